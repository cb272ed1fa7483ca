//! The build side of a GPU hash join: collected once on the host (per
//! partition, or once for all partitions in `CollectLeft` mode), then copied
//! and partitioned once per device that probes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::TryStreamExt;

use super::stream::evaluate_keys;
use crate::exec::keys::{KeyLayout, NormalizedKeys};
use crate::exec::GpuJoinMetrics;
use crate::gpu::{GpuDevice, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::hash_join::DeviceBuildTable;
use crate::ops::radix::RadixPlan;

/// All build rows and their packed keys, shared by the probing partitions.
#[derive(Debug)]
pub(crate) struct BuildSide {
    /// Every build row, in one batch so that row ids index it directly.
    pub(crate) batch: RecordBatch,
    pub(crate) keys: NormalizedKeys,
    plan: RadixPlan,
    device_tables: Mutex<HashMap<usize, Arc<ResidentTable>>>,
    _host_memory: MemoryReservation,
}

/// A build table on one device, with the device memory it holds.
#[derive(Debug)]
pub(crate) struct ResidentTable {
    pub(crate) table: DeviceBuildTable,
    _device_memory: crate::gpu::DeviceReservation,
}

impl BuildSide {
    /// Collects `input`, packs its keys and plans the partitioning for probe
    /// chunks of about `probe_chunk_rows` rows.
    pub(crate) async fn collect(
        input: SendableRecordBatchStream,
        schema: SchemaRef,
        on: Vec<PhysicalExprRef>,
        layout: KeyLayout,
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
        let _timer = metrics.baseline.elapsed_compute().timer();
        let batch = concat_batches(&schema, &batches)?;
        drop(batches);
        reservation.try_resize(batch.get_array_memory_size())?;
        metrics.build_rows.add(batch.num_rows());
        let keys = layout.normalize(&evaluate_keys(&on, &batch)?)?;
        reservation.try_grow(8 * (keys.keys.len() + keys.row_ids.as_ref().map_or(0, Vec::len)))?;
        let plan = RadixPlan::for_join(keys.keys.len() as u64, probe_chunk_rows as u64);
        Ok(Self {
            batch,
            keys,
            plan,
            device_tables: Mutex::new(HashMap::new()),
            _host_memory: reservation,
        })
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
        metrics.record_device(&timer.finish()?);
        drop(scratch_memory);
        let table = Arc::new(ResidentTable {
            table,
            _device_memory: device_memory,
        });
        tables.insert(device.ordinal(), Arc::clone(&table));
        Ok(table)
    }
}
