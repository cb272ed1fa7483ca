//! The group-by on device columns: dense group ids, then one reduction per
//! aggregate column into per-group slots, privatized in shared memory while
//! the groups fit. The ids come from one global hash table (seed 002 §4.2,
//! HGB; ids in no particular order). Where the groups must leave in key
//! order, either the hash table's groups are then sorted by key and their
//! results gathered in that order ([`GroupIds::HashedInKeyOrder`]: a sort
//! of the groups, not of the rows), or the rows are radix-sorted by key and each run of equal
//! keys is a group ([`GroupIds::Sorted`], seed 002 §3.2.2), which costs less
//! than hashing and then sorting where nearly every row is its own group.
//! The sort path reduces through each row's group id as HGB does, rather
//! than moving the values with the keys (SGB-TR): seed 002 §5.2.8 finds
//! moving them slower with 8-byte keys, which every key here is.
//!
//! It knows nothing of Arrow: keys are one `u64` per row (see
//! `exec::keys`), values are 64-bit words whose unsigned order (after an
//! optional flip of the sign bit) and wrapping sum are what the caller
//! wants, 128-bit values are split into two words. Columns come as
//! [`Words`]: pieces laid end to end, copied once into the upload's pinned
//! staging buffer.

use std::sync::Arc;

use crate::gpu::alloc_uninit;
use crate::gpu::DeviceStream;

use super::merge_join::radix_sort;
use super::radix::{radix_partition, RadixPlan};
use super::scan::exclusive_scan;
use crate::gpu::launch::{
    self, AggregateOp, CodeTransform, GroupRows, PartitionGroupIds, RadixGrid, SortedGroupIds,
};
use crate::gpu::{
    download_u64, upload_u64, upload_words_narrowed, DeviceVec, DriverResultExt, GpuDevice, GpuError,
    GpuResult, Phase, PhaseTimer, StagingWindows,
};
use crate::trace;

mod checked;
mod device_words;
mod finish;
mod first_seen;
mod grouping;
mod fixed_point;
mod hash_table;
mod kept;
mod landing_chunks;
mod partitioned;
mod pending;
mod reduce;
mod results;
mod sizing;
mod sorted;
mod table_folds;

use checked::*;
#[allow(unused_imports)]
use finish::*;
use first_seen::*;
pub use grouping::group_uploaded_keys;
pub use fixed_point::*;
use hash_table::*;
use partitioned::*;
use pending::*;
use reduce::*;
pub use sizing::*;
use sorted::*;

pub use device_words::{sample as sample_device_words, DeviceWordPiece};
pub use kept::GroupComparison;
pub use landing_chunks::InputChunks;
use landing_chunks::{reduce_chunks, reduces_in_one_pass, upload_in_chunks, RowsInRowOrder};
use results::DeviceReduced;
pub use results::{DeviceGrouped, GroupedWindow, ReducedWindow, ResultParts};
pub use table_folds::FOLD_CHUNK_ROWS;
use table_folds::{
    launch_table_folds, table_fold_capacity, FoldCounts, FoldInputs, FoldedChunks, TableFolds,
};

/// A piece of a column's words, owned or borrowed from wherever the caller
/// keeps them (an Arrow buffer of 8-byte values needs no copy).
pub type WordPiece = Box<dyn AsRef<[u64]> + Send + Sync>;

/// One 64-bit word per row, in pieces laid end to end (one per input
/// batch, typically): on the host, or already on the device
/// ([`Words::on_device`]), never both.
#[derive(Default)]
pub struct Words {
    pieces: Vec<WordPiece>,
    on_device: Vec<DeviceWordPiece>,
    len: usize,
}

impl Words {
    /// Appends a piece.
    pub fn push(&mut self, piece: WordPiece) {
        debug_assert!(self.on_device.is_empty(), "host words pushed onto device words");
        self.len += piece.as_ref().as_ref().len();
        self.pieces.push(piece);
    }

    /// Words that lie on the device already, `pieces` end to end: a copy
    /// to the device lays them out in device memory instead
    /// ([`device_words::lay_out`]), and nothing crosses the bus.
    pub fn on_device(pieces: Vec<DeviceWordPiece>) -> Self {
        Self {
            len: pieces.iter().map(|p| p.rows).sum(),
            pieces: Vec::new(),
            on_device: pieces,
        }
    }

    /// Whether the words lie on the device ([`Words::on_device`]).
    pub fn lie_on_device(&self) -> bool {
        !self.on_device.is_empty()
    }

