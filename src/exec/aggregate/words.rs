//! Arrow columns to the 64-bit words the device reduces, and back.
//!
//! Sums use the values' own two's-complement bits (a wrapping sum is the
//! same on signed and unsigned words). Minima and maxima use *ordered*
//! words, whose unsigned order is the type's order: signed values with the
//! sign bit flipped. A Decimal128 is two words, low and high.

use datafusion::arrow::array::{make_array, Array, ArrayData, ArrayRef, BooleanArray};
use datafusion::arrow::buffer::{Buffer, NullBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use super::spec::ValueKind;
use crate::ops::group_by::validity_bitmap;

const SIGN: u64 = 1 << 63;

/// The words of one column: low words, and high words for Decimal128.
#[derive(Debug, Default)]
pub(crate) struct Words {
    pub(crate) low: Vec<u64>,
    pub(crate) high: Vec<u64>,
}

fn width(data_type: &DataType) -> Result<usize> {
    data_type.primitive_width().ok_or_else(|| {
        DataFusionError::Internal(format!("{data_type} is not a fixed-width column"))
    })
}

/// The values of `array` as i64 (signed kinds) or u64 bit patterns
/// (unsigned kinds), NULL slots holding whatever the buffer holds.
fn widened(array: &dyn Array, kind: ValueKind) -> Result<Vec<u64>> {
    let data = array.to_data();
    let len = data.len();
    macro_rules! read {
        ($t:ty, $widen:expr) => {
            data.buffer::<$t>(0)[..len].iter().map($widen).collect()
        };
    }
    Ok(match (kind, width(data.data_type())?) {
        (ValueKind::Signed, 1) => read!(i8, |&v| v as i64 as u64),
        (ValueKind::Signed, 2) => read!(i16, |&v| v as i64 as u64),
        (ValueKind::Signed, 4) => read!(i32, |&v| v as i64 as u64),
        (ValueKind::Signed, 8) => read!(i64, |&v| v as u64),
        (ValueKind::Unsigned, 1) => read!(u8, |&v| u64::from(v)),
        (ValueKind::Unsigned, 2) => read!(u16, |&v| u64::from(v)),
        (ValueKind::Unsigned, 4) => read!(u32, |&v| u64::from(v)),
        (ValueKind::Unsigned, 8) => read!(u64, |&v| v),
        (ValueKind::Float64, 8) => read!(f64, |&v| v.to_bits()),
        (kind, width) => {
            return Err(DataFusionError::Internal(format!(
                "{kind:?} values of {width} bytes"
            )))
        }
    })
}

fn decimal_words(array: &dyn Array, ordered: bool) -> Words {
    let data = array.to_data();
    let values = &data.buffer::<i128>(0)[..data.len()];
    let flip = if ordered { SIGN } else { 0 };
    Words {
        low: values.iter().map(|&v| v as u64).collect(),
        high: values.iter().map(|&v| ((v >> 64) as u64) ^ flip).collect(),
    }
}

/// Words whose wrapping sum is the sum of the values.
pub(crate) fn sum_words(array: &dyn Array, kind: ValueKind) -> Result<Words> {
    match kind {
        ValueKind::Decimal128 => Ok(decimal_words(array, false)),
        kind => Ok(Words {
            low: widened(array, kind)?,
            high: Vec::new(),
        }),
    }
}

/// Words whose unsigned order is the values' order.
pub(crate) fn ordered_words(array: &dyn Array, kind: ValueKind) -> Result<Words> {
    match kind {
        ValueKind::Decimal128 => Ok(decimal_words(array, true)),
        ValueKind::Signed => Ok(Words {
            low: widened(array, kind)?
                .into_iter()
                .map(|w| w ^ SIGN)
                .collect(),
            high: Vec::new(),
        }),
        ValueKind::Unsigned => Ok(Words {
            low: widened(array, kind)?,
            high: Vec::new(),
        }),
        ValueKind::Float64 => Err(DataFusionError::Internal(
            "floats have no ordered words here".into(),
        )),
    }
}

/// The rows that take part: valid in `array` and, with a FILTER, where it
/// is true. `None` when that is every row.
pub(crate) fn row_validity(array: &dyn Array, filter: Option<&BooleanArray>) -> Option<Vec<u64>> {
    let nulls = array.logical_nulls();
    let filter = filter.filter(|f| f.null_count() > 0 || f.false_count() > 0);
    if nulls.is_none() && filter.is_none() {
        return None;
    }
    Some(validity_bitmap(array.len(), |i| {
        nulls.as_ref().is_none_or(|n| n.is_valid(i))
            && filter.is_none_or(|f| f.is_valid(i) && f.value(i))
    }))
}

/// A column of `data_type` from one word (and high word) per group, the
/// words ordered ones when `ordered`, NULL where `valid` is false.
pub(crate) fn column_from_words(
    data_type: &DataType,
    kind: ValueKind,
    ordered: bool,
    low: &[u64],
    high: &[u64],
    valid: Option<Vec<bool>>,
) -> Result<ArrayRef> {
    let len = low.len();
    let unflip = |w: u64| if ordered { w ^ SIGN } else { w };
    let buffer = match (kind, width(data_type)?) {
        (ValueKind::Decimal128, 16) => {
            if high.len() != len {
                return Err(DataFusionError::Internal(
                    "decimal result without its high words".into(),
                ));
            }
            Buffer::from_vec(
                low.iter()
                    .zip(high)
                    .map(|(&lo, &hi)| ((u128::from(unflip(hi)) << 64) | u128::from(lo)) as i128)
                    .collect::<Vec<i128>>(),
            )
        }
        (ValueKind::Signed, 1) => Buffer::from_vec(narrow(low, unflip, |w| w as i64 as i8)),
        (ValueKind::Signed, 2) => Buffer::from_vec(narrow(low, unflip, |w| w as i64 as i16)),
        (ValueKind::Signed, 4) => Buffer::from_vec(narrow(low, unflip, |w| w as i64 as i32)),
        (ValueKind::Signed, 8) => Buffer::from_vec(narrow(low, unflip, |w| w as i64)),
        (ValueKind::Unsigned, 1) => Buffer::from_vec(narrow(low, |w| w, |w| w as u8)),
        (ValueKind::Unsigned, 2) => Buffer::from_vec(narrow(low, |w| w, |w| w as u16)),
        (ValueKind::Unsigned, 4) => Buffer::from_vec(narrow(low, |w| w, |w| w as u32)),
        (ValueKind::Unsigned, 8) => Buffer::from_vec(low.to_vec()),
        (ValueKind::Float64, 8) => Buffer::from_vec(narrow(low, |w| w, f64::from_bits)),
        (kind, width) => {
            return Err(DataFusionError::Internal(format!(
                "{kind:?} result as {data_type} of {width} bytes"
            )))
        }
    };
    let nulls = valid.map(NullBuffer::from).filter(|n| n.null_count() > 0);
    let data = ArrayData::builder(data_type.clone())
        .len(len)
        .add_buffer(buffer)
        .nulls(nulls)
        .build()?;
    Ok(make_array(data))
}

fn narrow<T>(words: &[u64], unflip: impl Fn(u64) -> u64, to: impl Fn(u64) -> T) -> Vec<T> {
    words.iter().map(|&w| to(unflip(w))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        AsArray, Date32Array, Decimal128Array, Int16Array, UInt32Array,
    };
    use datafusion::arrow::datatypes::{Date32Type, Decimal128Type, Int16Type};

    #[test]
    fn ordered_words_sort_like_the_values() {
        let values = Int16Array::from(vec![-5, 3, i16::MIN, 0, i16::MAX]);
        let words = ordered_words(&values, ValueKind::Signed).unwrap().low;
        let mut by_word: Vec<usize> = (0..5).collect();
        by_word.sort_by_key(|&i| words[i]);
        assert_eq!(by_word, vec![2, 0, 3, 1, 4]);
        let back = column_from_words(&DataType::Int16, ValueKind::Signed, true, &words, &[], None)
            .unwrap();
        assert_eq!(back.as_primitive::<Int16Type>(), &values);
    }

    #[test]
    fn decimals_round_trip_through_two_words() {
        let values = Decimal128Array::from(vec![-(1i128 << 70), 12345, -1, i128::MAX])
            .with_precision_and_scale(38, 2)
            .unwrap();
        for ordered in [false, true] {
            let words = if ordered {
                ordered_words(&values, ValueKind::Decimal128).unwrap()
            } else {
                sum_words(&values, ValueKind::Decimal128).unwrap()
            };
            let back = column_from_words(
                values.data_type(),
                ValueKind::Decimal128,
                ordered,
                &words.low,
                &words.high,
                Some(vec![true, true, false, true]),
            )
            .unwrap();
            let back = back.as_primitive::<Decimal128Type>();
            assert_eq!(back.value(0), -(1i128 << 70));
            assert_eq!(back.value(3), i128::MAX);
            assert!(back.is_null(2));
            assert_eq!(back.data_type(), values.data_type());
        }
        let ordered = ordered_words(&values, ValueKind::Decimal128).unwrap();
        let key = |i: usize| (ordered.high[i], ordered.low[i]);
        assert!(key(0) < key(2) && key(2) < key(1) && key(1) < key(3));
    }

    #[test]
    fn sliced_and_typed_columns_read_from_their_offset() {
        let dates = Date32Array::from(vec![1, 2, 3, 4]).slice(1, 2);
        let words = sum_words(&dates, ValueKind::Signed).unwrap().low;
        assert_eq!(words, vec![2, 3]);
        let back = column_from_words(
            &DataType::Date32,
            ValueKind::Signed,
            false,
            &words,
            &[],
            None,
        )
        .unwrap();
        assert_eq!(back.as_primitive::<Date32Type>().values(), &[2, 3]);
        let unsigned = UInt32Array::from(vec![u32::MAX, 0]);
        assert_eq!(
            ordered_words(&unsigned, ValueKind::Unsigned).unwrap().low,
            vec![u64::from(u32::MAX), 0]
        );
    }

    #[test]
    fn validity_combines_nulls_and_the_filter() {
        let values = Int16Array::from(vec![Some(1), None, Some(3), Some(4)]);
        let filter = BooleanArray::from(vec![Some(true), Some(true), None, Some(false)]);
        let bits = row_validity(&values, Some(&filter)).unwrap();
        assert_eq!(bits, vec![0b0001]);
        let all_true = BooleanArray::from(vec![true; 4]);
        let no_nulls = Int16Array::from(vec![1, 2, 3, 4]);
        assert!(row_validity(&no_nulls, Some(&all_true)).is_none());
    }
}
