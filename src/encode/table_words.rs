//! A table column as the device column cache keeps it: one 8-byte word a
//! row (signed integers, dates, timestamps, booleans and decimals as
//! `i64`; floats as the bits of an `f64`; strings as codes into a
//! dictionary of their distinct values, kept on the host) and a validity
//! bitmap where it has NULLs. Host work only.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, LargeStringArray, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, Float64Type, Int16Type, Int32Type,
    Int64Type, Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt8Type,
};

use crate::gpu::WordKind;

/// Distinct strings a column may hold in one part of a table and still be
/// coded: beyond, its strings are too many for the device's group tables
/// and its codes would save little.
pub const MAX_DICTIONARY_VALUES: usize = 1024;

/// A column's values on the host, ready to be copied: 8-byte words, or
/// 4-byte signed integers where every value fits (half the bytes to copy
/// and read; the device widens them).
#[derive(Debug)]
pub enum WordValues {
    Wide(Vec<u64>),
    Narrow(Vec<i32>),
}

impl WordValues {
    /// The values' bytes.
    pub fn bytes(&self) -> &[u8] {
        use datafusion::arrow::datatypes::ToByteSlice;
        match self {
            WordValues::Wide(words) => words.to_byte_slice(),
            WordValues::Narrow(values) => values.to_byte_slice(),
        }
    }

    /// Whether the values are 4-byte integers.
    pub fn narrow(&self) -> bool {
        matches!(self, WordValues::Narrow(_))
    }
}

/// A column's words on the host, ready to be copied.
#[derive(Debug)]
pub struct HostWords {
    pub rows: usize,
    pub kind: WordKind,
    pub values: WordValues,
    /// Bit `r` of word `r / 64` set where row `r` is valid; `None` where
    /// every row is.
    pub validity: Option<Vec<u64>>,
    /// A coded column's distinct values, in code order, of the column's
    /// type.
    pub dictionary: Option<ArrayRef>,
}

/// How columns of `data_type` are kept as words, or `None` where they are
/// not (the caller then leaves the work to DataFusion).
pub fn word_kind(data_type: &DataType) -> Option<WordKind> {
    use DataType::*;
    match data_type {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 | Date64 | Boolean => {
            Some(WordKind::I64)
        }
        Timestamp(_, _) => Some(WordKind::I64),
        Decimal128(_, _) => Some(WordKind::I64),
        Float64 => Some(WordKind::F64),
        Utf8 | LargeUtf8 | Utf8View => Some(WordKind::Code),
        _ => None,
    }
}

/// `pieces` (arrays of one type, end to end) as words, or `None` where they
/// cannot be: a type [`word_kind`] refuses, a decimal beyond 64 bits, or
/// strings with more than [`MAX_DICTIONARY_VALUES`] distinct values.
pub fn column_words(pieces: &[ArrayRef], data_type: &DataType) -> Option<HostWords> {
    let kind = word_kind(data_type)?;
    let rows: usize = pieces.iter().map(|p| p.len()).sum();
    let (values, dictionary) = match kind {
        WordKind::Code => {
            let mut codes = Vec::with_capacity(rows);
            let dictionary = coded_words(pieces, data_type, &mut codes)?;
            (WordValues::Narrow(codes), Some(dictionary))
        }
        WordKind::I64 | WordKind::F64 => {
            let mut narrow = Vec::with_capacity(rows);
            let narrowed =
                kind == WordKind::I64 && pieces.iter().all(|p| narrow_words(p, &mut narrow));
            let values = match narrowed {
                true => WordValues::Narrow(narrow),
                false => {
                    drop(narrow);
                    let mut wide = Vec::with_capacity(rows);
                    for piece in pieces {
                        plain_words(piece, &mut wide)?;
                    }
                    WordValues::Wide(wide)
                }
            };
            (values, None)
        }
    };
    Some(HostWords {
        rows,
        kind,
        values,
        validity: validity_words(pieces, rows),
        dictionary,
    })
}

