//! The plan node.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::aggregates::{
    aggregate_expressions, AggregateExec, AggregateOutputMode,
};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements,
    PlanProperties, SendableRecordBatchStream, Statistics, StatisticsArgs,
};

use super::spec::AggregateSpec;
use super::stream::{
    aggregate_stream, cached_input, reads_cache_if_asked, AggregateInputs, AggregateTask, CachedInput,
    InputStart,
};
use super::spec::GroupOrder;
use crate::exec::collect::{merge_to_read_through, WholeInput};
use crate::exec::GpuAggregateMetrics;
use crate::config::GpuOptions;

/// An aggregation on the GPU in place of the [`AggregateExec`] it was made
/// from: same input, mode, output schema and partitioning. It is only
/// placed where the aggregation advertised no output ordering. Groups
/// leave in no particular order (`algorithm=hash_group_by`: numbered in one
/// hash table, or in hash partitions sized to shared memory where a
/// sample of the keys estimates at least `gpu.tuning.min_groups_to_partition`
/// groups), or, where it
/// took the place of a sort on its group keys above it
/// ([`Self::with_group_order`]), in that sort's order
/// (`algorithm=sort_group_by`): the device then numbers the groups in key
/// order (sorting the rows where nearly every row is a group of its own,
/// else sorting the hash table's groups), and the sort above is gone.
///
/// Supported (what [`crate::gpu_decisions`] reports as GPU): every mode;
/// `COUNT`, `SUM`, `MIN`, `MAX`, `AVG` without DISTINCT, with or without
/// FILTER; group keys that pack into 64 bits (integers, dates, times,
/// timestamps, decimals, booleans, several columns), NULL as a group; the
/// aggregation without GROUP BY.
///
/// A filter of its groups (a `HAVING`, or any `FilterExec` the rule finds
/// above it, past repartitions) may run inside it
/// ([`Self::with_output_filter`]): each output batch is filtered as it is
/// made, on every core, and the groups it drops are never handed on.
pub struct GpuAggregateExec {
    /// The replaced node; its child is this node's child.
    cpu_aggregate: Arc<dyn ExecutionPlan>,
    spec: AggregateSpec,
    properties: Arc<PlanProperties>,
    /// DataFusion's partial aggregation, exchange and final aggregation,
    /// where the rule replaced them by this one (shown by `EXPLAIN`): the
    /// CPU fallback then runs them over the collected input, on every core.
    cpu_phases: Option<Arc<dyn ExecutionPlan>>,
    /// The order the groups leave in, where this node sorts them.
    group_order: Option<GroupOrder>,
    /// The filter of the groups this node runs, if any: DataFusion's
    /// `FilterExec` over the replaced aggregation (without a projection),
    /// whose predicate each output batch passes, and which the CPU
    /// fallback runs over DataFusion's aggregation.
    output_filter: Option<Arc<FilterExec>>,
    /// Whether it reads its table's columns from the device column cache,
    /// where its input is a whole table scan it can read so
    /// ([`Self::with_cached_input`]).
    reads_cache: bool,
    metrics: ExecutionPlanMetricsSet,
    /// The column cache's reads ([`GpuAggregateMetrics::cache`]).
    cache_metrics: ExecutionPlanMetricsSet,
}

