//! Typed launches of the kernels in `ptx/`. Each function states the kernel's
//! launch contract once (grid, block, what must hold on entry), so the
//! algorithms above never build raw argument lists.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::{DriverResultExt, GpuError, GpuResult};

mod gather;
mod hash_seed;
mod launcher;
mod group_by;
mod group_order;
mod kept_groups;
mod join_tasks;
mod merge_join;
mod radix;
mod remap;
mod scan_aggregate;
mod scan_filter;
pub use launcher::Launcher;
pub use group_order::{group_min_rows, table_group_min_rows};
pub use kept_groups::{group_keep_compare, group_keep_ids, CompareOp, GroupValues};
#[cfg(any(test, feature = "test-support"))]
pub use hash_seed::hash_seed;
use hash_seed::set_hash_seed;
pub use gather::{
    gather_bits, gather_u64, gather_values, scatter_u64, set_table_bits, widen_words, ValueWidth,
};
pub use group_by::{
    aggregate_f64_sum, aggregate_gathered, aggregate_i128_sum, aggregate_u64, f64_sum_fixed,
    f64_sum_scale, fill_u64, group_insert, group_insert_fold, group_resolve,
    partitioned_group_ids, partitioned_group_resolve, sorted_group_heads, sorted_group_ids,
    table_fold_results, table_slot_words, AggregateOp, FoldTable, GatheredValues, GroupRows, PartitionGroupIds,
    SortedGroupIds, TableFold, MAX_TABLE_FOLDS, PARTITION_GROUP_LIMIT,
};
#[cfg(any(test, feature = "test-support"))]
pub use group_by::PRIVATIZED_GROUPS;
pub use join_tasks::JoinTasks;
use join_tasks::{check_join_tasks, push_join_tasks};
pub use radix::{
    largest_partition, partition_bounds, radix_histogram, radix_scatter, RadixDigits, RadixGrid,
};
pub use merge_join::{expand_pairs, merge_path_bounds, ordered_codes, CodeTransform, MergeBound};
#[cfg(any(test, feature = "test-support"))]
pub use merge_join::MERGE_TILE;
pub use scan_aggregate::{
    scan_aggregate, AccumulatorKind, ScanAggregateOutput, ScanChunk, ScanColumn, ScanOp,
    ScanProgram, SCAN_MAX_INSTRUCTIONS, SCAN_MAX_SLOTS, SCAN_REGISTERS,
};
#[cfg(any(test, feature = "test-support"))]
pub use scan_aggregate::{accumulator_init, SCAN_MAX_SHARED_BYTES};
pub use remap::{RemapTable, RemapUploads, SharedWords, TableWords};
#[cfg(any(test, feature = "test-support"))]
pub use remap::SHARED_TABLE_MIN_WORDS;
pub use scan_filter::{FilterLaunch, FilterProgram, OUTPUT_HAS_NULL, OUTPUT_IS_WIDE};
#[cfg(any(test, feature = "test-support"))]
pub use scan_filter::FILTER_TILE;

/// Threads per block of every kernel (`BLOCK_THREADS` in `ptx/common.cuh`).
pub const BLOCK_THREADS: u32 = 256;
/// Values scanned per block by `scan_tiles` (`SCAN_TILE` in `ptx/scan.cu`).
pub const SCAN_TILE: usize = 1024;
/// Largest digit of one radix pass (`MAX_RADIX_BITS` in `ptx/radix_partition.cu`).
pub const MAX_RADIX_BITS: u32 = 8;
/// Build rows per shared-memory hash table (`TABLE_CAPACITY` in `ptx/hash_join.cu`).
pub const JOIN_TABLE_CAPACITY: usize = 2048;

const SCAN_PTX: &str = include_str!("../../../ptx/scan.ptx");
const RADIX_PARTITION_PTX: &str = include_str!("../../../ptx/radix_partition.ptx");
const HASH_JOIN_PTX: &str = include_str!("../../../ptx/hash_join.ptx");
const GROUP_BY_PTX: &str = include_str!("../../../ptx/group_by.ptx");
const MERGE_JOIN_PTX: &str = include_str!("../../../ptx/merge_join.ptx");
const GATHER_PTX: &str = include_str!("../../../ptx/gather.ptx");
const SCAN_AGGREGATE_PTX: &str = include_str!("../../../ptx/scan_aggregate.ptx");
const SCAN_FILTER_PTX: &str = include_str!("../../../ptx/scan_filter.ptx");

