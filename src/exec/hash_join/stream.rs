//! The probe side of a GPU hash join, one DataFusion partition: wait for the
//! build side, then read probe batches into chunks, join each chunk on the
//! device in a blocking task, and emit the output batches.

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use super::build_side::BuildSide;
use super::output::OutputAssembler;
use crate::exec::keys::KeyLayout;
use crate::exec::once::OnceFut;
use crate::exec::GpuJoinMetrics;
use crate::gpu::{GpuDevice, PhaseTimer, ReservationKind};
use crate::ops::hash_join::{probe, probe_device_bytes};

/// Evaluates the key expressions of one side on `batch`.
pub(crate) fn evaluate_keys(on: &[PhysicalExprRef], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    on.iter()
        .map(|expr| expr.evaluate(batch)?.into_array(batch.num_rows()))
        .collect()
}

/// Everything one partition's probe loop needs.
pub(crate) struct ProbeSpec {
    pub(crate) build: OnceFut<BuildSide>,
    pub(crate) probe_input: SendableRecordBatchStream,
    pub(crate) probe_schema: SchemaRef,
    pub(crate) probe_on: Vec<PhysicalExprRef>,
    pub(crate) layout: KeyLayout,
    pub(crate) output: OutputAssembler,
    pub(crate) device: Arc<GpuDevice>,
    pub(crate) probe_chunk_rows: usize,
    pub(crate) max_output_pairs: usize,
    pub(crate) memory_fraction: f64,
    pub(crate) metrics: GpuJoinMetrics,
}

struct ProbeLoop {
    spec: ProbeSpec,
    build: Option<Arc<BuildSide>>,
    probe_exhausted: bool,
    ready: VecDeque<RecordBatch>,
}

/// The output stream of one partition.
pub(crate) fn probe_stream(spec: ProbeSpec, schema: SchemaRef) -> SendableRecordBatchStream {
    let state = ProbeLoop {
        spec,
        build: None,
        probe_exhausted: false,
        ready: VecDeque::new(),
    };
    let stream = futures::stream::try_unfold(state, |mut state| async move {
        loop {
            if let Some(batch) = state.ready.pop_front() {
                // Rows, batches and bytes, as DataFusion's own operators record them.
                let batch = batch.record_output(&state.spec.metrics.baseline);
                return Ok(Some((batch, state)));
            }
            if state.probe_exhausted {
                state.spec.metrics.baseline.done();
                return Ok(None);
            }
            let build = match &state.build {
                Some(build) => Arc::clone(build),
                None => {
                    let build = state.spec.build.get().await?;
                    state.build = Some(Arc::clone(&build));
                    build
                }
            };
            let chunk = state.read_chunk().await?;
            match chunk {
                None => state.probe_exhausted = true,
                Some(chunk) => {
                    let output = state.join_chunk(build, chunk).await?;
                    state.ready.extend(output);
                }
            }
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

impl ProbeLoop {
    /// Up to `probe_chunk_rows` probe rows as one batch; `None` at the end.
    async fn read_chunk(&mut self) -> Result<Option<RecordBatch>> {
        let mut batches = Vec::new();
        let mut rows = 0;
        while rows < self.spec.probe_chunk_rows {
            match self.spec.probe_input.next().await {
                Some(batch) => {
                    let batch = batch?;
                    rows += batch.num_rows();
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
        let _timer = self.spec.metrics.baseline.elapsed_compute().timer();
        Ok(Some(concat_batches(&self.spec.probe_schema, &batches)?))
    }

    /// Joins one probe chunk on the device, off the async runtime.
    async fn join_chunk(
        &mut self,
        build: Arc<BuildSide>,
        chunk: RecordBatch,
    ) -> Result<Vec<RecordBatch>> {
        let probe_keys = {
            let _timer = self.spec.metrics.baseline.elapsed_compute().timer();
            self.spec
                .layout
                .normalize(&evaluate_keys(&self.spec.probe_on, &chunk)?)?
        };
        let device = Arc::clone(&self.spec.device);
        let output = self.spec.output.clone();
        let metrics = self.spec.metrics.clone();
        let memory_fraction = self.spec.memory_fraction;
        let max_pairs = self.spec.max_output_pairs.max(1);
        let task = SpawnedTask::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
            let _timer = metrics.baseline.elapsed_compute().timer();
            device.bind_to_thread()?;
            let resident = build.device_table(&device, memory_fraction, &metrics)?;
            let table = &resident.table;
            let bytes = probe_device_bytes(
                probe_keys.keys.len(),
                table.plan(),
                max_pairs,
                device.sm_count(),
            );
            let memory =
                device
                    .budget()
                    .reserve(bytes, memory_fraction, ReservationKind::Transient)?;
            metrics.device_memory_wait.add_duration(memory.waited());
            let stream = device.stream()?;
            let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
            let mut batches = Vec::new();
            let mut assembly_error = None;
            probe(
                &device,
                stream.stream(),
                table,
                &probe_keys.keys,
                probe_keys.row_ids.as_deref(),
                max_pairs,
                &mut timer,
                |build_ids, probe_ids| {
                    // After a failed assembly the rest of the chunk is not worth building.
                    if assembly_error.is_none() {
                        match output.assemble(&build.batch, &chunk, build_ids, probe_ids) {
                            Ok(out) => batches.extend(out),
                            Err(e) => assembly_error = Some(e),
                        }
                    }
                    Ok(())
                },
            )?;
            metrics.record_device(&timer.finish()?);
            metrics.probe_chunks.add(1);
            match assembly_error {
                Some(e) => Err(e),
                None => Ok(batches),
            }
        });
        task.join()
            .await
            .map_err(|e| DataFusionError::Execution(format!("GPU join task failed: {e}")))?
    }
}
