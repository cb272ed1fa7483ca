//! Fused HGB: where every input reduces to one word per group by an op a
//! hash table can apply with atomics (a count, sum, minimum, maximum, or a
//! float sum in the atomics' order), each row's values are folded into its
//! key's slot of the table as the row finds it (`group_insert_fold`), so
//! that no row's slot or group is written out nor read back, and every
//! column is read once; the slots' words then move to their groups
//! (`table_fold_results`). Separate passes read each row's group once per
//! column, and the group of a row is a random access each time.
//!
//! Only a table sized from an estimate of the groups folds: its slots are
//! few, so that moving them costs little. Where the first chunk of rows
//! shows more groups than the estimate, the table is built again, larger
//! ([`regrown_capacity`]). Where it fills up all the same, its folds are
//! dropped and the rows are numbered again and reduced one column at a
//! time, as without folding.

use std::sync::Arc;

use crate::gpu::alloc_zeroed;
use crate::gpu::alloc_uninit;
use crate::gpu::DeviceStream;

use super::{
    estimated_groups, folding_table_words, in_key_order, sized_table_capacity, table_capacity,
    unfolded_table_words, DeviceReduced, GroupIds, GroupsBack, ReduceInput, Reduction, SizedTable,
    UploadedInput,
};
use crate::gpu::launch::{self, AggregateOp, FoldOp, FoldTable, TableFold, MAX_TABLE_FOLDS};
use crate::gpu::{
    download_word, upload_u64, DeviceVec, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase,
    PhaseTimer, StagingWindows,
};
use crate::trace;

/// How a table folds `reduction`, where it can.
fn table_fold_op(reduction: Reduction) -> Option<FoldOp> {
    Some(match reduction {
        Reduction::Count => FoldOp::Words(AggregateOp::Count),
        Reduction::Sum => FoldOp::Words(AggregateOp::Sum),
        Reduction::Min => FoldOp::Words(AggregateOp::Min),
        Reduction::Max => FoldOp::Words(AggregateOp::Max),
        Reduction::SumF64 => FoldOp::SumF64,
        _ => return None,
    })
}

/// The slots of the table that `inputs` over `rows` rows are folded into
/// as the rows are numbered, where they can be: ids from a hash table
/// sized from an estimate of the groups (smaller than one sized to the
/// rows), each group's key word asked for rather than each row's group,
/// and 1 to [`MAX_TABLE_FOLDS`] inputs that a table can fold.
pub(super) fn table_fold_capacity(
    ids: GroupIds,
    back: GroupsBack,
    rows: usize,
    inputs: &[ReduceInput],
) -> Option<u64> {
    let expected_groups = match ids {
        GroupIds::Hashed { expected_groups }
        | GroupIds::HashedInKeyOrder {
            expected_groups, ..
        } => expected_groups?,
        GroupIds::Partitioned { .. } | GroupIds::Sorted { .. } => return None,
    };
    let foldable = back == GroupsBack::KeyWords
        && rows > 0
        && (1..=MAX_TABLE_FOLDS).contains(&inputs.len())
        && inputs
            .iter()
            .all(|input| table_fold_op(input.reduction).is_some());
    let capacity = sized_table_capacity(expected_groups);
    (foldable && capacity < table_capacity(rows)).then_some(capacity)
}

/// Rows whose values cross the bus at once by default, where they are
/// folded into a table or reduced as they land ([`super::InputChunks`]):
/// 64 MiB of a column, one staging window. The fold or reduction of one
/// chunk runs while the next crosses the bus, so that only the last
/// chunk's waits for the copies to end.
pub const FOLD_CHUNK_ROWS: usize = 1 << 23;

