//! The physical optimizer rule that swaps supported DataFusion operators for
//! their GPU versions.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::{Column, UnKnownColumn};
use datafusion::physical_expr::{LexOrdering, Partitioning, PhysicalSortExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use datafusion::physical_plan::limit::LocalLimitExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use super::aggregate_filters::with_filters_in_gpu_aggregations;
use super::cached_inputs::with_cached_gpu_inputs;
use super::decision::folds_join_below;
use super::fills_ahead::with_fills_ahead;
use super::join_key_filters::{with_build_key_filters, with_join_key_filters};
use super::merge_for_order::{merge_join_for_sort, MergeForOrder};
use super::partitioning::{
    children_partitioning_free, merge_join_over_unrepartitioned_inputs, over_unrepartitioned_inputs,
};
use super::phases::{cpu_phases, single_phase};
use super::shape::estimated_rows;
use super::statistics::with_statistics_of_one_pass;
use super::{
    decide_aggregate, decide_hash_join, decide_scan_aggregate, decide_scan_filter,
    decide_sort_merge_join,
};
use crate::config::GpuOptions;
use crate::exec::tracks_build_matches;
use crate::exec::{
    GpuAggregateExec, GpuHashJoinExec, GpuScanAggregateExec, GpuScanFilterExec,
    GpuSortMergeJoinExec,
};

/// Replaces each `HashJoinExec` the GPU can run (see [`crate::gpu_decisions`])
/// by a [`GpuHashJoinExec`], and each such `AggregateExec` by a
/// [`GpuAggregateExec`], with the same inputs, schema and
/// partitioning (except that a GPU aggregation at the plan's root keeps
/// its one partition: nothing there runs on several), and leaves every
/// other node exactly as it was. It runs after DataFusion's own rules, on
/// the final plan.
#[derive(Debug, Default, Clone, Copy)]
pub struct GpuOptimizerRule;

impl GpuOptimizerRule {
    /// The rule.
    pub fn new() -> Self {
        Self
    }

    /// Rewrites `plan`, whose output partitions are run apart, each by a
    /// task of its own that executes only that partition: a query stage of
    /// a distributed engine such as Ballista, whose tasks may run on
    /// executors with the rule and without it. Every rewrite keeps the rows
    /// of each output partition, so a task writes the rows the plan as
    /// given would: no GPU node runs over the partitions of other tasks,
    /// and none changes how many output partitions there are. Below a node
    /// that merges partitions within the task, the rewrites are those of
    /// [`PhysicalOptimizerRule::optimize`].
    pub fn optimize_stage(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.optimize_with(plan, config, RootPartitions::RunApart)
    }

    fn optimize_with(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
        root: RootPartitions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = GpuOptions::from_config(config);
        if !options.enabled {
            return Ok(plan);
        }
        let gpu = crate::gpu::gpu_availability(&options.devices);
        let gpu = gpu.as_ref().map(|_| ()).map_err(|e| e.as_str());
        crate::trace::event(|| "rule: rewriting the plan".into());
        let rewritten = rewrite_plan(plan, &options, gpu, root);
        crate::trace::event(|| "rule: plan rewritten".into());
        rewritten
    }
}

/// How the caller consumes the output partitions of the plan it rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootPartitions {
    /// Read together (a session collecting a query's result): how the rows
    /// fall into them does not matter.
    Merged,
    /// Each executed by its own task (a distributed query stage): each must
    /// keep its rows. The stage's sorts stay nodes of their own too (a
    /// sort-merge join still sorts its inputs itself): Ballista reads a stage
    /// that ends in a sort through its ordered exchange, and with the sort
    /// of TPC-H q8's final stage folded into the GPU aggregation (whose
    /// groups come out in that order all the same), the groups one GPU
    /// task wrote were missing from the answer, or the query never ended.
    RunApart,
}

