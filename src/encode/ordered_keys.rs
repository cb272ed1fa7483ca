//! Sort keys as one order-preserving u64 per row: ascending codes are the
//! sort order (each column's direction and NULL placement), and equal codes
//! are equal keys, so the device sorts plain integers. The sort-merge join
//! codes its join keys (both sides together); the sorted group-by codes its
//! group keys (one side, NULL a group of its own) and decodes each group's
//! code back into its key ([`OrderedKeyEncoder::decode`]).
//!
//! Each key column is coded as its distance from the smallest value of both
//! sides (from the largest, for a descending column), in just enough bits
//! for the two sides' range, with one more code for NULL placed first or
//! last; the columns are packed first column highest. When NULL equals
//! nothing and NULL keys exist, one more low bit tells the sides apart on
//! rows with a NULL key (1 on the left, 0 on the right), so those rows never
//! match while each side keeps its order. Fixed-width key types only; a key
//! whose codes need more than 64 bits is not encoded (the join then runs on
//! the CPU).

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::*;
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};

use crate::encode::keys::{
    code_bits, column_of_values, field_of, for_64_bit_integer_type, for_each_value,
    pieces_value_range, KeySpec,
};
use crate::gpu::launch::CodeTransform;
use crate::gpu::zeroed_for_fill;
use crate::host::parallel::on_row_chunks;

/// The code of one key column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColumnCode {
    /// Smallest and largest non-NULL value of both sides (`max < min`: none).
    min: i128,
    max: i128,
    descending: bool,
    nulls_first: bool,
    /// Whether either side has a NULL in this column (it then has a code).
    has_null: bool,
    bits: u32,
}

impl ColumnCode {
    fn new(min: i128, max: i128, options: SortOptions, has_null: bool) -> Self {
        Self {
            min,
            max,
            descending: options.descending,
            nulls_first: options.nulls_first,
            has_null,
            bits: code_bits(min, max, has_null),
        }
    }

    /// Added to every value's code: 1 when NULL takes code 0.
    fn value_base(&self) -> u64 {
        u64::from(self.has_null && self.nulls_first)
    }

    fn null_code(&self) -> u64 {
        if self.nulls_first || self.max < self.min {
            0
        } else {
            ((self.max as u128).wrapping_sub(self.min as u128) as u64).wrapping_add(1)
        }
    }

    /// The code of a value within `[min, max]`.
    #[inline]
    fn code(&self, value: i128) -> u64 {
        let distance = if self.descending {
            (self.max as u128).wrapping_sub(value as u128)
        } else {
            (value as u128).wrapping_sub(self.min as u128)
        };
        (distance as u64) + self.value_base()
    }
}

/// For a key type whose values the device codes from their own 8-byte
/// words (see [`OrderedKeyEncoder::device_transform`]), what a word is
/// XORed with to compare as the values do: the sign bit for signed types,
/// nothing for unsigned ones. `None` for other types.
pub(crate) fn raw_word_flip(data_type: &DataType) -> Option<u64> {
    match data_type {
        DataType::Int64 | DataType::Date64 | DataType::Timestamp(_, _) => Some(1 << 63),
        DataType::UInt64 => Some(0),
        _ => None,
    }
}

/// A word of a type of [`raw_word_flip`] as the value it holds.
pub(crate) fn raw_word_value(word: u64, flip: u64) -> i128 {
    match flip {
        0 => i128::from(word),
        _ => i128::from(word as i64),
    }
}

/// Which side of the join a column belongs to (for the NULL bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeySide {
    Left,
    Right,
}

/// How one join's keys are coded, fixed from both sides' key columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OrderedKeyEncoder {
    columns: Vec<ColumnCode>,
    /// The low bit that keeps rows with a NULL key from matching.
    null_bit: bool,
    bits: u32,
}

