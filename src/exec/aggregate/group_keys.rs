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

use super::spec::ValueKind;
use super::words::pieces_words;
use crate::array_buffers::value_buffer;
use crate::exec::keys::{column_of_words, raw_words, KeyEncoder, KeySpec};
use crate::exec::mapped_ahead::MappedAhead;
use crate::exec::ordered_keys::{KeySide, OrderedKeyEncoder};
use crate::exec::parallel::{map_pieces, on_ranges, starts_of};
use crate::gpu::launch::CodeTransform;
use crate::host_copy::host_threads;
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
            "gpu.hashed_group_key_bits must be within 1 and 64, not {hash_bits}"
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

/// Whether a sample of `sampled` rows holding `distinct` keys says the
/// partition makes fewer groups than the GPU needs to win: each sampled
/// key repeats 8 times on average, and 8 times the distinct keys stay under
/// `min_groups` (`gpu.min_groups`; 0 never says so). The group-by sweep
/// measured the GPU at half DataFusion's speed up to 2^12 groups and ahead
/// from 2^16 (BENCHMARKS.md); a sample of 2^16 rows tells 2^12 groups
/// (4096 distinct) from 2^16 (about 41,000).
pub(crate) fn sample_shows_few_groups(sampled: usize, distinct: usize, min_groups: usize) -> bool {
    min_groups > 0 && sampled > 0 && distinct * 8 <= sampled && distinct * 8 < min_groups
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
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int16Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::Float64Type;

    #[test]
    fn groups_are_estimated_from_the_sample_s_repeats() {
        let (sample, rows) = (1 << 16, 1 << 28);
        let near = |got: usize, want: f64| (got as f64 / want - 1.0).abs() < 0.01;
        // Uniform over 2^24 groups: about 128 repeats (the birthday count).
        let g = estimated_groups(sample, sample - 128, rows);
        assert!(near(g, (1u64 << 24) as f64), "{g}");
        // 2^12 groups, each drawn 16 times on average: all of them seen.
        let g = estimated_groups(sample, 4096, rows);
        assert!((4096..4200).contains(&g), "{g}");
        // 2^16 groups: e^-1 of them unseen, 41,427 distinct.
        let g = estimated_groups(sample, 41_427, rows);
        assert!(near(g, 65_536.0), "{g}");
        // No repeat: as many groups as rows; a repeat or so: capped there.
        assert_eq!(estimated_groups(sample, sample, rows), rows);
        assert_eq!(estimated_groups(sample, sample - 1, 1 << 20), 1 << 20);
        // Every row sampled: exact; nothing sampled: nothing known.
        assert_eq!(estimated_groups(1000, 17, 1000), 17);
        assert_eq!(estimated_groups(0, 0, rows), 0);
    }

    #[test]
    fn the_sample_tells_groups_near_the_rows_from_fewer() {
        // 2^16 keys sampled from 2^28 rows: uniform over 2^26 groups they
        // repeat about 32 times, over 2^24 about 128 times, over 2^16
        // groups about 24,000 times (41,000 distinct).
        let (sample, rows) = (1 << 16, 1 << 28);
        assert!(sample_shows_groups_near_rows(sample, sample, rows, 8));
        assert!(sample_shows_groups_near_rows(sample, sample - 32, rows, 8));
        assert!(!sample_shows_groups_near_rows(
            sample,
            sample - 128,
            rows,
            8
        ));
        assert!(!sample_shows_groups_near_rows(sample, 41_000, rows, 8));
        // Every row sampled: the distinct count decides.
        assert!(sample_shows_groups_near_rows(1000, 125, 1000, 8));
        assert!(!sample_shows_groups_near_rows(1000, 124, 1000, 8));
        assert!(!sample_shows_groups_near_rows(0, 0, 0, 8));
    }

    fn spec(types: &[DataType]) -> KeySpec {
        KeySpec::try_new(types, NullEquality::NullEqualsNull).unwrap()
    }

    fn arr<A: Array + 'static>(a: A) -> ArrayRef {
        Arc::new(a)
    }

    #[test]
    fn negative_zeros_fold_into_positive_zero_and_nans_keep_their_bits() {
        let other_nan = f64::from_bits(0x7ff8_0000_0000_0001);
        let column = arr(Float64Array::from(vec![
            Some(-0.0),
            Some(0.0),
            None,
            Some(f64::NAN),
            Some(other_nan),
            Some(-1.5),
        ]));
        let folded = fold_negative_zeros(vec![vec![column]]).unwrap();
        let folded = folded[0][0].as_primitive::<Float64Type>();
        let bits: Vec<Option<u64>> = folded.iter().map(|v| v.map(f64::to_bits)).collect();
        assert_eq!(
            bits,
            vec![
                Some(0),
                Some(0),
                None,
                Some(f64::NAN.to_bits()),
                Some(other_nan.to_bits()),
                Some((-1.5f64).to_bits()),
            ]
        );
        // Nothing to fold: the same array.
        let plain = arr(Float64Array::from(vec![1.0, 2.0]));
        let kept = fold_negative_zeros(vec![vec![Arc::clone(&plain)]]).unwrap();
        assert!(Arc::ptr_eq(&kept[0][0], &plain));
    }

    #[test]
    fn one_column_without_nulls_is_its_own_word_and_the_rest_is_packed_or_hashed() {
        let ints = vec![vec![
            arr(Int64Array::from(vec![5, -1])),
            arr(Int64Array::from(vec![7])),
        ]];
        let words = group_key_words(&spec(&[DataType::Int64]), &ints, 2, true, 64)
            .unwrap()
            .unwrap();
        assert!(!words.hashed());
        assert_eq!(words.words.to_vec(), vec![5, (-1i64) as u64, 7]);

        let floats = vec![vec![arr(Float64Array::from(vec![0.5, -2.0]))]];
        let words = group_key_words(&spec(&[DataType::Float64]), &floats, 1, true, 64)
            .unwrap()
            .unwrap();
        assert!(!words.hashed());
        assert_eq!(
            words.words.to_vec(),
            vec![0.5f64.to_bits(), (-2.0f64).to_bits()]
        );

        // With a NULL, an integer column is packed (NULL has a code).
        let with_null = vec![vec![arr(Int64Array::from(vec![Some(5), None]))]];
        let words = group_key_words(&spec(&[DataType::Int64]), &with_null, 1, true, 64)
            .unwrap()
            .unwrap();
        assert!(!words.hashed());
        let w = words.words.to_vec();
        assert_ne!(w[0], w[1]);

        // Strings, and floats with a NULL, are hashed: equal keys, equal words.
        let strings = vec![vec![arr(StringArray::from(vec![
            Some("a"),
            None,
            Some("a"),
        ]))]];
        let words = group_key_words(&spec(&[DataType::Utf8]), &strings, 1, true, 64)
            .unwrap()
            .unwrap();
        assert!(words.hashed());
        let w = words.words.to_vec();
        assert_eq!(w[0], w[2]);
        assert_ne!(w[0], w[1]);

        // One bit of hash: two words at most; a bit count out of range is an
        // error.
        let many = vec![vec![arr(StringArray::from(
            (0..100).map(|i| i.to_string()).collect::<Vec<_>>(),
        ))]];
        let words = group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 1)
            .unwrap()
            .unwrap();
        assert!(words.words.to_vec().iter().all(|&w| w <= 1));
        assert!(group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 0).is_err());
        // Hashing not allowed: found before any key is hashed.
        assert!(
            group_key_words(&spec(&[DataType::Utf8]), &many, 1, false, 64)
                .unwrap()
                .is_none()
        );
        assert!(
            group_key_words(&spec(&[DataType::Int64]), &ints, 2, false, 64)
                .unwrap()
                .is_some()
        );
        assert!(group_key_words(&spec(&[DataType::Utf8]), &many, 1, true, 65).is_err());

        // Two full-range Int64 columns do not pack into 64 bits.
        let wide = vec![
            vec![arr(Int64Array::from(vec![i64::MIN, i64::MAX]))],
            vec![arr(Int64Array::from(vec![i64::MAX, i64::MIN]))],
        ];
        let words = group_key_words(
            &spec(&[DataType::Int64, DataType::Int64]),
            &wide,
            1,
            true,
            64,
        )
        .unwrap()
        .unwrap();
        assert!(words.hashed());
        assert!(group_key_words(
            &spec(&[DataType::Int64, DataType::Int64]),
            &wide,
            1,
            false,
            64
        )
        .unwrap()
        .is_none());
    }

    #[test]
    fn key_words_decode_back_into_the_keys_they_stand_for() {
        use datafusion::arrow::array::{
            BooleanArray, Date32Array, Decimal128Array, Float32Array, Int32Array, Int8Array,
            TimestampMicrosecondArray, UInt16Array, UInt8Array,
        };
        use datafusion::arrow::compute::concat;
        let tz = || TimestampMicrosecondArray::from(vec![Some(-5), None, Some(1 << 40)]);
        let cases: Vec<Vec<ArrayRef>> = vec![
            // Own words: every width, signed and unsigned, floats, times.
            vec![arr(Int32Array::from(vec![-3, i32::MAX, i32::MIN]))],
            vec![arr(UInt8Array::from(vec![0, 255, 7]))],
            vec![arr(Float32Array::from(vec![-1.5, f32::NAN, 0.0]))],
            vec![arr(Float64Array::from(vec![f64::MIN, 2.25, -7.0]))],
            vec![arr(Date32Array::from(vec![-719_162, 0, 19_000]))],
            vec![arr(
                TimestampMicrosecondArray::from(vec![1, -2, 3]).with_timezone("+02:00")
            )],
            // Packed: NULLs, several columns, decimals and booleans.
            vec![arr(Int64Array::from(vec![
                Some(i64::MIN),
                None,
                Some(i64::MAX - 1),
            ]))],
            vec![arr(tz().with_timezone("UTC"))],
            vec![
                arr(Int8Array::from(vec![Some(-128), None, Some(127)])),
                arr(BooleanArray::from(vec![Some(true), Some(false), None])),
                arr(UInt16Array::from(vec![None, Some(9), Some(65_535)])),
            ],
            vec![
                arr(Decimal128Array::from(vec![Some(-12_345), Some(99), None])
                    .with_precision_and_scale(15, 2)
                    .unwrap()),
                arr(Date32Array::from(vec![Some(10), None, Some(10)])),
            ],
            // A column of NULLs only, beside one of a single value.
            vec![
                arr(Int32Array::from(vec![None, None, None])),
                arr(Int32Array::from(vec![4, 4, 4])),
            ],
        ];
        for columns in cases {
            let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
            // Each column in two pieces, as two input batches.
            let pieces: Vec<Vec<ArrayRef>> = columns
                .iter()
                .map(|c| vec![c.slice(0, 1), c.slice(1, 2)])
                .collect();
            let words = group_key_words(&spec(&types), &pieces, 2, false, 64)
                .unwrap()
                .unwrap_or_else(|| panic!("{types:?} need hashing"));
            let decoded = words
                .decode(&words.words.to_vec(), &MappedAhead::none())
                .unwrap();
            assert_eq!(decoded.len(), columns.len());
            for (got, want) in decoded.iter().zip(&columns) {
                let want = concat(&[want.as_ref()]).unwrap();
                assert_eq!(got.data_type(), want.data_type());
                assert_eq!(&got.to_data(), &want.to_data(), "{types:?}");
            }
            // A group's word alone decodes to its key.
            let last = words
                .decode(&words.words.to_vec()[2..], &MappedAhead::none())
                .unwrap();
            for (got, want) in last.iter().zip(&columns) {
                assert_eq!(&got.to_data(), &want.slice(2, 1).to_data(), "{types:?}");
            }
        }
        let strings = vec![vec![arr(StringArray::from(vec!["a", "b"]))]];
        let hashed = group_key_words(&spec(&[DataType::Utf8]), &strings, 1, true, 64)
            .unwrap()
            .unwrap();
        assert!(hashed
            .decode(&hashed.words.to_vec(), &MappedAhead::none())
            .is_err());
    }

    #[test]
    fn a_sample_spread_over_the_pieces_counts_distinct_keys() {
        // Sorted keys, 1000 groups of 100 rows, in uneven pieces, with a
        // second key column: a sample of the first rows would see one group.
        let keys: Vec<i64> = (0..100_000i64).map(|i| i / 100).collect();
        let mut columns = vec![Vec::new(), Vec::new()];
        for piece in keys.chunks(7_777) {
            columns[0].push(arr(Int64Array::from(piece.to_vec())));
            columns[1].push(arr(StringArray::from(
                piece
                    .iter()
                    .map(|k| format!("s{}", k % 3))
                    .collect::<Vec<_>>(),
            )));
        }
        assert_eq!(sampled_distinct_keys(&columns, 1000).unwrap(), (1000, 1000));
        assert_eq!(sampled_distinct_keys(&columns, 100).unwrap(), (100, 100));
        // The string column alone: three keys.
        assert_eq!(sampled_distinct_keys(&columns[1..], 500).unwrap(), (500, 3));
        assert_eq!(sampled_distinct_keys(&[], 100).unwrap(), (0, 0));
        let few = vec![vec![arr(Int64Array::from(vec![3i64; 5000]))]];
        assert_eq!(sampled_distinct_keys(&few, 65_536).unwrap(), (5000, 1));
        // NULL is a key like any other.
        let nulls = vec![vec![arr(Int64Array::from(vec![None, Some(1), None]))]];
        assert_eq!(sampled_distinct_keys(&nulls, 10).unwrap(), (3, 2));
    }

    #[test]
    fn keys_read_in_place_sample_the_rows_that_hashed_keys_do() {
        // One narrow key column without NULLs is read in place; the same
        // keys beside a constant column are hashed: the same rows sampled,
        // as many distinct keys. Sliced pieces read from their offsets.
        let keys: Vec<i16> = (0..30_000)
            .map(|i| ((i * 7919) % 4001) as i16 - 2000)
            .collect();
        let whole = Int16Array::from(keys.clone());
        let mut alone = vec![Vec::new()];
        let mut beside = vec![Vec::new(), Vec::new()];
        let mut at = 0;
        for len in [1, 4_999, 10_000, 15_000] {
            let piece = arr(whole.slice(at, len));
            alone[0].push(Arc::clone(&piece));
            beside[0].push(piece);
            beside[1].push(arr(Int64Array::from(vec![0i64; len])));
            at += len;
        }
        let starts = starts_of(alone[0].iter().map(|p| p.len()));
        for sample in [30_000, 7_000, 333] {
            let stride = 30_000usize.div_ceil(sample);
            assert!(sampled_distinct_words(&alone, stride, &starts).is_some());
            let want: HashSet<i16> = keys.iter().step_by(stride).copied().collect();
            let got = sampled_distinct_keys(&alone, sample).unwrap();
            assert_eq!(got, (30_000usize.div_ceil(stride), want.len()), "{sample}");
            assert_eq!(sampled_distinct_keys(&beside, sample).unwrap(), got);
        }
        assert!(sampled_distinct_words(&beside, 1, &starts).is_none());
    }

    #[test]
    fn few_groups_are_told_from_many_by_the_sample() {
        // 2^12 groups in a 2^16-row sample: few; 2^16 groups: about 41,000
        // distinct, many; 2^13: at the edge, many.
        assert!(sample_shows_few_groups(65_536, 4_096, 65_536));
        assert!(!sample_shows_few_groups(65_536, 41_000, 65_536));
        assert!(!sample_shows_few_groups(65_536, 8_192, 65_536));
        // TPC-H q1: four groups.
        assert!(sample_shows_few_groups(65_536, 4, 65_536));
        // gpu.min_groups = 0 sends everything to the GPU; no rows, no sample.
        assert!(!sample_shows_few_groups(65_536, 4, 0));
        assert!(!sample_shows_few_groups(0, 0, 65_536));
        // A small partition of few keys, each seen a few times only.
        assert!(!sample_shows_few_groups(100, 50, 65_536));
    }

    #[test]
    fn a_group_holding_two_keys_is_found() {
        let keys = vec![
            vec![
                arr(StringArray::from(vec![Some("a"), None])),
                arr(StringArray::from(vec![Some("b"), Some("a")])),
            ],
            vec![
                arr(Int64Array::from(vec![1, 2])),
                arr(Int64Array::from(vec![3, 1])),
            ],
        ];
        // Groups: ("a", 1), (NULL, 2), ("b", 3).
        let group_keys = vec![
            arr(StringArray::from(vec![Some("a"), None, Some("b")])),
            arr(Int64Array::from(vec![1, 2, 3])),
        ];
        assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2, 0]).unwrap());
        // ("b", 3) put in the group of ("a", 1): a collision.
        assert!(!groups_hold_one_key(&keys, &group_keys, &[0, 1, 0, 0]).unwrap());
        // NULL in the group of "a".
        assert!(!groups_hold_one_key(&keys, &group_keys, &[0, 0, 2, 0]).unwrap());
        // A group id out of range, or a row count that differs, is an error.
        assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2, 3]).is_err());
        assert!(groups_hold_one_key(&keys, &group_keys, &[0, 1, 2]).is_err());
    }
}
