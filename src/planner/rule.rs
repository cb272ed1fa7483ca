//! The physical optimizer rule that swaps supported DataFusion operators for
//! their GPU versions.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::ExecutionPlan;

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
        plan.transform_up(|node| {
            if let Some(join) = node.downcast_ref::<HashJoinExec>() {
                if decide_hash_join(join, &options, gpu).is_ok() {
                    let gpu_join = GpuHashJoinExec::try_new(Arc::clone(&node))?;
                    return Ok(Transformed::yes(
                        Arc::new(gpu_join) as Arc<dyn ExecutionPlan>
                    ));
                }
            }
            Ok(Transformed::no(node))
        })
        .map(|transformed| transformed.data)
    }

    fn name(&self) -> &str {
        "datafusion_gpu"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
