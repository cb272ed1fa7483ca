//! Reading an operator's whole input: one stream, or every input partition
//! of a merge below it (`CoalescePartitionsExec`), each in a task of its
//! own, as the merge would read them (a scan below decodes as it is
//! polled), without the merge's channel hand-off per batch: 8,192 batches
//! passed one by one to a single consumer took about 19 ms. An input read
//! as it goes (a join's probe side) comes through in groups of batches
//! instead ([`merge_inputs_in_groups`]).

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
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

/// Every batch with rows of `input`, each reserved in `reservation` (and
/// its rows counted in `rows`) as it arrives.
pub(crate) async fn collect_stream(
    mut input: SendableRecordBatchStream,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    while let Some(batch) = input.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        reservation.try_grow(batch.get_array_memory_size())?;
        if let Some(rows) = rows {
            rows.add(batch.num_rows());
        }
        batches.push(batch);
    }
    Ok(batches)
}

/// One input's batches and the reservation that holds them.
type CollectedInput = (Vec<RecordBatch>, MemoryReservation);

/// Every batch with rows of every stream of `inputs`, input by input (each
/// input's batches together, in their order): one stream in this task;
/// several each in a task of its own. The batches of several streams are
/// reserved in reservations of their own, returned to be held as long as
/// the batches.
pub(crate) async fn collect_streams(
    mut inputs: Vec<SendableRecordBatchStream>,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<(Vec<RecordBatch>, Vec<MemoryReservation>)> {
    if inputs.len() == 1 {
        let input = inputs.pop().expect("one input");
        return Ok((collect_stream(input, reservation, rows).await?, Vec::new()));
    }
    let tasks: Vec<SpawnedTask<Result<CollectedInput>>> = inputs
        .into_iter()
        .map(|input| {
            let reservation = reservation.new_empty();
            let rows = rows.cloned();
            SpawnedTask::spawn(async move {
                let batches = collect_stream(input, &reservation, rows.as_ref()).await?;
                Ok((batches, reservation))
            })
        })
        .collect();
    let mut batches = Vec::new();
    let mut reservations = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (part, reserved) = task.join().await.map_err(|e| {
            DataFusionError::Execution(format!("a task reading input failed: {e}"))
        })??;
        batches.extend(part);
        reservations.push(reserved);
    }
    Ok((batches, reservations))
}

/// [`collect_streams`] with every batch reserved in `reservation` alone,
/// however many streams were read: for an operator that holds its input
/// as one, and frees it at once.
pub(crate) async fn collect_streams_into(
    inputs: Vec<SendableRecordBatchStream>,
    reservation: &MemoryReservation,
    rows: Option<&Count>,
) -> Result<Vec<RecordBatch>> {
    let (batches, input_reservations) = collect_streams(inputs, reservation, rows).await?;
    for reserved in input_reservations {
        reservation.grow(reserved.free());
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use datafusion::prelude::SessionContext;
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
}
