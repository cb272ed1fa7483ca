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
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream, Statistics, StatisticsArgs,
};
use futures::{Stream, StreamExt};

use super::set::{JoinKeySet, MAX_KEY_VALUES};
use crate::exec::fill_ahead::FillAheadSlot;

/// The most bytes of a probe side's batches (as sliced, not the buffers
/// they share) that the partitions of a collector of its keys (a set
/// [`JoinKeySet::of_probe_side`]) hold for their join, all together, an
/// equal share a partition: a build side waits for such a set only to read
/// fewer rows, and a probe side larger than this is left to its join to
/// stream, with no set (the build side then reads every row). Under a
/// memory pool with a limit, at most a quarter of it.
pub const MAX_PROBE_SIDE_HELD: usize = 512 << 20;

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
///
/// In a multi-threaded runtime each partition of the build side is read to
/// its end by a task of its own from the moment it is executed, its batches
/// held (in the session's memory pool; where it refuses one, the join reads
/// the rest itself) until the join reads them: the build
/// side's work overlaps whatever the plan does before the join reads it (in
/// q18, `customer`'s scan and hash table run beside the GPU aggregation of
/// `lineitem` rather than after it), and the set is made without waiting
/// for the join, so that a scan may wait for it ([`JoinKeySet::reads_ahead`]).
pub struct JoinKeyCollectorExec {
    input: Arc<dyn ExecutionPlan>,
    /// The join key, over the input's rows.
    key: Arc<dyn PhysicalExpr>,
    keys: Arc<JoinKeySet>,
    metrics: ExecutionPlanMetricsSet,
    /// The cache fills of the plan's scans, started when this node runs.
    fill_ahead: FillAheadSlot,
    /// For a set of a probe side, the most bytes its partitions hold
    /// ([`MAX_PROBE_SIDE_HELD`]).
    probe_side_held: usize,
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
            fill_ahead: FillAheadSlot::default(),
            probe_side_held: MAX_PROBE_SIDE_HELD,
        }
    }

    /// Where the plan's fills are given to this node.
    pub(crate) fn fill_ahead(&self) -> &FillAheadSlot {
        &self.fill_ahead
    }

    /// The set the keys go to.
    pub fn keys(&self) -> &Arc<JoinKeySet> {
        &self.keys
    }

    /// This collector with its partitions holding at most `bytes` of a
    /// probe side's batches in all (in place of [`MAX_PROBE_SIDE_HELD`]).
    #[cfg(test)]
    fn with_probe_side_held(mut self, bytes: usize) -> Self {
        self.probe_side_held = bytes;
        self
    }

    /// The side whose keys it gathers (a build side, or a probe side for a
    /// set [`JoinKeySet::of_probe_side`]).
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
                "JoinKeyCollectorExec: key={}, keys=#{} (for the scan of the {} side)",
                self.key,
                self.keys.id(),
                match self.keys.is_of_probe_side() {
                    true => "build",
                    false => "probe",
                }
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
                let mut node = Self::new(input, Arc::clone(&self.key), keys);
                node.fill_ahead = self.fill_ahead.carried();
                node.probe_side_held = self.probe_side_held;
                Ok(Arc::new(node))
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
        let held = MemoryConsumer::new(format!("JoinKeyCollectorExec[{partition}] read ahead"))
            .register(context.memory_pool());
        let context_pool_limit = match context.memory_pool().memory_limit() {
            datafusion::execution::memory_pool::MemoryLimit::Finite(limit) => Some(limit),
            _ => None,
        };
        let fills = self.fill_ahead.start(&context);
        let input = self.input.execute(partition, context)?;
        let round = self.keys.start(partition);
        let metrics = GatherMetrics {
            keys: MetricBuilder::new(&self.metrics).counter("join_keys", partition),
            sets: MetricBuilder::new(&self.metrics).counter("join_key_sets", partition),
        };
        let (read_ahead_name, left_to_join_name) = match self.keys.is_of_probe_side() {
            true => ("probe_side_read_ahead", "probe_side_left_to_join"),
            false => ("build_side_read_ahead", "build_side_left_to_join"),
        };
        let read_ahead_metrics = ReadAheadMetrics {
            read_ahead: MetricBuilder::new(&self.metrics).counter(read_ahead_name, partition),
            left_to_join: MetricBuilder::new(&self.metrics).counter(left_to_join_name, partition),
        };
        let gathering = Box::pin(GatheringStream {
            metrics,
            reservation,
            schema: input.schema(),
            input,
            key: Arc::clone(&self.key),
            keys: Arc::clone(&self.keys),
            round,
            values: Some(Vec::new()),
            done: false,
        });
        // A probe side's partitions share what they may hold.
        let held_limit = self.keys.is_of_probe_side().then(|| {
            let partitions = self.keys.partitions().max(1);
            let bound = match context_pool_limit {
                Some(limit) => self.probe_side_held.min(limit / 4),
                None => self.probe_side_held,
            };
            bound / partitions
        });
        let stream = read_ahead(gathering, &self.keys, round, held, held_limit, read_ahead_metrics);
        Ok(match fills {
            None => stream,
            // The plan's fills go on while the join reads this side.
            Some(fills) => Box::pin(RecordBatchStreamAdapter::new(
                stream.schema(),
                stream.map(move |batch| {
                    let _ = &fills;
                    batch
                }),
            )),
        })
    }
}

