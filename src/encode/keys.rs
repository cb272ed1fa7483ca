//! Join keys turned into one u64 per row, which is all the device compares.
//!
//! Three encodings, chosen at run time from the collected build side:
//!
//! * **Raw**: one key column of an 8-byte integer type (Int64, UInt64,
//!   Date64, Time64, Timestamp, Duration), when NULL keys cannot match
//!   (NULL equals nothing, or the build side has none). The key is the
//!   value's own bits, read in place from the Arrow buffer: no pass over the
//!   rows and no copy, the common case of large joins. Equal bits mean
//!   equal values; a probe value absent from the build side simply finds no
//!   match on the device. NULL rows are dropped.
//! * **Packed**: every key column is a fixed-width value (integers, dates,
//!   times, timestamps, durations, Decimal128, Boolean). Each column is coded
//!   as its offset from the build side's minimum, in just enough bits for the
//!   build side's range (plus one code for NULL when NULL equals NULL), and
//!   the codes are packed side by side. The coding is injective over the
//!   build domain, so equal packed keys mean equal rows and the device's
//!   answer needs no check. A probe value outside the build range cannot
//!   match and is dropped before the upload. TPC-H's two-column Int64 keys
//!   pack this way although their types take 128 bits.
//! * **Hashed**: everything else (strings, composites too wide to pack).
//!   The key is DataFusion's own row hash of the key columns; the device
//!   finds candidate pairs with equal hashes and the host keeps those whose
//!   key columns compare equal under the join's NULL semantics, with
//!   `HashJoinExec`'s own key comparator.
//!
//! Float key columns are first read as integers of their width
//! ([`equality_column`]): `HashJoinExec` hashes and compares floats by
//! their bits, -0.0 taken as 0.0 (IEEE totalOrder after that one
//! normalization: a NaN equals a NaN of the same bits, infinities
//! themselves), so those integers are equal exactly when the join calls
//! the floats equal, and a float key is raw or packed like an integer one,
//! with no check on the host: many equal floats (zeros, NaNs) no longer
//! send every candidate pair through the host comparator.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, Array, ArrayData, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::*;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::encode::float_keys::{equality_column, equality_type};
use crate::host::array_buffers::value_buffer;
use crate::host::mapped_ahead::MappedAhead;

/// The plan-time description of a join's keys: their types and NULL
/// semantics. Accepting a spec means every key type can be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    types: Vec<DataType>,
    null_equality: NullEquality,
}

/// Keys of the rows that can match, one u64 each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NormalizedKeys {
    /// One encoded key per kept row (with the raw encoding, the key
    /// column's own buffer).
    pub keys: ScalarBuffer<u64>,
    /// Index of each kept row in the input, ascending, or `None` when every
    /// row was kept.
    pub row_ids: Option<Vec<u64>>,
}

/// The keys of a build side or a probe chunk: encoded into one buffer, or,
/// where the raw encoding reads them in place and none is NULL, the key
/// column's own buffers batch by batch. Copying those into one buffer first
/// would be most of a probe chunk's `encode_time` and of a build side's
/// `build_prepare_time`, and the device copies them piece by piece anyway.
#[derive(Debug, Clone)]
pub enum JoinKeys {
    Encoded(NormalizedKeys),
    RawPieces(Vec<ScalarBuffer<u64>>),
}

