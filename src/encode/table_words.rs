//! A table column as the device column cache keeps it: one 8-byte word a
//! row (signed integers, dates, timestamps, booleans and decimals as
//! `i64`; floats as the bits of an `f64`; strings as codes into a
//! dictionary of their distinct values, kept on the host) and a validity
//! bitmap where it has NULLs. Host work only.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanBufferBuilder, DictionaryArray, GenericStringArray,
    LargeStringArray, OffsetSizeTrait, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, Decimal32Type, Decimal64Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt8Type,
};

use crate::gpu::{zeroed_for_fill, WordKind};

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
    /// A [`WordKind::Bytes`] column's bytes, which its values (offsets)
    /// point into.
    pub bytes: Option<Vec<u8>>,
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

/// A column's words made piece by piece as a part is read, each piece
/// coded while it is fresh in the caches and then free to go. A column
/// cannot be kept as words where [`word_kind`] refuses its type, a decimal
/// is beyond 64 bits, or strings have more than [`MAX_DICTIONARY_VALUES`]
/// distinct values.
pub struct WordsBuilder {
    data_type: DataType,
    kind: WordKind,
    rows: usize,
    /// 4-byte values until a piece does not fit them, then 8-byte words
    /// (floats start there).
    values: WordValues,
    validity: ValidityBuilder,
    /// A string column's distinct values so far.
    dictionary: Option<Dictionary>,
}

impl WordsBuilder {
    /// A builder for a column of `data_type`, or `None` where [`word_kind`]
    /// refuses the type, with room for about `rows` rows made at once (a
    /// guess: more rows grow the words, fewer leave room unused).
    pub fn with_rows_hint(data_type: &DataType, rows: usize) -> Option<Self> {
        let kind = word_kind(data_type)?;
        Some(Self {
            data_type: data_type.clone(),
            kind,
            rows: 0,
            values: match kind {
                WordKind::F64 => WordValues::Wide(empty_for_fill(initial_room(rows))),
                WordKind::I64 | WordKind::Code | WordKind::Bytes => {
                    WordValues::Narrow(empty_for_fill(initial_room(rows)))
                }
            },
            validity: ValidityBuilder::default(),
            dictionary: (kind == WordKind::Code).then(Dictionary::default),
        })
    }

    /// How the column's words are read.
    pub fn kind(&self) -> WordKind {
        self.kind
    }

    /// Appends `piece`'s rows, or returns `false` where the column cannot
    /// be kept as words (the builder is then of no further use).
    pub fn push(&mut self, piece: &ArrayRef) -> bool {
        let appended = match (&mut self.values, &mut self.dictionary) {
            (WordValues::Narrow(codes), Some(dictionary)) => {
                code_strings(piece, dictionary, codes).is_some()
            }
            (WordValues::Narrow(narrow), None) => {
                let before = narrow.len();
                if narrow_words(piece, narrow) {
                    true
                } else {
                    // A value past 32 bits: every word 8 bytes from here on.
                    narrow.truncate(before);
                    let mut wide: Vec<u64> =
                        empty_for_fill(narrow.capacity().max(before + piece.len()));
                    wide.extend(narrow.iter().map(|&v| i64::from(v) as u64));
                    let appended = plain_words(piece, &mut wide).is_some();
                    self.values = WordValues::Wide(wide);
                    appended
                }
            }
            (WordValues::Wide(wide), _) => plain_words(piece, wide).is_some(),
        };
        if !appended {
            return false;
        }
        self.validity.push(piece, self.rows);
        self.rows += piece.len();
        true
    }

    /// The words of every piece pushed.
    pub fn finish(self) -> HostWords {
        HostWords {
            rows: self.rows,
            kind: self.kind,
            values: self.values,
            validity: self.validity.finish(self.rows),
            dictionary: self
                .dictionary
                .map(|d| strings_array(&d.values, &self.data_type)),
            bytes: None,
        }
    }
}

/// A column's validity made piece by piece: nothing kept until the first
/// piece with NULLs.
#[derive(Default)]
pub(crate) struct ValidityBuilder {
    bits: Option<BooleanBufferBuilder>,
}

