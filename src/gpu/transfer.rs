//! Host-device copies through pinned staging buffers.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtrMut};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::ToByteSlice;

use super::pinned_region::region_holding;
use super::pinned_words::PinnedWords;
use super::{
    DriverResultExt, FillingBuffer, GpuDevice, GpuError, GpuResult, Phase, PhaseTimer, PinnedBuffer,
    PinnedRegion,
};
use super::host_pages::zeroed_for_fill;
use crate::host::copy::{
    copy_window, fill_window, host_threads, narrow_to_halves, narrow_to_words, sign_extend_words,
    SignedBytes,
};

/// Copies `host` to a new device vector on `stream`, staged through a pinned
/// buffer so that the copy runs at full bus speed. Returns once the copy is
/// enqueued; the staging buffer goes back to the pool and is reused only
/// after the copy has finished.
pub fn upload_u64(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    host: &[u64],
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    upload_u64_pieces(device, stream, &[host], timer)
}

/// Copies `pieces`, laid end to end, to one new device vector on `stream`,
/// staged through one pinned buffer (filled by several threads when the
/// pieces are large), so that a column held as many Arrow batches is never
/// concatenated on the host. Returns once the copy is enqueued.
pub fn upload_u64_pieces(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pieces: &[&[u64]],
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
    upload_byte_pieces(device, stream, &bytes, timer)
}

/// [`upload_u64_pieces`] of words that are 8-byte signed integers (join
/// keys, group codes), through [`StagingWindows::upload_words_narrowed`]:
/// at 4 bytes each where every one of them fits 32 bits.
pub fn upload_words_narrowed(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pieces: &[&[u64]],
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
    StagingWindows::standard(device).upload_words_narrowed(stream, &bytes, timer)
}

/// Copies the first `bytes` bytes of `filled` to a new device vector of
/// whole words on `stream` (the last word padded with zeros), straight from
/// its page-locked memory: words the host made there need no staging.
/// Returns once the copy is enqueued; the buffer goes back to its pool,
/// which lends it again only after the copy has finished. `bytes` beyond
/// the buffer are refused.
pub fn upload_filled(
    stream: &Arc<CudaStream>,
    mut filled: FillingBuffer,
    bytes: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    let len = bytes.div_ceil(8).max(1);
    if len > filled.len() {
        return Err(GpuError::Invalid(format!(
            "{bytes} bytes to copy from a filled buffer of {} words",
            filled.len()
        )));
    }
    filled.as_mut_bytes()[bytes..8 * len].fill(0);
    let mut buffer = filled.into_buffer();
    // SAFETY: every element is written by the copy below before any kernel reads it.
    let mut dst = unsafe { stream.alloc::<u64>(len) }.during("allocating device memory")?;
    copy_pinned_words(stream, buffer.raw_mut(), len, &mut dst, timer)?;
    timer.add_bytes(Phase::HostToDevice, 8 * len);
    timer.add_direct_copies(8 * len, 1);
    Ok(dst)
}

/// Enqueues the copy of the first `len` words of `buffer` into `dst` on
/// `stream`, timed as a host-to-device phase.
fn copy_pinned_words<Dst: DevicePtrMut<u64>>(
    stream: &Arc<CudaStream>,
    buffer: &mut PinnedWords,
    len: usize,
    dst: &mut Dst,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    timer.time_on(stream, Phase::HostToDevice, || {
        let src = PinnedRange {
            buffer,
            start: 0,
            len,
        };
        stream
            .memcpy_htod(&src, dst)
            .during("copying to the device")
    })
}

/// Bytes staged for one host-to-device copy. A longer upload goes through
/// two pinned buffers of this size in turn: the host fills one while the
/// previous one is on the bus, so the staging copy and the transfer overlap,
/// and pinned memory stays bounded whatever the column's length (a first
/// query over a 2 GB column would otherwise wait a second for the driver to
/// pin 2 GB).
const STAGING_WINDOW_BYTES: usize = 1 << 26;

