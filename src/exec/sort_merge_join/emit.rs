//! The rows a sort-merge join emits, in `SortMergeJoinExec`'s order: the
//! streamed side (left, or right for the Right join types) in key order,
//! each row with its matches in the other side's key order; an outer join's
//! unmatched streamed rows in their place; a Full join's unmatched rows of
//! the other side after all of them.
//!
//! Matches arrive as pairs ordered by streamed position (a position is a
//! row's rank in key order), range by range, already narrowed by the
//! residual filter. A streamed row's fate (matched or not) is known once the
//! pairs move past it, so the walk emits rows as soon as it can and never
//! holds more than one range.

use datafusion::arrow::array::{Array, BooleanArray, UInt64Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::common::JoinType;

use crate::exec::join::{emits_pairs, OutputRows, SideRows};

/// What a join type does with a streamed row and whether it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alone {
    /// Nothing more than its pairs (Inner).
    Nothing,
    /// The row with NULLs for the other side when unmatched (outer joins).
    NullPaddedIfUnmatched,
    /// The row alone when matched (semi).
    IfMatched,
    /// The row alone when unmatched (anti).
    IfUnmatched,
    /// The row with whether it matched (mark).
    WithMark,
}

/// Which side is streamed for a join type: the Right join types stream the
/// right side, as `SortMergeJoinExec` does.
pub(crate) fn streams_left(join_type: JoinType) -> bool {
    !matches!(
        join_type,
        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
    )
}

/// Whether the output needs every pair (or only whether each streamed row
/// matched, which the match counts tell without a filter).
pub(crate) fn needs_pairs(join_type: JoinType, has_filter: bool) -> bool {
    has_filter || emits_pairs(join_type)
}

/// The walk over one partition's streamed rows.
#[derive(Debug)]
pub(crate) struct StreamedWalk {
    join_type: JoinType,
    alone: Alone,
    streams_left: bool,
    /// Input row of each streamed position (`None`: the identity).
    streamed_rows: Option<Vec<u64>>,
    rows: usize,
    /// Next position whose fate is not settled.
    next: usize,
    /// Whether position `next` has a kept pair so far.
    next_matched: bool,
    /// Full join: which rows of the other side matched.
    other_matched: Option<Vec<bool>>,
}

/// Row ids of one side, some of them NULL (the side's columns are then
/// NULL in that row); the validity is kept only once a NULL comes.
#[derive(Debug, Default)]
struct IdsBuilder {
    values: Vec<u64>,
    valid: Option<Vec<bool>>,
}

impl IdsBuilder {
    fn push(&mut self, id: Option<u64>) {
        match id {
            Some(id) => {
                self.values.push(id);
                if let Some(valid) = self.valid.as_mut() {
                    valid.push(true);
                }
            }
            None => {
                let rows = self.values.len();
                self.valid
                    .get_or_insert_with(|| vec![true; rows])
                    .push(false);
                self.values.push(0);
            }
        }
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    fn finish(self) -> UInt64Array {
        UInt64Array::new(self.values.into(), self.valid.map(NullBuffer::from))
    }
}

/// Rows collected from the walk, turned into [`OutputRows`] by [`StreamedWalk::finish`].
#[derive(Debug, Default)]
struct RowsBuilder {
    streamed: IdsBuilder,
    other: IdsBuilder,
    mark: Vec<bool>,
}

impl StreamedWalk {
    /// A walk over `rows` streamed rows, whose input rows in key order are
    /// `streamed_rows` (`None` when they arrived in key order), joined
    /// against `other_rows` rows.
    pub(crate) fn new(
        join_type: JoinType,
        rows: usize,
        streamed_rows: Option<Vec<u64>>,
        other_rows: usize,
    ) -> Self {
        let alone = match join_type {
            JoinType::Inner => Alone::Nothing,
            JoinType::Left | JoinType::Right | JoinType::Full => Alone::NullPaddedIfUnmatched,
            JoinType::LeftSemi | JoinType::RightSemi => Alone::IfMatched,
            JoinType::LeftAnti | JoinType::RightAnti => Alone::IfUnmatched,
            JoinType::LeftMark | JoinType::RightMark => Alone::WithMark,
        };
        Self {
            join_type,
            alone,
            streams_left: streams_left(join_type),
            streamed_rows,
            rows,
            next: 0,
            next_matched: false,
            other_matched: (join_type == JoinType::Full).then(|| vec![false; other_rows]),
        }
    }

