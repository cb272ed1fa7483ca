use super::*;
use datafusion::arrow::array::{Float64Array, Int16Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::Float64Type;

#[test]
fn groups_are_estimated_from_the_sample_s_repeats() {
    let (sample, rows) = (1 << 16, 1 << 28);
    let near = |got: usize, want: f64| (got as f64 / want - 1.0).abs() < 0.01;
    // Uniform over 2^24 groups: about 128 repeats (the birthday count).
    let g = estimated_groups(sample, sample - 128, rows);
    assert!(near(g, (1u64 << 24) as f64), "{g}");
    // 2^12 groups, each drawn 16 times on average: all of them seen.
    let g = estimated_groups(sample, 4096, rows);
    assert!((4096..4200).contains(&g), "{g}");
    // 2^16 groups: e^-1 of them unseen, 41,427 distinct.
    let g = estimated_groups(sample, 41_427, rows);
    assert!(near(g, 65_536.0), "{g}");
    // No repeat: as many groups as rows; a repeat or so: capped there.
    assert_eq!(estimated_groups(sample, sample, rows), rows);
    assert_eq!(estimated_groups(sample, sample - 1, 1 << 20), 1 << 20);
    // Every row sampled: exact; nothing sampled: nothing known.
    assert_eq!(estimated_groups(1000, 17, 1000), 17);
    assert_eq!(estimated_groups(0, 0, rows), 0);
}

#[test]
fn the_sample_tells_groups_near_the_rows_from_fewer() {
    // 2^16 keys sampled from 2^28 rows: uniform over 2^26 groups they
    // repeat about 32 times, over 2^24 about 128 times, over 2^16
    // groups about 24,000 times (41,000 distinct).
    let (sample, rows) = (1 << 16, 1 << 28);
    assert!(sample_shows_groups_near_rows(sample, sample, rows, 8));
    assert!(sample_shows_groups_near_rows(sample, sample - 32, rows, 8));
    assert!(!sample_shows_groups_near_rows(
        sample,
        sample - 128,
        rows,
        8
    ));
    assert!(!sample_shows_groups_near_rows(sample, 41_000, rows, 8));
    // Every row sampled: the distinct count decides.
    assert!(sample_shows_groups_near_rows(1000, 125, 1000, 8));
    assert!(!sample_shows_groups_near_rows(1000, 124, 1000, 8));
    assert!(!sample_shows_groups_near_rows(0, 0, 0, 8));
}

fn spec(types: &[DataType]) -> KeySpec {
    KeySpec::try_new(types, NullEquality::NullEqualsNull).unwrap()
}

fn arr<A: Array + 'static>(a: A) -> ArrayRef {
    Arc::new(a)
}

#[test]
fn negative_zeros_fold_into_positive_zero_and_nans_keep_their_bits() {
    let other_nan = f64::from_bits(0x7ff8_0000_0000_0001);
    let column = arr(Float64Array::from(vec![
        Some(-0.0),
        Some(0.0),
        None,
        Some(f64::NAN),
        Some(other_nan),
        Some(-1.5),
    ]));
    let folded = fold_negative_zeros(vec![vec![column]]).unwrap();
    let folded = folded[0][0].as_primitive::<Float64Type>();
    let bits: Vec<Option<u64>> = folded.iter().map(|v| v.map(f64::to_bits)).collect();
    assert_eq!(
        bits,
        vec![
            Some(0),
            Some(0),
            None,
            Some(f64::NAN.to_bits()),
            Some(other_nan.to_bits()),
            Some((-1.5f64).to_bits()),
        ]
    );
    // Nothing to fold: the same array.
    let plain = arr(Float64Array::from(vec![1.0, 2.0]));
    let kept = fold_negative_zeros(vec![vec![Arc::clone(&plain)]]).unwrap();
    assert!(Arc::ptr_eq(&kept[0][0], &plain));
}

