use super::*;
use datafusion::arrow::array::{
    BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float64Array, Int16Array,
    Int32Array, Int64Array, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};

use datafusion::common::JoinType;

use crate::exec::join::matches::gathers_by_pair;
use crate::exec::join::row_source::ArrivedBatches;

fn arr<A: Array + 'static>(a: A) -> ArrayRef {
    Arc::new(a)
}

#[test]
fn fixed_width_columns_of_4_8_16_bytes_without_nulls_go_to_the_device() {
    let width = |a: ArrayRef| device_width(&RecordBatch::try_from_iter([("c", a)]).unwrap(), 0);
    assert_eq!(
        width(arr(Int64Array::from(vec![1, 2]))),
        Some(ValueWidth::Eight)
    );
    assert_eq!(
        width(arr(Float64Array::from(vec![1.5]))),
        Some(ValueWidth::Eight)
    );
    assert_eq!(
        width(arr(Int32Array::from(vec![1]))),
        Some(ValueWidth::Four)
    );
    assert_eq!(
        width(arr(Date32Array::from(vec![1]))),
        Some(ValueWidth::Four)
    );
    let decimal = Decimal128Array::from(vec![1i128, -2])
        .with_precision_and_scale(15, 2)
        .unwrap();
    assert_eq!(width(arr(decimal)), Some(ValueWidth::Sixteen));
    assert_eq!(width(arr(Int64Array::from(vec![Some(1), None]))), None);
    assert_eq!(width(arr(Int16Array::from(vec![1]))), None);
    assert_eq!(width(arr(BooleanArray::from(vec![true]))), None);
    assert_eq!(width(arr(StringArray::from(vec!["a"]))), None);
    // Values of a primitive type behind other buffers are not.
    let dictionary = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(vec![1, 0]),
        arr(Int64Array::from(vec![7, 8])),
    )
    .unwrap();
    assert_eq!(width(arr(dictionary)), None);
    assert!(gathers_by_pair(JoinType::Inner, false));
    assert!(!gathers_by_pair(JoinType::Inner, true));
    assert!(!gathers_by_pair(JoinType::Left, false));
}

#[test]
fn only_decimal_columns_are_tried_at_eight_bytes_on_the_device() {
    let decimal = |precision: u8| {
        arr(Decimal128Array::from(vec![1i128, -2])
            .with_precision_and_scale(precision, 2)
            .unwrap())
    };
    let interval = arr(
        datafusion::arrow::array::IntervalMonthDayNanoArray::from(vec![
            datafusion::arrow::datatypes::IntervalMonthDayNano::new(1, 2, 3),
        ]),
    );
    let batch = RecordBatch::try_from_iter([
        ("money", decimal(15)),
        ("wide", decimal(38)),
        ("count", arr(Int64Array::from(vec![1, 2]))),
    ])
    .unwrap();
    let bytes = ColumnBytes::of(&batch, &[true, true, true]);
    let tried: Vec<bool> = bytes
        .columns
        .iter()
        .map(|column| column.as_ref().unwrap().narrowable)
        .collect();
    // Any decimal is tried (its values decide, as they are staged); an
    // 8-byte column is at its width already.
    assert_eq!(tried, vec![true, true, false]);
    // A 16-byte value that is not one integer is never narrowed.
    let intervals = RecordBatch::try_from_iter([("i", interval)]).unwrap();
    assert_eq!(device_width(&intervals, 0), Some(ValueWidth::Sixteen));
    assert!(!narrowable(&intervals, 0, ValueWidth::Sixteen));
}

#[test]
fn the_probe_side_is_copied_only_where_most_of_its_rows_match() {
    assert!(probe_side_pays(1_000, true, 1_000));
    assert!(probe_side_pays(500, true, 1_000));
    assert!(!probe_side_pays(499, true, 1_000));
    assert!(!probe_side_pays(10, true, 1_000));
    // More pairs than one range holds: at least a range's worth.
    assert!(probe_side_pays(10, false, 1_000));
    assert!(!ResidentColumns::none().any());
}

#[test]
fn value_bytes_are_those_of_a_slice() {
    let column = arr(Int32Array::from(vec![5, -1, 7, 9])).slice(1, 2);
    let bytes = value_bytes(&column, ValueWidth::Four);
    assert_eq!(bytes.typed_data::<i32>(), &[-1, 7]);
    let decimal: ArrayRef = arr(Decimal128Array::from(vec![3i128, -4, 5])).slice(2, 1);
    assert_eq!(
        value_bytes(&decimal, ValueWidth::Sixteen).typed_data::<i128>(),
        &[5]
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
fn a_column_in_pieces_goes_to_the_device_only_where_no_piece_has_nulls() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Int32, true),
    ]));
    let batch = |a: Vec<Option<i64>>, b: Vec<i32>| {
        RecordBatch::try_new(
            Arc::clone(&schema),
            vec![arr(Int64Array::from(a)), arr(Int32Array::from(b))],
        )
        .unwrap()
    };
    let pieces = ArrivedBatches::new(
        Arc::clone(&schema),
        vec![
            batch(vec![Some(1), Some(2)], vec![1, 2]),
            batch(vec![None, Some(4), Some(5)], vec![3, 4, 5]),
        ],
    );
    assert_eq!(
        device_width(&pieces, 0),
        None,
        "the second piece has a NULL"
    );
    assert_eq!(device_width(&pieces, 1), Some(ValueWidth::Four));
    // Five 4-byte values in 8-byte words.
    assert_eq!(ResidentColumns::device_bytes(&pieces, &[true, true]), 24);
    assert_eq!(ResidentColumns::widest(&pieces, &[true, true]), 4);
    // The bytes taken for the copy: the wanted column that can go,
    // piece by piece; ordinary memory, so not copied straight from it.
    let bytes = ColumnBytes::of(&pieces, &[true, true]);
    assert!(bytes.columns[0].is_none());
    let column = bytes.columns[1].as_ref().unwrap();
    assert_eq!(column.width, ValueWidth::Four);
    assert!(!column.narrowable, "only 16-byte decimals are narrowed");
    let values: Vec<Vec<i32>> = column
        .buffers
        .iter()
        .map(|b| b.typed_data::<i32>().to_vec())
        .collect();
    assert_eq!(values, vec![vec![1, 2], vec![3, 4, 5]]);
    assert!(!bytes.in_pinned_memory());
    // Nothing to copy is nothing staged.
    assert!(ColumnBytes::of(&pieces, &[true, false]).in_pinned_memory());
}

#[test]
fn only_wanted_columns_that_qualify_count_as_device_bytes() {
    let batch = batch();
    assert_eq!(
        ResidentColumns::device_bytes(&batch, &[true, true, true, true]),
        2 * 8 * 2 + 8
    );
    assert_eq!(
        ResidentColumns::widest(&batch, &[true, true, true, true]),
        8
    );
    assert_eq!(ResidentColumns::widest(&batch, &[false, true, true]), 4);
    assert_eq!(ResidentColumns::widest(&batch, &[false, true]), 0);
    assert_eq!(
        ResidentColumns::device_bytes(&batch, &[false, true, true, true]),
        8 * 2 + 8
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