impl JoinKeys {
    /// Keys in all.
    pub fn len(&self) -> usize {
        match self {
            Self::Encoded(keys) => keys.keys.len(),
            Self::RawPieces(pieces) => pieces.iter().map(|p| p.len()).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys, in pieces laid end to end.
    pub fn pieces(&self) -> Vec<&[u64]> {
        match self {
            Self::Encoded(keys) => vec![&keys.keys[..]],
            Self::RawPieces(pieces) => pieces.iter().map(|p| &p[..]).collect(),
        }
    }

    /// Each key's row in the chunk, or `None` where every row has its key.
    pub fn row_ids(&self) -> Option<&[u64]> {
        match self {
            Self::Encoded(keys) => keys.row_ids.as_deref(),
            Self::RawPieces(_) => None,
        }
    }

    /// One more than the largest row a key comes from (row ids ascend):
    /// a bound on the row ids.
    pub fn row_bound(&self) -> u64 {
        match self.row_ids() {
            Some(ids) => {
                debug_assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
                ids.last().map_or(0, |&id| id + 1)
            }
            None => self.len() as u64,
        }
    }

    /// The keys in one buffer (copied where they are in pieces).
    pub fn to_normalized(&self) -> std::borrow::Cow<'_, NormalizedKeys> {
        match self {
            Self::Encoded(keys) => std::borrow::Cow::Borrowed(keys),
            Self::RawPieces(pieces) => std::borrow::Cow::Owned(NormalizedKeys {
                keys: pieces.iter().flat_map(|p| p.iter().copied()).collect(),
                row_ids: None,
            }),
        }
    }
}

/// Whether a column of `data_type` packs as a fixed-width value.
fn packable(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Date32
            | Date64
            | Time32(_)
            | Time64(_)
            | Timestamp(_, _)
            | Duration(_)
            | Decimal128(_, _)
            | Boolean
    )
}

/// Whether a single key column of `data_type` is its own key: an 8-byte
/// integer, whose bits compare equal exactly when the values do.
fn raw(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int64 | UInt64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_)
    )
}

/// Whether a column of `data_type` can be hashed and compared on the host.
fn hashable(data_type: &DataType) -> bool {
    use DataType::*;
    packable(data_type)
        || matches!(
            data_type,
            Float16
                | Float32
                | Float64
                | Utf8
                | LargeUtf8
                | Utf8View
                | Binary
                | LargeBinary
                | BinaryView
                | FixedSizeBinary(_)
                | Decimal32(_, _)
                | Decimal64(_, _)
                | Decimal256(_, _)
        )
}

impl KeySpec {
    /// The spec for key columns of `types`, or why the GPU cannot take them.
    pub fn try_new(
        types: &[DataType],
        null_equality: NullEquality,
    ) -> std::result::Result<Self, String> {
        if types.is_empty() {
            return Err("the join has no equi-join keys".into());
        }
        if let Some(other) = types.iter().find(|t| !hashable(t)) {
            return Err(format!("key type {other} is not supported on the GPU"));
        }
        Ok(Self {
            types: types.to_vec(),
            null_equality,
        })
    }

    /// This spec with each float key column read as the integer of its
    /// width that [`equality_column`] makes of it.
    fn for_equality(&self) -> Self {
        Self {
            types: self.types.iter().map(equality_type).collect(),
            null_equality: self.null_equality,
        }
    }

    /// Key column types.
    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// Whether every key column can be packed (given a narrow enough range).
    pub fn packable(&self) -> bool {
        self.types.iter().all(packable)
    }

    /// Whether a key column of `data_type` packs (given a narrow enough range).
    pub fn is_packable(data_type: &DataType) -> bool {
        packable(data_type)
    }

    fn check_columns(&self, columns: &[ArrayRef]) -> Result<usize> {
        if columns.len() != self.types.len() {
            return Err(DataFusionError::Internal(format!(
                "{} key columns for {} planned",
                columns.len(),
                self.types.len()
            )));
        }
        let rows = columns.first().map(|c| c.len()).unwrap_or(0);
        for (column, data_type) in columns.iter().zip(&self.types) {
            if column.data_type() != data_type || column.len() != rows {
                return Err(DataFusionError::Internal(format!(
                    "key column of type {} and length {} where {data_type} and {rows} were planned",
                    column.data_type(),
                    column.len()
                )));
            }
        }
        Ok(rows)
    }
}

/// The `bits` bits of `word` from bit `shift` up: one column's code in a
/// word that packs several, first column highest.
#[inline]
pub(crate) fn field_of(word: u64, shift: u32, bits: u32) -> u64 {
    let mask = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    word.checked_shr(shift).unwrap_or(0) & mask
}

