//! The plan node.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{OrderingRequirements, PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{apply_expression_roots, EmissionType};
use datafusion::physical_plan::joins::SortMergeJoinExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements,
    Partitioning, PlanProperties, SendableRecordBatchStream, Statistics, StatisticsArgs,
};

use super::stream::{merge_join_stream, MergeJoinPlan, MergeJoinTask};
use crate::exec::collect::{merge_to_read_through, WholeInput};
use crate::exec::join::OutputAssembler;
use crate::exec::join::pair_aggregate::{check_join_emits_pairs, PairAggregate};
use crate::exec::GpuSortMergeJoinMetrics;
use crate::config::GpuOptions;

/// A merge-path sort-merge join on the GPU, in place of the
/// [`SortMergeJoinExec`] it was made from, with the same output schema,
/// partitioning and output ordering, so nodes above that rely on the order
/// stay correct (or, with a projection of plain columns absorbed from
/// above, those of that `ProjectionExec`). Where DataFusion sorted an input
/// just for the join (a
/// `SortExec` on exactly the join keys below it), that sort is absorbed and
/// done on the device; an input that arrives sorted is merged as it is.
///
/// Supported (what [`crate::gpu_decisions`] reports as GPU): every join
/// type, both NULL equalities, residual filters (on the host, per bounded
/// range of pairs), keys of integer, date, time, timestamp, duration,
/// Decimal128 and Boolean columns, one or several.
pub struct GpuSortMergeJoinExec {
    /// The replaced node, over the absorbed `SortExec`s where there were.
    cpu_join: Arc<dyn ExecutionPlan>,
    /// Per side (left, right): whether its `SortExec` was absorbed.
    sort_on_device: [bool; 2],
    /// What this node reads: the replaced node's children, or the inputs of
    /// the absorbed sorts.
    inputs: [Arc<dyn ExecutionPlan>; 2],
    /// Planned in place of a `HashJoinExec` whose output was sorted on the
    /// join keys right after (the merge's own output order).
    in_place_of_hash_join: bool,
    /// Planned over all input partitions, in place of the CPU hash
    /// repartitions DataFusion put below the replaced join.
    repartitions_removed: bool,
    /// The columns of the join's output this node emits, absorbed from a
    /// `ProjectionExec` of plain columns above it: only those columns are
    /// copied to the device, gathered and copied back.
    projection: Option<AbsorbedProjection>,
    /// The join's own output (after `projection`).
    properties: Arc<PlanProperties>,
    /// The partial aggregation above the join that this node computes from
    /// the pairs, emitting its states in place of the join's rows.
    aggregate: Option<FusedAggregate>,
    metrics: ExecutionPlanMetricsSet,
}

/// A partial aggregation computed by the join, and the node's properties
/// with it: the aggregation's, over as many partitions as the join has.
#[derive(Debug, Clone)]
struct FusedAggregate {
    pair_aggregate: Arc<PairAggregate>,
    properties: Arc<PlanProperties>,
}