    /// Words in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order (host words only).
    pub fn pieces(&self) -> Vec<&[u64]> {
        debug_assert!(self.on_device.is_empty(), "device words read as host pieces");
        self.pieces.iter().map(|p| p.as_ref().as_ref()).collect()
    }

    /// The pieces' parts that hold the words `range`, in order (nothing
    /// for an empty range).
    pub fn pieces_in(&self, range: std::ops::Range<usize>) -> Vec<&[u64]> {
        let mut parts = Vec::new();
        let mut first = 0;
        for piece in self.pieces() {
            let last = first + piece.len();
            let (from, to) = (range.start.max(first), range.end.min(last));
            if from < to {
                parts.push(&piece[from - first..to - first]);
            }
            first = last;
        }
        parts
    }

    #[cfg(any(test, feature = "test-support"))]
    /// All words in one vector (tests and references).
    pub fn to_vec(&self) -> Vec<u64> {
        self.pieces().concat()
    }
}

impl From<Vec<u64>> for Words {
    fn from(words: Vec<u64>) -> Self {
        let mut all = Words::default();
        all.push(Box::new(words));
        all
    }
}

impl std::fmt::Debug for Words {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.lie_on_device() {
            true => write!(f, "Words({} on the device in {} pieces)", self.len, self.on_device.len()),
            false => write!(f, "Words({} in {} pieces)", self.len, self.pieces.len()),
        }
    }
}

/// One reduction of one column into every group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Valid rows of the group (no values needed).
    Count,
    /// Wrapping sum of the 64-bit words.
    Sum,
    /// Smallest word, unsigned.
    Min,
    /// Largest word, unsigned.
    Max,
    /// Sum of the doubles whose bits the words are, in whatever order the
    /// device's atomics add them (the last bits may vary from run to run).
    SumF64,
    /// Sum of the doubles whose bits the words are, the same in any order:
    /// each value counted as a 128-bit fixed-point integer on a scale set
    /// by its group's largest exponent ([`fixed_point_term`]), truncated
    /// below 2^-62 of the group's largest magnitude, and rounded to a
    /// double once ([`fixed_sum_to_f64`]).
    SumF64Fixed,
    /// Wrapping 128-bit sum of (low word, high word) pairs.
    SumI128,
    /// Smallest (high word, low word) pair, both compared unsigned: the
    /// caller flips the sign bit of signed high words.
    MinI128,
    /// Largest (high word, low word) pair, as [`Reduction::MinI128`].
    MaxI128,
}

impl Reduction {
    /// The word a group's result starts from (and keeps without rows).
    pub fn identity(self) -> u64 {
        match self {
            Reduction::Min | Reduction::MinI128 => u64::MAX,
            Reduction::SumF64 | Reduction::SumF64Fixed => 0f64.to_bits(),
            _ => 0,
        }
    }

    /// Whether the values come in two words.
    pub fn is_wide(self) -> bool {
        matches!(
            self,
            Reduction::SumI128 | Reduction::MinI128 | Reduction::MaxI128
        )
    }

    /// Device words per group while reducing.
    fn result_words(self) -> usize {
        match self {
            r if r.is_wide() => 2,
            // Largest exponent, special values, 128-bit sum.
            Reduction::SumF64Fixed => 4,
            _ => 1,
        }
    }
}

/// A column to reduce.
#[derive(Debug)]
pub struct ReduceInput {
    /// What to compute.
    pub reduction: Reduction,
    /// One word per row (the low word of wide values); empty for `Count`.
    pub values: Words,
    /// High words of wide values, otherwise empty.
    pub high_words: Words,
    /// XORed into each value of `Sum`, `Min` and `Max` before it is used:
    /// the sign bit turns signed values into order-preserving words.
    pub flip: u64,
    /// Index into the bitmaps passed alongside; `None`: every row counts.
    pub valid: Option<usize>,
}

impl ReduceInput {
    /// Whether its words lie on the device already ([`Words::on_device`]).
    pub fn lies_on_device(&self) -> bool {
        self.values.lie_on_device() || self.high_words.lie_on_device()
    }
}

#[cfg(any(test, feature = "test-support"))]
/// The result of one [`ReduceInput`], one entry per group. Groups without
/// a valid row hold the reduction's identity (0, or `u64::MAX` for minima);
/// the caller tells them apart with a `Count` over the same bitmap.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reduced {
    /// One word per group (low words of wide results).
    pub values: Vec<u64>,
    /// High words of wide results, otherwise empty.
    pub high_words: Vec<u64>,
}

