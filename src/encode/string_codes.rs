//! Strings as codes: each string of a column as the number of its value in
//! a dictionary of the column's distinct values, in the order rows first
//! name them (the column cache's [`super::table_words`] keeps a part's
//! string column so, and the dictionary on the host). Strings read as
//! views are looked up by their views, strings read through a dictionary
//! by their keys, others by their bytes. Host work only.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, DictionaryArray, GenericStringArray, LargeStringArray,
    OffsetSizeTrait, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{DataType, Int32Type};

use super::table_words::{room_for, MAX_DICTIONARY_VALUES};

/// Appends the codes of `piece`'s strings to `out` (0 for NULL rows),
/// adding new values to `dictionary`, or `None` past
/// [`MAX_DICTIONARY_VALUES`] distinct values (or for a type not a string).
pub(super) fn code_strings(piece: &ArrayRef, dictionary: &mut Dictionary, out: &mut Vec<i32>) -> Option<()> {
    room_for(out, piece.len());
    match piece.data_type() {
        DataType::Utf8View => {
            let strings = piece.as_string_view();
            // A long string's view names its bytes by buffer and offset,
            // which only mean the same thing within this array.
            dictionary.views.clear();
            let views = strings.views();
            // Codes written in place (not pushed), so that the loop keeps
            // the table and the output in registers.
            let start = out.len();
            out.resize(start + views.len(), 0);
            let codes = &mut out[start..];
            let coded =
                match strings.nulls().filter(|n| n.null_count() > 0) {
                    None => codes.iter_mut().zip(views).enumerate().try_for_each(
                        |(row, (code, &view))| {
                            *code = dictionary.code_of_view(view, || strings.value(row))?;
                            Some(())
                        },
                    ),
                    Some(nulls) => codes.iter_mut().zip(views).enumerate().try_for_each(
                        |(row, (code, &view))| {
                            if nulls.is_valid(row) {
                                *code = dictionary.code_of_view(view, || strings.value(row))?;
                            }
                            Some(())
                        },
                    ),
                };
            if coded.is_none() {
                out.truncate(start);
                return None;
            }
        }
        DataType::Utf8 => code_offset_strings(piece.as_string::<i32>(), dictionary, out)?,
        DataType::LargeUtf8 => code_offset_strings(piece.as_string::<i64>(), dictionary, out)?,
        // Strings read through their dictionary (see `read_types`).
        DataType::Dictionary(key, value)
            if key.as_ref() == &DataType::Int32 && value.as_ref() == &DataType::Utf8 =>
        {
            code_dictionary_strings(piece.as_dictionary::<Int32Type>(), dictionary, out)?
        }
        _ => return None,
    }
    Some(())
}

/// [`code_strings`] for strings read through their dictionary: a value of
/// the array's dictionary is looked up by its bytes when a row first names
/// it, every other row's code read by its key. Arrays that share their
/// dictionary (a Parquet column chunk's batches) share those lookups.
fn code_dictionary_strings(
    strings: &DictionaryArray<Int32Type>,
    dictionary: &mut Dictionary,
    out: &mut Vec<i32>,
) -> Option<()> {
    let values = strings.values().as_string_opt::<i32>()?;
    let mut codes = dictionary.take_codes_of_values(strings.values());
    let keys = strings.keys();
    let start = out.len();
    out.resize(start + keys.len(), 0);
    let rows = &mut out[start..];
    let mut code_of_key = |key: i32| -> Option<i32> {
        let k = usize::try_from(key).ok().filter(|&k| k < values.len())?;
        if codes.codes[k] < 0 {
            // A NULL value: its rows are NULL (the column's validity says
            // so), whatever their code.
            codes.codes[k] = match values.is_null(k) {
                true => 0,
                false => dictionary.code_of(values.value(k))?,
            };
        }
        Some(codes.codes[k])
    };
    let coded = match keys.nulls().filter(|n| n.null_count() > 0) {
        None => rows
            .iter_mut()
            .zip(keys.values().iter())
            .try_for_each(|(row, &key)| {
                *row = code_of_key(key)?;
                Some(())
            }),
        Some(nulls) => rows
            .iter_mut()
            .zip(keys.values().iter())
            .enumerate()
            .try_for_each(|(r, (row, &key))| {
                if nulls.is_valid(r) {
                    *row = code_of_key(key)?;
                }
                Some(())
            }),
    };
    match coded {
        Some(()) => dictionary.keep_codes_of_values(codes),
        None => out.truncate(start),
    }
    coded
}

