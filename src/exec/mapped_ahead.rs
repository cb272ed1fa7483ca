//! Memory for output columns, mapped before the columns are filled.
//!
//! Fresh memory is mapped by the kernel page by page, on the first write to
//! each 4 KiB page. On a GPU machine's 16-core host (a virtual machine),
//! filling 1 GB of a group-by's results into fresh buffers on 16 threads
//! took 45 to 67 ms, against 25 ms into buffers already mapped: the page
//! faults, not the copy, bound the results' way back. Where the device
//! reads its input from pinned memory the host mostly waits while it
//! works, so threads of their own allocate the buffers the results will
//! need beforehand and write one word to each of their pages; once the
//! results land, they are only copied.
//!
//! The buffers are ordinary `Vec<u64>`s handed over to Arrow whole, so an
//! output column's memory is its own and counts as it always did.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::trace;

/// Words in the smallest page the kernel maps (4 KiB): writing one word in
/// each maps a buffer whole.
const PAGE_WORDS: usize = 4096 / std::mem::size_of::<u64>();

/// Buffers of `words` words, mapped ahead by threads of their own, taken
/// by whoever fills an output column; a fresh allocation where none is
/// ready. Stopped (its threads joined) when dropped.
pub(crate) struct MappedAhead {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// What the mapping threads and the takers share.
struct Shared {
    /// Words per buffer.
    words: usize,
    /// Buffers to map in all.
    wanted: usize,
    /// Buffers a thread has started to map.
    started: AtomicUsize,
    /// Set once no more buffers should be mapped.
    stop: AtomicBool,
    /// Buffers mapped and not yet taken.
    ready: Mutex<Vec<Vec<u64>>>,
    /// Buffers taken from `ready`.
    taken: AtomicUsize,
}

impl MappedAhead {
    /// Nothing mapped ahead: every [`MappedAhead::take`] allocates.
    pub(crate) fn none() -> Self {
        Self::start(0, 0, 0)
    }

    /// Starts up to `threads` threads that map `buffers` buffers of `words`
    /// words each. A thread that cannot be started is done without.
    pub(crate) fn start(buffers: usize, words: usize, threads: usize) -> Self {
        let shared = Arc::new(Shared {
            words,
            wanted: if words == 0 { 0 } else { buffers },
            started: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            ready: Mutex::new(Vec::new()),
            taken: AtomicUsize::new(0),
        });
        let threads = (0..threads.min(shared.wanted))
            .filter_map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name("datafusion-gpu-map-ahead".into())
                    .spawn(move || shared.map_buffers())
                    .ok()
            })
            .collect();
        Self { shared, threads }
    }

    /// An empty vector with room for `len` words: a buffer mapped ahead
    /// where one is ready and large enough, otherwise a fresh allocation.
    pub(crate) fn take(&self, len: usize) -> Vec<u64> {
        if len <= self.shared.words {
            if let Some(buffer) = self.shared.lock_ready().pop() {
                self.shared.taken.fetch_add(1, Ordering::Relaxed);
                return buffer;
            }
        }
        Vec::with_capacity(len)
    }

    /// Buffers taken so far that had been mapped ahead.
    pub(crate) fn taken(&self) -> usize {
        self.shared.taken.load(Ordering::Relaxed)
    }

    /// Asks the threads to map no more buffers (each finishes the one it
    /// maps), without waiting for them: once the results land, the cores
    /// are theirs.
    pub(crate) fn stop_mapping(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the threads, waits for them, and returns the buffers never
    /// taken, for the caller to drop where it costs the query nothing.
    pub(crate) fn finish(mut self) -> Vec<Vec<u64>> {
        self.join();
        std::mem::take(&mut *self.shared.lock_ready())
    }

    /// Waits until `buffers` buffers are ready to take (tests).
    #[cfg(test)]
    pub(crate) fn wait_for_buffers(&self, buffers: usize) {
        let start = std::time::Instant::now();
        while self.shared.lock_ready().len() < buffers {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "{buffers} buffers never mapped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn join(&mut self) {
        self.stop_mapping();
        for thread in self.threads.drain(..) {
            // A mapping thread that panicked mapped fewer buffers; takers
            // then allocate their own.
            let _ = thread.join();
        }
    }
}

impl Drop for MappedAhead {
    fn drop(&mut self) {
        self.join();
    }
}

impl Shared {
    fn lock_ready(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u64>>> {
        // Pushing or popping a vector cannot leave the list half changed.
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One mapping thread's loop: claims buffers until all are claimed or
    /// it is told to stop.
    fn map_buffers(&self) {
        let mut mapped = 0;
        while !self.stop.load(Ordering::Relaxed)
            && self.started.fetch_add(1, Ordering::Relaxed) < self.wanted
        {
            let mut buffer: Vec<u64> = Vec::with_capacity(self.words);
            // One write per page maps it; the vector stays empty (its
            // length 0), so nothing is read from these words before the
            // taker writes them.
            for word in buffer.spare_capacity_mut().iter_mut().step_by(PAGE_WORDS) {
                word.write(0);
            }
            self.lock_ready().push(buffer);
            mapped += 1;
        }
        trace::event(|| format!("output memory: {mapped} buffers mapped ahead"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_mapped_ahead_are_taken_empty_with_room_for_their_words() {
        let mapped = MappedAhead::start(10, 1000, 3);
        mapped.wait_for_buffers(10);
        for _ in 0..10 {
            let buffer = mapped.take(1000);
            assert!(buffer.is_empty());
            assert!(buffer.capacity() >= 1000);
        }
        assert_eq!(mapped.taken(), 10);
        // None left: a fresh allocation, not counted.
        let fresh = mapped.take(700);
        assert!(fresh.is_empty() && fresh.capacity() >= 700);
        assert_eq!(mapped.taken(), 10);
        assert!(mapped.finish().is_empty());
    }

    #[test]
    fn a_buffer_too_small_is_never_handed_out() {
        let mapped = MappedAhead::start(2, 64, 1);
        mapped.wait_for_buffers(2);
        let buffer = mapped.take(65);
        assert!(buffer.capacity() >= 65);
        assert_eq!(mapped.taken(), 0);
        // The two mapped buffers are still there, and come back untaken.
        let left = mapped.finish();
        assert_eq!(left.len(), 2);
        assert!(left.iter().all(|b| b.is_empty() && b.capacity() >= 64));
    }

    #[test]
    fn nothing_mapped_ahead_allocates_on_every_take() {
        let none = MappedAhead::none();
        assert!(none.threads.is_empty());
        let buffer = none.take(123);
        assert!(buffer.is_empty() && buffer.capacity() >= 123);
        assert_eq!(none.taken(), 0);
        assert!(none.finish().is_empty());
    }

    #[test]
    fn stopped_threads_map_no_more_and_leave() {
        // Far more buffers than can be mapped before the stop: the threads
        // must leave early, and what they mapped comes back.
        let mapped = MappedAhead::start(1 << 30, 512, 2);
        mapped.stop_mapping();
        let left = mapped.finish();
        assert!(
            left.len() < 1 << 20,
            "{} buffers mapped after a stop",
            left.len()
        );
    }
}