/// The range of one packed key column over the build side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Domain {
    /// Smallest build value; with `max < min` the build side has none.
    min: i128,
    max: i128,
    /// Code 0 stands for NULL (NULL equals NULL), values start at 1.
    null_code: bool,
    bits: u32,
}

/// Bits that code every value of `[min, max]` (none when `max < min`)
/// and, with `null_code`, one more code for NULL.
pub(crate) fn code_bits(min: i128, max: i128, null_code: bool) -> u32 {
    let values = if max < min {
        0
    } else {
        (max as u128).wrapping_sub(min as u128) + 1
    };
    let codes = values.saturating_add(u128::from(null_code));
    if codes <= 1 {
        0
    } else {
        128 - (codes - 1).leading_zeros()
    }
}

impl Domain {
    fn new(min: i128, max: i128, null_code: bool) -> Self {
        Self {
            min,
            max,
            null_code,
            bits: code_bits(min, max, null_code),
        }
    }

    /// The code of `value`, or `None` when no build value equals it.
    #[inline]
    fn code(&self, value: i128) -> Option<u64> {
        (self.min <= value && value <= self.max).then(|| {
            ((value as u128).wrapping_sub(self.min as u128) as u64) + u64::from(self.null_code)
        })
    }
}

/// How keys are encoded for one join, fixed once the build side is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEncoder {
    /// The keys' spec, float columns read as integers ([`equality_column`]).
    spec: KeySpec,
    encoding: Encoding,
    /// Whether a key column is a float: its codes stand for an equality
    /// class (-0.0 and 0.0 together) and cannot be decoded.
    float_keys: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Encoding {
    /// The single key column's own bits.
    Raw,
    /// Offsets from the build minimum, one domain per column.
    Packed(Vec<Domain>),
    /// DataFusion's row hash, checked on the host.
    Hashed,
}

/// The seed of the hashed encoding; both sides must use the same one.
const HASH_SEED: u64 = 0x6470_755f_6a6f_696e;

impl KeyEncoder {
    /// Chooses the encoding from the build side's key columns.
    #[cfg(test)]
    pub fn for_build_side(spec: &KeySpec, build_columns: &[ArrayRef]) -> Result<Self> {
        Self::for_pieces(spec, std::slice::from_ref(&build_columns.to_vec()))
    }

    /// Chooses the encoding from key columns held in pieces (each element
    /// of `pieces` holds every key column of some rows), as if the pieces
    /// were one set of columns.
    pub fn for_pieces(spec: &KeySpec, pieces: &[Vec<ArrayRef>]) -> Result<Self> {
        for piece in pieces {
            spec.check_columns(piece)?;
        }
        let float_keys = spec.types.iter().any(|t| equality_type(t) != *t);
        let spec = &spec.for_equality();
        let pieces: Vec<Vec<ArrayRef>> = pieces
            .iter()
            .map(|piece| piece.iter().map(equality_column).collect())
            .collect();
        let pieces = &pieces[..];
        let nulls_cannot_match = spec.null_equality == NullEquality::NullEqualsNothing
            || pieces.iter().all(|piece| piece[0].null_count() == 0);
        if spec.types.len() == 1 && raw(&spec.types[0]) && nulls_cannot_match {
            return Ok(Self {
                spec: spec.clone(),
                encoding: Encoding::Raw,
                float_keys,
            });
        }
        let packing = if spec.packable() {
            let null_code = spec.null_equality == NullEquality::NullEqualsNull;
            let mut domains = Vec::with_capacity(spec.types.len());
            let mut bits = 0u32;
            for column in 0..spec.types.len() {
                let column_pieces: Vec<ArrayRef> = pieces
                    .iter()
                    .map(|piece| Arc::clone(&piece[column]))
                    .collect();
                let (mut min, mut max) =
                    pieces_value_range(&column_pieces, crate::host::copy::host_threads())?;
                if min > max {
                    (min, max) = (1, 0);
                }
                let domain = Domain::new(min, max, null_code);
                bits += domain.bits;
                domains.push(domain);
            }
            (bits <= 64).then_some(domains)
        } else {
            None
        };
        Ok(Self {
            spec: spec.clone(),
            encoding: packing.map_or(Encoding::Hashed, Encoding::Packed),
            float_keys,
        })
    }

