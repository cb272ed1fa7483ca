//! The physical optimizer rule that swaps supported DataFusion operators for
//! their GPU versions.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
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

use super::decision::estimated_rows;
use super::merge_for_order::{merge_join_for_sort, MergeForOrder};
use super::partitioning::{
    children_partitioning_free, merge_join_over_unrepartitioned_inputs, over_unrepartitioned_inputs,
};
use super::phases::{cpu_phases, single_phase};
use super::statistics::with_statistics_of_one_pass;
use super::{decide_aggregate, decide_hash_join, decide_sort_merge_join, GpuOptions};
use crate::exec::{GpuAggregateExec, GpuHashJoinExec, GpuSortMergeJoinExec};

/// Replaces each `HashJoinExec` that [`decide_hash_join`] accepts by a
/// [`GpuHashJoinExec`], and each `AggregateExec` that [`decide_aggregate`]
/// accepts by a [`GpuAggregateExec`], with the same inputs, schema and
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
}

impl PhysicalOptimizerRule for GpuOptimizerRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = GpuOptions::from_config(config);
        if !options.enabled {
            return Ok(plan);
        }
        let gpu = crate::gpu::gpu_availability();
        let gpu = gpu.as_ref().map(|_| ()).map_err(|e| e.as_str());
        crate::trace::event(|| "rule: rewriting the plan".into());
        let rewritten = rewrite_plan(plan, &options, gpu);
        crate::trace::event(|| "rule: plan rewritten".into());
        rewritten
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
) -> Result<Arc<dyn ExecutionPlan>> {
    // Rows of several partitions reach the caller in no fixed order.
    let order_observable = plan.properties().output_partitioning().partition_count() <= 1;
    with_statistics_of_one_pass(|| {
        rewrite(plan, order_observable, true, options, gpu).and_then(without_spread_at_root)
    })
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
/// with its output repartitioned where something does.
fn rewrite(
    node: Arc<dyn ExecutionPlan>,
    order_observable: bool,
    partitioning_free: bool,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some(merge) = merge_join_for_sort(&node, options, gpu)? {
        // The sorts below it keep the hash partitioning the merge needs;
        // below them, row order does not matter.
        let children = merge
            .join
            .children()
            .into_iter()
            .map(|child| rewrite(Arc::clone(child), false, false, options, gpu))
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
    let children = node
        .children()
        .into_iter()
        .zip(children_free)
        .map(|(child, free)| rewrite(Arc::clone(child), children_observable, free, options, gpu))
        .collect::<Result<Vec<_>>>()?;
    let node = replace_children_if_necessary(node, children)?;
    if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        if let Some(join) = projection_into_merge_join(projection)? {
            return Ok(join);
        }
    }
    if let Some(join) = node.downcast_ref::<HashJoinExec>() {
        // A join whose inputs arrive in no fixed order emits its rows in no
        // fixed order either, on the CPU as on the GPU.
        let order_observable =
            order_observable && !node.children().into_iter().any(order_depends_on_arrival);
        let merge =
            (options.merge_partitions && !order_observable).then_some(if partitioning_free {
                MergeInputs::Free
            } else {
                MergeInputs::RepartitionOutput
            });
        if let Some(gpu_join) = gpu_join(&node, join, order_observable, merge, options, gpu)? {
            return Ok(gpu_join);
        }
    }
    if let Some(join) = node.downcast_ref::<SortMergeJoinExec>() {
        if decide_sort_merge_join(join, options, gpu).is_ok() {
            if options.merge_partitions && partitioning_free {
                let unsorted_too = options.merge_unsorted_sort_merge_inputs;
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
        if let Some(join) = aggregate_into_join(&node, agg, partitioning_free, options) {
            return Ok(join);
        }
        if let Some(gpu_agg) = gpu_aggregate(&node, agg, partitioning_free, options, gpu)? {
            return Ok(gpu_agg);
        }
    }
    if let Some(sort) = node.downcast_ref::<SortExec>() {
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

/// The GPU join replacing `join` (the plan node `node`), if any: over all
/// input partitions where `merge` allows and the join has CPU repartitions
/// to remove (with its output repartitioned where that is relied on),
/// otherwise over the same inputs.
fn gpu_join(
    node: &Arc<dyn ExecutionPlan>,
    join: &HashJoinExec,
    order_observable: bool,
    merge: Option<MergeInputs>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
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
            if decide_hash_join(&merged, options, gpu).is_ok() {
                let merged: Arc<dyn ExecutionPlan> = Arc::new(merged);
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
    if decide_hash_join(join, options, gpu).is_ok() {
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
/// `gpu.aggregate_single_phase` allows, otherwise over the same input. The
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
    if options.aggregate_single_phase && restorable {
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
    if !options.aggregate_in_join {
        return None;
    }
    if let Some((join, spread)) = merge_join_below(agg.input()) {
        // The sort-merge join always gathers by pair on the device.
        if spread.is_none() && options.merge_partitions && !join.repartitions_removed() {
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
    if !options.device_gather {
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
    let probe_merged = match options.merge_partitions && partitioning_free {
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
/// `gpu.merge_unsorted_sort_merge_inputs`), one that aggregates has no
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
mod tests {
    //! The plan rewrite, checked on plans without executing them, so these
    //! run without a GPU: the rule is applied as if one were present.
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    use datafusion::physical_plan::Partitioning;
    use datafusion::prelude::{SessionConfig, SessionContext};

    fn table(partitions: usize) -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let parts = (0..partitions as i64)
            .map(|p| {
                let k: ArrayRef = Arc::new(Int64Array::from_iter_values(p * 100..p * 100 + 100));
                let v: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100));
                vec![RecordBatch::try_new(Arc::clone(&schema), vec![k, v]).unwrap()]
            })
            .collect();
        Arc::new(MemTable::try_new(schema, parts).unwrap())
    }

    /// The physical plan of `sql` with DataFusion's rules, every join
    /// `Partitioned`, then the GPU rewrite as if a GPU were present.
    async fn rewritten(sql: &str, merge_partitions: bool) -> Arc<dyn ExecutionPlan> {
        rewritten_with(
            sql,
            GpuOptions {
                min_rows: 0,
                min_groups: 0,
                merge_partitions,
                // Each aggregation node as DataFusion planned it; the
                // single-phase rewrite has its own test.
                aggregate_single_phase: false,
                ..GpuOptions::default()
            },
        )
        .await
    }

    /// As [`rewritten`], with the rule's options given.
    async fn rewritten_with(sql: &str, options: GpuOptions) -> Arc<dyn ExecutionPlan> {
        rewritten_where(sql, options, 0).await
    }

    /// As [`rewritten_with`], with joins whose build side holds fewer than
    /// `collect_left_bytes` bytes planned in `CollectLeft` mode. The
    /// tables: r (4 partitions of 100 rows of two Int64 columns), s (3),
    /// t (1).
    async fn rewritten_where(
        sql: &str,
        options: GpuOptions,
        collect_left_bytes: usize,
    ) -> Arc<dyn ExecutionPlan> {
        let config = SessionConfig::new()
            .with_target_partitions(4)
            .set_usize(
                "datafusion.optimizer.hash_join_single_partition_threshold",
                collect_left_bytes,
            )
            .set_usize(
                "datafusion.optimizer.hash_join_single_partition_threshold_rows",
                0,
            );
        let ctx = SessionContext::new_with_config(config);
        ctx.register_table("r", table(4)).unwrap();
        ctx.register_table("s", table(3)).unwrap();
        ctx.register_table("t", table(1)).unwrap();
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let plan = rewrite_plan(plan, &options, Ok(())).unwrap();
        // The rewritten plan still meets every node's distribution and
        // ordering requirements.
        SanityCheckPlan::new()
            .optimize(Arc::clone(&plan), ctx.state().config_options())
            .unwrap_or_else(|e| panic!("{e}\n{}", show(&plan)))
    }

    fn show(plan: &Arc<dyn ExecutionPlan>) -> String {
        datafusion::physical_plan::displayable(plan.as_ref())
            .indent(true)
            .to_string()
    }

    fn gpu_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuHashJoinExec> {
        let mut joins: Vec<&GpuHashJoinExec> = plan.downcast_ref().into_iter().collect();
        for child in plan.children() {
            joins.extend(gpu_joins(child));
        }
        joins
    }

    fn hash_repartitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
        let here = plan
            .downcast_ref::<RepartitionExec>()
            .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..)));
        usize::from(here)
            + plan
                .children()
                .into_iter()
                .map(hash_repartitions)
                .sum::<usize>()
    }

    #[tokio::test]
    async fn a_join_under_an_ungrouped_aggregate_runs_over_all_input_partitions() {
        let sql = "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k";
        let plan = rewritten(sql, true).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert!(joins[0].repartition_removed(), "{}", show(&plan));
        assert_eq!(
            *joins[0].hash_join().partition_mode(),
            datafusion::physical_plan::joins::PartitionMode::CollectLeft
        );
        assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
        // The probe side is read in the table's own partitions.
        let probe = joins[0].hash_join().right();
        assert!(
            probe.downcast_ref::<RepartitionExec>().is_none(),
            "{}",
            show(&plan)
        );
        assert_eq!(
            joins[0]
                .properties()
                .output_partitioning()
                .partition_count(),
            probe.properties().output_partitioning().partition_count()
        );
        assert!(show(&plan).contains("cpu_repartition=removed"));
        // The build side's partitions are read by the join itself, not
        // through the merge DataFusion put below it.
        let merge = joins[0]
            .hash_join()
            .left()
            .downcast_ref::<CoalescePartitionsExec>()
            .unwrap_or_else(|| panic!("{}", show(&plan)));
        let build_partitions = merge
            .input()
            .properties()
            .output_partitioning()
            .partition_count();
        assert!(build_partitions > 1, "{}", show(&plan));
        assert!(
            show(&plan).contains(&format!("build_reads_merge_inputs={build_partitions}")),
            "{}",
            show(&plan)
        );

        let plan = rewritten(sql, false).await;
        let joins = gpu_joins(&plan);
        assert!(!joins[0].repartition_removed(), "{}", show(&plan));
        assert_eq!(hash_repartitions(&plan), 2, "{}", show(&plan));
    }

    #[tokio::test]
    async fn a_join_below_a_collect_left_probe_side_runs_over_all_input_partitions() {
        // t (the 800 bytes of its column v) is collected whole by the outer join;
        // the inner join (s, 2,400 bytes of k, builds) feeds that join's probe
        // side, whose partitioning nothing relies on.
        let sql = "SELECT count(*) FROM t JOIN (SELECT r.k FROM r JOIN s ON r.k = s.k) x \
                   ON t.v = x.k";
        let options = GpuOptions {
            min_rows: 0,
            min_groups: 0,
            aggregate_single_phase: false,
            ..GpuOptions::default()
        };
        let plan = rewritten_where(sql, options, 2_000).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 2, "{}", show(&plan));
        let outer = joins
            .iter()
            .find(|j| !j.repartition_removed())
            .unwrap_or_else(|| panic!("{}", show(&plan)));
        assert_eq!(
            *outer.hash_join().partition_mode(),
            datafusion::physical_plan::joins::PartitionMode::CollectLeft,
            "{}",
            show(&plan)
        );
        assert!(
            joins.iter().any(|j| j.repartition_removed()),
            "the inner join kept its repartitions:\n{}",
            show(&plan)
        );
        assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
    }

    #[tokio::test]
    async fn a_join_over_inputs_in_arrival_order_need_not_keep_its_order() {
        // A TopK over the join reads its rows in the order the join made
        // them (ties are kept in arrival order), so with deterministic
        // inputs (one partition each) the GPU join keeps HashJoinExec's
        // order. Over tables of several partitions the inputs arrive
        // through hash repartitions, in no fixed order: the join runs over
        // all input partitions, with no repartition left.
        let top = |from: &str| {
            format!("SELECT a.k, b.v FROM {from} ON a.k = b.k ORDER BY b.v DESC LIMIT 3")
        };
        let options = GpuOptions {
            min_rows: 0,
            min_groups: 0,
            aggregate_single_phase: false,
            ..GpuOptions::default()
        };
        let plan = rewritten_with(&top("t a JOIN t b"), options.clone()).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert!(joins[0].preserves_order(), "{}", show(&plan));
        assert!(!joins[0].repartition_removed(), "{}", show(&plan));

        let plan = rewritten_with(&top("r a JOIN s b"), options).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert!(!joins[0].preserves_order(), "{}", show(&plan));
        assert!(joins[0].repartition_removed(), "{}", show(&plan));
        assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
    }

    #[tokio::test]
    async fn a_join_whose_hash_partitioning_is_relied_on_has_its_output_repartitioned() {
        // The aggregate groups by the join key: DataFusion plans it over the
        // join's hash partitioning, without a repartition of its own. The
        // GPU join reads its inputs as they are and its output is
        // repartitioned as the join's was: one repartition instead of two.
        let sql = "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k";
        let plan = rewritten(sql, true).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert!(joins[0].repartition_removed(), "{}", show(&plan));
        assert_eq!(
            *joins[0].hash_join().partition_mode(),
            datafusion::physical_plan::joins::PartitionMode::CollectLeft
        );
        assert_eq!(hash_repartitions(&plan), 1, "{}", show(&plan));
        let shown = show(&plan);
        let lines: Vec<&str> = shown.lines().map(str::trim).collect();
        assert!(
            lines.windows(2).any(|pair| {
                pair[0].starts_with("RepartitionExec: partitioning=Hash([k@0], 4)")
                    && pair[1].starts_with("GpuHashJoinExec")
            }),
            "{shown}"
        );
        // Without merging, DataFusion's two input repartitions stay.
        let plan = rewritten(sql, false).await;
        assert!(!gpu_joins(&plan)[0].repartition_removed());
        assert_eq!(hash_repartitions(&plan), 2, "{}", show(&plan));
    }

    #[test]
    fn only_hash_partitionings_on_output_columns_can_be_made_again() {
        // TPC-H q2, q9, q10, q11 and q16 plan joins whose projection drops
        // their keys below a node that keeps their partitioning from being
        // free; repartitioning on the dropped column failed at run time.
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::physical_expr::PhysicalExpr;
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, false),
        ]));
        let hash = |exprs: Vec<Arc<dyn PhysicalExpr>>| Partitioning::Hash(exprs, 4);
        assert!(evaluable_hash(
            &hash(vec![Arc::new(Column::new("b", 1))]),
            &schema
        ));
        // A column beyond the output, or named otherwise, or unknown.
        assert!(!evaluable_hash(
            &hash(vec![Arc::new(Column::new("o_orderkey", 6))]),
            &schema
        ));
        assert!(!evaluable_hash(
            &hash(vec![Arc::new(Column::new("a", 1))]),
            &schema
        ));
        assert!(!evaluable_hash(
            &hash(vec![
                Arc::new(Column::new("a", 0)),
                Arc::new(UnKnownColumn::new("k"))
            ]),
            &schema
        ));
        assert!(!evaluable_hash(&Partitioning::RoundRobinBatch(4), &schema));
    }

    #[tokio::test]
    async fn joins_stacked_on_one_key_run_over_all_input_partitions() {
        let sql = "SELECT count(*) FROM r JOIN s ON r.k = s.k JOIN r AS r2 ON s.k = r2.k";
        let plan = rewritten(sql, true).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 2, "{}", show(&plan));
        // The lower join (listed second) feeds a join that requires its
        // hash partitioning, so its output is repartitioned; the upper
        // join, free of any requirement, then reads the lower one's output
        // without that repartition.
        assert!(
            joins.iter().all(|j| j.repartition_removed()),
            "{}",
            show(&plan)
        );
        assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
    }

    fn gpu_aggregates(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuAggregateExec> {
        let mut aggs: Vec<&GpuAggregateExec> = plan.downcast_ref().into_iter().collect();
        for child in plan.children() {
            aggs.extend(gpu_aggregates(child));
        }
        aggs
    }

    fn cpu_aggregates(plan: &Arc<dyn ExecutionPlan>) -> Vec<&AggregateExec> {
        let mut aggs: Vec<&AggregateExec> = plan.downcast_ref().into_iter().collect();
        for child in plan.children() {
            aggs.extend(cpu_aggregates(child));
        }
        aggs
    }

    #[tokio::test]
    async fn aggregations_run_on_the_gpu_in_every_mode_of_a_two_phase_plan() {
        use datafusion::physical_plan::aggregates::AggregateMode;
        for (sql, modes) in [
            (
                "SELECT k, count(*), sum(v), min(v), max(v), avg(v) FROM r GROUP BY k",
                [AggregateMode::Partial, AggregateMode::FinalPartitioned],
            ),
            (
                "SELECT count(*), sum(v), avg(v) FROM r",
                [AggregateMode::Partial, AggregateMode::Final],
            ),
        ] {
            let plan = rewritten(sql, false).await;
            let mut seen: Vec<AggregateMode> = gpu_aggregates(&plan)
                .iter()
                .map(|agg| *agg.aggregate().mode())
                .collect();
            seen.sort_by_key(|m| format!("{m:?}"));
            let mut expected = modes.to_vec();
            expected.sort_by_key(|m| format!("{m:?}"));
            assert_eq!(seen, expected, "{}", show(&plan));
            assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
            assert!(show(&plan).contains("GpuAggregateExec: algorithm=hash_group_by"));
        }
    }

    #[tokio::test]
    async fn two_aggregation_phases_become_one_gpu_aggregation_where_partitioning_is_free() {
        use datafusion::physical_plan::aggregates::AggregateMode;
        let single_phase = || GpuOptions {
            min_rows: 0,
            min_groups: 0,
            aggregate_single_phase: true,
            ..GpuOptions::default()
        };
        for sql in [
            "SELECT k, count(*), sum(v), min(v), max(v), avg(v) FROM r GROUP BY k",
            "SELECT count(*), sum(v), avg(v) FROM r",
        ] {
            let plan = rewritten_with(sql, single_phase()).await;
            let aggs = gpu_aggregates(&plan);
            assert_eq!(aggs.len(), 1, "{}", show(&plan));
            assert_eq!(*aggs[0].aggregate().mode(), AggregateMode::Single);
            assert!(aggs[0].phases_merged());
            assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
            assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
            assert!(show(&plan).contains("cpu_phases=removed"));
            assert!(
                show(&plan).contains("reads_merge_inputs=4"),
                "{}",
                show(&plan)
            );
            // At the root, its one partition is not spread round robin: the
            // caller would only merge the partitions again.
            assert!(!show(&plan).contains("RoundRobinBatch"), "{}", show(&plan));
            assert_eq!(plan.properties().output_partitioning().partition_count(), 1);
        }
        // Nor below a projection of plain columns at the root.
        let sql = "SELECT c, k FROM (SELECT k, count(*) AS c FROM r GROUP BY k)";
        let plan = rewritten_with(sql, single_phase()).await;
        assert_eq!(gpu_aggregates(&plan).len(), 1, "{}", show(&plan));
        assert!(!show(&plan).contains("RoundRobinBatch"), "{}", show(&plan));
        // A join above relies on the aggregation's hash partitioning on its
        // key: the one aggregation's groups are hash-repartitioned.
        let sql = "SELECT a.k, a.c, s.v FROM (SELECT k, count(*) AS c FROM r GROUP BY k) a \
                   JOIN s ON a.k = s.k";
        for merge_partitions in [false, true] {
            let options = GpuOptions {
                merge_partitions,
                ..single_phase()
            };
            let plan = rewritten_with(sql, options).await;
            let aggs = gpu_aggregates(&plan);
            assert_eq!(aggs.len(), 1, "{}", show(&plan));
            assert_eq!(*aggs[0].aggregate().mode(), AggregateMode::Single);
            assert!(aggs[0].phases_merged());
            assert!(
                show(&plan).contains(
                    "RepartitionExec: partitioning=Hash([k@0], 4), input_partitions=4\n      \
                     RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1\n        \
                     GpuAggregateExec"
                ),
                "{}",
                show(&plan)
            );
        }
        // Nothing above relies on the partitioning, but the aggregation had
        // several partitions: its groups are spread round robin.
        let sql = "SELECT k + 1, c FROM (SELECT k, count(*) AS c FROM r GROUP BY k)";
        let plan = rewritten_with(sql, single_phase()).await;
        assert!(
            show(&plan)
                .contains("RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1"),
            "{}",
            show(&plan)
        );
        assert_eq!(gpu_aggregates(&plan).len(), 1, "{}", show(&plan));
    }

    #[tokio::test]
    async fn a_sort_on_group_keys_above_an_aggregation_becomes_the_aggregation_s_own() {
        for single_phase in [true, false] {
            let options = GpuOptions {
                min_rows: 0,
                min_groups: 0,
                aggregate_single_phase: single_phase,
                ..GpuOptions::default()
            };
            for (sql, order) in [
                (
                    "SELECT k, max(v) FROM r GROUP BY k ORDER BY k",
                    "k@0 ASC NULLS LAST",
                ),
                (
                    "SELECT k, v, count(*) FROM r GROUP BY k, v ORDER BY v DESC NULLS FIRST",
                    "v@1 DESC",
                ),
                (
                    "SELECT k, v, count(*) FROM r GROUP BY k, v ORDER BY v, k DESC LIMIT 5",
                    "v@1 ASC NULLS LAST, k@0 DESC",
                ),
                // Sorts below or above a projection of the groups.
                (
                    "SELECT max(v) AS m, k FROM r GROUP BY k ORDER BY k DESC",
                    "k@0 DESC",
                ),
                (
                    "SELECT k + 1 AS k1, max(v) FROM r GROUP BY k ORDER BY k",
                    "k@0 ASC NULLS LAST",
                ),
            ] {
                let plan = rewritten_with(sql, options.clone()).await;
                let text = show(&plan);
                assert!(!text.contains("SortExec"), "{sql}\n{text}");
                let sorted: Vec<&GpuAggregateExec> = gpu_aggregates(&plan)
                    .into_iter()
                    .filter(|agg| agg.group_ordering().is_some())
                    .collect();
                assert_eq!(sorted.len(), 1, "{sql}\n{text}");
                assert_eq!(sorted[0].algorithm(), GpuAggregateExec::SORTED_ALGORITHM);
                assert!(text.contains(&format!("order=[{order}]")), "{sql}\n{text}");
                assert_eq!(
                    text.contains("LocalLimitExec: fetch=5"),
                    sql.contains("LIMIT")
                );
            }
        }
        // Sorts the aggregation cannot take stay: on an aggregate's value,
        // on an expression, on a string key.
        for sql in [
            "SELECT k, max(v) AS m FROM r GROUP BY k ORDER BY m",
            "SELECT k, max(v) FROM r GROUP BY k ORDER BY k + 1",
            "SELECT k + 1 AS k1, max(v) FROM r GROUP BY k ORDER BY k1",
            "SELECT c, count(*) FROM (SELECT CAST(k AS VARCHAR) AS c FROM r) GROUP BY c ORDER BY c",
        ] {
            let options = GpuOptions {
                min_rows: 0,
                min_groups: 0,
                hashed_group_keys: true,
                ..GpuOptions::default()
            };
            let plan = rewritten_with(sql, options).await;
            assert!(show(&plan).contains("SortExec"), "{sql}\n{}", show(&plan));
            assert!(
                gpu_aggregates(&plan)
                    .iter()
                    .all(|agg| agg.group_ordering().is_none()),
                "{sql}\n{}",
                show(&plan)
            );
        }
    }

    fn gpu_merge_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuSortMergeJoinExec> {
        let mut joins: Vec<&GpuSortMergeJoinExec> = plan.downcast_ref().into_iter().collect();
        for child in plan.children() {
            joins.extend(gpu_merge_joins(child));
        }
        joins
    }

    fn find_merge_join(plan: &Arc<dyn ExecutionPlan>) -> Option<&SortMergeJoinExec> {
        plan.downcast_ref::<SortMergeJoinExec>()
            .or_else(|| plan.children().into_iter().find_map(find_merge_join))
    }

    #[tokio::test]
    async fn sort_merge_joins_absorb_the_sorts_planned_for_them() {
        // Each partition on its own: the joins of the merge over all input
        // partitions have their own test.
        let options = GpuOptions {
            min_rows: 0,
            min_groups: 0,
            merge_partitions: false,
            ..GpuOptions::default()
        };
        let config = SessionConfig::new()
            .with_target_partitions(4)
            .set_bool("datafusion.optimizer.prefer_hash_join", false);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_table("r", table(4)).unwrap();
        ctx.register_table("s", table(3)).unwrap();
        for sql in [
            "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
            "SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k AND r.v > s.v",
            "SELECT s.v FROM r RIGHT ANTI JOIN s ON r.k = s.k",
        ] {
            let plan = ctx
                .sql(sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let plan = rewrite(plan, false, true, &options, Ok(())).unwrap();
            // Every requirement still holds, with the sorts gone.
            let plan = SanityCheckPlan::new()
                .optimize(plan, ctx.state().config_options())
                .unwrap();
            let joins = gpu_merge_joins(&plan);
            assert_eq!(joins.len(), 1, "{sql}\n{}", show(&plan));
            assert_eq!(joins[0].sort_on_device(), [true, true], "{}", show(&plan));
            assert!(!show(&plan).contains("SortExec"), "{}", show(&plan));
            assert!(show(&plan).contains("sort=[left: device, right: device]"));
        }
        // String keys have no order-preserving code: the join stays, and says why.
        let plan = ctx
            .sql("SELECT r.v FROM r JOIN s ON CAST(r.k AS VARCHAR) = CAST(s.k AS VARCHAR)")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let plan = rewrite(plan, false, true, &options, Ok(())).unwrap();
        assert!(gpu_merge_joins(&plan).is_empty(), "{}", show(&plan));
        let join = find_merge_join(&plan).expect("a sort-merge join");
        let why = super::decide_sort_merge_join(join, &options, Ok(())).unwrap_err();
        assert!(why.contains("order-preserving"), "{why}");
    }

    /// The plan of `sql` with sort-merge joins, rewritten with `options` and
    /// checked against every node's requirements; `sorted` registers the
    /// tables with their partitions sorted on `k` and DataFusion asked to
    /// keep that order.
    async fn merge_join_plan(
        sql: &str,
        options: &GpuOptions,
        sorted: bool,
    ) -> Arc<dyn ExecutionPlan> {
        let config = SessionConfig::new()
            .with_target_partitions(4)
            .set_bool("datafusion.optimizer.prefer_hash_join", false)
            .set_bool("datafusion.optimizer.prefer_existing_sort", sorted);
        let ctx = SessionContext::new_with_config(config);
        let order = vec![vec![datafusion::logical_expr::col("k").sort(true, true)]];
        for (name, partitions) in [("r", 4), ("s", 3)] {
            let table = Arc::into_inner(table(partitions)).expect("one owner");
            let table = if sorted {
                table.with_sort_order(order.clone())
            } else {
                table
            };
            ctx.register_table(name, Arc::new(table)).unwrap();
        }
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let plan = rewrite(plan, false, true, options, Ok(())).unwrap();
        SanityCheckPlan::new()
            .optimize(Arc::clone(&plan), ctx.state().config_options())
            .unwrap_or_else(|e| panic!("{e}\n{}", show(&plan)))
    }

    /// Asserts that `plan` holds one GPU sort-merge join per partition of
    /// DataFusion's two hash repartitions, and returns it.
    fn joined_per_partition(plan: &Arc<dyn ExecutionPlan>) -> &GpuSortMergeJoinExec {
        let joins = gpu_merge_joins(plan);
        assert_eq!(joins.len(), 1, "{}", show(plan));
        assert!(!joins[0].repartitions_removed(), "{}", show(plan));
        assert_eq!(hash_repartitions(plan), 2, "{}", show(plan));
        joins[0]
    }

    #[tokio::test]
    async fn a_sort_merge_join_runs_once_over_all_input_partitions_where_nothing_relies_on_its_partitioning(
    ) {
        let options = GpuOptions {
            min_rows: 0,
            min_groups: 0,
            ..GpuOptions::default()
        };
        assert!(options.merge_partitions && !options.merge_unsorted_sort_merge_inputs);
        // By default over sorted partitions, which DataFusion merges while
        // it repartitions them; with the option, over unsorted ones too.
        let unsorted_too = GpuOptions {
            merge_unsorted_sort_merge_inputs: true,
            ..options.clone()
        };
        for sorted in [false, true] {
            let options = if sorted { &options } else { &unsorted_too };
            for sql in [
                "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k",
                "SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k AND r.v > s.v",
                "SELECT s.v FROM r RIGHT ANTI JOIN s ON r.k = s.k",
                "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k NULLS FIRST",
            ] {
                let plan = merge_join_plan(sql, options, sorted).await;
                let text = show(&plan);
                let joins = gpu_merge_joins(&plan);
                assert_eq!(joins.len(), 1, "{sql}\n{text}");
                let join = joins[0];
                assert!(join.repartitions_removed(), "{sql}\n{text}");
                assert!(text.contains("cpu_repartitions=removed"), "{text}");
                // No CPU pass hashes the inputs; the device sorts both,
                // sorted partitions or not, as one partition each.
                assert_eq!(hash_repartitions(&plan), 0, "{sql}\n{text}");
                assert_eq!(join.sort_on_device(), [true, true], "{sql}\n{text}");
                for child in join.children() {
                    assert_eq!(
                        child.properties().output_partitioning().partition_count(),
                        1,
                        "{text}"
                    );
                }
                // It reads the partitions below each merge itself (r has
                // four, s three), as the merge would, each in a task.
                assert!(
                    text.contains("reads_merge_inputs=[left: 4, right: 3]"),
                    "{sql}\n{text}"
                );
                // Its output, in key order, is spread round robin over the
                // join's partitions, each still sorted; the one row of an
                // aggregation's states is not.
                assert_eq!(
                    text.contains(
                        "RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1"
                    ),
                    join.partial_aggregate().is_none(),
                    "{sql}\n{text}"
                );
                assert!(!text.contains("SortExec"), "{sql}\n{text}");
                // The projection of the join's columns above the round robin
                // is the join's own: only those columns travel.
                assert!(join.projection().is_some(), "{sql}\n{text}");
                assert!(text.contains(", projection=["), "{sql}\n{text}");
                // Its statistics are those of the columns it emits.
                let stats = StatisticsContext::new()
                    .compute(join, &StatisticsArgs::new())
                    .unwrap();
                assert_eq!(
                    stats.column_statistics.len(),
                    join.schema().fields().len(),
                    "{sql}"
                );
                // The decision record says so.
                let decisions = crate::gpu_decisions(&plan, &ConfigOptions::default());
                assert!(
                    decisions.iter().any(|d| matches!(
                        &d.placement,
                        crate::Placement::Gpu { algorithm }
                            if algorithm.contains("over all input partitions (CPU hash repartitions removed)")
                    )),
                    "{sql}: {decisions:?}"
                );
            }
        }
        // An input already in one sorted partition is merged as it is.
        let plan = merge_join_plan(
            "SELECT r.v, s.v FROM r JOIN (SELECT * FROM s ORDER BY k NULLS FIRST LIMIT 1000) s ON r.k = s.k",
            &unsorted_too,
            false,
        )
        .await;
        let joins = gpu_merge_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert_eq!(joins[0].sort_on_device(), [true, false], "{}", show(&plan));
        // Unsorted inputs by default: a GPU join per partition of
        // DataFusion's repartitions, the sorts absorbed (where the join
        // hands rows on: one that aggregates runs over all partitions, see
        // the test of aggregates in the sort-merge join).
        let plan = merge_join_plan(
            "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
            &options,
            false,
        )
        .await;
        let join = joined_per_partition(&plan);
        assert_eq!(join.sort_on_device(), [true, true], "{}", show(&plan));
        // Where a node above relies on the join's hash partitioning, each
        // partition joins on its own, as DataFusion planned it.
        let plan = merge_join_plan(
            "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k",
            &unsorted_too,
            false,
        )
        .await;
        joined_per_partition(&plan);
        // And so it does with the option off.
        let plan = merge_join_plan(
            "SELECT count(*) FROM r JOIN s ON r.k = s.k",
            &GpuOptions {
                merge_partitions: false,
                ..unsorted_too.clone()
            },
            false,
        )
        .await;
        joined_per_partition(&plan);
        // There, sorted partitions keep their order through DataFusion's
        // order-preserving repartitions, and are merged without a sort.
        let plan = merge_join_plan(
            "SELECT count(*) FROM r JOIN s ON r.k = s.k",
            &GpuOptions {
                merge_partitions: false,
                ..options.clone()
            },
            true,
        )
        .await;
        let join = joined_per_partition(&plan);
        assert_eq!(join.sort_on_device(), [false, false], "{}", show(&plan));
    }

    #[tokio::test]
    async fn a_single_count_distinct_runs_on_the_gpu_as_datafusion_rewrites_it() {
        // DataFusion plans one DISTINCT column as a grouping by the key and
        // the column, then a count per key: two plain aggregations.
        let sql = "SELECT k, count(DISTINCT v), max(v) FROM r GROUP BY k";
        for single_phase in [false, true] {
            let options = GpuOptions {
                min_rows: 0,
                min_groups: 0,
                aggregate_single_phase: single_phase,
                ..GpuOptions::default()
            };
            let plan = rewritten_with(sql, options).await;
            assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
            assert!(gpu_aggregates(&plan).len() >= 2, "{}", show(&plan));
        }
    }

    #[tokio::test]
    async fn aggregations_the_gpu_cannot_run_stay_on_the_cpu_and_say_why() {
        let options = GpuOptions {
            min_rows: 0,
            min_groups: 0,
            aggregate_single_phase: false,
            ..GpuOptions::default()
        };
        for (sql, reason) in [
            (
                "SELECT named_struct('a', k), count(*) FROM r GROUP BY named_struct('a', k)",
                "group key type Struct",
            ),
            (
                "SELECT k, min(CAST(v AS DOUBLE)) FROM r GROUP BY k",
                "min over Float64",
            ),
            (
                "SELECT k, v, count(*) FROM r GROUP BY ROLLUP (k, v)",
                "GROUPING SETS",
            ),
            (
                "SELECT k, array_agg(v) FROM r GROUP BY k",
                "array_agg is not supported",
            ),
            (
                // Two DISTINCT columns: DataFusion keeps the DISTINCT
                // aggregates (one is rewritten, see below).
                "SELECT k, count(DISTINCT v), count(DISTINCT v + k) FROM r GROUP BY k",
                "(DISTINCT ...) is not supported",
            ),
        ] {
            let plan = rewritten(sql, false).await;
            let aggs = cpu_aggregates(&plan);
            assert!(!aggs.is_empty(), "{sql}\n{}", show(&plan));
            for agg in aggs {
                let why = super::decide_aggregate(agg, &options, Ok(())).unwrap_err();
                assert!(why.contains(reason), "{sql}: {why}");
            }
        }
        // Strings, and floats beside other columns, are hashed and checked
        // on the host: on the CPU unless gpu.hashed_group_keys is set. A
        // single float column is its own key.
        for sql in [
            "SELECT CAST(k AS VARCHAR), count(*) FROM r GROUP BY CAST(k AS VARCHAR)",
            "SELECT CAST(v AS DOUBLE), k, max(k) FROM r GROUP BY CAST(v AS DOUBLE), k",
        ] {
            let plan = rewritten(sql, false).await;
            let aggs = cpu_aggregates(&plan);
            assert!(!aggs.is_empty(), "{sql}\n{}", show(&plan));
            for agg in aggs {
                let why = super::decide_aggregate(agg, &options, Ok(())).unwrap_err();
                assert!(
                    why.contains("gpu.hashed_group_keys = false"),
                    "{sql}: {why}"
                );
            }
            let hashed = GpuOptions {
                hashed_group_keys: true,
                ..options.clone()
            };
            let plan = rewritten_with(sql, hashed).await;
            assert!(cpu_aggregates(&plan).is_empty(), "{sql}\n{}", show(&plan));
            assert_eq!(gpu_aggregates(&plan).len(), 2, "{sql}\n{}", show(&plan));
        }
        let plan = rewritten(
            "SELECT CAST(v AS DOUBLE), max(k) FROM r GROUP BY CAST(v AS DOUBLE)",
            false,
        )
        .await;
        assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
        // Too small by statistics, under the default threshold.
        let plan = rewritten("SELECT k, count(*) FROM r GROUP BY k", false).await;
        let agg = gpu_aggregates(&plan)[0].aggregate();
        let why = super::decide_aggregate(agg, &GpuOptions::default(), Ok(())).unwrap_err();
        assert!(why.contains("below gpu.min_rows"), "{why}");
    }

    #[tokio::test]
    async fn a_hash_join_sorted_on_its_keys_becomes_a_gpu_sort_merge_join_without_the_sort() {
        let options = |for_order: bool| GpuOptions {
            min_rows: 0,
            min_groups: 0,
            sort_merge_join_for_order: for_order,
            ..GpuOptions::default()
        };
        for sql in [
            "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k",
            "SELECT r.v, s.k FROM r JOIN s ON r.k = s.k ORDER BY s.k DESC",
        ] {
            let plan = rewritten_with(sql, options(true)).await;
            let joins = gpu_merge_joins(&plan);
            assert_eq!(joins.len(), 1, "{sql}\n{}", show(&plan));
            assert!(joins[0].in_place_of_hash_join());
            assert_eq!(joins[0].sort_on_device(), [true, true], "{}", show(&plan));
            // The sort of the join output is gone; the merge of the sorted
            // partitions stays.
            assert!(!show(&plan).contains("SortExec"), "{sql}\n{}", show(&plan));
            assert!(
                show(&plan).contains("SortPreservingMergeExec"),
                "{}",
                show(&plan)
            );
            assert!(show(&plan).contains("in_place_of=HashJoinExec"));
            // The hash join's embedded projection is the merge join's own.
            assert!(joins[0].projection().is_some(), "{}", show(&plan));
            assert!(!show(&plan).contains("ProjectionExec"), "{}", show(&plan));
            let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
            assert!(
                decisions.iter().any(|d| matches!(&d.placement,
                    crate::Placement::Gpu { algorithm } if algorithm.contains("in place of HashJoinExec"))),
                "{decisions:?}"
            );
            // Switched off, the hash join and the sort stay.
            let plan = rewritten_with(sql, options(false)).await;
            assert!(gpu_merge_joins(&plan).is_empty(), "{}", show(&plan));
            assert!(show(&plan).contains("SortExec"), "{}", show(&plan));
        }
        // A sort on something else, with a limit, or over a full join (whose
        // unmatched rows break the merge's key order) keeps the hash join.
        for sql in [
            "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY s.v",
            "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k LIMIT 5",
            "SELECT r.k, s.v FROM r FULL JOIN s ON r.k = s.k ORDER BY r.k",
        ] {
            let plan = rewritten_with(sql, options(true)).await;
            assert!(gpu_merge_joins(&plan).is_empty(), "{sql}\n{}", show(&plan));
        }
    }

    #[tokio::test]
    async fn aggregations_without_group_by_stay_on_the_cpu_unless_min_groups_is_zero() {
        let sql = "SELECT count(*), sum(v) FROM r";
        // The rewrite with min_groups = 0 sends both phases to the GPU.
        let plan = rewritten(sql, false).await;
        let aggs = gpu_aggregates(&plan);
        assert!(!aggs.is_empty(), "{}", show(&plan));
        let few_groups = GpuOptions {
            min_rows: 0,
            ..GpuOptions::default()
        };
        for agg in aggs {
            let agg = agg.aggregate();
            let why = super::decide_aggregate(agg, &few_groups, Ok(())).unwrap_err();
            assert!(why.contains("one (no GROUP BY)"), "{why}");
            assert!(why.contains("below gpu.min_groups = 65536"), "{why}");
        }
        // Grouping keys without distinct counts count as many groups.
        let plan = rewritten("SELECT k, count(*) FROM r GROUP BY k", false).await;
        for agg in gpu_aggregates(&plan) {
            super::decide_aggregate(agg.aggregate(), &few_groups, Ok(())).unwrap();
        }
    }

    /// The rule's options for the tests of aggregations computed in joins.
    fn aggregate_in_join_options(aggregate_in_join: bool) -> GpuOptions {
        GpuOptions {
            min_rows: 0,
            aggregate_single_phase: false,
            aggregate_in_join,
            ..GpuOptions::default()
        }
    }

    /// An aggregation a join computes, and those it does not (with
    /// `GROUP BY`, `FILTER`, a function or argument it does not reduce,
    /// above a join that does not emit one row per pair).
    const AGGREGATE_IN_JOIN: &str = "SELECT count(*), sum(r.v), min(s.v), max(r.k), count(s.v) \
                                     FROM r JOIN s ON r.k = s.k";
    const AGGREGATES_NOT_IN_JOIN: [&str; 6] = [
        "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k",
        "SELECT sum(r.v) FILTER (WHERE r.v > 3) FROM r JOIN s ON r.k = s.k",
        "SELECT avg(r.v) FROM r JOIN s ON r.k = s.k",
        "SELECT sum(r.v + 1) FROM r JOIN s ON r.k = s.k",
        "SELECT count(*), sum(s.v) FROM r LEFT JOIN s ON r.k = s.k",
        "SELECT count(*) FROM r JOIN s ON r.k = s.k AND r.v < s.v",
    ];

    /// DataFusion's `Partial` aggregations left in `plan`.
    fn partial_aggregations(plan: &Arc<dyn ExecutionPlan>) -> usize {
        use datafusion::physical_plan::aggregates::AggregateMode;
        cpu_aggregates(plan)
            .iter()
            .filter(|agg| *agg.mode() == AggregateMode::Partial)
            .count()
    }

    #[tokio::test]
    async fn an_ungrouped_aggregate_above_an_inner_join_is_computed_in_the_join() {
        use datafusion::physical_plan::aggregates::AggregateMode;
        let options = aggregate_in_join_options;
        let sql = AGGREGATE_IN_JOIN;
        let partial_modes = partial_aggregations;
        let plan = rewritten_with(sql, options(true)).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert_eq!(
            joins[0].partial_aggregate().as_deref(),
            Some("count(Int64(1)), sum(r.v), min(s.v), max(r.k), count(s.v)"),
            "{}",
            show(&plan)
        );
        assert_eq!(partial_modes(&plan), 0, "{}", show(&plan));
        let finals = cpu_aggregates(&plan);
        assert_eq!(finals.len(), 1, "{}", show(&plan));
        assert_eq!(*finals[0].mode(), AggregateMode::Final);
        // The join's node has the partial aggregation's schema.
        assert_eq!(
            finals[0].input().children()[0].schema(),
            joins[0].schema(),
            "{}",
            show(&plan)
        );
        assert!(show(&plan).contains("partial_aggregate=[count(Int64(1)), sum(r.v)"));
        // The join reads every probe partition itself, as one: r's four (the
        // smaller s is the build side).
        assert!(
            show(&plan).contains("probe_reads_merge_inputs=4"),
            "{}",
            show(&plan)
        );
        assert_eq!(
            joins[0]
                .properties()
                .output_partitioning()
                .partition_count(),
            1
        );
        let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
        assert!(
            decisions.iter().any(|d| d.operator == "AggregateExec"
                && d.on_gpu()
                && d.to_string().contains("partial_aggregate")),
            "{decisions:?}"
        );

        // Without merged partitions, one partition's states per probe
        // partition.
        let unmerged = GpuOptions {
            merge_partitions: false,
            ..options(true)
        };
        let plan = rewritten_with(sql, unmerged).await;
        let joins = gpu_joins(&plan);
        assert!(joins[0].partial_aggregate().is_some(), "{}", show(&plan));
        assert!(!show(&plan).contains("probe_reads_merge_inputs"));
        assert!(
            joins[0]
                .properties()
                .output_partitioning()
                .partition_count()
                > 1
        );

        // Switched off, DataFusion's partial aggregation stays, and the
        // probe keeps its partitions.
        let plan = rewritten_with(sql, options(false)).await;
        assert!(gpu_joins(&plan)[0].partial_aggregate().is_none());
        assert!(!show(&plan).contains("probe_reads_merge_inputs"));
        assert_eq!(partial_modes(&plan), 1, "{}", show(&plan));

        // Aggregations the join does not compute, and joins that do not
        // emit one row per pair.
        for sql in AGGREGATES_NOT_IN_JOIN {
            let plan = rewritten_with(sql, options(true)).await;
            let joins = gpu_joins(&plan);
            assert!(!joins.is_empty(), "{sql}\n{}", show(&plan));
            assert!(
                joins.iter().all(|j| j.partial_aggregate().is_none()),
                "{sql}\n{}",
                show(&plan)
            );
        }
    }

    #[tokio::test]
    async fn an_ungrouped_aggregate_above_a_sort_merge_join_is_computed_in_the_join() {
        use datafusion::physical_plan::aggregates::AggregateMode;
        let options = aggregate_in_join_options;
        let sql = AGGREGATE_IN_JOIN;
        let partial_modes = partial_aggregations;
        // One join over all input partitions, sorted or not (a join that
        // aggregates hands no rows on), its one row of states in one
        // partition (the merge above needs no more); with
        // `merge_partitions` off, one join per hash partition, each
        // computing its partition's states.
        for (sorted, merge_partitions) in [(false, true), (true, true), (false, false)] {
            let options = |aggregate_in_join| GpuOptions {
                merge_partitions,
                ..options(aggregate_in_join)
            };
            let plan = merge_join_plan(sql, &options(true), sorted).await;
            let text = show(&plan);
            let joins = gpu_merge_joins(&plan);
            assert_eq!(joins.len(), 1, "{text}");
            assert_eq!(joins[0].repartitions_removed(), merge_partitions, "{text}");
            assert_eq!(
                hash_repartitions(&plan),
                if merge_partitions { 0 } else { 2 },
                "{text}"
            );
            assert_eq!(
                joins[0].partial_aggregate().as_deref(),
                Some("count(Int64(1)), sum(r.v), min(s.v), max(r.k), count(s.v)"),
                "{text}"
            );
            assert!(text.contains("partial_aggregate=[count(Int64(1)), sum(r.v)"));
            assert_eq!(partial_modes(&plan), 0, "{text}");
            let finals = cpu_aggregates(&plan);
            assert_eq!(finals.len(), 1, "{text}");
            assert_eq!(*finals[0].mode(), AggregateMode::Final);
            // The join's node has the partial aggregation's schema.
            assert_eq!(
                finals[0].input().children()[0].schema(),
                joins[0].schema(),
                "{text}"
            );
            assert!(!text.contains("RoundRobinBatch"), "{text}");
            assert_eq!(
                joins[0]
                    .properties()
                    .output_partitioning()
                    .partition_count()
                    == 1,
                merge_partitions,
                "{text}"
            );
            let stats = StatisticsContext::new()
                .compute(joins[0], &StatisticsArgs::new())
                .unwrap();
            assert_eq!(
                stats.column_statistics.len(),
                joins[0].schema().fields().len()
            );
            let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
            assert!(
                decisions.iter().any(|d| d.operator == "AggregateExec"
                    && d.on_gpu()
                    && d.to_string().contains("GPU sort-merge join")),
                "{decisions:?}"
            );

            // Switched off, DataFusion's partial aggregation stays.
            let plan = merge_join_plan(sql, &options(false), sorted).await;
            assert!(gpu_merge_joins(&plan)[0].partial_aggregate().is_none());
            assert_eq!(partial_modes(&plan), 1, "{}", show(&plan));
        }

        // Aggregations the join does not compute, and joins that do not
        // emit one row per pair.
        for sql in AGGREGATES_NOT_IN_JOIN {
            let plan = merge_join_plan(sql, &options(true), true).await;
            let joins = gpu_merge_joins(&plan);
            assert!(!joins.is_empty(), "{sql}\n{}", show(&plan));
            assert!(
                joins.iter().all(|j| j.partial_aggregate().is_none()),
                "{sql}\n{}",
                show(&plan)
            );
        }
    }
}
