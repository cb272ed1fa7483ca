//! Estimates of one operator's time on DataFusion's CPU operator and on the
//! GPU, from the shape of its inputs (rows, bytes a row, groups) and the
//! device's measured constants ([`DeviceConstants`]). The planner turns a
//! plan node's statistics into a shape; an operator that samples its keys at
//! run time asks again with what it found. Nothing here knows DataFusion's
//! plans or the device's API: shapes in, estimates out.
//!
//! The GPU's time is what it adds over reading the same host batches: the
//! bytes that cross the bus each way at the measured rates, the host's own
//! work to stage keys and build output batches, the device's passes over
//! memory, and a fixed cost a node pays whatever its size. The CPU's time
//! is DataFusion's operator: nanoseconds per row and per byte on each of the
//! threads its partitions run on. The per-row constants are fitted to the
//! measurements in BENCHMARKS.md ("Placement by cost").

mod constants;

use std::fmt;
use std::time::Duration;

pub use crate::gpu::DeviceConstants;
use constants::*;

/// How much faster the GPU must be estimated before a node goes there: the
/// estimates are within tens of percent of measured times, and a node that
/// moves to the GPU for an estimated 5 % may well run slower.
pub const GPU_MARGIN: f64 = 1.25;

/// The two estimates for one node, and the bytes the GPU path moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// DataFusion's operator.
    pub cpu: Duration,
    /// The GPU operator, its copies and host work included.
    pub gpu: Duration,
    /// Bytes the GPU path copies to the device.
    pub to_device: u64,
    /// Bytes the GPU path copies back.
    pub from_device: u64,
}

impl Estimate {
    /// The estimate of a node whose CPU time is `cpu` seconds and whose GPU
    /// path pays `fixed` seconds, copies `bytes` (up, down) at the device's
    /// staged rates, launches a node's kernels, and works `work` seconds
    /// more on the host and the device.
    fn of(cpu: f64, fixed: f64, bytes: (f64, f64), work: f64, device: &DeviceConstants) -> Self {
        let (to_device, from_device) = bytes;
        let gpu = fixed
            + GPU_LAUNCHES_PER_NODE * device.launch.as_secs_f64()
            + to_device / device.staged_to_device
            + from_device / device.staged_from_device
            + work;
        Estimate {
            cpu: seconds(cpu),
            gpu: seconds(gpu),
            to_device: to_device as u64,
            from_device: from_device as u64,
        }
    }

    /// Whether the GPU is estimated faster by at least [`GPU_MARGIN`].
    pub fn gpu_faster(&self) -> bool {
        self.gpu.as_secs_f64() * GPU_MARGIN <= self.cpu.as_secs_f64()
    }
}

impl fmt::Display for Estimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "estimated GPU {} ({} up, {} down) against CPU {}",
            millis(self.gpu),
            bytes(self.to_device),
            bytes(self.from_device),
            millis(self.cpu)
        )
    }
}

fn millis(time: Duration) -> String {
    let ms = time.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Which GPU join replaces which DataFusion join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinAlgorithm {
    /// `HashJoinExec` and the GPU hash join.
    Hash,
    /// `SortMergeJoinExec` (with the sorts below it that the GPU join
    /// absorbs) and the GPU sort-merge join.
    SortMerge,
}

/// What an estimate of a join needs. Byte widths are per row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JoinShape {
    /// The algorithm pair compared.
    pub algorithm: JoinAlgorithm,
    /// Rows of the build (left) side.
    pub build_rows: u64,
    /// Rows of the probe (right) side.
    pub probe_rows: u64,
    /// Key columns.
    pub keys: u64,
    /// Rows the join emits.
    pub output_rows: u64,
    /// Bytes of one output row.
    pub output_row_bytes: u64,
    /// Output columns gathered on the device (fixed width, no NULLs, no
    /// residual filter): they cross the bus up from their side and back;
    /// otherwise the host gathers them by the pairs the device found.
    pub gathered_on_device: bool,
    /// An aggregation without GROUP BY above takes the join's pairs on the
    /// device: no rows come back.
    pub output_folded: bool,
    /// DataFusion's threads: the partitions the join's plan runs on, at
    /// most the host's cores.
    pub threads: usize,
    /// DataFusion builds the hash table on one thread (`CollectLeft`).
    pub build_on_one_thread: bool,
    /// DataFusion hash-repartitions both inputs first and the GPU join
    /// reads them as they are (a sort-merge join over hash partitions): work
    /// only DataFusion's plan does. Repartitions that stay below the GPU
    /// join too are left out of both estimates.
    pub repartitioned: bool,
    /// Sides DataFusion sorts for a sort-merge join, build then probe.
    pub sorted_for_join: [bool; 2],
    /// DataFusion's hash join skips its probe side: the build side is
    /// empty and the join type makes no row without a build row.
    pub probe_skipped: bool,
    /// The join type remembers which build rows matched and emits the
    /// others at the end (left, full, left semi, anti and mark joins).
    pub build_matches_tracked: bool,
    /// Output rows take columns of the build side (every join type but
    /// the right semi, anti and mark joins): each one a read of the build
    /// side's columns at a random place.
    pub output_reads_build: bool,
}

