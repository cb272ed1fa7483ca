//! Memory for output columns, mapped before the columns are filled.
//!
//! Fresh memory is mapped by the kernel page by page, on the first write to
//! each 4 KiB page. On a host where page faults are slow (a virtual machine,
//! many threads faulting one address space at once), filling a group-by's
//! results into fresh buffers takes longer than into buffers already mapped:
//! the page faults, not the copy, bound the results' way back. Where the
//! device reads its input from pinned memory the host mostly waits while it
//! works, so threads of their own allocate the buffers the results will need
//! beforehand and write one word to each of their pages; once the results
//! land, they are only copied.
//!
//! The buffers are ordinary `Vec<u64>`s handed over to Arrow whole, so an
//! output column's memory is its own; a short last batch keeps a whole
//! buffer's capacity, and counts it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use datafusion::execution::memory_pool::MemoryReservation;

use crate::host::copy::host_threads;
use crate::trace;

/// Words in the smallest page the kernel maps (4 KiB): writing one word in
/// each maps a buffer whole. Buffers smaller than this gain nothing.
pub(crate) const PAGE_WORDS: usize = 4096 / std::mem::size_of::<u64>();

/// Mapping threads running in the process, all aggregations together:
/// they are meant for idle cores, so at most half the host's cores map at
/// once however many partitions are on the device.
static MAPPING_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Buffers of `words` words, mapped ahead by threads of their own, taken
/// by whoever fills an output column; a fresh allocation where none is
/// ready. Stopped (its threads joined) when dropped.
pub(crate) struct MappedAhead {
    /// `None`: nothing is mapped ahead.
    shared: Option<Arc<Shared>>,
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
    /// Buffers mapped and not yet taken, in one list per mapping thread
    /// (at least one): each thread fills its own, and a taker starts at a
    /// list of its own, so that threads building output batches on every
    /// core do not all queue for one lock.
    ready: Vec<Mutex<Vec<Vec<u64>>>>,
    /// Buffers taken from `ready`.
    taken: AtomicUsize,
    /// The memory pool's account of every buffer mapped, grown one buffer
    /// at a time before it is allocated: mapping stops where the pool
    /// cannot spare more, rather than take from the query what it needs.
    reservation: MemoryReservation,
}

impl MappedAhead {
    /// Nothing mapped ahead: every [`MappedAhead::take`] allocates.
    pub(crate) fn none() -> Self {
        Self {
            shared: None,
            threads: Vec::new(),
        }
    }

