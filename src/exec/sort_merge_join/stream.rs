//! One partition of a GPU sort-merge join: collect both inputs (kept in the
//! batches they arrived in, never concatenated), code their keys in sort
//! order (or, for raw 8-byte keys, let the device code them from their
//! batches' own buffers, and, where it sorts both sides, find their value
//! range itself), then in a blocking task sort them on the device
//! (where the plan did not already sort them), merge, and emit the output
//! range by range through a bounded channel, so a large result streams out
//! while later ranges are still being made. When the device cannot take
//! the partition (keys too wide for 64-bit codes, too little device
//! memory), DataFusion's `SortMergeJoinExec` joins the collected inputs
//! instead, and a metric says so. Where the join computes the partial
//! aggregation above it (see [`crate::exec::join::pair_aggregate`]), the pairs
//! are reduced on the device and one row of partial states leaves instead.

use std::sync::Arc;

use crate::config::DeviceErrorPolicy;
use crate::gpu::{DeviceEvent, DeviceStream};
use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, SchemaRef, ToByteSlice};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{JoinType, NullEquality};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::metrics::RecordOutput;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt, TryStreamExt};

use super::emit::{needs_pairs, streams_left, StreamedWalk};
use crate::exec::collect::{collect_or_refuse_into, Collected, WholeInput};
use crate::exec::hand_over::handed_over_input;
use crate::exec::join::matches::gathers_by_pair;
use crate::exec::join::device_gather::{
    gather_batches, output_columns, reduce_pairs, ColumnBytes, GatherSide,
    ResidentColumns,
};
use crate::exec::join::{evaluate_filter, OutputAssembler, OutputRows};
use crate::encode::keys::raw_words;
use crate::encode::ordered_keys::{raw_word_flip, raw_word_value, KeySide, OrderedKeyEncoder};
use crate::exec::join::pair_aggregate::{PairAggregate, PartialStates};
use crate::host::release::release_in_background;
use crate::exec::join::row_source::{ArrivedBatches, RowSource};
use crate::exec::GpuSortMergeJoinMetrics;
use crate::gpu::launch::CodeTransform;
use crate::pinned_tables::{first_buffer_address};
use crate::gpu::{
    in_pinned_memory, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase,
    PhaseTimer, ReservationKind,
};
use crate::ops::gather;
use crate::ops::merge_join::{merge_join_device_bytes, DevicePairs, MergeMatches, SortedSide};
use crate::trace;

#[path = "side_keys.rs"]
mod side_keys;
use side_keys::*;
#[path = "device_part.rs"]
mod device_part;

/// What every partition of one join shares.
pub(crate) struct MergeJoinPlan {
    pub(crate) left_schema: SchemaRef,
    pub(crate) right_schema: SchemaRef,
    pub(crate) left_on: Vec<PhysicalExprRef>,
    pub(crate) right_on: Vec<PhysicalExprRef>,
    pub(crate) key_types: Vec<DataType>,
    pub(crate) sort_options: Vec<SortOptions>,
    pub(crate) null_equality: NullEquality,
    pub(crate) join_type: JoinType,
    pub(crate) filter: Option<JoinFilter>,
    /// Per side (left, right): sorted on the device, or arriving sorted.
    pub(crate) sort_on_device: [bool; 2],
    pub(crate) output: OutputAssembler,
    /// Threads one partition codes its keys on: the host's cores shared by
    /// the partitions, which run at once.
    pub(crate) host_threads: usize,
    /// The replaced `SortMergeJoinExec` (with the `SortExec`s this node
    /// absorbed), run over the collected inputs when the device cannot.
    pub(crate) cpu_join: Arc<dyn ExecutionPlan>,
    /// The projection this node absorbed, put over `cpu_join` there.
    pub(crate) cpu_projection: Option<Vec<ProjectionExpr>>,
    /// The partial aggregation above the join computed from its pairs: the
    /// partition then emits one row of its states instead of its rows.
    pub(crate) aggregate: Option<Arc<PairAggregate>>,
}

