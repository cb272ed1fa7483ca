//! Where each operator runs, and why. The same functions drive the rule and
//! answer [`gpu_decisions`], so the reason a user reads is the one the rule
//! acted on.

use std::fmt;
use std::sync::Arc;

use datafusion::config::ConfigOptions;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::ExecutionPlan;

use super::join_key_filters::probe_share_kept_on_device;
use super::scan_size::gpu_scan_placed;
use super::shape::{aggregate_shape, hash_join_shape, sort_merge_join_shape};
use crate::config::GpuOptions;
use crate::cost::{self, AggregateShape, DeviceConstants, Estimate, GPU_MARGIN};
use crate::encode::keys::KeySpec;
use crate::exec::join_keys::JoinKeyCollectorExec;
use crate::exec::{
    can_read_cached_input, describe_aggregate, AggregateSpec, GpuAggregateExec, GpuHashJoinExec,
    GpuScanAggregateExec, GpuScanFilterExec, GpuSortMergeJoinExec,
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

/// What a decision for the GPU knows: the node's estimates, where its
/// inputs have statistics.
pub type GpuPlacement = Result<Option<Estimate>, String>;

/// Decides whether the `HashJoinExec` `node` can run as a
/// [`GpuHashJoinExec`]: `Ok` with its estimates if so, otherwise the reason
/// it stays on the CPU. `gpu` is the availability of a GPU (`Err(reason)`
/// when there is none); `output_folded` says that an aggregation above takes
/// the join's pairs on the device.
pub fn decide_hash_join(
    node: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
    output_folded: bool,
) -> GpuPlacement {
    let join = node
        .downcast_ref::<HashJoinExec>()
        .ok_or_else(|| format!("{} is not a HashJoinExec", node.name()))?;
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
    let shape = hash_join_shape(join, node, output_folded, options.tuning.device_gather);
    let device = device_constants();
    let estimate = shape.map(|shape| cost::join(&shape, &device));
    let placed = place_by_cost(options, estimate)?;
    if let (Some(shape), Some(estimate), false) = (shape, estimate, options.placement.always()) {
        if let Some(share) = probe_share_kept_on_device(join, options) {
            keys_tested_on_device_slower(&shape, &estimate, share, &device)?;
        }
    }
    Ok(placed)
}

/// Whether a join the GPU is estimated faster for (`estimate`, of
/// `shape`) is still so against DataFusion's join over the share `share`
/// of its probe rows, those its build keys keep when a scan on the device
/// tests them (the join left on the CPU; the GPU join reads every probe
/// row from DataFusion's scan): otherwise the reason it stays on the CPU.
pub(super) fn keys_tested_on_device_slower(
    shape: &cost::JoinShape,
    estimate: &Estimate,
    share: f64,
    device: &DeviceConstants,
) -> Result<(), String> {
    let kept = cost::JoinShape {
        probe_rows: (shape.probe_rows as f64 * share).ceil() as u64,
        ..*shape
    };
    let cpu = cost::join(&kept, device).cpu;
    if estimate.gpu.as_secs_f64() * GPU_MARGIN <= cpu.as_secs_f64() {
        return Ok(());
    }
    Err(format!(
        "{estimate}, but CPU {:.0} ms where its build keys filter the scan of its probe side on \
         the device (about {:.2} % of the probe rows kept): the GPU must be estimated \
         {GPU_MARGIN}x faster (gpu.placement = 'cost')",
        cpu.as_secs_f64() * 1e3,
        share * 100.0
    ))
}

/// Decides whether the `SortMergeJoinExec` `node` can run as a
/// [`GpuSortMergeJoinExec`]: `Ok` with its estimates if so, otherwise the
/// reason it stays on the CPU.
pub fn decide_sort_merge_join(
    node: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
    output_folded: bool,
) -> GpuPlacement {
    let join = node
        .downcast_ref::<SortMergeJoinExec>()
        .ok_or_else(|| format!("{} is not a SortMergeJoinExec", node.name()))?;
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
    let shape = sort_merge_join_shape(join, node, output_folded);
    place_by_cost(
        options,
        shape.map(|shape| cost::join(&shape, &device_constants())),
    )
}

/// Whether the partial aggregation `node` and the filters, projections and
/// scan below it run as a [`GpuScanAggregateExec`]: `Ok(Some)` with the
/// node if so, `Ok(None)` where it is not of that shape, and the reason
/// where it is but stays on the CPU.
pub(crate) fn decide_scan_aggregate(
    node: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> Result<Option<GpuScanAggregateExec>, String> {
    let Some(scan_aggregate) = GpuScanAggregateExec::try_new(Arc::clone(node))? else {
        return Ok(None);
    };
    gpu_usable(
        options,
        options.aggregate,
        "GPU aggregation disabled (gpu.aggregate = false)",
        gpu,
    )?;
    if !options.tuning.scan_aggregate {
        return Err("scan aggregations are off (gpu.tuning.scan_aggregate = false)".into());
    }
    gpu_scan_placed(options, "a scan aggregation", scan_aggregate.scan_rows())?;
    if !options.placement.always() && !scan_aggregate.reads_files() {
        memory_scan_aggregate_faster(&scan_aggregate)?;
    }
    Ok(Some(scan_aggregate))
}

/// Whether a scan aggregation of a table held in memory is estimated
/// faster on the device: it saves DataFusion no decoding, only the
/// aggregation, against the device's fixed costs. Groups that statistics
/// do not know are taken as few, where the device gains least (the scan
/// aggregation has no run-time check of them).
fn memory_scan_aggregate_faster(scan_aggregate: &GpuScanAggregateExec) -> Result<(), String> {
    let (Some((shape, groups_known)), Some(scan_rows)) = (
        aggregate_shape(scan_aggregate.aggregate(), false),
        scan_aggregate.scan_rows(),
    ) else {
        return Ok(());
    };
    let shape = match groups_known {
        true => shape,
        false => AggregateShape {
            groups: cost::FEW_GROUPS,
            ..shape
        },
    };
    let estimate = cost::memory_scan_aggregate(&shape, scan_rows as u64, &device_constants());
    if estimate.gpu_faster() {
        return Ok(());
    }
    Err(format!(
        "a scan aggregation of a table in memory: {estimate}, the GPU must be estimated \
         {GPU_MARGIN}x faster (gpu.placement = 'cost')"
    ))
}

/// The largest share of a table's rows (by DataFusion's estimate) a
/// filtering scan keeps under `gpu.placement = 'cost'`: each row kept
/// crosses the bus back and becomes Arrow columns on the host, and where
/// many are, the first run's copy of the columns does not pay back soon.
pub(crate) const SCAN_FILTER_MAX_KEPT: f64 = 0.25;

/// Whether `node`, the top of filters and projections over a table scan,
/// runs as a [`GpuScanFilterExec`]: `Ok(Some)` with the node if so,
/// `Ok(None)` where it is not of that shape, and the reason where it is
/// but stays on the CPU.
pub(crate) fn decide_scan_filter(
    node: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> Result<Option<GpuScanFilterExec>, String> {
    let Some(scan_filter) = GpuScanFilterExec::try_new(Arc::clone(node))? else {
        return Ok(None);
    };
    gpu_usable(
        options,
        options.tuning.scan_filter,
        "scan filters are off (gpu.tuning.scan_filter = false)",
        gpu,
    )?;
    let scan_rows = scan_filter.scan_rows();
    gpu_scan_placed(options, "a scan filter", scan_rows)?;
    if !options.placement.always() {
        let kept = super::statistics::plan_statistics(node)
            .ok()
            .and_then(|s| s.num_rows.get_value().copied());
        if let (Some(kept), Some(rows)) = (kept, scan_rows) {
            if kept as f64 > SCAN_FILTER_MAX_KEPT * rows as f64 {
                return Err(format!(
                    "the filter keeps about {kept} of {rows} rows by DataFusion's estimate, more \
                     than {SCAN_FILTER_MAX_KEPT} of them, which would cross the bus back \
                     (gpu.placement = 'cost')"
                ));
            }
        }
    }
    Ok(Some(scan_filter))
}

/// Decides whether `agg` can run as a [`GpuAggregateExec`]: `Ok` with its
/// estimates if so, otherwise the reason it stays on the CPU.
pub fn decide_aggregate(
    agg: &AggregateExec,
    options: &GpuOptions,
    gpu: Result<(), &str>,
) -> GpuPlacement {
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
    let device = device_constants();
    let Some((shape, groups_known)) = aggregate_shape(agg, spec.keys_need_hashing) else {
        return Ok(None);
    };
    // Over a whole table the device reads from its column cache, nothing
    // is sent up.
    let cached =
        options.cache && options.tuning.cached_gpu_inputs && can_read_cached_input(agg, &spec);
    if !groups_known && !options.placement.always() {
        // Statistics do not know the groups: taken as many, checked again
        // at run time by a sample of the keys, whose overhead only a long
        // enough aggregation hides where the groups turn out few.
        let few = AggregateShape {
            groups: cost::FEW_GROUPS,
            ..shape
        };
        let cpu_if_few = cost::aggregate(&few, &device).cpu;
        if cpu_if_few < cost::UNKNOWN_GROUPS_MIN_CPU {
            return Err(format!(
                "groups unknown by statistics, and the input too small for the GPU even then: \
                 with few groups DataFusion would take an estimated {:.1} ms, below the {} ms \
                 from which the run-time check of the groups pays (gpu.placement = 'cost')",
                cpu_if_few.as_secs_f64() * 1e3,
                cost::UNKNOWN_GROUPS_MIN_CPU.as_millis()
            ));
        }
    }
    let estimate = match cached {
        true => cost::cached_aggregate(&shape, &device),
        false => cost::aggregate(&shape, &device),
    };
    place_by_cost(options, Some(estimate))
}

/// The estimate of `agg` reading its table's columns from the device
/// column cache (nothing sent up); `None` without statistics.
fn cached_aggregate_estimate(agg: &AggregateExec) -> Option<Estimate> {
    let (shape, _) = aggregate_shape(agg, false)?;
    Some(cost::cached_aggregate(&shape, &device_constants()))
}

/// Places a node the GPU can run by its estimates (`None` without
/// statistics, which counts as large): on the GPU where it is estimated
/// faster by [`GPU_MARGIN`], or whatever the estimates under
/// `gpu.placement = 'always'`.
fn place_by_cost(options: &GpuOptions, estimate: Option<Estimate>) -> GpuPlacement {
    match estimate {
        Some(estimate) if !options.placement.always() && !estimate.gpu_faster() => Err(format!(
            "{estimate}: the GPU must be estimated {GPU_MARGIN}x faster (gpu.placement = 'cost')"
        )),
        _ => Ok(estimate),
    }
}

/// The constants of the first device, measured at its first use; typical
/// ones where there is no device or measuring failed.
pub(super) fn device_constants() -> DeviceConstants {
    crate::gpu::gpu_runtime()
        .ok()
        .and_then(|runtime| runtime.devices().first().cloned())
        .and_then(|device| device.constants().ok())
        .unwrap_or(DeviceConstants::TYPICAL)
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
    let gpu = crate::gpu::gpu_availability(&options.devices);
    let mut decisions = Vec::new();
    collect_decisions(
        plan,
        &options,
        gpu.as_ref().map(|_| ()).map_err(|e| e.as_str()),
        false,
        &mut decisions,
    );
    decisions
}

const NOT_APPLIED: &str = "eligible, but the GPU rule was not applied to this plan";

/// Whether the aggregation `node` takes the pairs of a GPU join directly
/// below it on the device, as the rule makes it (`gpu.tuning.aggregate_in_join`).
pub(super) fn folds_join_below(node: &Arc<dyn ExecutionPlan>, options: &GpuOptions) -> bool {
    options.tuning.aggregate_in_join
        && crate::exec::folds_pairs_below(node, options.deterministic_float_sums)
}

/// The estimates of a node on the GPU, as `gpu_decisions` appends them.
fn estimates(placement: GpuPlacement) -> String {
    match placement {
        Ok(Some(estimate)) => format!("; {estimate}"),
        Ok(None) => "; no statistics: its inputs were taken as large".into(),
        Err(_) => String::new(),
    }
}

/// The reason a node the rule left on the CPU stays there.
fn cpu_reason(placement: GpuPlacement) -> String {
    match placement {
        Err(reason) => reason,
        Ok(estimate) => format!("{NOT_APPLIED}{}", estimates(Ok(estimate))),
    }
}

fn collect_decisions(
    plan: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: Result<(), &str>,
    output_folded: bool,
    out: &mut Vec<NodeDecision>,
) {
    // A GPU node's estimates, whatever `gpu.placement` says.
    let always = GpuOptions {
        placement: crate::config::PlacementPolicy::Always,
        ..options.clone()
    };
    if let Some(gpu_join) = plan.downcast_ref::<GpuHashJoinExec>() {
        aggregate_in_join(
            gpu_join.partial_aggregate_node(),
            "hash",
            "GpuHashJoinExec",
            out,
        );
        let folded = gpu_join.partial_aggregate_node().is_some();
        let key_filter = match gpu_join
            .hash_join()
            .right()
            .downcast_ref::<JoinKeyCollectorExec>()
            .filter(|collector| collector.keys().is_of_probe_side())
        {
            Some(collector) => format!(
                "; its probe keys (#{}) filter the scan of its build side",
                collector.keys().id()
            ),
            None => String::new(),
        };
        out.push(NodeDecision {
            operator: "HashJoinExec".into(),
            detail: describe_hash_join(gpu_join.hash_join()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{}{}{key_filter}",
                    if gpu_join.repartition_removed() {
                        format!(
                            "{} over all input partitions (CPU hash repartition removed)",
                            GpuHashJoinExec::ALGORITHM
                        )
                    } else {
                        GpuHashJoinExec::ALGORITHM.into()
                    },
                    estimates(decide_hash_join(
                        gpu_join.cpu_join(),
                        &always,
                        Ok(()),
                        folded
                    ))
                ),
            },
        });
    } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        let key_filter = match join.left().downcast_ref::<JoinKeyCollectorExec>() {
            Some(collector) => format!(
                "; its build keys (#{}) filter the scan of its probe side",
                collector.keys().id()
            ),
            None => String::new(),
        };
        out.push(NodeDecision {
            operator: "HashJoinExec".into(),
            detail: describe_hash_join(join),
            placement: Placement::Cpu {
                reason: format!(
                    "{}{key_filter}",
                    cpu_reason(decide_hash_join(plan, options, gpu, output_folded))
                ),
            },
        });
    } else if let Some(gpu_join) = plan.downcast_ref::<GpuSortMergeJoinExec>() {
        aggregate_in_join(
            gpu_join.partial_aggregate_node(),
            "sort-merge",
            "GpuSortMergeJoinExec",
            out,
        );
        let folded = gpu_join.partial_aggregate_node().is_some();
        let [left, right] = gpu_join.sort_on_device();
        let sorted_by = |on_device: bool| if on_device { "device" } else { "input" };
        out.push(NodeDecision {
            operator: "SortMergeJoinExec".into(),
            detail: describe_sort_merge_join(gpu_join.sort_merge_join()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{} (left sorted by the {}, right by the {}){}{}{}",
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
                    },
                    estimates(decide_sort_merge_join(
                        gpu_join.cpu_join(),
                        &always,
                        Ok(()),
                        folded
                    ))
                ),
            },
        });
    } else if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        out.push(NodeDecision {
            operator: "SortMergeJoinExec".into(),
            detail: describe_sort_merge_join(join),
            placement: Placement::Cpu {
                reason: cpu_reason(decide_sort_merge_join(plan, options, gpu, output_folded)),
            },
        });
    } else if let Some(gpu_agg) = plan.downcast_ref::<GpuAggregateExec>() {
        out.push(NodeDecision {
            operator: "AggregateExec".into(),
            detail: describe_aggregate(gpu_agg.aggregate()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{}{}{}{}{}",
                    gpu_agg.algorithm(),
                    if gpu_agg.phases_merged() {
                        " over all input partitions (CPU partial aggregation and repartition removed)"
                    } else {
                        ""
                    },
                    if gpu_agg.reads_cached_input() {
                        ", reading its table scan's columns from the device column cache"
                    } else {
                        ""
                    },
                    match gpu_agg.group_ordering() {
                        Some(ordering) => format!(
                            ", groups emitted in the order of the sort above it, [{ordering}], \
                             which is gone: the device numbers the groups in key order"
                        ),
                        None => String::new(),
                    },
                    match gpu_agg.reads_cached_input() {
                        true => estimates(Ok(cached_aggregate_estimate(gpu_agg.aggregate()))),
                        false => estimates(decide_aggregate(gpu_agg.aggregate(), &always, Ok(()))),
                    }
                ),
            },
        });
    } else if let Some(scan_agg) = plan.downcast_ref::<GpuScanAggregateExec>() {
        out.push(NodeDecision {
            operator: "AggregateExec".into(),
            detail: describe_aggregate(scan_agg.aggregate()),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{} with its filters, projections and table scan, over the table's columns \
                     in the device column cache{}",
                    GpuScanAggregateExec::ALGORITHM,
                    match scan_agg.scan_rows() {
                        Some(rows) => format!(" ({rows} rows by statistics)"),
                        None => String::new(),
                    }
                ),
            },
        });
        // The nodes below it run only where the device cannot.
        return;
    } else if let Some(scan_filter) = plan.downcast_ref::<GpuScanFilterExec>() {
        out.push(NodeDecision {
            operator: scan_filter.cpu_input().name().into(),
            detail: "filters and projections over a table scan".into(),
            placement: Placement::Gpu {
                algorithm: format!(
                    "{} with its table scan, over the table's columns in the device column \
                     cache{}{}",
                    GpuScanFilterExec::ALGORITHM,
                    match scan_filter.join_filtered() {
                        true => ", its rows tested against the build keys of the joins above",
                        false => "",
                    },
                    match scan_filter.scan_rows() {
                        Some(rows) => format!(" ({rows} rows by statistics)"),
                        None => String::new(),
                    }
                ),
            },
        });
        // The nodes below it run only where the device cannot.
        return;
    } else if plan.downcast_ref::<FilterExec>().is_some() {
        if let Err(reason) = decide_scan_filter(plan, options, gpu) {
            out.push(NodeDecision {
                operator: "FilterExec".into(),
                detail: "filters and projections over a table scan".into(),
                placement: Placement::Cpu {
                    reason: format!("{} not possible: {reason}", GpuScanFilterExec::ALGORITHM),
                },
            });
        }
    } else if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        let reason = match decide_scan_aggregate(plan, options, gpu) {
            Err(reason) => format!(
                "{} not possible: {reason}; {}",
                GpuScanAggregateExec::ALGORITHM,
                cpu_reason(decide_aggregate(agg, options, gpu))
            ),
            Ok(_) => cpu_reason(decide_aggregate(agg, options, gpu)),
        };
        out.push(NodeDecision {
            operator: "AggregateExec".into(),
            detail: describe_aggregate(agg),
            placement: Placement::Cpu { reason },
        });
    }
    let folds = folds_join_below(plan, options);
    for child in plan.children() {
        collect_decisions(child, options, gpu, folds, out);
    }
}
