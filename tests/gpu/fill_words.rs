//! A table column's words made straight into page-locked memory (the cache
//! fill's path for a large part) against the same words made in ordinary
//! memory, and their copy to the device from there: every integer type
//! the fill narrows, NULLs, empty pieces, pieces past the lent room, and a
//! value past 4 bytes after narrow pieces.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Int32Array, Int64Array,
};
use datafusion::arrow::datatypes::DataType;
use datafusion_gpu::encode::table_words::{HostWords, WordValues, WordsBuilder, MIN_PINNED_ROWS};
use datafusion_gpu::gpu::{download_u64, upload_filled, GpuDevice, PhaseTimer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::require_gpu;

fn device(test: &str) -> Option<Arc<GpuDevice>> {
    require_gpu(test).map(|runtime| Arc::clone(&runtime.devices()[0]))
}

/// `rows` values of `data_type` from `seed`, about a tenth NULL; `wide`:
/// some past 4 bytes (where the type has any).
fn piece(data_type: &DataType, rows: usize, seed: u64, wide: bool) -> ArrayRef {
    let mut rng = StdRng::seed_from_u64(seed);
    let valid = |rng: &mut StdRng| rng.random_bool(0.9);
    let big = if wide { 1i64 << 40 } else { 1 << 30 };
    match data_type {
        DataType::Int64 => Arc::new(
            (0..rows)
                .map(|_| valid(&mut rng).then(|| rng.random_range(-big..big)))
                .collect::<Int64Array>(),
        ),
        DataType::Int32 => Arc::new(
            (0..rows)
                .map(|_| valid(&mut rng).then(|| rng.random_range(i32::MIN..=i32::MAX)))
                .collect::<Int32Array>(),
        ),
        DataType::Date32 => Arc::new(
            (0..rows)
                .map(|_| valid(&mut rng).then(|| rng.random_range(-40_000..40_000)))
                .collect::<Date32Array>(),
        ),
        DataType::Boolean => Arc::new(
            (0..rows)
                .map(|_| valid(&mut rng).then(|| rng.random_bool(0.5)))
                .collect::<BooleanArray>(),
        ),
        DataType::Decimal128(precision, scale) => Arc::new(
            (0..rows)
                .map(|_| valid(&mut rng).then(|| i128::from(rng.random_range(-big..big))))
                .collect::<Decimal128Array>()
                .with_precision_and_scale(*precision, *scale)
                .unwrap(),
        ),
        other => panic!("no generator for {other}"),
    }
}

/// The words' values as 8-byte integers, and whether they are 4 bytes.
fn values(words: &HostWords) -> (Vec<i64>, bool) {
    let values = match &words.values {
        WordValues::Wide(v) => v.iter().map(|&w| w as i64).collect(),
        WordValues::Narrow(v) => v.iter().map(|&v| i64::from(v)).collect(),
        WordValues::Pinned(v) => v.values().iter().map(|&v| i64::from(v)).collect(),
    };
    (values, words.values.narrow())
}

#[test]
fn words_made_in_pinned_memory_equal_those_made_in_ordinary_memory() {
    let Some(device) = device("words_made_in_pinned_memory_equal_those_made_in_ordinary_memory")
    else {
        return;
    };
    let big = MIN_PINNED_ROWS + 1000;
    let types = [
        DataType::Int64,
        DataType::Int32,
        DataType::Date32,
        DataType::Boolean,
        DataType::Decimal128(15, 2),
    ];
    // (rows hint, pieces as (rows, with values past 4 bytes)): within the
    // room; empty pieces; past the room in the second piece; a value past
    // 4 bytes after a narrow piece; a hint below the pinned minimum.
    let cases: [(usize, &[(usize, bool)]); 5] = [
        (big, &[(big / 2, false), (big / 2, false)]),
        (big, &[(0, false), (big, false), (0, false)]),
        (big, &[(big - 10, false), (5_000, false), (70_000, false)]),
        (big, &[(40_000, false), (20_000, true), (10, false)]),
        (MIN_PINNED_ROWS - 1, &[(MIN_PINNED_ROWS - 1, false)]),
    ];
    let mut pinned_seen = 0;
    for data_type in &types {
        for (case, (hint, pieces)) in cases.iter().enumerate() {
            let label = format!("{data_type}, case {case}");
            let arrays: Vec<ArrayRef> = pieces
                .iter()
                .enumerate()
                .map(|(i, &(rows, wide))| piece(data_type, rows, (case * 10 + i) as u64, wide))
                .collect();
            let mut ordinary = WordsBuilder::with_rows_hint(data_type, *hint).unwrap();
            let mut pinned =
                WordsBuilder::with_pinned_room(data_type, *hint, device.pinned()).unwrap();
            for array in &arrays {
                assert!(ordinary.push(array), "{label}");
                assert!(pinned.push(array), "{label}");
            }
            let (ordinary, pinned) = (ordinary.finish(), pinned.finish());
            pinned_seen += usize::from(matches!(pinned.values, WordValues::Pinned(_)));
            assert_eq!(pinned.rows, ordinary.rows, "{label}");
            assert_eq!(values(&pinned), values(&ordinary), "{label}");
            assert_eq!(pinned.validity, ordinary.validity, "{label}");
            let rows: usize = arrays.iter().map(|a| a.len()).sum();
            assert_eq!(values(&pinned).0.len(), rows, "{label}");
            // Within the room, narrow and of a large hint: pinned (case 3's
            // values fit 4 bytes where the type has no wider ones).
            let has_wide = matches!(data_type, DataType::Int64 | DataType::Decimal128(..));
            let stays_pinned = case < 2 || (case == 3 && !has_wide);
            assert_eq!(
                matches!(pinned.values, WordValues::Pinned(_)),
                stays_pinned,
                "{label}"
            );
            if let WordValues::Pinned(values) = pinned.values {
                let expected = values.bytes().to_vec();
                let stream = device.stream().unwrap();
                let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
                let (buffer, bytes) = (*values).into_buffer();
                assert_eq!(bytes, expected.len(), "{label}");
                let on_device = upload_filled(stream.stream(), buffer, bytes, &mut timer).unwrap();
                let mut back = Vec::new();
                download_u64(
                    &device,
                    stream.stream(),
                    &on_device.as_view(),
                    &mut back,
                    &mut timer,
                )
                .unwrap();
                let back: Vec<u8> = back.iter().flat_map(|w| w.to_le_bytes()).collect();
                assert_eq!(back.len(), expected.len().div_ceil(8) * 8, "{label}");
                assert_eq!(&back[..expected.len()], expected.as_slice(), "{label}");
                assert!(
                    back[expected.len()..].iter().all(|&b| b == 0),
                    "{label}: padding"
                );
            }
        }
    }
    assert_eq!(pinned_seen, 3 * types.len() - 2);
}

/// A pool lends no more for fills at once than its limit: a builder whose
/// room would pass it makes its words in ordinary memory (the same words),
/// and the room comes back when the words that held it are dropped.
#[test]
fn a_fill_past_the_pools_limit_makes_its_words_in_ordinary_memory() {
    let Some(device) = device("a_fill_past_the_pools_limit_makes_its_words_in_ordinary_memory")
    else {
        return;
    };
    let rows = 4 * MIN_PINNED_ROWS;
    // A part's room is 4 bytes a row: the limit lends one part's, not two.
    let pool = device.pinned().sibling_with_fill_limit(6 * rows);
    let data_type = DataType::Int32;
    let array = piece(&data_type, rows, 7, false);
    let make = || {
        let mut builder = WordsBuilder::with_pinned_room(&data_type, rows, &pool).unwrap();
        assert!(builder.push(&array));
        builder.finish()
    };
    let first = make();
    assert!(
        matches!(first.values, WordValues::Pinned(_)),
        "within the limit"
    );
    let second = make();
    assert!(
        matches!(second.values, WordValues::Narrow(_)),
        "past the limit: ordinary memory"
    );
    assert_eq!(values(&second), values(&first));
    assert_eq!(second.validity, first.validity);
    assert_eq!(second.rows, rows);
    let expected = values(&first);
    drop(first);
    let third = make();
    assert!(
        matches!(third.values, WordValues::Pinned(_)),
        "the room given back"
    );
    assert_eq!(values(&third), expected);
    drop(third);
    // One loan alone past the limit.
    assert!(pool.take_for_fill(rows).unwrap().is_none());
    assert!(pool.take_for_fill(rows / 2).unwrap().is_some());
}
