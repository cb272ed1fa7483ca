//! A Parquet part read in turn (by a scan filter, or by the fill ahead of a
//! plan) by one task, piece after piece (of whole row groups, or slices of
//! its one large row group), whose last unread pieces an idle task reads
//! for it.
//!
//! A table's byte ranges hold unequal numbers of row groups, and cold, a
//! scan's last ranges are each read by one task on an otherwise idle host.
//! Read in pieces by tasks of their own from the start, a partition's parts
//! progress together, all end late, and pieces decoded ahead are coded
//! after they left the CPU's caches (traced on SF 10's q14,
//! `BENCHMARKS.md`). Here a part's own task reads its pieces in order,
//! each batch coded as it comes. A task with nothing else to do (a
//! fill-ahead task whose queue is empty, [`help_reads_in_turn`]) takes the
//! last unread piece of the part with the most, reads it whole and hands
//! its batches to the part's task, which codes them when it gets there
//! (until then they wait as arrays: at most the part's pieces). It
//! does so only while fewer tasks read parts in turn (their own and
//! helpers) than the runtime has threads, so that it reads the tail rather
//! than beside every core. Each piece is read once, by whichever task
//! claims it first; a piece whose helper stops or fails is read by the
//! part's own task (a read error then recurs there and is reported).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use datafusion::arrow::array::ArrayRef;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::Count;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::{oneshot, Notify};

use super::row_groups::read_whole;
use super::source::Part;
use super::TableSource;
use crate::trace;

/// A piece's batches, as its helper read them.
type PieceBatches = Result<Vec<Vec<ArrayRef>>>;

/// One part read in turn, with what a helper needs to read its pieces.
pub(crate) struct SharedRead {
    source: TableSource,
    table_columns: Vec<usize>,
    coded: Vec<usize>,
    context: Arc<TaskContext>,
    pieces: Vec<SharedPiece>,
}

struct SharedPiece {
    part: Part,
    /// Whether a task (the part's own or a helper) reads it.
    claimed: AtomicBool,
    /// Where a helper hands its batches to the part's task.
    handed: Mutex<Option<oneshot::Sender<PieceBatches>>>,
}

impl SharedPiece {
    /// Claims the piece; `false` where another task has.
    fn claim(&self) -> bool {
        !self.claimed.swap(true, Ordering::AcqRel)
    }
}

impl SharedRead {
    /// Pieces no task reads yet.
    fn unclaimed(&self) -> usize {
        self.pieces
            .iter()
            .filter(|piece| !piece.claimed.load(Ordering::Acquire))
            .count()
    }

    /// Claims the last piece no task reads yet, if any.
    fn claim_last(&self) -> Option<usize> {
        (0..self.pieces.len())
            .rev()
            .find(|&at| self.pieces[at].claim())
    }

    /// Reads piece `at` (claimed by the caller) whole, for the part's task.
    /// The sender is taken first: where this future is dropped before the
    /// read ends (its fill-ahead task aborted with its plan), the sender
    /// goes with it, and the part's task reads the piece itself.
    async fn read_for_owner(&self, at: usize) {
        let piece = &self.pieces[at];
        let Some(sender) = piece.handed.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let read = read_whole(&piece.part, &self.source, &self.table_columns, &self.coded, Arc::clone(&self.context)).await;
        trace::event(|| format!("{}: read by a helper", piece.part.describe()));
        // The part's task may have stopped (its query ended): nothing then
        // waits for the batches.
        let _ = sender.send(read);
    }

    /// Claims every piece left: the part's task stopped reading, and no
    /// helper should read for it.
    fn close(&self) {
        for piece in &self.pieces {
            piece.claimed.store(true, Ordering::Release);
        }
    }
}

/// Parts being read in turn that cut into pieces, open to helpers, and
/// the tasks reading them.
#[derive(Default)]
pub(crate) struct OpenReads {
    reads: Mutex<Vec<Weak<SharedRead>>>,
    /// Tasks reading such parts now: each part's own (from its first piece
    /// to its last batch, waiting for a helper's piece too) and each
    /// helper.
    reading: AtomicUsize,
    /// Told when a task stops reading, for helpers waiting for a core.
    stopped: Notify,
}