/// Copies the bytes of `pieces`, laid end to end, to one new device vector
/// of whole words on `stream` (the last word padded with zeros), staged
/// through pinned windows of `STAGING_WINDOW_BYTES`: how columns of 4- and
/// 16-byte values travel in the same words as 8-byte ones. Returns once the
/// last copy is enqueued.
pub fn upload_byte_pieces(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pieces: &[&[u8]],
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    upload_byte_pieces_in_windows(device, stream, pieces, STAGING_WINDOW_BYTES, timer)
}

/// [`upload_byte_pieces`] through windows of `window_bytes` (rounded down
/// to whole words, at least one): a test can cross many window boundaries
/// with little data.
pub fn upload_byte_pieces_in_windows(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    pieces: &[&[u8]],
    window_bytes: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    StagingWindows::new(device, window_bytes).upload_bytes(stream, pieces, timer)
}

/// Uploads staged through the same two pinned buffers in turn: the host
/// fills one window while the previous one is on the bus, across the
/// uploads of one `StagingWindows` as within each. Columns sent in chunks,
/// one upload a chunk, keep the overlap that separate uploads, each ending
/// with its last window on the bus, would lose at every chunk.
pub struct StagingWindows<'a> {
    device: &'a GpuDevice,
    window_words: usize,
    buffers: [Option<PinnedBuffer>; 2],
    windows: usize,
}

/// 4-byte values on the device, two to a word ([`StagingWindows::upload_halved`]).
struct Halves {
    words: CudaSlice<u64>,
    values: usize,
}

impl<'a> StagingWindows<'a> {
    /// Windows of `window_bytes` (rounded down to whole words, at least one).
    pub fn new(device: &'a GpuDevice, window_bytes: usize) -> Self {
        Self {
            device,
            window_words: (window_bytes / 8).max(1),
            buffers: [None, None],
            windows: 0,
        }
    }

    /// Windows of the size every upload stages through by default (64 MiB).
    pub fn standard(device: &'a GpuDevice) -> Self {
        Self::new(device, STAGING_WINDOW_BYTES)
    }

    /// [`upload_u64_pieces`] through these windows.
    pub fn upload_u64(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[u64]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
        self.upload_bytes(stream, &bytes, timer)
    }

    /// [`upload_byte_pieces`] through these windows.
    pub fn upload_bytes(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[u8]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let bytes: usize = pieces.iter().map(|p| p.len()).sum();
        let len = bytes.div_ceil(8);
        if len == 0 {
            return stream
                .null::<u64>()
                .during("allocating an empty device vector");
        }
        if let Some(runs) = pinned_runs(pieces) {
            // SAFETY: every element is written by the copies below before
            // any kernel reads it.
            let mut dst = unsafe { stream.alloc::<u64>(len) }.during("allocating device memory")?;
            copy_pinned_runs(stream, &runs, bytes, &mut dst, timer)?;
            return Ok(dst);
        }
        let uploaded = self.upload_windows(
            stream,
            len,
            |staging, first_word, words| {
                let target = &mut staging.as_mut_bytes()?[..8 * words];
                let first_byte = 8 * first_word;
                let data_bytes = (bytes - first_byte).min(8 * words);
                let (data, padding) = target.split_at_mut(data_bytes);
                copy_window(data, pieces, first_byte, host_threads(), BYTES_PER_THREAD);
                padding.fill(0);
                Ok(true)
            },
            timer,
        )?;
        uploaded.ok_or_else(|| GpuError::Invalid("a copied window was refused".into()))
    }