/// Everything one partition needs.
pub(crate) struct MergeJoinTask {
    pub(crate) plan: Arc<MergeJoinPlan>,
    /// The output partition, for the trace.
    pub(crate) partition: usize,
    /// Each side's input: its one stream, the streams of every partition
    /// of the merge below it where the join reads through that merge (see
    /// `GpuSortMergeJoinExec::merge_read_through`), or the batches of a
    /// scan of batches in memory.
    pub(crate) left: WholeInput,
    pub(crate) right: WholeInput,
    pub(crate) output_schema: SchemaRef,
    pub(crate) context: Arc<TaskContext>,
    pub(crate) reservation: MemoryReservation,
    pub(crate) device: Arc<GpuDevice>,
    pub(crate) max_output_pairs: usize,
    pub(crate) memory_fraction: f64,
    pub(crate) max_concurrent_tasks: usize,
    /// What a device error does (DataFusion's join takes over where nothing
    /// was sent, but in tests).
    pub(crate) device_errors: DeviceErrorPolicy,
    pub(crate) metrics: GpuSortMergeJoinMetrics,
}

/// The output stream of one partition.
pub(crate) fn merge_join_stream(task: MergeJoinTask) -> SendableRecordBatchStream {
    let schema = Arc::clone(&task.output_schema);
    let stream = futures::stream::once(run(task)).try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// Output batches in flight between the device task and the consumer.
const CHANNEL_BATCHES: usize = 4;

/// How the blocking part ended.
enum Outcome {
    /// Every output batch was sent.
    Done,
    /// Nothing was sent, and the device cannot take the inputs (keys too
    /// wide for 64-bit codes, too little device memory): DataFusion's
    /// operator joins them.
    OnCpu,
}

/// Reads `inputs` whole (several streams each in a task of its own),
/// keeping their batches: row ids count rows over them in order, and
/// nothing is concatenated (only key columns that the host codes are made
/// contiguous later). A side the device sorts (`in_memory_order`) is kept
/// in the order its batches lie in memory instead of the order they
/// arrived in, which only orders rows of equal keys, and arrival already
/// left that to chance (partitions read at once): batches laid end to end
/// in pinned regions (`pin_batches`) then go to the device in one copy per
/// column and region, not one per batch.
async fn collect(
    inputs: WholeInput,
    schema: &SchemaRef,
    reservation: &MemoryReservation,
    in_memory_order: bool,
) -> Result<Side> {
    // One reservation holds both sides' memory, however they were read.
    let side = match collect_or_refuse_into(inputs, reservation, None).await? {
        Collected::Whole(mut batches, _) => {
            if in_memory_order {
                batches.sort_by_cached_key(first_buffer_address);
            }
            Side::Arrived(Arc::new(ArrivedBatches::new(Arc::clone(schema), batches)))
        }
        Collected::Refused { read, rest, .. } => Side::Refused { read, rest },
    };
    Ok(side)
}

/// One side of the join as [`collect`] read it.
enum Side {
    /// Every batch, kept.
    Arrived(Arc<ArrivedBatches>),
    /// The memory pool refused a batch: the batches read, and the streams
    /// with the rest.
    Refused {
        read: Vec<RecordBatch>,
        rest: Vec<SendableRecordBatchStream>,
    },
}

impl Side {
    /// A scan of this side for DataFusion's join: its batches in the
    /// order they arrived (a side that arrives sorted stays sorted).
    fn into_source(self, schema: &SchemaRef) -> Result<Arc<dyn ExecutionPlan>> {
        match self {
            Side::Arrived(batches) => {
                handed_over_input(Arc::clone(schema), batches.batches().to_vec(), Vec::new())
            }
            Side::Refused { read, rest } => handed_over_input(Arc::clone(schema), read, rest),
        }
    }
}

async fn run(task: MergeJoinTask) -> Result<SendableRecordBatchStream> {
    let plan = Arc::clone(&task.plan);
    // Both inputs are read at once, as `SortMergeJoinExec` reads them: their
    // pipelines (a repartition, a sort) then run side by side.
    let partition = task.partition;
    trace::event(|| format!("sort-merge join p{partition}: collecting its inputs"));
    let collecting = task.metrics.collect_time.timer();
    let (left, right) = futures::try_join!(
        collect(
            task.left,
            &plan.left_schema,
            &task.reservation,
            plan.sort_on_device[0]
        ),
        collect(
            task.right,
            &plan.right_schema,
            &task.reservation,
            plan.sort_on_device[1]
        )
    )?;
    collecting.done();
    let (left, right) = match (left, right) {
        (Side::Arrived(left), Side::Arrived(right)) => (left, right),
        (left, right) => {
            // The memory pool cannot hold both sides: DataFusion's join,
            // with the sorts it needs (which spill), reads them from the
            // batches read on, with this node's reservation released.
            // Nothing has left the partition yet.
            trace::event(|| format!("sort-merge join p{partition}: inputs refused by the pool"));
            task.reservation.free();
            task.metrics.cpu_fallback_partitions.add(1);
            task.metrics.memory_pool_fallback_partitions.add(1);
            let sources = [
                left.into_source(&plan.left_schema)?,
                right.into_source(&plan.right_schema)?,
            ];
            let stream = cpu_join_over(&plan, sources, &task.context)?;
            let stream = match &plan.aggregate {
                Some(aggregate) => aggregate.over_rows(stream),
                None => stream,
            };
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&task.output_schema),
                stream,
            )));
        }
    };
    task.metrics.left_rows.add(left.num_rows());
    task.metrics.right_rows.add(right.num_rows());
    trace::event(|| {
        format!(
            "sort-merge join p{partition}: inputs collected ({} and {} rows)",
            left.num_rows(),
            right.num_rows()
        )
    });

    let (sender, receiver) = mpsc::channel::<Result<RecordBatch>>(CHANNEL_BATCHES);
    let device_part = DeviceMergeJoin {
        plan: Arc::clone(&plan),
        partition,
        device: Arc::clone(&task.device),
        max_output_pairs: task.max_output_pairs.max(1),
        memory_fraction: task.memory_fraction,
        max_concurrent_tasks: task.max_concurrent_tasks,
        device_errors: task.device_errors,
        metrics: task.metrics.clone(),
    };
    let device_task = {
        let (left, right) = (Arc::clone(&left), Arc::clone(&right));
        SpawnedTask::spawn_blocking(move || device_part.join(&left, &right, sender))
    };
    let metrics = task.metrics.clone();
    let output = receiver.map(move |batch| batch.map(|b| b.record_output(&metrics.baseline)));
    let (context, output_schema) = (task.context, Arc::clone(&task.output_schema));
    let reservation = task.reservation;
    let metrics = task.metrics;
    let after = futures::stream::once(async move {
        let outcome: Outcome = device_task.join().await.map_err(|e| {
            DataFusionError::Execution(format!("GPU sort-merge join task failed: {e}"))
        })??;
        trace::event(|| format!("sort-merge join p{partition}: device task joined"));
        match outcome {
            Outcome::Done => {
                metrics.baseline.done();
                // The inputs, with the reservation that accounts for them,
                // are dropped while the answer goes on (see `release`).
                release_in_background((left, right, reservation));
                Ok::<_, DataFusionError>(Box::pin(RecordBatchStreamAdapter::new(
                    output_schema,
                    futures::stream::empty(),
                )) as SendableRecordBatchStream)
            }
            Outcome::OnCpu => {
                metrics.cpu_fallback_partitions.add(1);
                let stream = cpu_join(&plan, left, right, &context)?;
                let stream = match &plan.aggregate {
                    Some(aggregate) => aggregate.over_rows(stream),
                    None => stream,
                };
                // The collected inputs stay reserved until the CPU
                // operator's stream, which reads them, is dropped.
                Ok(Box::pin(RecordBatchStreamAdapter::new(
                    output_schema,
                    stream.inspect(move |_| {
                        let _ = &reservation;
                    }),
                )) as SendableRecordBatchStream)
            }
        }
    })
    .try_flatten();
    Ok(Box::pin(RecordBatchStreamAdapter::new(
        Arc::clone(&task.output_schema),
        output.chain(after),
    )))
}

