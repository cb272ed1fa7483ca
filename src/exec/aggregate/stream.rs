//! One partition of a GPU aggregation: collect the input, group and reduce
//! it on the device in a blocking task, finish each aggregate with
//! DataFusion's own accumulator over the per-group state, emit the groups.
//! When the device cannot take the work (too little device memory, keys
//! too wide to pack into 64 bits), DataFusion's CPU operator aggregates the
//! collected input instead, and a metric says so.

use std::sync::Arc;

use datafusion::arrow::array::{new_empty_array, Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};

use super::reductions::DeviceWork;
use super::spec::{AggregateSpec, ValueKind};
use super::words::piece_words;
use crate::exec::keys::{KeyEncoder, KeySpec};
use crate::exec::parallel::on_threads;
use crate::exec::GpuAggregateMetrics;
use crate::gpu::{GpuDevice, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::group_by::{group_by, group_by_device_bytes, Grouped, Words};

/// The expressions one partition evaluates over its input.
pub(crate) struct AggregateInputs {
    /// Group key expressions.
    pub(crate) group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    /// Per aggregate, the expressions of its input columns.
    pub(crate) aggregate_args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    /// Per aggregate, its FILTER.
    pub(crate) filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

/// Everything one partition needs.
pub(crate) struct AggregateTask {
    pub(crate) spec: AggregateSpec,
    pub(crate) inputs: AggregateInputs,
    /// Output final values (Final, Single modes) rather than partial states.
    pub(crate) final_output: bool,
    pub(crate) input: SendableRecordBatchStream,
    pub(crate) input_schema: SchemaRef,
    pub(crate) output_schema: SchemaRef,
    /// The replaced `AggregateExec`, run over the collected input when the
    /// device cannot take it.
    pub(crate) cpu_aggregate: Arc<dyn ExecutionPlan>,
    pub(crate) context: Arc<TaskContext>,
    pub(crate) reservation: MemoryReservation,
    pub(crate) device: Arc<GpuDevice>,
    pub(crate) memory_fraction: f64,
    pub(crate) max_concurrent_tasks: usize,
    pub(crate) batch_size: usize,
    pub(crate) metrics: GpuAggregateMetrics,
}

/// The output stream of one partition.
pub(crate) fn aggregate_stream(task: AggregateTask) -> SendableRecordBatchStream {
    let schema = Arc::clone(&task.output_schema);
    let stream = futures::stream::once(run(task)).try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// What the blocking part produced.
enum Outcome {
    Batches(Vec<RecordBatch>),
    /// The device cannot take this input (keys too wide to pack, or too
    /// little device memory): DataFusion's CPU operator aggregates it.
    OnCpu,
}

async fn run(mut task: AggregateTask) -> Result<SendableRecordBatchStream> {
    let mut batches = Vec::new();
    while let Some(batch) = task.input.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        task.reservation.try_grow(batch.get_array_memory_size())?;
        task.metrics.input_rows.add(batch.num_rows());
        batches.push(batch);
    }
    let batches = Arc::new(batches);
    let device_task = Arc::new(DevicePart {
        spec: task.spec.clone(),
        final_output: task.final_output,
        output_schema: Arc::clone(&task.output_schema),
        device: Arc::clone(&task.device),
        memory_fraction: task.memory_fraction,
        max_concurrent_tasks: task.max_concurrent_tasks,
        batch_size: task.batch_size,
        metrics: task.metrics.clone(),
    });
    let inputs = Arc::new(task.inputs);
    let outcome = {
        let batches = Arc::clone(&batches);
        let inputs = Arc::clone(&inputs);
        SpawnedTask::spawn_blocking(move || device_task.aggregate(&batches, &inputs))
            .join()
            .await
            .map_err(|e| {
                DataFusionError::Execution(format!("GPU aggregation task failed: {e}"))
            })??
    };
    match outcome {
        Outcome::Batches(output) => {
            drop(batches);
            task.reservation.free();
            let output: Vec<Result<RecordBatch>> = output
                .into_iter()
                .map(|batch| Ok(batch.record_output(&task.metrics.baseline)))
                .collect();
            task.metrics.baseline.done();
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                task.output_schema,
                futures::stream::iter(output),
            )))
        }
        Outcome::OnCpu => {
            task.metrics.cpu_fallback_partitions.add(1);
            let batches = Arc::try_unwrap(batches).unwrap_or_else(|shared| (*shared).clone());
            let source = MemorySourceConfig::try_new_exec(&[batches], task.input_schema, None)?;
            #[allow(deprecated)]
            let plan = Arc::clone(&task.cpu_aggregate).with_new_children(vec![source])?;
            let stream = plan.execute(0, Arc::clone(&task.context))?;
            // The collected input stays reserved until the CPU operator's
            // stream, which reads it, is dropped.
            let reservation = task.reservation;
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                task.output_schema,
                stream.inspect(move |_| {
                    let _ = &reservation;
                }),
            )))
        }
    }
}