    /// `values` (16-byte little-endian signed integers laid end to end over
    /// `pieces`) copied to one new device vector as 8-byte words, each
    /// narrowed on the host as it is staged: half the bus bytes of the
    /// values themselves. `None` (nothing kept on the device) where a value
    /// does not fit 64 bits; the caller then sends them whole.
    pub fn upload_narrowed(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[[u8; 16]]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<CudaSlice<u64>>> {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        self.upload_windows(
            stream,
            len,
            |staging, first_word, words| {
                let target = &mut staging.as_mut_slice()?[..words];
                Ok(fill_window(
                    target,
                    pieces,
                    first_word,
                    host_threads(),
                    BYTES_PER_THREAD / 16,
                    narrow_to_words,
                ))
            },
            timer,
        )
    }

    /// 8-byte little-endian signed integers (join keys, or an 8-byte
    /// column's values; `pieces` of whole values laid end to end) copied to
    /// one new device vector of a word each, sent at 4 bytes a value where
    /// every one of them fits 32 bits and sign-extended on the device: half
    /// the bus bytes. The narrowing is tried as the values are staged;
    /// where one does not fit, they are sent again whole (after the windows
    /// already sent, which are lost: at most half their bytes more). Values
    /// already in pinned memory are sent whole from where they lie, as are
    /// pieces that are not whole values.
    pub fn upload_words_narrowed(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[u8]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        if in_pinned_memory(pieces) || pieces.iter().any(|p| p.len() % 8 != 0) {
            return self.upload_bytes(stream, pieces, timer);
        }
        let values: Vec<&[[u8; 8]]> = pieces.iter().map(|p| p.as_chunks::<8>().0).collect();
        match self.upload_halved(stream, &values, timer)? {
            Some(halves) => self.widen_halves(stream, halves, timer),
            None => self.upload_bytes(stream, pieces, timer),
        }
    }

    /// `values` (16-byte little-endian signed integers, decimals) copied to
    /// one new device vector as 8-byte words, each the value it equals:
    /// sent at 4 bytes where every value fits 32 bits (widened on the
    /// device), else at 8 where every one fits 64 bits
    /// ([`Self::upload_narrowed`]). `None` where one does not; the caller
    /// then sends them whole. A refusal loses the windows already sent.
    pub fn upload_decimals_narrowed(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[[u8; 16]]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<CudaSlice<u64>>> {
        match self.upload_halved(stream, pieces, timer)? {
            Some(halves) => self.widen_halves(stream, halves, timer).map(Some),
            None => self.upload_narrowed(stream, pieces, timer),
        }
    }

    /// Signed little-endian integers (of 8 or 16 bytes) laid end to end over
    /// `pieces`, copied to one new device vector as 4-byte values, two to a
    /// word (the last word's high half zero), each narrowed on the host as
    /// it is staged ([`narrow_to_halves`]). `None` (nothing kept on the
    /// device) where a value does not fit 32 bits. [`Self::widen_halves`]
    /// makes them words again.
    fn upload_halved<V: SignedBytes>(
        &mut self,
        stream: &Arc<CudaStream>,
        pieces: &[&[V]],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<Halves>> {
        let values: usize = pieces.iter().map(|p| p.len()).sum();
        let halves = self.upload_windows(
            stream,
            values.div_ceil(2),
            |staging, first_word, words| {
                let first = 2 * first_word;
                let count = (values - first).min(2 * words);
                let (target, padding) = staging.as_mut_halves()?[..2 * words].split_at_mut(count);
                padding.fill(0);
                Ok(fill_window(
                    target,
                    pieces,
                    first,
                    host_threads(),
                    BYTES_PER_THREAD / std::mem::size_of::<V>(),
                    narrow_to_halves::<V>,
                ))
            },
            timer,
        )?;
        Ok(halves.map(|words| Halves { words, values }))
    }

    /// The values of `halves` as one word each, sign-extended on the
    /// device (`widen_words`); the halves are freed in stream order once
    /// read.
    fn widen_halves(
        &self,
        stream: &Arc<CudaStream>,
        halves: Halves,
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let Halves { words: narrow, values } = halves;
        if values == 0 {
            return Ok(narrow);
        }
        // widen_words writes every element.
        let mut words = super::alloc_uninit::<u64>(stream, values, "allocating widened words")?;
        timer.time(Phase::Kernel, || {
            super::launch::widen_words(
                &self.device.launcher(stream),
                &narrow,
                values,
                true,
                false,
                &mut words,
                0,
            )
        })?;
        Ok(words)
    }

    /// A new device vector of `len` words, each window of it filled on the
    /// host by `fill` (given the staging buffer, the window's first word
    /// and its words) and copied up while the next is filled. `None` where
    /// `fill` refused a window: the vector is dropped (freed in stream
    /// order, after the copies already enqueued). An empty vector where
    /// `len` is 0.
    fn upload_windows(
        &mut self,
        stream: &Arc<CudaStream>,
        len: usize,
        mut fill: impl FnMut(&mut PinnedBuffer, usize, usize) -> GpuResult<bool>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<CudaSlice<u64>>> {
        if len == 0 {
            return stream
                .null::<u64>()
                .during("allocating an empty device vector")
                .map(Some);
        }
        // SAFETY: every element is written by the copies below before any
        // kernel reads it; a vector whose window was refused is dropped
        // unread.
        let mut dst = unsafe { stream.alloc::<u64>(len) }.during("allocating device memory")?;
        // Two buffers in turn: filling one waits (in `as_mut_bytes` or
        // `as_mut_slice`) only for the copy enqueued from it two windows
        // earlier.
        for first_word in (0..len).step_by(self.window_words) {
            let words = self.window_words.min(len - first_word);
            let slot = &mut self.buffers[self.windows % 2];
            self.windows += 1;
            if slot.as_ref().is_some_and(|buffer| buffer.len() < words) {
                // Too small for this window (taken for a shorter upload):
                // back to the pool, which waits for its copy before reuse.
                *slot = None;
            }
            let staging = match slot {
                Some(buffer) => buffer,
                empty => empty.insert(self.device.pinned().take_timed(words, timer)?),
            };
            // Waits for the copy still reading the buffer before the
            // filling is timed (`fill`'s own wait is then for a finished one).
            staging.as_mut_slice()?;
            let filling = std::time::Instant::now();
            let filled = fill(staging, first_word, words)?;
            timer.add_host_staging(filling.elapsed());
            if !filled {
                return Ok(None);
            }
            let mut window_of_dst = dst.slice_mut(first_word..first_word + words);
            copy_pinned_words(stream, staging.raw_mut(), words, &mut window_of_dst, timer)?;
            // Counted window by window: a refused upload's earlier windows
            // crossed the bus too.
            timer.add_bytes(Phase::HostToDevice, 8 * words);
        }
        Ok(Some(dst))
    }
}

/// Bytes one staging thread copies at least.
const BYTES_PER_THREAD: usize = 1 << 22;

/// Bytes that lie end to end in one pinned region, and where they go among
/// the uploaded bytes.
struct PinnedRun<'a> {
    region: Arc<PinnedRegion>,
    bytes: &'a [u8],
    at: usize,
}

/// Whether [`upload_byte_pieces`] copies `pieces` straight from pinned
/// host memory, without staging them on the host.
pub fn in_pinned_memory(pieces: &[&[u8]]) -> bool {
    pinned_runs(pieces).is_some()
}

/// `pieces` as runs of contiguous bytes in pinned regions
/// ([`super::pin_batches`]), or `None` when any piece lies elsewhere: then
/// everything is staged, which costs no more than staging that piece alone
/// once the host's copy is the bottleneck.
fn pinned_runs<'a>(pieces: &[&'a [u8]]) -> Option<Vec<PinnedRun<'a>>> {
    let mut runs: Vec<PinnedRun<'a>> = Vec::new();
    let mut at = 0;
    for &piece in pieces.iter().filter(|p| !p.is_empty()) {
        let extended = runs.last_mut().and_then(|run| {
            let joined_len = run.bytes.len() + piece.len();
            let joins = run.bytes.as_ptr_range().end == piece.as_ptr()
                && run
                    .region
                    .holds_addresses(run.bytes.as_ptr() as usize, joined_len);
            // SAFETY: the two slices are adjacent and both inside the run's
            // region (checked just above), one live allocation that the
            // pieces' owners keep alive for `'a`; nothing writes to it.
            joins.then(|| {
                run.bytes = unsafe { std::slice::from_raw_parts(run.bytes.as_ptr(), joined_len) }
            })
        });
        if extended.is_none() {
            runs.push(PinnedRun {
                region: region_holding(piece)?,
                bytes: piece,
                at,
            });
        }
        at += piece.len();
    }
    Some(runs)
}

