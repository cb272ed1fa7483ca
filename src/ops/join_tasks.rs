//! The hash join kernels' tasks (see `hash_join.cu`): which probe rows meet
//! which build rows in one block. Normally a task is a partition. A
//! partition with many probe rows (a skewed probe side) or many build rows
//! (one key repeated on the build side) is spread over tasks of a slice of
//! each side, so no block does most of the work while the others idle; and
//! a task with more pairs than one output range holds is split until its
//! pairs fit one, so the output of one key matching many rows on both sides
//! is still written in bounded ranges.

use std::ops::Range;

/// One task's rows: probe rows, then build rows, each within one partition
/// of its side, as the kernels read them (four entries a task).
pub type TaskRows = [u64; 4];

/// Build rows one task takes at most where a build partition is split: one
/// shared-memory table of the join kernels (`TABLE_CAPACITY`), so a split
/// task loads one table.
pub const BUILD_TASK_ROWS: u64 = 2048;

/// Pieces a task with too many pairs is split into at a time: the list of
/// pieces, their counts and offsets stay small on the device (a piece
/// still above the bound is split again).
pub const MAX_PIECES: usize = 4096;

/// The probe and build rows of a task.
pub fn task_ranges(task: &TaskRows) -> (Range<u64>, Range<u64>) {
    (task[0]..task[1], task[2]..task[3])
}

/// The tasks for partitions starting at `probe_starts` and `build_starts`
/// (one more entry than partitions on each side, ending at the side's
/// rows): `None` where no partition holds more than `probe_slice` probe
/// rows or `build_slice` build rows (each partition is then one task);
/// else each partition as slices of at most `probe_slice` probe rows by
/// slices of build rows, in order, the build slices widened (by powers of
/// two) until there are at most `max_tasks` tasks (where slices of whole
/// build partitions allow it). A partition without rows on a side stays
/// one task.
pub fn partition_tasks(
    probe_starts: &[u64],
    build_starts: &[u64],
    probe_slice: u64,
    build_slice: u64,
    max_tasks: usize,
) -> Option<Vec<TaskRows>> {
    let probe_slice = probe_slice.max(1);
    let partitions = probe_starts.len().min(build_starts.len()).saturating_sub(1);
    let len = |starts: &[u64], p: usize| starts[p + 1].saturating_sub(starts[p]);
    let heavy = (0..partitions).any(|p| {
        len(probe_starts, p) > probe_slice || len(build_starts, p) > build_slice
    });
    if !heavy {
        return None;
    }
    let pieces = |rows: u64, slice: u64| rows.div_ceil(slice.max(1)).max(1);
    let count = |build_slice: u64| -> u64 {
        (0..partitions)
            .map(|p| {
                let (probe, build) = (len(probe_starts, p), len(build_starts, p));
                if probe == 0 || build == 0 {
                    1
                } else {
                    pieces(probe, probe_slice) * pieces(build, build_slice)
                }
            })
            .sum()
    };
    let largest_build = (0..partitions).map(|p| len(build_starts, p)).max().unwrap_or(0);
    let mut build_slice = build_slice.max(1);
    while count(build_slice) > max_tasks as u64 && build_slice < largest_build {
        build_slice = build_slice.saturating_mul(2);
    }
    let mut tasks = Vec::with_capacity(count(build_slice) as usize);
    for p in 0..partitions {
        let probe = probe_starts[p]..probe_starts[p + 1].max(probe_starts[p]);
        let build = build_starts[p]..build_starts[p + 1].max(build_starts[p]);
        if probe.is_empty() || build.is_empty() {
            tasks.push([probe.start, probe.end, build.start, build.end]);
            continue;
        }
        for probe in slices(probe, pieces(len(probe_starts, p), probe_slice)) {
            for build in slices(build.clone(), pieces(len(build_starts, p), build_slice)) {
                tasks.push([probe.start, probe.end, build.start, build.end]);
            }
        }
    }
    Some(tasks)
}

/// `rows` as `pieces` consecutive slices of near-equal length (at least
/// one row each where `rows` holds enough).
fn slices(rows: Range<u64>, pieces: u64) -> impl Iterator<Item = Range<u64>> {
    let len = rows.end - rows.start;
    let pieces = pieces.clamp(1, len.max(1));
    (0..pieces).map(move |i| {
        let at = |i: u64| rows.start + (len as u128 * i as u128 / pieces as u128) as u64;
        at(i)..at(i + 1)
    })
}

