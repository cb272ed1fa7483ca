//! A set of integer keys as the device tests it (`ScanOp::KeyTest`): the
//! smallest value, then one bit a value up to the largest, made from the
//! keys of a build side's partitions as they were gathered, on several
//! threads where they are many.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::gpu::launch::TableWords;

/// Values from the smallest key to the largest that a set spans at most:
/// its bitmap (one bit a value, 128 MiB at most) goes to the device with
/// each part of the probe side's table. TPC-H's order keys at scale factor
/// 100 span 600 million values: a set of a few thousand of them must still
/// be made, or every order and line item crosses the joins above on the CPU.
pub const MAX_KEY_SPAN: u64 = 1 << 30;

/// Values a thread of [`KeyBitmap::of_pieces`] takes at least: fewer cost
/// less on one thread than starting another does.
const KEYS_A_THREAD: usize = 1 << 19;

/// The most threads [`KeyBitmap::of_pieces`] makes a set on.
const MAX_THREADS: usize = 16;

// The words are viewed as atomics while threads set their bits.
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<u32>());

/// How many threads make a set of `values` values.
fn threads_for(values: usize) -> usize {
    let cores = crate::host::copy::host_threads();
    (values / KEYS_A_THREAD).clamp(1, cores.clamp(1, MAX_THREADS))
}

/// A thread's share of the values: consecutive slices of the pieces.
type Share<'a> = Vec<&'a [i64]>;

/// The values of `pieces`, in order, cut into `count` shares of about the
/// same number of values (one, empty, where there are none).
fn shares<P: AsRef<[i64]>>(pieces: &[P], count: usize) -> Vec<Share<'_>> {
    let total: usize = pieces.iter().map(|piece| piece.as_ref().len()).sum();
    let each = total.div_ceil(count.max(1)).max(1);
    let mut shares: Vec<Share<'_>> = vec![Vec::new()];
    let mut room = each;
    for piece in pieces {
        let mut rest = piece.as_ref();
        while !rest.is_empty() {
            if room == 0 {
                shares.push(Vec::new());
                room = each;
            }
            let (taken, left) = rest.split_at(rest.len().min(room));
            shares.last_mut().expect("one share at least").push(taken);
            room -= taken.len();
            rest = left;
        }
    }
    shares
}

/// The smallest and largest value of `share`; `None` where it has none.
fn bounds_of(share: &Share<'_>) -> Option<(i64, i64)> {
    let values = share.iter().copied().flatten();
    let low = values.clone().min()?;
    Some((*low, *values.max()?))
}

/// `work` over each share, the first on this thread and each other on a
/// thread of its own (or on this one, where none can be started), in order.
fn on_threads<T: Send>(shares: &[Share<'_>], work: impl Fn(&Share<'_>) -> T + Sync) -> Vec<T> {
    let Some((first, rest)) = shares.split_first() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let work = &work;
        let started: Vec<_> = rest
            .iter()
            .map(|share| {
                let thread = std::thread::Builder::new()
                    .name("join-key-set".into())
                    .spawn_scoped(scope, move || work(share));
                (share, thread.ok())
            })
            .collect();
        let mut done = vec![work(first)];
        for (share, thread) in started {
            done.push(match thread {
                Some(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                None => work(share),
            });
        }
        done
    })
}

/// A set of integers as the device tests it (`ScanOp::KeyTest`): the
/// smallest value, then one bit per value from it to the largest.
#[derive(Debug)]
pub struct KeyBitmap {
    /// The smallest value's two 32-bit halves, low first, then the bitmap
    /// (bit `v - smallest` of word `(v - smallest) / 32`).
    words: Vec<u32>,
    /// Where the values are few for their span (at most one a
    /// [`SPARSE_BITS_PER_VALUE`] bits of the bitmap), the position of each
    /// bit set in `words` (the smallest value's, then each value's, a
    /// value given twice twice): what goes to the device in their place.
    set_bits: Option<Vec<u32>>,
    /// Which set this is: a number no other set of the process has.
    id: u64,
}

/// Bits of a bitmap a value must stand for at least for the set to cross
/// the bus as its values' bit positions (32 bits each) rather than as its
/// words: at 128, the positions are at most a quarter of the words' bytes.
/// TPC-H q18's 624 order keys over a span of 60 million values at SF 10
/// are 2.5 KB where their bitmap is 7.5 MB.
pub const SPARSE_BITS_PER_VALUE: usize = 128;