impl GpuSortMergeJoinExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions.
    pub const ALGORITHM: &'static str = "merge_path_sort_merge_join";

    /// Wraps `cpu_join`, a [`SortMergeJoinExec`] the rule places on the GPU
    /// (see [`crate::gpu_decisions`]). Where `sort_on_device`
    /// says so, that side's child must be a `SortExec`, which this node
    /// replaces by a sort on the device.
    pub fn try_new(cpu_join: Arc<dyn ExecutionPlan>, sort_on_device: [bool; 2]) -> Result<Self> {
        let join = cpu_join
            .downcast_ref::<SortMergeJoinExec>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "GpuSortMergeJoinExec made from {}",
                    cpu_join.name()
                ))
            })?;
        let children = [join.left(), join.right()];
        let mut inputs = Vec::with_capacity(2);
        for (side, child) in children.into_iter().enumerate() {
            inputs.push(if sort_on_device[side] {
                let sort = child.downcast_ref::<SortExec>().ok_or_else(|| {
                    DataFusionError::Internal(format!(
                        "a GPU sort-merge join absorbs a SortExec, not {}",
                        child.name()
                    ))
                })?;
                Arc::clone(sort.input())
            } else {
                Arc::clone(child)
            });
        }
        let inputs: [Arc<dyn ExecutionPlan>; 2] = inputs.try_into().expect("two sides");
        // Every output row is known only once both inputs are collected.
        let properties = join
            .properties()
            .as_ref()
            .clone()
            .with_emission_type(EmissionType::Final);
        Ok(Self {
            cpu_join,
            sort_on_device,
            inputs,
            in_place_of_hash_join: false,
            repartitions_removed: false,
            projection: None,
            properties: Arc::new(properties),
            aggregate: None,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Marks this join as planned in place of a `HashJoinExec` whose output
    /// was sorted on the join keys (see `gpu.tuning.sort_merge_join_for_order`).
    pub fn with_in_place_of_hash_join(mut self, in_place: bool) -> Self {
        self.in_place_of_hash_join = in_place;
        self
    }

    /// Marks this join as planned over all input partitions, without the
    /// CPU hash repartitions below the replaced join (see
    /// `gpu.tuning.merge_partitions`).
    pub fn with_repartitions_removed(mut self, removed: bool) -> Self {
        self.repartitions_removed = removed;
        self
    }

    /// This join emitting only what `exprs` (plain columns of the join's
    /// output, under any names) pick: the node then stands for a
    /// `ProjectionExec` of `exprs` over it, with that node's schema and
    /// properties. `None` where an expression is not a column of the
    /// join's output, or where the join already has a projection.
    pub fn with_projection(&self, exprs: Vec<ProjectionExpr>) -> Result<Option<Self>> {
        if self.projection.is_some() || self.aggregate.is_some() {
            return Ok(None);
        }
        let join_fields = self.cpu_join.schema().fields().len();
        let mut columns = Vec::with_capacity(exprs.len());
        for expr in &exprs {
            match expr.expr.downcast_ref::<Column>() {
                Some(column) if column.index() < join_fields => columns.push(column.index()),
                _ => return Ok(None),
            }
        }
        let join = self.without_projection();
        let projected =
            ProjectionExec::try_new(exprs.clone(), Arc::new(join.without_projection()))?;
        let properties = projected
            .properties()
            .as_ref()
            .clone()
            .with_emission_type(EmissionType::Final);
        Ok(Some(Self {
            projection: Some(AbsorbedProjection { exprs, columns }),
            properties: Arc::new(properties),
            ..join
        }))
    }

    /// This join computing `aggregate`, the `AggregateExec` above it
    /// (`Partial`, without `GROUP BY`; directly above, or above a round
    /// robin over this join), from its pairs: the node then emits the
    /// aggregation's partial states, one row per partition. An error where
    /// the join or the aggregation does not allow it: only an inner join
    /// without a residual filter emits a row per pair, and only `COUNT`,
    /// `SUM`, `MIN` and `MAX` of columns the device reduces are computed.
    pub fn with_partial_aggregate(
        &self,
        aggregate: Arc<dyn ExecutionPlan>,
        deterministic_float_sums: bool,
    ) -> Result<Self> {
        let join = self.sort_merge_join();
        if self.aggregate.is_some() {
            return Err(DataFusionError::Plan(
                "the join computes an aggregation already".into(),
            ));
        }
        check_join_emits_pairs(join.join_type(), join.filter().is_some())?;
        let over_this_join = aggregate
            .children()
            .first()
            .is_some_and(|input| input.schema() == self.join_schema());
        if !over_this_join {
            return Err(DataFusionError::Plan(
                "the aggregation is not above this join".into(),
            ));
        }
        let pair_aggregate = PairAggregate::try_new(&aggregate, deterministic_float_sums)
            .map_err(DataFusionError::Plan)?;
        self.rebuilt(Arc::clone(&self.cpu_join))?
            .with_pair_aggregate(&pair_aggregate)
    }

    /// This node computing `aggregate`, re-planned over a copy of itself.
    fn with_pair_aggregate(mut self, aggregate: &PairAggregate) -> Result<Self> {
        let join: Arc<dyn ExecutionPlan> = Arc::new(self.rebuilt(Arc::clone(&self.cpu_join))?);
        let partitions = self.properties.output_partitioning().partition_count();
        let pair_aggregate = Arc::new(aggregate.over(join)?);
        let properties = pair_aggregate
            .aggregate()
            .properties()
            .as_ref()
            .clone()
            .with_partitioning(Partitioning::UnknownPartitioning(partitions))
            .with_emission_type(EmissionType::Final);
        self.aggregate = Some(FusedAggregate {
            pair_aggregate,
            properties: Arc::new(properties),
        });
        Ok(self)
    }

    /// The aggregate functions this node computes from its pairs, as
    /// `EXPLAIN` shows them; `None` when it emits the join's rows.
    pub fn partial_aggregate(&self) -> Option<String> {
        self.aggregate
            .as_ref()
            .map(|a| a.pair_aggregate.functions_text())
    }

    /// The `AggregateExec` this node computes from its pairs, if any.
    pub(crate) fn partial_aggregate_node(&self) -> Option<&Arc<dyn ExecutionPlan>> {
        self.aggregate
            .as_ref()
            .map(|a| a.pair_aggregate.aggregate())
    }

    /// The schema of the join's own rows (what an aggregation computed in
    /// the join reads).
    fn join_schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        Arc::clone(self.properties.eq_properties.schema())
    }

    /// This node without its absorbed projection (the join's own output).
    fn without_projection(&self) -> Self {
        Self {
            cpu_join: Arc::clone(&self.cpu_join),
            sort_on_device: self.sort_on_device,
            inputs: self.inputs.clone(),
            in_place_of_hash_join: self.in_place_of_hash_join,
            repartitions_removed: self.repartitions_removed,
            projection: None,
            properties: Arc::new(
                self.cpu_join
                    .properties()
                    .as_ref()
                    .clone()
                    .with_emission_type(EmissionType::Final),
            ),
            aggregate: None,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The projection this node absorbed: the join output columns it
    /// emits, in order, and the expressions naming them.
    pub fn projection(&self) -> Option<&[ProjectionExpr]> {
        self.projection.as_ref().map(|p| p.exprs.as_slice())
    }

    /// This node rebuilt over `cpu_join` with the same marks, projection
    /// and aggregation.
    fn rebuilt(&self, cpu_join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let join = Self::try_new(cpu_join, self.sort_on_device)?
            .with_in_place_of_hash_join(self.in_place_of_hash_join)
            .with_repartitions_removed(self.repartitions_removed);
        let join = match &self.projection {
            None => join,
            Some(projection) => {
                join.with_projection(projection.exprs.clone())?
                    .ok_or_else(|| {
                        DataFusionError::Internal(
                            "a GPU sort-merge join's projection no longer fits its join"
                                .to_string(),
                        )
                    })?
            }
        };
        match &self.aggregate {
            None => Ok(join),
            Some(aggregate) => join.with_pair_aggregate(&aggregate.pair_aggregate),
        }
    }

    /// Whether this join runs over all input partitions, without the CPU
    /// hash repartitions below the replaced join.
    pub fn repartitions_removed(&self) -> bool {
        self.repartitions_removed
    }

    /// Whether this join was planned in place of a `HashJoinExec`.
    pub fn in_place_of_hash_join(&self) -> bool {
        self.in_place_of_hash_join
    }

    /// The [`SortMergeJoinExec`] this node replaces, as the plan node it was.
    pub fn cpu_join(&self) -> &Arc<dyn ExecutionPlan> {
        &self.cpu_join
    }

    /// The [`SortMergeJoinExec`] this node replaces.
    pub fn sort_merge_join(&self) -> &SortMergeJoinExec {
        self.cpu_join
            .downcast_ref::<SortMergeJoinExec>()
            .expect("checked in try_new")
    }

    /// Per side (left, right): whether the device sorts it (the `SortExec`
    /// DataFusion planned was absorbed) or it arrives sorted.
    pub fn sort_on_device(&self) -> [bool; 2] {
        self.sort_on_device
    }

    /// `projection=[...]`, for `EXPLAIN`, where a projection was absorbed.
    fn projection_text(&self) -> Option<String> {
        let projection = self.projection.as_ref()?;
        let exprs: Vec<String> = projection.exprs.iter().map(|e| e.to_string()).collect();
        Some(format!("projection=[{}]", exprs.join(", ")))
    }

    /// The merge below `side` that this join reads through, where the
    /// device sorts that side: its input partitions are then read each in
    /// a task of its own, as the merge would read them, without the
    /// merge's hand-off of every batch to one consumer (the order the
    /// merge would give them in is lost, and the sort does not need it).
    fn merge_read_through(&self, side: usize) -> Option<&CoalescePartitionsExec> {
        if !self.sort_on_device[side] {
            return None;
        }
        merge_to_read_through(&self.inputs[side])
    }

    /// `side`'s input: one stream, one per partition of the merge it reads
    /// through, or the batches of a scan of batches in memory.
    fn execute_side(
        &self,
        side: usize,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> Result<WholeInput> {
        WholeInput::execute(
            &self.inputs[side],
            self.merge_read_through(side),
            partition,
            context,
        )
    }

    fn describe_sides(&self) -> String {
        let side = |sorted_here: bool| if sorted_here { "device" } else { "input" };
        let mut text = format!(
            "sort=[left: {}, right: {}]",
            side(self.sort_on_device[0]),
            side(self.sort_on_device[1])
        );
        let partitions = |side: usize| {
            self.merge_read_through(side).map(|merge| {
                merge
                    .input()
                    .properties()
                    .output_partitioning()
                    .partition_count()
            })
        };
        let (left, right) = (partitions(0), partitions(1));
        if left.is_some() || right.is_some() {
            let count = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
            text.push_str(&format!(
                ", reads_merge_inputs=[left: {}, right: {}]",
                count(left),
                count(right)
            ));
        }
        text
    }

    /// The statistics of the join's own rows.
    fn join_statistics(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let stats = self.cpu_join.statistics_from_inputs(input_stats, args)?;
        let Some(projection) = &self.projection else {
            return Ok(stats);
        };
        // `Statistics::project` panics on a column it lacks.
        let known = projection
            .columns
            .iter()
            .all(|&column| column < stats.column_statistics.len());
        Ok(Arc::new(match known {
            true => {
                let mut projected = Arc::unwrap_or_clone(stats).project(Some(&projection.columns));
                // The bytes of the columns kept, as `ProjectionExec` counts them.
                projected.calculate_total_byte_size(&self.join_schema());
                projected
            }
            false => Statistics::new_unknown(&self.join_schema()),
        }))
    }
}

/// A `ProjectionExec` of plain columns taken into the join.
#[derive(Debug, Clone)]
struct AbsorbedProjection {
    exprs: Vec<ProjectionExpr>,
    /// The join output column of each expression.
    columns: Vec<usize>,
}

impl fmt::Debug for GpuSortMergeJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuSortMergeJoinExec")
            .field("cpu_join", &self.cpu_join)
            .field("sort_on_device", &self.sort_on_device)
            .finish()
    }
}

impl DisplayAs for GpuSortMergeJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let join = self.sort_merge_join();
        let on = crate::exec::join_keys_text(join.on());
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "GpuSortMergeJoinExec: algorithm={}, join_type={}, on=[{on}], {}",
                    Self::ALGORITHM,
                    join.join_type(),
                    self.describe_sides()
                )?;
                if let Some(filter) = join.filter() {
                    write!(f, ", filter={}", filter.expression())?;
                }
                if join.null_equality() == NullEquality::NullEqualsNull {
                    write!(f, ", null_equality=NullEqualsNull")?;
                }
                if self.in_place_of_hash_join {
                    write!(f, ", in_place_of=HashJoinExec")?;
                }
                if self.repartitions_removed {
                    write!(f, ", cpu_repartitions=removed")?;
                }
                if let Some(projection) = self.projection_text() {
                    write!(f, ", {projection}")?;
                }
                if let Some(functions) = self.partial_aggregate() {
                    write!(f, ", partial_aggregate=[{functions}]")?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", Self::ALGORITHM)?;
                writeln!(f, "join_type={}", join.join_type())?;
                write!(f, "on={on}")?;
                if let Some(projection) = self.projection_text() {
                    write!(f, "\n{projection}")?;
                }
                if let Some(functions) = self.partial_aggregate() {
                    write!(f, "\npartial_aggregate=[{functions}]")?;
                }
                Ok(())
            }
        }
    }
}