#[test]
fn one_column_without_nulls_is_its_own_word_and_the_rest_is_packed_or_hashed() {
    let ints = vec![vec![
        arr(Int64Array::from(vec![5, -1])),
        arr(Int64Array::from(vec![7])),
    ]];
    let words = group_key_words(&spec(&[DataType::Int64]), &ints, 2, true, 64)
        .unwrap()
        .unwrap();
    assert!(!words.hashed());
    assert_eq!(words.words.to_vec(), vec![5, (-1i64) as u64, 7]);

    let floats = vec![vec![arr(Float64Array::from(vec![0.5, -2.0]))]];
    let words = group_key_words(&spec(&[DataType::Float64]), &floats, 1, true, 64)
        .unwrap()
        .unwrap();
    assert!(!words.hashed());
    assert_eq!(
        words.words.to_vec(),
        vec![0.5f64.to_bits(), (-2.0f64).to_bits()]
    );

    // With a NULL, an integer column is packed (NULL has a code).
    let with_null = vec![vec![arr(Int64Array::from(vec![Some(5), None]))]];
    let words = group_key_words(&spec(&[DataType::Int64]), &with_null, 1, true, 64)
        .unwrap()
        .unwrap();
    assert!(!words.hashed());
    let w = words.words.to_vec();
    assert_ne!(w[0], w[1]);

    // Strings, and floats with a NULL, are hashed: equal keys, equal words.
    let strings = vec![vec![arr(StringArray::from(vec![
        Some("a"),
        None,
        Some("a"),
    ]))]];
    let words = group_key_words(&spec(&[DataType::Utf8]), &strings, 1, true, 64)
        .unwrap()
        .unwrap();
    assert!(words.hashed());
    let w = words.words.to_vec();
    assert_eq!(w[0], w[2]);
    assert_ne!(w[0], w[1]);

    // One bit of hash: two words at most; a bit count out of range is an
    // error.
    let many = vec![vec![arr(StringArray::from(
        (0..100).map(|i| i.to_string()).collect::<Vec<_>>(),
    ))]];
    let words = group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 1)
        .unwrap()
        .unwrap();
    assert!(words.words.to_vec().iter().all(|&w| w <= 1));
    assert!(group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 0).is_err());
    // Hashing not allowed: found before any key is hashed.
    assert!(
        group_key_words(&spec(&[DataType::Utf8]), &many, 1, false, 64)
            .unwrap()
            .is_none()
    );
    assert!(
        group_key_words(&spec(&[DataType::Int64]), &ints, 2, false, 64)
            .unwrap()
            .is_some()
    );
    assert!(group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 65).is_err());

    // Two full-range Int64 columns do not pack into 64 bits.
    let wide = vec![
        vec![arr(Int64Array::from(vec![i64::MIN, i64::MAX]))],
        vec![arr(Int64Array::from(vec![i64::MAX, i64::MIN]))],
    ];
    let words = group_key_words(
        &spec(&[DataType::Int64, DataType::Int64]),
        &wide,
        1,
        true,
        64,
    )
    .unwrap()
    .unwrap();
    assert!(words.hashed());
    assert!(group_key_words(
        &spec(&[DataType::Int64, DataType::Int64]),
        &wide,
        1,
        false,
        64
    )
    .unwrap()
    .is_none());
}

