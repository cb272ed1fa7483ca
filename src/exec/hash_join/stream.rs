//! The probe side of a GPU hash join, one DataFusion partition: wait for the
//! build side, then read probe batches into chunks, join each chunk on the
//! device in a task of its own (the next chunk is read meanwhile) and emit
//! its output in chunk order, and after the last chunk
//! emit the build rows the join type calls for (once, from the partition
//! that finishes last).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use datafusion::arrow::array::UInt64Array;
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use super::build_side::{BuildSide, ResidentTable};
use super::candidates::{confirm_pairs, key_comparator};
use super::matches::{emits_pairs, rows_emitted_alone, tracks_probe_matches};
use super::order::{sort_by_probe_row, with_unmatched_probe_rows};
use super::output::{OutputAssembler, OutputRows, SideRows};
use crate::exec::device_gather::{
    folded_words, gather_batches, join_folds, probe_side_pays, reduce_pairs, ColumnBytes,
    GatherSide, ResidentColumns, SideCarry,
};
use crate::exec::keys::JoinKeys;
use crate::exec::once::OnceFut;
use crate::exec::pair_aggregate::{PairAggregate, PairReduction, PartialStates};
use crate::exec::release::release_in_background;
use crate::exec::row_source::{ArrivedBatches, RowSource};
use crate::exec::GpuJoinMetrics;
use crate::gpu::launch::PairSide;
use crate::gpu::{GpuDevice, GpuError, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::hash_join::{
    fold_partitioned, order_by_probe_row, order_device_bytes, partition_probe,
    partition_probe_carrying, probe_device_bytes, probe_partitioned, HostKeys, PartitionedProbe,
};
use crate::trace;

/// What the join computes, beyond its keys.
#[derive(Debug, Clone)]
pub(crate) struct JoinSemantics {
    pub(crate) join_type: JoinType,
    pub(crate) filter: Option<Arc<JoinFilter>>,
    /// `NOT IN` semantics of a single-key LeftAnti join.
    pub(crate) null_aware: bool,
    /// At most this many rows from this partition.
    pub(crate) fetch: Option<usize>,
    /// Emit rows in `HashJoinExec`'s order (see `gpu.preserve_order`).
    pub(crate) preserve_order: bool,
    /// The probe input is ordered: `HashJoinExec` then puts unmatched probe
    /// rows of outer joins at their position rather than after each batch.
    pub(crate) probe_ordered: bool,
}

/// Probe rows joined in one device launch sequence.
struct ProbeChunk {
    /// The probe batches the chunk is made of, as they arrived.
    rows: ArrivedBatches,
}

/// Everything one partition's probe loop needs.
pub(crate) struct ProbeSpec {
    /// The DataFusion partition this loop reads.
    pub(crate) partition: usize,
    pub(crate) build: OnceFut<BuildSide>,
    pub(crate) probe_input: SendableRecordBatchStream,
    pub(crate) probe_schema: SchemaRef,
    pub(crate) probe_on: Vec<PhysicalExprRef>,
    pub(crate) semantics: JoinSemantics,
    pub(crate) output: OutputAssembler,
    /// The partial aggregation computed from the pairs in place of the
    /// output rows (see [`crate::exec::pair_aggregate`]).
    pub(crate) aggregate: Option<Arc<PairAggregate>>,
    /// Per probe column, whether the output uses it, where output columns
    /// are gathered on the device (an inner join without a filter).
    pub(crate) gather_probe_columns: Option<Vec<bool>>,
    pub(crate) device: Arc<GpuDevice>,
    pub(crate) max_output_pairs: usize,
    /// Fold an aggregation's pairs while probing (`gpu.fold_while_probing`).
    pub(crate) fold_while_probing: bool,
    /// Partition the probe keys with the folds' values
    /// (`gpu.carry_folded_values`).
    pub(crate) carry_folded_values: bool,
    pub(crate) memory_fraction: f64,
    /// Tasks admitted on the device at once (`gpu.max_concurrent_tasks`).
    pub(crate) max_concurrent_tasks: usize,
    /// Threads a chunk's host work uses: 1 where many partitions' chunks
    /// run at once, every core where this partition reads the whole probe
    /// side.
    pub(crate) host_threads: usize,
    pub(crate) metrics: GpuJoinMetrics,
}

struct ProbeLoop {
    spec: ProbeSpec,
    /// The partition's partial aggregation states, with `spec.aggregate`.
    partial: Option<Arc<Mutex<PartialStates>>>,
    build: Option<Arc<BuildSide>>,
    probe_exhausted: bool,
    finished: bool,
    rows_left: usize,
    ready: VecDeque<RecordBatch>,
    /// The chunk being joined (in a task of its own) while the next one is
    /// read: its output goes before the next chunk's.
    joining: Option<SpawnedTask<Result<Vec<RecordBatch>>>>,
    /// The build table being made on this partition's device while the
    /// first probe chunk is read (see [`ProbeLoop::make_table_in_advance`]).
    table_in_advance: Option<SpawnedTask<()>>,
}

/// The output stream of one partition.
pub(crate) fn probe_stream(
    spec: ProbeSpec,
    schema: SchemaRef,
) -> Result<SendableRecordBatchStream> {
    let partial = match &spec.aggregate {
        Some(aggregate) => Some(Arc::new(Mutex::new(aggregate.start()?))),
        None => None,
    };
    let state = ProbeLoop {
        partial,
        rows_left: spec.semantics.fetch.unwrap_or(usize::MAX),
        spec,
        build: None,
        probe_exhausted: false,
        finished: false,
        ready: VecDeque::new(),
        joining: None,
        table_in_advance: None,
    };
    let stream = futures::stream::try_unfold(state, |mut state| async move {
        loop {
            if state.rows_left == 0 {
                state.spec.metrics.baseline.done();
                return Ok(None);
            }
            if let Some(batch) = state.ready.pop_front() {
                let batch = if batch.num_rows() > state.rows_left {
                    batch.slice(0, state.rows_left)
                } else {
                    batch
                };
                state.rows_left -= batch.num_rows();
                // Rows, batches and bytes, as DataFusion's own operators record them.
                let batch = batch.record_output(&state.spec.metrics.baseline);
                return Ok(Some((batch, state)));
            }
            if state.finished {
                state.spec.metrics.baseline.done();
                let partition = state.spec.partition;
                trace::event(|| format!("hash join p{partition}: finished"));
                return Ok(None);
            }
            let build = match &state.build {
                Some(build) => Arc::clone(build),
                None => {
                    let build = state.spec.build.get().await?;
                    state.build = Some(Arc::clone(&build));
                    state.make_table_in_advance(&build);
                    build
                }
            };
            if state.probe_exhausted {
                if let Some(joining) = state.joining.take() {
                    state.ready.extend(joined(joining).await?);
                    continue;
                }
                let output = state.final_rows(&build)?;
                state.ready.extend(output);
                if let Some(partial) = &state.partial {
                    let states = lock(partial).finish()?;
                    state.ready.push_back(states);
                }
                state.finished = true;
                continue;
            }
            if let Some(chunk) = state.read_chunk().await? {
                // This chunk's join starts while the previous one may still
                // run; the next chunk is read while this one is joined.
                let task = SpawnedTask::spawn(join_chunk(state.chunk_context(), build, chunk));
                if let Some(previous) = state.joining.replace(task) {
                    state.ready.extend(joined(previous).await?);
                }
            }
        }
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
}

/// The output of a chunk's join task.
async fn joined(task: SpawnedTask<Result<Vec<RecordBatch>>>) -> Result<Vec<RecordBatch>> {
    task.join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU join chunk task failed: {e}")))?
}

/// What joining one chunk needs of its partition, cloned per chunk so that
/// the join runs as a task of its own while the partition reads on.
#[derive(Clone)]
struct ChunkContext {
    probe_on: Vec<PhysicalExprRef>,
    semantics: JoinSemantics,
    output: OutputAssembler,
    aggregate: Option<Arc<PairAggregate>>,
    partial: Option<Arc<Mutex<PartialStates>>>,
    gather_probe_columns: Option<Vec<bool>>,
    device: Arc<GpuDevice>,
    max_output_pairs: usize,
    fold_while_probing: bool,
    carry_folded_values: bool,
    memory_fraction: f64,
    max_concurrent_tasks: usize,
    host_threads: usize,
    partition: usize,
    metrics: GpuJoinMetrics,
}

/// The bytes of `batch`'s rows: a slice of a larger batch counts its part of
/// the buffers, not all of them. Fixed-width values are counted from their
/// width alone (no `ArrayData` per batch), validity bits left out.
fn rows_bytes(batch: &RecordBatch) -> Result<usize> {
    let mut bytes = 0;
    for column in batch.columns() {
        bytes += match column.data_type().primitive_width() {
            Some(width) => column.len() * width,
            None => column.to_data().get_slice_memory_size()?,
        };
    }
    Ok(bytes)
}

fn lock(partial: &Mutex<PartialStates>) -> std::sync::MutexGuard<'_, PartialStates> {
    partial.lock().unwrap_or_else(|p| p.into_inner())
}

impl ProbeLoop {
    /// Up to the build side's `probe_chunk_rows` probe rows (and, for the
    /// automatic size, about `probe_chunk_bytes` bytes) as one batch;
    /// `None` at the end. Called once the build side is collected.
    async fn read_chunk(&mut self) -> Result<Option<ProbeChunk>> {
        let (chunk_rows, chunk_bytes) = self.build.as_ref().map_or((1, usize::MAX), |build| {
            (build.probe_chunk_rows.max(1), build.probe_chunk_bytes)
        });
        let mut batches = Vec::new();
        let mut rows = 0;
        let mut bytes = 0;
        while rows < chunk_rows && bytes < chunk_bytes {
            match self.spec.probe_input.next().await {
                Some(batch) => {
                    let batch = batch?;
                    rows += batch.num_rows();
                    if chunk_bytes != usize::MAX {
                        bytes += rows_bytes(&batch)?;
                    }
                    if batch.num_rows() > 0 {
                        batches.push(batch);
                    }
                }
                None => {
                    self.probe_exhausted = true;
                    break;
                }
            }
        }
        if batches.is_empty() {
            return Ok(None);
        }
        self.spec.metrics.probe_rows.add(rows);
        let partition = self.spec.partition;
        trace::event(|| format!("hash join p{partition}: chunk of {rows} rows read"));
        // Not concatenated: only the keys are made contiguous (see
        // `crate::exec::row_source`).
        Ok(Some(ProbeChunk {
            rows: ArrivedBatches::new(Arc::clone(&self.spec.probe_schema), batches),
        }))
    }

    /// The build rows emitted after the last probe partition: unmatched
    /// (Left, Full, LeftAnti), matched (LeftSemi) or all with a mark
    /// (LeftMark). Only the partition that finishes last emits them.
    fn final_rows(&self, build: &BuildSide) -> Result<Vec<RecordBatch>> {
        let Some(visited) = &build.visited else {
            return Ok(vec![]);
        };
        if !build.probe_finished() {
            return Ok(vec![]);
        }
        let semantics = &self.spec.semantics;
        if semantics.null_aware && build.probe_saw_null.load(Ordering::Acquire) {
            // x NOT IN (..., NULL, ...) is never true.
            return Ok(vec![]);
        }
        let _timer = self.spec.metrics.baseline.elapsed_compute().timer();
        let (mut ids, mark) = rows_emitted_alone(semantics.join_type, &visited.snapshot());
        if semantics.null_aware && build.probe_saw_rows.load(Ordering::Acquire) {
            // NULL NOT IN (a non-empty set) is not true either.
            // Keys held as raw pieces have no NULL (and no key columns).
            if let Some(key) = build.key_columns.first() {
                ids = ids
                    .values()
                    .iter()
                    .copied()
                    .filter(|&i| key.is_valid(i as usize))
                    .collect();
            }
        }
        let no_probe = RecordBatch::new_empty(Arc::clone(&self.spec.probe_schema));
        self.spec
            .output
            .assemble(&build.rows, &no_probe, &OutputRows::build_only(ids, mark))
    }

    /// Starts making the build table on this partition's device, where it
    /// has keys and nobody has made or makes it, so that the build side
    /// crosses the bus while the first probe chunk is read and its keys
    /// coded (at 2^26 rows a side, a GPU machine read the probe chunk 8 to
    /// 9 ms into the query and started the table after it, at 11 ms; now at
    /// 7 ms, the build side's preparation done). The first chunk's device
    /// part then finds the table in
    /// progress and sends its own keys meanwhile. A failure here is not
    /// reported: the chunk makes the table itself, and falls back to the
    /// host or fails as it would have. The task holds one of the device's
    /// admissions while it works, as a chunk making the table would.
    fn make_table_in_advance(&mut self, build: &Arc<BuildSide>) {
        let device = &self.spec.device;
        if build.keys.is_empty() || !build.device_table_unstarted(device) {
            return;
        }
        let (build, device) = (Arc::clone(build), Arc::clone(device));
        let (memory_fraction, max_concurrent_tasks) =
            (self.spec.memory_fraction, self.spec.max_concurrent_tasks);
        let metrics = self.spec.metrics.clone();
        self.table_in_advance = Some(SpawnedTask::spawn_blocking(move || {
            let _admission = device.admit(max_concurrent_tasks);
            if build.device_table_ready(&device) || device.bind_to_thread().is_err() {
                return;
            }
            let _ = build.device_table(&device, memory_fraction, &metrics);
        }));
    }

    /// What the next chunk's join task needs of this partition.
    fn chunk_context(&self) -> ChunkContext {
        let spec = &self.spec;
        ChunkContext {
            probe_on: spec.probe_on.clone(),
            semantics: spec.semantics.clone(),
            output: spec.output.clone(),
            aggregate: spec.aggregate.clone(),
            partial: self.partial.clone(),
            gather_probe_columns: spec.gather_probe_columns.clone(),
            device: Arc::clone(&spec.device),
            max_output_pairs: spec.max_output_pairs,
            fold_while_probing: spec.fold_while_probing,
            carry_folded_values: spec.carry_folded_values,
            memory_fraction: spec.memory_fraction,
            max_concurrent_tasks: spec.max_concurrent_tasks,
            host_threads: spec.host_threads,
            partition: spec.partition,
            metrics: spec.metrics.clone(),
        }
    }
}

/// Joins one probe chunk: its keys coded here, the device part off the
/// async runtime.
async fn join_chunk(
    cx: ChunkContext,
    build: Arc<BuildSide>,
    chunk: ProbeChunk,
) -> Result<Vec<RecordBatch>> {
    let ProbeChunk { rows: chunk } = chunk;
    let batch_ends = chunk.batch_ends().to_vec();
    let semantics = cx.semantics.clone();
    let (probe_key_columns, probe_keys) = {
        let _timer = cx.metrics.baseline.elapsed_compute().timer();
        let _encode = cx.metrics.encode_time.timer();
        let pieces = chunk.key_pieces(&cx.probe_on)?;
        if semantics.null_aware {
            build.probe_saw_rows.store(true, Ordering::Release);
            if pieces[0].iter().any(|piece| piece.null_count() > 0) {
                build.probe_saw_null.store(true, Ordering::Release);
            }
            if build.probe_saw_null.load(Ordering::Acquire) {
                // Nothing will be emitted; the rest of the probe side is
                // read only to finish the input.
                return Ok(vec![]);
            }
        }
        match build.encoder.raw_pieces(&pieces) {
            // Raw keys need no check against the key columns.
            Some(raw) => (Vec::new(), JoinKeys::RawPieces(raw)),
            None => {
                let threads = cx.host_threads;
                let columns = chunk.concat_key_pieces(&cx.probe_on, &pieces, threads)?;
                let keys = build.encoder.encode_parallel(&columns, threads)?;
                (columns, JoinKeys::Encoded(keys))
            }
        }
    };
    let device = Arc::clone(&cx.device);
    let output = cx.output.clone();
    // Hashed keys need a check of the key columns on the host, so only
    // exactly coded keys let the device make the output.
    let gather_probe_columns = cx
        .gather_probe_columns
        .clone()
        .filter(|_| !build.encoder.needs_verification());
    let metrics = cx.metrics.clone();
    let aggregate = cx.aggregate.clone();
    let partial = cx.partial.clone();
    let memory_fraction = cx.memory_fraction;
    let max_pairs = cx.max_output_pairs.max(1);
    let fold_while_probing = cx.fold_while_probing;
    let carry_folded_values = cx.carry_folded_values;
    let max_concurrent_tasks = cx.max_concurrent_tasks;
    let host_threads = cx.host_threads;
    let partition = cx.partition;
    let task = SpawnedTask::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
        let _timer = metrics.baseline.elapsed_compute().timer();
        let join_type = semantics.join_type;
        let keys_equal = if build.encoder.needs_verification() {
            Some(key_comparator(
                &build.key_columns,
                &probe_key_columns,
                build.encoder.null_equality(),
            )?)
        } else {
            None
        };
        let mut probe_matched =
            tracks_probe_matches(join_type).then(|| vec![false; chunk.num_rows()]);
        // With the order preserved, the chunk's pairs are gathered, sorted
        // and emitted at the end; otherwise each range is emitted as it comes.
        let mut ordered_pairs =
            (semantics.preserve_order && emits_pairs(join_type)).then(|| (Vec::new(), Vec::new()));
        let mut batches = Vec::new();
        // Rows of either side that no key can match never reach the device.
        if !probe_keys.is_empty() && !build.keys.is_empty() {
            let mut on_output = |output_part: ChunkOutput| -> Result<()> {
                let _emit = metrics.emit_time.timer();
                let (build_ids, probe_ids) = match output_part {
                    ChunkOutput::Pairs(build_ids, probe_ids) => (build_ids, probe_ids),
                    ChunkOutput::Batches(gathered, len) => {
                        // Every pair is an output row, in order already.
                        metrics.rows_gathered_on_device.add(len);
                        batches.extend(gathered);
                        return Ok(());
                    }
                    ChunkOutput::Reduced(words, len) => {
                        let partial = partial.as_ref().ok_or_else(|| {
                            DataFusionError::Internal(
                                "pairs reduced on the device without an aggregation".into(),
                            )
                        })?;
                        metrics.rows_aggregated_on_device.add(len);
                        return lock(partial).merge_device(&words, len);
                    }
                };
                let (build_ids, probe_ids) = confirm_pairs(
                    keys_equal.as_ref(),
                    semantics.filter.as_deref(),
                    &build.rows,
                    &chunk,
                    UInt64Array::from(build_ids),
                    UInt64Array::from(probe_ids),
                )?;
                if let Some(visited) = &build.visited {
                    visited.mark(build_ids.values());
                }
                if let Some(matched) = probe_matched.as_mut() {
                    for &i in probe_ids.values() {
                        matched[i as usize] = true;
                    }
                }
                if let Some((all_build, all_probe)) = ordered_pairs.as_mut() {
                    all_build.extend_from_slice(build_ids.values());
                    all_probe.extend_from_slice(probe_ids.values());
                } else if emits_pairs(join_type) {
                    batches.extend(output.assemble(
                        &build.rows,
                        &chunk,
                        &OutputRows::pairs(build_ids, probe_ids),
                    )?);
                }
                Ok(())
            };
            let gather = gather_probe_columns
                .as_ref()
                .map(|probe_columns| ChunkGather {
                    chunk: &chunk,
                    probe_columns,
                    output: &output,
                    ordered: semantics.preserve_order,
                    reductions: aggregate.as_ref().map(|a| a.reductions()),
                    fold_while_probing,
                    carry_folded_values,
                });
            let device_wall = metrics.device_wall_time.timer();
            find_pairs(
                &device,
                &build,
                &probe_keys,
                DeviceLimits {
                    max_pairs,
                    memory_fraction,
                    max_concurrent_tasks,
                    host_threads,
                    partition,
                },
                gather,
                &metrics,
                &mut on_output,
            )?;
            device_wall.done();
        }
        let _emit = metrics.emit_time.timer();
        let probe_matched = probe_matched.map(BooleanBuffer::from);
        if let Some((all_build, all_probe)) = ordered_pairs {
            let (build_ids, probe_ids) =
                sort_by_probe_row(&all_build, &all_probe, chunk.num_rows(), &build.arrival);
            let rows = match (&probe_matched, join_type) {
                (Some(matched), JoinType::Right | JoinType::Full) => {
                    let (build_ids, probe_ids) = with_unmatched_probe_rows(
                        &build_ids,
                        &probe_ids,
                        matched,
                        &batch_ends,
                        semantics.probe_ordered,
                    );
                    OutputRows {
                        len: probe_ids.len(),
                        build: SideRows::Ids(build_ids),
                        probe: SideRows::Ids(probe_ids),
                        mark: None,
                    }
                }
                _ => OutputRows::pairs(UInt64Array::from(build_ids), UInt64Array::from(probe_ids)),
            };
            batches.extend(output.assemble(&build.rows, &chunk, &rows)?);
        } else if let Some(matched) = &probe_matched {
            if matches!(join_type, JoinType::Right | JoinType::Full) {
                let (ids, _) = rows_emitted_alone(join_type, matched);
                batches.extend(output.assemble(
                    &build.rows,
                    &chunk,
                    &OutputRows::probe_only(ids, None),
                )?);
            }
        }
        if let Some(matched) = &probe_matched {
            if !matches!(join_type, JoinType::Right | JoinType::Full) {
                // RightSemi, RightAnti, RightMark: probe rows, in order.
                let (ids, mark) = rows_emitted_alone(join_type, matched);
                batches.extend(output.assemble(
                    &build.rows,
                    &chunk,
                    &OutputRows::probe_only(ids, mark),
                )?);
            }
        }
        metrics.probe_chunks.add(1);
        trace::event(|| format!("hash join p{partition}: chunk done"));
        if let Some(partial) = &partial {
            // Rows assembled on the host feed the same accumulators.
            let mut partial = lock(partial);
            for batch in batches.drain(..) {
                partial.update(&batch)?;
            }
        }
        // The chunk's batches and keys are dropped while the join goes on
        // (see `release`).
        release_in_background((chunk, probe_keys, probe_key_columns));
        Ok(batches)
    });
    task.join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU join task failed: {e}")))?
}

