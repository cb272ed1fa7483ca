//! Page-locked host staging buffers. Copies from pageable memory are staged by
//! the driver through its own small pinned buffer and do not overlap with
//! anything; copies from pinned memory run at full PCIe speed and
//! asynchronously. Locking memory costs milliseconds, so buffers
//! ([`PinnedWords`]) are pooled per device and reused, up to
//! [`IDLE_LIMIT_BYTES`] idle: a returned buffer beyond that is freed (the
//! largest idle ones first), so one large download does not keep its
//! page-locked memory for the life of the process.

#[cfg(any(test, feature = "test-support"))]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::CudaContext;

use super::pinned_words::PinnedWords;
use super::{GpuResult, PhaseTimer};

/// Smallest buffer the pool allocates, in u64 elements (512 KiB).
const MIN_PINNED_ELEMENTS: usize = 1 << 16;

/// Bytes of idle pinned buffers a pool keeps for reuse, and no more than a
/// sixteenth of the host's memory: above the staging windows and download
/// windows that many tasks use at once, far below a host's memory, which
/// the system cannot page while the pool keeps it.
pub const IDLE_LIMIT_BYTES: usize = 4 << 30;

/// Elements a buffer lent for a fill is a whole number of: 2 MiB, a huge
/// page.
const FILL_ROUNDING_ELEMENTS: usize = (2 << 20) / 8;

/// Bytes a pool lends at most at once for the host to fill with a table's
/// words ([`PinnedPool::take_for_fill`]), and no more than a sixteenth of
/// the host's memory: beyond, words are made in ordinary memory and
/// staged, so that the fill of a large table does not lock a large share
/// of the host's memory.
pub const FILL_LIMIT_BYTES: usize = 4 << 30;

/// `limit`, or a sixteenth of the host's memory where less.
fn within_host_share(limit: usize) -> usize {
    static HOST_SHARE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let share = *HOST_SHARE.get_or_init(|| host_memory_bytes().map(|bytes| bytes / 16));
    share.map_or(limit, |share| share.min(limit))
}

/// The host's physical memory, where the system says.
#[cfg(unix)]
fn host_memory_bytes() -> Option<usize> {
    // SAFETY: `sysconf` only reads system constants; a negative answer
    // (unknown) is handled below.
    let (pages, page_bytes) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages > 0 && page_bytes > 0).then(|| (pages as usize).saturating_mul(page_bytes as usize))
}

#[cfg(not(unix))]
fn host_memory_bytes() -> Option<usize> {
    None
}

/// Pool of pinned u64 buffers of one device context.
#[derive(Debug)]
pub struct PinnedPool {
    ctx: Arc<CudaContext>,
    free: Mutex<Vec<PinnedWords>>,
    idle_limit_bytes: usize,
    /// Bytes of the buffers lent for fills now ([`FillingBuffer`]).
    lent_for_fills: Arc<AtomicUsize>,
    /// Bytes the pool lends for fills at most at once.
    fill_limit_bytes: usize,
    /// Whether new buffers are registered huge pages where the kernel
    /// offers them (always, but in the tests of the driver's allocation).
    huge_pages: bool,
    /// Buffers allocated so far and their bytes, for the tests of reuse.
    #[cfg(any(test, feature = "test-support"))]
    allocated: (AtomicU64, AtomicU64),
}