    /// The input row of the streamed row at `position` in key order.
    pub(crate) fn input_row(&self, position: usize) -> u64 {
        match &self.streamed_rows {
            Some(rows) => rows[position],
            None => position as u64,
        }
    }

    /// Settles position `next` (matched or not) and moves past it.
    fn settle_next(&mut self, out: &mut RowsBuilder) {
        let row = Some(self.input_row(self.next));
        // Only an outer join's rows carry the other side (NULL here); the
        // semi, anti and mark joins emit the streamed side alone.
        match (self.alone, self.next_matched) {
            (Alone::NullPaddedIfUnmatched, false) => {
                out.streamed.push(row);
                out.other.push(None);
            }
            (Alone::IfUnmatched, false) | (Alone::IfMatched, true) => out.streamed.push(row),
            (Alone::WithMark, matched) => {
                out.streamed.push(row);
                out.mark.push(matched);
            }
            _ => {}
        }
        self.next += 1;
        self.next_matched = false;
    }

    /// The output rows of one range of pairs: `positions` (streamed, in key
    /// order, non-decreasing across every call) and the other side's input
    /// rows, of which those with `keep[k]` false failed the filter.
    pub(crate) fn pairs(
        &mut self,
        positions: &[u64],
        other_rows: &[u64],
        keep: Option<&BooleanArray>,
    ) -> OutputRows {
        let mut out = RowsBuilder::default();
        let pairs = emits_pairs(self.join_type);
        for (k, (&position, &other)) in positions.iter().zip(other_rows).enumerate() {
            let position = position as usize;
            while self.next < position {
                self.settle_next(&mut out);
            }
            // `filter` semantics: a NULL filter value drops the pair.
            if keep.is_some_and(|keep| !keep.is_valid(k) || !keep.value(k)) {
                continue;
            }
            self.next_matched = true;
            if let Some(matched) = self.other_matched.as_mut() {
                matched[other as usize] = true;
            }
            if pairs {
                out.streamed.push(Some(self.input_row(position)));
                out.other.push(Some(other));
            }
        }
        self.finish(out)
    }

    /// The rows of every streamed row whose match count is known (no filter,
    /// a join type that emits no pairs): `counts[i]` matches at position i.
    pub(crate) fn counts(&mut self, counts: &[u64]) -> OutputRows {
        let mut out = RowsBuilder::default();
        for &count in counts {
            self.next_matched = count > 0;
            self.settle_next(&mut out);
        }
        self.finish(out)
    }

    /// The rows left after the last range: unsettled streamed rows, then,
    /// for a Full join, the unmatched rows of the other side in
    /// `other_in_key_order`.
    pub(crate) fn end(&mut self, other_in_key_order: Option<&[u64]>) -> OutputRows {
        let mut out = RowsBuilder::default();
        while self.next < self.rows {
            self.settle_next(&mut out);
        }
        if let Some(matched) = self.other_matched.take() {
            let unmatched = |row: &u64| !matched[*row as usize];
            let mut push = |row: u64| {
                out.streamed.push(None);
                out.other.push(Some(row));
            };
            match other_in_key_order {
                Some(order) => order.iter().copied().filter(unmatched).for_each(&mut push),
                None => (0..matched.len() as u64)
                    .filter(unmatched)
                    .for_each(&mut push),
            }
        }
        self.finish(out)
    }

