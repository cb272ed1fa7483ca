//! Many pieces of host memory copied end to end into one buffer, spread
//! over threads: the staging copy before an upload and the concatenation of
//! a join's build side both move hundreds of megabytes, which one thread
//! copies at a fraction of the memory bandwidth. Decimals of up to 18
//! digits are narrowed to 8-byte words on their way up and widened back
//! on their way down ([`narrow_to_words`], [`sign_extend_words`]); keys
//! and values that fit 32 bits go up at 4 bytes ([`narrow_to_halves`]).

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
    fill_window(
        target,
        pieces,
        start,
        max_threads,
        min_per_thread,
        |from, to| {
            to.copy_from_slice(from);
            true
        },
    );
}

/// As [`copy_window`], each run of source elements written into its place
/// of `target` by `map` (given runs of equal length) instead of copied:
/// true where every call of `map` returned true. A call that returns false
/// does not stop the others; the caller discards `target` then.
pub(crate) fn fill_window<S: Sync, T: Send>(
    target: &mut [T],
    pieces: &[&[S]],
    start: usize,
    max_threads: usize,
    min_per_thread: usize,
    map: impl Fn(&[S], &mut [T]) -> bool + Sync,
) -> bool {
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
        let mut all = true;
        while done < target.len() {
            let from = &pieces[piece][at - offsets[piece]..];
            let n = from.len().min(target.len() - done);
            all &= map(&from[..n], &mut target[done..done + n]);
            done += n;
            at += n;
            piece += 1;
        }
        all
    };
    let len = target.len();
    let threads = max_threads.min(len / min_per_thread.max(1)).max(1);
    if threads <= 1 {
        return fill(start, target);
    }
    let share = len.div_ceil(threads);
    let fill = &fill;
    std::thread::scope(|scope| {
        let filling: Vec<_> = target
            .chunks_mut(share)
            .enumerate()
            .map(|(i, chunk)| scope.spawn(move || fill(start + i * share, chunk)))
            .collect();
        // Every thread joined (none left running); one that panicked
        // filled nothing, so the window is not whole.
        let mut all = true;
        for thread in filling {
            all &= thread.join().unwrap_or(false);
        }
        all
    })
}

/// Writes each of `values` (16-byte little-endian signed integers) into
/// `words` as the 8-byte integer it equals: true where every value fits
/// 64 bits, false (with `words` partly written) where one does not. How a
/// decimal of up to 18 digits crosses the bus in half its bytes.
pub(crate) fn narrow_to_words(values: &[[u8; 16]], words: &mut [u64]) -> bool {
    let mut fits = true;
    for (value, word) in values.iter().zip(words.iter_mut()) {
        let value = i128::from_le_bytes(*value);
        let narrow = value as i64;
        fits &= i128::from(narrow) == value;
        *word = narrow as u64;
    }
    fits
}

/// Writes each of `values` (little-endian signed integers: 8 bytes for
/// join keys and 8-byte columns, 16 for decimals) into `halves` as the
/// 4-byte signed integer it equals: true where every value fits 32 bits,
/// false (with `halves` partly written) where one does not, found at the
/// first such value. Sign-extending the halves gives back the values' own
/// bits, so any value within `i32`'s range survives the trip, including
/// the all-ones word of -1. How keys and columns of small values (order
/// keys, packed codes of narrow domains, money in cents) cross the bus in
/// a half or a quarter of their bytes; a hashed key fails at once.
pub(crate) fn narrow_to_halves<V: SignedBytes>(values: &[V], halves: &mut [u32]) -> bool {
    for (value, half) in values.iter().zip(halves.iter_mut()) {
        let Some(narrow) = value.as_i32() else {
            return false;
        };
        *half = narrow as u32;
    }
    true
}

/// A little-endian signed integer held as its bytes, as a column's buffer
/// holds it.
pub(crate) trait SignedBytes: Sync {
    /// The value, where it fits 32 bits.
    fn as_i32(&self) -> Option<i32>;
}

impl SignedBytes for [u8; 8] {
    fn as_i32(&self) -> Option<i32> {
        i32::try_from(i64::from_le_bytes(*self)).ok()
    }
}

impl SignedBytes for [u8; 16] {
    fn as_i32(&self) -> Option<i32> {
        i32::try_from(i128::from_le_bytes(*self)).ok()
    }
}

