//! DataFusion execution plan nodes that run on the GPU and their streams:
//! the hash join, the sort-merge join and the aggregation, the join
//! machinery they share ([`join`]), reading a node's whole input
//! ([`collect`]) and handing it on to DataFusion's operator where the GPU
//! node falls back ([`hand_over`]), and their metrics. They own batching, metrics, memory
//! reservations and join semantics; Arrow columns become device words in
//! [`crate::encode`] and the algorithms run in [`crate::ops`].

mod aggregate;
mod collect;
pub(crate) mod fill_ahead;
mod hand_over;
mod hash_join;
mod join;
pub(crate) mod join_keys;
mod metrics;
mod scan_aggregate;
mod scan_filter;
mod sort_merge_join;

pub use aggregate::GpuAggregateExec;
pub(crate) use aggregate::{can_read_cached_input, describe_aggregate, AggregateSpec};
pub use hash_join::GpuHashJoinExec;
pub use join_keys::{JoinKeyCollectorExec, JoinKeyWaitExec};
pub(crate) use hash_join::{dynamic_filter_of, with_filter_of};
pub(crate) use join::matches::tracks_build_matches;
pub(crate) use join::pair_aggregate::folds_pairs_below;
pub use metrics::{
    GpuAggregateMetrics, GpuJoinMetrics, GpuScanMetrics, GpuSortMergeJoinMetrics,
};
pub use scan_aggregate::{GpuScanAggregateExec, WarmedColumns};
pub(crate) use scan_aggregate::{coalesced_input, warm_scan};
pub use scan_filter::GpuScanFilterExec;
pub use sort_merge_join::GpuSortMergeJoinExec;

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::Statistics;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;

use crate::config::GpuOptions;
use crate::gpu::GpuDevice;

/// The device of those `options.devices` names that runs DataFusion
/// partition `partition`, or why there is none (a node planned on the GPU
/// executed where no GPU is, or none of those devices).
pub(crate) fn partition_device(partition: usize, options: &GpuOptions) -> Result<Arc<GpuDevice>> {
    crate::gpu::gpu_runtime()
        .and_then(|runtime| runtime.device_for_partition(partition, &options.devices))
        .map_err(|e| DataFusionError::Execution(e.to_string()))
}

/// Whether the caller runs in a multi-threaded tokio runtime, where work
/// spawned beside a query (a build side read ahead, the cache filled
/// ahead) runs in parallel with it rather than in turn.
pub(crate) fn in_multi_threaded_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Tasks that keep the runtime's threads busy: its worker threads (1 in
/// a single-threaded runtime or outside one).
pub(crate) fn runtime_workers() -> usize {
    tokio::runtime::Handle::try_current().map_or(1, |h| h.metrics().num_workers().max(1))
}

/// The device for partition `partition` of a join or aggregation with
/// `partitions` output partitions, which reads no cached columns: a node of
/// one partition takes the devices `options.devices` names in turn (see
/// [`crate::gpu::GpuRuntime::device_in_turn`]), a node of several spreads
/// its partitions over them ([`partition_device`]).
pub(crate) fn node_device(
    partition: usize,
    partitions: usize,
    options: &GpuOptions,
) -> Result<Arc<GpuDevice>> {
    if partitions != 1 {
        return partition_device(partition, options);
    }
    crate::gpu::gpu_runtime()
        .and_then(|runtime| runtime.device_in_turn(&options.devices))
        .map_err(|e| DataFusionError::Execution(e.to_string()))
}

/// Checks that every one of `ids`, row ids a kernel made, names one of the
/// `rows` rows of `what` before they index host memory: a fault on the
/// device then ends the query with an error rather than a panic or a read
/// out of bounds. One pass, which vectorizes.
pub(crate) fn check_device_ids(ids: &[u64], rows: usize, what: &str) -> Result<()> {
    let largest = ids.iter().copied().fold(0, u64::max);
    if !ids.is_empty() && largest >= rows as u64 {
        return Err(DataFusionError::Internal(format!(
            "the device returned row id {largest} for the {rows} rows of {what}"
        )));
    }
    Ok(())
}

/// The statistics of a node whose rows are its one input's: the input's,
/// or unknown for `schema` without them.
pub(crate) fn input_statistics(
    input_stats: &[Arc<Statistics>],
    schema: &SchemaRef,
) -> Arc<Statistics> {
    match input_stats.first() {
        Some(stats) => Arc::clone(stats),
        None => Arc::new(Statistics::new_unknown(schema)),
    }
}

/// A join's equi-join keys as `EXPLAIN` shows them: `(left, right), ...`.
pub(crate) fn join_keys_text(on: &[(PhysicalExprRef, PhysicalExprRef)]) -> String {
    on.iter()
        .map(|(l, r)| format!("({l}, {r})"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::check_device_ids;

    #[test]
    fn device_ids_past_the_rows_are_an_error() {
        assert!(check_device_ids(&[], 0, "a side").is_ok());
        assert!(check_device_ids(&[0, 4, 2], 5, "a side").is_ok());
        let err = check_device_ids(&[0, 5, 2], 5, "the build side").unwrap_err();
        assert!(err.to_string().contains("row id 5 for the 5 rows of the build side"), "{err}");
        assert!(check_device_ids(&[u64::MAX], usize::MAX, "a side").is_err());
        assert!(check_device_ids(&[0], 0, "an empty side").is_err());
    }
}
