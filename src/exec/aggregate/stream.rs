//! One partition of a GPU aggregation: collect the input, group and reduce
//! it on the device in a blocking task, finish each aggregate with
//! DataFusion's own accumulator over the per-group state, emit the groups
//! (in key order where the node replaced a sort: the device numbers the
//! groups by sorting their order-preserving codes).
//! When the device cannot take the work (too little device memory, or two
//! hashed keys that shared a hash), or should not (a sample of the keys
//! shows few groups, which the cost model places on the CPU), DataFusion's CPU operator
//! aggregates the collected input instead, and a metric says so. Where the
//! session's memory pool cannot hold the whole input, DataFusion's operator
//! (which spills) takes the batches read so far and the rest of the input.

use std::ops::Range;
use std::sync::Arc;

use crate::gpu::DeviceStream;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::{concat, interleave, BatchCoalescer};
use datafusion::arrow::datatypes::{Schema, SchemaRef, ToByteSlice};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::{CastExpr, Column, Literal};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::{batch_filter, FilterExec};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{execute_stream, ExecutionPlan, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};

use super::spec::GroupOrder;
use crate::config::{DeviceErrorPolicy, GpuOptions};
use crate::cost::{self, AggregateShape, DeviceConstants};
use crate::encode::group_keys::{
    estimated_groups, fold_negative_zeros, group_key_words, groups_hold_one_key,
    ordered_group_key_words, own_group_key_words, sample_shows_few_groups,
    sample_shows_groups_near_rows, sampled_distinct_keys, GroupKeyWords, OrderedGroupKeyWords,
    GROUP_SAMPLE_ROWS,
};

use super::reductions::DeviceWork;
use super::result_passes::{batches_of, result_passes, task_groups, EarlyColumns, ResultPass};
use super::spec::AggregateSpec;
use crate::encode::words::threads_for;
use crate::exec::collect::{collect_or_refuse, Collected, WholeInput};
use crate::exec::hand_over::handed_over_input;
use crate::host::mapped_ahead::{MappedAhead, PAGE_WORDS};
use crate::host::parallel::{map_pieces, on_ranges, starts_of};
use crate::host::release::release_in_background;
use crate::exec::GpuAggregateMetrics;
use crate::gpu::{in_pinned_memory, GpuDevice, GpuError, GpuResult, PhaseTimer, ReservationKind};
use crate::host::copy::host_threads;
use crate::ops::group_by::{
    group_by_device_bytes, group_uploaded_keys, partition_bits_for_groups, upload_group_keys,
    DeviceGrouped, GroupIds, GroupedWindow, GroupsBack, InputChunks, ReducedWindow, ResultParts,
    Words, FOLD_CHUNK_ROWS,
};
use super::cpu_phases::cpu_phases_over;
use crate::trace;

#[path = "partition_aggregation.rs"]
mod partition_aggregation;
#[path = "emit.rs"]
mod emit;
#[path = "out_of_core.rs"]
mod out_of_core;
#[path = "cached_input.rs"]
mod cached_input;

pub(crate) use cached_input::{cached_input, reads_cache_if_asked, CachedInput};

/// Starts a node's input: executes it (its streams start when polled).
pub(crate) type InputStart = Box<dyn FnOnce() -> Result<WholeInput> + Send + Sync>;

/// Where groups must leave in key order, the rows themselves are sorted
/// when the sampled keys show at least one group in this many rows;
/// otherwise the hash table's groups are sorted.
const ROWS_PER_GROUP_TO_SORT_ROWS: usize = 8;

/// Bytes of output buffers mapped ahead at most: a sample that finds every
/// key distinct estimates as many groups as rows, which may be far more
/// than come.
const MAX_BYTES_MAPPED_AHEAD: usize = 2 << 30;

