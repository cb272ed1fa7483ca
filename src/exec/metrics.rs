//! Metrics of the GPU operators, shown by `EXPLAIN ANALYZE`.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, CustomMetricValue, ExecutionPlanMetricsSet, MetricBuilder,
    MetricValue, Time,
};

use crate::gpu::{GpuDevice, PhaseTimes};

/// Per-partition metrics of device work, shared by every GPU operator.
#[derive(Debug, Clone)]
pub struct DeviceMetrics {
    /// Bytes copied host to device.
    pub h2d_bytes: Count,
    /// Bytes copied device to host.
    pub d2h_bytes: Count,
    /// Device time in copies, both directions (CUDA events).
    pub transfer_time: Time,
    /// Device time in kernels (CUDA events).
    pub kernel_time: Time,
    /// Host time copying into and out of pinned staging buffers.
    pub staging_time: Time,
    /// Host time getting page-locked buffers to stage through or to make a
    /// cache fill's words in (locking new memory where the pool had none
    /// idle: a first query's cost).
    pub pinned_alloc_time: Time,
    /// Bytes copied to the device straight from pinned host memory, without
    /// staging: from tables pinned there (`pin_batches`), and the words a
    /// cache fill made there.
    pub h2d_direct_bytes: Count,
    /// Copies those bytes took: one per run of batches laid end to end in a
    /// pinned region (many where batches are read out of their order), and
    /// one per column of a part a cache fill made in pinned memory.
    pub h2d_direct_copies: Count,
    /// Time spent waiting for the device memory budget.
    pub device_memory_wait: Time,
    /// Time spent waiting for a slot of `gpu.max_concurrent_tasks`.
    pub device_admission_wait: Time,
    /// Where [`Self::ran_on`] registers the partition's device.
    set: ExecutionPlanMetricsSet,
    partition: usize,
}

impl DeviceMetrics {
    pub(crate) fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(set);
        Self {
            h2d_bytes: builder().counter("h2d_bytes", partition),
            d2h_bytes: builder().counter("d2h_bytes", partition),
            transfer_time: builder().subset_time("transfer_time", partition),
            kernel_time: builder().subset_time("kernel_time", partition),
            staging_time: builder().subset_time("staging_time", partition),
            pinned_alloc_time: builder().subset_time("pinned_alloc_time", partition),
            h2d_direct_bytes: builder().counter("h2d_direct_bytes", partition),
            h2d_direct_copies: builder().counter("h2d_direct_copies", partition),
            device_memory_wait: builder().subset_time("device_memory_wait", partition),
            device_admission_wait: builder().subset_time("device_admission_wait", partition),
            set: set.clone(),
            partition,
        }
    }

    /// Counts the partition as given to `device`: `partitions_on_gpu<N>`
    /// in `EXPLAIN ANALYZE` says how many of a node's partitions device N
    /// ran (`gpu.devices` chooses among the devices).
    pub fn ran_on(&self, device: &GpuDevice) {
        MetricBuilder::new(&self.set)
            .counter(format!("partitions_on_gpu{}", device.ordinal()), self.partition)
            .add(1);
    }

    /// Adds the device times and bytes of one unit of work.
    pub fn record(&self, times: &PhaseTimes) {
        self.transfer_time.add_duration(times.transfer());
        self.kernel_time.add_duration(times.kernel);
        self.staging_time.add_duration(times.host_staging);
        self.pinned_alloc_time
            .add_duration(times.pinned_allocation);
        self.h2d_direct_bytes.add(times.direct_host_to_device_bytes);
        self.h2d_direct_copies
            .add(times.direct_host_to_device_copies);
        self.h2d_bytes.add(times.host_to_device_bytes);
        self.d2h_bytes.add(times.device_to_host_bytes);
    }
}

