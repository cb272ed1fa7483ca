//! Metrics of the GPU joins, shown by `EXPLAIN ANALYZE`.

use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, Time,
};

use crate::gpu::PhaseTimes;

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
    /// Bytes copied host to device.
    pub h2d_bytes: Count,
    /// Bytes copied device to host.
    pub d2h_bytes: Count,
    /// Device time in copies, both directions (CUDA events).
    pub transfer_time: Time,
    /// Device time in kernels (CUDA events).
    pub kernel_time: Time,
    /// Time spent waiting for the device memory budget.
    pub device_memory_wait: Time,
    /// Time spent waiting for a slot of `gpu.max_concurrent_tasks`.
    pub device_admission_wait: Time,
    /// Probe chunks joined on the host because the device lacked memory.
    pub cpu_fallback_chunks: Count,
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
            h2d_bytes: builder().counter("h2d_bytes", partition),
            d2h_bytes: builder().counter("d2h_bytes", partition),
            transfer_time: builder().subset_time("transfer_time", partition),
            kernel_time: builder().subset_time("kernel_time", partition),
            device_memory_wait: builder().subset_time("device_memory_wait", partition),
            cpu_fallback_chunks: builder().counter("cpu_fallback_chunks", partition),
            device_admission_wait: builder().subset_time("device_admission_wait", partition),
        }
    }

    /// Adds the device times and bytes of one unit of work.
    pub fn record_device(&self, times: &PhaseTimes) {
        self.transfer_time.add_duration(times.transfer());
        self.kernel_time.add_duration(times.kernel);
        self.h2d_bytes.add(times.host_to_device_bytes);
        self.d2h_bytes.add(times.device_to_host_bytes);
    }
}
