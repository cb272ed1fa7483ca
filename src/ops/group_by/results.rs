//! A group-by's results while they are still on the device, and how they
//! come back: window by window of consecutive groups, through pinned
//! buffers that take turns, so that the next window crosses the bus while
//! the host reads the last one in place. [`DeviceGrouped::bring_back`]
//! hands the windows to one callback in order;
//! [`DeviceGrouped::bring_back_in_parallel`] cuts them into tasks that
//! threads started once take in turn, so that the host's work on the
//! results (building output batches) runs on every core without a start
//! and a join of threads per window, nor a wait for the slowest thread of
//! each.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::gpu::{DeviceEvent, DeviceStream};

use super::{fixed_sum_to_f64, GroupsBack};
#[cfg(any(test, feature = "test-support"))]
use super::{Grouped, Reduced};
use crate::gpu::{
    enqueue_download, DeviceVec, DriverResultExt, GpuDevice, GpuError, GpuResult, LandedBuffer,
    PhaseTimer, PinnedBuffer,
};
use crate::trace;

/// The groups of a set of rows, with what identifies each group and every
/// reduction still on the device ([`super::group_on_device`]).
pub struct DeviceGrouped {
    /// Number of groups: distinct keys, or 1 without keys.
    pub groups: usize,
    /// Each group's key word or a row of it (as `back` asks), in its first
    /// `groups` words; `None` without keys or rows.
    pub(super) identities: Option<DeviceVec<u64>>,
    /// What the group rows hold; read where every result is downloaded at
    /// once ([`DeviceGrouped::download`], tests only).
    #[cfg_attr(not(any(test, feature = "test-support")), allow(dead_code))]
    pub(super) back: GroupsBack,
    /// The group of every row, with [`GroupsBack::RowsAndRowGroups`];
    /// otherwise empty.
    pub row_groups: Vec<u64>,
    pub(super) reduced: Vec<DeviceReduced>,
    /// Whether the groups were numbered partition by partition
    /// ([`super::GroupIds::Partitioned`] without a partition holding too many).
    pub numbered_in_partitions: bool,
    /// Whether a hash table sized from an estimate of the groups
    /// ([`super::GroupIds::Hashed`] with `expected_groups`) filled up, so
    /// that the rows were numbered again in one sized to them.
    pub table_overflowed: bool,
    /// Whether every input was folded into that hash table as the rows were
    /// numbered, one pass over the rows and their values rather than a pass
    /// per input (it did not fill up; see `table_folds`).
    pub folded_in_table: bool,
    /// Whether that table was built again, larger, once the first chunk of
    /// rows showed more groups than it could hold (the sample's estimate
    /// too low), and the chunk folded again.
    pub folding_table_grown: bool,
    /// The stream the results were written on, which copies them out.
    pub(super) stream: Arc<DeviceStream>,
    /// Recorded on `stream` once every identity is made, before the
    /// reductions: another stream that waits for it brings the identities
    /// back while the reductions run.
    pub(super) identities_made: Option<DeviceEvent>,
    /// Recorded on `stream` once each reduction is made, in reduction
    /// order, where the reductions are made one after the other (empty
    /// where they are made together, folded into the table).
    pub(super) reductions_made: Vec<DeviceEvent>,
    /// Inputs reduced chunk by chunk as they landed
    /// ([`super::InputChunks::reduce_as_they_land`]).
    pub inputs_reduced_as_they_landed: usize,
}

/// What of each group a pass over the results brings back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultParts {
    /// Its identity and every reduction's results (tests only).
    #[cfg_attr(not(any(test, feature = "test-support")), allow(dead_code))]
    All,
    /// Its identity alone, known once the groups are numbered: brought
    /// back on another stream while the device still reduces.
    Identities,
    /// Every reduction's results alone.
    Reductions,
    /// The results of the reductions whose bits `mask` sets (reduction `i`
    /// at bit `i`: of the first 64 alone): on another stream, they come
    /// back once the last of them is made, while the device may still make
    /// later ones ([`DeviceGrouped::reductions_made_apart`]). The windows'
    /// other reductions are empty.
    SomeReductions { mask: u64 },
}

