//! The device column cache filled for every filtered GPU scan of a plan
//! (`GpuScanFilterExec`) as soon as the plan starts to run, rather than
//! when each scan is first read.
//!
//! DataFusion reads a hash join's probe side only once its build side is
//! in, so a chain of joins reads its tables one after another, and the
//! largest (the probe side of the first join) last. A GPU scan's columns
//! are read whole into the cache, whatever its filter and its join keys,
//! so nothing but the order of reading makes it wait: a plan's scans are
//! filled together from the start, as many tasks a scan as the runtime has
//! threads (all spawned at once, the smallest tables' first), beside the
//! joins' own reading. Each task takes the scan's next part (the first of
//! every partition, then the second of every one, as the partitions read
//! them) and passes over a part another task fills now, and with none
//! left reads the last unread pieces of parts other tasks read in turn
//! (`gpu.tuning.steal_pieces`, [`help_reads_in_turn`]); each scan finds
//! its parts in the cache (or waits for the part being filled, see
//! [`crate::exec::scan_aggregate`]'s fill lock) when its turn comes. Scan aggregations are left out: each reads all of
//! its parts at once, a task a group, when it first runs. A scan that only
//! tests join keys leaves its partitions to DataFusion where the keys are
//! estimated to keep more than a share of its rows
//! ([`crate::exec::join_keys::MAX_KEPT_SHARE`], or more for strings kept
//! as their bytes), or where none are there: its fill waits until their
//! sets are made (or will not be), and fills nothing where the scan would
//! read nothing from the device. (TPC-H q14's `part`, tested against the
//! parts of a month's line items, would otherwise be read twice in a first
//! run.) A scan partition that started before a set of several partitions
//! was there (one not read ahead) still leaves its partition to
//! DataFusion: its fill may then read for the next query only.
//!
//! Only with the cache on (the fill is the cache's), in a multi-threaded
//! runtime, for a plan whose output partitions are read together (not a
//! distributed stage, which reads only its own), and where every column the
//! plan's scans read is known (by the files' statistics) to fit in half the
//! cache's share of the device: a fill ahead that evicts its own parts
//! before their scan reads them would read them twice. (The estimate
//! counts 8 bytes a row a column; strings kept as their bytes take more.)
//! A fill that fails, or finds a column it cannot keep, stops: the scan
//! finds the same when it reads the part, and says so.
//!
//! `EXPLAIN ANALYZE` counts, per scan, the parts and rows filled ahead
//! (`parts_filled_ahead`, `rows_filled_ahead`); the scan's own
//! `cache_misses`, `rows_read` and read times count only what it read
//! itself.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::datatypes::Field;
use datafusion::common::runtime::SpawnedTask;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};

use super::join_keys::{kept_by_join_keys, key_sets_in};
use super::scan_aggregate::{
    being_filled, help_reads_in_turn, part_columns, source_url, Loaded, Part, Reading, TableSource,
};
use super::GpuScanMetrics;
use crate::config::GpuOptions;
use crate::gpu::GpuDevice;
use crate::trace;

/// The columns one GPU scan of a plan reads, as it reads them.
pub(crate) struct ScanFill {
    pub source: TableSource,
    /// Table column index and field of each column read.
    pub fields: Vec<(usize, Field)>,
    /// Those of `fields` read as their bytes.
    pub byte_slots: Vec<usize>,
    /// The scan node's metrics, where the parts and rows filled ahead are
    /// counted (`parts_filled_ahead`, `rows_filled_ahead`).
    pub metrics: ExecutionPlanMetricsSet,
    /// Where the scan tests nothing but join keys, its tests: the fill
    /// waits for their sets (see the module docs).
    pub key_tests: Option<Vec<Arc<dyn PhysicalExpr>>>,
    /// The largest share of its rows such a scan's keys may keep for it to
    /// read the device, as the scan would find it now.
    pub kept_limit: KeptLimit,
    /// How the scan reads its columns once a string column is found too
    /// varied to code, where it can read it as its bytes.
    pub as_bytes: Option<AsBytes>,
}

