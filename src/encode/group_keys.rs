//! Group keys as one 64-bit word per row, and the host check that makes
//! hashed words safe.
//!
//! The device groups rows by equal words, so a word must stand for one key.
//! Three ways to get one, cheapest first:
//!
//! * **Own word**: one integer or float column without NULLs. Its bits are
//!   the word (floats after DataFusion's folding of `-0.0` into `+0.0`).
//! * **Packed**: integer-like columns whose ranges fit 64 bits together,
//!   coded as join keys are ([`KeyEncoder`]); NULL has a code of its own.
//! * **Hashed**: anything else (strings, binary, several columns with a
//!   float, ranges too wide to pack): DataFusion's row hash. Two keys may
//!   share a hash, so every row's key is then compared on the host with the
//!   key of the row that stands for its group ([`groups_hold_one_key`]);
//!   one difference sends the partition to DataFusion's CPU operator.
//!
//! Where the groups must leave in key order, the keys are instead coded in
//! that order ([`ordered_group_key_words`]): each word is the key's
//! order-preserving code ([`OrderedKeyEncoder`]), so ascending words are
//! the order asked for.
//!
//! Equality is DataFusion's for group values: NULL is a group of its own,
//! floats compare by bits once `-0.0` is folded into `+0.0` (so NaNs with
//! different payloads are different groups, as they are there).

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::UInt64Array;
use datafusion::arrow::array::{make_array, make_comparator, Array, ArrayData, ArrayRef, AsArray};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::{take, SortOptions};
use datafusion::arrow::datatypes::{ArrowNativeType, DataType, Float32Type};
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};

use crate::encode::keys::{column_of_words, raw_words, KeyEncoder, KeySpec};
use crate::encode::ordered_keys::{KeySide, OrderedKeyEncoder};
use crate::encode::words::pieces_words;
use crate::encode::words::ValueKind;
use crate::gpu::launch::CodeTransform;
use crate::host::array_buffers::value_buffer;
use crate::host::copy::host_threads;
use crate::host::mapped_ahead::MappedAhead;
use crate::host::parallel::{map_pieces, on_ranges, starts_of};
pub(crate) use crate::ops::group_by::estimated_groups;
use crate::ops::group_by::Words;

/// The seed of hashed group keys.
const GROUP_HASH_SEED: u64 = 0x6770_755f_6772_6f75;

/// One word per row, and how a word stands for its key.
pub(crate) struct GroupKeyWords {
    pub(crate) words: Words,
    pub(crate) kind: GroupKeyKind,
}

/// How a group key became its word.
pub(crate) enum GroupKeyKind {
    /// The one key column's own bits, of this type.
    Own(DataType),
    /// Packed codes.
    Packed(KeyEncoder),
    /// Hashes: equal words may stand for different keys, so the groups
    /// must be checked on the host, and a word cannot be turned back into
    /// its key.
    Hashed,
    /// Order-preserving codes of the key columns taken in `order` (indexes
    /// of the group expressions, most significant first, every one once).
    Ordered {
        encoder: OrderedKeyEncoder,
        /// The key types, in `order`.
        types: Vec<DataType>,
        order: Vec<usize>,
    },
}

impl GroupKeyWords {
    /// Whether the words are hashes.
    pub(crate) fn hashed(&self) -> bool {
        matches!(self.kind, GroupKeyKind::Hashed)
    }

    /// The key columns of the groups whose words are `words`; not for
    /// hashed words.
    pub(crate) fn decode(&self, words: &[u64], memory: &MappedAhead) -> Result<Vec<ArrayRef>> {
        match &self.kind {
            GroupKeyKind::Own(data_type) => Ok(vec![column_of_words(data_type, words, memory)?]),
            GroupKeyKind::Packed(encoder) => encoder.decode(words),
            GroupKeyKind::Ordered {
                encoder,
                types,
                order,
            } => {
                let decoded = encoder.decode(words, types)?;
                // Back into the group expressions' order.
                let mut columns = vec![None; order.len()];
                for (column, &key) in decoded.into_iter().zip(order) {
                    columns[key] = Some(column);
                }
                columns
                    .into_iter()
                    .map(|c| {
                        c.ok_or_else(|| {
                            DataFusionError::Internal("a group key left out of the order".into())
                        })
                    })
                    .collect()
            }
            GroupKeyKind::Hashed => Err(DataFusionError::Internal(
                "hashed group keys cannot be decoded".into(),
            )),
        }
    }
}