/// What a chunk hands on: matching pairs (build row ids, probe row ids),
/// the output batches of `len` rows gathered on the device, or the words
/// of the partial aggregation over `len` pairs reduced on the device.
enum ChunkOutput {
    Pairs(Vec<u64>, Vec<u64>),
    Batches(Vec<RecordBatch>, usize),
    Reduced(Vec<u64>, usize),
}

/// Output gathered on the device for one chunk (see
/// [`crate::exec::device_gather`]).
struct ChunkGather<'a> {
    chunk: &'a ArrivedBatches,
    /// Per probe column, whether the output uses it.
    probe_columns: &'a [bool],
    output: &'a OutputAssembler,
    /// Emit in `HashJoinExec`'s order: ordered on the device when the
    /// chunk's pairs fit one output range, else handed on as pairs.
    ordered: bool,
    /// The partial aggregation's reductions, computed from the pairs in
    /// place of output rows where their columns are on the device.
    reductions: Option<&'a [PairReduction]>,
    /// Compute them as the device probes, where it can (see
    /// [`crate::ops::hash_join::fold_partitioned`]).
    fold_while_probing: bool,
    /// And partition the probe keys with the values they fold (see
    /// [`SideCarry`]).
    carry_folded_values: bool,
}

/// Limits on one chunk's device work, and its partition (for tracing).
#[derive(Clone, Copy)]
struct DeviceLimits {
    max_pairs: usize,
    memory_fraction: f64,
    max_concurrent_tasks: usize,
    /// Threads for the host's part (see [`ProbeSpec::host_threads`]).
    host_threads: usize,
    partition: usize,
}

