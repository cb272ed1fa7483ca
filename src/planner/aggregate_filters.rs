//! Filters of a GPU aggregation's groups run inside it: a `FilterExec`
//! over a [`GpuAggregateExec`] that hands on final values (a `HAVING`),
//! directly or past the repartitions that deal its groups to the
//! partitions above, becomes the aggregation's own filter. Each output
//! batch is then filtered on the core that made it, and only the groups
//! kept go through the repartitions: q18's aggregation of `lineitem` by
//! `l_orderkey` keeps 624 of 15 million groups, which were all dealt
//! round robin, hashed and filtered on the CPU before. The filter's
//! projection, where it has one, stays above as a `ProjectionExec`.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use crate::exec::GpuAggregateExec;

/// `plan` with every filter that a GPU aggregation below it can run
/// moved into that aggregation.
pub(crate) fn with_filters_in_gpu_aggregations(
    plan: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(filter) = node.downcast_ref::<FilterExec>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match filtered_aggregation(filter)? {
            Some(plan) => Transformed::yes(plan),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// What takes `filter`'s place where the GPU aggregation below it (past
/// repartitions, which keep every row and change no column) runs it.
fn filtered_aggregation(filter: &FilterExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    // The repartitions between, from the filter down.
    let mut repartitions = Vec::new();
    let mut node = Arc::clone(filter.input());
    while let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
        repartitions.push(Arc::clone(&node));
        node = Arc::clone(repartition.input());
    }
    let Some(aggregation) = node.downcast_ref::<GpuAggregateExec>() else {
        return Ok(None);
    };
    let Some(filtered) = aggregation.with_output_filter(filter)? else {
        return Ok(None);
    };
    let mut plan: Arc<dyn ExecutionPlan> = Arc::new(filtered);
    for repartition in repartitions.into_iter().rev() {
        plan = replace_children_if_necessary(repartition, vec![plan])?;
    }
    if let Some(projection) = filter.projection() {
        let schema = plan.schema();
        let exprs = projection
            .iter()
            .map(|&i| {
                let name = schema.field(i).name();
                ProjectionExpr::new(Arc::new(Column::new(name, i)), name.clone())
            })
            .collect::<Vec<_>>();
        plan = Arc::new(ProjectionExec::try_new(exprs, plan)?);
    }
    Ok(Some(plan))
}