/// Every kernel of the crate, loaded into one device context.
#[derive(Debug)]
pub struct Kernels {
    _modules: Vec<Arc<CudaModule>>,
    scan_tiles: CudaFunction,
    scan_add_tile_offsets: CudaFunction,
    iota_u64: CudaFunction,
    radix_histogram: CudaFunction,
    radix_scatter: CudaFunction,
    radix_sort_histogram: CudaFunction,
    radix_sort_scatter: CudaFunction,
    merge_path_bounds: CudaFunction,
    expand_pairs: CudaFunction,
    ordered_codes: CudaFunction,
    gather_u32: CudaFunction,
    gather_u64: CudaFunction,
    gather_u128: CudaFunction,
    scatter_u64: CudaFunction,
    set_table_bits: CudaFunction,
    gather_bits: CudaFunction,
    widen_words: CudaFunction,
    partition_bounds: CudaFunction,
    largest_partition: CudaFunction,
    hash_join_count: CudaFunction,
    hash_join_write: CudaFunction,
    hash_join_fold: CudaFunction,
    pack_carried_words: CudaFunction,
    pack_key_words: CudaFunction,
    fill_u64: CudaFunction,
    group_keep_compare: CudaFunction,
    group_keep_ids: CudaFunction,
    group_insert: CudaFunction,
    /// One per fold count, 1 to [`MAX_TABLE_FOLDS`].
    group_insert_fold: [CudaFunction; MAX_TABLE_FOLDS],
    table_fold_results: CudaFunction,
    group_min_rows: CudaFunction,
    table_group_min_rows: CudaFunction,
    group_resolve: CudaFunction,
    partitioned_group_ids: CudaFunction,
    partitioned_group_resolve: CudaFunction,
    sorted_group_heads: CudaFunction,
    sorted_group_ids: CudaFunction,
    aggregate_u64: CudaFunction,
    aggregate_gathered: CudaFunction,
    aggregate_f64_sum: CudaFunction,
    aggregate_i128_sum: CudaFunction,
    f64_sum_scale: CudaFunction,
    f64_sum_fixed: CudaFunction,
    scan_aggregate: CudaFunction,
    scan_filter_count: CudaFunction,
    scan_filter_write: CudaFunction,
    scan_filter_narrow: CudaFunction,
    scan_filter_string_lengths: CudaFunction,
    scan_filter_string_copy: CudaFunction,
    /// Blocks of each join kernel a multiprocessor holds at once.
    join_residency: JoinResidency,
}

/// Blocks of each of `hash_join_count`, `_write` and `_fold` that fit one
/// multiprocessor at once (registers and shared memory bound them,
/// differently for each kernel and device), asked of the driver once the
/// kernels are loaded.
#[derive(Debug, Clone, Copy)]
struct JoinResidency {
    count: u32,
    write: u32,
    fold: u32,
}

impl JoinResidency {
    fn of(count: &CudaFunction, write: &CudaFunction, fold: &CudaFunction) -> GpuResult<Self> {
        let resident = |function: &CudaFunction| {
            function
                .occupancy_max_active_blocks_per_multiprocessor(BLOCK_THREADS, 0, None)
                // At least one, so that a grid is never empty: a kernel
                // that fits nowhere then fails at launch, with an error.
                .map(|blocks| blocks.max(1))
                .during("asking the driver how many join blocks fit a multiprocessor")
        };
        Ok(Self {
            count: resident(count)?,
            write: resident(write)?,
            fold: resident(fold)?,
        })
    }
}

