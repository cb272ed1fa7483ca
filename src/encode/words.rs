//! Arrow columns to the 64-bit words the device reduces, and back.
//!
//! Sums use the values' own two's-complement bits (a wrapping sum is the
//! same on signed and unsigned words). Minima and maxima use *ordered*
//! words, whose unsigned order is the type's order: signed values with the
//! sign bit flipped. A Decimal128 is two words, low and high.

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray};
use datafusion::arrow::buffer::{Buffer, NullBuffer};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};

use crate::encode::keys::column_of_buffer;
use crate::host::array_buffers::value_buffer;
use crate::host::copy::host_threads;
use crate::host::mapped_ahead::MappedAhead;
use crate::host::parallel::{map_pieces, on_ranges, on_row_chunks};
use crate::ops::group_by::{WordPiece, Words};

/// How the values of a column become 64-bit device words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueKind {
    /// Signed integers of 1 to 8 bytes, and the types stored as them
    /// (dates, times, timestamps, durations).
    Signed,
    /// Unsigned integers of 1 to 8 bytes.
    Unsigned,
    /// `Float64`.
    Float64,
    /// `Decimal128`, two words.
    Decimal128,
}

impl ValueKind {
    /// The kind of `data_type`, if the device can hold it.
    pub(crate) fn of(data_type: &DataType) -> Option<Self> {
        use DataType::*;
        match data_type {
            Int8
            | Int16
            | Int32
            | Int64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_) => Some(ValueKind::Signed),
            UInt8 | UInt16 | UInt32 | UInt64 => Some(ValueKind::Unsigned),
            Float64 => Some(ValueKind::Float64),
            Decimal128(_, _) => Some(ValueKind::Decimal128),
            _ => None,
        }
    }
}

/// The sign bit: flipped, signed words compare as unsigned ones in order.
pub(crate) const SIGN: u64 = 1 << 63;

/// The words of one column: low words, high words for Decimal128, and the
/// flip the device applies to the low words before comparing them.
#[derive(Debug, Default)]
pub(crate) struct ColumnWords {
    pub(crate) low: Words,
    pub(crate) high: Words,
    pub(crate) flip: u64,
}

fn width(data_type: &DataType) -> Result<usize> {
    data_type.primitive_width().ok_or_else(|| {
        DataFusionError::Internal(format!("{data_type} is not a fixed-width column"))
    })
}

/// The values buffer of an 8-byte column, read as words where it lies.
struct BufferWords(Buffer);

impl AsRef<[u64]> for BufferWords {
    fn as_ref(&self) -> &[u64] {
        // Arrow keeps 8-byte values 8-byte aligned (a PrimitiveArray
        // checks it), so the cast never fails.
        self.0.typed_data::<u64>()
    }
}

/// The values of one piece as words: the Arrow buffer itself for 8-byte
/// types; 1, 2 and 4-byte values widened (sign-extended for signed kinds).
/// NULL slots hold whatever the buffer holds.
pub(crate) fn piece_words(array: &dyn Array, kind: ValueKind) -> Result<WordPiece> {
    let len = array.len();
    let width = width(array.data_type())?;
    let values = value_buffer(array, width);
    macro_rules! widen {
        ($t:ty, $widen:expr) => {
            Box::new(
                values.typed_data::<$t>()[..len]
                    .iter()
                    .map($widen)
                    .collect::<Vec<u64>>(),
            )
        };
    }
    Ok(match (kind, width) {
        (ValueKind::Signed | ValueKind::Unsigned | ValueKind::Float64, 8) => {
            Box::new(BufferWords(values))
        }
        (ValueKind::Signed, 1) => widen!(i8, |&v| v as i64 as u64),
        (ValueKind::Signed, 2) => widen!(i16, |&v| v as i64 as u64),
        (ValueKind::Signed, 4) => widen!(i32, |&v| v as i64 as u64),
        (ValueKind::Unsigned, 1) => widen!(u8, |&v| u64::from(v)),
        (ValueKind::Unsigned, 2) => widen!(u16, |&v| u64::from(v)),
        (ValueKind::Unsigned, 4) => widen!(u32, |&v| u64::from(v)),
        (kind, width) => {
            return Err(DataFusionError::Internal(format!(
                "{kind:?} values of {width} bytes"
            )))
        }
    })
}

