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

use datafusion::arrow::array::ArrayRef;

use crate::ops::group_by::GroupedWindow;

/// One pass over the results: the aggregates whose output columns it
/// builds and the reductions it brings back for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResultPass {
    /// Indexes of the aggregates, in order.
    pub(crate) aggregates: Vec<usize>,
    /// The reductions brought back, in order: every reduction these
    /// aggregates read, and no other pass's. The pass can start once the
    /// last of them is made.
    pub(crate) reductions: Vec<usize>,
}

/// The passes over the results of aggregates that read the reductions
/// `reductions_of[i]` (aggregate `i`'s, in any order) of `reductions` made
/// in index order, in the order they can start: at first one per last
/// reduction read, the last pass holding the aggregates that wait longest
/// (and those that read none). A pass that shares a reduction with a later
/// one (a count shared by aggregates over one column) is merged into it,
/// so that every reduction crosses the bus once.
pub(crate) fn result_passes(reductions_of: &[Vec<usize>], reductions: usize) -> Vec<ResultPass> {
    // Per aggregate, the pass it waits for: its last reduction's, or the
    // last pass where it reads none.
    let last_read = |read: &Vec<usize>| read.iter().max().map_or(reductions, |last| last + 1);
    let mut ends: Vec<usize> = reductions_of.iter().map(last_read).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut passes: Vec<ResultPass> = ends
        .into_iter()
        .map(|end| {
            let aggregates: Vec<usize> = (0..reductions_of.len())
                .filter(|&i| last_read(&reductions_of[i]) == end)
                .collect();
            let mut read: Vec<usize> = aggregates
                .iter()
                .flat_map(|&i| reductions_of[i].iter().copied())
                .collect();
            read.sort_unstable();
            read.dedup();
            ResultPass {
                aggregates,
                reductions: read,
            }
        })
        .collect();
    // From the last pass back: a pass that shares a reduction with any
    // later one takes the passes after it in until it shares none. The
    // stack's top is the pass right after the one at hand.
    let shares = |pass: &ResultPass, later: &ResultPass| {
        pass.reductions
            .iter()
            .any(|r| later.reductions.binary_search(r).is_ok())
    };
    let mut merged: Vec<ResultPass> = Vec::with_capacity(passes.len());
    while let Some(mut pass) = passes.pop() {
        while merged.iter().any(|later| shares(&pass, later)) {
            let Some(mut next) = merged.pop() else { break };
            pass.aggregates.append(&mut next.aggregates);
            pass.reductions.append(&mut next.reductions);
        }
        // Sorted once merged: `shares` searches a later pass's reductions.
        pass.aggregates.sort_unstable();
        pass.reductions.sort_unstable();
        pass.reductions.dedup();
        merged.push(pass);
    }
    merged.reverse();
    merged
}

/// Groups per task of a pass over the results: whole output batches of
/// `batch_size` groups, about a window's share of each of `threads`
/// threads (`window` groups, or `groups` where fewer). A task per batch
/// cost each batch a turn at the tasks' lock and its wake-ups, which bound
/// the pass where a batch's own work was short (one column).
pub(crate) fn task_groups(
    window: usize,
    groups: usize,
    batch_size: usize,
    threads: usize,
) -> usize {
    let size = batch_size.max(1);
    let batches = window.min(groups.max(1).next_multiple_of(size)) / size;
    (batches / threads.max(1)).max(1) * size
}

/// The output batches a task's groups `groups` (of `window`'s own, whole
/// batches of `batch_size` groups but the last) cover: each batch's index
/// among all, and its groups among the window's.
pub(crate) fn batches_of(
    window: &GroupedWindow<'_>,
    groups: Range<usize>,
    batch_size: usize,
) -> impl Iterator<Item = (usize, Range<usize>)> {
    let size = batch_size.max(1);
    let first = window.groups.start;
    (groups.start..groups.end).step_by(size).map(move |start| {
        (
            (first + start) / size,
            start..(start + size).min(groups.end),
        )
    })
}

/// The output columns of aggregates brought back before the last pass:
/// per output batch, per aggregate, its columns where made.
#[derive(Default)]
pub(crate) struct EarlyColumns {
    pub(crate) by_batch: Vec<Vec<Option<Vec<ArrayRef>>>>,
    /// Aggregates whose columns are here.
    pub(crate) aggregates: usize,
}

