//! What each join type does with matches: which side's matched rows are
//! remembered, and which rows it emits per probe chunk and at the end.

use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{BooleanArray, UInt64Array};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::common::JoinType;

/// Whether matched (build, probe) pairs are output rows.
pub(crate) fn emits_pairs(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
    )
}

/// Whether the join's output rows are exactly its pairs, so columns can be
/// gathered by pair.
pub(crate) fn gathers_by_pair(join_type: JoinType, has_filter: bool) -> bool {
    join_type == JoinType::Inner && !has_filter
}

/// Whether each probe chunk must remember which of its rows matched.
pub(crate) fn tracks_probe_matches(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Right
            | JoinType::Full
            | JoinType::RightSemi
            | JoinType::RightAnti
            | JoinType::RightMark
    )
}

/// Whether the build side must remember which of its rows matched, to emit
/// rows after every probe partition has finished.
pub(crate) fn tracks_build_matches(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Left
            | JoinType::Full
            | JoinType::LeftSemi
            | JoinType::LeftAnti
            | JoinType::LeftMark
    )
}

/// Which rows of a side, given which of them matched, a join type emits
/// alone (without a partner): `(ids, mark)`.
pub(crate) fn rows_emitted_alone(
    join_type: JoinType,
    matched: &BooleanBuffer,
) -> (UInt64Array, Option<BooleanArray>) {
    let select = |want: bool| -> UInt64Array {
        matched
            .iter()
            .enumerate()
            .filter_map(|(i, m)| (m == want).then_some(i as u64))
            .collect()
    };
    match join_type {
        JoinType::LeftSemi | JoinType::RightSemi => (select(true), None),
        JoinType::LeftMark | JoinType::RightMark => (
            (0..matched.len() as u64).collect(),
            Some(BooleanArray::new(matched.clone(), None)),
        ),
        // Left, Right, Full, LeftAnti, RightAnti: the unmatched rows.
        _ => (select(false), None),
    }
}

/// A bitmap that concurrent probe partitions set bits in without a lock.
#[derive(Debug)]
pub(crate) struct VisitedRows {
    words: Vec<AtomicU64>,
    len: usize,
}

impl VisitedRows {
    pub(crate) fn new(len: usize) -> Self {
        Self {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Marks the rows `ids`, which must be below `len`.
    pub(crate) fn mark(&self, ids: &[u64]) {
        for &id in ids {
            debug_assert!((id as usize) < self.len);
            // Relaxed: the bits are read only after every partition has
            // finished, which the completion counter orders.
            self.words[(id / 64) as usize].fetch_or(1 << (id % 64), Ordering::Relaxed);
        }
    }

    /// The bitmap as it stands.
    pub(crate) fn snapshot(&self) -> BooleanBuffer {
        BooleanBuffer::collect_bool(self.len, |i| {
            self.words[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_join_type_has_one_role() {
        use JoinType::*;
        for join_type in [
            Inner, Left, Right, Full, LeftSemi, RightSemi, LeftAnti, RightAnti, LeftMark, RightMark,
        ] {
            // Every join type emits something from matches.
            assert!(
                emits_pairs(join_type)
                    || tracks_probe_matches(join_type)
                    || tracks_build_matches(join_type),
                "{join_type}"
            );
        }
        assert!(tracks_build_matches(Full) && tracks_probe_matches(Full));
        assert!(!tracks_build_matches(Inner) && !tracks_probe_matches(Inner));
    }

    #[test]
    fn visited_rows_survive_concurrent_marking() {
        let visited = std::sync::Arc::new(VisitedRows::new(130));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let visited = std::sync::Arc::clone(&visited);
                std::thread::spawn(move || {
                    let ids: Vec<u64> = (0..130).filter(|i| i % 4 == t && i % 3 == 0).collect();
                    visited.mark(&ids);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let bits = visited.snapshot();
        for i in 0..130 {
            assert_eq!(bits.value(i), i % 3 == 0, "row {i}");
        }
    }

    #[test]
    fn rows_emitted_alone_follow_the_join_type() {
        let matched = BooleanBuffer::from(vec![true, false, true]);
        let (ids, mark) = rows_emitted_alone(JoinType::LeftAnti, &matched);
        assert_eq!((ids.values().to_vec(), mark), (vec![1], None));
        let (ids, _) = rows_emitted_alone(JoinType::RightSemi, &matched);
        assert_eq!(ids.values().to_vec(), vec![0, 2]);
        let (ids, mark) = rows_emitted_alone(JoinType::LeftMark, &matched);
        assert_eq!(ids.values().to_vec(), vec![0, 1, 2]);
        assert_eq!(mark, Some(BooleanArray::from(vec![true, false, true])));
        let (ids, _) = rows_emitted_alone(JoinType::Full, &matched);
        assert_eq!(ids.values().to_vec(), vec![1]);
    }
}