/// Metrics of a GPU scan over the device column cache, an aggregation or a
/// filter (one partition).
#[derive(Debug, Clone)]
pub struct GpuScanMetrics {
    /// Output rows (partial states, or rows kept), batches and host
    /// compute time.
    pub baseline: BaselineMetrics,
    /// Table rows the device filtered and aggregated.
    pub rows_scanned: Count,
    /// Table rows read from files or memory to fill the column cache (a
    /// part's rows once, whatever columns were missing).
    pub rows_read: Count,
    /// Pieces of those parts (runs of whole row groups of a Parquet byte
    /// range, or slices of a large one, `gpu.tuning.min_part_rows`) read
    /// by tasks of their own: each piece of a table read at once, and the
    /// last pieces of the scan's own parts read in turn that an idle task
    /// read for it
    /// (`gpu.tuning.steal_pieces`; those read for the fill ahead's parts are
    /// not counted here).
    pub pieces_read: Count,
    /// Parts the cache missed whose columns were read apart, side by side
    /// (`gpu.tuning.read_columns_apart`), by the scan or, for the node's
    /// partition's parts, by the fill ahead of its plan.
    pub parts_read_apart: Count,
    /// Columns of table parts found in the device column cache.
    pub cache_hits: Count,
    /// Columns of table parts read and copied to the device.
    pub cache_misses: Count,
    /// Runs handed to DataFusion's plan (or parts filtered on the host).
    pub cpu_fallback: Count,
    /// Why, each reason with its count ([`Self::fell_back`]).
    pub cpu_fallback_reasons: Arc<FallbackReasons>,
    /// Time reading missing columns from files or memory, summed over the
    /// parts read at once.
    pub read_time: Time,
    /// Host time making them words (and codes).
    pub encode_time: Time,
    /// Wall time copying them to the device, waits for memory included.
    pub upload_time: Time,
    /// Copies, kernels and waits on the device.
    pub device: DeviceMetrics,
}

impl GpuScanMetrics {
    /// Registers the metrics of partition `partition` in `set`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(set);
        Self {
            baseline: BaselineMetrics::new(set, partition),
            rows_scanned: builder().counter("rows_scanned", partition),
            rows_read: builder().counter("rows_read", partition),
            pieces_read: builder().counter("pieces_read", partition),
            parts_read_apart: builder().counter("parts_read_apart", partition),
            cache_hits: builder().counter("cache_hits", partition),
            cache_misses: builder().counter("cache_misses", partition),
            cpu_fallback: builder().counter("cpu_fallback", partition),
            cpu_fallback_reasons: FallbackReasons::register(set, "cpu_fallback_reasons", partition),
            read_time: builder().subset_time("read_time", partition),
            encode_time: builder().subset_time("encode_time", partition),
            upload_time: builder().subset_time("upload_time", partition),
            device: DeviceMetrics::new(set, partition),
        }
    }

    /// A run (or a part) handed to the host, for `reason`: counted, and
    /// the reason kept for `EXPLAIN ANALYZE`.
    pub fn fell_back(&self, reason: &str) {
        self.cpu_fallback.add(1);
        self.cpu_fallback_reasons.add(reason);
    }
}

/// Why a node's runs went to the host: each reason with how many times, shown
/// by `EXPLAIN ANALYZE` summed over the partitions (`[]` where none did).
#[derive(Debug, Default)]
pub struct FallbackReasons {
    counts: Mutex<BTreeMap<String, usize>>,
}

impl FallbackReasons {
    /// New reasons, registered in `set` as metric `name` of `partition`.
    pub fn register(set: &ExecutionPlanMetricsSet, name: &'static str, partition: usize) -> Arc<Self> {
        let reasons = Arc::new(Self::default());
        MetricBuilder::new(set).with_partition(partition).build(MetricValue::Custom {
            name: name.into(),
            value: Arc::clone(&reasons) as Arc<dyn CustomMetricValue>,
        });
        reasons
    }

    /// One more run handed to the host for `reason`.
    pub fn add(&self, reason: &str) {
        *self.lock().entry(reason.to_string()).or_default() += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, usize>> {
        self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Each reason with its count, in the reasons' order.
    pub fn counts(&self) -> Vec<(String, usize)> {
        self.lock().iter().map(|(reason, &n)| (reason.clone(), n)).collect()
    }
}

impl fmt::Display for FallbackReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = self.counts();
        let shown: Vec<String> = counts.iter().map(|(reason, n)| format!("{n}: {reason}")).collect();
        write!(f, "[{}]", shown.join("; "))
    }
}

impl CustomMetricValue for FallbackReasons {
    fn new_empty(&self) -> Arc<dyn CustomMetricValue> {
        Arc::new(Self::default())
    }