    /// Whether NULL keys match each other.
    pub fn null_equality(&self) -> NullEquality {
        self.spec.null_equality
    }

    /// The keys of rows whose key columns are in `pieces` (per key column,
    /// its arrays batch by batch), each piece's own buffer, when
    /// the raw encoding reads them in place and none is NULL; `None`
    /// otherwise (the columns are then concatenated and encoded).
    pub fn raw_pieces(&self, pieces: &[Vec<ArrayRef>]) -> Option<Vec<ScalarBuffer<u64>>> {
        let [column] = pieces else {
            return None;
        };
        let column: Vec<ArrayRef> = column.iter().map(equality_column).collect();
        let in_place = self.encoding == Encoding::Raw
            && column.iter().all(|piece| {
                piece.logical_null_count() == 0
                    && self.spec.check_columns(std::slice::from_ref(piece)).is_ok()
            });
        in_place.then(|| column.iter().map(|piece| raw_keys(piece).keys).collect())
    }

    /// Whether the keys of a column of `data_type` without NULLs are its
    /// own 8-byte words (the raw encoding, for this encoder's key type):
    /// the device then reads them where the column lies.
    pub fn reads_in_place(&self, data_type: &DataType) -> bool {
        self.encoding == Encoding::Raw
            && !self.float_keys
            && self.spec.types.len() == 1
            && self.spec.types[0] == *data_type
            && data_type.primitive_width() == Some(8)
    }

    /// Bits an encoded key may take: every key lies below 2^key_bits (64
    /// for raw and hashed keys).
    pub fn key_bits(&self) -> u32 {
        match &self.encoding {
            Encoding::Packed(domains) => domains.iter().map(|d| d.bits).sum(),
            Encoding::Raw | Encoding::Hashed => 64,
        }
    }

    /// Whether device matches must be checked on the host (hashed keys).
    pub fn needs_verification(&self) -> bool {
        self.encoding == Encoding::Hashed
    }

    /// `"raw"`, `"packed"` or `"hashed"`.
    #[cfg(test)]
    pub fn kind(&self) -> &'static str {
        match self.encoding {
            Encoding::Raw => "raw",
            Encoding::Packed(_) => "packed",
            Encoding::Hashed => "hashed",
        }
    }

    /// The key columns whose encoded keys are `keys`: the inverse of
    /// [`KeyEncoder::encode`] for the raw and packed encodings (a group's
    /// key rebuilt from its word, in order, rather than read from a row of
    /// it at random). Hashed keys cannot be decoded.
    pub fn decode(&self, keys: &[u64]) -> Result<Vec<ArrayRef>> {
        if self.float_keys {
            return Err(DataFusionError::Internal(
                "float keys are coded by equality and cannot be decoded".into(),
            ));
        }
        match &self.encoding {
            Encoding::Raw => Ok(vec![column_of_words(
                &self.spec.types[0],
                keys,
                &MappedAhead::none(),
            )?]),
            Encoding::Packed(domains) => {
                let mut columns = Vec::with_capacity(domains.len());
                // The last column holds the lowest bits.
                let mut shift = domains.iter().map(|d| d.bits).sum::<u32>();
                for (domain, data_type) in domains.iter().zip(&self.spec.types) {
                    shift -= domain.bits;
                    let code = |key: u64| field_of(key, shift, domain.bits);
                    let nulls = domain
                        .null_code
                        .then(|| NullBuffer::from_iter(keys.iter().map(|&key| code(key) != 0)))
                        .filter(|nulls| nulls.null_count() > 0);
                    let null_code = u64::from(domain.null_code);
                    let values = keys.iter().map(|&key| {
                        // A NULL's slot holds the minimum; its value is never read.
                        let offset = code(key).saturating_sub(null_code);
                        (domain.min as u128).wrapping_add(u128::from(offset)) as i128
                    });
                    columns.push(column_of_values(data_type, keys.len(), values, nulls)?);
                }
                Ok(columns)
            }
            Encoding::Hashed => Err(DataFusionError::Internal(
                "hashed keys cannot be decoded".into(),
            )),
        }
    }

    /// Encodes `columns`, dropping rows that cannot match anything: a NULL
    /// key when NULL equals nothing, and a value outside the build range.
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<NormalizedKeys> {
        self.encode_parallel(columns, 1)
    }

    /// Writes the codes of `columns` (all of `keys.len()` rows) into `keys`,
    /// setting `dropped[i]` where row `i` cannot match anything. Not for the
    /// raw encoding, whose keys are the column itself.
    fn encode_into(
        &self,
        columns: &[ArrayRef],
        keys: &mut [u64],
        dropped: &mut [bool],
    ) -> Result<()> {
        if self.spec.null_equality == NullEquality::NullEqualsNothing {
            for column in columns {
                if let Some(nulls) = column.logical_nulls().filter(|n| n.null_count() > 0) {
                    for i in nulls
                        .iter()
                        .enumerate()
                        .filter_map(|(i, v)| (!v).then_some(i))
                    {
                        dropped[i] = true;
                    }
                }
            }
        }
        match &self.encoding {
            Encoding::Packed(domains) => {
                for (i, (column, domain)) in columns.iter().zip(domains).enumerate() {
                    pack_column(column, domain, i == 0, keys, dropped)?;
                }
                Ok(())
            }
            Encoding::Hashed => {
                create_hashes(columns, &RandomState::with_seed(HASH_SEED), keys)?;
                Ok(())
            }
            Encoding::Raw => Err(DataFusionError::Internal(
                "raw keys are read in place, not encoded".into(),
            )),
        }
    }
}