/// Finds the candidate pairs of one probe chunk and hands them to
/// `on_pairs` in bounded batches: on the device, or on the host when the
/// device lacks the memory and nothing was handed on yet. Blocking.
fn find_pairs(
    device: &Arc<GpuDevice>,
    build: &BuildSide,
    probe_keys: &JoinKeys,
    limits: DeviceLimits,
    gather: Option<ChunkGather<'_>>,
    metrics: &GpuJoinMetrics,
    on_output: &mut dyn FnMut(ChunkOutput) -> Result<()>,
) -> Result<()> {
    let DeviceLimits {
        max_pairs,
        max_concurrent_tasks,
        ..
    } = limits;
    let mut handed_on = false;
    let mut host_error = None;
    // A chunk waits for one of `max_concurrent_tasks` slots before its
    // device work starts and gives the slot up when its first pairs reach
    // the host: the host work on them (key checks, filters, gathering output
    // columns) then runs on every core while other chunks use the device.
    // The chunk's further device work (more output ranges of a large join)
    // runs without a slot, so a chunk holding device memory never waits for
    // one while a slot holder waits for that memory.
    let waiting = std::time::Instant::now();
    let admission = RefCell::new(Some(device.admit(max_concurrent_tasks)));
    let partition = limits.partition;
    trace::event(|| format!("hash join p{partition}: admitted to the device"));
    metrics
        .device
        .device_admission_wait
        .add_duration(waiting.elapsed());
    let on_device = pairs_on_device(
        device,
        build,
        probe_keys,
        &limits,
        gather.as_ref(),
        metrics,
        &mut |output| {
            handed_on = true;
            admission.borrow_mut().take();
            // A host-side failure stops further host work; the device
            // finishes its ranges and the error is returned after.
            if host_error.is_none() {
                if let Err(e) = output.and_then(&mut *on_output) {
                    host_error = Some(e);
                }
            }
        },
    );
    admission.borrow_mut().take();
    if let Some(e) = host_error {
        return Err(e);
    }
    match on_device {
        Ok(()) => Ok(()),
        Err(e) if !handed_on && e.is_out_of_device_memory() => {
            metrics.cpu_fallback_chunks.add(1);
            build.host_table().probe(
                &probe_keys.to_normalized(),
                max_pairs,
                &mut |build_ids, probe_ids| on_output(ChunkOutput::Pairs(build_ids, probe_ids)),
            )
        }
        Err(e) => Err(e.into()),
    }
}