/// The columns a scan reads and the slots of those it reads as their
/// bytes, made again after a string column was found too varied to code
/// (see [`crate::exec::scan_aggregate::uncodable_columns`]); `None` where
/// the scan cannot read it as its bytes.
pub(crate) type AsBytes = Arc<dyn Fn() -> Option<(Vec<(usize, Field)>, Vec<usize>)> + Send + Sync>;

/// See [`ScanFill::kept_limit`].
pub(crate) type KeptLimit = Arc<dyn Fn() -> f64 + Send + Sync>;

impl ScanFill {
    /// About how many bytes the scan's columns take on the device, at most;
    /// `None` where a part's rows are unknown (a file without statistics).
    fn bytes(&self) -> Option<usize> {
        let mut rows = 0usize;
        for part in self.source.part_groups().iter().flatten() {
            rows = rows.saturating_add(part.rows_estimate()?);
        }
        Some(rows.saturating_mul(8).saturating_mul(self.fields.len()))
    }
}

/// Whether a scan that tests only `key_tests` reads the device: once their
/// sets are made, or will not be, whether they keep at most `limit` of its
/// rows (as the scan finds when it runs).
async fn keys_keep_few_rows(key_tests: &[Arc<dyn PhysicalExpr>], limit: &KeptLimit) -> bool {
    let sets = key_sets_in(key_tests);
    futures::future::join_all(sets.iter().map(|set| set.decided())).await;
    kept_by_join_keys(key_tests).is_some_and(|kept| kept <= limit())
}

/// Whether scans whose columns take `bytes` (`None`: unknown) are filled
/// ahead into a cache of `capacity` bytes: only where they take at most
/// half of it, so that the fills do not evict their own parts before
/// their scans read them.
fn fits_ahead(bytes: &[Option<usize>], capacity: usize) -> bool {
    let mut total = 0usize;
    for scan in bytes {
        match scan {
            Some(bytes) => total = total.saturating_add(*bytes),
            None => return false,
        }
    }
    total <= capacity / 2
}

/// The fills of one plan's scans, started once, by the first of its nodes
/// to run ([`FillAheadSlot::start`]); the tasks end when it is dropped.
pub(crate) struct FillAhead {
    scans: Vec<ScanFill>,
    started: AtomicBool,
    tasks: Mutex<Vec<SpawnedTask<()>>>,
}

