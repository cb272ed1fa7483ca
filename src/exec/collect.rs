//! Reading an operator's whole input: one stream, or every input partition
//! of a merge below it (`CoalescePartitionsExec`), each in a task of its
//! own, as the merge would read them (a scan below decodes as it is
//! polled), without the merge's channel hand-off per batch, which adds up
//! over the thousands of batches of a large input. Batches a scan
//! would only hand on from memory (a `MemTable`) are taken as they are,
//! without streams at all ([`WholeInput::InMemory`]). An input read as it
//! goes (a join's probe side) comes through in groups of batches instead
//! ([`merge_inputs_in_groups`]).

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};

/// The merge below an operator that may read its input partitions itself:
/// one without a `fetch` (a limit would stop reading early).
pub(crate) fn merge_to_read_through(
    input: &Arc<dyn ExecutionPlan>,
) -> Option<&CoalescePartitionsExec> {
    input
        .downcast_ref::<CoalescePartitionsExec>()
        .filter(|merge| merge.fetch().is_none())
}

/// An operator's whole input, ready to be read.
pub(crate) enum WholeInput {
    /// Streams to read, each in a task of its own where there are several.
    Streams(Vec<SendableRecordBatchStream>),
    /// Partitions of a scan of batches already in memory, taken from it
    /// when collected, without its streams.
    InMemory(InMemoryBatches),
}

impl Default for WholeInput {
    /// No input: no stream.
    fn default() -> Self {
        Self::Streams(Vec::new())
    }
}

impl WholeInput {
    /// Partition `partition` of `input`, or, where the operator reads
    /// through `input`'s merge (`read_through`), every partition below it.
    pub(crate) fn execute(
        input: &Arc<dyn ExecutionPlan>,
        read_through: Option<&CoalescePartitionsExec>,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> Result<Self> {
        let batch_size = context.session_config().batch_size();
        Ok(match read_through {
            Some(merge) => {
                let below = merge.input();
                let partitions = below.properties().output_partitioning().partition_count();
                match InMemoryBatches::of(below, 0..partitions, batch_size) {
                    Some(batches) => Self::InMemory(batches),
                    None => Self::Streams(execute_merge_inputs(merge, context)?),
                }
            }
            None => match InMemoryBatches::of(input, partition..partition + 1, batch_size) {
                Some(batches) => Self::InMemory(batches),
                None => Self::Streams(vec![input.execute(partition, Arc::clone(context))?]),
            },
        })
    }
}

/// Partitions of a scan of batches in memory without a limit (a
/// `MemTable`'s `MemorySourceConfig`), whose batches an operator that reads
/// its whole input takes as the scan's streams would hand them on, but
/// without them: several partitions at once, each batch remade with a
/// schema of the task's own, so that the tasks do not all bump the one
/// reference count that a table's batches share (the streams bump it twice
/// a batch, every core contending for its cache line). Taken so, an input
/// of thousands of batches is collected sooner than through the streams.
pub(crate) struct InMemoryBatches {
    /// The scan (a `DataSourceExec` over a `MemorySourceConfig`).
    scan: Arc<dyn ExecutionPlan>,
    partitions: Range<usize>,
    /// Stored batches longer than this are handed on in slices of it, as
    /// `DataSourceExec` slices them.
    batch_size: usize,
}

impl InMemoryBatches {
    /// `partitions` of `plan` where it is such a scan and has them.
    fn of(
        plan: &Arc<dyn ExecutionPlan>,
        partitions: Range<usize>,
        batch_size: usize,
    ) -> Option<Self> {
        let memory = memory_source(plan)?;
        (memory.fetch().is_none() && partitions.end <= memory.partitions().len()).then(|| Self {
            scan: Arc::clone(plan),
            partitions,
            batch_size: batch_size.max(1),
        })
    }