/// Key columns (per key expression, one array per input batch) with every
/// float `-0.0` replaced by `+0.0`, as DataFusion's group values store
/// them: the key a group shows is then the one DataFusion would show, and
/// bitwise equality is its equality. Columns without `-0.0` are kept as
/// they are.
pub(crate) fn fold_negative_zeros(key_columns: Vec<Vec<ArrayRef>>) -> Result<Vec<Vec<ArrayRef>>> {
    key_columns
        .into_iter()
        .map(|pieces| {
            pieces
                .into_iter()
                .map(|piece| match piece.data_type() {
                    DataType::Float16 => fold::<u16>(piece),
                    DataType::Float32 => fold::<u32>(piece),
                    DataType::Float64 => fold::<u64>(piece),
                    _ => Ok(piece),
                })
                .collect()
        })
        .collect()
}

/// The bits of a float of one width, read as an unsigned integer.
trait FloatBits: ArrowNativeType + Eq {
    /// The bits of `-0.0`: the sign bit alone.
    const NEGATIVE_ZERO: Self;
}

impl FloatBits for u16 {
    const NEGATIVE_ZERO: Self = 1 << 15;
}

impl FloatBits for u32 {
    const NEGATIVE_ZERO: Self = 1 << 31;
}

impl FloatBits for u64 {
    const NEGATIVE_ZERO: Self = 1 << 63;
}

/// `piece`, a float column whose values are `U`'s width, with `-0.0`
/// replaced by `+0.0` (all bits zero).
fn fold<U: FloatBits>(piece: ArrayRef) -> Result<ArrayRef> {
    let data = piece.to_data();
    let values = &data.buffer::<U>(0)[..data.len()];
    if !values.contains(&U::NEGATIVE_ZERO) {
        return Ok(piece);
    }
    let folded: Vec<U> = values
        .iter()
        .map(|&v| {
            if v == U::NEGATIVE_ZERO {
                U::default()
            } else {
                v
            }
        })
        .collect();
    let data = ArrayData::builder(data.data_type().clone())
        .len(data.len())
        .add_buffer(Buffer::from_vec(folded))
        .nulls(data.nulls().cloned())
        .build()?;
    Ok(make_array(data))
}

/// [`group_key_words`] where they are the key column's own values (one
/// integer or float key without NULLs, read in place, nothing computed);
/// `None` where the keys must be packed or hashed.
pub(crate) fn own_group_key_words(
    key_spec: &KeySpec,
    key_columns: &[Vec<ArrayRef>],
) -> Result<Option<GroupKeyWords>> {
    let [column] = key_columns else {
        return Ok(None);
    };
    // A cache miss or two a piece: thousands of them on every core.
    let no_nulls = map_pieces(column.len(), |p| Ok(column[p].logical_null_count() == 0))?;
    if !no_nulls.into_iter().all(|none| none) {
        return Ok(None);
    }
    let data_type = &key_spec.types()[0];
    Ok(own_words(data_type, column)?.map(|words| GroupKeyWords {
        words,
        kind: GroupKeyKind::Own(data_type.clone()),
    }))
}

/// The words of `key_columns` (per key expression, one array per batch;
/// floats already folded by [`fold_negative_zeros`]) for `batches` batches.
/// Hashed words keep their low `hash_bits` bits (64 but in tests of the
/// check). `None` when the keys need hashing and `allow_hashing` is false
/// (found before any key is hashed).
pub(crate) fn group_key_words(
    key_spec: &KeySpec,
    key_columns: &[Vec<ArrayRef>],
    batches: usize,
    allow_hashing: bool,
    hash_bits: u32,
) -> Result<Option<GroupKeyWords>> {
    if !(1..=64).contains(&hash_bits) {
        return Err(DataFusionError::Configuration(format!(
            "gpu_test.hashed_group_key_bits must be within 1 and 64, not {hash_bits}"
        )));
    }
    let hash_mask = u64::MAX >> (64 - hash_bits);
    if let Some(own) = own_group_key_words(key_spec, key_columns)? {
        return Ok(Some(own));
    }
    let pieces = columns_per_batch(key_columns, batches);
    if key_spec.packable() {
        let encoder = KeyEncoder::for_pieces(key_spec, &pieces)?;
        if !encoder.needs_verification() {
            let words = on_pieces(&pieces, |columns| {
                let encoded = encoder.encode(columns)?;
                // NULL is a group and every value is in range: no row is
                // ever dropped.
                if encoded.row_ids.is_some() {
                    return Err(DataFusionError::Internal(
                        "group key encoding dropped rows".into(),
                    ));
                }
                Ok(encoded.keys)
            })?;
            return Ok(Some(GroupKeyWords {
                words,
                kind: GroupKeyKind::Packed(encoder),
            }));
        }
    }
    if !allow_hashing {
        return Ok(None);
    }
    let words = on_pieces(&pieces, |columns| {
        let rows = columns.first().map_or(0, |c| c.len());
        let mut hashes = vec![0u64; rows];
        create_hashes(
            columns,
            &RandomState::with_seed(GROUP_HASH_SEED),
            &mut hashes,
        )?;
        if hash_mask != u64::MAX {
            hashes.iter_mut().for_each(|h| *h &= hash_mask);
        }
        Ok(hashes)
    })?;
    Ok(Some(GroupKeyWords {
        words,
        kind: GroupKeyKind::Hashed,
    }))
}