/// A task of `pairs` pairs split into pieces that together cover every
/// pair once, each expected to hold at most half of `max_pairs`: its probe
/// rows into slices first, then, where a slice would still be one probe
/// row, its build rows too; at most [`MAX_PIECES`] pieces. Pairs are not
/// spread evenly over rows, so a piece can still hold more than
/// `max_pairs`: the caller counts the pieces and splits such a one again
/// (a piece of one probe row and one build row holds at most one pair).
/// The task itself where it cannot be split.
pub fn split_task(task: TaskRows, pairs: u64, max_pairs: u64) -> Vec<TaskRows> {
    let (probe, build) = task_ranges(&task);
    let (probe_rows, build_rows) = (probe.end - probe.start, build.end - build.start);
    let wanted = (2 * pairs)
        .div_ceil(max_pairs.max(1))
        .clamp(2, MAX_PIECES as u64);
    let probe_pieces = wanted.min(probe_rows.max(1));
    let build_pieces = wanted.div_ceil(probe_pieces).min(build_rows.max(1));
    if probe_pieces * build_pieces <= 1 {
        return vec![task];
    }
    let mut pieces = Vec::with_capacity((probe_pieces * build_pieces) as usize);
    for probe in slices(probe, probe_pieces) {
        for build in slices(build.clone(), build_pieces) {
            pieces.push([probe.start, probe.end, build.start, build.end]);
        }
    }
    pieces
}

/// Checks that every task's rows lie within the sides' rows (the kernels
/// read the keys there): an error naming the first that does not.
pub fn check_task_rows(tasks: &[TaskRows], probe_rows: u64, build_rows: u64) -> Result<(), String> {
    for (t, task) in tasks.iter().enumerate() {
        let (probe, build) = task_ranges(task);
        if probe.start > probe.end
            || probe.end > probe_rows
            || build.start > build.end
            || build.end > build_rows
        {
            return Err(format!(
                "join task {t} reads probe rows {probe:?} and build rows {build:?} \
                 of {probe_rows} and {build_rows}"
            ));
        }
    }
    Ok(())
}

/// `offsets[p]` = pairs before partition p; `offsets[counts.len()]` = total
/// (the device scans the counts so; this is the tests' reference).
#[cfg(test)]
pub fn exclusive_offsets(counts: &[u64]) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut running = 0u64;
    offsets.push(0);
    for &c in counts {
        running += c;
        offsets.push(running);
    }
    offsets
}