impl ResultParts {
    /// [`ResultParts::SomeReductions`] of `reductions`; `None` where one is
    /// past the first 64.
    pub fn some_reductions(reductions: &[usize]) -> Option<Self> {
        reductions
            .iter()
            .try_fold(0u64, |mask, &i| {
                Some(mask | 1u64.checked_shl(i.try_into().ok()?)?)
            })
            .map(|mask| ResultParts::SomeReductions { mask })
    }

    fn identities(self) -> bool {
        matches!(self, ResultParts::All | ResultParts::Identities)
    }

    /// Whether reduction `i` comes back.
    fn reduction(self, i: usize) -> bool {
        match self {
            ResultParts::All | ResultParts::Reductions => true,
            ResultParts::Identities => false,
            ResultParts::SomeReductions { mask } => i < 64 && (mask >> i) & 1 == 1,
        }
    }

    fn reductions(self) -> bool {
        self != ResultParts::Identities
    }
}

/// One reduction's results on the device.
pub(super) enum DeviceReduced {
    /// No row was reduced: every group holds the identity, in one word or,
    /// for wide reductions, two.
    Identity { word: u64, wide: bool },
    /// One word per group, and high words of wide results.
    Words {
        values: DeviceVec<u64>,
        high: Option<DeviceVec<u64>>,
    },
    /// [`super::Reduction::SumF64Fixed`]'s parts, which the host turns into
    /// one double per group ([`fixed_sum_to_f64`]).
    FixedF64 {
        top: DeviceVec<u64>,
        specials: DeviceVec<u64>,
        lo: DeviceVec<u64>,
        hi: DeviceVec<u64>,
    },
}

impl DeviceReduced {
    /// The device vectors that come back, in the order their windows are
    /// laid out in a pinned buffer.
    fn parts(&self) -> Vec<&DeviceVec<u64>> {
        match self {
            DeviceReduced::Identity { .. } => Vec::new(),
            DeviceReduced::Words { values, high } => std::iter::once(values).chain(high).collect(),
            DeviceReduced::FixedF64 {
                top,
                specials,
                lo,
                hi,
            } => vec![top, specials, lo, hi],
        }
    }

    /// The results of `len` groups where the host makes them (values, high
    /// words) from their parts' windows (`parts`, each of `len` words, in
    /// [`DeviceReduced::parts`] order); `None` where they are read in place.
    fn made_on_host(&self, parts: &[&[u64]], len: usize) -> Option<(Vec<u64>, Vec<u64>)> {
        match self {
            DeviceReduced::Identity { word, wide } => Some((
                vec![*word; len],
                if *wide { vec![*word; len] } else { Vec::new() },
            )),
            DeviceReduced::Words { .. } => None,
            DeviceReduced::FixedF64 { .. } => {
                let (top, specials, lo, hi) = (parts[0], parts[1], parts[2], parts[3]);
                let values = (0..len)
                    .map(|g| {
                        let sum = ((u128::from(hi[g]) << 64) | u128::from(lo[g])) as i128;
                        fixed_sum_to_f64(sum, top[g], specials[g]).to_bits()
                    })
                    .collect();
                Some((values, Vec::new()))
            }
        }
    }
}

/// One reduction's results for a window of groups, read where they landed
/// in pinned memory where they need no work on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducedWindow<'a> {
    /// One word per group (low words of wide results).
    pub values: Cow<'a, [u64]>,
    /// High words of wide results, otherwise empty.
    pub high_words: Cow<'a, [u64]>,
}

/// A window of consecutive groups brought back to the host.
#[derive(Debug)]
pub struct GroupedWindow<'a> {
    /// The groups, among all of them.
    pub groups: Range<usize>,
    /// Each group's key word ([`GroupsBack::KeyWords`]) or a row of it
    /// ([`GroupsBack::RowsAndRowGroups`]); empty without keys.
    pub identities: &'a [u64],
    /// One result per input, in input order.
    pub reduced: Vec<ReducedWindow<'a>>,
}

/// A window that has landed in its pinned buffer: the buffer, the groups,
/// and the results the host made of its words.
struct Landed {
    /// `None` where nothing comes back (no keys, and no row reduced).
    buffer: Option<LandedBuffer>,
    groups: Range<usize>,
    made: Vec<Option<(Vec<u64>, Vec<u64>)>>,
}