/// What `EXPLAIN ANALYZE` shows of a partition's read ahead.
struct ReadAheadMetrics {
    /// 1 where the partition was read ahead of its join.
    read_ahead: Count,
    /// 1 where the partition was left to the join to read the rest itself
    /// (the memory pool refused more, a probe side passed its share, or its
    /// round ended without a set).
    left_to_join: Count,
}

/// What the task reading a partition ahead hands the join.
enum ReadAhead {
    /// The partition's next batch (or error), held since it was read, with
    /// the bytes reserved for it.
    Batch(Result<RecordBatch>, usize),
    /// The rest of the partition, to be read as the join reads it (see
    /// [`read_ahead`]).
    Rest(SendableRecordBatchStream),
    /// The partition's end.
    End,
}

/// `stream` (partition of round `round` of `keys`) read to its end by a
/// task of its own, where a multi-threaded runtime can run one (see
/// [`JoinKeyCollectorExec`]); else `stream` as it is, read as the join
/// reads it. The batches waiting for the join are held in `held` (a probe
/// side's as sliced, see [`sliced_bytes`]); where the pool refuses one,
/// where the batches read ahead would pass `held_limit` bytes (as sliced),
/// or where the round of a probe side's set has ended without one, the task
/// hands the join that batch and the rest of the stream, and the join reads
/// them as it would have. (A probe side's join reads nothing before its
/// build side, which waits for the set: until the set is made or none will
/// be, the batches read ahead are those held.) The task stops when the
/// stream it feeds is dropped.
fn read_ahead(
    mut stream: SendableRecordBatchStream,
    keys: &Arc<JoinKeySet>,
    round: u64,
    held: MemoryReservation,
    held_limit: Option<usize>,
    metrics: ReadAheadMetrics,
) -> SendableRecordBatchStream {
    if !crate::exec::in_multi_threaded_runtime() {
        return stream;
    }
    let schema = stream.schema();
    let held = Arc::new(held);
    let (sender, received) = futures::channel::mpsc::unbounded();
    // Counted before the task starts: it may hand the partition back at
    // once.
    keys.read_ahead(round);
    metrics.read_ahead.add(1);
    let (holding, rest_schema, set) = (Arc::clone(&held), Arc::clone(&schema), Arc::clone(keys));
    let task = SpawnedTask::spawn(async move {
        let probe_side = set.is_of_probe_side();
        let mut sliced_read = 0;
        while let Some(item) = stream.next().await {
            let failed = item.is_err();
            // A build side's batches are reserved whole, as they always
            // were; only a probe side's are measured as sliced.
            let size = match (probe_side, &item) {
                (true, Ok(batch)) => sliced_bytes(batch),
                (false, Ok(batch)) => get_record_batch_memory_size(batch),
                (_, Err(_)) => 0,
            };
            let over_limit = held_limit.is_some_and(|limit| sliced_read + size > limit);
            // No set will come: the join may as well stream the rest.
            let no_set = probe_side && set.ended_without_set(round);
            if over_limit || no_set || holding.try_grow(size).is_err() {
                // The join takes this batch and reads the rest itself.
                let rest = futures::stream::once(async move { item }).chain(stream);
                let rest = RecordBatchStreamAdapter::new(rest_schema, rest);
                set.read_by_join(round);
                metrics.left_to_join.add(1);
                let _ = sender.unbounded_send(ReadAhead::Rest(Box::pin(rest)));
                return;
            }
            sliced_read += size;
            if sender.unbounded_send(ReadAhead::Batch(item, size)).is_err() {
                // The join is gone (a limit, a cancelled query).
                return;
            }
            if failed {
                // The partition failed: nothing more to read.
                break;
            }
        }
        let _ = sender.unbounded_send(ReadAhead::End);
    });
    Box::pin(ReadAheadStream {
        schema,
        received,
        rest: None,
        ended: false,
        held,
        _task: task,
    })
}

