//! The plan node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::statistics::ChildStats;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
    Statistics, StatisticsArgs,
};
use futures::TryStreamExt;

use super::program::{compile, with_run_time_values, FilterProgram};
use super::run::{kept_limit, run, with_uncodable_as_bytes, Ran};
use super::shape::ScanFilterShape;
use crate::exec::scan_aggregate::{uncodable_columns, TableSource};
use crate::exec::join_keys::{key_sets_in, rows_passing, waits_for};
use crate::exec::fill_ahead::{FillAheadSlot, ScanFill};
use crate::exec::GpuScanMetrics;
use crate::gpu::launch::RemapUploads;
use crate::trace;

/// Filters and projections over one table scan (Parquet files or a
/// `MemTable`), run on the GPU over the table's columns in the device
/// column cache (`algorithm=scan_filter`): the columns the query reads are
/// copied to the device once (strings of few distinct values as codes into
/// a host dictionary, strings of many as their bytes where only `LIKE`,
/// `=`, `<>`, `IN` with text or `IS NULL` reads them, or, from files, where
/// they are output) and kept there for the next queries, up to
/// `gpu.cache_memory_fraction` of the device's memory; per part of the
/// table, one kernel evaluates the filter and the output columns, a second
/// writes the rows kept, in order, and only those come back (but for a
/// string output kept as bytes, whose part's bytes come back whole, the
/// kept rows' strings made from them), as batches of the plan's schema for
/// the nodes above.
///
/// It takes the place of the top of the chain, which stays below it as its
/// only child and runs, partition by partition, only where no device is.
/// A part the device cannot take (a string column of more distinct values
/// than it codes, a 64-bit overflow, no device memory) is filtered on the
/// host with DataFusion's own expressions. Its partitions, their rows and
/// their order are the chain's.
///
/// Supported: filters and output expressions built of columns, literals,
/// comparisons, `AND`, `OR`, `NOT`, `IS [NOT] NULL`, `+`, `-`, `*` (64-bit
/// integers, decimals, doubles), `IN` lists, `CASE`, casts that widen, and
/// any deterministic predicate of one string column (`=`, `IN`, `LIKE`,
/// `starts_with`, ...), which DataFusion evaluates once over each part's
/// dictionary; output columns of integers, dates, timestamps, decimals,
/// doubles, booleans and strings. Joins above may add tests of a column
/// against their build keys (see [`crate::exec::join_keys`]); with those,
/// a chain without a filter of its own, or the scan alone, is taken too,
/// and a partition left to the chain has its batches tested on the host.
pub struct GpuScanFilterExec {
    /// The chain replaced (its top): the CPU fallback.
    cpu_input: Arc<dyn ExecutionPlan>,
    shape: Arc<ScanFilterShape>,
    /// The chain's expressions as the device evaluates them.
    program: Arc<FilterProgram>,
    /// Join key filters over `cpu_input`'s output, from the joins above
    /// (see [`crate::exec::join_keys`]).
    join_filters: Vec<Arc<dyn PhysicalExpr>>,
    metrics: ExecutionPlanMetricsSet,
    /// The cache fills of the plan's scans, started when this node runs.
    fill_ahead: FillAheadSlot,
    /// The remap tables its partitions' parts share (join key sets, LIKE
    /// patterns), copied to each device once.
    remaps: Arc<RemapUploads>,
}

