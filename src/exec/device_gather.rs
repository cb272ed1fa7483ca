//! Output columns gathered on the device (seed 002's gather by row id).
//! Where every pair of a join is an output row (an inner join without a
//! residual filter), each 8-byte output column without NULLs is copied to
//! the device once, gathered there by the pairs' row ids, and copied back
//! whole, instead of being gathered row by row on the host, where random
//! reads from a large side cost about what the CPU join itself does. Other
//! columns (NULLs, other widths, variable width) are taken on the host from
//! the same pairs.
//!
//! Shared by the hash join and the sort-merge join; the two sides are called
//! build and probe as in [`OutputAssembler`] (the sort-merge join's left and
//! right).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use datafusion::arrow::array::ArrayData;
use datafusion::arrow::array::{make_array, Array, ArrayRef, UInt64Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};

use crate::exec::hash_join::{take_rows, ColumnSource, OutputAssembler};
use crate::gpu::launch;
use crate::gpu::{
    download_u64, download_u64_pieces, upload_u64, DeviceVec, DriverResultExt, GpuDevice,
    GpuResult, Phase, PhaseTimer,
};

/// Whether the join's output rows are exactly its pairs, so columns can be
/// gathered by pair.
pub(crate) fn gathers_by_pair(join_type: JoinType, has_filter: bool) -> bool {
    join_type == JoinType::Inner && !has_filter
}

/// Whether columns of `data_type` can be gathered on the device (when they
/// hold no NULLs): 8-byte primitives, moved as plain words.
pub(crate) fn gatherable_type(data_type: &DataType) -> bool {
    data_type.primitive_width() == Some(8)
}

/// Whether `column` is gathered on the device: fixed width of 8 bytes,
/// no NULLs.
fn on_device(column: &ArrayRef) -> bool {
    gatherable_type(column.data_type())
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

/// The columns of one side's batch that are gathered on the device,
/// resident there.
#[derive(Debug)]
pub(crate) struct ResidentColumns {
    /// Per column of the batch, its copy on the device, or `None` (host).
    columns: Vec<Option<DeviceVec<u64>>>,
}

impl ResidentColumns {
    /// The columns of `batch` that `wanted` names and [`on_device`] accepts.
    fn chosen<'a>(
        batch: &'a RecordBatch,
        wanted: &'a [bool],
    ) -> impl Iterator<Item = (usize, bool)> + 'a {
        batch.columns().iter().enumerate().map(move |(i, c)| {
            (
                i,
                wanted.get(i).copied().unwrap_or(false) && on_device(c) && !c.is_empty(),
            )
        })
    }

    /// Device bytes of the columns of `batch` that [`Self::upload`] copies.
    pub(crate) fn device_bytes(batch: &RecordBatch, wanted: &[bool]) -> usize {
        Self::chosen(batch, wanted)
            .filter(|&(_, chosen)| chosen)
            .map(|_| 8 * batch.num_rows())
            .sum()
    }

    /// Copies the columns of `batch` that `wanted[i]` asks for and that can
    /// be gathered on the device.
    pub(crate) fn upload(
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        batch: &RecordBatch,
        wanted: &[bool],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (i, chosen) in Self::chosen(batch, wanted) {
            columns.push(if chosen {
                Some(with_words(batch.column(i), |words| {
                    upload_u64(device, stream, words, timer)
                })?)
            } else {
                None
            });
        }
        Ok(Self { columns })
    }

    /// Whether any column is on the device.
    pub(crate) fn any(&self) -> bool {
        self.columns.iter().any(Option::is_some)
    }

    fn get(&self, column: usize) -> Option<&DeviceVec<u64>> {
        self.columns.get(column).and_then(Option::as_ref)
    }
}

/// One side of the pairs being gathered.
pub(crate) struct GatherSide<'a> {
    /// The side's rows.
    pub(crate) batch: &'a RecordBatch,
    /// Its columns on the device.
    pub(crate) resident: &'a ResidentColumns,
    /// The side's row of each pair (the first `len` elements).
    pub(crate) ids: &'a DeviceVec<u64>,
}

/// Which columns of each side the output of `assembler` uses; `None` when
/// it has a column that is not a side's (a mark).
pub(crate) fn output_columns(
    assembler: &OutputAssembler,
    build_columns: usize,
    probe_columns: usize,
) -> Option<(Vec<bool>, Vec<bool>)> {
    let mut build = vec![false; build_columns];
    let mut probe = vec![false; probe_columns];
    for source in assembler.sources() {
        match *source {
            ColumnSource::Build(i) => *build.get_mut(i)? = true,
            ColumnSource::Probe(i) => *probe.get_mut(i)? = true,
            ColumnSource::Mark => return None,
        }
    }
    Some((build, probe))
}