    /// The batches with rows, partition by partition in order, and the
    /// memory of the stored batches they come from (each counted once,
    /// however many slices it is handed on in).
    async fn take(self) -> Result<Taken> {
        let partitions: Vec<usize> = self.partitions.clone().collect();
        let tasks = crate::host::copy::host_threads().min(partitions.len());
        if tasks <= 1 {
            return self.take_partitions(&partitions);
        }
        let this = Arc::new(self);
        let per_task = partitions.len().div_ceil(tasks);
        let handles: Vec<SpawnedTask<Result<Taken>>> = partitions
            .chunks(per_task)
            .map(|chunk| {
                let (this, chunk) = (Arc::clone(&this), chunk.to_vec());
                SpawnedTask::spawn(async move { this.take_partitions(&chunk) })
            })
            .collect();
        let mut batches = Vec::new();
        let mut bytes = 0;
        for handle in handles {
            let (part, part_bytes) = handle.join().await.map_err(|e| {
                DataFusionError::Execution(format!("a task taking batches in memory failed: {e}"))
            })??;
            batches.extend(part);
            bytes += part_bytes;
        }
        Ok((batches, bytes))
    }

    /// [`Self::take`] over `partitions`, in this task.
    fn take_partitions(&self, partitions: &[usize]) -> Result<Taken> {
        let memory = memory_source(&self.scan).ok_or_else(|| {
            DataFusionError::Internal("a scan of batches in memory is no longer one".into())
        })?;
        let stored = memory.partitions();
        let mut batches = Vec::with_capacity(partitions.iter().map(|&p| stored[p].len()).sum());
        let mut bytes = 0;
        let mut own_schema: Option<(SchemaRef, SchemaRef)> = None;
        for batch in partitions.iter().flat_map(|&p| &stored[p]) {
            let rows = batch.num_rows();
            if rows == 0 {
                continue;
            }
            let batch = match memory.projection() {
                // A projection makes a schema per batch already.
                Some(columns) => batch.project(columns)?,
                None => {
                    let schema = match &own_schema {
                        Some((shared, own)) if Arc::ptr_eq(shared, batch.schema_ref()) => {
                            Arc::clone(own)
                        }
                        _ => {
                            let own = Arc::new(batch.schema_ref().as_ref().clone());
                            own_schema = Some((batch.schema(), Arc::clone(&own)));
                            own
                        }
                    };
                    // SAFETY: the columns and the row count are those of a
                    // valid batch, and `schema` is an equal copy of its
                    // schema: the new batch is that batch.
                    unsafe { RecordBatch::new_unchecked(schema, batch.columns().to_vec(), rows) }
                }
            };
            bytes += batch.get_array_memory_size();
            if rows <= self.batch_size {
                batches.push(batch);
            } else {
                batches.extend(
                    (0..rows)
                        .step_by(self.batch_size)
                        .map(|start| batch.slice(start, self.batch_size.min(rows - start))),
                );
            }
        }
        Ok((batches, bytes))
    }
}

/// Batches taken from memory, and the memory of the stored batches.
type Taken = (Vec<RecordBatch>, usize);

/// The batches in memory `plan` scans, where it is such a scan.
fn memory_source(plan: &Arc<dyn ExecutionPlan>) -> Option<&MemorySourceConfig> {
    plan.downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<MemorySourceConfig>()
}

/// The streams of every input partition of `merge`.
pub(crate) fn execute_merge_inputs(
    merge: &CoalescePartitionsExec,
    context: &Arc<TaskContext>,
) -> Result<Vec<SendableRecordBatchStream>> {
    let below = merge.input();
    (0..below.properties().output_partitioning().partition_count())
        .map(|partition| below.execute(partition, Arc::clone(context)))
        .collect()
}

/// A group of batches handed on from a task reading one input partition
/// ends at this many batches...
const GROUP_BATCHES: usize = 64;
/// ...or at this many rows, whichever comes first.
const GROUP_ROWS: usize = 1 << 19;

/// Every input partition of `merge` read in a task of its own, as the merge
/// would read them, and handed on in groups of batches
/// ([`GROUP_BATCHES`], [`GROUP_ROWS`]): one stream of all their batches, in
/// no fixed order, for a consumer that reads its input as it goes. A
/// bounded channel (two groups per input) holds the readers back when the
/// consumer is slower; an input's error ends the stream with that error;
/// dropping the stream stops the readers.
pub(crate) fn merge_inputs_in_groups(
    merge: &CoalescePartitionsExec,
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let inputs = execute_merge_inputs(merge, context)?;
    let (sender, receiver) = mpsc::channel::<Result<Vec<RecordBatch>>>(2 * inputs.len().max(1));
    let readers: Vec<SpawnedTask<()>> = inputs
        .into_iter()
        .map(|input| SpawnedTask::spawn(read_in_groups(input, sender.clone())))
        .collect();
    drop(sender);
    let batches = receiver
        .map(|group| match group {
            Ok(batches) => futures::stream::iter(batches.into_iter().map(Ok)).left_stream(),
            Err(e) => futures::stream::once(async { Err(e) }).right_stream(),
        })
        .flatten()
        // The readers are aborted when the stream is dropped early.
        .inspect(move |_| {
            let _ = &readers;
        });
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        merge.schema(),
        batches,
    )))
}