impl OrderedKeyEncoder {
    /// The coding for key columns `left` and `right` (one entry per key
    /// column each, of the planned `types`), or `None` when the codes would
    /// need more than 64 bits or a type has no fixed-width code. The
    /// columns' ranges are found on up to `threads` threads.
    #[cfg(test)]
    pub(crate) fn for_sides(
        types: &[DataType],
        sort_options: &[SortOptions],
        null_equality: NullEquality,
        left: &[ArrayRef],
        right: &[ArrayRef],
        threads: usize,
    ) -> Result<Option<Self>> {
        let one_piece = |columns: &[ArrayRef]| -> Vec<Vec<ArrayRef>> {
            columns
                .iter()
                .map(|c| vec![std::sync::Arc::clone(c)])
                .collect()
        };
        Self::for_side_pieces(
            types,
            sort_options,
            null_equality,
            &one_piece(left),
            &one_piece(right),
            threads,
        )
    }

    /// [`Self::for_sides`] over key columns held in pieces (per key column,
    /// its values batch by batch), without making them contiguous.
    pub(crate) fn for_side_pieces(
        types: &[DataType],
        sort_options: &[SortOptions],
        null_equality: NullEquality,
        left: &[Vec<ArrayRef>],
        right: &[Vec<ArrayRef>],
        threads: usize,
    ) -> Result<Option<Self>> {
        if sort_options.len() != types.len()
            || left.len() != types.len()
            || right.len() != types.len()
        {
            return Err(DataFusionError::Internal(format!(
                "{} key types, {} sort options, {} and {} key columns",
                types.len(),
                sort_options.len(),
                left.len(),
                right.len()
            )));
        }
        if !types.iter().all(KeySpec::is_packable) {
            return Ok(None);
        }
        let mut ranges = Vec::with_capacity(types.len());
        for column in 0..types.len() {
            let (mut min, mut max) = (i128::MAX, i128::MIN);
            let mut has_null = false;
            for side in [&left[column], &right[column]] {
                let (side_min, side_max) = pieces_value_range(side, threads)?;
                if side_min <= side_max {
                    min = min.min(side_min);
                    max = max.max(side_max);
                }
                has_null |= side.iter().any(|piece| piece.logical_null_count() > 0);
            }
            if min > max {
                (min, max) = (1, 0);
            }
            ranges.push((min, max, has_null));
        }
        Ok(Self::from_ranges(sort_options, null_equality, &ranges))
    }

    /// The coding of one key column of an 8-byte integer type without
    /// NULLs on either side, whose values span `[min, max]` on both sides
    /// together (`max < min`: no rows), found elsewhere (on the device);
    /// `None` where [`Self::for_side_pieces`] would not code `types`.
    pub(crate) fn for_value_range(
        types: &[DataType],
        sort_options: &[SortOptions],
        null_equality: NullEquality,
        (min, max): (i128, i128),
    ) -> Option<Self> {
        if types.len() != 1 || sort_options.len() != 1 || !KeySpec::is_packable(&types[0]) {
            return None;
        }
        let range = if min > max { (1, 0) } else { (min, max) };
        Self::from_ranges(sort_options, null_equality, &[(range.0, range.1, false)])
    }

    /// The coding of key columns with the value ranges (and whether a NULL
    /// was seen) of `ranges`; `None` when the codes need more than 64 bits.
    fn from_ranges(
        sort_options: &[SortOptions],
        null_equality: NullEquality,
        ranges: &[(i128, i128, bool)],
    ) -> Option<Self> {
        let mut columns = Vec::with_capacity(ranges.len());
        let mut bits = 0u32;
        let mut any_null = false;
        for (&(min, max, has_null), options) in ranges.iter().zip(sort_options) {
            let code = ColumnCode::new(min, max, *options, has_null);
            bits = bits.saturating_add(code.bits);
            any_null |= has_null;
            columns.push(code);
        }
        let null_bit = any_null && null_equality == NullEquality::NullEqualsNothing;
        bits = bits.saturating_add(u32::from(null_bit));
        (bits <= 64).then_some(Self {
            columns,
            null_bit,
            bits,
        })
    }

    /// Bits the codes use (every code is below `2^bits`).
    pub(crate) fn bits(&self) -> u32 {
        self.bits
    }

