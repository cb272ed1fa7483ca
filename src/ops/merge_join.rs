//! The sort-merge join on device columns (seed 000 §3.3, seed 001 §3): keys
//! with their row ids sorted by an LSD radix sort over the key bits in use,
//! the two sorted sides matched by merge path (the run of equal keys in the
//! other side for every streamed key), the output sized from the match
//! counts, then written range by range so the output buffer stays bounded.
//!
//! Keys are order-preserving codes: ascending codes are the join's sort
//! order, so both the sort and the merge compare plain u64.

use std::sync::Arc;

use crate::gpu::empty_device_vec;
use crate::gpu::alloc_uninit;
use crate::gpu::DeviceStream;

use super::radix::stable_radix_passes;
use super::scan::exclusive_scan;
use crate::gpu::launch::{
    self, AggregateOp, CodeTransform, GroupRows, MergeBound, RadixDigits, RadixGrid, MAX_RADIX_BITS,
};
use crate::gpu::{
    download_u64, download_word, upload_words_narrowed, DeviceVec, GpuDevice, GpuError, GpuResult,
    Phase, PhaseTimer,
};

/// One side of the join on the device, ordered by key.
#[derive(Debug)]
pub struct SortedSide {
    /// Keys, ascending.
    pub keys: DeviceVec<u64>,
    /// The input row of each key.
    pub row_ids: DeviceVec<u64>,
}

impl SortedSide {
    #[cfg(any(test, feature = "test-support"))]
    /// Copies `keys` (pieces laid end to end) to the device and sorts them
    /// with their row ids on the low `key_bits` bits, or, with `presorted`,
    /// takes them as already in order (row ids `0..n`). `keys` are codes, or, with `transform`, raw
    /// keys that the device turns into codes first.
    pub fn upload(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        keys: &[&[u64]],
        transform: Option<CodeTransform>,
        key_bits: u32,
        presorted: bool,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        Self::upload_unsorted(device, stream, stream, keys, timer)?
            .sort(device, stream, transform, key_bits, presorted, timer)
    }

