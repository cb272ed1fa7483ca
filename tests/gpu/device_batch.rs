//! Record batches copied to device memory and back come back equal, for
//! every type a device column holds, with NULLs, sliced arrays, empty
//! batches and dictionary-encoded columns; their memory is counted in the
//! device budget while they live, and given back when they are dropped.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, DictionaryArray,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeStringArray, RecordBatch,
    StringArray, TimestampNanosecondArray, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{Field, Int32Type, Schema, UInt8Type};
use datafusion_gpu::encode::device_batch::DeviceBatch;
use datafusion_gpu::gpu::{GpuDevice, PhaseTimer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::require_gpu;

fn device(test: &str) -> Option<Arc<GpuDevice>> {
    require_gpu(test).map(|runtime| Arc::clone(&runtime.devices()[0]))
}

/// `rows` values from `value`, NULL where `null_every` divides a row's
/// random draw (0: never NULL).
fn values<T>(
    rows: usize,
    seed: u64,
    null_every: u32,
    value: impl Fn(&mut StdRng) -> T,
) -> Vec<Option<T>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..rows)
        .map(|_| {
            let null = null_every > 0 && rng.random_range(0..null_every) == 0;
            let v = value(&mut rng);
            (!null).then_some(v)
        })
        .collect()
}

/// One column of every type a device column holds, `rows` rows.
fn batch(rows: usize, seed: u64, null_every: u32) -> RecordBatch {
    let text = |rng: &mut StdRng| {
        let len = rng.random_range(0..12usize);
        (0..len)
            .map(|_| rng.random_range(b'a'..=b'z') as char)
            .collect::<String>()
    };
    let codes: Vec<Option<i32>> = values(rows, seed + 11, null_every, |r| r.random_range(0..5));
    let dictionary = StringArray::from(vec!["AIR", "MAIL", "RAIL", "SHIP", "TRUCK"]);
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "i8",
            Arc::new(Int8Array::from(values(rows, seed, null_every, |r| {
                r.random::<i8>()
            }))),
        ),
        (
            "i16",
            Arc::new(Int16Array::from(values(rows, seed + 1, null_every, |r| {
                r.random::<i16>()
            }))),
        ),
        (
            "i32",
            Arc::new(Int32Array::from(values(rows, seed + 2, null_every, |r| {
                r.random::<i32>()
            }))),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(values(rows, seed + 3, null_every, |r| {
                r.random::<i64>()
            }))),
        ),
        (
            "u8",
            Arc::new(UInt8Array::from(values(rows, seed + 4, null_every, |r| {
                r.random::<u8>()
            }))),
        ),
        (
            "u32",
            Arc::new(UInt32Array::from(values(rows, seed + 5, null_every, |r| {
                r.random::<u32>()
            }))),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(values(rows, seed + 6, null_every, |r| {
                r.random::<u64>()
            }))),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(values(
                rows,
                seed + 7,
                null_every,
                |r| r.random::<f64>() - 0.5,
            ))),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(values(rows, seed + 8, null_every, |r| {
                    r.random::<i64>() as i128 * 1000
                }))
                .with_precision_and_scale(38, 2)
                .unwrap(),
            ),
        ),
        (
            "date",
            Arc::new(Date32Array::from(values(rows, seed + 9, null_every, |r| {
                r.random_range(0..20_000)
            }))),
        ),
        (
            "ts",
            Arc::new(TimestampNanosecondArray::from(values(
                rows,
                seed + 10,
                null_every,
                |r| r.random::<i64>(),
            ))),
        ),
        (
            "flag",
            Arc::new(BooleanArray::from(values(
                rows,
                seed + 12,
                null_every,
                |r| r.random::<bool>(),
            ))),
        ),
        (
            "text",
            Arc::new(StringArray::from(values(rows, seed + 13, null_every, text))),
        ),
        (
            "large_text",
            Arc::new(LargeStringArray::from(values(
                rows,
                seed + 14,
                null_every,
                text,
            ))),
        ),
        (
            "bytes",
            Arc::new(BinaryArray::from_iter(values(
                rows,
                seed + 15,
                null_every,
                |r| text(r).into_bytes(),
            ))),
        ),
        (
            "mode",
            Arc::new(
                DictionaryArray::<Int32Type>::try_new(
                    Int32Array::from(codes),
                    Arc::new(dictionary),
                )
                .unwrap(),
            ),
        ),
    ];
    let schema = Schema::new(
        columns
            .iter()
            .map(|(name, column)| Field::new(*name, column.data_type().clone(), true))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        columns.into_iter().map(|(_, c)| c).collect(),
    )
    .unwrap()
}