impl FillAhead {
    pub fn new(scans: Vec<ScanFill>) -> Self {
        Self {
            scans,
            started: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// Starts the fills, the first time only (see the module docs for
    /// where it does nothing).
    fn start(&self, context: &Arc<TaskContext>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let options = GpuOptions::from_config(context.session_config().options());
        if !options.cache || !super::in_multi_threaded_runtime() || self.scans.is_empty() {
            return;
        }
        let Ok(first) = super::partition_device(0, &options) else { return };
        let capacity = first.budget().limit_for(options.cache_memory_fraction);
        let bytes: Vec<Option<usize>> = self.scans.iter().map(ScanFill::bytes).collect();
        if !fits_ahead(&bytes, capacity) {
            trace::event(|| format!("fill ahead: {bytes:?} bytes, not known to fit half the cache's {capacity}"));
            return;
        }
        let mut order: Vec<(&ScanFill, Option<usize>)> = self.scans.iter().zip(bytes).collect();
        order.sort_by_key(|&(_, bytes)| bytes);
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for (scan, _) in order {
            let groups: Vec<GroupFill> = (0..scan.source.group_count())
                .map(|group| GroupFill {
                    // The device of the scan's partition `group`, which
                    // reads this group's parts.
                    device: super::partition_device(group, &options).ok(),
                    filled: MetricBuilder::new(&scan.metrics).counter("parts_filled_ahead", group),
                    rows_filled: MetricBuilder::new(&scan.metrics).counter("rows_filled_ahead", group),
                    read_apart: MetricBuilder::new(&scan.metrics).counter("parts_read_apart", group),
                })
                .collect();
            let queue = Arc::new(PartQueue {
                source: scan.source.clone(),
                groups,
                parts: PartQueue::in_turn(scan.source.part_groups()),
                next: AtomicUsize::new(0),
            });
            for worker in 0..super::runtime_workers() {
                let read = PartsRead {
                    queue: Arc::clone(&queue),
                    fields: scan.fields.clone(),
                    byte_slots: scan.byte_slots.clone(),
                    as_bytes: scan.as_bytes.clone(),
                    // Its own metrics: the node's count the scan's reads.
                    metrics: GpuScanMetrics::new(&ExecutionPlanMetricsSet::new(), worker),
                };
                let (context, options) = (Arc::clone(context), options.clone());
                let (key_tests, kept_limit) = (scan.key_tests.clone(), Arc::clone(&scan.kept_limit));
                tasks.push(SpawnedTask::spawn(async move {
                    if let Some(key_tests) = &key_tests {
                        if !keys_keep_few_rows(key_tests, &kept_limit).await {
                            trace::event(|| {
                                format!("fill ahead task {worker}: left out, the join keys keep many rows or none came")
                            });
                            return;
                        }
                    }
                    read.fill(context, options).await;
                }));
            }
        }
    }
}

/// The parts of one scan that its fill tasks take in turn: the first part
/// of every partition, then the second of every one, and so on, as the
/// scan's partitions will read them.
struct PartQueue {
    source: TableSource,
    groups: Vec<GroupFill>,
    /// Each part and the partition (group) it is of.
    parts: Vec<(usize, Part)>,
    /// The next part a task takes.
    next: AtomicUsize,
}

impl PartQueue {
    /// The parts of `groups` in the order the tasks take them.
    fn in_turn(groups: Vec<Vec<Part>>) -> Vec<(usize, Part)> {
        let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
        let mut order = Vec::new();
        for at in 0..longest {
            for (group, parts) in groups.iter().enumerate() {
                if let Some(part) = parts.get(at) {
                    order.push((group, part.clone()));
                }
            }
        }
        order
    }
}

/// What filling a part of one partition of a scan needs: the partition's
/// device (`None` where it has none, and the scan reads the partition
/// elsewhere), and where its parts and rows filled ahead are counted.
struct GroupFill {
    device: Option<Arc<GpuDevice>>,
    filled: Count,
    rows_filled: Count,
    /// Of the parts filled, those whose columns were read apart.
    read_apart: Count,
}

/// One task of a fill ahead: it takes the next part of its scan's queue
/// that no other task fills now, until none is left.
struct PartsRead {
    queue: Arc<PartQueue>,
    fields: Vec<(usize, Field)>,
    byte_slots: Vec<usize>,
    as_bytes: Option<AsBytes>,
    metrics: GpuScanMetrics,
}

impl PartsRead {
    /// Reads the queue's parts into the cache, those the cache lacks;
    /// stops at the first the device cannot take (the scan finds the same
    /// when it reads the part, and says so), but for a string column just
    /// found too varied to code that the scan reads as its bytes instead:
    /// the part is read again so, as the scan would.
    async fn fill(mut self, context: Arc<TaskContext>, options: GpuOptions) {
        let queue = Arc::clone(&self.queue);
        let url = source_url(&queue.source);
        loop {
            let at = queue.next.fetch_add(1, Ordering::Relaxed);
            let Some((group, part)) = queue.parts.get(at) else {
                // No part left to take: read the last pieces of parts
                // others read now.
                if options.tuning.steal_pieces && options.tuning.min_part_rows > 0 {
                    help_reads_in_turn().await;
                }
                return;
            };
            let group_fill = &queue.groups[*group];
            let Some(device) = &group_fill.device else {
                continue;
            };
            // Another task fills it: the scan waits for that fill.
            if being_filled(&part.fill_key(&url), device.id()) {
                continue;
            }
            let mut read_as_bytes = false;
            loop {
                let (misses_before, rows_before, apart_before) = (
                    self.metrics.cache_misses.value(),
                    self.metrics.rows_read.value(),
                    self.metrics.parts_read_apart.value(),
                );
                let loaded = part_columns(
                    &queue.source,
                    self.fields.clone(),
                    &self.byte_slots,
                    device,
                    part.clone(),
                    Reading::InTurn,
                    Arc::clone(&context),
                    &options,
                    &self.metrics,
                )
                .await;
                match loaded {
                    Ok(Loaded::Device(_)) => {
                        if self.metrics.cache_misses.value() > misses_before {
                            group_fill.filled.add(1);
                            group_fill
                                .rows_filled
                                .add(self.metrics.rows_read.value() - rows_before);
                            group_fill
                                .read_apart
                                .add(self.metrics.parts_read_apart.value() - apart_before);
                        }
                        break;
                    }
                    Ok(Loaded::Host(reason)) => {
                        let as_bytes = self.as_bytes.as_ref().and_then(|as_bytes| as_bytes());
                        match as_bytes {
                            Some((fields, byte_slots)) if !read_as_bytes && byte_slots != self.byte_slots => {
                                trace::event(|| format!("fill ahead of {}: strings as bytes", part.describe()));
                                (self.fields, self.byte_slots, read_as_bytes) = (fields, byte_slots, true);
                            }
                            _ => {
                                trace::event(|| format!("fill ahead stopped: {reason}"));
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        trace::event(|| format!("fill ahead stopped: {e}"));
                        return;
                    }
                }
            }
        }
    }
}

/// Where a plan node keeps its plan's [`FillAhead`], set once the plan is
/// made ([`crate::planner`]); empty in a node made otherwise.
#[derive(Default)]
pub(crate) struct FillAheadSlot(OnceLock<Arc<FillAhead>>);

impl FillAheadSlot {
    /// Gives the node `fills` (a node keeps the first it is given).
    pub fn set(&self, fills: &Arc<FillAhead>) {
        let _ = self.0.set(Arc::clone(fills));
    }

    /// The same fills, for a copy of the node.
    pub fn carried(&self) -> Self {
        let slot = Self::default();
        if let Some(fills) = self.0.get() {
            slot.set(fills);
        }
        slot
    }

    /// Starts the plan's fills, where the node has them and none of the
    /// plan's nodes started them yet; what the node's stream holds so that
    /// they go on while it is read (they end once the plan and every such
    /// stream are dropped).
    pub fn start(&self, context: &Arc<TaskContext>) -> Option<Arc<FillAhead>> {
        let fills = self.0.get()?;
        fills.start(context);
        Some(Arc::clone(fills))
    }
}

impl FillAheadSlot {
    /// The scans the plan's fills read (0 where the node has none), and
    /// which fills they are.
    pub fn scans(&self) -> (usize, Option<*const FillAhead>) {
        match self.0.get() {
            Some(fills) => (fills.scans.len(), Some(Arc::as_ptr(fills))),
            None => (0, None),
        }
    }
}

impl fmt::Debug for FillAheadSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FillAheadSlot({})", self.scans().0)
    }
}

#[cfg(test)]
mod tests {
    use super::fits_ahead;

    #[test]
    fn scans_are_filled_ahead_only_where_they_are_known_to_fit_half_the_cache() {
        assert!(fits_ahead(&[Some(300), Some(200)], 1000));
        assert!(!fits_ahead(&[Some(300), Some(201)], 1000));
        // A part of unknown rows (a file without statistics) may be of any
        // size.
        assert!(!fits_ahead(&[Some(1), None], 1000));
        assert!(fits_ahead(&[], 1000));
        assert!(!fits_ahead(&[Some(usize::MAX), Some(usize::MAX)], usize::MAX));
    }
}
