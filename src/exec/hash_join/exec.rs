//! The plan node.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::apply_expression_roots;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::TryStreamExt;
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements,
    PlanProperties, SendableRecordBatchStream, Statistics, StatisticsArgs,
};

use super::build_side::{BuildGather, BuildSide, FoldedAggregation};
use super::probe_filter::{dynamic_filter_of, with_filter_of, ProbeFilterPublisher};
use super::probe_reader::{ProbeReader, ReadAheadLimit};
use crate::exec::join::output::OutputAssembler;
use crate::gpu::GpuDevice;
use super::stream::{
    host_probe_input, probe_rows_stream, probe_stream, JoinSemantics, ProbeInput, ProbeSpec,
};
use crate::exec::collect::{merge_inputs_in_groups, merge_to_read_through, WholeInput};
use crate::exec::join::device_gather::output_columns;
use crate::exec::join::matches::gathers_by_pair;
use crate::encode::keys::KeySpec;
use crate::host::once::OnceFut;
use crate::exec::join::pair_aggregate::{check_join_emits_pairs, PairAggregate};
use crate::exec::GpuJoinMetrics;
use crate::exec::join_keys::JoinKeyCollectorExec;
use crate::host::copy::host_threads;
use crate::config::GpuOptions;

/// A radix-partitioned hash join on the GPU, in place of the
/// [`HashJoinExec`] it was made from: same inputs, output schema, column
/// order, projection and partitioning. It does not keep the probe order, so
/// it is only placed where the join advertised no output ordering.
///
/// Supported (what [`crate::gpu_decisions`] reports as GPU): every join type,
/// both NULL equalities, the null-aware anti join, residual filters (on the
/// host, per bounded batch of candidates), a pushed-down fetch, keys of any
/// type the device can encode (not nested types), in `CollectLeft` and
/// `Partitioned` mode.
pub struct GpuHashJoinExec {
    /// The replaced node; its children are this node's children.
    cpu_join: Arc<dyn ExecutionPlan>,
    keys: KeySpec,
    properties: Arc<PlanProperties>,
    /// Whether rows leave in `HashJoinExec`'s order (where it can be seen
    /// above, and `gpu.preserve_order` is on).
    preserve_order: bool,
    /// The rule re-planned a `Partitioned` join in `CollectLeft` mode over
    /// the inputs of its CPU hash repartitions (shown by `EXPLAIN`).
    repartition_removed: bool,
    /// The partial aggregation above the join that this node computes from
    /// the pairs, emitting its states in place of the join's rows.
    aggregate: Option<Arc<PairAggregate>>,
    /// `CollectLeft`: the build side, collected once for all partitions.
    shared_build: Mutex<Option<OnceFut<BuildSide>>>,
    /// The end of DataFusion's dynamic filter this join publishes to its
    /// probe side's scan (made at the first `execute`; none where there is
    /// no filter or no scan reads it).
    probe_filter: OnceLock<Option<Arc<ProbeFilterPublisher>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuHashJoinExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions.
    pub const ALGORITHM: &'static str = "radix_partitioned_hash_join";

    /// Wraps `cpu_join`, which must be a [`HashJoinExec`] the rule places on
    /// the GPU (see [`crate::gpu_decisions`]).
    pub fn try_new(cpu_join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let join = cpu_join.downcast_ref::<HashJoinExec>().ok_or_else(|| {
            DataFusionError::Internal(format!("GpuHashJoinExec made from {}", cpu_join.name()))
        })?;
        let keys = crate::encode::keys::join_key_spec(join).map_err(DataFusionError::NotImplemented)?;
        let mut properties = join.properties().as_ref().clone();
        let mut eq_properties = properties.eq_properties.clone();
        eq_properties.clear_orderings();
        properties = properties.with_eq_properties(eq_properties);
        Ok(Self {
            keys,
            properties: Arc::new(properties),
            preserve_order: true,
            repartition_removed: false,
            aggregate: None,
            shared_build: Mutex::new(None),
            probe_filter: OnceLock::new(),
            metrics: ExecutionPlanMetricsSet::new(),
            cpu_join,
        })
    }