/// Copies `runs` (`bytes` bytes in all) straight from pinned host memory
/// into `dst`, on `stream`, zeroing the last word's padding; each run's
/// region is kept alive until its copy has finished.
fn copy_pinned_runs(
    stream: &Arc<CudaStream>,
    runs: &[PinnedRun<'_>],
    bytes: usize,
    dst: &mut CudaSlice<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let len = dst.len();
    if !bytes.is_multiple_of(8) {
        let mut last = dst.slice_mut(len - 1..len);
        stream
            .memset_zeros(&mut last)
            .during("zeroing an upload's last word")?;
    }
    let copied = timer.time_on(stream, Phase::HostToDevice, || {
        let (base, _record_write) = dst.device_ptr_mut(stream);
        for run in runs {
            // SAFETY: the destination range `[at, at + len)` lies within
            // `dst`'s `8 * len >= bytes` bytes; the source is pinned host
            // memory of a live region, kept alive past the copy by
            // `hold_until_done` below, and Arrow buffers are never written
            // once built.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    base + run.at as u64,
                    run.bytes,
                    stream.cu_stream(),
                )
            }
            .during("copying from pinned host memory to the device")?;
        }
        Ok(())
    });
    // Whatever was enqueued, even before a failed copy, keeps its region
    // alive until it has finished.
    // (Regions are few: one per pinned partition, however many runs.)
    let mut held: Vec<&Arc<PinnedRegion>> = Vec::new();
    for run in runs {
        if !held.iter().any(|r| Arc::ptr_eq(r, &run.region)) {
            run.region.hold_until_done(stream)?;
            held.push(&run.region);
        }
    }
    copied?;
    timer.add_bytes(Phase::HostToDevice, 8 * len);
    timer.add_direct_copies(bytes, runs.len());
    Ok(())
}