impl GpuAggregateExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions, for groups
    /// in no particular order.
    pub const ALGORITHM: &'static str = "hash_group_by";
    /// The algorithm name for groups in key order.
    pub const SORTED_ALGORITHM: &'static str = "sort_group_by";

    /// Wraps `cpu_aggregate`, which must be an [`AggregateExec`] the rule
    /// places on the GPU (see [`crate::gpu_decisions`]).
    pub fn try_new(cpu_aggregate: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let agg = cpu_aggregate
            .downcast_ref::<AggregateExec>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "GpuAggregateExec made from {}",
                    cpu_aggregate.name()
                ))
            })?;
        let spec = AggregateSpec::try_new(agg).map_err(DataFusionError::NotImplemented)?;
        Ok(Self {
            spec,
            properties: Arc::clone(agg.properties()),
            cpu_phases: None,
            group_order: None,
            output_filter: None,
            reads_cache: false,
            metrics: ExecutionPlanMetricsSet::new(),
            cache_metrics: ExecutionPlanMetricsSet::new(),
            cpu_aggregate,
        })
    }

    /// This aggregation filtering its groups by `filter`'s predicate (a
    /// `FilterExec` whose input has this node's schema; its projection, if
    /// any, stays the caller's to make), or `None` where it cannot: the
    /// groups must leave as final values (not partial states), in no
    /// order of this node's making, and not filtered already; the filter
    /// must take no limit and make no column constant that its input did
    /// not (the plan above may have relied on that).
    pub fn with_output_filter(&self, filter: &FilterExec) -> Result<Option<Self>> {
        let final_output = self.aggregate().mode().output_mode() == AggregateOutputMode::Final;
        if !final_output
            || self.group_order.is_some()
            || self.output_filter.is_some()
            || filter.fetch().is_some()
            || filter.input().schema() != self.schema()
        {
            return Ok(None);
        }
        let constants = |plan: &dyn ExecutionPlan| plan.properties().eq_properties.constants().len();
        if constants(filter) != constants(filter.input().as_ref()) {
            return Ok(None);
        }
        let filter = Arc::new(filtered_groups(filter, &self.cpu_aggregate)?);
        let mut properties = filter.properties().as_ref().clone();
        properties.partitioning = self.properties.partitioning.clone();
        Ok(Some(Self {
            spec: self.spec.clone(),
            properties: Arc::new(properties),
            cpu_phases: self.cpu_phases.clone(),
            group_order: None,
            output_filter: Some(filter),
            reads_cache: self.reads_cache,
            metrics: ExecutionPlanMetricsSet::new(),
            cache_metrics: ExecutionPlanMetricsSet::new(),
            cpu_aggregate: Arc::clone(&self.cpu_aggregate),
        }))
    }

    /// The predicate of the groups this node keeps, if it filters them.
    pub fn output_filter(&self) -> Option<&Arc<dyn PhysicalExpr>> {
        self.output_filter.as_ref().map(|filter| filter.predicate())
    }

    /// This aggregation emitting its groups sorted by `ordering`, in place
    /// of a sort above it (per partition, as this node's partitions are),
    /// or `None` where it cannot: the ordering must name group key columns
    /// of the output, each once, and the group keys must have
    /// order-preserving codes (integers, dates, times, timestamps,
    /// decimals, booleans). Where the codes turn out to need more than 64
    /// bits, the node runs its CPU fallback and sorts that.
    pub fn with_group_order(&self, ordering: &LexOrdering) -> Result<Option<Self>> {
        let Some(key_spec) = &self.spec.keys else {
            return Ok(None);
        };
        if !key_spec.packable() || self.output_filter.is_some() {
            return Ok(None);
        }
        let group_count = key_spec.types().len();
        let schema = self.schema();
        let mut keys = Vec::with_capacity(group_count);
        let mut named = vec![false; group_count];
        for sort_expr in ordering.iter() {
            let Some(column) = sort_expr.expr.downcast_ref::<Column>() else {
                return Ok(None);
            };
            let index = column.index();
            let is_group_key = index < group_count
                && schema.field(index).name() == column.name()
                && !std::mem::replace(&mut named[index], true);
            if !is_group_key {
                return Ok(None);
            }
            keys.push((index, sort_expr.options));
        }
        keys.extend(
            (0..group_count)
                .filter(|&key| !named[key])
                .map(|key| (key, SortOptions::default())),
        );
        let order = GroupOrder {
            ordering: ordering.clone(),
            keys,
        };
        Ok(Some(Self {
            spec: self.spec.clone(),
            properties: Arc::new(ordered_properties(&self.properties, &order)?),
            cpu_phases: self.cpu_phases.clone(),
            group_order: Some(order),
            output_filter: None,
            reads_cache: false,
            metrics: ExecutionPlanMetricsSet::new(),
            cache_metrics: ExecutionPlanMetricsSet::new(),
            cpu_aggregate: Arc::clone(&self.cpu_aggregate),
        }))
    }

    /// This aggregation reading its table's columns from the device column
    /// cache on the device (no rows decoded, made words or copied over the
    /// bus once they are cached), or `None` where it cannot
    /// ([`cached_input`]: one partition of a whole table scan, one integer
    /// group key, columns and literals as arguments, groups in no order).
    /// Where a run cannot read them so (NULLs, a decimal beyond 64 bits, a
    /// sample showing few groups, too little device memory, a device
    /// failure), it reads its input as before. `EXPLAIN` shows it where the
    /// plan reads the cache; the session must also keep `gpu.cache` and
    /// `gpu.tuning.cached_gpu_inputs` on when it runs.
    pub fn with_cached_input(&self) -> Option<Self> {
        if self.group_order.is_some() {
            return None;
        }
        if !reads_cache_if_asked(self.aggregate(), &self.spec) {
            return None;
        }
        let mut node = self.rebuilt(Arc::clone(&self.cpu_aggregate), self.cpu_phases.clone()).ok()?;
        node.reads_cache = true;
        Some(node)
    }

    /// Whether it reads its table's columns from the column cache
    /// ([`Self::with_cached_input`]), as its input now stands.
    pub fn reads_cached_input(&self) -> bool {
        self.reads_cache
            && self.group_order.is_none()
            && reads_cache_if_asked(self.aggregate(), &self.spec)
    }

    fn cached_input(&self) -> Option<CachedInput> {
        match self.reads_cache && self.group_order.is_none() {
            true => cached_input(self.aggregate(), &self.spec),
            false => None,
        }
    }

    /// The sort this node does in place of one above it, if any.
    pub fn group_ordering(&self) -> Option<&LexOrdering> {
        self.group_order.as_ref().map(|order| &order.ordering)
    }

    /// The algorithm this node runs.
    pub fn algorithm(&self) -> &'static str {
        match self.group_order {
            Some(_) => Self::SORTED_ALGORITHM,
            None => Self::ALGORITHM,
        }
    }

    /// A node like this one over `cpu_aggregate` and `cpu_phases`.
    fn rebuilt(
        &self,
        cpu_aggregate: Arc<dyn ExecutionPlan>,
        cpu_phases: Option<Arc<dyn ExecutionPlan>>,
    ) -> Result<Self> {
        let mut node = Self::try_new(cpu_aggregate)?.with_cpu_phases(cpu_phases);
        node.reads_cache = self.reads_cache;
        if let Some(filter) = &self.output_filter {
            return node.with_output_filter(filter)?.ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "GpuAggregateExec can no longer filter its groups by {}",
                    filter.predicate()
                ))
            });
        }
        let Some(order) = &self.group_order else {
            return Ok(node);
        };
        node.with_group_order(&order.ordering)?.ok_or_else(|| {
            DataFusionError::Internal(format!(
                "GpuAggregateExec can no longer sort its groups by {}",
                order.ordering
            ))
        })
    }

    /// Marks an aggregation that replaced DataFusion's two phases,
    /// `cpu_phases` (a final aggregation over an exchange over a partial
    /// one, all DataFusion's), which its CPU fallback runs instead of the
    /// `Single` aggregation it was made from (default: none).
    pub fn with_cpu_phases(mut self, cpu_phases: Option<Arc<dyn ExecutionPlan>>) -> Self {
        self.cpu_phases = cpu_phases;
        self
    }

    /// Whether this aggregation replaced DataFusion's two phases.
    pub fn phases_merged(&self) -> bool {
        self.cpu_phases.is_some()
    }

    /// The merge below an aggregation that replaced DataFusion's two
    /// phases, whose input partitions it reads itself, each in a task of
    /// its own (the merge would, and hand each batch through a channel
    /// besides).
    fn merge_read_through(&self) -> Option<&CoalescePartitionsExec> {
        merge_to_read_through(self.aggregate().input()).filter(|_| self.phases_merged())
    }

    /// The [`AggregateExec`] this node replaces.
    pub fn aggregate(&self) -> &AggregateExec {
        self.cpu_aggregate
            .downcast_ref::<AggregateExec>()
            .expect("checked in try_new")
    }
}

