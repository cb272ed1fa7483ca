//! Typed launches of the merge-path kernels in `ptx/merge_join.cu`.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::Launcher;
use super::{check_len, config, grid_stride_blocks, BLOCK_THREADS};
use crate::gpu::{DriverResultExt, GpuResult};

/// Merged elements each block of `merge_path_bounds` takes into shared
/// memory (`MERGE_TILE` in `ptx/merge_join.cu`: 8 per thread): long enough
/// to amortise the block's two binary searches, short enough to spread any
/// input over the whole device.
pub const MERGE_TILE: u64 = 8 * BLOCK_THREADS as u64;

/// Which bound of the run of equal keys `merge_path_bounds` computes.
#[derive(Debug, Clone, Copy)]
pub enum MergeBound<'a> {
    /// `out[i] = #{b < a[i]}`.
    Lower,
    /// `out[i] = #{b <= a[i]} - lower[i]`: the number of matches of `a[i]`.
    CountAbove(&'a CudaSlice<u64>),
}

/// `merge_path_bounds` over sorted `a` and `b`, writing `out[..a.len()]`.
pub fn merge_path_bounds(
    launcher: &Launcher<'_>,
    a: &CudaSlice<u64>,
    b: &CudaSlice<u64>,
    bound: MergeBound<'_>,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    let (n, m) = (a.len() as u64, b.len() as u64);
    if n == 0 {
        return Ok(());
    }
    check_len(out, n as usize, "merge bounds")?;
    let blocks = (n + m).div_ceil(MERGE_TILE);
    let (upper, lower): (u32, Option<&CudaSlice<u64>>) = match bound {
        MergeBound::Lower => (0, None),
        MergeBound::CountAbove(lower) => {
            check_len(lower, n as usize, "lower bounds")?;
            (1, Some(lower))
        }
    };
    let mut launch = stream.launch_builder(&kernels.merge_path_bounds);
    launch.arg(a).arg(&n).arg(b).arg(&m).arg(&upper);
    // A null pointer tells the kernel there is nothing to subtract.
    let null: u64 = 0;
    match lower {
        Some(lower) => launch.arg(lower),
        None => launch.arg(&null),
    };
    launch.arg(out);
    // SAFETY: the blocks' tiles cover the n + m merged elements; each reads a[..n] and
    // b[..m] (the slices' lengths) and writes out[i] for i < n, checked
    // above; `lower` holds n elements when given, and a zero pointer is
    // never dereferenced (the kernel tests it).
    unsafe { launch.launch(config(blocks)?) }.during("launching merge_path_bounds")?;
    Ok(())
}

/// `expand_pairs`: the pairs at output positions `[first, first + len)`,
/// as (sorted position in a, row id of b), into `out_*[..len]`.
#[allow(clippy::too_many_arguments)]
pub fn expand_pairs(
    launcher: &Launcher<'_>,
    offsets: &CudaSlice<u64>,
    lower: &CudaSlice<u64>,
    b_ids: &CudaSlice<u64>,
    first: u64,
    len: usize,
    out_a_pos: &mut CudaSlice<u64>,
    out_b_ids: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = offsets.len() as u64;
    if len == 0 || n == 0 {
        return Ok(());
    }
    check_len(lower, n as usize, "lower bounds")?;
    check_len(out_a_pos, len, "pair positions")?;
    check_len(out_b_ids, len, "pair row ids")?;
    let len64 = len as u64;
    let mut launch = stream.launch_builder(&kernels.expand_pairs);
    launch
        .arg(offsets)
        .arg(lower)
        .arg(&n)
        .arg(b_ids)
        .arg(&first)
        .arg(&len64)
        .arg(out_a_pos)
        .arg(out_b_ids);
    // SAFETY: `offsets` is the exclusive scan of the match counts made from
    // `lower` over `b_ids`' side, and the caller keeps first + len within the
    // match total, so every lower[i] + (p - offsets[i]) is below b_ids.len();
    // writes stay in out_*[..len], checked above.
    unsafe { launch.launch(config(grid_stride_blocks(len64, sm_count))?) }
        .during("launching expand_pairs")?;
    Ok(())
}

/// How raw 8-byte integer keys become order-preserving codes on the device:
/// each key's distance from `base`, the smallest key of both sides, or, for
/// a `descending` key, from the largest (the host's codes of a key column
/// without NULLs, see `OrderedKeyEncoder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeTransform {
    /// The bits of the smallest (ascending) or largest (descending) key.
    pub base: u64,
    pub descending: bool,
}

impl CodeTransform {
    /// The code of the raw key `key`, as `ordered_codes` computes it.
    pub fn code(self, key: u64) -> u64 {
        if self.descending {
            self.base.wrapping_sub(key)
        } else {
            key.wrapping_sub(self.base)
        }
    }
}

/// `ordered_codes`: every raw key of `keys` replaced, in place, by its code
/// under `transform`.
pub fn ordered_codes(
    launcher: &Launcher<'_>,
    keys: &mut CudaSlice<u64>,
    transform: CodeTransform,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let descending = u32::from(transform.descending);
    let mut launch = stream.launch_builder(&kernels.ordered_codes);
    launch
        .arg(&mut *keys)
        .arg(&n)
        .arg(&transform.base)
        .arg(&descending);
    // SAFETY: reads and writes keys[..n] with n = keys.len().
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching ordered_codes")?;
    Ok(())
}