    /// Whether to emit rows in `HashJoinExec`'s order; the rule turns it off
    /// where no node above can observe that order (default: on).
    pub fn with_preserve_order(mut self, preserve_order: bool) -> Self {
        self.preserve_order = preserve_order;
        self
    }

    /// Whether rows leave in `HashJoinExec`'s order.
    pub fn preserves_order(&self) -> bool {
        self.preserve_order
    }

    /// Marks a join the rule re-planned over the inputs of the CPU hash
    /// repartitions it removed (default: not).
    pub fn with_repartition_removed(mut self, repartition_removed: bool) -> Self {
        self.repartition_removed = repartition_removed;
        self
    }

    /// Whether the rule removed the CPU hash repartitions below this join.
    pub fn repartition_removed(&self) -> bool {
        self.repartition_removed
    }

    /// This join computing `aggregate`, the `AggregateExec` right above it
    /// (`Partial`, without `GROUP BY`), from its pairs: the node then
    /// emits the aggregation's partial states, one row per partition, with
    /// the aggregation's schema and properties. An error where the join or
    /// the aggregation does not allow it: only an inner join without a
    /// residual filter or fetch emits a row per pair, and only `COUNT`,
    /// `SUM`, `MIN` and `MAX` of columns the device reduces are computed.
    pub fn with_partial_aggregate(
        self,
        aggregate: Arc<dyn ExecutionPlan>,
        deterministic_float_sums: bool,
    ) -> Result<Self> {
        let join = self.hash_join();
        check_join_emits_pairs(*join.join_type(), join.filter().is_some())?;
        if join.fetch().is_some() {
            return Err(DataFusionError::Plan(
                "a join with a fetch does not emit every pair".into(),
            ));
        }
        let over_this_join = aggregate
            .children()
            .first()
            .is_some_and(|input| input.schema() == self.cpu_join.schema());
        if !over_this_join {
            return Err(DataFusionError::Plan(
                "the aggregation is not directly above this join".into(),
            ));
        }
        let pair_aggregate = PairAggregate::try_new(&aggregate, deterministic_float_sums)
            .map_err(DataFusionError::Plan)?
            .over(Arc::clone(&self.cpu_join))?;
        Ok(self.with_pair_aggregate(Some(Arc::new(pair_aggregate))))
    }

    fn with_pair_aggregate(mut self, aggregate: Option<Arc<PairAggregate>>) -> Self {
        if let Some(aggregate) = &aggregate {
            self.properties = Arc::clone(aggregate.aggregate().properties());
            // The partial states' order is of no use above.
            self.preserve_order = false;
        }
        self.aggregate = aggregate;
        self
    }

    /// The aggregate functions this node computes from its pairs, as
    /// `EXPLAIN` shows them; `None` when it emits the join's rows.
    pub fn partial_aggregate(&self) -> Option<String> {
        self.aggregate.as_ref().map(|a| a.functions_text())
    }

    /// The `AggregateExec` this node computes from its pairs, if any.
    pub(crate) fn partial_aggregate_node(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.aggregate.as_ref().map(|a| a.aggregate())
    }

    /// A copy of this node (it holds no state until executed).
    pub(crate) fn remade_over_same_children(&self) -> Result<Self> {
        self.remade(Arc::clone(&self.cpu_join))
    }

    /// The same node over new children (`with_new_children`, `reset_state`).
    fn remade(&self, cpu_join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let aggregate = match &self.aggregate {
            Some(aggregate) => Some(Arc::new(aggregate.over(Arc::clone(&cpu_join))?)),
            None => None,
        };
        Ok(Self::try_new(cpu_join)?
            .with_preserve_order(self.preserve_order)
            .with_repartition_removed(self.repartition_removed)
            .with_pair_aggregate(aggregate))
    }