fn round_trip(device: &Arc<GpuDevice>, batch: &RecordBatch) -> (RecordBatch, usize) {
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let on_device = DeviceBatch::upload(device, stream, batch, 1.0, &mut timer).unwrap();
    assert_eq!(on_device.num_rows(), batch.num_rows());
    assert_eq!(on_device.schema(), &batch.schema());
    let reserved = device.budget().in_use();
    assert!(
        reserved >= on_device.device_bytes(),
        "{reserved} < {}",
        on_device.device_bytes()
    );
    let back = on_device.download(device, stream, &mut timer).unwrap();
    timer.finish().unwrap();
    (back, on_device.device_bytes())
}

#[test]
fn batches_come_back_from_the_device_as_they_went() {
    let Some(device) = device("batches_come_back_from_the_device_as_they_went") else {
        return;
    };
    device.bind_to_thread().unwrap();
    for (rows, null_every) in [
        (0, 0),
        (1, 0),
        (1, 1),
        (7, 3),
        (64, 0),
        (1000, 5),
        (100_003, 7),
    ] {
        let original = batch(rows, rows as u64, null_every);
        let (back, _) = round_trip(&device, &original);
        // Equality compares values, validity and types column by column.
        assert_eq!(back, original, "{rows} rows, NULL every {null_every}");
    }
}

#[test]
fn sliced_batches_come_back_equal_to_their_slices() {
    let Some(device) = device("sliced_batches_come_back_equal_to_their_slices") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let whole = batch(5000, 42, 4);
    // Offsets that are not multiples of 8 move validity and boolean bits.
    for (offset, len) in [
        (0, 5000),
        (1, 10),
        (3, 4000),
        (13, 0),
        (4999, 1),
        (2048, 1000),
    ] {
        let slice = whole.slice(offset, len);
        let (back, _) = round_trip(&device, &slice);
        assert_eq!(back, slice, "slice {offset}..{}", offset + len);
    }
}

#[test]
fn a_dictionary_column_keeps_its_codes_on_the_device_and_its_dictionary_on_the_host() {
    let Some(device) =
        device("a_dictionary_column_keeps_its_codes_on_the_device_and_its_dictionary_on_the_host")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let rows = 100_000;
    let codes = UInt8Array::from(values(rows, 5, 9, |r| r.random_range(0..200u8)));
    let dictionary: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..200).map(|i| format!("brand#{i:03}")),
    ));
    let column = DictionaryArray::<UInt8Type>::try_new(codes, Arc::clone(&dictionary)).unwrap();
    let schema = Schema::new(vec![Field::new("brand", column.data_type().clone(), true)]);
    let original = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(column)]).unwrap();
    let (back, device_bytes) = round_trip(&device, &original);
    assert_eq!(back, original);
    // One byte of code a row and one bit of validity, padded to words: the
    // dictionary's strings stay on the host.
    let expected = rows.div_ceil(8) * 8 + rows.div_ceil(64) * 8;
    assert_eq!(device_bytes, expected);
}

#[test]
fn device_batches_hold_their_budget_until_dropped() {
    let Some(device) = device("device_batches_hold_their_budget_until_dropped") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let original = batch(10_000, 9, 3);
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let on_device = DeviceBatch::upload(&device, stream, &original, 1.0, &mut timer).unwrap();
    // Other tests reserve memory at the same time: the batch's own
    // reservation is what it must hold, its padded bytes.
    assert_eq!(on_device.reserved_bytes(), on_device.device_bytes());
    assert!(device.budget().in_use() >= on_device.reserved_bytes());
    drop(on_device);
    timer.finish().unwrap();
    // A batch that can never fit its share of the budget is an error, not a wait.
    let error = DeviceBatch::upload(
        &device,
        stream,
        &original,
        1e-12,
        &mut PhaseTimer::new(Arc::clone(stream)),
    )
    .err()
    .expect("a batch larger than its budget");
    assert!(
        error.to_string().contains("GPU memory budget exceeded"),
        "{error}"
    );
}

#[test]
fn unsupported_columns_are_refused_with_their_type() {
    let Some(device) = device("unsupported_columns_are_refused_with_their_type") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let list =
        datafusion::arrow::array::ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(
            vec![Some(1)],
        )]);
    let schema = Schema::new(vec![Field::new("l", list.data_type().clone(), true)]);
    let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(list)]).unwrap();
    assert!(!DeviceBatch::supports(batch.schema().field(0).data_type()));
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let error = DeviceBatch::upload(&device, stream, &batch, 1.0, &mut timer)
        .err()
        .unwrap();
    assert!(error.to_string().contains("List"), "{error}");
}