    fn aggregate(&self, other: Arc<dyn CustomMetricValue + 'static>) {
        if let Some(other) = other.as_any().downcast_ref::<Self>() {
            // The same value aggregated into itself would lock twice.
            if std::ptr::eq(self, other) {
                return;
            }
            let theirs = other.counts();
            let mut ours = self.lock();
            for (reason, n) in theirs {
                *ours.entry(reason).or_default() += n;
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_usize(&self) -> usize {
        self.lock().values().sum()
    }

    fn is_eq(&self, other: &Arc<dyn CustomMetricValue>) -> bool {
        other
            .as_any()
            .downcast_ref::<Self>()
            .is_some_and(|other| std::ptr::eq(self, other) || self.counts() == other.counts())
    }
}

/// Per-partition metrics of a GPU join.
#[derive(Debug, Clone)]
pub struct GpuJoinMetrics {
    /// Output rows, batches and host compute time.
    pub baseline: BaselineMetrics,
    /// Build rows collected (all of them, NULL keys included).
    pub build_rows: Count,
    /// Probe rows read.
    pub probe_rows: Count,
    /// Probe chunks sent to the device.
    pub probe_chunks: Count,
    /// Host time concatenating the build batches and encoding their keys.
    pub build_prepare_time: Time,
    /// Host time evaluating and encoding the probe chunks' keys.
    pub encode_time: Time,
    /// Wall time finding the chunks' pairs: waits, copies, kernels, gathers
    /// on the device, and the host work on each output range.
    pub device_wall_time: Time,
    /// Host time turning pairs into output batches (key checks, filter,
    /// order, gather).
    pub emit_time: Time,
    /// Copies, kernels and waits on the device.
    pub device: DeviceMetrics,
    /// Probe chunks joined on the host because the device lacked memory
    /// or failed.
    pub cpu_fallback_chunks: Count,
    /// Of those, chunks whose device work failed (a driver error, or
    /// results the device got wrong) before any of their output.
    pub device_error_fallback_chunks: Count,
    /// Ranges of pairs the device wrote out, each of at most
    /// `gpu.max_output_pairs` pairs.
    pub output_ranges: Count,
    /// Pairs the device wrote out in them (under a fetch, a range's pairs
    /// past it are written but not read).
    pub pairs_written: Count,
    /// Output rows whose columns were gathered on the device (the rest were
    /// gathered on the host by row id).
    pub rows_gathered_on_device: Count,
    /// Pairs reduced on the device by the partial aggregation the join
    /// computes (`partial_aggregate` in `EXPLAIN`), never made into rows.
    pub rows_aggregated_on_device: Count,
    /// Of those, pairs folded as the device probed (`gpu.tuning.fold_while_probing`),
    /// never written out.
    pub pairs_folded_while_probing: Count,
    /// Probe rows whose keys carried the values their folds read, in place
    /// of row ids (`gpu.tuning.carry_folded_values`).
    pub probe_rows_carrying_values: Count,
    /// Build rows whose keys carried the values the folds read, in place
    /// of row ids (`gpu.tuning.carry_folded_values`), once per device.
    pub build_rows_carrying_values: Count,
    /// Build rows partitioned again by row id, for chunks whose folds could
    /// not run against a table that carries values (once per device).
    pub build_rows_by_row_id: Count,
    /// Build and probe rows partitioned as one word each, key and row id
    /// (or carried value) together (`gpu.tuning.one_word_join_rows`).
    pub rows_in_one_word: Count,
    /// Output rows kept on the device for the GPU join above, which probes
    /// with them there: no copy down and up between the two joins.
    pub output_rows_kept_on_device: Count,
    /// Probe rows handed on by the GPU join below on the device and probed
    /// there.
    pub probe_rows_from_device: Count,
    /// Probe rows read while the build side was collected
    /// (`gpu.tuning.read_probe_ahead`).
    pub probe_rows_read_ahead: Count,
    /// Probe rows handed on on the device that this join copied down to
    /// join on the host (a key the device cannot read in place, a chunk
    /// the device lacked memory for); their bytes are in `d2h_bytes`.
    pub probe_rows_copied_down: Count,
}

impl GpuJoinMetrics {
    /// Registers the metrics of `partition` in `set`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(set);
        Self {
            baseline: BaselineMetrics::new(set, partition),
            build_rows: builder().counter("build_rows", partition),
            probe_rows: builder().counter("probe_rows", partition),
            probe_chunks: builder().counter("probe_chunks", partition),
            build_prepare_time: builder().subset_time("build_prepare_time", partition),
            encode_time: builder().subset_time("encode_time", partition),
            device_wall_time: builder().subset_time("device_wall_time", partition),
            emit_time: builder().subset_time("emit_time", partition),
            device: DeviceMetrics::new(set, partition),
            cpu_fallback_chunks: builder().counter("cpu_fallback_chunks", partition),
            device_error_fallback_chunks: builder()
                .counter("device_error_fallback_chunks", partition),
            output_ranges: builder().counter("output_ranges", partition),
            pairs_written: builder().counter("pairs_written", partition),
            rows_gathered_on_device: builder().counter("rows_gathered_on_device", partition),
            rows_aggregated_on_device: builder().counter("rows_aggregated_on_device", partition),
            pairs_folded_while_probing: builder().counter("pairs_folded_while_probing", partition),
            probe_rows_carrying_values: builder().counter("probe_rows_carrying_values", partition),
            build_rows_carrying_values: builder().counter("build_rows_carrying_values", partition),
            build_rows_by_row_id: builder().counter("build_rows_by_row_id", partition),
            rows_in_one_word: builder().counter("rows_in_one_word", partition),
            output_rows_kept_on_device: builder()
                .counter("output_rows_kept_on_device", partition),
            probe_rows_from_device: builder().counter("probe_rows_from_device", partition),
            probe_rows_read_ahead: builder().counter("probe_rows_read_ahead", partition),
            probe_rows_copied_down: builder().counter("probe_rows_copied_down", partition),
        }
    }
}

/// Per-partition metrics of a GPU sort-merge join.
#[derive(Debug, Clone)]
pub struct GpuSortMergeJoinMetrics {
    /// Output rows, batches and host compute time.
    pub baseline: BaselineMetrics,
    /// Left rows collected.
    pub left_rows: Count,
    /// Right rows collected.
    pub right_rows: Count,
    /// Wall time reading both inputs (their pipelines' time included).
    pub collect_time: Time,
    /// Host time evaluating the key columns and coding them in sort order.
    pub encode_time: Time,
    /// Wall time of the device part: waits, copies, sort, merge, and the
    /// output made and handed on range by range.
    pub device_wall_time: Time,
    /// Host time turning pairs into output batches (filter, order, gather).
    pub emit_time: Time,
    /// Copies, kernels and waits on the device.
    pub device: DeviceMetrics,
    /// Partitions joined by DataFusion's `SortMergeJoinExec` at run time
    /// (device out of memory, keys too wide for 64-bit codes, or inputs the
    /// memory pool could not hold).
    pub cpu_fallback_partitions: Count,
    /// Of those, partitions whose inputs the session's memory pool could
    /// not hold whole: DataFusion's join, whose sorts spill, took the
    /// batches read and the rest of the inputs.
    pub memory_pool_fallback_partitions: Count,
    /// Of those, partitions whose device work failed (a driver error, or
    /// results the device got wrong) before any output.
    pub device_error_fallback_partitions: Count,
    /// Pairs reduced on the device by the aggregation computed in the join
    /// (never made into rows).
    pub rows_aggregated_on_device: Count,
    /// Partitions whose raw keys' value range the device found (both sides
    /// sorted there), sparing the host a pass over the keys.
    pub key_ranges_on_device: Count,
}

impl GpuSortMergeJoinMetrics {
    /// Registers the metrics of `partition` in `set`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let builder = || MetricBuilder::new(set);
        Self {
            baseline: BaselineMetrics::new(set, partition),
            left_rows: builder().counter("left_rows", partition),
            right_rows: builder().counter("right_rows", partition),
            collect_time: builder().subset_time("collect_time", partition),
            encode_time: builder().subset_time("encode_time", partition),
            device_wall_time: builder().subset_time("device_wall_time", partition),
            emit_time: builder().subset_time("emit_time", partition),
            device: DeviceMetrics::new(set, partition),
            cpu_fallback_partitions: builder().counter("cpu_fallback_partitions", partition),
            memory_pool_fallback_partitions: builder()
                .counter("memory_pool_fallback_partitions", partition),
            device_error_fallback_partitions: builder()
                .counter("device_error_fallback_partitions", partition),
            rows_aggregated_on_device: builder().counter("rows_aggregated_on_device", partition),
            key_ranges_on_device: builder().counter("key_ranges_on_device", partition),
        }
    }
}

/// Per-partition metrics of a GPU aggregation.
#[derive(Debug, Clone)]
pub struct GpuAggregateMetrics {
    /// Output rows, batches and host compute time.
    pub baseline: BaselineMetrics,
    /// Output bytes, shown with the baseline's (as one `output_bytes`):
    /// each batch's are counted on the thread that made it, and added once
    /// the batches are sure to leave.
    pub output_bytes: Count,
    /// Input rows read.
    pub input_rows: Count,
    /// Groups found.
    pub groups: Count,
    /// Wall time from the first poll to the whole input collected (the
    /// input's own work, such as a scan, included).
    pub input_time: Time,
    /// Host time evaluating, packing and converting the collected input
    /// before the device starts (see
    /// `inputs_prepared_during_key_copy_partitions`).
    pub prepare_time: Time,
    /// Wall time of the device part until the per-group results are on
    /// the device (waits, copies, kernels, staging, and the aggregates'
    /// inputs where they are prepared while the keys cross the bus).
    pub device_wall_time: Time,
    /// Wall time bringing the per-group results back and turning them into
    /// output batches, the two overlapped, from the moment the groups are
    /// numbered: their keys while the device still reduces, then the
    /// reductions' results.
    pub emit_time: Time,
    /// Copies, kernels and waits on the device.
    pub device: DeviceMetrics,
    /// Host time checking that each group of hashed keys holds one key.
    pub key_check_time: Time,
    /// Partitions whose hashed keys collided (two keys, one hash), which
    /// then ran on the CPU operator.
    pub hashed_key_collisions: Count,
    /// Partitions whose sampled keys showed few groups, for which the cost
    /// model estimated the CPU operator faster, which then ran them.
    pub few_groups_partitions: Count,
    /// Hash partitions of the group keys that inputs too large for the
    /// device's memory were split into on the host, each aggregated on the
    /// device in turn.
    pub out_of_core_partitions: Count,
    /// Partitions whose groups had to leave in key order and were numbered
    /// by sorting the rows (the sample showed nearly every row a group of
    /// its own), not by sorting the hash table's groups.
    pub sorted_rows_partitions: Count,
    /// Partitions whose groups were numbered in hash partitions sized to
    /// shared memory (seed 002's partition-based group-by: the sample of
    /// the keys estimated at least `gpu.tuning.min_groups_to_partition` groups).
    pub partitioned_groups_partitions: Count,
    /// Partitions that tried that, but found a hash partition with too many
    /// groups (the sample underestimated them) and numbered the groups in
    /// one global table after all.
    pub partition_overflow_partitions: Count,
    /// Partitions whose hash table, sized from the sample's estimate of the
    /// groups, filled up (the sample underestimated them), so that the rows
    /// were numbered again in a table sized to them.
    pub table_overflow_partitions: Count,
    /// Partitions whose aggregates were folded into that hash table as its
    /// rows were numbered, in one pass over the rows (every aggregate a
    /// count, or a sum, minimum or maximum of one word per row; at most
    /// four of them), rather than reduced in a pass per aggregate.
    pub table_fold_partitions: Count,
    /// Partitions whose folding hash table was built again, larger, after
    /// its first chunk of rows showed more groups than the sample's
    /// estimate (a long tail of rare keys) before it could fill up.
    pub folding_table_grown_partitions: Count,
    /// Aggregates' inputs (of every partition) reduced chunk by chunk as
    /// they landed on the device (`gpu.tuning.reduce_as_they_land`), rather than
    /// once their whole column had crossed the bus.
    pub inputs_reduced_as_they_landed: Count,
    /// Partitions whose aggregates' inputs were prepared on the host while
    /// the keys crossed the bus (no FILTER, and every argument a column
    /// that cannot be NULL, a literal, or a numeric CAST of either), rather
    /// than before the device started.
    pub inputs_prepared_during_key_copy_partitions: Count,
    /// Output buffers (one column of one output batch each) whose memory
    /// was mapped while the device worked (`gpu.tuning.map_output_ahead`), rather
    /// than page by page as the results were copied into it.
    pub output_buffers_mapped_ahead: Count,
    /// Aggregates whose output columns were brought back and built while
    /// the device still made later aggregates' results (reductions made
    /// one after the other, each once its input crossed the bus).
    pub aggregates_brought_back_early: Count,
    /// Groups a filter of the groups (a `HAVING`) dropped on the device,
    /// before they came back (see `GpuAggregateExec::with_output_filter`).
    pub groups_dropped_on_device: Count,
    /// Partitions aggregated by DataFusion's CPU operator at run time
    /// (device out of memory, hashed keys that collided, few groups, an
    /// input the memory pool could not hold, or a device error).
    pub cpu_fallback_partitions: Count,
    /// Of those, partitions whose input the session's memory pool could
    /// not hold whole: DataFusion's operator, which spills, took the
    /// batches read and the rest of the input.
    pub memory_pool_fallback_partitions: Count,
    /// Of those, partitions whose device work failed (a driver error, or
    /// results the device got wrong) before any output.
    pub device_error_fallback_partitions: Count,
    /// Partitions that read their table's columns from the device column
    /// cache on the device, rather than the rows from their input.
    pub cached_input_partitions: Count,
    /// Why a partition that could have read the column cache read its
    /// input instead, each reason with its count.
    pub cached_input_refusals: Arc<FallbackReasons>,
    /// The column cache's reads (hits, misses, and the reads, coding and
    /// copies that fill it), registered in a set of their own
    /// ([`Self::CACHE_METRICS`] of it are shown with the node's).
    pub cache: GpuScanMetrics,
}

impl GpuAggregateMetrics {
    /// The metrics of the column cache's reads shown with the node's.
    pub const CACHE_METRICS: [&'static str; 6] = [
        "cache_hits",
        "cache_misses",
        "rows_read",
        "read_time",
        "encode_time",
        "upload_time",
    ];

