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

use cudarc::driver::CudaStream;

use super::merge_join::radix_sort;
use super::radix::{radix_partition, RadixPlan};
use super::scan::exclusive_scan;
use crate::gpu::launch::{
    self, AggregateOp, CodeTransform, GroupRows, PartitionGroupIds, RadixGrid, SortedGroupIds,
};
use crate::gpu::{
    download_u64, upload_u64, upload_u64_pieces, DeviceVec, DriverResultExt, GpuDevice, GpuError,
    GpuResult, Phase, PhaseTimer, StagingWindows,
};
use crate::trace;

mod landing_chunks;
mod results;
mod table_folds;

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
/// batch, typically).
#[derive(Default)]
pub struct Words {
    pieces: Vec<WordPiece>,
    len: usize,
}

impl Words {
    /// Appends a piece.
    pub fn push(&mut self, piece: WordPiece) {
        self.len += piece.as_ref().as_ref().len();
        self.pieces.push(piece);
    }

    /// Words in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> Vec<&[u64]> {
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
        write!(f, "Words({} in {} pieces)", self.len, self.pieces.len())
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

/// Bits of a double's exponent field.
const EXPONENT_BITS: u64 = 0x7ff;
/// The bits of a double's significand below its implicit bit.
const SIGNIFICAND_MASK: u64 = (1 << 52) - 1;

/// The exponent field of a finite double with bits `bits`, or the
/// special-value flag it raises: NaN 1, +inf 2, -inf 4
/// ([`Reduction::SumF64Fixed`], pass 1 in `ptx/group_by.cu`).
pub fn fixed_point_scale(bits: u64) -> Result<u64, u64> {
    let exponent = (bits >> 52) & EXPONENT_BITS;
    if exponent != EXPONENT_BITS {
        Ok(exponent)
    } else if bits & SIGNIFICAND_MASK != 0 {
        Err(1)
    } else if bits >> 63 == 1 {
        Err(4)
    } else {
        Err(2)
    }
}

/// The finite double with bits `bits` as an integer in units of
/// 2^(`top` - 1084), truncated toward zero, where `top` is the largest
/// exponent field of its group (at least the value's own): the group's
/// largest values take 62 bits ([`Reduction::SumF64Fixed`], pass 2 in
/// `ptx/group_by.cu`).
pub fn fixed_point_term(bits: u64, top: u64) -> i128 {
    let mut exponent = (bits >> 52) & EXPONENT_BITS;
    let mut significand = bits & SIGNIFICAND_MASK;
    if exponent == 0 {
        exponent = 1;
    } else {
        significand |= 1 << 52;
    }
    let top = top.max(1);
    let drop = top.saturating_sub(exponent);
    let magnitude = if drop <= 9 {
        significand << (9 - drop)
    } else if drop - 9 < 64 {
        significand >> (drop - 9)
    } else {
        0
    };
    if bits >> 63 == 1 {
        -i128::from(magnitude)
    } else {
        i128::from(magnitude)
    }
}

/// The double of a fixed-point sum (`sum` in units of 2^(`top` - 1084)),
/// or of the special values its group saw: NaN, or +inf and -inf together,
/// give NaN; one infinity gives itself.
pub fn fixed_sum_to_f64(sum: i128, top: u64, specials: u64) -> f64 {
    if specials & 1 != 0 || specials & 6 == 6 {
        return f64::NAN;
    }
    if specials & 2 != 0 {
        return f64::INFINITY;
    }
    if specials & 4 != 0 {
        return f64::NEG_INFINITY;
    }
    // One rounding to a double, then exact scaling (but in the subnormal
    // range): the same bits however the terms were added.
    let mut value = sum as f64;
    let mut power = top.max(1) as i32 - 1084;
    let step = |p: i32| f64::from_bits(((p + 1023) as u64) << 52);
    while power > 1000 {
        value *= step(1000);
        power -= 1000;
    }
    while power < -1000 {
        value *= step(-1000);
        power += 1000;
    }
    value * step(power)
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

/// Groups a partition of [`GroupIds::Partitioned`] is planned to hold on
/// average: a third of [`launch::PARTITION_GROUP_LIMIT`], so an estimate of
/// the groups three times too low still fits.
pub const GROUPS_PER_PARTITION: usize = 512;
const _: () = assert!(3 * GROUPS_PER_PARTITION <= launch::PARTITION_GROUP_LIMIT);

/// Hash bits that split `groups` (an estimate) into partitions of
/// [`GROUPS_PER_PARTITION`] groups on average, at most
/// [`super::radix::MAX_PARTITION_BITS`].
pub fn partition_bits_for_groups(groups: usize) -> u32 {
    let partitions = groups.div_ceil(GROUPS_PER_PARTITION).max(1);
    (usize::BITS - (partitions - 1).leading_zeros()).min(super::radix::MAX_PARTITION_BITS)
}

/// Hash-table slots for `rows` keys: a power of two, at least twice the rows.
fn table_capacity(rows: usize) -> u64 {
    ((2 * rows as u64).max(2)).next_power_of_two()
}

/// How many groups a sample of `sampled` keys with `distinct` distinct ones
/// suggests among `rows` rows: the `g` for which `sampled` draws from `g`
/// equally likely groups show `distinct` of them on average,
/// `g (1 - e^(-sampled / g)) = distinct` (for few repeats, the birthday
/// count `sampled^2 / 2 repeats`). No repeat at all: as many groups as
/// rows, as far as the sample tells; never more than the rows. Heavy keys
/// repeat more than equally likely ones, so skew lowers the estimate.
pub fn estimated_groups(sampled: usize, distinct: usize, rows: usize) -> usize {
    if sampled == 0 || rows == 0 {
        return 0;
    }
    if sampled >= rows {
        // Every row was sampled: the count is exact.
        return distinct;
    }
    if distinct >= sampled {
        return rows;
    }
    let (s, d) = (sampled as f64, distinct as f64);
    let shown = |g: f64| g * -(-s / g).exp_m1();
    // `shown` grows with g from 0 towards s: bisect between the distinct
    // keys (never fewer groups) and the rows (never more), in log scale.
    let (mut low, mut high) = (d.max(1.0).ln(), (rows as f64).max(d).ln());
    if shown(high.exp()) <= d {
        return rows;
    }
    for _ in 0..64 {
        let middle = 0.5 * (low + high);
        if shown(middle.exp()) < d {
            low = middle;
        } else {
            high = middle;
        }
    }
    (high.exp().round() as usize).clamp(distinct, rows)
}

/// Hash-table slots for an estimate of the groups: a power of two, at
/// least four times the estimate (a table a quarter full keeps probes
/// short, and a sample of skewed keys underestimates the groups), up to
/// sixty-four times within [`SPREAD_TABLE_SLOTS`], at least
/// [`MIN_SIZED_TABLE_SLOTS`]. A table sized to the rows instead, at 2^28
/// rows and a few groups, is 4 GiB to fill and a TLB miss a probe.
pub fn sized_table_capacity(expected_groups: usize) -> u64 {
    let groups = expected_groups as u64;
    (64 * groups)
        .min(SPREAD_TABLE_SLOTS)
        .max(4 * groups)
        .max(MIN_SIZED_TABLE_SLOTS)
        .next_power_of_two()
}

/// Slots up to which a table for few groups is spread over sixty-four
/// times their number rather than four: the fold kernel, every warp of
/// the device folding its rows into the table at once, waits on L2 where
/// the table is small. With 2^28 rows on an H100 it took 8.3 ms at 2^10
/// groups in 4,096 slots, 5.0 ms in 16,384 and 3.9 ms in 65,536; 5.6
/// against 4.3 ms at 2^8 groups (4,096 slots against 16,384), 7.1 against
/// 4.5 ms at 2^12 (2^14 against 2^18; `BENCHMARKS.md`). 2^19 slots of two
/// folds' words and their keys, 16 MiB, stay in L2.
const SPREAD_TABLE_SLOTS: u64 = 1 << 19;

/// The fewest slots of a table sized from an estimate of the groups.
pub const MIN_SIZED_TABLE_SLOTS: u64 = 1 << 12;

/// Words of the hash table that numbers `rows` rows and of what it leaves
/// per row, for [`group_by_device_bytes`]: a table sized to the rows and
/// every row's group, or, where a table sized from `expected_groups` may
/// fold the inputs ([`table_fold_capacity`]), that table with its folds'
/// words beside each slot's key and group, whichever is larger (a folding
/// table that fills up is freed before the rows are numbered again).
fn hashed_table_words(
    rows: usize,
    expected_groups: Option<usize>,
    inputs: &[ReduceInput],
) -> usize {
    let ids = GroupIds::Hashed { expected_groups };
    let folding = table_fold_capacity(ids, GroupsBack::KeyWords, rows, inputs)
        .map_or(0, |capacity| folding_table_words(capacity, inputs.len()));
    unfolded_table_words(rows).max(folding)
}

/// Words of the table sized to `rows` rows that numbers them without
/// folding (keys and groups, the reserved slot included) and of every
/// row's group.
fn unfolded_table_words(rows: usize) -> usize {
    2 * (table_capacity(rows) as usize + 1) + rows
}

/// Words of a folding table of `capacity` slots and the reserved one, each
/// with its group, and its key and the words of `folds` folds.
fn folding_table_words(capacity: u64, folds: usize) -> usize {
    (capacity as usize + 1) * (1 + launch::table_slot_words(folds))
}

/// Device bytes [`group_on_device`] may hold at once for `rows` rows: every group
/// distinct in the worst case.
pub fn group_by_device_bytes(
    rows: usize,
    with_keys: bool,
    ids: GroupIds,
    inputs: &[ReduceInput],
    bitmaps: usize,
    sm_count: u32,
) -> usize {
    let table = match (with_keys, ids) {
        (false, _) => 0,
        // keys, first rows, the key word of each group, and the table
        (true, GroupIds::Hashed { expected_groups }) => {
            8 * (3 * rows + 1 + hashed_table_words(rows, expected_groups, inputs))
        }
        // the keys and row ids partitioned, with the passes' second pair
        // of buffers and largest histogram; local ids, positions in each
        // partition, each group's position, the partitions' counts; the
        // global table, where a partition overflows; an input gathered
        // into the partitions' order beside its rows, and the row groups
        // put back in row order (kept through every reduction where
        // inputs are reduced as they land)
        (true, GroupIds::Partitioned { partition_bits }) => {
            let histogram = RadixGrid::new(rows as u64, sm_count).blocks as usize
                * (1 << launch::MAX_RADIX_BITS);
            let partitions = RadixPlan::new(partition_bits).partitions();
            8 * (7 * rows
                + 2 * (table_capacity(rows) as usize + 1)
                + histogram
                + histogram.div_ceil(launch::SCAN_TILE) * 2
                + partitions
                + 4)
        }
        // as hashed, and the sort of as many groups as rows at most (keys,
        // ids and their second buffers, the largest histogram) and one
        // result gathered in key order
        (
            true,
            GroupIds::HashedInKeyOrder {
                expected_groups, ..
            },
        ) => {
            let histogram = RadixGrid::new(rows as u64, sm_count).blocks as usize
                * (1 << launch::MAX_RADIX_BITS);
            8 * (3 * rows
                + 1
                + hashed_table_words(rows, expected_groups, inputs)
                + 5 * rows
                + histogram
                + histogram.div_ceil(launch::SCAN_TILE) * 2)
        }
        // keys and row ids with the sort's second pair of buffers and its
        // largest histogram, run heads, row groups, first positions, the
        // key word of each group
        (true, GroupIds::Sorted { .. }) => {
            let histogram = RadixGrid::new(rows as u64, sm_count).blocks as usize
                * (1 << launch::MAX_RADIX_BITS);
            8 * (4 * rows + histogram + histogram.div_ceil(launch::SCAN_TILE) * 2 + 4 * rows + 1)
        }
    };
    let groups = if with_keys { rows.max(1) } else { 1 };
    let columns: usize = inputs
        .iter()
        .map(|input| {
            let input_words = if input.reduction.is_wide() { 2 } else { 1 };
            8 * input_words * rows + 8 * (input.reduction.result_words() + 1) * groups
        })
        .sum();
    // Bitmaps gathered into the partitions' order beside their own.
    let bitmap_copies = match ids {
        GroupIds::Partitioned { .. } if with_keys => 2,
        _ => 1,
    };
    table + columns + bitmap_copies * bitmaps * 8 * rows.div_ceil(64)
}

/// Words of the pinned buffer each window of [`DeviceGrouped::download`]
/// takes (32 MiB).
pub const DOWNLOAD_WINDOW_WORDS: usize = 1 << 22;

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
    stream: &Arc<CudaStream>,
    copy_stream: &Arc<CudaStream>,
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
    stream: &Arc<CudaStream>,
    copy_stream: &Arc<CudaStream>,
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
            let uploaded = upload_u64_pieces(device, stream, &keys.pieces(), timer)?;
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

/// [`group_on_device`] over keys already enqueued for the device
/// ([`upload_group_keys`], with the same streams and `rows`).
#[allow(clippy::too_many_arguments)]
pub fn group_uploaded_keys(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    copy_stream: &Arc<CudaStream>,
    keys: UploadedKeys,
    ids: GroupIds,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
    back: GroupsBack,
    chunks: InputChunks,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceGrouped> {
    if keys.rows != rows {
        return Err(GpuError::Invalid(format!(
            "keys uploaded for {} rows, grouping {rows}",
            keys.rows
        )));
    }
    check_inputs(None, rows, inputs, bitmaps)?;
    if ids.in_key_order() && back == GroupsBack::RowsAndRowGroups {
        return Err(GpuError::Invalid(
            "sorted group ids give each group's key word, not a row of it".into(),
        ));
    }
    let sm_count = device.sm_count();
    // Everything is enqueued before the host first waits for the device:
    // the keys' copy (already) and the grouping kernels, then every
    // column's copy on the copy stream, so that the host stages the
    // columns and the bus carries them while the grouping kernels run.
    // Where the table folds the inputs, its kernel reads them: it is
    // enqueued chunk by chunk, each launch after its chunk's copies, below.
    let fold_into_table = chunks.fold_into_table
        && keys.with_keys
        && table_fold_capacity(ids, back, rows, inputs).is_some();
    let mut device_keys = keys.words;
    let with_keys = keys.with_keys.then_some(());
    let mut pending = match with_keys {
        Some(_) if !fold_into_table => Some(launch_pending_groups(
            device,
            stream,
            device_keys.take(),
            ids,
            None,
            timer,
        )?),
        _ => None,
    };
    let device_bitmaps = bitmaps
        .iter()
        .map(|bits| upload_u64(device, copy_stream, bits, timer))
        .collect::<GpuResult<Vec<_>>>()?;
    // Where the table folds the inputs, their values cross the bus chunk
    // by chunk as it folds them, and never whole.
    let mut fold_chunks = FoldedChunks::default();
    let uploaded_columns = if fold_into_table {
        pending = Some(launch_pending_groups(
            device,
            stream,
            device_keys.take(),
            ids,
            Some(FoldInputs {
                inputs,
                bitmaps: &device_bitmaps,
                copy_stream,
                chunk_rows: chunks.chunk_rows(),
                chunks: &mut fold_chunks,
            }),
            timer,
        )?);
        None
    } else {
        // The chunks of every input share two staging windows, as a
        // table's folds do.
        let mut staging = StagingWindows::standard(device);
        Some(
            inputs
                .iter()
                .map(|input| {
                    let in_chunks = chunks.reduce_as_they_land
                        && keys.with_keys
                        && rows > 0
                        && reduces_in_one_pass(input.reduction);
                    Ok(if in_chunks {
                        InputColumn::InChunks(upload_in_chunks(
                            &mut staging,
                            copy_stream,
                            input,
                            rows,
                            chunks.chunk_rows(),
                            timer,
                        )?)
                    } else {
                        InputColumn::Whole(upload_input(device, copy_stream, input, rows, timer)?)
                    })
                })
                .collect::<GpuResult<Vec<_>>>()?,
        )
    };
    let mut numbered_in_partitions = false;
    let mut table_overflowed = false;
    let mut folding_table_grown = false;
    let mut permutation = None;
    let mut identities_made = None;
    let (groups, identities, numbered, key_order) = match pending {
        Some(pending) => {
            let order_bits = match ids {
                GroupIds::HashedInKeyOrder { key_bits, .. } => Some(key_bits),
                _ => None,
            };
            let finished = pending.finish(device, stream, back, order_bits, timer)?;
            if finished.identities.is_some() {
                // Every identity is made: nothing enqueued from here on
                // writes them.
                identities_made = Some(
                    stream
                        .record_event(None)
                        .during("recording the identities' end")?,
                );
            }
            numbered_in_partitions = finished.numbered_in_partitions;
            table_overflowed = finished.table_overflowed;
            folding_table_grown = finished.folding_table_grown;
            permutation = finished.permutation;
            (
                finished.groups,
                finished.identities,
                Some(finished.numbered),
                finished.key_order,
            )
        }
        None => (1, None, None, None),
    };
    let (row_groups, folded) = match numbered {
        Some(NumberedRows::RowGroups(row_groups)) => (Some(row_groups), None),
        Some(NumberedRows::Folded(folded)) => (None, Some(folded)),
        None => (None, None),
    };
    let folded_in_table = folded.is_some();
    let columns = match uploaded_columns {
        Some(columns) => columns,
        None if folded_in_table => {
            // Freed in stream order, each after the fold that read it.
            drop(fold_chunks);
            Vec::new()
        }
        // The table that folded filled up: the rows were numbered again,
        // and each input is reduced from its whole column, joined from the
        // chunks that crossed the bus.
        None => fold_chunks
            .into_columns(stream, inputs.len(), rows)?
            .into_iter()
            .map(InputColumn::Whole)
            .collect(),
    };
    let any_in_chunks = columns
        .iter()
        .any(|column| matches!(column, InputColumn::InChunks(_)));
    // The rows' groups in row order, where the groups were numbered in
    // the partitions' order and the host asks for each row's group, or an
    // input is reduced chunk by chunk as it lands.
    let wants_row_order = (back == GroupsBack::RowsAndRowGroups || any_in_chunks) && rows > 0;
    let row_groups_by_row = match (&row_groups, &permutation) {
        (Some(row_groups), Some(positions)) if wants_row_order => {
            // SAFETY: the scatter writes every row's entry, a permutation's
            // ids covering 0..rows.
            let mut by_row: DeviceVec<u64> =
                unsafe { stream.alloc(rows) }.during("allocating row groups")?;
            timer.time(Phase::Kernel, || {
                launch::scatter_u64(
                    device.kernels(),
                    stream,
                    sm_count,
                    row_groups,
                    positions,
                    &mut by_row,
                )
            })?;
            Some(by_row)
        }
        _ => None,
    };
    // Where the groups are numbered in the partitions' order, so are the
    // inputs reduced whole (each column just before its reduction, below),
    // with their bitmaps; inputs reduced in chunks read them in row order.
    let mut partition_bitmaps: Vec<Option<DeviceVec<u64>>> =
        (0..device_bitmaps.len()).map(|_| None).collect();
    if let Some(positions) = &permutation {
        for (input, column) in inputs.iter().zip(&columns) {
            if let (InputColumn::Whole(_), Some(i)) = (column, input.valid) {
                let bits = device_bitmaps
                    .get(i)
                    .ok_or_else(|| GpuError::Invalid(format!("no validity bitmap {i}")))?;
                if partition_bitmaps[i].is_none() {
                    partition_bitmaps[i] =
                        Some(gathered_bits(device, stream, bits, positions, timer)?);
                }
            }
        }
    }
    let mut kept_row_groups = Vec::new();
    if let (GroupsBack::RowsAndRowGroups, Some(row_groups)) = (back, &row_groups) {
        if rows > 0 {
            kept_row_groups.reserve_exact(rows);
            let in_row_order = row_groups_by_row.as_ref().unwrap_or(row_groups);
            download_u64(
                device,
                stream,
                &in_row_order.slice(0..rows),
                &mut kept_row_groups,
                timer,
            )?;
        }
    }
    // Without a permutation, the rows' groups are in row order already.
    let groups_in_row_order = match &permutation {
        Some(_) => row_groups_by_row.as_ref(),
        None => row_groups.as_ref(),
    };
    // Each input is reduced (a whole one gathered first, in partitions)
    // before the next input's turn, and its end recorded: the inputs cross
    // the bus one after the other, so the first inputs' results are made,
    // and can come back, while the last ones still cross. (A chunk dropped
    // once its reduction is enqueued makes the copy stream wait for that
    // reduction before freeing it: every copy is enqueued already.)
    let mut reductions_made = Vec::new();
    let mut inputs_reduced_as_they_landed = 0;
    let reduced = match folded {
        // Every input is reduced already.
        Some(folded) => folded.into_reduced(device, stream, groups, key_order.as_ref(), timer)?,
        None => inputs
            .iter()
            .zip(columns)
            .map(|(input, column)| {
                let reduced = match column {
                    InputColumn::InChunks(chunks) => {
                        let groups_of_rows = groups_in_row_order.ok_or_else(|| {
                            GpuError::Invalid("an input in chunks without row groups".into())
                        })?;
                        let rows_of = RowsInRowOrder {
                            groups_of_rows,
                            rows,
                            bitmaps: &device_bitmaps,
                            groups,
                        };
                        let reduced = reduce_chunks(
                            device,
                            stream,
                            &rows_of,
                            input,
                            &chunks,
                            key_order.as_ref(),
                            timer,
                        )?;
                        inputs_reduced_as_they_landed += 1;
                        reduced
                    }
                    InputColumn::Whole(mut column) => {
                        let valid_bits = match input.valid {
                            None => None,
                            // In the partitions' order, as the groups are.
                            Some(i) if permutation.is_some() => Some(
                                partition_bitmaps
                                    .get(i)
                                    .and_then(Option::as_ref)
                                    .ok_or_else(|| {
                                        GpuError::Invalid(format!(
                                            "validity bitmap {i} not in the partitions' order"
                                        ))
                                    })?,
                            ),
                            Some(i) => Some(device_bitmaps.get(i).ok_or_else(|| {
                                GpuError::Invalid(format!("no validity bitmap {i}"))
                            })?),
                        };
                        if let Some(positions) = &permutation {
                            column.gather(device, stream, positions, timer)?;
                        }
                        let group_rows_of = GroupRows {
                            groups_of_rows: row_groups.as_ref(),
                            rows,
                            valid_bits,
                            groups,
                            span: None,
                        };
                        reduce(
                            device,
                            stream,
                            group_rows_of,
                            input,
                            column,
                            key_order.as_ref(),
                            timer,
                        )?
                    }
                };
                reductions_made.push(
                    stream
                        .record_event(None)
                        .during("recording a reduction's end")?,
                );
                Ok(reduced)
            })
            .collect::<GpuResult<Vec<_>>>()?,
    };
    Ok(DeviceGrouped {
        groups,
        identities,
        back,
        row_groups: kept_row_groups,
        reduced,
        numbered_in_partitions,
        table_overflowed,
        folded_in_table,
        folding_table_grown,
        stream: Arc::clone(stream),
        identities_made,
        reductions_made,
        inputs_reduced_as_they_landed,
    })
}

fn check_inputs(
    keys: Option<&Words>,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
) -> GpuResult<()> {
    if let Some(keys) = keys {
        if keys.len() != rows {
            return Err(GpuError::Invalid(format!(
                "{} keys for {rows} rows",
                keys.len()
            )));
        }
    }
    for bits in bitmaps {
        if bits.len() != rows.div_ceil(64) {
            return Err(GpuError::Invalid(format!(
                "validity bitmap of {} words for {rows} rows",
                bits.len()
            )));
        }
    }
    for input in inputs {
        let values = if input.reduction == Reduction::Count {
            0
        } else {
            rows
        };
        let high = if input.reduction.is_wide() { rows } else { 0 };
        if input.values.len() != values || input.high_words.len() != high {
            return Err(GpuError::Invalid(format!(
                "{:?} over {} words and {} high words for {rows} rows",
                input.reduction,
                input.values.len(),
                input.high_words.len()
            )));
        }
        if input.valid.is_some_and(|i| i >= bitmaps.len()) {
            return Err(GpuError::Invalid(format!(
                "validity bitmap {:?} of {}",
                input.valid,
                bitmaps.len()
            )));
        }
    }
    Ok(())
}

/// Stage 1 on the device, enqueued: the group id of every row.
struct PendingGroups {
    /// The keys, kept for the gather of each group's key word: in row
    /// order (hashed ids), or sorted (sorted ids).
    keys: DeviceVec<u64>,
    group_count: DeviceVec<u64>,
    /// Where each group's first row is in `keys`: its row (hashed ids), or
    /// its position in the sorted keys (sorted ids).
    first_rows: DeviceVec<u64>,
    row_groups: PendingRowGroups,
    rows: usize,
    /// Partitioned ids: positions stand for rows of their own.
    partitioned: Option<PartitionedPositions>,
}

/// What a partitioned numbering leaves beside its positions.
struct PartitionedPositions {
    /// The row at each position of the partitioned keys.
    row_ids: DeviceVec<u64>,
    /// Nonzero where a partition held too many groups to be numbered.
    overflow: DeviceVec<u64>,
}

/// Where stage 1 leaves each row's group, before the host has read what
/// it found.
enum PendingRowGroups {
    /// A group id per row.
    Ids(DeviceVec<u64>),
    /// A slot per row of a table sized from an estimate, resolved into
    /// group ids once the table is known not to have filled up.
    Slots {
        row_slots: DeviceVec<u64>,
        table: SizedTable,
    },
    /// Every input folded into the slots of a table sized from an estimate
    /// ([`launch_table_folds`]), no group per row: moved to the groups once the
    /// table is known not to have filled up.
    Folded(TableFolds),
}

/// What stage 1 leaves for stage 2 once the host knows its table held.
enum NumberedRows {
    /// The group of every row, for each input's reduction.
    RowGroups(DeviceVec<u64>),
    /// Every input already folded into the table's slots.
    Folded(TableFolds),
}

/// A hash table sized from an estimate of the groups, which may have
/// filled up ([`launch::group_insert`] with an overflow flag).
struct SizedTable {
    table_groups: DeviceVec<u64>,
    capacity: u64,
    /// One entry, nonzero where the table filled up.
    overflow: DeviceVec<u64>,
}

/// Enqueues stage 1 as `ids` asks, over the device `keys` (`None`: no
/// rows), with `folds` folded into a hash table sized from an estimate
/// where given ([`table_fold_capacity`] says where).
fn launch_pending_groups(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: Option<DeviceVec<u64>>,
    ids: GroupIds,
    folds: Option<FoldInputs<'_>>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    match ids {
        GroupIds::Hashed { expected_groups } => {
            launch_group_assignment(device, stream, keys, None, expected_groups, folds, timer)
        }
        GroupIds::Partitioned { partition_bits } => {
            launch_partitioned_group_assignment(device, stream, keys, partition_bits, timer)
        }
        GroupIds::HashedInKeyOrder {
            transform,
            expected_groups,
            ..
        } => launch_group_assignment(
            device,
            stream,
            keys,
            transform,
            expected_groups,
            folds,
            timer,
        ),
        GroupIds::Sorted {
            key_bits,
            transform,
        } => launch_sorted_group_assignment(device, stream, keys, key_bits, transform, timer),
    }
}

/// Enqueues the kernels that give every row of the device `keys` (`None`:
/// no rows) a group, the keys made codes first with `transform`, in a table
/// sized to `expected_groups` where that is smaller than one sized to the
/// rows ([`sized_table_capacity`]), with `folds` folded into that table
/// where given ([`launch_table_folds`]).
fn launch_group_assignment(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: Option<DeviceVec<u64>>,
    transform: Option<CodeTransform>,
    expected_groups: Option<usize>,
    folds: Option<FoldInputs<'_>>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let sm_count = device.sm_count();
    let mut group_count = stream
        .alloc_zeros::<u64>(1)
        .during("allocating the group counter")?;
    let Some(mut device_keys) = keys else {
        // No groups; the reductions launch nothing for no rows.
        let none = || stream.alloc_zeros::<u64>(1).during("allocating row groups");
        return Ok(PendingGroups {
            keys: none()?,
            group_count,
            first_rows: none()?,
            row_groups: PendingRowGroups::Ids(none()?),
            rows: 0,
            partitioned: None,
        });
    };
    let rows = device_keys.len();
    if let Some(transform) = transform {
        timer.time(Phase::Kernel, || {
            launch::ordered_codes(
                device.kernels(),
                stream,
                sm_count,
                &mut device_keys,
                transform,
            )
        })?;
    }
    // SAFETY (first rows): entries [0, groups) are written, only those are read.
    let mut first_rows: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating group rows")?;
    let sized = expected_groups
        .map(sized_table_capacity)
        .filter(|&capacity| capacity < table_capacity(rows));
    if let (Some(capacity), Some(folds)) = (sized, folds) {
        trace::event(|| {
            format!(
                "aggregation: {} inputs folded into a hash table of {capacity} slots",
                folds.inputs.len()
            )
        });
        let folded = launch_table_folds(
            device,
            stream,
            &device_keys,
            capacity,
            folds,
            FoldCounts {
                group_count: &mut group_count,
                first_rows: &mut first_rows,
            },
            timer,
        )?;
        return Ok(PendingGroups {
            keys: device_keys,
            group_count,
            first_rows,
            row_groups: PendingRowGroups::Folded(folded),
            rows,
            partitioned: None,
        });
    }
    // SAFETY (row groups): group_insert writes one slot per row (unless a
    // table sized from an estimate fills up: then they are numbered again).
    let mut row_groups: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating row groups")?;
    let row_groups = match sized {
        None => {
            number_in_global_table(
                device,
                stream,
                &device_keys,
                GlobalNumbering {
                    row_groups: &mut row_groups,
                    first_rows: &mut first_rows,
                    group_count: &mut group_count,
                },
                timer,
            )?;
            PendingRowGroups::Ids(row_groups)
        }
        Some(capacity) => {
            let mut overflow = stream
                .alloc_zeros::<u64>(1)
                .during("allocating the overflow flag")?;
            let table_groups = insert_into_table(
                device,
                stream,
                &device_keys,
                capacity,
                TableOutputs {
                    row_slots: &mut row_groups,
                    first_rows: &mut first_rows,
                    group_count: &mut group_count,
                    overflow: Some(&mut overflow),
                },
                timer,
            )?;
            PendingRowGroups::Slots {
                row_slots: row_groups,
                table: SizedTable {
                    table_groups,
                    capacity,
                    overflow,
                },
            }
        }
    };
    Ok(PendingGroups {
        keys: device_keys,
        group_count,
        first_rows,
        row_groups,
        rows,
        partitioned: None,
    })
}

/// Where [`number_in_global_table`] writes.
struct GlobalNumbering<'a> {
    /// The group of each key (`keys.len()` entries).
    row_groups: &'a mut DeviceVec<u64>,
    /// A position of each group (`keys.len()` entries, `[0, groups)` written).
    first_rows: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry: the number of groups.
    group_count: &'a mut DeviceVec<u64>,
}

/// Enqueues HGB's stage 1 over `keys` (at least one): a table of twice as
/// many slots as keys, every key's group, each group's first position.
fn number_in_global_table(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: &DeviceVec<u64>,
    out: GlobalNumbering<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let table_groups = insert_into_table(
        device,
        stream,
        keys,
        table_capacity(keys.len()),
        TableOutputs {
            row_slots: &mut *out.row_groups,
            first_rows: out.first_rows,
            group_count: out.group_count,
            overflow: None,
        },
        timer,
    )?;
    timer.time(Phase::Kernel, || {
        launch::group_resolve(
            device.kernels(),
            stream,
            device.sm_count(),
            out.row_groups,
            &table_groups,
        )
    })
    // The table is freed in stream order, after the kernels that read it.
}

/// Where [`insert_into_table`] writes.
struct TableOutputs<'a> {
    /// The slot of each key (`keys.len()` entries).
    row_slots: &'a mut DeviceVec<u64>,
    /// A position of each group (`keys.len()` entries, `[0, groups)` written).
    first_rows: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry: the number of groups.
    group_count: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry, set where the table fills up; required for a
    /// table of fewer than twice as many slots as keys.
    overflow: Option<&'a mut DeviceVec<u64>>,
}