    /// The [`HashJoinExec`] this node replaces, as the plan node it was.
    pub fn cpu_join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.cpu_join
    }

    /// The [`HashJoinExec`] this node replaces.
    pub fn hash_join(&self) -> &HashJoinExec {
        self.cpu_join
            .downcast_ref::<HashJoinExec>()
            .expect("checked in try_new")
    }

    /// The merge below a build side collected once for all partitions,
    /// whose input partitions the join reads itself, each in a task of its
    /// own.
    fn build_merge_read_through(&self) -> Option<&CoalescePartitionsExec> {
        let join = self.hash_join();
        merge_to_read_through(join.left())
            .filter(|_| *join.partition_mode() == PartitionMode::CollectLeft)
    }

    /// The merge below a probe side read as one partition, whose input
    /// partitions the join reads itself, each in a task of its own (see
    /// [`Self::with_probe_merged`]).
    fn probe_merge_read_through(&self) -> Option<&CoalescePartitionsExec> {
        let join = self.hash_join();
        merge_to_read_through(join.right())
            .filter(|_| *join.partition_mode() == PartitionMode::CollectLeft)
    }

    /// This `CollectLeft` join with its probe partitions merged into one,
    /// which the join reads itself (each input partition in a task of its
    /// own, handed on in groups of batches): one output partition, whose
    /// chunks hold the rows of every probe partition. Each chunk's kernels
    /// build every partition's shared-memory table from the whole build
    /// side, so one probe partition in place of many builds them that many
    /// times fewer (with many probe partitions against a large build side,
    /// the repeated builds are a large share of the query). Meant for a join
    /// that computes an aggregation, which hands no rows on to operators
    /// above that would lose their parallelism. `None` where the join is not
    /// `CollectLeft` or reads one probe partition already.
    pub(crate) fn with_probe_merged(&self) -> Result<Option<Self>> {
        let join = self.hash_join();
        let probe = join.right();
        if *join.partition_mode() != PartitionMode::CollectLeft
            || probe.properties().output_partitioning().partition_count() <= 1
        {
            return Ok(None);
        }
        let merged_probe: Arc<dyn ExecutionPlan> =
            Arc::new(CoalescePartitionsExec::new(Arc::clone(probe)));
        let merged = join
            .builder()
            .with_new_children(vec![Arc::clone(join.left()), merged_probe])?
            .recompute_properties()
            .reset_state()
            .build()?;
        let merged = with_filter_of(join, merged)?;
        // Rows of several partitions arrive in no fixed order.
        Ok(Some(
            self.remade(Arc::new(merged))?.with_preserve_order(false),
        ))
    }

    /// The publisher of the join's dynamic filter, shared by its partitions.
    fn probe_filter(&self, context: &TaskContext) -> Option<Arc<ProbeFilterPublisher>> {
        self.probe_filter
            .get_or_init(|| {
                ProbeFilterPublisher::for_join(self.hash_join(), context.session_config().options())
                    .map(Arc::new)
            })
            .clone()
    }

    fn build_side(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        options: &GpuOptions,
        gather: Option<BuildGather>,
        metrics: &GpuJoinMetrics,
    ) -> Result<OnceFut<BuildSide>> {
        let join = self.hash_join();
        let probe_filter = self.probe_filter(context);
        let collect = |input_partition: usize,
                       probe_partitions: usize,
                       consumer: String|
         -> Result<OnceFut<BuildSide>> {
            // A build side collected once for all partitions reads the
            // partitions of the merge below it itself.
            let inputs = WholeInput::execute(
                join.left(),
                self.build_merge_read_through(),
                input_partition,
                context,
            )?;
            let reservation = MemoryConsumer::new(consumer).register(context.memory_pool());
            Ok(OnceFut::new(BuildSide::collect(
                inputs,
                join.left().schema(),
                join.on().iter().map(|(left, _)| Arc::clone(left)).collect(),
                self.keys.clone(),
                *join.join_type(),
                probe_partitions,
                options.tuning.probe_chunk_rows,
                options.tuning.one_word_join_rows,
                reservation,
                gather.clone(),
                probe_filter.clone(),
                metrics.clone(),
            )))
        };
        match join.partition_mode() {
            PartitionMode::CollectLeft => {
                let mut shared = self.shared_build.lock().unwrap_or_else(|p| p.into_inner());
                if shared.is_none() {
                    let probe_partitions = join
                        .right()
                        .properties()
                        .output_partitioning()
                        .partition_count();
                    *shared = Some(collect(0, probe_partitions, "GpuHashJoinInput".into())?);
                }
                Ok(shared.clone().expect("set above"))
            }
            PartitionMode::Partitioned => {
                collect(partition, 1, format!("GpuHashJoinInput[{partition}]"))
            }
            PartitionMode::Auto => Err(DataFusionError::Internal(
                "GpuHashJoinExec in partition mode Auto".into(),
            )),
        }
    }
}