    /// Registers the metrics of `partition` in `set`, those of the column
    /// cache's reads in `cache_set`.
    pub fn new(
        set: &ExecutionPlanMetricsSet,
        cache_set: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> Self {
        let builder = || MetricBuilder::new(set);
        Self {
            cached_input_partitions: builder().counter("cached_input_partitions", partition),
            cached_input_refusals: FallbackReasons::register(set, "cached_input_refusals", partition),
            cache: GpuScanMetrics::new(cache_set, partition),
            baseline: BaselineMetrics::new(set, partition),
            output_bytes: builder().output_bytes(partition),
            input_rows: builder().counter("input_rows", partition),
            groups: builder().counter("groups", partition),
            input_time: builder().subset_time("input_time", partition),
            prepare_time: builder().subset_time("prepare_time", partition),
            device_wall_time: builder().subset_time("device_wall_time", partition),
            emit_time: builder().subset_time("emit_time", partition),
            key_check_time: builder().subset_time("key_check_time", partition),
            hashed_key_collisions: builder().counter("hashed_key_collisions", partition),
            few_groups_partitions: builder().counter("few_groups_partitions", partition),
            out_of_core_partitions: builder().counter("out_of_core_partitions", partition),
            sorted_rows_partitions: builder().counter("sorted_rows_partitions", partition),
            partitioned_groups_partitions: builder()
                .counter("partitioned_groups_partitions", partition),
            partition_overflow_partitions: builder()
                .counter("partition_overflow_partitions", partition),
            table_overflow_partitions: builder().counter("table_overflow_partitions", partition),
            table_fold_partitions: builder().counter("table_fold_partitions", partition),
            folding_table_grown_partitions: builder()
                .counter("folding_table_grown_partitions", partition),
            inputs_reduced_as_they_landed: builder()
                .counter("inputs_reduced_as_they_landed", partition),
            inputs_prepared_during_key_copy_partitions: builder()
                .counter("inputs_prepared_during_key_copy_partitions", partition),
            output_buffers_mapped_ahead: builder()
                .counter("output_buffers_mapped_ahead", partition),
            aggregates_brought_back_early: builder()
                .counter("aggregates_brought_back_early", partition),
            groups_dropped_on_device: builder().counter("groups_dropped_on_device", partition),
            device: DeviceMetrics::new(set, partition),
            cpu_fallback_partitions: builder().counter("cpu_fallback_partitions", partition),
            memory_pool_fallback_partitions: builder()
                .counter("memory_pool_fallback_partitions", partition),
            device_error_fallback_partitions: builder()
                .counter("device_error_fallback_partitions", partition),
        }
    }
}