fn decimal_words(pieces: &[ArrayRef], ordered: bool) -> Result<ColumnWords> {
    let flip = if ordered { SIGN } else { 0 };
    let split = |array: &ArrayRef| -> (WordPiece, WordPiece) {
        let data = array.to_data();
        let values = &data.buffer::<i128>(0)[..data.len()];
        (
            Box::new(values.iter().map(|&v| v as u64).collect::<Vec<u64>>()),
            Box::new(
                values
                    .iter()
                    .map(|&v| ((v >> 64) as u64) ^ flip)
                    .collect::<Vec<u64>>(),
            ),
        )
    };
    // Every value is copied into two words: on every core.
    let threads = threads_for(pieces.len(), pieces.iter().map(|p| p.len()).sum());
    let per_range = on_ranges(pieces.len(), threads, |range| {
        Ok(pieces[range].iter().map(split).collect::<Vec<_>>())
    })?;
    let mut words = ColumnWords::default();
    for (low, high) in per_range.into_iter().flatten() {
        words.low.push(low);
        words.high.push(high);
    }
    Ok(words)
}

fn low_words(pieces: &[ArrayRef], kind: ValueKind, flip: u64) -> Result<ColumnWords> {
    let mut words = ColumnWords {
        flip,
        ..ColumnWords::default()
    };
    for piece in pieces_words(pieces, kind)? {
        words.low.push(piece);
    }
    Ok(words)
}

/// Rows below which one thread does a per-row pass over a column's
/// pieces: a thread costs tens of microseconds to start.
const ROWS_PER_THREAD: usize = 1 << 16;

/// Threads for a per-row pass over `rows` rows in `pieces` pieces (input
/// batches), each thread taking whole pieces: by rows, not by pieces,
/// since a filtered input arrives in many small batches, and a few hundred
/// of them can hold millions of rows, too many for one thread (TPC-H
/// q15's Decimal128 arithmetic reads such an input).
pub(crate) fn threads_for(pieces: usize, rows: usize) -> usize {
    host_threads()
        .min(pieces)
        .min(rows / ROWS_PER_THREAD)
        .max(1)
}