/// Every input folded into the slots of a table sized from an estimate,
/// enqueued: what the host reads once it knows the table did not fill up.
pub(super) struct TableFolds {
    pub(super) table: SizedTable,
    /// Each slot's words, one per fold, side by side, and its key
    /// ([`launch::table_slot_words`] a slot).
    slot_results: DeviceVec<u64>,
    /// The folds' [`TableFold::specs`], on the device.
    specs: DeviceVec<u64>,
    folds: usize,
    /// Whether the table was built again, larger, after the first chunk
    /// ([`regrown_capacity`]).
    pub(super) grown: bool,
}

/// Where [`launch_table_folds`] counts the groups and writes a row of each.
pub(super) struct FoldCounts<'a> {
    /// One entry, 0 on entry.
    pub(super) group_count: &'a mut DeviceVec<u64>,
    /// One entry per row; `[0, groups)` written.
    pub(super) first_rows: &'a mut DeviceVec<u64>,
}

/// What [`launch_table_folds`] folds: `inputs`, whose values are copied to
/// the device on `copy_stream` chunk by chunk, and whose validity bitmaps
/// are `bitmaps`, on the device already.
pub(super) struct FoldInputs<'a> {
    pub(super) inputs: &'a [ReduceInput],
    pub(super) bitmaps: &'a [DeviceVec<u64>],
    pub(super) copy_stream: &'a Arc<DeviceStream>,
    /// Rows a chunk holds (rounded up to a multiple of 64, so that a
    /// chunk starts at a word of a validity bitmap).
    pub(super) chunk_rows: usize,
    /// Where the chunks' values are kept once folded.
    pub(super) chunks: &'a mut FoldedChunks,
}

/// The inputs' values as they crossed the bus for a table's folds, chunk
/// by chunk: kept until the host knows the table held (then dropped,
/// each freed after the fold that read it), so that where it filled up
/// the inputs are reduced from them without crossing the bus again.
#[derive(Default)]
pub(super) struct FoldedChunks {
    /// Per chunk, each input's values (`None` for a count).
    chunks: Vec<Vec<Option<DeviceVec<u64>>>>,
}

impl FoldedChunks {
    /// Each input's whole column on `stream`, its chunks copied end to
    /// end on the device and freed one by one.
    pub(super) fn into_columns(
        self,
        stream: &Arc<DeviceStream>,
        inputs: usize,
        rows: usize,
    ) -> GpuResult<Vec<UploadedInput>> {
        let mut by_input: Vec<Vec<DeviceVec<u64>>> = (0..inputs).map(|_| Vec::new()).collect();
        for chunk in self.chunks {
            for (input, values) in chunk.into_iter().enumerate() {
                by_input[input].extend(values);
            }
        }
        by_input
            .into_iter()
            .map(|chunks| {
                if chunks.is_empty() {
                    return Ok(UploadedInput {
                        values: None,
                        high: None,
                    });
                }
                // The chunks, `rows` words in all, are copied over
                // every element below.
                let mut column: DeviceVec<u64> =
                    alloc_uninit(stream, rows, "allocating an input's column")?;
                let mut at = 0;
                for chunk in chunks {
                    let len = chunk.len();
                    if at + len > rows {
                        return Err(GpuError::Invalid(format!(
                            "chunks of {} rows or more for a column of {rows}",
                            at + len
                        )));
                    }
                    stream
                        .memcpy_dtod(&chunk, &mut column.slice_mut(at..at + len))
                        .during("joining an input's chunks")?;
                    at += len;
                }
                if at != rows {
                    return Err(GpuError::Invalid(format!(
                        "chunks of {at} rows for a column of {rows}"
                    )));
                }
                Ok(UploadedInput {
                    values: Some(column),
                    high: None,
                })
            })
            .collect()
    }
}