impl ValidityBuilder {
    /// Appends `piece`'s validity after the `rows_before` rows pushed.
    pub fn push(&mut self, piece: &ArrayRef, rows_before: usize) {
        let nulls = piece.logical_nulls().filter(|n| n.null_count() > 0);
        match (nulls, &mut self.bits) {
            (None, None) => {}
            (None, Some(bits)) => bits.append_n(piece.len(), true),
            (Some(nulls), bits) => {
                let bits = bits.get_or_insert_with(|| {
                    let mut all_valid = BooleanBufferBuilder::new(rows_before + piece.len());
                    all_valid.append_n(rows_before, true);
                    all_valid
                });
                bits.append_buffer(nulls.inner());
            }
        }
    }

    /// Bit `r` of word `r / 64` set where row `r` of `rows` is valid;
    /// `None` where every row is.
    pub fn finish(self, rows: usize) -> Option<Vec<u64>> {
        self.bits.map(|mut builder| {
            let bits = builder.finish();
            let bytes = bits.values();
            let mut words = vec![0u64; rows.div_ceil(64)];
            for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
                let mut le = [0u8; 8];
                le[..chunk.len()].copy_from_slice(chunk);
                *word = u64::from_le_bytes(le);
            }
            // Bits past the last row are not rows: clear them.
            if !rows.is_multiple_of(64) {
                if let Some(last) = words.last_mut() {
                    *last &= (1u64 << (rows % 64)) - 1;
                }
            }
            words
        })
    }
}

/// Values checked for fitting a narrower word at once, then copied: few
/// enough to stay in the CPU's first-level cache between the two loops.
const FIT_CHUNK: usize = 1024;

