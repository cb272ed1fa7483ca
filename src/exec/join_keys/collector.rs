//! The plan node above a hash join's build side that gathers its keys.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Int16Type, Int32Type, Int64Type, Int8Type, SchemaRef, UInt16Type,
    UInt32Type, UInt8Type,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::statistics::ChildStats;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream, Statistics, StatisticsArgs,
};
use futures::{Stream, StreamExt};

use super::set::{JoinKeySet, MAX_KEY_VALUES};

/// Whether join keys of `data_type` can be gathered into a [`JoinKeySet`]:
/// integers (unsigned up to 32 bits) and dates, whose device words are their
/// values.
pub(crate) fn gathers_keys_of(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32
    )
}

/// The valid values of `array` (of a type [`gathers_keys_of`] takes),
/// appended to `out`; `false` for another type.
pub(super) fn append_key_values(array: &ArrayRef, out: &mut Vec<i64>) -> bool {
    macro_rules! append {
        ($t:ty) => {{
            let values = array.as_primitive::<$t>();
            match values.nulls().filter(|n| n.null_count() > 0) {
                None => out.extend(values.values().iter().map(|&v| v as i64)),
                Some(nulls) => out.extend(
                    values
                        .values()
                        .iter()
                        .zip(nulls.iter())
                        .filter(|(_, valid)| *valid)
                        .map(|(&v, _)| v as i64),
                ),
            }
            true
        }};
    }
    match array.data_type() {
        DataType::Int8 => append!(Int8Type),
        DataType::Int16 => append!(Int16Type),
        DataType::Int32 => append!(Int32Type),
        DataType::Int64 => append!(Int64Type),
        DataType::UInt8 => append!(UInt8Type),
        DataType::UInt16 => append!(UInt16Type),
        DataType::UInt32 => append!(UInt32Type),
        DataType::Date32 => append!(Date32Type),
        _ => false,
    }
}

/// Passes a hash join's build side through unchanged, gathering the values
/// of one of its join keys into a [`JoinKeySet`] that the scan of the
/// join's probe side tests its rows against, on the GPU or the host (see
/// [`super`]).
pub struct JoinKeyCollectorExec {
    input: Arc<dyn ExecutionPlan>,
    /// The join key, over the input's rows.
    key: Arc<dyn PhysicalExpr>,
    keys: Arc<JoinKeySet>,
    metrics: ExecutionPlanMetricsSet,
}

impl JoinKeyCollectorExec {
    /// Gathers `key` (over `input`'s rows) into `keys`, which must expect as
    /// many partitions as `input` has.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        key: Arc<dyn PhysicalExpr>,
        keys: Arc<JoinKeySet>,
    ) -> Self {
        Self {
            input,
            key,
            keys,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The set the keys go to.
    pub fn keys(&self) -> &Arc<JoinKeySet> {
        &self.keys
    }

    /// The build side.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl fmt::Debug for JoinKeyCollectorExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinKeyCollectorExec")
            .field("key", &self.key)
            .field("set", &self.keys.id())
            .finish()
    }
}

impl DisplayAs for JoinKeyCollectorExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "JoinKeyCollectorExec: key={}, keys=#{} (for the scan of the probe side)",
                self.key,
                self.keys.id()
            ),
            DisplayFormatType::TreeRender => write!(f, "keys=#{}", self.keys.id()),
        }
    }
}

impl ExecutionPlan for JoinKeyCollectorExec {
    fn name(&self) -> &str {
        "JoinKeyCollectorExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        f(&self.key)
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => {
                let partitions = input.properties().output_partitioning().partition_count();
                // A set expects its input's partitions: a new input may
                // have others.
                let keys = match partitions == self.input.properties().output_partitioning().partition_count() {
                    true => Arc::clone(&self.keys),
                    false => return Ok(input),
                };
                Ok(Arc::new(Self::new(input, Arc::clone(&self.key), keys)))
            }
            _ => Err(DataFusionError::Internal(
                "JoinKeyCollectorExec has one child".into(),
            )),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
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
        let reservation = MemoryConsumer::new(format!("JoinKeyCollectorExec[{partition}]"))
            .register(context.memory_pool());
        let input = self.input.execute(partition, context)?;
        let round = self.keys.start(partition);
        let metrics = GatherMetrics {
            keys: MetricBuilder::new(&self.metrics).counter("join_keys", partition),
            sets: MetricBuilder::new(&self.metrics).counter("join_key_sets", partition),
        };
        Ok(Box::pin(GatheringStream {
            metrics,
            reservation,
            schema: input.schema(),
            input,
            key: Arc::clone(&self.key),
            keys: Arc::clone(&self.keys),
            round,
            values: Some(Vec::new()),
            done: false,
        }))
    }
}

