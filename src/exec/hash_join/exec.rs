//! The plan node.

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::execution_plan::apply_expression_roots;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    ChildStats, DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements,
    PlanProperties, SendableRecordBatchStream, Statistics, StatisticsArgs,
};

use super::build_side::{BuildGather, BuildSide};
use super::output::OutputAssembler;
use super::stream::{probe_stream, JoinSemantics, ProbeSpec};
use crate::exec::device_gather::{gathers_by_pair, output_columns};
use crate::exec::keys::KeySpec;
use crate::exec::once::OnceFut;
use crate::exec::GpuJoinMetrics;
use crate::planner::GpuOptions;

/// A radix-partitioned hash join on the GPU, in place of the
/// [`HashJoinExec`] it was made from: same inputs, output schema, column
/// order, projection and partitioning. It does not keep the probe order, so
/// it is only placed where the join advertised no output ordering.
///
/// Supported (see [`crate::planner::decide_hash_join`]): every join type,
/// both NULL equalities, the null-aware anti join, residual filters (on the
/// host, per bounded batch of candidates), a pushed-down fetch, keys of any
/// type that [`KeySpec`] accepts, in `CollectLeft` and `Partitioned` mode.
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
    /// `CollectLeft`: the build side, collected once for all partitions.
    shared_build: Mutex<Option<OnceFut<BuildSide>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl GpuHashJoinExec {
    /// The algorithm name shown by `EXPLAIN` and in decisions.
    pub const ALGORITHM: &'static str = "radix_partitioned_hash_join";

    /// Wraps `cpu_join`, which must be a [`HashJoinExec`] accepted by
    /// [`crate::planner::decide_hash_join`].
    pub fn try_new(cpu_join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let join = cpu_join.downcast_ref::<HashJoinExec>().ok_or_else(|| {
            DataFusionError::Internal(format!("GpuHashJoinExec made from {}", cpu_join.name()))
        })?;
        let keys = crate::planner::key_spec_of(join).map_err(DataFusionError::NotImplemented)?;
        let mut properties = join.properties().as_ref().clone();
        let mut eq_properties = properties.eq_properties.clone();
        eq_properties.clear_orderings();
        properties = properties.with_eq_properties(eq_properties);
        Ok(Self {
            keys,
            properties: Arc::new(properties),
            preserve_order: true,
            repartition_removed: false,
            shared_build: Mutex::new(None),
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

    /// The [`HashJoinExec`] this node replaces.
    pub fn hash_join(&self) -> &HashJoinExec {
        self.cpu_join
            .downcast_ref::<HashJoinExec>()
            .expect("checked in try_new")
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
        let collect = |input_partition: usize,
                       probe_partitions: usize,
                       consumer: String|
         -> Result<OnceFut<BuildSide>> {
            let input = join.left().execute(input_partition, Arc::clone(context))?;
            let reservation = MemoryConsumer::new(consumer).register(context.memory_pool());
            Ok(OnceFut::new(BuildSide::collect(
                input,
                join.left().schema(),
                join.on().iter().map(|(left, _)| Arc::clone(left)).collect(),
                self.keys.clone(),
                *join.join_type(),
                probe_partitions,
                options.probe_chunk_rows,
                reservation,
                gather.clone(),
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
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "algorithm={}", Self::ALGORITHM)?;
                writeln!(f, "join_type={}", join.join_type())?;
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
        apply_expression_roots(roots, f)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        #[allow(deprecated)]
        let cpu_join = Arc::clone(&self.cpu_join).with_new_children(children)?;
        Ok(Arc::new(
            Self::try_new(cpu_join)?
                .with_preserve_order(self.preserve_order)
                .with_repartition_removed(self.repartition_removed),
        ))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        // A fresh node forgets the collected build side, so a re-executed
        // plan (recursive queries) reads its inputs again.
        let cpu_join = Arc::clone(&self.cpu_join).reset_state()?;
        Ok(Arc::new(
            Self::try_new(cpu_join)?
                .with_preserve_order(self.preserve_order)
                .with_repartition_removed(self.repartition_removed),
        ))
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
        self.cpu_join.statistics_from_inputs(input_stats, args)
    }

    fn fetch(&self) -> Option<usize> {
        self.cpu_join.fetch()
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let join = self.hash_join();
        let options = GpuOptions::from_config(context.session_config().options());
        let device = crate::exec::partition_device(partition)?;
        let metrics = GpuJoinMetrics::new(&self.metrics, partition);
        let (build_columns, probe_columns) = (
            join.left().schema().fields().len(),
            join.right().schema().fields().len(),
        );
        let output = OutputAssembler::new(
            self.schema(),
            *join.join_type(),
            join.projection.as_deref(),
            build_columns,
            probe_columns,
            context.session_config().batch_size(),
        );
        let preserve_order = options.preserve_order && self.preserve_order;
        let gathered = (options.device_gather
            && gathers_by_pair(*join.join_type(), join.filter().is_some()))
        .then(|| output_columns(&output, build_columns, probe_columns))
        .flatten();
        let (build_gather, gather_probe_columns) = match gathered {
            Some((build, probe)) => (
                Some(BuildGather {
                    columns: build,
                    ordered: preserve_order,
                }),
                Some(probe),
            ),
            None => (None, None),
        };
        let build = self.build_side(partition, &context, &options, build_gather, &metrics)?;
        let probe_input = join.right().execute(partition, Arc::clone(&context))?;
        let spec = ProbeSpec {
            build,
            probe_input,
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
            gather_probe_columns,
            device,
            probe_chunk_rows: options.probe_chunk_rows.max(1),
            max_output_pairs: options.max_output_pairs,
            memory_fraction: options.memory_fraction,
            max_concurrent_tasks: options.max_concurrent_tasks,
            metrics,
        };
        Ok(probe_stream(spec, self.schema()))
    }
}