/// What a helper finds.
enum Claim {
    /// A piece to read.
    Piece(Arc<SharedRead>, usize),
    /// Unread pieces, but every slot busy.
    Busy,
    /// No unread piece.
    Done,
}

impl OpenReads {
    fn open(&self, read: &Arc<SharedRead>) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.retain(|read| read.strong_count() > 0);
        reads.push(Arc::downgrade(read));
        self.reading.fetch_add(1, Ordering::AcqRel);
    }

    /// A task stopped reading.
    fn stop_reading(&self) {
        self.reading.fetch_sub(1, Ordering::AcqRel);
        self.stopped.notify_waiters();
    }

    /// Claims, where fewer than `slots` tasks read now, the last unread
    /// piece of the part with the most, and counts the caller as reading.
    fn claim(&self, slots: usize) -> Claim {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.retain(|read| read.strong_count() > 0);
        let mut open: Vec<(usize, Arc<SharedRead>)> = reads
            .iter()
            .filter_map(Weak::upgrade)
            .map(|read| (read.unclaimed(), read))
            .filter(|(unclaimed, _)| *unclaimed > 0)
            .collect();
        if open.is_empty() {
            return Claim::Done;
        }
        if self.reading.load(Ordering::Acquire) >= slots {
            return Claim::Busy;
        }
        // The part with the most unread pieces first; its own task may
        // have claimed the last one since (then the next part).
        open.sort_by_key(|(unclaimed, _)| std::cmp::Reverse(*unclaimed));
        for (_, read) in open {
            if let Some(at) = read.claim_last() {
                self.reading.fetch_add(1, Ordering::AcqRel);
                return Claim::Piece(read, at);
            }
        }
        Claim::Done
    }
}

/// A task counted as reading (see [`OpenReads::reading`]) until dropped:
/// a part's own task, with its stream, or a helper, with its read (an
/// aborted helper too).
struct Reading<'a>(&'a OpenReads);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.stop_reading();
    }
}

/// A part's own task reading, until its stream is dropped: then no helper
/// reads the part's pieces left (for nobody), and the task stops counting
/// as reading.
struct OwnerReading {
    read: Arc<SharedRead>,
    _reading: Reading<'static>,
}

impl Drop for OwnerReading {
    fn drop(&mut self) {
        self.read.close();
    }
}

/// The parts being read in turn in the process.
static OPEN_READS: LazyLock<OpenReads> = LazyLock::new(OpenReads::default);

/// Every row of table columns `table_columns` of `part`, as
/// [`Part::batches`] reads them (`coded`: the string columns the fill
/// codes), in the part's order: where the part cuts into `pieces` (what
/// [`pieces_of`] found, asked by the caller once), piece after piece, its
/// last unread pieces open to idle tasks ([`help_reads_in_turn`]); those
/// pieces are counted in `pieces_read`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn batches_read_in_turn(
    source: &TableSource,
    part: &Part,
    pieces: Option<Vec<Part>>,
    table_columns: &[usize],
    coded: &[usize],
    context: Arc<TaskContext>,
    pieces_read: &Count,
) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
    let read = shared_read(&OPEN_READS, source, part, pieces, table_columns, coded, context, pieces_read);
    Ok(read.await?.0)
}

/// [`batches_read_in_turn`], with the part's pieces where it cut into any.
#[allow(clippy::too_many_arguments)]
async fn shared_read(
    open: &'static OpenReads,
    source: &TableSource,
    part: &Part,
    pieces: Option<Vec<Part>>,
    table_columns: &[usize],
    coded: &[usize],
    context: Arc<TaskContext>,
    pieces_read: &Count,
) -> Result<(BoxStream<'static, Result<Vec<ArrayRef>>>, Option<Arc<SharedRead>>)> {
    let Some(pieces) = pieces else {
        return Ok((part.batches(source, table_columns, coded, context)?, None));
    };
    let mut receivers = Vec::with_capacity(pieces.len());
    let pieces: Vec<SharedPiece> = pieces
        .into_iter()
        .map(|part| {
            let (sender, receiver) = oneshot::channel();
            receivers.push(receiver);
            SharedPiece {
                part,
                claimed: AtomicBool::new(false),
                handed: Mutex::new(Some(sender)),
            }
        })
        .collect();
    let read = Arc::new(SharedRead {
        source: source.clone(),
        table_columns: table_columns.to_vec(),
        coded: coded.to_vec(),
        context,
        pieces,
    });
    open.open(&read);
    let reading = OwnerReading {
        read: Arc::clone(&read),
        _reading: Reading(open),
    };
    let (owner, pieces_read) = (Arc::clone(&read), pieces_read.clone());
    let batches = futures::stream::iter(receivers.into_iter().enumerate())
        .then(move |(at, receiver)| {
            let (read, pieces_read) = (Arc::clone(&owner), pieces_read.clone());
            // The part's task reads until its stream is dropped.
            let _reading = &reading;
            async move {
                let piece = &read.pieces[at];
                // A helper read it, or failed or stopped: then it is read here.
                if !piece.claim() {
                    if let Ok(Ok(batches)) = receiver.await {
                        pieces_read.add(1);
                        return futures::stream::iter(batches.into_iter().map(Ok)).boxed();
                    }
                }
                match piece.part.batches(&read.source, &read.table_columns, &read.coded, Arc::clone(&read.context)) {
                    Ok(batches) => batches,
                    Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
                }
            }
        })
        .flatten()
        .boxed();
    Ok((batches, Some(read)))
}

