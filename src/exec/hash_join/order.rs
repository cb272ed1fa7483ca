//! Putting a chunk's matches in the order `HashJoinExec` emits them: by probe
//! row, then by the build rows' arrival order, with the unmatched probe rows
//! of outer joins interleaved (when the probe side is ordered) or after each
//! probe batch's matches (when it is not).
//!
//! `HashJoinExec` concatenates its build batches last to first (so its row
//! ids, and the order of the build rows it emits at the end, run that way),
//! but its hash chains give each probe row its matches in arrival order.
//! [`ArrivalOrder`] maps one to the other.

use datafusion::arrow::array::UInt64Array;
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer, ScalarBuffer};

/// Where each row of the build batch arrived among the build rows. The
/// build batch holds the arrived batches last to first, as `HashJoinExec`
/// concatenates them, or in another order (see [`Self::held_in`]).
#[derive(Debug, Clone)]
pub(crate) struct ArrivalOrder {
    /// Start row, in the build batch, of each arrived batch, in the order
    /// the build batch holds them.
    starts: Vec<u64>,
    /// Arrival position of each of those batches' first row.
    arrived_at: Vec<u64>,
}

impl ArrivalOrder {
    /// For batches of `sizes` rows, in arrival order, held last to first.
    #[cfg(test)]
    pub(crate) fn new(sizes: &[usize]) -> Self {
        let held: Vec<usize> = (0..sizes.len()).rev().collect();
        Self::held_in(sizes, &held)
    }

    /// For batches of `sizes` rows, in arrival order, held in the order
    /// `held`: the arrival index of each batch the build batch holds, first
    /// to last (a permutation of `0..sizes.len()`).
    pub(crate) fn held_in(sizes: &[usize], held: &[usize]) -> Self {
        let mut arrived = 0u64;
        let first_arrived: Vec<u64> = sizes
            .iter()
            .map(|&n| {
                let at = arrived;
                arrived += n as u64;
                at
            })
            .collect();
        let mut starts = Vec::with_capacity(held.len());
        let mut start = 0u64;
        for &batch in held {
            starts.push(start);
            start += sizes[batch] as u64;
        }
        Self {
            starts,
            arrived_at: held.iter().map(|&batch| first_arrived[batch]).collect(),
        }
    }

    /// The arrival position of build row `row`.
    pub(crate) fn position(&self, row: u64) -> u64 {
        let block = self.starts.partition_point(|&s| s <= row) - 1;
        self.arrived_at[block] + (row - self.starts[block])
    }

    /// The arrival position of each of the `rows` build rows, or `None`
    /// where it is the row itself (rows arrived in one batch).
    pub(crate) fn positions(&self, rows: u64) -> Option<Vec<u64>> {
        let ends = self.starts.iter().skip(1).copied().chain([rows]);
        let blocks: Vec<(u64, u64, u64)> = self
            .starts
            .iter()
            .zip(ends)
            .zip(&self.arrived_at)
            .map(|((&start, end), &at)| (start, end, at))
            .filter(|&(start, end, _)| end > start)
            .collect();
        if blocks.len() <= 1 {
            return None;
        }
        let mut positions = Vec::with_capacity(rows as usize);
        for (start, end, at) in blocks {
            positions.extend(at..at + (end - start));
        }
        Some(positions)
    }
}

/// Sorts the pairs by probe row, then by the build rows' arrival order: a
/// counting sort on the probe row (`probe_rows` rows), then a sort of each
/// probe row's (usually few) build rows.
pub(crate) fn sort_by_probe_row(
    build_ids: &[u64],
    probe_ids: &[u64],
    probe_rows: usize,
    arrival: &ArrivalOrder,
) -> (Vec<u64>, Vec<u64>) {
    let mut starts = vec![0usize; probe_rows + 1];
    for &p in probe_ids {
        starts[p as usize + 1] += 1;
    }
    for i in 0..probe_rows {
        starts[i + 1] += starts[i];
    }
    let mut next = starts.clone();
    let mut sorted_build = vec![0u64; build_ids.len()];
    for (&b, &p) in build_ids.iter().zip(probe_ids) {
        let slot = &mut next[p as usize];
        sorted_build[*slot] = b;
        *slot += 1;
    }
    let mut sorted_probe = Vec::with_capacity(probe_ids.len());
    for p in 0..probe_rows {
        let (start, end) = (starts[p], starts[p + 1]);
        if end - start > 1 {
            sorted_build[start..end].sort_unstable_by_key(|&b| arrival.position(b));
        }
        sorted_probe.extend(std::iter::repeat_n(p as u64, end - start));
    }
    (sorted_build, sorted_probe)
}