/// The output batches of `len` pairs, in pair order: resident columns
/// gathered on the device, the others taken on the host with the row ids
/// downloaded once. Each batch owns its columns' memory (no batch holds a
/// slice of a larger buffer), so memory accounting downstream sees each
/// batch's own rows. Device failures are returned as the outer error, host
/// ones as the inner.
pub(crate) fn gather_batches(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    assembler: &OutputAssembler,
    build: &GatherSide<'_>,
    probe: &GatherSide<'_>,
    len: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Result<Vec<RecordBatch>>> {
    let batch_size = assembler.batch_size();
    let batches = len.div_ceil(batch_size);
    // Per output column, its pieces of `batch_size` rows.
    let mut columns: Vec<Vec<ArrayRef>> = Vec::with_capacity(assembler.sources().len());
    let mut gathered: Option<DeviceVec<u64>> = None;
    let mut host_ids: [Option<UInt64Array>; 2] = [None, None];
    for source in assembler.sources() {
        let (which, side, column) = match *source {
            ColumnSource::Build(i) => (0, build, i),
            ColumnSource::Probe(i) => (1, probe, i),
            ColumnSource::Mark => {
                return Ok(Err(DataFusionError::Internal(
                    "a mark column cannot be gathered by pair".into(),
                )))
            }
        };
        let source_column = side.batch.column(column);
        let mut pieces = Vec::with_capacity(batches);
        if let Some(values) = side.resident.get(column).filter(|_| len > 0) {
            let target = match &mut gathered {
                Some(target) => target,
                None => {
                    // SAFETY: gather_u64 writes the first `len` elements
                    // before each read of them below.
                    let buffer =
                        unsafe { stream.alloc::<u64>(len) }.during("allocating gathered values")?;
                    gathered.insert(buffer)
                }
            };
            timer.time(Phase::Kernel, || {
                launch::gather_u64(
                    device.kernels(),
                    stream,
                    device.sm_count(),
                    values,
                    side.ids,
                    len,
                    target,
                )
            })?;
            let words =
                download_u64_pieces(device, stream, &target.slice(..len), batch_size, timer)?;
            for words in words {
                let rows = words.len();
                let data = ArrayData::builder(source_column.data_type().clone())
                    .len(rows)
                    .add_buffer(Buffer::from_vec(words))
                    .build();
                match data {
                    Ok(data) => pieces.push(make_array(data)),
                    Err(e) => return Ok(Err(e.into())),
                }
            }
        } else {
            if host_ids[which].is_none() {
                let mut ids = Vec::new();
                if len > 0 {
                    download_u64(device, stream, &side.ids.slice(..len), &mut ids, timer)?;
                }
                host_ids[which] = Some(UInt64Array::from(ids));
            }
            let ids = host_ids[which].as_ref().expect("set above");
            for start in (0..len).step_by(batch_size) {
                let rows = batch_size.min(len - start);
                match take_rows(source_column, &ids.slice(start, rows)) {
                    Ok(piece) => pieces.push(piece),
                    Err(e) => return Ok(Err(e)),
                }
            }
        }
        columns.push(pieces);
    }
    Ok((0..batches)
        .map(|b| {
            let rows = batch_size.min(len - b * batch_size);
            let batch_columns = columns
                .iter()
                .map(|pieces| Arc::clone(&pieces[b]))
                .collect();
            assembler.batch_from_columns(batch_columns, rows)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

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

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter([
            ("a", arr(Int64Array::from(vec![1, 2]))),
            ("b", arr(Int64Array::from(vec![Some(1), None]))),
            ("c", arr(Int32Array::from(vec![1, 2]))),
            ("d", arr(Float64Array::from(vec![1.0, 2.0]))),
        ])
        .unwrap()
    }

    #[test]
    fn only_wanted_columns_that_qualify_count_as_device_bytes() {
        let batch = batch();
        assert_eq!(
            ResidentColumns::device_bytes(&batch, &[true, true, true, true]),
            2 * 8 * 2
        );
        assert_eq!(
            ResidentColumns::device_bytes(&batch, &[false, true, true, true]),
            8 * 2
        );
        assert_eq!(ResidentColumns::device_bytes(&batch, &[]), 0);
    }

    #[test]
    fn output_columns_follow_the_projection_and_refuse_a_mark() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("p1", datafusion::arrow::datatypes::DataType::Int64, false),
            Field::new("b0", datafusion::arrow::datatypes::DataType::Int64, false),
        ]));
        let assembler = OutputAssembler::new(
            Arc::clone(&schema),
            JoinType::Inner,
            Some(&[3, 0]),
            2,
            2,
            10,
        );
        assert_eq!(
            output_columns(&assembler, 2, 2),
            Some((vec![true, false], vec![false, true]))
        );
        let mark = OutputAssembler::new(schema, JoinType::LeftMark, None, 1, 0, 10);
        assert_eq!(output_columns(&mark, 1, 0), None);
    }
}
