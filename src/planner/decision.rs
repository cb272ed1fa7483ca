//! Where each operator runs, and why. The same functions drive the rule and
//! answer [`gpu_decisions`], so the reason a user reads is the one the rule
//! acted on.

use std::fmt;
use std::sync::Arc;

use datafusion::common::stats::Precision;
use datafusion::config::ConfigOptions;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::ExecutionPlan;

use super::statistics::plan_statistics;
use crate::config::GpuOptions;
use crate::encode::keys::KeySpec;
use crate::exec::{
    describe_aggregate, AggregateSpec, GpuAggregateExec, GpuHashJoinExec, GpuSortMergeJoinExec,
};

/// Where a node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On the GPU, with this algorithm.
    Gpu {
        /// The algorithm, as `EXPLAIN` shows it.
        algorithm: String,
    },
    /// On DataFusion's CPU operator.
    Cpu {
        /// Why the GPU was not used.
        reason: String,
    },
}

/// The placement of one operator of a physical plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDecision {
    /// The DataFusion operator concerned, e.g. `HashJoinExec`.
    pub operator: String,
    /// A one-line description of the node (join type and keys).
    pub detail: String,
    /// GPU or CPU, with the algorithm or the reason.
    pub placement: Placement,
}

impl NodeDecision {
    /// Whether the node runs on the GPU.
    pub fn on_gpu(&self) -> bool {
        matches!(self.placement, Placement::Gpu { .. })
    }
}

impl fmt::Display for NodeDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.placement {
            Placement::Gpu { algorithm } => {
                write!(f, "{} ({}): GPU, {algorithm}", self.operator, self.detail)
            }
            Placement::Cpu { reason } => {
                write!(f, "{} ({}): CPU, {reason}", self.operator, self.detail)
            }
        }
    }
}