/// A partition read ahead, as its join reads it (see [`read_ahead`]).
struct ReadAheadStream {
    schema: SchemaRef,
    received: futures::channel::mpsc::UnboundedReceiver<ReadAhead>,
    /// The rest of the partition, where the task handed it over.
    rest: Option<SendableRecordBatchStream>,
    /// Whether the partition's end (or the task's failure) was handed on.
    ended: bool,
    held: Arc<MemoryReservation>,
    /// Aborted when the join drops this stream.
    _task: SpawnedTask<()>,
}

impl Stream for ReadAheadStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(rest) = self.rest.as_mut() {
                return rest.poll_next_unpin(cx);
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match futures::ready!(self.received.poll_next_unpin(cx)) {
                Some(ReadAhead::Batch(item, size)) => {
                    self.held.shrink(size.min(self.held.size()));
                    return Poll::Ready(Some(item));
                }
                Some(ReadAhead::Rest(rest)) => self.rest = Some(rest),
                Some(ReadAhead::End) => {
                    self.ended = true;
                    return Poll::Ready(None);
                }
                // The task ended without the partition's end: it panicked.
                None => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(DataFusionError::Execution(
                        "the task reading a join's input ahead stopped before its end".into(),
                    ))))
                }
            }
        }
    }
}