/// Enqueues a table of `capacity` slots (and the reserved one) and the
/// numbering of the rows of `keys` (at least one) in it, with every input
/// folded into each row's slot: the inputs' values cross the bus in chunks
/// of `to_fold.chunk_rows` on the copy stream, and each chunk is folded on
/// `stream` once it has landed, while the next one crosses.
pub(super) fn launch_table_folds(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &DeviceVec<u64>,
    capacity: u64,
    to_fold: FoldInputs<'_>,
    counts: FoldCounts<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<TableFolds> {
    let rows = keys.len();
    let inputs = to_fold.inputs;
    let ops = inputs
        .iter()
        .map(|input| {
            table_fold_op(input.reduction).ok_or_else(|| {
                GpuError::Invalid(format!("{:?} folded into a table", input.reduction))
            })
        })
        .collect::<GpuResult<Vec<_>>>()?;
    // The specs name each fold's op and flip, whatever its values.
    let spec_folds: Vec<TableFold<'_>> = inputs
        .iter()
        .zip(&ops)
        .map(|(input, &op)| TableFold {
            op,
            values: None,
            valid_bits: None,
            flip: input.flip,
        })
        .collect();
    let specs = upload_u64(device, stream, &TableFold::specs(&spec_folds), timer)?;
    let FoldCounts {
        group_count,
        first_rows,
    } = counts;
    let mut folder = ChunkFolder {
        device,
        stream,
        keys,
        inputs,
        ops: &ops,
        bitmaps: to_fold.bitmaps,
        specs: &specs,
        table: Some(FoldingTable::new(device, stream, capacity, inputs.len(), timer)?),
        group_count,
        first_rows,
        grown: false,
    };
    // Every chunk's values are kept at least until the last chunk's fold
    // is enqueued: a device vector dropped makes its stream (the copy
    // stream) wait for the kernels that read it, which would hold the
    // next chunk's copy back until the fold of this one had ended. The
    // chunks share two staging buffers, so that the host stages one
    // chunk's window while the last one crosses the bus.
    let chunk_rows = to_fold.chunk_rows.max(1).next_multiple_of(64);
    let mut staging = StagingWindows::standard(device);
    let chunks_values = &mut to_fold.chunks.chunks;
    chunks_values.reserve(rows.div_ceil(chunk_rows));
    for (index, first) in (0..rows).step_by(chunk_rows).enumerate() {
        let chunk = first..(first + chunk_rows).min(rows);
        let values = inputs
            .iter()
            .map(|input| {
                (!input.values.is_empty())
                    .then(|| {
                        staging.upload_u64(
                            to_fold.copy_stream,
                            &input.values.pieces_in(chunk.clone()),
                            timer,
                        )
                    })
                    .transpose()
            })
            .collect::<GpuResult<Vec<_>>>()?;
        if index == 1 {
            folder.grow_if_short(0..chunk.start, &chunks_values[0], timer)?;
        }
        folder.fold(chunk, &values, timer)?;
        chunks_values.push(values);
    }
    let grown = folder.grown;
    let table = folder.table()?;
    Ok(TableFolds {
        table: SizedTable {
            table_groups: table.groups,
            capacity: table.capacity,
            overflow: table.overflow,
        },
        slot_results: table.slot_results,
        specs,
        folds: inputs.len(),
        grown,
    })
}

/// Folds chunks of rows into a table, for [`launch_table_folds`].
struct ChunkFolder<'a> {
    device: &'a GpuDevice,
    stream: &'a Arc<DeviceStream>,
    keys: &'a DeviceVec<u64>,
    inputs: &'a [ReduceInput],
    ops: &'a [FoldOp],
    bitmaps: &'a [DeviceVec<u64>],
    specs: &'a DeviceVec<u64>,
    /// `None` only while a larger one replaces it.
    table: Option<FoldingTable>,
    group_count: &'a mut DeviceVec<u64>,
    first_rows: &'a mut DeviceVec<u64>,
    /// Whether the table was built again, larger.
    grown: bool,
}

