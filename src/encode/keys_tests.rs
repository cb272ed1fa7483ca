use super::*;
use datafusion::arrow::array::{
    BooleanArray, Date32Array, Decimal128Array, Float64Array, Int16Array, Int32Array, Int64Array,
    StringArray, StringViewArray, TimestampMicrosecondArray, UInt8Array,
};
use std::sync::Arc;

fn spec(types: &[DataType]) -> KeySpec {
    KeySpec::try_new(types, NullEquality::NullEqualsNothing).unwrap()
}

fn arr<A: Array + 'static>(a: A) -> ArrayRef {
    Arc::new(a)
}

#[test]
fn specs_reject_only_types_that_cannot_be_compared() {
    assert!(KeySpec::try_new(&[], NullEquality::NullEqualsNothing).is_err());
    let nested = DataType::List(Arc::new(Field::new("x", DataType::Int32, true)));
    let err = KeySpec::try_new(&[nested], NullEquality::NullEqualsNothing).unwrap_err();
    assert!(err.contains("List"), "{err}");
    assert!(spec(&[DataType::Utf8View, DataType::Float64]).types().len() == 2);
    assert!(spec(&[DataType::Int64, DataType::Decimal128(15, 2)]).packable());
    assert!(!spec(&[DataType::Int64, DataType::Utf8]).packable());
}

#[test]
fn codes_are_offsets_from_the_build_minimum_in_just_enough_bits() {
    let s = spec(&[DataType::Int32]);
    let build = arr(Int32Array::from(vec![-3, 4, 0]));
    let encoder = KeyEncoder::for_build_side(&s, std::slice::from_ref(&build)).unwrap();
    assert_eq!(encoder.kind(), "packed");
    assert_eq!(encoder.encode(&[build]).unwrap().keys, vec![0, 7, 3]);
    // 10 and -4 lie outside the build range [-3, 4]: they cannot match.
    let probe = arr(Int32Array::from(vec![10, 4, -4, -3]));
    let keys = encoder.encode(&[probe]).unwrap();
    assert_eq!(keys.keys, vec![7, 0]);
    assert_eq!(keys.row_ids, Some(vec![1, 3]));
    // Eight codes: every key lies below 2^3, every row id below 4.
    assert_eq!(encoder.key_bits(), 3);
    assert_eq!(JoinKeys::Encoded(keys).row_bound(), 4);
}

#[test]
fn two_int64_columns_with_narrow_ranges_pack_into_one_word() {
    let s = spec(&[DataType::Int64, DataType::Int64]);
    let a = arr(Int64Array::from(vec![1_000_000, 1_000_003]));
    let b = arr(Int64Array::from(vec![i64::MIN, i64::MIN + 1]));
    let encoder = KeyEncoder::for_build_side(&s, &[a.clone(), b.clone()]).unwrap();
    assert_eq!(encoder.kind(), "packed");
    // Ranges of 4 and 2 values: 2 bits then 1 bit.
    assert_eq!(encoder.encode(&[a, b]).unwrap().keys, vec![0b000, 0b111]);
    assert_eq!(encoder.key_bits(), 3);
}

#[test]
fn wide_ranges_fall_back_to_hashing() {
    let s = spec(&[DataType::Int64, DataType::Int64]);
    let a = arr(Int64Array::from(vec![i64::MIN, i64::MAX]));
    let encoder = KeyEncoder::for_build_side(&s, &[a.clone(), a]).unwrap();
    assert_eq!(encoder.kind(), "hashed");
    assert_eq!(encoder.key_bits(), 64);
    assert!(encoder.needs_verification());
}