/// Rows of a Right or Full join for one chunk: the sorted matched pairs plus
/// one row per unmatched probe row (its build id NULL). `batch_ends` are the
/// ends of the probe batches the chunk was made of; `interleave` puts each
/// unmatched row at its probe position, otherwise after its batch's matches.
pub(crate) fn with_unmatched_probe_rows(
    build_ids: &[u64],
    probe_ids: &[u64],
    matched: &BooleanBuffer,
    batch_ends: &[usize],
    interleave: bool,
) -> (UInt64Array, UInt64Array) {
    let unmatched = matched.len() - matched.count_set_bits();
    let total = build_ids.len() + unmatched;
    let mut build = Vec::with_capacity(total);
    let mut valid = Vec::with_capacity(total);
    let mut probe = Vec::with_capacity(total);
    let mut pair = 0;
    let mut batch_start = 0;
    for &batch_end in batch_ends {
        let mut pending = Vec::new();
        for row in batch_start..batch_end {
            while pair < probe_ids.len() && probe_ids[pair] as usize == row {
                build.push(build_ids[pair]);
                valid.push(true);
                probe.push(row as u64);
                pair += 1;
            }
            if !matched.value(row) {
                if interleave {
                    build.push(0);
                    valid.push(false);
                    probe.push(row as u64);
                } else {
                    pending.push(row as u64);
                }
            }
        }
        for row in pending {
            build.push(0);
            valid.push(false);
            probe.push(row);
        }
        batch_start = batch_end;
    }
    debug_assert_eq!(pair, probe_ids.len());
    let nulls = NullBuffer::from(valid);
    (
        UInt64Array::new(ScalarBuffer::from(build), Some(nulls)),
        UInt64Array::from(probe),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[test]
    fn pairs_sort_by_probe_row_then_build_arrival() {
        // One build batch: arrival order is row order.
        let one = ArrivalOrder::new(&[10]);
        let (b, p) = sort_by_probe_row(&[7, 3, 5, 1, 9], &[2, 0, 2, 2, 0], 3, &one);
        assert_eq!(p, vec![0, 0, 2, 2, 2]);
        assert_eq!(b, vec![3, 9, 1, 5, 7]);
    }

    #[test]
    fn arrival_positions_undo_the_reversed_concatenation() {
        // Batches of 2, 3 and 1 rows arrived in that order; the build batch
        // holds them last to first: [c0, b0, b1, b2, a0, a1].
        let order = ArrivalOrder::new(&[2, 3, 1]);
        let positions: Vec<u64> = (0..6).map(|r| order.position(r)).collect();
        assert_eq!(positions, vec![5, 2, 3, 4, 0, 1]);
        let (b, _) = sort_by_probe_row(&[0, 4, 2, 5], &[0, 0, 0, 0], 1, &order);
        assert_eq!(b, vec![4, 5, 2, 0]);
        assert_eq!(order.positions(6), Some(positions));
    }

    #[test]
    fn arrival_positions_of_batches_held_in_any_order() {
        // Batches of 2, 3 and 1 rows arrived in that order; the build batch
        // holds them as [b0, b1, b2, c0, a0, a1].
        let order = ArrivalOrder::held_in(&[2, 3, 1], &[1, 2, 0]);
        let positions: Vec<u64> = (0..6).map(|r| order.position(r)).collect();
        assert_eq!(positions, vec![2, 3, 4, 5, 0, 1]);
        assert_eq!(order.positions(6), Some(positions));
        // Matches of one probe row leave in arrival order: a1, b2, c0.
        let (b, _) = sort_by_probe_row(&[3, 5, 2], &[0, 0, 0], 1, &order);
        assert_eq!(b, vec![5, 2, 3]);
        // Held in arrival order with empty batches: the rows themselves.
        let order = ArrivalOrder::held_in(&[0, 2, 0, 1], &[0, 1, 2, 3]);
        assert_eq!(
            (0..3).map(|r| order.position(r)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }

    #[test]
    fn positions_of_one_batch_are_the_rows_themselves() {
        assert_eq!(ArrivalOrder::new(&[4]).positions(4), None);
        assert_eq!(ArrivalOrder::new(&[]).positions(0), None);
        // Empty batches around one full batch change nothing.
        assert_eq!(ArrivalOrder::new(&[0, 4, 0]).positions(4), None);
        let order = ArrivalOrder::new(&[0, 2, 0, 1]);
        assert_eq!(
            order.positions(3),
            Some((0..3).map(|r| order.position(r)).collect())
        );
    }

    #[test]
    fn unmatched_rows_go_in_place_or_after_their_batch() {
        // Probe rows 0..5 in batches [0, 3) and [3, 5); rows 1 and 3 unmatched.
        let matched = BooleanBuffer::from(vec![true, false, true, false, true]);
        let (b, p) = with_unmatched_probe_rows(&[10, 11, 12], &[0, 2, 4], &matched, &[3, 5], true);
        assert_eq!(p.values().to_vec(), vec![0, 1, 2, 3, 4]);
        assert_eq!(
            (0..5).map(|i| b.is_valid(i)).collect::<Vec<_>>(),
            vec![true, false, true, false, true]
        );
        let (b, p) = with_unmatched_probe_rows(&[10, 11, 12], &[0, 2, 4], &matched, &[3, 5], false);
        assert_eq!(p.values().to_vec(), vec![0, 2, 1, 4, 3]);
        assert_eq!(b.value(1), 11);
        assert!(b.is_null(2) && b.is_null(4));
    }
}