/// The expressions one partition evaluates over its input.
#[derive(Default)]
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
    /// The input: one stream, every partition of the input of a merge
    /// that this one aggregation reads itself (collected concurrently), or
    /// the batches of a scan of batches in memory.
    pub(crate) input: WholeInput,
    /// The table whose cached columns the node reads on the device, and
    /// how to start its input where a run cannot (`input` is then empty
    /// until started).
    pub(crate) cached_input: Option<(CachedInput, InputStart)>,
    pub(crate) input_schema: SchemaRef,
    pub(crate) output_schema: SchemaRef,
    /// The replaced `AggregateExec`, run over the collected input when the
    /// device cannot take it.
    pub(crate) cpu_aggregate: Arc<dyn ExecutionPlan>,
    /// DataFusion's two phases, where this one aggregation replaced them:
    /// the fallback runs those over the collected input instead, on every
    /// core ([`cpu_phases_over`]).
    pub(crate) cpu_phases: Option<Arc<dyn ExecutionPlan>>,
    /// The order the groups leave in, where the node replaced a sort: the
    /// CPU fallback then sorts its output.
    pub(crate) group_order: Option<GroupOrder>,
    /// The filter of the groups, where the node runs one: each output batch
    /// is filtered as it is made, and the CPU fallback runs it over its
    /// output.
    pub(crate) output_filter: Option<Arc<FilterExec>>,
    pub(crate) context: Arc<TaskContext>,
    pub(crate) reservation: MemoryReservation,
    pub(crate) device: Arc<GpuDevice>,
    /// The session's `gpu.*` options as the node was executed.
    pub(crate) options: GpuOptions,
    /// Low bits of a hashed group key used (64 but in tests).
    pub(crate) hashed_group_key_bits: u32,
    /// What a device error does (the CPU operator takes over, but in tests).
    pub(crate) device_errors: DeviceErrorPolicy,
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
    /// The session's memory pool refused the host memory the device's work
    /// needs: DataFusion's CPU operator, which spills, aggregates the input,
    /// whose reservations are released for it.
    PoolRefused,
    /// The device's work needs `requested` bytes of device memory where the
    /// budget has `limit` in all: split into partitions that fit
    /// ([`DeviceAggregation::aggregate_in_partitions`]).
    TooLarge { requested: usize, limit: usize },
}

async fn run(mut task: AggregateTask) -> Result<SendableRecordBatchStream> {
    if let Some((cached, start_input)) = task.cached_input.take() {
        let device_task = task.device_aggregation();
        if let Some(output) = run_cached(device_task, Arc::clone(&task.context), cached).await? {
            return Ok(output);
        }
        task.input = start_input()?;
    }
    let input = std::mem::take(&mut task.input);
    let collecting = task.metrics.input_time.timer();
    let collected =
        collect_or_refuse(input, &task.reservation, Some(&task.metrics.input_rows)).await?;
    collecting.done();
    let (batches, input_reservations) = match collected {
        Collected::Whole(batches, reservations) => (batches, reservations),
        Collected::Refused {
            read,
            rest,
            refusal,
        } => {
            // The memory pool cannot hold the whole input: DataFusion's
            // operator, which spills, aggregates it as it comes, from the
            // batches read on. Nothing has left this partition yet.
            trace::event(|| format!("aggregation: input refused by the memory pool: {refusal}"));
            task.metrics.cpu_fallback_partitions.add(1);
            task.metrics.memory_pool_fallback_partitions.add(1);
            let source = handed_over_input(Arc::clone(&task.input_schema), read, rest)?;
            let plan = task.cpu_plan_over(source)?;
            return execute_stream(plan, Arc::clone(&task.context));
        }
    };
    trace::event(|| format!("aggregation: input collected ({} batches)", batches.len()));
    let batches = Arc::new(batches);
    let device_task = Arc::new(task.device_aggregation());
    let inputs = Arc::new(std::mem::take(&mut task.inputs));
    let (outcome, reservation) = {
        let batches = Arc::clone(&batches);
        let inputs = Arc::clone(&inputs);
        let mut reservation = task.reservation;
        SpawnedTask::spawn_blocking(move || {
            let outcome = match device_task.aggregate(&batches, &inputs, &mut reservation) {
                Ok(Outcome::TooLarge { requested, limit }) => device_task.aggregate_in_partitions(
                    &batches,
                    &inputs,
                    &mut reservation,
                    (requested, limit),
                ),
                outcome => outcome,
            };
            (outcome, reservation)
        })
        .join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU aggregation task failed: {e}")))?
    };
    task.reservation = reservation;
    trace::event(|| "aggregation: blocking part returned".into());
    let outcome = outcome?;
    match outcome {
        Outcome::Batches(output) => {
            // The input, with the reservations that account for it, is
            // dropped while the groups go on (see `release`).
            release_in_background((batches, input_reservations));
            task.reservation.free();
            // Counted as they were made (see `DeviceAggregation::emit`).
            let output: Vec<Result<RecordBatch>> = output.into_iter().map(Ok).collect();
            task.metrics.baseline.done();
            trace::event(|| "aggregation: output handed on".into());
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                task.output_schema,
                futures::stream::iter(output),
            )))
        }
        Outcome::OnCpu | Outcome::PoolRefused | Outcome::TooLarge { .. } => {
            task.metrics.cpu_fallback_partitions.add(1);
            let input_reservations = match outcome {
                Outcome::PoolRefused => {
                    task.metrics.memory_pool_fallback_partitions.add(1);
                    task.reservation.free();
                    drop(input_reservations);
                    Vec::new()
                }
                _ => input_reservations,
            };
            let batches = Arc::try_unwrap(batches).unwrap_or_else(|shared| (*shared).clone());
            // With DataFusion's two phases, as many partitions as its plan
            // would have read, dealt round robin; else one.
            let partitions = match &task.cpu_phases {
                Some(_) => task.context.session_config().target_partitions().max(1),
                None => 1,
            };
            let mut parts = vec![Vec::new(); partitions.min(batches.len()).max(1)];
            let count = parts.len();
            for (i, batch) in batches.into_iter().enumerate() {
                parts[i % count].push(batch);
            }
            let source =
                MemorySourceConfig::try_new_exec(&parts, Arc::clone(&task.input_schema), None)?;
            let plan = task.cpu_plan_over(source)?;
            let stream = execute_stream(plan, Arc::clone(&task.context))?;
            // The collected input stays reserved until the CPU operator's
            // stream, which reads it, is dropped.
            let reservations = (task.reservation, input_reservations);
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                task.output_schema,
                stream.inspect(move |_| {
                    let _ = &reservations;
                }),
            )))
        }
    }
}