/// The device part of [`find_pairs`].
fn pairs_on_device(
    device: &Arc<GpuDevice>,
    build: &BuildSide,
    probe_keys: &JoinKeys,
    limits: &DeviceLimits,
    gather: Option<&ChunkGather<'_>>,
    metrics: &GpuJoinMetrics,
    on_output: &mut dyn FnMut(Result<ChunkOutput>),
) -> GpuResult<()> {
    let DeviceLimits {
        max_pairs,
        memory_fraction,
        host_threads,
        partition,
        ..
    } = *limits;
    device.bind_to_thread()?;
    let gather = gather.filter(|_| build.gathers_on_device());
    let gather_bytes = gather.map_or(0, |gather| {
        let order = if gather.ordered {
            order_device_bytes(max_pairs)
        } else {
            0
        };
        // One buffer of the widest column's values per pair.
        let widest = ResidentColumns::widest(gather.chunk, gather.probe_columns)
            .max(build.widest_gathered_column());
        ResidentColumns::device_bytes(gather.chunk, gather.probe_columns)
            + order
            + widest * max_pairs
    });
    let bytes = probe_device_bytes(probe_keys.len(), build.plan(), max_pairs, device.sm_count())
        + gather_bytes;
    let stream = device.stream()?;
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let mut probe_columns: Option<ResidentColumns> = None;
    let mut partitioned = None;
    // Where the chunk's aggregation is folded as the device probes, its
    // keys carry the probe columns the folds read in place of row ids (see
    // `SideCarry`): the chunk's columns go to the device first. Only where
    // they all cross straight from pinned memory: staged through the host,
    // they then held back the keys' partitioning, which otherwise runs while
    // they are staged, and the chunk waits on the host, not on the device
    // (at 2^26 rows a side: 118 to 122 ms without carrying, 125 to 138 ms
    // with).
    let carrying = gather.filter(|gather| {
        gather.fold_while_probing && gather.carry_folded_values && gather.reductions.is_some()
    });
    let partition_keys = |probe_columns: &mut Option<ResidentColumns>,
                          carry_values: bool,
                          timer: &mut PhaseTimer|
     -> GpuResult<Option<KeysOnDevice>> {
        let pieces = probe_keys.pieces();
        let host_keys = HostKeys {
            pieces: &pieces,
            row_ids: probe_keys.row_ids(),
            range: build.key_range(probe_keys),
        };
        let carrying = carrying.filter(|_| carry_values).and_then(|gather| {
            let bytes = ColumnBytes::of(gather.chunk, gather.probe_columns);
            bytes.in_pinned_memory().then_some((gather, bytes))
        });
        if let Some((gather, bytes)) = carrying {
            let columns = match probe_columns {
                Some(columns) => columns,
                None => probe_columns.insert(ResidentColumns::upload_bytes(
                    device, stream, &bytes, timer,
                )?),
            };
            let reductions = gather.reductions.unwrap_or_default();
            let carry = SideCarry::plan(
                PairSide::Probe,
                reductions,
                gather.output.sources(),
                columns,
            );
            let values = carry
                .as_ref()
                .and_then(|carry| carry.values(columns, gather.chunk.num_rows()));
            if let (Some(carry), Some(values)) = (carry, values) {
                let partitioned = partition_probe_carrying(
                    device,
                    stream,
                    host_keys,
                    &values,
                    build.plan(),
                    timer,
                )?;
                return Ok(partitioned.map(|keys| KeysOnDevice {
                    keys,
                    carry: Some(carry),
                }));
            }
        }
        let partitioned = partition_probe(device, stream, host_keys, build.plan(), timer)?;
        Ok(partitioned.map(|keys| KeysOnDevice { keys, carry: None }))
    };
    // While the build side goes to the device (made by another partition,
    // or, where nobody makes it yet, by a thread of this one), this chunk's
    // keys (and an aggregation's columns) cross the bus beside it and are
    // partitioned, where the memory they take leaves room for the table.
    let (resident, early) = std::thread::scope(|scope| {
        let table_maker = build.device_table_unstarted(device).then(|| {
            scope.spawn(|| {
                device.bind_to_thread()?;
                build.device_table(device, memory_fraction, metrics)
            })
        });
        let early = (table_maker.is_some() || build.device_table_in_progress())
            .then(|| {
                device.budget().try_reserve(
                    bytes,
                    build.device_table_bytes(device),
                    memory_fraction,
                )
            })
            .flatten();
        if early.is_some() {
            partitioned = Some(partition_keys(&mut probe_columns, true, &mut timer)?);
            let gather = gather.filter(|gather| gather.reductions.is_some());
            if let Some(gather) = gather.filter(|_| probe_columns.is_none()) {
                probe_columns = Some(ResidentColumns::upload(
                    device,
                    stream,
                    gather.chunk,
                    gather.probe_columns,
                    &mut timer,
                )?);
            }
            trace::event(|| format!("hash join p{partition}: keys partitioned before the table"));
        }
        let resident = match table_maker {
            Some(maker) => maker.join().map_err(|_| {
                GpuError::Invalid("the thread making the build table panicked".into())
            })??,
            None => build.device_table(device, memory_fraction, metrics)?,
        };
        GpuResult::Ok((resident, early))
    })?;
    trace::event(|| format!("hash join p{partition}: build table ready"));
    let table = &resident.table;
    let gather = gather.zip(resident.gather.as_ref());
    let _memory = match early {
        Some(memory) => memory,
        None => {
            let memory =
                device
                    .budget()
                    .reserve(bytes, memory_fraction, ReservationKind::Transient)?;
            metrics
                .device
                .device_memory_wait
                .add_duration(memory.waited());
            memory
        }
    };
    let partitioned = match partitioned {
        Some(partitioned) => partitioned,
        None => partition_keys(&mut probe_columns, true, &mut timer)?,
    };
    let Some(mut partitioned) = partitioned else {
        metrics.device.record(&timer.finish()?);
        return Ok(());
    };
    if let Some((gather, build_columns)) = gather.filter(|(gather, _)| gather.fold_while_probing) {
        let folded = fold_while_probing(
            device,
            stream,
            (&resident, &partitioned),
            gather,
            (&build.rows, &build_columns.columns),
            &mut probe_columns,
            &mut timer,
        )?;
        if let Some(folded) = folded {
            trace::event(|| format!("hash join p{partition}: {} pairs folded", folded.pairs));
            if partitioned.carry.is_some() {
                metrics.probe_rows_carrying_values.add(probe_keys.len());
            }
            if partitioned.keys.one_word() {
                metrics.rows_in_one_word.add(probe_keys.len());
            }
            if folded.pairs > 0 {
                // A fold over no pair holds its identity, not a value.
                metrics.pairs_folded_while_probing.add(folded.pairs);
                on_output(Ok(ChunkOutput::Reduced(folded.words, folded.pairs)));
            }
            metrics.device.record(&timer.finish()?);
            return Ok(());
        }
    }
    // The folds could not run (a column not on the device, say one with
    // NULLs): the pairs are written out, by row ids, of both sides.
    let by_row_id = build.table_by_row_id(device, &resident, memory_fraction, metrics)?;
    if by_row_id.is_some() {
        trace::event(|| format!("hash join p{partition}: build table by row id"));
    }
    let table = by_row_id
        .as_ref()
        .map_or(table, |by_row_id| &by_row_id.table);
    if partitioned.carry.is_some() {
        trace::event(|| format!("hash join p{partition}: keys partitioned again, by row id"));
        drop(partitioned);
        match partition_keys(&mut probe_columns, false, &mut timer)? {
            Some(again) => partitioned = again,
            None => {
                metrics.device.record(&timer.finish()?);
                return Ok(());
            }
        }
    }
    let partitioned = &partitioned.keys;
    if partitioned.one_word() {
        metrics.rows_in_one_word.add(probe_keys.len());
    }
    // The chunk's own columns go to the device once its pairs are counted,
    // and only where that pays (see `probe_side_pays`).
    probe_partitioned(
        device,
        stream,
        table,
        partitioned,
        max_pairs,
        &mut timer,
        |pairs, timer| {
            let len = pairs.len;
            trace::event(|| format!("hash join p{partition}: {len} pairs found"));
            let on_device = gather.filter(|(gather, _)| !gather.ordered || pairs.whole_chunk);
            let Some((gather, build_columns)) = on_device else {
                let (build_ids, probe_ids) = pairs.download(device, stream, timer)?;
                on_output(Ok(ChunkOutput::Pairs(build_ids, probe_ids)));
                return Ok(());
            };
            let probe_columns = match &mut probe_columns {
                Some(columns) => columns,
                // An aggregation's columns always pay: without them the
                // range's rows are made and aggregated on the host.
                None => probe_columns.insert(
                    if gather.reductions.is_some()
                        || probe_side_pays(pairs.len, pairs.whole_chunk, gather.chunk.num_rows())
                    {
                        ResidentColumns::upload(
                            device,
                            stream,
                            gather.chunk,
                            gather.probe_columns,
                            timer,
                        )?
                    } else {
                        ResidentColumns::none()
                    },
                ),
            };
            let ordered = match gather.ordered {
                true => Some(order_by_probe_row(
                    device,
                    stream,
                    &pairs,
                    build_columns.positions.as_ref(),
                    (build.rows.num_rows() as u64, gather.chunk.num_rows() as u64),
                    timer,
                )?),
                false => None,
            };
            let (build_ids, probe_ids) = match &ordered {
                Some((build_ids, probe_ids)) => (build_ids, probe_ids),
                None => (pairs.build_ids, pairs.probe_ids),
            };
            let build_side = GatherSide {
                batch: &build.rows,
                resident: &build_columns.columns,
                ids: build_ids,
            };
            let probe_side = GatherSide {
                batch: gather.chunk,
                resident: probe_columns,
                ids: probe_ids,
            };
            if let Some(reductions) = gather.reductions {
                let reduced = reduce_pairs(
                    device,
                    stream,
                    reductions,
                    gather.output.sources(),
                    &build_side,
                    &probe_side,
                    pairs.len,
                    timer,
                )?;
                if let Some(words) = reduced {
                    trace::event(|| format!("hash join p{partition}: pairs reduced"));
                    on_output(Ok(ChunkOutput::Reduced(words, pairs.len)));
                    return Ok(());
                }
            }
            let gathered = gather_batches(
                device,
                stream,
                gather.output,
                &build_side,
                &probe_side,
                pairs.len,
                host_threads,
                timer,
            )?;
            on_output(gathered.map(|batches| ChunkOutput::Batches(batches, pairs.len)));
            Ok(())
        },
    )?;
    metrics.device.record(&timer.finish()?);
    Ok(())
}

