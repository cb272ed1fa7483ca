//! Columns concatenated on many threads: a join's key columns are made
//! contiguous for the host to code them, and copying a large side on one
//! thread leaves most cores idle while every probe partition waits for it.

use datafusion::arrow::array::{make_array, Array, ArrayData, ArrayRef};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::concat;
use datafusion::error::Result;

use crate::gpu::zeroed_for_fill;
use crate::host::copy::copy_window;

/// Bytes one copying thread takes at least.
const BYTES_PER_THREAD: usize = 8 << 20;

/// One column's pieces concatenated: a column of a fixed-width type
/// without NULLs is copied on up to `threads` threads, each into its own
/// range of one buffer; any other by arrow. `None` for no pieces.
pub(crate) fn concat_column_in_parallel(
    arrays: &[&dyn Array],
    threads: usize,
) -> Result<Option<ArrayRef>> {
    match arrays {
        [] => Ok(None),
        [one] => Ok(Some(make_array(one.to_data()))),
        many => match concat_fixed_width(many, threads.max(1))? {
            Some(array) => Ok(Some(array)),
            None => Ok(Some(concat(many)?)),
        },
    }
}

/// The concatenation of `arrays` when they share a fixed-width primitive
/// type and hold no NULLs (one values buffer each), copied on up to
/// `threads` threads; `None` for any other column.
fn concat_fixed_width(arrays: &[&dyn Array], threads: usize) -> Result<Option<ArrayRef>> {
    let Some(first) = arrays.first() else {
        return Ok(None);
    };
    let data_type = first.data_type();
    let Some(width) = data_type.primitive_width() else {
        return Ok(None);
    };
    let data: Vec<ArrayData> = arrays.iter().map(|a| a.to_data()).collect();
    let plain = data
        .iter()
        .all(|d| d.data_type() == data_type && d.null_count() == 0 && d.buffers().len() == 1);
    if !plain || width == 0 {
        return Ok(None);
    }
    let pieces: Vec<&[u8]> = data
        .iter()
        .map(|d| &d.buffers()[0].as_slice()[d.offset() * width..(d.offset() + d.len()) * width])
        .collect();
    let rows: usize = data.iter().map(ArrayData::len).sum();
    // Zeroed lazily by the allocator: the pages are first touched by the
    // copying threads, in parallel.
    let mut target = zeroed_for_fill::<u8>(rows * width);
    copy_window(&mut target, &pieces, 0, threads, BYTES_PER_THREAD);
    let array = ArrayData::builder(data_type.clone())
        .len(rows)
        .add_buffer(Buffer::from_vec(target))
        .build()?;
    Ok(Some(make_array(array)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::arrow::record_batch::RecordBatch;
    use std::sync::Arc;

    fn batches(n: usize, rows: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int32, true),
            Field::new("c", DataType::Utf8, false),
            Field::new("d", DataType::Float64, false),
        ]));
        let batches = (0..n)
            .map(|i| {
                let base = (i * rows) as i64;
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(Int64Array::from_iter_values(base..base + rows as i64)),
                        Arc::new(Int32Array::from_iter((0..rows).map(|r| {
                            (r % 7 != 3).then_some((base as i32).wrapping_add(r as i32))
                        }))),
                        Arc::new(StringArray::from_iter_values(
                            (0..rows).map(|r| format!("s{}", base + r as i64)),
                        )),
                        Arc::new(Float64Array::from_iter_values(
                            (0..rows).map(|r| (base + r as i64) as f64 * 0.5),
                        )),
                    ],
                )
                .unwrap()
            })
            .collect();
        (schema, batches)
    }

    #[test]
    fn the_parallel_concatenation_equals_arrows() {
        // Sliced inputs too: a slice's offset must be honoured.
        for (n, rows) in [(1, 10), (3, 1000), (40, 300_000)] {
            let (schema, batches) = batches(n, rows);
            let sliced: Vec<RecordBatch> = batches
                .iter()
                .map(|b| b.slice(rows / 3, rows - rows / 3))
                .collect();
            for input in [&batches, &sliced] {
                for c in 0..schema.fields().len() {
                    let pieces: Vec<&dyn Array> =
                        input.iter().map(|b| b.column(c).as_ref()).collect();
                    let expected = concat(&pieces).unwrap();
                    for threads in [1, 2, 16] {
                        let got = concat_column_in_parallel(&pieces, threads)
                            .unwrap()
                            .unwrap();
                        assert_eq!(
                            got.to_data(),
                            expected.to_data(),
                            "column {c}: {n} batches of {rows}, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_fixed_width_columns_without_nulls_take_the_parallel_copy() {
        let (_, batches) = batches(2, 10);
        let column = |c: usize| -> Vec<&dyn Array> {
            batches.iter().map(|b| b.column(c).as_ref()).collect()
        };
        assert!(concat_fixed_width(&column(0), 4).unwrap().is_some());
        assert!(concat_fixed_width(&column(1), 4).unwrap().is_none());
        assert!(concat_fixed_width(&column(2), 4).unwrap().is_none());
        assert!(concat_fixed_width(&column(3), 4).unwrap().is_some());
        assert!(concat_fixed_width(&[], 4).unwrap().is_none());
    }
}