/// The partition aggregated from the table's cached columns `cached` on
/// the device; `None` where a run cannot (why is counted), and the node
/// reads its input instead.
async fn run_cached(
    device_task: DeviceAggregation,
    context: Arc<TaskContext>,
    cached: CachedInput,
) -> Result<Option<SendableRecordBatchStream>> {
    let metrics = device_task.metrics.clone();
    if let Some(reason) = device_task.too_large_for_cached(&cached) {
        metrics.cached_input_refusals.add(&reason);
        return Ok(None);
    }
    let loading = metrics.input_time.timer();
    let parts = cached
        .load(&device_task.device, &context, &device_task.options, &metrics.cache)
        .await?;
    loading.done();
    let parts = match parts {
        Ok(parts) => parts,
        Err(reason) => {
            trace::event(|| format!("aggregation: cached input refused: {reason}"));
            metrics.cached_input_refusals.add(&reason);
            return Ok(None);
        }
    };
    trace::event(|| format!("aggregation: {} cached parts resident", parts.len()));
    let schema = Arc::clone(&device_task.output_schema);
    let outcome = SpawnedTask::spawn_blocking(move || device_task.aggregate_cached(&cached, &parts))
        .join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU aggregation task failed: {e}")))??;
    match outcome {
        Ok(output) => {
            metrics.cached_input_partitions.add(1);
            metrics.baseline.done();
            let output: Vec<Result<RecordBatch>> = output.into_iter().map(Ok).collect();
            Ok(Some(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(output),
            ))))
        }
        Err(reason) => {
            trace::event(|| format!("aggregation: cached input refused: {reason}"));
            metrics.cached_input_refusals.add(&reason);
            Ok(None)
        }
    }
}

impl AggregateTask {
    /// The blocking part of this partition.
    fn device_aggregation(&self) -> DeviceAggregation {
        DeviceAggregation {
            spec: self.spec.clone(),
            group_order: self.group_order.clone(),
            output_filter: self.output_filter.clone(),
            final_output: self.final_output,
            output_schema: Arc::clone(&self.output_schema),
            device: Arc::clone(&self.device),
            options: self.options.clone(),
            hashed_group_key_bits: self.hashed_group_key_bits,
            device_errors: self.device_errors,
            batch_size: self.batch_size,
            metrics: self.metrics.clone(),
        }
    }