impl Kernels {
    /// JIT-compiles the embedded PTX for the context's device and looks up
    /// every kernel.
    pub fn load(ctx: &Arc<cudarc::driver::CudaContext>) -> GpuResult<Self> {
        let seeding = ctx.default_stream();
        let load = |src: &str| -> GpuResult<Arc<CudaModule>> {
            let module = ctx
                .load_module(Ptx::from_src(src))
                .during("loading PTX into the device")?;
            set_hash_seed(&module, &seeding)?;
            Ok(module)
        };
        let scan = load(SCAN_PTX)?;
        let radix = load(RADIX_PARTITION_PTX)?;
        let join = load(HASH_JOIN_PTX)?;
        let group_by = load(GROUP_BY_PTX)?;
        let merge = load(MERGE_JOIN_PTX)?;
        let gather = load(GATHER_PTX)?;
        let scan_aggregate = load(SCAN_AGGREGATE_PTX)?;
        let scan_filter = load(SCAN_FILTER_PTX)?;
        let function = |module: &Arc<CudaModule>, name: &'static str| {
            module
                .load_function(name)
                .during("looking up a kernel in the PTX")
        };
        let hash_join_count = function(&join, "hash_join_count")?;
        let hash_join_write = function(&join, "hash_join_write")?;
        let hash_join_fold = function(&join, "hash_join_fold")?;
        let join_residency =
            JoinResidency::of(&hash_join_count, &hash_join_write, &hash_join_fold)?;
        Ok(Self {
            scan_tiles: function(&scan, "scan_tiles")?,
            scan_add_tile_offsets: function(&scan, "scan_add_tile_offsets")?,
            iota_u64: function(&radix, "iota_u64")?,
            radix_histogram: function(&radix, "radix_histogram")?,
            radix_scatter: function(&radix, "radix_scatter")?,
            radix_sort_histogram: function(&radix, "radix_sort_histogram")?,
            radix_sort_scatter: function(&radix, "radix_sort_scatter")?,
            merge_path_bounds: function(&merge, "merge_path_bounds")?,
            expand_pairs: function(&merge, "expand_pairs")?,
            ordered_codes: function(&merge, "ordered_codes")?,
            gather_u32: function(&gather, "gather_u32")?,
            gather_u64: function(&gather, "gather_u64")?,
            gather_u128: function(&gather, "gather_u128")?,
            scatter_u64: function(&gather, "scatter_u64")?,
            set_table_bits: function(&gather, "set_table_bits")?,
            gather_bits: function(&gather, "gather_bits")?,
            widen_words: function(&gather, "widen_words")?,
            partition_bounds: function(&radix, "partition_bounds")?,
            largest_partition: function(&radix, "largest_partition")?,
            hash_join_count,
            hash_join_write,
            hash_join_fold,
            pack_carried_words: function(&join, "pack_carried_words")?,
            pack_key_words: function(&join, "pack_key_words")?,
            fill_u64: function(&group_by, "fill_u64")?,
            group_keep_compare: function(&group_by, "group_keep_compare")?,
            group_keep_ids: function(&group_by, "group_keep_ids")?,
            group_insert: function(&group_by, "group_insert")?,
            group_insert_fold: [
                function(&group_by, "group_insert_fold_1")?,
                function(&group_by, "group_insert_fold_2")?,
                function(&group_by, "group_insert_fold_3")?,
                function(&group_by, "group_insert_fold_4")?,
            ],
            table_fold_results: function(&group_by, "table_fold_results")?,
            group_min_rows: function(&group_by, "group_min_rows")?,
            table_group_min_rows: function(&group_by, "table_group_min_rows")?,
            group_resolve: function(&group_by, "group_resolve")?,
            partitioned_group_ids: function(&group_by, "partitioned_group_ids")?,
            partitioned_group_resolve: function(&group_by, "partitioned_group_resolve")?,
            sorted_group_heads: function(&group_by, "sorted_group_heads")?,
            sorted_group_ids: function(&group_by, "sorted_group_ids")?,
            aggregate_u64: function(&group_by, "aggregate_u64")?,
            aggregate_gathered: function(&group_by, "aggregate_gathered")?,
            aggregate_f64_sum: function(&group_by, "aggregate_f64_sum")?,
            aggregate_i128_sum: function(&group_by, "aggregate_i128_sum")?,
            f64_sum_scale: function(&group_by, "f64_sum_scale")?,
            f64_sum_fixed: function(&group_by, "f64_sum_fixed")?,
            scan_aggregate: function(&scan_aggregate, "scan_aggregate")?,
            scan_filter_count: function(&scan_filter, "scan_filter_count")?,
            scan_filter_write: function(&scan_filter, "scan_filter_write")?,
            scan_filter_narrow: function(&scan_filter, "scan_filter_narrow")?,
            scan_filter_string_lengths: function(&scan_filter, "scan_filter_string_lengths")?,
            scan_filter_string_copy: function(&scan_filter, "scan_filter_string_copy")?,
            join_residency,
            _modules: vec![scan, radix, join, group_by, merge, gather, scan_aggregate, scan_filter],
        })
    }
}

