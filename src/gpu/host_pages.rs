//! Host memory that a pass fills at once: downloads from the device, the
//! encoders' words, concatenated columns. Large allocations are backed by
//! huge pages, so that the fill is not bound by page faults.

/// Allocations at least this large are worth backing with huge pages.
const HUGE_PAGE_MIN_BYTES: usize = 8 << 20;

/// `len` zeroed elements, for a copy or a pass to fill at once: where the
/// allocation is large, the kernel is asked (Linux, `MADV_HUGEPAGE`) to map
/// it in 2 MiB pages when first touched. A fresh allocation is mapped lazily,
/// so its first write faults once per 4 KiB page; on machines where faults
/// are slow (virtual machines, many threads faulting one address space at
/// once), the faults, not the copy, bound how fast a group-by's results
/// are copied into such memory.
pub fn zeroed_for_fill<T: Copy + Default>(len: usize) -> Vec<T> {
    // `vec![default; len]` of a zero value is a zeroed (lazily mapped)
    // allocation: nothing has touched its pages yet.
    let values = vec![T::default(); len];
    advise_huge_pages(
        values.as_ptr().cast(),
        std::mem::size_of_val(values.as_slice()),
    );
    values
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(start: *const u8, bytes: usize) {
    const HUGE_PAGE: usize = 2 << 20;
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    // The 2 MiB-aligned part of the allocation: madvise needs a page-aligned
    // start, and only whole huge pages can be mapped as such.
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end <= first {
        return;
    }
    // SAFETY: [first, end) lies inside one live allocation this thread owns
    // (rounded inwards from its bounds); MADV_HUGEPAGE changes only how the
    // kernel backs those pages, never their contents. A refusal (no THP in
    // the kernel, THP off) leaves ordinary pages, so its result is not needed.
    unsafe {
        libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_start: *const u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::copy::copy_window;

    #[test]
    fn buffers_for_filling_are_zeroed_at_every_size() {
        // Below the huge-page size, across it, and not a whole number of
        // huge pages.
        for len in [0usize, 1, 1 << 20, (24 << 20) / 8 + 3] {
            let mut words = zeroed_for_fill::<u64>(len);
            assert_eq!(words.len(), len);
            assert!(words.iter().all(|&w| w == 0), "{len}");
            // Written through on every core, as a copy would.
            copy_window(&mut words, &[&vec![7u64; len]], 0, 4, 1 << 16);
            assert!(words.iter().all(|&w| w == 7), "{len}");
        }
        let flags = zeroed_for_fill::<bool>(9 << 20);
        assert!(flags.iter().all(|&f| !f));
    }
}