static NEXT_BITMAP: AtomicU64 = AtomicU64::new(1);

/// Its words as the device tests them (a scan's parts share them), sent as
/// the positions of their set bits where those are few.
impl TableWords for KeyBitmap {
    fn words(&self) -> &[u32] {
        &self.words
    }

    fn set_bits(&self) -> Option<&[u32]> {
        self.set_bits.as_deref()
    }

    fn shared_by_chunks(&self) -> bool {
        true
    }
}

impl KeyBitmap {
    /// The set of `values`, or `None` where they span more than
    /// [`MAX_KEY_SPAN`] values. No values make an empty set.
    pub fn of(values: &[i64]) -> Option<Self> {
        Self::of_pieces(&[values])
    }

    /// The set of the values of every piece (a partition's keys each, as
    /// gathered), or `None` where they span more than [`MAX_KEY_SPAN`]
    /// values. No values make an empty set. Many values are spread over
    /// threads (one a [`KEYS_A_THREAD`] values, [`MAX_THREADS`] at most),
    /// which find their bounds, then set their bits.
    pub fn of_pieces<P: AsRef<[i64]> + Sync>(pieces: &[P]) -> Option<Self> {
        let total: usize = pieces.iter().map(|piece| piece.as_ref().len()).sum();
        let shares = shares(pieces, threads_for(total));
        let bounds = on_threads(&shares, bounds_of);
        let Some((smallest, largest)) = bounds
            .into_iter()
            .flatten()
            .reduce(|(low, high), (l, h)| (low.min(l), high.max(h)))
        else {
            return Some(Self::new(vec![0, 0]));
        };
        let span = (largest as i128 - smallest as i128 + 1) as u128;
        if span > u128::from(MAX_KEY_SPAN) {
            return None;
        }
        let mut words = vec![0u32; 2 + (span as usize).div_ceil(32)];
        words[0] = smallest as u64 as u32;
        words[1] = ((smallest as u64) >> 32) as u32;
        let offset = |v: i64| v.wrapping_sub(smallest) as u64 as usize;
        match shares.as_slice() {
            [share] => {
                let bits = &mut words[2..];
                for &v in share.iter().copied().flatten() {
                    bits[offset(v) / 32] |= 1 << (offset(v) % 32);
                }
            }
            _ => {
                let bits: &mut [u32] = &mut words[2..];
                // SAFETY: `AtomicU32` has `u32`'s size and bit validity and
                // (asserted beside `MAX_THREADS`) its alignment, so the
                // words' memory is a valid `[AtomicU32]` of the same length;
                // `bits` is borrowed mutably for as long as the view lives,
                // so every access to the words meanwhile goes through the
                // atomics. Every offset is below the span the words hold:
                // each value lies between the smallest and the largest.
                let atomic: &[AtomicU32] =
                    unsafe { &*(std::ptr::from_mut(bits) as *const [AtomicU32]) };
                on_threads(&shares, |share| {
                    for &v in share.iter().copied().flatten() {
                        atomic[offset(v) / 32].fetch_or(1 << (offset(v) % 32), Ordering::Relaxed);
                    }
                });
            }
        }
        let sparse = total.saturating_mul(SPARSE_BITS_PER_VALUE) <= 32 * (words.len() - 2);
        let set_bits = sparse.then(|| {
            let smallest_bits = (0..64u32).filter(|&bit| (smallest as u64 >> bit) & 1 == 1);
            let values = pieces.iter().flat_map(|piece| piece.as_ref().iter().copied());
            // Span at most 2^30: every position fits 32 bits.
            smallest_bits
                .chain(values.map(|v| 64 + offset(v) as u32))
                .collect()
        });
        let mut set = Self::new(words);
        set.set_bits = set_bits;
        Some(set)
    }