/// Reads, for the tasks reading them, the last unread pieces of the parts
/// being read in turn in the process, the part with the most unread
/// pieces first, while fewer tasks read such parts than the runtime has
/// threads: what a fill-ahead task with no part left to take does before
/// it ends. It ends once no piece is left unclaimed (or when dropped: a
/// piece it was reading is then read by its part's task).
pub(crate) async fn help_reads_in_turn() {
    help(&OPEN_READS, crate::exec::runtime_workers()).await
}

/// Helps while fewer than `slots` tasks read parts in turn, waits while
/// more do, and ends once no piece is left unread.
async fn help(open: &OpenReads, slots: usize) {
    loop {
        let stopped = open.stopped.notified();
        tokio::pin!(stopped);
        // Told of a stop from here on, not only once waiting.
        stopped.as_mut().enable();
        match open.claim(slots) {
            Claim::Piece(read, at) => {
                let _reading = Reading(open);
                read.read_for_owner(at).await;
            }
            Claim::Busy => stopped.await,
            Claim::Done => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::scan_aggregate::row_groups::tests::{
        a_file_of_one_large_row_group, pairs_of, ranges_of_a_file_of_ten_row_groups, values_of,
    };
    use crate::exec::scan_aggregate::row_groups::{pieces_of, Slicing};

    /// Helpers' own registry, apart from the process's (other tests').
    fn open_reads() -> &'static OpenReads {
        Box::leak(Box::default())
    }

    /// The first range of the file of [`ranges_of_a_file_of_ten_row_groups`]
    /// (in a directory named after `name`), with a registry of its own.
    struct FirstRange {
        source: TableSource,
        context: Arc<TaskContext>,
        dir: std::path::PathBuf,
        open: &'static OpenReads,
        part: Part,
    }

    impl FirstRange {
        async fn of(name: &str) -> Self {
            let (source, context, dir) = ranges_of_a_file_of_ten_row_groups(name).await;
            let part = source.part_groups().into_iter().flatten().next().unwrap();
            Self { source, context, dir, open: open_reads(), part }
        }

        /// The range read in turn in pieces of one row group.
        async fn read_in_turn(
            &self,
            pieces_read: &Count,
        ) -> (BoxStream<'static, Result<Vec<ArrayRef>>>, Arc<SharedRead>) {
            let (source, part, context) = (&self.source, &self.part, Arc::clone(&self.context));
            let (batches, read) =
                shared_read(self.open, source, part, pieces_of(source, part, &context, 1, Slicing::Every).await, &[0], &[], context, pieces_read).await.unwrap();
            (batches, read.expect("the range cuts into pieces"))
        }
    }

    impl Drop for FirstRange {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Each range of a file read in turn, piece by piece, gives the rows a
    /// read of the whole range gives, in its order, whichever of its pieces
    /// a helper read for it (none, the last, all of them, or one whose
    /// reader stopped before handing it over), and counts the helped ones.
    #[tokio::test]
    async fn a_part_read_in_turn_gives_its_rows_in_order_whichever_pieces_a_helper_read() {
        let (source, context, dir) = ranges_of_a_file_of_ten_row_groups("read-in-turn").await;
        let open = open_reads();
        for part in source.part_groups().into_iter().flatten() {
            let whole = values_of(part.batches(&source, &[0], &[], Arc::clone(&context)).unwrap()).await;
            let pieces = pieces_of(&source, &part, &context, 1, Slicing::Every).await.map_or(0, |p| p.len());
            assert!(pieces >= 2, "{}: {pieces} pieces", part.describe());
            for helped in [0, 1, pieces] {
                let pieces_read = Count::new();
                let (batches, read) =
                    shared_read(open, &source, &part, pieces_of(&source, &part, &context, 1, Slicing::Every).await, &[0], &[], Arc::clone(&context), &pieces_read).await.unwrap();
                let read = read.expect("the range cuts into pieces");
                for _ in 0..helped {
                    let at = read.claim_last().unwrap();
                    read.read_for_owner(at).await;
                }
                assert_eq!(values_of(batches).await, whole, "{}, {helped} helped", part.describe());
                assert_eq!(pieces_read.value(), helped, "{}", part.describe());
                assert_eq!(read.unclaimed(), 0);
            }
            // A piece claimed by a helper that stops before handing it over
            // is read by the part's own task.
            let pieces_read = Count::new();
            let (batches, read) =
                shared_read(open, &source, &part, pieces_of(&source, &part, &context, 1, Slicing::Every).await, &[0], &[], Arc::clone(&context), &pieces_read).await.unwrap();
            let read = read.unwrap();
            let at = read.claim_last().unwrap();
            drop(read.pieces[at].handed.lock().unwrap().take());
            assert_eq!(values_of(batches).await, whole, "{}", part.describe());
            assert_eq!(pieces_read.value(), 0);
        }
        // Every part's own task is done reading.
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
        // A part that does not cut (0 rows a piece: each range whole) is
        // read as it is, open to no helper.
        let part = source.part_groups().into_iter().flatten().next().unwrap();
        let (_, read) =
            shared_read(open, &source, &part, pieces_of(&source, &part, &context, 0, Slicing::Every).await, &[0], &[], Arc::clone(&context), &Count::new()).await.unwrap();
        assert!(read.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A part of one row group read in turn in slices of its rows gives
    /// every row in order, a dictionary column's strings too, whichever of
    /// its slices a helper read for it (none, the last, all of them).
    #[tokio::test]
    async fn a_row_group_read_in_turn_in_slices_gives_its_rows_in_order_whichever_slices_a_helper_read() {
        let rows = 50_000;
        let (source, context, dir) = a_file_of_one_large_row_group("slices-in-turn", rows).await;
        let every: Vec<(i64, String)> = (0..rows).map(|v| (v, format!("value {}", v % 7))).collect();
        let open = open_reads();
        let mut sliced = 0;
        for part in source.part_groups().into_iter().flatten() {
            if pieces_of(&source, &part, &context, 10_000, Slicing::Alone).await.is_none() {
                continue;
            }
            sliced += 1;
            for helped in [0, 1, 5] {
                let pieces_read = Count::new();
                let pieces = pieces_of(&source, &part, &context, 10_000, Slicing::Alone).await;
                assert_eq!(pieces.as_ref().map(Vec::len), Some(5), "{}", part.describe());
                let (batches, read) =
                    shared_read(open, &source, &part, pieces, &[0, 1], &[1], Arc::clone(&context), &pieces_read)
                        .await
                        .unwrap();
                let read = read.expect("the part cuts into slices");
                for _ in 0..helped {
                    let at = read.claim_last().unwrap();
                    read.read_for_owner(at).await;
                }
                assert_eq!(pairs_of(batches).await, every, "{helped} helped");
                assert_eq!(pieces_read.value(), helped);
                assert_eq!(read.unclaimed(), 0);
            }
        }
        assert_eq!(sliced, 1, "the one range the row group starts in");
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Helpers with a slot each take the last unread piece of the part
    /// with the most, until none is left; the parts' tasks then find each
    /// piece read once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn helpers_read_the_last_pieces_of_parts_read_in_turn_once_each() {
        let (source, context, dir) = ranges_of_a_file_of_ten_row_groups("helpers").await;
        let open = open_reads();
        let parts: Vec<Part> = source.part_groups().into_iter().flatten().collect();
        let pieces_read = Count::new();
        let mut reads = Vec::new();
        for part in &parts {
            let (batches, read) =
                shared_read(open, &source, part, pieces_of(&source, part, &context, 1, Slicing::Every).await, &[0], &[], Arc::clone(&context), &pieces_read).await.unwrap();
            assert!(read.is_some());
            reads.push(batches);
        }
        let helpers: Vec<_> = (0..2).map(|_| tokio::spawn(help(open, usize::MAX))).collect();
        let mut values = Vec::new();
        for batches in reads {
            values.extend(values_of(batches).await);
        }
        for helper in helpers {
            helper.await.unwrap();
        }
        values.sort_unstable();
        assert_eq!(values, (0..10_000).collect::<Vec<i64>>());
        assert!(pieces_read.value() <= 10);
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A helper waits while as many tasks read parts in turn as it has
    /// slots, and ends once their pieces are read; with a slot free it
    /// takes the last unread piece.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_helper_reads_only_where_a_slot_is_free() {
        let range = FirstRange::of("slots").await;
        let open = range.open;
        let pieces = pieces_of(&range.source, &range.part, &range.context, 1, Slicing::Every).await.unwrap().len();
        let pieces_read = Count::new();
        let (batches, read) = range.read_in_turn(&pieces_read).await;
        // One slot, taken by the part's own task.
        assert!(matches!(open.claim(1), Claim::Busy));
        let helper = tokio::spawn(help(open, 1));
        let values = values_of(batches).await;
        assert_eq!(values.len(), 1000 * pieces);
        helper.await.unwrap();
        assert_eq!(pieces_read.value(), 0, "the part's task read every piece");
        assert_eq!(read.unclaimed(), 0);
        assert!(matches!(open.claim(1), Claim::Done));
        // Two slots: a helper takes the last piece, and reads it.
        let (batches, _read) = range.read_in_turn(&pieces_read).await;
        let Claim::Piece(read, at) = open.claim(2) else {
            panic!("a free slot and unread pieces: no piece claimed");
        };
        assert_eq!(at, pieces - 1);
        let reading = Reading(open);
        read.read_for_owner(at).await;
        drop(reading);
        assert_eq!(values_of(batches).await, values);
        assert_eq!(pieces_read.value(), 1);
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
    }

    /// A helper dropped while it reads (its fill-ahead task aborted with
    /// its plan) stops counting as reading, and the part's own task gets
    /// the piece it had claimed rather than wait for it (read where the
    /// helper had not handed it over; a sender dropped before anything was
    /// sent, as in the first test, makes the part's task read it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_helper_dropped_while_it_reads_leaves_its_piece_to_the_part_and_its_slot_free() {
        let range = FirstRange::of("dropped-helper").await;
        let open = range.open;
        let whole = values_of(range.part.batches(&range.source, &[0], &[], Arc::clone(&range.context)).unwrap()).await;
        let pieces_read = Count::new();
        let (batches, _read) = range.read_in_turn(&pieces_read).await;
        let Claim::Piece(read, at) = open.claim(usize::MAX) else {
            panic!("no piece claimed");
        };
        let mut helper = Box::pin(async move {
            let _reading = Reading(open);
            read.read_for_owner(at).await;
        });
        // One step (the read may end in it, or not), then dropped: the
        // piece reaches the part's task from the helper or is read there.
        let done = futures::poll!(helper.as_mut()).is_ready();
        drop(helper);
        assert_eq!(open.reading.load(Ordering::Acquire), 1, "only the part's own task reads");
        let read = tokio::time::timeout(std::time::Duration::from_secs(30), values_of(batches));
        assert_eq!(read.await.expect("the part's task waited for a dropped helper"), whole);
        assert_eq!(pieces_read.value(), usize::from(done));
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
    }

    /// Once a part's own task drops its stream, no helper reads its pieces
    /// left.
    #[tokio::test]
    async fn no_helper_reads_for_a_part_whose_task_stopped() {
        let range = FirstRange::of("stopped-owner").await;
        let open = range.open;
        let (batches, read) = range.read_in_turn(&Count::new()).await;
        assert!(read.unclaimed() >= 2);
        drop(batches);
        assert_eq!(read.unclaimed(), 0);
        assert!(matches!(open.claim(usize::MAX), Claim::Done));
        assert_eq!(open.reading.load(Ordering::Acquire), 0);
    }
}