/// Enqueues a table of `capacity` slots (and the reserved one) and the
/// insertion of `keys` (at least one) into it; returns the group of each
/// claimed slot (the table's keys are freed in stream order, after the
/// insertion).
fn insert_into_table(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: &DeviceVec<u64>,
    capacity: u64,
    out: TableOutputs<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    let sm_count = device.sm_count();
    let slots = capacity as usize + 1;
    // SAFETY (table_keys): filled with EMPTY_KEY below before any read.
    let mut table_keys: DeviceVec<u64> =
        unsafe { stream.alloc(slots) }.during("allocating the group hash table")?;
    // SAFETY (table_groups): group_insert writes the slots it claims, and
    // only claimed slots are read.
    let mut table_groups: DeviceVec<u64> =
        unsafe { stream.alloc(slots) }.during("allocating the group hash table")?;
    timer.time(Phase::Kernel, || {
        launch::fill_u64(
            device.kernels(),
            stream,
            sm_count,
            &mut table_keys,
            u64::MAX,
        )?;
        launch::group_insert(
            device.kernels(),
            stream,
            sm_count,
            keys,
            &mut table_keys,
            &mut table_groups,
            capacity,
            out.group_count,
            out.first_rows,
            out.row_slots,
            out.overflow,
        )
    })?;
    Ok(table_groups)
}

