//! Typed launches of the hash group-by kernels in `ptx/group_by.cu`.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::Launcher;
use super::{
    arg_or_null, check_len, config, grid_stride_blocks, FoldOp, ValueWidth, NULL_POINTER,
};
use crate::gpu::{DriverResultExt, GpuError, GpuResult};

/// Groups whose per-block copies of one aggregate fit the shared memory a
/// kernel may use without opting in (8 bytes each, 32 KiB of the 48 KiB).
pub const PRIVATIZED_GROUPS: u64 = 4096;

/// What `aggregate_u64` does with each value (`OP_*` in `group_by.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateOp {
    /// Wrapping sum.
    Sum = 0,
    /// Unsigned minimum.
    Min = 1,
    /// Unsigned maximum.
    Max = 2,
    /// Valid rows.
    Count = 3,
}

impl AggregateOp {
    /// The value an output slot starts from.
    pub fn identity(self) -> u64 {
        match self {
            AggregateOp::Min => u64::MAX,
            _ => 0,
        }
    }
}

/// The rows of a stage-2 launch: their group ids (or one group for all),
/// how many there are, and which are valid.
#[derive(Debug, Clone, Copy)]
pub struct GroupRows<'a> {
    /// Group id per row; `None`: every row is in group 0.
    pub groups_of_rows: Option<&'a CudaSlice<u64>>,
    /// Rows.
    pub rows: usize,
    /// Validity bitmap, bit `i % 64` of word `i / 64`; `None`: all valid.
    pub valid_bits: Option<&'a CudaSlice<u64>>,
    /// Groups (output slots).
    pub groups: usize,
    /// The rows `[first, end)` this launch reduces, where it reduces a chunk
    /// of a column as it lands ([`GroupRows::chunk`]); `None`: all `rows`.
    pub span: Option<(usize, usize)>,
}

impl GroupRows<'_> {
    /// Only the rows `first..end` of these: the values passed with them
    /// hold those rows alone (a chunk of a column), while the group ids and
    /// the bitmap still hold all `rows`.
    pub fn chunk(self, first: usize, end: usize) -> Self {
        Self {
            span: Some((first, end)),
            ..self
        }
    }

    /// The first row reduced and the row after the last.
    fn bounds(&self) -> (usize, usize) {
        self.span.unwrap_or((0, self.rows))
    }

    /// Rows reduced: the entries of the values passed with these.
    fn reduced(&self) -> usize {
        let (first, end) = self.bounds();
        end - first
    }

    /// The kernel's `first` and `n` (the row after the last).
    fn kernel_bounds(&self) -> (u64, u64) {
        let (first, end) = self.bounds();
        (first as u64, end as u64)
    }

    /// Errors where a pass that needs every row at once (the deterministic
    /// float sum's two) is given a chunk.
    pub(crate) fn whole(&self) -> GpuResult<()> {
        match self.span {
            Some(span) if span != (0, self.rows) => Err(GpuError::Invalid(format!(
                "rows {span:?} of {} reduced in a pass that needs them all",
                self.rows
            ))),
            _ => Ok(()),
        }
    }

    fn check(&self) -> GpuResult<()> {
        let (first, end) = self.bounds();
        if first > end || end > self.rows {
            return Err(GpuError::Invalid(format!(
                "rows [{first}, {end}) reduced of {}",
                self.rows
            )));
        }
        if let Some(groups) = self.groups_of_rows {
            check_len(groups, self.rows, "group ids")?;
        } else if self.groups != 1 {
            return Err(GpuError::Invalid(format!(
                "{} groups without group ids",
                self.groups
            )));
        }
        if let Some(bits) = self.valid_bits {
            check_len(bits, self.rows.div_ceil(64), "validity bitmap")?;
        }
        Ok(())
    }

    /// Whether each block reduces into shared memory first.
    fn privatize(&self) -> bool {
        (self.groups as u64) <= PRIVATIZED_GROUPS
    }

    /// Blocks for the rows: privatized blocks each merge every group at
    /// the end, so fewer of them pay for that.
    fn blocks(&self, sm_count: u32) -> u64 {
        let blocks = grid_stride_blocks(self.reduced() as u64, sm_count);
        if self.privatize() && self.groups > 1 {
            blocks.min(u64::from(sm_count) * 2)
        } else {
            blocks
        }
    }
}

