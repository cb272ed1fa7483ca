//! The plan rewrite, checked on plans without executing them, so these
//! run without a GPU: the rule is applied as if one were present.
use super::*;
use crate::config::{GpuTuning, PlacementPolicy};
use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::JoinType;
use datafusion::datasource::MemTable;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::Partitioning;
use datafusion::prelude::{SessionConfig, SessionContext};

fn table(partitions: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let parts = (0..partitions as i64)
        .map(|p| {
            let k: ArrayRef = Arc::new(Int64Array::from_iter_values(p * 100..p * 100 + 100));
            let v: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100));
            vec![RecordBatch::try_new(Arc::clone(&schema), vec![k, v]).unwrap()]
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

/// The physical plan of `sql` with DataFusion's rules, every join
/// `Partitioned`, then the GPU rewrite as if a GPU were present.
async fn rewritten(sql: &str, merge_partitions: bool) -> Arc<dyn ExecutionPlan> {
    rewritten_with(
        sql,
        GpuOptions {
            placement: PlacementPolicy::Always,
            tuning: GpuTuning {
                // Each aggregation node as DataFusion planned it; the
                // single-phase rewrite has its own test.
                aggregate_single_phase: false,
                merge_partitions,
                // GpuAggregateExec's rewrites; scan aggregations have
                // their own tests.
                scan_aggregate: false,
                ..GpuTuning::default()
            },
            ..GpuOptions::default()
        },
    )
    .await
}

/// As [`rewritten`], with the rule's options given.
async fn rewritten_with(sql: &str, options: GpuOptions) -> Arc<dyn ExecutionPlan> {
    rewritten_where(sql, options, 0).await
}

/// As [`rewritten_with`], with joins whose build side holds fewer than
/// `collect_left_bytes` bytes planned in `CollectLeft` mode. The
/// tables: r (4 partitions of 100 rows of two Int64 columns), s (3),
/// t (1).
async fn rewritten_where(
    sql: &str,
    options: GpuOptions,
    collect_left_bytes: usize,
) -> Arc<dyn ExecutionPlan> {
    rewritten_in(collect_left_below(collect_left_bytes), sql, options).await
}

/// Four target partitions, and joins whose build side holds fewer than
/// `collect_left_bytes` bytes planned in `CollectLeft` mode.
fn collect_left_below(collect_left_bytes: usize) -> SessionConfig {
    SessionConfig::new()
        .with_target_partitions(4)
        .set_usize(
            "datafusion.optimizer.hash_join_single_partition_threshold",
            collect_left_bytes,
        )
        .set_usize(
            "datafusion.optimizer.hash_join_single_partition_threshold_rows",
            0,
        )
}

/// As [`rewritten_where`] (everything in `CollectLeft` mode), with each
/// join's inputs where the query writes them: the left one is the build side.
async fn rewritten_in_written_order(sql: &str, options: GpuOptions) -> Arc<dyn ExecutionPlan> {
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .set_usize(
            "datafusion.optimizer.hash_join_single_partition_threshold",
            1 << 30,
        )
        .set_usize(
            "datafusion.optimizer.hash_join_single_partition_threshold_rows",
            0,
        )
        .set_bool("datafusion.optimizer.join_reordering", false);
    rewritten_in(config, sql, options).await
}

/// `sql` planned under `config` over the test tables, then rewritten
/// without scan filters (filters stay DataFusion's, as the joins and
/// aggregations these tests look at have them; scan filters have their
/// own test).
async fn rewritten_in(
    config: SessionConfig,
    sql: &str,
    mut options: GpuOptions,
) -> Arc<dyn ExecutionPlan> {
    options.tuning.scan_filter = false;
    rewritten_as_given(config, sql, options).await
}

/// `sql` planned under `config` over the test tables, then rewritten with
/// `options` as they are.
async fn rewritten_as_given(
    config: SessionConfig,
    sql: &str,
    options: GpuOptions,
) -> Arc<dyn ExecutionPlan> {
    let ctx = SessionContext::new_with_config(config);
    ctx.register_table("r", table(4)).unwrap();
    ctx.register_table("s", table(3)).unwrap();
    ctx.register_table("t", table(1)).unwrap();
    let plan = physical_plan_of(&ctx, sql).await;
    let plan = rewrite_plan(plan, &options, Ok(()), RootPartitions::Merged).unwrap();
    // The rewritten plan still meets every node's distribution and
    // ordering requirements.
    SanityCheckPlan::new()
        .optimize(Arc::clone(&plan), ctx.state().config_options())
        .unwrap_or_else(|e| panic!("{e}\n{}", show(&plan)))
}

/// The plan's nodes of type `T`.
pub(super) fn nodes_of<T: ExecutionPlan>(
    plan: &Arc<dyn ExecutionPlan>,
) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = Vec::new();
    plan.apply(|node| {
        if node.downcast_ref::<T>().is_some() {
            found.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found
}

/// DataFusion's physical plan of `sql` in `ctx`.
async fn physical_plan_of(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    ctx.sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap()
}

fn show(plan: &Arc<dyn ExecutionPlan>) -> String {
    datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string()
}

fn gpu_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuHashJoinExec> {
    let mut joins: Vec<&GpuHashJoinExec> = plan.downcast_ref().into_iter().collect();
    for child in plan.children() {
        joins.extend(gpu_joins(child));
    }
    joins
}

fn hash_repartitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let here = plan
        .downcast_ref::<RepartitionExec>()
        .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..)));
    usize::from(here)
        + plan
            .children()
            .into_iter()
            .map(hash_repartitions)
            .sum::<usize>()
}

