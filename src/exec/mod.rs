//! DataFusion execution plan nodes that run on the GPU. They own batching,
//! Arrow conversion, metrics, memory reservations and join semantics; the
//! algorithms themselves live in [`crate::ops`].

mod aggregate;
mod concat;
mod device_gather;
mod hash_join;
pub mod keys;
mod metrics;
mod once;
mod parallel;
mod sort_merge_join;

pub use aggregate::GpuAggregateExec;
pub(crate) use aggregate::{describe_aggregate, AggregateSpec};
pub use hash_join::GpuHashJoinExec;
pub use metrics::{DeviceMetrics, GpuAggregateMetrics, GpuJoinMetrics, GpuSortMergeJoinMetrics};
pub use sort_merge_join::GpuSortMergeJoinExec;