    /// DataFusion's aggregation in place of this one over `source` (the
    /// task's input): its two phases where this one replaced them, else
    /// the replaced operator; sorted where this one took a sort's place,
    /// filtered where it filters its groups.
    fn cpu_plan_over(&self, source: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        #[allow(deprecated)]
        let plan = match &self.cpu_phases {
            Some(cpu_phases) => cpu_phases_over(cpu_phases, source)?,
            None => Arc::clone(&self.cpu_aggregate).with_new_children(vec![source])?,
        };
        let plan = match &self.group_order {
            // The sort this node took the place of.
            Some(order) => sorted_by(plan, &order.ordering),
            None => plan,
        };
        #[allow(deprecated)]
        Ok(match &self.output_filter {
            Some(filter) => Arc::clone(filter).with_new_children(vec![plan])?,
            None => plan,
        })
    }
}

/// What emitting a partition's groups gave.
enum Emitted {
    /// The group count and the output batches.
    Batches(usize, Vec<RecordBatch>),
    /// Two different hashed keys shared a hash: the groups are wrong.
    Collided,
    /// The device failed while the results came back (none has left).
    DeviceFailed(GpuError),
    /// No pinned memory for the results' windows.
    OutOfMemory,
}

/// An error while the results come back: the device's (out of memory
/// falls back to the CPU operator), or the host's own.
enum EmitError {
    Device(GpuError),
    Host(DataFusionError),
}

impl From<GpuError> for EmitError {
    fn from(e: GpuError) -> Self {
        EmitError::Device(e)
    }
}

impl From<DataFusionError> for EmitError {
    fn from(e: DataFusionError) -> Self {
        EmitError::Host(e)
    }
}

/// What the groups' keys are read from: their words (unless hashed), or
/// a row of each group among the input's key columns (hashed keys, and the
/// check that each group holds one key).
struct KeySources<'a> {
    keys: Option<&'a GroupKeyWords>,
    /// Per key expression, one array per input batch.
    key_columns: &'a [Vec<ArrayRef>],
    batches: &'a [RecordBatch],
}

/// The blocking part of one partition.
struct DeviceAggregation {
    spec: AggregateSpec,
    group_order: Option<GroupOrder>,
    /// The filter each output batch passes, if any.
    output_filter: Option<Arc<FilterExec>>,
    final_output: bool,
    output_schema: SchemaRef,
    device: Arc<GpuDevice>,
    options: GpuOptions,
    hashed_group_key_bits: u32,
    device_errors: DeviceErrorPolicy,
    batch_size: usize,
    metrics: GpuAggregateMetrics,
}

/// The group keys' words, as [`DeviceAggregation::key_words`] made them.
enum KeyWordsMade {
    /// Codes whose order is the keys' order (the node emits in key order).
    Ordered(OrderedGroupKeyWords),
    Unordered(GroupKeyWords),
    /// A global aggregate: all rows form one group.
    NoKeys,
    /// Keys the device cannot group: DataFusion's operator takes them.
    OnCpu,
}

/// The aggregates' device work: prepared before the device is taken, or,
/// where the data cannot change its shape ([`DeviceAggregation::work_shape`]),
/// prepared while the keys cross the bus. Preparing it reads every input
/// batch several times, which costs less than copying the keys, so the
/// keys' copy hides it.
enum WorkToDo<'a> {
    Ready(DeviceWork),
    WhileKeysCross {
        /// The same work over no rows: the inputs, their reductions and
        /// bitmaps, which size the device memory before the data is read.
        shape: DeviceWork,
        prepare: Box<dyn FnOnce() -> Result<DeviceWork> + 'a>,
    },
}

impl WorkToDo<'_> {
    /// What sizes the device memory: the work, or its shape.
    fn shape(&self) -> &DeviceWork {
        match self {
            Self::Ready(work) => work,
            Self::WhileKeysCross { shape, .. } => shape,
        }
    }

    /// The work, prepared now where it was not, and checked against the
    /// shape that sized the device memory.
    fn prepare(self) -> Result<DeviceWork> {
        match self {
            Self::Ready(work) => Ok(work),
            Self::WhileKeysCross { shape, prepare } => {
                let work = prepare()?;
                trace::event(|| "aggregation: aggregates' inputs prepared".into());
                if !work.has_shape_of(&shape) {
                    return Err(DataFusionError::Internal(
                        "the aggregates' inputs differ from the shape that sized the device memory"
                            .into(),
                    ));
                }
                Ok(work)
            }
        }
    }
}