#[tokio::test]
async fn a_join_under_an_ungrouped_aggregate_runs_over_all_input_partitions() {
    let sql = "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k";
    let plan = rewritten(sql, true).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert!(joins[0].repartition_removed(), "{}", show(&plan));
    assert_eq!(
        *joins[0].hash_join().partition_mode(),
        datafusion::physical_plan::joins::PartitionMode::CollectLeft
    );
    assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
    // The probe side is read in the table's own partitions.
    let probe = joins[0].hash_join().right();
    assert!(
        probe.downcast_ref::<RepartitionExec>().is_none(),
        "{}",
        show(&plan)
    );
    assert_eq!(
        joins[0]
            .properties()
            .output_partitioning()
            .partition_count(),
        probe.properties().output_partitioning().partition_count()
    );
    assert!(show(&plan).contains("cpu_repartition=removed"));
    // The build side's partitions are read by the join itself, not
    // through the merge DataFusion put below it.
    let merge = joins[0]
        .hash_join()
        .left()
        .downcast_ref::<CoalescePartitionsExec>()
        .unwrap_or_else(|| panic!("{}", show(&plan)));
    let build_partitions = merge
        .input()
        .properties()
        .output_partitioning()
        .partition_count();
    assert!(build_partitions > 1, "{}", show(&plan));
    assert!(
        show(&plan).contains(&format!("build_reads_merge_inputs={build_partitions}")),
        "{}",
        show(&plan)
    );

    let plan = rewritten(sql, false).await;
    let joins = gpu_joins(&plan);
    assert!(!joins[0].repartition_removed(), "{}", show(&plan));
    assert_eq!(hash_repartitions(&plan), 2, "{}", show(&plan));
}

#[tokio::test]
async fn a_join_below_a_collect_left_probe_side_runs_over_all_input_partitions() {
    // t (the 800 bytes of its column v) is collected whole by the outer join;
    // the inner join (s, 2,400 bytes of k, builds) feeds that join's probe
    // side, whose partitioning nothing relies on.
    let sql = "SELECT count(*) FROM t JOIN (SELECT r.k FROM r JOIN s ON r.k = s.k) x \
               ON t.v = x.k";
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            aggregate_single_phase: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    let plan = rewritten_where(sql, options, 2_000).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 2, "{}", show(&plan));
    let outer = joins
        .iter()
        .find(|j| !j.repartition_removed())
        .unwrap_or_else(|| panic!("{}", show(&plan)));
    assert_eq!(
        *outer.hash_join().partition_mode(),
        datafusion::physical_plan::joins::PartitionMode::CollectLeft,
        "{}",
        show(&plan)
    );
    assert!(
        joins.iter().any(|j| j.repartition_removed()),
        "the inner join kept its repartitions:\n{}",
        show(&plan)
    );
    assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
}