#[test]
fn one_8_byte_integer_column_is_its_own_key_read_in_place() {
    let s = spec(&[DataType::UInt64]);
    let build = arr(datafusion::arrow::array::UInt64Array::from(vec![
        0,
        u64::MAX,
    ]));
    let encoder = KeyEncoder::for_build_side(&s, std::slice::from_ref(&build)).unwrap();
    assert_eq!(encoder.kind(), "raw");
    assert!(!encoder.needs_verification());
    assert_eq!(encoder.key_bits(), 64);
    assert_eq!(encoder.encode(&[build]).unwrap().keys, vec![0, u64::MAX]);
    // NULL equals NULL, but the build side has none: still raw.
    let with_null_code =
        KeySpec::try_new(&[DataType::UInt64], NullEquality::NullEqualsNull).unwrap();
    let build = arr(datafusion::arrow::array::UInt64Array::from(vec![
        0,
        u64::MAX,
    ]));
    assert_eq!(
        KeyEncoder::for_build_side(&with_null_code, &[build])
            .unwrap()
            .kind(),
        "raw"
    );
    // With a NULL build key that must match probe NULLs: hashed, as the
    // range leaves no code for NULL.
    let build = arr(datafusion::arrow::array::UInt64Array::from(vec![
        Some(0),
        None,
        Some(u64::MAX),
    ]));
    assert_eq!(
        KeyEncoder::for_build_side(&with_null_code, &[build])
            .unwrap()
            .kind(),
        "hashed"
    );
}

#[test]
fn raw_probe_keys_stay_in_their_pieces_unless_one_is_null() {
    let s = spec(&[DataType::Int64]);
    let build = arr(Int64Array::from(vec![1, 5, 9]));
    let encoder = KeyEncoder::for_build_side(&s, &[build]).unwrap();
    assert_eq!(encoder.kind(), "raw");
    let first = arr(Int64Array::from(vec![5, -3]));
    let second = arr(Int64Array::from(vec![9, 1, 7]));
    let pieces = vec![vec![Arc::clone(&first), Arc::clone(&second)]];
    let raw = encoder.raw_pieces(&pieces).expect("raw pieces");
    assert_eq!(raw.len(), 2);
    // Each piece is its column's own buffer.
    assert_eq!(
        raw[1].inner().as_ptr(),
        second.to_data().buffers()[0].as_ptr()
    );
    let keys = JoinKeys::RawPieces(raw);
    assert_eq!(keys.len(), 5);
    assert_eq!(keys.row_ids(), None);
    let whole = datafusion::arrow::compute::concat(&[first.as_ref(), second.as_ref()]).unwrap();
    let encoded = encoder.encode(&[whole]).unwrap();
    assert_eq!(*keys.to_normalized(), encoded);
    let laid_end_to_end: Vec<u64> = keys.pieces().concat();
    assert_eq!(laid_end_to_end, encoded.keys.to_vec());

    // A NULL in any piece: the rows are concatenated and encoded (the
    // NULL row dropped) instead.
    let with_null = arr(Int64Array::from(vec![Some(9), None]));
    assert!(encoder.raw_pieces(&[vec![first, with_null]]).is_none());
    // Other encodings never hand out pieces.
    let packed = KeyEncoder::for_build_side(
        &spec(&[DataType::Int32]),
        &[arr(Int32Array::from(vec![1, 2]))],
    )
    .unwrap();
    assert_eq!(packed.kind(), "packed");
    assert!(packed
        .raw_pieces(&[vec![arr(Int32Array::from(vec![1]))]])
        .is_none());
}

#[test]
fn ranges_of_pieces_skip_pieces_without_values() {
    let pieces = vec![
        arr(Int64Array::from(vec![None, None])),
        arr(Int64Array::from(vec![5, 9])),
        arr(Int64Array::from(Vec::<i64>::new())),
        arr(Int64Array::from(vec![Some(-3), None])),
    ];
    for threads in [1, 4] {
        assert_eq!(pieces_value_range(&pieces, threads).unwrap(), (-3, 9));
        assert_eq!(pieces_value_range(&pieces[..1], threads).unwrap(), (1, 0));
    }
    // Many pieces, shared out over threads.
    let whole = arr(Int64Array::from_iter_values(
        (0..5_242_900).map(|i: i64| (i * 7919) % 1_000_003 - 500_000),
    ));
    let pieces: Vec<ArrayRef> = (0..100)
        .map(|i| whole.slice(i * (whole.len() / 100), whole.len() / 100))
        .collect();
    let expected = value_range(&whole).unwrap();
    assert_eq!(pieces_value_range(&pieces, 4).unwrap(), expected);
    assert_eq!(pieces_value_range(&pieces, 1).unwrap(), expected);
}

