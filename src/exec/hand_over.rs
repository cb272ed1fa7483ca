//! Handing an input an operator began to read on to another operator
//! (DataFusion's, where the GPU node falls back): the batches read, then
//! the rest of each stream, as one partition of a plan node.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, Array, ArrayRef, AsArray, MutableArrayData};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::StreamExt;

/// A scan of an input an operator began to read and hands on whole to
/// another (DataFusion's, after [`super::collect::Collected::Refused`]):
/// one partition, the batches read first, then the rest of each stream as
/// they come, small slices of large buffers copied (see [`compacted`]).
/// Executed once; a second execution is an error.
pub(crate) fn handed_over_input(
    schema: SchemaRef,
    read: Vec<RecordBatch>,
    rest: Vec<SendableRecordBatchStream>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let stream = futures::stream::iter(read.into_iter().map(Ok))
        .chain(futures::stream::select_all(rest))
        .map(|batch| batch.and_then(compacted));
    let stream: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), stream));
    let partition = HandedOver {
        schema: Arc::clone(&schema),
        stream: std::sync::Mutex::new(Some(stream)),
    };
    Ok(Arc::new(StreamingTableExec::try_new(
        schema,
        vec![Arc::new(partition)],
        None,
        Vec::new(),
        false,
        None,
    )?))
}

/// A slice this much smaller than the buffers it holds on to, and at
/// least [`MIN_BYTES_FREED`] smaller, is copied by [`compacted`].
const HELD_TO_USED: usize = 4;
const MIN_BYTES_FREED: usize = 1 << 20;

/// `batch` with each column that is a small slice of much larger buffers
/// (a table's column cut into batches) copied into buffers of its own.
/// DataFusion's spilling operators charge a batch's buffers whole, so such
/// a slice is charged as the whole column, however few rows it holds: a
/// sort under a small memory pool is then refused memory for one batch,
/// where the repartition the GPU node replaced would have handed it new
/// arrays. Other columns are handed on as they are.
fn compacted(batch: RecordBatch) -> Result<RecordBatch> {
    let oversized = |column: &ArrayRef| {
        let held = column.get_array_memory_size();
        let used = match column.data_type() {
            DataType::Utf8View => 16 * column.len() + column.as_string_view().total_bytes_len(),
            DataType::BinaryView => 16 * column.len() + column.as_binary_view().total_bytes_len(),
            DataType::Dictionary(..) | DataType::Struct(_) | DataType::Union(..) => held,
            _ => column.to_data().get_slice_memory_size().unwrap_or(held),
        };
        held > HELD_TO_USED * used && held - used >= MIN_BYTES_FREED
    };
    if !batch.columns().iter().any(oversized) {
        return Ok(batch);
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|column| -> Result<ArrayRef> {
            Ok(match column.data_type() {
                _ if !oversized(column) => Arc::clone(column),
                DataType::Utf8View => Arc::new(column.as_string_view().gc()),
                DataType::BinaryView => Arc::new(column.as_binary_view().gc()),
                _ => {
                    let data = column.to_data();
                    let mut copy = MutableArrayData::new(vec![&data], false, data.len());
                    copy.try_extend(0, 0, data.len())?;
                    make_array(copy.freeze())
                }
            })
        })
        .collect::<Result<_>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(batch.schema(), columns, &options)?)
}

/// The one partition of [`handed_over_input`].
struct HandedOver {
    schema: SchemaRef,
    stream: std::sync::Mutex<Option<SendableRecordBatchStream>>,
}

impl std::fmt::Debug for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandedOver").finish_non_exhaustive()
    }
}

impl PartitionStream for HandedOver {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().ok().and_then(|mut stream| stream.take());
        taken.unwrap_or_else(|| {
            let error = DataFusionError::Internal("an input handed over was read twice".into());
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::once(async { Err(error) }),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::common::utils::memory::get_record_batch_memory_size;
    use datafusion::prelude::SessionContext;
    use futures::TryStreamExt;

    /// Batches cut from one table's columns are handed over in buffers of
    /// their own, so DataFusion's operators charge each for its rows; a
    /// column already of its own size is handed on as it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handed_over_slices_of_large_columns_are_copied() {
        let rows = 1_000_000usize;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
            Field::new("v", DataType::Utf8View, false),
            Field::new("own", DataType::Int64, false),
        ]));
        let k = Int64Array::from_iter((0..rows as i64).map(|i| (i % 7 != 0).then_some(i)));
        let text = |i: usize| format!("value number {i} of the column");
        let s = datafusion::arrow::array::StringArray::from_iter_values((0..rows).map(text));
        let v = datafusion::arrow::array::StringViewArray::from_iter_values((0..rows).map(text));
        let table = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(k),
                Arc::new(s),
                Arc::new(v),
                Arc::new(Int64Array::from(vec![0i64; rows])),
            ],
        )
        .unwrap();
        let size = 8_192;
        let slices: Vec<RecordBatch> = (0..rows)
            .step_by(size)
            .map(|at| {
                let batch = table.slice(at, size.min(rows - at));
                // `own`: a column of the batch's own size.
                let own = Int64Array::from_iter_values(0..batch.num_rows() as i64);
                let mut columns = batch.columns().to_vec();
                columns[3] = Arc::new(own);
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect();
        let (read, rest) = slices.split_at(40);
        let rest: Vec<Result<RecordBatch>> = rest.iter().cloned().map(Ok).collect();
        let rest = Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&schema),
            futures::stream::iter(rest),
        ));
        let source = handed_over_input(Arc::clone(&schema), read.to_vec(), vec![rest]).unwrap();
        let context = SessionContext::new().task_ctx();
        let got: Vec<RecordBatch> = source.execute(0, context).unwrap().try_collect().await.unwrap();
        assert_eq!(got.len(), slices.len());
        for (got, sliced) in got.iter().zip(&slices) {
            assert_eq!(got, sliced);
            // Each string at most 36 bytes, and an offset or view each.
            let bound = 64 * 1024 + got.num_rows() * (8 + 4 + 36 + 16 + 36 + 8);
            assert!(
                get_record_batch_memory_size(got) < bound,
                "{} bytes held for {} rows",
                get_record_batch_memory_size(got),
                got.num_rows()
            );
            assert!(get_record_batch_memory_size(sliced) > 8 * rows);
            let own = |b: &RecordBatch| b.column(3).to_data().buffers()[0].as_ptr();
            assert_eq!(own(got), own(sliced), "a column of its own size copied");
        }
    }
}
