//! Launches of the radix partitioning kernels (`ptx/radix_partition.cu`):
//! a pass's per-block digit histogram and its stable scatter, the
//! partitions' starts after the last pass, and the largest partition's
//! rows.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{
    arg_or_null, check_len, config, grid_stride_blocks, Launcher, BLOCK_THREADS, MAX_RADIX_BITS,
    NULL_POINTER,
};
use crate::gpu::{DriverResultExt, GpuError, GpuResult};

/// The block decomposition shared by `radix_histogram` and `radix_scatter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixGrid {
    /// Blocks; block `b` owns rows `[b * rows_per_block, (b + 1) * rows_per_block)`.
    pub blocks: u64,
    /// Rows per block (below 2^32, as the per-block counters are 32-bit).
    pub rows_per_block: u64,
}

impl RadixGrid {
    /// Spreads `rows` over about four blocks per multiprocessor, with at
    /// least one tile of [`BLOCK_THREADS`] rows per block.
    pub fn new(rows: u64, sm_count: u32) -> Self {
        let target_blocks = (u64::from(sm_count) * 4).max(1);
        let rows_per_block = rows
            .div_ceil(target_blocks)
            .max(u64::from(BLOCK_THREADS) * 4);
        let blocks = rows.div_ceil(rows_per_block).max(1);
        Self {
            blocks,
            rows_per_block,
        }
    }
}

/// Which bits of a key a radix pass reads its digit from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RadixDigits {
    /// Bits of `mix64(key)`: partitioning for the hash join.
    Hashed,
    /// Bits of `mix64` of each word's low half: partitioning one-word rows
    /// (the key below 2^32 in the low half, the row's id or a carried
    /// value in the high half, see [`super::pack_key_words`]), which move without
    /// a row-id array.
    HashedLowHalf,
    /// Bits of the key itself: sorting.
    Key,
}

impl RadixDigits {
    /// The kernels' `key_mask`: what of a word is its key.
    fn key_mask(self) -> u64 {
        match self {
            RadixDigits::HashedLowHalf => u64::from(u32::MAX),
            RadixDigits::Hashed | RadixDigits::Key => u64::MAX,
        }
    }

    /// Whether rows are one word each, with no row-id array.
    pub fn one_word(self) -> bool {
        self == RadixDigits::HashedLowHalf
    }
}

/// `radix_histogram` (or `radix_sort_histogram` for [`RadixDigits::Key`]):
/// per-block counts of digit `(mix64(key) >> shift) & (2^bits - 1)` (the
/// key being each word's low half for [`RadixDigits::HashedLowHalf`], or,
/// sorting, of the key's own bits), written as `histogram[digit * blocks + block]`.
#[allow(clippy::too_many_arguments)]
pub fn radix_histogram(
    launcher: &Launcher<'_>,
    digits: RadixDigits,
    keys: &CudaSlice<u64>,
    shift: u32,
    bits: u32,
    grid: RadixGrid,
    histogram: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    if bits == 0 || bits > MAX_RADIX_BITS {
        return Err(GpuError::Invalid(format!("radix pass of {bits} bits")));
    }
    check_len(histogram, (grid.blocks as usize) << bits, "radix histogram")?;
    let n = keys.len() as u64;
    let kernel = match digits {
        RadixDigits::Hashed | RadixDigits::HashedLowHalf => &kernels.radix_histogram,
        RadixDigits::Key => &kernels.radix_sort_histogram,
    };
    let key_mask = digits.key_mask();
    let mut launch = stream.launch_builder(kernel);
    launch
        .arg(keys)
        .arg(&n)
        .arg(&key_mask)
        .arg(&shift)
        .arg(&bits)
        .arg(&grid.rows_per_block)
        .arg(histogram);
    // SAFETY: reads keys[..n]; writes histogram[..2^bits * blocks], checked above.
    unsafe { launch.launch(config(grid.blocks)?) }.during("launching radix_histogram")?;
    Ok(())
}

