//! Tables kept in page-locked host memory, which the device copies from
//! directly. An upload from ordinary (pageable) memory is staged through a
//! pinned buffer on the host's cores: that copy reads and writes every byte
//! once more, and on a 16-core host it, not the bus, sets the pace of a
//! large upload. Batches copied once into a pinned region with
//! [`pin_batches`] skip it: the upload finds their buffers in the region
//! registry and enqueues one direct copy per contiguous run.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, Array, ArrayData, ArrayRef, RecordBatch};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{gpu_runtime, region_holding, PinnedRegion};
use crate::host::array_buffers::{all_buffers, first_value_address};

/// Where each buffer begins inside a region: a multiple of this, which
/// satisfies every Arrow type's alignment. Buffers of 8-byte values whose
/// lengths are multiples of it (8 rows) therefore lie end to end, and a
/// column's run of such batches is one copy.
const BUFFER_ALIGNMENT: usize = 64;

/// Whether every buffer of `batch`'s columns lies in pinned host memory
/// made by [`pin_batches`] (child arrays of nested types are not pinned).
pub fn is_pinned(batch: &RecordBatch) -> bool {
    batch.columns().iter().all(|column| {
        all_buffers(column.as_ref(), |b| {
            b.is_empty() || region_holding(b.as_slice()).is_some()
        })
    })
}

/// Copies `batches` into one region of page-locked host memory and returns
/// them backed by it, column by column (each column's value buffers of all
/// batches first, end to end, then its other buffers), so that the device
/// copies a column in a few direct transfers instead of staging it through
/// a pinned buffer on the host. The batches read and compare like the
/// originals; the region is freed when the last of them is dropped. Meant
/// for tables that stay in memory and are queried many times (a
/// `MemTable`): pinning costs about as much as one staged upload, and
/// page-locked memory cannot be swapped out.
///
/// The batches must share one schema (a partition's do); others are an
/// error. Child arrays of nested types stay where they are. Without a GPU
/// the batches are returned as they are.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use datafusion::arrow::record_batch::RecordBatch;
/// # use datafusion::datasource::MemTable;
/// # fn demo(schema: datafusion::arrow::datatypes::SchemaRef, partitions: Vec<Vec<RecordBatch>>)
/// #     -> datafusion::error::Result<()> {
/// let pinned = partitions
///     .iter()
///     .map(|batches| datafusion_gpu::pin_batches(batches))
///     .collect::<datafusion::error::Result<Vec<_>>>()?;
/// let table = MemTable::try_new(schema, pinned)?;
/// # Ok(()) }
/// ```
pub fn pin_batches(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    let Some(first) = batches.first() else {
        return Ok(Vec::new());
    };
    if let Some(other) = batches.iter().find(|b| b.schema() != first.schema()) {
        return Err(DataFusionError::Plan(format!(
            "pin_batches: batches of one call must share a schema; {} and {} differ",
            first.schema(),
            other.schema()
        )));
    }
    let Ok(runtime) = gpu_runtime() else {
        return Ok(batches.to_vec());
    };
    let Some(device) = runtime.devices().into_iter().next() else {
        return Ok(batches.to_vec());
    };
    let columns = first.num_columns();
    // Per column, per batch: the array's data.
    let data: Vec<Vec<ArrayData>> = (0..columns)
        .map(|c| batches.iter().map(|b| b.column(c).to_data()).collect())
        .collect();
    let layout = buffer_layout(&data);
    let source = |(c, b, i): (usize, usize, usize)| -> &[u8] {
        let array = &data[c][b];
        match array.buffers().get(i) {
            Some(buffer) => buffer.as_slice(),
            None => array.nulls().map_or(&[], |n| n.buffer().as_slice()),
        }
    };
    let pieces: Vec<&[u8]> = layout.iter().map(|&at| source(at)).collect();
    let (region, offsets) = PinnedRegion::holding_copies(&device, &pieces, BUFFER_ALIGNMENT)
        .map_err(DataFusionError::from)?;
    let mut pinned: Vec<Vec<Vec<Option<Buffer>>>> = data
        .iter()
        .map(|per_batch| {
            per_batch
                .iter()
                .map(|d| vec![None; d.buffers().len() + 1])
                .collect()
        })
        .collect();
    for ((&(c, b, i), &offset), piece) in layout.iter().zip(&offsets).zip(&pieces) {
        let to = region.address_at(offset, piece.len()).ok_or_else(|| {
            DataFusionError::Internal(format!("{offset} is not within the pinned region"))
        })?;
        // SAFETY: the region holds a copy of `piece` at `to` (written before
        // the region was handed out), which stays valid and unchanged while
        // the region lives, and the buffer holds the region.
        let buffer = unsafe {
            Buffer::from_custom_allocation(to, piece.len(), Arc::clone(&region) as Arc<_>)
        };
        pinned[c][b][i] = Some(buffer);
    }
    let arrays = rebuilt_arrays(&data, pinned)?;
    batches
        .iter()
        .enumerate()
        .map(|(b, batch)| {
            let columns = arrays
                .iter()
                .map(|per_batch| Arc::clone(&per_batch[b]))
                .collect();
            Ok(RecordBatch::try_new(batch.schema(), columns)?)
        })
        .collect()
}