impl fmt::Debug for GpuAggregateExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuAggregateExec")
            .field("cpu_aggregate", &self.cpu_aggregate)
            .finish()
    }
}

/// `filter` (without its projection) over `input`.
fn filtered_groups(filter: &FilterExec, input: &Arc<dyn ExecutionPlan>) -> Result<FilterExec> {
    FilterExecBuilder::from(filter)
        .with_input(Arc::clone(input))
        .apply_projection(None)?
        .build()
}

/// The aggregation's properties with its groups sorted by `order`.
fn ordered_properties(properties: &PlanProperties, order: &GroupOrder) -> Result<PlanProperties> {
    let mut eq_properties = properties.eq_properties.clone();
    eq_properties.reorder(order.ordering.clone())?;
    Ok(PlanProperties::new(
        eq_properties,
        properties.partitioning.clone(),
        EmissionType::Final,
        properties.boundedness,
    ))
}

/// `mode=..., gby=[...], aggr=[...]`, as `AggregateExec` shows them.
pub(crate) fn describe_aggregate(agg: &AggregateExec) -> String {
    let keys = agg
        .group_expr()
        .expr()
        .iter()
        .map(|(expr, name)| format!("{expr} as {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let aggregates = agg
        .aggr_expr()
        .iter()
        .map(|a| a.name().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!("mode={:?}, gby=[{keys}], aggr=[{aggregates}]", agg.mode())
}

impl DisplayAs for GpuAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let agg = self.aggregate();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "GpuAggregateExec: algorithm={}, {}",
                    self.algorithm(),
                    describe_aggregate(agg)
                )?;
                if let Some(ordering) = self.group_ordering() {
                    write!(f, ", order=[{ordering}]")?;
                }
                if let Some(predicate) = self.output_filter() {
                    write!(f, ", filter=[{predicate}]")?;
                }
                if self.phases_merged() {
                    write!(f, ", cpu_phases=removed")?;
                }
                if self.reads_cached_input() {
                    write!(f, ", input=column_cache")?;
                }
                if let Some(merge) = self.merge_read_through() {
                    // The merge below is shown but not run.
                    let partitions = merge.input().properties().output_partitioning();
                    write!(f, ", reads_merge_inputs={}", partitions.partition_count())?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", self.algorithm())?;
                if let Some(ordering) = self.group_ordering() {
                    writeln!(f, "order=[{ordering}]")?;
                }
                write!(f, "mode={:?}", agg.mode())
            }
        }
    }
}