    fn new(words: Vec<u32>) -> Self {
        Self {
            words,
            set_bits: None,
            id: NEXT_BITMAP.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A number no other set of the process has.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The table the device reads.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    fn smallest(&self) -> i64 {
        (u64::from(self.words[1]) << 32 | u64::from(self.words[0])) as i64
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: i64) -> bool {
        let offset = value.wrapping_sub(self.smallest()) as u64;
        let bits = &self.words[2..];
        offset / 32 < bits.len() as u64 && bits[(offset / 32) as usize] >> (offset % 32) & 1 == 1
    }

    /// The share of the values from `low` to `high` in the set (of the
    /// values it spans where no range is given): about the share of rows a
    /// test keeps whose keys spread evenly over that range.
    pub fn share_of(&self, range: Option<(i64, i64)>) -> f64 {
        let bits = &self.words[2..];
        let span = bits.len() as i64 * 32;
        let smallest = self.smallest();
        let (low, high) = range.unwrap_or((smallest, smallest.saturating_add(span - 1)));
        if high < low {
            return 0.0;
        }
        // The range as bit offsets, clamped to the bitmap.
        let first = (low as i128 - smallest as i128).clamp(0, span as i128) as usize;
        let last = (high as i128 - smallest as i128 + 1).clamp(0, span as i128) as usize;
        let held = count_bits(bits, first, last);
        held as f64 / (high as i128 - low as i128 + 1) as f64
    }
}

/// Set bits of `bits` from bit `first` to before bit `last`.
fn count_bits(bits: &[u32], first: usize, last: usize) -> u64 {
    let mut count = 0;
    let mut at = first;
    while at < last {
        let from = at % 32;
        let base = at - from;
        let width = (last - base).min(32) - from;
        let mask = match width {
            32 => u32::MAX,
            _ => ((1u32 << width) - 1) << from,
        };
        count += u64::from((bits[at / 32] & mask).count_ones());
        at = base + 32;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bitmap_holds_its_values_and_no_other() {
        let values = [5, -3, 40, 5, 70];
        let keys = KeyBitmap::of(&values).unwrap();
        for v in -40..120 {
            assert_eq!(keys.contains(v), values.contains(&v), "{v}");
        }
        assert_eq!(keys.words()[..2], [-3i64 as u64 as u32, (-3i64 as u64 >> 32) as u32]);
        assert!(!keys.contains(i64::MIN) && !keys.contains(i64::MAX));
        let empty = KeyBitmap::of(&[]).unwrap();
        assert!(!empty.contains(0) && empty.words().len() == 2);
        let extremes = KeyBitmap::of(&[i64::MAX]).unwrap();
        assert!(extremes.contains(i64::MAX) && !extremes.contains(i64::MIN));
        assert!(KeyBitmap::of(&[0, MAX_KEY_SPAN as i64 - 1]).is_some());
        assert!(KeyBitmap::of(&[0, MAX_KEY_SPAN as i64]).is_none());
        assert!(KeyBitmap::of(&[i64::MIN, i64::MAX]).is_none());
    }

    #[test]
    fn a_share_counts_the_keys_within_a_range() {
        let values: Vec<i64> = (100..200).chain([1000]).collect();
        let keys = KeyBitmap::of(&values).unwrap();
        assert_eq!(keys.share_of(Some((100, 199))), 1.0);
        assert_eq!(keys.share_of(Some((0, 999))), 0.1);
        assert_eq!(keys.share_of(Some((150, 1049))), 51.0 / 900.0);
        assert_eq!(keys.share_of(Some((-5000, -1))), 0.0);
        assert_eq!(keys.share_of(Some((5, 4))), 0.0);
        // Without a range: of the values spanned (rounded up to whole words).
        let spanned = keys.words().len() as f64 * 32.0 - 64.0;
        assert_eq!(keys.share_of(None), 101.0 / spanned);
        for (first, last) in [(0, 0), (3, 5), (31, 33), (0, 64), (7, 100), (64, 96)] {
            let bits = [u32::MAX, 0x0F0F_0F0F, 1 << 31, u32::MAX];
            let expected = (first..last)
                .filter(|&b: &usize| bits[b / 32] >> (b % 32) & 1 == 1)
                .count() as u64;
            assert_eq!(count_bits(&bits, first, last), expected, "{first}..{last}");
        }
    }

    /// The set's words made the plain way, one value after another.
    fn reference_words(values: &[i64]) -> Vec<u32> {
        let smallest = *values.iter().min().unwrap();
        let largest = *values.iter().max().unwrap();
        let span = (largest - smallest + 1) as usize;
        let mut words = vec![0u32; 2 + span.div_ceil(32)];
        words[0] = smallest as u64 as u32;
        words[1] = ((smallest as u64) >> 32) as u32;
        for &v in values {
            let offset = (v - smallest) as usize;
            words[2 + offset / 32] |= 1 << (offset % 32);
        }
        words
    }

    /// The words whose bits `positions` set, `len` words long.
    fn words_of_bits(positions: &[u32], len: usize) -> Vec<u32> {
        let mut words = vec![0u32; len];
        for &p in positions {
            words[p as usize / 32] |= 1 << (p % 32);
        }
        words
    }

    #[test]
    fn a_set_of_few_values_over_a_wide_span_goes_as_its_bit_positions() {
        // 624 values (some twice, the smallest negative) over 60 million.
        let mut values: Vec<i64> = (0..624).map(|i| -7 + i * 96_153).collect();
        values.extend_from_slice(&[-7, 1_000, 1_000]);
        let sparse = KeyBitmap::of_pieces(&[&values[..300], &values[300..]]).unwrap();
        let positions = sparse.set_bits().expect("few values for their span");
        assert_eq!(positions.len(), values.len() + (-7i64 as u64).count_ones() as usize);
        assert_eq!(words_of_bits(positions, sparse.words().len()), sparse.words());
        assert_eq!(sparse.words(), reference_words(&values).as_slice());
        // Many values for their span: its words.
        let dense: Vec<i64> = (0..10_000).map(|i| i * 3).collect();
        assert!(KeyBitmap::of(&dense).unwrap().set_bits().is_none());
        // One value a 128 bits of the bitmap is still few; one more is not.
        let edge: Vec<i64> = vec![0, 200, 300, 511];
        let bits = 32 * (KeyBitmap::of(&edge).unwrap().words().len() - 2);
        assert!(edge.len() * SPARSE_BITS_PER_VALUE <= bits);
        assert!(KeyBitmap::of(&edge).unwrap().set_bits().is_some());
        let more: Vec<i64> = edge.iter().copied().chain([1]).collect();
        assert!(more.len() * SPARSE_BITS_PER_VALUE > bits);
        assert!(KeyBitmap::of(&more).unwrap().set_bits().is_none());
        // No value: two words, nothing to send but them.
        assert!(KeyBitmap::of(&[]).unwrap().set_bits().is_none());
    }

    #[test]
    fn a_set_made_on_threads_from_uneven_pieces_holds_the_same_bits() {
        // Sizes on both sides of one thread's values and of several; the
        // pieces uneven, some empty; negative keys, duplicates, the bounds
        // in different pieces.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |modulus: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % modulus
        };
        for total in [1, 31, KEYS_A_THREAD, 2 * KEYS_A_THREAD - 1, 2 * KEYS_A_THREAD, 3_000_001] {
            let values: Vec<i64> = (0..total)
                .map(|_| next(20_000_000) as i64 - 7_000_000)
                .collect();
            let mut pieces: Vec<Vec<i64>> = vec![Vec::new()];
            let mut at = 0;
            while at < total {
                let len = (next(700_000) as usize).min(total - at);
                pieces.push(values[at..at + len].to_vec());
                pieces.push(Vec::new());
                at += len;
            }
            // The sizes past two threads' worth are made on several where
            // the host has the cores: the atomic path is the one tested.
            if total >= 2 * KEYS_A_THREAD && crate::host::copy::host_threads() > 1 {
                assert!(threads_for(total) > 1, "{total} values on one thread");
            }
            let made = KeyBitmap::of_pieces(&pieces).unwrap();
            assert_eq!(made.words(), reference_words(&values).as_slice(), "{total} values");
            assert_eq!(made.words(), KeyBitmap::of(&values).unwrap().words(), "{total} values");
        }
        let spread: Vec<Vec<i64>> = vec![vec![5; 3 * KEYS_A_THREAD], vec![5 + MAX_KEY_SPAN as i64]];
        assert!(KeyBitmap::of_pieces(&spread).is_none());
        let none: Vec<Vec<i64>> = vec![Vec::new(), Vec::new()];
        assert_eq!(KeyBitmap::of_pieces(&none).unwrap().words(), [0, 0]);
    }

    #[test]
    fn shares_cover_the_pieces_in_order_in_about_equal_parts() {
        let pieces: Vec<Vec<i64>> = vec![(0..10).collect(), vec![], (10..13).collect(), (13..30).collect()];
        for count in 1..8 {
            let shares = shares(&pieces, count);
            assert!(shares.len() <= count, "{count}: {} shares", shares.len());
            let flat: Vec<i64> = shares.iter().flatten().flat_map(|s| s.iter().copied()).collect();
            assert_eq!(flat, (0..30).collect::<Vec<_>>(), "{count}");
            let each = 30usize.div_ceil(count);
            assert!(shares.iter().all(|s| s.iter().map(|p| p.len()).sum::<usize>() <= each));
        }
        assert_eq!(shares(&Vec::<Vec<i64>>::new(), 4).len(), 1);
    }
}