/// What a [`PinnedPool`] has allocated since it was made: buffers the
/// pool had none idle for, and their bytes.
#[cfg(any(test, feature = "test-support"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinnedStats {
    /// Buffers allocated.
    pub allocations: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl PinnedPool {
    /// An empty pool for `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Arc<Self> {
        Self::with_idle_limit(ctx, within_host_share(IDLE_LIMIT_BYTES))
    }

    /// An empty pool for `ctx` that keeps at most `bytes` of idle buffers.
    pub(crate) fn with_idle_limit(ctx: Arc<CudaContext>, bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            free: Mutex::new(Vec::new()),
            idle_limit_bytes: bytes,
            lent_for_fills: Arc::new(AtomicUsize::new(0)),
            fill_limit_bytes: within_host_share(FILL_LIMIT_BYTES),
            huge_pages: true,
            #[cfg(any(test, feature = "test-support"))]
            allocated: (AtomicU64::new(0), AtomicU64::new(0)),
        })
    }

    /// A pool of this one's context that keeps at most `bytes` idle, for
    /// the tests of the limit.
    #[cfg(any(test, feature = "test-support"))]
    pub fn sibling_with_idle_limit(&self, bytes: usize) -> Arc<Self> {
        Self::with_idle_limit(Arc::clone(&self.ctx), bytes)
    }

    /// A pool of this one's context that lends at most `bytes` for fills
    /// at once, for the tests of a fill past it.
    #[cfg(any(test, feature = "test-support"))]
    pub fn sibling_with_fill_limit(&self, bytes: usize) -> Arc<Self> {
        let pool = Self::with_idle_limit(Arc::clone(&self.ctx), self.idle_limit_bytes);
        let mut pool = Arc::into_inner(pool).expect("just made");
        pool.fill_limit_bytes = bytes;
        Arc::new(pool)
    }

    /// A pool of this one's context whose buffers the driver allocates
    /// (never registered huge pages) and that keeps at most `bytes` idle,
    /// for the tests of that path.
    #[cfg(any(test, feature = "test-support"))]
    pub fn sibling_allocated_by_driver(&self, bytes: usize) -> Arc<Self> {
        let pool = Self::with_idle_limit(Arc::clone(&self.ctx), bytes);
        let mut pool = Arc::into_inner(pool).expect("just made");
        pool.huge_pages = false;
        Arc::new(pool)
    }

    /// Bytes of the idle buffers the pool keeps.
    #[cfg(any(test, feature = "test-support"))]
    pub fn idle_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.iter().map(|b| b.len() * 8).sum()
    }

    /// Buffers allocated so far and their bytes.
    #[cfg(any(test, feature = "test-support"))]
    pub fn stats(&self) -> PinnedStats {
        PinnedStats {
            allocations: self.allocated.0.load(Ordering::Relaxed),
            bytes: self.allocated.1.load(Ordering::Relaxed),
        }
    }

    /// Keeps `slice` for reuse, then frees the largest idle buffers while
    /// more than the limit is idle.
    fn give_back(&self, slice: PinnedWords) {
        let freed = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            free.push(slice);
            let mut idle: usize = free.iter().map(|b| b.len() * 8).sum();
            let mut freed = Vec::new();
            while idle > self.idle_limit_bytes {
                let largest = (0..free.len()).max_by_key(|&i| free[i].len());
                let Some(largest) = largest else { break };
                let buffer = free.swap_remove(largest);
                idle -= buffer.len() * 8;
                freed.push(buffer);
            }
            freed
        };
        // Freed outside the lock: freeing page-locked memory waits for the
        // buffer's copies and takes the driver a while.
        drop(freed);
    }

    /// [`Self::take`], its time counted in `timer`.
    pub fn take_timed(self: &Arc<Self>, len: usize, timer: &mut PhaseTimer) -> GpuResult<PinnedBuffer> {
        let taking = Instant::now();
        let buffer = self.take(len);
        timer.add_pinned_allocation(taking.elapsed());
        buffer
    }

    /// A buffer of at least `len` elements for the host to fill before any
    /// copy reads it, or `None` where it would take the bytes lent for
    /// fills past the pool's limit ([`FILL_LIMIT_BYTES`], or a sixteenth of
    /// the host's memory).
    pub fn take_for_fill(self: &Arc<Self>, len: usize) -> GpuResult<Option<FillingBuffer>> {
        let bytes = 8 * len;
        let before = self.lent_for_fills.fetch_add(bytes, Ordering::Relaxed);
        // Given back on every path from here, with the buffer or without.
        let lent = Lent {
            counter: Arc::clone(&self.lent_for_fills),
            bytes,
        };
        if before + bytes > self.fill_limit_bytes {
            return Ok(None);
        }
        // Sized to whole huge pages, not to a power of two: a fill's
        // buffers are many and large, and the parts of a table about alike.
        let mut buffer = self.take_sized(len, len.max(MIN_PINNED_ELEMENTS).next_multiple_of(FILL_ROUNDING_ELEMENTS))?;
        // The copies from the buffer's earlier loans, waited for once here:
        // nothing else enqueues a copy from it until it is filled.
        let words = buffer.as_mut_slice()?;
        let (words, len) = (words.as_mut_ptr(), words.len());
        Ok(Some(FillingBuffer {
            buffer,
            words,
            len,
            _lent: lent,
        }))
    }

    /// A buffer of at least `len` elements: the smallest pooled one that fits,
    /// or a new one with a power-of-two size.
    pub fn take(self: &Arc<Self>, len: usize) -> GpuResult<PinnedBuffer> {
        self.take_sized(len, len.max(MIN_PINNED_ELEMENTS).next_power_of_two())
    }

    /// A buffer of at least `len` elements: the smallest pooled one that
    /// fits, or a new one of `new_elements` (at least `len`).
    fn take_sized(self: &Arc<Self>, len: usize, new_elements: usize) -> GpuResult<PinnedBuffer> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= len)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let slice = match reused {
            Some(slice) => slice,
            None => {
                let elements = new_elements.max(len);
                // Every user writes the prefix it reads (host writes before
                // an upload, the device writes before a download) and reads
                // no further.
                let words = PinnedWords::new(&self.ctx, elements, self.huge_pages)?;
                #[cfg(any(test, feature = "test-support"))]
                {
                    self.allocated.0.fetch_add(1, Ordering::Relaxed);
                    self.allocated.1.fetch_add(8 * elements as u64, Ordering::Relaxed);
                }
                words
            }
        };
        Ok(PinnedBuffer {
            slice: Some(slice),
            len,
            pool: Arc::clone(self),
        })
    }
}