impl DeviceGrouped {
    /// Waits until the device has made every result ([`group_on_device`]
    /// returns once the work is enqueued): what a measure of the device
    /// part, as apart from bringing the results back, waits for.
    ///
    /// [`group_on_device`]: super::group_on_device
    pub fn wait_until_made(&self) -> GpuResult<()> {
        self.stream
            .synchronize()
            .during("waiting for the groups' results")
    }

    /// The stream the results are written on.
    pub fn stream(&self) -> &Arc<DeviceStream> {
        &self.stream
    }

    /// Words that come back per group with `parts`: its identity (with
    /// keys) and each reduction's parts.
    pub fn words_per_group(&self, parts: ResultParts) -> usize {
        self.parts(parts).len()
    }

    /// Whether each group has an identity to bring back (with keys).
    pub fn has_identities(&self) -> bool {
        self.identities.is_some()
    }

    /// Whether the reductions are made one after the other, each input
    /// once it has crossed the bus, so that a pass over the first ones
    /// ([`ResultParts::SomeReductions`]) can bring them back while the
    /// device still makes the others.
    pub fn reductions_made_apart(&self) -> bool {
        self.reduced.len() > 1 && self.reductions_made.len() == self.reduced.len()
    }

    /// Every part of `parts` that comes back, identities first.
    fn parts(&self, parts: ResultParts) -> Vec<&DeviceVec<u64>> {
        let identities = self.identities.iter().filter(|_| parts.identities());
        let reduced = self
            .reduced
            .iter()
            .enumerate()
            .filter(|(i, _)| parts.reduction(*i))
            .flat_map(|(_, reduced)| reduced.parts());
        identities.chain(reduced).collect()
    }

    /// Orders `stream`'s later work after what `parts` reads was made:
    /// the identities, the reductions up to the last of `parts` where
    /// their ends were recorded, or every reduction (all the work enqueued
    /// on the results' stream). Nothing for the results' own stream.
    fn order_after(&self, stream: &Arc<DeviceStream>, parts: ResultParts) -> GpuResult<()> {
        if Arc::ptr_eq(stream, &self.stream) {
            return Ok(());
        }
        let last_made = match parts {
            ResultParts::SomeReductions { mask } if mask != 0 => {
                let last = 63 - mask.leading_zeros() as usize;
                self.reductions_made.get(last)
            }
            _ => None,
        };
        match (&self.identities_made, parts, last_made) {
            (Some(made), ResultParts::Identities, _) => stream
                .wait(made)
                .during("ordering a copy after the identities"),
            (_, _, Some(made)) => stream
                .wait(made)
                .during("ordering a copy after a reduction"),
            _ => {
                let reduced = self
                    .stream
                    .record_event(None)
                    .during("recording the reductions' end")?;
                stream
                    .wait(&reduced)
                    .during("ordering a copy after the reductions")
            }
        }
    }

    /// The groups of window `w` of `window` groups each.
    fn window_groups(&self, w: usize, window: usize) -> Range<usize> {
        w * window..((w + 1) * window).min(self.groups)
    }

