//! Admission of device memory by bytes: one budget per device, shared by every
//! operator and partition, so that many DataFusion partitions running at once
//! wait for each other instead of running the device out of memory.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use super::column_cache::Evict;
use super::{GpuError, GpuResult};

/// Whether a reservation is released soon (so others may wait for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationKind {
    /// Held for the life of an operator's state (a join's build table).
    Resident,
    /// Held for one unit of work (one probe chunk); waiting for it is useful.
    Transient,
}

#[derive(Debug, Default)]
struct BudgetState {
    in_use: usize,
    transient_holders: usize,
    /// The transient reservations each thread made and still holds.
    transient_by_thread: HashMap<ThreadId, usize>,
}

impl BudgetState {
    /// Transient reservations made by threads other than `thread`.
    fn transient_held_by_others(&self, thread: ThreadId) -> usize {
        let own = self.transient_by_thread.get(&thread).copied().unwrap_or(0);
        self.transient_holders - own
    }
}

/// The device-wide byte budget. The limit of each request is a fraction of the
/// memory that was free when the device was opened; the fraction comes from
/// the requesting session's `gpu.memory_fraction`.
#[derive(Debug)]
pub struct DeviceBudget {
    free_at_open: usize,
    state: Mutex<BudgetState>,
    released: Condvar,
    /// What frees memory before a request that does not fit waits or fails
    /// (the device's column cache).
    evictor: Mutex<Option<Weak<dyn Evict>>>,
}

impl DeviceBudget {
    /// A budget over `free_at_open` bytes.
    pub fn new(free_at_open: usize) -> Arc<Self> {
        Arc::new(Self {
            free_at_open,
            state: Mutex::default(),
            released: Condvar::new(),
            evictor: Mutex::new(None),
        })
    }

    /// Makes `evictor` free memory for requests that do not fit, before
    /// they wait or fail. The budget holds it weakly.
    pub fn set_evictor(&self, evictor: Weak<dyn Evict>) {
        *self.evictor.lock().unwrap_or_else(|p| p.into_inner()) = Some(evictor);
    }

    /// Asks the evictor to free `bytes`; the bytes it freed. Called without
    /// the state's lock: what it frees returns its reservations, which
    /// take that lock.
    fn evict(&self, bytes: usize) -> usize {
        let evictor = self
            .evictor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade);
        evictor.map_or(0, |evictor| evictor.evict(bytes))
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Device memory that was free when the device was opened.
    pub fn free_at_open(&self) -> usize {
        self.free_at_open
    }

    /// Bytes currently reserved.
    pub fn in_use(&self) -> usize {
        self.lock().in_use
    }

    /// The byte limit that `fraction` of the free memory gives.
    pub fn limit_for(&self, fraction: f64) -> usize {
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        (self.free_at_open as f64 * fraction) as usize
    }

    /// Reserves `bytes`, blocking while transient reservations of others hold
    /// the memory it needs. Fails at once when the request can never fit, or
    /// when only resident reservations stand in the way (nothing will be freed
    /// by waiting). Call it from a blocking thread, never from an async task.
    pub fn reserve(
        self: &Arc<Self>,
        bytes: usize,
        fraction: f64,
        kind: ReservationKind,
    ) -> GpuResult<DeviceReservation> {
        let mut parts = self.reserve_together(&[(bytes, kind)], fraction)?;
        parts
            .pop()
            .ok_or_else(|| GpuError::Invalid("a reservation of one part made none".into()))
    }

