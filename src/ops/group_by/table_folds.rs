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
//! few, so that moving them costs little. Where it fills up all the same,
//! its folds are dropped and the rows are numbered again and reduced one
//! column at a time, as without folding.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{
    in_key_order, sized_table_capacity, table_capacity, DeviceReduced, GroupIds, GroupsBack,
    ReduceInput, Reduction, SizedTable, UploadedInput,
};
use crate::gpu::launch::{self, AggregateOp, FoldOp, FoldTable, TableFold, MAX_TABLE_FOLDS};
use crate::gpu::{
    upload_u64, DeviceVec, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase, PhaseTimer,
    StagingWindows,
};

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

/// Rows whose values cross the bus, and are folded, at once by default
/// ([`super::group_on_device`]): 64 MiB of a column, one staging window.
/// The fold of one chunk runs while the next crosses the bus, so that only
/// the last chunk's fold waits for the copies to end.
pub const FOLD_CHUNK_ROWS: usize = 1 << 23;

/// Every input folded into the slots of a table sized from an estimate,
/// enqueued: what the host reads once it knows the table did not fill up.
pub(super) struct TableFolds {
    pub(super) table: SizedTable,
    /// Each slot's words, one per fold, side by side
    /// ([`launch::table_slot_words`] a slot).
    slot_results: DeviceVec<u64>,
    /// The folds' [`TableFold::specs`], on the device.
    specs: DeviceVec<u64>,
    folds: usize,
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
    pub(super) copy_stream: &'a Arc<CudaStream>,
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
        stream: &Arc<CudaStream>,
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
                // SAFETY: the chunks, `rows` words in all, are copied over
                // every element below.
                let mut column: DeviceVec<u64> =
                    unsafe { stream.alloc(rows) }.during("allocating an input's column")?;
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
    stream: &Arc<CudaStream>,
    keys: &DeviceVec<u64>,
    capacity: u64,
    to_fold: FoldInputs<'_>,
    counts: FoldCounts<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<TableFolds> {
    let sm_count = device.sm_count();
    let kernels = device.kernels();
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
    let slots = capacity as usize + 1;
    // SAFETY (both): filled with u64::MAX below, before any read.
    let mut table_keys: DeviceVec<u64> =
        unsafe { stream.alloc(slots) }.during("allocating the group hash table")?;
    let mut table_groups: DeviceVec<u64> =
        unsafe { stream.alloc(slots) }.during("allocating the group hash table")?;
    let mut overflow = stream
        .alloc_zeros::<u64>(1)
        .during("allocating the overflow flag")?;
    let mut slot_results = stream
        .alloc_zeros::<u64>(slots * launch::table_slot_words(inputs.len()))
        .during("allocating the table's folds")?;
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
    timer.time(Phase::Kernel, || {
        launch::fill_u64(kernels, stream, sm_count, &mut table_keys, u64::MAX)?;
        launch::fill_u64(kernels, stream, sm_count, &mut table_groups, u64::MAX)
    })?;
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
    for first in (0..rows).step_by(chunk_rows) {
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
        let folds: Vec<TableFold<'_>> = inputs
            .iter()
            .zip(&ops)
            .zip(&values)
            .map(|((input, &op), values)| TableFold {
                op,
                values: values.as_ref(),
                valid_bits: input.valid.and_then(|i| to_fold.bitmaps.get(i)),
                flip: input.flip,
            })
            .collect();
        timer.time(Phase::Kernel, || {
            launch::group_insert_fold(
                kernels,
                stream,
                sm_count,
                keys,
                chunk.clone(),
                FoldTable {
                    table_keys: &mut table_keys,
                    table_groups: &mut table_groups,
                    capacity,
                    group_count: &mut *counts.group_count,
                    group_first_rows: &mut *counts.first_rows,
                    overflow: &mut overflow,
                },
                &folds,
                &specs,
                &mut slot_results,
            )
        })?;
        chunks_values.push(values);
    }
    // The table's keys are freed in stream order, after the last chunk's
    // fold.
    Ok(TableFolds {
        table: SizedTable {
            table_groups,
            capacity,
            overflow,
        },
        slot_results,
        specs,
        folds: inputs.len(),
    })
}

impl TableFolds {
    /// Each fold's result per group (`groups`, the table's count), in
    /// `key_order` where given (the group at each position).
    pub(super) fn into_reduced(
        self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        groups: usize,
        key_order: Option<&DeviceVec<u64>>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Vec<DeviceReduced>> {
        let mut outputs = (0..self.folds)
            .map(|_| {
                // SAFETY: table_fold_results writes every group's entry:
                // each group claimed exactly one slot.
                unsafe { stream.alloc::<u64>(groups.max(1)) }.during("allocating aggregate output")
            })
            .collect::<GpuResult<Vec<_>>>()?;
        timer.time(Phase::Kernel, || {
            launch::table_fold_results(
                device.kernels(),
                stream,
                device.sm_count(),
                &self.table.table_groups,
                &self.slot_results,
                self.folds,
                &self.specs,
                groups,
                &mut outputs,
            )
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
            expected_groups: Some(5_000),
        };
        assert_eq!(
            table_fold_capacity(in_key_order, keys, rows, &narrow),
            Some(32_768)
        );
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