    fn finish(&self, out: RowsBuilder) -> OutputRows {
        let len = out.streamed.len();
        let mark = (self.alone == Alone::WithMark).then(|| BooleanArray::from(out.mark));
        let streamed = SideRows::Ids(out.streamed.finish());
        let other = if emits_pairs(self.join_type) {
            SideRows::Ids(out.other.finish())
        } else {
            SideRows::Null
        };
        let (build, probe) = if self.streams_left {
            (streamed, other)
        } else {
            (other, streamed)
        };
        OutputRows {
            len,
            build,
            probe,
            mark,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(side: &SideRows) -> Vec<Option<u64>> {
        match side {
            SideRows::Ids(ids) => ids.iter().collect(),
            SideRows::Null => vec![],
        }
    }

    #[test]
    fn left_join_puts_unmatched_rows_in_their_place() {
        // Streamed positions 0..4 are input rows 3, 0, 2, 1.
        let mut walk = StreamedWalk::new(JoinType::Left, 4, Some(vec![3, 0, 2, 1]), 5);
        let first = walk.pairs(&[1, 1], &[7, 8], None);
        assert_eq!(ids(&first.build), vec![Some(3), Some(0), Some(0)]);
        assert_eq!(ids(&first.probe), vec![None, Some(7), Some(8)]);
        // Position 2's only pair fails the filter: it is unmatched.
        let keep = BooleanArray::from(vec![false, true]);
        let second = walk.pairs(&[2, 3], &[4, 4], Some(&keep));
        assert_eq!(ids(&second.build), vec![Some(2), Some(1)]);
        assert_eq!(ids(&second.probe), vec![None, Some(4)]);
        assert_eq!(walk.end(None).len, 0);
    }

    #[test]
    fn right_joins_stream_the_right_side() {
        let mut walk = StreamedWalk::new(JoinType::RightAnti, 3, None, 2);
        let rows = walk.pairs(&[1], &[0], None);
        assert_eq!(ids(&rows.probe), vec![Some(0)]);
        assert!(matches!(rows.build, SideRows::Null));
        assert_eq!(ids(&walk.end(None).probe), vec![Some(2)]);
    }

    #[test]
    fn full_join_adds_the_unmatched_other_rows_at_the_end() {
        let mut walk = StreamedWalk::new(JoinType::Full, 2, None, 3);
        let rows = walk.pairs(&[0], &[2], None);
        assert_eq!(ids(&rows.build), vec![Some(0)]);
        let end = walk.end(Some(&[2, 1, 0]));
        assert_eq!(ids(&end.build), vec![Some(1), None, None]);
        assert_eq!(ids(&end.probe), vec![None, Some(1), Some(0)]);
    }

    #[test]
    fn semi_anti_and_mark_from_counts() {
        for (join_type, expected, mark) in [
            (JoinType::LeftSemi, vec![Some(1)], None),
            (JoinType::LeftAnti, vec![Some(0), Some(2)], None),
            (
                JoinType::LeftMark,
                vec![Some(0), Some(1), Some(2)],
                Some(vec![false, true, false]),
            ),
        ] {
            let mut walk = StreamedWalk::new(join_type, 3, None, 1);
            let mut rows = walk.counts(&[0, 2, 0]);
            assert_eq!(ids(&rows.build), expected, "{join_type}");
            let mark_values = rows
                .mark
                .take()
                .map(|m| m.iter().map(|v| v.unwrap()).collect());
            assert_eq!(mark_values, mark, "{join_type}");
            assert_eq!(walk.end(None).len, 0);
        }
    }

    #[test]
    fn pairs_or_counts_by_join_type() {
        assert!(needs_pairs(JoinType::Inner, false));
        assert!(!needs_pairs(JoinType::LeftSemi, false));
        assert!(needs_pairs(JoinType::LeftSemi, true));
        assert!(!streams_left(JoinType::Right) && streams_left(JoinType::Full));
    }
}