impl fmt::Debug for GpuHashJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuHashJoinExec")
            .field("cpu_join", &self.cpu_join)
            .finish()
    }
}

impl DisplayAs for GpuHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let join = self.hash_join();
        let on = crate::exec::join_keys_text(join.on());
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "GpuHashJoinExec: algorithm={}, mode={:?}, join_type={}, on=[{on}]",
                    Self::ALGORITHM,
                    join.partition_mode(),
                    join.join_type()
                )?;
                if let Some(filter) = join.filter() {
                    write!(f, ", filter={}", filter.expression())?;
                }
                if join.null_equality() == NullEquality::NullEqualsNull {
                    write!(f, ", null_equality=NullEqualsNull")?;
                }
                if join.null_aware {
                    write!(f, ", null_aware=true")?;
                }
                if let Some(projection) = &join.projection {
                    write!(f, ", projection={:?}", projection.as_ref())?;
                }
                if let Some(fetch) = join.fetch() {
                    write!(f, ", fetch={fetch}")?;
                }
                if self.preserve_order {
                    write!(f, ", row_order=hash_join_exec")?;
                }
                if self.repartition_removed {
                    write!(f, ", cpu_repartition=removed")?;
                }
                if let Some(functions) = self.partial_aggregate() {
                    write!(f, ", partial_aggregate=[{functions}]")?;
                }
                if let Some(merge) = self.build_merge_read_through() {
                    // The merge below is shown but not run.
                    let partitions = merge.input().properties().output_partitioning();
                    write!(
                        f,
                        ", build_reads_merge_inputs={}",
                        partitions.partition_count()
                    )?;
                }
                if let Some(merge) = self.probe_merge_read_through() {
                    let partitions = merge.input().properties().output_partitioning();
                    write!(
                        f,
                        ", probe_reads_merge_inputs={}",
                        partitions.partition_count()
                    )?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", Self::ALGORITHM)?;
                writeln!(f, "join_type={}", join.join_type())?;
                if let Some(functions) = self.partial_aggregate() {
                    writeln!(f, "partial_aggregate=[{functions}]")?;
                }
                write!(f, "on={on}")
            }
        }
    }
}

impl ExecutionPlan for GpuHashJoinExec {
    fn name(&self) -> &str {
        "GpuHashJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.cpu_join.children()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let join = self.hash_join();
        let mut roots: Vec<PhysicalExprRef> = join
            .on()
            .iter()
            .flat_map(|(l, r)| [Arc::clone(l), Arc::clone(r)])
            .collect();
        roots.extend(join.filter().map(|filter| Arc::clone(filter.expression())));
        roots.extend(self.dynamic_expressions_produced());
        apply_expression_roots(roots, f)
    }