/// A pinned buffer on loan from a [`PinnedPool`]; returned on drop. The
/// driver records an event on every copy that uses it, and host access waits
/// on that event, so it is never overwritten while a copy is in flight.
#[derive(Debug)]
pub struct PinnedBuffer {
    slice: Option<PinnedWords>,
    len: usize,
    pool: Arc<PinnedPool>,
}

impl PinnedBuffer {
    /// The first `len` elements, for the host to fill (waits for pending copies).
    pub fn as_mut_slice(&mut self) -> GpuResult<&mut [u64]> {
        let len = self.len;
        let slice = self.slice.as_mut().expect("present until drop");
        Ok(&mut slice.as_mut_slice()?[..len])
    }

    /// The bytes of the first `len` elements, for the host to fill with
    /// values of any width (waits for pending copies).
    pub fn as_mut_bytes(&mut self) -> GpuResult<&mut [u8]> {
        let words = self.as_mut_slice()?;
        let bytes = std::mem::size_of_val(words);
        // SAFETY: the words' memory, borrowed mutably for the returned
        // lifetime, viewed as bytes: u8 has alignment 1 and every bit
        // pattern of the bytes is a valid u64 again.
        Ok(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), bytes) })
    }

    /// The first `len` elements as twice as many 4-byte halves (the low
    /// half of each word first, as the device reads them), for the host to
    /// fill with 4-byte values (waits for pending copies).
    pub fn as_mut_halves(&mut self) -> GpuResult<&mut [u32]> {
        let words = self.as_mut_slice()?;
        let halves = 2 * words.len();
        // SAFETY: the words' memory, borrowed mutably for the returned
        // lifetime, viewed as u32s: u32's alignment (4) divides u64's, the
        // length covers exactly the same bytes, and every bit pattern of
        // them is a valid u64 again.
        Ok(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u32>(), halves) })
    }

    /// The first `len` elements, for the host to read (waits for pending copies).
    pub fn as_slice(&self) -> GpuResult<&[u64]> {
        let slice = self.slice.as_ref().expect("present until drop");
        Ok(&slice.as_slice()?[..self.len])
    }

    /// The buffer once every copy into it has finished (waits for them),
    /// for readers on many threads that would otherwise each ask the
    /// driver about the same finished copies.
    pub fn into_landed(self) -> GpuResult<LandedBuffer> {
        let words = self.as_slice()?;
        let (words, len) = (words.as_ptr(), words.len());
        Ok(LandedBuffer {
            buffer: self,
            words,
            len,
        })
    }

    /// The underlying driver allocation, mutably.
    pub(crate) fn raw_mut(&mut self) -> &mut PinnedWords {
        self.slice.as_mut().expect("present until drop")
    }

    /// Whether the buffer is registered huge pages rather than the
    /// driver's own allocation.
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_registered(&self) -> bool {
        self.slice.as_ref().is_some_and(PinnedWords::is_registered)
    }

    /// Elements in use.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Whether no elements are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A [`PinnedBuffer`] whose copies have all finished