/// `fill_u64`: sets every element of `out` to `value`.
pub fn fill_u64(
    launcher: &Launcher<'_>,
    out: &mut CudaSlice<u64>,
    value: u64,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = out.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let mut launch = stream.launch_builder(&kernels.fill_u64);
    launch.arg(&mut *out).arg(&n).arg(&value);
    // SAFETY: writes out[..n] with n = out.len().
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching fill_u64")?;
    Ok(())
}

/// `group_insert`: stage 1 of the hash group-by. `table_keys` holds
/// `capacity + 1` entries set to `u64::MAX`, `capacity` a power of two;
/// `group_count` one entry set to 0. Writes each row's table slot to
/// `row_slots` and each new group's first row to `group_first_rows`.
/// Without `overflow` the table must have twice as many slots as rows;
/// with it (one entry set to 0) the table may have fewer, sized from an
/// estimate of the groups, and the kernel sets it and stops where the table
/// fills up, leaving every output incomplete.
#[allow(clippy::too_many_arguments)]
pub fn group_insert(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    table_keys: &mut CudaSlice<u64>,
    table_groups: &mut CudaSlice<u64>,
    capacity: u64,
    group_count: &mut CudaSlice<u64>,
    group_first_rows: &mut CudaSlice<u64>,
    row_slots: &mut CudaSlice<u64>,
    overflow: Option<&mut CudaSlice<u64>>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len();
    let room_for_all = capacity >= 2 * n as u64;
    if !capacity.is_power_of_two() || capacity < 2 || (overflow.is_none() && !room_for_all) {
        return Err(GpuError::Invalid(format!(
            "hash table of {capacity} slots for {n} rows"
        )));
    }
    let slots = capacity as usize + 1;
    check_len(table_keys, slots, "hash table keys")?;
    check_len(table_groups, slots, "hash table groups")?;
    check_len(group_count, 1, "group count")?;
    check_len(group_first_rows, n, "group first rows")?;
    check_len(row_slots, n, "row slots")?;
    if let Some(overflow) = &overflow {
        check_len(overflow, 1, "overflow flag")?;
    }
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = stream.launch_builder(&kernels.group_insert);
    launch
        .arg(keys)
        .arg(&n64)
        .arg(table_keys)
        .arg(table_groups)
        .arg(&capacity)
        .arg(group_count)
        .arg(group_first_rows)
        .arg(row_slots);
    match overflow {
        Some(overflow) => launch.arg(overflow),
        None => launch.arg(&NULL_POINTER),
    };
    // SAFETY: the table has capacity + 1 slots; with at least twice as many
    // as rows linear probing always finds a free slot, and otherwise the
    // kernel gives up after probing every slot at the most (the overflow
    // flag, checked to exist); slots < capacity + 1, group ids < n (one
    // claim per row at most); every length is checked above, and a null
    // pointer stands only for an absent overflow flag, which the kernel
    // tests.
    unsafe { launch.launch(config(grid_stride_blocks(n64, sm_count))?) }
        .during("launching group_insert")?;
    Ok(())
}

/// Folds [`group_insert_fold`] computes at most in one launch
/// (`MAX_TABLE_FOLDS` in `ptx/group_by.cu`).
pub const MAX_TABLE_FOLDS: usize = 4;

/// Blocks of the fold kernel for `folds` folds that its registers let one
/// multiprocessor hold (`fold_blocks_per_sm` in `ptx/group_by.cu`): a grid
/// of that many per multiprocessor runs in one wave, where a larger one
/// would leave its last wave part full.
fn fold_blocks_per_sm(folds: usize) -> u32 {
    if folds <= 2 {
        6
    } else {
        5
    }
}

/// Words each slot of a folding table holds for `folds` folds: the folds'
/// words, then as many as make a power of two with the slot's key word,
/// last, so that one 32-byte sector holds a slot's key and up to three
/// folds' words (`table_slot_words` in `ptx/group_by.cu`).
pub fn table_slot_words(folds: usize) -> usize {
    (folds + 1).next_power_of_two()
}

/// One reduction [`group_insert_fold`] folds into each row's table slot:
/// `op` over `values[i] ^ flip` (the bits of `values[i]` for a float sum;
/// nothing read for a count) of each row `i` whose bit is set in
/// `valid_bits` (`None`: every row).
#[derive(Debug, Clone, Copy)]
pub struct TableFold<'a> {
    pub op: FoldOp,
    /// One word per row; `None` only for a count.
    pub values: Option<&'a CudaSlice<u64>>,
    pub valid_bits: Option<&'a CudaSlice<u64>>,
    pub flip: u64,
}