/// Copies `device_data` into `out` (resized to its length) through a pinned
/// buffer, and waits for the copy.
pub fn download_u64(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    out: &mut Vec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    /// Below this many words one thread copies them out.
    const WORDS_PER_THREAD: usize = 1 << 19;
    out.clear();
    if let Some(staging) = download_to_staging(device, stream, device_data, timer)? {
        let words = staging.as_slice()?;
        let copying = std::time::Instant::now();
        if words.len() < 2 * WORDS_PER_THREAD {
            out.extend_from_slice(words);
        } else {
            // A zeroed allocation this large is mapped lazily, so its pages
            // are first touched, like the words are copied, on every core:
            // one thread copying 128 MB of group results out of pinned
            // memory spends most of its time in page faults.
            *out = zeroed_for_fill(words.len());
            copy_window(out, &[words], 0, host_threads(), WORDS_PER_THREAD);
        }
        timer.add_host_staging(copying.elapsed());
    }
    Ok(())
}

/// The one word `device_data` holds (a count, a total, a flag a kernel
/// wrote), copied to the host through a pinned buffer once the work
/// enqueued on `stream` before it has run; an error where it holds no word
/// or more than one.
pub fn download_word(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    what: &str,
    timer: &mut PhaseTimer,
) -> GpuResult<u64> {
    if device_data.len() != 1 {
        return Err(GpuError::Invalid(format!(
            "{what}: one word to read back, {} on the device",
            device_data.len()
        )));
    }
    let staging = download_to_staging(device, stream, device_data, timer)?
        .ok_or_else(|| GpuError::Invalid(format!("{what} was not read back")))?;
    staging
        .as_slice()?
        .first()
        .copied()
        .ok_or_else(|| GpuError::Invalid(format!("{what} was not read back")))
}