/// ([`PinnedBuffer::into_landed`]): its words are read without waiting.
/// It gives no mutable access, so no copy can be enqueued into it until it
/// is turned back into the buffer ([`LandedBuffer::into_buffer`]).
#[derive(Debug)]
pub struct LandedBuffer {
    buffer: PinnedBuffer,
    /// The first `len` words of `buffer`'s allocation.
    words: *const u64,
    len: usize,
}

// SAFETY: the words are plain host memory owned by `buffer` (moved with
// it, freed only with it), written by nothing while this exists: every
// copy into them finished before it was made, and a new one needs the
// buffer mutably, which this never lends. Shared reads from many threads
// are then reads of immutable memory.
unsafe impl Send for LandedBuffer {}
// SAFETY: as for `Send`: only shared reads of memory nothing writes.
unsafe impl Sync for LandedBuffer {}

impl LandedBuffer {
    /// The first `len` words, as they landed.
    pub fn as_slice(&self) -> &[u64] {
        // SAFETY: `words` and `len` are the slice `PinnedBuffer::as_slice`
        // gave once the copies finished, in the allocation `buffer` owns
        // for as long as `self` lives (see the `Send` impl: nothing writes
        // them meanwhile).
        unsafe { std::slice::from_raw_parts(self.words, self.len) }
    }

    /// The buffer again, for the next copies.
    pub fn into_buffer(self) -> PinnedBuffer {
        self.buffer
    }
}

/// Bytes counted as lent for fills until dropped.
#[derive(Debug)]
struct Lent {
    counter: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A [`PinnedBuffer`] lent for the host to fill ([`PinnedPool::take_for_fill`])
/// and then copied from ([`super::upload_filled`]): its words are written
/// without asking the driver about copies, since none is enqueued from it
/// until it is given up for its copy.
#[derive(Debug)]
pub struct FillingBuffer {
    buffer: PinnedBuffer,
    /// The first `len` words of `buffer`'s allocation.
    words: *mut u64,
    len: usize,
    _lent: Lent,
}

// SAFETY: the words are plain host memory owned by `buffer` (moved with
// it, freed only with it); every earlier copy that used them finished
// before this was made, and a new one is enqueued only through
// `into_buffer`, which gives the memory up. Access is through `&self`
// and `&mut self`, as for a `Vec<u64>`.
unsafe impl Send for FillingBuffer {}
// SAFETY: as for `Send`: shared access only reads.
unsafe impl Sync for FillingBuffer {}

impl FillingBuffer {
    /// Words lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no words are lent.
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The words' bytes, for the host to read.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `words` and `len` are the slice the buffer lent when this
        // was made, in memory `buffer` owns while `self` lives; nothing but
        // `self` writes it (see the `Send` impl). u8 has alignment 1.
        unsafe { std::slice::from_raw_parts(self.words.cast::<u8>(), 8 * self.len) }
    }

    /// The words' bytes, for the host to fill.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_bytes`, borrowed mutably with `self`; every
        // bit pattern of the bytes is a valid u64 again.
        unsafe { std::slice::from_raw_parts_mut(self.words.cast::<u8>(), 8 * self.len) }
    }

    /// The buffer, for the copy from it.
    pub(crate) fn into_buffer(self) -> PinnedBuffer {
        self.buffer
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            self.pool.give_back(slice);
        }
    }
}