impl TableFold<'_> {
    /// The kernels' `specs` for `folds`: the op code and the flip of each.
    pub fn specs(folds: &[TableFold<'_>]) -> Vec<u64> {
        folds
            .iter()
            .flat_map(|fold| [fold.op.code(), fold.flip])
            .collect()
    }

    /// Values for the `chunk_rows` rows folded, a bitmap for all `rows`.
    fn check(&self, chunk_rows: usize, rows: usize) -> GpuResult<()> {
        match (self.op, self.values) {
            (FoldOp::Words(AggregateOp::Count), _) => {}
            (_, Some(values)) => check_len(values, chunk_rows, "fold values")?,
            (op, None) => return Err(GpuError::Invalid(format!("{op:?} without values"))),
        }
        if let Some(bits) = self.valid_bits {
            check_len(bits, rows.div_ceil(64), "validity bitmap")?;
        }
        Ok(())
    }
}

fn check_table_folds(folds: usize, specs: &CudaSlice<u64>) -> GpuResult<()> {
    if folds == 0 || folds > MAX_TABLE_FOLDS {
        return Err(GpuError::Invalid(format!(
            "{folds} folds into a table, 1 to {MAX_TABLE_FOLDS}"
        )));
    }
    check_len(specs, 2 * folds, "fold specs")
}

/// The table [`group_insert_fold`] fills: `table_groups` holds
/// `capacity + 1` entries set to `u64::MAX` (`capacity` a power of two),
/// `group_count` and `overflow` one entry set to 0, and `group_first_rows`
/// one entry per row. The slots' keys are kept with their words.
pub struct FoldTable<'a> {
    pub table_groups: &'a mut CudaSlice<u64>,
    pub capacity: u64,
    pub group_count: &'a mut CudaSlice<u64>,
    pub group_first_rows: &'a mut CudaSlice<u64>,
    pub overflow: &'a mut CudaSlice<u64>,
}