#[test]
fn raw_keys_share_the_column_buffer_and_drop_null_rows() {
    let s = spec(&[DataType::Int64]);
    let build = arr(Int64Array::from(vec![i64::MIN, i64::MIN + 2]));
    let encoder = KeyEncoder::for_build_side(&s, &[build]).unwrap();
    assert_eq!(encoder.kind(), "raw");
    let whole = arr(Int64Array::from(vec![
        i64::MAX,
        i64::MIN + 1,
        i64::MIN,
        -1,
        7,
    ]));
    let probe = whole.slice(1, 3);
    let keys = encoder.encode(std::slice::from_ref(&probe)).unwrap();
    assert_eq!(
        keys.keys,
        vec![(i64::MIN + 1) as u64, i64::MIN as u64, u64::MAX]
    );
    assert_eq!(keys.row_ids, None);
    // No copy: the keys point into the column's own values.
    let values = whole.to_data().buffers()[0].as_ptr();
    // The slice starts at element 1 of the 5-element buffer.
    assert_eq!(keys.keys.inner().as_ptr(), values.wrapping_add(8));
    let with_nulls = arr(Int64Array::from(vec![Some(3), None, Some(-4)]));
    let keys = encoder.encode(&[with_nulls]).unwrap();
    assert_eq!(keys.keys, vec![3, (-4i64) as u64]);
    assert_eq!(keys.row_ids, Some(vec![0, 2]));
    // The parallel path gives the same.
    let many = arr(Int64Array::from_iter_values(0..3_000_000));
    assert_eq!(
        encoder
            .encode_parallel(std::slice::from_ref(&many), 4)
            .unwrap(),
        encoder.encode(&[many]).unwrap()
    );
}

#[test]
fn the_64_bit_packing_path_checks_ranges_at_the_extremes() {
    // Two columns, so the keys pack rather than being used raw.
    let s = spec(&[DataType::Int64, DataType::Boolean]);
    let build = vec![
        arr(Int64Array::from(vec![i64::MIN, i64::MIN + 2])),
        arr(BooleanArray::from(vec![true, true])),
    ];
    let encoder = KeyEncoder::for_build_side(&s, &build).unwrap();
    assert_eq!(encoder.kind(), "packed");
    let probe = vec![
        arr(Int64Array::from(vec![
            i64::MAX,
            i64::MIN + 1,
            i64::MIN,
            -1,
            i64::MIN + 3,
        ])),
        arr(BooleanArray::from(vec![true; 5])),
    ];
    let keys = encoder.encode(&probe).unwrap();
    assert_eq!(
        (keys.keys, keys.row_ids),
        (vec![1, 0].into(), Some(vec![1, 2]))
    );
    let s = spec(&[DataType::UInt8]);
    let build = arr(UInt8Array::from(vec![250, 252]));
    let encoder = KeyEncoder::for_build_side(&s, &[build]).unwrap();
    let keys = encoder
        .encode(&[arr(UInt8Array::from(vec![255, 0, 251, 249]))])
        .unwrap();
    assert_eq!((keys.keys, keys.row_ids), (vec![1].into(), Some(vec![2])));
}

#[test]
fn null_keys_are_dropped_or_coded_by_null_equality() {
    let column = arr(Int16Array::from(vec![Some(5), None, Some(6)]));
    let nothing = spec(&[DataType::Int16]);
    let encoder = KeyEncoder::for_build_side(&nothing, std::slice::from_ref(&column)).unwrap();
    let keys = encoder.encode(std::slice::from_ref(&column)).unwrap();
    assert_eq!(
        (keys.keys, keys.row_ids),
        (vec![0, 1].into(), Some(vec![0, 2]))
    );

    let null = KeySpec::try_new(&[DataType::Int16], NullEquality::NullEqualsNull).unwrap();
    let encoder = KeyEncoder::for_build_side(&null, std::slice::from_ref(&column)).unwrap();
    let keys = encoder.encode(&[column]).unwrap();
    assert_eq!((keys.keys, keys.row_ids), (vec![1, 0, 2].into(), None));
}