/// DataFusion's `SortMergeJoinExec` over the collected inputs, with the
/// sorts this node absorbed.
fn cpu_join(
    plan: &MergeJoinPlan,
    left: Arc<ArrivedBatches>,
    right: Arc<ArrivedBatches>,
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let sources = [
        Side::Arrived(left).into_source(&plan.left_schema)?,
        Side::Arrived(right).into_source(&plan.right_schema)?,
    ];
    cpu_join_over(plan, sources, context)
}

/// DataFusion's `SortMergeJoinExec` over the scans `sources` of its two
/// sides, each under the sort this node absorbed where it did.
fn cpu_join_over(
    plan: &MergeJoinPlan,
    sources: [Arc<dyn ExecutionPlan>; 2],
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let children = plan.cpu_join.children();
    let mut inputs = Vec::with_capacity(2);
    for (side, source) in sources.into_iter().enumerate() {
        inputs.push(if plan.sort_on_device[side] {
            // The absorbed SortExec, over the collected input.
            #[allow(deprecated)]
            Arc::clone(children[side]).with_new_children(vec![source])?
        } else {
            source
        });
    }
    #[allow(deprecated)]
    let mut join = Arc::clone(&plan.cpu_join).with_new_children(inputs)?;
    if let Some(exprs) = &plan.cpu_projection {
        join = Arc::new(ProjectionExec::try_new(exprs.clone(), join)?);
    }
    join.execute(0, Arc::clone(context))
}

