//! Filters and projections over a table scan become a `GpuScanFilterExec`.

use super::*;
use crate::exec::{GpuScanAggregateExec, GpuScanFilterExec};
use datafusion::physical_plan::filter::FilterExec;

fn options(cache: bool, placement: PlacementPolicy) -> GpuOptions {
    GpuOptions {
        placement,
        cache,
        ..GpuOptions::default()
    }
}

async fn planned(sql: &str, options: GpuOptions) -> Arc<dyn ExecutionPlan> {
    rewritten_as_given(SessionConfig::new().with_target_partitions(4), sql, options).await
}

#[tokio::test]
async fn filters_and_projections_over_a_table_scan_run_as_a_scan_filter() {
    let always = || options(true, PlacementPolicy::Always);
    // A projection over a filter over the scan: one node in place of the
    // chain, with its schema and its partitions (r has 4).
    let sql = "SELECT v * 2 AS w, k FROM r WHERE v > 10 AND k IS NOT NULL";
    let plan = planned(sql, always()).await;
    let found = nodes_of::<GpuScanFilterExec>(&plan);
    assert_eq!(found.len(), 1, "{}", show(&plan));
    let node = &found[0];
    assert_eq!(node.properties().output_partitioning().partition_count(), 4);
    let schema = node.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["w", "k"]);
    assert!(
        show(&plan).contains("GpuScanFilterExec: algorithm=scan_filter"),
        "{}",
        show(&plan)
    );
    assert!(
        show(&plan).contains("filter=[v@1 > 10 AND k@0 IS NOT NULL]"),
        "{}",
        show(&plan)
    );
    // The decisions name it, and nothing below it.
    let decisions = gpu_decisions_of(&plan, always());
    assert_eq!(
        decisions
            .iter()
            .filter(|d| d.contains("scan_filter"))
            .count(),
        1,
        "{decisions:?}"
    );

    // Under a join, each filtered side.
    let sql = "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k WHERE r.v > 10 AND s.v < 50";
    let plan = planned(sql, always()).await;
    assert!(
        !nodes_of::<GpuScanFilterExec>(&plan).is_empty(),
        "{}",
        show(&plan)
    );

    // A partial aggregation over the same chain: the scan aggregation takes
    // it all.
    let sql = "SELECT count(*), sum(v) FROM r WHERE v > 10";
    let plan = planned(sql, always()).await;
    assert_eq!(
        nodes_of::<GpuScanAggregateExec>(&plan).len(),
        1,
        "{}",
        show(&plan)
    );
    assert!(
        nodes_of::<GpuScanFilterExec>(&plan).is_empty(),
        "{}",
        show(&plan)
    );

    // Not without the cache, with the tuning switch off, over an
    // expression the device does not evaluate, or under the cost
    // placement for a table of 400 rows.
    let sql = "SELECT k, v FROM r WHERE v > 10";
    let mut off = always();
    off.tuning.scan_filter = false;
    for (options, sql) in [
        (options(false, PlacementPolicy::Always), sql),
        (off, sql),
        (always(), "SELECT k FROM r WHERE v % 3 = 0"),
        (options(true, PlacementPolicy::Cost), sql),
    ] {
        let plan = planned(sql, options.clone()).await;
        assert!(
            nodes_of::<GpuScanFilterExec>(&plan).is_empty(),
            "{sql} (cache {}, placement {:?}, scan_filter {})\n{}",
            options.cache,
            options.placement,
            options.tuning.scan_filter,
            show(&plan)
        );
        let decisions = gpu_decisions_of(&plan, options);
        assert!(
            decisions
                .iter()
                .any(|d| d.contains("scan_filter not possible")),
            "{sql}: {decisions:?}"
        );
    }
}