/// The raw encoding of an 8-byte integer column: its buffer as it is, or,
/// with NULLs, the valid rows' values and their row ids.
fn raw_keys(column: &ArrayRef) -> NormalizedKeys {
    let words = raw_words(column);
    match column.logical_nulls().filter(|n| n.null_count() > 0) {
        None => NormalizedKeys {
            keys: words,
            row_ids: None,
        },
        Some(nulls) => {
            let row_ids: Vec<u64> = nulls.valid_indices().map(|i| i as u64).collect();
            let keys = row_ids.iter().map(|&i| words[i as usize]).collect();
            NormalizedKeys {
                keys,
                row_ids: Some(row_ids),
            }
        }
    }
}

/// The values of an 8-byte column as the words its buffer holds (NULL
/// slots included), without a copy.
pub(crate) fn raw_words(column: &ArrayRef) -> ScalarBuffer<u64> {
    ScalarBuffer::new(value_buffer(column.as_ref(), 8), 0, column.len())
}

/// Expands `$each!(ArrowType)` for the column types whose values are integers
/// of at most 64 bits (integers, dates, timestamps), matched on `$data_type`;
/// other types fall through, so a caller handles them after it. Each caller's
/// `$each` returns from the calling function.
macro_rules! for_64_bit_integer_type {
    ($data_type:expr, $each:ident) => {
        match $data_type {
            DataType::Int8 => $each!(Int8Type),
            DataType::Int16 => $each!(Int16Type),
            DataType::Int32 => $each!(Int32Type),
            DataType::Int64 => $each!(Int64Type),
            DataType::UInt8 => $each!(UInt8Type),
            DataType::UInt16 => $each!(UInt16Type),
            DataType::UInt32 => $each!(UInt32Type),
            DataType::UInt64 => $each!(UInt64Type),
            DataType::Date32 => $each!(Date32Type),
            DataType::Date64 => $each!(Date64Type),
            DataType::Timestamp(TimeUnit::Second, _) => $each!(TimestampSecondType),
            DataType::Timestamp(TimeUnit::Millisecond, _) => $each!(TimestampMillisecondType),
            DataType::Timestamp(TimeUnit::Microsecond, _) => $each!(TimestampMicrosecondType),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => $each!(TimestampNanosecondType),
            _ => {}
        }
    };
}
pub(crate) use for_64_bit_integer_type;