impl ExecutionPlan for GpuSortMergeJoinExec {
    fn name(&self) -> &str {
        "GpuSortMergeJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        match &self.aggregate {
            Some(aggregate) => &aggregate.properties,
            None => &self.properties,
        }
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let join = self.sort_merge_join();
        let mut roots: Vec<PhysicalExprRef> = join
            .on()
            .iter()
            .flat_map(|(l, r)| [Arc::clone(l), Arc::clone(r)])
            .collect();
        roots.extend(
            join.filter()
                .as_ref()
                .map(|filter| Arc::clone(filter.expression())),
        );
        apply_expression_roots(roots, f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 2 {
            return Err(DataFusionError::Internal(format!(
                "GpuSortMergeJoinExec given {} children",
                children.len()
            )));
        }
        let join = self.sort_merge_join();
        let old = [join.left(), join.right()];
        let mut join_children = Vec::with_capacity(2);
        for (side, child) in children.into_iter().enumerate() {
            join_children.push(if self.sort_on_device[side] {
                // The absorbed sort, over the new input.
                #[allow(deprecated)]
                Arc::clone(old[side]).with_new_children(vec![child])?
            } else {
                child
            });
        }
        #[allow(deprecated)]
        let cpu_join = Arc::clone(&self.cpu_join).with_new_children(join_children)?;
        Ok(Arc::new(self.rebuilt(cpu_join)?))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let cpu_join = Arc::clone(&self.cpu_join).reset_state()?;
        Ok(Arc::new(self.rebuilt(cpu_join)?))
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu_join.input_distribution_requirements()
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        // A side this node sorts itself needs no order; the other must
        // arrive sorted, as the replaced join required.
        self.cpu_join
            .required_input_ordering()
            .into_iter()
            .zip(self.sort_on_device)
            .map(|(required, sorted_here)| if sorted_here { None } else { required })
            .collect()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.cpu_join
            .maintains_input_order()
            .into_iter()
            .zip(self.sort_on_device)
            .map(|(kept, sorted_here)| kept && !sorted_here && self.aggregate.is_none())
            .collect()
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.cpu_join.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // A sort keeps its input's statistics, so the inputs' statistics
        // are the replaced join's children's.
        let stats = self.join_statistics(input_stats, args)?;
        match &self.aggregate {
            Some(aggregate) => aggregate
                .pair_aggregate
                .aggregate()
                .statistics_from_inputs(&[stats], args),
            None => Ok(stats),
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
        let join = self.sort_merge_join();
        let options = GpuOptions::from_config(context.session_config().options());
        let device_errors = crate::config::device_error_policy(context.session_config().options());
        let partitions = self.properties().output_partitioning().partition_count();
        let device = crate::exec::node_device(partition, partitions, &options)?;
        let metrics = GpuSortMergeJoinMetrics::new(&self.metrics, partition);
        metrics.device.ran_on(&device);
        let left_schema = self.inputs[0].schema();
        let right_schema = self.inputs[1].schema();
        let key_types = join
            .on()
            .iter()
            .map(|(left, _)| left.data_type(&left_schema))
            .collect::<Result<Vec<_>>>()?;
        let plan = MergeJoinPlan {
            output: OutputAssembler::new(
                self.join_schema(),
                join.join_type(),
                self.projection.as_ref().map(|p| p.columns.as_slice()),
                left_schema.fields().len(),
                right_schema.fields().len(),
                context.session_config().batch_size(),
            ),
            left_on: join.on().iter().map(|(l, _)| Arc::clone(l)).collect(),
            right_on: join.on().iter().map(|(_, r)| Arc::clone(r)).collect(),
            left_schema,
            right_schema,
            key_types,
            sort_options: join.sort_options().to_vec(),
            null_equality: join.null_equality(),
            join_type: join.join_type(),
            filter: join.filter().clone(),
            sort_on_device: self.sort_on_device,
            host_threads: crate::host::copy::host_threads()
                / self
                    .properties
                    .output_partitioning()
                    .partition_count()
                    .max(1)
                + 1,
            cpu_join: Arc::clone(&self.cpu_join),
            cpu_projection: self.projection.as_ref().map(|p| p.exprs.clone()),
            aggregate: self
                .aggregate
                .as_ref()
                .map(|a| Arc::clone(&a.pair_aggregate)),
        };
        // Spillable: refused, the partition hands its inputs to DataFusion's
        // join, whose sorts spill; a fair pool caps it at its share so that
        // those sorts (its own or another partition's) find theirs.
        let reservation = MemoryConsumer::new(format!("GpuSortMergeJoinInput[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let task = MergeJoinTask {
            partition,
            left: self.execute_side(0, partition, &context)?,
            right: self.execute_side(1, partition, &context)?,
            plan: Arc::new(plan),
            output_schema: self.schema(),
            context,
            reservation,
            device,
            max_output_pairs: options.max_output_pairs,
            memory_fraction: options.memory_fraction,
            max_concurrent_tasks: options.max_concurrent_tasks,
            device_errors,
            metrics,
        };
        Ok(merge_join_stream(task))
    }
}
