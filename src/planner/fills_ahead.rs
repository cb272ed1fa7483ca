//! The plan's GPU scans given one fill ahead of the device column cache
//! ([`crate::exec::fill_ahead`]) of their filtered scans' columns, started
//! by whichever of them, or of the join key collectors, runs first.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::fill_ahead::{FillAhead, FillAheadSlot};
use crate::exec::{GpuScanAggregateExec, GpuScanFilterExec, JoinKeyCollectorExec};

/// Gives `plan`'s GPU scans and join key collectors the fills of its
/// filtered scans' columns, where it has such scans; the plan itself is
/// unchanged.
pub(crate) fn with_fills_ahead(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let mut scans = Vec::new();
    // Scan aggregations read all of their parts at once when they run:
    // only scans with filters are filled ahead.
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<GpuScanFilterExec>() {
            scans.push(scan.fill());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if scans.is_empty() {
        return Ok(plan);
    }
    let fills = Arc::new(FillAhead::new(scans));
    plan.apply(|node| {
        if let Some(slot) = slot_of(node.as_ref()) {
            slot.set(&fills);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(plan)
}

/// Where `node` keeps its plan's fills, where it starts them.
pub(crate) fn slot_of(node: &dyn ExecutionPlan) -> Option<&FillAheadSlot> {
    if let Some(scan) = node.downcast_ref::<GpuScanFilterExec>() {
        return Some(scan.fill_ahead());
    }
    if let Some(scan) = node.downcast_ref::<GpuScanAggregateExec>() {
        return Some(scan.fill_ahead());
    }
    node.downcast_ref::<JoinKeyCollectorExec>()
        .map(JoinKeyCollectorExec::fill_ahead)
}