impl ChunkFolder<'_> {
    fn table(self) -> GpuResult<FoldingTable> {
        self.table
            .ok_or_else(|| GpuError::Invalid("a folding table dropped and not made again".into()))
    }

    /// Enqueues the numbering of `chunk`'s rows in the table, each input's
    /// `values` (the chunk's, `None` for a count) folded into its slot.
    fn fold(
        &mut self,
        chunk: std::ops::Range<usize>,
        values: &[Option<DeviceVec<u64>>],
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let folds: Vec<TableFold<'_>> = self
            .inputs
            .iter()
            .zip(self.ops)
            .zip(values)
            .map(|((input, &op), values)| TableFold {
                op,
                values: values.as_ref(),
                valid_bits: input.valid.and_then(|i| self.bitmaps.get(i)),
                flip: input.flip,
            })
            .collect();
        let table = self
            .table
            .as_mut()
            .ok_or_else(|| GpuError::Invalid("folding into a dropped table".into()))?;
        timer.time(Phase::Kernel, || {
            launch::group_insert_fold(
                &self.device.launcher(self.stream),
                self.keys,
                chunk,
                FoldTable {
                    table_groups: &mut table.groups,
                    capacity: table.capacity,
                    group_count: &mut *self.group_count,
                    group_first_rows: &mut *self.first_rows,
                    overflow: &mut table.overflow,
                },
                &folds,
                self.specs,
                &mut table.slot_results,
            )
        })
    }

    /// The first chunk's groups tell whether the table will hold, while
    /// the second chunk crosses the bus: a sample of a few thousand keys
    /// cannot tell a long tail of rare keys (Zipf 1.0 over 2^24 keys:
    /// 33 K distinct of 65 K sampled, 14 M groups) from fewer groups seen
    /// once or twice each. A table that cannot hold is built again,
    /// larger, before any more rows fold into it, and the first chunk is
    /// folded again from its values, still on the device; left to fill
    /// up, the rows would be numbered and reduced again once every chunk
    /// had crossed the bus, work no copy is left to hide.
    fn grow_if_short(
        &mut self,
        first_chunk: std::ops::Range<usize>,
        first_values: &[Option<DeviceVec<u64>>],
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let (device, stream) = (self.device, self.stream);
        let rows = self.keys.len();
        let Some(table) = &self.table else {
            return Err(GpuError::Invalid("growing a dropped folding table".into()));
        };
        let capacity = table.capacity;
        let (filled, groups) = table.groups_so_far(device, stream, self.group_count, timer)?;
        let largest = largest_folding_capacity(rows, self.inputs.len());
        let Some(grown) = regrown_capacity(
            capacity,
            largest,
            (first_chunk.len(), rows),
            groups,
            filled,
        ) else {
            return Ok(());
        };
        trace::event(|| {
            format!(
                "aggregation: {groups} groups in the first {} rows (table full: {filled}); the folding table grows from {} to {grown} slots",
                first_chunk.len(),
                capacity
            )
        });
        // The old table goes first: the device memory reserved holds one
        // table this large, not two.
        self.table = None;
        self.table = Some(FoldingTable::new(device, stream, grown, self.inputs.len(), timer)?);
        self.grown = true;
        stream
            .memset_zeros(&mut *self.group_count)
            .during("resetting the group counter")?;
        self.fold(first_chunk, first_values, timer)
    }
}

/// A table that folds, on the device: `capacity` slots and the reserved
/// one, groups set to `u64::MAX`, each slot's fold words and key word to 0
/// (an empty slot: keys are kept complemented).
struct FoldingTable {
    groups: DeviceVec<u64>,
    capacity: u64,
    /// One entry, 0 until the table fills up.
    overflow: DeviceVec<u64>,
    slot_results: DeviceVec<u64>,
}

impl FoldingTable {
    /// Enqueues a fresh table of `capacity` slots for `folds` folds.
    fn new(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        capacity: u64,
        folds: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let slots = capacity as usize + 1;
        // Filled with u64::MAX below, before any read.
        let mut groups: DeviceVec<u64> =
            alloc_uninit(stream, slots, "allocating the group hash table")?;
        let overflow = alloc_zeroed::<u64>(stream, 1, "allocating the overflow flag")?;
        let slot_results = alloc_zeroed::<u64>(stream, slots * launch::table_slot_words(folds), "allocating the table's folds")?;
        timer.time(Phase::Kernel, || {
            launch::fill_u64(&device.launcher(stream), &mut groups, u64::MAX)
        })?;
        Ok(Self {
            groups,
            capacity,
            overflow,
            slot_results,
        })
    }