/// The blocking part of one partition.
struct DeviceMergeJoin {
    plan: Arc<MergeJoinPlan>,
    partition: usize,
    device: Arc<GpuDevice>,
    max_output_pairs: usize,
    memory_fraction: f64,
    max_concurrent_tasks: usize,
    device_errors: DeviceErrorPolicy,
    metrics: GpuSortMergeJoinMetrics,
}

/// Both sides sorted on the device, and the columns gathered there.
struct SortedSides {
    streamed: SortedSide,
    other: SortedSide,
    /// Per side, its columns on the device, where pairs are gathered there.
    device_columns: Option<(ResidentColumns, ResidentColumns)>,
}

/// Hands the join's output on: its rows to the consumer or, where the
/// join computes an aggregation, into the aggregation's states, which go to
/// the consumer at the end.
struct Sender {
    channel: mpsc::Sender<Result<RecordBatch>>,
    /// Whether the consumer has had a batch (the join can no longer fall
    /// back to the CPU then).
    sent_any: bool,
    partial: Option<PartialStates>,
}

impl Sender {
    /// Hands output rows on; `Ok(false)` once the consumer has gone (the
    /// query was cancelled or finished early), which stops the work.
    fn send(&mut self, batches: Vec<RecordBatch>) -> Result<bool> {
        match &mut self.partial {
            Some(partial) => {
                for batch in &batches {
                    partial.update(batch)?;
                }
                Ok(true)
            }
            None => Ok(self.send_to_consumer(batches)),
        }
    }

    /// Merges the device's reduction of `pairs` pairs into the states.
    fn merge_device(&mut self, words: &[u64], pairs: usize) -> Result<()> {
        match &mut self.partial {
            Some(partial) => partial.merge_device(words, pairs),
            None => Err(DataFusionError::Internal(
                "pairs reduced on the device without an aggregation".into(),
            )),
        }
    }

    /// Sends the aggregation's states, once every pair is in them.
    fn finish(&mut self) -> Result<()> {
        if let Some(partial) = &mut self.partial {
            let states = partial.finish()?;
            self.send_to_consumer(vec![states]);
        }
        Ok(())
    }

    fn send_to_consumer(&mut self, batches: Vec<RecordBatch>) -> bool {
        for batch in batches {
            self.sent_any = true;
            if futures::executor::block_on(self.channel.send(Ok(batch))).is_err() {
                return false;
            }
        }
        true
    }
}