impl EarlyColumns {
    /// What of output batch `batch` is made (nothing where no aggregate
    /// came back early).
    pub(crate) fn of_batch(&self, batch: usize) -> &[Option<Vec<ArrayRef>>] {
        self.by_batch.get(batch).map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(aggregates: &[usize], reductions: &[usize]) -> ResultPass {
        ResultPass {
            aggregates: aggregates.to_vec(),
            reductions: reductions.to_vec(),
        }
    }

    #[test]
    fn each_aggregate_comes_back_once_the_last_reduction_it_reads_is_made() {
        // MAX(a), MAX(b): a pass each.
        assert_eq!(
            result_passes(&[vec![0], vec![1]], 2),
            vec![pass(&[0], &[0]), pass(&[1], &[1])]
        );
        // Made in index order, whatever the aggregates' order.
        assert_eq!(
            result_passes(&[vec![2], vec![0], vec![1]], 3),
            vec![pass(&[1], &[0]), pass(&[2], &[1]), pass(&[0], &[2])]
        );
        // Two aggregates of one reduction share its pass.
        assert_eq!(
            result_passes(&[vec![0], vec![0], vec![1]], 2),
            vec![pass(&[0, 1], &[0]), pass(&[2], &[1])]
        );
        // AVG(a) (a sum and a count), MAX(b), and MIN(c) with its count:
        // three passes, none sharing a reduction.
        assert_eq!(
            result_passes(&[vec![1, 0], vec![2], vec![3, 4]], 5),
            vec![pass(&[0], &[0, 1]), pass(&[1], &[2]), pass(&[2], &[3, 4])]
        );
    }

    #[test]
    fn passes_that_share_a_reduction_are_merged_so_that_each_crosses_once() {
        // SUM, MIN, MAX and AVG of one nullable column share its count
        // (reduction 1): one pass, each reduction once.
        assert_eq!(
            result_passes(&[vec![0, 1], vec![1, 2], vec![1, 3], vec![1, 4]], 5),
            vec![pass(&[0, 1, 2, 3], &[0, 1, 2, 3, 4])]
        );
        // MAX(b) between two aggregates of `a` sharing a count: merged
        // with them, as the pass after it shares the count too.
        assert_eq!(
            result_passes(&[vec![0, 1], vec![2], vec![1, 3]], 4),
            vec![pass(&[0, 1, 2], &[0, 1, 2, 3])]
        );
        // MAX(x) first, then two aggregates sharing a count: MAX(x) keeps
        // its pass.
        assert_eq!(
            result_passes(&[vec![0], vec![1, 2], vec![2, 3]], 4),
            vec![pass(&[0], &[0]), pass(&[1, 2], &[1, 2, 3])]
        );
    }

    #[test]
    fn aggregates_that_read_no_reduction_wait_for_the_last_pass() {
        assert_eq!(
            result_passes(&[vec![], vec![0]], 1),
            vec![pass(&[0, 1], &[0])]
        );
        assert_eq!(result_passes(&[vec![]], 0), vec![pass(&[0], &[])]);
        // No aggregate at all (the keys alone): no pass to make.
        assert_eq!(result_passes(&[], 0), Vec::new());
    }

    #[test]
    fn tasks_are_whole_batches_about_a_window_share_of_each_thread() {
        let many = usize::MAX / 2;
        // 256 batches of 8192 groups on 16 threads: 16 batches a task.
        assert_eq!(task_groups(256 * 8192, many, 8192, 16), 16 * 8192);
        assert_eq!(task_groups(100 * 8192, many, 8192, 16), 6 * 8192);
        // Fewer groups than a window: shared out as they are.
        assert_eq!(task_groups(256 * 8192, 100_000, 8192, 16), 8192);
        assert_eq!(task_groups(256 * 8192, 64 * 8192, 8192, 16), 4 * 8192);
        // Fewer batches than threads, or a window of one: a batch a task.
        assert_eq!(task_groups(8 * 8192, many, 8192, 16), 8192);
        assert_eq!(task_groups(512, many, 8192, 16), 8192);
        assert_eq!(task_groups(1000, 1000, 0, 0), 1000);
    }

    #[test]
    fn a_task_covers_its_batches_numbered_among_all() {
        let window = GroupedWindow {
            groups: 40..80,
            identities: &[],
            reduced: Vec::new(),
        };
        let batches: Vec<_> = batches_of(&window, 10..35, 10).collect();
        assert_eq!(batches, vec![(5, 10..20), (6, 20..30), (7, 30..35)]);
        assert_eq!(batches_of(&window, 0..0, 10).count(), 0);
    }
}
