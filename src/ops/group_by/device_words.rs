//! Words that lie on the device already (a table's columns in the device
//! column cache), laid out end to end in device memory where host words
//! would be copied over the bus.

use super::*;
use crate::gpu::launch::ValueWidth;

/// One piece of [`Words::on_device`]: the values of one part of a cached
/// column, read where they lie.
#[derive(Clone)]
pub struct DeviceWordPiece {
    /// The column's words (held, so their memory lives while they are read).
    pub values: Arc<dyn AsRef<DeviceVec<u64>> + Send + Sync>,
    /// Values in the piece.
    pub rows: usize,
    /// The values are 4-byte signed integers, two to a word, each
    /// sign-extended as it is laid out.
    pub narrow: bool,
    /// Each word laid out is the value's sign rather than the value (all
    /// ones where it is negative): the high words of a 128-bit input.
    pub sign_only: bool,
}

impl std::fmt::Debug for DeviceWordPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWordPiece")
            .field("rows", &self.rows)
            .field("narrow", &self.narrow)
            .field("sign_only", &self.sign_only)
            .finish()
    }
}

/// `words` (on the device) laid out end to end in a new device vector, on
/// `stream`: one kernel a piece, reading each where it lies.
pub(super) fn lay_out(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    words: &Words,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    // Every word is written below, one piece after the other.
    let mut out = alloc_uninit::<u64>(stream, words.len(), "allocating words laid out")?;
    let mut offset = 0;
    for piece in &words.on_device {
        let values: &DeviceVec<u64> = piece.values.as_ref().as_ref();
        timer.time(Phase::Kernel, || {
            launch::widen_words(
                &device.launcher(stream),
                values,
                piece.rows,
                piece.narrow,
                piece.sign_only,
                &mut out,
                offset,
            )
        })?;
        offset += piece.rows;
    }
    Ok(out)
}

/// About `count` of `words` (on the device), spread evenly over them, each
/// as [`lay_out`] would write it: the rows `i * len / count` for
/// `i < count`, gathered on the device piece by piece and copied back.
pub fn sample(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    words: &Words,
    count: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<u64>> {
    let rows = words.len();
    let count = count.min(rows);
    let mut sampled = Vec::with_capacity(count);
    let mut first = 0;
    let mut next = 0;
    for piece in &words.on_device {
        let last = first + piece.rows;
        let mut ids = Vec::new();
        while next < count && next * rows / count < last {
            ids.push((next * rows / count - first) as u64);
            next += 1;
        }
        first = last;
        if ids.is_empty() {
            continue;
        }
        let width = if piece.narrow { ValueWidth::Four } else { ValueWidth::Eight };
        let device_ids = upload_u64(device, stream, &ids, timer)?;
        // The gather below writes every one of these words' values.
        let mut gathered = alloc_uninit::<u64>(stream, width.words(ids.len()), "allocating a sample")?;
        let values: &DeviceVec<u64> = piece.values.as_ref().as_ref();
        timer.time(Phase::Kernel, || {
            launch::gather_values(
                &device.launcher(stream),
                width,
                values,
                piece.rows,
                &device_ids,
                ids.len(),
                &mut gathered,
            )
        })?;
        let mut back = Vec::new();
        download_u64(device, stream, &gathered.slice(0..width.words(ids.len())), &mut back, timer)?;
        for i in 0..ids.len() {
            let value = match piece.narrow {
                // Two 4-byte values a word, the first in the low half.
                true => i64::from((back[i / 2] >> (32 * (i % 2))) as u32 as i32),
                false => back[i] as i64,
            };
            sampled.push(match piece.sign_only {
                true => (value >> 63) as u64,
                false => value as u64,
            });
        }
    }
    Ok(sampled)
}