    /// How the device makes the codes itself from the key column's own
    /// buffers, where that gives exactly [`Self::encode`]'s codes: one key
    /// column of 8-byte integers (of the planned `types`) with no NULL on
    /// either side. Each code is then the value's distance from the
    /// smallest value (or the largest, descending), so the raw values go
    /// to the device as they are: the host only finds the value range (and
    /// checks the order of a side that arrives sorted), and writes no codes.
    pub(crate) fn device_transform(&self, types: &[DataType]) -> Option<CodeTransform> {
        let ([code], [data_type]) = (self.columns.as_slice(), types) else {
            return None;
        };
        if raw_word_flip(data_type).is_none() || code.has_null || self.null_bit {
            return None;
        }
        let base = if code.descending { code.max } else { code.min };
        Some(CodeTransform {
            // The bits of the value as its column holds them.
            base: base as u64,
            descending: code.descending,
        })
    }

    /// The key columns (of the planned `types`) whose codes are `codes`:
    /// the inverse of [`Self::encode`] where codes carry no NULL bit (NULL
    /// equals NULL, or no NULL was seen).
    pub(crate) fn decode(&self, codes: &[u64], types: &[DataType]) -> Result<Vec<ArrayRef>> {
        if self.null_bit || types.len() != self.columns.len() {
            return Err(DataFusionError::Internal(format!(
                "decoding {} key columns of {} coded, null bit {}",
                types.len(),
                self.columns.len(),
                self.null_bit
            )));
        }
        let mut shift = self.bits;
        let mut columns = Vec::with_capacity(types.len());
        for (code, data_type) in self.columns.iter().zip(types) {
            // The first column holds the highest bits.
            shift -= code.bits;
            let code_of = |word: u64| field_of(word, shift, code.bits);
            let null_code = code.null_code();
            let nulls = code
                .has_null
                .then(|| NullBuffer::from_iter(codes.iter().map(|&w| code_of(w) != null_code)))
                .filter(|nulls| nulls.null_count() > 0);
            let values = codes.iter().map(|&word| {
                let c = code_of(word);
                if code.has_null && c == null_code {
                    // A NULL's slot holds the minimum; its value is never read.
                    return code.min;
                }
                let distance = i128::from(c.wrapping_sub(code.value_base()));
                if code.descending {
                    code.max - distance
                } else {
                    code.min + distance
                }
            });
            columns.push(column_of_values(data_type, codes.len(), values, nulls)?);
        }
        Ok(columns)
    }

    /// The code of every row of `columns` (key columns of `side`), on up to
    /// `threads` threads.
    pub(crate) fn encode(
        &self,
        columns: &[ArrayRef],
        side: KeySide,
        threads: usize,
    ) -> Result<Vec<u64>> {
        const MIN_ROWS_PER_THREAD: usize = 1 << 20;
        let rows = columns.first().map_or(0, |c| c.len());
        let threads = threads.min(rows / MIN_ROWS_PER_THREAD).max(1);
        // One buffer filled in place by every thread, each code written
        // without reading the buffer first (see `KeyEncoder::encode_parallel`).
        let mut keys = zeroed_for_fill::<u64>(rows);
        let mut any_null = self.null_bit.then(|| zeroed_for_fill::<bool>(rows));
        on_row_chunks(
            &mut keys,
            any_null.as_deref_mut(),
            rows.div_ceil(threads),
            |start, keys, any_null| {
                let slice: Vec<ArrayRef> =
                    columns.iter().map(|c| c.slice(start, keys.len())).collect();
                self.encode_rows(&slice, side, keys, any_null)
            },
        )?;
        Ok(keys)
    }

    /// The codes of `columns` (of `keys.len()` rows) into `keys`, NULLs
    /// noted in `any_null` (zeroed on entry) where codes carry a NULL bit.
    fn encode_rows(
        &self,
        columns: &[ArrayRef],
        side: KeySide,
        keys: &mut [u64],
        mut any_null: Option<&mut [bool]>,
    ) -> Result<()> {
        for (i, (column, code)) in columns.iter().zip(&self.columns).enumerate() {
            code_column(column, code, i == 0, keys, any_null.as_deref_mut())?;
        }
        if let Some(any_null) = any_null {
            let bit = u64::from(side == KeySide::Left);
            for (key, &null) in keys.iter_mut().zip(any_null.iter()) {
                *key = (*key << 1) | if null { bit } else { 0 };
            }
        }
        Ok(())
    }
}

