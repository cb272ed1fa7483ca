//! The build side of a GPU hash join: collected once on the host (per
//! partition, or once for all partitions in `CollectLeft` mode), then copied
//! and partitioned once per device that probes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::{concat, concat_batches};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::TryStreamExt;

use super::host_fallback::HostBuildTable;
use super::matches::{tracks_build_matches, VisitedRows};
use super::order::ArrivalOrder;
use super::stream::evaluate_keys;
use crate::exec::keys::{KeyEncoder, KeySpec, NormalizedKeys};
use crate::exec::GpuJoinMetrics;
use crate::gpu::{GpuDevice, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::hash_join::DeviceBuildTable;
use crate::ops::radix::RadixPlan;

/// All build rows and their encoded keys, shared by the probing partitions,
/// with what those partitions learn together: which build rows matched,
/// how many partitions are still probing, and (for the null-aware anti
/// join) what the probe side held.
#[derive(Debug)]
pub(crate) struct BuildSide {
    /// Every build row, in one batch so that row ids index it directly.
    pub(crate) batch: RecordBatch,
    /// The arrival position of each row of `batch`.
    pub(crate) arrival: ArrivalOrder,
    /// The key columns evaluated on `batch`.
    pub(crate) key_columns: Vec<ArrayRef>,
    pub(crate) encoder: KeyEncoder,
    pub(crate) keys: NormalizedKeys,
    /// Matched build rows, for join types that emit build rows at the end.
    pub(crate) visited: Option<VisitedRows>,
    probes_running: AtomicUsize,
    /// Null-aware anti join: some probe key was NULL / some probe row came.
    pub(crate) probe_saw_null: AtomicBool,
    pub(crate) probe_saw_rows: AtomicBool,
    plan: RadixPlan,
    /// Built on the first chunk the device cannot take.
    host_table: OnceLock<HostBuildTable>,
    device_tables: Mutex<HashMap<usize, Arc<ResidentTable>>>,
    _host_memory: MemoryReservation,
}

/// A build table on one device, with the device memory it holds.
#[derive(Debug)]
pub(crate) struct ResidentTable {
    pub(crate) table: DeviceBuildTable,
    _device_memory: crate::gpu::DeviceReservation,
}

/// The collected build rows in one batch, with their encoded keys.
struct PreparedBuild {
    arrival: ArrivalOrder,
    batch: RecordBatch,
    key_columns: Vec<ArrayRef>,
    encoder: KeyEncoder,
    keys: NormalizedKeys,
}

impl PreparedBuild {
    /// Concatenates `batches` and encodes their keys, both spread over the
    /// host's cores: this runs once, before any probe partition can start.
    fn new(
        batches: &[RecordBatch],
        schema: &SchemaRef,
        on: &[PhysicalExprRef],
        spec: &KeySpec,
    ) -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        // In reverse arrival order, as `HashJoinExec` concatenates its build
        // side: build row ids then order rows the way it does.
        let arrival = ArrivalOrder::new(&batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>());
        let batch = concat_in_parallel(schema, batches.iter().rev(), threads)?;
        let key_columns = evaluate_keys(on, &batch)?;
        let encoder = KeyEncoder::for_build_side(spec, &key_columns)?;
        let keys = encoder.encode_parallel(&key_columns, threads)?;
        Ok(Self {
            arrival,
            batch,
            key_columns,
            encoder,
            keys,
        })
    }
}

/// `concat_batches`, one column per thread (up to `threads` at a time).
fn concat_in_parallel<'a>(
    schema: &SchemaRef,
    batches: impl Iterator<Item = &'a RecordBatch>,
    threads: usize,
) -> Result<RecordBatch> {
    let batches: Vec<&RecordBatch> = batches.collect();
    let columns = schema.fields().len();
    if columns <= 1 || threads <= 1 || batches.len() <= 1 {
        return Ok(concat_batches(schema, batches)?);
    }
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let concatenated: Vec<Result<ArrayRef>> = std::thread::scope(|scope| {
        let mut results = Vec::with_capacity(columns);
        for first in (0..columns).step_by(threads) {
            let handles: Vec<_> = (first..(first + threads).min(columns))
                .map(|c| {
                    let batches = &batches;
                    scope.spawn(move || {
                        let arrays: Vec<&dyn Array> =
                            batches.iter().map(|b| b.column(c).as_ref()).collect();
                        Ok(concat(&arrays)?)
                    })
                })
                .collect();
            results.extend(handles.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(DataFusionError::Internal(
                        "build concatenation thread panicked".into(),
                    ))
                })
            }));
        }
        results
    });
    let columns = concatenated.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

