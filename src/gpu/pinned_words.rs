//! One page-locked host buffer of u64 words, owned: the memory the pinned
//! pool lends. Where the kernel maps memory in 2 MiB pages on request, the
//! buffer is ordinary anonymous memory in huge pages, registered with the
//! driver; elsewhere it is allocated by the driver. Locking huge pages costs
//! the driver a tenth of what its own allocation of the same size does
//! (0.6 ms a MiB, one allocation at a time however many threads ask), which
//! a first query pays on its path for every staging window and download
//! buffer it needs.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, HostSlice, SyncOnDrop};

use super::{DriverResultExt, GpuResult};

/// Size of a huge page, and the alignment of a registered buffer of at
/// least that size (a smaller one stays in ordinary pages: a huge page
/// each would hold memory it never uses).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Size of an ordinary page.
const PAGE_BYTES: usize = 4 << 10;

/// Bytes of a buffer one thread touches when its pages are faulted in on
/// several threads.
const TOUCH_BYTES_PER_THREAD: usize = 32 << 20;

/// Threads that fault a large buffer's pages in at most.
const TOUCH_THREADS: usize = 8;

/// How a buffer's memory was obtained, and so how it is given back.
#[derive(Debug)]
enum Backing {
    /// An anonymous mapping of `bytes` bytes from `base`, the buffer at its
    /// first 2 MiB boundary, registered with the driver.
    Registered { base: *mut libc::c_void, bytes: usize },
    /// Page-locked memory the driver allocated.
    DriverAllocated,
}

/// `len` page-locked u64 words, uninitialised for the driver-allocated
/// kind and zeroed for the registered kind; every user writes the prefix
/// it reads. An event recorded after every copy that uses the words makes
/// host access wait for those copies, as cudarc's own pinned slice does.
#[derive(Debug)]
pub struct PinnedWords {
    words: *mut u64,
    len: usize,
    event: CudaEvent,
    backing: Backing,
}

// SAFETY: the words are host memory this value owns alone (mapped or
// allocated for it, freed only in its drop); host access goes through
// `&self`/`&mut self` and waits on the event for device copies, so moving
// or sharing the value between threads is as safe as for a `Vec<u64>`.
unsafe impl Send for PinnedWords {}
// SAFETY: as for `Send`: shared access only reads.
unsafe impl Sync for PinnedWords {}

impl PinnedWords {
    /// `len` (at least one) page-locked words for `ctx`: registered huge
    /// pages where `huge_pages` is set and the kernel maps them on request,
    /// else the driver's allocation.
    pub fn new(ctx: &Arc<CudaContext>, len: usize, huge_pages: bool) -> GpuResult<Self> {
        let len = len.max(1);
        let bytes = len
            .checked_mul(8)
            .filter(|&b| b < isize::MAX as usize / 2)
            .ok_or_else(|| {
                super::GpuError::Invalid(format!("{len} pinned words are more than a host holds"))
            })?;
        ctx.bind_to_thread().during("binding the device context")?;
        let event = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .during("creating a pinned buffer's event")?;
        if huge_pages && huge_pages_on_request() {
            if let Some((words, base, mapped)) = registered_huge_pages(bytes) {
                return Ok(Self {
                    words,
                    len,
                    event,
                    backing: Backing::Registered {
                        base,
                        bytes: mapped,
                    },
                });
            }
        }
        // SAFETY: the memory is uninitialised; every user writes the prefix
        // it reads (see the type's contract).
        let words = unsafe { result::malloc_host(bytes, 0) }
            .during("allocating pinned host memory")?
            .cast::<u64>();
        Ok(Self {
            words,
            len,
            event,
            backing: Backing::DriverAllocated,
        })
    }

    /// Words held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory is registered huge pages (not the driver's own).
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_registered(&self) -> bool {
        matches!(self.backing, Backing::Registered { .. })
    }

    /// The words, once every copy enqueued with them has finished.
    pub fn as_slice(&self) -> GpuResult<&[u64]> {
        self.event
            .synchronize()
            .during("waiting for a pinned buffer")?;
        // SAFETY: `words` points at `len` words this value owns, which no
        // device copy touches any more (waited for just above) and which
        // the shared borrow keeps from host writers.
        Ok(unsafe { std::slice::from_raw_parts(self.words, self.len) })
    }

    /// The words mutably, once every copy enqueued with them has finished.
    pub fn as_mut_slice(&mut self) -> GpuResult<&mut [u64]> {
        self.event
            .synchronize()
            .during("waiting for a pinned buffer")?;
        // SAFETY: as for `as_slice`, with the exclusive borrow keeping every
        // other reader away.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.words, self.len) })
    }
}