#[test]
fn key_words_decode_back_into_the_keys_they_stand_for() {
    use datafusion::arrow::array::{
        BooleanArray, Date32Array, Decimal128Array, Float32Array, Int32Array, Int8Array,
        TimestampMicrosecondArray, UInt16Array, UInt8Array,
    };
    use datafusion::arrow::compute::concat;
    let tz = || TimestampMicrosecondArray::from(vec![Some(-5), None, Some(1 << 40)]);
    let cases: Vec<Vec<ArrayRef>> = vec![
        // Own words: every width, signed and unsigned, floats, times.
        vec![arr(Int32Array::from(vec![-3, i32::MAX, i32::MIN]))],
        vec![arr(UInt8Array::from(vec![0, 255, 7]))],
        vec![arr(Float32Array::from(vec![-1.5, f32::NAN, 0.0]))],
        vec![arr(Float64Array::from(vec![f64::MIN, 2.25, -7.0]))],
        vec![arr(Date32Array::from(vec![-719_162, 0, 19_000]))],
        vec![arr(
            TimestampMicrosecondArray::from(vec![1, -2, 3]).with_timezone("+02:00")
        )],
        // Packed: NULLs, several columns, decimals and booleans.
        vec![arr(Int64Array::from(vec![
            Some(i64::MIN),
            None,
            Some(i64::MAX - 1),
        ]))],
        vec![arr(tz().with_timezone("UTC"))],
        vec![
            arr(Int8Array::from(vec![Some(-128), None, Some(127)])),
            arr(BooleanArray::from(vec![Some(true), Some(false), None])),
            arr(UInt16Array::from(vec![None, Some(9), Some(65_535)])),
        ],
        vec![
            arr(Decimal128Array::from(vec![Some(-12_345), Some(99), None])
                .with_precision_and_scale(15, 2)
                .unwrap()),
            arr(Date32Array::from(vec![Some(10), None, Some(10)])),
        ],
        // A column of NULLs only, beside one of a single value.
        vec![
            arr(Int32Array::from(vec![None, None, None])),
            arr(Int32Array::from(vec![4, 4, 4])),
        ],
    ];
    for columns in cases {
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        // Each column in two pieces, as two input batches.
        let pieces: Vec<Vec<ArrayRef>> = columns
            .iter()
            .map(|c| vec![c.slice(0, 1), c.slice(1, 2)])
            .collect();
        let words = group_key_words(&spec(&types), &pieces, 2, false, 64)
            .unwrap()
            .unwrap_or_else(|| panic!("{types:?} need hashing"));
        let decoded = words
            .decode(&words.words.to_vec(), &MappedAhead::none())
            .unwrap();
        assert_eq!(decoded.len(), columns.len());
        for (got, want) in decoded.iter().zip(&columns) {
            let want = concat(&[want.as_ref()]).unwrap();
            assert_eq!(got.data_type(), want.data_type());
            assert_eq!(&got.to_data(), &want.to_data(), "{types:?}");
        }
        // A group's word alone decodes to its key.
        let last = words
            .decode(&words.words.to_vec()[2..], &MappedAhead::none())
            .unwrap();
        for (got, want) in last.iter().zip(&columns) {
            assert_eq!(&got.to_data(), &want.slice(2, 1).to_data(), "{types:?}");
        }
    }
    let strings = vec![vec![arr(StringArray::from(vec!["a", "b"]))]];
    let hashed = group_key_words(&spec(&[DataType::Utf8]), &strings, 1, true, 64)
        .unwrap()
        .unwrap();
    assert!(hashed
        .decode(&hashed.words.to_vec(), &MappedAhead::none())
        .is_err());
}

#[test]
fn a_sample_spread_over_the_pieces_counts_distinct_keys() {
    // Sorted keys, 1000 groups of 100 rows, in uneven pieces, with a
    // second key column: a sample of the first rows would see one group.
    let keys: Vec<i64> = (0..100_000i64).map(|i| i / 100).collect();
    let mut columns = vec![Vec::new(), Vec::new()];
    for piece in keys.chunks(7_777) {
        columns[0].push(arr(Int64Array::from(piece.to_vec())));
        columns[1].push(arr(StringArray::from(
            piece
                .iter()
                .map(|k| format!("s{}", k % 3))
                .collect::<Vec<_>>(),
        )));
    }
    assert_eq!(sampled_distinct_keys(&columns, 1000).unwrap(), (1000, 1000));
    assert_eq!(sampled_distinct_keys(&columns, 100).unwrap(), (100, 100));
    // The string column alone: three keys.
    assert_eq!(sampled_distinct_keys(&columns[1..], 500).unwrap(), (500, 3));
    assert_eq!(sampled_distinct_keys(&[], 100).unwrap(), (0, 0));
    let few = vec![vec![arr(Int64Array::from(vec![3i64; 5000]))]];
    assert_eq!(sampled_distinct_keys(&few, 65_536).unwrap(), (5000, 1));
    // NULL is a key like any other.
    let nulls = vec![vec![arr(Int64Array::from(vec![None, Some(1), None]))]];
    assert_eq!(sampled_distinct_keys(&nulls, 10).unwrap(), (3, 2));
}