/// `group_insert_fold`: stage 1 and stage 2 of the hash group-by in one
/// pass over the rows `rows` of `keys` (one chunk of them: launches over
/// consecutive chunks, in order on one stream, fold every row). Every row
/// finds or claims its key's slot of `table` (each new group's slot then
/// holds its id, and `group_first_rows` a row of it), and folds its value
/// of each of `folds` (whose values hold the chunk's rows alone, whose
/// bitmaps hold every row's bit) into that slot's words of `slot_results`
/// (`(capacity + 1) * table_slot_words(folds.len())` words set to 0): fold
/// `f` of slot `s` at `s * table_slot_words(folds.len()) + f`, a minimum
/// kept complemented, and the slot's key, complemented, in its last word.
/// `specs` is [`TableFold::specs`] of `folds`, on the device. Where the
/// table fills up, the kernel sets `overflow` and stops, leaving every
/// output incomplete. [`table_fold_results`] then moves the words to the
/// groups.
#[allow(clippy::too_many_arguments)]
pub fn group_insert_fold(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    rows: std::ops::Range<usize>,
    table: FoldTable<'_>,
    folds: &[TableFold<'_>],
    specs: &CudaSlice<u64>,
    slot_results: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len();
    if rows.start > rows.end || rows.end > n {
        return Err(GpuError::Invalid(format!(
            "rows {rows:?} folded of {n} keys"
        )));
    }
    let capacity = table.capacity;
    if !capacity.is_power_of_two() || capacity < 2 {
        return Err(GpuError::Invalid(format!(
            "hash table of {capacity} slots for {n} rows"
        )));
    }
    let slots = capacity as usize + 1;
    check_len(table.table_groups, slots, "hash table groups")?;
    check_len(table.group_count, 1, "group count")?;
    check_len(table.group_first_rows, n, "group first rows")?;
    check_len(table.overflow, 1, "overflow flag")?;
    check_table_folds(folds.len(), specs)?;
    for fold in folds {
        fold.check(rows.len(), n)?;
    }
    check_len(
        slot_results,
        slots * table_slot_words(folds.len()),
        "slot results",
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    let (first_row, end_row) = (rows.start as u64, rows.end as u64);
    let mut launch = stream.launch_builder(&kernels.group_insert_fold[folds.len() - 1]);
    launch
        .arg(keys)
        .arg(&first_row)
        .arg(&end_row)
        .arg(table.table_groups)
        .arg(&table.capacity)
        .arg(table.group_count)
        .arg(table.group_first_rows)
        .arg(table.overflow)
        .arg(specs);
    for f in 0..MAX_TABLE_FOLDS {
        arg_or_null(&mut launch, folds.get(f).and_then(|fold| fold.values));
    }
    for f in 0..MAX_TABLE_FOLDS {
        arg_or_null(&mut launch, folds.get(f).and_then(|fold| fold.valid_bits));
    }
    launch.arg(slot_results);
    // SAFETY: as group_insert with an overflow flag (probes stay within the
    // capacity + 1 slots, checked, and give up where the table is full;
    // group ids < n, one per row at most); keys are read at rows
    // first_row <= i < end_row <= n, checked; each fold's values at
    // i - first_row < rows.len() and its bitmap at words < n / 64 + 1, both
    // checked, and a null pointer stands
    // only for a count's values (never read) or an absent bitmap (tested),
    // or for a fold past `folds` (never read); slot_results is read and
    // written at slot * words + j < (capacity + 1) * words (words =
    // table_slot_words(folds) > folds, j < words; 16-byte loads at even
    // offsets of an allocation aligned to 256 bytes), checked; specs holds
    // 2 * folds words, checked.
    let resident = u64::from(sm_count) * u64::from(fold_blocks_per_sm(folds.len()));
    let blocks = grid_stride_blocks(end_row - first_row, sm_count).min(resident);
    unsafe { launch.launch(config(blocks)?) }.during("launching group_insert_fold")?;
    Ok(())
}

/// `table_fold_results`: after [`group_insert_fold`] with `folds` folds
/// and the same `specs`, writes each fold's word of every claimed slot (each slot's
/// group in `table_groups`, `u64::MAX` where unclaimed) to that group's
/// entry of its output in `outputs` (one per fold, `groups` entries each,
/// `groups` the table's group count), a minimum complemented back: groups
/// without a counted row hold the reduction's identity.
#[allow(clippy::too_many_arguments)]
pub fn table_fold_results(
    launcher: &Launcher<'_>,
    table_groups: &CudaSlice<u64>,
    slot_results: &CudaSlice<u64>,
    folds: usize,
    specs: &CudaSlice<u64>,
    groups: usize,
    outputs: &mut [CudaSlice<u64>],
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_table_folds(folds, specs)?;
    let slots = table_groups.len();
    check_len(
        slot_results,
        slots * table_slot_words(folds),
        "slot results",
    )?;
    if outputs.len() != folds {
        return Err(GpuError::Invalid(format!(
            "{} outputs for {folds} folds",
            outputs.len()
        )));
    }
    for out in outputs.iter() {
        check_len(out, groups, "fold output")?;
    }
    let slots64 = slots as u64;
    let fold_count = folds as u32;
    let mut launch = stream.launch_builder(&kernels.table_fold_results);
    launch
        .arg(table_groups)
        .arg(&slots64)
        .arg(slot_results)
        .arg(&fold_count)
        .arg(specs);
    let mut outputs = outputs.iter_mut();
    for _ in 0..MAX_TABLE_FOLDS {
        match outputs.next() {
            Some(out) => launch.arg(out),
            None => launch.arg(&NULL_POINTER),
        };
    }
    // SAFETY: reads table_groups and slot_results within their checked
    // lengths (slot_results at slot * table_slot_words(folds) + f); a
    // claimed slot holds a group id below the table's group count, which
    // the caller passes as `groups`, and each output (one per fold,
    // checked) holds that many entries; outputs past `folds` are null and
    // never written.
    unsafe { launch.launch(config(grid_stride_blocks(slots64, sm_count))?) }
        .during("launching table_fold_results")?;
    Ok(())
}

/// `group_resolve`: replaces the table slot of each row by its group id.
pub fn group_resolve(
    launcher: &Launcher<'_>,
    row_groups: &mut CudaSlice<u64>,
    table_groups: &CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = row_groups.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let mut launch = stream.launch_builder(&kernels.group_resolve);
    launch.arg(&mut *row_groups).arg(&n).arg(table_groups);
    // SAFETY: every slot was written by group_insert for the same rows and
    // indexes table_groups (capacity + 1 entries), whose claimed slots hold
    // group ids; reads and writes row_groups[..n].
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching group_resolve")?;
    Ok(())
}

/// Groups a partition of a partitioned group-by may hold
/// (`PART_TABLE_LIMIT` in `group_by.cu`, of 2048 shared-memory slots): a
/// partition that reaches it sets the overflow flag.
pub const PARTITION_GROUP_LIMIT: usize = 1536;

/// Blocks for a launch with one block per partition at a time.
fn partition_blocks(partitions: u64, sm_count: u32) -> u64 {
    partitions.min(u64::from(sm_count) * 32).max(1)
}

/// The outputs of [`partitioned_group_ids`].
pub struct PartitionGroupIds<'a> {
    /// Per position: the slot of its key, then its local group id.
    pub local_ids: &'a mut CudaSlice<u64>,
    /// Per partition: its groups (one more entry, left as it is).
    pub group_counts: &'a mut CudaSlice<u64>,
    /// At `starts[p] + id`: a position of partition `p`'s group `id`.
    pub first_positions: &'a mut CudaSlice<u64>,
    /// One entry, 0 on entry: set where a partition held too many groups.
    pub overflow: &'a mut CudaSlice<u64>,
}

/// `partitioned_group_ids`: numbers the groups of each partition of the
/// radix-partitioned `keys` (`starts`: `partitions + 1` bounds) in shared
/// memory.
pub fn partitioned_group_ids(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    starts: &CudaSlice<u64>,
    out: PartitionGroupIds<'_>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len();
    let partitions = starts.len().saturating_sub(1);
    if partitions == 0 {
        return Err(GpuError::Invalid("no partition bounds".into()));
    }
    check_len(out.local_ids, n, "local group ids")?;
    check_len(out.group_counts, partitions, "partition group counts")?;
    check_len(out.first_positions, n, "group positions")?;
    check_len(out.overflow, 1, "overflow flag")?;
    if n == 0 {
        return Ok(());
    }
    let partitions = partitions as u64;
    let mut launch = stream.launch_builder(&kernels.partitioned_group_ids);
    launch
        .arg(keys)
        .arg(starts)
        .arg(&partitions)
        .arg(out.local_ids)
        .arg(out.group_counts)
        .arg(out.first_positions)
        .arg(out.overflow);
    // SAFETY: `starts` are radix_partition's bounds over these n keys
    // (non-decreasing, last = n), so each partition's positions lie in
    // [0, n), where keys, local ids and first positions hold n entries; a
    // partition's groups are at most its rows, so starts[p] + id stays in
    // its range; group counts hold `partitions` entries; all checked above.
    unsafe { launch.launch(config(partition_blocks(partitions, sm_count))?) }
        .during("launching partitioned_group_ids")?;
    Ok(())
}

/// `partitioned_group_resolve`: with `bases` the exclusive scan of the
/// partitions' group counts (`partitions + 1` entries, the last the
/// total), turns local ids into global ones, writes each group's position
/// to `group_firsts` and the number of groups to `group_count`.
#[allow(clippy::too_many_arguments)]
pub fn partitioned_group_resolve(
    launcher: &Launcher<'_>,
    starts: &CudaSlice<u64>,
    bases: &CudaSlice<u64>,
    row_groups: &mut CudaSlice<u64>,
    first_positions: &CudaSlice<u64>,
    group_firsts: &mut CudaSlice<u64>,
    group_count: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = row_groups.len();
    let partitions = starts.len().saturating_sub(1);
    if partitions == 0 {
        return Err(GpuError::Invalid("no partition bounds".into()));
    }
    check_len(bases, partitions + 1, "partition bases")?;
    check_len(first_positions, n, "group positions")?;
    check_len(group_firsts, n, "group first positions")?;
    check_len(group_count, 1, "group count")?;
    if n == 0 {
        return Ok(());
    }
    let partitions = partitions as u64;
    let mut launch = stream.launch_builder(&kernels.partitioned_group_resolve);
    launch
        .arg(starts)
        .arg(&partitions)
        .arg(bases)
        .arg(&mut *row_groups)
        .arg(first_positions)
        .arg(&mut *group_firsts)
        .arg(&mut *group_count);
    // SAFETY: bounds as in partitioned_group_ids over the same n positions;
    // bases scan counts that partitioned_group_ids wrote (each at most its
    // partition's rows), so base + j < n for every group j, and group_firsts
    // holds n entries; all lengths checked above.
    unsafe { launch.launch(config(partition_blocks(partitions, sm_count))?) }
        .during("launching partitioned_group_resolve")?;
    Ok(())
}

/// `sorted_group_heads`: `heads[i]` = 1 where a run of equal keys starts
/// in the ascending `keys`, else 0.
pub fn sorted_group_heads(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    heads: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len();
    check_len(heads, n, "run heads")?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = stream.launch_builder(&kernels.sorted_group_heads);
    launch.arg(keys).arg(&n64).arg(&mut *heads);
    // SAFETY: reads keys[..n] and writes heads[..n], both checked to hold n.
    unsafe { launch.launch(config(grid_stride_blocks(n64, sm_count))?) }
        .during("launching sorted_group_heads")?;
    Ok(())
}

/// The outputs of `sorted_group_ids`.
pub struct SortedGroupIds<'a> {
    /// The group of every row, indexed by row id.
    pub row_groups: &'a mut CudaSlice<u64>,
    /// Each group's first position in the sorted keys.
    pub group_firsts: &'a mut CudaSlice<u64>,
    /// One entry: the number of groups.
    pub group_count: &'a mut CudaSlice<u64>,
}