fn config(grid: u64) -> GpuResult<LaunchConfig> {
    let grid = u32::try_from(grid.max(1)).map_err(|_| {
        GpuError::Invalid(format!("grid of {grid} blocks exceeds the launch limit"))
    })?;
    Ok(LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn check_len<T>(slice: &CudaSlice<T>, needed: usize, what: &str) -> GpuResult<()> {
    if slice.len() < needed {
        return Err(GpuError::Invalid(format!(
            "{what} holds {} elements, {needed} needed",
            slice.len()
        )));
    }
    Ok(())
}

/// Blocks for a grid-stride loop over `n` items: enough to fill the device,
/// no more than the items need.
pub fn grid_stride_blocks(n: u64, sm_count: u32) -> u64 {
    n.div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, u64::from(sm_count) * 16)
}

/// `scan_tiles`: scans `values[..n]` in place per tile of [`SCAN_TILE`] and
/// writes each tile's total to `tile_totals` (one per tile).
pub fn scan_tiles(
    launcher: &Launcher<'_>,
    values: &mut CudaSlice<u64>,
    n: usize,
    tile_totals: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    let tiles = n.div_ceil(SCAN_TILE);
    check_len(values, n, "scan input")?;
    check_len(tile_totals, tiles, "scan tile totals")?;
    let n64 = n as u64;
    let mut launch = stream.launch_builder(&kernels.scan_tiles);
    launch.arg(values).arg(&n64).arg(tile_totals);
    // SAFETY: the kernel reads and writes values[..n] and writes
    // tile_totals[..tiles]; both lengths were checked above.
    unsafe { launch.launch(config(tiles as u64)?) }.during("launching scan_tiles")?;
    Ok(())
}

/// `scan_add_tile_offsets`: adds `tile_offsets[t]` to every value of tile `t`.
pub fn scan_add_tile_offsets(
    launcher: &Launcher<'_>,
    values: &mut CudaSlice<u64>,
    n: usize,
    tile_offsets: &CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    let tiles = n.div_ceil(SCAN_TILE);
    check_len(values, n, "scan values")?;
    check_len(tile_offsets, tiles, "scan tile offsets")?;
    let n64 = n as u64;
    let mut launch = stream.launch_builder(&kernels.scan_add_tile_offsets);
    launch.arg(values).arg(&n64).arg(tile_offsets);
    // SAFETY: reads tile_offsets[..tiles], updates values[..n]; lengths checked.
    unsafe { launch.launch(config(tiles as u64)?) }.during("launching scan_add_tile_offsets")?;
    Ok(())
}

/// `iota_u64`: `out[i] = first + i` for `i < out.len()`.
pub fn iota(
    launcher: &Launcher<'_>,
    out: &mut CudaSlice<u64>,
    first: u64,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = out.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let mut launch = stream.launch_builder(&kernels.iota_u64);
    launch.arg(&mut *out).arg(&n).arg(&first);
    // SAFETY: writes out[..n] with n = out.len().
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching iota_u64")?;
    Ok(())
}

/// `iota_u64` aimed at an address no allocation of the context covers: the
/// launch faults, which breaks the context (the tests of recovery from
/// device faults).
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn write_to_unowned_address(launcher: &Launcher<'_>) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    // The lowest page of the address space, which the driver never maps.
    let (address, n, first) = (0x100u64, 1024u64, 0u64);
    let mut launch = stream.launch_builder(&kernels.iota_u64);
    launch.arg(&address).arg(&n).arg(&first);
    // SAFETY: the kernel writes device memory only, and at an unmapped
    // address, so it faults on the device and breaks this context, which is
    // the point: no host memory and no allocation of anyone is touched, and
    // every later call on the broken context returns the fault's error.
    unsafe { launch.launch(config(grid_stride_blocks(n, 1))?) }
        .during("launching a kernel at an unowned address")?;
    Ok(())
}

/// Device inputs of the join kernels: one radix-partitioned side.
#[derive(Debug, Clone, Copy)]
pub struct PartitionedSide<'a> {
    /// Keys ordered by partition (one-word rows: the key in each word's
    /// low half, the row's word in its high half, see [`pack_key_words`]).
    pub keys: &'a CudaSlice<u64>,
    /// Row ids in the same order (or the words a side carries in
    /// their place, see [`pack_carried_words`]); `None` for one-word rows.
    pub row_ids: Option<&'a CudaSlice<u64>>,
    /// 2^partition_bits + 1 partition starts.
    pub starts: &'a CudaSlice<u64>,
}

