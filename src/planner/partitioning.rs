//! One GPU join over all input partitions (design brief, "Plan properties and
//! partitioning"): in `Partitioned` mode DataFusion hash-repartitions both
//! join inputs on the CPU only so that N CPU threads can each join one slice.
//! The GPU partitions the keys itself, so the join is re-planned in
//! `CollectLeft` mode over the inputs of those repartitions: the build side
//! is collected once from all its partitions, and every partition of the
//! probe input probes it as it arrives. A full CPU pass over both inputs
//! disappears. Where something above depends on the join's hash
//! partitioning, the rule puts one repartition of the join's output in its
//! place (see `rule.rs`).
//! A sort-merge join over sorted partitions is re-planned the same way
//! ([`merge_join_over_unrepartitioned_inputs`]): both inputs merged into
//! one partition each, which the GPU join sorts on the device, in place of
//! a CPU pass that merges the sorted partitions while it hashes every row
//! before the join starts.
//! On by default (`gpu.tuning.merge_partitions`): with the build side concatenated
//! on every core and single integer keys used in place, it is faster from
//! 2^24 rows a side and does not suffer from skewed keys (BENCHMARKS.md).

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_expr::{Distribution, Partitioning};
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::ExecutionPlan;

/// Whether the output partitioning of each child of `node` may change
/// without changing what the plan computes, given whether `node`'s own may
/// (`node_free`; true at the root, whose partitions are merged by whoever
/// collects them).
///
/// A child's partitioning is free when `node` states no distribution
/// requirement for it and either `node` sets its own partitioning (a
/// repartition or a merge) or `node` has that one child and is free itself
/// (a projection or sort passes its input's partitioning on, and whatever
/// above could rely on it states a requirement, which makes `node` not
/// free). The probe input of a `CollectLeft` hash join is the one child of
/// two that passes its partitioning on the same way (the build input is
/// collected whole), so it is free where the join is. Everything else is
/// treated as relied on: the test is conservative, since the rule runs
/// after `EnsureRequirements` and nothing re-checks the plan.
pub(super) fn children_partitioning_free(
    node: &Arc<dyn ExecutionPlan>,
    node_free: bool,
) -> Vec<bool> {
    let children = node.children();
    let requirements = node.input_distribution_requirements();
    let sets_own = node.is::<RepartitionExec>()
        || node.is::<CoalescePartitionsExec>()
        || node.is::<SortPreservingMergeExec>();
    let passed_on = |i: usize| {
        children.len() == 1
            || node
                .downcast_ref::<HashJoinExec>()
                .is_some_and(|join| *join.partition_mode() == PartitionMode::CollectLeft && i == 1)
    };
    (0..children.len())
        .map(|i| {
            let unrequired = matches!(
                requirements.child_distribution(i),
                None | Some(Distribution::UnspecifiedDistribution)
            );
            unrequired && (sets_own || (passed_on(i) && node_free))
        })
        .collect()
}

/// `join`, a `Partitioned` hash join with a CPU hash repartition below at
/// least one input, re-planned in `CollectLeft` mode over the repartitions'
/// inputs (the build input merged into one partition); `None` when `join`
/// is not of that shape. The caller must have checked that the join's
/// output partitioning is free ([`children_partitioning_free`]).
pub(super) fn over_unrepartitioned_inputs(join: &HashJoinExec) -> Result<Option<HashJoinExec>> {
    if *join.partition_mode() != PartitionMode::Partitioned {
        return Ok(None);
    }
    let (build, build_stripped) = without_repartition(join.left(), is_hash);
    let (probe, probe_stripped) = without_repartition(join.right(), is_hash);
    if !build_stripped && !probe_stripped {
        return Ok(None);
    }
    // Spreading the build input round-robin only to merge it again is waste.
    let (build, _) = without_repartition(&build, is_round_robin);
    let build: Arc<dyn ExecutionPlan> =
        if build.properties().output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(build))
        } else {
            build
        };
    let collect_left = join
        .builder()
        .with_partition_mode(PartitionMode::CollectLeft)
        .with_new_children(vec![build, probe])?
        .recompute_properties()
        .reset_state()
        .build()?;
    // The probe input's scan still holds the join's dynamic filter.
    Ok(Some(crate::exec::with_filter_of(join, collect_left)?))
}