    /// Starts threads that map up to `buffers` buffers of `words` words
    /// each, each counted in `reservation` first: as many threads as
    /// `threads` asks and the process's budget of mapping threads (half
    /// the host's cores) has left; none, and nothing mapped, where it has
    /// none left. A thread that cannot be started is done without.
    pub(crate) fn start(
        buffers: usize,
        words: usize,
        threads: usize,
        reservation: MemoryReservation,
    ) -> Self {
        let budget = thread_budget();
        let wanted_threads = threads.min(buffers);
        let claimed = MAPPING_THREADS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                let claimed = threads_to_claim(running, budget, wanted_threads);
                (claimed > 0).then_some(running + claimed)
            })
            .map_or(0, |running| {
                threads_to_claim(running, budget, wanted_threads)
            });
        let shared = Arc::new(Shared {
            words,
            wanted: buffers,
            started: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            ready: (0..claimed.max(1))
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            taken: AtomicUsize::new(0),
            reservation,
        });
        let mut started = Vec::with_capacity(claimed);
        for list in 0..claimed {
            let thread_shared = Arc::clone(&shared);
            // Given back when the thread ends, or, where it cannot be
            // started, with the closure that holds it.
            let slot = BudgetSlot;
            let spawned = std::thread::Builder::new()
                .name("datafusion-gpu-map-ahead".into())
                .spawn(move || {
                    let _slot = slot;
                    thread_shared.map_buffers(list);
                });
            if let Ok(handle) = spawned {
                started.push(handle);
            }
        }
        Self {
            shared: Some(shared),
            threads: started,
        }
    }

    /// An empty vector with room for `len` words: a buffer mapped ahead
    /// where one is ready and large enough, otherwise a fresh allocation.
    pub(crate) fn take(&self, len: usize) -> Vec<u64> {
        if let Some(shared) = self.shared.as_ref().filter(|s| len <= s.words) {
            if let Some(buffer) = shared.pop_ready() {
                shared.taken.fetch_add(1, Ordering::Relaxed);
                return buffer;
            }
        }
        Vec::with_capacity(len)
    }

    /// Buffers taken so far that had been mapped ahead.
    pub(crate) fn taken(&self) -> usize {
        self.shared
            .as_ref()
            .map_or(0, |s| s.taken.load(Ordering::Relaxed))
    }

    /// Asks the threads to map no more buffers (each finishes the one it
    /// maps), without waiting for them: once the results land, the cores
    /// are theirs.
    pub(crate) fn stop_mapping(&self) {
        if let Some(shared) = &self.shared {
            shared.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Stops the threads, waits for them, and returns the buffers never
    /// taken, with the reservation that counts them and those taken (the
    /// taken ones now belong to output batches, which DataFusion does not
    /// count), for the caller to drop where it costs the query nothing:
    /// the buffers first, then the reservation.
    pub(crate) fn finish(mut self) -> Option<(Vec<Vec<u64>>, MemoryReservation)> {
        self.join();
        let shared = self.shared.take()?;
        let left: Vec<Vec<u64>> = (0..shared.ready.len())
            .flat_map(|list| std::mem::take(&mut *shared.lock_ready(list)))
            .collect();
        // The threads are joined: this is the last reference but where a
        // thread panicked and left its own behind, in which case the
        // reservation is let go with it.
        let reservation = Arc::try_unwrap(shared).ok()?.reservation;
        Some((left, reservation))
    }

    /// Waits until `buffers` buffers are ready to take (tests).
    #[cfg(test)]
    pub(crate) fn wait_for_buffers(&self, buffers: usize) {
        let start = std::time::Instant::now();
        let shared = self.shared.as_ref().expect("buffers to map");
        while (0..shared.ready.len())
            .map(|list| shared.lock_ready(list).len())
            .sum::<usize>()
            < buffers
        {
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

/// The process's budget of mapping threads: half the host's cores. Unit
/// tests, many at once on a small machine, would wait on each other's
/// threads under it, so they have none.
fn thread_budget() -> usize {
    match cfg!(test) {
        true => usize::MAX / 2,
        false => (host_threads() / 2).max(1),
    }
}

/// One mapping thread's place in [`MAPPING_THREADS`], given back when
/// dropped, whether its thread ends, panics or never starts.
struct BudgetSlot;

impl Drop for BudgetSlot {
    fn drop(&mut self) {
        MAPPING_THREADS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The list of `lists` a thread takes from first: threads spread over
/// them, each keeping its own.
fn own_list(lists: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static OWN: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    OWN.with(|own| own % lists.max(1))
}

/// Threads a new mapping may start while `running` run, within `budget`.
fn threads_to_claim(running: usize, budget: usize, wanted: usize) -> usize {
    budget.saturating_sub(running).min(wanted)
}

impl Shared {
    fn lock_ready(&self, list: usize) -> std::sync::MutexGuard<'_, Vec<Vec<u64>>> {
        // Pushing or popping a vector cannot leave the list half changed.
        self.ready[list].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A mapped buffer, where one is ready: from the taking thread's own
    /// list first, passing over lists another thread holds, then waiting
    /// for each list in turn where every one was held.
    fn pop_ready(&self) -> Option<Vec<u64>> {
        let lists = self.ready.len();
        let first = own_list(lists);
        let order = (0..lists).map(|i| (first + i) % lists);
        let mut held = false;
        for list in order.clone() {
            match self.ready[list].try_lock() {
                Ok(mut ready) => {
                    if let Some(buffer) = ready.pop() {
                        return Some(buffer);
                    }
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    if let Some(buffer) = p.into_inner().pop() {
                        return Some(buffer);
                    }
                }
                Err(std::sync::TryLockError::WouldBlock) => held = true,
            }
        }
        if !held {
            return None;
        }
        order
            .into_iter()
            .find_map(|list| self.lock_ready(list).pop())
    }

    /// One mapping thread's loop: claims buffers until all are claimed,
    /// it is told to stop, or the memory pool cannot spare another.
    fn map_buffers(&self, list: usize) {
        let bytes = self.words * std::mem::size_of::<u64>();
        let mut mapped = 0;
        while !self.stop.load(Ordering::Relaxed)
            && self.started.fetch_add(1, Ordering::Relaxed) < self.wanted
        {
            if self.reservation.try_grow(bytes).is_err() {
                self.stop.store(true, Ordering::Relaxed);
                break;
            }
            let mut buffer: Vec<u64> = Vec::with_capacity(self.words);
            // One write per page maps it, and one in the last word the
            // page-unaligned allocation reaches; the vector stays empty
            // (its length 0), so nothing is read from these words before
            // the taker writes them.
            let spare = buffer.spare_capacity_mut();
            for word in spare.iter_mut().step_by(PAGE_WORDS) {
                word.write(0);
            }
            if let Some(last) = spare.last_mut() {
                last.write(0);
            }
            self.lock_ready(list).push(buffer);
            mapped += 1;
        }
        trace::event(|| format!("output memory: {mapped} buffers mapped ahead"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::{
        GreedyMemoryPool, MemoryConsumer, MemoryPool, UnboundedMemoryPool,
    };

    fn reservation(pool: &Arc<dyn MemoryPool>) -> MemoryReservation {
        MemoryConsumer::new("mapped ahead").register(pool)
    }

    fn unbounded() -> Arc<dyn MemoryPool> {
        Arc::new(UnboundedMemoryPool::default())
    }

    #[test]
    fn buffers_mapped_ahead_are_taken_empty_with_room_for_their_words() {
        let pool = unbounded();
        let mapped = MappedAhead::start(10, 1000, 3, reservation(&pool));
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
        // Every buffer mapped stays counted until the caller lets go.
        let (left, counted) = mapped.finish().expect("buffers were mapped");
        assert!(left.is_empty());
        assert_eq!(counted.size(), 10 * 1000 * 8);
        drop(counted);
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn takers_on_many_threads_share_every_list_and_take_each_buffer_once() {
        // Four mapping threads, four lists; eight takers asking for more
        // than there are: each mapped buffer is handed out once, and the
        // rest are fresh.
        let mapped = MappedAhead::start(200, 600, 4, reservation(&unbounded()));
        mapped.wait_for_buffers(200);
        let taken: Vec<Vec<u64>> = std::thread::scope(|scope| {
            let takers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| (0..40).map(|_| mapped.take(600)).collect::<Vec<_>>()))
                .collect();
            takers
                .into_iter()
                .flat_map(|taker| taker.join().unwrap())
                .collect()
        });
        assert_eq!(mapped.taken(), 200);
        let mut addresses: Vec<usize> = taken.iter().map(|b| b.as_ptr() as usize).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(addresses.len(), 320, "a buffer handed out twice");
        let (left, _) = mapped.finish().expect("buffers were mapped");
        assert!(left.is_empty());
    }

    #[test]
    fn a_taker_finds_a_buffer_in_another_list_and_waits_for_a_list_held() {
        let shared = Shared {
            words: 8,
            wanted: 0,
            started: AtomicUsize::new(0),
            stop: AtomicBool::new(true),
            ready: (0..4).map(|_| Mutex::new(Vec::new())).collect(),
            taken: AtomicUsize::new(0),
            reservation: reservation(&unbounded()),
        };
        let other = (own_list(4) + 2) % 4;
        // This thread's own list is empty: the buffer comes from another.
        shared.lock_ready(other).push(Vec::with_capacity(8));
        assert!(shared.pop_ready().is_some());
        assert!(shared.pop_ready().is_none());
        // The only buffer lies in a list another thread holds: the taker
        // waits for it rather than allocate.
        shared.lock_ready(other).push(Vec::with_capacity(8));
        let held = shared.lock_ready(other);
        std::thread::scope(|scope| {
            let taker = scope.spawn(|| shared.pop_ready());
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(held);
            assert!(taker.join().unwrap().is_some(), "the held list's buffer");
        });
        assert!((0..4).all(|list| shared.lock_ready(list).is_empty()));
    }

    #[test]
    fn a_buffer_too_small_is_never_handed_out() {
        let pool = unbounded();
        let mapped = MappedAhead::start(2, 64, 1, reservation(&pool));
        mapped.wait_for_buffers(2);
        let buffer = mapped.take(65);
        assert!(buffer.capacity() >= 65);
        assert_eq!(mapped.taken(), 0);
        // The two mapped buffers are still there, and come back untaken.
        let (left, _) = mapped.finish().expect("buffers were mapped");
        assert_eq!(left.len(), 2);
        assert!(left.iter().all(|b| b.is_empty() && b.capacity() >= 64));
    }

    #[test]
    fn mapping_stops_where_the_memory_pool_cannot_spare_another_buffer() {
        // Room for three buffers of 512 words (4 KiB each) and a little.
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(3 * 4096 + 100));
        let mapped = MappedAhead::start(1000, 512, 2, reservation(&pool));
        mapped.wait_for_buffers(3);
        let (left, counted) = mapped.finish().expect("buffers were mapped");
        assert_eq!(left.len(), 3);
        assert_eq!(counted.size(), 3 * 4096);
        drop((left, counted));
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn nothing_mapped_ahead_allocates_on_every_take() {
        let none = MappedAhead::none();
        assert!(none.threads.is_empty());
        let buffer = none.take(123);
        assert!(buffer.is_empty() && buffer.capacity() >= 123);
        assert_eq!(none.taken(), 0);
        assert!(none.finish().is_none());
    }

    #[test]
    fn stopped_threads_map_no_more_and_leave() {
        // Far more buffers than can be mapped before the stop: the threads
        // must leave early, and what they mapped comes back.
        let mapped = MappedAhead::start(1 << 30, 512, 2, reservation(&unbounded()));
        mapped.stop_mapping();
        let (left, _) = mapped.finish().expect("a mapping was started");
        assert!(
            left.len() < 1 << 20,
            "{} buffers mapped after a stop",
            left.len()
        );
    }

    #[test]
    fn mapping_threads_stay_within_the_process_budget() {
        assert_eq!(threads_to_claim(0, 8, 8), 8);
        assert_eq!(threads_to_claim(6, 8, 8), 2);
        assert_eq!(threads_to_claim(8, 8, 8), 0);
        assert_eq!(threads_to_claim(9, 8, 3), 0);
        assert_eq!(threads_to_claim(0, 8, 3), 3);
    }
}