/// What an estimate of an aggregation needs. Byte widths are per row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggregateShape {
    /// Input rows.
    pub rows: u64,
    /// Groups (1 without GROUP BY).
    pub groups: u64,
    /// Group key columns (0 without GROUP BY).
    pub keys: u64,
    /// Bytes of one row's aggregated values.
    pub value_bytes: u64,
    /// Aggregate functions.
    pub aggregates: u64,
    /// Bytes of one group's keys and states as they come back.
    pub group_bytes: u64,
    /// DataFusion's threads.
    pub threads: usize,
    /// Group keys the host must hash and check row by row (strings and
    /// other keys without a fixed-width code).
    pub hashed_keys: bool,
}

/// Seconds as a [`Duration`], never negative.
fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn ns(n: f64) -> f64 {
    n * 1e-9
}

/// The estimate of a join of `shape` on a device of `device`.
pub fn join(shape: &JoinShape, device: &DeviceConstants) -> Estimate {
    let threads = shape.threads.max(1) as f64;
    let build = shape.build_rows as f64;
    let probe = shape.probe_rows as f64;
    let inputs = build + probe;
    let out_rows = shape.output_rows as f64;
    let out_bytes = out_rows * shape.output_row_bytes as f64;
    let extra_keys = shape.keys.saturating_sub(1) as f64;
    // DataFusion's hash table: about 16 bytes a build row. Out of cache,
    // each probe, and each output row that takes build columns, misses.
    let table_misses = out_of_cache(16.0 * build, CPU_SHARED_CACHE_BYTES);

    // DataFusion: repartition, build, probe, then take each output row's
    // columns (and the aggregation above reads them, folded or not).
    let repartition = match (shape.repartitioned, shape.probe_skipped) {
        (false, _) => 0.0,
        (true, false) => inputs * ns(CPU_REPARTITION_NS_PER_ROW) / threads,
        (true, true) => build * ns(CPU_REPARTITION_NS_PER_ROW) / threads,
    };
    let output_row_ns = CPU_OUTPUT_NS_PER_ROW
        + CPU_OUTPUT_NS_PER_BYTE * shape.output_row_bytes as f64
        + if shape.output_reads_build {
            CPU_MISS_NS * table_misses
        } else {
            0.0
        };
    let output = out_rows * ns(output_row_ns) / threads;
    let extra_key_work = inputs * extra_keys * ns(CPU_EXTRA_KEY_NS_PER_ROW) / threads;
    let cpu = repartition
        + match shape.algorithm {
            JoinAlgorithm::Hash if shape.probe_skipped => 0.0,
            JoinAlgorithm::Hash => {
                let build_threads = if shape.build_on_one_thread { 1.0 } else { threads };
                build * ns(CPU_HASH_BUILD_NS_PER_ROW) / build_threads
                    + probe * ns(CPU_HASH_PROBE_NS_PER_ROW + CPU_MISS_NS * table_misses) / threads
                    + output
                    + extra_key_work
            }
            JoinAlgorithm::SortMerge => {
                let sort = |rows: f64, sorted: bool| match sorted {
                    true => rows * (rows / threads).max(2.0).log2() * ns(CPU_SORT_NS_PER_ROW_LOG),
                    false => 0.0,
                };
                (sort(build, shape.sorted_for_join[0]) + sort(probe, shape.sorted_for_join[1]))
                    / threads
                    + inputs * ns(CPU_MERGE_NS_PER_ROW) / threads
                    + output
                    + extra_key_work
            }
        };

    // The GPU: keys (and the columns it gathers or folds) up, columns or
    // pairs down, the host's staging, gathering and batch building, the
    // device's passes, and what a node pays whatever its size.
    let (rows_kept, bytes_kept) = match shape.output_folded {
        true => (0.0, 0.0),
        false => (out_rows, out_bytes),
    };
    let device_columns = shape.gathered_on_device || shape.output_folded;
    // Each side's columns of the output cross up whole: about half the
    // output's width a row, each side.
    let columns_up = match device_columns {
        true => inputs * shape.output_row_bytes as f64 / 2.0,
        false => 0.0,
    };
    let to_device = inputs * GPU_KEY_BYTES * shape.keys.max(1) as f64 + columns_up;
    let from_device = match (shape.output_folded, shape.gathered_on_device) {
        (true, _) => 0.0,
        (false, true) => bytes_kept,
        (false, false) => rows_kept * GPU_PAIR_BYTES,
    };
    let host_gather = match device_columns {
        true => 0.0,
        false => {
            rows_kept
                * ns(GPU_HOST_GATHER_NS_PER_ROW
                    + GPU_HOST_GATHER_NS_PER_BYTE * shape.output_row_bytes as f64)
                / threads
        }
    };
    let build_matches = match shape.build_matches_tracked {
        true => build * ns(GPU_BUILD_MATCHES_NS_PER_ROW),
        false => 0.0,
    };
    let device_passes = match shape.algorithm {
        JoinAlgorithm::Hash => GPU_HASH_JOIN_PASSES,
        JoinAlgorithm::SortMerge => GPU_SORT_MERGE_PASSES,
    };
    let kernels =
        (inputs * GPU_KEY_BYTES * device_passes + 2.0 * bytes_kept) / device.device_memory;
    let host_keys = inputs
        * ns(GPU_HOST_NS_PER_INPUT_ROW + extra_keys.min(1.0) * GPU_HOST_NS_PER_ROW_OF_SEVERAL_KEYS)
        / threads;
    let fixed = match shape.output_folded {
        true => GPU_FIXED_SECONDS,
        false => GPU_FIXED_SECONDS_EMITTING_ROWS,
    };
    let host_and_device = host_keys + host_gather + build_matches + kernels;
    Estimate::of(cpu, fixed, (to_device, from_device), host_and_device, device)
}

