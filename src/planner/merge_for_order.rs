//! A GPU sort-merge join chosen in place of a hash join whose output is
//! sorted on the join keys right after (`ORDER BY` the join key): the device
//! sorts both inputs as part of the join, the rows come out in key order, and
//! the CPU sort of the whole join output above disappears.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::JoinType;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalExprRef, PhysicalSortExpr};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::ExecutionPlan;

use super::decide_sort_merge_join;
use crate::config::GpuOptions;

/// What replaces a `SortExec` over a hash join: the sort-merge join (over
/// a per-partition sort of each input on its keys, which the GPU join
/// absorbs), and the hash join's embedded projection to put above it.
pub(crate) struct MergeForOrder {
    pub(crate) join: Arc<dyn ExecutionPlan>,
    pub(crate) projection: Option<Vec<usize>>,
}

impl MergeForOrder {
    /// `node` with the projection applied.
    pub(crate) fn project(
        projection: Option<&[usize]>,
        node: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(projection) = projection else {
            return Ok(node);
        };
        let exprs = Self::projection_exprs(projection, &node.schema());
        Ok(Arc::new(ProjectionExec::try_new(exprs, node)?))
    }

    /// The columns `projection` picks from `schema`, under their names.
    pub(crate) fn projection_exprs(
        projection: &[usize],
        schema: &SchemaRef,
    ) -> Vec<ProjectionExpr> {
        projection
            .iter()
            .map(|&i| {
                let name = schema.field(i).name().clone();
                ProjectionExpr {
                    expr: Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>,
                    alias: name,
                }
            })
            .collect()
    }
}

/// The sort-merge join that can stand for `node`, a `SortExec` over a
/// `Partitioned` inner or outer `HashJoinExec`, where the sort orders each
/// partition by exactly the join keys and the merge's output order gives
/// that ordering; `None` otherwise, or where the GPU would not take the
/// sort-merge join (then nothing changes).
pub(crate) fn merge_join_for_sort(
    node: &Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Option<MergeForOrder>> {
    if !(options.sort_merge_join && options.tuning.sort_merge_join_for_order) {
        return Ok(None);
    }
    let Some(sort) = node.downcast_ref::<SortExec>() else {
        return Ok(None);
    };
    let Some(join) = sort.input().downcast_ref::<HashJoinExec>() else {
        return Ok(None);
    };
    let partitions =
        |plan: &Arc<dyn ExecutionPlan>| plan.properties().output_partitioning().partition_count();
    let per_partition = sort.preserve_partitioning() || partitions(sort.input()) <= 1;
    let supported = matches!(
        join.join_type(),
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
    );
    if sort.fetch().is_some()
        || !per_partition
        || !supported
        || *join.partition_mode() != PartitionMode::Partitioned
        || join.null_aware
        || join.fetch().is_some()
        || sort.expr().len() != join.on().len()
    {
        return Ok(None);
    }
    // The keys sorted in the directions the sort above asks for, key by key.
    let sort_options: Vec<_> = sort.expr().iter().map(|e| e.options).collect();
    let sorted_on = |child: &Arc<dyn ExecutionPlan>, keys: Vec<PhysicalExprRef>| {
        let exprs = keys
            .into_iter()
            .zip(&sort_options)
            .map(|(key, options)| PhysicalSortExpr::new(key, *options));
        LexOrdering::new(exprs).map(|ordering| {
            Arc::new(SortExec::new(ordering, Arc::clone(child)).with_preserve_partitioning(true))
                as Arc<dyn ExecutionPlan>
        })
    };
    let left_keys = join.on().iter().map(|(l, _)| Arc::clone(l)).collect();
    let right_keys = join.on().iter().map(|(_, r)| Arc::clone(r)).collect();
    let (Some(left), Some(right)) = (
        sorted_on(join.left(), left_keys),
        sorted_on(join.right(), right_keys),
    ) else {
        return Ok(None);
    };
    let merge = SortMergeJoinExec::try_new(
        left,
        right,
        join.on().to_vec(),
        join.filter().cloned(),
        *join.join_type(),
        sort_options,
        join.null_equality(),
    )?;
    let merge: Arc<dyn ExecutionPlan> = Arc::new(merge);
    if decide_sort_merge_join(&merge, options, gpu, false).is_err() {
        return Ok(None);
    }
    let projection = join.projection.as_ref().map(|p| p.to_vec());
    // The replacement must deliver what the sort delivered: its schema, its
    // partitions, and rows in its order.
    let delivered = MergeForOrder::project(projection.as_deref(), Arc::clone(&merge))?;
    let same_shape =
        delivered.schema() == node.schema() && partitions(&delivered) == partitions(node);
    if !same_shape
        || !delivered
            .properties()
            .equivalence_properties()
            .ordering_satisfy(sort.expr().iter().cloned())?
    {
        return Ok(None);
    }
    Ok(Some(MergeForOrder {
        join: merge,
        projection,
    }))
}