/// Enqueues the radix partitioning of the device `keys` (`None`: no rows)
/// with their row ids and the numbering of each partition's groups (seed
/// 002's PGB).
fn launch_partitioned_group_assignment(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: Option<DeviceVec<u64>>,
    partition_bits: u32,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let Some(device_keys) = keys else {
        return launch_group_assignment(device, stream, None, None, None, None, timer);
    };
    let rows = device_keys.len();
    let sm_count = device.sm_count();
    let kernels = device.kernels();
    let plan = RadixPlan::new(partition_bits);
    let partitions = plan.partitions();
    // SAFETY (all four): iota writes every row id; partitioned_group_ids
    // writes every position's local id, and [starts[p], starts[p] + its
    // groups) of the positions, the only ones the resolve reads; the
    // resolve writes group_firsts[0..groups), the only ones read later.
    let mut ids: DeviceVec<u64> = unsafe { stream.alloc(rows) }.during("allocating row ids")?;
    let mut local_ids: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating row groups")?;
    let mut first_positions: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating group positions")?;
    let mut group_firsts: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating group positions")?;
    // Zeros: a partition left unnumbered (after an overflow) counts none,
    // and the entry after the last makes the scan's last entry the total.
    let mut group_counts = stream
        .alloc_zeros::<u64>(partitions + 1)
        .during("allocating partition group counts")?;
    let mut overflow = stream
        .alloc_zeros::<u64>(1)
        .during("allocating the overflow flag")?;
    let mut group_count = stream
        .alloc_zeros::<u64>(1)
        .during("allocating the group counter")?;
    let partitioned = timer.time(Phase::Kernel, || {
        launch::iota(kernels, stream, sm_count, &mut ids, 0)?;
        let partitioned = radix_partition(device, stream, device_keys, ids, &plan)?;
        launch::partitioned_group_ids(
            kernels,
            stream,
            sm_count,
            &partitioned.keys,
            &partitioned.starts,
            PartitionGroupIds {
                local_ids: &mut local_ids,
                group_counts: &mut group_counts,
                first_positions: &mut first_positions,
                overflow: &mut overflow,
            },
        )?;
        exclusive_scan(device, stream, &mut group_counts, partitions + 1)?;
        launch::partitioned_group_resolve(
            kernels,
            stream,
            sm_count,
            &partitioned.starts,
            &group_counts,
            &mut local_ids,
            &first_positions,
            &mut group_firsts,
            &mut group_count,
        )?;
        Ok(partitioned)
    })?;
    Ok(PendingGroups {
        keys: partitioned.keys,
        group_count,
        first_rows: group_firsts,
        row_groups: PendingRowGroups::Ids(local_ids),
        rows,
        partitioned: Some(PartitionedPositions {
            row_ids: partitioned.row_ids,
            overflow,
        }),
    })
}