/// The kernels' `layouts`: which sides are one word a row
/// (`BUILD_ONE_WORD`, `PROBE_ONE_WORD` in `ptx/hash_join.cu`).
fn join_layouts(build: &PartitionedSide<'_>, probe: &PartitionedSide<'_>) -> u32 {
    u32::from(build.row_ids.is_none()) | (u32::from(probe.row_ids.is_none()) << 1)
}

fn check_join_inputs(
    build: &PartitionedSide<'_>,
    probe: &PartitionedSide<'_>,
    partition_bits: u32,
) -> GpuResult<()> {
    for side in [build, probe] {
        check_len(
            side.starts,
            (1usize << partition_bits) + 1,
            "partition starts",
        )?;
        if let Some(row_ids) = side.row_ids {
            check_len(row_ids, side.keys.len(), "row ids")?;
        }
    }
    Ok(())
}

/// A kernel parameter that is a null pointer: an absent optional input,
/// which the kernel never reads.
static NULL_POINTER: u64 = 0;

/// Pushes `slice`, or [`NULL_POINTER`] where it is absent.
fn arg_or_null<'a>(launch: &mut cudarc::driver::LaunchArgs<'a>, slice: Option<&'a CudaSlice<u64>>) {
    match slice {
        Some(slice) => launch.arg(slice),
        None => launch.arg(&NULL_POINTER),
    };
}

/// Blocks for a join kernel over `tasks` tasks: one task per block at a
/// time, and no more blocks than the device holds at once (`resident` a
/// multiprocessor). Each block strides over the tasks; a grid of more
/// blocks than fit would run its last wave on part of the device (at 8
/// blocks a multiprocessor in place of the fold's 3, a third of its time
/// on two thirds of the device's block slots).
fn join_blocks(tasks: u64, sm_count: u32, resident: u32) -> u64 {
    tasks.clamp(1, u64::from(sm_count) * u64::from(resident))
}

/// The launch of a join kernel over the tasks in `range` ([`join_blocks`]).
fn join_config(
    range: &std::ops::Range<u64>,
    sm_count: u32,
    resident: u32,
) -> GpuResult<LaunchConfig> {
    config(join_blocks(range.end - range.start, sm_count, resident))
}

/// Pushes the arguments `hash_join_write` and `hash_join_fold` begin with:
/// both sides' keys, row ids and partition starts, the task list, the
/// sides' layouts, the partition bits and the task range.
fn push_join_work<'a>(
    launch: &mut cudarc::driver::LaunchArgs<'a>,
    build: &PartitionedSide<'a>,
    probe: &PartitionedSide<'a>,
    tasks: &Option<JoinTasks<'a>>,
    layouts: &'a u32,
    partition_bits: &'a u32,
    range: &'a std::ops::Range<u64>,
) {
    launch.arg(build.keys);
    arg_or_null(launch, build.row_ids);
    launch.arg(build.starts).arg(probe.keys);
    arg_or_null(launch, probe.row_ids);
    launch.arg(probe.starts);
    push_join_tasks(launch, tasks);
    launch
        .arg(layouts)
        .arg(partition_bits)
        .arg(&range.start)
        .arg(&range.end);
}

/// `hash_join_count`: `match_counts[t]` = matching pairs of task `t` (of
/// partition `t` without a task list), for `t` in `range`.
#[allow(clippy::too_many_arguments)]
pub fn hash_join_count(
    launcher: &Launcher<'_>,
    build: PartitionedSide<'_>,
    probe: PartitionedSide<'_>,
    tasks: Option<JoinTasks<'_>>,
    partition_bits: u32,
    range: std::ops::Range<u64>,
    match_counts: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_join_inputs(&build, &probe, partition_bits)?;
    check_join_tasks(tasks, partition_bits, &range)?;
    check_len(match_counts, range.end as usize, "match counts")?;
    let layouts = join_layouts(&build, &probe);
    let mut launch = stream.launch_builder(&kernels.hash_join_count);
    launch
        .arg(build.keys)
        .arg(build.starts)
        .arg(probe.keys)
        .arg(probe.starts);
    push_join_tasks(&mut launch, &tasks);
    launch
        .arg(&layouts)
        .arg(&partition_bits)
        .arg(&range.start)
        .arg(&range.end)
        .arg(match_counts);
    let config = join_config(&range, sm_count, kernels.join_residency.count)?;
    // SAFETY: starts bound every key access; a task list's rows lie within
    // both sides' rows (`ops::hash_join::JoinTaskList` checks every range
    // against them before it uploads the list); match_counts holds the
    // range.
    unsafe { launch.launch(config) }.during("launching hash_join_count")?;
    Ok(())
}

