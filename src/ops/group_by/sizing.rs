//! How large a group-by's tables and partitions are, from the sample's
//! estimate of its groups, and the device memory it needs.

use super::*;

/// Groups a partition of [`GroupIds::Partitioned`] is planned to hold on
/// average: a third of [`launch::PARTITION_GROUP_LIMIT`], so an estimate of
/// the groups three times too low still fits.
pub const GROUPS_PER_PARTITION: usize = 512;
const _: () = assert!(3 * GROUPS_PER_PARTITION <= launch::PARTITION_GROUP_LIMIT);

/// Hash bits that split `groups` (an estimate) into partitions of
/// [`GROUPS_PER_PARTITION`] groups on average, at most
/// [`crate::ops::radix::MAX_PARTITION_BITS`].
pub fn partition_bits_for_groups(groups: usize) -> u32 {
    let partitions = groups.div_ceil(GROUPS_PER_PARTITION).max(1);
    (usize::BITS - (partitions - 1).leading_zeros()).min(crate::ops::radix::MAX_PARTITION_BITS)
}

/// Hash-table slots for `rows` keys: a power of two, at least twice the rows.
pub(super) fn table_capacity(rows: usize) -> u64 {
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
/// the table is small, its atomics crowding few lines: a table spread over
/// more slots folds faster while it stays in L2 (`BENCHMARKS.md` has the
/// measurements). 2^19 slots of two folds' words and their keys, 16 MiB,
/// stay in L2.
pub(super) const SPREAD_TABLE_SLOTS: u64 = 1 << 19;

/// The fewest slots of a table sized from an estimate of the groups.
pub const MIN_SIZED_TABLE_SLOTS: u64 = 1 << 12;

/// Words of the hash table that numbers `rows` rows and of what it leaves
/// per row, for [`group_by_device_bytes`]: a table sized to the rows and
/// every row's group, or, where a table sized from `expected_groups` may
/// fold the inputs ([`table_fold_capacity`]), that table with its folds'
/// words beside each slot's key and group, whichever is larger (a folding
/// table that fills up is freed before the rows are numbered again).
pub(super) fn hashed_table_words(
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
pub(super) fn unfolded_table_words(rows: usize) -> usize {
    2 * (table_capacity(rows) as usize + 1) + rows
}

/// Words of a folding table of `capacity` slots and the reserved one, each
/// with its group, and its key and the words of `folds` folds.
pub(super) fn folding_table_words(capacity: u64, folds: usize) -> usize {
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
    // Groups put in the order of their first rows (`first_seen`), as many
    // as rows at most: their first rows and numbers with the sort's second
    // pair of buffers and largest histogram, and their ranks.
    let first_seen = || {
        let histogram =
            RadixGrid::new(rows as u64, sm_count).blocks as usize * (1 << launch::MAX_RADIX_BITS);
        8 * (6 * rows + histogram + histogram.div_ceil(launch::SCAN_TILE) * 2)
    };
    let table = match (with_keys, ids) {
        (false, _) => 0,
        // keys, first rows, the key word of each group, and the table
        (true, GroupIds::Hashed { expected_groups }) => {
            8 * (3 * rows + 1 + hashed_table_words(rows, expected_groups, inputs)) + first_seen()
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
                + first_seen()
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

#[cfg(any(test, feature = "test-support"))]
/// Words of the pinned buffer each window of [`DeviceGrouped::download`]
/// takes (32 MiB).
pub const DOWNLOAD_WINDOW_WORDS: usize = 1 << 22;
