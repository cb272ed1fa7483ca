//! The integer keys of a hash join's build side, gathered as the build side
//! is read, as a set the probe side's scan can test each row against.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures::channel::oneshot;

use super::bitmap::KeyBitmap;

/// Distinct build keys a set is made of at most; beyond, the build side is
/// too large for the filter to pay, and no set is made.
pub const MAX_KEY_VALUES: usize = 1 << 25;

/// The largest share of a probe side's rows a join key test may be
/// estimated to keep for a scan with no filter of its own to read the
/// column cache for it (the scan filter's own limit, for the same reason:
/// each row kept crosses the bus back and is made into Arrow columns).
pub const MAX_KEPT_SHARE: f64 = 0.25;

/// The same for a scan of files that outputs strings too varied to code,
/// kept on the device as their bytes: DataFusion's scan decodes every
/// row's strings, where the device sends back the kept rows' alone.
pub const MAX_KEPT_SHARE_OF_STRINGS: f64 = 0.5;

/// How long a scan waits at most for the set of a build side read in one
/// partition before it reads its rows (see [`JoinKeySet::settled`]).
pub const MAX_KEY_WAIT: Duration = Duration::from_secs(10);

/// How long after the first wait for a round of a build side of several
/// partitions, some read ahead of their join, its every partition must be
/// read ahead for the wait to go on (see [`JoinKeySet::settled`]): the
/// partitions of a plan are executed within moments of each other, and a
/// partition that no one here executes (another process reads it) ends
/// the wait then.
pub const READ_AHEAD_GRACE: Duration = Duration::from_millis(20);

/// A join's build keys, shared by the node that gathers them
/// ([`super::JoinKeyCollectorExec`], above the build side) and the scans
/// that test their rows against them ([`super::JoinKeyFilterExpr`]).
///
/// The build side is read in rounds: one per execution of the plan, each
/// partition once. A round's set is made when its every partition was read
/// to its end; until then, or where a partition stopped early, failed, or
/// the keys are too many or too spread, there is no set and every probe row
/// passes. Only the latest round's set is ever given out, so a scan never
/// tests its rows against the keys of another execution.
///
/// A scan may wait for a round's set ([`Self::settled`]) before it reads.
#[derive(Debug)]
pub struct JoinKeySet {
    id: usize,
    partitions: usize,
    /// Gathered over a join's probe side for the scan of its build side
    /// (see [`Self::of_probe_side`]).
    of_probe_side: bool,
    round: Mutex<Round>,
    /// Signalled whenever a round settles or a new one starts.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Round {
    number: u64,
    started: Vec<bool>,
    finished: usize,
    failed: bool,
    /// The keys of each partition read to its end, as it gathered them.
    pieces: Vec<Vec<i64>>,
    /// How many keys `pieces` hold.
    keys_read: usize,
    keys: Option<Arc<KeyBitmap>>,
    /// Partitions of this round read to their end by a task of their own
    /// ([`JoinKeySet::read_ahead`]).
    read_ahead: usize,
    /// A wait for this round's set ran out: no scan waits for it again.
    waited_out: bool,
    /// Whether a thread times the waits for this round's set.
    timed: bool,
    /// The scans waiting for this round's set.
    waiters: Vec<oneshot::Sender<()>>,
}

impl Round {
    /// Whether round `number` is over for those waiting: its set made,
    /// none to be made, waited for long enough, or a newer round started.
    fn settled(&self, number: u64) -> bool {
        self.number != number || self.keys.is_some() || self.failed || self.waited_out
    }

    /// Lets every scan waiting for this round go on.
    fn release(&mut self) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(());
        }
    }
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