/// The estimate of an aggregation of `shape` on a device of `device`.
pub fn aggregate(shape: &AggregateShape, device: &DeviceConstants) -> Estimate {
    let threads = shape.threads.max(1) as f64;
    let rows = shape.rows as f64;
    let groups = (shape.groups.max(1) as f64).min(rows.max(1.0));
    let group_bytes = groups * shape.group_bytes as f64;
    let key_bytes = GPU_KEY_BYTES * shape.keys as f64;

    // DataFusion: a partial aggregation per partition (its hash table stays
    // in cache while it is small), its states repartitioned, a final one.
    let hashing = match shape.keys {
        0 => 0.0,
        _ => CPU_AGGREGATE_NS_PER_ROW,
    };
    let per_row = hashing
        + CPU_AGGREGATE_NS_PER_AGGREGATE * shape.aggregates as f64
        + CPU_MISS_NS * out_of_cache(group_bytes, CPU_CORE_CACHE_BYTES);
    let partial_groups = match shape.keys {
        0 => threads,
        _ => (groups * threads).min(rows),
    };
    let cpu = rows * ns(per_row) / threads
        + partial_groups * ns(CPU_REPARTITION_NS_PER_ROW + per_row) / threads;

    // The GPU: keys and values up, one row a group down, the host's pass
    // over the keys (and its check of hashed keys), the device's passes.
    let to_device = rows * (key_bytes + shape.value_bytes as f64);
    let from_device = group_bytes;
    let host_keys = rows
        * ns(GPU_HOST_NS_PER_INPUT_ROW
            + if shape.hashed_keys {
                GPU_HASHED_KEY_CHECK_NS_PER_ROW
            } else {
                0.0
            })
        / threads;
    let kernels =
        (to_device * GPU_AGGREGATE_PASSES + 2.0 * group_bytes) / device.device_memory;
    let host_and_device = host_keys + group_bytes * ns(CPU_OUTPUT_NS_PER_BYTE) / threads + kernels;
    Estimate::of(cpu, GPU_FIXED_SECONDS, (to_device, from_device), host_and_device, device)
}