/// `sorted_group_ids`: from the ascending `keys`, their `row_ids` (a
/// permutation of `0..n`) and `ranks` (the exclusive scan of
/// [`sorted_group_heads`]), the group of every row, in key order.
pub fn sorted_group_ids(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    ranks: &CudaSlice<u64>,
    row_ids: &CudaSlice<u64>,
    out: SortedGroupIds<'_>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len();
    check_len(ranks, n, "run ranks")?;
    check_len(row_ids, n, "row ids")?;
    check_len(out.row_groups, n, "row groups")?;
    check_len(out.group_firsts, n, "group first positions")?;
    check_len(out.group_count, 1, "group count")?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = stream.launch_builder(&kernels.sorted_group_ids);
    launch
        .arg(keys)
        .arg(ranks)
        .arg(row_ids)
        .arg(&n64)
        .arg(out.row_groups)
        .arg(out.group_firsts)
        .arg(out.group_count);
    // SAFETY: every length is checked above; row ids index row_groups
    // (n entries) because the sort permuted `0..n`, and group ids are
    // below n because there are at most n runs.
    unsafe { launch.launch(config(grid_stride_blocks(n64, sm_count))?) }
        .during("launching sorted_group_ids")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// `aggregate_u64`: reduces `values ^ flip` (unused by [`AggregateOp::Count`])
/// by `op` into `out[group]`, which holds the op's identity on entry. With
/// `tie` = (values of the high word, the high word's result per group), only
/// rows whose high word equals their group's result take part.
pub fn aggregate_u64(
    launcher: &Launcher<'_>,
    rows: GroupRows<'_>,
    values: Option<&CudaSlice<u64>>,
    tie: Option<(&CudaSlice<u64>, &CudaSlice<u64>)>,
    op: AggregateOp,
    flip: u64,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    rows.check()?;
    check_len(out, rows.groups, "aggregate output")?;
    match values {
        Some(values) => check_len(values, rows.reduced(), "aggregate input")?,
        None if op != AggregateOp::Count => {
            return Err(GpuError::Invalid(format!("{op:?} without values")))
        }
        None => {}
    }
    if let Some((tie_values, tie_best)) = tie {
        check_len(tie_values, rows.reduced(), "tie values")?;
        check_len(tie_best, rows.groups, "tie results")?;
    }
    if rows.reduced() == 0 {
        return Ok(());
    }
    let (first, n) = rows.kernel_bounds();
    let op_code = op as u32;
    let groups = rows.groups as u64;
    let privatize = u32::from(rows.privatize());
    let mut launch = stream.launch_builder(&kernels.aggregate_u64);
    arg_or_null(&mut launch, rows.groups_of_rows);
    arg_or_null(&mut launch, values);
    arg_or_null(&mut launch, rows.valid_bits);
    arg_or_null(&mut launch, tie.map(|(values, _)| values));
    arg_or_null(&mut launch, tie.map(|(_, best)| best));
    launch
        .arg(&first)
        .arg(&n)
        .arg(&op_code)
        .arg(&flip)
        .arg(&mut *out)
        .arg(&groups)
        .arg(&privatize);
    let mut cfg = config(rows.blocks(sm_count))?;
    if privatize == 1 {
        cfg.shared_mem_bytes = (8 * groups) as u32;
    }
    // SAFETY: group ids are < groups (written by the numbering kernels, or
    // put back in row order by scatter_u64, for these rows; or absent
    // meaning 0 with groups = 1); the group ids hold `rows` entries and the
    // bitmap rows/64 words, the values and tie values the `n - first` rows
    // reduced, read at `i - first` for `first <= i < n <= rows` (`groups`
    // for tie results and out), all checked above; null pointers stand
    // only for absent optional inputs, which the kernel tests before use;
    // shared memory holds `groups` u64 when privatized (at most 32 KiB).
    unsafe { launch.launch(cfg) }.during("launching aggregate_u64")?;
    Ok(())
}

/// How [`aggregate_gathered`] reads the values of its column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatheredValues {
    /// 8-byte values, as they are.
    Eight,
    /// 4-byte values, sign-extended to 64 bits (Int32, Date32, Time32).
    FourSigned,
    /// 4-byte values, zero-extended to 64 bits (UInt32).
    FourUnsigned,
}