/// Whether `plan`'s rows arrive in an order that depends on which input
/// partition delivers first.
fn arrives_in_no_fixed_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let text = show(plan);
    text.contains("CoalescePartitionsExec") || text.contains("RoundRobinBatch")
}

#[tokio::test]
async fn a_join_keeps_its_order_where_its_probe_side_fixes_it() {
    // An aggregation over four partitions arrives in no fixed order; `t`,
    // one partition, in a fixed one. HashJoinExec emits probe row by probe
    // row, so a probe side in a fixed order fixes the order of its rows
    // (DataFusion's own sqllogictest files expect it) and the GPU join
    // keeps it, whatever order the build side arrives in; where the build
    // rows emitted alone make or end the output, their order is the build
    // side's arrival order, and where that is not fixed the join need not
    // keep it.
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        ..GpuOptions::default()
    };
    let aggregated = "(SELECT k, sum(v) AS total FROM r GROUP BY k) x";
    // Each join's left input is its build side (inputs where written):
    // the join type, whether the build and the probe side arrive in no
    // fixed order, and whether the GPU join keeps HashJoinExec's order.
    for (sql, join_type, build_unfixed, probe_unfixed, kept) in [
        (
            format!("SELECT t.k, x.total FROM t LEFT JOIN {aggregated} ON t.k = x.k"),
            JoinType::Left,
            false,
            true,
            false,
        ),
        (
            format!("SELECT t.k, x.total FROM t JOIN {aggregated} ON t.k = x.k"),
            JoinType::Inner,
            false,
            true,
            false,
        ),
        (
            format!("SELECT t.k, x.total FROM {aggregated} RIGHT JOIN t ON t.k = x.k"),
            JoinType::Right,
            true,
            false,
            true,
        ),
        (
            format!("SELECT t.k, x.total FROM {aggregated} JOIN t ON t.k = x.k"),
            JoinType::Inner,
            true,
            false,
            true,
        ),
        // The build rows emitted alone end the output, in arrival order.
        (
            format!("SELECT t.k, x.total FROM {aggregated} LEFT JOIN t ON t.k = x.k"),
            JoinType::Left,
            true,
            false,
            false,
        ),
    ] {
        let plan = rewritten_in_written_order(&sql, options.clone()).await;
        let joins = gpu_joins(&plan);
        assert_eq!(joins.len(), 1, "{sql}\n{}", show(&plan));
        let join = joins[0].hash_join();
        let shape = (
            *join.join_type(),
            arrives_in_no_fixed_order(join.left()),
            arrives_in_no_fixed_order(join.right()),
        );
        assert_eq!(
            shape,
            (join_type, build_unfixed, probe_unfixed),
            "{sql}: not the plan meant\n{}",
            show(&plan)
        );
        assert_eq!(joins[0].preserves_order(), kept, "{sql}\n{}", show(&plan));
    }
}

#[tokio::test]
async fn a_join_keeps_its_order_below_a_root_of_several_partitions() {
    // A filter the left join cannot take below it runs over a round robin
    // that deals the join's one partition to four: each partition still
    // shows the join's rows in the order it made them, and a caller that
    // collects them sees that order (DataFusion's own sqllogictest files
    // expect it).
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        ..GpuOptions::default()
    };
    let sql = "SELECT t.k, u.v FROM t LEFT JOIN t AS u ON t.k = u.k WHERE u.v <> 3 OR t.k = 5";
    let plan = rewritten_in_written_order(sql, options).await;
    assert_eq!(
        plan.properties().output_partitioning().partition_count(),
        4,
        "not the plan meant\n{}",
        show(&plan)
    );
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert!(joins[0].preserves_order(), "{}", show(&plan));
}

