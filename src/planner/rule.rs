//! The physical optimizer rule that swaps supported DataFusion operators for
//! their GPU versions.

use std::sync::Arc;

use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use super::{decide_hash_join, GpuOptions};
use crate::exec::GpuHashJoinExec;

/// Replaces each `HashJoinExec` that [`decide_hash_join`] accepts by a
/// [`GpuHashJoinExec`] with the same inputs, schema and partitioning, and
/// leaves every other node exactly as it was. It runs after DataFusion's own
/// rules, on the final plan.
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
        // Rows of several partitions reach the caller in no fixed order.
        let order_observable = plan.properties().output_partitioning().partition_count() <= 1;
        rewrite(plan, order_observable, &options, gpu)
    }

    fn name(&self) -> &str {
        "datafusion_gpu"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Replaces the supported joins under `node`, children first. A GPU join
/// keeps `HashJoinExec`'s row order only where that order can be seen
/// (`order_observable`): not below a node that merges several partitions
/// in whatever order they come, since nothing above it can depend on the
/// order of one partition's rows.
fn rewrite(
    node: Arc<dyn ExecutionPlan>,
    order_observable: bool,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let children_observable = order_observable && !merges_in_arrival_order(&node);
    let children = node
        .children()
        .into_iter()
        .map(|child| rewrite(Arc::clone(child), children_observable, options, gpu))
        .collect::<Result<Vec<_>>>()?;
    let node = replace_children_if_necessary(node, children)?;
    if let Some(join) = node.downcast_ref::<HashJoinExec>() {
        if decide_hash_join(join, options, gpu).is_ok() {
            let gpu_join =
                GpuHashJoinExec::try_new(Arc::clone(&node))?.with_preserve_order(order_observable);
            return Ok(Arc::new(gpu_join));
        }
    }
    Ok(node)
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