impl DeviceMergeJoin {
    fn join(
        &self,
        left: &ArrivedBatches,
        right: &ArrivedBatches,
        channel: mpsc::Sender<Result<RecordBatch>>,
    ) -> Result<Outcome> {
        let plan = &self.plan;
        let encoding = self.metrics.encode_time.timer();
        let Some((coding, left_codes, right_codes)) = self.code_keys(left, right)? else {
            // The keys' ranges need more than 64 bits together.
            return Ok(Outcome::OnCpu);
        };
        encoding.done();
        let partition = self.partition;
        trace::event(|| format!("sort-merge join p{partition}: keys ready for the device"));
        let left_streams = streams_left(plan.join_type);
        let (streamed, other) = if left_streams {
            (
                (left_codes, plan.sort_on_device[0]),
                (right_codes, plan.sort_on_device[1]),
            )
        } else {
            (
                (right_codes, plan.sort_on_device[1]),
                (left_codes, plan.sort_on_device[0]),
            )
        };
        let mut sender = Sender {
            channel,
            sent_any: false,
            partial: match &plan.aggregate {
                Some(aggregate) => Some(aggregate.start()?),
                None => None,
            },
        };
        let on_device = self.metrics.device_wall_time.timer();
        let outcome = match self.device_errors.inject {
            true => Err(DeviceFailure::Gpu(GpuError::Invalid(
                "a device error injected by the test options".into(),
            ))),
            false => self.on_device(left, right, coding, streamed, other, &mut sender),
        };
        on_device.done();
        trace::event(|| format!("sort-merge join p{partition}: device part done"));
        // Host compute: coding the keys and making the output (not the
        // device waits, nor waiting for the consumer).
        let host_ns = self.metrics.encode_time.value() + self.metrics.emit_time.value();
        self.metrics
            .baseline
            .elapsed_compute()
            .add_duration(std::time::Duration::from_nanos(host_ns as u64));
        match outcome {
            Ok(()) => {
                sender.finish()?;
                trace::event(|| format!("sort-merge join p{partition}: output handed on"));
                Ok(Outcome::Done)
            }
            Err(DeviceFailure::Gpu(e)) if !sender.sent_any && e.is_out_of_device_memory() => {
                Ok(Outcome::OnCpu)
            }
            // Nothing has left the partition: DataFusion's join takes the
            // inputs, and the error is traced and counted.
            Err(DeviceFailure::Gpu(e)) if !sender.sent_any && !self.device_errors.fail => {
                trace::event(|| format!("sort-merge join p{partition}: device error: {e}"));
                self.metrics.device_error_fallback_partitions.add(1);
                Ok(Outcome::OnCpu)
            }
            Err(DeviceFailure::Gpu(e)) => Err(e.into()),
            Err(DeviceFailure::Host(e)) => Err(e),
        }
    }