/// A MemTable of 2^20 rows (four partitions), keys 0 to 2^20 - 1.
fn memory_table_of_2_20_rows() -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let rows = 1i64 << 18;
    let parts = (0..4)
        .map(|p| {
            let k: ArrayRef = Arc::new(Int64Array::from_iter_values(p * rows..(p + 1) * rows));
            let v: ArrayRef = Arc::new(Int64Array::from_iter_values((0..rows).map(|r| r % 7)));
            vec![RecordBatch::try_new(Arc::clone(&schema), vec![k, v]).unwrap()]
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

#[tokio::test]
async fn under_the_cost_placement_a_scan_aggregation_of_a_table_in_memory_is_placed_by_its_estimate(
) {
    // 2^20 rows, the size from which the device keeps a scan's columns,
    // but in memory: DataFusion aggregates them in a millisecond or two,
    // less than the device's fixed costs.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_table("big", memory_table_of_2_20_rows())
        .unwrap();
    let sql = "SELECT count(*), sum(v), max(k) FROM big";
    let plan = physical_plan_of(&ctx, sql).await;
    let partial = nodes_of::<datafusion::physical_plan::aggregates::AggregateExec>(&plan)
        .into_iter()
        .find(|node| {
            let agg = node.downcast_ref::<datafusion::physical_plan::aggregates::AggregateExec>();
            agg.is_some_and(|agg| {
                *agg.mode() == datafusion::physical_plan::aggregates::AggregateMode::Partial
            })
        })
        .unwrap_or_else(|| panic!("{}", show(&plan)));
    let placed = |placement| {
        crate::planner::decide_scan_aggregate(&partial, &options(true, placement), Ok(()))
            .map(|node| node.is_some())
    };
    let reason = placed(PlacementPolicy::Cost).unwrap_err();
    assert!(
        reason.contains("a scan aggregation of a table in memory: estimated GPU"),
        "{reason}"
    );
    assert_eq!(placed(PlacementPolicy::Always), Ok(true));
    let aggregations = |placement| {
        let ctx = ctx.clone();
        async move {
            let plan = physical_plan_of(&ctx, sql).await;
            let plan = rewrite_plan(
                plan,
                &options(true, placement),
                Ok(()),
                RootPartitions::Merged,
            )
            .unwrap();
            (nodes_of::<GpuScanAggregateExec>(&plan).len(), show(&plan))
        }
    };
    let (found, text) = aggregations(PlacementPolicy::Cost).await;
    assert_eq!(found, 0, "{text}");
    let (found, text) = aggregations(PlacementPolicy::Always).await;
    assert_eq!(found, 1, "{text}");
}

/// The decisions for `plan`, as text.
fn gpu_decisions_of(plan: &Arc<dyn ExecutionPlan>, options: GpuOptions) -> Vec<String> {
    let mut config = datafusion::config::ConfigOptions::new();
    config.extensions.insert(options);
    crate::gpu_decisions(plan, &config)
        .iter()
        .map(|d| d.to_string())
        .collect()
}

/// The ids of the key sets the plan's collectors gather.
fn key_set_ids(plan: &Arc<dyn ExecutionPlan>) -> Vec<usize> {
    use crate::exec::join_keys::JoinKeyCollectorExec;
    nodes_of::<JoinKeyCollectorExec>(plan)
        .iter()
        .filter_map(|c| c.downcast_ref::<JoinKeyCollectorExec>())
        .map(|c| c.keys().id())
        .collect()
}

#[tokio::test]
async fn a_hash_join_hands_its_build_keys_to_the_scan_of_its_probe_side() {
    use crate::exec::join_keys::{JoinKeyCollectorExec, JoinKeyWaitExec};
    use crate::exec::GpuAggregateExec;
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::physical_plan::aggregates::AggregateExec;
    use datafusion::physical_plan::joins::HashJoinExec;
    // The joins stay on the CPU.
    let cpu_joins = |cache, placement| GpuOptions {
        hash_join: false,
        sort_merge_join: false,
        aggregate: false,
        ..options(cache, placement)
    };
    let always = || cpu_joins(true, PlacementPolicy::Always);
    let collectors = |plan: &Arc<dyn ExecutionPlan>| nodes_of::<JoinKeyCollectorExec>(plan).len();
    // Neither side filtered: the probe side's scan alone becomes a scan
    // filter that tests the keys gathered above the build side.
    for sql in [
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
        "SELECT r.v FROM r WHERE r.k IN (SELECT k FROM s WHERE v < 5)",
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k AND r.v = s.v WHERE s.v > 3",
    ] {
        let plan = planned(sql, always()).await;
        let text = show(&plan);
        let joins = nodes_of::<HashJoinExec>(&plan);
        assert_eq!(joins.len(), 1, "{sql}\n{text}");
        let join = joins[0].downcast_ref::<HashJoinExec>().unwrap();
        let collector = join
            .left()
            .downcast_ref::<JoinKeyCollectorExec>()
            .unwrap_or_else(|| panic!("{sql}: no key collector on the build side\n{text}"));
        let id = collector.keys().id();
        let tested = nodes_of::<GpuScanFilterExec>(join.right());
        assert_eq!(tested.len(), 1, "{sql}\n{text}");
        assert!(
            show(&tested[0]).contains(&format!("IN join keys #{id}")),
            "{sql}\n{text}"
        );
        let decisions = gpu_decisions_of(&plan, always());
        assert!(
            decisions
                .iter()
                .any(|d| d.contains(&format!("its build keys (#{id}) filter the scan"))),
            "{sql}: {decisions:?}"
        );
        assert!(
            decisions
                .iter()
                .any(|d| d.contains("tested against the build keys of the joins above")),
            "{sql}: {decisions:?}"
        );
    }
    // A semi join over an inner join: its keys reach the scans of both
    // inputs, beside the inner join's own.
    let sql = "SELECT r.v FROM r JOIN s ON r.k = s.k WHERE r.k IN (SELECT k FROM t WHERE v < 5)";
    let plan = planned(sql, always()).await;
    let text = show(&plan);
    let ids = key_set_ids(&plan);
    assert_eq!(ids.len(), 2, "{text}");
    let scans = nodes_of::<GpuScanFilterExec>(&plan);
    let widest = ids
        .iter()
        .map(|id| {
            let test = format!("IN join keys #{id}");
            scans
                .iter()
                .filter(|scan| show(scan).contains(&test))
                .count()
        })
        .max();
    assert_eq!(widest, Some(2), "{text}");

    // An aggregation on the probe side that groups by the key, on the CPU
    // or the GPU: the keys reach the scan below it. Not where the key is
    // an aggregate's result, nor under grouping sets.
    for aggregate in [false, true] {
        let options = GpuOptions {
            aggregate,
            ..always()
        };
        let sql = "SELECT s.v, a.n FROM s JOIN \
                   (SELECT k, count(*) AS n FROM r WHERE v > 2 GROUP BY k) a ON s.k = a.k";
        let plan = planned(sql, options.clone()).await;
        let text = show(&plan);
        let collectors = nodes_of::<JoinKeyCollectorExec>(&plan);
        assert_eq!(collectors.len(), 1, "{text}");
        let id = collectors[0]
            .downcast_ref::<JoinKeyCollectorExec>()
            .unwrap()
            .keys()
            .id();
        let under_aggregate = |plan: &Arc<dyn ExecutionPlan>| {
            let mut aggregates = nodes_of::<AggregateExec>(plan);
            aggregates.extend(nodes_of::<GpuAggregateExec>(plan));
            aggregates.iter().any(|aggregate| {
                nodes_of::<GpuScanFilterExec>(aggregate)
                    .iter()
                    .any(|scan| show(scan).contains(&format!("IN join keys #{id}")))
            })
        };
        assert!(
            under_aggregate(&plan),
            "aggregate on the GPU: {aggregate}\n{text}"
        );
        assert_eq!(
            nodes_of::<GpuAggregateExec>(&plan).is_empty(),
            !aggregate,
            "{text}"
        );
        for sql in [
            "SELECT s.v FROM s JOIN (SELECT v, max(k) AS m FROM r GROUP BY v) a ON s.k = a.m",
            "SELECT s.v FROM s JOIN \
             (SELECT k, v, count(*) AS n FROM r GROUP BY ROLLUP(k, v)) a ON s.k = a.k",
        ] {
            let plan = planned(sql, options.clone()).await;
            let text = show(&plan);
            let ids = key_set_ids(&plan);
            let mut aggregates = nodes_of::<AggregateExec>(&plan);
            aggregates.extend(nodes_of::<GpuAggregateExec>(&plan));
            // The join hands over keys, and an aggregation is there: none
            // of the tests lies below it.
            assert!(!ids.is_empty() && !aggregates.is_empty(), "{sql}\n{text}");
            for aggregate in aggregates {
                assert!(
                    !show(&aggregate).contains("IN join keys"),
                    "{sql}: {ids:?}\n{text}"
                );
            }
        }
    }

    // A scan the device does not read (the cache off) is tested on the
    // host. Under the cost placement, not where the scan is right below
    // the join (the test saves nothing the join's probe does not do), nor
    // where the build side is a whole table of more than an eighth of the
    // probe side's rows (below).
    let sql = "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k WHERE s.v < 50";
    let plan = planned(sql, cpu_joins(true, PlacementPolicy::Cost)).await;
    assert_eq!(collectors(&plan), 0, "{}", show(&plan));
    for options in [cpu_joins(false, PlacementPolicy::Always)] {
        let plan = planned(sql, options).await;
        let text = show(&plan);
        assert_eq!(collectors(&plan), 1, "{text}");
        assert!(nodes_of::<GpuScanFilterExec>(&plan).is_empty(), "{text}");
        let tested = nodes_of::<FilterExec>(&plan);
        assert!(
            tested.iter().any(|f| show(f).contains("IN join keys")),
            "{text}"
        );
        // The scan below the test is read once the keys are there.
        let waits = nodes_of::<JoinKeyWaitExec>(&plan);
        assert_eq!(waits.len(), 1, "{text}");
        assert!(
            waits[0].children()[0]
                .downcast_ref::<DataSourceExec>()
                .is_some(),
            "{text}"
        );
    }
    // Under the cost placement, no keys are gathered where statistics know
    // the build side exactly (a whole table) and it holds more than an
    // eighth of the probe side's rows (t's 100 against r's 400), or none
    // (DataFusion's join then skips its probe side); the same joins are
    // tested under `gpu.placement = 'always'`.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_table("r", table(4)).unwrap();
    ctx.register_table("s", table(3)).unwrap();
    ctx.register_table("t", table(1)).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let empty = MemTable::try_new(schema, vec![vec![]]).unwrap();
    ctx.register_table("e", Arc::new(empty)).unwrap();
    let filtered = |plan: &Arc<dyn ExecutionPlan>| show(plan).contains("IN join keys");
    // (The probe sides aggregate, so that a test below them would save
    // the aggregation work.)
    for sql in [
        "SELECT t.v, a.n FROM t JOIN (SELECT k, count(*) AS n FROM r GROUP BY k) a ON t.k = a.k",
        "SELECT e.v, a.n FROM e JOIN (SELECT k, count(*) AS n FROM r GROUP BY k) a ON e.k = a.k",
    ] {
        let plan = physical_plan_of(&ctx, sql).await;
        let cost = rewrite_plan(
            Arc::clone(&plan),
            &cpu_joins(true, PlacementPolicy::Cost),
            Ok(()),
            RootPartitions::Merged,
        )
        .unwrap();
        assert_eq!(collectors(&cost), 0, "{sql}:\n{}", show(&cost));
        assert!(!filtered(&cost), "{sql}:\n{}", show(&cost));
        let always = rewrite_plan(plan, &always(), Ok(()), RootPartitions::Merged).unwrap();
        assert_eq!(collectors(&always), 1, "{sql}:\n{}", show(&always));
        assert!(filtered(&always), "{sql}:\n{}", show(&always));
    }
    // A build side of a tenth of the probe side's rows is tested.
    ctx.register_table("big", table(10)).unwrap();
    let sql =
        "SELECT t.v, a.n FROM t JOIN (SELECT k, count(*) AS n FROM big GROUP BY k) a ON t.k = a.k";
    let plan = physical_plan_of(&ctx, sql).await;
    let options = cpu_joins(true, PlacementPolicy::Cost);
    let cost = rewrite_plan(plan, &options, Ok(()), RootPartitions::Merged).unwrap();
    assert_eq!(collectors(&cost), 1, "{sql}:\n{}", show(&cost));
    assert!(filtered(&cost), "{sql}:\n{}", show(&cost));

    // A partitioned join's build side is read partition by partition: its
    // keys are tested on the host without a wait.
    let plan = rewritten_where(
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
        cpu_joins(true, PlacementPolicy::Always),
        0,
    )
    .await;
    let text = show(&plan);
    assert!(text.contains("mode=Partitioned"), "{text}");
    assert!(text.contains("IN join keys"), "{text}");
    assert!(nodes_of::<JoinKeyWaitExec>(&plan).is_empty(), "{text}");
    // Two joins' keys tested on the host over one scan: one wait, for both.
    let sql = "SELECT r.v FROM r JOIN s ON r.k = s.k WHERE r.k IN (SELECT k FROM t WHERE v < 5)";
    let plan = planned(sql, cpu_joins(false, PlacementPolicy::Always)).await;
    let text = show(&plan);
    let waits = nodes_of::<JoinKeyWaitExec>(&plan);
    assert!(
        waits.iter().any(|w| show(w).matches('#').count() == 2),
        "{text}"
    );
    // A limit on the probe side's path: a test below it would let other
    // rows in, so there is none.
    let sql = "SELECT t.v, r2.v FROM t JOIN (SELECT k, v FROM r LIMIT 300) r2 ON t.k = r2.k";
    let plan = planned(sql, always()).await;
    let text = show(&plan);
    assert!(
        text.contains("fetch=300") || text.contains("limit=300"),
        "{text}"
    );
    assert!(!text.contains("IN join keys"), "{text}");
    // Where a probe row without a match makes output, where NULL keys
    // count (NOT IN), or with the switch off: no key filter.
    let mut off = always();
    off.tuning.join_key_filters = false;
    for (sql, options) in [
        ("SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k", always()),
        (
            "SELECT r.v FROM r WHERE r.k NOT IN (SELECT k FROM s)",
            always(),
        ),
        ("SELECT r.v, s.v FROM r JOIN s ON r.k = s.k", off),
    ] {
        let plan = planned(sql, options).await;
        assert_eq!(collectors(&plan), 0, "{sql}\n{}", show(&plan));
        assert!(
            !show(&plan).contains("IN join keys"),
            "{sql}\n{}",
            show(&plan)
        );
    }
}

#[tokio::test]
async fn under_the_cost_placement_a_scan_of_a_table_in_memory_that_only_tests_keys_is_placed_by_its_estimate(
) {
    // Two tables of 2^20 rows (the size from which the device keeps a
    // scan's columns), joined on the CPU.
    let big = memory_table_of_2_20_rows;
    let options = GpuOptions {
        hash_join: false,
        sort_merge_join: false,
        aggregate: false,
        ..options(true, PlacementPolicy::Cost)
    };
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_table("big", big()).unwrap();
    ctx.register_table("big2", big()).unwrap();
    let plan_of = |sql: &'static str| {
        let ctx = ctx.clone();
        let options = options.clone();
        async move {
            let plan = physical_plan_of(&ctx, sql).await;
            rewrite_plan(plan, &options, Ok(()), RootPartitions::Merged).unwrap()
        }
    };
    // The build side, estimated at more than an eighth of the probe
    // side's rows, does not keep the test off: the scan would decide by
    // the set at run time. But a scan of a table in memory saves
    // DataFusion no decoding, only its join's probes of 2^20 rows (a
    // millisecond or two on a few threads), less than the device's fixed
    // costs: the keys are tested on the host, DataFusion's scan below.
    let sql = "SELECT big.v FROM big JOIN big2 ON big.k = big2.k WHERE big2.v = 3";
    let plan = plan_of(sql).await;
    let text = show(&plan);
    let on_device: Vec<_> = nodes_of::<GpuScanFilterExec>(&plan)
        .into_iter()
        .filter(|scan| show(scan).contains("IN join keys"))
        .collect();
    assert!(on_device.is_empty(), "{text}");
    assert!(
        nodes_of::<FilterExec>(&plan)
            .iter()
            .any(|f| show(f).contains("IN join keys")),
        "{text}"
    );
    // The estimate that decided it.
    let estimate = crate::cost::memory_key_test(
        &crate::cost::KeyTestShape {
            probe_rows: 1 << 20,
            build_rows: Some((1 << 20) / 7),
            threads: 4,
        },
        &crate::cost::DeviceConstants::TYPICAL,
    );
    assert!(!estimate.gpu_faster(), "{estimate}");
    // Under `gpu.placement = 'always'` the device reads the scan, whatever
    // its size.
    let always = GpuOptions {
        placement: PlacementPolicy::Always,
        ..options.clone()
    };
    let plan = physical_plan_of(&ctx, sql).await;
    let plan = rewrite_plan(plan, &always, Ok(()), RootPartitions::Merged).unwrap();
    let text = show(&plan);
    let tested: Vec<_> = nodes_of::<GpuScanFilterExec>(&plan)
        .into_iter()
        .filter(|scan| show(scan).contains("IN join keys"))
        .collect();
    assert_eq!(tested.len(), 1, "{text}");
    assert!(
        !tested[0]
            .downcast_ref::<GpuScanFilterExec>()
            .unwrap()
            .filters_of_its_own(),
        "{text}"
    );
}

#[tokio::test]
async fn gpu_nodes_over_filtered_parquet_scans_read_them_from_the_cache() {
    use crate::exec::{GpuAggregateExec, GpuHashJoinExec};
    use crate::planner::cached_inputs::with_cached_gpu_inputs;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::prelude::ParquetReadOptions;
    // A Parquet table, the same rows in memory.
    let dir = std::env::temp_dir().join(format!(
        "datafusion-gpu-cached-inputs-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let batches: Vec<RecordBatch> = (0..4i64)
        .map(|p| {
            let k: ArrayRef = Arc::new(Int64Array::from_iter_values(p * 1000..(p + 1) * 1000));
            let v: ArrayRef = Arc::new(Int64Array::from_iter_values((0..1000).map(|r| r % 97)));
            RecordBatch::try_new(Arc::clone(&schema), vec![k, v]).unwrap()
        })
        .collect();
    // One file a partition.
    for (i, batch) in batches.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("p{i}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }
    let memory = Arc::new(MemTable::try_new(Arc::clone(&schema), vec![batches]).unwrap());
    // Planned with the GPU joins and aggregations placed but no scan filter
    // (as the cost placement leaves a filter that keeps most rows), then
    // the pass under `options`.
    let plan_of = |sql: &'static str, options: GpuOptions| {
        let dir = dir.clone();
        let memory = Arc::clone(&memory);
        async move {
            let ctx =
                SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
            ctx.register_parquet("p", dir.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap();
            ctx.register_table("m", memory).unwrap();
            let plan = physical_plan_of(&ctx, sql).await;
            let mut placed = options.clone();
            placed.tuning.scan_filter = false;
            placed.tuning.join_key_filters = false;
            let plan = rewrite_plan(plan, &placed, Ok(()), RootPartitions::Merged).unwrap();
            with_cached_gpu_inputs(plan, &options, Ok(())).unwrap()
        }
    };
    let always = || GpuOptions {
        tuning: GpuTuning {
            scan_aggregate: false,
            ..GpuTuning::default()
        },
        ..options(true, PlacementPolicy::Always)
    };
    let reading = |plan: &Arc<dyn ExecutionPlan>| nodes_of::<GpuScanFilterExec>(plan);
    // Below a GPU join's build side: the filtered scan read through a scan
    // filter. The probe side, which the join's dynamic filter prunes,
    // stays DataFusion's scan.
    let sql = "SELECT a.v, b.v FROM p a JOIN p b ON a.k = b.k WHERE a.v >= 3 AND b.v >= 5";
    let plan = plan_of(sql, always()).await;
    let text = show(&plan);
    let joins = nodes_of::<GpuHashJoinExec>(&plan);
    assert_eq!(joins.len(), 1, "{text}");
    let sides = joins[0].children();
    let build = reading(sides[0]);
    assert_eq!(build.len(), 1, "{text}");
    let scan = build[0].downcast_ref::<GpuScanFilterExec>().unwrap();
    assert!(scan.reads_files(), "{text}");
    assert!(show(&build[0]).contains("filter=[v@1 >="), "{text}");
    assert!(reading(sides[1]).is_empty(), "{text}");
    assert!(show(sides[1]).contains("DynamicFilter"), "{text}");
    // Below a GPU aggregation, through the merge of its partitions.
    let sql = "SELECT k, count(*), max(v) FROM p WHERE v >= 3 GROUP BY k";
    let plan = plan_of(sql, always()).await;
    let aggregates = nodes_of::<GpuAggregateExec>(&plan);
    assert!(!aggregates.is_empty(), "{}", show(&plan));
    assert_eq!(reading(&plan).len(), 1, "{}", show(&plan));
    // Without a filter, the aggregation reads the table's cached columns
    // itself, from Parquet or a `MemTable`; not with the cache off, nor
    // with a key that is not an integer column.
    let reads_cache = |plan: &Arc<dyn ExecutionPlan>| {
        let aggregates = nodes_of::<GpuAggregateExec>(plan);
        aggregates
            .iter()
            .filter(|a| {
                a.downcast_ref::<GpuAggregateExec>()
                    .unwrap()
                    .reads_cached_input()
            })
            .count()
    };
    for table in ["p", "m"] {
        let sql = format!("SELECT k, count(*), max(v), sum(v) FROM {table} GROUP BY k");
        let sql: &'static str = Box::leak(sql.into_boxed_str());
        let plan = plan_of(sql, always()).await;
        assert_eq!(reads_cache(&plan), 1, "{sql}\n{}", show(&plan));
        assert!(
            show(&plan).contains("input=column_cache"),
            "{}",
            show(&plan)
        );
        let decisions = gpu_decisions_of(&plan, always());
        assert!(
            decisions
                .iter()
                .any(|d| d.contains("from the device column cache") && d.contains("hash_group_by")),
            "{decisions:?}"
        );
        // Its estimate sends nothing up: the cache holds the columns.
        assert!(
            decisions
                .iter()
                .any(|d| d.contains("from the device column cache") && d.contains("(0 B up,")),
            "{decisions:?}"
        );
        assert!(reading(&plan).is_empty(), "{}", show(&plan));
        let mut uncached = always();
        uncached.cache = false;
        assert_eq!(reads_cache(&plan_of(sql, uncached).await), 0, "{sql}");
    }
    for sql in [
        "SELECT k + 1, count(*) FROM p GROUP BY k + 1",
        "SELECT k, v, count(*) FROM p GROUP BY k, v",
        "SELECT k, count(*) FROM p WHERE v >= 3 GROUP BY k",
        "SELECT k, count(*) FILTER (WHERE v > 3) FROM p GROUP BY k",
    ] {
        let plan = plan_of(sql, always()).await;
        assert!(
            !nodes_of::<GpuAggregateExec>(&plan).is_empty(),
            "{sql}\n{}",
            show(&plan)
        );
        assert_eq!(reads_cache(&plan), 0, "{sql}\n{}", show(&plan));
    }
    // Switched off, over a `MemTable`, without a filter, under a CPU node,
    // or without a GPU: DataFusion's scan.
    let mut off = always();
    off.tuning.cached_gpu_inputs = false;
    let cpu_nodes = GpuOptions {
        hash_join: false,
        sort_merge_join: false,
        aggregate: false,
        ..always()
    };
    for (sql, options) in [
        (sql, off),
        (
            "SELECT k, count(*), max(v) FROM m WHERE v >= 3 GROUP BY k",
            always(),
        ),
        ("SELECT k, count(*), max(v) FROM p GROUP BY k", always()),
        (sql, cpu_nodes),
    ] {
        let plan = plan_of(sql, options).await;
        assert!(reading(&plan).is_empty(), "{sql}\n{}", show(&plan));
    }
    let plan = plan_of(sql, always()).await;
    let unchanged = with_cached_gpu_inputs(Arc::clone(&plan), &always(), Err("no GPU")).unwrap();
    assert!(Arc::ptr_eq(&plan, &unchanged));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_join_whose_build_keys_filter_a_cached_probe_scan_weighs_the_share_they_keep() {
    use crate::planner::join_key_filters::probe_share_kept_on_device;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::physical_plan::joins::HashJoinExec;
    use datafusion::prelude::ParquetReadOptions;
    // A probe side of 2^20 rows in Parquet (its keys' bounds in the file's
    // statistics), keys 0 to 2^20 - 1; a build side of 1,024 rows.
    let dir =
        std::env::temp_dir().join(format!("datafusion-gpu-probe-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let rows = 1i64 << 20;
    let k: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
    let v: ArrayRef = Arc::new(Int64Array::from_iter_values((0..rows).map(|r| r % 7)));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![k, v]).unwrap();
    let file = std::fs::File::create(dir.join("big.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let small = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(5000..5000 + 1024)),
            Arc::new(Int64Array::from_iter_values((0..1024).map(|r| r % 7))),
        ],
    )
    .unwrap();
    let small = Arc::new(MemTable::try_new(Arc::clone(&schema), vec![vec![small]]).unwrap());
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_parquet("big", dir.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx.register_table("small", small).unwrap();
    let sql = "SELECT big.v, small.v FROM small JOIN big ON small.k = big.k";
    let plan = physical_plan_of(&ctx, sql).await;
    let cost = options(true, PlacementPolicy::Cost);
    let share_of = |plan: &Arc<dyn ExecutionPlan>, options: &GpuOptions| {
        let joins = nodes_of::<HashJoinExec>(plan);
        assert_eq!(joins.len(), 1, "{}", show(plan));
        let join = joins[0].downcast_ref::<HashJoinExec>().unwrap();
        probe_share_kept_on_device(join, options)
    };
    // Before the rule (the placement's question) and after it (the
    // filter made, as `gpu_decisions` asks): 1,024 of 2^20 key values.
    let expected = 1024.0 / rows as f64;
    let before = share_of(&plan, &cost).unwrap_or_else(|| panic!("{}", show(&plan)));
    assert!((before - expected).abs() < 1e-12, "{before}");
    let cpu_joins = GpuOptions {
        hash_join: false,
        sort_merge_join: false,
        ..cost.clone()
    };
    let rewritten = rewrite_plan(
        Arc::clone(&plan),
        &cpu_joins,
        Ok(()),
        RootPartitions::Merged,
    )
    .unwrap();
    let after = share_of(&rewritten, &cpu_joins).unwrap_or_else(|| panic!("{}", show(&rewritten)));
    assert!((after - expected).abs() < 1e-12, "{after}");
    // No scan on the device tests the keys: without the cache, without
    // join key filters, or on a host test of a table below the GPU scans'
    // size.
    let mut no_filters = cost.clone();
    no_filters.tuning.join_key_filters = false;
    for options in [options(false, PlacementPolicy::Cost), no_filters] {
        assert_eq!(share_of(&plan, &options), None);
    }
    let sql = "SELECT a.v, b.v FROM small a JOIN small b ON a.k = b.k";
    assert_eq!(share_of(&physical_plan_of(&ctx, sql).await, &cost), None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gpu_join_must_beat_the_cpu_join_over_the_probe_rows_its_keys_keep() {
    use crate::cost::{self, DeviceConstants, JoinAlgorithm, JoinShape};
    use crate::planner::decision::keys_tested_on_device_slower;
    // SF 100's q17: 20 million parts filtered to an estimated 4 million
    // build rows (one thread builds them), 600 million line items probing.
    let shape = JoinShape {
        algorithm: JoinAlgorithm::Hash,
        build_rows: 4_000_000,
        probe_rows: 600_000_000,
        keys: 1,
        output_rows: 120_000_000,
        output_row_bytes: 24,
        gathered_on_device: true,
        output_folded: false,
        threads: 16,
        build_on_one_thread: true,
        repartitioned: false,
        sorted_for_join: [false, false],
        probe_skipped: false,
        build_matches_tracked: false,
        output_reads_build: true,
    };
    let device = DeviceConstants::TYPICAL;
    let estimate = cost::join(&shape, &device);
    assert!(estimate.gpu_faster(), "{estimate}");
    // Its keys keeping a fifth of the probe rows, the CPU join wins.
    let why = keys_tested_on_device_slower(&shape, &estimate, 0.2, &device).unwrap_err();
    assert!(why.contains("filter the scan of its probe side"), "{why}");
    assert!(why.contains("20.00 %"), "{why}");
    // Keeping them all, nothing changes.
    keys_tested_on_device_slower(&shape, &estimate, 1.0, &device).unwrap();
}

#[tokio::test]
async fn a_plans_scans_and_collectors_share_one_fill_ahead_of_its_filtered_scans() {
    use crate::exec::join_keys::JoinKeyCollectorExec;
    use crate::planner::fills_ahead::slot_of;
    let cpu_joins = GpuOptions {
        hash_join: false,
        sort_merge_join: false,
        aggregate: false,
        ..options(true, PlacementPolicy::Always)
    };
    // Two filtered scans and a collector: each holds the same fills, of
    // both scans.
    let sql = "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k WHERE r.v > 10 AND s.v < 50";
    let plan = planned(sql, cpu_joins.clone()).await;
    let scans = nodes_of::<GpuScanFilterExec>(&plan);
    let collectors = nodes_of::<JoinKeyCollectorExec>(&plan);
    assert_eq!((scans.len(), collectors.len()), (2, 1), "{}", show(&plan));
    let slots: Vec<_> = scans
        .iter()
        .chain(&collectors)
        .map(|node| slot_of(node.as_ref()).unwrap().scans())
        .collect();
    assert!(
        slots
            .iter()
            .all(|&(count, fills)| count == 2 && fills == slots[0].1),
        "{slots:?}"
    );
    // A plan without a filtered scan has none to fill.
    let plan = planned("SELECT k, sum(v) FROM r GROUP BY k", cpu_joins.clone()).await;
    assert!(
        nodes_of::<GpuScanFilterExec>(&plan).is_empty(),
        "{}",
        show(&plan)
    );
    for node in nodes_of::<GpuScanAggregateExec>(&plan) {
        assert_eq!(slot_of(node.as_ref()).unwrap().scans().0, 0);
    }
    // A distributed stage's scans read only their own partitions: none.
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_table("r", table(4)).unwrap();
    ctx.register_table("s", table(3)).unwrap();
    let plan = physical_plan_of(&ctx, sql).await;
    let stage = rewrite_plan(plan, &cpu_joins, Ok(()), RootPartitions::RunApart).unwrap();
    let scans = nodes_of::<GpuScanFilterExec>(&stage);
    assert!(!scans.is_empty(), "{}", show(&stage));
    for node in scans
        .iter()
        .chain(&nodes_of::<JoinKeyCollectorExec>(&stage))
    {
        assert_eq!(slot_of(node.as_ref()).unwrap().scans(), (0, None));
    }
}

#[tokio::test]
async fn a_gpu_exists_join_hands_its_probe_keys_to_the_scan_of_its_build_side() {
    use crate::exec::join_keys::JoinKeyCollectorExec;
    use crate::exec::GpuHashJoinExec;
    use datafusion::common::JoinType;
    let always = || options(true, PlacementPolicy::Always);
    // `NOT EXISTS` over a filtered subquery, the subquery's smaller table the
    // build side (as DataFusion plans it in `CollectLeft` mode): a right
    // anti join on the GPU.
    let config = || collect_left_below(1 << 30);
    let exists_join = |plan: &Arc<dyn ExecutionPlan>| {
        nodes_of::<GpuHashJoinExec>(plan).into_iter().find(|node| {
            let join = node.downcast_ref::<GpuHashJoinExec>().unwrap().hash_join();
            matches!(join.join_type(), JoinType::RightAnti | JoinType::RightSemi)
        })
    };
    // The collectors of a probe side's keys in `plan`.
    let probe_side_collectors = |plan: &Arc<dyn ExecutionPlan>| {
        nodes_of::<JoinKeyCollectorExec>(plan)
            .iter()
            .filter(|node| {
                let collector = node.downcast_ref::<JoinKeyCollectorExec>().unwrap();
                collector.keys().is_of_probe_side()
            })
            .count()
    };
    let not_exists = [
        "SELECT r.v FROM r WHERE NOT EXISTS \
         (SELECT 1 FROM t WHERE t.k = r.k AND t.v <> r.v AND t.v > 1)",
        "SELECT r.v FROM r WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.v > 1)",
    ];
    for sql in not_exists {
        let plan = rewritten_as_given(config(), sql, always()).await;
        let text = show(&plan);
        let Some(node) = exists_join(&plan) else {
            panic!("{sql}: no right anti join on the GPU\n{text}");
        };
        let join = node.downcast_ref::<GpuHashJoinExec>().unwrap().hash_join();
        let collector = join
            .right()
            .downcast_ref::<JoinKeyCollectorExec>()
            .unwrap_or_else(|| panic!("{sql}: no key collector on the probe side\n{text}"));
        assert!(collector.keys().is_of_probe_side(), "{sql}\n{text}");
        let id = collector.keys().id();
        let tested = nodes_of::<GpuScanFilterExec>(join.left());
        assert_eq!(tested.len(), 1, "{sql}\n{text}");
        assert!(
            show(&tested[0]).contains(&format!("IN join keys #{id}")),
            "{sql}\n{text}"
        );
        assert!(
            text.contains(&format!("keys=#{id} (for the scan of the build side)")),
            "{sql}\n{text}"
        );
        let decisions = gpu_decisions_of(&plan, always());
        assert!(
            decisions.iter().any(|d| d.contains(&format!(
                "its probe keys (#{id}) filter the scan of its build side"
            ))),
            "{sql}: {decisions:?}"
        );
        // Nothing else tests the set: the probe side reads every row.
        assert!(
            !show(join.right()).contains(&format!("IN join keys #{id}")),
            "{sql}\n{text}"
        );

        // The option off: the join's inputs as placed.
        let mut off = always();
        off.tuning.build_key_filters = false;
        let plan = rewritten_as_given(config(), sql, off).await;
        let text = show(&plan);
        let node = exists_join(&plan).expect("the same join");
        let join = node.downcast_ref::<GpuHashJoinExec>().unwrap().hash_join();
        assert!(
            join.right()
                .downcast_ref::<JoinKeyCollectorExec>()
                .is_none(),
            "{text}"
        );
        assert!(!show(join.left()).contains("IN join keys"), "{text}");
    }

    // A stage of a distributed plan: its task runs some of the probe
    // side's partitions, and no set of them all would be made.
    let ctx = SessionContext::new_with_config(config());
    ctx.register_table("r", table(4)).unwrap();
    ctx.register_table("t", table(1)).unwrap();
    let plan = physical_plan_of(&ctx, not_exists[0]).await;
    let stage = rewrite_plan(plan, &always(), Ok(()), RootPartitions::RunApart).unwrap();
    assert!(exists_join(&stage).is_some(), "{}", show(&stage));
    assert_eq!(probe_side_collectors(&stage), 0, "{}", show(&stage));

    // Not for: an `EXISTS` whose probe side the join's dynamic filter
    // prunes (read ahead, it would be read before the filter is there); a
    // `NOT IN`, whose build side's NULLs matter; an inner join, whose build
    // rows all may match.
    for sql in [
        "SELECT r.v FROM r WHERE EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.v > 1)",
        "SELECT r.v FROM r WHERE r.k NOT IN (SELECT k FROM t WHERE v > 1)",
        "SELECT r.v, t.v FROM r JOIN t ON r.k = t.k WHERE t.v > 1",
    ] {
        let plan = rewritten_as_given(config(), sql, always()).await;
        let text = show(&plan);
        assert!(
            !nodes_of::<GpuHashJoinExec>(&plan).is_empty(),
            "{sql}\n{text}"
        );
        assert_eq!(probe_side_collectors(&plan), 0, "{sql}\n{text}");
        if sql.contains("EXISTS") {
            let node = exists_join(&plan).expect("a right semi join");
            let join = node.downcast_ref::<GpuHashJoinExec>().unwrap().hash_join();
            assert!(
                crate::exec::dynamic_filter_of(join).is_some(),
                "{sql}\n{text}"
            );
        }
    }
}