    fn dynamic_expressions_produced(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        dynamic_filter_of(self.hash_join())
            .map(|filter| filter as Arc<dyn PhysicalExpr>)
            .into_iter()
            .collect()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        #[allow(deprecated)]
        let cpu_join = Arc::clone(&self.cpu_join).with_new_children(children)?;
        Ok(Arc::new(self.remade(cpu_join)?))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        // A fresh node forgets the collected build side, so a re-executed
        // plan (recursive queries) reads its inputs again.
        let cpu_join = Arc::clone(&self.cpu_join).reset_state()?;
        Ok(Arc::new(self.remade(cpu_join)?))
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu_join.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.cpu_join.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let join = self.cpu_join.statistics_from_inputs(input_stats, args)?;
        match &self.aggregate {
            Some(aggregate) => aggregate.aggregate().statistics_from_inputs(&[join], args),
            None => Ok(join),
        }
    }

    fn fetch(&self) -> Option<usize> {
        match self.aggregate {
            Some(_) => None,
            None => self.cpu_join.fetch(),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let spec = self.probe_spec(partition, &context, None)?;
        probe_stream(spec, self.schema())
    }
}

impl GpuHashJoinExec {
    /// Whether this join can keep its output on the device for a GPU join
    /// above: an inner join without a residual filter, a fetch or an
    /// aggregation, whose every output column is of 4, 8 or 16 bytes
    /// (gathered on the device where it has no NULLs), in no particular
    /// order.
    fn hands_on_device_rows(&self, options: &GpuOptions) -> bool {
        self.passes_rows_on_device(options)
            && self.hash_join().fetch().is_none()
            && self.schema().fields().iter().all(|field| {
                matches!(field.data_type().primitive_width(), Some(4 | 8 | 16))
            })
    }

    /// Whether this join probes with rows the GPU join below keeps on the
    /// device: it gathers its output there too (an inner join without a
    /// residual filter or an aggregation, in no particular order), on one
    /// key that is a plain column.
    fn takes_device_rows(&self, options: &GpuOptions) -> bool {
        let join = self.hash_join();
        let [(_, key)] = join.on() else {
            return false;
        };
        self.passes_rows_on_device(options)
            && !join.null_aware
            && key.downcast_ref::<datafusion::physical_expr::expressions::Column>().is_some()
    }

    /// What both joins of a handoff on the device need: the option on, an
    /// inner join without a residual filter (every pair an output row,
    /// gathered on the device), no aggregation in the join, no row order
    /// to keep.
    fn passes_rows_on_device(&self, options: &GpuOptions) -> bool {
        let join = self.hash_join();
        options.tuning.device_gather
            && options.tuning.device_rows_between_joins
            && gathers_by_pair(*join.join_type(), join.filter().is_some())
            && self.aggregate.is_none()
            && !(options.preserve_order && self.preserve_order)
    }

    /// The GPU hash join below this one on its probe side, where it keeps
    /// its output on the device for this one.
    fn device_rows_from(&self, options: &GpuOptions) -> Option<&GpuHashJoinExec> {
        let below = self.hash_join().right().downcast_ref::<GpuHashJoinExec>()?;
        (self.takes_device_rows(options) && below.hands_on_device_rows(options)).then_some(below)
    }

    /// One partition's output, run on `device` (the GPU join above's) as
    /// host batches and rows kept on the device for that join.
    fn execute_rows(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        device: Arc<GpuDevice>,
    ) -> Result<ProbeInput> {
        probe_rows_stream(self.probe_spec(partition, context, Some(device))?)
    }