/// What comes back to the host to tell the groups apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupsBack {
    /// Each group's key word, gathered on the device: keys that are their
    /// values (packed or raw), which the host decodes in order instead of
    /// reading a row of each group at random.
    KeyWords,
    /// A row of each group and the group of every row: hashed keys, which
    /// the host checks against the rows.
    RowsAndRowGroups,
}

#[cfg(any(test, feature = "test-support"))]
/// The groups of a set of rows and the reductions over them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grouped {
    /// Number of groups: distinct keys, or 1 without keys.
    pub groups: usize,
    /// The key word of each group, with [`GroupsBack::KeyWords`];
    /// otherwise empty.
    pub group_keys: Vec<u64>,
    /// A row of each group, with [`GroupsBack::RowsAndRowGroups`];
    /// otherwise empty.
    pub group_rows: Vec<u64>,
    /// The group of every row, with [`GroupsBack::RowsAndRowGroups`];
    /// otherwise empty.
    pub row_groups: Vec<u64>,
    /// One result per input, in input order.
    pub reduced: Vec<Reduced>,
    /// Whether the groups were numbered partition by partition
    /// ([`GroupIds::Partitioned`] without a partition holding too many).
    pub numbered_in_partitions: bool,
    /// Whether a hash table sized from an estimate of the groups filled up
    /// ([`DeviceGrouped::table_overflowed`]).
    pub table_overflowed: bool,
    /// Whether the inputs were folded into the hash table as the rows were
    /// numbered ([`DeviceGrouped::folded_in_table`]).
    pub folded_in_table: bool,
    /// Whether that table was built again, larger, after its first chunk
    /// of rows ([`DeviceGrouped::folding_table_grown`]).
    pub folding_table_grown: bool,
    /// Inputs reduced chunk by chunk as they landed
    /// ([`DeviceGrouped::inputs_reduced_as_they_landed`]).
    pub inputs_reduced_as_they_landed: usize,
}

/// How rows get their dense group ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupIds {
    /// One global hash table (HGB): ids in the order groups were first met
    /// on the device, which is no fixed order. With `expected_groups` (an
    /// estimate, from a sample of the keys), the table is sized to them
    /// rather than to the rows ([`sized_table_capacity`]); where it fills
    /// up all the same, the rows are numbered again in a table sized to
    /// them ([`DeviceGrouped::table_overflowed`]).
    Hashed { expected_groups: Option<usize> },
    /// Seed 002's partition-based group-by (PGB): the keys, radix
    /// partitioned on their hash with their row ids into
    /// `2^partition_bits` partitions, are numbered one partition at a time
    /// in a shared-memory table, so that a partition's groups get
    /// neighbouring ids, in no fixed order. Where a partition holds
    /// [`launch::PARTITION_GROUP_LIMIT`] groups or more, the global table
    /// numbers the partitioned keys instead. Either way an input reduced
    /// whole is gathered into the partitions' order before it is reduced,
    /// so the reductions' atomics of nearby rows meet nearby groups; one
    /// reduced as it lands ([`InputChunks::reduce_as_they_land`]) reads
    /// its rows' groups put back in row order, its atomics scattered over
    /// all the groups but run while the next chunks cross the bus.
    Partitioned { partition_bits: u32 },
    /// A radix sort of the keys, which must be below `2^key_bits`: ids in
    /// ascending key order. With `transform`, the keys are raw 8-byte
    /// integers that the device turns into codes first
    /// ([`launch::ordered_codes`]); the group key words that come back are
    /// then the codes.
    Sorted {
        key_bits: u32,
        transform: Option<CodeTransform>,
    },
    /// The hash table's ids, then the groups sorted by key on the device
    /// and every result gathered in that order: groups come back in
    /// ascending key order, as with [`GroupIds::Sorted`], with a sort of
    /// the groups rather than of the rows (keys and `transform` as there).
    /// The rows keep the hash table's ids: numbered in key order, the
    /// hottest keys of a skewed input would share cache lines, whose
    /// atomics then serialize.
    HashedInKeyOrder {
        key_bits: u32,
        transform: Option<CodeTransform>,
        expected_groups: Option<usize>,
    },
}

impl GroupIds {
    /// Whether ids follow ascending key order.
    pub fn in_key_order(self) -> bool {
        !matches!(self, GroupIds::Hashed { .. } | GroupIds::Partitioned { .. })
    }
}