#[tokio::test]
async fn a_join_over_inputs_in_arrival_order_need_not_keep_its_order() {
    // A TopK over the join reads its rows in the order the join made
    // them (ties are kept in arrival order), so with deterministic
    // inputs (one partition each) the GPU join keeps HashJoinExec's
    // order. Over tables of several partitions the inputs arrive
    // through hash repartitions, in no fixed order: the join runs over
    // all input partitions, with no repartition left.
    let top =
        |from: &str| format!("SELECT a.k, b.v FROM {from} ON a.k = b.k ORDER BY b.v DESC LIMIT 3");
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            aggregate_single_phase: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    let plan = rewritten_with(&top("t a JOIN t b"), options.clone()).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert!(joins[0].preserves_order(), "{}", show(&plan));
    assert!(!joins[0].repartition_removed(), "{}", show(&plan));

    let plan = rewritten_with(&top("r a JOIN s b"), options).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert!(!joins[0].preserves_order(), "{}", show(&plan));
    assert!(joins[0].repartition_removed(), "{}", show(&plan));
    assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
}

#[tokio::test]
async fn a_join_whose_hash_partitioning_is_relied_on_has_its_output_repartitioned() {
    // The aggregate groups by the join key: DataFusion plans it over the
    // join's hash partitioning, without a repartition of its own. The
    // GPU join reads its inputs as they are and its output is
    // repartitioned as the join's was: one repartition instead of two.
    let sql = "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k";
    let plan = rewritten(sql, true).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert!(joins[0].repartition_removed(), "{}", show(&plan));
    assert_eq!(
        *joins[0].hash_join().partition_mode(),
        datafusion::physical_plan::joins::PartitionMode::CollectLeft
    );
    assert_eq!(hash_repartitions(&plan), 1, "{}", show(&plan));
    let shown = show(&plan);
    let lines: Vec<&str> = shown.lines().map(str::trim).collect();
    assert!(
        lines.windows(2).any(|pair| {
            pair[0].starts_with("RepartitionExec: partitioning=Hash([k@0], 4)")
                && pair[1].starts_with("GpuHashJoinExec")
        }),
        "{shown}"
    );
    // Without merging, DataFusion's two input repartitions stay.
    let plan = rewritten(sql, false).await;
    assert!(!gpu_joins(&plan)[0].repartition_removed());
    assert_eq!(hash_repartitions(&plan), 2, "{}", show(&plan));
}

#[test]
fn only_hash_partitionings_on_output_columns_can_be_made_again() {
    // TPC-H q2, q9, q10, q11 and q16 plan joins whose projection drops
    // their keys below a node that keeps their partitioning from being
    // free; repartitioning on the dropped column failed at run time.
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::PhysicalExpr;
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int64, false),
    ]));
    let hash = |exprs: Vec<Arc<dyn PhysicalExpr>>| Partitioning::Hash(exprs, 4);
    assert!(evaluable_hash(
        &hash(vec![Arc::new(Column::new("b", 1))]),
        &schema
    ));
    // A column beyond the output, or named otherwise, or unknown.
    assert!(!evaluable_hash(
        &hash(vec![Arc::new(Column::new("o_orderkey", 6))]),
        &schema
    ));
    assert!(!evaluable_hash(
        &hash(vec![Arc::new(Column::new("a", 1))]),
        &schema
    ));
    assert!(!evaluable_hash(
        &hash(vec![
            Arc::new(Column::new("a", 0)),
            Arc::new(UnKnownColumn::new("k"))
        ]),
        &schema
    ));
    assert!(!evaluable_hash(&Partitioning::RoundRobinBatch(4), &schema));
}

#[tokio::test]
async fn joins_stacked_on_one_key_run_over_all_input_partitions() {
    let sql = "SELECT count(*) FROM r JOIN s ON r.k = s.k JOIN r AS r2 ON s.k = r2.k";
    let plan = rewritten(sql, true).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 2, "{}", show(&plan));
    // The lower join (listed second) feeds a join that requires its
    // hash partitioning, so its output is repartitioned; the upper
    // join, free of any requirement, then reads the lower one's output
    // without that repartition.
    assert!(
        joins.iter().all(|j| j.repartition_removed()),
        "{}",
        show(&plan)
    );
    assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
}

fn gpu_merge_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuSortMergeJoinExec> {
    let mut joins: Vec<&GpuSortMergeJoinExec> = plan.downcast_ref().into_iter().collect();
    for child in plan.children() {
        joins.extend(gpu_merge_joins(child));
    }
    joins
}

fn find_merge_join(plan: &Arc<dyn ExecutionPlan>) -> Option<&Arc<dyn ExecutionPlan>> {
    if plan.is::<SortMergeJoinExec>() {
        return Some(plan);
    }
    plan.children().into_iter().find_map(find_merge_join)
}