impl PhysicalOptimizerRule for GpuOptimizerRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.optimize_with(plan, config, RootPartitions::Merged)
    }

    fn name(&self) -> &str {
        "datafusion_gpu"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The whole plan `plan` rewritten ([`rewrite`]).
fn rewrite_plan(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
    root: RootPartitions,
) -> Result<Arc<dyn ExecutionPlan>> {
    // The caller sees each partition's rows in the order they are made,
    // even where it interleaves several partitions: a partition fed by
    // one join in a fixed order (a round robin over its one partition, say)
    // shows that order. Only a node below that merges partitions as they
    // arrive makes it no fixed order.
    let order_observable = true;
    with_statistics_of_one_pass(|| {
        let root_free = root == RootPartitions::Merged;
        let sorts_kept = root == RootPartitions::RunApart;
        rewrite(
            plan,
            order_observable,
            root_free,
            false,
            sorts_kept,
            options,
            gpu,
        )
        .and_then(|plan| match root {
            RootPartitions::Merged => without_spread_at_root(plan),
            RootPartitions::RunApart => Ok(plan),
        })
        .and_then(with_filters_in_gpu_aggregations)
        .and_then(|plan| with_scan_filters(plan, options, gpu))
        .and_then(|plan| with_cached_gpu_inputs(plan, options, gpu))
        .and_then(|plan| with_join_key_filters(plan, options, gpu))
        .and_then(|plan| match root {
            // A stage's task runs only some of a probe side's partitions.
            RootPartitions::Merged => with_build_key_filters(plan, options, gpu),
            RootPartitions::RunApart => Ok(plan),
        })
        .and_then(|plan| match root {
            // A stage's task runs only its own partitions: it fills only
            // the parts they read.
            RootPartitions::Merged => with_fills_ahead(plan),
            RootPartitions::RunApart => Ok(plan),
        })
    })
}

/// `plan` with each chain of filters and projections over a table scan
/// that the device can run replaced by a [`GpuScanFilterExec`], from the
/// top down (a chain is replaced from the highest node the device can
/// make). Chains a GPU scan node already reads are left as they are.
fn with_scan_filters(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        if node.downcast_ref::<GpuScanAggregateExec>().is_some()
            || node.downcast_ref::<GpuScanFilterExec>().is_some()
        {
            return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
        }
        Ok(match decide_scan_filter(&node, options, gpu) {
            Ok(Some(scan_filter)) => {
                Transformed::new(Arc::new(scan_filter), true, TreeNodeRecursion::Jump)
            }
            // A shorter chain below may still run on the device (a
            // projection the device cannot make above a filter it can).
            Err(_) | Ok(None) => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// `plan` without the round robin at its root (or below projections of
/// plain columns there) that deals one GPU aggregation's groups to several
/// partitions ([`gpu_aggregate`]): nothing above it runs on them, and the
/// caller merges them back into one stream, so each batch would only pass
/// through two more channels (a few milliseconds for thousands of batches).
fn without_spread_at_root(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let plain = projection
            .expr()
            .iter()
            .all(|e| e.expr.downcast_ref::<Column>().is_some());
        if plain {
            let input = without_spread_at_root(Arc::clone(projection.input()))?;
            if !Arc::ptr_eq(&input, projection.input()) {
                return Ok(Arc::new(ProjectionExec::try_new(
                    projection.expr().to_vec(),
                    input,
                )?));
            }
        }
        return Ok(plan);
    }
    match plan.downcast_ref::<RepartitionExec>() {
        Some(repartition)
            if !repartition.preserve_order()
                && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
                && repartition
                    .input()
                    .properties()
                    .output_partitioning()
                    .partition_count()
                    == 1
                && repartition
                    .input()
                    .downcast_ref::<GpuAggregateExec>()
                    .is_some() =>
        {
            Ok(Arc::clone(repartition.input()))
        }
        _ => Ok(plan),
    }
}

/// Replaces the supported joins under `node`, children first. A GPU join
/// keeps `HashJoinExec`'s row order only where that order can be seen
/// (`order_observable`): not below a node that merges several partitions
/// in whatever order they come, since nothing above it can depend on the
/// order of one partition's rows. A `Partitioned` join runs once over all
/// input partitions instead (see [`super::partitioning`]): as it is where
/// nothing above depends on its hash partitioning (`partitioning_free`),
/// with its output repartitioned where something does. `output_folded`
/// says that `node`'s parent is an aggregation that takes a GPU join's
/// pairs on the device (see [`folds_join_below`]). Where `sorts_kept` (a
/// distributed query stage, see [`RootPartitions::RunApart`]), no
/// `SortExec` is folded into the GPU aggregation below it, or replaced by a
/// sort-merge join in place of the hash join below it.
fn rewrite(
    node: Arc<dyn ExecutionPlan>,
    order_observable: bool,
    partitioning_free: bool,
    output_folded: bool,
    sorts_kept: bool,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let merge_for_sort = match sorts_kept {
        true => None,
        false => merge_join_for_sort(&node, options, gpu)?,
    };
    if let Some(merge) = merge_for_sort {
        // The sorts below it keep the hash partitioning the merge needs;
        // below them, row order does not matter.
        let children = merge
            .join
            .children()
            .into_iter()
            .map(|child| {
                rewrite(
                    Arc::clone(child),
                    false,
                    false,
                    false,
                    sorts_kept,
                    options,
                    gpu,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let join = replace_children_if_necessary(merge.join, children)?;
        let sorts = match join.downcast_ref::<SortMergeJoinExec>() {
            Some(merge_join) => absorbable_sorts(merge_join),
            None => [false, false],
        };
        let gpu_join = GpuSortMergeJoinExec::try_new(join, sorts)?.with_in_place_of_hash_join(true);
        // The hash join's embedded projection becomes the GPU join's own.
        let Some(projection) = merge.projection else {
            return Ok(Arc::new(gpu_join));
        };
        let exprs = MergeForOrder::projection_exprs(&projection, &gpu_join.schema());
        return Ok(match gpu_join.with_projection(exprs)? {
            Some(projected) => Arc::new(projected),
            None => MergeForOrder::project(Some(&projection), Arc::new(gpu_join))?,
        });
    }
    let children_observable = order_observable && !merges_in_arrival_order(&node);
    let children_free = children_partitioning_free(&node, partitioning_free);
    let children_folded = folds_join_below(&node, options);
    let children = node
        .children()
        .into_iter()
        .zip(children_free)
        .map(|(child, free)| {
            rewrite(
                Arc::clone(child),
                children_observable,
                free,
                children_folded,
                sorts_kept,
                options,
                gpu,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let node = replace_children_if_necessary(node, children)?;
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        if let Some(join) = projection_into_merge_join(projection)? {
            return Ok(join);
        }
    }
    if let Some(join) = node.downcast_ref::<HashJoinExec>() {
        let order_observable = order_observable && join_order_is_fixed(join);
        let merge = (options.tuning.merge_partitions && !order_observable).then_some(
            if partitioning_free {
                MergeInputs::Free
            } else {
                MergeInputs::RepartitionOutput
            },
        );
        let planned = GpuJoinPlan {
            order_observable,
            merge,
            output_folded,
        };
        if let Some(gpu_join) = gpu_join(&node, join, planned, options, gpu)? {
            return Ok(gpu_join);
        }
    }
    if let Some(join) = node.downcast_ref::<SortMergeJoinExec>() {
        if decide_sort_merge_join(&node, options, gpu, output_folded).is_ok() {
            if options.tuning.merge_partitions && partitioning_free {
                let unsorted_too = options.tuning.merge_unsorted_sort_merge_inputs;
                if let Some(merged) = merge_join_over_unrepartitioned_inputs(join, unsorted_too)? {
                    return merge_join_over_all_partitions(&node, merged);
                }
            }
            let sorts = absorbable_sorts(join);
            return Ok(Arc::new(GpuSortMergeJoinExec::try_new(
                Arc::clone(&node),
                sorts,
            )?));
        }
    }
    if let Some(agg) = node.downcast_ref::<AggregateExec>() {
        // One output partition in place of the partial aggregation's: only
        // where nothing above relies on how its output is partitioned.
        let one_partition_fits =
            partitioning_free || agg.properties().output_partitioning().partition_count() == 1;
        if one_partition_fits {
            if let Ok(Some(scan_aggregate)) = decide_scan_aggregate(&node, options, gpu) {
                return Ok(Arc::new(scan_aggregate));
            }
        }
        if let Some(join) = aggregate_into_join(&node, agg, partitioning_free, options) {
            return Ok(join);
        }
        if let Some(gpu_agg) = gpu_aggregate(&node, agg, partitioning_free, options, gpu)? {
            return Ok(gpu_agg);
        }
    }
    if let Some(sort) = node.downcast_ref::<SortExec>().filter(|_| !sorts_kept) {
        if let Some(sorted) = sort_into_aggregate(sort)? {
            return Ok(sorted);
        }
    }
    Ok(node)
}

/// The GPU aggregation below `sort` emitting its groups in the sort's
/// order itself, where the sort orders each partition (or its one input
/// partition) on group key columns alone: directly over the aggregation,
/// or over the round robin that deals one aggregation's groups to several
/// partitions (one partition, sorted, then serves every partition's
/// consumer: a merge that preserves order, above such a sort), either
/// possibly under a projection that passes the sort's columns through (it
/// then runs over the sorted groups). A limit on the sort becomes a limit
/// on each partition. `None` where nothing changes.
fn sort_into_aggregate(sort: &SortExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let input = sort.input();
    let per_partition = sort.preserve_partitioning()
        || input.properties().output_partitioning().partition_count() <= 1;
    if !per_partition {
        return Ok(None);
    }
    // A projection between them: the sort's columns named through it.
    let (projection, ordering, input) = match input.downcast_ref::<ProjectionExec>() {
        Some(projection) => match ordering_below_projection(sort.expr(), projection) {
            Some(ordering) => (Some(projection), ordering, projection.input()),
            None => return Ok(None),
        },
        None => (None, sort.expr().clone(), input),
    };
    let gpu_agg = match input.downcast_ref::<RepartitionExec>() {
        Some(repartition)
            if !repartition.preserve_order()
                && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_)) =>
        {
            repartition
                .input()
                .downcast_ref::<GpuAggregateExec>()
                .filter(|agg| agg.properties().output_partitioning().partition_count() == 1)
        }
        Some(_) => None,
        None => input.downcast_ref::<GpuAggregateExec>(),
    };
    let Some(gpu_agg) = gpu_agg.filter(|agg| agg.group_ordering().is_none()) else {
        return Ok(None);
    };
    let Some(sorted) = gpu_agg.with_group_order(&ordering)? else {
        return Ok(None);
    };
    let mut sorted: Arc<dyn ExecutionPlan> = Arc::new(sorted);
    if let Some(projection) = projection {
        // A projection keeps the order of its rows.
        sorted = Arc::new(ProjectionExec::try_new(projection.expr().to_vec(), sorted)?);
    }
    Ok(Some(match sort.fetch() {
        Some(fetch) => Arc::new(LocalLimitExec::new(sorted, fetch)),
        None => sorted,
    }))
}

/// The GPU join in place of `node`, a sort-merge join that `merged` re-plans
/// over all its input partitions (see
/// [`merge_join_over_unrepartitioned_inputs`]). Its one output partition,
/// in key order, is spread round robin over as many partitions as `node`
/// had, so the nodes above keep their parallelism: whole batches, in order,
/// each partition still sorted on the keys.
fn merge_join_over_all_partitions(
    node: &Arc<dyn ExecutionPlan>,
    merged: SortMergeJoinExec,
) -> Result<Arc<dyn ExecutionPlan>> {
    let sorts = absorbable_sorts(&merged);
    let gpu_join: Arc<dyn ExecutionPlan> = Arc::new(
        GpuSortMergeJoinExec::try_new(Arc::new(merged), sorts)?.with_repartitions_removed(true),
    );
    let partitions = node.properties().output_partitioning().partition_count();
    if partitions <= 1 {
        return Ok(gpu_join);
    }
    Ok(Arc::new(RepartitionExec::try_new(
        gpu_join,
        Partitioning::RoundRobinBatch(partitions),
    )?))
}

/// The GPU sort-merge join below `projection` (directly, or under the round
/// robin that spreads a join over all partitions) with the projection taken
/// into it, where it picks plain columns: the join then copies, gathers and
/// returns only those columns. `None` where nothing changes.
fn projection_into_merge_join(
    projection: &ProjectionExec,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some((join, spread)) = merge_join_below(projection.input()) else {
        return Ok(None);
    };
    let Some(projected) = join.with_projection(projection.expr().to_vec())? else {
        return Ok(None);
    };
    if projected.schema() != projection.schema() {
        return Ok(None);
    }
    Ok(Some(spread_again(Arc::new(projected), spread)?))
}

/// The GPU sort-merge join that `input` is, or that the round robin
/// `input` spreads over several partitions (with their number).
fn merge_join_below(
    input: &Arc<dyn ExecutionPlan>,
) -> Option<(&GpuSortMergeJoinExec, Option<usize>)> {
    match input.downcast_ref::<RepartitionExec>() {
        Some(repartition) if !repartition.preserve_order() => match repartition.partitioning() {
            Partitioning::RoundRobinBatch(partitions) => repartition
                .input()
                .downcast_ref()
                .map(|join| (join, Some(*partitions))),
            _ => None,
        },
        Some(_) => None,
        None => input.downcast_ref().map(|join| (join, None)),
    }
}

/// `node` spread round robin over `spread` partitions again, where it was.
fn spread_again(
    node: Arc<dyn ExecutionPlan>,
    spread: Option<usize>,
) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(match spread {
        None => node,
        Some(partitions) => Arc::new(RepartitionExec::try_new(
            node,
            Partitioning::RoundRobinBatch(partitions),
        )?),
    })
}

/// `ordering` (over `projection`'s output) over its input's columns, where
/// every sort column is a plain column of the input passed through.
fn ordering_below_projection(
    ordering: &LexOrdering,
    projection: &ProjectionExec,
) -> Option<LexOrdering> {
    let mut below = Vec::with_capacity(ordering.len());
    for sort_expr in ordering.iter() {
        let column = sort_expr.expr.downcast_ref::<Column>()?;
        let projected = projection.expr().get(column.index())?;
        if projected.alias != column.name() || projected.expr.downcast_ref::<Column>().is_none() {
            return None;
        }
        below.push(PhysicalSortExpr::new(
            Arc::clone(&projected.expr),
            sort_expr.options,
        ));
    }
    LexOrdering::new(below)
}

/// How a `Partitioned` join may run once over all its input partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MergeInputs {
    /// Nothing above relies on the join's hash partitioning.
    Free,
    /// Something above does: the join's output is hash-repartitioned as
    /// the join's was, which moves fewer rows than repartitioning both
    /// inputs wherever the join makes no more rows than it reads.
    RepartitionOutput,
}

/// How a GPU hash join is to be planned where it replaces a `HashJoinExec`.
#[derive(Debug, Clone, Copy)]
struct GpuJoinPlan {
    /// Whether the join's row order can be seen above it.
    order_observable: bool,
    /// Whether, and how, it may run once over all input partitions.
    merge: Option<MergeInputs>,
    /// Whether the aggregation above takes its pairs on the device.
    output_folded: bool,
}

/// The GPU join replacing `join` (the plan node `node`), if any: over all
/// input partitions where `merge` allows and the join has CPU repartitions
/// to remove (with its output repartitioned where that is relied on),
/// otherwise over the same inputs.
fn gpu_join(
    node: &Arc<dyn ExecutionPlan>,
    join: &HashJoinExec,
    planned: GpuJoinPlan,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let GpuJoinPlan {
        order_observable,
        merge,
        output_folded,
    } = planned;
    if let Some(merge) = merge {
        let output_partitioning = join.properties().output_partitioning().clone();
        let allowed = match merge {
            MergeInputs::Free => true,
            MergeInputs::RepartitionOutput => {
                evaluable_hash(&output_partitioning, &join.schema())
                    && !makes_more_rows_than_it_reads(node, join)
            }
        };
        if let Some(merged) = allowed
            .then(|| over_unrepartitioned_inputs(join))
            .transpose()?
            .flatten()
        {
            let merged: Arc<dyn ExecutionPlan> = Arc::new(merged);
            if decide_hash_join(&merged, options, gpu, output_folded).is_ok() {
                let gpu_join: Arc<dyn ExecutionPlan> = Arc::new(
                    GpuHashJoinExec::try_new(merged)?
                        .with_preserve_order(false)
                        .with_repartition_removed(true),
                );
                return Ok(Some(match merge {
                    MergeInputs::Free => gpu_join,
                    MergeInputs::RepartitionOutput => {
                        Arc::new(RepartitionExec::try_new(gpu_join, output_partitioning)?)
                    }
                }));
            }
        }
    }
    if decide_hash_join(node, options, gpu, output_folded).is_ok() {
        return Ok(Some(Arc::new(
            GpuHashJoinExec::try_new(Arc::clone(node))?.with_preserve_order(order_observable),
        )));
    }
    Ok(None)
}

/// Whether `partitioning` hashes expressions that a repartition above a node
/// of `schema` can evaluate: every column one of the schema's. A join whose
/// projection drops its key columns reports a partitioning on columns it no
/// longer outputs; nothing can re-create that one.
fn evaluable_hash(partitioning: &Partitioning, schema: &SchemaRef) -> bool {
    let Partitioning::Hash(exprs, _) = partitioning else {
        return false;
    };
    exprs.iter().all(|expr| {
        let mut evaluable = true;
        let walked = expr.apply(|node| {
            if node.downcast_ref::<UnKnownColumn>().is_some() {
                evaluable = false;
            } else if let Some(column) = node.downcast_ref::<Column>() {
                evaluable &= schema
                    .fields()
                    .get(column.index())
                    .is_some_and(|field| field.name() == column.name());
            }
            Ok(if evaluable {
                TreeNodeRecursion::Continue
            } else {
                TreeNodeRecursion::Stop
            })
        });
        walked.is_ok() && evaluable
    })
}

/// Whether statistics say that `join` (the plan node `node`) makes more
/// rows than its two inputs hold together (an exploding join, whose output
/// costs more to repartition than its inputs); unknown sizes count as not.
fn makes_more_rows_than_it_reads(node: &Arc<dyn ExecutionPlan>, join: &HashJoinExec) -> bool {
    match (
        estimated_rows(node),
        estimated_rows(join.left()),
        estimated_rows(join.right()),
    ) {
        (Some(output), Some(left), Some(right)) => output > left.saturating_add(right),
        _ => false,
    }
}

/// The GPU aggregation replacing `agg` (the plan node `node`), if any: one
/// aggregation in place of DataFusion's two phases where
/// `gpu.tuning.aggregate_single_phase` allows, otherwise over the same input. The
/// one aggregation has one output partition; where the final aggregation
/// had several, a repartition of its groups restores their number (by hash
/// where something above relies on the final aggregation's hash
/// partitioning, round robin where nothing does), so that the operators
/// above run on as many threads as before. A hash repartition hashes in
/// one task per input partition, so the groups are first dealt round robin
/// to as many partitions: millions of groups are then hashed on every core,
/// not on one.
fn gpu_aggregate(
    node: &Arc<dyn ExecutionPlan>,
    agg: &AggregateExec,
    partitioning_free: bool,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let output_partitioning = agg.properties().output_partitioning().clone();
    let partitions = output_partitioning.partition_count();
    let restorable =
        partitioning_free || partitions == 1 || evaluable_hash(&output_partitioning, &agg.schema());
    if options.tuning.aggregate_single_phase && restorable {
        if let Some(single) = single_phase(agg)? {
            if decide_aggregate(&single, options, gpu).is_ok() {
                let single: Arc<dyn ExecutionPlan> = Arc::new(single);
                let gpu_agg: Arc<dyn ExecutionPlan> =
                    Arc::new(GpuAggregateExec::try_new(single)?.with_cpu_phases(cpu_phases(agg)?));
                return Ok(Some(if partitions == 1 {
                    gpu_agg
                } else if partitioning_free {
                    Arc::new(RepartitionExec::try_new(
                        gpu_agg,
                        Partitioning::RoundRobinBatch(partitions),
                    )?)
                } else {
                    let dealt = Arc::new(RepartitionExec::try_new(
                        gpu_agg,
                        Partitioning::RoundRobinBatch(partitions),
                    )?);
                    Arc::new(RepartitionExec::try_new(dealt, output_partitioning)?)
                }));
            }
        }
    }
    if decide_aggregate(agg, options, gpu).is_ok() {
        return Ok(Some(Arc::new(GpuAggregateExec::try_new(Arc::clone(node))?)));
    }
    Ok(None)
}

/// The GPU join below `agg` computing `agg` from its pairs (see
/// [`GpuHashJoinExec::with_partial_aggregate`] and
/// [`GpuSortMergeJoinExec::with_partial_aggregate`]), where `agg` is
/// directly above one (a sort-merge join also under the round robin that
/// spreads its one partition, which then spreads the states) and the join
/// allows it; `None` otherwise. A `CollectLeft` hash join reads all its
/// probe partitions as one where nothing above relies on `agg`'s
/// partitioning (`partitioning_free`).
fn aggregate_into_join(
    node: &Arc<dyn ExecutionPlan>,
    agg: &AggregateExec,
    partitioning_free: bool,
    options: &GpuOptions,
) -> Option<Arc<dyn ExecutionPlan>> {
    if !options.tuning.aggregate_in_join {
        return None;
    }
    if let Some((join, spread)) = merge_join_below(agg.input()) {
        // The sort-merge join always gathers by pair on the device.
        if spread.is_none() && options.tuning.merge_partitions && !join.repartitions_removed() {
            if let Some(merged) =
                aggregating_merge_join_over_all_partitions(node, join, partitioning_free, options)
            {
                return Some(merged);
            }
        }
        let fused = join
            .with_partial_aggregate(Arc::clone(node), options.deterministic_float_sums)
            .ok()?;
        // One row of states needs no spreading where nothing above relies
        // on the number of partitions (the round robin's tasks and channels
        // cost milliseconds).
        let spread = spread.filter(|_| !partitioning_free);
        return spread_again(Arc::new(fused), spread).ok();
    }
    if !options.tuning.device_gather {
        return None;
    }
    let join = agg.input().downcast_ref::<GpuHashJoinExec>()?;
    if join.partial_aggregate().is_some() {
        return None;
    }
    // Without GROUP BY, the partial states go to one partition above
    // whatever their number: a join that aggregates reads every probe
    // partition itself, where it may merge them.
    // A join that cannot be re-planned so still computes the aggregation
    // over its own probe partitions.
    let probe_merged = match options.tuning.merge_partitions && partitioning_free {
        true => join.with_probe_merged().ok().flatten(),
        false => None,
    };
    let fused = match probe_merged {
        Some(merged) => merged,
        None => join.remade_over_same_children().ok()?,
    }
    .with_partial_aggregate(Arc::clone(node), options.deterministic_float_sums)
    .ok()?;
    Some(Arc::new(fused))
}

/// `join`, one GPU sort-merge join per partition of DataFusion's hash
/// repartitions, re-planned once over all input partitions (see
/// [`merge_join_over_unrepartitioned_inputs`]) computing `node`, the
/// aggregation above it, whose one row of states is spread round robin
/// over as many partitions as `node` had where something above relies on
/// that number (`partitioning_free` false). Unlike a join that hands its rows
/// on, which gains from its partitions' host work running at once (see
/// `gpu.tuning.merge_unsorted_sort_merge_inputs`), one that aggregates has no
/// rows to hand on: it runs over all partitions whether or not they
/// arrive sorted, without the CPU's hash repartitions. `None` where the
/// join is not of that shape.
fn aggregating_merge_join_over_all_partitions(
    node: &Arc<dyn ExecutionPlan>,
    join: &GpuSortMergeJoinExec,
    partitioning_free: bool,
    options: &GpuOptions,
) -> Option<Arc<dyn ExecutionPlan>> {
    let merged = merge_join_over_unrepartitioned_inputs(join.sort_merge_join(), true).ok()??;
    let sorts = absorbable_sorts(&merged);
    let mut gpu_join = GpuSortMergeJoinExec::try_new(Arc::new(merged), sorts)
        .ok()?
        .with_repartitions_removed(true)
        .with_in_place_of_hash_join(join.in_place_of_hash_join());
    if let Some(exprs) = join.projection() {
        gpu_join = gpu_join.with_projection(exprs.to_vec()).ok()??;
    }
    let fused = gpu_join
        .with_partial_aggregate(Arc::clone(node), options.deterministic_float_sums)
        .ok()?;
    let partitions = node.properties().output_partitioning().partition_count();
    let spread = (partitions > 1 && !partitioning_free).then_some(partitions);
    spread_again(Arc::new(fused), spread).ok()
}

/// Per side of `join`: whether its child is a `SortExec` that sorts each
/// partition on exactly the join's keys, in the join's directions, with no
/// limit: a sort DataFusion planned for the join alone, which the GPU join
/// then does on the device.
fn absorbable_sorts(join: &SortMergeJoinExec) -> [bool; 2] {
    let sides = [
        (
            join.left(),
            join.on().iter().map(|(l, _)| l).collect::<Vec<_>>(),
        ),
        (
            join.right(),
            join.on().iter().map(|(_, r)| r).collect::<Vec<_>>(),
        ),
    ];
    sides.map(|(child, keys)| {
        let Some(sort) = child.downcast_ref::<SortExec>() else {
            return false;
        };
        let per_partition = sort.preserve_partitioning()
            || sort
                .input()
                .properties()
                .output_partitioning()
                .partition_count()
                <= 1;
        let on_the_keys = sort.expr().len() == keys.len()
            && sort
                .expr()
                .iter()
                .zip(keys.iter().zip(join.sort_options()))
                .all(|(sort_expr, (key, options))| {
                    sort_expr.options == *options && sort_expr.expr.eq(*key)
                });
        sort.fetch().is_none() && per_partition && on_the_keys
    })
}

/// Whether `join` emits its rows in an order its inputs fix. `HashJoinExec`
/// emits probe row by probe row, so a probe side that arrives in a fixed
/// order fixes the output's order, whatever order the build side arrives
/// in (which orders only the matches of one probe row, and the build rows
/// emitted alone). Where the build rows emitted alone make the output, or
/// end it, their order is the build side's arrival order. A join whose
/// order is not fixed emits its rows in no fixed order, on the CPU as on
/// the GPU.
fn join_order_is_fixed(join: &HashJoinExec) -> bool {
    let [build, probe] = [join.left(), join.right()];
    // The join types whose build side remembers its matches emit build
    // rows alone once every probe row is done.
    let emits_build_rows_alone = tracks_build_matches(*join.join_type());
    let build_rows_alone_follow_arrival = emits_build_rows_alone && order_depends_on_arrival(build);
    !(order_depends_on_arrival(probe) || build_rows_alone_follow_arrival)
}

/// Whether the rows of `plan` come out in an order that depends on when
/// batches arrive: somewhere below, a node interleaves several partitions
/// as they come, and no sort has ordered the rows since. `HashJoinExec`'s
/// order (probe rows as they arrive) is then no fixed order: DataFusion's
/// own runs differ from one another, so a GPU join need not keep it.
fn order_depends_on_arrival(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if merges_in_arrival_order(plan) {
        return true;
    }
    if plan.is::<SortExec>() || plan.is::<SortPreservingMergeExec>() {
        return false;
    }
    plan.children().into_iter().any(order_depends_on_arrival)
}

/// Whether `node` interleaves several input partitions in arrival order.
fn merges_in_arrival_order(node: &Arc<dyn ExecutionPlan>) -> bool {
    let inputs = |node: &Arc<dyn ExecutionPlan>| {
        node.children().first().map_or(0, |c| {
            c.properties().output_partitioning().partition_count()
        })
    };
    if node.downcast_ref::<CoalescePartitionsExec>().is_some() {
        return inputs(node) > 1;
    }
    if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
        return !repartition.preserve_order() && inputs(node) > 1;
    }
    false
}

#[cfg(test)]
mod tests;
