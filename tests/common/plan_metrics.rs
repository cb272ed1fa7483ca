//! A metric summed over a whole physical plan. Shared by the GPU tests and
//! the TPC-H example.

use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;

/// Metric `name` summed over every node of `plan` and its partitions.
pub fn plan_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let here = plan
        .metrics()
        .and_then(|m| m.sum_by_name(name))
        .map_or(0, |v| v.as_usize());
    here + plan
        .children()
        .into_iter()
        .map(|c| plan_metric(c, name))
        .sum::<usize>()
}
