//! The buffers of Arrow arrays, read in place. A primitive array's values
//! are taken from the array itself: asking each batch's array for its
//! `ArrayData` clones its type and buffers, a cost that adds up over the
//! thousands of batches of a large side, where a join or an aggregation
//! looks at every batch several times.

use datafusion::arrow::array::{downcast_primitive_array, Array};
use datafusion::arrow::buffer::Buffer;

/// The bytes of the values of a column of fixed `width` (bytes a value),
/// NULL slots included, in place in its Arrow buffer (sliced to its rows).
pub(crate) fn value_buffer(column: &dyn Array, width: usize) -> Buffer {
    downcast_primitive_array!(
        column => column.values().inner().clone(),
        _ => {
            let data = column.to_data();
            data.buffers()[0].slice_with_length(data.offset() * width, data.len() * width)
        }
    )
}

/// Whether `holds` is true of every buffer `ArrayData::buffers` lists for
/// `column` (not its validity, nor its children's): for a primitive
/// column, its values sliced to its rows; for another, each buffer whole.
pub(crate) fn all_buffers(column: &dyn Array, holds: impl FnMut(&Buffer) -> bool) -> bool {
    match column.data_type().primitive_width() {
        Some(width) => [value_buffer(column, width)].iter().all(holds),
        None => column.to_data().buffers().iter().all(holds),
    }
}

/// The address of the first value of `column`'s first buffer (its values
/// for a primitive column), or `None` where it has no buffer.
pub(crate) fn first_value_address(column: &dyn Array) -> Option<usize> {
    match column.data_type().primitive_width() {
        Some(width) => Some(value_buffer(column, width).as_ptr() as usize),
        None => {
            let data = column.to_data();
            data.buffers()
                .first()
                .map(|buffer| buffer.as_ptr() as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Decimal128Array, Int16Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn values_and_addresses_of_sliced_columns_match_their_array_data() {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int16Array::from(vec![1, 2, 3, 4]).slice(1, 2)),
            Arc::new(
                Decimal128Array::from(vec![1i128, -2, 3])
                    .with_precision_and_scale(20, 2)
                    .unwrap()
                    .slice(2, 1),
            ),
            Arc::new(StringArray::from(vec!["a", "bc"]).slice(1, 1)),
        ];
        for column in &columns {
            let data = column.to_data();
            let width = column.data_type().primitive_width().unwrap_or(0);
            let first = data.buffers()[0].as_ptr() as usize + data.offset() * width;
            assert_eq!(first_value_address(column.as_ref()), Some(first));
            let mut seen = Vec::new();
            assert!(all_buffers(column.as_ref(), |b| {
                seen.push(b.as_ptr() as usize);
                true
            }));
            assert_eq!(seen[0], first);
            if width > 0 {
                let bytes = value_buffer(column.as_ref(), width);
                assert_eq!(bytes.len(), column.len() * width);
            } else {
                assert_eq!(seen.len(), data.buffers().len());
            }
        }
        assert!(!all_buffers(columns[0].as_ref(), |_| false));
    }
}