/// `hash_join_write`: writes the (build row id, probe row id) pairs of the
/// tasks in `range` to `out_*[match_offsets[t] - output_base ..]`.
#[allow(clippy::too_many_arguments)]
pub fn hash_join_write(
    launcher: &Launcher<'_>,
    build: PartitionedSide<'_>,
    probe: PartitionedSide<'_>,
    tasks: Option<JoinTasks<'_>>,
    partition_bits: u32,
    range: std::ops::Range<u64>,
    match_offsets: &CudaSlice<u64>,
    output_base: u64,
    output_len: usize,
    out_build_ids: &mut CudaSlice<u64>,
    out_probe_ids: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_join_inputs(&build, &probe, partition_bits)?;
    check_join_tasks(tasks, partition_bits, &range)?;
    check_len(match_offsets, range.end as usize, "match offsets")?;
    check_len(out_build_ids, output_len, "output build ids")?;
    check_len(out_probe_ids, output_len, "output probe ids")?;
    let layouts = join_layouts(&build, &probe);
    let mut launch = stream.launch_builder(&kernels.hash_join_write);
    push_join_work(
        &mut launch,
        &build,
        &probe,
        &tasks,
        &layouts,
        &partition_bits,
        &range,
    );
    launch
        .arg(match_offsets)
        .arg(&output_base)
        .arg(out_build_ids)
        .arg(out_probe_ids);
    let config = join_config(&range, sm_count, kernels.join_residency.write)?;
    // SAFETY: the caller passes the offsets of hash_join_count over the same
    // inputs and tasks, and output_len >= the range's match total, so every
    // write lands in [0, output_len); the other lengths are checked above; a
    // one-word side's null row-id array is never read (its `layouts` bit).
    unsafe { launch.launch(config) }.during("launching hash_join_write")?;
    Ok(())
}

/// Folds [`hash_join_fold`] computes at most in one launch (`MAX_JOIN_FOLDS`
/// in `ptx/hash_join.cu`).
pub const MAX_JOIN_FOLDS: usize = 4;

/// Which row of a pair a fold reads its value at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairSide {
    Build,
    Probe,
}

/// How a fold combines its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldOp {
    /// Wrapping sum, unsigned minimum or unsigned maximum of the words, or
    /// (table folds only: a join counts its pairs apart) the valid rows.
    Words(AggregateOp),
    /// Sum of the doubles whose bits the words are, in the order the
    /// device's atomics add.
    SumF64,
}

impl FoldOp {
    /// The op code of `ptx/fold.cuh` (`FOLD_F64_SUM` for a float sum).
    fn code(self) -> u64 {
        match self {
            FoldOp::Words(op) => op as u64,
            FoldOp::SumF64 => 4,
        }
    }

    /// The word the fold starts from.
    pub fn identity(self) -> u64 {
        match self {
            FoldOp::Words(op) => op.identity(),
            FoldOp::SumF64 => 0f64.to_bits(),
        }
    }
}

/// Where a fold finds its value in the word its side carried through the
/// partitioning in place of a row id (seed 002's GFTR; see
/// [`pack_carried_words`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarriedSlot {
    /// The word is the 8-byte value.
    Whole,
    /// The 4-byte value in the word's low half.
    Low,
    /// The 4-byte value in the word's high half.
    High,
}

impl CarriedSlot {
    /// The width of the value the slot holds.
    pub fn width(self) -> ValueWidth {
        match self {
            CarriedSlot::Whole => ValueWidth::Eight,
            CarriedSlot::Low | CarriedSlot::High => ValueWidth::Four,
        }
    }
}

