//! GPU nodes whose input is a filtered Parquet table scan that the scan
//! filters left on the CPU (its filter keeps more than a quarter of the
//! rows, by DataFusion's estimate) read it through a [`GpuScanFilterExec`]
//! all the same: the rows kept cross the bus back, but the node above
//! uploads them anyway, and the filter, and the columns only the filter
//! reads, are no longer decoded from the files on each run. (A scan with
//! no filter stays DataFusion's: decoding two integer columns measured
//! faster than bringing every row back from the cache.)
//! A `MemTable` scan stays as it is (its batches are already in memory,
//! and GPU nodes read them as they are), and so does a scan a dynamic
//! filter reaches (a probe side under a join, DataFusion's or the GPU's,
//! that publishes its build keys): it skips the row groups the filter
//! rules out, where the cache would hand every row over.
//! A GPU aggregation over a whole table scan (Parquet or a `MemTable`, no
//! filter) reads the table's cached columns on the device instead
//! ([`GpuAggregateExec::with_cached_input`]): nothing crosses the bus, and
//! no row is decoded, once they are cached.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use super::scan_size::gpu_scan_placed;
use crate::config::GpuOptions;
use crate::exec::{coalesced_input, GpuAggregateExec, GpuHashJoinExec, GpuScanFilterExec};

/// `plan` with the filtered Parquet scans its GPU joins and aggregations
/// read taken from the column cache.
pub(crate) fn with_cached_gpu_inputs(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if gpu.is_err() || !options.tuning.cached_gpu_inputs {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        if let Some(aggregate) = node
            .downcast_ref::<GpuAggregateExec>()
            .filter(|_| options.cache)
        {
            if let Some(reading) = aggregate.with_cached_input() {
                return Ok(Transformed::yes(Arc::new(reading) as Arc<dyn ExecutionPlan>));
            }
        }
        let reads_inputs = node.downcast_ref::<GpuAggregateExec>().is_some()
            || node.downcast_ref::<GpuHashJoinExec>().is_some();
        if !reads_inputs || !options.tuning.scan_filter {
            return Ok(Transformed::no(node));
        }
        let children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        let mut changed = false;
        let children: Vec<Arc<dyn ExecutionPlan>> = children
            .into_iter()
            .map(|child| match cached(&child, options) {
                Some(cached) => {
                    changed = true;
                    cached
                }
                None => child,
            })
            .collect();
        match changed {
            true => Ok(Transformed::yes(replace_children_if_necessary(
                node, children,
            )?)),
            false => Ok(Transformed::no(node)),
        }
    })
    .map(|t| t.data)
}

/// `input` (a GPU node's input) reading its filtered Parquet scan from the
/// cache, through merges of its partitions, where the device can read it.
fn cached(input: &Arc<dyn ExecutionPlan>, options: &GpuOptions) -> Option<Arc<dyn ExecutionPlan>> {
    if let Some(merge) = input.downcast_ref::<CoalescePartitionsExec>() {
        if merge.fetch().is_some() {
            return None;
        }
        let below = cached(merge.input(), options)?;
        return replace_children_if_necessary(Arc::clone(input), vec![below]).ok();
    }
    if let Some(below) = coalesced_input(input) {
        let below = cached(&below, options)?;
        return replace_children_if_necessary(Arc::clone(input), vec![below]).ok();
    }
    if pruned_by_a_dynamic_filter(input) {
        return None;
    }
    let scan = GpuScanFilterExec::try_new(Arc::clone(input)).ok()??;
    let placed =
        scan.reads_files() && gpu_scan_placed(options, "a scan filter", scan.scan_rows()).is_ok();
    placed.then(|| Arc::new(scan) as Arc<dyn ExecutionPlan>)
}

/// Whether a Parquet scan in `plan` has a dynamic filter among its
/// predicates.
fn pruned_by_a_dynamic_filter(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.exists(|node| {
        let Some(scan) = node.downcast_ref::<DataSourceExec>() else {
            return Ok(false);
        };
        let predicate = scan
            .data_source()
            .downcast_ref::<FileScanConfig>()
            .and_then(|config| config.file_source().downcast_ref::<ParquetSource>())
            .and_then(|parquet| parquet.filter());
        Ok(predicate.is_some_and(|predicate| {
            predicate
                .exists(|expr| Ok(expr.downcast_ref::<DynamicFilterPhysicalExpr>().is_some()))
                .unwrap_or(true)
        }))
    })
    .unwrap_or(true)
}