/// `bits` (a validity bitmap) in the order of `positions`: bit `i` of the
/// result is bit `positions[i]` of `bits`.
fn gathered_bits(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    bits: &DeviceVec<u64>,
    positions: &DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    // SAFETY: gather_bits writes every word of the result.
    let mut out: DeviceVec<u64> = unsafe { stream.alloc(positions.len().div_ceil(64).max(1)) }
        .during("allocating a validity bitmap")?;
    timer.time(Phase::Kernel, || {
        launch::gather_bits(
            device.kernels(),
            stream,
            device.sm_count(),
            bits,
            positions,
            &mut out,
        )
    })?;
    Ok(out)
}

/// Enqueues the sort of the device `keys` (`None`: no rows) and the
/// kernels that give every row the rank of its key among the distinct keys.
fn launch_sorted_group_assignment(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: Option<DeviceVec<u64>>,
    key_bits: u32,
    transform: Option<CodeTransform>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let Some(mut device_keys) = keys else {
        return launch_group_assignment(device, stream, None, None, None, None, timer);
    };
    let rows = device_keys.len();
    let sm_count = device.sm_count();
    let kernels = device.kernels();
    // SAFETY (all four): iota, the heads kernel and sorted_group_ids write
    // every element of the first three; group_firsts[0..groups) is written
    // and only that is read.
    let mut ids: DeviceVec<u64> = unsafe { stream.alloc(rows) }.during("allocating row ids")?;
    let mut ranks: DeviceVec<u64> = unsafe { stream.alloc(rows) }.during("allocating run ranks")?;
    let mut row_groups: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating row groups")?;
    let mut group_firsts: DeviceVec<u64> =
        unsafe { stream.alloc(rows) }.during("allocating group first positions")?;
    let mut group_count = stream
        .alloc_zeros::<u64>(1)
        .during("allocating the group counter")?;
    let sorted = timer.time(Phase::Kernel, || {
        if let Some(transform) = transform {
            launch::ordered_codes(kernels, stream, sm_count, &mut device_keys, transform)?;
        }
        launch::iota(kernels, stream, sm_count, &mut ids, 0)?;
        let sorted = radix_sort(device, stream, device_keys, ids, key_bits)?;
        launch::sorted_group_heads(kernels, stream, sm_count, &sorted.keys, &mut ranks)?;
        exclusive_scan(device, stream, &mut ranks, rows)?;
        launch::sorted_group_ids(
            kernels,
            stream,
            sm_count,
            &sorted.keys,
            &ranks,
            &sorted.row_ids,
            SortedGroupIds {
                row_groups: &mut row_groups,
                group_firsts: &mut group_firsts,
                group_count: &mut group_count,
            },
        )?;
        Ok(sorted)
    })?;
    Ok(PendingGroups {
        keys: sorted.keys,
        group_count,
        first_rows: group_firsts,
        row_groups: PendingRowGroups::Ids(row_groups),
        rows,
        partitioned: None,
    })
}