/// `words` (8-byte little-endian signed integers) as 16-byte ones, each
/// sign-extended: the inverse of [`narrow_to_words`], in a buffer of its
/// own aligned for 16-byte values.
pub(crate) fn sign_extend_words(words: &[u8]) -> datafusion::arrow::buffer::Buffer {
    let (words, _) = words.as_chunks::<8>();
    let wide: Vec<i128> = words
        .iter()
        .map(|word| i128::from(i64::from_le_bytes(*word)))
        .collect();
    datafusion::arrow::buffer::Buffer::from_vec(wide)
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
    use datafusion::arrow::datatypes::ToByteSlice;

    fn wide(v: i128) -> [u8; 16] {
        v.to_le_bytes()
    }

    #[test]
    fn values_within_64_bits_narrow_and_widen_back_to_themselves() {
        let values: Vec<i128> = vec![
            0,
            1,
            -1,
            999_999_999_999_999_999,
            -999_999_999_999_999_999,
            i64::MAX as i128,
            i64::MIN as i128,
            i32::MIN as i128 - 5,
        ];
        let bytes: Vec<[u8; 16]> = values.iter().map(|&v| wide(v)).collect();
        let mut words = vec![0u64; values.len()];
        assert!(narrow_to_words(&bytes, &mut words));
        let expected: Vec<u64> = values.iter().map(|&v| v as i64 as u64).collect();
        assert_eq!(words, expected);
        let back = sign_extend_words(words.as_slice().to_byte_slice());
        assert_eq!(back.typed_data::<i128>(), values.as_slice());
    }

    #[test]
    fn a_value_past_64_bits_fails_the_narrowing_wherever_it_lies() {
        for outside in [
            i64::MAX as i128 + 1,
            i64::MIN as i128 - 1,
            1i128 << 100,
            -(1i128 << 64),
            1i128 << 64,
        ] {
            for at in [0, 3, 6] {
                let mut values = vec![wide(7); 7];
                values[at] = wide(outside);
                let mut words = vec![0u64; 7];
                assert!(!narrow_to_words(&values, &mut words), "{outside} at {at}");
            }
        }
    }

    #[test]
    fn values_within_32_bits_narrow_to_halves_that_sign_extend_to_themselves() {
        let values: Vec<i64> = vec![0, 1, -1, 7, i32::MAX as i64, i32::MIN as i64, -5, 1 << 30];
        let words: Vec<[u8; 8]> = values.iter().map(|v| v.to_le_bytes()).collect();
        let wide: Vec<[u8; 16]> = values
            .iter()
            .map(|&v| i128::from(v).to_le_bytes())
            .collect();
        let mut halves = vec![0u32; values.len()];
        assert!(narrow_to_halves(&words, &mut halves));
        let back: Vec<i64> = halves.iter().map(|&h| i64::from(h as i32)).collect();
        assert_eq!(back, values);
        assert_eq!(halves[2], u32::MAX, "-1 is all ones in 4 bytes too");
        let mut from_wide = vec![0u32; values.len()];
        assert!(narrow_to_halves(&wide, &mut from_wide));
        assert_eq!(from_wide, halves);
    }

    #[test]
    fn a_value_past_32_bits_fails_the_narrowing_wherever_it_lies() {
        for outside in [
            i32::MAX as i64 + 1,
            i32::MIN as i64 - 1,
            u32::MAX as i64,
            1 << 40,
            i64::MIN,
            i64::MAX,
        ] {
            for at in [0, 3, 6] {
                let mut words = vec![7i64.to_le_bytes(); 7];
                words[at] = outside.to_le_bytes();
                let mut halves = vec![0u32; 7];
                assert!(!narrow_to_halves(&words, &mut halves), "{outside} at {at}");
            }
        }
        // 16-byte values past 32 bits, past 64 bits among them.
        for outside in [
            i128::from(i32::MAX) + 1,
            i128::from(i64::MIN),
            1 << 100,
            -(1 << 64),
        ] {
            for at in [0, 3, 6] {
                let mut values = vec![(-7i128).to_le_bytes(); 7];
                values[at] = outside.to_le_bytes();
                let mut halves = vec![0u32; 7];
                assert!(!narrow_to_halves(&values, &mut halves), "{outside} at {at}");
            }
        }
    }

    #[test]
    fn a_window_filled_by_a_map_says_whether_every_run_was_mapped() {
        // Runs split at piece boundaries and between threads: each value
        // doubled, and one value refused wherever it falls.
        let pieces: Vec<Vec<u32>> = (0..19u32)
            .map(|i| (0..(i * 5 % 9)).map(|j| i * 100 + j).collect())
            .collect();
        let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
        let whole: Vec<u32> = pieces.concat();
        let double = |from: &[u32], to: &mut [u64]| {
            for (f, t) in from.iter().zip(to.iter_mut()) {
                *t = 2 * u64::from(*f);
            }
            from.iter().all(|&f| f != 1203)
        };
        for threads in [1, 3, 16] {
            for start in [0, 1, 7, 30, 50] {
                let len = whole.len() - start;
                let mut target = vec![0u64; len];
                let all = fill_window(&mut target, &refs, start, threads, 2, double);
                let expected: Vec<u64> = whole[start..].iter().map(|&v| 2 * u64::from(v)).collect();
                assert_eq!(target, expected, "{threads} threads from {start}");
                assert_eq!(
                    all,
                    !whole[start..].contains(&1203),
                    "{threads} threads from {start}"
                );
            }
        }
    }

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