/// Copies `device_data` into a pinned buffer and waits for the copy;
/// `None` when it is empty.
fn download_to_staging(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<PinnedBuffer>> {
    let len = device_data.len();
    if len == 0 {
        return Ok(None);
    }
    let mut staging = device.pinned().take_timed(len, timer)?;
    enqueue_download(stream, device_data, &mut staging, 0, timer)?;
    Ok(Some(staging))
}

/// Enqueues the copy of `device_data` into words `at..at + len` of
/// `staging` on `stream`, without waiting: the buffer's own event makes
/// its next host read wait for the copy, so several copies into one
/// buffer are read once the last has landed.
pub fn enqueue_download(
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    staging: &mut PinnedBuffer,
    at: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let len = device_data.len();
    if len == 0 {
        return Ok(());
    }
    if at + len > staging.len() {
        return Err(GpuError::Invalid(format!(
            "{len} words at {at} of a staging buffer of {}",
            staging.len()
        )));
    }
    timer.time_on(stream, Phase::DeviceToHost, || {
        // The range matters: the driver copies as many bytes as the host
        // slice holds, and the pooled buffer may be larger than the data.
        let mut dst = PinnedRange {
            buffer: staging.raw_mut(),
            start: at,
            len,
        };
        stream
            .memcpy_dtoh(device_data, &mut dst)
            .during("copying from the device")
    })?;
    timer.add_bytes(Phase::DeviceToHost, 8 * len);
    Ok(())
}

/// Copies the first `bytes` bytes of the words of `device_data` to the host
/// through a pinned buffer, waits for the copy, and returns them as Arrow
/// buffers of `piece_bytes` bytes each (the last may be shorter): each piece
/// owns its memory, so the batches made of them account for their own rows
/// only. The pieces are copied out of pinned memory on up to `threads`
/// threads: a caller that runs alone passes the host's cores, one of many
/// partitions running at once passes its share.
pub fn download_byte_pieces(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    bytes: usize,
    piece_bytes: usize,
    threads: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<Buffer>> {
    download_pieces_as(
        device,
        stream,
        device_data,
        (bytes, piece_bytes.max(1)),
        threads,
        |piece| Buffer::from_slice_ref(piece),
        timer,
    )
}

/// The first `values` words of `device_data` (8-byte signed integers)
/// copied to the host as 16-byte integers, each sign-extended as it leaves
/// pinned memory (see [`sign_extend_words`]), in buffers of `piece_values`
/// values each (the last may be shorter); otherwise as
/// [`download_byte_pieces`]. The way back of [`StagingWindows::upload_narrowed`].
pub fn download_widened_pieces(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    values: usize,
    piece_values: usize,
    threads: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<Buffer>> {
    download_pieces_as(
        device,
        stream,
        device_data,
        (8 * values, 8 * piece_values.max(1)),
        threads,
        sign_extend_words,
        timer,
    )
}

/// The first `bytes` bytes of `device_data`, copied down through a pinned
/// buffer and made into one buffer per `piece_bytes` by `make`, on up to
/// `threads` threads.
fn download_pieces_as(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    device_data: &CudaView<'_, u64>,
    (bytes, piece_bytes): (usize, usize),
    threads: usize,
    make: impl Fn(&[u8]) -> Buffer + Sync,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<Buffer>> {
    if bytes > 8 * device_data.len() {
        return Err(GpuError::Invalid(format!(
            "{bytes} bytes asked of {} device words",
            device_data.len()
        )));
    }
    let words = device_data.slice(..bytes.div_ceil(8));
    let Some(staging) = download_to_staging(device, stream, &words, timer)? else {
        return Ok(Vec::new());
    };
    let pieces: Vec<&[u8]> = staging.as_slice()?.to_byte_slice()[..bytes]
        .chunks(piece_bytes)
        .collect();
    let copying = std::time::Instant::now();
    let buffers = copy_out_in_parallel(&pieces, threads, &make);
    timer.add_host_staging(copying.elapsed());
    buffers
}

/// Each of `pieces` made into a buffer of its own by `make`, on up to
/// `threads` threads when they are large: a join over all its input
/// partitions brings back gigabytes of gathered columns through one
/// stream, and one thread copying them out of pinned memory (touching
/// every fresh page) takes longer than the bus.
fn copy_out_in_parallel(
    pieces: &[&[u8]],
    threads: usize,
    make: &(impl Fn(&[u8]) -> Buffer + Sync),
) -> GpuResult<Vec<Buffer>> {
    /// Bytes one copying thread takes at least.
    const BYTES_PER_THREAD: usize = 1 << 22;
    let bytes: usize = pieces.iter().map(|p| p.len()).sum();
    let threads = threads
        .min(bytes / BYTES_PER_THREAD)
        .min(pieces.len())
        .max(1);
    if threads <= 1 {
        return Ok(pieces.iter().map(|p| make(p)).collect());
    }
    let per_thread = pieces.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = pieces
            .chunks(per_thread)
            .map(|group| scope.spawn(move || group.iter().map(|p| make(p)).collect::<Vec<_>>()))
            .collect();
        let mut buffers = Vec::with_capacity(pieces.len());
        for handle in handles {
            let copied = handle.join().map_err(|_| {
                GpuError::Invalid("a thread copying device results out panicked".into())
            })?;
            buffers.extend(copied);
        }
        Ok(buffers)
    })
}

/// Elements `start..start + len` of a pinned buffer, as a host slice the
/// driver copies to or from asynchronously. cudarc copies the whole host
/// slice, so a pooled buffer larger than the data must be narrowed to it.
struct PinnedRange<'a> {
    buffer: &'a mut PinnedWords,
    start: usize,
    len: usize,
}

impl cudarc::driver::HostSlice<u64> for PinnedRange<'_> {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn stream_synced_slice<'b>(
        &'b self,
        stream: &'b CudaStream,
    ) -> (&'b [u64], cudarc::driver::SyncOnDrop<'b>) {
        let range = self.start..self.start + self.len;
        // SAFETY: forwarded to the pinned slice under the same contract;
        // callers build the range within the buffer (`enqueue_download`).
        let (full, sync) = unsafe { self.buffer.stream_synced_slice(stream) };
        (&full[range], sync)
    }

    unsafe fn stream_synced_mut_slice<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (&'b mut [u64], cudarc::driver::SyncOnDrop<'b>) {
        let range = self.start..self.start + self.len;
        // SAFETY: forwarded to the pinned slice under the same contract.
        let (full, sync) = unsafe { self.buffer.stream_synced_mut_slice(stream) };
        (&mut full[range], sync)
    }
}