/// [`code_strings`] for strings laid end to end with offsets: each looked
/// up by its bytes.
fn code_offset_strings<O: OffsetSizeTrait>(
    strings: &GenericStringArray<O>,
    dictionary: &mut Dictionary,
    out: &mut Vec<i32>,
) -> Option<()> {
    for row in 0..strings.len() {
        out.push(match strings.is_null(row) {
            true => 0,
            false => dictionary.code_of(strings.value(row))?,
        });
    }
    Some(())
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
pub(super) struct Dictionary {
    values: Vec<String>,
    by_value: HashMap<String, i32>,
    /// Codes by string view, for one array at a time: a string of at most
    /// 12 bytes by its length and bytes (its view, the bytes past the
    /// length zeroed), a longer one by its whole view (length, first bytes,
    /// buffer and offset), which only names the same bytes within one
    /// array. A Parquet column read through its dictionary repeats each
    /// value's view, so each distinct value is looked up by its bytes once
    /// an array, and no string is hashed.
    views: ViewCodes,
    /// The first 64 values by their length and first bytes
    /// ([`prefix_key`]), each candidate's whole value compared before its
    /// code is taken: no hashing for the few values a low-cardinality
    /// column repeats.
    by_prefix: Vec<(u64, i32)>,
    /// The codes of the last dictionary array's values.
    value_codes: Option<ValueCodes>,
}

impl Default for Dictionary {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            by_value: HashMap::new(),
            views: ViewCodes::new(),
            by_prefix: Vec::new(),
            value_codes: None,
        }
    }
}

/// Codes of string views seen, in slots picked by a hash of the view; a
/// slot holds the last view that hashed to it, so a lookup either finds
/// the view itself or misses.
struct ViewCodes {
    slots: Vec<(u128, i32)>,
}

/// Slots of a [`ViewCodes`], as a power of two: four times the values a
/// dictionary holds at most, so that few of a column's values share a slot
/// and miss each time they meet (with as many slots as values, 150 values
/// of `p_type` coded at twice the time a row).
const VIEW_SLOTS_LOG2: u32 = 12;

impl ViewCodes {
    const EMPTY: (u128, i32) = (0, -1);

    fn new() -> Self {
        Self {
            slots: vec![Self::EMPTY; 1 << VIEW_SLOTS_LOG2],
        }
    }

    fn clear(&mut self) {
        self.slots.fill(Self::EMPTY);
    }

    #[inline]
    fn slot(view: u128) -> usize {
        let mixed = (view as u64) ^ ((view >> 64) as u64).rotate_left(32);
        (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - VIEW_SLOTS_LOG2)) as usize
    }

    #[inline]
    fn get(&self, view: u128) -> Option<i32> {
        let (key, code) = self.slots[Self::slot(view)];
        (code >= 0 && key == view).then_some(code)
    }

    #[inline]
    fn put(&mut self, view: u128, code: i32) {
        self.slots[Self::slot(view)] = (view, code);
    }
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

/// The key of a string view in [`Dictionary::views`]: the view with the
/// bytes past a short string's length masked (Arrow's format has them zero,
/// but the key does not depend on it). Short and long keys never meet: the
/// length is part of the key. Without branches, as the strings of a column
/// come in no order.
#[inline]
fn view_key(view: u128) -> u128 {
    let len = (view as u32).min(12);
    let kept_bits = 32 + 8 * len;
    // A shift by 128 would overflow: shift the ones out in two steps.
    let mask = !((u128::MAX << (kept_bits - 1)) << 1);
    view & mask
}

/// The codes of the values of one dictionary array ([`Dictionary::codes_of_values`]).
struct ValueCodes {
    /// The values, held so that their buffers, by which the next array's
    /// values are recognised as the same, stay theirs.
    values: ArrayRef,
    /// Each value's code, or -1 where no row has named it yet.
    codes: Vec<i32>,
}

impl ValueCodes {
    /// Whether `values` are these values: the same buffers, at the same
    /// offset and length (an Arrow buffer never changes, and these are
    /// held, so no other array's can be at their address).
    fn are(&self, values: &ArrayRef) -> bool {
        let (held, other) = (self.values.as_string::<i32>(), values.as_string::<i32>());
        held.len() == other.len()
            && held.offsets().as_ptr() == other.offsets().as_ptr()
            && held.values().as_ptr() == other.values().as_ptr()
    }
}

impl Dictionary {
    /// The distinct strings, in code order.
    pub(super) fn values(&self) -> &[String] {
        &self.values
    }