/// Appends `array`'s values as 4-byte integers, or returns `false` (with
/// `out` in any state) where one does not fit (NULL rows included: they
/// hold whatever the array holds there) or the type is not an integer.
/// Checked before copied, in loops the compiler vectorizes: this runs over
/// every row of every column a query first reads.
fn narrow_words(array: &ArrayRef, out: &mut Vec<i32>) -> bool {
    macro_rules! always {
        ($t:ty) => {{
            out.extend(array.as_primitive::<$t>().values().iter().map(|&v| v as i32));
            true
        }};
    }
    macro_rules! if_fits {
        ($t:ty) => {{
            let values = array.as_primitive::<$t>().values();
            let (low, high) = values.iter().fold((i64::MAX, i64::MIN), |(l, h), &v| {
                (l.min(v as i64), h.max(v as i64))
            });
            let fits = values.is_empty()
                || (low >= i64::from(i32::MIN) && high <= i64::from(i32::MAX));
            if fits {
                out.extend(values.iter().map(|&v| v as i32));
            }
            fits
        }};
    }
    match array.data_type() {
        DataType::Int8 => always!(Int8Type),
        DataType::Int16 => always!(Int16Type),
        DataType::Int32 => always!(Int32Type),
        DataType::UInt8 => always!(UInt8Type),
        DataType::UInt16 => always!(UInt16Type),
        DataType::Date32 => always!(Date32Type),
        DataType::Int64 => if_fits!(Int64Type),
        DataType::UInt32 => if_fits!(UInt32Type),
        DataType::Date64 => if_fits!(Date64Type),
        DataType::Timestamp(TimeUnit::Second, _) => if_fits!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => if_fits!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => if_fits!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => if_fits!(TimestampNanosecondType),
        DataType::Boolean => {
            out.extend(array.as_boolean().values().iter().map(i32::from));
            true
        }
        DataType::Decimal128(_, _) => {
            let values = array.as_primitive::<Decimal128Type>().values();
            let fits = values
                .iter()
                .fold(true, |fits, &v| fits & (v as i32 as i128 == v));
            if fits {
                out.extend(values.iter().map(|&v| v as i32));
            }
            fits
        }
        _ => false,
    }
}

