//! Many pieces of host memory copied end to end into one buffer, spread
//! over threads: the staging copy before an upload and the concatenation of
//! a join's build side both move hundreds of megabytes, which one thread
//! copies at a fraction of the memory bandwidth.

/// Copies `pieces`, end to end, into `target` (whose length is theirs
/// summed) on up to `max_threads` threads, each taking whole pieces of
/// about `target.len() / threads` elements and at least `min_per_thread`.
pub(crate) fn copy_pieces<T: Copy + Send + Sync>(
    target: &mut [T],
    pieces: &[&[T]],
    max_threads: usize,
    min_per_thread: usize,
) {
    let len = target.len();
    debug_assert_eq!(len, pieces.iter().map(|p| p.len()).sum::<usize>());
    let threads = max_threads.min(len / min_per_thread.max(1)).max(1);
    let share = len.div_ceil(threads);
    let mut groups: Vec<(&mut [T], Vec<&[T]>)> = Vec::with_capacity(threads);
    let mut rest = target;
    let (mut current, mut current_len) = (Vec::new(), 0);
    for &piece in pieces {
        current.push(piece);
        current_len += piece.len();
        if current_len >= share {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(current_len);
            groups.push((head, std::mem::take(&mut current)));
            rest = tail;
            current_len = 0;
        }
    }
    if !current.is_empty() {
        groups.push((rest, current));
    }
    let copy = |(target, pieces): (&mut [T], Vec<&[T]>)| {
        let mut at = 0;
        for piece in pieces {
            target[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
        }
    };
    if groups.len() <= 1 {
        groups.into_iter().for_each(copy);
    } else {
        std::thread::scope(|scope| {
            for group in groups {
                scope.spawn(move || copy(group));
            }
        });
    }
}

/// The host's cores, as the default thread count of host copies.
pub(crate) fn host_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_end_to_end_whatever_the_thread_count() {
        let pieces: Vec<Vec<u32>> = (0..37u32)
            .map(|i| (0..(i * 13 % 50)).map(|j| i * 1000 + j).collect())
            .collect();
        let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
        let expected: Vec<u32> = pieces.concat();
        for threads in [1, 2, 5, 64] {
            for min in [1, 10, 1000] {
                let mut target = vec![0u32; expected.len()];
                copy_pieces(&mut target, &refs, threads, min);
                assert_eq!(target, expected, "{threads} threads, {min} at least");
            }
        }
        let mut empty: Vec<u8> = Vec::new();
        copy_pieces(&mut empty, &[], 4, 1);
        assert!(empty.is_empty());
    }
}