/// [`piece_words`] of every piece, on every core where values are widened:
/// a column arrives in thousands of batches.
pub(crate) fn pieces_words(pieces: &[ArrayRef], kind: ValueKind) -> Result<Vec<WordPiece>> {
    if pieces
        .iter()
        .all(|p| p.data_type().primitive_width() == Some(8))
    {
        // Each piece is read where it lies: a few allocations a piece,
        // which cost less on this thread than starting threads for them
        // (a millisecond or more for all cores on a virtual machine),
        // unless the pieces run into thousands.
        return map_pieces(pieces.len(), |p| piece_words(pieces[p].as_ref(), kind));
    }
    let threads = threads_for(pieces.len(), pieces.iter().map(|p| p.len()).sum());
    let per_range = on_ranges(pieces.len(), threads, |range| {
        pieces[range]
            .iter()
            .map(|array| piece_words(array.as_ref(), kind))
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(per_range.into_iter().flatten().collect())
}

/// Words whose wrapping sum is the sum of the values.
pub(crate) fn sum_words(pieces: &[ArrayRef], kind: ValueKind) -> Result<ColumnWords> {
    match kind {
        ValueKind::Decimal128 => decimal_words(pieces, false),
        kind => low_words(pieces, kind, 0),
    }
}

/// Words whose unsigned order, once the device applies `flip`, is the
/// values' order.
pub(crate) fn ordered_words(pieces: &[ArrayRef], kind: ValueKind) -> Result<ColumnWords> {
    match kind {
        ValueKind::Decimal128 => decimal_words(pieces, true),
        ValueKind::Signed => low_words(pieces, kind, SIGN),
        ValueKind::Unsigned => low_words(pieces, kind, 0),
        ValueKind::Float64 => Err(DataFusionError::Internal(
            "floats have no ordered words here".into(),
        )),
    }
}

/// The rows that take part, over all pieces: valid in the column and, with
/// a FILTER, where it is true. `None` when that is every row. Built on
/// every core, each thread filling whole words of the bitmap.
pub(crate) fn row_validity(
    pieces: &[ArrayRef],
    filter: Option<&[BooleanArray]>,
) -> Option<Vec<u64>> {
    // Reading each piece's validity is a cache miss or two: thousands of
    // pieces are read on every core. Only a panicking thread fails, and
    // then this thread reads them.
    // A validity buffer without a NULL (some Arrow compute functions
    // leave one) is none.
    let nulls_of = |p: &ArrayRef| p.logical_nulls().filter(|n| n.null_count() > 0);
    let nulls: Vec<Option<NullBuffer>> = map_pieces(pieces.len(), |p| Ok(nulls_of(&pieces[p])))
        .unwrap_or_else(|_| pieces.iter().map(nulls_of).collect());
    let filter = filter.filter(|f| f.iter().any(|f| f.null_count() > 0 || f.false_count() > 0));
    if nulls.iter().all(Option::is_none) && filter.is_none() {
        return None;
    }
    // Where each piece begins among the rows.
    let mut starts = Vec::with_capacity(pieces.len());
    let mut rows = 0;
    for piece in pieces {
        starts.push(rows);
        rows += piece.len();
    }
    let valid = |p: usize, i: usize| {
        nulls[p].as_ref().is_none_or(|n| n.is_valid(i))
            && filter.is_none_or(|f| f[p].is_valid(i) && f[p].value(i))
    };
    let mut bits = vec![0u64; rows.div_ceil(64)];
    let threads = threads_for(bits.len(), rows);
    let words_per_thread = bits.len().div_ceil(threads).max(1);
    // Filling words cannot fail.
    let _ = on_row_chunks(
        &mut bits,
        None::<&mut [()]>,
        words_per_thread,
        |first_word, words, _| {
            let first_row = 64 * first_word;
            let end = (first_row + 64 * words.len()).min(rows);
            let mut piece = starts
                .partition_point(|&s| s <= first_row)
                .saturating_sub(1);
            for row in first_row..end {
                while row - starts[piece] >= pieces[piece].len() {
                    piece += 1;
                }
                if valid(piece, row - starts[piece]) {
                    words[(row - first_row) / 64] |= 1 << (row % 64);
                }
            }
            Ok(())
        },
    );
    Some(bits)
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
    memory: &MappedAhead,
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
        (ValueKind::Signed, 8) => eight_byte_values(low, unflip, memory),
        (ValueKind::Unsigned, 1) => Buffer::from_vec(narrow(low, |w| w, |w| w as u8)),
        (ValueKind::Unsigned, 2) => Buffer::from_vec(narrow(low, |w| w, |w| w as u16)),
        (ValueKind::Unsigned, 4) => Buffer::from_vec(narrow(low, |w| w, |w| w as u32)),
        (ValueKind::Unsigned, 8) | (ValueKind::Float64, 8) => eight_byte_values(low, |w| w, memory),
        (kind, width) => {
            return Err(DataFusionError::Internal(format!(
                "{kind:?} result as {data_type} of {width} bytes"
            )))
        }
    };
    let nulls = valid.map(NullBuffer::from).filter(|n| n.null_count() > 0);
    column_of_buffer(data_type, len, buffer, nulls)
}

/// 8-byte values, which are their words (unflipped where `unflip` says),
/// in a buffer that may have been mapped ahead.
fn eight_byte_values(words: &[u64], unflip: impl Fn(u64) -> u64, memory: &MappedAhead) -> Buffer {
    let mut values = memory.take(words.len());
    values.extend(words.iter().map(|&w| unflip(w)));
    Buffer::from_vec(values)
}

fn narrow<T>(words: &[u64], unflip: impl Fn(u64) -> u64, to: impl Fn(u64) -> T) -> Vec<T> {
    words.iter().map(|&w| to(unflip(w))).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use datafusion::arrow::array::{
        AsArray, Date32Array, Decimal128Array, Int16Array, Int64Array, UInt32Array,
    };
    use datafusion::arrow::datatypes::{
        Date32Type, Decimal128Type, Float64Type, Int16Type, Int64Type, UInt64Type,
    };
    use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, UnboundedMemoryPool};

    fn pieces(arrays: Vec<ArrayRef>) -> Vec<ArrayRef> {
        arrays
    }

    #[test]
    fn eight_byte_results_fill_buffers_mapped_ahead_as_they_fill_fresh_ones() {
        // Signed with the sign bit flipped (minima and maxima), unsigned
        // and float words, into two mapped buffers and then, once those
        // are taken, fresh ones: the same columns either way.
        let signed = [i64::MIN, -1, 0, 7, i64::MAX];
        let flipped: Vec<u64> = signed.iter().map(|&v| (v as u64) ^ SIGN).collect();
        let floats = vec![-0.5f64, 0.0, 1.5, f64::INFINITY, 3.25];
        let float_words: Vec<u64> = floats.iter().map(|v| v.to_bits()).collect();
        let unsigned = vec![0u64, 1, u64::MAX, 42, 1 << 63];
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let reservation = MemoryConsumer::new("mapped ahead").register(&pool);
        let mapped = MappedAhead::start(2, 8, 1, reservation);
        mapped.wait_for_buffers(2);
        for round in 0..2 {
            let back = column_from_words(
                &DataType::Int64,
                ValueKind::Signed,
                true,
                &flipped,
                &[],
                Some(vec![true, true, false, true, true]),
                &mapped,
            )
            .unwrap();
            let expected = Int64Array::from(vec![
                Some(i64::MIN),
                Some(-1),
                None,
                Some(7),
                Some(i64::MAX),
            ]);
            assert_eq!(back.as_primitive::<Int64Type>(), &expected, "round {round}");
            let back = column_from_words(
                &DataType::Float64,
                ValueKind::Float64,
                false,
                &float_words,
                &[],
                None,
                &mapped,
            )
            .unwrap();
            assert_eq!(
                back.as_primitive::<Float64Type>().values(),
                floats.as_slice()
            );
            let back = column_from_words(
                &DataType::UInt64,
                ValueKind::Unsigned,
                false,
                &unsigned,
                &[],
                None,
                &mapped,
            )
            .unwrap();
            assert_eq!(
                back.as_primitive::<UInt64Type>().values(),
                unsigned.as_slice()
            );
        }
        // Two of the six columns took the mapped buffers.
        assert_eq!(mapped.taken(), 2);
    }

    #[test]
    fn ordered_words_sort_like_the_values_once_flipped() {
        let values = Int16Array::from(vec![-5, 3, i16::MIN, 0, i16::MAX]);
        let words =
            ordered_words(&pieces(vec![Arc::new(values.clone())]), ValueKind::Signed).unwrap();
        let flipped: Vec<u64> = words.low.to_vec().iter().map(|w| w ^ words.flip).collect();
        let mut by_word: Vec<usize> = (0..5).collect();
        by_word.sort_by_key(|&i| flipped[i]);
        assert_eq!(by_word, vec![2, 0, 3, 1, 4]);
        let back = column_from_words(
            &DataType::Int16,
            ValueKind::Signed,
            true,
            &flipped,
            &[],
            None,
            &MappedAhead::none(),
        )
        .unwrap();
        assert_eq!(back.as_primitive::<Int16Type>(), &values);
    }

    #[test]
    fn decimals_round_trip_through_two_words() {
        let values = Decimal128Array::from(vec![-(1i128 << 70), 12345, -1, i128::MAX])
            .with_precision_and_scale(38, 2)
            .unwrap();
        let column: Vec<ArrayRef> =
            vec![Arc::new(values.slice(0, 1)), Arc::new(values.slice(1, 3))];
        for ordered in [false, true] {
            let words = if ordered {
                ordered_words(&column, ValueKind::Decimal128).unwrap()
            } else {
                sum_words(&column, ValueKind::Decimal128).unwrap()
            };
            assert_eq!(words.flip, 0);
            let back = column_from_words(
                values.data_type(),
                ValueKind::Decimal128,
                ordered,
                &words.low.to_vec(),
                &words.high.to_vec(),
                Some(vec![true, true, false, true]),
                &MappedAhead::none(),
            )
            .unwrap();
            let back = back.as_primitive::<Decimal128Type>();
            assert_eq!(back.value(0), -(1i128 << 70));
            assert_eq!(back.value(3), i128::MAX);
            assert!(back.is_null(2));
            assert_eq!(back.data_type(), values.data_type());
        }
        let ordered = ordered_words(&column, ValueKind::Decimal128).unwrap();
        let (high, low) = (ordered.high.to_vec(), ordered.low.to_vec());
        let key = |i: usize| (high[i], low[i]);
        assert!(key(0) < key(2) && key(2) < key(1) && key(1) < key(3));
    }

    #[test]
    fn sliced_pieces_read_from_their_offset_and_8_byte_values_are_not_copied() {
        let dates = Date32Array::from(vec![1, 2, 3, 4]).slice(1, 2);
        let words = sum_words(&pieces(vec![Arc::new(dates)]), ValueKind::Signed).unwrap();
        assert_eq!(words.low.to_vec(), vec![2, 3]);
        let back = column_from_words(
            &DataType::Date32,
            ValueKind::Signed,
            false,
            &words.low.to_vec(),
            &[],
            None,
            &MappedAhead::none(),
        )
        .unwrap();
        assert_eq!(back.as_primitive::<Date32Type>().values(), &[2, 3]);
        let wide = Int64Array::from(vec![-1, 5, 7]);
        let piece = wide.slice(1, 2);
        let words = sum_words(&pieces(vec![Arc::new(piece.clone())]), ValueKind::Signed).unwrap();
        assert_eq!(words.low.to_vec(), vec![5, 7]);
        assert_eq!(
            words.low.pieces()[0].as_ptr() as usize,
            piece.values().as_ptr() as usize
        );
        let unsigned = UInt32Array::from(vec![u32::MAX, 0]);
        let words = ordered_words(&pieces(vec![Arc::new(unsigned)]), ValueKind::Unsigned).unwrap();
        assert_eq!(words.low.to_vec(), vec![u64::from(u32::MAX), 0]);
        assert_eq!(words.flip, 0);
    }

    #[test]
    fn validity_spans_pieces_and_combines_nulls_and_the_filter() {
        let column: Vec<ArrayRef> = vec![
            Arc::new(Int16Array::from(vec![Some(1), None])),
            Arc::new(Int16Array::from(vec![Some(3), Some(4)])),
        ];
        let filter = [
            BooleanArray::from(vec![Some(true), Some(true)]),
            BooleanArray::from(vec![None, Some(true)]),
        ];
        let bits = row_validity(&column, Some(&filter)).unwrap();
        assert_eq!(bits, vec![0b1001]);
        // Many uneven pieces, some empty, over several threads' words:
        // every row's bit is its own.
        let mut rng = 7u64;
        let mut next = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            rng >> 33
        };
        let (mut column, mut filter, mut want) = (Vec::<ArrayRef>::new(), Vec::new(), Vec::new());
        for _ in 0..300 {
            let len = (next() % 3000) as usize;
            let values: Vec<Option<i16>> =
                (0..len).map(|_| (next() % 5 != 0).then_some(1)).collect();
            let keep: Vec<Option<bool>> = (0..len)
                .map(|_| match next() % 7 {
                    0 => None,
                    n => Some(n % 2 == 0),
                })
                .collect();
            want.extend(
                values
                    .iter()
                    .zip(&keep)
                    .map(|(v, k)| v.is_some() && *k == Some(true)),
            );
            column.push(Arc::new(Int16Array::from(values)));
            filter.push(BooleanArray::from(keep));
        }
        let bits = row_validity(&column, Some(&filter)).unwrap();
        assert_eq!(bits.len(), want.len().div_ceil(64));
        for (row, &valid) in want.iter().enumerate() {
            assert_eq!(bits[row / 64] >> (row % 64) & 1 == 1, valid, "row {row}");
        }
        let all_true = [BooleanArray::from(vec![true; 2])];
        let no_nulls: Vec<ArrayRef> = vec![Arc::new(Int16Array::from(vec![1, 2]))];
        assert!(row_validity(&no_nulls, Some(&all_true)).is_none());
        // A validity buffer that marks every row valid needs no bitmap
        // either: the shape of an aggregate's device work over a column
        // that cannot be NULL depends on it.
        let all_valid: Vec<ArrayRef> = vec![Arc::new(Int16Array::new(
            vec![1, 2, 3].into(),
            Some(NullBuffer::new_valid(3)),
        ))];
        assert!(all_valid[0].logical_nulls().is_some());
        assert!(row_validity(&all_valid, None).is_none());
    }
}
