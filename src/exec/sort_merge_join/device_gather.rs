//! Output columns gathered on the device (seed 002's gather by row id):
//! for an inner join without a residual filter, every pair is an output
//! row, so each 8-byte column without NULLs is copied to the device once,
//! gathered there by the pairs' row ids, and copied back whole, instead of
//! being gathered row by row on the host, where random reads from a large
//! side dominate the join. Other columns (NULLs, variable or other widths)
//! are taken on the host from the same pairs.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use datafusion::arrow::array::ArrayData;
use datafusion::arrow::array::{make_array, Array, ArrayRef, UInt64Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::error::Result;

use crate::exec::hash_join::take_rows;
use crate::gpu::launch;
use crate::gpu::{
    download_u64, upload_u64, DeviceVec, DriverResultExt, GpuDevice, GpuResult, Phase, PhaseTimer,
};
use crate::ops::merge_join::DevicePairs;

/// Whether the join's output rows are exactly its pairs, so columns can be
/// gathered by pair.
pub(crate) fn gathers_by_pair(join_type: JoinType, has_filter: bool) -> bool {
    join_type == JoinType::Inner && !has_filter
}

/// Whether `column` is gathered on the device: fixed width of 8 bytes,
/// no NULLs.
fn on_device(column: &ArrayRef) -> bool {
    column.data_type().primitive_width() == Some(8)
        && column.null_count() == 0
        && column.to_data().buffers().len() == 1
}

/// `f` over the 8-byte values of a column [`on_device`] accepts, read in
/// place from its Arrow buffer.
fn with_words<R>(column: &ArrayRef, f: impl FnOnce(&[u64]) -> R) -> R {
    let data = column.to_data();
    let bytes = data.buffers()[0].slice_with_length(data.offset() * 8, data.len() * 8);
    f(bytes.typed_data::<u64>())
}

/// The output columns of an inner join (the left's, then the right's):
/// those gathered on the device, resident there.
pub(crate) struct DeviceColumns {
    /// Per output column, its copy on the device, or `None` (host).
    columns: Vec<Option<DeviceVec<u64>>>,
}

impl DeviceColumns {
    /// Device bytes for the columns of `left` and `right` that go to the
    /// device, and the gather buffers of `max_pairs` rows.
    pub(crate) fn device_bytes(left: &RecordBatch, right: &RecordBatch, max_pairs: usize) -> usize {
        let resident: usize = [left, right]
            .iter()
            .flat_map(|batch| batch.columns())
            .filter(|c| on_device(c))
            .map(|c| 8 * c.len())
            .sum();
        resident + 2 * 8 * max_pairs
    }

    /// Copies the device columns of `left` and `right`; `None` when no
    /// column qualifies.
    pub(crate) fn upload(
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        left: &RecordBatch,
        right: &RecordBatch,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<Self>> {
        let mut columns = Vec::new();
        for column in left.columns().iter().chain(right.columns()) {
            columns.push(if on_device(column) && !column.is_empty() {
                Some(with_words(column, |words| {
                    upload_u64(device, stream, words, timer)
                })?)
            } else {
                None
            });
        }
        Ok(columns
            .iter()
            .any(Option::is_some)
            .then_some(Self { columns }))
    }

    /// The output columns of one range of pairs: `streamed_row_ids` (the
    /// left side's row ids in key order) turns the pairs' positions into
    /// left rows. Device failures are returned as the outer error, host
    /// ones as the inner.
    pub(crate) fn gather(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        pairs: &DevicePairs<'_>,
        streamed_row_ids: &DeviceVec<u64>,
        (left, right): (&RecordBatch, &RecordBatch),
        timer: &mut PhaseTimer,
    ) -> GpuResult<Result<Vec<ArrayRef>>> {
        let len = pairs.len;
        let kernels = device.kernels();
        // SAFETY (both): gather_u64 writes the first `len` elements, and
        // only those are read.
        let mut left_ids = unsafe { stream.alloc::<u64>(len) }.during("allocating gather ids")?;
        let mut gathered =
            unsafe { stream.alloc::<u64>(len) }.during("allocating gathered values")?;
        timer.time(Phase::Kernel, || {
            launch::gather_u64(
                kernels,
                stream,
                device.sm_count(),
                streamed_row_ids,
                pairs.positions,
                len,
                &mut left_ids,
            )
        })?;
        let left_columns = left.num_columns();
        let mut host_ids: Option<(UInt64Array, UInt64Array)> = None;
        let mut out = Vec::with_capacity(self.columns.len());
        for (i, resident) in self.columns.iter().enumerate() {
            let (batch, column) = if i < left_columns {
                (left, i)
            } else {
                (right, i - left_columns)
            };
            let source = batch.column(column);
            match resident {
                Some(values) => {
                    let ids = if i < left_columns {
                        &left_ids
                    } else {
                        pairs.other_ids
                    };
                    timer.time(Phase::Kernel, || {
                        launch::gather_u64(
                            kernels,
                            stream,
                            device.sm_count(),
                            values,
                            ids,
                            len,
                            &mut gathered,
                        )
                    })?;
                    let mut host = Vec::new();
                    download_u64(device, stream, &gathered.slice(..len), &mut host, timer)?;
                    let data = ArrayData::builder(source.data_type().clone())
                        .len(len)
                        .add_buffer(Buffer::from_vec(host))
                        .build();
                    match data {
                        Ok(data) => out.push(make_array(data)),
                        Err(e) => return Ok(Err(e.into())),
                    }
                }
                None => {
                    if host_ids.is_none() {
                        let (mut l, mut r) = (Vec::new(), Vec::new());
                        download_u64(device, stream, &left_ids.slice(..len), &mut l, timer)?;
                        download_u64(device, stream, &pairs.other_ids.slice(..len), &mut r, timer)?;
                        host_ids = Some((UInt64Array::from(l), UInt64Array::from(r)));
                    }
                    let (l, r) = host_ids.as_ref().expect("set above");
                    let ids = if i < left_columns { l } else { r };
                    match take_rows(source, ids) {
                        Ok(column) => out.push(column),
                        Err(e) => return Ok(Err(e)),
                    }
                }
            }
        }
        Ok(Ok(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};

    fn arr<A: Array + 'static>(a: A) -> ArrayRef {
        Arc::new(a)
    }

    #[test]
    fn only_8_byte_columns_without_nulls_go_to_the_device() {
        assert!(on_device(&arr(Int64Array::from(vec![1, 2]))));
        assert!(on_device(&arr(Float64Array::from(vec![1.5]))));
        assert!(!on_device(&arr(Int64Array::from(vec![Some(1), None]))));
        assert!(!on_device(&arr(Int32Array::from(vec![1]))));
        assert!(!on_device(&arr(StringArray::from(vec!["a"]))));
        assert!(gathers_by_pair(JoinType::Inner, false));
        assert!(!gathers_by_pair(JoinType::Inner, true));
        assert!(!gathers_by_pair(JoinType::Left, false));
    }

    #[test]
    fn words_are_the_values_of_a_slice_bit_for_bit() {
        let column = arr(Int64Array::from(vec![5, -1, 7, 9])).slice(1, 2);
        assert_eq!(with_words(&column, <[u64]>::to_vec), vec![u64::MAX, 7]);
        let floats = arr(Float64Array::from(vec![0.5, -2.0]));
        assert_eq!(
            with_words(&floats, <[u64]>::to_vec),
            vec![0.5f64.to_bits(), (-2.0f64).to_bits()]
        );
    }
}