#[test]
fn an_all_null_or_empty_build_side_matches_no_probe_value() {
    let s = spec(&[DataType::Int32]);
    let build = arr(Int32Array::from(vec![None, None]));
    let encoder = KeyEncoder::for_build_side(&s, &[build]).unwrap();
    let keys = encoder
        .encode(&[arr(Int32Array::from(vec![0, -1, i32::MAX]))])
        .unwrap();
    assert!(keys.keys.is_empty());
    let empty = arr(Int32Array::from(Vec::<i32>::new()));
    let encoder = KeyEncoder::for_build_side(&s, &[empty]).unwrap();
    assert!(encoder
        .encode(&[arr(Int32Array::from(vec![0]))])
        .unwrap()
        .keys
        .is_empty());
}

#[test]
fn decimals_booleans_dates_and_timestamps_pack() {
    let s = spec(&[
        DataType::Decimal128(15, 2),
        DataType::Boolean,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    ]);
    let columns = vec![
        arr(Decimal128Array::from(vec![12_345, -1])
            .with_precision_and_scale(15, 2)
            .unwrap()),
        arr(BooleanArray::from(vec![true, false])),
        arr(Date32Array::from(vec![10, 12])),
        arr(TimestampMicrosecondArray::from(vec![-5, 7]).with_timezone("UTC")),
    ];
    let encoder = KeyEncoder::for_build_side(&s, &columns).unwrap();
    assert_eq!(encoder.kind(), "packed");
    let keys = encoder.encode(&columns).unwrap().keys;
    assert_ne!(keys[0], keys[1]);
    assert_eq!(encoder.encode(&columns).unwrap().keys, keys);
}

#[test]
fn composite_codes_are_injective() {
    // (1, 23) and (12, 3) would collide as decimal strings "123".
    let s = spec(&[DataType::Int32, DataType::UInt8]);
    let a = arr(Int32Array::from(vec![1, 12]));
    let b = arr(UInt8Array::from(vec![23, 3]));
    let encoder = KeyEncoder::for_build_side(&s, &[a.clone(), b.clone()]).unwrap();
    let keys = encoder.encode(&[a, b]).unwrap().keys;
    assert_ne!(keys[0], keys[1]);
}

#[test]
fn strings_and_floats_are_hashed_alike_on_both_sides() {
    let s = spec(&[DataType::Utf8View, DataType::Float64]);
    let build = vec![
        arr(StringViewArray::from(vec!["a", "b", "a"])),
        arr(Float64Array::from(vec![1.0, 2.0, 1.5])),
    ];
    let probe = vec![
        arr(StringViewArray::from(vec!["a", "a"])),
        arr(Float64Array::from(vec![1.0, 1.0])),
    ];
    let encoder = KeyEncoder::for_build_side(&s, &build).unwrap();
    assert_eq!(encoder.kind(), "hashed");
    assert!(encoder.needs_verification());
    let b = encoder.encode(&build).unwrap().keys;
    let p = encoder.encode(&probe).unwrap().keys;
    assert_eq!(b[0], p[0]);
    assert_eq!(p[0], p[1]);
    assert_ne!(b[0], b[2]);
}