/// Appends `array`'s values as words (NULL rows hold whatever the array
/// holds there).
fn plain_words(array: &ArrayRef, out: &mut Vec<u64>) -> Option<()> {
    macro_rules! widened {
        ($t:ty) => {
            out.extend(array.as_primitive::<$t>().values().iter().map(|&v| v as i64 as u64))
        };
    }
    match array.data_type() {
        DataType::Int8 => widened!(Int8Type),
        DataType::Int16 => widened!(Int16Type),
        DataType::Int32 => widened!(Int32Type),
        DataType::Int64 => widened!(Int64Type),
        DataType::UInt8 => widened!(UInt8Type),
        DataType::UInt16 => widened!(UInt16Type),
        DataType::UInt32 => widened!(UInt32Type),
        DataType::Date32 => widened!(Date32Type),
        DataType::Date64 => widened!(Date64Type),
        DataType::Timestamp(TimeUnit::Second, _) => widened!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => widened!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => widened!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => widened!(TimestampNanosecondType),
        DataType::Boolean => {
            let bits = array.as_boolean().values();
            out.extend(bits.iter().map(u64::from));
        }
        DataType::Float64 => {
            out.extend(array.as_primitive::<Float64Type>().values().iter().map(|v| v.to_bits()))
        }
        DataType::Decimal128(_, _) => {
            let decimals = array.as_primitive::<Decimal128Type>();
            let start = out.len();
            out.reserve(decimals.len());
            for (row, &value) in decimals.values().iter().enumerate() {
                match i64::try_from(value) {
                    Ok(narrow) => out.push(narrow as u64),
                    // A NULL row's value is not the row's: it may hold anything.
                    Err(_) if decimals.is_null(row) => out.push(0),
                    Err(_) => {
                        out.truncate(start);
                        return None;
                    }
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// The validity of `pieces` as one bitmap, or `None` where no row is NULL.
fn validity_words(pieces: &[ArrayRef], rows: usize) -> Option<Vec<u64>> {
    if pieces.iter().all(|p| p.logical_null_count() == 0) {
        return None;
    }
    let mut words = vec![0u64; rows.div_ceil(64)];
    let mut row = 0;
    for piece in pieces {
        match piece.logical_nulls() {
            None => {
                for r in row..row + piece.len() {
                    words[r / 64] |= 1 << (r % 64);
                }
            }
            Some(nulls) => {
                for (i, valid) in nulls.iter().enumerate() {
                    if valid {
                        let r = row + i;
                        words[r / 64] |= 1 << (r % 64);
                    }
                }
            }
        }
        row += piece.len();
    }
    Some(words)
}

/// Appends the codes of `pieces`' strings to `out` (0 for NULL rows) and
/// returns their dictionary, or `None` past [`MAX_DICTIONARY_VALUES`].
fn coded_words(pieces: &[ArrayRef], data_type: &DataType, out: &mut Vec<i32>) -> Option<ArrayRef> {
    let mut codes = Dictionary::default();
    for piece in pieces {
        match piece.data_type() {
            DataType::Utf8View => {
                let strings = piece.as_string_view();
                for (row, view) in strings.views().iter().enumerate() {
                    let code = match strings.is_null(row) {
                        true => 0,
                        false => codes.code_of_view(*view, || strings.value(row))?,
                    };
                    out.push(code);
                }
            }
            DataType::Utf8 => {
                let strings = piece.as_string::<i32>();
                for row in 0..strings.len() {
                    let code = match strings.is_null(row) {
                        true => 0,
                        false => codes.code_of(strings.value(row))?,
                    };
                    out.push(code);
                }
            }
            DataType::LargeUtf8 => {
                let strings = piece.as_string::<i64>();
                for row in 0..strings.len() {
                    let code = match strings.is_null(row) {
                        true => 0,
                        false => codes.code_of(strings.value(row))?,
                    };
                    out.push(code);
                }
            }
            _ => return None,
        }
    }
    Some(strings_array(&codes.values, data_type))
}

/// `values` as an array of `data_type` (a string type).
pub fn strings_array(values: &[String], data_type: &DataType) -> ArrayRef {
    let values = values.iter().map(String::as_str);
    match data_type {
        DataType::LargeUtf8 => Arc::new(LargeStringArray::from_iter_values(values)),
        DataType::Utf8View => Arc::new(StringViewArray::from_iter_values(values)),
        _ => Arc::new(StringArray::from_iter_values(values)),
    }
}

/// The distinct strings seen so far, by code.
#[derive(Default)]
struct Dictionary {
    values: Vec<String>,
    by_value: HashMap<String, i32>,
    /// Strings of at most 12 bytes by their length and bytes (a string
    /// view's own 16 bytes, the bytes past the length zeroed), which spares
    /// hashing a string for the short keys that are most often coded.
    by_view: Vec<(u128, i32)>,
    /// The first 64 values by their length and first bytes
    /// ([`prefix_key`]), each candidate's whole value compared before its
    /// code is taken: no hashing for the few values a low-cardinality
    /// column repeats.
    by_prefix: Vec<(u64, i32)>,
}

/// A string's length and first 7 bytes in one word: equal for equal
/// strings, rarely for others.
fn prefix_key(value: &str) -> u64 {
    let bytes = value.as_bytes();
    let mut head = [0u8; 8];
    let take = bytes.len().min(7);
    head[..take].copy_from_slice(&bytes[..take]);
    u64::from_le_bytes(head) | ((bytes.len() as u64) << 56)
}

impl Dictionary {
    fn code_of(&mut self, value: &str) -> Option<i32> {
        let key = prefix_key(value);
        let seen = self
            .by_prefix
            .iter()
            .filter(|(k, _)| *k == key)
            .find(|(_, code)| self.values[*code as usize] == value);
        if let Some(&(_, code)) = seen {
            return Some(code);
        }
        let code = match self.by_value.get(value) {
            Some(&code) => code,
            None => {
                if self.values.len() >= MAX_DICTIONARY_VALUES {
                    return None;
                }
                let code = self.values.len() as i32;
                self.values.push(value.to_owned());
                self.by_value.insert(value.to_owned(), code);
                code
            }
        };
        if self.by_prefix.len() < 64 {
            self.by_prefix.push((key, code));
        }
        Some(code)
    }

    fn code_of_view<'a>(&mut self, view: u128, value: impl FnOnce() -> &'a str) -> Option<i32> {
        let len = (view as u32) as usize;
        if len > 12 {
            return self.code_of(value());
        }
        // Bytes past the length are zero by Arrow's format, but zeroing
        // them here makes the key not depend on it.
        let mask = match len {
            12 => u128::MAX,
            _ => (1u128 << (32 + 8 * len)) - 1,
        };
        let key = view & mask;
        // Few distinct short strings: a linear search beats a hash.
        if let Some(&(_, code)) = self.by_view.iter().find(|(k, _)| *k == key) {
            return Some(code);
        }
        let code = self.code_of(value())?;
        if self.by_view.len() < 64 {
            self.by_view.push((key, code));
        }
        Some(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Decimal128Array, Float64Array, Int32Array, Int64Array};

    #[test]
    fn integers_and_decimals_become_signed_words_with_their_validity() {
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(-1), None, Some(7)]));
        let words = column_words(&[Arc::clone(&ints), ints], &DataType::Int32).unwrap();
        assert_eq!(words.kind, WordKind::I64);
        let WordValues::Narrow(values) = &words.values else {
            panic!("Int32 values fit 4 bytes");
        };
        assert_eq!((values[0], values[5]), (-1, 7));
        assert_eq!(words.validity, Some(vec![0b101101]));

        let decimals: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(12345), Some(-5)])
                .with_precision_and_scale(38, 2)
                .unwrap(),
        );
        let words = column_words(&[decimals], &DataType::Decimal128(38, 2)).unwrap();
        assert!(matches!(&words.values, WordValues::Narrow(v) if v == &[12345, -5]));
        assert_eq!(words.validity, None);
        // One value past 32 bits keeps the column in 8-byte words.
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![1, i64::from(i32::MIN) - 1]));
        let words = column_words(&[wide], &DataType::Int64).unwrap();
        assert!(matches!(&words.values, WordValues::Wide(v) if v[1] as i64 == i64::from(i32::MIN) - 1));
    }

    #[test]
    fn a_decimal_beyond_64_bits_is_refused_unless_its_row_is_null() {
        let wide = i128::from(i64::MAX) + 1;
        let valid: ArrayRef = Arc::new(Decimal128Array::from(vec![Some(1), Some(wide)]));
        assert!(column_words(&[valid], &DataType::Decimal128(38, 0)).is_none());
    }

    #[test]
    fn floats_keep_their_bits() {
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![-0.0, f64::NAN, 1.5]));
        let words = column_words(&[floats], &DataType::Float64).unwrap();
        assert_eq!(words.kind, WordKind::F64);
        let WordValues::Wide(values) = &words.values else {
            panic!("floats stay 8 bytes");
        };
        assert_eq!(values[0], (-0.0f64).to_bits());
        assert!(f64::from_bits(values[1]).is_nan());
    }

    #[test]
    fn strings_become_codes_of_their_distinct_values_across_pieces_and_types() {
        let long = "a string longer than twelve bytes";
        let views: ArrayRef = Arc::new(StringViewArray::from(vec![
            Some("R"),
            None,
            Some(long),
            Some("R"),
            Some(""),
        ]));
        let utf8: ArrayRef = Arc::new(StringArray::from(vec![Some(long), Some("N")]));
        let words = column_words(&[views, utf8], &DataType::Utf8View).unwrap();
        assert_eq!(words.kind, WordKind::Code);
        assert!(matches!(&words.values, WordValues::Narrow(v) if v == &[0, 0, 1, 0, 2, 1, 3]));
        assert_eq!(words.validity, Some(vec![0b1111101]));
        let dictionary = words.dictionary.unwrap();
        let dictionary = dictionary.as_string_view();
        let values: Vec<&str> = dictionary.iter().map(|v| v.unwrap()).collect();
        assert_eq!(values, ["R", long, "", "N"]);
    }

    #[test]
    fn long_strings_of_one_length_and_prefix_keep_codes_of_their_own() {
        // Same length, same first four bytes, different values.
        let (a, b) = ("DELIVER IN PERSON", "DELIVER BY TRUCK!");
        assert_eq!(a.len(), b.len());
        let views: ArrayRef = Arc::new(StringViewArray::from(vec![a, b, a, b, b, "NONE"]));
        let words = column_words(&[views], &DataType::Utf8View).unwrap();
        assert!(matches!(&words.values, WordValues::Narrow(v) if v == &[0, 1, 0, 1, 1, 2]));
        let dictionary = words.dictionary.unwrap();
        let values: Vec<&str> = dictionary.as_string_view().iter().map(|v| v.unwrap()).collect();
        assert_eq!(values, [a, b, "NONE"]);
    }

    #[test]
    fn too_many_distinct_strings_are_not_coded() {
        let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..=MAX_DICTIONARY_VALUES).map(|i| i.to_string()),
        ));
        assert!(column_words(&[strings], &DataType::Utf8).is_none());
    }
}