/// `radix_scatter` (or `radix_sort_scatter`): stable scatter of (key, row
/// id) pairs, or of one-word rows without `ids` ([`RadixDigits::HashedLowHalf`]
/// and only it), to the positions given by the exclusive scan of
/// [`radix_histogram`]'s output with the same `digits`.
#[allow(clippy::too_many_arguments)]
pub fn radix_scatter(
    launcher: &Launcher<'_>,
    digits: RadixDigits,
    keys_in: &CudaSlice<u64>,
    ids: Option<(&CudaSlice<u64>, &mut CudaSlice<u64>)>,
    shift: u32,
    bits: u32,
    grid: RadixGrid,
    offsets: &CudaSlice<u64>,
    keys_out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, .. } = *launcher;
    let n = keys_in.len();
    if bits == 0 || bits > MAX_RADIX_BITS {
        return Err(GpuError::Invalid(format!("radix pass of {bits} bits")));
    }
    if ids.is_some() == digits.one_word() {
        return Err(GpuError::Invalid(format!(
            "a radix pass over {digits:?} digits {} row ids",
            if ids.is_some() { "with" } else { "without" }
        )));
    }
    if let Some((ids_in, ids_out)) = &ids {
        check_len(ids_in, n, "row ids")?;
        check_len(ids_out, n, "partitioned row ids")?;
    }
    check_len(keys_out, n, "partitioned keys")?;
    check_len(offsets, (grid.blocks as usize) << bits, "radix offsets")?;
    let n64 = n as u64;
    let key_mask = digits.key_mask();
    let kernel = match digits {
        RadixDigits::Hashed | RadixDigits::HashedLowHalf => &kernels.radix_scatter,
        RadixDigits::Key => &kernels.radix_sort_scatter,
    };
    // One-word rows pass a null pointer for each id array: never touched.
    let (ids_in, ids_out) = ids.map_or((None, None), |(ids_in, ids_out)| {
        (Some(ids_in), Some(ids_out))
    });
    let mut launch = stream.launch_builder(kernel);
    launch.arg(keys_in);
    arg_or_null(&mut launch, ids_in);
    launch
        .arg(&n64)
        .arg(&key_mask)
        .arg(&shift)
        .arg(&bits)
        .arg(&grid.rows_per_block)
        .arg(offsets)
        .arg(keys_out);
    match ids_out {
        Some(ids_out) => launch.arg(ids_out),
        None => launch.arg(&NULL_POINTER),
    };
    // SAFETY: offsets are an exclusive scan of the histogram of the same keys,
    // so every destination lies in [0, n); all lengths checked above; null
    // id arrays (one-word rows) are never touched.
    unsafe { launch.launch(config(grid.blocks)?) }.during("launching radix_scatter")?;
    Ok(())
}

/// `partition_bounds`: `starts[p]` = first row of partition `p` for every `p`
/// in `[0, 2^total_bits]`, for keys ordered by partition over `digits`
/// (hashed: whole words or their low halves). `keys` must be non-empty.
pub fn partition_bounds(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    digits: RadixDigits,
    total_bits: u32,
    starts: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = keys.len() as u64;
    if n == 0 {
        return Err(GpuError::Invalid(
            "partition_bounds needs at least one row".into(),
        ));
    }
    if digits == RadixDigits::Key {
        return Err(GpuError::Invalid(
            "partition bounds of keys sorted by their own bits".into(),
        ));
    }
    check_len(starts, (1usize << total_bits) + 1, "partition starts")?;
    let key_mask = digits.key_mask();
    let mut launch = stream.launch_builder(&kernels.partition_bounds);
    launch
        .arg(keys)
        .arg(&n)
        .arg(&key_mask)
        .arg(&total_bits)
        .arg(starts);
    // SAFETY: writes starts[..=2^total_bits], length checked; reads keys[..n].
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching partition_bounds")?;
    Ok(())
}

/// `largest_partition`: raises `largest[0]` to the most rows one of the
/// `partitions` partitions whose starts are `starts` (`partitions + 1`
/// entries, never decreasing) holds; the caller zeroes it first.
pub fn largest_partition(
    launcher: &Launcher<'_>,
    starts: &CudaSlice<u64>,
    partitions: u64,
    largest: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let entries = usize::try_from(partitions)
        .ok()
        .and_then(|p| p.checked_add(1))
        .ok_or_else(|| GpuError::Invalid(format!("{partitions} partitions")))?;
    check_len(starts, entries, "partition starts")?;
    check_len(largest, 1, "largest partition")?;
    let mut launch = stream.launch_builder(&kernels.largest_partition);
    launch.arg(starts).arg(&partitions).arg(largest);
    // SAFETY: reads starts[..=partitions] and writes largest[0], both
    // lengths checked above.
    unsafe { launch.launch(config(grid_stride_blocks(partitions, sm_count))?) }
        .during("launching largest_partition")?;
    Ok(())
}
