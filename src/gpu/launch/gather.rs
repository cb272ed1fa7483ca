//! Typed launches of the gather kernels in `ptx/gather.cu`.

use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};

use super::Launcher;
use super::{check_len, config, grid_stride_blocks, Kernels};
use crate::gpu::{DriverResultExt, GpuError, GpuResult};

/// The width of the values a gather moves, one kernel each. Values are
/// held on the device packed end to end in `u64` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ValueWidth {
    /// Int32, Float32, Date32 and other 4-byte values.
    Four,
    /// Int64, Float64, timestamps and other 8-byte values.
    Eight,
    /// Decimal128 and other 16-byte values.
    Sixteen,
}

impl ValueWidth {
    /// The width of values of `bytes` bytes, where a kernel moves them.
    pub fn of_bytes(bytes: usize) -> Option<Self> {
        match bytes {
            4 => Some(Self::Four),
            8 => Some(Self::Eight),
            16 => Some(Self::Sixteen),
            _ => None,
        }
    }

    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            Self::Four => 4,
            Self::Eight => 8,
            Self::Sixteen => 16,
        }
    }

    /// The `u64` words that hold `values` values packed end to end.
    pub fn words(self, values: usize) -> usize {
        (values * self.bytes()).div_ceil(8)
    }

    /// Checks that `src` holds `values` values of this width, packed in
    /// its words (`what` names it in the error).
    pub(super) fn check_source(
        self,
        src: &CudaSlice<u64>,
        values: usize,
        what: &str,
    ) -> GpuResult<()> {
        if src.len() < self.words(values) {
            return Err(GpuError::Invalid(format!(
                "{what} of {} words holds fewer than {values} values of {} bytes",
                src.len(),
                self.bytes()
            )));
        }
        Ok(())
    }

    fn kernel(self, kernels: &Kernels) -> &CudaFunction {
        match self {
            Self::Four => &kernels.gather_u32,
            Self::Eight => &kernels.gather_u64,
            Self::Sixteen => &kernels.gather_u128,
        }
    }
}

/// `gather_u32` / `gather_u64` / `gather_u128`: value `i` of `out` is value
/// `ids[i]` of `src`, for `i < len`, where `src` holds `src_values` values of
/// `width` packed into words (a whole allocation, so 16-byte values are
/// aligned).
#[allow(clippy::too_many_arguments)]
pub fn gather_values(
    launcher: &Launcher<'_>,
    width: ValueWidth,
    src: &CudaSlice<u64>,
    src_values: usize,
    ids: &CudaSlice<u64>,
    len: usize,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    if len == 0 {
        return Ok(());
    }
    width.check_source(src, src_values, "gather source")?;
    check_len(ids, len, "gather ids")?;
    check_len(out, width.words(len), "gather output")?;
    let (src_len, len64) = (src_values as u64, len as u64);
    let mut launch = stream.launch_builder(width.kernel(kernels));
    launch.arg(src).arg(&src_len).arg(ids).arg(&len64).arg(out);
    // SAFETY: the kernel reads ids[..len] and the values of src below
    // src_values (it checks each id), which lie within src's words, and
    // writes the first len values of out, within its words: all three
    // lengths are checked above. Both buffers are whole allocations, aligned
    // for any of the three widths.
    unsafe { launch.launch(config(grid_stride_blocks(len64, sm_count))?) }
        .during("launching a gather")?;
    Ok(())
}

/// [`gather_values`] over 8-byte values: `out[i] = src[ids[i]]` for
/// `i < len`.
pub fn gather_u64(
    launcher: &Launcher<'_>,
    src: &CudaSlice<u64>,
    ids: &CudaSlice<u64>,
    len: usize,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    gather_values(
        &Launcher::new(kernels, stream, sm_count),
        ValueWidth::Eight,
        src,
        src.len(),
        ids,
        len,
        out)
}

/// `scatter_u64`: `out[ids[i]] = src[i]` for `i < ids.len()`, where `ids`
/// is a permutation of `0..ids.len()` (the inverse of [`gather_u64`]).
pub fn scatter_u64(
    launcher: &Launcher<'_>,
    src: &CudaSlice<u64>,
    ids: &CudaSlice<u64>,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = ids.len();
    check_len(src, n, "scatter source")?;
    check_len(out, n, "scatter output")?;
    if n == 0 {
        return Ok(());
    }
    let (n64, out_len) = (n as u64, out.len() as u64);
    let mut launch = stream.launch_builder(&kernels.scatter_u64);
    launch
        .arg(src)
        .arg(ids)
        .arg(&n64)
        .arg(&mut *out)
        .arg(&out_len);
    // SAFETY: the kernel reads src[..n] and ids[..n] (both checked to hold
    // n) and writes out[id] only for ids below out's length.
    unsafe { launch.launch(config(grid_stride_blocks(n64, sm_count))?) }
        .during("launching scatter_u64")?;
    Ok(())
}