    /// Reserves every part of `parts` (bytes, kind) at once, or none: the
    /// sum waits as one request. Work that needs several reservations (a
    /// table and the scratch that builds it) takes them together, since a
    /// thread that holds a transient reservation never waits for more (see
    /// below). The reservations come back in the order of `parts`.
    ///
    /// Waits happen in one order, so no two requests wait on each other
    /// through the budget: only a thread that holds no transient
    /// reservation waits, and only for transient reservations of other
    /// threads, which never wait on the budget themselves. A request from a
    /// thread that already holds a transient reservation fails at once
    /// where it does not fit, as does one that can never fit or that only
    /// resident reservations stand in the way of; the caller takes its
    /// fallback. (A holder blocked elsewhere, on a consumer that does not
    /// read its output, holds its memory until it is read or dropped.)
    pub fn reserve_together(
        self: &Arc<Self>,
        parts: &[(usize, ReservationKind)],
        fraction: f64,
    ) -> GpuResult<Vec<DeviceReservation>> {
        let limit = self.limit_for(fraction);
        let bytes = parts
            .iter()
            .fold(0usize, |sum, &(part, _)| sum.saturating_add(part));
        let thread = std::thread::current().id();
        let started = Instant::now();
        let mut state = self.lock();
        let mut evicted_for_this = false;
        loop {
            if state.in_use.saturating_add(bytes) <= limit {
                let waited = started.elapsed();
                return Ok(parts
                    .iter()
                    .map(|&(part, kind)| {
                        state.in_use += part;
                        let holder = (kind == ReservationKind::Transient).then(|| {
                            state.transient_holders += 1;
                            *state.transient_by_thread.entry(thread).or_default() += 1;
                            thread
                        });
                        DeviceReservation {
                            budget: Arc::clone(self),
                            bytes: part,
                            kind,
                            holder,
                            waited,
                        }
                    })
                    .collect());
            }
            if !evicted_for_this && bytes <= limit {
                // Cached columns no one reads give way first.
                evicted_for_this = true;
                let short = state.in_use.saturating_add(bytes) - limit;
                drop(state);
                let freed = self.evict(short);
                state = self.lock();
                if freed > 0 {
                    continue;
                }
            }
            let others = state.transient_held_by_others(thread);
            let holds_transient = state.transient_holders > others;
            if bytes > limit || holds_transient || others == 0 {
                return Err(GpuError::OutOfDeviceMemory {
                    requested: bytes,
                    limit,
                    in_use: state.in_use,
                });
            }
            state = self
                .released
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Reserves `bytes` at once if `headroom` more bytes would still fit
    /// beside them, else `None` (never waits). For work that runs before
    /// work it will wait for (a probe chunk copied before the build table
    /// it joins exists): each such reservation leaves room for the work it
    /// waits for. Nobody waits for it to be released, since its holder may
    /// itself be waiting: a request that only such reservations (and
    /// resident ones) stand in the way of fails at once, as with resident
    /// memory, instead of deadlocking.
    pub fn try_reserve(
        self: &Arc<Self>,
        bytes: usize,
        headroom: usize,
        fraction: f64,
    ) -> Option<DeviceReservation> {
        let limit = self.limit_for(fraction);
        let mut state = self.lock();
        let needed = state.in_use.saturating_add(bytes).saturating_add(headroom);
        if needed > limit {
            // Cached columns no one reads give way first.
            drop(state);
            self.evict(needed - limit);
            state = self.lock();
            if state.in_use.saturating_add(bytes).saturating_add(headroom) > limit {
                return None;
            }
        }
        Some(self.held_without_waiters(&mut state, bytes))
    }

    /// Reserves `bytes` at once where they fit beside what is reserved now,
    /// else `None`: it neither waits nor evicts. For memory that only saves
    /// work (a copy kept for later chunks, which could be made again for
    /// each): cached columns are not evicted for it.
    pub fn reserve_if_free(self: &Arc<Self>, bytes: usize, fraction: f64) -> Option<DeviceReservation> {
        let limit = self.limit_for(fraction);
        let mut state = self.lock();
        if state.in_use.saturating_add(bytes) > limit {
            return None;
        }
        Some(self.held_without_waiters(&mut state, bytes))
    }

    /// `bytes` added to `state` as a reservation made without waiting and
    /// that no one waits for (resident, no holder).
    fn held_without_waiters(self: &Arc<Self>, state: &mut BudgetState, bytes: usize) -> DeviceReservation {
        state.in_use += bytes;
        DeviceReservation {
            budget: Arc::clone(self),
            bytes,
            // Not counted among the holders worth waiting for.
            kind: ReservationKind::Resident,
            holder: None,
            waited: Duration::ZERO,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        // The state is two counters that are always left consistent, so a
        // panic elsewhere while holding the lock cannot corrupt it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Bytes held against a [`DeviceBudget`]; released on drop.
#[derive(Debug)]
pub struct DeviceReservation {
    budget: Arc<DeviceBudget>,
    bytes: usize,
    kind: ReservationKind,
    /// The thread that made a transient reservation (it may be dropped
    /// on another).
    holder: Option<ThreadId>,
    waited: Duration,
}

impl DeviceReservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// How long the request waited for others to release memory.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl Drop for DeviceReservation {
    fn drop(&mut self) {
        let mut state = self.budget.lock();
        state.in_use -= self.bytes;
        if self.kind == ReservationKind::Transient {
            state.transient_holders -= 1;
        }
        if let Some(holder) = self.holder {
            if let Some(count) = state.transient_by_thread.get_mut(&holder) {
                *count -= 1;
                if *count == 0 {
                    state.transient_by_thread.remove(&holder);
                }
            }
        }
        drop(state);
        self.budget.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds reservations and gives them up when asked, as the column
    /// cache does.
    #[derive(Debug, Default)]
    struct Holder(Mutex<Vec<DeviceReservation>>);

    impl Evict for Holder {
        fn evict(&self, bytes: usize) -> usize {
            let mut held = self.0.lock().unwrap();
            let mut freed = 0;
            while freed < bytes {
                match held.pop() {
                    Some(reservation) => freed += reservation.bytes(),
                    None => break,
                }
            }
            freed
        }
    }

    #[test]
    fn a_request_that_does_not_fit_evicts_cached_memory_before_it_fails() {
        let budget = DeviceBudget::new(1000);
        let holder = Arc::new(Holder::default());
        for _ in 0..4 {
            let held = budget.reserve(200, 1.0, ReservationKind::Resident).unwrap();
            holder.0.lock().unwrap().push(held);
        }
        let weak: Weak<dyn Evict> = Arc::downgrade(&(Arc::clone(&holder) as Arc<dyn Evict>));
        budget.set_evictor(weak);
        let big = budget.reserve(500, 1.0, ReservationKind::Resident).unwrap();
        assert_eq!(holder.0.lock().unwrap().len(), 2, "two of 200 bytes gave way");
        assert_eq!(budget.in_use(), 900);
        let small = budget.try_reserve(300, 0, 1.0).expect("evicts for a try too");
        assert_eq!(holder.0.lock().unwrap().len(), 1);
        // What is left to evict is not enough: the request fails as before.
        assert!(budget.reserve(300, 1.0, ReservationKind::Resident).is_err());
        assert_eq!(holder.0.lock().unwrap().len(), 0);
        // Nothing left to evict: the request fails as before.
        assert!(budget.reserve(300, 1.0, ReservationKind::Resident).is_err());
        drop((big, small));
    }

    #[test]
    fn memory_that_only_saves_work_is_taken_where_free_and_evicts_nothing() {
        let budget = DeviceBudget::new(1000);
        let holder = Arc::new(Holder::default());
        let held = budget.reserve(600, 1.0, ReservationKind::Resident).unwrap();
        holder.0.lock().unwrap().push(held);
        let weak: Weak<dyn Evict> = Arc::downgrade(&(Arc::clone(&holder) as Arc<dyn Evict>));
        budget.set_evictor(weak);
        // 400 bytes are free: 500 are refused, and the cached 600 stay.
        assert!(budget.reserve_if_free(500, 1.0).is_none());
        assert_eq!(holder.0.lock().unwrap().len(), 1, "nothing evicted");
        assert_eq!(budget.in_use(), 600);
        // Within the session's fraction only: 400 of a limit of 900 do not fit.
        assert!(budget.reserve_if_free(400, 0.9).is_none());
        let kept = budget.reserve_if_free(400, 1.0).expect("400 bytes are free");
        assert_eq!((kept.bytes(), budget.in_use()), (400, 1000));
        assert!(budget.reserve_if_free(1, 1.0).is_none());
        drop(kept);
        assert_eq!(budget.in_use(), 600);
        assert_eq!(holder.0.lock().unwrap().len(), 1);
    }

    #[test]
    fn reservations_add_up_and_release_on_drop() {
        let budget = DeviceBudget::new(1000);
        let a = budget.reserve(400, 1.0, ReservationKind::Resident).unwrap();
        let b = budget
            .reserve(600, 1.0, ReservationKind::Transient)
            .unwrap();
        assert_eq!(budget.in_use(), 1000);
        drop(a);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn a_reservation_that_must_leave_headroom_is_refused_without_waiting() {
        let budget = DeviceBudget::new(1000);
        let first = budget.try_reserve(300, 500, 1.0).expect("300 + 500 fit");
        assert_eq!(budget.in_use(), 300);
        // 300 + 300 + 500 do not: refused at once, nothing held.
        assert!(budget.try_reserve(300, 500, 1.0).is_none());
        assert_eq!(budget.in_use(), 300);
        // The headroom left is there for the work waited for.
        let waited_for = budget
            .reserve(500, 1.0, ReservationKind::Transient)
            .unwrap();
        assert_eq!(budget.in_use(), 800);
        // Nobody waits for it: with only it (and resident memory) in the
        // way, a request that does not fit fails at once.
        drop(waited_for);
        let err = budget
            .reserve(800, 1.0, ReservationKind::Transient)
            .unwrap_err();
        assert!(matches!(err, GpuError::OutOfDeviceMemory { .. }));
        drop(first);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn a_request_larger_than_the_limit_fails_at_once() {
        let budget = DeviceBudget::new(1000);
        let err = budget
            .reserve(600, 0.5, ReservationKind::Transient)
            .unwrap_err();
        assert!(matches!(
            err,
            GpuError::OutOfDeviceMemory {
                requested: 600,
                limit: 500,
                in_use: 0
            }
        ));
    }

    #[test]
    fn waiting_on_resident_memory_fails_instead_of_deadlocking() {
        let budget = DeviceBudget::new(1000);
        let _resident = budget.reserve(800, 1.0, ReservationKind::Resident).unwrap();
        let err = budget
            .reserve(300, 1.0, ReservationKind::Transient)
            .unwrap_err();
        assert!(matches!(
            err,
            GpuError::OutOfDeviceMemory { in_use: 800, .. }
        ));
    }

    #[test]
    fn a_transient_request_waits_for_another_transient_to_finish() {
        let budget = DeviceBudget::new(1000);
        let first = budget
            .reserve(700, 1.0, ReservationKind::Transient)
            .unwrap();
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                budget
                    .reserve(700, 1.0, ReservationKind::Transient)
                    .map(|r| r.bytes())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(first);
        assert_eq!(waiter.join().unwrap().unwrap(), 700);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn a_thread_holding_transient_memory_is_refused_instead_of_waiting_on_itself() {
        let budget = DeviceBudget::new(1000);
        let scratch = budget
            .reserve(400, 1.0, ReservationKind::Transient)
            .unwrap();
        // 400 + 700 do not fit, and the only transient holder is this
        // thread: waiting would never end.
        let err = budget
            .reserve(700, 1.0, ReservationKind::Resident)
            .unwrap_err();
        assert!(matches!(err, GpuError::OutOfDeviceMemory { in_use: 400, .. }));
        drop(scratch);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn two_holders_each_wanting_more_are_refused_instead_of_deadlocking() {
        let budget = DeviceBudget::new(1000);
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let builders: Vec<_> = (0..2)
            .map(|_| {
                let (budget, barrier) = (Arc::clone(&budget), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let scratch = budget
                        .reserve(300, 1.0, ReservationKind::Transient)
                        .unwrap();
                    barrier.wait();
                    // Each would wait for the other's scratch.
                    let table = budget.reserve(600, 1.0, ReservationKind::Resident);
                    barrier.wait();
                    drop(scratch);
                    table.map(|t| t.bytes())
                })
            })
            .collect();
        let outcomes: Vec<_> = builders.into_iter().map(|b| b.join().unwrap()).collect();
        assert!(outcomes.iter().all(|o| matches!(o, Err(GpuError::OutOfDeviceMemory { .. }))));
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn parts_reserved_together_wait_as_one_and_come_back_in_order() {
        let budget = DeviceBudget::new(1000);
        let other = budget
            .reserve(500, 1.0, ReservationKind::Transient)
            .unwrap();
        let builder = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                let parts = budget
                    .reserve_together(
                        &[
                            (300, ReservationKind::Transient),
                            (600, ReservationKind::Resident),
                        ],
                        1.0,
                    )
                    .unwrap();
                let bytes: Vec<usize> = parts.iter().map(DeviceReservation::bytes).collect();
                (bytes, budget.in_use())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        // Nothing of the pair is held while it waits.
        assert_eq!(budget.in_use(), 500);
        drop(other);
        let (bytes, in_use) = builder.join().unwrap();
        assert_eq!(bytes, vec![300, 600]);
        assert_eq!(in_use, 900);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn a_transient_reservation_dropped_on_another_thread_is_released() {
        let budget = DeviceBudget::new(1000);
        let held = budget
            .reserve(400, 1.0, ReservationKind::Transient)
            .unwrap();
        std::thread::spawn(move || drop(held)).join().unwrap();
        // This thread holds nothing any more: a request that does not fit
        // beside a resident one fails, and one that fits is taken.
        let _resident = budget.reserve(700, 1.0, ReservationKind::Resident).unwrap();
        assert!(budget.reserve(400, 1.0, ReservationKind::Transient).is_err());
        assert!(budget.reserve(300, 1.0, ReservationKind::Transient).is_ok());
    }

    #[test]
    fn fractions_outside_zero_to_one_are_clamped() {
        let budget = DeviceBudget::new(1000);
        assert_eq!(budget.limit_for(2.0), 1000);
        assert_eq!(budget.limit_for(-1.0), 0);
        assert_eq!(budget.limit_for(f64::NAN), 0);
    }
}