/// One aggregate [`hash_join_fold`] folds over the pairs: `op` over
/// `values[id] ^ flip`, where `id` is the pair's row of `side` and
/// `values` holds the column's `rows` values packed in words. Where its
/// side carried its values in place of row ids, `carried` says where the
/// value lies in the side's word, and `values` is not read.
#[derive(Debug, Clone, Copy)]
pub struct JoinFold<'a> {
    pub side: PairSide,
    pub values: &'a CudaSlice<u64>,
    pub rows: usize,
    pub read: GatheredValues,
    pub op: FoldOp,
    pub flip: u64,
    pub carried: Option<CarriedSlot>,
}

impl JoinFold<'_> {
    /// The three words of the kernel's `specs` for this fold.
    fn spec(&self) -> [u64; 3] {
        let width = self.read.width().bytes() as u64;
        let sign_extend = u64::from(self.read == GatheredValues::FourSigned) << 8;
        let probe_side = u64::from(self.side == PairSide::Probe) << 9;
        let carried = match self.carried {
            None => 0,
            Some(CarriedSlot::Whole | CarriedSlot::Low) => 1 << 10,
            Some(CarriedSlot::High) => (1 << 10) | (1 << 11),
        };
        [
            self.rows as u64,
            width | sign_extend | probe_side | carried | (self.op.code() << 16),
            self.flip,
        ]
    }

    /// The kernel's `specs` for `folds`.
    pub fn specs(folds: &[JoinFold<'_>]) -> Vec<u64> {
        folds.iter().flat_map(JoinFold::spec).collect()
    }
}