/// Group keys coded in the order the groups must leave in.
pub(crate) struct OrderedGroupKeyWords {
    pub(crate) keys: GroupKeyWords,
    /// Bits the codes use: what the device sorts on.
    pub(crate) bits: u32,
    /// Set where the words are the raw key column, which the device turns
    /// into the codes itself (one 8-byte integer key without NULLs).
    pub(crate) transform: Option<CodeTransform>,
}

/// The words of `key_columns` (per key expression, one array per batch)
/// for `batches` batches, coded so that ascending words are the order of
/// the key expressions `order` (most significant first, every key once)
/// with their `options`; `None` when the codes need more than 64 bits or a
/// key type has no order-preserving code. The ranges are found on every
/// core, and so are the codes, unless the device makes them.
pub(crate) fn ordered_group_key_words(
    key_spec: &KeySpec,
    key_columns: &[Vec<ArrayRef>],
    order: &[(usize, SortOptions)],
) -> Result<Option<OrderedGroupKeyWords>> {
    let mut seen = vec![false; key_columns.len()];
    for &(key, _) in order {
        if key >= seen.len() || std::mem::replace(&mut seen[key], true) {
            return Err(DataFusionError::Internal(format!(
                "group order {order:?} over {} keys",
                seen.len()
            )));
        }
    }
    if seen.contains(&false) {
        return Err(DataFusionError::Internal(format!(
            "group order {order:?} leaves out a key of {}",
            seen.len()
        )));
    }
    let types: Vec<DataType> = order
        .iter()
        .map(|&(key, _)| key_spec.types()[key].clone())
        .collect();
    let options: Vec<SortOptions> = order.iter().map(|&(_, options)| options).collect();
    let columns: Vec<Vec<ArrayRef>> = order
        .iter()
        .map(|&(key, _)| key_columns[key].clone())
        .collect();
    let none = vec![Vec::new(); columns.len()];
    let Some(encoder) = OrderedKeyEncoder::for_side_pieces(
        &types,
        &options,
        NullEquality::NullEqualsNull,
        &columns,
        &none,
        host_threads(),
    )?
    else {
        return Ok(None);
    };
    let transform = encoder.device_transform(&types);
    let words = match (transform, columns.as_slice()) {
        (Some(_), [column]) => {
            let mut words = Words::default();
            for piece in column {
                words.push(Box::new(raw_words(piece)));
            }
            words
        }
        _ => {
            let pieces = columns_per_batch(&columns, columns.first().map_or(0, |c| c.len()));
            on_pieces(&pieces, |columns| encoder.encode(columns, KeySide::Left, 1))?
        }
    };
    Ok(Some(OrderedGroupKeyWords {
        bits: encoder.bits(),
        transform,
        keys: GroupKeyWords {
            words,
            kind: GroupKeyKind::Ordered {
                encoder,
                types,
                order: order.iter().map(|&(key, _)| key).collect(),
            },
        },
    }))
}

/// A single key column without NULLs that is its own word: an integer, or
/// a float (its bits, which are injective and, once `-0.0` is folded, are
/// DataFusion's equality).
fn own_words(data_type: &DataType, column: &[ArrayRef]) -> Result<Option<Words>> {
    let mut words = Words::default();
    match data_type {
        DataType::Float64 => {
            for piece in pieces_words(column, ValueKind::Float64)? {
                words.push(piece);
            }
        }
        DataType::Float32 => {
            for piece in column {
                let values = piece.as_primitive::<Float32Type>().values();
                words.push(Box::new(
                    values
                        .iter()
                        .map(|v| u64::from(v.to_bits()))
                        .collect::<Vec<u64>>(),
                ));
            }
        }
        other => match ValueKind::of(other) {
            Some(kind @ (ValueKind::Signed | ValueKind::Unsigned)) => {
                for piece in pieces_words(column, kind)? {
                    words.push(piece);
                }
            }
            _ => return Ok(None),
        },
    }
    Ok(Some(words))
}