/// The blocking part of one partition.
struct DevicePart {
    spec: AggregateSpec,
    final_output: bool,
    output_schema: SchemaRef,
    device: Arc<GpuDevice>,
    memory_fraction: f64,
    max_concurrent_tasks: usize,
    batch_size: usize,
    metrics: GpuAggregateMetrics,
}

/// `exprs` evaluated over every batch: per expression, one array per batch
/// (the pieces are never concatenated; see [`Words`]).
fn evaluate_pieces(
    exprs: &[Arc<dyn PhysicalExpr>],
    batches: &[RecordBatch],
) -> Result<Vec<Vec<ArrayRef>>> {
    exprs
        .iter()
        .map(|expr| {
            batches
                .iter()
                .map(|batch| expr.evaluate(batch)?.into_array(batch.num_rows()))
                .collect()
        })
        .collect()
}

/// The group keys of every batch as one word per row: a single integer
/// column without NULLs is its own word (any injective word will do for
/// grouping); anything else is packed as join keys are, the batches spread
/// over the cores. `None` when the packed ranges need more than 64 bits.
fn encode_keys(
    key_spec: &KeySpec,
    key_columns: &[Vec<ArrayRef>],
    batches: usize,
) -> Result<Option<Words>> {
    if let [column] = key_columns {
        let kind = ValueKind::of(&key_spec.types()[0])
            .filter(|k| matches!(k, ValueKind::Signed | ValueKind::Unsigned));
        if let Some(kind) = kind {
            if column.iter().all(|piece| piece.logical_null_count() == 0) {
                let mut words = Words::default();
                for piece in column {
                    words.push(piece_words(piece.as_ref(), kind)?);
                }
                return Ok(Some(words));
            }
        }
    }
    // Per batch, its key columns.
    let pieces: Vec<Vec<ArrayRef>> = (0..batches)
        .map(|b| key_columns.iter().map(|c| Arc::clone(&c[b])).collect())
        .collect();
    let encoder = KeyEncoder::for_pieces(key_spec, &pieces)?;
    if encoder.needs_verification() {
        return Ok(None);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(pieces.len())
        .max(1);
    let per_thread = pieces.len().div_ceil(threads).max(1);
    let chunks: Vec<&[Vec<ArrayRef>]> = pieces.chunks(per_thread).collect();
    let encoded = on_threads(chunks.len(), |i| {
        chunks[i]
            .iter()
            .map(|columns| {
                let encoded = encoder.encode(columns)?;
                // NULL is a group and every value is in range: no row is
                // ever dropped.
                if encoded.row_ids.is_some() {
                    return Err(DataFusionError::Internal(
                        "group key encoding dropped rows".into(),
                    ));
                }
                Ok(encoded.keys)
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut words = Words::default();
    for chunk in encoded {
        for keys in chunk {
            words.push(Box::new(keys));
        }
    }
    Ok(Some(words))
}

impl DevicePart {
    fn aggregate(&self, batches: &[RecordBatch], inputs: &AggregateInputs) -> Result<Outcome> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let prepare = self.metrics.prepare_time.timer();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let key_columns = evaluate_pieces(&inputs.group_exprs, batches)?;
        let keys = match &self.spec.keys {
            Some(key_spec) => match encode_keys(key_spec, &key_columns, batches.len())? {
                Some(keys) => Some(keys),
                // The keys' ranges need more than 64 bits together.
                None => return Ok(Outcome::OnCpu),
            },
            None => None,
        };
        let with_keys = keys.is_some();
        let mut work = DeviceWork::default();
        for (i, aggregate) in self.spec.aggregates.iter().enumerate() {
            let args = evaluate_pieces(&inputs.aggregate_args[i], batches)?;
            let filter = match &inputs.filters[i] {
                Some(filter) => {
                    let pieces = evaluate_pieces(std::slice::from_ref(filter), batches)?;
                    Some(
                        pieces[0]
                            .iter()
                            .map(|piece| {
                                piece.as_boolean_opt().cloned().ok_or_else(|| {
                                    DataFusionError::Internal("FILTER is not boolean".into())
                                })
                            })
                            .collect::<Result<Vec<_>>>()?,
                    )
                }
                None => None,
            };
            work.add(
                aggregate,
                self.spec.merges_states,
                &args,
                filter.as_deref(),
                with_keys,
            )?;
        }
        prepare.done();
        let device = self.metrics.device_wall_time.timer();
        let grouped = self.on_device(keys.as_ref(), rows, &work);
        device.done();
        let grouped = match grouped {
            Ok(grouped) => grouped,
            Err(e) if e.is_out_of_device_memory() => return Ok(Outcome::OnCpu),
            Err(e) => return Err(e.into()),
        };
        self.metrics.groups.add(grouped.groups);
        let _emit = self.metrics.emit_time.timer();
        self.output(&key_columns, batches, &work, &grouped)
            .map(Outcome::Batches)
    }

    fn on_device(
        &self,
        keys: Option<&Words>,
        rows: usize,
        work: &DeviceWork,
    ) -> GpuResult<Grouped> {
        let waiting = std::time::Instant::now();
        let _admission = self.device.admit(self.max_concurrent_tasks);
        self.metrics
            .device
            .device_admission_wait
            .add_duration(waiting.elapsed());
        self.device.bind_to_thread()?;
        let bytes = group_by_device_bytes(rows, keys.is_some(), &work.inputs, work.bitmaps.len());
        let memory = self.device.budget().reserve(
            bytes,
            self.memory_fraction,
            ReservationKind::Transient,
        )?;
        self.metrics
            .device
            .device_memory_wait
            .add_duration(memory.waited());
        let stream = self.device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        let grouped = group_by(
            &self.device,
            stream.stream(),
            keys,
            rows,
            &work.inputs,
            &work.bitmaps,
            &mut timer,
        )?;
        self.metrics.device.record(&timer.finish()?);
        Ok(grouped)
    }

    /// The output batches: group keys read from a row of each group, then
    /// each aggregate's value or state columns.
    fn output(
        &self,
        key_columns: &[Vec<ArrayRef>],
        batches: &[RecordBatch],
        work: &DeviceWork,
        grouped: &Grouped,
    ) -> Result<Vec<RecordBatch>> {
        let groups = grouped.groups;
        let mut columns = Vec::with_capacity(self.output_schema.fields().len());
        if self.spec.keys.is_some() {
            // (batch, row in batch) of each group's row.
            let starts: Vec<usize> = batches
                .iter()
                .scan(0, |start, b| {
                    let this = *start;
                    *start += b.num_rows();
                    Some(this)
                })
                .collect();
            let at: Vec<(usize, usize)> = grouped
                .group_rows
                .iter()
                .map(|&row| {
                    let row = row as usize;
                    let batch = starts.partition_point(|&s| s <= row) - 1;
                    (batch, row - starts[batch])
                })
                .collect();
            for (key, pieces) in key_columns.iter().enumerate() {
                let column = if pieces.is_empty() {
                    new_empty_array(self.output_schema.field(key).data_type())
                } else {
                    let sources: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
                    interleave(&sources, &at)?
                };
                columns.push(column);
            }
        }
        for (i, aggregate) in self.spec.aggregates.iter().enumerate() {
            columns.extend(work.finish(
                i,
                aggregate,
                &grouped.reduced,
                groups,
                self.final_output,
            )?);
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.output_schema), columns)?;
        let size = self.batch_size.max(1);
        Ok((0..batch.num_rows())
            .step_by(size)
            .map(|start| batch.slice(start, size.min(batch.num_rows() - start)))
            .collect())
    }
}