/// Stage 1, finished.
struct FinishedGroups {
    groups: usize,
    /// What identifies each group on the host, as asked for, in its first
    /// `groups` words (`None` without rows).
    identities: Option<DeviceVec<u64>>,
    /// The group of every row on the device, or the inputs folded into
    /// the table's slots.
    numbered: NumberedRows,
    /// Where groups come back in key order: the group at each position.
    key_order: Option<DeviceVec<u64>>,
    /// Partitioned ids: the row at each position, where `row_groups`
    /// follow the partitions' order rather than the rows'.
    permutation: Option<DeviceVec<u64>>,
    /// Whether the partitions numbered their groups (none overflowed).
    numbered_in_partitions: bool,
    /// Whether a table sized from an estimate of the groups filled up, and
    /// the rows were numbered again in one sized to them.
    table_overflowed: bool,
    /// Whether the table that folded was built again, larger, after its
    /// first chunk of rows.
    folding_table_grown: bool,
}

impl PendingGroups {
    /// Waits for stage 1: the number of groups and what identifies each
    /// group on the host (its key word or a row of it, as `back` asks),
    /// with the group of every row left on the device. With `order_bits`,
    /// the groups' key words (below `2^order_bits`) are sorted on the
    /// device and come back in that order, with the order itself for the
    /// results; only key words come back then.
    fn finish(
        self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        back: GroupsBack,
        order_bits: Option<u32>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<FinishedGroups> {
        let PendingGroups {
            keys,
            mut group_count,
            mut first_rows,
            row_groups,
            rows,
            partitioned,
        } = self;
        let folding_table_grown =
            matches!(&row_groups, PendingRowGroups::Folded(folded) if folded.grown);
        if rows == 0 {
            return Ok(FinishedGroups {
                groups: 0,
                identities: None,
                numbered: match row_groups {
                    PendingRowGroups::Ids(ids) => NumberedRows::RowGroups(ids),
                    PendingRowGroups::Slots { row_slots, .. } => NumberedRows::RowGroups(row_slots),
                    PendingRowGroups::Folded(folded) => NumberedRows::Folded(folded),
                },
                key_order: None,
                permutation: None,
                numbered_in_partitions: false,
                table_overflowed: false,
                folding_table_grown,
            });
        }
        let (mut numbered, table_overflowed) = checked_row_groups(
            row_groups,
            Numbering {
                keys: &keys,
                first_rows: &mut first_rows,
                group_count: &mut group_count,
            },
            device,
            stream,
            timer,
        )?;
        let mut numbered_in_partitions = false;
        if let Some(partitioned) = &partitioned {
            let mut overflow = Vec::with_capacity(1);
            download_u64(
                device,
                stream,
                &partitioned.overflow.as_view(),
                &mut overflow,
                timer,
            )?;
            numbered_in_partitions = overflow[0] == 0;
            if !numbered_in_partitions {
                let NumberedRows::RowGroups(row_groups) = &mut numbered else {
                    return Err(GpuError::Invalid("partitions folded into a table".into()));
                };
                // A partition held too many groups: the global table
                // numbers the partitioned keys instead, in their order.
                number_again_in_global_table(
                    device,
                    stream,
                    Numbering {
                        keys: &keys,
                        first_rows: &mut first_rows,
                        group_count: &mut group_count,
                    },
                    row_groups,
                    timer,
                )?;
            }
        }
        let mut count = Vec::with_capacity(1);
        download_u64(device, stream, &group_count.as_view(), &mut count, timer)?;
        let groups = count[0] as usize;
        if groups == 0 || groups > rows {
            return Err(GpuError::Invalid(format!(
                "{groups} groups reported for {} rows",
                rows
            )));
        }
        let mut key_order = None;
        let identities = match back {
            GroupsBack::RowsAndRowGroups if order_bits.is_some() => {
                return Err(GpuError::Invalid(
                    "groups in key order give key words, not rows".into(),
                ))
            }
            GroupsBack::RowsAndRowGroups => match &partitioned {
                // Each group's position, mapped to its row.
                Some(partitioned) => {
                    // SAFETY: the gather writes all `groups` words.
                    let mut group_rows: DeviceVec<u64> =
                        unsafe { stream.alloc(groups) }.during("allocating group rows")?;
                    timer.time(Phase::Kernel, || {
                        launch::gather_u64(
                            device.kernels(),
                            stream,
                            device.sm_count(),
                            &partitioned.row_ids,
                            &first_rows,
                            groups,
                            &mut group_rows,
                        )
                    })?;
                    group_rows
                }
                None => first_rows,
            },
            GroupsBack::KeyWords => {
                // SAFETY: the gather below writes all `groups` words, and
                // only those are read.
                let mut group_keys: DeviceVec<u64> =
                    unsafe { stream.alloc(groups) }.during("allocating group keys")?;
                timer.time(Phase::Kernel, || {
                    launch::gather_u64(
                        device.kernels(),
                        stream,
                        device.sm_count(),
                        &keys,
                        &first_rows,
                        groups,
                        &mut group_keys,
                    )
                })?;
                if let Some(key_bits) = order_bits {
                    let sorted = timer.time(Phase::Kernel, || {
                        // SAFETY: iota writes every element.
                        let mut ids: DeviceVec<u64> =
                            unsafe { stream.alloc(groups) }.during("allocating group numbers")?;
                        launch::iota(device.kernels(), stream, device.sm_count(), &mut ids, 0)?;
                        radix_sort(device, stream, group_keys, ids, key_bits)
                    })?;
                    group_keys = sorted.keys;
                    key_order = Some(sorted.row_ids);
                }
                group_keys
            }
        };
        Ok(FinishedGroups {
            groups,
            identities: Some(identities),
            numbered,
            key_order,
            permutation: partitioned.map(|p| p.row_ids),
            numbered_in_partitions,
            table_overflowed,
            folding_table_grown,
        })
    }
}

/// What numbering the rows again ([`number_again_in_global_table`]) writes
/// over, and the keys it reads.
struct Numbering<'a> {
    keys: &'a DeviceVec<u64>,
    first_rows: &'a mut DeviceVec<u64>,
    group_count: &'a mut DeviceVec<u64>,
}