impl ExecutionPlan for GpuAggregateExec {
    fn name(&self) -> &str {
        "GpuAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.cpu_aggregate.children()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let recursion = self.cpu_aggregate.apply_expressions(f)?;
        match (recursion, self.output_filter()) {
            (TreeNodeRecursion::Continue, Some(predicate)) => f(predicate),
            (recursion, _) => Ok(recursion),
        }
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        #[allow(deprecated)]
        let cpu_aggregate = Arc::clone(&self.cpu_aggregate).with_new_children(children)?;
        Ok(Arc::new(
            self.rebuilt(cpu_aggregate, self.cpu_phases.clone())?,
        ))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let cpu_aggregate = Arc::clone(&self.cpu_aggregate).reset_state()?;
        let cpu_phases = self
            .cpu_phases
            .as_ref()
            .map(|plan| Arc::clone(plan).reset_state())
            .transpose()?;
        Ok(Arc::new(self.rebuilt(cpu_aggregate, cpu_phases)?))
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.cpu_aggregate.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.cpu_aggregate.child_stats_requests(partition)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let groups = self.cpu_aggregate.statistics_from_inputs(input_stats, args)?;
        match &self.output_filter {
            Some(filter) => filter.statistics_from_inputs(&[groups], args),
            None => Ok(groups),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        let mut metrics = self.metrics.clone_inner();
        for metric in self.cache_metrics.clone_inner().iter() {
            if GpuAggregateMetrics::CACHE_METRICS.contains(&metric.value().name()) {
                metrics.push(Arc::clone(metric));
            }
        }
        Some(metrics)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let agg = self.aggregate();
        let options = GpuOptions::from_config(context.session_config().options());
        let hashed_group_key_bits =
            crate::config::hashed_group_key_bits(context.session_config().options());
        let device_errors = crate::config::device_error_policy(context.session_config().options());
        let partitions = self.properties().output_partitioning().partition_count();
        let device = crate::exec::node_device(partition, partitions, &options)?;
        let metrics = GpuAggregateMetrics::new(&self.metrics, &self.cache_metrics, partition);
        metrics.device.ran_on(&device);
        let inputs = AggregateInputs {
            group_exprs: agg
                .group_expr()
                .expr()
                .iter()
                .map(|(expr, _)| Arc::clone(expr))
                .collect(),
            aggregate_args: aggregate_expressions(
                agg.aggr_expr(),
                agg.mode(),
                agg.group_expr().num_group_exprs(),
            )?,
            filters: agg.filter_expr().to_vec(),
        };
        // A node that reads the column cache starts its input only where a
        // run cannot read the cache after all.
        let cached_input = self
            .cached_input()
            .filter(|_| options.cache && options.tuning.cached_gpu_inputs);
        let (input, cached_input) = match cached_input {
            Some(cached) => {
                let (input, read_through) = (Arc::clone(agg.input()), self.merge_read_through().cloned());
                let context = Arc::clone(&context);
                let start: InputStart = Box::new(move || {
                    WholeInput::execute(&input, read_through.as_ref(), partition, &context)
                });
                (WholeInput::default(), Some((cached, start)))
            }
            None => (
                WholeInput::execute(agg.input(), self.merge_read_through(), partition, &context)?,
                None,
            ),
        };
        // Spillable: refused, the partition hands its input to DataFusion's
        // aggregation, which spills (see `GpuSortMergeJoinExec`).
        let reservation = MemoryConsumer::new(format!("GpuAggregateInput[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        Ok(aggregate_stream(AggregateTask {
            spec: self.spec.clone(),
            inputs,
            final_output: agg.mode().output_mode() == AggregateOutputMode::Final,
            input,
            cached_input,
            input_schema: agg.input().schema(),
            output_schema: agg.schema(),
            cpu_aggregate: Arc::clone(&self.cpu_aggregate),
            cpu_phases: self.cpu_phases.clone(),
            group_order: self.group_order.clone(),
            output_filter: self.output_filter.clone(),
            batch_size: context.session_config().batch_size(),
            context,
            reservation,
            device,
            options,
            hashed_group_key_bits,
            device_errors,
            metrics,
        }))
    }
}