/// Per batch of `batches`, its key columns, from per key column, its
/// arrays batch by batch.
fn columns_per_batch(key_columns: &[Vec<ArrayRef>], batches: usize) -> Vec<Vec<ArrayRef>> {
    (0..batches)
        .map(|b| key_columns.iter().map(|c| Arc::clone(&c[b])).collect())
        .collect()
}

/// `encode` over every batch's key columns, the batches spread over the
/// cores, one piece of words per batch in batch order.
fn on_pieces<P: AsRef<[u64]> + Send + Sync + 'static>(
    pieces: &[Vec<ArrayRef>],
    encode: impl Fn(&[ArrayRef]) -> Result<P> + Sync,
) -> Result<Words> {
    let encoded = on_ranges(pieces.len(), host_threads(), |batches| {
        pieces[batches]
            .iter()
            .map(|columns| encode(columns))
            .collect::<Result<Vec<_>>>()
    })?;
    let mut words = Words::default();
    for piece in encoded.into_iter().flatten() {
        words.push(Box::new(piece));
    }
    Ok(words)
}

/// Rows sampled to estimate how many groups a partition makes.
pub(crate) const GROUP_SAMPLE_ROWS: usize = 65_536;

/// How many rows were sampled and how many distinct keys they hold: up
/// to `sample` rows spread evenly over the batches' key columns (per key
/// expression, one array per batch), evenly rather than the first rows so
/// that input sorted on its keys is not mistaken for a few groups. Only the
/// sampled rows are read (each key hashed; a collision of two 64-bit
/// hashes would undercount by one), so the decision costs nothing like a
/// pass over the partition.
pub(crate) fn sampled_distinct_keys(
    key_columns: &[Vec<ArrayRef>],
    sample: usize,
) -> Result<(usize, usize)> {
    let Some(first) = key_columns.first() else {
        return Ok((0, 0));
    };
    let rows: usize = first.iter().map(|piece| piece.len()).sum();
    if rows == 0 || sample == 0 {
        return Ok((0, 0));
    }
    // Rows 0, stride, 2 stride, ... of all batches; each batch's share is
    // found from where it starts, so the batches are sampled on every core
    // (an input of tens of thousands of batches costs a take and a hash
    // call per batch).
    let stride = rows.div_ceil(sample).max(1);
    let starts = starts_of(first.iter().map(|piece| piece.len()));
    if let Some(counted) = sampled_distinct_words(key_columns, stride, &starts) {
        return Ok(counted);
    }
    let random_state = RandomState::with_seed(GROUP_HASH_SEED);
    let threads = host_threads().min(first.len()).min(rows >> 16).max(1);
    let hashes = on_ranges(first.len(), threads, |batches| {
        let mut hashes = Vec::new();
        for batch in batches {
            let (start, end) = (starts[batch], starts[batch] + first[batch].len());
            let picked: Vec<u64> = (start.div_ceil(stride) * stride..end)
                .step_by(stride)
                .map(|row| (row - start) as u64)
                .collect();
            if picked.is_empty() {
                continue;
            }
            let indices = UInt64Array::from(picked);
            let columns = key_columns
                .iter()
                .map(|pieces| take(pieces[batch].as_ref(), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let mut batch_hashes = vec![0u64; indices.len()];
            create_hashes(&columns, &random_state, &mut batch_hashes)?;
            hashes.extend(batch_hashes);
        }
        Ok(hashes)
    })?;
    let sampled = hashes.iter().map(Vec::len).sum();
    let mut seen = HashSet::with_capacity_and_hasher(sampled, random_state);
    for part in hashes {
        seen.extend(part);
    }
    Ok((sampled, seen.len()))
}

/// [`sampled_distinct_keys`] of one fixed-width key column of at most 8
/// bytes without NULLs, rows `0, stride, 2 stride, ...` (`starts`: where
/// each batch begins): the keys' own bits, read in place, are as many
/// distinct words as there are distinct keys (float keys come with `-0.0`
/// folded). No array is made per batch, which for an input of thousands
/// of batches costs more than the sample itself. `None` for other keys.
fn sampled_distinct_words(
    key_columns: &[Vec<ArrayRef>],
    stride: usize,
    starts: &[usize],
) -> Option<(usize, usize)> {
    let [pieces] = key_columns else {
        return None;
    };
    let width = pieces.first()?.data_type().primitive_width()?;
    if !matches!(width, 1 | 2 | 4 | 8) || pieces.iter().any(|p| p.null_count() > 0) {
        return None;
    }
    // Each sampled row is a cache and TLB miss of its own: a few threads
    // read them, fewer than the cores, whose starting would cost more.
    let threads = host_threads().min(SAMPLE_THREADS).min(pieces.len()).max(1);
    let words = on_ranges(pieces.len(), threads, |range| {
        let mut words = Vec::new();
        for (piece, &start) in pieces[range.clone()].iter().zip(&starts[range]) {
            let values = value_buffer(piece.as_ref(), width);
            let bytes = values.as_slice();
            let end = start + piece.len();
            for row in (start.div_ceil(stride) * stride..end).step_by(stride) {
                let at = (row - start) * width;
                let mut word = [0u8; 8];
                word[..width].copy_from_slice(&bytes[at..at + width]);
                words.push(u64::from_le_bytes(word));
            }
        }
        Ok(words)
    })
    .ok()?;
    let sampled = words.iter().map(Vec::len).sum();
    let mut seen = HashSet::with_capacity_and_hasher(sampled, RandomState::with_seed(0));
    for part in words {
        seen.extend(part);
    }
    Some((sampled, seen.len()))
}

/// Threads that read a sample of keys in place.
const SAMPLE_THREADS: usize = 8;

/// Whether a sample of `sampled` keys with `distinct` distinct ones saw
/// each group many times over (eight on average), so that the groups are
/// few and their number known.
pub(crate) fn sample_shows_few_groups(sampled: usize, distinct: usize) -> bool {
    sampled > 0 && distinct * 8 <= sampled
}

/// Whether a sample of `sampled` keys with `distinct` distinct ones, out of
/// `rows` rows, says that at least one row in `rows_per_group` is a group
/// of its own ([`estimated_groups`]).
pub(crate) fn sample_shows_groups_near_rows(
    sampled: usize,
    distinct: usize,
    rows: usize,
    rows_per_group: usize,
) -> bool {
    if sampled == 0 || rows == 0 {
        return false;
    }
    estimated_groups(sampled, distinct, rows) >= rows.div_ceil(rows_per_group.max(1))
}

/// Whether every row's key equals the key of its group: `row_groups[i]` is
/// the group of row `i` (rows counted across the batches in order), and
/// `group_keys` holds each group's key (one array per key expression, one
/// row per group). False when two keys shared a hash.
pub(crate) fn groups_hold_one_key(
    key_columns: &[Vec<ArrayRef>],
    group_keys: &[ArrayRef],
    row_groups: &[u64],
) -> Result<bool> {
    let Some(first) = key_columns.first() else {
        return Ok(true);
    };
    let batches = first.len();
    let mut starts = Vec::with_capacity(batches);
    let mut rows = 0usize;
    for piece in first {
        starts.push(rows);
        rows += piece.len();
    }
    if rows != row_groups.len() {
        return Err(DataFusionError::Internal(format!(
            "{} row groups for {rows} rows",
            row_groups.len()
        )));
    }
    let groups = group_keys.first().map_or(0, |k| k.len());
    if let Some(&g) = row_groups.iter().find(|&&g| g as usize >= groups) {
        return Err(DataFusionError::Internal(format!(
            "row group {g} of {groups} groups"
        )));
    }
    let verdicts = on_ranges(batches, host_threads(), |batch_range| {
        for b in batch_range {
            let groups_of_rows = &row_groups[starts[b]..starts[b] + first[b].len()];
            for (pieces, keys) in key_columns.iter().zip(group_keys) {
                // NULL compares equal to NULL: it is a group of its own.
                let compare =
                    make_comparator(pieces[b].as_ref(), keys.as_ref(), SortOptions::default())?;
                let differs = groups_of_rows
                    .iter()
                    .enumerate()
                    .any(|(row, &group)| compare(row, group as usize) != Ordering::Equal);
                if differs {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    })?;
    Ok(verdicts.into_iter().all(|holds| holds))
}

#[cfg(test)]
#[path = "group_keys_tests.rs"]
mod tests;