/// Measured copy bandwidth of one device, pinned memory both ways: the floor
/// that any host-resident GPU operator is compared against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyBandwidth {
    /// Bytes per second, host to device.
    pub host_to_device: f64,
    /// Bytes per second, device to host.
    pub device_to_host: f64,
    /// Bytes per second of the device's own memory, counting each byte a
    /// device-to-device copy reads and each byte it writes: the ceiling
    /// that kernel time is compared against.
    pub device_memory: f64,
}

#[cfg(any(test, feature = "test-support"))]
/// Times `repeats` copies of `bytes` bytes each way through pinned memory,
/// and as many device-to-device copies, with events (after one warm-up round)
/// and returns the median bandwidths.
pub fn measure_copy_bandwidth(
    device: &std::sync::Arc<GpuDevice>,
    bytes: usize,
    repeats: usize,
) -> GpuResult<CopyBandwidth> {
    device.bind_to_thread()?;
    let pooled = device.stream()?;
    copy_bandwidth(device, pooled.stream(), bytes, repeats)
}

/// [`measure_copy_bandwidth`] on `stream`, `device` bound to this thread.
pub(super) fn copy_bandwidth(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    bytes: usize,
    repeats: usize,
) -> GpuResult<CopyBandwidth> {
    let elements = (bytes / 8).max(1);
    let repeats = repeats.max(1);
    let mut staging = device.pinned().take(elements)?;
    for (i, v) in staging.as_mut_slice()?.iter_mut().enumerate() {
        *v = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    // SAFETY: written by the first copy before it is read.
    let mut device_buffer =
        unsafe { stream.alloc::<u64>(elements) }.during("allocating a bandwidth buffer")?;
    // SAFETY: written by each round's device-to-device copy before anything
    // reads it (nothing does: it is only the copy's destination).
    let mut device_copy =
        unsafe { stream.alloc::<u64>(elements) }.during("allocating a bandwidth buffer")?;
    let mut h2d = Vec::new();
    let mut d2h = Vec::new();
    let mut d2d = Vec::new();
    for round in 0..=repeats {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        copy_pinned_words(stream, staging.raw_mut(), elements, &mut device_buffer, &mut timer)?;
        timer.time_on(stream, Phase::DeviceToHost, || {
            let mut dst = PinnedRange {
                buffer: staging.raw_mut(),
                start: 0,
                len: elements,
            };
            stream
                .memcpy_dtoh(&device_buffer, &mut dst)
                .during("copying from the device")
        })?;
        // Timed as the kernel phase: a copy within device memory is what
        // the device's memory-bound kernels are compared against.
        timer.time_on(stream, Phase::Kernel, || {
            stream
                .memcpy_dtod(&device_buffer, &mut device_copy)
                .during("copying within the device")
        })?;
        let times = timer.finish()?;
        if round > 0 {
            h2d.push(times.host_to_device.as_secs_f64());
            d2h.push(times.device_to_host.as_secs_f64());
            d2d.push(times.kernel.as_secs_f64());
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let bytes = (elements * 8) as f64;
    Ok(CopyBandwidth {
        host_to_device: bytes / median(h2d),
        device_to_host: bytes / median(d2h),
        device_memory: 2.0 * bytes / median(d2d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_copied_out_on_several_threads_equal_their_sources() {
        // 24 MB in uneven pieces, the last one short: enough for six
        // threads of 4 MB each.
        let data: Vec<u8> = (0..24_000_003u32).map(|i| (i % 251) as u8).collect();
        let pieces: Vec<&[u8]> = data.chunks(1_000_003).collect();
        let copy = |piece: &[u8]| Buffer::from_slice_ref(piece);
        for threads in [1, 3, 16] {
            let buffers = copy_out_in_parallel(&pieces, threads, &copy).unwrap();
            assert_eq!(buffers.len(), pieces.len(), "{threads} threads");
            for (buffer, piece) in buffers.iter().zip(&pieces) {
                assert_eq!(buffer.as_slice(), *piece, "{threads} threads");
            }
        }
        assert!(copy_out_in_parallel(&[], 8, &copy).unwrap().is_empty());
    }

    #[test]
    fn words_widened_on_several_threads_keep_their_order_and_sign() {
        // 3 M words in pieces of 100,000 (the last short), 24 MB: several
        // threads' worth.
        let words: Vec<i64> = (0..3_000_001i64)
            .map(|i| (i - 1_500_000) * 6_148_914_691_236)
            .collect();
        let bytes = words.as_slice().to_byte_slice();
        let pieces: Vec<&[u8]> = bytes.chunks(8 * 100_000).collect();
        for threads in [1, 4] {
            let buffers = copy_out_in_parallel(&pieces, threads, &sign_extend_words).unwrap();
            let wide: Vec<i128> = buffers
                .iter()
                .flat_map(|b| b.typed_data::<i128>().to_vec())
                .collect();
            let expected: Vec<i128> = words.iter().map(|&w| i128::from(w)).collect();
            assert_eq!(wide, expected, "{threads} threads");
            assert_eq!(buffers.len(), 31, "{threads} threads");
        }
    }
}