    /// What one partition's probe loop needs; with `device_output`, run on
    /// that device, the output kept there for the GPU join above.
    fn probe_spec(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        device_output: Option<Arc<GpuDevice>>,
    ) -> Result<ProbeSpec> {
        let context = Arc::clone(context);
        let join = self.hash_join();
        let options = GpuOptions::from_config(context.session_config().options());
        let device_errors = crate::config::device_error_policy(context.session_config().options());
        let max_chunk_bytes = crate::config::max_probe_chunk_bytes(
            context.session_config().options(),
            super::stream::MAX_PROBE_CHUNK_BYTES,
        );
        let partitions = self.properties().output_partitioning().partition_count();
        // A join handing rows on runs where the join above does (a plan of
        // one partition takes devices in turn, node by node).
        let device = match &device_output {
            Some(device) => Arc::clone(device),
            None => crate::exec::node_device(partition, partitions, &options)?,
        };
        let metrics = GpuJoinMetrics::new(&self.metrics, partition);
        metrics.device.ran_on(&device);
        let (build_columns, probe_columns) = (
            join.left().schema().fields().len(),
            join.right().schema().fields().len(),
        );
        // The join's own rows, which a partial aggregation reads.
        let output = OutputAssembler::new(
            self.cpu_join.schema(),
            *join.join_type(),
            join.projection.as_deref(),
            build_columns,
            probe_columns,
            context.session_config().batch_size(),
        );
        let preserve_order = options.preserve_order && self.preserve_order;
        let gathered = (options.tuning.device_gather
            && gathers_by_pair(*join.join_type(), join.filter().is_some()))
        .then(|| output_columns(&output, build_columns, probe_columns))
        .flatten();
        // An aggregation needs on the device only the columns it reduces.
        let gathered = match &self.aggregate {
            Some(aggregate) => gathered
                .map(|(build, probe)| aggregate.columns_read(output.sources(), build, probe)),
            None => gathered,
        };
        let (build_gather, gather_probe_columns) = match gathered {
            Some((build, probe)) => (
                Some(BuildGather {
                    columns: build,
                    ordered: preserve_order,
                    folds: self
                        .aggregate
                        .as_ref()
                        .filter(|_| options.tuning.fold_while_probing && options.tuning.carry_folded_values)
                        .map(|aggregate| FoldedAggregation {
                            reductions: aggregate.reductions().to_vec(),
                            sources: output.sources().to_vec(),
                        }),
                }),
                Some(probe),
            ),
            None => (None, None),
        };
        // A probe side whose keys the build side's scan tests is executed
        // first: its partitions are read ahead of the join (their keys
        // gathered) while that scan waits for them.
        let mut probe_executed = match gathers_keys_for_build_side(join.right()) {
            true => Some(join.right().execute(partition, Arc::clone(&context))?),
            false => None,
        };
        let probe_read_by_gatherer = probe_executed.is_some();
        let build = self.build_side(partition, &context, &options, build_gather, &metrics)?;
        // A partition that reads the whole probe side does its host work on
        // every core; many partitions' chunks run at once otherwise.
        let (probe_input, host_threads) = match self.probe_merge_read_through() {
            // The readers start at once, unless the build side's keys are
            // to filter the probe side's scan: then once they have.
            Some(merge) => match self.probe_filter(&context) {
                None => (
                    host_probe_input(merge_inputs_in_groups(merge, &context)?),
                    host_threads(),
                ),
                Some(_) => (
                    host_probe_input(merge_inputs_after_build(
                        Arc::clone(join.right()),
                        &build,
                        &context,
                    )),
                    host_threads(),
                ),
            },
            None => match self.device_rows_from(&options) {
                Some(below) => (
                    below.execute_rows(partition, &context, Arc::clone(&device))?,
                    1,
                ),
                None => {
                    let probe = match probe_executed.take() {
                        Some(probe) => probe,
                        None => join.right().execute(partition, Arc::clone(&context))?,
                    };
                    (host_probe_input(probe), 1)
                }
            },
        };
        // A probe side its key gatherer reads ahead is not read ahead again,
        // nor one read through its merge (its readers start at once, or
        // once the build side is in where the join has a dynamic filter).
        let read_ahead = match probe_read_by_gatherer || self.probe_merge_read_through().is_some()
        {
            true => None,
            false => self.probe_read_ahead(partition, &context, &options, &metrics),
        };
        let spec = ProbeSpec {
            partition,
            build,
            probe: ProbeReader::new(probe_input, read_ahead),
            probe_schema: join.right().schema(),
            probe_on: join
                .on()
                .iter()
                .map(|(_, right)| Arc::clone(right))
                .collect(),
            semantics: JoinSemantics {
                join_type: *join.join_type(),
                filter: join.filter().cloned().map(Arc::new),
                null_aware: join.null_aware,
                fetch: join.fetch(),
                preserve_order,
                probe_ordered: join.right().properties().output_ordering().is_some(),
            },
            output,
            aggregate: self.aggregate.clone(),
            gather_probe_columns,
            device,
            options: Arc::new(options),
            device_errors,
            max_chunk_bytes,
            host_threads,
            metrics,
            device_output: device_output.map(|_| self.schema()),
        };
        Ok(spec)
    }
}

/// The most bytes of host batches the partitions of a GPU hash join's
/// probe side hold in all while its build side is collected
/// (`gpu.tuning.read_probe_ahead`).
const MAX_PROBE_READ_AHEAD: usize = 512 << 20;

impl GpuHashJoinExec {
    /// How far partition `partition` reads its probe input ahead while the
    /// build side is collected: its share of [`MAX_PROBE_READ_AHEAD`], where
    /// the session reads ahead and that loses nothing: no scan of the probe
    /// side prunes by the join's dynamic filter (it would be read before
    /// the filter is there), the memory pool is unbounded (the build side's
    /// batches are not refused for those read ahead; a pool that does not
    /// say is taken as bounded), the join has no limit (rows past it would
    /// be read for nothing), and a multi-threaded runtime runs the reads
    /// below the probe side beside the build side's.
    fn probe_read_ahead(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
        options: &GpuOptions,
        metrics: &GpuJoinMetrics,
    ) -> Option<ReadAheadLimit> {
        let join = self.hash_join();
        let pool = context.memory_pool();
        let reads_ahead = options.tuning.read_probe_ahead
            && join.fetch().is_none()
            && crate::exec::in_multi_threaded_runtime()
            && matches!(pool.memory_limit(), MemoryLimit::Infinite)
            && !self
                .probe_filter(context)
                .is_some_and(|filter| filter.prunes_the_probe_side(join.right()));
        if !reads_ahead {
            return None;
        }
        let partitions = self.properties().output_partitioning().partition_count();
        Some(ReadAheadLimit {
            max_bytes: MAX_PROBE_READ_AHEAD / partitions.max(1),
            reservation: MemoryConsumer::new(format!("GpuHashJoinExec[{partition}] read ahead"))
                .register(pool),
            rows: metrics.probe_rows_read_ahead.clone(),
        })
    }
}

/// Whether `probe` (a join's probe side) gathers its keys for the scan of
/// the join's build side (see [`crate::exec::join_keys`]).
fn gathers_keys_for_build_side(probe: &Arc<dyn ExecutionPlan>) -> bool {
    probe
        .downcast_ref::<JoinKeyCollectorExec>()
        .is_some_and(|collector| collector.keys().is_of_probe_side())
}

/// The probe partitions below `merge` (the join's probe input, a
/// [`CoalescePartitionsExec`]) read as [`merge_inputs_in_groups`] reads
/// them, started only once `build` is collected, so that the scans below
/// open their files with the dynamic filter the build side published.
fn merge_inputs_after_build(
    merge: Arc<dyn ExecutionPlan>,
    build: &OnceFut<BuildSide>,
    context: &Arc<TaskContext>,
) -> SendableRecordBatchStream {
    let (build, context, schema) = (build.clone(), Arc::clone(context), merge.schema());
    let started = futures::stream::once(async move {
        build.get().await?;
        let merge = merge_to_read_through(&merge).ok_or_else(|| {
            DataFusionError::Internal("the probe input is no merge to read through".into())
        })?;
        merge_inputs_in_groups(merge, &context)
    })
    .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, started))
}