/// The group of every row, once a table sized from an estimate is known
/// not to have filled up (its slots then resolved into group ids), or the
/// inputs folded into such a table. Where it filled up, the rows are
/// numbered again in a table sized to them (`true`), without folds. Waits
/// for the device where the table was sized from an estimate.
fn checked_row_groups(
    pending: PendingRowGroups,
    numbering: Numbering<'_>,
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    timer: &mut PhaseTimer,
) -> GpuResult<(NumberedRows, bool)> {
    let sized_table = match &pending {
        PendingRowGroups::Ids(_) => None,
        PendingRowGroups::Slots { table, .. } => Some(table),
        PendingRowGroups::Folded(folded) => Some(&folded.table),
    };
    let Some(table) = sized_table else {
        let PendingRowGroups::Ids(ids) = pending else {
            unreachable!("only ids come without a sized table")
        };
        return Ok((NumberedRows::RowGroups(ids), false));
    };
    let capacity = table.capacity;
    let mut overflow = Vec::with_capacity(1);
    download_u64(
        device,
        stream,
        &table.overflow.as_view(),
        &mut overflow,
        timer,
    )?;
    if overflow[0] == 0 {
        let numbered = match pending {
            PendingRowGroups::Ids(ids) => NumberedRows::RowGroups(ids),
            PendingRowGroups::Slots {
                mut row_slots,
                table,
            } => {
                timer.time(Phase::Kernel, || {
                    launch::group_resolve(
                        device.kernels(),
                        stream,
                        device.sm_count(),
                        &mut row_slots,
                        &table.table_groups,
                    )
                })?;
                NumberedRows::RowGroups(row_slots)
            }
            PendingRowGroups::Folded(folded) => NumberedRows::Folded(folded),
        };
        return Ok((numbered, false));
    }
    trace::event(|| {
        format!(
            "aggregation: a hash table of {capacity} slots filled up; the rows are numbered again"
        )
    });
    // Every output of the first try is incomplete: start again, with the
    // small table (and its folds) freed first, in stream order, so that the
    // device holds no more than a table sized to the rows.
    let mut row_groups = match pending {
        PendingRowGroups::Slots { row_slots, table } => {
            drop(table);
            row_slots
        }
        other => {
            drop(other);
            // SAFETY: the numbering below writes every row's group.
            unsafe { stream.alloc(numbering.keys.len()) }.during("allocating row groups")?
        }
    };
    number_again_in_global_table(device, stream, numbering, &mut row_groups, timer)?;
    Ok((NumberedRows::RowGroups(row_groups), true))
}

/// Enqueues the numbering of every row again, the group count reset
/// first, in a table sized to the rows: where a smaller table or a
/// partition filled up.
fn number_again_in_global_table(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    numbering: Numbering<'_>,
    row_groups: &mut DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    timer.time(Phase::Kernel, || {
        launch::fill_u64(
            device.kernels(),
            stream,
            device.sm_count(),
            numbering.group_count,
            0,
        )
    })?;
    number_in_global_table(
        device,
        stream,
        numbering.keys,
        GlobalNumbering {
            row_groups,
            first_rows: numbering.first_rows,
            group_count: numbering.group_count,
        },
        timer,
    )
}

/// One input on its way to the device: its whole column, reduced once it
/// has crossed, or chunks, each reduced once it has landed
/// ([`landing_chunks`]).
enum InputColumn {
    Whole(UploadedInput),
    InChunks(Vec<landing_chunks::LandedChunk>),
}

/// One input's columns on the device (none without rows).
struct UploadedInput {
    values: Option<DeviceVec<u64>>,
    high: Option<DeviceVec<u64>>,
}

impl UploadedInput {
    /// Each column in the order of `positions` (`out[i] = column[positions[i]]`).
    fn gather(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        positions: &DeviceVec<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        for column in [&mut self.values, &mut self.high].into_iter().flatten() {
            let rows = positions.len();
            // SAFETY: the gather writes all `rows` words.
            let mut gathered: DeviceVec<u64> =
                unsafe { stream.alloc(rows) }.during("allocating a gathered input")?;
            timer.time(Phase::Kernel, || {
                launch::gather_u64(
                    device.kernels(),
                    stream,
                    device.sm_count(),
                    column,
                    positions,
                    rows,
                    &mut gathered,
                )
            })?;
            // The column is freed in stream order, after the gather.
            *column = gathered;
        }
        Ok(())
    }
}

/// Enqueues the copy of one input's columns.
fn upload_input(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    input: &ReduceInput,
    rows: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<UploadedInput> {
    let upload = |words: &Words, timer: &mut PhaseTimer| {
        (rows > 0 && !words.is_empty())
            .then(|| upload_u64_pieces(device, stream, &words.pieces(), timer))
            .transpose()
    };
    Ok(UploadedInput {
        values: upload(&input.values, timer)?,
        high: upload(&input.high_words, timer)?,
    })
}

/// `out`, one result per group, gathered on the device into `key_order`
/// where given (the group at each position of `groups`).
fn in_key_order(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    out: DeviceVec<u64>,
    key_order: Option<&DeviceVec<u64>>,
    groups: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    let Some(order) = key_order else {
        return Ok(out);
    };
    // SAFETY: the gather writes all `groups` words.
    let mut ordered: DeviceVec<u64> =
        unsafe { stream.alloc(groups.max(1)) }.during("allocating ordered results")?;
    timer.time(Phase::Kernel, || {
        launch::gather_u64(
            device.kernels(),
            stream,
            device.sm_count(),
            &out,
            order,
            groups,
            &mut ordered,
        )
    })?;
    Ok(ordered)
}

/// Stage 2 for one input over all its rows; with `key_order`, each result
/// comes back in that order of the groups (the group at each position).
fn reduce(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    rows: GroupRows<'_>,
    input: &ReduceInput,
    column: UploadedInput,
    key_order: Option<&DeviceVec<u64>>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceReduced> {
    if rows.rows == 0 {
        // Nothing to reduce: every group (the one group without keys) keeps
        // the identity.
        return Ok(DeviceReduced::Identity {
            word: input.reduction.identity(),
            wide: input.reduction.is_wide(),
        });
    }
    let mut outputs = ReductionOutputs::new(device, stream, input.reduction, rows.groups, timer)?;
    outputs.reduce(device, stream, rows, input, &column, timer)?;
    outputs.into_reduced(device, stream, key_order, timer)
}

/// One input's results on the device while its rows are reduced into
/// them: each group's slot starts at the reduction's identity.
struct ReductionOutputs {
    /// Groups: the slots of each vector (of at least one slot).
    groups: usize,
    /// Words or the fixed-point sum's parts, never the identity alone.
    slots: DeviceReduced,
}

impl ReductionOutputs {
    /// Enqueues the slots of `groups` groups for `reduction`, each set to
    /// its identity.
    fn new(
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        reduction: Reduction,
        groups: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let mut slots = |identity: u64| -> GpuResult<DeviceVec<u64>> {
            // SAFETY: filled right below, before any read.
            let mut out: DeviceVec<u64> =
                unsafe { stream.alloc(groups.max(1)) }.during("allocating aggregate output")?;
            timer.time(Phase::Kernel, || {
                launch::fill_u64(
                    device.kernels(),
                    stream,
                    device.sm_count(),
                    &mut out,
                    identity,
                )
            })?;
            Ok(out)
        };
        let slots = match reduction {
            Reduction::Count | Reduction::Sum | Reduction::Min | Reduction::Max => {
                DeviceReduced::Words {
                    values: slots(reduction.identity())?,
                    high: None,
                }
            }
            Reduction::SumF64 => DeviceReduced::Words {
                values: slots(0f64.to_bits())?,
                high: None,
            },
            Reduction::SumF64Fixed => DeviceReduced::FixedF64 {
                top: slots(0)?,
                specials: slots(0)?,
                lo: slots(0)?,
                hi: slots(0)?,
            },
            Reduction::SumI128 => DeviceReduced::Words {
                values: slots(0)?,
                high: Some(slots(0)?),
            },
            Reduction::MinI128 | Reduction::MaxI128 => {
                let op = min_or_max(reduction);
                let high = slots(op.identity())?;
                DeviceReduced::Words {
                    values: slots(op.identity())?,
                    high: Some(high),
                }
            }
        };
        Ok(Self { groups, slots })
    }

    /// Enqueues the reduction of `rows` (all of them, or a chunk whose
    /// values `column` holds, where the reduction takes one pass:
    /// [`reduces_in_one_pass`]) into these slots.
    fn reduce(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        rows: GroupRows<'_>,
        input: &ReduceInput,
        column: &UploadedInput,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let (kernels, sm_count) = (device.kernels(), device.sm_count());
        let UploadedInput { values, high } = column;
        let missing = || GpuError::Invalid(format!("{:?} without its values", input.reduction));
        let mismatch = || {
            GpuError::Invalid(format!(
                "{:?} reduced into the slots of another reduction",
                input.reduction
            ))
        };
        match (input.reduction, &mut self.slots) {
            (
                reduction @ (Reduction::Count | Reduction::Sum | Reduction::Min | Reduction::Max),
                DeviceReduced::Words { values: out, .. },
            ) => {
                let op = match reduction {
                    Reduction::Count => AggregateOp::Count,
                    Reduction::Sum => AggregateOp::Sum,
                    Reduction::Min => AggregateOp::Min,
                    _ => AggregateOp::Max,
                };
                timer.time(Phase::Kernel, || {
                    launch::aggregate_u64(
                        kernels,
                        stream,
                        sm_count,
                        rows,
                        values.as_ref(),
                        None,
                        op,
                        input.flip,
                        out,
                    )
                })
            }
            (Reduction::SumF64, DeviceReduced::Words { values: out, .. }) => {
                let values = values.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_f64_sum(kernels, stream, sm_count, rows, values, out)
                })
            }
            (
                Reduction::SumF64Fixed,
                DeviceReduced::FixedF64 {
                    top,
                    specials,
                    lo,
                    hi,
                },
            ) => {
                let values = values.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::f64_sum_scale(kernels, stream, sm_count, rows, values, top, specials)?;
                    launch::f64_sum_fixed(kernels, stream, sm_count, rows, values, top, lo, hi)
                })
            }
            (
                Reduction::SumI128,
                DeviceReduced::Words {
                    values: out_lo,
                    high: Some(out_hi),
                },
            ) => {
                let lo = values.as_ref().ok_or_else(missing)?;
                let hi = high.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_i128_sum(
                        kernels, stream, sm_count, rows, lo, hi, out_lo, out_hi,
                    )
                })
            }
            (
                reduction @ (Reduction::MinI128 | Reduction::MaxI128),
                DeviceReduced::Words {
                    values: out_lo,
                    high: Some(out_hi),
                },
            ) => {
                let lo = values.as_ref().ok_or_else(missing)?;
                let hi = high.as_ref().ok_or_else(missing)?;
                let op = min_or_max(reduction);
                // The high words decide; the low words only among rows that
                // tie with their group's best high word, so the rows are
                // read twice: they come whole, never in chunks.
                rows.whole()?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_u64(
                        kernels,
                        stream,
                        sm_count,
                        rows,
                        Some(hi),
                        None,
                        op,
                        0,
                        out_hi,
                    )?;
                    launch::aggregate_u64(
                        kernels,
                        stream,
                        sm_count,
                        rows,
                        Some(lo),
                        Some((hi, &*out_hi)),
                        op,
                        0,
                        out_lo,
                    )
                })
            }
            _ => Err(mismatch()),
        }
    }

    /// The results, gathered on the device into `key_order` where given
    /// (the group at each position).
    fn into_reduced(
        self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        key_order: Option<&DeviceVec<u64>>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<DeviceReduced> {
        let groups = self.groups;
        let mut ordered =
            |out: DeviceVec<u64>| in_key_order(device, stream, out, key_order, groups, timer);
        Ok(match self.slots {
            identity @ DeviceReduced::Identity { .. } => identity,
            DeviceReduced::Words { values, high } => DeviceReduced::Words {
                values: ordered(values)?,
                high: high.map(&mut ordered).transpose()?,
            },
            DeviceReduced::FixedF64 {
                top,
                specials,
                lo,
                hi,
            } => DeviceReduced::FixedF64 {
                top: ordered(top)?,
                specials: ordered(specials)?,
                lo: ordered(lo)?,
                hi: ordered(hi)?,
            },
        })
    }
}