    /// Both sides' keys as they go to the device, and how their codes are
    /// made; `None` where the keys' ranges need more than 64 bits
    /// together. Raw 8-byte keys without NULLs go to the device as they
    /// are, and the device codes them; other keys are coded here. (Both
    /// sides' key values must be of the planned type: the device reads
    /// their bits.) A side the plan says arrives sorted must be.
    fn code_keys(
        &self,
        left: &ArrivedBatches,
        right: &ArrivedBatches,
    ) -> Result<Option<(KeyCoding, SideKeys, SideKeys)>> {
        let plan = &self.plan;
        // Per key, its values batch by batch.
        let left_keys = left.key_pieces(&plan.left_on)?;
        let right_keys = right.key_pieces(&plan.right_on)?;
        let threads = plan.host_threads;
        let planned_type = |keys: &[Vec<ArrayRef>]| {
            keys.iter()
                .zip(&plan.key_types)
                .all(|(pieces, t)| pieces.iter().all(|piece| piece.data_type() == t))
        };
        let no_nulls = |keys: &[Vec<ArrayRef>]| {
            keys.iter()
                .all(|pieces| pieces.iter().all(|piece| piece.logical_null_count() == 0))
        };
        // Where the device sorts both sides too, it also finds their value
        // range, which spares the host a pass over the keys.
        let range_on_device = match (plan.key_types.as_slice(), plan.sort_on_device) {
            ([key_type], [true, true]) => raw_word_flip(key_type).filter(|_| {
                planned_type(&left_keys)
                    && planned_type(&right_keys)
                    && no_nulls(&left_keys)
                    && no_nulls(&right_keys)
            }),
            _ => None,
        };
        let (coding, left_codes, right_codes) = match range_on_device {
            Some(flip) => (
                KeyCoding::RangeOnDevice { flip },
                SideKeys::raw(&left_keys),
                SideKeys::raw(&right_keys),
            ),
            None => {
                let Some(encoder) = OrderedKeyEncoder::for_side_pieces(
                    &plan.key_types,
                    &plan.sort_options,
                    plan.null_equality,
                    &left_keys,
                    &right_keys,
                    threads,
                )?
                else {
                    return Ok(None);
                };
                let transform = encoder
                    .device_transform(&plan.key_types)
                    .filter(|_| planned_type(&left_keys) && planned_type(&right_keys));
                let left_codes = SideKeys::new(
                    &encoder,
                    transform,
                    (left, &plan.left_on, &left_keys),
                    KeySide::Left,
                    threads,
                )?;
                let right_codes = SideKeys::new(
                    &encoder,
                    transform,
                    (right, &plan.right_on, &right_keys),
                    KeySide::Right,
                    threads,
                )?;
                let coding = KeyCoding::Known {
                    bits: encoder.bits(),
                    transform,
                };
                (coding, left_codes, right_codes)
            }
        };
        drop((left_keys, right_keys));
        let transform = match coding {
            KeyCoding::Known { transform, .. } => transform,
            KeyCoding::RangeOnDevice { .. } => None,
        };
        for (side, codes) in [&left_codes, &right_codes].into_iter().enumerate() {
            if !plan.sort_on_device[side] && !codes.ascending(transform) {
                return Err(DataFusionError::Internal(format!(
                    "the {} input of a GPU sort-merge join is not sorted on its keys as the plan says",
                    ["left", "right"][side]
                )));
            }
        }
        Ok(Some((coding, left_codes, right_codes)))
    }

    /// Sends one range of pairs whose every output row is a pair: their
    /// columns gathered on the device, or, with an aggregation whose columns
    /// are all there, its reductions over them. The outer error is the
    /// device's; the inner result the host's, `false` once the consumer has
    /// gone.
    #[allow(clippy::too_many_arguments)]
    fn send_gathered(
        &self,
        stream: &Arc<DeviceStream>,
        streamed: &SortedSide,
        (left, right): (&ArrivedBatches, &ArrivedBatches),
        (left_columns, right_columns): (&ResidentColumns, &ResidentColumns),
        pairs: DevicePairs<'_>,
        timer: &mut PhaseTimer,
        sender: &mut Sender,
    ) -> GpuResult<Result<bool>> {
        let (device, plan, partition) = (&self.device, &self.plan, self.partition);
        // An inner join streams its left side: the pairs' positions in key
        // order map to left rows.
        let left_ids = timer.time(Phase::Kernel, || {
            gather::gather_u64(
                device,
                stream,
                &streamed.row_ids,
                pairs.positions,
                pairs.len,
            )
        })?;
        let left_side = GatherSide {
            batch: left,
            resident: left_columns,
            ids: &left_ids,
        };
        let right_side = GatherSide {
            batch: right,
            resident: right_columns,
            ids: pairs.other_ids,
        };
        // An aggregation's columns reduced on the device, where they are
        // all there.
        let reduced = match plan.aggregate.as_deref() {
            Some(aggregate) => reduce_pairs(
                device,
                stream,
                aggregate.reductions(),
                plan.output.sources(),
                &left_side,
                &right_side,
                pairs.len,
                timer,
            )?,
            None => None,
        };
        Ok(match reduced {
            Some(words) => {
                let len = pairs.len;
                trace::event(|| format!("sort-merge join p{partition}: {len} pairs reduced"));
                self.metrics.rows_aggregated_on_device.add(pairs.len);
                sender.merge_device(&words, pairs.len).map(|()| true)
            }
            None => gather_batches(
                device,
                stream,
                &plan.output,
                &left_side,
                &right_side,
                pairs.len,
                plan.host_threads,
                timer,
            )?
            .and_then(|batches| sender.send(batches)),
        })
    }
}