/// Whether `arg` is NULL in no row of any batch of `schema`: a column the
/// schema says cannot be NULL (every batch was checked against it when it
/// was made), a literal that is not NULL, or a numeric CAST of either that
/// fails rather than gives NULL (as `avg(x)` and `sum(x)` of narrow
/// integers are planned). Other computed arguments may say they cannot be
/// NULL and still give one.
fn never_null(arg: &Arc<dyn PhysicalExpr>, schema: &Schema) -> bool {
    if let Some(column) = arg.downcast_ref::<Column>() {
        return schema
            .fields()
            .get(column.index())
            .is_some_and(|field| !field.is_nullable());
    }
    if let Some(literal) = arg.downcast_ref::<Literal>() {
        // `count(*)` is planned as `count(1)`.
        return !literal.value().is_null();
    }
    if let Some(cast) = arg.downcast_ref::<CastExpr>() {
        let numeric = cast.cast_type().is_numeric();
        return numeric && !cast.cast_options().safe && never_null(cast.expr(), schema);
    }
    false
}

/// How groups that must leave in key order are numbered, from the sample
/// of the keys (`(sampled, distinct)`) out of `rows` rows: sorting the rows
/// costs less than hashing them and sorting the groups only where nearly
/// every row is a group of its own (BENCHMARKS.md).
fn ids_in_key_order(
    ordered: &OrderedGroupKeyWords,
    (sampled, distinct): (usize, usize),
    rows: usize,
) -> GroupIds {
    let (key_bits, transform) = (ordered.bits, ordered.transform);
    if sample_shows_groups_near_rows(sampled, distinct, rows, ROWS_PER_GROUP_TO_SORT_ROWS) {
        GroupIds::Sorted {
            key_bits,
            transform,
        }
    } else {
        GroupIds::HashedInKeyOrder {
            key_bits,
            transform,
            expected_groups: sampled_groups((sampled, distinct), rows),
        }
    }
}

/// How groups in no particular order are numbered, from the sample of the
/// keys (`(sampled, distinct)`) out of `rows` rows: in hash partitions
/// where it estimates at least `min_groups_to_partition` groups, else in
/// one table sized to the estimate.
fn unordered_ids(
    (sampled, distinct): (usize, usize),
    rows: usize,
    min_groups_to_partition: usize,
) -> GroupIds {
    let groups = estimated_groups(sampled, distinct, rows);
    if groups >= min_groups_to_partition {
        GroupIds::Partitioned {
            partition_bits: partition_bits_for_groups(groups),
        }
    } else {
        GroupIds::Hashed {
            expected_groups: (sampled > 0).then_some(groups),
        }
    }
}

/// The groups a sample of the keys estimates, where one was taken.
fn sampled_groups((sampled, distinct): (usize, usize), rows: usize) -> Option<usize> {
    (sampled > 0).then(|| estimated_groups(sampled, distinct, rows))
}

/// `plan`'s rows, all partitions together, sorted by `ordering`.
fn sorted_by(plan: Arc<dyn ExecutionPlan>, ordering: &LexOrdering) -> Arc<dyn ExecutionPlan> {
    let plan = if plan.properties().output_partitioning().partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(plan))
    } else {
        plan
    };
    Arc::new(SortExec::new(ordering.clone(), plan))
}

