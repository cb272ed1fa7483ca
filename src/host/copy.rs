//! Many pieces of host memory copied end to end into one buffer, spread
//! over threads: the staging copy before an upload and the concatenation of
//! a join's build side both move hundreds of megabytes, which one thread
//! copies at a fraction of the memory bandwidth.

/// Copies the `target.len()` elements that begin at element `start` of
/// `pieces` laid end to end into `target`, on up to `max_threads` threads
/// of at least `min_per_thread` elements each: one window of a long column
/// staged for an upload, without the column ever being whole on the host,
/// or, from element 0, all of them (a join's build side concatenated).
/// `target` must not reach past the pieces' end.
pub(crate) fn copy_window<T: Copy + Send + Sync>(
    target: &mut [T],
    pieces: &[&[T]],
    start: usize,
    max_threads: usize,
    min_per_thread: usize,
) {
    // Where each piece begins in the concatenation.
    let mut offsets = Vec::with_capacity(pieces.len());
    let mut total = 0;
    for piece in pieces {
        offsets.push(total);
        total += piece.len();
    }
    assert!(
        start + target.len() <= total,
        "a window of {} elements at {start} of {total}",
        target.len()
    );
    let fill = |mut at: usize, target: &mut [T]| {
        let mut piece = offsets.partition_point(|&o| o <= at).saturating_sub(1);
        let mut done = 0;
        while done < target.len() {
            let from = &pieces[piece][at - offsets[piece]..];
            let n = from.len().min(target.len() - done);
            target[done..done + n].copy_from_slice(&from[..n]);
            done += n;
            at += n;
            piece += 1;
        }
    };
    let len = target.len();
    let threads = max_threads.min(len / min_per_thread.max(1)).max(1);
    if threads <= 1 {
        fill(start, target);
        return;
    }
    let share = len.div_ceil(threads);
    let fill = &fill;
    std::thread::scope(|scope| {
        for (i, chunk) in target.chunks_mut(share).enumerate() {
            scope.spawn(move || fill(start + i * share, chunk));
        }
    });
}

/// The host's cores, as the default thread count of host work, counted
/// once per process: counting reads the process's CPU affinity and its
/// cgroup's quota files each time, and the rule asks at every decision of
/// every plan.
pub(crate) fn host_threads() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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
                copy_window(&mut target, &refs, 0, threads, min);
                assert_eq!(target, expected, "{threads} threads, {min} at least");
            }
        }
        let mut empty: Vec<u8> = Vec::new();
        copy_window(&mut empty, &[], 0, 4, 1);
        assert!(empty.is_empty());
    }

    #[test]
    fn every_window_of_the_pieces_is_copied_whatever_the_thread_count() {
        // Empty pieces among them, windows starting and ending inside,
        // on and between piece boundaries.
        let pieces: Vec<Vec<u32>> = (0..23u32)
            .map(|i| (0..(i * 7 % 11)).map(|j| i * 1000 + j).collect())
            .collect();
        let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
        let whole: Vec<u32> = pieces.concat();
        for start in 0..whole.len() {
            for len in [0, 1, 5, 13, whole.len() - start] {
                let len = len.min(whole.len() - start);
                for threads in [1, 3, 8] {
                    let mut target = vec![0u32; len];
                    copy_window(&mut target, &refs, start, threads, 1);
                    assert_eq!(
                        target,
                        whole[start..start + len],
                        "{start}+{len}, {threads}"
                    );
                }
            }
        }
        let mut empty: Vec<u8> = Vec::new();
        copy_window(&mut empty, &[], 0, 4, 1);
        assert!(empty.is_empty());
    }
}
