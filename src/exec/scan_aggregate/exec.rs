//! The plan node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    execute_stream, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    SendableRecordBatchStream, Statistics, StatisticsArgs,
};
use datafusion::common::stats::Precision;
use futures::TryStreamExt;

use super::run::{run, Ran};
use super::shape::ScanAggregateShape;
use super::states::check;
use crate::exec::fill_ahead::FillAheadSlot;
use crate::exec::aggregate::describe_aggregate;
use crate::exec::GpuScanMetrics;
use crate::gpu::launch::SCAN_MAX_SLOTS;
use crate::trace;

/// A partial aggregation and the filters and projections below it, down to
/// its table scan (Parquet files or a `MemTable`), run on the GPU over the
/// table's columns in the device column cache (`algorithm=scan_aggregate`):
/// the columns the query reads are copied to the device once (strings of
/// few distinct values as codes into a host dictionary) and kept there for
/// the next queries, up to `gpu.cache_memory_fraction` of the device's
/// memory; one kernel then filters, computes the aggregates' arguments and
/// accumulates each group's states, and one row of partial states per
/// group comes back, which DataFusion's final aggregation above merges as
/// it would its own partial one's.
///
/// It takes the place of the partial `AggregateExec`, which stays below it
/// as its only child and runs only where the device cannot: a column that
/// is not kept as words, more groups than the device's accumulators hold,
/// a 64-bit overflow, no device memory. Its one output partition holds
/// every group.
///
/// Supported: `COUNT`, `SUM`, `AVG` over integers, decimals and doubles;
/// `MIN`, `MAX` over integers, dates, timestamps, decimals and booleans;
/// group keys that are string columns of at most 1,024 distinct values in
/// each file or partition; filters and arguments built of columns,
/// literals, comparisons, `AND`, `OR`, `NOT`, `IS [NOT] NULL`, `+`, `-`,
/// `*` (64-bit integers, decimals, doubles), `IN` lists, `CASE`, and casts
/// that widen.
pub struct GpuScanAggregateExec {
    /// The partial aggregation replaced, with its input: the CPU fallback.
    cpu_aggregate: Arc<dyn ExecutionPlan>,
    shape: Arc<ScanAggregateShape>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The cache fills of the plan's scans, started when this node runs.
    fill_ahead: FillAheadSlot,
}

impl GpuScanAggregateExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions.
    pub const ALGORITHM: &'static str = "scan_aggregate";

    /// Replaces `cpu_aggregate`, a partial `AggregateExec` over one table
    /// scan whose every expression the device evaluates; the reason where
    /// it is not.
    pub(crate) fn try_new(
        cpu_aggregate: Arc<dyn ExecutionPlan>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(agg) = cpu_aggregate.downcast_ref::<AggregateExec>() else {
            return Ok(None);
        };
        let Some(shape) = ScanAggregateShape::of(agg)? else {
            return Ok(None);
        };
        // What the device cannot evaluate is found now, with its reason.
        check(&shape)?;
        let schema = agg.schema();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Some(Self {
            cpu_aggregate,
            shape: Arc::new(shape),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            fill_ahead: FillAheadSlot::default(),
        }))
    }

    /// The partial `AggregateExec` this node replaces.
    pub fn aggregate(&self) -> &AggregateExec {
        self.cpu_aggregate
            .downcast_ref::<AggregateExec>()
            .expect("checked in try_new")
    }

    /// Rows the scan reads, where known without reading the table (a
    /// `MemTable`'s counted, files' from their footers).
    pub(crate) fn scan_rows(&self) -> Option<usize> {
        self.shape.scan_rows
    }

    /// Whether it reads a Parquet table (not batches in memory).
    pub(crate) fn reads_files(&self) -> bool {
        matches!(self.shape.source, super::TableSource::Parquet { .. })
    }

    /// Where the plan's fills are given to this node.
    pub(crate) fn fill_ahead(&self) -> &FillAheadSlot {
        &self.fill_ahead
    }
}

impl fmt::Debug for GpuScanAggregateExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuScanAggregateExec")
            .field("cpu_aggregate", &self.cpu_aggregate)
            .finish()
    }
}

impl DisplayAs for GpuScanAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "GpuScanAggregateExec: algorithm={}, {}, table=({}), filter=[{}], \
                     cpu_fallback=input",
                    Self::ALGORITHM,
                    describe_aggregate(self.aggregate()),
                    self.shape.source.describe(),
                    self.shape
                        .predicate
                        .as_ref()
                        .map_or_else(String::new, |p| p.to_string()),
                )
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", Self::ALGORITHM)?;
                write!(f, "table={}", self.shape.source.describe())
            }
        }
    }
}

impl ExecutionPlan for GpuScanAggregateExec {
    fn name(&self) -> &str {
        "GpuScanAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.cpu_aggregate]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        match &self.shape.predicate {
            Some(predicate) => f(predicate),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = match (children.pop(), children.is_empty()) {
            (Some(child), true) => child,
            _ => {
                return Err(DataFusionError::Internal(
                    "GpuScanAggregateExec has one child".into(),
                ))
            }
        };
        // A child this node can no longer read runs as it is.
        match Self::try_new(Arc::clone(&child)) {
            Ok(Some(mut node)) => {
                node.fill_ahead = self.fill_ahead.carried();
                Ok(Arc::new(node))
            }
            _ => Ok(Arc::new(CoalescePartitionsExec::new(child))),
        }
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let child = Arc::clone(&self.cpu_aggregate).reset_state()?;
        #[allow(deprecated)]
        self.with_new_children(vec![child])
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let mut statistics = Statistics::new_unknown(&self.schema());
        statistics.num_rows = match self.shape.group_columns.is_empty() {
            true => Precision::Exact(1),
            false => Precision::Inexact(SCAN_MAX_SLOTS),
        };
        Ok(Arc::new(statistics))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "GpuScanAggregateExec has one partition, not {partition}"
            )));
        }
        let shape = Arc::clone(&self.shape);
        let fallback = Arc::clone(&self.cpu_aggregate);
        let schema = self.schema();
        let metrics = GpuScanMetrics::new(&self.metrics, 0);
        let fills = self.fill_ahead.start(&context);
        let output = async move {
            let _fills = fills;
            match run(shape, Arc::clone(&context), metrics.clone()).await? {
                Ran::Batch(batch) => {
                    metrics.baseline.done();
                    let schema = batch.schema();
                    let batches = futures::stream::iter([Ok(batch)]);
                    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches))
                        as SendableRecordBatchStream)
                }
                Ran::OnCpu(reason) => {
                    trace::event(|| format!("scan aggregation on the CPU: {reason}"));
                    metrics.fell_back(&reason);
                    let plan = Arc::new(CoalescePartitionsExec::new(fallback));
                    execute_stream(plan, context)
                }
            }
        };
        let stream = futures::stream::once(output).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}