    /// The codes of the values of a dictionary array (strings): the last
    /// array's where its values are the same, else none yet. Given back
    /// with [`Self::keep_codes_of_values`].
    fn take_codes_of_values(&mut self, values: &ArrayRef) -> ValueCodes {
        match self.value_codes.take() {
            Some(codes) if codes.are(values) => codes,
            _ => ValueCodes {
                values: Arc::clone(values),
                codes: vec![-1; values.len()],
            },
        }
    }

    /// Keeps `codes` for the next array that shares their values.
    fn keep_codes_of_values(&mut self, codes: ValueCodes) {
        self.value_codes = Some(codes);
    }

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

    /// The code of the string `view` of the array being coded describes
    /// (`value` gives its bytes).
    #[inline]
    fn code_of_view<'a>(&mut self, view: u128, value: impl FnOnce() -> &'a str) -> Option<i32> {
        let key = view_key(view);
        match self.views.get(key) {
            Some(code) => Some(code),
            None => self.code_of_new_view(key, value()),
        }
    }

    /// [`Self::code_of_view`] for a view not in the table: out of the
    /// loop's way, as most views are.
    #[cold]
    #[inline(never)]
    fn code_of_new_view(&mut self, key: u128, value: &str) -> Option<i32> {
        let code = self.code_of(value)?;
        self.views.put(key, code);
        Some(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::table_words::{column_words, HostWords, WordValues};
    use crate::gpu::WordKind;

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

    /// A dictionary of string views' values.
    fn view_values(dictionary: &ArrayRef) -> Vec<&str> {
        dictionary
            .as_string_view()
            .iter()
            .map(|v| v.unwrap())
            .collect()
    }

    #[test]
    fn long_strings_of_one_length_and_prefix_keep_codes_of_their_own() {
        // Same length, same first four bytes, different values.
        let (a, b) = ("DELIVER IN PERSON", "DELIVER BY TRUCK!");
        assert_eq!(a.len(), b.len());
        let views: ArrayRef = Arc::new(StringViewArray::from(vec![a, b, a, b, b, "NONE"]));
        let words = column_words(&[views], &DataType::Utf8View).unwrap();
        assert!(matches!(&words.values, WordValues::Narrow(v) if v == &[0, 1, 0, 1, 1, 2]));
        let values = view_values(words.dictionary.as_ref().unwrap());
        assert_eq!(values, [a, b, "NONE"]);
    }

    #[test]
    fn long_strings_with_equal_views_in_different_arrays_keep_their_own_codes() {
        // Same length, same first four bytes, each at offset 0 of its
        // array's first buffer: the two arrays' views are equal.
        let (a, b) = ("same-prefix value A", "same-prefix value B");
        let first: ArrayRef = Arc::new(StringViewArray::from(vec![a, a]));
        let second: ArrayRef = Arc::new(StringViewArray::from(vec![b, a, b]));
        let (v1, v2) = (
            first.as_string_view().views()[0],
            second.as_string_view().views()[0],
        );
        assert_eq!(v1, v2, "the test needs equal views");
        let words = column_words(&[first, second], &DataType::Utf8View).unwrap();
        assert!(matches!(&words.values, WordValues::Narrow(v) if v == &[0, 0, 1, 0, 1]));
        let values = view_values(words.dictionary.as_ref().unwrap());
        assert_eq!(values, [a, b]);
    }

    #[test]
    fn strings_with_nulls_and_short_values_of_every_length_code_alike() {
        let values: Vec<Option<String>> = (0..=20)
            .map(|len| Some("x".repeat(len)))
            .chain([None])
            .collect();
        let mut doubled = values.clone();
        doubled.extend(values.iter().cloned());
        let views: ArrayRef = Arc::new(StringViewArray::from_iter(
            doubled.iter().map(|v| v.as_deref()),
        ));
        let words = column_words(&[views], &DataType::Utf8View).unwrap();
        let WordValues::Narrow(codes) = &words.values else {
            panic!("codes are 4 bytes");
        };
        let first: Vec<i32> = (0..=20).collect();
        assert_eq!(&codes[..21], &first[..]);
        assert_eq!(
            &codes[22..43],
            &first[..],
            "each value's second row takes its first code"
        );
        assert_eq!((codes[21], codes[43]), (0, 0), "NULL rows");
    }

    #[test]
    fn too_many_distinct_strings_are_not_coded() {
        let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..=MAX_DICTIONARY_VALUES).map(|i| i.to_string()),
        ));
        assert!(column_words(&[strings], &DataType::Utf8).is_none());
    }

    /// `keys` into `values` as a dictionary array of `Int32` keys and
    /// `Utf8` values, as the cache fill reads a Parquet string column.
    fn dictionary_of(keys: Vec<Option<i32>>, values: &ArrayRef) -> ArrayRef {
        use datafusion::arrow::array::Int32Array;
        Arc::new(DictionaryArray::<Int32Type>::try_new(Int32Array::from(keys), Arc::clone(values)).unwrap())
    }

    /// The strings `dictionary` (a dictionary array) stands for, as a view
    /// array: as DataFusion's scan reads them, a row whose key or value is
    /// NULL a NULL (Arrow's cast would make a NULL value an empty string).
    fn as_views(dictionary: &ArrayRef) -> ArrayRef {
        let dictionary = dictionary.as_dictionary::<Int32Type>();
        let values = dictionary.values().as_string::<i32>();
        let nulls = dictionary.logical_nulls();
        let strings: StringViewArray = dictionary
            .keys()
            .iter()
            .enumerate()
            .map(|(row, key)| match nulls.as_ref().is_some_and(|n| n.is_null(row)) {
                true => None,
                false => key.map(|k| values.value(k as usize)),
            })
            .collect();
        Arc::new(strings)
    }

    fn same_words(a: &HostWords, b: &HostWords) -> bool {
        a.rows == b.rows
            && a.kind == b.kind
            && a.values.bytes() == b.values.bytes()
            && a.validity == b.validity
            && a.dictionary.as_ref().map(|d| d.to_data()) == b.dictionary.as_ref().map(|d| d.to_data())
    }

    #[test]
    fn strings_read_through_their_dictionary_make_the_words_of_their_views() {
        let table_type = DataType::Utf8View;
        let values: ArrayRef = Arc::new(StringArray::from(vec![
            Some("MAIL"),
            Some("a value longer than twelve bytes"),
            None,
            Some("SHIP"),
            Some("never named"),
            Some(""),
        ]));
        // Pieces sharing one dictionary (a column chunk's batches), then
        // a new dictionary of the same values in another order (the next
        // row group's), then one of a single value; NULL keys, a NULL value,
        // a value no row names, an empty string, an empty piece.
        let other: ArrayRef = Arc::new(StringArray::from(vec!["SHIP", "", "MAIL", "TRUCK"]));
        let single: ArrayRef = Arc::new(StringArray::from(vec!["a value longer than twelve bytes"]));
        let pieces = vec![
            dictionary_of(vec![Some(3), Some(0), None, Some(1), Some(3)], &values),
            dictionary_of(vec![], &values),
            dictionary_of(vec![Some(2), Some(5), Some(0), Some(0)], &values),
            dictionary_of(vec![Some(3), Some(1), None, Some(0), Some(2)], &other),
            dictionary_of(vec![Some(0), Some(0)], &single),
        ];
        let views: Vec<ArrayRef> = pieces.iter().map(as_views).collect();
        let read = column_words(&pieces, &table_type).unwrap();
        let expected = column_words(&views, &table_type).unwrap();
        assert!(same_words(&read, &expected), "{read:?}\nagainst\n{expected:?}");
        assert_eq!(read.rows, 16);
        // Codes in the order rows first name their values; the value no
        // row names is not coded.
        let dictionary = read.dictionary.as_ref().unwrap();
        let named: Vec<&str> = dictionary.as_string_view().iter().map(|v| v.unwrap()).collect();
        assert_eq!(named, ["SHIP", "MAIL", "a value longer than twelve bytes", "", "TRUCK"]);
        let WordValues::Narrow(codes) = &read.values else {
            panic!("codes are 4 bytes");
        };
        assert_eq!(&codes[..5], &[0, 1, 0, 2, 0]);
        assert_eq!(read.validity, expected.validity);
        assert!(read.validity.is_some(), "NULL keys and the NULL value");

        // Many values in a dictionary, few named: coded, as their views
        // would be. More named than the device codes: refused, as their
        // views would be.
        let many: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..=MAX_DICTIONARY_VALUES).map(|i| format!("value {i}")),
        ));
        let few_named = dictionary_of(vec![Some(7), Some(MAX_DICTIONARY_VALUES as i32), Some(7)], &many);
        let read = column_words(std::slice::from_ref(&few_named), &table_type).unwrap();
        assert!(same_words(&read, &column_words(&[as_views(&few_named)], &table_type).unwrap()));
        let all_named = dictionary_of((0..=MAX_DICTIONARY_VALUES as i32).map(Some).collect(), &many);
        assert!(column_words(std::slice::from_ref(&all_named), &table_type).is_none());
        assert!(column_words(&[as_views(&all_named)], &table_type).is_none());
    }
}
