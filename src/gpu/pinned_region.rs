//! Page-locked host memory that the device copies from directly, and the
//! registry by which an upload finds the region holding a buffer. Filled by
//! the Arrow-aware side (`pin_batches`), read by the transfers here.

use std::collections::BTreeMap;
use std::panic::RefUnwindSafe;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, RwLock, Weak};

use cudarc::driver::{sys, CudaEvent, CudaStream, PinnedHostSlice};

use super::{DriverResultExt, GpuDevice, GpuResult};

/// One allocation of page-locked host memory holding buffers of Arrow
/// arrays. Freed when the last buffer in it is dropped, after every device
/// copy that reads it has finished.
pub struct PinnedRegion {
    memory: PinnedHostSlice<u8>,
    /// The memory's first address and length, read once.
    start: usize,
    len: usize,
    /// Copies enqueued from this region, recorded after them on their
    /// streams; waited for before the memory is freed.
    copies: Mutex<Vec<CudaEvent>>,
}

impl std::fmt::Debug for PinnedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedRegion({} bytes)", self.memory.len())
    }
}

// The region is only read through its buffers and its event list is behind
// a mutex: a panic cannot leave it half-updated.
impl RefUnwindSafe for PinnedRegion {}

impl PinnedRegion {
    /// A region holding copies of `pieces`, laid end to end, each at a
    /// multiple of `align` bytes, and registered so that uploads find it;
    /// with each piece's offset in it.
    pub(crate) fn holding_copies(
        device: &GpuDevice,
        pieces: &[&[u8]],
        align: usize,
    ) -> GpuResult<(Arc<Self>, Vec<usize>)> {
        let mut offsets = Vec::with_capacity(pieces.len());
        let mut bytes = 0usize;
        for piece in pieces {
            offsets.push(bytes);
            bytes = (bytes + piece.len()).next_multiple_of(align.max(1));
        }
        let region = Self::new(device, bytes)?;
        for (piece, &offset) in pieces.iter().zip(&offsets) {
            // SAFETY: `offset + piece.len()` is within the region's `bytes`
            // (the offsets were laid out from these lengths), the region is
            // host memory this process owns, and nothing else has a
            // reference into it yet (it is not handed out before this
            // returns); `piece` is a different allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    region.base().add(offset),
                    piece.len(),
                );
            }
        }
        Ok((region, offsets))
    }

    /// A region of `bytes` bytes, registered so that uploads find it. Its
    /// memory is uninitialised: [`Self::holding_copies`] writes what it
    /// places there before anything reads it.
    fn new(device: &GpuDevice, bytes: usize) -> GpuResult<Arc<Self>> {
        let ctx = device.context();
        // SAFETY: the memory is uninitialised; `holding_copies` writes every
        // byte a piece covers before the region is handed out, and nothing
        // reads the padding between pieces. Portable: pinned for every
        // device's context, not only the allocating one. Not write-combined:
        // the CPU operators read these tables too.
        let memory = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .during("allocating pinned host memory for a table")?;
        let start = memory
            .as_ptr()
            .during("reading pinned host memory's address")? as usize;
        let region = Arc::new(Self {
            len: memory.len(),
            start,
            memory,
            copies: Mutex::new(Vec::new()),
        });
        let (start, _) = region.range();
        registry()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(start, Arc::downgrade(&region));
        Ok(region)
    }

    /// The region's first byte, for writing into it.
    fn base(&self) -> *mut u8 {
        self.start as *mut u8
    }

    /// The address `offset` bytes into the region, where the `len` bytes
    /// from it lie inside the region.
    pub(crate) fn address_at(&self, offset: usize, len: usize) -> Option<NonNull<u8>> {
        let at = self.start.checked_add(offset)?;
        self.holds_addresses(at, len)
            .then(|| NonNull::new(self.base().wrapping_add(offset)))
            .flatten()
    }

    /// The region's addresses, `[start, end)`.
    fn range(&self) -> (usize, usize) {
        (self.start, self.start + self.len)
    }

    /// Whether `bytes` lie inside this region.
    pub(crate) fn holds(&self, bytes: &[u8]) -> bool {
        self.holds_addresses(bytes.as_ptr() as usize, bytes.len())
    }

    /// Whether the `len` bytes from address `at` lie inside this region.
    pub(crate) fn holds_addresses(&self, at: usize, len: usize) -> bool {
        let (start, end) = self.range();
        at >= start && at.checked_add(len).is_some_and(|last| last <= end)
    }

    /// Keeps the region's memory until everything enqueued on `stream` so
    /// far (the copies just enqueued from it) has finished.
    pub(crate) fn hold_until_done(&self, stream: &Arc<CudaStream>) -> GpuResult<()> {
        let event = stream
            .record_event(None)
            .during("recording the end of a copy from pinned memory")?;
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        copies.retain(|copy| !copy.is_complete());
        copies.push(event);
        Ok(())
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        let (start, _) = self.range();
        // The entry at this address is this region's: no other region can
        // have the address before this memory is freed, after this body.
        registry()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&start);
        for copy in self.copies.get_mut().unwrap_or_else(|p| p.into_inner()) {
            // A failed wait leaves nothing better to do than free the
            // memory: the context is then broken and copies have stopped.
            let _ = copy.synchronize();
        }
    }
}

/// Live regions by their first address.
fn registry() -> &'static RwLock<BTreeMap<usize, Weak<PinnedRegion>>> {
    static REGIONS: RwLock<BTreeMap<usize, Weak<PinnedRegion>>> = RwLock::new(BTreeMap::new());
    &REGIONS
}

/// The live region that holds all of `bytes`, if any.
pub(crate) fn region_holding(bytes: &[u8]) -> Option<Arc<PinnedRegion>> {
    if bytes.is_empty() {
        return None;
    }
    let at = bytes.as_ptr() as usize;
    let regions = registry().read().unwrap_or_else(|p| p.into_inner());
    let (_, region) = regions.range(..=at).next_back()?;
    let region = region.upgrade()?;
    region.holds(bytes).then_some(region)
}