impl GpuScanFilterExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions.
    pub const ALGORITHM: &'static str = "scan_filter";

    /// Replaces `cpu_input`, the top of a chain of filters and projections
    /// over one table scan whose every expression the device evaluates;
    /// `Ok(None)` where it is not of that shape, the reason where the
    /// device cannot run it.
    pub(crate) fn try_new(
        cpu_input: Arc<dyn ExecutionPlan>,
    ) -> std::result::Result<Option<Self>, String> {
        Self::with_join_filters(cpu_input, Vec::new())
    }

    /// [`Self::try_new`] with `join_filters` (over `cpu_input`'s output) among
    /// its filters: then `cpu_input` may be a chain without a filter, or the
    /// scan alone.
    pub(crate) fn with_join_filters(
        cpu_input: Arc<dyn ExecutionPlan>,
        join_filters: Vec<Arc<dyn PhysicalExpr>>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(shape) = ScanFilterShape::with_join_filters(&cpu_input, &join_filters)? else {
            return Ok(None);
        };
        // What the device cannot evaluate is found now, with its reason.
        let mut program = compile(&shape, &[])?;
        if program.columns.is_empty() {
            return Err("the filter reads no column of the table".into());
        }
        // String columns found too varied to code are kept as their bytes,
        // where only LIKE and its kin read them, or they are output from
        // files.
        let uncodable = uncodable_columns(&shape.source, &shape.fields_of(&program.columns));
        if !uncodable.is_empty() {
            let byte_columns: Vec<usize> = uncodable.iter().map(|&slot| program.columns[slot]).collect();
            program = compile(&shape, &byte_columns)?;
        }
        Ok(Some(Self {
            cpu_input,
            shape: Arc::new(shape),
            program: Arc::new(program),
            join_filters,
            metrics: ExecutionPlanMetricsSet::new(),
            fill_ahead: FillAheadSlot::default(),
            remaps: Arc::default(),
        }))
    }

    /// The columns this node reads into the cache, as it reads them.
    pub(crate) fn fill(&self) -> ScanFill {
        ScanFill {
            source: self.shape.source.clone(),
            fields: self.shape.fields_of(&self.program.columns),
            byte_slots: self.program.byte_slots(),
            metrics: self.metrics.clone(),
            key_tests: (!self.shape.chain_filters).then(|| {
                self.program.tests.iter().map(|test| Arc::clone(&test.predicate)).collect()
            }),
            kept_limit: {
                let (shape, program) = (Arc::clone(&self.shape), Arc::clone(&self.program));
                Arc::new(move || match with_uncodable_as_bytes(&shape, &program) {
                    Some(as_bytes) => kept_limit(&shape, &as_bytes),
                    None => kept_limit(&shape, &program),
                })
            },
            as_bytes: Some({
                let (shape, program) = (Arc::clone(&self.shape), Arc::clone(&self.program));
                Arc::new(move || {
                    let program = with_uncodable_as_bytes(&shape, &program)?;
                    Some((shape.fields_of(&program.columns), program.byte_slots()))
                })
            }),
        }
    }

    /// Where the plan's fills are given to this node.
    pub(crate) fn fill_ahead(&self) -> &FillAheadSlot {
        &self.fill_ahead
    }

    /// This node with `filter` (over its output) among its join key filters.
    pub(crate) fn with_join_filter(
        &self,
        filter: Arc<dyn PhysicalExpr>,
    ) -> std::result::Result<Option<Self>, String> {
        let mut join_filters = self.join_filters.clone();
        join_filters.push(filter);
        Self::with_join_filters(Arc::clone(&self.cpu_input), join_filters)
    }

    /// Whether the chain it replaces filters rows (beside any join key
    /// tests): else it only tests join keys, and leaves a partition to
    /// DataFusion's scan where those would keep many rows.
    pub(crate) fn filters_of_its_own(&self) -> bool {
        self.shape.chain_filters
    }

    /// Whether it reads a Parquet table (not batches in memory).
    pub(crate) fn reads_files(&self) -> bool {
        matches!(self.shape.source, TableSource::Parquet { .. })
    }

    /// Whether joins above test this scan's rows against their build keys.
    pub(crate) fn join_filtered(&self) -> bool {
        !self.join_filters.is_empty()
    }

    /// Whether this scan tests its rows against the join key set `keys`.
    pub(crate) fn tests_keys_of(&self, keys: &Arc<crate::exec::join_keys::JoinKeySet>) -> bool {
        key_sets_in(&self.join_filters)
            .iter()
            .any(|set| Arc::ptr_eq(set, keys))
    }

    /// The plan this node replaces (the top of the chain).
    pub fn cpu_input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.cpu_input
    }

    /// Rows the scan reads, where known without reading the table (a
    /// `MemTable`'s counted, files' from their footers).
    pub(crate) fn scan_rows(&self) -> Option<usize> {
        self.shape.scan_rows
    }
}