/// `join`, a sort-merge join with a CPU hash repartition below each input
/// (under the `SortExec` DataFusion planned for the join, or keeping the
/// order of sorted input partitions), re-planned over the repartitions'
/// inputs, each merged into one partition and sorted on the keys: the GPU
/// join absorbs that sort, so the join runs once over all the input. An
/// input that is already one partition sorted on the keys is not sorted
/// again. The join's output is one partition, in key order; the caller
/// must have checked that the join's output partitioning is free
/// ([`children_partitioning_free`]).
///
/// Unless `unsorted_too`, only where a repartition keeps the order of
/// sorted partitions: that one merges them on one thread per output
/// partition, which costs more than the device sort, while a plain hash
/// repartition costs less than the host work that one GPU join per
/// partition overlaps (see `gpu.tuning.merge_unsorted_sort_merge_inputs`).
/// `None` when `join` is not of that shape, or when its keys repeat (one
/// sort expression per key is what the GPU join absorbs).
pub(super) fn merge_join_over_unrepartitioned_inputs(
    join: &SortMergeJoinExec,
    unsorted_too: bool,
) -> Result<Option<SortMergeJoinExec>> {
    let on = join.on();
    let sides = [
        (join.left(), on.iter().map(|(l, _)| l).collect::<Vec<_>>()),
        (join.right(), on.iter().map(|(_, r)| r).collect::<Vec<_>>()),
    ];
    let mut inputs = Vec::with_capacity(2);
    let mut merges_sorted_partitions = false;
    for (child, keys) in sides {
        let ordering = LexOrdering::new(
            keys.iter()
                .zip(join.sort_options())
                .map(|(key, options)| PhysicalSortExpr::new(Arc::clone(key), *options)),
        );
        let Some(ordering) = ordering.filter(|o| o.len() == keys.len()) else {
            return Ok(None);
        };
        let below_sort = match child.downcast_ref::<SortExec>() {
            Some(sort) if sort.fetch().is_none() && sort.expr() == &ordering => sort.input(),
            _ => child,
        };
        let Some(repartition) = below_sort
            .downcast_ref::<RepartitionExec>()
            .filter(|r| is_hash(r.partitioning()))
        else {
            return Ok(None);
        };
        merges_sorted_partitions |= repartition.preserve_order();
        // Spreading the input round-robin only to merge it again is waste.
        let (input, _) = without_repartition(repartition.input(), is_round_robin);
        let input: Arc<dyn ExecutionPlan> =
            if input.properties().output_partitioning().partition_count() > 1 {
                Arc::new(CoalescePartitionsExec::new(input))
            } else {
                input
            };
        let sorted = input
            .properties()
            .equivalence_properties()
            .ordering_satisfy(ordering.clone())?;
        inputs.push(if sorted {
            input
        } else {
            Arc::new(SortExec::new(ordering, input)) as Arc<dyn ExecutionPlan>
        });
    }
    if !merges_sorted_partitions && !unsorted_too {
        return Ok(None);
    }
    let [left, right]: [Arc<dyn ExecutionPlan>; 2] = inputs.try_into().expect("two sides");
    Ok(Some(SortMergeJoinExec::try_new(
        left,
        right,
        on.to_vec(),
        join.filter().clone(),
        join.join_type(),
        join.sort_options().to_vec(),
        join.null_equality(),
    )?))
}

/// The input of `plan` if it is a repartition that keeps no order and whose
/// partitioning `kind` accepts; otherwise `plan` itself. The flag says which.
fn without_repartition(
    plan: &Arc<dyn ExecutionPlan>,
    kind: fn(&Partitioning) -> bool,
) -> (Arc<dyn ExecutionPlan>, bool) {
    match plan.downcast_ref::<RepartitionExec>() {
        Some(repartition) if kind(repartition.partitioning()) && !repartition.preserve_order() => {
            (Arc::clone(repartition.input()), true)
        }
        _ => (Arc::clone(plan), false),
    }
}

fn is_hash(partitioning: &Partitioning) -> bool {
    matches!(partitioning, Partitioning::Hash(..))
}

fn is_round_robin(partitioning: &Partitioning) -> bool {
    matches!(partitioning, Partitioning::RoundRobinBatch(..))
}