/// The op of a 128-bit minimum or maximum.
fn min_or_max(reduction: Reduction) -> AggregateOp {
    match reduction {
        Reduction::MinI128 | Reduction::Min => AggregateOp::Min,
        _ => AggregateOp::Max,
    }
}

/// CPU reference: the same results, with groups in first-occurrence order
/// and `group_rows` the first row of each group; every field is filled,
/// whatever a [`GroupsBack`] would ask for.
pub mod reference {
    use std::collections::HashMap;

    use super::{
        fixed_point_scale, fixed_point_term, fixed_sum_to_f64, Grouped, ReduceInput, Reduced,
        Reduction,
    };

    /// What [`super::group_on_device`] computes, then downloaded, on the host.
    pub fn group_by(
        keys: Option<&[u64]>,
        rows: usize,
        inputs: &[ReduceInput],
        bitmaps: &[Vec<u64>],
    ) -> Grouped {
        let mut group_of_row = Vec::with_capacity(rows);
        let mut group_rows = Vec::new();
        match keys {
            Some(keys) => {
                let mut ids: HashMap<u64, usize> = HashMap::new();
                for (row, key) in keys.iter().enumerate() {
                    let next = ids.len();
                    let id = *ids.entry(*key).or_insert(next);
                    if id == next {
                        group_rows.push(row as u64);
                    }
                    group_of_row.push(id);
                }
            }
            None => group_of_row.resize(rows, 0),
        }
        let groups = if keys.is_some() { group_rows.len() } else { 1 };
        let reduced = inputs
            .iter()
            .map(|input| reduce(input, &group_of_row, groups, bitmaps))
            .collect();
        Grouped {
            groups,
            group_keys: match keys {
                Some(keys) => group_rows.iter().map(|&row| keys[row as usize]).collect(),
                None => Vec::new(),
            },
            group_rows,
            row_groups: if keys.is_some() {
                group_of_row.iter().map(|&g| g as u64).collect()
            } else {
                Vec::new()
            },
            reduced,
            table_overflowed: false,
            folded_in_table: false,
            folding_table_grown: false,
            inputs_reduced_as_they_landed: 0,
            numbered_in_partitions: false,
        }
    }

    fn reduce(
        input: &ReduceInput,
        group_of_row: &[usize],
        groups: usize,
        bitmaps: &[Vec<u64>],
    ) -> Reduced {
        let valid = |i: usize| {
            input
                .valid
                .is_none_or(|b| (bitmaps[b][i / 64] >> (i % 64)) & 1 == 1)
        };
        let (values, high_words) = (input.values.to_vec(), input.high_words.to_vec());
        if input.reduction == Reduction::SumF64Fixed {
            return fixed_sums(&values, group_of_row, groups, valid);
        }
        let wide = |i: usize| (u128::from(high_words[i]) << 64) | u128::from(values[i]);
        let (identity, combine): (u128, fn(u128, u128) -> u128) = match input.reduction {
            Reduction::Count | Reduction::Sum | Reduction::SumI128 => (0, u128::wrapping_add),
            Reduction::Min => (u64::MAX.into(), u128::min),
            Reduction::MinI128 => (u128::MAX, u128::min),
            Reduction::Max | Reduction::MaxI128 => (0, u128::max),
            Reduction::SumF64 | Reduction::SumF64Fixed => (0f64.to_bits().into(), |a, b| {
                (f64::from_bits(a as u64) + f64::from_bits(b as u64))
                    .to_bits()
                    .into()
            }),
        };
        let mut out = vec![identity; groups];
        for (i, &g) in group_of_row.iter().enumerate() {
            if !valid(i) {
                continue;
            }
            let value = match input.reduction {
                Reduction::Count => 1,
                r if r.is_wide() => wide(i),
                Reduction::Sum | Reduction::Min | Reduction::Max => {
                    u128::from(values[i] ^ input.flip)
                }
                _ => u128::from(values[i]),
            };
            out[g] = combine(out[g], value);
        }
        if input.reduction.is_wide() {
            Reduced {
                values: out.iter().map(|&v| v as u64).collect(),
                high_words: out.iter().map(|&v| (v >> 64) as u64).collect(),
            }
        } else {
            Reduced {
                // Sums wrap at 64 bits like the device's.
                values: out.iter().map(|&v| v as u64).collect(),
                high_words: Vec::new(),
            }
        }
    }