    /// `keys` (pieces laid end to end) copied on `copy_stream` as they are,
    /// with row ids `0..n` made on `stream`: not yet coded nor sorted (see
    /// [`Self::sort`]).
    pub fn upload_unsorted(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        copy_stream: &Arc<DeviceStream>,
        keys: &[&[u64]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        // Keys that fit 32 bits cross the bus at 4 bytes.
        let keys = upload_words_narrowed(device, copy_stream, keys, timer)?;
        // One row id per key, over all pieces.
        let rows = keys.len();
        let mut row_ids = if rows == 0 {
            empty_device_vec::<u64>(stream, "allocating row ids")?
        } else {
            // iota writes every element.
            alloc_uninit::<u64>(stream, rows, "allocating row ids")?
        };
        timer.time(Phase::Kernel, || {
            launch::iota(&device.launcher(stream), &mut row_ids, 0)
        })?;
        Ok(Self { keys, row_ids })
    }

    /// The keys turned into codes by `transform` (where given) and sorted
    /// with their row ids on the low `key_bits` bits, or, with
    /// `presorted`, taken as already in order. Enqueued on `stream`.
    pub fn sort(
        mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        transform: Option<CodeTransform>,
        key_bits: u32,
        presorted: bool,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        if let Some(transform) = transform {
            self.transform_keys(device, stream, transform, timer)?;
        }
        if presorted {
            return Ok(self);
        }
        timer.time(Phase::Kernel, || {
            radix_sort(device, stream, self.keys, self.row_ids, key_bits)
        })
    }

    /// Codes that `from` made from raw keys turned into those `to` makes
    /// (both in the same direction; `to`'s base the farther end): each
    /// code shifted by the distance between the two bases, so the order
    /// stays and sorted keys stay sorted. Enqueued on `stream`.
    pub fn rebase_codes(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        from: CodeTransform,
        to: CodeTransform,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        if from.descending != to.descending {
            return Err(GpuError::Invalid("codes rebased across directions".into()));
        }
        match rebase_shift(from, to).filter(|_| !self.keys.is_empty()) {
            Some(shift) => self.transform_keys(device, stream, shift, timer),
            None => Ok(()),
        }
    }

    /// Every key replaced, in place, by its code under `transform`.
    fn transform_keys(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        transform: CodeTransform,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        timer.time(Phase::Kernel, || {
            launch::ordered_codes(
                &device.launcher(stream),
                &mut self.keys,
                transform)
        })
    }

    /// The smallest and largest key, compared as words XORed with `flip`
    /// (`1 << 63` for signed values), or `None` without keys: found on the
    /// device, which the host waits for.
    pub fn key_range(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        flip: u64,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<(u64, u64)>> {
        let rows = self.keys.len();
        if rows == 0 {
            return Ok(None);
        }
        let mut ends = Vec::with_capacity(2);
        let mut outs = Vec::with_capacity(2);
        for op in [AggregateOp::Min, AggregateOp::Max] {
            // Filled with the identity right below, before any read.
            let mut out = alloc_uninit::<u64>(stream, 1, "allocating a key range")?;
            timer.time(Phase::Kernel, || {
                launch::fill_u64(&device.launcher(stream), &mut out, op.identity())?;
                let rows = GroupRows {
                    groups_of_rows: None,
                    rows,
                    valid_bits: None,
                    groups: 1,
                    span: None,
                };
                launch::aggregate_u64(
                    &device.launcher(stream),
                    rows,
                    Some(&self.keys),
                    None,
                    op,
                    flip,
                    &mut out)
            })?;
            outs.push(out);
        }
        for out in &outs {
            let word = download_word(device, stream, &out.as_view(), "a side's key bound", timer)?;
            // The reduction's word is in the flipped order's terms.
            ends.push(word ^ flip);
        }
        Ok(Some((ends[0], ends[1])))
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.keys.len()
    }

    /// The row ids in key order, on the host.
    pub fn download_row_ids(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Vec<u64>> {
        let mut ids = Vec::new();
        download_u64(device, stream, &self.row_ids.as_view(), &mut ids, timer)?;
        Ok(ids)
    }
}

/// The transform that turns codes made by `from` into those `to` makes
/// (same direction), or `None` where they are the same: ascending, `(k -
/// from) - (to - from)`; descending, `(from - k) - (from - to)`.
fn rebase_shift(from: CodeTransform, to: CodeTransform) -> Option<CodeTransform> {
    let shift = match to.descending {
        true => from.base.wrapping_sub(to.base),
        false => to.base.wrapping_sub(from.base),
    };
    (shift != 0).then_some(CodeTransform {
        base: shift,
        descending: false,
    })
}

/// Bits of each radix-sort pass over `key_bits` bits, least significant first:
/// the fewest passes of at most [`MAX_RADIX_BITS`], split evenly.
pub fn sort_pass_bits(key_bits: u32) -> Vec<u32> {
    let key_bits = key_bits.min(64);
    let passes = key_bits.div_ceil(MAX_RADIX_BITS);
    (0..passes)
        .map(|i| key_bits / passes + u32::from(i < key_bits % passes))
        .collect()
}

/// Stable LSD radix sort of `keys` (with `row_ids`) on bits `[0, key_bits)`;
/// every key must be below `2^key_bits`.
pub fn radix_sort(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: DeviceVec<u64>,
    row_ids: DeviceVec<u64>,
    key_bits: u32,
) -> GpuResult<SortedSide> {
    if keys.len() <= 1 {
        return Ok(SortedSide { keys, row_ids });
    }
    let (keys, row_ids) = stable_radix_passes(
        device,
        stream,
        keys,
        row_ids,
        RadixDigits::Key,
        &sort_pass_bits(key_bits),
    )?;
    Ok(SortedSide { keys, row_ids })
}

/// The matches of every streamed key, found by merge path: where its run of
/// equal keys starts in the other side, and the running total of matches.
#[derive(Debug)]
pub struct MergeMatches {
    /// `lower[i]`: the first row of the other side (in key order) whose key
    /// equals streamed key `i`.
    lower: DeviceVec<u64>,
    /// Exclusive scan of the match counts.
    offsets: DeviceVec<u64>,
    /// Matches of each streamed key, when asked for.
    counts: Option<Vec<u64>>,
    total: u64,
}

impl MergeMatches {
    /// Matches `streamed` against `other` (both sorted). With `want_counts`,
    /// the per-row match counts are also copied to the host.
    pub fn find(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        streamed: &SortedSide,
        other: &SortedSide,
        want_counts: bool,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let n = streamed.rows();
        let alloc = |what: &'static str| -> GpuResult<DeviceVec<u64>> {
            if n == 0 {
                return empty_device_vec::<u64>(stream, what);
            }
            // merge_path_bounds writes every one of the n elements.
            alloc_uninit::<u64>(stream, n, what)
        };
        let mut lower = alloc("allocating merge bounds")?;
        let mut counts = alloc("allocating match counts")?;
        timer.time(Phase::Kernel, || {
            launch::merge_path_bounds(
                &device.launcher(stream),
                &streamed.keys,
                &other.keys,
                MergeBound::Lower,
                &mut lower)?;
            launch::merge_path_bounds(
                &device.launcher(stream),
                &streamed.keys,
                &other.keys,
                MergeBound::CountAbove(&lower),
                &mut counts)
        })?;
        let host_counts = if want_counts {
            let mut host = Vec::new();
            download_u64(device, stream, &counts.as_view(), &mut host, timer)?;
            Some(host)
        } else {
            None
        };
        // The total: the last count, plus its offset once they are
        // scanned (the scan is exclusive).
        let last_count = match n {
            0 => 0,
            _ => download_word(device, stream, &counts.slice(n - 1..n), "the last probe row's count", timer)?,
        };
        timer.time(Phase::Kernel, || {
            exclusive_scan(device, stream, &mut counts, n)
        })?;
        let total = match n {
            0 => 0,
            _ => last_count + download_word(device, stream, &counts.slice(n - 1..n), "the last probe row's offset", timer)?,
        };
        Ok(Self {
            lower,
            offsets: counts,
            counts: host_counts,
            total,
        })
    }

    /// Matching pairs in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The per-row match counts, when [`Self::find`] was asked for them.
    pub fn counts(&self) -> Option<&[u64]> {
        self.counts.as_deref()
    }

    /// For each range of at most `max_pairs` output positions, in order,
    /// calls `emit(streamed_positions, other_row_ids)`: the streamed side's
    /// position in key order and the other side's input row of every pair.
    /// Pairs come ordered by streamed position, then by the other side's
    /// key order (input order among equal keys). `emit` returns whether to
    /// go on; `false` leaves the remaining ranges unmade.
    pub fn expand(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        other: &SortedSide,
        max_pairs: usize,
        timer: &mut PhaseTimer,
        mut emit: impl FnMut(Vec<u64>, Vec<u64>) -> GpuResult<bool>,
    ) -> GpuResult<()> {
        self.expand_on_device(device, stream, other, max_pairs, timer, |pairs, timer| {
            let (mut positions, mut ids) = (Vec::new(), Vec::new());
            let len = pairs.len;
            download_u64(
                device,
                stream,
                &pairs.positions.slice(..len),
                &mut positions,
                timer,
            )?;
            download_u64(
                device,
                stream,
                &pairs.other_ids.slice(..len),
                &mut ids,
                timer,
            )?;
            emit(positions, ids)
        })
    }

    /// As [`Self::expand`], handing each range's pairs over while they are
    /// still on the device (for work on them there, such as gathering
    /// payload columns).
    pub fn expand_on_device(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        other: &SortedSide,
        max_pairs: usize,
        timer: &mut PhaseTimer,
        mut emit: impl FnMut(DevicePairs<'_>, &mut PhaseTimer) -> GpuResult<bool>,
    ) -> GpuResult<()> {
        if self.total == 0 {
            return Ok(());
        }
        let max_pairs = max_pairs.max(1);
        let buffer = (self.total as usize).min(max_pairs);
        // Both: expand_pairs writes the first `len` elements, and
        // only those are copied back.
        let mut positions =
            alloc_uninit::<u64>(stream, buffer, "allocating output pairs")?;
        let mut other_ids =
            alloc_uninit::<u64>(stream, buffer, "allocating output pairs")?;
        let mut first = 0u64;
        while first < self.total {
            let len = (self.total - first).min(buffer as u64) as usize;
            timer.time(Phase::Kernel, || {
                launch::expand_pairs(
                    &device.launcher(stream),
                    &self.offsets,
                    &self.lower,
                    &other.row_ids,
                    first,
                    len,
                    &mut positions,
                    &mut other_ids)
            })?;
            let go_on = emit(
                DevicePairs {
                    positions: &positions,
                    other_ids: &other_ids,
                    len,
                },
                timer,
            )?;
            if !go_on {
                break;
            }
            first += len as u64;
        }
        Ok(())
    }
}

/// One range of pairs on the device: the first `len` elements of each
/// buffer.
pub struct DevicePairs<'a> {
    /// The streamed side's position (in key order) of each pair.
    pub positions: &'a DeviceVec<u64>,
    /// The other side's input row of each pair.
    pub other_ids: &'a DeviceVec<u64>,
    /// Pairs in the range.
    pub len: usize,
}

/// Device bytes a join of `streamed` x `other` rows needs at most, with at
/// most `max_pairs` output pairs on the device at a time.
pub fn merge_join_device_bytes(
    streamed: usize,
    other: usize,
    max_pairs: usize,
    sm_count: u32,
) -> usize {
    let rows = streamed + other;
    let grid = RadixGrid::new(streamed.max(other) as u64, sm_count);
    let histogram = (grid.blocks as usize) << MAX_RADIX_BITS;
    // Keys and ids of both sides, the sort's second buffers for the larger
    // side, bounds and offsets of the streamed side, the histogram and its
    // scan, and the output pairs.
    8 * (2 * rows + 2 * streamed.max(other) + 2 * streamed + 2 * histogram + 2 * max_pairs)
}

/// CPU references.
#[cfg(any(test, feature = "test-support"))]
pub mod reference {
    /// What [`super::radix_sort`] must produce: a stable sort by key.
    pub fn sort(keys: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let mut order: Vec<u64> = (0..keys.len() as u64).collect();
        order.sort_by_key(|&i| keys[i as usize]); // stable
        (order.iter().map(|&i| keys[i as usize]).collect(), order)
    }

    /// The (streamed position, other row id) pairs of sorted `streamed`
    /// against sorted `other` (with `other_ids` its row ids), in the order
    /// [`super::MergeMatches::expand`] emits them.
    pub fn merge_pairs(streamed: &[u64], other: &[u64], other_ids: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let (mut positions, mut ids) = (Vec::new(), Vec::new());
        for (i, key) in streamed.iter().enumerate() {
            let lower = other.partition_point(|k| k < key);
            let upper = other.partition_point(|k| k <= key);
            for &id in &other_ids[lower..upper] {
                positions.push(i as u64);
                ids.push(id);
            }
        }
        (positions, ids)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rebased_codes_are_the_codes_of_the_wider_base() {
        // Raw words of signed keys; the side's own range inside the join's.
        let keys: Vec<u64> = [-5i64, 0, 17, 1 << 40, -(1 << 50)]
            .iter()
            .map(|&k| k as u64)
            .collect();
        let (side_min, side_max) = (-(1i64 << 50), 1i64 << 40);
        let (join_min, join_max) = (i64::MIN, i64::MAX - 3);
        for descending in [false, true] {
            let (from, to) = match descending {
                false => (side_min, join_min),
                true => (side_max, join_max),
            };
            let from = CodeTransform {
                base: from as u64,
                descending,
            };
            let to = CodeTransform {
                base: to as u64,
                descending,
            };
            let shift = rebase_shift(from, to).expect("different bases");
            for &key in &keys {
                assert_eq!(shift.code(from.code(key)), to.code(key), "{descending}");
            }
            assert_eq!(rebase_shift(to, to), None);
        }
    }

    use super::*;

    #[test]
    fn sort_passes_cover_the_key_bits_evenly() {
        assert!(sort_pass_bits(0).is_empty());
        assert_eq!(sort_pass_bits(1), vec![1]);
        assert_eq!(sort_pass_bits(8), vec![8]);
        assert_eq!(sort_pass_bits(26), vec![7, 7, 6, 6]);
        assert_eq!(sort_pass_bits(64), vec![8; 8]);
        assert_eq!(sort_pass_bits(70), vec![8; 8]);
    }

    #[test]
    fn reference_merge_pairs_each_key_with_its_run() {
        let (sorted, ids) = reference::sort(&[5, 3, 5, 9]);
        assert_eq!(sorted, vec![3, 5, 5, 9]);
        assert_eq!(ids, vec![1, 0, 2, 3]);
        let (positions, other) = reference::merge_pairs(&[1, 5, 9, 9], &sorted, &ids);
        assert_eq!(positions, vec![1, 1, 2, 3]);
        assert_eq!(other, vec![0, 2, 3, 3]);
    }
}