#[test]
fn float_keys_are_coded_equal_exactly_where_the_join_compares_them_equal() {
    use datafusion::arrow::array::Float32Array;
    use datafusion::physical_plan::joins::utils::JoinKeyComparator;
    let other_nan = f64::from_bits(0x7ff8_0000_0000_0001);
    let doubles = vec![
        Some(0.0),
        Some(-0.0),
        Some(f64::NAN),
        Some(-f64::NAN),
        Some(other_nan),
        Some(f64::INFINITY),
        Some(f64::NEG_INFINITY),
        Some(f64::MIN_POSITIVE),
        Some(-f64::MIN_POSITIVE),
        Some(1.5),
        Some(-1.5),
        None,
        Some(0.0),
        Some(f64::NAN),
    ];
    let singles: Vec<Option<f32>> = doubles.iter().map(|v| v.map(|v| v as f32)).collect();
    let columns = [
        arr(Float64Array::from(doubles.clone())),
        arr(Float32Array::from(singles)),
    ];
    for null_equality in [NullEquality::NullEqualsNothing, NullEquality::NullEqualsNull] {
        for column in &columns {
            let s = KeySpec::try_new(&[column.data_type().clone()], null_equality).unwrap();
            let encoder = KeyEncoder::for_build_side(&s, std::slice::from_ref(column)).unwrap();
            assert!(!encoder.needs_verification(), "{}", column.data_type());
            assert!(encoder.decode(&[0]).is_err());
            let keys = encoder.encode(std::slice::from_ref(column)).unwrap();
            let rows: Vec<usize> = match &keys.row_ids {
                Some(ids) => ids.iter().map(|&i| i as usize).collect(),
                None => (0..column.len()).collect(),
            };
            let code = |row: usize| rows.iter().position(|&r| r == row).map(|i| keys.keys[i]);
            // DataFusion's hash join compares its key columns so.
            let cmp = JoinKeyComparator::new(
                std::slice::from_ref(column),
                std::slice::from_ref(column),
                &[Default::default()],
                null_equality,
            )
            .unwrap();
            for i in 0..column.len() {
                for j in 0..column.len() {
                    let coded_equal = matches!((code(i), code(j)), (Some(a), Some(b)) if a == b);
                    assert_eq!(
                        coded_equal,
                        cmp.is_equal(i, j),
                        "{} rows {i} and {j} under {null_equality:?}",
                        column.data_type()
                    );
                }
            }
        }
    }
}

#[test]
fn hashed_keys_keep_or_drop_nulls_by_null_equality() {
    let build = vec![arr(StringArray::from(vec![None::<&str>, Some("x")]))];
    let null = KeySpec::try_new(&[DataType::Utf8], NullEquality::NullEqualsNull).unwrap();
    let encoder = KeyEncoder::for_build_side(&null, &build).unwrap();
    assert_eq!(encoder.encode(&build).unwrap().keys.len(), 2);
    let nothing = spec(&[DataType::Utf8]);
    let encoder = KeyEncoder::for_build_side(&nothing, &build).unwrap();
    assert_eq!(encoder.encode(&build).unwrap().row_ids, Some(vec![1]));
}

#[test]
fn parallel_encoding_matches_one_pass_with_and_without_dropped_rows() {
    let rows = 3 * (1 << 20) + 12_345;
    // Int32 keys, which pack (a single Int64 column would be used raw).
    let values: Vec<Option<i32>> = (0..rows as i64)
        .map(|i| (i % 1_000_003 != 7).then_some(((i * 7919) % 5_000_000 - 2_000_000) as i32))
        .collect();
    let with_nulls = arr(Int32Array::from(values));
    let without_nulls = arr(Int32Array::from_iter_values(
        (0..rows as i64).map(|i| ((i * 31) % 4_000_000) as i32),
    ));
    for (column, equality) in [
        (&with_nulls, NullEquality::NullEqualsNothing),
        (&with_nulls, NullEquality::NullEqualsNull),
        (&without_nulls, NullEquality::NullEqualsNothing),
    ] {
        let spec = KeySpec::try_new(&[DataType::Int32], equality).unwrap();
        let encoder = KeyEncoder::for_build_side(&spec, std::slice::from_ref(column)).unwrap();
        assert_eq!(encoder.kind(), "packed");
        let one_pass = encoder.encode(std::slice::from_ref(column)).unwrap();
        for threads in [2, 3, 16] {
            let parallel = encoder
                .encode_parallel(std::slice::from_ref(column), threads)
                .unwrap();
            assert_eq!(
                parallel.keys, one_pass.keys,
                "{equality:?}, {threads} threads"
            );
            assert_eq!(
                parallel.row_ids, one_pass.row_ids,
                "{equality:?}, {threads} threads"
            );
        }
    }
    // A probe side with values outside the build range drops rows in
    // some slices only.
    // (Int32 keys pack; a single Int64 column would be used raw.)
    let spec = KeySpec::try_new(&[DataType::Int32], NullEquality::NullEqualsNothing).unwrap();
    let build = arr(Int32Array::from_iter_values(0..1000));
    let encoder = KeyEncoder::for_build_side(&spec, &[build]).unwrap();
    assert_eq!(encoder.kind(), "packed");
    let probe = arr(Int32Array::from_iter_values((0..rows).map(|i| {
        if i < (1 << 21) {
            i % 1000
        } else {
            i
        }
    })));
    let one_pass = encoder.encode(std::slice::from_ref(&probe)).unwrap();
    let parallel = encoder.encode_parallel(&[probe], 3).unwrap();
    assert_eq!(parallel.keys, one_pass.keys);
    assert_eq!(parallel.row_ids, one_pass.row_ids);
    assert!(one_pass.row_ids.is_some());
}

