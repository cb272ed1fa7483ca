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

use crate::gpu::DeviceStream;
use datafusion::arrow::array::{AsArray, UInt64Array};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::build_side::{BuildSide, ResidentTable};
use super::probe_reader::{HeldAhead, ProbeReader};
use crate::exec::join::candidates::{confirm_pairs, key_comparator};
use crate::exec::join::matches::{emits_pairs, rows_emitted_alone, tracks_probe_matches};
use super::order::{sort_by_probe_row, with_unmatched_probe_rows};
use crate::exec::join::output::{OutputAssembler, OutputRows, SideRows};
use crate::exec::join::device_gather::{
    folded_words, gather_batches, join_folds, probe_side_pays, reduce_pairs, ColumnBytes,
    GatherSide, ResidentColumns, SideCarry,
};
use crate::config::{DeviceErrorPolicy, GpuOptions};
use crate::encode::keys::JoinKeys;
use crate::host::once::OnceFut;
use crate::exec::join::pair_aggregate::{PairAggregate, PairReduction, PartialStates};
use crate::host::release::release_in_background;
use crate::exec::join::device_rows::{DeviceRows, JoinedRows, RowsShape};
use crate::exec::join::row_source::{ArrivedBatches, RowSource};
use crate::exec::GpuJoinMetrics;
use crate::gpu::launch::PairSide;
use crate::gpu::{GpuDevice, GpuError, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::hash_join::{
    fold_partitioned, order_by_probe_row, order_device_bytes, partition_probe,
    partition_probe_carrying, probe_device_bytes, probe_partitioned, HostKeys, PartitionedProbe,
};
use crate::trace;

#[path = "device_pairs.rs"]
mod device_pairs;
use device_pairs::*;
#[path = "chunk_join.rs"]
mod chunk_join;
use chunk_join::join_chunk;

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

/// String and binary value bytes (32-bit offsets) a probe chunk's batches
/// stay within, but for a chunk of one batch: its key columns are made
/// contiguous, and such a column's offsets hold less than 2 GiB, so keys
/// longer than that in all (a key of computed strings aside) come in
/// several chunks.
pub(crate) const MAX_PROBE_CHUNK_BYTES: usize = 1 << 30;

/// Probe rows joined in one device launch sequence: the probe batches the
/// chunk is made of, as they arrived, or rows the GPU join below handed on
/// on the device.
enum ProbeChunk {
    Host(ArrivedBatches),
    Device(DeviceRows),
}

/// A join's probe input: host batches, and rows on the device where the
/// GPU join below hands them on so (see [`crate::exec::join::device_rows`]).
pub(crate) type ProbeInput = BoxStream<'static, Result<JoinedRows>>;

impl HeldAhead for JoinedRows {
    fn bytes_held(&self) -> Option<usize> {
        match self {
            Self::Host(batch) => {
                Some(rows_bytes(batch).unwrap_or_else(|_| batch.get_array_memory_size()))
            }
            Self::Device(_) => None,
        }
    }

    fn rows(&self) -> usize {
        match self {
            Self::Host(batch) => batch.num_rows(),
            Self::Device(rows) => rows.num_rows(),
        }
    }
}

/// A record batch stream as a probe input of host batches.
pub(crate) fn host_probe_input(input: SendableRecordBatchStream) -> ProbeInput {
    Box::pin(input.map_ok(JoinedRows::Host))
}

/// Everything one partition's probe loop needs.
pub(crate) struct ProbeSpec {
    /// The DataFusion partition this loop reads.
    pub(crate) partition: usize,
    pub(crate) build: OnceFut<BuildSide>,
    /// The probe input, read ahead while the build side is collected
    /// where that is asked for (see [`super::probe_reader`]).
    pub(crate) probe: ProbeReader<JoinedRows>,
    pub(crate) probe_schema: SchemaRef,
    pub(crate) probe_on: Vec<PhysicalExprRef>,
    pub(crate) semantics: JoinSemantics,
    pub(crate) output: OutputAssembler,
    /// The partial aggregation computed from the pairs in place of the
    /// output rows (see [`crate::exec::join::pair_aggregate`]).
    pub(crate) aggregate: Option<Arc<PairAggregate>>,
    /// Per probe column, whether the output uses it, where output columns
    /// are gathered on the device (an inner join without a filter).
    pub(crate) gather_probe_columns: Option<Vec<bool>>,
    pub(crate) device: Arc<GpuDevice>,
    /// The session's `gpu.*` options as the node was executed.
    pub(crate) options: Arc<GpuOptions>,
    /// What a device error does (the chunk is joined on the host, but in
    /// tests).
    pub(crate) device_errors: DeviceErrorPolicy,
    /// String and binary value bytes a probe chunk's batches stay within
    /// (but for a chunk of one batch): [`MAX_PROBE_CHUNK_BYTES`], or fewer
    /// in tests.
    pub(crate) max_chunk_bytes: usize,
    /// Threads a chunk's host work uses: 1 where many partitions' chunks
    /// run at once, every core where this partition reads the whole probe
    /// side.
    pub(crate) host_threads: usize,
    pub(crate) metrics: GpuJoinMetrics,
    /// Keep output rows on the device for the GPU join above, which reads
    /// them there (rows of this schema); `None` for host batches only.
    pub(crate) device_output: Option<SchemaRef>,
}

/// Where one partition's probe stands.
enum ProbeState {
    /// Waiting for the build side, which the partitions share.
    WaitingForBuild,
    /// Reading probe chunks, each joined in a task of its own while the
    /// next one is read.
    Probing(Arc<BuildSide>),
    /// The probe side is read: the last chunk's join finishes, then come
    /// the build rows emitted alone and the partial aggregation's states.
    Draining(Arc<BuildSide>),
    /// Everything is out.
    Done,
}

struct ProbeLoop {
    spec: ProbeSpec,
    /// The partition's partial aggregation states, with `spec.aggregate`.
    partial: Option<Arc<Mutex<PartialStates>>>,
    state: ProbeState,
    /// Rows still to emit (the pushed-down fetch).
    rows_left: usize,
    ready: VecDeque<JoinedRows>,
    /// The chunk being joined (in a task of its own) while the next one is
    /// read: its output goes before the next chunk's.
    joining: Option<SpawnedTask<Result<Vec<JoinedRows>>>>,
    /// The build table being made on this partition's device while the
    /// first probe chunk is read (see [`ProbeLoop::make_table_in_advance`]).
    table_in_advance: Option<SpawnedTask<()>>,
    /// A batch read that would have taken its chunk past
    /// `ProbeSpec::max_chunk_bytes`, or rows on the device read after
    /// host batches: the next chunk's first.
    pending: Option<JoinedRows>,
}

/// The output stream of one partition, for a consumer that reads host
/// batches (`spec.device_output` is `None`).
pub(crate) fn probe_stream(
    spec: ProbeSpec,
    schema: SchemaRef,
) -> Result<SendableRecordBatchStream> {
    let rows = probe_rows_stream(spec)?;
    let batches = rows.map(|rows| match rows? {
        JoinedRows::Host(batch) => Ok(batch),
        JoinedRows::Device(_) => Err(DataFusionError::Internal(
            "rows kept on the device reached a consumer of host batches".into(),
        )),
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}

/// The output of one partition as host batches and, where
/// `spec.device_output` asks for them, rows kept on the device.
pub(crate) fn probe_rows_stream(spec: ProbeSpec) -> Result<ProbeInput> {
    let partial = match &spec.aggregate {
        Some(aggregate) => Some(Arc::new(Mutex::new(aggregate.start()?))),
        None => None,
    };
    let state = ProbeLoop {
        partial,
        rows_left: spec.semantics.fetch.unwrap_or(usize::MAX),
        spec,
        state: ProbeState::WaitingForBuild,
        ready: VecDeque::new(),
        joining: None,
        table_in_advance: None,
        pending: None,
    };
    let stream = futures::stream::try_unfold(state, |mut state| async move {
        loop {
            if state.rows_left == 0 {
                state.spec.metrics.baseline.done();
                return Ok(None);
            }
            match state.ready.pop_front() {
                Some(JoinedRows::Host(batch)) => {
                    let batch = if batch.num_rows() > state.rows_left {
                        batch.slice(0, state.rows_left)
                    } else {
                        batch
                    };
                    state.rows_left -= batch.num_rows();
                    // Rows, batches and bytes, as DataFusion's own operators record them.
                    let batch = batch.record_output(&state.spec.metrics.baseline);
                    return Ok(Some((JoinedRows::Host(batch), state)));
                }
                Some(JoinedRows::Device(rows)) => {
                    // Kept on the device only without a fetch (see
                    // `GpuHashJoinExec::hands_on_device_rows`).
                    state.rows_left = state.rows_left.saturating_sub(rows.num_rows());
                    let metrics = &state.spec.metrics;
                    metrics.baseline.record_output(rows.num_rows());
                    metrics.output_rows_kept_on_device.add(rows.num_rows());
                    return Ok(Some((JoinedRows::Device(rows), state)));
                }
                None => {}
            }
            state.state = match std::mem::replace(&mut state.state, ProbeState::Done) {
                ProbeState::WaitingForBuild => {
                    let spec = &mut state.spec;
                    let build = spec.probe.read_ahead_until(spec.build.get()).await?;
                    if spec.probe.reads_ahead() {
                        let (partition, rows) =
                            (spec.partition, spec.metrics.probe_rows_read_ahead.value());
                        trace::event(|| {
                            format!("hash join p{partition}: build side in, {rows} probe rows read ahead")
                        });
                    }
                    state.make_table_in_advance(&build);
                    ProbeState::Probing(build)
                }
                ProbeState::Probing(build) => state.probe(build).await?,
                ProbeState::Draining(build) => state.drain(build).await?,
                ProbeState::Done => {
                    state.spec.metrics.baseline.done();
                    let partition = state.spec.partition;
                    trace::event(|| format!("hash join p{partition}: finished"));
                    return Ok(None);
                }
            };
        }
    });
    Ok(Box::pin(stream))
}

/// The output of a chunk's join task.
async fn joined(task: SpawnedTask<Result<Vec<JoinedRows>>>) -> Result<Vec<JoinedRows>> {
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
    options: Arc<GpuOptions>,
    device_errors: DeviceErrorPolicy,
    host_threads: usize,
    partition: usize,
    metrics: GpuJoinMetrics,
    device_output: Option<SchemaRef>,
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

/// The bytes of `batch`'s string and binary values with 32-bit offsets
/// (`Utf8`, `Binary`), as its rows take them: what a column of them made
/// contiguous must hold below 2 GiB.
fn offset_value_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| {
            let offsets = match column.data_type() {
                DataType::Utf8 => column.as_string::<i32>().value_offsets(),
                DataType::Binary => column.as_binary::<i32>().value_offsets(),
                _ => return 0,
            };
            match (offsets.first(), offsets.last()) {
                (Some(&first), Some(&last)) => (last - first).max(0) as usize,
                _ => 0,
            }
        })
        .sum()
}

fn lock(partial: &Mutex<PartialStates>) -> std::sync::MutexGuard<'_, PartialStates> {
    partial.lock().unwrap_or_else(|p| p.into_inner())
}

impl ProbeLoop {
    /// Reads the next chunk and starts its join while the previous chunk's
    /// may still run (whose output then goes first); the next state.
    async fn probe(&mut self, build: Arc<BuildSide>) -> Result<ProbeState> {
        let (chunk, exhausted) = self.read_chunk(&build).await?;
        if let Some(chunk) = chunk {
            let task = SpawnedTask::spawn(join_chunk(self.chunk_context(), Arc::clone(&build), chunk));
            if let Some(previous) = self.joining.replace(task) {
                self.ready.extend(joined(previous).await?);
            }
        }
        Ok(match exhausted {
            true => ProbeState::Draining(build),
            false => ProbeState::Probing(build),
        })
    }

    /// Once the probe side is read: the last chunk's output, then the build
    /// rows emitted alone and the partial aggregation's states.
    async fn drain(&mut self, build: Arc<BuildSide>) -> Result<ProbeState> {
        if let Some(joining) = self.joining.take() {
            self.ready.extend(joined(joining).await?);
            return Ok(ProbeState::Draining(build));
        }
        let output = self.final_rows(&build)?;
        self.ready.extend(output.into_iter().map(JoinedRows::Host));
        if let Some(partial) = &self.partial {
            let states = lock(partial).finish()?;
            self.ready.push_back(JoinedRows::Host(states));
        }
        Ok(ProbeState::Done)
    }

    /// Up to the build side's `probe_chunk_rows` probe rows (and, for the
    /// automatic size, about `probe_chunk_bytes` bytes) as one chunk, and
    /// whether the probe side has ended. A chunk never takes a batch that
    /// would carry its string and binary values past `max_chunk_bytes`
    /// (its key columns are made contiguous, and 32-bit offsets hold less
    /// than 2 GiB): that batch begins the next chunk.
    async fn read_chunk(&mut self, build: &BuildSide) -> Result<(Option<ProbeChunk>, bool)> {
        let (chunk_rows, chunk_bytes) = (build.probe_chunk_rows.max(1), build.probe_chunk_bytes);
        let max_value_bytes = self.spec.max_chunk_bytes;
        let mut exhausted = false;
        let mut batches = Vec::new();
        let mut rows = 0;
        let mut bytes = 0;
        let mut value_bytes = 0;
        while rows < chunk_rows && bytes < chunk_bytes {
            let next = match self.pending.take() {
                Some(batch) => Some(Ok(batch)),
                None => self.spec.probe.next().await,
            };
            match next {
                Some(next) => {
                    let batch = match next? {
                        JoinedRows::Host(batch) => batch,
                        JoinedRows::Device(rows) if batches.is_empty() => {
                            let partition = self.spec.partition;
                            let count = rows.num_rows();
                            self.spec.metrics.probe_rows.add(count);
                            trace::event(|| {
                                format!("hash join p{partition}: {count} rows read on the device")
                            });
                            return Ok((Some(ProbeChunk::Device(rows)), false));
                        }
                        device => {
                            // A chunk of its own, after the host batches.
                            self.pending = Some(device);
                            break;
                        }
                    };
                    let batch_values = offset_value_bytes(&batch);
                    if !batches.is_empty() && value_bytes + batch_values > max_value_bytes {
                        self.pending = Some(JoinedRows::Host(batch));
                        break;
                    }
                    value_bytes += batch_values;
                    rows += batch.num_rows();
                    if chunk_bytes != usize::MAX {
                        bytes += rows_bytes(&batch)?;
                    }
                    if batch.num_rows() > 0 {
                        batches.push(batch);
                    }
                }
                None => {
                    exhausted = true;
                    break;
                }
            }
        }
        if batches.is_empty() {
            return Ok((None, exhausted));
        }
        self.spec.metrics.probe_rows.add(rows);
        let partition = self.spec.partition;
        trace::event(|| format!("hash join p{partition}: chunk of {rows} rows read"));
        // Not concatenated: only the keys are made contiguous (see
        // `crate::exec::join::row_source`).
        let chunk = ProbeChunk::Host(ArrivedBatches::new(
            Arc::clone(&self.spec.probe_schema),
            batches,
        ));
        Ok((Some(chunk), exhausted))
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
            // Keys held as raw pieces, or packed in place, have no NULL
            // (and no key columns).
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
    /// coded: the table starts once the build side is prepared, not after
    /// the first probe chunk is read. The first chunk's device part then
    /// finds the table in progress and sends its own keys meanwhile. A
    /// failure here is not reported: the chunk makes the table itself, and
    /// falls back to the host or fails as it would have. The task holds one
    /// of the device's admissions while it works, as a chunk making the
    /// table would.
    fn make_table_in_advance(&mut self, build: &Arc<BuildSide>) {
        let device = &self.spec.device;
        if build.keys.is_empty() || !build.device_table_unstarted(device) {
            return;
        }
        let (build, device) = (Arc::clone(build), Arc::clone(device));
        let (memory_fraction, max_concurrent_tasks) =
            (self.spec.options.memory_fraction, self.spec.options.max_concurrent_tasks);
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
            options: Arc::clone(&spec.options),
            device_errors: spec.device_errors,
            host_threads: spec.host_threads,
            partition: spec.partition,
            metrics: spec.metrics.clone(),
            device_output: spec.device_output.clone(),
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