/// Calls `f(row, value)` for every row of a packable column, NULL slots
/// included (their value is arbitrary).
pub(crate) fn for_each_value(column: &ArrayRef, mut f: impl FnMut(usize, i128)) -> Result<()> {
    macro_rules! each {
        ($arrow_type:ty) => {{
            for (i, &v) in column
                .as_primitive::<$arrow_type>()
                .values()
                .iter()
                .enumerate()
            {
                f(i, v as i128);
            }
        }};
    }
    use DataType::*;
    match column.data_type() {
        Int8 => each!(Int8Type),
        Int16 => each!(Int16Type),
        Int32 => each!(Int32Type),
        Int64 => each!(Int64Type),
        UInt8 => each!(UInt8Type),
        UInt16 => each!(UInt16Type),
        UInt32 => each!(UInt32Type),
        UInt64 => each!(UInt64Type),
        Date32 => each!(Date32Type),
        Date64 => each!(Date64Type),
        Time32(TimeUnit::Second) => each!(Time32SecondType),
        Time32(TimeUnit::Millisecond) => each!(Time32MillisecondType),
        Time64(TimeUnit::Microsecond) => each!(Time64MicrosecondType),
        Time64(TimeUnit::Nanosecond) => each!(Time64NanosecondType),
        Timestamp(TimeUnit::Second, _) => each!(TimestampSecondType),
        Timestamp(TimeUnit::Millisecond, _) => each!(TimestampMillisecondType),
        Timestamp(TimeUnit::Microsecond, _) => each!(TimestampMicrosecondType),
        Timestamp(TimeUnit::Nanosecond, _) => each!(TimestampNanosecondType),
        Duration(TimeUnit::Second) => each!(DurationSecondType),
        Duration(TimeUnit::Millisecond) => each!(DurationMillisecondType),
        Duration(TimeUnit::Microsecond) => each!(DurationMicrosecondType),
        Duration(TimeUnit::Nanosecond) => each!(DurationNanosecondType),
        Decimal128(_, _) => each!(Decimal128Type),
        Boolean => {
            for (i, v) in column.as_boolean().values().iter().enumerate() {
                f(i, i128::from(v));
            }
        }
        other => {
            return Err(DataFusionError::Internal(format!(
                "packing a key column of type {other}"
            )))
        }
    }
    Ok(())
}

/// [`value_range`] over slices of a large column on up to `threads`
/// threads: the build side's range is found while every probe partition
/// waits (all the host's cores), a sort-merge join partition's on its share
/// of them.
pub(crate) fn value_range_in_parallel(column: &ArrayRef, threads: usize) -> Result<(i128, i128)> {
    const MIN_ROWS_PER_THREAD: usize = 1 << 21;
    let threads = threads.min(column.len() / MIN_ROWS_PER_THREAD);
    if threads <= 1 {
        return value_range(column);
    }
    let ranges = crate::host::parallel::on_ranges(column.len(), threads, |rows| {
        value_range(&column.slice(rows.start, rows.len()))
    })?;
    Ok(ranges
        .into_iter()
        .filter(|(min, max)| min <= max)
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
        .unwrap_or((1, 0)))
}

/// [`value_range`] of one column held in `pieces` (`(1, 0)` when there is
/// no value), on up to `threads` threads: one large piece (a build side)
/// split into row ranges, or many pieces (an aggregation's or a sort-merge
/// join's input batches) spread over them whole.
pub(crate) fn pieces_value_range(pieces: &[ArrayRef], threads: usize) -> Result<(i128, i128)> {
    let merge = |ranges: Vec<(i128, i128)>| {
        ranges
            .into_iter()
            .filter(|(min, max)| min <= max)
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
            .unwrap_or((1, 0))
    };
    if let [piece] = pieces {
        return value_range_in_parallel(piece, threads);
    }
    // A thread per 64 Ki rows at least: starting one costs microseconds.
    let rows: usize = pieces.iter().map(|piece| piece.len()).sum();
    let threads = threads.min(pieces.len()).min(rows >> 16).max(1);
    let ranges = crate::host::parallel::on_ranges(pieces.len(), threads, |range| {
        pieces[range]
            .iter()
            .map(value_range)
            .collect::<Result<Vec<_>>>()
            .map(merge)
    })?;
    Ok(merge(ranges))
}