impl JoinKeySet {
    /// The keys of a build side of `partitions` partitions.
    pub fn new(partitions: usize) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            partitions,
            of_probe_side: false,
            round: Mutex::new(Round {
                started: vec![false; partitions],
                ..Round::default()
            }),
            changed: Condvar::new(),
        }
    }

    /// The keys of a join's probe side of `partitions` partitions, for the
    /// scan of its build side: a join reads its probe side after its build
    /// side, so a scan waits for such a set only where the probe side is
    /// read ahead of its join, however many partitions it has (see
    /// [`super::waits_for`]), and a partition left to the join ends the
    /// round at once ([`Self::read_by_join`]).
    pub fn of_probe_side(partitions: usize) -> Self {
        Self {
            of_probe_side: true,
            ..Self::new(partitions)
        }
    }

    /// Whether the set is gathered over a probe side (see
    /// [`Self::of_probe_side`]).
    pub fn is_of_probe_side(&self) -> bool {
        self.of_probe_side
    }

    /// A number naming this set in `EXPLAIN`.
    pub fn id(&self) -> usize {
        self.id
    }

    /// How many partitions of the build side make a round.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// The latest round's number: a scan executed after its join's build
    /// side was (as DataFusion's hash join executes its inputs) tests its
    /// rows against this round's set.
    pub fn round(&self) -> u64 {
        self.lock().number
    }

    /// Resolves once round `number` has settled: its set made, none to be
    /// made, a newer round started, or `limit` after the first wait for
    /// it began (a round waited out so is not waited for again). A thread
    /// times the waits; where none can be started, nothing waits.
    ///
    /// A scan waits only for a build side read in one partition (whoever
    /// reads the join first reads all of it) or read ahead of its join
    /// ([`Self::reads_ahead`]), so the wait cannot hang on a partition that
    /// no one reads, as it could where DataFusion reads a hash-partitioned
    /// join's partitions one after another, or in several processes: a
    /// round of several partitions not all read ahead [`READ_AHEAD_GRACE`]
    /// after the first wait began is waited out then.
    pub fn settled(
        self: &Arc<Self>,
        number: u64,
        limit: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let waiting = {
            let mut round = self.lock();
            if round.settled(number) {
                None
            } else {
                let (sender, receiver) = oneshot::channel();
                round.waiters.push(sender);
                if !round.timed {
                    round.timed = true;
                    let set = Arc::clone(self);
                    let timer = std::thread::Builder::new()
                        .name("join-key-wait".into())
                        .spawn(move || set.time_waits(number, limit));
                    if timer.is_err() {
                        round.waited_out = true;
                        round.release();
                    }
                }
                Some(receiver)
            }
        };
        async move {
            if let Some(receiver) = waiting {
                // A dropped sender (the set gone) ends the wait too.
                let _ = receiver.await;
            }
        }
    }

    /// Resolves once the latest round has settled (see [`Self::settled`]),
    /// however long that takes. Unlike [`Self::settled`] it times nothing
    /// and never ends a round's waits, so it changes nothing for the scans
    /// that wait: the fill ahead of a scan that only tests join keys waits
    /// so (see [`crate::exec::fill_ahead`]). A task that waits so must be
    /// one that is dropped with its plan, as a round no one reads never
    /// settles.
    pub fn decided(&self) -> impl Future<Output = ()> + Send + 'static {
        let waiting = {
            let mut round = self.lock();
            if round.settled(round.number) {
                None
            } else {
                let (sender, receiver) = oneshot::channel();
                round.waiters.push(sender);
                Some(receiver)
            }
        };
        async move {
            if let Some(receiver) = waiting {
                let _ = receiver.await;
            }
        }
    }

    /// Ends the waits for round `number` after `limit`, or after
    /// [`READ_AHEAD_GRACE`] where the round has several partitions and not
    /// all are read ahead by then, unless it settles first.
    fn time_waits(&self, number: u64, limit: Duration) {
        let began = Instant::now();
        let deadline = began + limit;
        let grace = (self.partitions > 1).then(|| began + READ_AHEAD_GRACE.min(limit));
        let mut round = self.lock();
        while !round.settled(number) {
            let now = Instant::now();
            let graceless = grace.is_some_and(|grace| now >= grace && round.read_ahead < self.partitions);
            if now >= deadline || graceless {
                round.waited_out = true;
                round.release();
                return;
            }
            let until = match grace {
                Some(grace) if grace > now => grace,
                _ => deadline,
            };
            round = match self.changed.wait_timeout(round, until - now) {
                Ok((round, _)) => round,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// `round` settled: its waiters go on, and its timer stops.
    fn settle(&self, round: &mut Round) {
        round.release();
        self.changed.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Partition `partition` of the build side starts: the round it belongs
    /// to (a new one where it already started in the latest).
    pub fn start(&self, partition: usize) -> u64 {
        let mut round = self.lock();
        if round.started.get(partition).copied().unwrap_or(true) {
            let number = round.number + 1;
            let mut latest = std::mem::replace(
                &mut *round,
                Round {
                    number,
                    started: vec![false; self.partitions],
                    ..Round::default()
                },
            );
            self.settle(&mut latest);
        }
        if let Some(started) = round.started.get_mut(partition) {
            *started = true;
        } else {
            round.failed = true;
            self.settle(&mut round);
        }
        round.number
    }

    /// A partition of round `number` read to its end, with its keys (NULLs
    /// left out); `None` where they could not be taken. Whether this made
    /// the round's set.
    pub fn finish(&self, number: u64, values: Option<Vec<i64>>) -> bool {
        let mut round = self.lock();
        if round.number != number || round.failed {
            return false;
        }
        match values {
            Some(values) if round.keys_read + values.len() <= MAX_KEY_VALUES => {
                round.keys_read += values.len();
                round.pieces.push(values);
            }
            _ => {
                round.failed = true;
                round.pieces = Vec::new();
                self.settle(&mut round);
                return false;
            }
        }
        round.finished += 1;
        if round.finished < self.partitions {
            return false;
        }
        // Each partition's keys stay as they came: copied into one list
        // under the lock, every partition's keys waited for the copies of
        // those before. The bitmap (up to 128 MiB) is made from them on
        // several threads, with the lock released: scans testing their
        // batches ask for the set meanwhile.
        let (pieces, keys_read) = (std::mem::take(&mut round.pieces), round.keys_read);
        drop(round);
        crate::trace::event(|| format!("join keys #{}: round {number}'s {keys_read} keys all read", self.id));
        let made = KeyBitmap::of_pieces(&pieces);
        drop(pieces);
        let mut round = self.lock();
        if round.number != number || round.failed {
            // A newer round started (or this one failed) meanwhile.
            return false;
        }
        match made {
            Some(keys) => round.keys = Some(Arc::new(keys)),
            None => round.failed = true,
        }
        crate::trace::event(|| {
            format!("join keys #{}: round {number}'s set made: {}", self.id, round.keys.is_some())
        });
        self.settle(&mut round);
        round.keys.is_some()
    }

    /// A partition of round `number` is read to its end by a task of its
    /// own, whether or not the join reads it.
    pub fn read_ahead(&self, number: u64) {
        let mut round = self.lock();
        if round.number == number {
            round.read_ahead += 1;
        }
    }

    /// A partition of round `number` read ahead is left to its join after
    /// all (the memory pool refused to hold more): the waits for the round
    /// end as soon as [`READ_AHEAD_GRACE`] has passed; for a set of a probe
    /// side, which its join reads only once its build side was, the round
    /// ends now, with no set.
    pub fn read_by_join(&self, number: u64) {
        if self.of_probe_side {
            self.fail(number);
            return;
        }
        let mut round = self.lock();
        if round.number == number {
            round.read_ahead = round.read_ahead.saturating_sub(1);
            self.changed.notify_all();
        }
    }

    /// Whether round `number` is over with no set: it failed, or a newer
    /// round started.
    pub fn ended_without_set(&self, number: u64) -> bool {
        let round = self.lock();
        round.number != number || round.failed
    }

    /// Whether a partition of the latest round is read to its end by a task
    /// of its own: the plan's other partitions are then read so too, so
    /// that the round settles without the join reading anything, and a scan
    /// may wait for it whatever the partitions (for [`READ_AHEAD_GRACE`]
    /// at most, until they all are).
    pub fn reads_ahead(&self) -> bool {
        self.lock().read_ahead > 0
    }

    /// A partition of round `number` that stopped before its end.
    pub fn fail(&self, number: u64) {
        let mut round = self.lock();
        if round.number == number {
            round.failed = true;
            round.pieces = Vec::new();
            self.settle(&mut round);
        }
    }

    /// The latest round's set, where that round is complete.
    pub fn keys(&self) -> Option<Arc<KeyBitmap>> {
        self.lock().keys.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::bitmap::MAX_KEY_SPAN;
    use super::*;

    #[test]
    fn a_set_is_given_out_only_once_its_latest_round_is_complete() {
        let set = JoinKeySet::new(2);
        let first = set.start(0);
        set.finish(first, Some(vec![1, 2]));
        assert!(set.keys().is_none(), "a partition still to come");
        assert_eq!(set.start(1), first);
        set.finish(first, Some(vec![9]));
        let keys = set.keys().unwrap();
        assert!(keys.contains(1) && keys.contains(9) && !keys.contains(3));

        // The next execution: the old set is gone once it starts.
        let second = set.start(1);
        assert_ne!(second, first);
        assert!(set.keys().is_none());
        set.finish(first, Some(vec![3]));
        assert_eq!(set.start(0), second);
        set.finish(second, Some(vec![4]));
        set.fail(second);
        set.finish(second, Some(vec![5]));
        assert!(set.keys().is_none(), "a partition that stopped early");

        let third = set.start(0);
        set.finish(third, None);
        set.start(1);
        set.finish(third, Some(vec![1]));
        assert!(set.keys().is_none(), "keys that could not be taken");

        let fourth = set.start(0);
        set.start(1);
        assert!(!set.finish(fourth, Some(vec![])));
        assert!(set.finish(fourth, Some(vec![])), "the last partition makes the set");
        let empty = set.keys().unwrap();
        assert!(!empty.contains(0), "an empty build side passes no row");
    }

    /// Whether `wait` resolves within `within`, polled on this thread.
    fn resolves_within(wait: impl Future<Output = ()> + Send + 'static, within: Duration) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn(move || {
            futures::executor::block_on(wait);
            let _ = done.send(());
        });
        let resolved = finished.recv_timeout(within).is_ok();
        if resolved {
            waiting.join().unwrap();
        }
        resolved
    }

    #[test]
    fn a_wait_ends_when_the_round_settles_or_runs_out() {
        let long = Duration::from_secs(60);
        // Settled when the set is made.
        let set = Arc::new(JoinKeySet::new(1));
        let round = set.start(0);
        let wait = set.settled(round, long);
        assert!(!resolves_within(wait, Duration::from_millis(50)), "no set yet");
        let wait = set.settled(round, long);
        let maker = Arc::clone(&set);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            maker.finish(round, Some(vec![7]));
        });
        assert!(resolves_within(wait, Duration::from_secs(10)), "the set made");
        assert!(resolves_within(set.settled(round, long), Duration::from_secs(1)));

        // Settled when none is made, or by the next round.
        for end in ["fail", "too many", "next round"] {
            // Both partitions read ahead: no grace ends the wait.
            let set = Arc::new(JoinKeySet::new(2));
            let round = set.start(0);
            set.read_ahead(round);
            set.read_ahead(round);
            let wait = set.settled(round, long);
            match end {
                "fail" => set.fail(round),
                "too many" => drop(set.finish(round, None)),
                _ => drop(set.start(0)),
            }
            assert!(resolves_within(wait, Duration::from_secs(10)), "{end}");
        }

        // A round whose set never comes: the wait runs out, and later waits
        // for that round do not wait; the next round's do.
        let set = Arc::new(JoinKeySet::new(1));
        let round = set.start(0);
        let started = Instant::now();
        assert!(resolves_within(
            set.settled(round, Duration::from_millis(30)),
            Duration::from_secs(10)
        ));
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(resolves_within(set.settled(round, long), Duration::from_secs(1)));
        assert!(set.keys().is_none());
        let next = set.start(0);
        assert!(!resolves_within(set.settled(next, long), Duration::from_millis(50)));
    }

    #[test]
    fn a_fill_waits_for_the_latest_round_without_ending_anyone_elses_wait() {
        let long = Duration::from_secs(60);
        // Waiting before the build side started: the first round is the
        // one waited for, and only its set (or its end) ends the wait.
        let set = Arc::new(JoinKeySet::new(2));
        let decided = set.decided();
        let round = set.start(0);
        assert!(!resolves_within(set.decided(), 3 * READ_AHEAD_GRACE), "no set yet");
        // The fill's wait has no timer of its own (above); a scan's wait on
        // a round not read ahead runs out after the grace, and the round is
        // over for the fill too.
        let scans_wait = set.settled(round, long);
        assert!(resolves_within(scans_wait, Duration::from_secs(10)));
        assert!(resolves_within(decided, Duration::from_secs(10)), "the round waited out");
        assert!(resolves_within(set.decided(), Duration::from_secs(1)));
        assert!(set.keys().is_none());

        let set = Arc::new(JoinKeySet::new(1));
        let round = set.start(0);
        let decided = set.decided();
        let maker = Arc::clone(&set);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            maker.finish(round, Some(vec![3, 4]));
        });
        assert!(resolves_within(decided, Duration::from_secs(10)), "the set made");
        assert!(set.keys().unwrap().contains(4));
        // A fill that waited changed nothing for the scans: a new round's
        // wait waits for its set.
        let next = set.start(0);
        let decided = set.decided();
        assert!(!resolves_within(set.settled(next, long), Duration::from_millis(50)));
        set.fail(next);
        assert!(resolves_within(decided, Duration::from_secs(10)), "the round failed");
    }

    #[test]
    fn a_wait_for_several_partitions_goes_on_only_where_all_are_read_ahead() {
        let long = Duration::from_secs(60);
        // Every partition read ahead: the wait lasts until the set is made.
        let set = Arc::new(JoinKeySet::new(2));
        let round = set.start(0);
        set.read_ahead(round);
        assert_eq!(set.start(1), round);
        set.read_ahead(round);
        assert!(set.reads_ahead());
        let wait = set.settled(round, long);
        assert!(!resolves_within(wait, 3 * READ_AHEAD_GRACE), "no set yet");
        let wait = set.settled(round, long);
        set.finish(round, Some(vec![1]));
        set.finish(round, Some(vec![2]));
        assert!(resolves_within(wait, Duration::from_secs(10)), "the set made");

        // One partition read ahead, the other never executed here: the
        // wait ends after the grace, and the round is not waited for again.
        let set = Arc::new(JoinKeySet::new(2));
        let round = set.start(0);
        set.read_ahead(round);
        let started = Instant::now();
        assert!(resolves_within(set.settled(round, long), Duration::from_secs(10)));
        assert!(started.elapsed() >= READ_AHEAD_GRACE);
        assert!(resolves_within(set.settled(round, long), Duration::from_secs(1)));
        assert!(set.keys().is_none());
    }

    #[test]
    fn a_few_keys_spread_over_hundreds_of_millions_make_a_set_that_keeps_few_rows() {
        // Order keys at scale factor 100: 1 to 600 million (a quarter of
        // them used), the few thousand orders a query keeps spread over all.
        let keys: Vec<i64> = (0..6_400).map(|i| 1 + i * 93_750).collect();
        let set = JoinKeySet::new(1);
        let round = set.start(0);
        set.finish(round, Some(keys.clone()));
        let bitmap = set.keys().expect("a set of keys spanning 600 million values");
        assert!(keys.iter().all(|&k| bitmap.contains(k)));
        assert!(!bitmap.contains(2) && !bitmap.contains(600_000_000) && !bitmap.contains(0));
        let share = bitmap.share_of(Some((1, 600_000_000)));
        assert!(share > 0.0 && share < 1e-4, "{share}");
    }

    #[test]
    fn keys_too_spread_make_no_set() {
        let set = JoinKeySet::new(1);
        let round = set.start(0);
        set.finish(round, Some(vec![0, MAX_KEY_SPAN as i64 * 2]));
        assert!(set.keys().is_none());
    }

    #[test]
    fn partitions_finishing_on_many_threads_make_the_set_of_all_their_keys() {
        // Enough keys that the set is made on several threads, from eight
        // partitions finishing at once, each with keys of its own and some
        // of the others'.
        let partitions = 8;
        let keys: Vec<Vec<i64>> = (0..partitions)
            .map(|p| (0..300_000i64).map(|i| (i * 7919 + p * 104_729) % 9_000_000 - 1_000).collect())
            .collect();
        let set = Arc::new(JoinKeySet::new(partitions as usize));
        let round = (0..partitions).map(|p| set.start(p as usize)).max().unwrap();
        let made: Vec<bool> = std::thread::scope(|scope| {
            let finishing: Vec<_> = keys
                .iter()
                .map(|values| {
                    let set = Arc::clone(&set);
                    scope.spawn(move || set.finish(round, Some(values.clone())))
                })
                .collect();
            finishing.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(made.iter().filter(|&&m| m).count(), 1, "one partition, the last, made it");
        let all: Vec<i64> = keys.concat();
        let expected = KeyBitmap::of(&all).unwrap();
        assert_eq!(set.keys().unwrap().words(), expected.words());
        assert!(all.iter().step_by(997).all(|&k| expected.contains(k)));
    }
}