#[tokio::test]
async fn sort_merge_joins_absorb_the_sorts_planned_for_them() {
    // Each partition on its own: the joins of the merge over all input
    // partitions have their own test.
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            merge_partitions: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .set_bool("datafusion.optimizer.prefer_hash_join", false);
    let ctx = SessionContext::new_with_config(config);
    ctx.register_table("r", table(4)).unwrap();
    ctx.register_table("s", table(3)).unwrap();
    for sql in [
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
        "SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k AND r.v > s.v",
        "SELECT s.v FROM r RIGHT ANTI JOIN s ON r.k = s.k",
    ] {
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let plan = rewrite(plan, false, true, false, false, &options, Ok(())).unwrap();
        // Every requirement still holds, with the sorts gone.
        let plan = SanityCheckPlan::new()
            .optimize(plan, ctx.state().config_options())
            .unwrap();
        let joins = gpu_merge_joins(&plan);
        assert_eq!(joins.len(), 1, "{sql}\n{}", show(&plan));
        assert_eq!(joins[0].sort_on_device(), [true, true], "{}", show(&plan));
        assert!(!show(&plan).contains("SortExec"), "{}", show(&plan));
        assert!(show(&plan).contains("sort=[left: device, right: device]"));
    }
    // String keys have no order-preserving code: the join stays, and says why.
    let plan = ctx
        .sql("SELECT r.v FROM r JOIN s ON CAST(r.k AS VARCHAR) = CAST(s.k AS VARCHAR)")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let plan = rewrite(plan, false, true, false, false, &options, Ok(())).unwrap();
    assert!(gpu_merge_joins(&plan).is_empty(), "{}", show(&plan));
    let join = find_merge_join(&plan).expect("a sort-merge join");
    let why = super::decide_sort_merge_join(join, &options, Ok(()), false).unwrap_err();
    assert!(why.contains("order-preserving"), "{why}");
}

/// The plan of `sql` with sort-merge joins, rewritten with `options` and
/// checked against every node's requirements; `sorted` registers the
/// tables with their partitions sorted on `k` and DataFusion asked to
/// keep that order.
async fn merge_join_plan(sql: &str, options: &GpuOptions, sorted: bool) -> Arc<dyn ExecutionPlan> {
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .set_bool("datafusion.optimizer.prefer_hash_join", false)
        .set_bool("datafusion.optimizer.prefer_existing_sort", sorted);
    let ctx = SessionContext::new_with_config(config);
    let order = vec![vec![datafusion::logical_expr::col("k").sort(true, true)]];
    for (name, partitions) in [("r", 4), ("s", 3)] {
        let table = Arc::into_inner(table(partitions)).expect("one owner");
        let table = if sorted {
            table.with_sort_order(order.clone())
        } else {
            table
        };
        ctx.register_table(name, Arc::new(table)).unwrap();
    }
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let plan = rewrite(plan, false, true, false, false, options, Ok(())).unwrap();
    SanityCheckPlan::new()
        .optimize(Arc::clone(&plan), ctx.state().config_options())
        .unwrap_or_else(|e| panic!("{e}\n{}", show(&plan)))
}

/// Asserts that `plan` holds one GPU sort-merge join per partition of
/// DataFusion's two hash repartitions, and returns it.
fn joined_per_partition(plan: &Arc<dyn ExecutionPlan>) -> &GpuSortMergeJoinExec {
    let joins = gpu_merge_joins(plan);
    assert_eq!(joins.len(), 1, "{}", show(plan));
    assert!(!joins[0].repartitions_removed(), "{}", show(plan));
    assert_eq!(hash_repartitions(plan), 2, "{}", show(plan));
    joins[0]
}