impl GatheredValues {
    /// The width of the values in the column's words.
    pub fn width(self) -> ValueWidth {
        match self {
            GatheredValues::Eight => ValueWidth::Eight,
            GatheredValues::FourSigned | GatheredValues::FourUnsigned => ValueWidth::Four,
        }
    }
}

/// `aggregate_gathered`: folds `src[ids[i]] ^ flip` for `i < len` (`src`
/// holds `src_values` values read as `values` says, packed in its words) by
/// `op` (not [`AggregateOp::Count`]) into `out[0]`, which holds the op's
/// identity on entry: a gather by row id and a reduction without groups in
/// one pass, the gathered column never written out.
#[allow(clippy::too_many_arguments)]
pub fn aggregate_gathered(
    launcher: &Launcher<'_>,
    src: &CudaSlice<u64>,
    src_values: usize,
    values: GatheredValues,
    ids: &CudaSlice<u64>,
    len: usize,
    op: AggregateOp,
    flip: u64,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    if op == AggregateOp::Count {
        return Err(GpuError::Invalid("a gathered COUNT".into()));
    }
    let width = values.width();
    width.check_source(src, src_values, "aggregate source")?;
    check_len(ids, len, "aggregate ids")?;
    check_len(out, 1, "aggregate output")?;
    if len == 0 {
        return Ok(());
    }
    let (src_len, n) = (src_values as u64, len as u64);
    let width_bytes = width.bytes() as u32;
    let sign_extend = u32::from(values == GatheredValues::FourSigned);
    let op_code = op as u32;
    let mut launch = stream.launch_builder(&kernels.aggregate_gathered);
    launch
        .arg(src)
        .arg(&src_len)
        .arg(&width_bytes)
        .arg(&sign_extend)
        .arg(ids)
        .arg(&n)
        .arg(&op_code)
        .arg(&flip)
        .arg(&mut *out);
    // SAFETY: the kernel reads ids[..len] and, for each id below
    // src_values, one value of `width` bytes at that index, which lies within
    // src's words (checked above); it writes only out[0], which exists. The
    // source is a whole allocation, aligned for 8-byte reads.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching aggregate_gathered")?;
    Ok(())
}

