//! DataFusion's two aggregation phases over a collected input: the CPU
//! fallback of one GPU aggregation that replaced them (the rule keeps the
//! two phases beside the node, see `planner::phases`).

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;

/// `cpu_phases` (a final aggregation over an exchange over a partial one)
/// over `input` in place of the partial aggregation's input.
pub(crate) fn cpu_phases_over(
    cpu_phases: &Arc<dyn ExecutionPlan>,
    input: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let exchange = Arc::clone(cpu_phases.children()[0]);
    let partial = Arc::clone(exchange.children()[0]);
    #[allow(deprecated)]
    let partial = partial.with_new_children(vec![input])?;
    #[allow(deprecated)]
    let exchange = exchange.with_new_children(vec![partial])?;
    #[allow(deprecated)]
    Arc::clone(cpu_phases).with_new_children(vec![exchange])
}