/// The checks of a GPU sort-merge join that runs once over all its
/// input partitions, in `plan` for `sql`.
fn check_merged_over_all_partitions(sql: &str, plan: &Arc<dyn ExecutionPlan>) {
    let text = show(plan);
    let joins = gpu_merge_joins(plan);
    assert_eq!(joins.len(), 1, "{sql}\n{text}");
    let join = joins[0];
    assert!(join.repartitions_removed(), "{sql}\n{text}");
    assert!(text.contains("cpu_repartitions=removed"), "{text}");
    // No CPU pass hashes the inputs; the device sorts both,
    // sorted partitions or not, as one partition each.
    assert_eq!(hash_repartitions(plan), 0, "{sql}\n{text}");
    assert_eq!(join.sort_on_device(), [true, true], "{sql}\n{text}");
    for child in join.children() {
        assert_eq!(
            child.properties().output_partitioning().partition_count(),
            1,
            "{text}"
        );
    }
    // It reads the partitions below each merge itself (r has
    // four, s three), as the merge would, each in a task.
    assert!(
        text.contains("reads_merge_inputs=[left: 4, right: 3]"),
        "{sql}\n{text}"
    );
    // Its output, in key order, is spread round robin over the
    // join's partitions, each still sorted; the one row of an
    // aggregation's states is not.
    assert_eq!(
        text.contains("RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1"),
        join.partial_aggregate().is_none(),
        "{sql}\n{text}"
    );
    assert!(!text.contains("SortExec"), "{sql}\n{text}");
    // The projection of the join's columns above the round robin
    // is the join's own: only those columns travel.
    assert!(join.projection().is_some(), "{sql}\n{text}");
    assert!(text.contains(", projection=["), "{sql}\n{text}");
    // Its statistics are those of the columns it emits.
    let stats = StatisticsContext::new()
        .compute(join, &StatisticsArgs::new())
        .unwrap();
    assert_eq!(
        stats.column_statistics.len(),
        join.schema().fields().len(),
        "{sql}"
    );
    // The decision record says so.
    let decisions = crate::gpu_decisions(plan, &ConfigOptions::default());
    assert!(
        decisions.iter().any(|d| matches!(
            &d.placement,
            crate::Placement::Gpu { algorithm }
                if algorithm.contains("over all input partitions (CPU hash repartitions removed)")
        )),
        "{sql}: {decisions:?}"
    );
}

#[tokio::test]
async fn a_sort_merge_join_runs_once_over_all_input_partitions_where_nothing_relies_on_its_partitioning(
) {
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        ..GpuOptions::default()
    };
    assert!(options.tuning.merge_partitions && !options.tuning.merge_unsorted_sort_merge_inputs);
    // By default over sorted partitions, which DataFusion merges while
    // it repartitions them; with the option, over unsorted ones too.
    let unsorted_too = GpuOptions {
        tuning: GpuTuning {
            merge_unsorted_sort_merge_inputs: true,
            ..options.clone().tuning
        },
        ..options.clone()
    };
    for sorted in [false, true] {
        let options = if sorted { &options } else { &unsorted_too };
        for sql in [
            "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k",
            "SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k AND r.v > s.v",
            "SELECT s.v FROM r RIGHT ANTI JOIN s ON r.k = s.k",
            "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k NULLS FIRST",
        ] {
            let plan = merge_join_plan(sql, options, sorted).await;
            check_merged_over_all_partitions(sql, &plan);
        }
    }
    // An input already in one sorted partition is merged as it is.
    let plan = merge_join_plan(
        "SELECT r.v, s.v FROM r JOIN (SELECT * FROM s ORDER BY k NULLS FIRST LIMIT 1000) s ON r.k = s.k",
        &unsorted_too,
        false,
    )
    .await;
    let joins = gpu_merge_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert_eq!(joins[0].sort_on_device(), [true, false], "{}", show(&plan));
    // Unsorted inputs by default: a GPU join per partition of
    // DataFusion's repartitions, the sorts absorbed (where the join
    // hands rows on: one that aggregates runs over all partitions, see
    // the test of aggregates in the sort-merge join).
    let plan = merge_join_plan(
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
        &options,
        false,
    )
    .await;
    let join = joined_per_partition(&plan);
    assert_eq!(join.sort_on_device(), [true, true], "{}", show(&plan));
    // Where a node above relies on the join's hash partitioning, each
    // partition joins on its own, as DataFusion planned it.
    let plan = merge_join_plan(
        "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k",
        &unsorted_too,
        false,
    )
    .await;
    joined_per_partition(&plan);
    // And so it does with the option off.
    let plan = merge_join_plan(
        "SELECT count(*) FROM r JOIN s ON r.k = s.k",
        &GpuOptions {
            tuning: GpuTuning {
                merge_partitions: false,
                ..unsorted_too.clone().tuning
            },
            ..unsorted_too.clone()
        },
        false,
    )
    .await;
    joined_per_partition(&plan);
    // There, sorted partitions keep their order through DataFusion's
    // order-preserving repartitions, and are merged without a sort.
    let plan = merge_join_plan(
        "SELECT count(*) FROM r JOIN s ON r.k = s.k",
        &GpuOptions {
            tuning: GpuTuning {
                merge_partitions: false,
                ..options.clone().tuning
            },
            ..options.clone()
        },
        true,
    )
    .await;
    let join = joined_per_partition(&plan);
    assert_eq!(join.sort_on_device(), [false, false], "{}", show(&plan));
}