/// A probe chunk's keys partitioned on the device, and the probe columns
/// they carry in place of row ids, if any.
struct KeysOnDevice {
    keys: PartitionedProbe,
    carry: Option<SideCarry>,
}

/// A chunk's aggregation folded over its pairs as the device finds them
/// (see [`fold_partitioned`]): each reduction's word and the pairs, or
/// `None` where its columns are not all on the device, there are more
/// than one launch folds, or a probe fold's column was not carried beside
/// the keys (the pairs are then written out and reduced). Uploads the
/// chunk's columns into `probe_columns` when not there yet.
fn fold_while_probing(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    (resident, partitioned): (&ResidentTable, &KeysOnDevice),
    gather: &ChunkGather<'_>,
    build: (&dyn RowSource, &ResidentColumns),
    probe_columns: &mut Option<ResidentColumns>,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<FoldedChunk>> {
    let Some(reductions) = gather.reductions else {
        return Ok(None);
    };
    let probe_columns = match probe_columns {
        Some(columns) => columns,
        // An aggregation's columns always go to the device.
        None => probe_columns.insert(ResidentColumns::upload(
            device,
            stream,
            gather.chunk,
            gather.probe_columns,
            timer,
        )?),
    };
    let carries: Vec<&SideCarry> = [resident.carry.as_ref(), partitioned.carry.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let Some(folds) = join_folds(
        reductions,
        gather.output.sources(),
        build,
        (gather.chunk, probe_columns),
        &carries,
    ) else {
        return Ok(None);
    };
    let device_folds: Vec<_> = folds.iter().flatten().copied().collect();
    let folded = fold_partitioned(
        device,
        stream,
        &resident.table,
        &partitioned.keys,
        &device_folds,
        timer,
    )?;
    Ok(Some(FoldedChunk {
        words: folded_words(&folds, &folded),
        pairs: folded.pairs as usize,
    }))
}

/// What [`fold_while_probing`] computed: a word per reduction over `pairs`
/// pairs.
struct FoldedChunk {
    words: Vec<u64>,
    pairs: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};

    #[test]
    fn a_batch_counts_the_bytes_of_its_own_rows() {
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
        let strings: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..1000).map(|i| format!("{i:08}")),
        ));
        let batch = RecordBatch::try_from_iter([("i", ints), ("s", strings)]).unwrap();
        // 8 bytes an integer; 8 bytes of text and a 4-byte offset a string.
        let whole = rows_bytes(&batch).unwrap();
        assert!(
            (8 * 1000 + 12 * 1000..=8 * 1000 + 12 * 1000 + 8).contains(&whole),
            "{whole}"
        );
        // A slice counts its rows only, not the buffers it shares.
        let slice = rows_bytes(&batch.slice(100, 10)).unwrap();
        assert!(
            (8 * 10 + 12 * 10..=8 * 10 + 12 * 10 + 8).contains(&slice),
            "{slice}"
        );
    }
}