/// Splits partitions into consecutive ranges of at most `max_pairs` output
/// pairs each (a single partition above it gets a range of its own); ranges
/// without output are dropped.
pub fn output_ranges(offsets: &[u64], max_pairs: u64) -> Vec<Range<usize>> {
    let partitions = offsets.len().saturating_sub(1);
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < partitions {
        let mut end = start + 1;
        while end < partitions && offsets[end + 1] - offsets[start] <= max_pairs {
            end += 1;
        }
        if offsets[end] > offsets[start] {
            ranges.push(start..end);
        }
        start = end;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// How many times each (probe row, build row) pair of the same
    /// partition is covered by `tasks`, for partitions `probe_starts` and
    /// `build_starts`; fails on a task that crosses a partition.
    fn coverage(
        tasks: &[TaskRows],
        probe_starts: &[u64],
        build_starts: &[u64],
    ) -> HashMap<(u64, u64), u32> {
        let partition_of = |starts: &[u64], row: u64| starts.partition_point(|&s| s <= row) - 1;
        let mut covered = HashMap::new();
        for task in tasks {
            let (probe, build) = task_ranges(task);
            for p in probe.clone() {
                for b in build.clone() {
                    assert_eq!(
                        partition_of(probe_starts, p),
                        partition_of(build_starts, b),
                        "{task:?} crosses partitions"
                    );
                    *covered.entry((p, b)).or_insert(0) += 1;
                }
            }
        }
        covered
    }

    fn every_pair(probe_starts: &[u64], build_starts: &[u64]) -> usize {
        probe_starts
            .windows(2)
            .zip(build_starts.windows(2))
            .map(|(p, b)| ((p[1] - p[0]) * (b[1] - b[0])) as usize)
            .sum()
    }

    #[test]
    fn partitions_within_both_slices_need_no_task_list() {
        assert_eq!(partition_tasks(&[0, 3, 3, 7], &[0, 2, 4, 4], 4, 2, 100), None);
    }

    #[test]
    fn heavy_partitions_become_tasks_covering_each_pair_once() {
        // Partition 1 has 10 probe rows, partition 2 none, partition 3
        // seven build rows; slices of 4 probe and 3 build rows.
        let probe = [0, 3, 13, 13, 15];
        let build = [0, 2, 3, 5, 12];
        let tasks = partition_tasks(&probe, &build, 4, 3, 1000).unwrap();
        let covered = coverage(&tasks, &probe, &build);
        assert_eq!(covered.len(), every_pair(&probe, &build));
        assert!(covered.values().all(|&n| n == 1));
        for task in &tasks {
            let (p, b) = task_ranges(task);
            assert!(p.end - p.start <= 4 && b.end - b.start <= 3, "{task:?}");
        }
        // The empty probe partition stays one task.
        assert!(tasks.contains(&[13, 13, 3, 5]));
        check_task_rows(&tasks, 15, 12).unwrap();
    }

    #[test]
    fn build_slices_widen_to_keep_the_task_count() {
        // One partition of 100 probe and 64 build rows: slices of 10 and 4
        // would be 160 tasks; at most 50 widens the build slice to 8 (80)
        // then 16 (40).
        let tasks = partition_tasks(&[0, 100], &[0, 64], 10, 4, 50).unwrap();
        assert_eq!(tasks.len(), 40);
        let covered = coverage(&tasks, &[0, 100], &[0, 64]);
        assert_eq!(covered.len(), 6400);
        assert!(covered.values().all(|&n| n == 1));
    }

    #[test]
    fn a_split_task_covers_its_pairs_once_in_pieces_that_should_fit() {
        let task = [10, 30, 100, 164];
        // 20 x 64 rows of one key: 1,280 pairs against ranges of 100.
        let pieces = split_task(task, 1280, 100);
        let covered = coverage(&pieces, &[0, 40], &[0, 200]);
        assert_eq!(covered.len(), 1280);
        assert!(covered.values().all(|&n| n == 1));
        for piece in &pieces {
            let (p, b) = task_ranges(piece);
            assert!((p.end - p.start) * (b.end - b.start) <= 50, "{piece:?}");
        }
        // One probe row: the build rows are split.
        let pieces = split_task([5, 6, 0, 1000], 1000, 10);
        assert!(pieces.len() >= 100);
        assert!(pieces.iter().all(|t| t[1] - t[0] == 1 && t[3] - t[2] <= 10));
        // One row a side cannot be split.
        assert_eq!(split_task([5, 6, 7, 8], 1, 1), vec![[5, 6, 7, 8]]);
        // Never more than MAX_PIECES.
        assert_eq!(split_task([0, 1 << 20, 0, 1 << 20], 1 << 40, 1).len(), MAX_PIECES);
    }

    #[test]
    fn task_rows_beyond_a_side_are_refused() {
        assert!(check_task_rows(&[[0, 4, 0, 2]], 4, 2).is_ok());
        assert!(check_task_rows(&[[0, 5, 0, 2]], 4, 2).is_err());
        assert!(check_task_rows(&[[3, 2, 0, 2]], 4, 2).is_err());
        assert!(check_task_rows(&[[0, 4, 0, 3]], 4, 2).is_err());
    }

    #[test]
    fn offsets_end_with_the_total() {
        assert_eq!(exclusive_offsets(&[2, 0, 3]), vec![0, 2, 2, 5]);
        assert_eq!(exclusive_offsets(&[]), vec![0]);
    }

    #[test]
    fn output_ranges_respect_the_bound_and_cover_every_pair() {
        let counts = [3, 0, 4, 10, 1, 1, 0, 2];
        let offsets = exclusive_offsets(&counts);
        let ranges = output_ranges(&offsets, 5);
        assert_eq!(ranges, vec![0..2, 2..3, 3..4, 4..8]);
        let covered: u64 = ranges
            .iter()
            .map(|r| offsets[r.end] - offsets[r.start])
            .sum();
        assert_eq!(covered, 21);
        for r in &ranges {
            let pairs = offsets[r.end] - offsets[r.start];
            assert!(pairs <= 5 || r.len() == 1, "{r:?} holds {pairs}");
        }
    }

    #[test]
    fn output_ranges_drop_empty_ranges() {
        let offsets = exclusive_offsets(&[0, 0, 0]);
        assert!(output_ranges(&offsets, 10).is_empty());
    }
}