/// Every buffer of `data` (per column, per batch) as (column, batch,
/// index), in the order it is laid out: per column, the first buffer of
/// every batch (the values, for fixed-width types), then each batch's
/// others; index `buffers().len()` stands for the validity bitmap.
fn buffer_layout(data: &[Vec<ArrayData>]) -> Vec<(usize, usize, usize)> {
    let mut layout = Vec::new();
    for (c, per_batch) in data.iter().enumerate() {
        for (b, array) in per_batch.iter().enumerate() {
            if !array.buffers().is_empty() {
                layout.push((c, b, 0));
            }
        }
        for (b, array) in per_batch.iter().enumerate() {
            let count = array.buffers().len();
            layout.extend((1..count).map(|i| (c, b, i)));
            if array.nulls().is_some() {
                layout.push((c, b, count));
            }
        }
    }
    layout
}

/// The arrays of `data` (per column, per batch) rebuilt over their
/// `pinned` copies: per array, its buffers, then its validity bitmap.
fn rebuilt_arrays(
    data: &[Vec<ArrayData>],
    pinned: Vec<Vec<Vec<Option<Buffer>>>>,
) -> Result<Vec<Vec<ArrayRef>>> {
    data.iter()
        .zip(pinned)
        .map(|(per_batch, buffers)| {
            per_batch
                .iter()
                .zip(buffers)
                .map(|(array, mut buffers)| {
                    let nulls = buffers.pop().flatten();
                    let buffers: Vec<Buffer> = buffers.into_iter().flatten().collect();
                    let nulls = match (array.nulls(), nulls) {
                        (Some(old), Some(bits)) => Some(NullBuffer::new(BooleanBuffer::new(
                            bits,
                            old.offset(),
                            old.len(),
                        ))),
                        (old, _) => old.cloned(),
                    };
                    let rebuilt = array
                        .clone()
                        .into_builder()
                        .buffers(buffers)
                        .nulls(nulls)
                        .build()?;
                    Ok(make_array(rebuilt))
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect()
}

/// Where the first buffer of `batch`'s first column that has one starts:
/// sorting batches by it puts those that [`pin_batches`] laid end to end
/// back next to each other, so that their columns cross the bus in one copy
/// per region instead of one per batch.
pub(crate) fn first_buffer_address(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .find_map(|column| first_value_address(column.as_ref()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn batches_sliced_from_one_buffer_sort_back_into_its_order() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let whole = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..100)),
                Arc::new(StringArray::from_iter_values(
                    (0..100).map(|i| i.to_string()),
                )),
            ],
        )
        .unwrap();
        let mut batches: Vec<RecordBatch> = [3, 0, 2, 1]
            .into_iter()
            .map(|i| whole.slice(i * 25, 25))
            .collect();
        batches.sort_by_cached_key(first_buffer_address);
        let firsts: Vec<i64> = batches
            .iter()
            .map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .value(0)
            })
            .collect();
        assert_eq!(firsts, vec![0, 25, 50, 75]);
    }

    #[test]
    fn pinned_batches_read_like_their_originals_with_or_without_a_gpu() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batches: Vec<RecordBatch> = [5usize, 0, 1000]
            .iter()
            .map(|&rows| {
                let k: Vec<Option<i64>> = (0..rows as i64)
                    .map(|i| (i % 7 != 0).then_some(i * 3))
                    .collect();
                let s: Vec<String> = (0..rows).map(|i| format!("v{i}")).collect();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from(k)),
                    Arc::new(StringArray::from(s)),
                ];
                RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
            })
            .collect();
        let pinned = pin_batches(&batches).unwrap();
        assert_eq!(pinned, batches);
        // Pinned where a GPU is, left as they are where none is.
        let gpu = gpu_runtime().is_ok();
        assert!(pinned.iter().all(|b| is_pinned(b) == gpu));
        assert!(pin_batches(&[]).unwrap().is_empty());
        // Batches of different schemas: an error, not a panic.
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1i64]))],
        )
        .unwrap();
        let mixed = [batches[0].clone(), other];
        let error = pin_batches(&mixed).unwrap_err().to_string();
        assert!(error.contains("share a schema"), "{error}");
    }
}