impl fmt::Debug for GpuScanFilterExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuScanFilterExec")
            .field("cpu_input", &self.cpu_input)
            .finish()
    }
}

impl DisplayAs for GpuScanFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                let outputs: Vec<String> = self
                    .shape
                    .outputs
                    .iter()
                    .zip(self.shape.output_schema.fields())
                    .map(|(e, f)| format!("{e} as {}", f.name()))
                    .collect();
                write!(
                    f,
                    "GpuScanFilterExec: algorithm={}, table=({}), filter=[{}], output=[{}], \
                     cpu_fallback=input",
                    Self::ALGORITHM,
                    self.shape.source.describe(),
                    self.shape.predicate,
                    outputs.join(", "),
                )?;
                let as_bytes: Vec<&str> = self
                    .program
                    .byte_columns
                    .iter()
                    .map(|&c| self.shape.scan_schema.field(c).name().as_str())
                    .collect();
                match as_bytes.is_empty() {
                    true => Ok(()),
                    false => write!(f, ", strings_as_bytes=[{}]", as_bytes.join(", ")),
                }
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", Self::ALGORITHM)?;
                write!(f, "table={}", self.shape.source.describe())
            }
        }
    }
}

impl ExecutionPlan for GpuScanFilterExec {
    fn name(&self) -> &str {
        "GpuScanFilterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        // The same partitions, rows and order as the chain it replaces.
        self.cpu_input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.cpu_input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        f(&self.shape.predicate)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = match (children.pop(), children.is_empty()) {
            (Some(child), true) => child,
            _ => {
                return Err(DataFusionError::Internal(
                    "GpuScanFilterExec has one child".into(),
                ))
            }
        };
        // A child this node can no longer read runs as it is.
        match Self::with_join_filters(Arc::clone(&child), self.join_filters.clone()) {
            Ok(Some(mut node)) => {
                node.fill_ahead = self.fill_ahead.carried();
                Ok(Arc::new(node))
            }
            _ => Ok(child),
        }
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let child = Arc::clone(&self.cpu_input).reset_state()?;
        #[allow(deprecated)]
        self.with_new_children(vec![child])
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // The chain's own estimate: the same rows.
        Ok(crate::exec::input_statistics(input_stats, &self.schema()))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let (shape, program) = (Arc::clone(&self.shape), Arc::clone(&self.program));
        let remaps = Arc::clone(&self.remaps);
        let fallback = Arc::clone(&self.cpu_input);
        let join_filters = self.join_filters.clone();
        let schema = self.schema();
        let metrics = GpuScanMetrics::new(&self.metrics, partition);
        // The join keys it tests, where their build side is read in one
        // partition (the rounds taken now) or read ahead of its join (the
        // rounds taken when first read): waited for before the first part.
        let waits = waits_for(&key_sets_in([&self.shape.predicate]));
        let fills = self.fill_ahead.start(&context);
        let output = async move {
            let _fills = fills;
            waits.await;
            let ran = match with_run_time_values(&shape, program) {
                Ok(program) => {
                    run(shape, program, remaps, partition, Arc::clone(&context), metrics.clone()).await?
                }
                Err(reason) => Ran::OnCpu(reason),
            };
            match ran {
                Ran::Batches(batches) => {
                    metrics.baseline.done();
                    trace::event(|| {
                        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                        format!("scan filter partition {partition}: {rows} rows handed on")
                    });
                    let schema = fallback.schema();
                    let batches = futures::stream::iter(batches.into_iter().map(Ok));
                    Ok::<_, DataFusionError>(Box::pin(RecordBatchStreamAdapter::new(schema, batches))
                        as SendableRecordBatchStream)
                }
                Ran::OnCpu(reason) => {
                    trace::event(|| format!("scan filter partition {partition} on the CPU: {reason}"));
                    metrics.fell_back(&reason);
                    let stream = fallback.execute(partition, without_work_stealing(&context))?;
                    // The join key tests still drop rows, from the batch
                    // their sets are there on.
                    Ok(match join_filters.is_empty() {
                        true => stream,
                        false => Box::pin(RecordBatchStreamAdapter::new(
                            stream.schema(),
                            stream.and_then(move |batch| {
                                std::future::ready(rows_passing(batch, &join_filters))
                            }),
                        )) as SendableRecordBatchStream,
                    })
                }
            }
        };
        let stream = futures::stream::once(output).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// `context` with DataFusion's file work stealing off. The chain runs only
/// the partitions the device did not take; a scan stealing files from its
/// sibling partitions, which the device reads from the cache instead,
/// would return their rows twice. Its scan reads each partition's own files
/// (the first partition to run sets this for the scan's run).
fn without_work_stealing(context: &Arc<TaskContext>) -> Arc<TaskContext> {
    let mut config = context.session_config().clone();
    config.options_mut().execution.enable_file_stream_work_stealing = false;
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        context.runtime_env(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::join_keys::{JoinKeyFilterExpr, JoinKeySet};
    use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    /// The `v` of every row the node gives, sorted.
    async fn values(node: &Arc<dyn ExecutionPlan>) -> Vec<i64> {
        let batches = collect(Arc::clone(node), SessionContext::new().task_ctx()).await.unwrap();
        let mut values: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        values.sort_unstable();
        values
    }

    #[tokio::test]
    async fn partitions_datafusion_reads_still_drop_the_rows_the_join_keys_rule_out() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let batch = |k: Vec<Option<i64>>, v: Vec<i64>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
            )
            .unwrap()
        };
        let partitions = [
            vec![batch(vec![Some(1), None, Some(5), Some(2), Some(7)], vec![10, 20, 30, 40, 50])],
            vec![batch(vec![Some(9), Some(3), Some(5)], vec![60, 70, 80])],
        ];
        let scan = MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
        // A build side of two partitions: the scan does not wait for it.
        let keys = Arc::new(JoinKeySet::new(2));
        let test: Arc<dyn PhysicalExpr> = Arc::new(JoinKeyFilterExpr::new(
            Arc::new(Column::new("k", 0)),
            Arc::clone(&keys),
            Some((0, 99)),
        ));
        let node: Arc<dyn ExecutionPlan> = Arc::new(
            GpuScanFilterExec::with_join_filters(scan, vec![test])
                .unwrap()
                .expect("a scan with a join key test"),
        );
        // No set yet: every row.
        assert_eq!(values(&node).await, [10, 20, 30, 40, 50, 60, 70, 80]);
        // The set made: only the rows whose key is among the build keys
        // (a NULL key never is), on the device or, where none is, on
        // DataFusion's chain under the node.
        let round = keys.start(0);
        assert_eq!(keys.start(1), round);
        keys.finish(round, Some(vec![2, 5]));
        keys.finish(round, Some(vec![9]));
        assert!(keys.keys().is_some());
        assert_eq!(values(&node).await, [30, 40, 60, 80]);
        if let Err(no_gpu) = crate::gpu_status() {
            let metrics = node.metrics().unwrap().aggregate_by_name();
            let fallbacks = metrics.sum_by_name("cpu_fallback").unwrap().as_usize();
            assert_eq!(fallbacks, 4, "two runs of two partitions, each on the CPU");
            // EXPLAIN ANALYZE says why.
            let reasons = metrics
                .iter()
                .find(|m| m.value().name() == "cpu_fallback_reasons")
                .expect("the fallback reasons among the metrics")
                .value();
            assert_eq!(reasons.as_usize(), 4);
            let shown = reasons.to_string();
            assert!(shown.starts_with("[4: ") && shown.contains(&no_gpu.0), "{shown}");
            let plan = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                node.as_ref(),
            )
            .indent(true)
            .to_string();
            assert!(plan.contains(&format!("cpu_fallback_reasons={shown}")), "{plan}");
        }
    }
}