#[test]
fn keys_read_in_place_sample_the_rows_that_hashed_keys_do() {
    // One narrow key column without NULLs is read in place; the same
    // keys beside a constant column are hashed: the same rows sampled,
    // as many distinct keys. Sliced pieces read from their offsets.
    let keys: Vec<i16> = (0..30_000)
        .map(|i| ((i * 7919) % 4001) as i16 - 2000)
        .collect();
    let whole = Int16Array::from(keys.clone());
    let mut alone = vec![Vec::new()];
    let mut beside = vec![Vec::new(), Vec::new()];
    let mut at = 0;
    for len in [1, 4_999, 10_000, 15_000] {
        let piece = arr(whole.slice(at, len));
        alone[0].push(Arc::clone(&piece));
        beside[0].push(piece);
        beside[1].push(arr(Int64Array::from(vec![0i64; len])));
        at += len;
    }
    let starts = starts_of(alone[0].iter().map(|p| p.len()));
    for sample in [30_000, 7_000, 333] {
        let stride = 30_000usize.div_ceil(sample);
        assert!(sampled_distinct_words(&alone, stride, &starts).is_some());
        let want: HashSet<i16> = keys.iter().step_by(stride).copied().collect();
        let got = sampled_distinct_keys(&alone, sample).unwrap();
        assert_eq!(got, (30_000usize.div_ceil(stride), want.len()), "{sample}");
        assert_eq!(sampled_distinct_keys(&beside, sample).unwrap(), got);
    }
    assert!(sampled_distinct_words(&beside, 1, &starts).is_none());
}

#[test]
fn few_groups_are_told_from_many_by_the_sample() {
    // 2^12 groups in a 2^16-row sample: each seen 16 times, few; 2^16
    // groups: about 41,000 distinct, many; 2^13: at the edge, few.
    assert!(sample_shows_few_groups(65_536, 4_096));
    assert!(!sample_shows_few_groups(65_536, 41_000));
    assert!(sample_shows_few_groups(65_536, 8_192));
    assert!(!sample_shows_few_groups(65_536, 8_193));
    // TPC-H q1: four groups.
    assert!(sample_shows_few_groups(65_536, 4));
    // No rows, no sample.
    assert!(!sample_shows_few_groups(0, 0));
    // A small partition of few keys, each seen a few times only.
    assert!(!sample_shows_few_groups(100, 50));
}

#[test]
fn a_group_holding_two_keys_is_found() {
    let keys = vec![
        vec![
            arr(StringArray::from(vec![Some("a"), None])),
            arr(StringArray::from(vec![Some("b"), Some("a")])),
        ],
        vec![
            arr(Int64Array::from(vec![1, 2])),
            arr(Int64Array::from(vec![3, 1])),
        ],
    ];
    // Groups: ("a", 1), (NULL, 2), ("b", 3).
    let group_keys = vec![
        arr(StringArray::from(vec![Some("a"), None, Some("b")])),
        arr(Int64Array::from(vec![1, 2, 3])),
    ];
    assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2, 0]).unwrap());
    // ("b", 3) put in the group of ("a", 1): a collision.
    assert!(!groups_hold_one_key(&keys, &group_keys, &[0, 1, 0, 0]).unwrap());
    // NULL in the group of "a".
    assert!(!groups_hold_one_key(&keys, &group_keys, &[0, 0, 2, 0]).unwrap());
    // A group id out of range, or a row count that differs, is an error.
    assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2, 3]).is_err());
    assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2]).is_err());
}