    /// A pinned buffer for one window of `window` groups of `parts` (none
    /// where nothing comes back).
    fn window_buffer(
        &self,
        device: &GpuDevice,
        window: usize,
        parts: ResultParts,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<PinnedBuffer>> {
        let words = self.words_per_group(parts) * window;
        (words > 0)
            .then(|| device.pinned().take_timed(words, timer))
            .transpose()
    }

    /// Enqueues the copies of window `w` (of `window` groups each) of
    /// `parts` into `buffer` on `stream`: part `i`'s words at `i * window`.
    fn enqueue_window(
        &self,
        w: usize,
        window: usize,
        buffer: Option<&mut PinnedBuffer>,
        (stream, parts): (&Arc<DeviceStream>, ResultParts),
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let Some(buffer) = buffer else {
            return Ok(());
        };
        let groups = self.window_groups(w, window);
        for (i, part) in self.parts(parts).into_iter().enumerate() {
            enqueue_download(
                stream,
                &part.slice(groups.clone()),
                buffer,
                i * window,
                timer,
            )?;
        }
        Ok(())
    }

    /// What the host makes of a landed window's words (`words`, laid out
    /// as [`DeviceGrouped::enqueue_window`] put them) for its `len` groups.
    fn made_on_host(
        &self,
        words: &[u64],
        window: usize,
        len: usize,
        parts: ResultParts,
    ) -> Vec<Option<(Vec<u64>, Vec<u64>)>> {
        if !parts.reductions() {
            return Vec::new();
        }
        let mut next = usize::from(self.identities.is_some() && parts.identities());
        self.reduced
            .iter()
            .enumerate()
            .map(|(i, reduced)| {
                if !parts.reduction(i) {
                    // Not brought back: an empty window.
                    return Some((Vec::new(), Vec::new()));
                }
                let count = reduced.parts().len();
                let parts: Vec<&[u64]> = (next..next + count)
                    .map(|i| &words[i * window..i * window + len])
                    .collect();
                next += count;
                reduced.made_on_host(&parts, len)
            })
            .collect()
    }

    /// The view of a landed window: its words in place, or what the host
    /// made of them.
    fn view<'a>(
        &self,
        words: &'a [u64],
        window: usize,
        groups: Range<usize>,
        made: &'a [Option<(Vec<u64>, Vec<u64>)>],
        parts: ResultParts,
    ) -> GroupedWindow<'a> {
        let len = groups.len();
        let part = |i: usize| &words[i * window..i * window + len];
        let with_identities = self.identities.is_some() && parts.identities();
        let mut next = usize::from(with_identities);
        // `made` is empty without the reductions: so is `reduced`. A
        // reduction not brought back is made empty, and has no words here.
        let reduced = self
            .reduced
            .iter()
            .zip(made)
            .enumerate()
            .map(|(i, (reduced, made))| {
                let count = if parts.reduction(i) {
                    reduced.parts().len()
                } else {
                    0
                };
                let first = next;
                next += count;
                match made {
                    Some((values, high_words)) => ReducedWindow {
                        values: Cow::Borrowed(values.as_slice()),
                        high_words: Cow::Borrowed(high_words.as_slice()),
                    },
                    None => ReducedWindow {
                        values: Cow::Borrowed(part(first)),
                        high_words: Cow::Borrowed(if count > 1 { part(first + 1) } else { &[] }),
                    },
                }
            })
            .collect();
        GroupedWindow {
            groups,
            identities: if with_identities { part(0) } else { &[] },
            reduced,
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Brings every group's identity and results back in windows of
    /// `window_groups` consecutive groups (at least one), and calls
    /// `on_window` with each in group order, on this thread. Two pinned
    /// buffers take turns: the next window crosses the bus while
    /// `on_window` reads this one, which it may do in place.
    pub fn bring_back<E: From<GpuError>>(
        &self,
        device: &GpuDevice,
        window_groups: usize,
        timer: &mut PhaseTimer,
        mut on_window: impl FnMut(GroupedWindow<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        // No larger than the groups: a window's buffer is sized to it.
        let window = window_groups.min(self.groups).max(1);
        let windows = self.groups.div_ceil(window);
        let all = (&self.stream, ResultParts::All);
        let mut buffers = Vec::with_capacity(2);
        for w in 0..windows.min(2) {
            let mut buffer = self.window_buffer(device, window, ResultParts::All, timer)?;
            self.enqueue_window(w, window, buffer.as_mut(), all, timer)?;
            buffers.push(buffer);
        }
        for w in 0..windows {
            {
                let groups = self.window_groups(w, window);
                // Waits for this window's copies.
                let words = match &buffers[w % 2] {
                    Some(buffer) => buffer.as_slice()?,
                    None => &[],
                };
                let made = self.made_on_host(words, window, groups.len(), ResultParts::All);
                on_window(self.view(words, window, groups, &made, ResultParts::All))?;
            }
            if w + 2 < windows {
                self.enqueue_window(w + 2, window, buffers[w % 2].as_mut(), all, timer)?;
            }
        }
        Ok(())
    }

    /// Brings `parts` of every group back in windows of about
    /// `window_groups` groups, copied on `stream` (ordered after what they
    /// read was made: the identities can come back while the device still
    /// reduces), cut into tasks of `task_groups` (each window
    /// a whole number of tasks), and runs `work` over every task on
    /// `threads` threads started once, which take the tasks in group
    /// order as they come: `work(window, groups)` with `groups` a range of
    /// the window's own. Returns the tasks' results in group order, or an
    /// error: of the tasks that failed, the first in group order (tasks not
    /// yet started when one fails are left out), or the feeding's own; a
    /// task that panics fails. Up to three windows are in pinned buffers at once: one
    /// or two read by the threads, the next crossing the bus.
    #[allow(clippy::too_many_arguments)]
    pub fn bring_back_in_parallel<R, E>(
        &self,
        device: &GpuDevice,
        (stream, parts): (&Arc<DeviceStream>, ResultParts),
        window_groups: usize,
        task_groups: usize,
        threads: usize,
        timer: &mut PhaseTimer,
        work: impl Fn(&GroupedWindow<'_>, Range<usize>) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E>
    where
        R: Send,
        E: From<GpuError> + Send,
    {
        /// Windows in pinned buffers at once.
        const BUFFERS: usize = 3;
        self.order_after(stream, parts)?;
        let task = task_groups.max(1);
        // Whole tasks, and no larger than the groups' last task ends: a
        // window's buffer is sized to it.
        let window = window_groups.min(self.groups).max(1).div_ceil(task) * task;
        let windows = self.groups.div_ceil(window);
        let tasks = self.groups.div_ceil(task);
        let shared = Shared {
            state: Mutex::new(TaskState {
                queue: VecDeque::new(),
                closed: false,
                finished: vec![0; windows],
                results: (0..tasks).map(|_| None).collect(),
                error: None,
            }),
            task_ready: Condvar::new(),
            task_finished: Condvar::new(),
        };
        let traced = trace::enabled();
        let pass_start = std::time::Instant::now();
        // With tracing on: the tasks' time in `work`, summed over the
        // threads (nanoseconds).
        let work_nanos = AtomicU64::new(0);
        let threads = threads.clamp(1, tasks.max(1));
        let main = std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let timed = traced.then_some(&work_nanos);
                    self.work_on_tasks(&shared, window, parts, &work, timed)
                });
            }
            // The queue is closed however the feeding ends, a panic
            // included, so that the threads leave and the scope can end.
            let closing = CloseOnDrop(&shared);
            let main = self.feed(
                device,
                &shared,
                (stream, parts),
                (window, task, windows, BUFFERS),
                timer,
            );
            if main.is_err() {
                // The tasks queued are dropped, not run.
                closing.0.abandon();
            }
            main
        });
        trace::event(|| {
            format!(
                "results: {parts:?}: {tasks} tasks of {task} groups on {threads} threads in \
                 {:.1} ms; the tasks' work {:.1} ms (thread time)",
                pass_start.elapsed().as_secs_f64() * 1e3,
                work_nanos.load(Ordering::Relaxed) as f64 / 1e6,
            )
        });
        let state = shared
            .state
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, error)) = state.error {
            return Err(error);
        }
        main?;
        state
            .results
            .into_iter()
            .map(|result| {
                result.ok_or_else(|| {
                    E::from(GpuError::Invalid("a task left without a result".into()))
                })
            })
            .collect()
    }

    /// One thread of [`DeviceGrouped::bring_back_in_parallel`]: runs `work`
    /// over the tasks queued in `shared` until the queue is closed; a task
    /// after an error is counted, not run. With `work_nanos`, adds the
    /// time spent in `work` to it.
    fn work_on_tasks<R, E>(
        &self,
        shared: &Shared<R, E>,
        window: usize,
        parts: ResultParts,
        work: &(impl Fn(&GroupedWindow<'_>, Range<usize>) -> Result<R, E> + Sync),
        work_nanos: Option<&AtomicU64>,
    ) where
        E: From<GpuError>,
    {
        while let Some(job) = shared.next_task() {
            let outcome = (!shared.failed()).then(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    let started = work_nanos.map(|_| std::time::Instant::now());
                    let words = match &job.landed.buffer {
                        Some(buffer) => buffer.as_slice(),
                        None => &[],
                    };
                    let view = self.view(
                        words,
                        window,
                        job.landed.groups.clone(),
                        &job.landed.made,
                        parts,
                    );
                    let outcome = work(&view, job.groups.clone());
                    if let (Some(started), Some(total)) = (started, work_nanos) {
                        total.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    outcome
                }))
                .unwrap_or_else(|_| {
                    Err(E::from(GpuError::Invalid(
                        "a thread bringing results back panicked".into(),
                    )))
                })
            });
            // The window is let go before it counts as finished, so that
            // its buffer can be taken back.
            let (window_index, index) = (job.window, job.index);
            drop(job);
            shared.finish(window_index, index, outcome);
        }
    }

    /// The feeding side of [`DeviceGrouped::bring_back_in_parallel`]: keeps
    /// up to `buffers` windows (of `window` groups) in pinned buffers, the
    /// copies of the next ones ahead of the threads, and queues each
    /// window's tasks (of `task` groups) once it has landed. Stops at the
    /// first error, its own or a task's.
    fn feed<R, E: From<GpuError>>(
        &self,
        device: &GpuDevice,
        shared: &Shared<R, E>,
        (stream, parts): (&Arc<DeviceStream>, ResultParts),
        (window, task, windows, buffers): (usize, usize, usize, usize),
        timer: &mut PhaseTimer,
    ) -> Result<(), E> {
        let tasks_of = |w: usize| self.window_groups(w, window).len().div_ceil(task);
        let mut spare: Vec<PinnedBuffer> = Vec::new();
        // Windows whose copies are enqueued, and those handed to the threads.
        let mut crossing: VecDeque<(usize, Option<PinnedBuffer>)> = VecDeque::new();
        let mut handed: VecDeque<(usize, Arc<Landed>)> = VecDeque::new();
        let mut next = 0;
        for w in 0..windows {
            // Takes back the buffers of windows whose tasks all finished,
            // and starts the copies of the next windows into free buffers.
            // Only where no window is crossing, and so none could be handed
            // to the threads next, does it wait for the oldest window.
            loop {
                while let Some((oldest, _)) = handed.front() {
                    let wait = crossing.is_empty();
                    if wait {
                        trace::event(|| format!("results: waiting for window {oldest}'s tasks"));
                    }
                    if !shared.window_finished(*oldest, tasks_of(*oldest), wait) {
                        break;
                    }
                    if wait {
                        trace::event(|| format!("results: window {oldest}'s tasks finished"));
                    }
                    let (_, landed) = handed.pop_front().expect("checked above");
                    if let Ok(Landed {
                        buffer: Some(buffer),
                        ..
                    }) = Arc::try_unwrap(landed)
                    {
                        spare.push(buffer.into_buffer());
                    }
                    if wait {
                        break;
                    }
                }
                while next < windows && crossing.len() + handed.len() < buffers {
                    let mut buffer = match spare.pop() {
                        Some(buffer) => Some(buffer),
                        None => self.window_buffer(device, window, parts, timer)?,
                    };
                    self.enqueue_window(next, window, buffer.as_mut(), (stream, parts), timer)?;
                    crossing.push_back((next, buffer));
                    next += 1;
                }
                if !crossing.is_empty() || shared.failed() {
                    break;
                }
            }
            let Some((_, buffer)) = crossing.pop_front() else {
                // A task failed while this waited: its error is the one
                // returned.
                return Ok(());
            };
            let groups = self.window_groups(w, window);
            // Waits for this window's copies, once for all its tasks.
            let buffer = buffer.map(PinnedBuffer::into_landed).transpose()?;
            let words = match &buffer {
                Some(buffer) => buffer.as_slice(),
                None => &[],
            };
            let made = self.made_on_host(words, window, groups.len(), parts);
            trace::event(|| format!("results: window {w} of {windows} of {parts:?} landed"));
            let landed = Arc::new(Landed {
                buffer,
                groups,
                made,
            });
            if !shared.queue(w, &landed, w * window / task, task) {
                // A task failed: its error is the one returned.
                return Ok(());
            }
            handed.push_back((w, landed));
        }
        Ok(())
    }

    /// Every result at once, brought back in windows of `window_words`
    /// words ([`DeviceGrouped::bring_back`]).
    #[cfg(any(test, feature = "test-support"))]
    pub fn download(
        self,
        device: &GpuDevice,
        window_words: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Grouped> {
        let mut identities = Vec::new();
        let mut reduced = vec![Reduced::default(); self.reduced.len()];
        let window_groups = window_words / self.words_per_group(ResultParts::All).max(1);
        self.bring_back(device, window_groups, timer, |window| {
            identities.extend_from_slice(window.identities);
            for (all, part) in reduced.iter_mut().zip(window.reduced) {
                all.values.extend_from_slice(&part.values);
                all.high_words.extend_from_slice(&part.high_words);
            }
            GpuResult::Ok(())
        })?;
        let (group_keys, group_rows) = match self.back {
            GroupsBack::KeyWords => (identities, Vec::new()),
            GroupsBack::RowsAndRowGroups => (Vec::new(), identities),
        };
        Ok(Grouped {
            groups: self.groups,
            group_keys,
            group_rows,
            row_groups: self.row_groups,
            reduced,
            numbered_in_partitions: self.numbered_in_partitions,
            table_overflowed: self.table_overflowed,
            folded_in_table: self.folded_in_table,
            folding_table_grown: self.folding_table_grown,
            inputs_reduced_as_they_landed: self.inputs_reduced_as_they_landed,
        })
    }
}