impl BuildSide {
    /// Collects `input`, encodes its keys and plans the partitioning for
    /// probe chunks of about `probe_chunk_rows` rows; `probe_partitions`
    /// partitions will probe it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn collect(
        input: SendableRecordBatchStream,
        schema: SchemaRef,
        on: Vec<PhysicalExprRef>,
        spec: KeySpec,
        join_type: JoinType,
        probe_partitions: usize,
        probe_chunk_rows: usize,
        reservation: MemoryReservation,
        metrics: GpuJoinMetrics,
    ) -> Result<Self> {
        let batches: Vec<RecordBatch> = input
            .and_then(|batch| {
                let grown = reservation.try_grow(batch.get_array_memory_size());
                futures::future::ready(grown.map(|_| batch))
            })
            .try_collect()
            .await?;
        let prepared = {
            let metrics = metrics.clone();
            SpawnedTask::spawn_blocking(move || -> Result<PreparedBuild> {
                let _timer = metrics.baseline.elapsed_compute().timer();
                PreparedBuild::new(&batches, &schema, &on, &spec)
            })
            .join()
            .await
            .map_err(|e| DataFusionError::Execution(format!("GPU join build task failed: {e}")))??
        };
        let PreparedBuild {
            arrival,
            batch,
            key_columns,
            encoder,
            keys,
        } = prepared;
        reservation.try_resize(batch.get_array_memory_size())?;
        metrics.build_rows.add(batch.num_rows());
        reservation.try_grow(8 * (keys.keys.len() + keys.row_ids.as_ref().map_or(0, Vec::len)))?;
        let plan = RadixPlan::for_join(keys.keys.len() as u64, probe_chunk_rows as u64);
        let visited = tracks_build_matches(join_type).then(|| VisitedRows::new(batch.num_rows()));
        Ok(Self {
            batch,
            arrival,
            key_columns,
            encoder,
            keys,
            visited,
            probes_running: AtomicUsize::new(probe_partitions.max(1)),
            probe_saw_null: AtomicBool::new(false),
            probe_saw_rows: AtomicBool::new(false),
            plan,
            host_table: OnceLock::new(),
            device_tables: Mutex::new(HashMap::new()),
            _host_memory: reservation,
        })
    }

    /// The build keys for joining on the host (see [`HostBuildTable`]).
    pub(crate) fn host_table(&self) -> &HostBuildTable {
        self.host_table
            .get_or_init(|| HostBuildTable::new(&self.keys))
    }

    /// Records that one probe partition has finished; true for the last.
    pub(crate) fn probe_finished(&self) -> bool {
        // AcqRel: the last partition sees every other partition's marks.
        self.probes_running.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The build table on `device`, copied and partitioned on first use.
    /// Blocking: call from a blocking task.
    pub(crate) fn device_table(
        &self,
        device: &Arc<GpuDevice>,
        memory_fraction: f64,
        metrics: &GpuJoinMetrics,
    ) -> GpuResult<Arc<ResidentTable>> {
        // Held while building, so a second partition on the same device
        // waits for the first one's table instead of building its own.
        let mut tables = self.device_tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(table) = tables.get(&device.ordinal()) {
            return Ok(Arc::clone(table));
        }
        let rows = self.keys.keys.len();
        let resident = DeviceBuildTable::resident_bytes(rows, &self.plan);
        let scratch = self.plan.device_bytes(rows, device.sm_count());
        // Partitioning needs its scratch buffers only briefly; the table
        // itself stays resident while the join runs.
        let scratch_memory =
            device
                .budget()
                .reserve(scratch, memory_fraction, ReservationKind::Transient)?;
        let device_memory =
            device
                .budget()
                .reserve(resident, memory_fraction, ReservationKind::Resident)?;
        metrics
            .device
            .device_memory_wait
            .add_duration(scratch_memory.waited() + device_memory.waited());
        let stream = device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        let table = DeviceBuildTable::build(
            device,
            stream.stream(),
            &self.keys.keys,
            self.keys.row_ids.as_deref(),
            self.plan.clone(),
            &mut timer,
        )?;
        metrics.device.record(&timer.finish()?);
        drop(scratch_memory);
        let table = Arc::new(ResidentTable {
            table,
            _device_memory: device_memory,
        });
        tables.insert(device.ordinal(), Arc::clone(&table));
        Ok(table)
    }
}
