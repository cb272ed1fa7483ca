//! One partition of a GPU aggregation: collect the input, group and reduce
//! it on the device in a blocking task, finish each aggregate with
//! DataFusion's own accumulator over the per-group state, emit the groups.
//! When the device cannot take the work (too little device memory, or two
//! hashed keys that shared a hash), or should not (a sample of the keys
//! shows fewer groups than `gpu.min_groups`), DataFusion's CPU operator
//! aggregates the collected input instead, and a metric says so.

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

use super::group_keys::{
    fold_negative_zeros, group_key_words, groups_hold_one_key, sample_shows_few_groups,
    sampled_distinct_keys, GROUP_SAMPLE_ROWS,
};
use super::reductions::DeviceWork;
use super::spec::AggregateSpec;
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
    pub(crate) deterministic_float_sums: bool,
    /// Low bits of a hashed group key used (64 but in tests).
    pub(crate) hashed_group_key_bits: u32,
    /// `gpu.min_groups`: a partition whose sampled keys show fewer groups
    /// runs on the CPU operator (0: never).
    pub(crate) min_groups: usize,
    /// `gpu.hashed_group_keys`: keys that turn out to need hashing (ranges
    /// too wide to pack) run on the CPU operator when false.
    pub(crate) hashed_group_keys: bool,
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
    /// The device cannot take this input (too little device memory, or
    /// hashed keys that collided): DataFusion's CPU operator aggregates it.
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
        deterministic_float_sums: task.deterministic_float_sums,
        hashed_group_key_bits: task.hashed_group_key_bits,
        min_groups: task.min_groups,
        hashed_group_keys: task.hashed_group_keys,
        batch_size: task.batch_size,
        metrics: task.metrics.clone(),
    });
    let inputs = Arc::new(task.inputs);
    let (outcome, reservation) = {
        let batches = Arc::clone(&batches);
        let inputs = Arc::clone(&inputs);
        let mut reservation = task.reservation;
        SpawnedTask::spawn_blocking(move || {
            let outcome = device_task.aggregate(&batches, &inputs, &mut reservation);
            (outcome, reservation)
        })
        .join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU aggregation task failed: {e}")))?
    };
    task.reservation = reservation;
    let outcome = outcome?;
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
    deterministic_float_sums: bool,
    hashed_group_key_bits: u32,
    min_groups: usize,
    hashed_group_keys: bool,
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

impl DevicePart {
    fn aggregate(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
        reservation: &mut MemoryReservation,
    ) -> Result<Outcome> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let prepare = self.metrics.prepare_time.timer();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        // Floats as DataFusion stores group values, `-0.0` folded into `+0.0`.
        let key_columns = fold_negative_zeros(evaluate_pieces(&inputs.group_exprs, batches)?)?;
        if self.spec.keys.is_some() && self.min_groups > 0 {
            // Statistics rarely know the groups (the rule counts unknown as
            // many): a sample of the keys decides before they are encoded
            // or copied, where one CPU pass over host memory would be faster.
            let (sampled, distinct) = sampled_distinct_keys(&key_columns, GROUP_SAMPLE_ROWS)?;
            if sample_shows_few_groups(sampled, distinct, self.min_groups) {
                self.metrics.few_groups_partitions.add(1);
                return Ok(Outcome::OnCpu);
            }
        }
        let keys = match &self.spec.keys {
            Some(key_spec) => match group_key_words(
                key_spec,
                &key_columns,
                batches.len(),
                self.hashed_group_keys,
                self.hashed_group_key_bits,
            )? {
                Some(keys) => Some(keys),
                // Keys that need hashing without gpu.hashed_group_keys:
                // packable types whose ranges need more than 64 bits
                // together, or one float column with NULLs.
                None => return Ok(Outcome::OnCpu),
            },
            None => None,
        };
        let hashed = keys.as_ref().is_some_and(|k| k.hashed);
        if hashed {
            // Each row's group comes back to the host for the key check.
            reservation.try_grow(8 * rows)?;
        }
        let mut work = DeviceWork::new(self.deterministic_float_sums);
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
                keys.is_some(),
            )?;
        }
        prepare.done();
        let device = self.metrics.device_wall_time.timer();
        let grouped = self.on_device(keys.as_ref().map(|k| &k.words), rows, &work, hashed);
        device.done();
        let grouped = match grouped {
            Ok(grouped) => grouped,
            Err(e) if e.is_out_of_device_memory() => return Ok(Outcome::OnCpu),
            Err(e) => return Err(e.into()),
        };
        let emit = self.metrics.emit_time.timer();
        let group_keys = self.group_keys(&key_columns, batches, &grouped)?;
        emit.done();
        if hashed {
            let _check = self.metrics.key_check_time.timer();
            if !groups_hold_one_key(&key_columns, &group_keys, &grouped.row_groups)? {
                // Two different keys shared a hash: the groups are wrong.
                self.metrics.hashed_key_collisions.add(1);
                return Ok(Outcome::OnCpu);
            }
        }
        self.metrics.groups.add(grouped.groups);
        let _emit = self.metrics.emit_time.timer();
        self.output(group_keys, &work, &grouped)
            .map(Outcome::Batches)
    }

    fn on_device(
        &self,
        keys: Option<&Words>,
        rows: usize,
        work: &DeviceWork,
        keep_row_groups: bool,
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
            keep_row_groups,
            &mut timer,
        )?;
        self.metrics.device.record(&timer.finish()?);
        Ok(grouped)
    }

    /// Each group's key columns, read from the row that stands for it.
    fn group_keys(
        &self,
        key_columns: &[Vec<ArrayRef>],
        batches: &[RecordBatch],
        grouped: &Grouped,
    ) -> Result<Vec<ArrayRef>> {
        if self.spec.keys.is_none() {
            return Ok(Vec::new());
        }
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
        key_columns
            .iter()
            .enumerate()
            .map(|(key, pieces)| {
                if pieces.is_empty() {
                    Ok(new_empty_array(self.output_schema.field(key).data_type()))
                } else {
                    let sources: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
                    Ok(interleave(&sources, &at)?)
                }
            })
            .collect()
    }

    /// The output batches: the group keys, then each aggregate's value or
    /// state columns.
    fn output(
        &self,
        group_keys: Vec<ArrayRef>,
        work: &DeviceWork,
        grouped: &Grouped,
    ) -> Result<Vec<RecordBatch>> {
        let groups = grouped.groups;
        let mut columns = group_keys;
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