/// Sends `input`'s batches with rows to `sender` in groups; stops at the
/// first error (sent on) or when the receiver has gone.
async fn read_in_groups(
    mut input: SendableRecordBatchStream,
    mut sender: mpsc::Sender<Result<Vec<RecordBatch>>>,
) {
    let mut group = Vec::new();
    let mut rows = 0;
    while let Some(batch) = input.next().await {
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) => {
                let _ = sender.send(Err(e)).await;
                return;
            }
        };
        if batch.num_rows() == 0 {
            continue;
        }
        rows += batch.num_rows();
        group.push(batch);
        if group.len() >= GROUP_BATCHES || rows >= GROUP_ROWS {
            rows = 0;
            if sender.send(Ok(std::mem::take(&mut group))).await.is_err() {
                return;
            }
        }
    }
    if !group.is_empty() {
        let _ = sender.send(Ok(group)).await;
    }
}

/// One stream read to its end, or until the memory pool refused a batch:
/// then that batch (unreserved) is the last read, and the stream, with
/// the pool's error, is what is left.
struct StreamRead {
    batches: Vec<RecordBatch>,
    refused: Option<(SendableRecordBatchStream, DataFusionError)>,
}

/// Every batch with rows of `input`, each reserved in `reservation` (and
/// its rows counted in `rows`) as it arrives, until the pool refuses one.
async fn read_stream(
    mut input: SendableRecordBatchStream,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<StreamRead> {
    let mut batches = Vec::new();
    while let Some(batch) = input.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let refused = reservation.try_grow(batch.get_array_memory_size()).err();
        if let Some(rows) = rows {
            rows.add(batch.num_rows());
        }
        batches.push(batch);
        if let Some(error) = refused {
            return Ok(StreamRead {
                batches,
                refused: Some((input, error)),
            });
        }
    }
    Ok(StreamRead {
        batches,
        refused: None,
    })
}

/// An operator's whole input as collected.
pub(crate) enum Collected {
    /// Every batch with rows, stream by stream (each stream's batches
    /// together, in their order), and the reservations of several streams'
    /// batches, to be held as long as the batches (the others are in the
    /// reservation passed in).
    Whole(Vec<RecordBatch>, Vec<MemoryReservation>),
    /// The memory pool refused a batch (`refusal`, its error): the batches
    /// read, none of them reserved any longer, and the streams with batches
    /// left to read. An operator that has sent nothing yet hands both to
    /// DataFusion's operator, which spills where it can.
    Refused {
        read: Vec<RecordBatch>,
        rest: Vec<SendableRecordBatchStream>,
        refusal: DataFusionError,
    },
}