/// `exprs` evaluated over every batch, on every core: per expression, one
/// array per batch (the pieces are never concatenated; see [`Words`]).
fn evaluate_pieces(
    exprs: &[Arc<dyn PhysicalExpr>],
    batches: &[RecordBatch],
) -> Result<Vec<Vec<ArrayRef>>> {
    let columns: Option<Vec<&Column>> = exprs.iter().map(|e| e.downcast_ref::<Column>()).collect();
    if let Some(columns) = columns {
        // Columns as they are: nothing to compute, so threads pay off only
        // over thousands of batches, each a few cache misses. Each batch's
        // array is taken by its index, not through `evaluate`, which
        // clones the schema every batch shares to check the index: on
        // every core at once, that one reference count made the threads
        // take turns.
        return columns
            .iter()
            .map(|column| {
                map_pieces(batches.len(), |b| {
                    batches[b]
                        .columns()
                        .get(column.index())
                        .cloned()
                        .ok_or_else(|| {
                            DataFusionError::Internal(format!(
                                "column {} at index {} of a batch of {} columns",
                                column.name(),
                                column.index(),
                                batches[b].num_columns()
                            ))
                        })
                })
            })
            .collect();
    }
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    let threads = threads_for(batches.len(), rows);
    let per_range = on_ranges(batches.len(), threads, |range| {
        batches[range]
            .iter()
            .map(|batch| {
                exprs
                    .iter()
                    .map(|expr| expr.evaluate(batch)?.into_array(batch.num_rows()))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut pieces = vec![Vec::with_capacity(batches.len()); exprs.len()];
    for arrays in per_range.into_iter().flatten() {
        for (expr, array) in arrays.into_iter().enumerate() {
            pieces[expr].push(array);
        }
    }
    Ok(pieces)
}

impl DeviceAggregation {
    /// The device reductions of every aggregate over its inputs evaluated
    /// over `batches`, with its FILTER.
    fn device_work(&self, batches: &[RecordBatch], inputs: &AggregateInputs) -> Result<DeviceWork> {
        let mut work = DeviceWork::new(self.options.deterministic_float_sums);
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
            // With keys, every group has a row.
            work.add(
                aggregate,
                self.spec.merges_states,
                args,
                filter.as_deref(),
                self.spec.keys.is_some(),
            )?;
        }
        Ok(work)
    }

    /// The aggregates' device work over no rows, where it is the work
    /// over `batches` but for its data: no aggregate has a FILTER, and no
    /// argument can be NULL ([`never_null`]), so that no column needs a
    /// validity bitmap. `None` where the data decides.
    fn work_shape(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
    ) -> Result<Option<DeviceWork>> {
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return Ok(None);
        };
        if inputs.filters.iter().any(Option::is_some) {
            return Ok(None);
        }
        let no_nulls = inputs
            .aggregate_args
            .iter()
            .flatten()
            .all(|arg| never_null(arg, &schema));
        if !no_nulls {
            return Ok(None);
        }
        self.device_work(&[], inputs).map(Some)
    }

    /// Runs the device part up to the results, which stay on the device,
    /// and hands them to `emit` (with a stream of its own to bring the
    /// groups' keys back on while the device still reduces) as soon as the
    /// work is enqueued, while the device and its memory are still held:
    /// errors of the device part are returned as they are (the caller
    /// falls back on out-of-memory), those of `emit` inside. The work,
    /// once prepared, is left in `prepared` (for the caller to release);
    /// `prepared_now` is called then, once the keys' copy is enqueued and
    /// before the rest of the device's work is.
    #[allow(clippy::too_many_arguments)]
    fn on_device<'w, T>(
        &self,
        keys: Option<&Words>,
        ids: GroupIds,
        rows: usize,
        work: WorkToDo<'w>,
        prepared_now: impl FnOnce(),
        prepared: &mut Option<DeviceWork>,
        back: GroupsBack,
        emit: impl FnOnce(&DeviceGrouped, &DeviceWork, &Arc<DeviceStream>, &mut PhaseTimer) -> Result<T>,
    ) -> GpuResult<Result<T>> {
        let waiting = std::time::Instant::now();
        let _admission = self.device.admit(self.options.max_concurrent_tasks);
        self.metrics
            .device
            .device_admission_wait
            .add_duration(waiting.elapsed());
        self.device.bind_to_thread()?;
        let shape = work.shape();
        let bytes = group_by_device_bytes(
            rows,
            keys.is_some(),
            ids,
            &shape.inputs,
            shape.bitmaps.len(),
            self.device.sm_count(),
        );
        let memory = self.device.budget().reserve(
            bytes,
            self.options.memory_fraction,
            ReservationKind::Transient,
        )?;
        self.metrics
            .device
            .device_memory_wait
            .add_duration(memory.waited());
        let stream = self.device.stream()?;
        // The inputs cross the bus on a stream of their own while the
        // groups are numbered.
        let copy_stream = self.device.stream()?;
        let keys_stream = self.device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        let uploaded = upload_group_keys(
            &self.device,
            stream.stream(),
            copy_stream.stream(),
            keys,
            rows,
            &mut timer,
        )?;
        if matches!(work, WorkToDo::WhileKeysCross { .. }) {
            self.metrics
                .inputs_prepared_during_key_copy_partitions
                .add(1);
        }
        let work = match work.prepare() {
            Ok(work) => prepared.insert(work),
            Err(e) => return Ok(Err(e)),
        };
        prepared_now();
        let grouped = group_uploaded_keys(
            &self.device,
            stream.stream(),
            copy_stream.stream(),
            uploaded,
            ids,
            rows,
            &work.inputs,
            &work.bitmaps,
            back,
            InputChunks {
                rows: FOLD_CHUNK_ROWS,
                fold_into_table: self.options.tuning.fold_into_table,
                reduce_as_they_land: self.options.tuning.reduce_as_they_land,
            },
            &mut timer,
        )?;
        let emitted = emit(&grouped, work, keys_stream.stream(), &mut timer);
        // Freed in stream order before the timer waits for the streams.
        drop(grouped);
        self.metrics.device.record(&timer.finish()?);
        trace::event(|| "aggregation: device results freed, timings read".into());
        Ok(emitted)
    }

    /// Output buffers mapped by threads of their own while the device
    /// works ([`MappedAhead`]): one per 8-byte output column of each output
    /// batch that the sample's estimate of the groups foresees, where that
    /// makes at least `gpu.tuning.min_output_bytes_mapped_ahead` bytes and each
    /// buffer is at least a page; up to [`MAX_BYTES_MAPPED_AHEAD`] bytes,
    /// each buffer counted in the memory pool before it is mapped.
    fn map_output_ahead(
        &self,
        sample: Option<(usize, usize)>,
        rows: usize,
        reservation: &MemoryReservation,
    ) -> MappedAhead {
        if !self.options.tuning.map_output_ahead {
            return MappedAhead::none();
        }
        let Some(groups) = sample.and_then(|sample| sampled_groups(sample, rows)) else {
            return MappedAhead::none();
        };
        let words = self.batch_size;
        let Some(buffer_bytes) = words.checked_mul(std::mem::size_of::<u64>()) else {
            return MappedAhead::none();
        };
        if words < PAGE_WORDS {
            return MappedAhead::none();
        }
        let columns = self
            .output_schema
            .fields()
            .iter()
            .filter(|f| f.data_type().primitive_width() == Some(8))
            .count();
        let buffers = groups
            .div_ceil(words)
            .saturating_mul(columns)
            .min(MAX_BYTES_MAPPED_AHEAD / buffer_bytes);
        if buffers.saturating_mul(buffer_bytes) < self.options.tuning.min_output_bytes_mapped_ahead.max(1) {
            return MappedAhead::none();
        }
        let threads = (host_threads() / 2).max(1);
        trace::event(|| {
            format!("output memory: mapping {buffers} buffers ahead on up to {threads} threads")
        });
        MappedAhead::start(buffers, words, threads, reservation.new_empty())
    }

    /// The group keys' words, made as the node's group order asks.
    fn key_words(&self, key_columns: &[Vec<ArrayRef>], batches: usize) -> Result<KeyWordsMade> {
        Ok(match (&self.spec.keys, &self.group_order) {
            (Some(key_spec), Some(order)) => {
                match ordered_group_key_words(key_spec, key_columns, &order.keys)? {
                    Some(ordered) => KeyWordsMade::Ordered(ordered),
                    // Codes of more than 64 bits: DataFusion's operator,
                    // then a sort.
                    None => KeyWordsMade::OnCpu,
                }
            }
            (Some(key_spec), None) => match group_key_words(
                key_spec,
                key_columns,
                batches,
                self.options.hashed_group_keys,
                self.hashed_group_key_bits,
            )? {
                Some(keys) => KeyWordsMade::Unordered(keys),
                // Keys that need hashing without gpu.hashed_group_keys:
                // packable types whose ranges need more than 64 bits
                // together, or one float column with NULLs.
                None => KeyWordsMade::OnCpu,
            },
            (None, _) => KeyWordsMade::NoKeys,
        })
    }
}

/// Groups per window of results brought back from the device: a whole
/// number of output batches of `batch_size` groups, about `window_words`
/// words in all (`gpu.tuning.result_window_words`), at least one batch.
fn window_groups(window_words: usize, words_per_group: usize, batch_size: usize) -> usize {
    let groups = window_words / words_per_group.max(1);
    (groups / batch_size).max(1) * batch_size
}

/// Each key column whole, from its chunks.
fn concat_chunks(chunks: &[Vec<ArrayRef>]) -> Result<Vec<ArrayRef>> {
    let Some(first) = chunks.first() else {
        return Ok(Vec::new());
    };
    (0..first.len())
        .map(|key| {
            let pieces: Vec<&dyn Array> = chunks.iter().map(|c| c[key].as_ref()).collect();
            Ok(concat(&pieces)?)
        })
        .collect()
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