impl RecordBatchStream for ReadAheadStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// The bytes `batch`'s columns take as sliced, not the whole buffers they
/// may share with other batches (an aggregation's output, cut in slices);
/// string and binary views whole, their values' buffers with them (a
/// slice's size counts only the views).
fn sliced_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| match column.data_type() {
            DataType::Utf8View | DataType::BinaryView => column.get_array_memory_size(),
            _ => column
                .to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| column.get_array_memory_size()),
        })
        .sum()
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
                crate::trace::event(|| {
                    let keys = values.as_ref().map_or(0, Vec::len);
                    format!("join keys #{}: a partition read to its end, {keys} keys", self.keys.id())
                });
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
    use datafusion::arrow::datatypes::Int64Type;

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

    /// A partition of one batch that comes once its gate opens (or at
    /// once, without a gate).
    #[derive(Debug)]
    struct GatedPartition {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        gate: std::sync::Mutex<Option<futures::channel::oneshot::Receiver<()>>>,
    }

    impl datafusion::physical_plan::streaming::PartitionStream for GatedPartition {
        fn schema(&self) -> &SchemaRef {
            &self.schema
        }

        fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
            let gate = self.gate.lock().unwrap().take();
            let opened = futures::stream::once(async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
            });
            let batches = futures::stream::iter(self.batches.clone().into_iter().map(Ok));
            let stream = opened.filter_map(|_| async { None }).chain(batches);
            Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&self.schema), stream))
        }
    }

    /// A collector over two partitions of keys 0..100 and 100..200, in
    /// batches of `columns` copies of the key, each partition held back by
    /// a gate where `gated`; the gates' senders.
    fn collector_of_two_partitions(
        columns: usize,
        gated: bool,
    ) -> (JoinKeyCollectorExec, Arc<JoinKeySet>, Vec<futures::channel::oneshot::Sender<()>>) {
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::physical_expr::expressions::Column;
        use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
        let fields: Vec<Field> = (0..columns).map(|c| Field::new(format!("k{c}"), DataType::Int64, false)).collect();
        let schema = Arc::new(Schema::new(fields));
        // Arrays of their own: memory is counted once per buffer.
        let batch = |keys: std::ops::Range<i64>| {
            let keys: Vec<i64> = keys.collect();
            let columns: Vec<ArrayRef> = (0..columns)
                .map(|_| Arc::new(Int64Array::from(keys.clone())) as ArrayRef)
                .collect();
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        };
        let mut gates = Vec::new();
        let mut partition = |batches: Vec<RecordBatch>| -> Arc<dyn PartitionStream> {
            let gate = gated.then(|| {
                let (open, gate) = futures::channel::oneshot::channel();
                gates.push(open);
                gate
            });
            Arc::new(GatedPartition {
                schema: Arc::clone(&schema),
                batches,
                gate: std::sync::Mutex::new(gate),
            })
        };
        let partitions = vec![partition(vec![batch(0..60), batch(60..100)]), partition(vec![batch(100..200)])];
        let scan = StreamingTableExec::try_new(Arc::clone(&schema), partitions, None, [], false, None).unwrap();
        let set = Arc::new(JoinKeySet::new(2));
        let key = Arc::new(Column::new("k0", 0));
        (JoinKeyCollectorExec::new(Arc::new(scan), key, Arc::clone(&set)), set, gates)
    }

    fn keys_of(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    fn multi_threaded() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap()
    }

    /// The sum of `collector`'s metric `name` over its partitions.
    fn metric(collector: &JoinKeyCollectorExec, name: &str) -> usize {
        let metrics = collector.metrics().expect("the collector's metrics");
        metrics.sum_by_name(name).map_or(0, |value| value.as_usize())
    }

    /// Both partitions of `collector` executed within `runtime`.
    fn execute_both(
        collector: &JoinKeyCollectorExec,
        context: &Arc<TaskContext>,
        runtime: &tokio::runtime::Runtime,
    ) -> Vec<SendableRecordBatchStream> {
        let _inside = runtime.enter();
        (0..2)
            .map(|p| collector.execute(p, Arc::clone(context)))
            .collect::<Result<Vec<_>>>()
            .unwrap()
    }

    /// Every batch of `streams`, stream by stream.
    async fn read_all(streams: Vec<SendableRecordBatchStream>) -> Vec<Vec<RecordBatch>> {
        use futures::TryStreamExt;
        let mut read = Vec::new();
        for stream in streams {
            read.push(stream.try_collect::<Vec<_>>().await.unwrap());
        }
        read
    }

    #[test]
    fn a_build_side_is_read_ahead_of_its_join_in_a_multi_threaded_runtime() {
        let (collector, set, gates) = collector_of_two_partitions(1, true);
        let runtime = multi_threaded();
        let context = Arc::new(TaskContext::default());
        let streams = execute_both(&collector, &context, &runtime);
        assert!(set.reads_ahead());
        // A scan waits for the set although the build side has two
        // partitions, past the grace (every partition is read ahead)...
        let (waited, done) = std::sync::mpsc::channel();
        let wait = super::super::waits_for(&[Arc::clone(&set)]);
        runtime.spawn(async move {
            wait.await;
            let _ = waited.send(());
        });
        let grace = super::super::set::READ_AHEAD_GRACE;
        assert!(done.recv_timeout(5 * grace).is_err(), "the wait ended before the set was made");
        // ...until the build side is read, though no one reads the join.
        for gate in gates {
            gate.send(()).unwrap();
        }
        assert!(done.recv_timeout(std::time::Duration::from_secs(30)).is_ok());
        let keys = set.keys().expect("the set of a build side read ahead");
        assert!((0..200).all(|k| keys.contains(k)) && !keys.contains(200) && !keys.contains(-1));
        assert!(context.memory_pool().reserved() > 0, "the batches read ahead are held");
        // The join then reads every batch, in order, and the memory held
        // for them is given back.
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read[0]), (0..100).collect::<Vec<_>>());
        assert_eq!(keys_of(&read[1]), (100..200).collect::<Vec<_>>());
        assert_eq!(read[0].len(), 2);
        assert_eq!(context.memory_pool().reserved(), 0);
        assert_eq!(metric(&collector, "build_side_read_ahead"), 2);
        // A stream read past its end stays ended.
        let mut again = execute_both(&collector, &context, &runtime);
        let (first, second) = runtime.block_on(async {
            while again[0].next().await.is_some() {}
            (again[0].next().await.is_none(), again[0].next().await.is_none())
        });
        assert!(first && second);
        assert_eq!(metric(&collector, "build_side_left_to_join"), 0);
    }

    #[test]
    fn a_join_dropped_before_its_build_side_was_read_stops_the_read_and_leaves_no_set() {
        let (collector, set, gates) = collector_of_two_partitions(1, true);
        let runtime = multi_threaded();
        let context = Arc::new(TaskContext::default());
        let streams = execute_both(&collector, &context, &runtime);
        // The join goes (a limit, a cancelled query): the reads stop, and
        // the round settles without a set, so no scan waits for it.
        drop(streams);
        let settled = runtime.block_on(async {
            let wait = super::super::waits_for(&[Arc::clone(&set)]);
            tokio::time::timeout(std::time::Duration::from_secs(5), wait).await
        });
        assert!(settled.is_ok());
        assert!(set.keys().is_none());
        // The tasks are dropped on the runtime's threads, moments later.
        let stopped = |gates: &[futures::channel::oneshot::Sender<()>]| {
            gates.iter().all(|gate| gate.is_canceled()) && context.memory_pool().reserved() == 0
        };
        let began = std::time::Instant::now();
        while !stopped(&gates) && began.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(stopped(&gates), "the reads still run, or hold memory");
    }

    #[test]
    fn a_build_side_the_memory_pool_cannot_hold_is_left_to_its_join() {
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        // 64 columns: a batch takes many times the memory of its keys.
        let (collector, set, _) = collector_of_two_partitions(64, false);
        let runtime = multi_threaded();
        let limited = RuntimeEnvBuilder::new().with_memory_limit(16 << 10, 1.0).build_arc().unwrap();
        let context = Arc::new(TaskContext::default().with_runtime(limited));
        let streams = execute_both(&collector, &context, &runtime);
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read[0]), (0..100).collect::<Vec<_>>());
        assert_eq!(keys_of(&read[1]), (100..200).collect::<Vec<_>>());
        assert!(read.iter().flatten().all(|batch| batch.num_columns() == 64));
        assert!(set.keys().is_some_and(|keys| keys.contains(0) && keys.contains(199)));
        // Left to the join: a scan no longer waits for that round.
        assert!(!set.reads_ahead());
        assert_eq!(context.memory_pool().reserved(), 0);
        assert_eq!(metric(&collector, "build_side_left_to_join"), 2);
    }

    #[test]
    fn a_build_side_waits_for_its_join_where_no_task_can_read_it_ahead() {
        let (collector, set, _) = collector_of_two_partitions(1, false);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let context = Arc::new(TaskContext::default());
        let streams = execute_both(&collector, &context, &runtime);
        assert!(!set.reads_ahead());
        assert!(set.keys().is_none());
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read.concat()), (0..200).collect::<Vec<_>>());
        assert!(set.keys().is_some_and(|keys| keys.contains(0) && keys.contains(199)));
        assert_eq!(metric(&collector, "build_side_read_ahead"), 0);
    }

    /// [`collector_of_two_partitions`]'s input and key gathered for the
    /// scan of a build side, its partitions holding at most `held` bytes.
    fn probe_side_collector(held: usize) -> (JoinKeyCollectorExec, Arc<JoinKeySet>) {
        let (collector, _, _) = collector_of_two_partitions(1, false);
        let set = Arc::new(JoinKeySet::of_probe_side(2));
        let probe_side = JoinKeyCollectorExec::new(
            Arc::clone(collector.input()),
            Arc::clone(&collector.key),
            Arc::clone(&set),
        )
        .with_probe_side_held(held);
        (probe_side, set)
    }

    #[test]
    fn a_probe_side_is_read_ahead_within_its_limit_and_left_to_its_join_beyond() {
        // Within the limit: both partitions read ahead, the set made.
        let (collector, set) = probe_side_collector(MAX_PROBE_SIDE_HELD);
        let runtime = multi_threaded();
        let context = Arc::new(TaskContext::default());
        let streams = execute_both(&collector, &context, &runtime);
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read.concat()), (0..200).collect::<Vec<_>>());
        assert!(set.keys().is_some_and(|keys| keys.contains(0) && keys.contains(199)));
        assert_eq!(metric(&collector, "probe_side_read_ahead"), 2);
        assert_eq!(metric(&collector, "probe_side_left_to_join"), 0);
        assert_eq!(metric(&collector, "build_side_read_ahead"), 0);
        assert!(collector_text(&collector).contains("(for the scan of the build side)"));

        // Beyond it (400 bytes, 200 a partition, where each batch of keys
        // takes 320 to 800): each partition is left to the join, the round
        // ends with no set at once, and the join still reads every row.
        let (collector, set) = probe_side_collector(400);
        let streams = execute_both(&collector, &context, &runtime);
        let ended = std::time::Instant::now();
        while !set.ended_without_set(set.round()) {
            assert!(ended.elapsed() < std::time::Duration::from_secs(30), "the round never ended");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read[0]), (0..100).collect::<Vec<_>>());
        assert_eq!(keys_of(&read[1]), (100..200).collect::<Vec<_>>());
        assert!(set.keys().is_none(), "a set of part of the probe side");
        assert_eq!(metric(&collector, "probe_side_left_to_join"), 2);
        released_in_time(&context);
    }

    /// `collector` as `EXPLAIN` shows it.
    fn collector_text(collector: &JoinKeyCollectorExec) -> String {
        datafusion::physical_plan::displayable(collector).one_line().to_string()
    }

    /// A probe side of two partitions whose batches are slices of one
    /// array of 100,000 keys (as an aggregation hands out its output), three
    /// of 100 rows each, gathered for the scan of a build side; its
    /// partitions hold at most `held` bytes in all.
    fn sliced_probe_side(held: usize) -> (JoinKeyCollectorExec, Arc<JoinKeySet>) {
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::physical_expr::expressions::Column;
        use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
        let schema = Arc::new(Schema::new(vec![Field::new("k0", DataType::Int64, false)]));
        let whole = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..100_000)) as ArrayRef],
        )
        .unwrap();
        let partition = |first: usize| -> Arc<dyn PartitionStream> {
            Arc::new(GatedPartition {
                schema: Arc::clone(&schema),
                batches: (0..3).map(|b| whole.slice(first + 100 * b, 100)).collect(),
                gate: std::sync::Mutex::new(None),
            })
        };
        let scan = StreamingTableExec::try_new(
            Arc::clone(&schema),
            vec![partition(0), partition(300)],
            None,
            [],
            false,
            None,
        )
        .unwrap();
        let set = Arc::new(JoinKeySet::of_probe_side(2));
        let key = Arc::new(Column::new("k0", 0));
        let collector = JoinKeyCollectorExec::new(Arc::new(scan), key, Arc::clone(&set))
            .with_probe_side_held(held);
        (collector, set)
    }

    #[test]
    fn a_probe_side_counts_its_batches_as_sliced_within_a_quarter_of_a_limited_pool() {
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        let runtime = multi_threaded();
        // Each partition reads 2,400 bytes as sliced (800 KB of buffers):
        // within a share of 8 KB, the set is made, and the pool holds the
        // sliced bytes.
        let pool = |bytes| {
            let env = RuntimeEnvBuilder::new().with_memory_limit(bytes, 1.0).build_arc().unwrap();
            Arc::new(TaskContext::default().with_runtime(env))
        };
        let (collector, set) = sliced_probe_side(16 << 10);
        let context = pool(1 << 20);
        let streams = execute_both(&collector, &context, &runtime);
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read.concat()), (0..600).collect::<Vec<_>>());
        assert!(set.keys().is_some_and(|keys| keys.contains(0) && keys.contains(599)));
        assert_eq!(metric(&collector, "probe_side_left_to_join"), 0);
        released_in_time(&context);

        // Under a pool of 8 KB, a quarter of it (1 KB a partition) bounds
        // what is held: each partition is left to the join after its first
        // batch, and no set is made.
        let (collector, set) = sliced_probe_side(16 << 10);
        let context = pool(8 << 10);
        let streams = execute_both(&collector, &context, &runtime);
        let read = runtime.block_on(read_all(streams));
        assert_eq!(keys_of(&read.concat()), (0..600).collect::<Vec<_>>());
        assert!(set.keys().is_none(), "a set of part of the probe side");
        assert_eq!(metric(&collector, "probe_side_left_to_join"), 2);
        released_in_time(&context);
    }

    /// Asserts that `context`'s pool holds nothing within a few seconds: the
    /// tasks that read ahead let go of their keys' memory as they end,
    /// after handing the join the partition's end.
    fn released_in_time(context: &Arc<TaskContext>) {
        let began = std::time::Instant::now();
        while context.memory_pool().reserved() > 0 {
            assert!(
                began.elapsed() < std::time::Duration::from_secs(10),
                "{} bytes still reserved",
                context.memory_pool().reserved()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