/// Every batch with rows of `input`, stream by stream: batches in memory
/// as they are, one stream in this task, several each in a task of its
/// own. The batches of several streams are reserved in reservations of
/// their own, the others in `reservation`; batches a scan holds in memory
/// (a `MemTable`'s) are not reserved again, since taking them allocates
/// nothing. Where the pool refuses a batch, what was read and what is left
/// ([`Collected::Refused`]), with `reservation` freed.
pub(crate) async fn collect_or_refuse(
    input: WholeInput,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<Collected> {
    let mut inputs = match input {
        WholeInput::Streams(streams) => streams,
        WholeInput::InMemory(in_memory) => {
            let (batches, _stored_bytes) = in_memory.take().await?;
            if let Some(rows) = rows {
                rows.add(batches.iter().map(RecordBatch::num_rows).sum());
            }
            return Ok(Collected::Whole(batches, Vec::new()));
        }
    };
    if inputs.len() == 1 {
        let input = inputs.pop().expect("one input");
        let read = read_stream(input, reservation, rows).await?;
        return Ok(match read.refused {
            None => Collected::Whole(read.batches, Vec::new()),
            Some((rest, refusal)) => {
                reservation.free();
                Collected::Refused {
                    read: read.batches,
                    rest: vec![rest],
                    refusal,
                }
            }
        });
    }
    let tasks: Vec<SpawnedTask<Result<(StreamRead, MemoryReservation)>>> = inputs
        .into_iter()
        .map(|input| {
            let reservation = reservation.new_empty();
            let rows = rows.cloned();
            SpawnedTask::spawn(async move {
                let read = read_stream(input, &reservation, rows.as_ref()).await?;
                Ok((read, reservation))
            })
        })
        .collect();
    let mut batches = Vec::new();
    let mut reservations = Vec::with_capacity(tasks.len());
    let mut rest = Vec::new();
    let mut refusal = None;
    for task in tasks {
        let (read, reserved) = task.join().await.map_err(|e| {
            DataFusionError::Execution(format!("a task reading input failed: {e}"))
        })??;
        batches.extend(read.batches);
        reservations.push(reserved);
        if let Some((stream, error)) = read.refused {
            rest.push(stream);
            refusal.get_or_insert(error);
        }
    }
    Ok(match refusal {
        None => Collected::Whole(batches, reservations),
        Some(refusal) => {
            // Dropped, the reservations free what they held.
            drop(reservations);
            reservation.free();
            Collected::Refused {
                read: batches,
                rest,
                refusal,
            }
        }
    })
}

/// [`collect_or_refuse`], where a refusal is the pool's error: every batch
/// with rows, and the reservations of several streams' batches (the tests'
/// view of it).
#[cfg(test)]
async fn collect_streams(
    input: WholeInput,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<(Vec<RecordBatch>, Vec<MemoryReservation>)> {
    match collect_or_refuse(input, reservation, rows).await? {
        Collected::Whole(batches, reservations) => Ok((batches, reservations)),
        Collected::Refused { refusal, .. } => Err(refusal),
    }
}

/// [`collect_or_refuse`] with every batch of a whole input reserved in
/// `reservation` alone, however many streams were read.
pub(crate) async fn collect_or_refuse_into(
    inputs: WholeInput,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<Collected> {
    Ok(match collect_or_refuse(inputs, reservation, rows).await? {
        Collected::Whole(batches, input_reservations) => {
            for reserved in input_reservations {
                reservation.grow(reserved.free());
            }
            Collected::Whole(batches, Vec::new())
        }
        refused => refused,
    })
}

/// [`collect_streams`] with every batch reserved in `reservation` alone,
/// however many streams were read: for an operator that holds its input
/// as one, and frees it at once.
pub(crate) async fn collect_streams_into(
    inputs: WholeInput,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<Vec<RecordBatch>> {
    match collect_or_refuse_into(inputs, reservation, rows).await? {
        Collected::Whole(batches, _) => Ok(batches),
        Collected::Refused { refusal, .. } => Err(refusal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::hand_over::handed_over_input;
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::memory_pool::MemoryConsumer;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use datafusion::prelude::{SessionConfig, SessionContext};
    use futures::TryStreamExt;

    /// `partitions` partitions of `batches` batches of `rows` rows each,
    /// every value distinct, some batches empty.
    fn merge_of(partitions: usize, batches: usize, rows: usize) -> CoalescePartitionsExec {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let parts: Vec<Vec<RecordBatch>> = (0..partitions)
            .map(|p| {
                (0..batches)
                    .map(|b| {
                        let len = if b % 7 == 3 { 0 } else { rows };
                        let first = ((p * batches + b) * rows) as i64;
                        RecordBatch::try_new(
                            Arc::clone(&schema),
                            vec![Arc::new(Int64Array::from_iter_values(
                                first..first + len as i64,
                            ))],
                        )
                        .unwrap()
                    })
                    .collect()
            })
            .collect();
        let source = MemorySourceConfig::try_new_exec(&parts, schema, None).unwrap();
        CoalescePartitionsExec::new(source)
    }

    fn sorted_values(batches: &[RecordBatch]) -> Vec<i64> {
        let mut values: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        values.sort_unstable();
        values
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn merge_inputs_in_groups_hands_on_every_row_of_every_partition_once() {
        let context = SessionContext::new().task_ctx();
        // Groups end by batch count (many small batches) and by rows (few
        // large ones); one partition, and none with rows.
        for (partitions, batches, rows) in [(5, 200, 10), (3, 4, 300_000), (1, 1, 5), (4, 0, 1)] {
            let merge = merge_of(partitions, batches, rows);
            let stream = merge_inputs_in_groups(&merge, &context).unwrap();
            assert_eq!(stream.schema(), merge.schema());
            let got: Vec<RecordBatch> = stream.try_collect().await.unwrap();
            assert!(got.iter().all(|b| b.num_rows() > 0));
            let expected: Vec<i64> = (0..partitions * batches)
                .filter(|b| b % batches.max(1) % 7 != 3)
                .flat_map(|b| (b * rows) as i64..((b + 1) * rows) as i64)
                .collect();
            assert_eq!(
                sorted_values(&got),
                expected,
                "{partitions} x {batches} x {rows}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_sends_an_input_error_and_stops() {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let (mut sender, receiver) = mpsc::channel::<Result<Vec<RecordBatch>>>(2);
        let failing: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            futures::stream::iter(vec![
                Ok(batch.clone()),
                Err(DataFusionError::Execution("the scan failed".into())),
                Ok(batch),
            ]),
        ));
        read_in_groups(failing, sender.clone()).await;
        sender.close_channel();
        let groups: Vec<Result<Vec<RecordBatch>>> = receiver.collect().await;
        // The error, and nothing after it: the batch before it was still
        // in its group.
        assert_eq!(groups.len(), 1);
        let error = groups[0].as_ref().unwrap_err().to_string();
        assert!(error.contains("the scan failed"), "{error}");
    }

    /// Two columns, `k` and `v = 10 k`, in `partitions` partitions of
    /// batches of the given lengths (0: an empty batch), `k` counting up
    /// over all of them.
    fn stored_partitions(
        partitions: usize,
        lengths: &[usize],
    ) -> (SchemaRef, Vec<Vec<RecordBatch>>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let mut next = 0i64;
        let parts = (0..partitions)
            .map(|_| {
                lengths
                    .iter()
                    .map(|&len| {
                        let k: Vec<i64> = (next..next + len as i64).collect();
                        next += len as i64;
                        let v: Vec<i64> = k.iter().map(|k| k * 10).collect();
                        RecordBatch::try_new(
                            Arc::clone(&schema),
                            vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
                        )
                        .unwrap()
                    })
                    .collect()
            })
            .collect();
        (schema, parts)
    }

    /// What the plan's own streams hand on, partition by partition, empty
    /// batches left out.
    async fn streamed(
        plan: &Arc<dyn ExecutionPlan>,
        partitions: Range<usize>,
        context: &Arc<TaskContext>,
    ) -> Vec<RecordBatch> {
        let mut batches = Vec::new();
        for partition in partitions {
            let stream = plan.execute(partition, Arc::clone(context)).unwrap();
            let part: Vec<RecordBatch> = stream.try_collect().await.unwrap();
            batches.extend(part.into_iter().filter(|b| b.num_rows() > 0));
        }
        batches
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_in_memory_are_taken_as_the_scan_would_hand_them_on() {
        // Batches shorter than, as long as and longer than a batch (sliced
        // then), empty ones; with and without a projection.
        let context =
            SessionContext::new_with_config(SessionConfig::new().with_batch_size(100)).task_ctx();
        let (schema, parts) = stored_partitions(3, &[40, 0, 100, 250, 7]);
        for projection in [None, Some(vec![1]), Some(vec![1, 0])] {
            let plan: Arc<dyn ExecutionPlan> =
                MemorySourceConfig::try_new_exec(&parts, Arc::clone(&schema), projection.clone())
                    .unwrap();
            let merge = CoalescePartitionsExec::new(Arc::clone(&plan));
            for (read_through, partition, expected_partitions) in
                [(Some(&merge), 0, 0..3), (None, 1, 1..2)]
            {
                let input = WholeInput::execute(&plan, read_through, partition, &context).unwrap();
                let WholeInput::InMemory(in_memory) = input else {
                    panic!("a scan of batches in memory was streamed ({projection:?})");
                };
                let (batches, bytes) = in_memory.take().await.unwrap();
                let expected = streamed(&plan, expected_partitions.clone(), &context).await;
                assert_eq!(batches, expected, "{projection:?}, {expected_partitions:?}");
                assert!(batches.iter().all(|b| (1..=100).contains(&b.num_rows())));
                // Each stored batch with rows counted once, not once a slice.
                let stored_bytes: usize = parts[expected_partitions]
                    .iter()
                    .flatten()
                    .filter(|b| b.num_rows() > 0)
                    .map(|b| match &projection {
                        Some(columns) => b.project(columns).unwrap().get_array_memory_size(),
                        None => b.get_array_memory_size(),
                    })
                    .sum();
                assert_eq!(bytes, stored_bytes);

                // Collected, they are counted, but not reserved again: the
                // table holds them, and taking them allocates nothing.
                let pool = context.memory_pool();
                let reservation = MemoryConsumer::new("test").register(pool);
                let rows = Count::new();
                let input = WholeInput::execute(&plan, read_through, partition, &context).unwrap();
                let (collected, others) = collect_streams(input, &reservation, Some(&rows))
                    .await
                    .unwrap();
                assert_eq!(collected, expected);
                assert!(others.is_empty());
                assert!(stored_bytes > 0);
                assert_eq!(reservation.size(), 0);
                assert_eq!(
                    rows.value(),
                    expected.iter().map(|b| b.num_rows()).sum::<usize>()
                );
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_inputs_and_limited_scans_are_streamed() {
        let context = SessionContext::new().task_ctx();
        let (schema, parts) = stored_partitions(2, &[30, 30]);
        // A scan with a limit stops early: its streams apply it.
        let limited = MemorySourceConfig::try_new(&parts, Arc::clone(&schema), None)
            .unwrap()
            .with_limit(Some(10));
        let limited: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(limited);
        // Any other plan, here a merge of the scan.
        let merged: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(
            MemorySourceConfig::try_new_exec(&parts, Arc::clone(&schema), None).unwrap(),
        ));
        for plan in [limited, merged] {
            let input = WholeInput::execute(&plan, None, 0, &context).unwrap();
            let WholeInput::Streams(streams) = input else {
                panic!("{} was taken from memory", plan.name());
            };
            assert_eq!(streams.len(), 1);
            let reservation = MemoryConsumer::new("test").register(context.memory_pool());
            let (batches, _) = collect_streams(WholeInput::Streams(streams), &reservation, None)
                .await
                .unwrap();
            let expected = streamed(&plan, 0..1, &context).await;
            // A merge hands its partitions' batches on in whatever order
            // they come: the same batches, in any order.
            let in_one_order = |mut batches: Vec<RecordBatch>| {
                batches.sort_by_cached_key(|batch| format!("{batch:?}"));
                batches
            };
            assert_eq!(in_one_order(batches), in_one_order(expected));
        }
    }

    /// A stream of `batches` batches of `rows` distinct values each.
    fn stream_of(batches: usize, rows: usize, first: i64) -> SendableRecordBatchStream {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batches: Vec<Result<RecordBatch>> = (0..batches)
            .map(|b| {
                let start = first + (b * rows) as i64;
                Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int64Array::from_iter_values(
                        start..start + rows as i64,
                    ))],
                )
                .unwrap())
            })
            .collect();
        Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches),
        ))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_input_hands_on_what_was_read_and_the_rest() {
        // Batches of 8,000 bytes and more against a pool of 50,000: one
        // stream, and three read at once; every row once, in order within
        // each stream, and nothing left reserved.
        for streams in [1usize, 3] {
            let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> = Arc::new(
                datafusion::execution::memory_pool::GreedyMemoryPool::new(50_000),
            );
            let reservation = MemoryConsumer::new("test").register(&pool);
            let inputs: Vec<SendableRecordBatchStream> = (0..streams)
                .map(|s| stream_of(20, 1_000, (s * 100_000) as i64))
                .collect();
            let schema = inputs[0].schema();
            let rows = Count::new();
            let collected =
                collect_or_refuse(WholeInput::Streams(inputs), &reservation, Some(&rows))
                    .await
                    .unwrap();
            let Collected::Refused {
                read,
                rest,
                refusal,
            } = collected
            else {
                panic!("{streams} streams of 160 KB each held in a pool of 50 KB");
            };
            assert!(
                matches!(refusal, DataFusionError::ResourcesExhausted(_)),
                "{refusal}"
            );
            assert_eq!(reservation.size(), 0);
            assert_eq!(pool.reserved(), 0);
            assert!(
                !read.is_empty() && read.len() < 20 * streams,
                "{} read",
                read.len()
            );
            assert_eq!(
                rows.value(),
                read.iter().map(|b| b.num_rows()).sum::<usize>()
            );
            let source = handed_over_input(schema, read, rest).unwrap();
            let context = SessionContext::new().task_ctx();
            let all: Vec<RecordBatch> = source
                .execute(0, Arc::clone(&context))
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            let expected: Vec<i64> = (0..streams as i64)
                .flat_map(|s| s * 100_000..s * 100_000 + 20_000)
                .collect();
            assert_eq!(sorted_values(&all), expected, "{streams} streams");
            if streams == 1 {
                // One stream: in its order.
                let values: Vec<i64> = all
                    .iter()
                    .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                    .collect();
                assert_eq!(values, expected);
            }
            // Read once: a second execution is an error, not the rows again.
            let again: Result<Vec<RecordBatch>> =
                source.execute(0, context).unwrap().try_collect().await;
            assert!(again.is_err());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn collect_streams_returns_the_pools_refusal() {
        let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> = Arc::new(
            datafusion::execution::memory_pool::GreedyMemoryPool::new(50_000),
        );
        let reservation = MemoryConsumer::new("test").register(&pool);
        let input = WholeInput::Streams(vec![stream_of(20, 1_000, 0)]);
        let error = collect_streams(input, &reservation, None)
            .await
            .unwrap_err();
        assert!(
            matches!(error, DataFusionError::ResourcesExhausted(_)),
            "{error}"
        );
        // Held, the input fits: every batch, all reserved.
        let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> = Arc::new(
            datafusion::execution::memory_pool::GreedyMemoryPool::new(1 << 20),
        );
        let reservation = MemoryConsumer::new("test").register(&pool);
        let input = WholeInput::Streams(vec![stream_of(20, 1_000, 0)]);
        let (batches, others) = collect_streams(input, &reservation, None).await.unwrap();
        assert_eq!(batches.len(), 20);
        assert!(others.is_empty());
        assert_eq!(
            reservation.size(),
            batches
                .iter()
                .map(|b| b.get_array_memory_size())
                .sum::<usize>()
        );
    }
}