/// `gather_bits`: bit `i` of `out` (64 a word) is bit `ids[i]` of `bits`,
/// for `i < ids.len()`; the rest of the last word is 0.
pub fn gather_bits(
    launcher: &Launcher<'_>,
    bits: &CudaSlice<u64>,
    ids: &CudaSlice<u64>,
    out: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    let n = ids.len();
    let words = n.div_ceil(64);
    check_len(out, words, "gathered bitmap")?;
    if n == 0 {
        return Ok(());
    }
    let (n64, bits_len) = (n as u64, bits.len() as u64);
    let mut launch = stream.launch_builder(&kernels.gather_bits);
    launch
        .arg(bits)
        .arg(&bits_len)
        .arg(ids)
        .arg(&n64)
        .arg(&mut *out);
    // SAFETY: the kernel reads ids[..n], bits only at words below bits_len
    // (it checks each id), and writes out[..n.div_ceil(64)], checked above.
    unsafe { launch.launch(config(grid_stride_blocks(words as u64, sm_count))?) }
        .during("launching gather_bits")?;
    Ok(())
}

/// `widen_words`: the `values` values of a cached column (`src`: 4-byte
/// values two to a word where `narrow`, else one 8-byte word each) written
/// as one 64-bit word each to `out[offset..offset + values]`, 4-byte values
/// sign-extended; with `sign_only`, each word is the value's sign instead
/// (all ones where it is negative, else 0).
pub fn widen_words(
    launcher: &Launcher<'_>,
    src: &CudaSlice<u64>,
    values: usize,
    narrow: bool,
    sign_only: bool,
    out: &mut CudaSlice<u64>,
    offset: usize,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    if values == 0 {
        return Ok(());
    }
    let width = if narrow { ValueWidth::Four } else { ValueWidth::Eight };
    width.check_source(src, values, "a cached column")?;
    let end = offset.checked_add(values).ok_or_else(|| {
        GpuError::Invalid(format!("{values} words at offset {offset} overflow"))
    })?;
    check_len(out, end, "widened words")?;
    let (narrow, sign_only) = (u32::from(narrow), u32::from(sign_only));
    let (n, offset) = (values as u64, offset as u64);
    let mut launch = stream.launch_builder(&kernels.widen_words);
    launch
        .arg(src)
        .arg(&narrow)
        .arg(&sign_only)
        .arg(&n)
        .arg(&mut *out)
        .arg(&offset);
    // SAFETY: the kernel reads the first `values` values of `src` at the
    // width `narrow` gives (checked to lie within its words above) and
    // writes out[offset..offset + values], checked to lie within `out`.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching widen_words")?;
    Ok(())
}

/// `set_table_bits`: sets, in the 32-bit words `words` holds (two a `u64`),
/// bit `p % 32` of word `first_word + p / 32` for each of the first
/// `positions` 32-bit positions of `packed_positions` (two a `u64`).
pub fn set_table_bits(
    launcher: &Launcher<'_>,
    words: &mut CudaSlice<u64>,
    first_word: usize,
    packed_positions: &CudaSlice<u64>,
    positions: usize,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_len(packed_positions, positions.div_ceil(2), "a table's bit positions")?;
    if positions == 0 {
        return Ok(());
    }
    let (first, words_len, n) = (first_word as u64, 2 * words.len() as u64, positions as u64);
    let mut launch = stream.launch_builder(&kernels.set_table_bits);
    launch
        .arg(&mut *words)
        .arg(&first)
        .arg(&words_len)
        .arg(packed_positions)
        .arg(&n);
    // SAFETY: the kernel reads the first `positions` 32-bit values of
    // packed_positions, which holds at least that many (checked above),
    // and writes only 32-bit words below words_len, the 32-bit words
    // `words` holds.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching set_table_bits")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_pack_values_into_whole_words() {
        assert_eq!(ValueWidth::of_bytes(4), Some(ValueWidth::Four));
        assert_eq!(ValueWidth::of_bytes(2), None);
        assert_eq!(ValueWidth::of_bytes(32), None);
        assert_eq!(ValueWidth::Four.words(3), 2);
        assert_eq!(ValueWidth::Four.words(4), 2);
        assert_eq!(ValueWidth::Eight.words(3), 3);
        assert_eq!(ValueWidth::Sixteen.words(3), 6);
        assert_eq!(ValueWidth::Sixteen.words(0), 0);
    }
}
