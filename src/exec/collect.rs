//! Reading an operator's whole input: one stream, or every input partition
//! of a merge below it (`CoalescePartitionsExec`), each in a task of its
//! own, as the merge would read them (a scan below decodes as it is
//! polled), without the merge's channel hand-off per batch: 8,192 batches
//! passed one by one to a single consumer took about 19 ms.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;

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