    /// [`Reduction::SumF64Fixed`] as the device computes it, to the bit.
    fn fixed_sums(
        values: &[u64],
        group_of_row: &[usize],
        groups: usize,
        valid: impl Fn(usize) -> bool,
    ) -> Reduced {
        let mut top = vec![0u64; groups];
        let mut specials = vec![0u64; groups];
        for (i, &g) in group_of_row.iter().enumerate() {
            if valid(i) {
                match fixed_point_scale(values[i]) {
                    Ok(exponent) => top[g] = top[g].max(exponent),
                    Err(flag) => specials[g] |= flag,
                }
            }
        }
        let mut sums = vec![0i128; groups];
        for (i, &g) in group_of_row.iter().enumerate() {
            if valid(i) && fixed_point_scale(values[i]).is_ok() {
                sums[g] = sums[g].wrapping_add(fixed_point_term(values[i], top[g]));
            }
        }
        Reduced {
            values: (0..groups)
                .map(|g| fixed_sum_to_f64(sums[g], top[g], specials[g]).to_bits())
                .collect(),
            high_words: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_in_a_range_are_the_parts_of_the_pieces_that_hold_it() {
        let mut words = Words::default();
        for piece in [vec![0u64, 1, 2], vec![], vec![3, 4], vec![5, 6, 7, 8]] {
            words.push(Box::new(piece));
        }
        let all: Vec<u64> = (0..9).collect();
        for start in 0..=9 {
            for end in start..=9 {
                let parts = words.pieces_in(start..end);
                assert!(parts.iter().all(|p| !p.is_empty()), "{start}..{end}");
                assert_eq!(parts.concat(), all[start..end], "{start}..{end}");
            }
        }
        assert_eq!(words.pieces_in(2..6).len(), 3);
    }

    #[test]
    fn a_folding_table_is_counted_where_it_outgrows_the_rows_own() {
        let inputs = |count: usize, reduction: Reduction| -> Vec<ReduceInput> {
            (0..count)
                .map(|_| ReduceInput {
                    reduction,
                    values: Words::default(),
                    high_words: Words::default(),
                    flip: 0,
                    valid: None,
                })
                .collect()
        };
        let sums = inputs(4, Reduction::Sum);
        let rows = 1 << 20;
        // 2^21 slots of keys and groups, and every row's group.
        let unfolded = 2 * ((1 << 21) + 1) + rows;
        assert_eq!(hashed_table_words(rows, None, &sums), unfolded);
        assert_eq!(hashed_table_words(rows, Some(1_000), &sums), unfolded);
        // 2^20 slots (and the reserved one), each with its group, and four
        // folds' words and its key in eight words: more than the table
        // sized to the rows.
        let folding = ((1 << 20) + 1) * 9;
        assert!(folding > unfolded);
        assert_eq!(hashed_table_words(rows, Some(1 << 18), &sums), folding);
        // Five inputs do not fold.
        let five = inputs(5, Reduction::Count);
        assert_eq!(hashed_table_words(rows, Some(1 << 18), &five), unfolded);
    }

    #[test]
    fn tables_are_sized_to_four_to_sixty_four_times_the_estimate_and_never_above_the_rows_own() {
        assert_eq!(sized_table_capacity(0), MIN_SIZED_TABLE_SLOTS);
        assert_eq!(sized_table_capacity(2), MIN_SIZED_TABLE_SLOTS);
        assert_eq!(sized_table_capacity(1 << 6), MIN_SIZED_TABLE_SLOTS);
        // Few groups: sixty-four times, within the spread bound.
        assert_eq!(sized_table_capacity(1 << 8), 1 << 14);
        assert_eq!(sized_table_capacity(1 << 10), 1 << 16);
        assert_eq!(sized_table_capacity(1 << 13), SPREAD_TABLE_SLOTS);
        assert_eq!(sized_table_capacity(1 << 15), SPREAD_TABLE_SLOTS);
        assert_eq!(sized_table_capacity(1 << 17), SPREAD_TABLE_SLOTS);
        // More: four times.
        assert_eq!(sized_table_capacity((1 << 17) + 1), 1 << 20);
        assert_eq!(sized_table_capacity(1 << 18), 1 << 20);
        // The table sized to the rows is the larger where the groups are
        // near the rows: group_on_device keeps it then.
        assert!(sized_table_capacity(1000) > table_capacity(1000));
        assert!(sized_table_capacity(1 << 24) < table_capacity(1 << 28));
    }

    #[test]
    fn fixed_point_sums_are_exact_where_the_terms_are_and_keep_special_values() {
        let sum = |values: &[f64]| -> f64 {
            let scales: Vec<Result<u64, u64>> = values
                .iter()
                .map(|v| fixed_point_scale(v.to_bits()))
                .collect();
            let top = scales.iter().filter_map(|s| s.ok()).max().unwrap_or(0);
            let specials = scales.iter().filter_map(|s| s.err()).fold(0, |a, b| a | b);
            let total: i128 = values
                .iter()
                .filter(|v| v.is_finite())
                .map(|v| fixed_point_term(v.to_bits(), top))
                .sum();
            fixed_sum_to_f64(total, top, specials)
        };
        assert_eq!(sum(&[]).to_bits(), 0f64.to_bits());
        assert_eq!(sum(&[-0.0]).to_bits(), 0f64.to_bits());
        assert_eq!(sum(&[1.5, -0.25, 1024.0]), 1025.25);
        assert_eq!(
            sum(&[f64::MAX, -f64::MAX, 3.0]),
            0.0,
            "3 is below 2^-62 of MAX"
        );
        assert_eq!(sum(&[f64::MAX, f64::MAX]), f64::INFINITY);
        assert_eq!(
            sum(&[f64::MIN_POSITIVE / 8.0, f64::MIN_POSITIVE / 8.0]),
            f64::MIN_POSITIVE / 4.0
        );
        assert_eq!(sum(&[1e-300, 2e-300]), 1e-300 + 2e-300);
        assert_eq!(
            sum(&[0.1; 10]),
            1.0,
            "the exact sum of ten 0.1s rounds to 1.0"
        );
        assert!(sum(&[1.0, f64::NAN]).is_nan());
        assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        assert_eq!(sum(&[f64::NEG_INFINITY, 5.0]), f64::NEG_INFINITY);
        // Any order, the same bits.
        let values: Vec<f64> = (0..1000)
            .map(|i| {
                ((i * 7919) % 1013) as f64
                    * 1.1f64.powi(i % 300 - 150)
                    * if i % 3 == 0 { -1.0 } else { 1.0 }
            })
            .collect();
        let mut reversed = values.clone();
        reversed.reverse();
        assert_eq!(sum(&values).to_bits(), sum(&reversed).to_bits());
        let naive: f64 = values.iter().sum();
        let magnitude: f64 = values.iter().map(|v| v.abs()).sum();
        assert!((sum(&values) - naive).abs() <= 1e-13 * magnitude);
    }

    #[test]
    fn partitions_hold_a_few_hundred_groups() {
        assert_eq!(partition_bits_for_groups(0), 0);
        assert_eq!(partition_bits_for_groups(GROUPS_PER_PARTITION), 0);
        assert_eq!(partition_bits_for_groups(GROUPS_PER_PARTITION + 1), 1);
        assert_eq!(partition_bits_for_groups(1 << 24), 15);
        assert_eq!(partition_bits_for_groups(usize::MAX), 18);
    }

    #[test]
    fn bitmap_sets_one_bit_per_valid_row() {
        let bits = validity_bitmap(130, |i| i % 2 == 0 || i == 129);
        assert_eq!(bits.len(), 3);
        assert_eq!(bits[0], 0x5555_5555_5555_5555);
        assert_eq!(bits[2], 0b11);
    }

    #[test]
    fn reference_groups_in_first_occurrence_order() {
        let keys = [7, 3, 7, 9, 3];
        let bitmaps = vec![validity_bitmap(5, |i| i != 2)];
        let inputs = [
            ReduceInput {
                reduction: Reduction::Count,
                values: Words::default(),
                high_words: Words::default(),
                flip: 0,
                valid: Some(0),
            },
            ReduceInput {
                reduction: Reduction::Sum,
                values: vec![1, 2, 4, 8, 16].into(),
                high_words: Words::default(),
                flip: 0,
                valid: Some(0),
            },
            ReduceInput {
                reduction: Reduction::MaxI128,
                values: vec![5, 0, 9, 1, u64::MAX].into(),
                high_words: vec![1, 0, 1, 0, 0].into(),
                flip: 0,
                valid: None,
            },
        ];
        let grouped = reference::group_by(Some(&keys), 5, &inputs, &bitmaps);
        assert_eq!(grouped.groups, 3);
        assert_eq!(grouped.group_rows, vec![0, 1, 3]);
        assert_eq!(grouped.group_keys, vec![keys[0], keys[1], keys[3]]);
        assert_eq!(grouped.reduced[0].values, vec![1, 2, 1]);
        assert_eq!(grouped.reduced[1].values, vec![1, 18, 8]);
        assert_eq!(grouped.reduced[2].values, vec![9, u64::MAX, 1]);
        assert_eq!(grouped.reduced[2].high_words, vec![1, 0, 0]);
    }

    #[test]
    fn reference_without_keys_has_one_group_even_without_rows() {
        let inputs = [ReduceInput {
            reduction: Reduction::Min,
            values: Words::default(),
            high_words: Words::default(),
            flip: 0,
            valid: None,
        }];
        let grouped = reference::group_by(None, 0, &inputs, &[]);
        assert_eq!(grouped.groups, 1);
        assert_eq!(grouped.reduced[0].values, vec![u64::MAX]);
    }

    #[test]
    fn inputs_of_the_wrong_length_are_refused() {
        let inputs = [ReduceInput {
            reduction: Reduction::Sum,
            values: vec![1].into(),
            high_words: Words::default(),
            flip: 0,
            valid: None,
        }];
        assert!(check_inputs(None, 2, &inputs, &[]).is_err());
        assert!(check_inputs(Some(&vec![1].into()), 2, &[], &[]).is_err());
        assert!(check_inputs(None, 1, &inputs, &[]).is_ok());
    }
}
