//! Filling the column cache ahead of queries ([`crate::cache_table`]).

use std::sync::Arc;

use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::ExecutionPlan;

use super::run::{part_columns, Loaded, Reading};
use super::shape::table_source;
use crate::config::GpuOptions;
use crate::encode::table_words::word_kind;
use crate::exec::GpuScanMetrics;

/// What warming a table did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmedColumns {
    /// Columns now in the cache (for every part of the table).
    pub cached: Vec<String>,
    /// Columns left out, each with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Copies every column of the table `scan` reads (a Parquet or `MemTable`
/// scan) that the device keeps as words into the column cache, under the
/// keys the same scan in a query uses.
pub(crate) async fn warm_scan(scan: &DataSourceExec, context: Arc<TaskContext>) -> Result<WarmedColumns> {
    let options = GpuOptions::from_config(context.session_config().options());
    if !options.cache {
        return Err(DataFusionError::Plan(
            "the device column cache is off (gpu.cache = false)".into(),
        ));
    }
    let device = crate::exec::partition_device(0, &options)?;
    let (source, columns) = match table_source(scan) {
        Ok(Some(found)) => found,
        Ok(None) => {
            return Err(DataFusionError::Plan(
                "only Parquet and memory tables without partition columns are cached".into(),
            ))
        }
        Err(reason) => return Err(DataFusionError::Plan(reason)),
    };
    let schema = scan.schema();
    let metrics = GpuScanMetrics::new(&ExecutionPlanMetricsSet::new(), 0);
    let mut warmed = WarmedColumns::default();
    for (c, column) in columns.iter().enumerate() {
        let field = schema.field(c).clone();
        if word_kind(field.data_type()).is_none() {
            let reason = format!("{} is not kept on the device", field.data_type());
            warmed.skipped.push((field.name().clone(), reason));
            continue;
        }
        let tasks: Vec<_> = source
            .part_groups()
            .into_iter()
            .flatten()
            .map(|part| {
                let (source, device, context) = (source.clone(), Arc::clone(&device), Arc::clone(&context));
                let (options, metrics) = (options.clone(), metrics.clone());
                let fields = vec![(column.table_index, field.clone())];
                SpawnedTask::spawn(async move {
                    part_columns(&source, fields, &[], &device, part, Reading::WithItsTable, context, &options, &metrics)
                        .await
                        .map(|loaded| match loaded {
                            Loaded::Device(_) => Ok(()),
                            Loaded::Host(reason) => Err(reason),
                        })
                })
            })
            .collect();
        let mut outcome = Ok(());
        for task in tasks {
            let loaded = task
                .join()
                .await
                .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))??;
            if let (Ok(()), Err(reason)) = (&outcome, loaded) {
                outcome = Err(reason);
            }
        }
        match outcome {
            Ok(()) => warmed.cached.push(field.name().clone()),
            Err(reason) => warmed.skipped.push((field.name().clone(), reason)),
        }
    }
    Ok(warmed)
}