#[tokio::test]
async fn a_hash_join_sorted_on_its_keys_becomes_a_gpu_sort_merge_join_without_the_sort() {
    let options = |for_order: bool| GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            sort_merge_join_for_order: for_order,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    for sql in [
        "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k",
        "SELECT r.v, s.k FROM r JOIN s ON r.k = s.k ORDER BY s.k DESC",
    ] {
        let plan = rewritten_with(sql, options(true)).await;
        let joins = gpu_merge_joins(&plan);
        assert_eq!(joins.len(), 1, "{sql}\n{}", show(&plan));
        assert!(joins[0].in_place_of_hash_join());
        assert_eq!(joins[0].sort_on_device(), [true, true], "{}", show(&plan));
        // The sort of the join output is gone; the merge of the sorted
        // partitions stays.
        assert!(!show(&plan).contains("SortExec"), "{sql}\n{}", show(&plan));
        assert!(
            show(&plan).contains("SortPreservingMergeExec"),
            "{}",
            show(&plan)
        );
        assert!(show(&plan).contains("in_place_of=HashJoinExec"));
        // The hash join's embedded projection is the merge join's own.
        assert!(joins[0].projection().is_some(), "{}", show(&plan));
        assert!(!show(&plan).contains("ProjectionExec"), "{}", show(&plan));
        let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
        assert!(
            decisions.iter().any(|d| matches!(&d.placement,
                crate::Placement::Gpu { algorithm } if algorithm.contains("in place of HashJoinExec"))),
            "{decisions:?}"
        );
        // Switched off, the hash join and the sort stay.
        let plan = rewritten_with(sql, options(false)).await;
        assert!(gpu_merge_joins(&plan).is_empty(), "{}", show(&plan));
        assert!(show(&plan).contains("SortExec"), "{}", show(&plan));
    }
    // A sort on something else, with a limit, or over a full join (whose
    // unmatched rows break the merge's key order) keeps the hash join.
    for sql in [
        "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY s.v",
        "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k LIMIT 5",
        "SELECT r.k, s.v FROM r FULL JOIN s ON r.k = s.k ORDER BY r.k",
    ] {
        let plan = rewritten_with(sql, options(true)).await;
        assert!(gpu_merge_joins(&plan).is_empty(), "{sql}\n{}", show(&plan));
    }
}

mod aggregates;
mod scan_filters;
mod stages;

#[tokio::test]
async fn a_partitioned_joins_repartitions_count_in_neither_estimate() {
    // Not re-planned over all input partitions, the GPU join reads the
    // same hash repartitions DataFusion's join reads: they cost both plans
    // alike, and the comparison leaves them out.
    let plan = rewritten("SELECT r.v, s.v FROM r JOIN s ON r.k = s.k", false).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    let join = joins[0].hash_join();
    assert_eq!(
        *join.partition_mode(),
        datafusion::physical_plan::joins::PartitionMode::Partitioned
    );
    assert_eq!(hash_repartitions(&plan), 2, "{}", show(&plan));
    let shape = super::super::shape::hash_join_shape(join, joins[0].cpu_join(), false, true)
        .unwrap_or_else(|| panic!("no statistics: {}", show(&plan)));
    assert!(!shape.repartitioned, "{shape:?}");
    // DataFusion builds on the smaller side, s.
    assert_eq!(
        (shape.build_rows, shape.probe_rows),
        (300, 400),
        "{shape:?}"
    );
}