/// One task of [`DeviceGrouped::bring_back_in_parallel`].
struct Job {
    landed: Arc<Landed>,
    window: usize,
    /// The task's groups, among its window's.
    groups: Range<usize>,
    /// The task's index among all tasks.
    index: usize,
}

/// What the feeding thread and the task threads share.
struct Shared<R, E> {
    state: Mutex<TaskState<R, E>>,
    /// Signalled when a task is queued or the queue is closed.
    task_ready: Condvar,
    /// Signalled when a task finishes.
    task_finished: Condvar,
}

struct TaskState<R, E> {
    queue: VecDeque<Job>,
    /// No task will be queued any more.
    closed: bool,
    /// Tasks finished per window.
    finished: Vec<usize>,
    /// Each task's result, by index.
    results: Vec<Option<R>>,
    /// The error of the first task (by index) that failed.
    error: Option<(usize, E)>,
}

impl<R, E> Shared<R, E> {
    fn lock(&self) -> MutexGuard<'_, TaskState<R, E>> {
        // A panicking task is caught before it could poison the lock; the
        // state stays whole either way.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next task, waiting for one; `None` once the queue is closed and
    /// empty.
    fn next_task(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                return Some(job);
            }
            if state.closed {
                return None;
            }
            state = self
                .task_ready
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn failed(&self) -> bool {
        self.lock().error.is_some()
    }

