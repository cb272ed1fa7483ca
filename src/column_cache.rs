//! The device column cache as users see it: warm it with a table
//! ([`cache_table`]), read what it holds ([`gpu_cache_stats`]), empty it
//! ([`clear_gpu_cache`]); `SET gpu.cache = false` turns it off and
//! `gpu.cache_memory_fraction` bounds it. GPU scan aggregations
//! ([`crate::GpuScanAggregateExec`]) fill it as they read tables.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::exec::{warm_scan, WarmedColumns};
use crate::gpu::gpu_runtime;

/// What the device column cache holds and has done since the process
/// started, summed over the devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCacheStats {
    /// Columns of table parts (a Parquet file or byte range of one, a
    /// `MemTable` partition) held.
    pub entries: usize,
    /// Device bytes they hold.
    pub bytes: usize,
    /// Lookups that found their column.
    pub hits: u64,
    /// Lookups that did not (the column was then read and copied).
    pub misses: u64,
    /// Columns evicted: to stay within `gpu.cache_memory_fraction`, to make
    /// room for other device work, or by [`clear_gpu_cache`].
    pub evictions: u64,
}

/// The cache's state; all zero without a GPU.
pub fn gpu_cache_stats() -> GpuCacheStats {
    let Ok(runtime) = gpu_runtime() else {
        return GpuCacheStats::default();
    };
    runtime
        .devices()
        .iter()
        .map(|device| device.column_cache().stats())
        .fold(GpuCacheStats::default(), |sum, s| GpuCacheStats {
            entries: sum.entries + s.entries,
            bytes: sum.bytes + s.bytes,
            hits: sum.hits + s.hits,
            misses: sum.misses + s.misses,
            evictions: sum.evictions + s.evictions,
        })
}

/// Drops every cached column (a query reading one keeps it until it ends).
pub fn clear_gpu_cache() {
    if let Ok(runtime) = gpu_runtime() {
        for device in runtime.devices() {
            device.column_cache().clear();
        }
    }
}

/// Copies the columns of `table` (a Parquet listing table or a `MemTable`
/// registered in `ctx`) into the device column cache, as a first query
/// over them would, so that queries find them there. Columns the device
/// does not keep (types it does not read, strings of more than 1,024
/// distinct values in a file or partition) are listed with the reason.
/// An error without a GPU, with `gpu.cache = false`, or for other tables.
pub async fn cache_table(ctx: &SessionContext, table: &str) -> Result<WarmedColumns> {
    gpu_runtime().map_err(|e| DataFusionError::Execution(e.to_string()))?;
    let plan = ctx.table(table).await?.create_physical_plan().await?;
    let mut scan: Option<Arc<dyn ExecutionPlan>> = None;
    plan.apply(|node| {
        if node.downcast_ref::<DataSourceExec>().is_some() {
            scan = Some(Arc::clone(node));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let scan =
        scan.ok_or_else(|| DataFusionError::Plan(format!("{table} is not read by a table scan")))?;
    let scan = scan
        .downcast_ref::<DataSourceExec>()
        .ok_or_else(|| DataFusionError::Internal("a scan that is not one".into()))?;
    warm_scan(scan, ctx.task_ctx()).await
}