/// What `EXPLAIN ANALYZE` shows of a partition's gathering.
struct GatherMetrics {
    /// Valid keys gathered.
    keys: Count,
    /// 1 where this partition, the last of its round, saw the set made.
    sets: Count,
}

/// One partition of the build side, its keys gathered as it passes.
struct GatheringStream {
    metrics: GatherMetrics,
    /// The keys' memory, in the session's pool: where it refuses them, no
    /// set is made.
    reservation: MemoryReservation,
    schema: SchemaRef,
    input: SendableRecordBatchStream,
    key: Arc<dyn PhysicalExpr>,
    keys: Arc<JoinKeySet>,
    round: u64,
    /// `None` once the keys could not be taken (too many, another type).
    values: Option<Vec<i64>>,
    /// Whether the set was told how the partition ended.
    done: bool,
}

impl GatheringStream {
    fn gather(&mut self, batch: &RecordBatch) -> Result<()> {
        let Some(values) = self.values.as_mut() else {
            return Ok(());
        };
        let array = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        let before = values.len();
        let held = values.capacity();
        let taken = append_key_values(&array, values)
            && values.len() <= MAX_KEY_VALUES
            && self
                .reservation
                .try_grow(values.capacity().saturating_sub(held) * std::mem::size_of::<i64>())
                .is_ok();
        if !taken {
            self.values = None;
            self.reservation.free();
            return Ok(());
        }
        self.metrics.keys.add(values.len() - before);
        Ok(())
    }
}

impl Stream for GatheringStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.input.poll_next_unpin(cx);
        match &polled {
            Poll::Ready(Some(Ok(batch))) => {
                if let Err(e) = self.gather(batch) {
                    self.done = true;
                    self.keys.fail(self.round);
                    return Poll::Ready(Some(Err(e)));
                }
            }
            Poll::Ready(Some(Err(_))) => {
                self.done = true;
                self.keys.fail(self.round);
            }
            Poll::Ready(None) if !self.done => {
                self.done = true;
                let values = self.values.take();
                if self.keys.finish(self.round, values) {
                    self.metrics.sets.add(1);
                }
            }
            _ => {}
        }
        polled
    }
}

impl RecordBatchStream for GatheringStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

impl Drop for GatheringStream {
    fn drop(&mut self) {
        // Dropped before its end (a limit, a cancelled query): the round
        // has no set.
        if !self.done {
            self.keys.fail(self.round);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date32Array, Int32Array, Int64Array, StringArray, UInt32Array};

    #[test]
    fn key_values_leave_nulls_out_and_refuse_other_types() {
        let mut out = Vec::new();
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(-4), None, Some(7)]));
        assert!(append_key_values(&ints, &mut out));
        let longs: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, 3]));
        assert!(append_key_values(&longs, &mut out));
        let unsigned: ArrayRef = Arc::new(UInt32Array::from(vec![u32::MAX]));
        assert!(append_key_values(&unsigned, &mut out));
        let dates: ArrayRef = Arc::new(Date32Array::from(vec![Some(19000), None]));
        assert!(append_key_values(&dates, &mut out));
        assert_eq!(out, [-4, 7, i64::MIN, 3, i64::from(u32::MAX), 19000]);
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert!(!append_key_values(&strings, &mut out));
        assert!(gathers_keys_of(&DataType::Date32) && !gathers_keys_of(&DataType::UInt64));
    }
}
