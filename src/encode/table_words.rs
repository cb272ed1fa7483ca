//! A table column as the device column cache keeps it: one 8-byte word a
//! row (signed integers, dates, timestamps, booleans and decimals as
//! `i64`; floats as the bits of an `f64`; strings as codes into a
//! dictionary of their distinct values, kept on the host) and a validity
//! bitmap where it has NULLs. Host work only.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanBufferBuilder};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, Decimal32Type, Decimal64Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt8Type,
};

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::string_codes::{code_strings, strings_array, Dictionary};
use crate::gpu::{zeroed_for_fill, FillingBuffer, PinnedPool, WordKind};
use crate::trace;

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
    /// 4-byte integers, as `Narrow`, in page-locked memory the device's
    /// pool lent: copied to the device without staging.
    Pinned(Box<PinnedNarrow>),
}

impl WordValues {
    /// The values' bytes.
    pub fn bytes(&self) -> &[u8] {
        use datafusion::arrow::datatypes::ToByteSlice;
        match self {
            WordValues::Wide(words) => words.to_byte_slice(),
            WordValues::Narrow(values) => values.to_byte_slice(),
            WordValues::Pinned(values) => values.bytes(),
        }
    }

    /// Whether the values are 4-byte integers.
    pub fn narrow(&self) -> bool {
        matches!(self, WordValues::Narrow(_) | WordValues::Pinned(_))
    }
}

/// Rows a column's part has at least for its words to be made in
/// page-locked memory ([`WordsBuilder::with_pinned_room`]): a smaller
/// part's staging costs little, and its loan would tie up a buffer.
pub const MIN_PINNED_ROWS: usize = 1 << 16;

/// 4-byte integers written into a page-locked buffer, as many as it has
/// room for.
#[derive(Debug)]
pub struct PinnedNarrow {
    buffer: FillingBuffer,
    /// Values written.
    len: usize,
}

impl PinnedNarrow {
    /// Values the buffer has room for past those written.
    fn room(&self) -> usize {
        2 * self.buffer.len() - self.len
    }