#[cfg(any(test, feature = "test-support"))]
/// Validity bitmap of `valid(i)` for `rows` rows, 64 rows per word.
pub fn validity_bitmap(rows: usize, valid: impl Fn(usize) -> bool) -> Vec<u64> {
    let mut bits = vec![0u64; rows.div_ceil(64)];
    for i in 0..rows {
        if valid(i) {
            bits[i / 64] |= 1 << (i % 64);
        }
    }
    bits
}

#[cfg(any(test, feature = "test-support"))]
/// Groups `rows` rows by `keys` (`None`: all rows form one group, which
/// exists even without rows) and computes every input's reduction per
/// group. `bitmaps` are validity bitmaps ([`validity_bitmap`]) that inputs
/// refer to by index. `ids` says how rows get their group ids, `back` what
/// identifies the groups on the host (sorted ids give key words only).
/// `chunks` says how the inputs cross the bus: with
/// [`InputChunks::fold_into_table`], a hash table sized from an estimate
/// folds them as it numbers the rows, where they allow it
/// ([`DeviceGrouped::folded_in_table`]), their values crossing in chunks of
/// [`InputChunks::rows`] rows (rounded up to a multiple of 64), each folded
/// while the next crosses; elsewhere, with
/// [`InputChunks::reduce_as_they_land`], each input whose reduction reads
/// every row once crosses in such chunks, each reduced once it has landed
/// and the groups are numbered
/// ([`DeviceGrouped::inputs_reduced_as_they_landed`]); the other inputs
/// cross whole. The keys' copy and every kernel go onto `stream`;
/// the inputs and bitmaps are copied on `copy_stream`, so that they cross
/// the bus while the device numbers the groups (the kernels that read them
/// wait for their copies).
/// The same stream may be passed twice. The results stay on the device:
/// the group count, and with [`GroupsBack::RowsAndRowGroups`] the group of
/// every row, are on the host; each group's identity and every reduction
/// come back window by window through [`DeviceGrouped::bring_back`], or at
/// once through [`DeviceGrouped::download`].
#[allow(clippy::too_many_arguments)]
pub fn group_on_device(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    copy_stream: &Arc<DeviceStream>,
    keys: Option<&Words>,
    ids: GroupIds,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
    back: GroupsBack,
    chunks: InputChunks,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceGrouped> {
    check_inputs(keys, rows, inputs, bitmaps)?;
    let keys = upload_group_keys(device, stream, copy_stream, keys, rows, timer)?;
    group_uploaded_keys(
        device,
        stream,
        copy_stream,
        keys,
        ids,
        rows,
        inputs,
        bitmaps,
        back,
        chunks,
        timer,
    )
}

/// The group keys' words on their way to the device
/// ([`upload_group_keys`]), for [`group_uploaded_keys`].
#[derive(Debug)]
pub struct UploadedKeys {
    /// Whether the rows have keys (without keys they form one group).
    with_keys: bool,
    /// The words, where there are keys and rows.
    words: Option<DeviceVec<u64>>,
    rows: usize,
}

/// The first step of [`group_on_device`]: the keys' copy to the device,
/// enqueued on `stream` (where their words lie in pinned memory, the host
/// does not wait for it), with `copy_stream` ordered after it. The host
/// may prepare the inputs while the keys cross the bus, then hand both to
/// [`group_uploaded_keys`].
pub fn upload_group_keys(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    copy_stream: &Arc<DeviceStream>,
    keys: Option<&Words>,
    rows: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<UploadedKeys> {
    check_inputs(keys, rows, &[], &[])?;
    // The columns' copies wait for the keys' own: sharing the bus with
    // them, the keys would arrive later and the grouping kernels start
    // later, for nothing.
    let words = match keys {
        Some(keys) if rows > 0 => {
            let uploaded = match keys.lie_on_device() {
                true => device_words::lay_out(device, stream, keys, timer)?,
                // Group codes that fit 32 bits cross the bus at 4 bytes.
                false => upload_words_narrowed(device, stream, &keys.pieces(), timer)?,
            };
            if !Arc::ptr_eq(stream, copy_stream) {
                let keys_copied = stream
                    .record_event(None)
                    .during("recording the keys' copy")?;
                copy_stream
                    .wait(&keys_copied)
                    .during("ordering the copies after the keys'")?;
            }
            Some(uploaded)
        }
        _ => None,
    };
    Ok(UploadedKeys {
        with_keys: keys.is_some(),
        words,
        rows,
    })
}

/// CPU reference: the same results, with groups in first-occurrence order
/// and `group_rows` the first row of each group; every field is filled,
/// whatever a [`GroupsBack`] would ask for.
#[cfg(any(test, feature = "test-support"))]
pub mod reference;

#[cfg(test)]
mod tests;