/// The estimate of a scan aggregation of `shape` (the rows its filter
/// keeps) over a table held in memory of `scan_rows` rows whose columns
/// the device column cache holds: DataFusion's aggregation against the
/// device reading the cached columns (their one upload, at the first run,
/// left out: the cache keeps them for the runs after; DataFusion's filter
/// left out too).
pub fn memory_scan_aggregate(
    shape: &AggregateShape,
    scan_rows: u64,
    device: &DeviceConstants,
) -> Estimate {
    let threads = shape.threads.max(1) as f64;
    let rows = scan_rows.max(shape.rows) as f64;
    let groups = (shape.groups.max(1) as f64).min((shape.rows as f64).max(1.0));
    let group_bytes = groups * shape.group_bytes as f64;
    let cpu = aggregate(shape, device).cpu.as_secs_f64();
    let kernels = (rows * shape.value_bytes as f64 * GPU_AGGREGATE_PASSES + 2.0 * group_bytes)
        / device.device_memory;
    let host = rows * ns(GPU_MEMORY_SCAN_AGGREGATE_NS_PER_ROW) / threads
        + group_bytes * ns(CPU_OUTPUT_NS_PER_BYTE) / threads;
    Estimate::of(
        cpu,
        GPU_MEMORY_SCAN_AGGREGATE_FIXED_SECONDS,
        (0.0, group_bytes),
        host + kernels,
        device,
    )
}

/// The estimate of an aggregation of `shape` that reads its whole table's
/// columns where the device column cache holds them: DataFusion's
/// aggregation against the device's, with nothing sent up and no pass
/// over the keys on the host; the groups come back as [`aggregate`]'s do.
pub fn cached_aggregate(shape: &AggregateShape, device: &DeviceConstants) -> Estimate {
    let threads = shape.threads.max(1) as f64;
    let rows = shape.rows as f64;
    let groups = (shape.groups.max(1) as f64).min(rows.max(1.0));
    let group_bytes = groups * shape.group_bytes as f64;
    let cpu = aggregate(shape, device).cpu.as_secs_f64();
    let kernels = rows * ns(GPU_CACHED_AGGREGATE_NS_PER_ROW) + 2.0 * group_bytes / device.device_memory;
    let host = group_bytes * ns(CPU_OUTPUT_NS_PER_BYTE) / threads;
    Estimate::of(cpu, GPU_FIXED_SECONDS, (0.0, group_bytes), kernels + host, device)
}

/// What an estimate of a join's build keys tested in the scan of its probe
/// side needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyTestShape {
    /// Rows of the probe side's table.
    pub probe_rows: u64,
    /// Rows of the build side, where statistics know: its hash table, out
    /// of cache, makes each of DataFusion's probes a miss.
    pub build_rows: Option<u64>,
    /// DataFusion's threads.
    pub threads: usize,
}

/// The estimate of a scan of a table held in memory that only tests a
/// join's build keys, its columns in the device column cache: at best
/// (no row kept) what DataFusion's join spends probing every row, against
/// the device's scan. The join stays DataFusion's either way.
pub fn memory_key_test(shape: &KeyTestShape, device: &DeviceConstants) -> Estimate {
    let threads = shape.threads.max(1) as f64;
    let rows = shape.probe_rows as f64;
    let misses = shape
        .build_rows
        .map_or(0.0, |build| out_of_cache(16.0 * build as f64, CPU_SHARED_CACHE_BYTES));
    let cpu = rows * ns(CPU_HASH_PROBE_NS_PER_ROW + CPU_MISS_NS * misses) / threads;
    let host = rows * ns(GPU_MEMORY_KEY_TEST_NS_PER_ROW) / threads;
    Estimate::of(cpu, GPU_MEMORY_KEY_TEST_FIXED_SECONDS, (0.0, 0.0), host, device)
}

/// Groups a sample of the keys at run time must find before an aggregation
/// whose groups statistics do not know goes to DataFusion's operator after
/// all: few enough to sit in one core's cache.
pub const FEW_GROUPS: u64 = 1024;

/// Where statistics do not know an aggregation's groups, it goes to the
/// GPU only where DataFusion would take at least this long even if the
/// groups were few: the run-time sample that then sends it back to the CPU
/// costs a few milliseconds (collecting the input, sampling it), which
/// stays within a tenth of the time only from here on.
pub const UNKNOWN_GROUPS_MIN_CPU: Duration = Duration::from_millis(40);

/// The share of a hash table of `bytes` that does not fit a cache of
/// `cache` bytes: 0 while it fits, towards 1 as it outgrows it.
fn out_of_cache(bytes: f64, cache: f64) -> f64 {
    if bytes <= cache {
        0.0
    } else {
        1.0 - cache / bytes
    }
}

#[cfg(test)]
mod tests;