    /// The values written, as bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buffer.as_bytes()[..4 * self.len]
    }

    /// The values written.
    pub fn values(&self) -> &[i32] {
        let bytes = self.bytes();
        // SAFETY: the bytes of `len` i32 values written by `push`, at the
        // start of the buffer's page-locked words (aligned to 8 bytes, so
        // to 4); every bit pattern is a valid i32.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i32>(), self.len) }
    }

    /// Appends `piece`'s values as [`narrow_into`] makes them, or returns
    /// `false` (nothing appended) where one does not fit 4 bytes. The
    /// caller has checked the room.
    fn push(&mut self, piece: &ArrayRef) -> bool {
        let (start, rows) = (self.len, piece.len());
        assert!(rows <= self.room(), "a piece past a pinned buffer's room");
        let bytes = &mut self.buffer.as_mut_bytes()[4 * start..4 * (start + rows)];
        // SAFETY: `bytes` holds exactly `rows` 4-byte slots, aligned to 4
        // (the buffer's words are aligned to 8 and `start` counts 4-byte
        // values); MaybeUninit<i32> has i32's layout and accepts any bytes.
        let out = unsafe {
            std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<MaybeUninit<i32>>(), rows)
        };
        if !narrow_into(piece, out) {
            return false;
        }
        self.len += rows;
        true
    }

    /// The buffer and the bytes of the values written, for the copy.
    pub fn into_buffer(self) -> (FillingBuffer, usize) {
        (self.buffer, 4 * self.len)
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
        Self::with_values(data_type, |kind| match kind {
            WordKind::F64 => WordValues::Wide(empty_for_fill(initial_room(rows))),
            WordKind::I64 | WordKind::Code | WordKind::Bytes => {
                WordValues::Narrow(empty_for_fill(initial_room(rows)))
            }
        })
    }

    /// A builder as [`Self::with_rows_hint`] makes, but that writes an
    /// integer column's 4-byte values straight into page-locked memory
    /// `pool` lends, with room for `rows` rows, so that they are copied to
    /// the device without staging: where `rows` is at least
    /// [`MIN_PINNED_ROWS`] and the pool lends the room. A piece past the
    /// room, or a value past 4 bytes, moves the values to ordinary memory.
    pub fn with_pinned_room(data_type: &DataType, rows: usize, pool: &Arc<PinnedPool>) -> Option<Self> {
        if word_kind(data_type)? != WordKind::I64 || rows < MIN_PINNED_ROWS {
            return Self::with_rows_hint(data_type, rows);
        }
        match pool.take_for_fill(rows.div_ceil(2)) {
            Ok(Some(buffer)) => Self::with_values(data_type, |_| {
                WordValues::Pinned(Box::new(PinnedNarrow { buffer, len: 0 }))
            }),
            Ok(None) => Self::with_rows_hint(data_type, rows),
            Err(e) => {
                trace::event(|| format!("words in ordinary memory: {e}"));
                Self::with_rows_hint(data_type, rows)
            }
        }
    }

    /// A builder of a column of `data_type` whose values start as
    /// `values` makes them for the column's kind.
    fn with_values(data_type: &DataType, values: impl FnOnce(WordKind) -> WordValues) -> Option<Self> {
        let kind = word_kind(data_type)?;
        Some(Self {
            data_type: data_type.clone(),
            kind,
            rows: 0,
            values: values(kind),
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
        if matches!(&self.values, WordValues::Pinned(pinned) if pinned.room() < piece.len()) {
            // Past the lent room: the values so far to ordinary memory.
            let values = std::mem::replace(&mut self.values, WordValues::Narrow(Vec::new()));
            if let WordValues::Pinned(pinned) = values {
                let written = pinned.values();
                let mut narrow = empty_for_fill((2 * written.len()).max(written.len() + piece.len()));
                narrow.extend_from_slice(written);
                self.values = WordValues::Narrow(narrow);
            }
        }
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
                    let room = narrow.capacity().max(before + piece.len());
                    let (wide, appended) = widened(narrow, room, piece);
                    self.values = wide;
                    appended
                }
            }
            // Never a coded column (`with_pinned_room`).
            (WordValues::Pinned(pinned), _) => {
                if pinned.push(piece) {
                    true
                } else {
                    let written = pinned.values();
                    let room = (2 * pinned.buffer.len()).max(written.len() + piece.len());
                    let (wide, appended) = widened(written, room, piece);
                    self.values = wide;
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
                .map(|d| strings_array(d.values(), &self.data_type)),
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

/// `narrow`'s values as 8-byte words, with room for `room` words, and
/// `piece`'s appended: the values of a column from its first value past 4
/// bytes on; with whether `piece` could be appended.
fn widened(narrow: &[i32], room: usize, piece: &ArrayRef) -> (WordValues, bool) {
    let mut wide: Vec<u64> = empty_for_fill(room);
    wide.extend(narrow.iter().map(|&v| i64::from(v) as u64));
    let appended = plain_words(piece, &mut wide).is_some();
    (WordValues::Wide(wide), appended)
}

/// Values checked for fitting a narrower word at once, then copied: few
/// enough to stay in the CPU's first-level cache between the two loops.
const FIT_CHUNK: usize = 1024;

/// Appends `array`'s values as 4-byte integers, or returns `false` (with
/// `out` in any state) where one does not fit (see [`narrow_into`]).
fn narrow_words(array: &ArrayRef, out: &mut Vec<i32>) -> bool {
    room_for(out, array.len());
    let start = out.len();
    if !narrow_into(array, &mut out.spare_capacity_mut()[..array.len()]) {
        return false;
    }
    // SAFETY: `narrow_into` returned `true`, so it wrote every one of the
    // `array.len()` slots past `start`, which `room_for` made room for.
    unsafe { out.set_len(start + array.len()) };
    true
}

/// Writes `array`'s values as 4-byte integers into `out` (one slot a row),
/// every slot where it returns `true`; returns `false` (with `out` in any
/// state) where one does not fit (NULL rows included: they hold whatever
/// the array holds there) or the type is not an integer.
/// Checked before copied, in loops the compiler vectorizes: this runs over
/// every row of every column a query first reads.
fn narrow_into(array: &ArrayRef, out: &mut [MaybeUninit<i32>]) -> bool {
    debug_assert_eq!(out.len(), array.len());
    fn put<T: Copy>(out: &mut [MaybeUninit<i32>], values: &[T], narrow: impl Fn(T) -> i32) {
        for (slot, &value) in out.iter_mut().zip(values) {
            slot.write(narrow(value));
        }
    }
    macro_rules! always {
        ($t:ty) => {{
            put(out, array.as_primitive::<$t>().values(), |v| v as i32);
            true
        }};
    }
    // Checked a chunk at a time, then copied while the chunk is in the
    // CPU's first-level cache: both loops vectorize (a running minimum and
    // maximum, or a per-value branch, do not).
    macro_rules! if_fits {
        ($t:ty, $fits:expr) => {{
            let values = array.as_primitive::<$t>().values();
            for (chunk, slots) in values.chunks(FIT_CHUNK).zip(out.chunks_mut(FIT_CHUNK)) {
                if !chunk.iter().fold(true, |fits, &v| fits & $fits(v)) {
                    return false;
                }
                put(slots, chunk, |v| v as i32);
            }
            true
        }};
        ($t:ty) => {
            if_fits!($t, |v| v as i64 as i32 as i64 == v as i64)
        };
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
            for (slot, bit) in out.iter_mut().zip(array.as_boolean().values().iter()) {
                slot.write(i32::from(bit));
            }
            true
        }
        DataType::Decimal128(_, _) => if_fits!(Decimal128Type, |v: i128| v as i32 as i128 == v),
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

/// `pieces` (arrays of one type, end to end) as words, or `None` where they
/// cannot be: a type [`word_kind`] refuses, a decimal beyond 64 bits, or
/// strings with more than [`MAX_DICTIONARY_VALUES`] distinct values. For
/// the tests of this module and of [`super::string_codes`].
#[cfg(test)]
pub(super) fn column_words(pieces: &[ArrayRef], data_type: &DataType) -> Option<HostWords> {
    let mut builder = WordsBuilder::with_rows_hint(data_type, 0)?;
    for piece in pieces {
        if !builder.push(piece) {
            return None;
        }
    }
    Some(builder.finish())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
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
            WordValues::Narrow(_) | WordValues::Pinned(_) => panic!("expected 8-byte words"),
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
}
