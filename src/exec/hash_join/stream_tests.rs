use super::*;
use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};

#[test]
fn a_batch_counts_the_bytes_of_its_own_rows() {
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..1000).map(|i| format!("{i:08}")),
    ));
    let batch = RecordBatch::try_from_iter([("i", ints), ("s", strings)]).unwrap();
    // 8 bytes an integer; 8 bytes of text and a 4-byte offset a string.
    let whole = rows_bytes(&batch).unwrap();
    assert!(
        (8 * 1000 + 12 * 1000..=8 * 1000 + 12 * 1000 + 8).contains(&whole),
        "{whole}"
    );
    // A slice counts its rows only, not the buffers it shares.
    let slice = rows_bytes(&batch.slice(100, 10)).unwrap();
    assert!(
        (8 * 10 + 12 * 10..=8 * 10 + 12 * 10 + 8).contains(&slice),
        "{slice}"
    );
}

#[test]
fn a_batch_counts_its_string_and_binary_values_with_32_bit_offsets() {
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..1000).map(|i| format!("{i:08}")),
    ));
    let binary: ArrayRef = Arc::new(datafusion::arrow::array::BinaryArray::from_iter_values(
        (0..1000).map(|i: u32| i.to_le_bytes()),
    ));
    let large: ArrayRef = Arc::new(datafusion::arrow::array::LargeStringArray::from_iter_values(
        (0..1000).map(|i| format!("{i:08}")),
    ));
    let batch = RecordBatch::try_from_iter([
        ("i", ints),
        ("s", strings),
        ("b", binary),
        ("l", large),
    ])
    .unwrap();
    // 8 bytes a string, 4 a binary value; integers and 64-bit offsets not.
    assert_eq!(offset_value_bytes(&batch), 12 * 1000);
    // A slice counts its own rows' values.
    assert_eq!(offset_value_bytes(&batch.slice(990, 10)), 12 * 10);
    assert_eq!(offset_value_bytes(&batch.slice(0, 0)), 0);
}
