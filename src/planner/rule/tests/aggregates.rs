//! The rule's rewrites of aggregations: every mode, one phase in place of
//! two, sorts absorbed, what stays on the CPU, and aggregates computed in joins.

use super::*;

pub(super) fn gpu_aggregates(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuAggregateExec> {
    let mut aggs: Vec<&GpuAggregateExec> = plan.downcast_ref().into_iter().collect();
    for child in plan.children() {
        aggs.extend(gpu_aggregates(child));
    }
    aggs
}

pub(super) fn cpu_aggregates(plan: &Arc<dyn ExecutionPlan>) -> Vec<&AggregateExec> {
    let mut aggs: Vec<&AggregateExec> = plan.downcast_ref().into_iter().collect();
    for child in plan.children() {
        aggs.extend(cpu_aggregates(child));
    }
    aggs
}

#[tokio::test]
async fn aggregations_run_on_the_gpu_in_every_mode_of_a_two_phase_plan() {
    use datafusion::physical_plan::aggregates::AggregateMode;
    for (sql, modes) in [
        (
            "SELECT k, count(*), sum(v), min(v), max(v), avg(v) FROM r GROUP BY k",
            [AggregateMode::Partial, AggregateMode::FinalPartitioned],
        ),
        (
            "SELECT count(*), sum(v), avg(v) FROM r",
            [AggregateMode::Partial, AggregateMode::Final],
        ),
    ] {
        let plan = rewritten(sql, false).await;
        let mut seen: Vec<AggregateMode> = gpu_aggregates(&plan)
            .iter()
            .map(|agg| *agg.aggregate().mode())
            .collect();
        seen.sort_by_key(|m| format!("{m:?}"));
        let mut expected = modes.to_vec();
        expected.sort_by_key(|m| format!("{m:?}"));
        assert_eq!(seen, expected, "{}", show(&plan));
        assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
        assert!(show(&plan).contains("GpuAggregateExec: algorithm=hash_group_by"));
    }
}

#[tokio::test]
async fn two_aggregation_phases_become_one_gpu_aggregation_where_partitioning_is_free() {
    use datafusion::physical_plan::aggregates::AggregateMode;
    let single_phase = || GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            aggregate_single_phase: true,
            scan_aggregate: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    for sql in [
        "SELECT k, count(*), sum(v), min(v), max(v), avg(v) FROM r GROUP BY k",
        "SELECT count(*), sum(v), avg(v) FROM r",
    ] {
        let plan = rewritten_with(sql, single_phase()).await;
        let aggs = gpu_aggregates(&plan);
        assert_eq!(aggs.len(), 1, "{}", show(&plan));
        assert_eq!(*aggs[0].aggregate().mode(), AggregateMode::Single);
        assert!(aggs[0].phases_merged());
        assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
        assert_eq!(hash_repartitions(&plan), 0, "{}", show(&plan));
        assert!(show(&plan).contains("cpu_phases=removed"));
        assert!(
            show(&plan).contains("reads_merge_inputs=4"),
            "{}",
            show(&plan)
        );
        // At the root, its one partition is not spread round robin: the
        // caller would only merge the partitions again.
        assert!(!show(&plan).contains("RoundRobinBatch"), "{}", show(&plan));
        assert_eq!(plan.properties().output_partitioning().partition_count(), 1);
    }
    // Nor below a projection of plain columns at the root.
    let sql = "SELECT c, k FROM (SELECT k, count(*) AS c FROM r GROUP BY k)";
    let plan = rewritten_with(sql, single_phase()).await;
    assert_eq!(gpu_aggregates(&plan).len(), 1, "{}", show(&plan));
    assert!(!show(&plan).contains("RoundRobinBatch"), "{}", show(&plan));
    // A join above relies on the aggregation's hash partitioning on its
    // key: the one aggregation's groups are hash-repartitioned.
    let sql = "SELECT a.k, a.c, s.v FROM (SELECT k, count(*) AS c FROM r GROUP BY k) a \
               JOIN s ON a.k = s.k";
    for merge_partitions in [false, true] {
        let options = GpuOptions {
            tuning: GpuTuning {
                merge_partitions,
                ..single_phase().tuning
            },
            ..single_phase()
        };
        let plan = rewritten_with(sql, options).await;
        let aggs = gpu_aggregates(&plan);
        assert_eq!(aggs.len(), 1, "{}", show(&plan));
        assert_eq!(*aggs[0].aggregate().mode(), AggregateMode::Single);
        assert!(aggs[0].phases_merged());
        assert!(
            show(&plan).contains(
                "RepartitionExec: partitioning=Hash([k@0], 4), input_partitions=4\n      \
                 RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1\n        \
                 GpuAggregateExec"
            ),
            "{}",
            show(&plan)
        );
    }
    // Nothing above relies on the partitioning, but the aggregation had
    // several partitions: its groups are spread round robin.
    let sql = "SELECT k + 1, c FROM (SELECT k, count(*) AS c FROM r GROUP BY k)";
    let plan = rewritten_with(sql, single_phase()).await;
    assert!(
        show(&plan)
            .contains("RepartitionExec: partitioning=RoundRobinBatch(4), input_partitions=1"),
        "{}",
        show(&plan)
    );
    assert_eq!(gpu_aggregates(&plan).len(), 1, "{}", show(&plan));
}

#[tokio::test]
async fn a_sort_on_group_keys_above_an_aggregation_becomes_the_aggregation_s_own() {
    for single_phase in [true, false] {
        let options = GpuOptions {
            placement: PlacementPolicy::Always,
            tuning: GpuTuning {
                aggregate_single_phase: single_phase,
                ..GpuTuning::default()
            },
            ..GpuOptions::default()
        };
        for (sql, order) in [
            (
                "SELECT k, max(v) FROM r GROUP BY k ORDER BY k",
                "k@0 ASC NULLS LAST",
            ),
            (
                "SELECT k, v, count(*) FROM r GROUP BY k, v ORDER BY v DESC NULLS FIRST",
                "v@1 DESC",
            ),
            (
                "SELECT k, v, count(*) FROM r GROUP BY k, v ORDER BY v, k DESC LIMIT 5",
                "v@1 ASC NULLS LAST, k@0 DESC",
            ),
            // Sorts below or above a projection of the groups.
            (
                "SELECT max(v) AS m, k FROM r GROUP BY k ORDER BY k DESC",
                "k@0 DESC",
            ),
            (
                "SELECT k + 1 AS k1, max(v) FROM r GROUP BY k ORDER BY k",
                "k@0 ASC NULLS LAST",
            ),
        ] {
            let plan = rewritten_with(sql, options.clone()).await;
            let text = show(&plan);
            assert!(!text.contains("SortExec"), "{sql}\n{text}");
            let sorted: Vec<&GpuAggregateExec> = gpu_aggregates(&plan)
                .into_iter()
                .filter(|agg| agg.group_ordering().is_some())
                .collect();
            assert_eq!(sorted.len(), 1, "{sql}\n{text}");
            assert_eq!(sorted[0].algorithm(), GpuAggregateExec::SORTED_ALGORITHM);
            assert!(text.contains(&format!("order=[{order}]")), "{sql}\n{text}");
            assert_eq!(
                text.contains("LocalLimitExec: fetch=5"),
                sql.contains("LIMIT")
            );
        }
    }
    // Sorts the aggregation cannot take stay: on an aggregate's value,
    // on an expression, on a string key.
    for sql in [
        "SELECT k, max(v) AS m FROM r GROUP BY k ORDER BY m",
        "SELECT k, max(v) FROM r GROUP BY k ORDER BY k + 1",
        "SELECT k + 1 AS k1, max(v) FROM r GROUP BY k ORDER BY k1",
        "SELECT c, count(*) FROM (SELECT CAST(k AS VARCHAR) AS c FROM r) GROUP BY c ORDER BY c",
    ] {
        let options = GpuOptions {
            placement: PlacementPolicy::Always,
            hashed_group_keys: true,
            ..GpuOptions::default()
        };
        let plan = rewritten_with(sql, options).await;
        assert!(show(&plan).contains("SortExec"), "{sql}\n{}", show(&plan));
        assert!(
            gpu_aggregates(&plan)
                .iter()
                .all(|agg| agg.group_ordering().is_none()),
            "{sql}\n{}",
            show(&plan)
        );
    }
}

#[tokio::test]
async fn a_single_count_distinct_runs_on_the_gpu_as_datafusion_rewrites_it() {
    // DataFusion plans one DISTINCT column as a grouping by the key and
    // the column, then a count per key: two plain aggregations.
    let sql = "SELECT k, count(DISTINCT v), max(v) FROM r GROUP BY k";
    for single_phase in [false, true] {
        let options = GpuOptions {
            placement: PlacementPolicy::Always,
            tuning: GpuTuning {
                aggregate_single_phase: single_phase,
                ..GpuTuning::default()
            },
            ..GpuOptions::default()
        };
        let plan = rewritten_with(sql, options).await;
        assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
        assert!(gpu_aggregates(&plan).len() >= 2, "{}", show(&plan));
    }
}

#[tokio::test]
async fn aggregations_the_gpu_cannot_run_stay_on_the_cpu_and_say_why() {
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            aggregate_single_phase: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    for (sql, reason) in [
        (
            "SELECT named_struct('a', k), count(*) FROM r GROUP BY named_struct('a', k)",
            "group key type Struct",
        ),
        (
            "SELECT k, min(CAST(v AS DOUBLE)) FROM r GROUP BY k",
            "min over Float64",
        ),
        (
            "SELECT k, v, count(*) FROM r GROUP BY ROLLUP (k, v)",
            "GROUPING SETS",
        ),
        (
            "SELECT k, array_agg(v) FROM r GROUP BY k",
            "array_agg is not supported",
        ),
        (
            // Two DISTINCT columns: DataFusion keeps the DISTINCT
            // aggregates (one is rewritten, see below).
            "SELECT k, count(DISTINCT v), count(DISTINCT v + k) FROM r GROUP BY k",
            "(DISTINCT ...) is not supported",
        ),
    ] {
        let plan = rewritten(sql, false).await;
        let aggs = cpu_aggregates(&plan);
        assert!(!aggs.is_empty(), "{sql}\n{}", show(&plan));
        for agg in aggs {
            let why = super::decide_aggregate(agg, &options, Ok(())).unwrap_err();
            assert!(why.contains(reason), "{sql}: {why}");
        }
    }
    // Strings, and floats beside other columns, are hashed and checked
    // on the host: on the CPU unless gpu.hashed_group_keys is set. A
    // single float column is its own key.
    for sql in [
        "SELECT CAST(k AS VARCHAR), count(*) FROM r GROUP BY CAST(k AS VARCHAR)",
        "SELECT CAST(v AS DOUBLE), k, max(k) FROM r GROUP BY CAST(v AS DOUBLE), k",
    ] {
        let plan = rewritten(sql, false).await;
        let aggs = cpu_aggregates(&plan);
        assert!(!aggs.is_empty(), "{sql}\n{}", show(&plan));
        for agg in aggs {
            let why = super::decide_aggregate(agg, &options, Ok(())).unwrap_err();
            assert!(
                why.contains("gpu.hashed_group_keys = false"),
                "{sql}: {why}"
            );
        }
        let hashed = GpuOptions {
            hashed_group_keys: true,
            ..options.clone()
        };
        let plan = rewritten_with(sql, hashed).await;
        assert!(cpu_aggregates(&plan).is_empty(), "{sql}\n{}", show(&plan));
        assert_eq!(gpu_aggregates(&plan).len(), 2, "{sql}\n{}", show(&plan));
    }
    let plan = rewritten(
        "SELECT CAST(v AS DOUBLE), max(k) FROM r GROUP BY CAST(v AS DOUBLE)",
        false,
    )
    .await;
    assert!(cpu_aggregates(&plan).is_empty(), "{}", show(&plan));
    // Groups unknown by statistics, and an input far too small for the
    // run-time check of the groups to pay: the reason says so.
    let plan = rewritten("SELECT k, count(*) FROM r GROUP BY k", false).await;
    let agg = gpu_aggregates(&plan)[0].aggregate();
    let why = super::decide_aggregate(agg, &GpuOptions::default(), Ok(())).unwrap_err();
    assert!(why.starts_with("groups unknown by statistics"), "{why}");
    assert!(why.contains("below the 40 ms"), "{why}");
    assert!(why.contains("(gpu.placement = 'cost')"), "{why}");
}

#[tokio::test]
async fn aggregations_without_group_by_stay_on_the_cpu_unless_placement_is_always() {
    let sql = "SELECT count(*), sum(v) FROM r";
    // The rewrite with gpu.placement = 'always' sends both phases to the GPU.
    let plan = rewritten(sql, false).await;
    let aggs = gpu_aggregates(&plan);
    assert!(!aggs.is_empty(), "{}", show(&plan));
    let by_cost = GpuOptions::default();
    let always = GpuOptions {
        placement: PlacementPolicy::Always,
        ..GpuOptions::default()
    };
    for agg in aggs {
        let agg = agg.aggregate();
        let why = super::decide_aggregate(agg, &by_cost, Ok(())).unwrap_err();
        assert!(why.contains(" against CPU "), "{why}");
        let estimate = super::decide_aggregate(agg, &always, Ok(()))
            .unwrap()
            .expect("the table has statistics");
        assert!(!estimate.gpu_faster(), "{estimate}");
    }
}

/// The rule's options for the tests of aggregations computed in joins:
/// every join on the GPU, and every aggregation the join does not compute
/// on the CPU.
pub(super) fn aggregate_in_join_options(aggregate_in_join: bool) -> GpuOptions {
    GpuOptions {
        placement: PlacementPolicy::Always,
        aggregate: false,
        tuning: GpuTuning {
            aggregate_single_phase: false,
            aggregate_in_join,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    }
}

/// An aggregation a join computes, and those it does not (with
/// `GROUP BY`, `FILTER`, a function or argument it does not reduce,
/// above a join that does not emit one row per pair).
pub(super) const AGGREGATE_IN_JOIN: &str =
    "SELECT count(*), sum(r.v), min(s.v), max(r.k), count(s.v) \
                                 FROM r JOIN s ON r.k = s.k";
pub(super) const AGGREGATES_NOT_IN_JOIN: [&str; 6] = [
    "SELECT r.k, count(*) FROM r JOIN s ON r.k = s.k GROUP BY r.k",
    "SELECT sum(r.v) FILTER (WHERE r.v > 3) FROM r JOIN s ON r.k = s.k",
    "SELECT avg(r.v) FROM r JOIN s ON r.k = s.k",
    "SELECT sum(r.v + 1) FROM r JOIN s ON r.k = s.k",
    "SELECT count(*), sum(s.v) FROM r LEFT JOIN s ON r.k = s.k",
    "SELECT count(*) FROM r JOIN s ON r.k = s.k AND r.v < s.v",
];

/// DataFusion's `Partial` aggregations left in `plan`.
pub(super) fn partial_aggregations(plan: &Arc<dyn ExecutionPlan>) -> usize {
    use datafusion::physical_plan::aggregates::AggregateMode;
    cpu_aggregates(plan)
        .iter()
        .filter(|agg| *agg.mode() == AggregateMode::Partial)
        .count()
}

#[tokio::test]
async fn an_ungrouped_aggregate_above_an_inner_join_is_computed_in_the_join() {
    use datafusion::physical_plan::aggregates::AggregateMode;
    let options = aggregate_in_join_options;
    let sql = AGGREGATE_IN_JOIN;
    let partial_modes = partial_aggregations;
    let plan = rewritten_with(sql, options(true)).await;
    let joins = gpu_joins(&plan);
    assert_eq!(joins.len(), 1, "{}", show(&plan));
    assert_eq!(
        joins[0].partial_aggregate().as_deref(),
        Some("count(Int64(1)), sum(r.v), min(s.v), max(r.k), count(s.v)"),
        "{}",
        show(&plan)
    );
    assert_eq!(partial_modes(&plan), 0, "{}", show(&plan));
    let finals = cpu_aggregates(&plan);
    assert_eq!(finals.len(), 1, "{}", show(&plan));
    assert_eq!(*finals[0].mode(), AggregateMode::Final);
    // The join's node has the partial aggregation's schema.
    assert_eq!(
        finals[0].input().children()[0].schema(),
        joins[0].schema(),
        "{}",
        show(&plan)
    );
    assert!(show(&plan).contains("partial_aggregate=[count(Int64(1)), sum(r.v)"));
    // The join reads every probe partition itself, as one: r's four (the
    // smaller s is the build side).
    assert!(
        show(&plan).contains("probe_reads_merge_inputs=4"),
        "{}",
        show(&plan)
    );
    assert_eq!(
        joins[0]
            .properties()
            .output_partitioning()
            .partition_count(),
        1
    );
    let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
    assert!(
        decisions.iter().any(|d| d.operator == "AggregateExec"
            && d.on_gpu()
            && d.to_string().contains("partial_aggregate")),
        "{decisions:?}"
    );

    // Without merged partitions, one partition's states per probe
    // partition.
    let unmerged = GpuOptions {
        tuning: GpuTuning {
            merge_partitions: false,
            ..options(true).tuning
        },
        ..options(true)
    };
    let plan = rewritten_with(sql, unmerged).await;
    let joins = gpu_joins(&plan);
    assert!(joins[0].partial_aggregate().is_some(), "{}", show(&plan));
    assert!(!show(&plan).contains("probe_reads_merge_inputs"));
    assert!(
        joins[0]
            .properties()
            .output_partitioning()
            .partition_count()
            > 1
    );

    // Switched off, DataFusion's partial aggregation stays, and the
    // probe keeps its partitions.
    let plan = rewritten_with(sql, options(false)).await;
    assert!(gpu_joins(&plan)[0].partial_aggregate().is_none());
    assert!(!show(&plan).contains("probe_reads_merge_inputs"));
    assert_eq!(partial_modes(&plan), 1, "{}", show(&plan));

    // Aggregations the join does not compute, and joins that do not
    // emit one row per pair.
    for sql in AGGREGATES_NOT_IN_JOIN {
        let plan = rewritten_with(sql, options(true)).await;
        let joins = gpu_joins(&plan);
        assert!(!joins.is_empty(), "{sql}\n{}", show(&plan));
        assert!(
            joins.iter().all(|j| j.partial_aggregate().is_none()),
            "{sql}\n{}",
            show(&plan)
        );
    }
}

#[tokio::test]
async fn an_ungrouped_aggregate_above_a_sort_merge_join_is_computed_in_the_join() {
    use datafusion::physical_plan::aggregates::AggregateMode;
    let options = aggregate_in_join_options;
    let sql = AGGREGATE_IN_JOIN;
    let partial_modes = partial_aggregations;
    // One join over all input partitions, sorted or not (a join that
    // aggregates hands no rows on), its one row of states in one
    // partition (the merge above needs no more); with
    // `merge_partitions` off, one join per hash partition, each
    // computing its partition's states.
    for (sorted, merge_partitions) in [(false, true), (true, true), (false, false)] {
        let options = |aggregate_in_join| GpuOptions {
            tuning: GpuTuning {
                merge_partitions,
                ..options(aggregate_in_join).tuning
            },
            ..options(aggregate_in_join)
        };
        let plan = merge_join_plan(sql, &options(true), sorted).await;
        let text = show(&plan);
        let joins = gpu_merge_joins(&plan);
        assert_eq!(joins.len(), 1, "{text}");
        assert_eq!(joins[0].repartitions_removed(), merge_partitions, "{text}");
        assert_eq!(
            hash_repartitions(&plan),
            if merge_partitions { 0 } else { 2 },
            "{text}"
        );
        assert_eq!(
            joins[0].partial_aggregate().as_deref(),
            Some("count(Int64(1)), sum(r.v), min(s.v), max(r.k), count(s.v)"),
            "{text}"
        );
        assert!(text.contains("partial_aggregate=[count(Int64(1)), sum(r.v)"));
        assert_eq!(partial_modes(&plan), 0, "{text}");
        let finals = cpu_aggregates(&plan);
        assert_eq!(finals.len(), 1, "{text}");
        assert_eq!(*finals[0].mode(), AggregateMode::Final);
        // The join's node has the partial aggregation's schema.
        assert_eq!(
            finals[0].input().children()[0].schema(),
            joins[0].schema(),
            "{text}"
        );
        assert!(!text.contains("RoundRobinBatch"), "{text}");
        assert_eq!(
            joins[0]
                .properties()
                .output_partitioning()
                .partition_count()
                == 1,
            merge_partitions,
            "{text}"
        );
        let stats = StatisticsContext::new()
            .compute(joins[0], &StatisticsArgs::new())
            .unwrap();
        assert_eq!(
            stats.column_statistics.len(),
            joins[0].schema().fields().len()
        );
        let decisions = crate::planner::gpu_decisions(&plan, &ConfigOptions::new());
        assert!(
            decisions.iter().any(|d| d.operator == "AggregateExec"
                && d.on_gpu()
                && d.to_string().contains("GPU sort-merge join")),
            "{decisions:?}"
        );

        // Switched off, DataFusion's partial aggregation stays.
        let plan = merge_join_plan(sql, &options(false), sorted).await;
        assert!(gpu_merge_joins(&plan)[0].partial_aggregate().is_none());
        assert_eq!(partial_modes(&plan), 1, "{}", show(&plan));
    }

    // Aggregations the join does not compute, and joins that do not
    // emit one row per pair.
    for sql in AGGREGATES_NOT_IN_JOIN {
        let plan = merge_join_plan(sql, &options(true), true).await;
        let joins = gpu_merge_joins(&plan);
        assert!(!joins.is_empty(), "{sql}\n{}", show(&plan));
        assert!(
            joins.iter().all(|j| j.partial_aggregate().is_none()),
            "{sql}\n{}",
            show(&plan)
        );
    }
}

/// Every node of `plan`, parents first.
fn plan_nodes(plan: &Arc<dyn ExecutionPlan>) -> Vec<&Arc<dyn ExecutionPlan>> {
    let mut nodes = vec![plan];
    for child in plan.children() {
        nodes.extend(plan_nodes(child));
    }
    nodes
}

#[tokio::test]
async fn a_partial_aggregation_over_a_table_scan_runs_as_a_scan_aggregation() {
    use crate::exec::GpuScanAggregateExec;
    let options = |cache: bool| GpuOptions {
        placement: PlacementPolicy::Always,
        cache,
        ..GpuOptions::default()
    };
    let scan_aggregations = |plan: &Arc<dyn ExecutionPlan>| {
        plan_nodes(plan)
            .into_iter()
            .filter(|node| node.downcast_ref::<GpuScanAggregateExec>().is_some())
            .count()
    };
    // Ungrouped, over a filter and a projection: the partial aggregation,
    // its filter and its scan become one node; DataFusion's final
    // aggregation stays above it.
    let sql = "SELECT count(*), sum(v * 2), min(k) FROM r WHERE v > 10 AND k IS NOT NULL";
    let plan = rewritten_with(sql, options(true)).await;
    assert_eq!(scan_aggregations(&plan), 1, "{}", show(&plan));
    assert!(show(&plan).contains("GpuScanAggregateExec: algorithm=scan_aggregate"));
    assert!(
        show(&plan).contains("filter=[v@1 > 10 AND k@0 IS NOT NULL]"),
        "{}",
        show(&plan)
    );
    let final_mode = datafusion::physical_plan::aggregates::AggregateMode::Final;
    let finals = cpu_aggregates(&plan)
        .into_iter()
        .filter(|agg| *agg.mode() == final_mode)
        .count()
        + gpu_aggregates(&plan)
            .into_iter()
            .filter(|agg| *agg.aggregate().mode() == final_mode)
            .count();
    assert_eq!(finals, 1, "{}", show(&plan));
    // Its one partition holds every group.
    let node = plan_nodes(&plan)
        .into_iter()
        .find(|node| node.downcast_ref::<GpuScanAggregateExec>().is_some())
        .unwrap();
    assert_eq!(node.properties().output_partitioning().partition_count(), 1);
    // Off with the cache; integer group keys are not coded on the device
    // (GpuAggregateExec takes those); a division is not evaluated there.
    assert_eq!(
        scan_aggregations(&rewritten_with(sql, options(false)).await),
        0
    );
    // Under the cost placement, a table of 400 rows stays DataFusion's.
    let cost = GpuOptions {
        placement: PlacementPolicy::Cost,
        ..options(true)
    };
    assert_eq!(scan_aggregations(&rewritten_with(sql, cost).await), 0);
    for sql in [
        "SELECT k, count(*) FROM r GROUP BY k",
        "SELECT sum(v / 3) FROM r",
    ] {
        let plan = rewritten_with(sql, options(true)).await;
        assert_eq!(scan_aggregations(&plan), 0, "{sql}\n{}", show(&plan));
    }
}

/// A filter of a GPU aggregation's groups (a `HAVING`) runs inside it,
/// directly above it or past the repartitions that deal its groups, in
/// every placement of the phases; its projection stays above. A filter
/// of partial states, or of groups the aggregation sorts, stays
/// DataFusion's.
#[tokio::test]
async fn a_filter_of_the_groups_runs_inside_the_gpu_aggregation() {
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    let options = |aggregate_single_phase| GpuOptions {
        placement: PlacementPolicy::Always,
        tuning: GpuTuning {
            aggregate_single_phase,
            scan_aggregate: false,
            ..GpuTuning::default()
        },
        ..GpuOptions::default()
    };
    let filters = |plan: &Arc<dyn ExecutionPlan>| nodes_of::<FilterExec>(plan).len();
    let having = "SELECT k, sum(v) AS total FROM r GROUP BY k HAVING sum(v) > 10";
    let hidden = "SELECT k FROM r GROUP BY k HAVING sum(v) > 10 AND count(*) > 1";
    let joined = "SELECT a.k, s.v FROM (SELECT k FROM r GROUP BY k HAVING count(*) > 1) a \
                  JOIN s ON a.k = s.k";
    for single_phase in [true, false] {
        for sql in [having, hidden, joined] {
            let plan = rewritten_with(sql, options(single_phase)).await;
            let text = show(&plan);
            assert_eq!(filters(&plan), 0, "{sql}\n{text}");
            let filtered = gpu_aggregates(&plan)
                .into_iter()
                .filter(|agg| agg.output_filter().is_some())
                .count();
            assert_eq!(filtered, 1, "{sql}\n{text}");
            assert!(text.contains(", filter=["), "{text}");
            // The columns the filter kept, and no others.
            if sql == hidden {
                assert!(!nodes_of::<ProjectionExec>(&plan).is_empty(), "{text}");
                assert_eq!(plan.schema().fields().len(), 1, "{text}");
            }
        }
    }
    // The join above still reads the aggregation's groups hash-partitioned
    // on the key, filtered below the repartitions.
    let plan = rewritten_with(joined, options(true)).await;
    let text = show(&plan);
    let repartition = text
        .find("RepartitionExec: partitioning=Hash([k@0], 4)")
        .expect(&text);
    let aggregation = text.find("GpuAggregateExec").expect(&text);
    assert!(repartition < aggregation, "{text}");

    // Groups the aggregation sorts, and partial states, are not filtered
    // inside it: a filter over either stays DataFusion's.
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, col, lit};
    use datafusion::physical_plan::aggregates::AggregateMode;
    let sorted = "SELECT k, count(*) FROM r GROUP BY k ORDER BY k";
    let two_phases = "SELECT k, count(*) FROM r GROUP BY k";
    for (sql, single_phase) in [(sorted, true), (two_phases, false)] {
        let plan = rewritten_with(sql, options(single_phase)).await;
        let text = show(&plan);
        let refused = nodes_of::<GpuAggregateExec>(&plan)
            .into_iter()
            .find(|node| {
                let agg = node.downcast_ref::<GpuAggregateExec>().unwrap();
                agg.group_ordering().is_some() || *agg.aggregate().mode() == AggregateMode::Partial
            })
            .unwrap_or_else(|| panic!("no sorting or partial GPU aggregation\n{text}"));
        let schema = refused.schema();
        let count = col(schema.field(1).name(), &schema).unwrap();
        let predicate = binary(count, Operator::Gt, lit(1i64), &schema).unwrap();
        let filter = FilterExec::try_new(predicate, Arc::clone(&refused)).unwrap();
        let agg = refused.downcast_ref::<GpuAggregateExec>().unwrap();
        assert!(
            agg.with_output_filter(&filter).unwrap().is_none(),
            "{sql}\n{text}"
        );
    }
}