/// Appends `array`'s values as 4-byte integers, or returns `false` (with
/// `out` in any state) where one does not fit (NULL rows included: they
/// hold whatever the array holds there) or the type is not an integer.
/// Checked before copied, in loops the compiler vectorizes: this runs over
/// every row of every column a query first reads.
fn narrow_words(array: &ArrayRef, out: &mut Vec<i32>) -> bool {
    room_for(out, array.len());
    macro_rules! always {
        ($t:ty) => {{
            out.extend(
                array
                    .as_primitive::<$t>()
                    .values()
                    .iter()
                    .map(|&v| v as i32),
            );
            true
        }};
    }
    // Checked a chunk at a time, then copied while the chunk is in the
    // CPU's first-level cache: both loops vectorize (a running minimum and
    // maximum, or a per-value branch, do not).
    macro_rules! if_fits {
        ($t:ty) => {{
            let values = array.as_primitive::<$t>().values();
            let start = out.len();
            for chunk in values.chunks(FIT_CHUNK) {
                let fits = chunk
                    .iter()
                    .fold(true, |fits, &v| fits & (v as i64 as i32 as i64 == v as i64));
                if !fits {
                    out.truncate(start);
                    return false;
                }
                out.extend(chunk.iter().map(|&v| v as i32));
            }
            true
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
        // A decimal read in 32 or 64 bits (`read_types`): the same words as
        // the table's 128-bit decimal.
        DataType::Decimal32(_, _) => always!(Decimal32Type),
        DataType::Decimal64(_, _) => if_fits!(Decimal64Type),
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
            let start = out.len();
            for chunk in values.chunks(FIT_CHUNK) {
                let fits = chunk
                    .iter()
                    .fold(true, |fits, &v| fits & (v as i32 as i128 == v));
                if !fits {
                    out.truncate(start);
                    return false;
                }
                out.extend(chunk.iter().map(|&v| v as i32));
            }
            true
        }
        _ => false,
    }
}

/// Appends `array`'s values as words (NULL rows hold whatever the array
/// holds there).
fn plain_words(array: &ArrayRef, out: &mut Vec<u64>) -> Option<()> {
    room_for(out, array.len());
    macro_rules! widened {
        ($t:ty) => {
            out.extend(
                array
                    .as_primitive::<$t>()
                    .values()
                    .iter()
                    .map(|&v| v as i64 as u64),
            )
        };
    }
    match array.data_type() {
        DataType::Int8 => widened!(Int8Type),
        DataType::Int16 => widened!(Int16Type),
        DataType::Int32 => widened!(Int32Type),
        DataType::Int64 => widened!(Int64Type),
        DataType::Decimal32(_, _) => widened!(Decimal32Type),
        DataType::Decimal64(_, _) => widened!(Decimal64Type),
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
        DataType::Float64 => out.extend(
            array
                .as_primitive::<Float64Type>()
                .values()
                .iter()
                .map(|v| v.to_bits()),
        ),
        DataType::Decimal128(_, _) => {
            let decimals = array.as_primitive::<Decimal128Type>();
            let start = out.len();
            for (at, chunk) in decimals.values().chunks(FIT_CHUNK).enumerate() {
                let fits = chunk
                    .iter()
                    .fold(true, |fits, &v| fits & (v as i64 as i128 == v));
                if fits {
                    out.extend(chunk.iter().map(|&v| v as i64 as u64));
                    continue;
                }
                for (i, &value) in chunk.iter().enumerate() {
                    match i64::try_from(value) {
                        Ok(narrow) => out.push(narrow as u64),
                        // A NULL row's value is not the row's: it may hold anything.
                        Err(_) if decimals.is_null(at * FIT_CHUNK + i) => out.push(0),
                        Err(_) => {
                            out.truncate(start);
                            return None;
                        }
                    }
                }
            }
        }
        _ => return None,
    }
    Some(())
}

/// Appends the codes of `piece`'s strings to `out` (0 for NULL rows),
/// adding new values to `dictionary`, or `None` past
/// [`MAX_DICTIONARY_VALUES`] distinct values (or for a type not a string).
fn code_strings(piece: &ArrayRef, dictionary: &mut Dictionary, out: &mut Vec<i32>) -> Option<()> {
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

/// Values a column's words grow to at least when they first outgrow their
/// room: 8 MiB of 4-byte values, enough to be mapped in huge pages.
const MIN_GROWN_VALUES: usize = 1 << 21;

/// The room a column's words start with for a part of about `rows` rows:
/// a large part's at least [`MIN_GROWN_VALUES`], so that it is mapped in
/// huge pages (a part of a few million rows fills several times faster so);
/// a small part's its own (a huge page would be mostly cleared for nothing).
pub(crate) fn initial_room(rows: usize) -> usize {
    match rows >= MIN_GROWN_VALUES / 2 {
        true => rows.max(MIN_GROWN_VALUES),
        false => rows,
    }
}

/// An empty vector with room for `len` values, in memory mapped as
/// [`zeroed_for_fill`] maps it: in huge pages where large, so that filling
/// a part's words (tens of MiB) faults once per 2 MiB, not per 4 KiB page.
pub(crate) fn empty_for_fill<T: Copy + Default>(len: usize) -> Vec<T> {
    let mut values = zeroed_for_fill::<T>(len);
    values.clear();
    values
}

/// Makes room in `out` for `more` values more: where it must grow, it at
/// least doubles, into memory from [`empty_for_fill`] (growing a `Vec`
/// the usual way maps every 4 KiB page of each larger copy one fault at a
/// time).
pub(crate) fn room_for<T: Copy + Default>(out: &mut Vec<T>, more: usize) {
    let needed = out.len() + more;
    if needed <= out.capacity() {
        return;
    }
    // Room never written is never mapped: growing in large steps costs
    // address space, not memory.
    let mut grown = empty_for_fill(needed.max(2 * out.capacity()).max(MIN_GROWN_VALUES));
    grown.extend_from_slice(out);
    *out = grown;
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
struct Dictionary {
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

    /// `pieces` (arrays of one type, end to end) as words, or `None` where they
    /// cannot be: a type [`word_kind`] refuses, a decimal beyond 64 bits, or
    /// strings with more than [`MAX_DICTIONARY_VALUES`] distinct values.
    fn column_words(pieces: &[ArrayRef], data_type: &DataType) -> Option<HostWords> {
        let mut builder = WordsBuilder::with_rows_hint(data_type, 0)?;
        for piece in pieces {
            if !builder.push(piece) {
                return None;
            }
        }
        Some(builder.finish())
    }
    use datafusion::arrow::array::{
        Decimal128Array, Decimal32Array, Decimal64Array, Float64Array, Int32Array, Int64Array,
    };
    use datafusion::arrow::buffer::NullBuffer;

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
        assert!(
            matches!(&words.values, WordValues::Wide(v) if v[1] as i64 == i64::from(i32::MIN) - 1)
        );
    }

    #[test]
    fn a_decimal_read_in_32_or_64_bits_makes_the_words_of_its_128_bit_type() {
        // The cache fill reads short decimals narrower than the table's
        // type (`read_types`); the words must not tell the difference,
        // in 4-byte words and, past 32 bits, in 8-byte ones, NULLs kept.
        let table_type = DataType::Decimal128(15, 2);
        let cases: [Vec<Option<i64>>; 2] = [
            vec![Some(-1), None, Some(7), Some(i64::from(i32::MAX))],
            vec![Some(3), Some(i64::from(i32::MIN) - 1), None, Some(i64::MAX / 7)],
        ];
        for values in cases {
            let wide: ArrayRef = Arc::new(
                Decimal128Array::from(values.iter().map(|v| v.map(i128::from)).collect::<Vec<_>>())
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            );
            let narrow: ArrayRef = Arc::new(
                Decimal64Array::from(values.clone()).with_precision_and_scale(15, 2).unwrap(),
            );
            let expected = column_words(&[Arc::clone(&wide), wide], &table_type).unwrap();
            let words = column_words(&[Arc::clone(&narrow), narrow], &table_type).unwrap();
            assert_eq!(words.rows, expected.rows);
            assert_eq!(words.validity, expected.validity);
            match (&words.values, &expected.values) {
                (WordValues::Narrow(a), WordValues::Narrow(b)) => assert_eq!(a, b),
                (WordValues::Wide(a), WordValues::Wide(b)) => assert_eq!(a, b),
                _ => panic!("4-byte words against 8-byte ones for {values:?}"),
            }
        }
        let small: Vec<Option<i32>> = vec![Some(-5), None, Some(99_999)];
        let wide: ArrayRef = Arc::new(
            Decimal128Array::from(small.iter().map(|v| v.map(i128::from)).collect::<Vec<_>>())
                .with_precision_and_scale(7, 2)
                .unwrap(),
        );
        let narrow: ArrayRef =
            Arc::new(Decimal32Array::from(small).with_precision_and_scale(7, 2).unwrap());
        let (a, b) = (
            column_words(&[narrow], &DataType::Decimal128(7, 2)).unwrap(),
            column_words(&[wide], &DataType::Decimal128(7, 2)).unwrap(),
        );
        assert!(matches!((&a.values, &b.values), (WordValues::Narrow(x), WordValues::Narrow(y)) if x == y));
        assert_eq!(a.validity, b.validity);
    }

    #[test]
    fn a_decimal_beyond_64_bits_is_refused_unless_its_row_is_null() {
        let wide = i128::from(i64::MAX) + 1;
        let valid: ArrayRef = Arc::new(Decimal128Array::from(vec![Some(1), Some(wide)]));
        assert!(column_words(&[valid], &DataType::Decimal128(38, 0)).is_none());
    }

    /// The 8-byte words' values of `words`, as signed integers.
    fn wide_values(words: &HostWords) -> Vec<i64> {
        match &words.values {
            WordValues::Wide(values) => values.iter().map(|&w| w as i64).collect(),
            WordValues::Narrow(_) => panic!("expected 8-byte words"),
        }
    }

    #[test]
    fn a_value_past_4_bytes_is_found_in_any_chunk_and_with_any_room() {
        // The fit is checked a chunk at a time, and the words grow past a
        // hint too small: each place and room must widen every word.
        let rows = 3 * FIT_CHUNK + 5;
        let head: ArrayRef = Arc::new(Int64Array::from(vec![-9i64; 5]));
        for at in [0, FIT_CHUNK - 1, FIT_CHUNK, rows - 1] {
            let mut values: Vec<i64> = (0..rows as i64).map(|v| v - 1000).collect();
            values[at] = i64::from(i32::MAX) + 1;
            let array: ArrayRef = Arc::new(Int64Array::from(values.clone()));
            for hint in [0, 7, rows + 5] {
                let mut builder = WordsBuilder::with_rows_hint(&DataType::Int64, hint).unwrap();
                assert!(builder.push(&head) && builder.push(&array));
                let got = wide_values(&builder.finish());
                assert_eq!(got[..5], [-9; 5], "at {at}, hint {hint}");
                assert_eq!(got[5..], values[..], "at {at}, hint {hint}");
            }
            let decimals: ArrayRef = Arc::new(
                Decimal128Array::from(values.iter().map(|&v| i128::from(v)).collect::<Vec<_>>())
                    .with_precision_and_scale(38, 0)
                    .unwrap(),
            );
            let words = column_words(&[decimals], &DataType::Decimal128(38, 0)).unwrap();
            assert_eq!(wide_values(&words), values, "decimals, at {at}");
        }
    }

    #[test]
    fn a_decimal_past_8_bytes_counts_only_where_its_row_is_valid_in_any_chunk() {
        let rows = 2 * FIT_CHUNK + 3;
        let past = i128::from(i64::MAX) + 1;
        let mut values: Vec<i128> = (0..rows as i128).map(|v| v - 5).collect();
        let mut valid = vec![true; rows];
        values[FIT_CHUNK + 2] = past;
        valid[FIT_CHUNK + 2] = false;
        let decimals = |values: &[i128], valid: &[bool]| -> ArrayRef {
            Arc::new(
                Decimal128Array::new(
                    values.to_vec().into(),
                    Some(NullBuffer::from(valid.to_vec())),
                )
                .with_precision_and_scale(38, 0)
                .unwrap(),
            )
        };
        let words =
            column_words(&[decimals(&values, &valid)], &DataType::Decimal128(38, 0)).unwrap();
        let got = wide_values(&words);
        assert_eq!(got[FIT_CHUNK + 2], 0, "a NULL row's word");
        assert_eq!(
            (got[FIT_CHUNK + 1], got[rows - 1]),
            (FIT_CHUNK as i64 - 4, rows as i64 - 6)
        );
        valid[FIT_CHUNK + 2] = true;
        assert!(column_words(&[decimals(&values, &valid)], &DataType::Decimal128(38, 0)).is_none());
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
    fn a_wide_piece_after_narrow_ones_widens_every_word() {
        let narrow: ArrayRef = Arc::new(Int64Array::from(vec![Some(-3), None, Some(5)]));
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![i64::MAX, -1]));
        let words = column_words(&[narrow, wide], &DataType::Int64).unwrap();
        let WordValues::Wide(values) = &words.values else {
            panic!("a value past 32 bits widens the column");
        };
        let values: Vec<i64> = values.iter().map(|&w| w as i64).collect();
        assert_eq!(
            (values[0], values[2], values[3], values[4]),
            (-3, 5, i64::MAX, -1)
        );
        assert_eq!(words.validity, Some(vec![0b11101]));
    }

    #[test]
    fn validity_spans_pieces_sliced_or_not_and_clears_bits_past_the_rows() {
        // 70 valid rows, then a sliced piece with NULLs at its rows 1 and
        // 3, then 2 valid rows: 77 rows, across two words.
        let valid: ArrayRef = Arc::new(Int32Array::from((0..70).collect::<Vec<_>>()));
        let with_nulls: ArrayRef = Arc::new(Int32Array::from(vec![
            Some(9),
            Some(1),
            None,
            Some(3),
            None,
            Some(5),
        ]));
        let sliced = with_nulls.slice(1, 5);
        let tail: ArrayRef = Arc::new(Int32Array::from(vec![7, 8]));
        let words = column_words(&[valid, sliced, tail], &DataType::Int32).unwrap();
        assert_eq!(words.rows, 77);
        let validity = words.validity.unwrap();
        let valid_rows: Vec<usize> = (0..77)
            .filter(|&r| validity[r / 64] >> (r % 64) & 1 == 1)
            .collect();
        let expected: Vec<usize> = (0..77).filter(|&r| r != 71 && r != 73).collect();
        assert_eq!(valid_rows, expected);
        assert_eq!(validity[1] >> 13, 0, "no bit past the last row");
    }

    #[test]
    fn a_null_buffer_without_nulls_leaves_the_column_without_validity() {
        let all_valid: ArrayRef = Arc::new(Int32Array::new(
            vec![1, 2, 3].into(),
            Some(NullBuffer::new_valid(3)),
        ));
        assert!(all_valid.logical_nulls().is_some());
        let words = column_words(&[all_valid], &DataType::Int32).unwrap();
        assert_eq!(words.validity, None);
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
