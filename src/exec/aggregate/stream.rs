//! One partition of a GPU aggregation: collect the input, group and reduce
//! it on the device in a blocking task, finish each aggregate with
//! DataFusion's own accumulator over the per-group state, emit the groups.
//! When the device cannot take the work (too little device memory, keys
//! too wide to pack into 64 bits), DataFusion's CPU operator aggregates the
//! collected input instead, and a metric says so.

use std::sync::Arc;

use datafusion::arrow::array::{
    new_empty_array, Array, ArrayRef, AsArray, RecordBatch, UInt64Array,
};
use datafusion::arrow::compute::{concat, take};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
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
use super::spec::AggregateSpec;
use crate::exec::keys::KeyEncoder;
use crate::exec::GpuAggregateMetrics;
use crate::gpu::{GpuDevice, GpuResult, PhaseTimer, ReservationKind};
use crate::ops::group_by::{group_by, group_by_device_bytes, Grouped};

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
        input_schema: Arc::clone(&task.input_schema),
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
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    device: Arc<GpuDevice>,
    memory_fraction: f64,
    max_concurrent_tasks: usize,
    batch_size: usize,
    metrics: GpuAggregateMetrics,
}

/// `exprs` evaluated over every batch, each concatenated into one column.
fn evaluate_all(
    exprs: &[Arc<dyn PhysicalExpr>],
    batches: &[RecordBatch],
    input_schema: &Schema,
) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|expr| {
            let pieces = batches
                .iter()
                .map(|batch| expr.evaluate(batch)?.into_array(batch.num_rows()))
                .collect::<Result<Vec<_>>>()?;
            if pieces.is_empty() {
                return Ok(new_empty_array(&expr.data_type(input_schema)?));
            }
            let pieces: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            Ok(concat(&pieces)?)
        })
        .collect()
}

impl DevicePart {
    fn aggregate(&self, batches: &[RecordBatch], inputs: &AggregateInputs) -> Result<Outcome> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let prepare = self.metrics.prepare_time.timer();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let key_columns = evaluate_all(&inputs.group_exprs, batches, &self.input_schema)?;
        let keys = match &self.spec.keys {
            Some(key_spec) if rows > 0 => {
                let encoder = KeyEncoder::for_build_side(key_spec, &key_columns)?;
                if encoder.needs_verification() {
                    // The keys' ranges need more than 64 bits together.
                    return Ok(Outcome::OnCpu);
                }
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                let encoded = encoder.encode_parallel(&key_columns, threads)?;
                if encoded.row_ids.is_some() || encoded.keys.len() != rows {
                    return Err(DataFusionError::Internal(
                        "group key encoding dropped rows".into(),
                    ));
                }
                Some(encoded.keys)
            }
            Some(_) => Some(Vec::new()),
            None => None,
        };
        let with_keys = keys.is_some();
        let mut work = DeviceWork::default();
        for (i, aggregate) in self.spec.aggregates.iter().enumerate() {
            let args = evaluate_all(&inputs.aggregate_args[i], batches, &self.input_schema)?;
            let filter = match &inputs.filters[i] {
                Some(filter) => {
                    let column =
                        evaluate_all(std::slice::from_ref(filter), batches, &self.input_schema)?;
                    Some(
                        column[0].as_boolean_opt().cloned().ok_or_else(|| {
                            DataFusionError::Internal("FILTER is not boolean".into())
                        })?,
                    )
                }
                None => None,
            };
            work.add(
                aggregate,
                self.spec.merges_states,
                &args,
                filter.as_ref(),
                with_keys,
            )?;
        }
        prepare.done();
        let device = self.metrics.device_wall_time.timer();
        let grouped = self.on_device(keys.as_deref(), rows, &work);
        device.done();
        let grouped = match grouped {
            Ok(grouped) => grouped,
            Err(e) if e.is_out_of_device_memory() => return Ok(Outcome::OnCpu),
            Err(e) => return Err(e.into()),
        };
        self.metrics.groups.add(grouped.groups);
        let _emit = self.metrics.emit_time.timer();
        self.output(&key_columns, &work, &grouped)
            .map(Outcome::Batches)
    }

    fn on_device(
        &self,
        keys: Option<&[u64]>,
        rows: usize,
        work: &DeviceWork,
    ) -> GpuResult<Grouped> {
        let waiting = std::time::Instant::now();
        let _admission = self.device.admit(self.max_concurrent_tasks);
        self.metrics
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
        self.metrics.record_device(&timer.finish()?);
        Ok(grouped)
    }

    /// The output batches: group keys read from a row of each group, then
    /// each aggregate's value or state columns.
    fn output(
        &self,
        key_columns: &[ArrayRef],
        work: &DeviceWork,
        grouped: &Grouped,
    ) -> Result<Vec<RecordBatch>> {
        let groups = grouped.groups;
        let group_rows = UInt64Array::from(grouped.group_rows.clone());
        let mut columns = Vec::with_capacity(self.output_schema.fields().len());
        if self.spec.keys.is_some() {
            for key in key_columns {
                columns.push(take(key.as_ref(), &group_rows, None)?);
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
        if self.spec.keys.is_some() && key_columns.is_empty() {
            return Err(DataFusionError::Internal("group keys missing".into()));
        }
        let batch = RecordBatch::try_new(Arc::clone(&self.output_schema), columns)?;
        let size = self.batch_size.max(1);
        Ok((0..batch.num_rows())
            .step_by(size)
            .map(|start| batch.slice(start, size.min(batch.num_rows() - start)))
            .collect())
    }
}
