//! Which aggregates' results come back in which pass.
//!
//! Where the device makes its reductions one after the other, each once its
//! input has crossed the bus (not folded into the numbering table), the
//! first inputs' results are ready while the last inputs still cross. An
//! aggregate whose columns are made from early reductions alone can then be
//! brought back, and its output columns built, in a pass of its own while
//! the device still works, rather than in the last pass, after everything,
//! when the host's work on the results is all that is left of the query.

use std::ops::Range;

/// One pass over the results: the aggregates whose output columns it
/// builds and the reductions it brings back for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResultPass {
    /// Indexes of the aggregates, in order.
    pub(crate) aggregates: Vec<usize>,
    /// The reductions brought back: every reduction these aggregates read
    /// lies in it. The pass can start once the last of them is made.
    pub(crate) reductions: Range<usize>,
}

/// The passes over the results of aggregates that read the reductions
/// `reductions_of[i]` (aggregate `i`'s, in any order) of `reductions` made
/// in index order: one pass per last reduction read, in the order they are
/// made, the last pass holding the aggregates that wait longest (and those
/// that read none). A pass brings back the range from the first reduction
/// any of its aggregates reads to its last, so a reduction read by
/// aggregates of two passes (a shared count) crosses the bus twice.
pub(crate) fn result_passes(reductions_of: &[Vec<usize>], reductions: usize) -> Vec<ResultPass> {
    // Per aggregate, the reductions it reads, as a range; None where it
    // reads none (it waits for the last pass).
    let ranges: Vec<Option<Range<usize>>> = reductions_of
        .iter()
        .map(|read| {
            let first = read.iter().min()?;
            let last = read.iter().max()?;
            Some(*first..last + 1)
        })
        .collect();
    let last_reduction = |range: &Option<Range<usize>>| match range {
        Some(range) => range.end,
        None => reductions,
    };
    let mut ends: Vec<usize> = ranges.iter().map(last_reduction).collect();
    ends.sort_unstable();
    ends.dedup();
    ends.into_iter()
        .map(|end| {
            let aggregates: Vec<usize> = (0..ranges.len())
                .filter(|&i| last_reduction(&ranges[i]) == end)
                .collect();
            let first = aggregates
                .iter()
                .filter_map(|&i| ranges[i].as_ref().map(|range| range.start))
                .min()
                .unwrap_or(end);
            ResultPass {
                aggregates,
                reductions: first..end,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(aggregates: &[usize], reductions: Range<usize>) -> ResultPass {
        ResultPass {
            aggregates: aggregates.to_vec(),
            reductions,
        }
    }

    #[test]
    fn each_aggregate_comes_back_once_the_last_reduction_it_reads_is_made() {
        // MAX(a), MAX(b): a pass each.
        assert_eq!(
            result_passes(&[vec![0], vec![1]], 2),
            vec![pass(&[0], 0..1), pass(&[1], 1..2)]
        );
        // Made in index order, whatever the aggregates' order.
        assert_eq!(
            result_passes(&[vec![2], vec![0], vec![1]], 3),
            vec![pass(&[1], 0..1), pass(&[2], 1..2), pass(&[0], 2..3)]
        );
        // AVG(a) (a count and a sum), then MAX(b), then SUM(a) sharing
        // AVG's count: AVG and SUM wait for the sum, MAX(b) for b.
        assert_eq!(
            result_passes(&[vec![1, 0], vec![2], vec![0, 3]], 4),
            vec![pass(&[0], 0..2), pass(&[1], 2..3), pass(&[2], 0..4)]
        );
        // Two aggregates of one reduction share its pass.
        assert_eq!(
            result_passes(&[vec![0], vec![0], vec![1]], 2),
            vec![pass(&[0, 1], 0..1), pass(&[2], 1..2)]
        );
    }

    #[test]
    fn aggregates_that_read_no_reduction_wait_for_the_last_pass() {
        assert_eq!(
            result_passes(&[vec![], vec![0]], 1),
            vec![pass(&[0, 1], 0..1)]
        );
        assert_eq!(result_passes(&[vec![]], 0), vec![pass(&[0], 0..0)]);
        // No aggregate at all (the keys alone): no pass to make.
        assert_eq!(result_passes(&[], 0), Vec::new());
    }
}