/// Two key columns cut into batches of many lengths (empty ones too), the
/// cuts falling anywhere in the threads' ranges: coded where they lie, the
/// same keys and dropped rows as over the columns made contiguous.
#[test]
fn packed_keys_coded_piece_by_piece_match_those_of_the_concatenation() {
    let spec = KeySpec::try_new(&[DataType::Int64, DataType::Int32], NullEquality::NullEqualsNothing)
        .unwrap();
    let build = [
        arr(Int64Array::from_iter_values(0..200_000)),
        arr(Int32Array::from_iter_values((0..200_000).map(|i| i % 7 - 3))),
    ];
    let encoder = KeyEncoder::for_build_side(&spec, &build).unwrap();
    assert_eq!(encoder.kind(), "packed");
    let rows = 2 * (1 << 20) + 77_777;
    // Probe keys, some outside the build side's ranges (dropped).
    let first: Vec<i64> = (0..rows as i64).map(|i| (i * 7919) % 230_000 - 10_000).collect();
    let second: Vec<i32> = (0..rows as i32).map(|i| i % 9 - 4).collect();
    // Empty pieces, tiny ones and large ones.
    let lengths = [0, 1, 5_000, 0, 123_457, 8_192, 300_001, 3];
    let mut cuts = vec![0usize];
    for length in lengths.iter().cycle() {
        let at = *cuts.last().unwrap();
        if at == rows {
            break;
        }
        cuts.push((at + length).min(rows));
    }
    let pieces: Vec<Vec<ArrayRef>> = vec![
        cuts.windows(2)
            .map(|w| arr(Int64Array::from(first[w[0]..w[1]].to_vec())))
            .collect(),
        cuts.windows(2)
            .map(|w| arr(Int32Array::from(second[w[0]..w[1]].to_vec())))
            .collect(),
    ];
    assert!(pieces[0].iter().any(|p| p.is_empty()) && pieces[0].len() > 10);
    assert!(encoder.codes_pieces_in_place(&pieces));
    let whole = [
        arr(Int64Array::from(first.clone())),
        arr(Int32Array::from(second.clone())),
    ];
    let expected = encoder.encode(&whole).unwrap();
    assert!(expected.row_ids.is_some(), "no probe row was dropped");
    for threads in [1, 2, 3, 16] {
        let got = encoder.encode_pieces_parallel(&pieces, threads).unwrap();
        assert_eq!(got.keys, expected.keys, "{threads} threads");
        assert_eq!(got.row_ids, expected.row_ids, "{threads} threads");
    }
    // No piece at all: no key.
    let none = encoder
        .encode_pieces_parallel(&[Vec::new(), Vec::new()], 4)
        .unwrap();
    assert!(none.keys.is_empty());
    // A NULL key, or keys that are not packed, go through the columns.
    let with_null = vec![
        vec![arr(Int64Array::from(vec![Some(1), None]))],
        vec![arr(Int32Array::from(vec![1, 2]))],
    ];
    assert!(!encoder.codes_pieces_in_place(&with_null));
    let strings = spec_of_strings();
    assert!(!strings.codes_pieces_in_place(&[vec![arr(StringArray::from(vec!["a"]))]]));
    assert!(strings
        .encode_pieces_parallel(&[vec![arr(StringArray::from(vec!["a"]))]], 2)
        .is_err());
}