impl HostSlice<u64> for PinnedWords {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [u64], SyncOnDrop<'a>) {
        // The stream waits for earlier copies with these words, and the
        // event is recorded after the copy the caller enqueues.
        stream.context().record_err(stream.wait(&self.event));
        (
            // SAFETY: the caller uses the slice only with `stream` (the
            // trait's contract), ordered after earlier copies just above.
            unsafe { std::slice::from_raw_parts(self.words, self.len) },
            SyncOnDrop::Record(Some((&self.event, stream))),
        )
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [u64], SyncOnDrop<'a>) {
        stream.context().record_err(stream.wait(&self.event));
        (
            // SAFETY: as for `stream_synced_slice`.
            unsafe { std::slice::from_raw_parts_mut(self.words, self.len) },
            SyncOnDrop::Record(Some((&self.event, stream))),
        )
    }
}

impl Drop for PinnedWords {
    fn drop(&mut self) {
        let ctx = Arc::clone(self.event.context());
        // The memory must outlive every copy that uses it; a failed wait
        // means a broken context, whose copies have stopped.
        ctx.record_err(self.event.synchronize());
        match self.backing {
            Backing::Registered { base, bytes } => {
                // SAFETY: `words` was registered by `registered_huge_pages`
                // and not yet unregistered; no copy uses it any more.
                ctx.record_err(unsafe { sys::cuMemHostUnregister(self.words.cast()) }.result());
                // SAFETY: `base` and `bytes` are the mapping made for this
                // buffer alone, unmapped once, here.
                unsafe { libc::munmap(base, bytes) };
            }
            Backing::DriverAllocated => {
                // SAFETY: allocated by `malloc_host` for this value alone,
                // freed once, here, after its copies (waited for above).
                ctx.record_err(unsafe { result::free_host(self.words.cast()) });
            }
        }
    }
}

/// Whether the kernel maps anonymous memory in huge pages when asked
/// (`MADV_HUGEPAGE`), read once: with 4 KiB pages, faulting and locking a
/// buffer costs about what the driver's own allocation does.
fn huge_pages_on_request() -> bool {
    static ON_REQUEST: OnceLock<bool> = OnceLock::new();
    *ON_REQUEST.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|mode| mode.contains("[always]") || mode.contains("[madvise]"))
    })
}

/// `bytes` bytes of anonymous memory (in huge pages where at least one
/// fills), faulted in and registered with the driver as page-locked for
/// the context bound to this thread: the words, and the mapping to unmap.
/// `None` when the kernel or the driver refuses (then the driver allocates
/// instead).
#[cfg(target_os = "linux")]
fn registered_huge_pages(bytes: usize) -> Option<(*mut u64, *mut libc::c_void, usize)> {
    let huge = bytes >= HUGE_PAGE_BYTES;
    let page = if huge { HUGE_PAGE_BYTES } else { PAGE_BYTES };
    // A huge page more than asked for a large buffer, so that it can start
    // on a 2 MiB boundary (the part before it is never touched); a mapping
    // already starts on an ordinary page's.
    let span = bytes.next_multiple_of(page);
    let mapped = if huge { span + HUGE_PAGE_BYTES } else { span };
    // SAFETY: a new private anonymous mapping; no existing memory is named.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let start = (base as usize).next_multiple_of(page);
    if huge {
        // SAFETY: [start, start + span) lies inside the mapping just made
        // (`mapped` has a huge page spare for the alignment); the advice
        // only changes how the kernel backs it. Refused, the pages stay
        // small and the buffer still works.
        unsafe { libc::madvise(start as *mut libc::c_void, span, libc::MADV_HUGEPAGE) };
    }
    touch_pages(start, span);
    // SAFETY: [start, start + bytes) is mapped, resident and owned by the
    // caller from here; registering locks it for the bound context.
    let registered = unsafe { sys::cuMemHostRegister_v2(start as *mut _, bytes, 0) }.result();
    if registered.is_err() {
        // SAFETY: the mapping made above, not shared with anything.
        unsafe { libc::munmap(base, mapped) };
        return None;
    }
    Some((start as *mut u64, base, mapped))
}

#[cfg(not(target_os = "linux"))]
fn registered_huge_pages(_bytes: usize) -> Option<(*mut u64, *mut libc::c_void, usize)> {
    None
}

/// Faults in every page of `[start, start + bytes)` by writing a zero to
/// it, on several threads for a large buffer: registering resident pages is
/// quick, and one thread faulting a large buffer's huge pages in (zeroing
/// each) is bound by that thread's memory bandwidth.
#[cfg(target_os = "linux")]
fn touch_pages(start: usize, bytes: usize) {
    let touch = |from: usize, to: usize| {
        for page in (from..to).step_by(PAGE_BYTES) {
            // SAFETY: `page` lies inside the caller's fresh mapping, which
            // nothing else reads or writes yet.
            unsafe { std::ptr::write_volatile(page as *mut u8, 0) };
        }
    };
    let threads = (bytes / TOUCH_BYTES_PER_THREAD).clamp(1, TOUCH_THREADS);
    if threads == 1 {
        touch(start, start + bytes);
        return;
    }
    let share = bytes.div_ceil(threads).next_multiple_of(HUGE_PAGE_BYTES);
    std::thread::scope(|scope| {
        for from in (start..start + bytes).step_by(share) {
            let to = (from + share).min(start + bytes);
            scope.spawn(move || touch(from, to));
        }
    });
}