/// The smallest and largest non-NULL value (`(1, 0)` when there is none).
pub(crate) fn value_range(column: &ArrayRef) -> Result<(i128, i128)> {
    // Integers and decimals. Without NULLs, one pass that keeps both ends
    // (arrow's `min` and `max` take a pass each); with NULLs, arrow's
    // kernels, which skip them.
    macro_rules! range {
        ($arrow_type:ty) => {{
            let values = column.as_primitive::<$arrow_type>();
            if values.null_count() == 0 {
                let values = values.values();
                let Some(&first) = values.first() else {
                    return Ok((1, 0));
                };
                let (min, max) = values
                    .iter()
                    .fold((first, first), |(min, max), &v| (min.min(v), max.max(v)));
                return Ok((min as i128, max as i128));
            }
            let (min, max) = (
                datafusion::arrow::compute::min(values),
                datafusion::arrow::compute::max(values),
            );
            return Ok(match (min, max) {
                (Some(min), Some(max)) => (min as i128, max as i128),
                _ => (1, 0),
            });
        }};
    }
    for_64_bit_integer_type!(column.data_type(), range);
    if let DataType::Decimal128(_, _) = column.data_type() {
        range!(Decimal128Type);
    }
    // Boolean, times and durations: one pass through i128.
    let nulls = column.logical_nulls();
    let (mut min, mut max) = (i128::MAX, i128::MIN);
    for_each_value(column, |i, v| {
        if nulls.as_ref().is_none_or(|n| n.is_valid(i)) {
            min = min.min(v);
            max = max.max(v);
        }
    })?;
    Ok(if min > max { (1, 0) } else { (min, max) })
}

/// `keys[i] = keys[i] << bits | code(column[i])`, or, for the `first`
/// column, `keys[i] = code(column[i])` without reading `keys` (see
/// [`KeyEncoder::encode_parallel`]); sets `dropped[i]` where the value has
/// no code.
fn pack_column(
    column: &ArrayRef,
    domain: &Domain,
    first: bool,
    keys: &mut [u64],
    dropped: &mut [bool],
) -> Result<()> {
    let nulls: Option<NullBuffer> = column.logical_nulls().filter(|n| n.null_count() > 0);
    let is_null = |i: usize| nulls.as_ref().is_some_and(|n| n.is_null(i));
    let put = |key: &mut u64, code: u64| {
        *key = if first || domain.bits >= 64 {
            code
        } else {
            (*key << domain.bits) | code
        };
    };
    // Values of up to 64 bits: offsets in wrapping u64 arithmetic, one
    // compare for the range check (the hot path of integer keys).
    macro_rules! pack64 {
        ($arrow_type:ty) => {{
            let values = column.as_primitive::<$arrow_type>().values();
            let empty = domain.max < domain.min;
            let base = domain.min as u64;
            let span = (domain.max as u64).wrapping_sub(base);
            let null_code = u64::from(domain.null_code);
            // Sign- or zero-extended to 64 bits, as the domain was.
            let offset = |v| (v as i128 as u64).wrapping_sub(base);
            if first && nulls.is_none() && !empty {
                // The common case, one store per row and no branch but
                // the rare drop.
                for ((key, drop), &v) in keys.iter_mut().zip(dropped.iter_mut()).zip(values) {
                    let offset = offset(v);
                    *key = offset.wrapping_add(null_code);
                    if offset > span {
                        *drop = true;
                    }
                }
                return Ok(());
            }
            for (i, &v) in values.iter().enumerate() {
                if is_null(i) {
                    match domain.null_code {
                        true => put(&mut keys[i], 0),
                        false => dropped[i] = true,
                    }
                    continue;
                }
                let offset = offset(v);
                if !empty && offset <= span {
                    put(&mut keys[i], offset + null_code);
                } else {
                    dropped[i] = true;
                }
            }
            return Ok(());
        }};
    }
    for_64_bit_integer_type!(column.data_type(), pack64);
    // Decimal128, Boolean, times and durations: through i128.
    for_each_value(column, |i, v| {
        let code = if is_null(i) {
            domain.null_code.then_some(0)
        } else {
            domain.code(v)
        };
        match code {
            Some(code) => put(&mut keys[i], code),
            None => dropped[i] = true,
        }
    })
}