/// A hashed encoder: string keys.
fn spec_of_strings() -> KeyEncoder {
    let spec = KeySpec::try_new(&[DataType::Utf8], NullEquality::NullEqualsNothing).unwrap();
    let encoder =
        KeyEncoder::for_build_side(&spec, &[arr(StringArray::from(vec!["a", "b"]))]).unwrap();
    assert_eq!(encoder.kind(), "hashed");
    encoder
}

#[test]
fn the_range_of_a_large_column_found_in_slices_is_that_of_one_pass() {
    // 5 M rows: two or more slices on any host with two cores.
    let rows = 5_000_000;
    let column = arr(Int32Array::from_iter((0..rows).map(|i| match i {
        3 => Some(9_000_000),
        _ if i == rows - 2 => Some(-7),
        _ if i % 11 == 0 => None,
        _ => Some(i % 1000),
    })));
    assert_eq!(
        value_range_in_parallel(&column, 8).unwrap(),
        (-7, 9_000_000)
    );
    assert_eq!(
        value_range_in_parallel(&column, 8).unwrap(),
        value_range(&column).unwrap()
    );
    let nulls = arr(Int32Array::from(vec![None; rows as usize]));
    assert_eq!(value_range_in_parallel(&nulls, 8).unwrap(), (1, 0));
}

#[test]
fn a_type_mismatch_is_an_error_not_a_panic() {
    let s = spec(&[DataType::Int64]);
    let good = arr(Int64Array::from(vec![1]));
    let encoder = KeyEncoder::for_build_side(&s, std::slice::from_ref(&good)).unwrap();
    assert!(encoder
        .encode(&[arr(StringArray::from(vec!["a"]))])
        .is_err());
    assert!(encoder.encode(&[good.clone(), good]).is_err());
}

#[test]
fn only_raw_eight_byte_keys_of_the_build_sides_type_are_read_in_place() {
    let raw = KeyEncoder::for_build_side(
        &spec(&[DataType::Int64]),
        &[arr(Int64Array::from(vec![1, 5, 9]))],
    )
    .unwrap();
    assert_eq!(raw.kind(), "raw");
    assert!(raw.reads_in_place(&DataType::Int64));
    // Another type's words are not this encoder's keys.
    assert!(!raw.reads_in_place(&DataType::UInt64));
    assert!(!raw.reads_in_place(&DataType::Int32));
    // Packed keys are offsets from the build minimum, not the words.
    let packed = KeyEncoder::for_build_side(
        &spec(&[DataType::Int32]),
        &[arr(Int32Array::from(vec![-3, 4, 0]))],
    )
    .unwrap();
    assert_eq!(packed.kind(), "packed");
    assert!(!packed.reads_in_place(&DataType::Int32));
    // Floats are coded by equality, strings hashed, several keys combined.
    let float = KeyEncoder::for_build_side(
        &spec(&[DataType::Float64]),
        &[arr(Float64Array::from(vec![0.5, -0.0]))],
    )
    .unwrap();
    assert!(!float.reads_in_place(&DataType::Float64));
    let strings = KeyEncoder::for_build_side(
        &spec(&[DataType::Utf8]),
        &[arr(StringArray::from(vec!["a", "b"]))],
    )
    .unwrap();
    assert!(!strings.reads_in_place(&DataType::Utf8));
    let two = KeyEncoder::for_build_side(
        &spec(&[DataType::Int64, DataType::Int64]),
        &[arr(Int64Array::from(vec![1, 2])), arr(Int64Array::from(vec![3, 4]))],
    )
    .unwrap();
    assert!(!two.reads_in_place(&DataType::Int64));
}
