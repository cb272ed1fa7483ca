//! DataFusion execution plan nodes that run on the GPU and their streams:
//! the hash join, the sort-merge join and the aggregation, the join
//! machinery they share ([`join`]), reading a node's whole input
//! ([`collect`]) and their metrics. They own batching, metrics, memory
//! reservations and join semantics; Arrow columns become device words in
//! [`crate::encode`] and the algorithms run in [`crate::ops`].

mod aggregate;
mod collect;
mod hash_join;
mod join;
mod metrics;
mod sort_merge_join;

pub use aggregate::GpuAggregateExec;
pub(crate) use aggregate::{describe_aggregate, AggregateSpec};
pub use hash_join::GpuHashJoinExec;
pub(crate) use join::matches::tracks_build_matches;
pub use metrics::{GpuAggregateMetrics, GpuJoinMetrics, GpuSortMergeJoinMetrics};
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