/// A column of `data_type` (an integer, float or temporal type of up to 8
/// bytes) whose values' bits are the low bytes of `words`: the inverse of a
/// column viewed as one word per value, sign- or zero-extended.
pub(crate) fn column_of_words(
    data_type: &DataType,
    words: &[u64],
    memory: &MappedAhead,
) -> Result<ArrayRef> {
    let buffer = match data_type.primitive_width() {
        Some(8) => {
            let mut values = memory.take(words.len());
            values.extend_from_slice(words);
            Buffer::from_vec(values)
        }
        Some(4) => Buffer::from_iter(words.iter().map(|&w| w as u32)),
        Some(2) => Buffer::from_iter(words.iter().map(|&w| w as u16)),
        Some(1) => Buffer::from_iter(words.iter().map(|&w| w as u8)),
        _ => {
            return Err(DataFusionError::Internal(format!(
                "a {data_type} column from words"
            )))
        }
    };
    column_of_buffer(data_type, words.len(), buffer, None)
}

/// A column of the packable `data_type` holding `values` (as
/// [`for_each_value`] reads them) and `nulls`.
pub(crate) fn column_of_values(
    data_type: &DataType,
    len: usize,
    values: impl Iterator<Item = i128>,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    if *data_type == DataType::Boolean {
        let values = BooleanBuffer::from_iter(values.map(|v| v != 0));
        return Ok(Arc::new(BooleanArray::new(values, nulls)));
    }
    // Two's complement: the low bytes of the i128 are the value's bits.
    let buffer = match data_type.primitive_width() {
        Some(16) => Buffer::from_iter(values),
        Some(8) => Buffer::from_iter(values.map(|v| v as u64)),
        Some(4) => Buffer::from_iter(values.map(|v| v as u32)),
        Some(2) => Buffer::from_iter(values.map(|v| v as u16)),
        Some(1) => Buffer::from_iter(values.map(|v| v as u8)),
        _ => {
            return Err(DataFusionError::Internal(format!(
                "a {data_type} key column from its codes"
            )))
        }
    };
    column_of_buffer(data_type, len, buffer, nulls)
}

/// A fixed-width column of `data_type` whose `len` values are `values`,
/// NULL where `nulls` says.
pub(crate) fn column_of_buffer(
    data_type: &DataType,
    len: usize,
    values: Buffer,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let data = ArrayData::builder(data_type.clone())
        .len(len)
        .add_buffer(values)
        .nulls(nulls)
        .build()?;
    Ok(make_array(data))
}

/// The key spec of a join, or why its keys cannot be encoded.
pub(crate) fn join_key_spec(join: &HashJoinExec) -> Result<KeySpec, String> {
    let types = key_types(join.left(), join.right(), join.on())?;
    KeySpec::try_new(&types, join.null_equality())
}

/// The type of each equi-join key, or why the two sides' types differ.
pub(crate) fn key_types(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    on: &[(PhysicalExprRef, PhysicalExprRef)],
) -> Result<Vec<DataType>, String> {
    let (left_schema, right_schema) = (left.schema(), right.schema());
    on.iter()
        .map(|(left, right)| {
            let left_type = left.data_type(&left_schema).map_err(|e| e.to_string())?;
            let right_type = right.data_type(&right_schema).map_err(|e| e.to_string())?;
            if left_type != right_type {
                return Err(format!(
                    "key types differ across the join ({left_type} and {right_type})"
                ));
            }
            Ok(left_type)
        })
        .collect()
}

#[path = "keys_parallel.rs"]
mod parallel;

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