/// `keys[i] = keys[i] << bits | code(column[i])`, or for the `first`
/// column `keys[i] = code(column[i])` without reading `keys`; NULLs noted in
/// `any_null` (only written where a row is NULL).
fn code_column(
    column: &ArrayRef,
    code: &ColumnCode,
    first: bool,
    keys: &mut [u64],
    any_null: Option<&mut [bool]>,
) -> Result<()> {
    let nulls = column.logical_nulls().filter(|n| n.null_count() > 0);
    let put = |key: &mut u64, value: u64| {
        *key = if first || code.bits >= 64 {
            value
        } else {
            (*key << code.bits) | value
        };
    };
    if let Some(nulls) = &nulls {
        if let Some(any_null) = any_null {
            for i in nulls
                .iter()
                .enumerate()
                .filter_map(|(i, valid)| (!valid).then_some(i))
            {
                any_null[i] = true;
            }
        }
    }
    let null_code = code.null_code();
    // Values of up to 64 bits: wrapping u64 arithmetic, with a loop free of
    // NULL checks when the column has none (the hot path).
    macro_rules! code64 {
        ($arrow_type:ty) => {{
            let values = column.as_primitive::<$arrow_type>().values();
            let (min, max, base) = (code.min as u64, code.max as u64, code.value_base());
            let value = |v: u64| {
                if code.descending {
                    max.wrapping_sub(v).wrapping_add(base)
                } else {
                    v.wrapping_sub(min).wrapping_add(base)
                }
            };
            match &nulls {
                None => {
                    for (key, &v) in keys.iter_mut().zip(values.iter()) {
                        put(key, value(v as i128 as u64));
                    }
                }
                Some(nulls) => {
                    for (i, (key, &v)) in keys.iter_mut().zip(values.iter()).enumerate() {
                        let coded = if nulls.is_null(i) {
                            null_code
                        } else {
                            value(v as i128 as u64)
                        };
                        put(key, coded);
                    }
                }
            }
            return Ok(());
        }};
    }
    for_64_bit_integer_type!(column.data_type(), code64);
    // Decimal128, Boolean, times and durations: through i128.
    for_each_value(column, |i, v| {
        let value = if nulls.as_ref().is_some_and(|n| n.is_null(i)) {
            null_code
        } else {
            code.code(v)
        };
        put(&mut keys[i], value);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        BooleanArray, Decimal128Array, Int32Array, Int64Array, UInt64Array,
    };
    use datafusion::arrow::compute::{lexsort_to_indices, SortColumn};
    use std::sync::Arc;

    fn arr<A: Array + 'static>(a: A) -> ArrayRef {
        Arc::new(a)
    }

    /// Codes sort the rows exactly as arrow's lexicographic sort with the
    /// same options, ties aside.
    fn assert_codes_follow_lexsort(columns: Vec<ArrayRef>, options: Vec<SortOptions>) {
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        let encoder = OrderedKeyEncoder::for_sides(
            &types,
            &options,
            NullEquality::NullEqualsNull,
            &columns,
            &columns,
            4,
        )
        .unwrap()
        .unwrap();
        let codes = encoder.encode(&columns, KeySide::Left, 1).unwrap();
        // Each code decodes into its row's key.
        assert_eq!(encoder.decode(&codes, &types).unwrap(), columns);
        assert!(codes
            .iter()
            .all(|&c| encoder.bits() >= 64 || c < 1 << encoder.bits()));
        let sort_columns: Vec<SortColumn> = columns
            .iter()
            .zip(&options)
            .map(|(c, o)| SortColumn {
                values: Arc::clone(c),
                options: Some(*o),
            })
            .collect();
        let order = lexsort_to_indices(&sort_columns, None).unwrap();
        let sorted: Vec<u64> = order.values().iter().map(|&i| codes[i as usize]).collect();
        assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{sorted:?}");
        // Equal codes exactly where the rows are equal.
        for i in 0..codes.len() {
            for j in 0..codes.len() {
                let same = columns.iter().all(|c| {
                    let (a, b) = (c.slice(i, 1), c.slice(j, 1));
                    a.to_data() == b.to_data()
                });
                assert_eq!(codes[i] == codes[j], same, "rows {i} and {j}");
            }
        }
    }

    #[test]
    fn codes_follow_every_direction_and_null_placement() {
        for descending in [false, true] {
            for nulls_first in [false, true] {
                let options = SortOptions {
                    descending,
                    nulls_first,
                };
                assert_codes_follow_lexsort(
                    vec![arr(Int64Array::from(vec![
                        Some(5),
                        None,
                        Some(-3),
                        Some(5),
                        Some(i64::MAX),
                        Some(i64::MIN + 1),
                    ]))],
                    vec![options],
                );
                assert_codes_follow_lexsort(
                    vec![
                        arr(Int32Array::from(vec![
                            Some(2),
                            None,
                            Some(1),
                            Some(2),
                            Some(1),
                            None,
                        ])),
                        arr(Decimal128Array::from(vec![
                            Some(10),
                            Some(7),
                            None,
                            Some(-1),
                            Some(10),
                            Some(3),
                        ])),
                        arr(BooleanArray::from(vec![
                            Some(true),
                            Some(false),
                            Some(true),
                            None,
                            Some(true),
                            Some(false),
                        ])),
                    ],
                    vec![
                        options,
                        SortOptions {
                            descending: !descending,
                            nulls_first,
                        },
                        options,
                    ],
                );
            }
        }
    }

    #[test]
    fn unsigned_keys_keep_their_order() {
        assert_codes_follow_lexsort(
            vec![arr(UInt64Array::from(vec![u64::MAX, 0, 1 << 63, 7]))],
            vec![SortOptions::default()],
        );
    }

    #[test]
    fn null_keys_never_match_when_null_equals_nothing() {
        let types = [DataType::Int64];
        let options = [SortOptions::default()];
        let left = vec![arr(Int64Array::from(vec![None, Some(1), Some(2)]))];
        let right = vec![arr(Int64Array::from(vec![Some(1), None]))];
        let encoder = OrderedKeyEncoder::for_sides(
            &types,
            &options,
            NullEquality::NullEqualsNothing,
            &left,
            &right,
            4,
        )
        .unwrap()
        .unwrap();
        let l = encoder.encode(&left, KeySide::Left, 1).unwrap();
        let r = encoder.encode(&right, KeySide::Right, 1).unwrap();
        assert_ne!(l[0], r[1], "NULL never equals NULL");
        assert_eq!(l[1], r[0]);
        assert!(l[1] < l[2]);
        // NULLs sort first by default (arrow's SortOptions) on both sides.
        assert!(l[0] < l[1] && r[1] < r[0]);

        let encoder = OrderedKeyEncoder::for_sides(
            &types,
            &options,
            NullEquality::NullEqualsNull,
            &left,
            &right,
            4,
        )
        .unwrap()
        .unwrap();
        let l = encoder.encode(&left, KeySide::Left, 1).unwrap();
        let r = encoder.encode(&right, KeySide::Right, 1).unwrap();
        assert_eq!(l[0], r[1], "NULL equals NULL");
    }

    #[test]
    fn keys_too_wide_or_not_fixed_width_are_not_encoded() {
        let wide = vec![
            arr(Int64Array::from(vec![i64::MIN, i64::MAX])),
            arr(Int64Array::from(vec![0, 1])),
        ];
        let types = [DataType::Int64, DataType::Int64];
        let options = [SortOptions::default(); 2];
        assert!(OrderedKeyEncoder::for_sides(
            &types,
            &options,
            NullEquality::NullEqualsNull,
            &wide,
            &wide,
            4,
        )
        .unwrap()
        .is_none());
        let text: Vec<ArrayRef> = vec![arr(datafusion::arrow::array::StringArray::from(vec!["a"]))];
        assert!(OrderedKeyEncoder::for_sides(
            &[DataType::Utf8],
            &options[..1],
            NullEquality::NullEqualsNull,
            &text,
            &text,
            4,
        )
        .unwrap()
        .is_none());
    }

    /// The raw words of an 8-byte column, as the device receives them.
    fn words(column: &ArrayRef) -> Vec<u64> {
        let data = column.to_data();
        data.buffers()[0].typed_data::<u64>()[data.offset()..][..data.len()].to_vec()
    }

    #[test]
    fn the_device_transform_gives_the_host_codes_where_it_applies() {
        use datafusion::arrow::array::TimestampNanosecondArray;
        let signed = arr(Int64Array::from(vec![i64::MAX, -1, i64::MIN, 0, 42]));
        let unsigned = arr(UInt64Array::from(vec![u64::MAX, 0, 1 << 63, 7]));
        let stamps = arr(TimestampNanosecondArray::from(vec![-5, 1_000, 3]));
        for (left, right) in [
            (signed.slice(1, 3), signed.slice(0, 5)),
            (unsigned.slice(0, 2), unsigned.slice(2, 2)),
            (Arc::clone(&stamps), stamps.slice(1, 2)),
        ] {
            for descending in [false, true] {
                let options = SortOptions {
                    descending,
                    nulls_first: true,
                };
                let encoder = OrderedKeyEncoder::for_sides(
                    &[left.data_type().clone()],
                    &[options],
                    NullEquality::NullEqualsNothing,
                    std::slice::from_ref(&left),
                    std::slice::from_ref(&right),
                    1,
                )
                .unwrap()
                .unwrap();
                let transform = encoder
                    .device_transform(&[left.data_type().clone()])
                    .expect("one 8-byte column without NULLs");
                for (side, column) in [(KeySide::Left, &left), (KeySide::Right, &right)] {
                    let host = encoder
                        .encode(std::slice::from_ref(column), side, 1)
                        .unwrap();
                    let device: Vec<u64> = words(column)
                        .into_iter()
                        .map(|w| transform.code(w))
                        .collect();
                    assert_eq!(device, host, "{:?} descending {descending}", column);
                }
            }
        }
        // A NULL on either side, two columns, or a narrower type: the host
        // codes the keys.
        let with_null = arr(Int64Array::from(vec![Some(1), None]));
        let narrow = arr(Int32Array::from(vec![1, 2]));
        let small = arr(Int64Array::from(vec![1, 2, 3]));
        for (types, left, right) in [
            (
                vec![DataType::Int64],
                vec![Arc::clone(&small)],
                vec![Arc::clone(&with_null)],
            ),
            (
                vec![DataType::Int64, DataType::Int64],
                vec![Arc::clone(&small), Arc::clone(&small)],
                vec![Arc::clone(&small), Arc::clone(&small)],
            ),
            (
                vec![DataType::Int32],
                vec![Arc::clone(&narrow)],
                vec![narrow],
            ),
        ] {
            let encoder = OrderedKeyEncoder::for_sides(
                &types,
                &vec![SortOptions::default(); types.len()],
                NullEquality::NullEqualsNull,
                &left,
                &right,
                1,
            )
            .unwrap()
            .unwrap();
            assert_eq!(encoder.device_transform(&types), None, "{types:?}");
        }
    }

    #[test]
    fn parallel_encoding_equals_one_thread() {
        let column = arr(Int64Array::from_iter_values(
            (0..(3 << 20)).map(|i: i64| (i * 7919) % 100_003 - 50_000),
        ));
        let encoder = OrderedKeyEncoder::for_sides(
            &[DataType::Int64],
            &[SortOptions::default()],
            NullEquality::NullEqualsNothing,
            std::slice::from_ref(&column),
            std::slice::from_ref(&column),
            4,
        )
        .unwrap()
        .unwrap();
        let one = encoder
            .encode(std::slice::from_ref(&column), KeySide::Right, 1)
            .unwrap();
        let four = encoder
            .encode(std::slice::from_ref(&column), KeySide::Right, 4)
            .unwrap();
        assert_eq!(one, four);
        // Two columns, the second with NULLs coded by a NULL bit: slices
        // of rows filled by different threads, NULL flags included.
        let with_nulls = arr(Int32Array::from_iter(
            (0..(3 << 20)).map(|i: i32| (i % 7 != 3).then_some(i % 1000)),
        ));
        let columns = vec![Arc::clone(&column), with_nulls];
        let encoder = OrderedKeyEncoder::for_sides(
            &[DataType::Int64, DataType::Int32],
            &[SortOptions::default(), SortOptions::default()],
            NullEquality::NullEqualsNull,
            &columns,
            &columns,
            4,
        )
        .unwrap()
        .unwrap();
        for side in [KeySide::Left, KeySide::Right] {
            let one = encoder.encode(&columns, side, 1).unwrap();
            let three = encoder.encode(&columns, side, 3).unwrap();
            assert_eq!(one, three);
            assert_eq!(one.len(), 3 << 20);
        }
    }

    #[test]
    fn a_range_found_elsewhere_codes_as_the_host_pass_does() {
        use datafusion::arrow::array::TimestampNanosecondArray;
        use datafusion::arrow::datatypes::TimeUnit;
        let columns: Vec<(DataType, ArrayRef, ArrayRef)> = vec![
            (
                DataType::Int64,
                arr(Int64Array::from(vec![-7, i64::MAX, 3])),
                arr(Int64Array::from(vec![i64::MIN + 1, 0])),
            ),
            (
                DataType::UInt64,
                arr(UInt64Array::from(vec![u64::MAX - 1, 1 << 63])),
                arr(UInt64Array::from(vec![5, 9])),
            ),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                arr(TimestampNanosecondArray::from(vec![-100, 40])),
                arr(TimestampNanosecondArray::from(Vec::<i64>::new())),
            ),
            (
                DataType::Int64,
                arr(Int64Array::from(Vec::<i64>::new())),
                arr(Int64Array::from(Vec::<i64>::new())),
            ),
        ];
        for (data_type, left, right) in columns {
            let flip = raw_word_flip(&data_type).expect("an 8-byte integer type");
            // The range as the device reports it: the ends of the words in
            // the flipped order.
            let words: Vec<u64> = [&left, &right]
                .iter()
                .flat_map(|column| crate::encode::keys::raw_words(column).to_vec())
                .collect();
            let low = words.iter().map(|w| w ^ flip).min().map(|w| w ^ flip);
            let high = words.iter().map(|w| w ^ flip).max().map(|w| w ^ flip);
            let range = match (low, high) {
                (Some(low), Some(high)) => (raw_word_value(low, flip), raw_word_value(high, flip)),
                _ => (1, 0),
            };
            for descending in [false, true] {
                let options = [SortOptions {
                    descending,
                    nulls_first: true,
                }];
                let types = [data_type.clone()];
                let host = OrderedKeyEncoder::for_sides(
                    &types,
                    &options,
                    NullEquality::NullEqualsNothing,
                    &[Arc::clone(&left)],
                    &[Arc::clone(&right)],
                    2,
                )
                .unwrap()
                .unwrap();
                let device = OrderedKeyEncoder::for_value_range(
                    &types,
                    &options,
                    NullEquality::NullEqualsNothing,
                    range,
                )
                .unwrap();
                assert_eq!(device, host, "{data_type} descending {descending}");
                assert_eq!(
                    device.device_transform(&types),
                    host.device_transform(&types)
                );
            }
        }
        // Several columns, or a type the device does not code from its words.
        let options = [SortOptions::default(); 2];
        assert!(OrderedKeyEncoder::for_value_range(
            &[DataType::Int64, DataType::Int64],
            &options,
            NullEquality::NullEqualsNothing,
            (0, 1)
        )
        .is_none());
        assert_eq!(raw_word_flip(&DataType::Int32), None);
        assert_eq!(raw_word_value(u64::MAX, 1 << 63), -1);
        assert_eq!(raw_word_value(u64::MAX, 0), i128::from(u64::MAX));
    }
}