/// `aggregate_f64_sum`: sums the doubles whose bits are in `values` into
/// `out[group]` (bits of 0.0 on entry).
pub fn aggregate_f64_sum(
    launcher: &Launcher<'_>,
    rows: GroupRows<'_>,
    values: &CudaSlice<u64>,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    rows.check()?;
    check_len(out, rows.groups, "aggregate output")?;
    check_len(values, rows.reduced(), "aggregate input")?;
    if rows.reduced() == 0 {
        return Ok(());
    }
    let (first, n) = rows.kernel_bounds();
    let groups = rows.groups as u64;
    let privatize = u32::from(rows.privatize());
    let mut launch = stream.launch_builder(&kernels.aggregate_f64_sum);
    arg_or_null(&mut launch, rows.groups_of_rows);
    launch.arg(values);
    arg_or_null(&mut launch, rows.valid_bits);
    launch
        .arg(&first)
        .arg(&n)
        .arg(&mut *out)
        .arg(&groups)
        .arg(&privatize);
    let mut cfg = config(rows.blocks(sm_count))?;
    if privatize == 1 {
        cfg.shared_mem_bytes = (8 * groups) as u32;
    }
    // SAFETY: as aggregate_u64; doubles and u64 have the same size, and the
    // kernel reads the bits as doubles.
    unsafe { launch.launch(cfg) }.during("launching aggregate_f64_sum")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// `aggregate_i128_sum`: wrapping 128-bit sums of (`lo`, `hi`) word pairs
/// into (`out_lo`, `out_hi`), zero on entry.
pub fn aggregate_i128_sum(
    launcher: &Launcher<'_>,
    rows: GroupRows<'_>,
    lo: &CudaSlice<u64>,
    hi: &CudaSlice<u64>,
    out_lo: &mut CudaSlice<u64>,
    out_hi: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    rows.check()?;
    check_len(lo, rows.reduced(), "aggregate input (low words)")?;
    check_len(hi, rows.reduced(), "aggregate input (high words)")?;
    check_len(out_lo, rows.groups, "aggregate output (low words)")?;
    check_len(out_hi, rows.groups, "aggregate output (high words)")?;
    if rows.reduced() == 0 {
        return Ok(());
    }
    let (first, n) = rows.kernel_bounds();
    let mut launch = stream.launch_builder(&kernels.aggregate_i128_sum);
    arg_or_null(&mut launch, rows.groups_of_rows);
    launch.arg(lo).arg(hi);
    arg_or_null(&mut launch, rows.valid_bits);
    launch
        .arg(&first)
        .arg(&n)
        .arg(&mut *out_lo)
        .arg(&mut *out_hi);
    // SAFETY: as aggregate_u64, without shared memory.
    unsafe { launch.launch(config(grid_stride_blocks(n - first, sm_count))?) }
        .during("launching aggregate_i128_sum")?;
    Ok(())
}

/// `f64_sum_scale`: pass 1 of the deterministic double sum. Per group, the
/// largest exponent field of its finite values into `max_exponent` and the
/// NaN (1), +inf (2), -inf (4) flags it saw into `specials`, both 0 on entry.
pub fn f64_sum_scale(
    launcher: &Launcher<'_>,
    rows: GroupRows<'_>,
    values: &CudaSlice<u64>,
    max_exponent: &mut CudaSlice<u64>,
    specials: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    rows.check()?;
    rows.whole()?;
    check_len(values, rows.rows, "aggregate input")?;
    check_len(max_exponent, rows.groups, "largest exponents")?;
    check_len(specials, rows.groups, "special values")?;
    if rows.rows == 0 {
        return Ok(());
    }
    let n = rows.rows as u64;
    let mut launch = stream.launch_builder(&kernels.f64_sum_scale);
    arg_or_null(&mut launch, rows.groups_of_rows);
    launch.arg(values);
    arg_or_null(&mut launch, rows.valid_bits);
    launch.arg(&n).arg(&mut *max_exponent).arg(&mut *specials);
    // SAFETY: as aggregate_u64, without shared memory: group ids < groups,
    // inputs of `rows` entries, outputs of `groups`, all checked above.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching f64_sum_scale")?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// `f64_sum_fixed`: pass 2 of the deterministic double sum. Adds each
/// finite value, as a fixed-point integer on its group's scale from
/// `max_exponent` (pass 1), into the 128-bit sums (`out_lo`, `out_hi`),
/// zero on entry.
pub fn f64_sum_fixed(
    launcher: &Launcher<'_>,
    rows: GroupRows<'_>,
    values: &CudaSlice<u64>,
    max_exponent: &CudaSlice<u64>,
    out_lo: &mut CudaSlice<u64>,
    out_hi: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    rows.check()?;
    rows.whole()?;
    check_len(values, rows.rows, "aggregate input")?;
    check_len(max_exponent, rows.groups, "largest exponents")?;
    check_len(out_lo, rows.groups, "aggregate output (low words)")?;
    check_len(out_hi, rows.groups, "aggregate output (high words)")?;
    if rows.rows == 0 {
        return Ok(());
    }
    let n = rows.rows as u64;
    let mut launch = stream.launch_builder(&kernels.f64_sum_fixed);
    arg_or_null(&mut launch, rows.groups_of_rows);
    launch.arg(values);
    arg_or_null(&mut launch, rows.valid_bits);
    launch
        .arg(&n)
        .arg(max_exponent)
        .arg(&mut *out_lo)
        .arg(&mut *out_hi);
    // SAFETY: as f64_sum_scale; the shifts are bounded in the kernel.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching f64_sum_fixed")?;
    Ok(())
}

#[cfg(test)]
#[path = "group_by_tests.rs"]
mod tests;