    /// Whether the table filled up, and the groups `group_count` counts,
    /// once the work enqueued on `stream` so far has run.
    fn groups_so_far(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        group_count: &DeviceVec<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<(bool, usize)> {
        let filled = download_word(device, stream, &self.overflow.as_view(), "the table's overflow flag", timer)? != 0;
        let groups = download_word(device, stream, &group_count.as_view(), "the group count", timer)?;
        Ok((filled, groups as usize))
    }
}

/// The most slots a folding table for `rows` rows and `folds` folds may
/// take: its words ([`folding_table_words`]) no more than those of the
/// table sized to the rows that numbers them without folding, with each
/// row's group ([`unfolded_table_words`]: the device memory the
/// aggregation reserves, [`super::hashed_table_words`]), and no more slots
/// than that table has; 0 where no table fits.
fn largest_folding_capacity(rows: usize, folds: usize) -> u64 {
    // (capacity + 1) slots (one reserved) of this many words each.
    let slot_words = folding_table_words(0, folds) as u64;
    let most = (unfolded_table_words(rows) as u64 / slot_words).saturating_sub(1);
    if most < 2 {
        // Not even the smallest table (a handful of rows): none.
        return 0;
    }
    // The largest power of two no larger than `most`.
    (1u64 << (63 - most.leading_zeros())).min(table_capacity(rows))
}

/// The slots a folding table of `capacity` slots is built again with,
/// where the first `seen` of `rows` rows (`(seen, rows)`) made `groups`
/// groups, or filled it (`filled`): `None` where it should hold. The
/// table gives up at three quarters full, so past three eighths after the
/// first chunk it is on course to. The first chunk, thousands of times
/// the key sample, estimates the groups again ([`estimated_groups`]), and
/// the table is sized to that as the sample's was
/// ([`sized_table_capacity`]); a table that filled up knows no bound but
/// `largest`. Only a table larger than before is built.
fn regrown_capacity(
    capacity: u64,
    largest: u64,
    (seen, rows): (usize, usize),
    groups: usize,
    filled: bool,
) -> Option<u64> {
    let on_course_to_fill = filled || 8 * groups as u64 > 3 * capacity;
    if !on_course_to_fill || seen == 0 {
        return None;
    }
    let wanted = if filled {
        largest
    } else {
        sized_table_capacity(estimated_groups(seen, groups, rows)).min(largest)
    };
    (wanted > capacity).then_some(wanted)
}

impl TableFolds {
    /// Each group's first row into `min_rows` (one entry per group,
    /// `u64::MAX` on entry), each of the `rows` rows' group found again in
    /// the table from its key in `keys`.
    pub(super) fn first_rows_into(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        keys: &DeviceVec<u64>,
        rows: usize,
        min_rows: &mut DeviceVec<u64>,
    ) -> GpuResult<()> {
        launch::table_group_min_rows(
            &device.launcher(stream),
            keys,
            rows,
            &self.table.table_groups,
            &self.slot_results,
            self.folds,
            min_rows,
        )
    }