    /// Records a task's outcome (`None`: skipped after an error).
    fn finish(&self, window: usize, index: usize, outcome: Option<Result<R, E>>) {
        let mut state = self.lock();
        state.finished[window] += 1;
        match outcome {
            Some(Ok(result)) => state.results[index] = Some(result),
            Some(Err(error)) if state.error.as_ref().is_none_or(|(first, _)| index < *first) => {
                state.error = Some((index, error));
            }
            Some(Err(_)) | None => {}
        }
        drop(state);
        self.task_finished.notify_all();
    }

    /// Queues the tasks of window `w`, `task` groups each (the last may be
    /// shorter), numbered from `first`; false, queuing nothing, after an
    /// error.
    fn queue(&self, w: usize, landed: &Arc<Landed>, first: usize, task: usize) -> bool {
        let mut state = self.lock();
        if state.error.is_some() {
            return false;
        }
        let len = landed.groups.len();
        for (i, start) in (0..len).step_by(task).enumerate() {
            state.queue.push_back(Job {
                landed: Arc::clone(landed),
                window: w,
                groups: start..(start + task).min(len),
                index: first + i,
            });
        }
        drop(state);
        self.task_ready.notify_all();
        true
    }

    /// Whether all `tasks` tasks of window `w` finished, waiting for them
    /// when `wait` (or an error, which also ends the wait).
    fn window_finished(&self, w: usize, tasks: usize, wait: bool) -> bool {
        let mut state = self.lock();
        loop {
            if state.finished[w] >= tasks {
                return true;
            }
            if !wait || state.error.is_some() {
                return false;
            }
            state = self
                .task_finished
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// No more tasks: the threads leave once the queue is empty.
    fn close(&self) {
        self.lock().closed = true;
        self.task_ready.notify_all();
    }

    /// Drops the tasks not yet taken, after the feeding failed.
    fn abandon(&self) {
        self.lock().queue.clear();
    }
}

/// Closes the task queue when dropped.
struct CloseOnDrop<'a, R, E>(&'a Shared<R, E>);

impl<R, E> Drop for CloseOnDrop<'_, R, E> {
    fn drop(&mut self) {
        self.0.close();
    }
}
