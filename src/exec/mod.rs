//! DataFusion execution plan nodes that run on the GPU. They own batching,
//! Arrow conversion, metrics, memory reservations and join semantics; the
//! algorithms themselves live in [`crate::ops`].

mod aggregate;
mod collect;
mod concat;
mod device_gather;
mod hash_join;
pub mod keys;
mod mapped_ahead;
mod metrics;
mod once;
mod ordered_keys;
mod pair_aggregate;
mod parallel;
mod release;
mod row_source;
mod sort_merge_join;

pub use aggregate::GpuAggregateExec;
pub(crate) use aggregate::{describe_aggregate, AggregateSpec};
pub use hash_join::GpuHashJoinExec;
pub use metrics::{DeviceMetrics, GpuAggregateMetrics, GpuJoinMetrics, GpuSortMergeJoinMetrics};
pub use sort_merge_join::GpuSortMergeJoinExec;

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;

use crate::gpu::GpuDevice;

/// The device that runs DataFusion partition `partition`, or why there is
/// none (a node planned on the GPU executed where no GPU is).
pub(crate) fn partition_device(partition: usize) -> Result<Arc<GpuDevice>> {
    let runtime =
        crate::gpu::gpu_runtime().map_err(|e| DataFusionError::Execution(e.to_string()))?;
    Ok(Arc::clone(runtime.device_for_partition(partition)))
}

/// A join's equi-join keys as `EXPLAIN` shows them: `(left, right), ...`.
pub(crate) fn join_keys_text(on: &[(PhysicalExprRef, PhysicalExprRef)]) -> String {
    on.iter()
        .map(|(l, r)| format!("({l}, {r})"))
        .collect::<Vec<_>>()
        .join(", ")
}