    /// Each fold's result per group (`groups`, the table's count), in
    /// `key_order` where given (the group at each position).
    pub(super) fn into_reduced(
        self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        groups: usize,
        key_order: Option<&DeviceVec<u64>>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Vec<DeviceReduced>> {
        let mut outputs = (0..self.folds)
            .map(|_| {
                // table_fold_results writes every group's entry:
                // each group claimed exactly one slot.
                alloc_uninit::<u64>(stream, groups.max(1), "allocating aggregate output")
            })
            .collect::<GpuResult<Vec<_>>>()?;
        timer.time(Phase::Kernel, || {
            launch::table_fold_results(
                &device.launcher(stream),
                &self.table.table_groups,
                &self.slot_results,
                self.folds,
                &self.specs,
                groups,
                &mut outputs)
        })?;
        // The table is freed in stream order, after the kernel that reads it.
        outputs
            .into_iter()
            .map(|out| {
                Ok(DeviceReduced::Words {
                    values: in_key_order(device, stream, out, key_order, groups, timer)?,
                    high: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::group_by::Words;

    fn input(reduction: Reduction) -> ReduceInput {
        ReduceInput {
            reduction,
            values: Words::default(),
            high_words: Words::default(),
            flip: 0,
            valid: None,
        }
    }

    #[test]
    fn a_folding_table_grows_only_where_its_first_chunk_shows_it_cannot_hold() {
        let rows = 1 << 28;
        let largest = largest_folding_capacity(rows, 2);
        let seen = 1 << 23;
        // The groups the estimate allowed for (a table four times as
        // large): kept, however many chunks follow.
        assert_eq!(
            regrown_capacity(1 << 18, largest, (seen, rows), 1 << 16, false),
            None
        );
        // Zipf 1.0 over 2^16 keys: every key in the first chunk, where a
        // table of 2^17 slots was sized from the sample: sized to the
        // first chunk's estimate, its groups seen over and over.
        assert_eq!(
            regrown_capacity(1 << 17, largest, (seen, rows), 65_536, false),
            Some(sized_table_capacity(estimated_groups(seen, 65_536, rows)))
        );
        assert_eq!(
            regrown_capacity(1 << 17, largest, (seen, rows), 65_536, false),
            Some(1 << 19)
        );
        // Every row of the first chunk a group of its own: as many groups
        // as rows, as far as it tells, within the memory reserved.
        assert_eq!(
            regrown_capacity(1 << 20, largest, (seen, rows), seen, false),
            Some(largest)
        );
        // Filled up: as large as the memory reserved allows.
        assert_eq!(
            regrown_capacity(1 << 18, largest, (seen, rows), 196_608, true),
            Some(largest)
        );
        // Not past three eighths, or no larger than it was: kept.
        assert_eq!(
            regrown_capacity(1 << 18, largest, (seen, rows), 98_304, false),
            None
        );
        assert_eq!(
            regrown_capacity(largest, largest, (seen, rows), 1 << 26, true),
            None
        );
        assert_eq!(regrown_capacity(1 << 12, largest, (0, rows), 0, true), None);
    }

    #[test]
    fn a_slot_is_an_aligned_piece_with_its_key_after_its_folds() {
        for folds in 1..=MAX_TABLE_FOLDS {
            let words = launch::table_slot_words(folds);
            // The folds' words, then the key word last: room for both.
            assert!(words > folds, "{folds} folds");
            // A power of two of words, so that slots never straddle their
            // aligned 16-, 32- or 64-byte pieces, and no larger than needs be.
            assert!(
                words.is_power_of_two() && words / 2 <= folds,
                "{folds} folds"
            );
        }
        // Up to three folds and the key share one 32-byte sector.
        assert_eq!(launch::table_slot_words(1) * 8, 16);
        assert_eq!(launch::table_slot_words(3) * 8, 32);
        assert_eq!(launch::table_slot_words(MAX_TABLE_FOLDS) * 8, 64);
    }

    #[test]
    fn the_largest_folding_table_fits_the_memory_of_the_unfolded_numbering() {
        for rows in [1usize, 2, 1000, 100_000, 1 << 20, (1 << 28) + 7] {
            for folds in 1..=MAX_TABLE_FOLDS {
                let capacity = largest_folding_capacity(rows, folds);
                if capacity == 0 {
                    // Too few rows for any table: never more than one chunk.
                    assert!(rows < 64, "{rows} rows, {folds} folds");
                    continue;
                }
                assert!(
                    capacity.is_power_of_two() && capacity >= 2,
                    "{rows} rows, {folds} folds"
                );
                assert!(
                    capacity <= table_capacity(rows),
                    "{rows} rows, {folds} folds"
                );
                let unfolded = 2 * (table_capacity(rows) + 1) + rows as u64;
                let slot_words = 1 + launch::table_slot_words(folds) as u64;
                assert!(
                    (capacity + 1) * slot_words <= unfolded,
                    "{rows} rows, {folds} folds"
                );
                // And it is the largest such power of two.
                assert!(
                    2 * capacity > table_capacity(rows)
                        || (2 * capacity + 1) * slot_words > unfolded,
                    "{rows} rows, {folds} folds"
                );
            }
        }
        // 2^28 rows, two folds: slots of five words (a group, two folds'
        // words, a spare one and the key), so 2^28 of them and the reserved
        // one take more than the 5 * 2^28 + 2 words of the numbering
        // without folds, and 2^27 do not; one fold (three words a slot):
        // 2^28.
        assert_eq!(largest_folding_capacity(1 << 28, 2), 1 << 27);
        assert_eq!(largest_folding_capacity(1 << 28, 1), 1 << 28);
    }

    #[test]
    fn only_a_table_sized_from_an_estimate_folds_narrow_inputs_for_key_words() {
        let rows = 100_000;
        let narrow = [
            input(Reduction::Count),
            input(Reduction::Max),
            input(Reduction::SumF64),
        ];
        let sized = GroupIds::Hashed {
            expected_groups: Some(10),
        };
        let keys = GroupsBack::KeyWords;
        assert_eq!(table_fold_capacity(sized, keys, rows, &narrow), Some(4096));
        let in_key_order = GroupIds::HashedInKeyOrder {
            key_bits: 64,
            transform: None,
            expected_groups: Some(1_000),
        };
        assert_eq!(
            table_fold_capacity(in_key_order, keys, rows, &narrow),
            Some(65_536)
        );
        // An estimate whose spread table is no smaller than the rows' own.
        let near_rows = GroupIds::HashedInKeyOrder {
            key_bits: 64,
            transform: None,
            expected_groups: Some(5_000),
        };
        assert_eq!(table_fold_capacity(near_rows, keys, rows, &narrow), None);
        // A table sized to the rows, partitions, sorted ids.
        let unsized_ = GroupIds::Hashed {
            expected_groups: None,
        };
        assert_eq!(table_fold_capacity(unsized_, keys, rows, &narrow), None);
        let partitioned = GroupIds::Partitioned { partition_bits: 4 };
        assert_eq!(table_fold_capacity(partitioned, keys, rows, &narrow), None);
        // An estimate whose table is no smaller than one sized to the rows.
        assert_eq!(table_fold_capacity(sized, keys, 1_000, &narrow), None);
        assert_eq!(table_fold_capacity(sized, keys, 0, &narrow), None);
        // Each row's group asked for; no inputs; too many; a wide one.
        let rows_back = GroupsBack::RowsAndRowGroups;
        assert_eq!(table_fold_capacity(sized, rows_back, rows, &narrow), None);
        assert_eq!(table_fold_capacity(sized, keys, rows, &[]), None);
        let five: Vec<_> = (0..5).map(|_| input(Reduction::Sum)).collect();
        assert_eq!(table_fold_capacity(sized, keys, rows, &five), None);
        assert_eq!(
            table_fold_capacity(sized, keys, rows, &five[..MAX_TABLE_FOLDS]),
            Some(4096)
        );
        for wide in [
            Reduction::SumI128,
            Reduction::MinI128,
            Reduction::MaxI128,
            Reduction::SumF64Fixed,
        ] {
            let inputs = [input(Reduction::Count), input(wide)];
            assert_eq!(table_fold_capacity(sized, keys, rows, &inputs), None);
        }
    }
}