/// `hash_join_fold`: over the pairs of the tasks in `range`, `out[0] +=`
/// the pairs and `out[1 + f]` folds fold `f`'s value of each pair, without
/// writing the pairs. `specs` is [`JoinFold::specs`] of `folds`, on the
/// device; `out` holds `1 + folds.len()` words, 0 and each fold's identity
/// on entry.
#[allow(clippy::too_many_arguments)]
pub fn hash_join_fold(
    launcher: &Launcher<'_>,
    build: PartitionedSide<'_>,
    probe: PartitionedSide<'_>,
    tasks: Option<JoinTasks<'_>>,
    partition_bits: u32,
    range: std::ops::Range<u64>,
    folds: &[JoinFold<'_>],
    specs: &CudaSlice<u64>,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_join_inputs(&build, &probe, partition_bits)?;
    check_join_tasks(tasks, partition_bits, &range)?;
    if folds.len() > MAX_JOIN_FOLDS {
        return Err(GpuError::Invalid(format!(
            "{} folds in one join, at most {MAX_JOIN_FOLDS}",
            folds.len()
        )));
    }
    for fold in folds {
        if fold.op == FoldOp::Words(AggregateOp::Count) {
            return Err(GpuError::Invalid("a folded COUNT".into()));
        }
        if fold.op == FoldOp::SumF64 && fold.read != GatheredValues::Eight {
            return Err(GpuError::Invalid("a float sum of 4-byte values".into()));
        }
        fold.read
            .width()
            .check_source(fold.values, fold.rows, "fold source")?;
        if let Some(slot) = fold.carried {
            if slot.width() != fold.read.width() {
                return Err(GpuError::Invalid(format!(
                    "a fold of {}-byte values carried in a {slot:?} slot",
                    fold.read.width().bytes()
                )));
            }
        }
    }
    check_len(specs, 3 * folds.len(), "fold specs")?;
    check_len(out, 1 + folds.len(), "fold output")?;
    let fold_count = folds.len() as u32;
    let layouts = join_layouts(&build, &probe);
    let mut launch = stream.launch_builder(&kernels.hash_join_fold);
    push_join_work(
        &mut launch,
        &build,
        &probe,
        &tasks,
        &layouts,
        &partition_bits,
        &range,
    );
    launch.arg(&fold_count).arg(specs);
    // A null pointer stands for each source past the folds: never read.
    for f in 0..MAX_JOIN_FOLDS {
        arg_or_null(&mut launch, folds.get(f).map(|fold| fold.values));
    }
    launch.arg(out);
    let config = join_config(&range, sm_count, kernels.join_residency.fold)?;
    // SAFETY: starts bound every key access and a task list lies within the
    // probe side's partitions (as for hash_join_count); each fold reads its
    // source only at a row id below its `rows`, which the checks above put
    // within the source's words, at its width (a carried fold reads no
    // source: its value is in the side's word); the kernel reads specs[..3 *
    // folds] and writes only out[..1 + folds], both checked; sources past
    // `folds` are null and never read.
    unsafe { launch.launch(config) }.during("launching hash_join_fold")?;
    Ok(())
}

/// `pack_carried_words`: the words a side carries through its partitioning
/// in place of row ids, so that a join's folds read their values where the
/// keys are, not at random rows (seed 002's GFTR; [`CarriedSlot`]). For
/// each `i < out.len()`, with `id = row_ids[i]` (or `i` without row ids),
/// `out[i]` is `low`'s value at `id` (8-byte `low`), or `low`'s 4-byte value
/// in the low half and `high`'s (when given, 4-byte) in the high half. Both
/// hold `rows` values; an id at or past `rows` gives 0.
#[allow(clippy::too_many_arguments)]
pub fn pack_carried_words(
    launcher: &Launcher<'_>,
    out: &mut CudaSlice<u64>,
    row_ids: Option<&CudaSlice<u64>>,
    rows: usize,
    low: (&CudaSlice<u64>, ValueWidth),
    high: Option<&CudaSlice<u64>>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = out.len() as u64;
    let (low, low_width) = low;
    match (low_width, high.is_some()) {
        (ValueWidth::Eight, false) | (ValueWidth::Four, _) => {}
        _ => {
            return Err(GpuError::Invalid(format!(
                "carried words of a {}-byte value{}",
                low_width.bytes(),
                if high.is_some() { " and another" } else { "" }
            )))
        }
    }
    low_width.check_source(low, rows, "carried low values")?;
    if let Some(high) = high {
        ValueWidth::Four.check_source(high, rows, "carried high values")?;
    }
    if let Some(ids) = row_ids {
        check_len(ids, n as usize, "carried row ids")?;
    }
    if n == 0 {
        return Ok(());
    }
    let rows = rows as u64;
    let low_bytes = low_width.bytes() as u32;
    let mut launch = stream.launch_builder(&kernels.pack_carried_words);
    launch.arg(&mut *out).arg(&n);
    arg_or_null(&mut launch, row_ids);
    launch.arg(&rows).arg(low).arg(&low_bytes);
    arg_or_null(&mut launch, high);
    // SAFETY: writes out[..n] with n = out.len(); reads row_ids[..n] (length
    // checked) and the sources only at ids below `rows`, which the checks
    // above put within their words at their widths; a null high is never
    // read.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching pack_carried_words")?;
    Ok(())
}

/// `pack_key_words`: makes one-word rows in place ([`RadixDigits::HashedLowHalf`]).
/// For each `i < keys.len()`, with `id = row_ids[i]` (or `i` without row
/// ids), `keys[i]` keeps its low half (the key, which the caller guarantees
/// lies below 2^32) and takes in its high half `id` (which must lie below
/// 2^32), or, with `values` (4-byte values, `rows` of them), the value at
/// `id` (0 for an id at or past `rows`).
pub fn pack_key_words(
    launcher: &Launcher<'_>,
    keys: &mut CudaSlice<u64>,
    row_ids: Option<&CudaSlice<u64>>,
    values: Option<(&CudaSlice<u64>, usize)>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len() as u64;
    if let Some(ids) = row_ids {
        check_len(ids, n as usize, "row ids beside key words")?;
    }
    let rows = match values {
        Some((values, rows)) => {
            ValueWidth::Four.check_source(values, rows, "values beside key words")?;
            rows as u64
        }
        None => 0,
    };
    if n == 0 {
        return Ok(());
    }
    let mut launch = stream.launch_builder(&kernels.pack_key_words);
    launch.arg(&mut *keys).arg(&n);
    arg_or_null(&mut launch, row_ids);
    launch.arg(&rows);
    arg_or_null(&mut launch, values.map(|(values, _)| values));
    // SAFETY: reads and writes keys[..n] with n = keys.len(); reads
    // row_ids[..n] (length checked) and the 4-byte values only at ids below
    // `rows`, which the check above puts within their words; null row ids
    // and values are never read.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching pack_key_words")?;
    Ok(())
}

#[cfg(test)]
mod tests;