/// Decides whether `join` can run as a [`GpuHashJoinExec`]: `Ok(())` if so,
/// otherwise the reason it stays on the CPU. `gpu` is the availability of a
/// GPU (`Err(reason)` when there is none).
pub fn decide_hash_join(
    join: &HashJoinExec,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> Result<(), String> {
    gpu_usable(
        options,
        options.hash_join,
        "GPU hash join disabled (gpu.hash_join = false)",
        gpu,
    )?;
    if join.null_aware && *join.partition_mode() != PartitionMode::CollectLeft {
        return Err(
            "a null-aware anti join must see the whole probe side, which it does only in CollectLeft mode"
                .into(),
        );
    }
    if *join.partition_mode() == PartitionMode::Auto {
        return Err("partition mode Auto was not resolved by the planner".into());
    }
    if join.properties().output_ordering().is_some() {
        return Err("the join's output ordering may be relied on above it, and the GPU join does not keep it".into());
    }
    crate::encode::keys::join_key_spec(join)?;
    check_join_size(join.left(), join.right(), options)
}

/// Decides whether `join` can run as a [`GpuSortMergeJoinExec`]: `Ok(())`
/// if so, otherwise the reason it stays on the CPU.
pub fn decide_sort_merge_join(
    join: &SortMergeJoinExec,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> Result<(), String> {
    gpu_usable(
        options,
        options.sort_merge_join,
        "GPU sort-merge join disabled (gpu.sort_merge_join = false)",
        gpu,
    )?;
    if join.properties().boundedness.is_unbounded() {
        return Err(
            "an input is unbounded, and the GPU sort-merge join reads its inputs whole".into(),
        );
    }
    for key_type in crate::encode::keys::key_types(join.left(), join.right(), join.on())? {
        if !KeySpec::is_packable(&key_type) {
            return Err(format!(
                "key type {key_type} has no order-preserving fixed-width code on the GPU \
                 (integers, dates, times, timestamps, durations, Decimal128 and Boolean do)"
            ));
        }
    }
    check_join_size(join.left(), join.right(), options)
}

/// Decides whether `agg` can run as a [`GpuAggregateExec`]: `Ok(())` if so,
/// otherwise the reason it stays on the CPU.
pub fn decide_aggregate(
    agg: &AggregateExec,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> Result<(), String> {
    gpu_usable(
        options,
        options.aggregate,
        "GPU aggregation disabled (gpu.aggregate = false)",
        gpu,
    )?;
    let spec = AggregateSpec::try_new(agg)?;
    if spec.keys_need_hashing && !options.hashed_group_keys {
        let types: Vec<String> = spec
            .keys
            .iter()
            .flat_map(|keys| keys.types().iter().map(|t| t.to_string()))
            .collect();
        return Err(format!(
            "group keys [{}] would be hashed and checked on the host, which measured slower \
             than DataFusion's own hash table (gpu.hashed_group_keys = false)",
            types.join(", ")
        ));
    }
    check_size(estimated_rows(agg.input()), options)?;
    check_groups(agg, options)
}

/// Keeps an aggregation that makes fewer than `gpu.min_groups` groups (one
/// without GROUP BY, or by statistics; none counts as many) on the CPU.
fn check_groups(agg: &AggregateExec, options: &GpuOptions) -> Result<(), String> {
    match estimated_groups(agg) {
        Some(groups) if groups < options.min_groups => Err(format!(
            "few groups: {}, below gpu.min_groups = {} (the input crosses PCIe whatever \
             the groups; with few groups one CPU pass over host memory is faster)",
            if agg.group_expr().expr().is_empty() {
                "one (no GROUP BY)".to_string()
            } else {
                format!("about {groups} by statistics")
            },
            options.min_groups
        )),
        _ => Ok(()),
    }
}

/// The groups `agg` makes: one without grouping keys, else the product of
/// its key columns' distinct counts in its input's statistics; `None` when
/// a key is not a plain column or has no distinct count.
fn estimated_groups(agg: &AggregateExec) -> Option<usize> {
    let exprs = agg.group_expr().expr();
    if exprs.is_empty() {
        return Some(1);
    }
    let stats = plan_statistics(agg.input()).ok()?;
    exprs.iter().try_fold(1usize, |groups, (expr, _)| {
        let column = expr.downcast_ref::<Column>()?;
        let distinct = match stats.column_statistics.get(column.index())?.distinct_count {
            Precision::Exact(n) | Precision::Inexact(n) => n,
            Precision::Absent => return None,
        };
        Some(groups.saturating_mul(distinct.max(1)))
    })
}

/// Whether the GPU may be used at all: the session's switch, the
/// operator's (`operator_enabled`, with the reason `disabled`), a device.
fn gpu_usable(
    options: &GpuOptions,
    operator_enabled: bool,
    disabled: &str,
    gpu: Result<(), &str>,
) -> Result<(), String> {
    if !options.enabled {
        return Err("GPU disabled (gpu.enabled = false)".into());
    }
    if !operator_enabled {
        return Err(disabled.into());
    }
    gpu.map_err(|reason| format!("no GPU: {reason}"))
}

/// [`check_size`] on the rows of both inputs of a join.
fn check_join_size(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
) -> Result<(), String> {
    let rows =
        estimated_rows(left).and_then(|left| Some(left.saturating_add(estimated_rows(right)?)));
    check_size(rows, options)
}

/// Keeps a node whose inputs hold fewer than `gpu.min_rows` rows (by
/// statistics; none counts as large) on the CPU.
fn check_size(rows: Option<usize>, options: &GpuOptions) -> Result<(), String> {
    match rows {
        Some(rows) if rows < options.min_rows => Err(format!(
            "inputs too small: about {rows} rows by statistics, below gpu.min_rows = {}",
            options.min_rows
        )),
        _ => Ok(()),
    }
}

/// Rows of `plan` by statistics, exact or estimated; `None` without any.
pub(super) fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let stats = plan_statistics(plan).ok()?;
    match stats.num_rows {
        Precision::Exact(n) | Precision::Inexact(n) => Some(n),
        Precision::Absent => None,
    }
}

fn describe_hash_join(join: &HashJoinExec) -> String {
    let keys = join
        .on()
        .iter()
        .map(|(l, r)| format!("{l} = {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{} join, mode {:?}, on {keys}",
        join.join_type(),
        join.partition_mode()
    )
}

fn describe_sort_merge_join(join: &SortMergeJoinExec) -> String {
    let keys = join
        .on()
        .iter()
        .map(|(l, r)| format!("{l} = {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{} join, on {keys}", join.join_type())
}

/// The placement of every join and aggregation of `plan`, as the rule
/// decided it (or would, for a plan the rule did not see) under `config`.
/// The decision of an `AggregateExec` computed inside a GPU join (`node`,
/// where it is one), whose `kind` and node name say which.
fn aggregate_in_join(
    node: Option<&Arc<dyn ExecutionPlan>>,
    kind: &str,
    join_node: &str,
    out: &mut Vec<NodeDecision>,
) {
    let Some(agg) = node.and_then(|node| node.downcast_ref::<AggregateExec>()) else {
        return;
    };
    out.push(NodeDecision {
        operator: "AggregateExec".into(),
        detail: describe_aggregate(agg),
        placement: Placement::Gpu {
            algorithm: format!(
                "reduced on the device from the pairs of the GPU {kind} join below it, \
                 inside {join_node} (partial_aggregate)"
            ),
        },
    });
}

pub fn gpu_decisions(plan: &Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Vec<NodeDecision> {
    let options = GpuOptions::from_config(config);
    let gpu = crate::gpu::gpu_availability();
    let mut decisions = Vec::new();
    collect_decisions(
        plan,
        &options,
        gpu.as_ref().map(|_| ()).map_err(|e| e.as_str()),
        &mut decisions,
    );
    decisions
}

const NOT_APPLIED: &str = "eligible, but the GPU rule was not applied to this plan";

fn collect_decisions(
    plan: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
    out: &mut Vec<NodeDecision>,
) {
    if let Some(gpu_join) = plan.downcast_ref::<GpuHashJoinExec>() {
        aggregate_in_join(
            gpu_join.partial_aggregate_node(),
            "hash",
            "GpuHashJoinExec",
            out,
        );
        out.push(NodeDecision {
            operator: "HashJoinExec".into(),
            detail: describe_hash_join(gpu_join.hash_join()),
            placement: Placement::Gpu {
                algorithm: if gpu_join.repartition_removed() {
                    format!(
                        "{} over all input partitions (CPU hash repartition removed)",
                        GpuHashJoinExec::ALGORITHM
                    )
                } else {
                    GpuHashJoinExec::ALGORITHM.into()
                },
            },
        });
    } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        let reason = match decide_hash_join(join, options, gpu) {
            Err(reason) => reason,
            Ok(()) => NOT_APPLIED.into(),
        };
        out.push(NodeDecision {
            operator: "HashJoinExec".into(),
            detail: describe_hash_join(join),
            placement: Placement::Cpu { reason },
        });
    } else if let Some(gpu_join) = plan.downcast_ref::<GpuSortMergeJoinExec>() {
        aggregate_in_join(
            gpu_join.partial_aggregate_node(),
            "sort-merge",
            "GpuSortMergeJoinExec",
            out,
        );
        let [left, right] = gpu_join.sort_on_device();
        let sorted_by = |on_device: bool| if on_device { "device" } else { "input" };
        out.push(NodeDecision {
            operator: "SortMergeJoinExec".into(),
            detail: describe_sort_merge_join(gpu_join.sort_merge_join()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{} (left sorted by the {}, right by the {}){}{}",
                    GpuSortMergeJoinExec::ALGORITHM,
                    sorted_by(left),
                    sorted_by(right),
                    if gpu_join.in_place_of_hash_join() {
                        ", in place of HashJoinExec: its output was sorted on the join keys, \
                         which the merge's output order gives without the sort"
                    } else {
                        ""
                    },
                    if gpu_join.repartitions_removed() {
                        ", over all input partitions (CPU hash repartitions removed)"
                    } else {
                        ""
                    }
                ),
            },
        });
    } else if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        let reason = match decide_sort_merge_join(join, options, gpu) {
            Err(reason) => reason,
            Ok(()) => NOT_APPLIED.into(),
        };
        out.push(NodeDecision {
            operator: "SortMergeJoinExec".into(),
            detail: describe_sort_merge_join(join),
            placement: Placement::Cpu { reason },
        });
    } else if let Some(gpu_agg) = plan.downcast_ref::<GpuAggregateExec>() {
        out.push(NodeDecision {
            operator: "AggregateExec".into(),
            detail: describe_aggregate(gpu_agg.aggregate()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{}{}{}",
                    gpu_agg.algorithm(),
                    if gpu_agg.phases_merged() {
                        " over all input partitions (CPU partial aggregation and repartition removed)"
                    } else {
                        ""
                    },
                    match gpu_agg.group_ordering() {
                        Some(ordering) => format!(
                            ", groups emitted in the order of the sort above it, [{ordering}], \
                             which is gone: the device numbers the groups in key order"
                        ),
                        None => String::new(),
                    }
                ),
            },
        });
    } else if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        let reason = match decide_aggregate(agg, options, gpu) {
            Err(reason) => reason,
            Ok(()) => NOT_APPLIED.into(),
        };
        out.push(NodeDecision {
            operator: "AggregateExec".into(),
            detail: describe_aggregate(agg),
            placement: Placement::Cpu { reason },
        });
    }
    for child in plan.children() {
        collect_decisions(child, options, gpu, out);
    }
}
