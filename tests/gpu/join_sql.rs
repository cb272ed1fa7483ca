//! Differential SQL tests: the same query with the GPU rule (every supported
//! join forced onto the GPU) and without it, compared as sorted multisets.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Array, Date64Array, Int16Array, Int32Array, Int64Array, Int8Array, RecordBatch,
    StringArray, TimestampMicrosecondArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::metrics::MetricValue;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use datafusion_gpu::gpu::gpu_runtime;

use crate::support::*;

const JOIN_ROWS: &str = "SELECT r.k, r.v, s.v FROM r JOIN s ON r.k = s.k";

async fn register(
    ctxs: [&SessionContext; 2],
    r: &[Option<i64>],
    s: &[Option<i64>],
    partitions: usize,
    batch_rows: usize,
) {
    for ctx in ctxs {
        ctx.register_table("r", key_value_table(r, 11, partitions, batch_rows))
            .unwrap();
        ctx.register_table("s", key_value_table(s, 23, partitions, batch_rows))
            .unwrap();
    }
}

/// Runs [`JOIN_ROWS`] on r and s in both partition modes and compares.
async fn check_join(
    name: &str,
    r: Vec<Option<i64>>,
    s: Vec<Option<i64>>,
    extra: &[&str],
) -> Option<usize> {
    require_gpu(name)?;
    let mut rows = 0;
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, extra).await;
        let cpu = cpu_context(mode, 4, extra).await;
        register([&gpu, &cpu], &r, &s, 3, 1000).await;
        rows = assert_same_int64_rows(&gpu, &cpu, JOIN_ROWS, 1).await;
    }
    Some(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sizes_that_cross_every_threshold() {
    // Block (256 rows), table (2048 build rows per partition), batch (8192),
    // probe chunk, output range and radix pass (256 partitions) thresholds.
    for rows in [
        1usize, 2, 255, 256, 257, 1023, 1024, 1025, 2047, 2048, 2049, 8191, 8192, 8193, 65_537,
        300_000,
    ] {
        let r = gen_keys(rows, Keys::Permutation, 0.0, rows as u64);
        let s = gen_keys(
            rows + 7,
            Keys::Uniform {
                domain: rows as u64 + 3,
            },
            0.0,
            rows as u64 + 1,
        );
        if check_join(
            &format!("sizes_that_cross_every_threshold({rows})"),
            r,
            s,
            &[],
        )
        .await
        .is_none()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_chunks_ranges_and_batches() {
    let r = gen_keys(20_000, Keys::Uniform { domain: 5_000 }, 0.05, 1);
    let s = gen_keys(30_000, Keys::Uniform { domain: 5_000 }, 0.05, 2);
    let extra = [
        "SET gpu.tuning.probe_chunk_rows = 777",
        "SET gpu.max_output_pairs = 1000",
        "SET datafusion.execution.batch_size = 97",
    ];
    check_join("small_chunks_ranges_and_batches", r, s, &extra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_on_both_sides_and_null_keys() {
    let r = gen_keys(50_000, Keys::Uniform { domain: 1_000 }, 0.1, 3);
    let s = gen_keys(50_000, Keys::Uniform { domain: 1_000 }, 0.2, 4);
    let rows = check_join("duplicates_on_both_sides_and_null_keys", r, s, &[]).await;
    if let Some(rows) = rows {
        assert!(rows > 1_000_000, "a many-to-many join: {rows} rows");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zipf_keys() {
    for s_exp in [0.5, 1.0, 1.5] {
        let r = gen_keys(100_000, Keys::Permutation, 0.0, 5);
        let s = gen_keys(
            200_000,
            Keys::Zipf {
                domain: 100_000,
                s: s_exp,
            },
            0.0,
            6,
        );
        if check_join(&format!("zipf_keys({s_exp})"), r, s, &[])
            .await
            .is_none()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_holding_half_the_build_side() {
    let mut r = gen_keys(40_000, Keys::Permutation, 0.0, 7);
    r.extend(std::iter::repeat_n(Some(17), 40_000));
    let s = gen_keys(40_000, Keys::Uniform { domain: 40_000 }, 0.0, 8);
    check_join("one_key_holding_half_the_build_side", r, s, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn empty_sides_one_row_all_null_and_no_match() {
    let some = gen_keys(5_000, Keys::Permutation, 0.0, 9);
    // (case, r's keys, s's keys)
    type Case = (&'static str, Vec<Option<i64>>, Vec<Option<i64>>);
    let cases: Vec<Case> = vec![
        ("empty build", vec![], some.clone()),
        ("empty probe", some.clone(), vec![]),
        ("both empty", vec![], vec![]),
        ("one row each", vec![Some(5)], vec![Some(5)]),
        ("all NULL keys", vec![None; 1000], vec![None; 1000]),
        (
            "no match",
            some.clone(),
            some.iter().map(|k| k.map(|k| k + 1_000_000)).collect(),
        ),
    ];
    for (name, r, s) in cases {
        if check_join(
            &format!("empty_sides_one_row_all_null_and_no_match({name})"),
            r,
            s,
            &[],
        )
        .await
        .is_none()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn primary_key_foreign_key_at_2_pow_24() {
    if require_gpu("primary_key_foreign_key_at_2_pow_24").is_none() {
        return;
    }
    let rows = 1 << 24;
    let r = gen_keys(rows, Keys::Permutation, 0.0, 10);
    let s = gen_keys(
        rows,
        Keys::Uniform {
            domain: rows as u64,
        },
        0.0,
        11,
    );
    let gpu = gpu_context(JoinMode::Partitioned, 8, &[]).await;
    let cpu = cpu_context(JoinMode::Partitioned, 8, &[]).await;
    register([&gpu, &cpu], &r, &s, 8, 8192).await;
    let sql = "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k";
    assert_same_int64_rows(&gpu, &cpu, sql, 1).await;
    let rows_out = assert_same_int64_rows(&gpu, &cpu, JOIN_ROWS, 1).await;
    assert_eq!(rows_out, rows, "every foreign key matches one primary key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_aggregate_above_a_partitioned_join_sees_correct_partitioning() {
    // The aggregate's final phase relies on the join output being hash
    // partitioned on the key; a GPU join that broke it would double-count.
    let Some(_) = require_gpu("an_aggregate_above_a_partitioned_join_sees_correct_partitioning")
    else {
        return;
    };
    let r = gen_keys(30_000, Keys::Uniform { domain: 3_000 }, 0.0, 12);
    let s = gen_keys(30_000, Keys::Uniform { domain: 3_000 }, 0.0, 13);
    let gpu = gpu_context(JoinMode::Partitioned, 4, &[]).await;
    let cpu = cpu_context(JoinMode::Partitioned, 4, &[]).await;
    register([&gpu, &cpu], &r, &s, 4, 1000).await;
    let sql = "SELECT r.k, count(*), sum(s.v) FROM r JOIN s ON r.k = s.k GROUP BY r.k";
    assert_same_int64_rows(&gpu, &cpu, sql, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_column_and_narrow_key_types() {
    let Some(_) = require_gpu("multi_column_and_narrow_key_types") else {
        return;
    };
    let rows = 5_000usize;
    let schema = Arc::new(Schema::new(vec![
        Field::new("a8", DataType::Int8, true),
        Field::new("b16", DataType::Int16, true),
        Field::new("c32", DataType::Int32, true),
        Field::new("u32", DataType::UInt32, false),
        Field::new("d32", DataType::Date32, true),
        Field::new("d64", DataType::Date64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("id", DataType::Int32, false),
    ]));
    let make = |salt: i64| {
        let schema = Arc::clone(&schema);
        table_from_columns(Arc::clone(&schema), rows, 3, 4096, move |range| {
            let v = |i: usize, m: i64| ((i as i64 * 7919 + salt * 104_729) % m) - m / 2;
            let valid = |i: usize| (i as i64 + salt) % 37 != 0;
            vec![
                Arc::new(Int8Array::from_iter(
                    range.clone().map(|i| valid(i).then(|| v(i, 200) as i8)),
                )) as ArrayRef,
                Arc::new(Int16Array::from_iter(
                    range.clone().map(|i| valid(i).then(|| v(i, 300) as i16)),
                )),
                Arc::new(Int32Array::from_iter(
                    range.clone().map(|i| valid(i).then(|| v(i, 500) as i32)),
                )),
                Arc::new(UInt32Array::from_iter_values(
                    range.clone().map(|i| (i % 400) as u32),
                )),
                Arc::new(Date32Array::from_iter(
                    range.clone().map(|i| valid(i).then(|| v(i, 90) as i32)),
                )),
                Arc::new(Date64Array::from_iter_values(
                    range.clone().map(|i| v(i, 50) * 86_400_000),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from_iter(
                        range
                            .clone()
                            .map(|i| valid(i).then(|| v(i, 700) * 1_000_003)),
                    )
                    .with_timezone("UTC"),
                ),
                Arc::new(Int32Array::from_iter_values(range.map(|i| i as i32))),
            ]
        })
    };
    let gpu = gpu_context(JoinMode::Partitioned, 4, &[]).await;
    let cpu = cpu_context(JoinMode::Partitioned, 4, &[]).await;
    // The same with both sides as (key, row id) pairs.
    let two_words = gpu_context(
        JoinMode::Partitioned,
        4,
        &["SET gpu.tuning.one_word_join_rows = false"],
    )
    .await;
    for ctx in [&gpu, &cpu, &two_words] {
        ctx.register_table("x", make(1)).unwrap();
        ctx.register_table("y", make(2)).unwrap();
    }
    // (query, whether its keys fit 32 bits, so that each side goes as one
    // word a row): a lone Date64 or Timestamp column is its raw 64 bits;
    // the other keys pack by the build side's value ranges, a few hundred
    // values a column, but Date64 days in milliseconds take 33 bits.
    let queries = [
        ("SELECT x.id, y.id FROM x JOIN y ON x.a8 = y.a8", true),
        (
            "SELECT x.id, y.id FROM x JOIN y ON x.b16 = y.b16 AND x.a8 = y.a8",
            true,
        ),
        (
            "SELECT x.id, y.id FROM x JOIN y ON x.c32 = y.c32 AND x.d32 = y.d32",
            true,
        ),
        ("SELECT x.id, y.id FROM x JOIN y ON x.u32 = y.u32", true),
        ("SELECT x.id, y.id FROM x JOIN y ON x.d64 = y.d64", false),
        (
            "SELECT x.id, y.id FROM x JOIN y ON x.u32 = y.u32 AND x.c32 = y.c32",
            true,
        ),
        (
            "SELECT x.id, x.d32, y.b16 FROM x JOIN y ON x.d32 = y.d32",
            true,
        ),
        (
            "SELECT x.id, y.id, y.ts FROM x JOIN y ON x.ts = y.ts",
            false,
        ),
        // 64 + 32 bits of key types, packed by the build side's value ranges.
        (
            "SELECT x.id, y.id FROM x JOIN y ON x.d64 = y.d64 AND x.c32 = y.c32",
            false,
        ),
    ];
    for (sql, packed) in queries {
        let (gpu_batches, gpu_nodes, plan) = run(&gpu, sql).await;
        let (cpu_batches, _, _) = run(&cpu, sql).await;
        assert!(gpu_nodes >= 1, "{sql} did not run on the GPU");
        assert_eq!(
            string_rows(&gpu_batches),
            string_rows(&cpu_batches),
            "{sql}"
        );
        let one_word = plan_metric(&plan, "rows_in_one_word");
        assert_eq!(one_word > 0, packed, "{sql}: {one_word} rows as one word");
        let (two_word_batches, _, two_word_plan) = run(&two_words, sql).await;
        assert_eq!(
            string_rows(&two_word_batches),
            string_rows(&cpu_batches),
            "{sql}, two words a row"
        );
        assert_eq!(plan_metric(&two_word_plan, "rows_in_one_word"), 0, "{sql}");
    }
    // Folded while probing over pinned tables: the probe side's one 4-byte
    // column rides in the high halves of its key words.
    let folded = "SELECT sum(x.id), max(y.id), count(*) FROM x JOIN y ON x.u32 = y.u32";
    let pinned = gpu_context(JoinMode::Partitioned, 4, &[]).await;
    pinned
        .register_table("x", pinned_table(&make(1)).await)
        .unwrap();
    pinned
        .register_table("y", pinned_table(&make(2)).await)
        .unwrap();
    let (gpu_batches, gpu_nodes, plan) = run(&pinned, folded).await;
    let (cpu_batches, _, _) = run(&cpu, folded).await;
    assert!(gpu_nodes >= 1, "{folded} did not run on the GPU");
    assert_eq!(
        string_rows(&gpu_batches),
        string_rows(&cpu_batches),
        "pinned: {folded}"
    );
    use datafusion::arrow::array::AsArray;
    let count = cpu_batches[0].column(2);
    let pairs = count
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0) as usize;
    assert!(pairs > 10_000, "{pairs} pairs");
    assert_eq!(plan_metric(&plan, "pairs_folded_while_probing"), pairs);
    assert!(plan_metric(&plan, "probe_rows_carrying_values") > 0);
    // More rows than the build side's: probe rows went as one word too.
    let one_word = plan_metric(&plan, "rows_in_one_word");
    let build_rows = plan_metric(&plan, "build_rows");
    assert!(
        one_word > build_rows,
        "{one_word} rows as one word, {build_rows} build rows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explain_shows_the_gpu_join_and_analyze_shows_its_metrics() {
    let Some(_) = require_gpu("explain_shows_the_gpu_join_and_analyze_shows_its_metrics") else {
        return;
    };
    let gpu = gpu_context(JoinMode::Partitioned, 4, &[]).await;
    let r = gen_keys(10_000, Keys::Permutation, 0.0, 14);
    let cpu = cpu_context(JoinMode::Partitioned, 4, &[]).await;
    register([&gpu, &cpu], &r, &r, 2, 1000).await;
    let explain = |batches: Vec<datafusion::arrow::array::RecordBatch>| {
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    };
    let plan = explain(
        gpu.sql(&format!("EXPLAIN {JOIN_ROWS}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap(),
    );
    assert!(
        plan.contains("GpuHashJoinExec: algorithm=radix_partitioned_hash_join"),
        "{plan}"
    );
    assert!(!plan.contains(" HashJoinExec"), "{plan}");
    let analyzed = explain(
        gpu.sql(&format!("EXPLAIN ANALYZE {JOIN_ROWS}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap(),
    );
    let join_line = analyzed
        .lines()
        .find(|l| l.contains("GpuHashJoinExec"))
        .unwrap_or_else(|| panic!("{analyzed}"));
    for metric in [
        "output_rows=10.00 K",
        "output_batches=",
        "probe_rows=10.00 K",
        "h2d_bytes=",
        "d2h_bytes=",
        "transfer_time=",
        "kernel_time=",
    ] {
        assert!(
            join_line.contains(metric),
            "{metric} missing in\n{join_line}"
        );
    }
    assert!(!join_line.contains("output_batches=0,"), "{join_line}");
    let cpu_plan = explain(
        cpu.sql(&format!("EXPLAIN {JOIN_ROWS}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap(),
    );
    assert!(!cpu_plan.contains("GpuHashJoinExec"), "{cpu_plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_over_pinned_tables_match_the_cpu_and_copy_without_staging() {
    let Some(_) = require_gpu("queries_over_pinned_tables_match_the_cpu_and_copy_without_staging")
    else {
        return;
    };
    // Keys with NULLs and duplicates, in batches of a few sizes.
    let r = key_value_table(
        &gen_keys(60_000, Keys::Uniform { domain: 20_000 }, 0.05, 1),
        1,
        3,
        4_096,
    );
    let s = key_value_table(
        &gen_keys(
            90_000,
            Keys::Zipf {
                domain: 20_000,
                s: 1.1,
            },
            0.05,
            2,
        ),
        2,
        4,
        1_000,
    );
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &[]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("r", pinned_table(&r).await).unwrap();
            ctx.register_table("s", pinned_table(&s).await).unwrap();
        }
        let sql = "SELECT r.k, r.v, s.v FROM r JOIN s ON r.k = s.k";
        assert_same_int64_rows(&gpu, &cpu, sql, 1).await;
        let (_, _, plan) = run(&gpu, sql).await;
        let direct = plan_metric(&plan, "h2d_direct_bytes");
        if mode == JoinMode::PartitionedKept {
            // The join reads DataFusion's hash repartitions, whose batches
            // are new ones in ordinary memory: everything is staged.
            assert_eq!(direct, 0, "{mode:?}: nothing pinned reaches the join");
        } else {
            assert!(
                direct > 0,
                "{mode:?}: the join copied nothing straight from pinned memory"
            );
        }
        let sql = "SELECT k, count(*), max(v), sum(v) FROM s GROUP BY k";
        let (gpu_batches, gpu_nodes, plan) = run_counting(&gpu, sql, "AggregateExec").await;
        let (cpu_batches, _, _) = run_counting(&cpu, sql, "AggregateExec").await;
        assert!(gpu_nodes >= 1, "{mode:?}: no aggregation on the GPU");
        assert_eq!(
            int64_rows(&gpu_batches),
            int64_rows(&cpu_batches),
            "{mode:?}: {sql}"
        );
        assert!(
            plan_metric(&plan, "h2d_direct_bytes") > 0,
            "{mode:?}: the aggregation copied nothing straight from pinned memory"
        );
    }
}

/// A build side whose batches lie in two pinned regions but arrive
/// interleaved (one partition reading A0, B0, A1, B1, ...): the join holds
/// them in memory order, so each column crosses the bus in one copy per
/// region rather than one per batch, and still matches DataFusion's join.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_build_side_arriving_across_pinned_regions_is_copied_once_per_region() {
    let Some(_) =
        require_gpu("a_build_side_arriving_across_pinned_regions_is_copied_once_per_region")
    else {
        return;
    };
    // 16 batches of 1,000 rows (8,000 bytes a column: whole aligned
    // buffers, which lie end to end once pinned), in two partitions.
    let r = key_value_table(&gen_keys(16_000, Keys::Permutation, 0.0, 3), 1, 2, 1_000);
    let s = key_value_table(
        &gen_keys(40_000, Keys::Uniform { domain: 16_000 }, 0.0, 4),
        2,
        1,
        8_000,
    );
    let (r_parts, s_parts) = (pinned_table(&r).await, pinned_table(&s).await);
    let [first, second] = [0, 1].map(|p| r_parts.batches[p].clone());
    let (first, second) = (first.read().await.clone(), second.read().await.clone());
    assert_eq!((first.len(), second.len()), (8, 8));
    let interleaved: Vec<_> = first
        .iter()
        .zip(&second)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    let all: Vec<_> = first.iter().chain(&second).cloned().collect();
    let one_region = datafusion_gpu::pin_batches(&all).unwrap();
    let schema = datafusion::catalog::TableProvider::schema(r.as_ref());
    let mut copies = Vec::new();
    for (layout, batches) in [("one region", one_region), ("two regions", interleaved)] {
        let build = Arc::new(
            datafusion::datasource::MemTable::try_new(Arc::clone(&schema), vec![batches]).unwrap(),
        );
        // One partition on both sides: the probe side is read in order,
        // so only the build side's layout differs between the two runs.
        let gpu = gpu_context(JoinMode::CollectLeft, 1, &[]).await;
        let cpu = cpu_context(JoinMode::CollectLeft, 1, &[]).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("r", Arc::clone(&build) as _).unwrap();
            ctx.register_table("s", Arc::clone(&s_parts) as _).unwrap();
        }
        assert_same_int64_rows(&gpu, &cpu, JOIN_ROWS, 1).await;
        let (_, _, plan) = run(&gpu, JOIN_ROWS).await;
        assert_eq!(
            plan_metric(&plan, "build_rows"),
            16_000,
            "{layout}: r builds"
        );
        let direct = plan_metric(&plan, "h2d_direct_bytes");
        assert!(direct > 0, "{layout}: nothing straight from pinned memory");
        copies.push(plan_metric(&plan, "h2d_direct_copies"));
    }
    // The second region costs one more copy per build column the device
    // reads (the keys, and `k` and `v` gathered for the output), not one
    // per batch (16 batches a column).
    assert_eq!(
        copies[1],
        copies[0] + 3,
        "copies with the build side in one region, then in two: {copies:?}"
    );
}

/// Aggregations without GROUP BY computed inside the GPU join from its
/// pairs (`partial_aggregate`): against DataFusion's join and aggregation,
/// with NULL keys, duplicates, sums that wrap, empty sides, many output
/// ranges, and columns with NULLs that send ranges to the host's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_computed_in_the_join_match_the_cpu() {
    let Some(_) = require_gpu("aggregates_computed_in_the_join_match_the_cpu") else {
        return;
    };
    // Reduced on the device: the v columns have no NULLs.
    let on_device = "SELECT count(*), sum(r.v), sum(s.v), min(r.v), max(s.v), count(s.v) \
                     FROM r JOIN s ON r.k = s.k";
    // r.k has NULLs, so its column never goes to the device: the rows are
    // made on the host and aggregated there.
    let on_host = "SELECT count(r.k), max(r.k), sum(s.v) FROM r JOIN s ON r.k = s.k";
    let many = gen_keys(200_000, Keys::Uniform { domain: 20_000 }, 0.05, 21);
    let few = gen_keys(
        30_000,
        Keys::Zipf {
            domain: 20_000,
            s: 1.2,
        },
        0.1,
        22,
    );
    let no_match: Vec<Option<i64>> = few.iter().map(|k| k.map(|k| k + 1_000_000)).collect();
    // (name, r's keys, s's keys, extra settings)
    type Case<'a> = (&'a str, &'a [Option<i64>], &'a [Option<i64>], &'a [&'a str]);
    let cases: Vec<Case<'_>> = vec![
        ("many to many", &few, &many, &[]),
        (
            "many ranges",
            &few,
            &many,
            &[
                "SET gpu.tuning.probe_chunk_rows = 7777",
                "SET gpu.max_output_pairs = 10000",
            ],
        ),
        ("empty build", &[], &many, &[]),
        ("empty probe", &few, &[], &[]),
        ("no match", &no_match, &many, &[]),
    ];
    for (name, r, s, extra) in cases {
        for mode in JoinMode::ALL {
            let gpu = gpu_context(mode, 4, extra).await;
            let cpu = cpu_context(mode, 4, extra).await;
            let unfolded_settings: Vec<&str> = extra
                .iter()
                .copied()
                .chain(["SET gpu.tuning.fold_while_probing = false"])
                .collect();
            let unfolded = gpu_context(mode, 4, &unfolded_settings).await;
            let uncarried_settings: Vec<&str> = extra
                .iter()
                .copied()
                .chain(["SET gpu.tuning.carry_folded_values = false"])
                .collect();
            // Over pinned copies of the tables, whose columns the probe
            // keys carry, and the same with the option off.
            let pinned = gpu_context(mode, 4, extra).await;
            let uncarried = gpu_context(mode, 4, &uncarried_settings).await;
            register([&gpu, &cpu], r, s, 3, 4096).await;
            unfolded
                .register_table("r", key_value_table(r, 11, 3, 4096))
                .unwrap();
            unfolded
                .register_table("s", key_value_table(s, 23, 3, 4096))
                .unwrap();
            let pinned_r = pinned_table(&key_value_table(r, 11, 3, 4096)).await;
            let pinned_s = pinned_table(&key_value_table(s, 23, 3, 4096)).await;
            for ctx in [&pinned, &uncarried] {
                ctx.register_table("r", Arc::clone(&pinned_r) as _).unwrap();
                ctx.register_table("s", Arc::clone(&pinned_s) as _).unwrap();
            }
            assert_same_int64_rows(&gpu, &cpu, on_device, 1).await;
            assert_same_int64_rows(&unfolded, &cpu, on_device, 1).await;
            assert_same_int64_rows(&pinned, &cpu, on_device, 1).await;
            assert_same_int64_rows(&uncarried, &cpu, on_device, 1).await;
            let (_, _, plan) = run(&gpu, on_device).await;
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(
                shown.contains("partial_aggregate=[count(Int64(1)), sum(r.v), sum(s.v)"),
                "{name}, {mode:?}: the join does not compute the aggregation\n{shown}"
            );
            // With `gpu.tuning.merge_partitions` (on in this mode only), the join
            // reads its probe partitions as one (in several chunks in
            // "many ranges").
            assert_eq!(
                shown.contains("probe_reads_merge_inputs="),
                mode == JoinMode::Partitioned,
                "{name}, {mode:?}: probe partitions\n{shown}"
            );
            let reduced = plan_metric(&plan, "rows_aggregated_on_device");
            let pairs = plan_metric(&plan, "rows_gathered_on_device");
            assert_eq!(pairs, 0, "{name}, {mode:?}: rows were made on the device");
            // Every pair was reduced on the device: as many as the join has.
            let (cpu_batches, _, _) = run(&cpu, on_device).await;
            let join_rows = int64_rows(&cpu_batches)[0][0].unwrap_or(0) as usize;
            assert_eq!(reduced, join_rows, "{name}, {mode:?}: pairs reduced");
            // Four aggregated columns: folded as the device probed, every
            // pair; with the option off, written out and reduced after.
            let folded = plan_metric(&plan, "pairs_folded_while_probing");
            assert_eq!(folded, join_rows, "{name}, {mode:?}: pairs folded");
            // The probe side's folded column (its v, summed and maxed)
            // went through the partitioning with the keys, in place of row
            // ids, where it came from pinned memory (not through
            // DataFusion's hash repartitions, whose batches are new ones);
            // staged through the host, or with the option off, row ids did.
            assert_eq!(
                plan_metric(&plan, "probe_rows_carrying_values"),
                0,
                "{name}, {mode:?}: staged values carried"
            );
            let (_, _, pinned_plan) = run(&pinned, on_device).await;
            let pinned_folded = plan_metric(&pinned_plan, "pairs_folded_while_probing");
            assert_eq!(
                pinned_folded, join_rows,
                "{name}, {mode:?}: pinned pairs folded"
            );
            let carrying = plan_metric(&pinned_plan, "probe_rows_carrying_values");
            if mode == JoinMode::PartitionedKept {
                assert_eq!(
                    carrying, 0,
                    "{name}, {mode:?}: repartitioned values carried"
                );
            } else if pinned_folded > 0 {
                assert!(
                    carrying > 0,
                    "{name}, {mode:?}: no pinned probe row carried values"
                );
            }
            let (_, _, uncarried_plan) = run(&uncarried, on_device).await;
            assert_eq!(
                plan_metric(&uncarried_plan, "probe_rows_carrying_values"),
                0,
                "{name}, {mode:?}: values carried with the option off"
            );
            assert_eq!(
                plan_metric(&uncarried_plan, "pairs_folded_while_probing"),
                join_rows,
                "{name}, {mode:?}: pairs folded with values not carried"
            );
            let (_, _, unfolded_plan) = run(&unfolded, on_device).await;
            assert_eq!(
                plan_metric(&unfolded_plan, "pairs_folded_while_probing"),
                0,
                "{name}, {mode:?}: pairs folded with the option off"
            );
            assert_eq!(
                plan_metric(&unfolded_plan, "rows_aggregated_on_device"),
                join_rows,
                "{name}, {mode:?}: pairs reduced with the option off"
            );
            if name == "many to many" {
                assert!(join_rows > 100_000, "{name}: {join_rows} rows");
            }
            assert_same_int64_rows(&gpu, &cpu, on_host, 1).await;
            let (_, _, plan) = run(&gpu, on_host).await;
            // Over DataFusion's hash repartitions, the NULL keys all go to
            // one partition, and the others' r.k has none: those reduce on
            // the device.
            if mode != JoinMode::PartitionedKept {
                assert_eq!(
                    plan_metric(&plan, "rows_aggregated_on_device"),
                    0,
                    "{name}, {mode:?}: a column with NULLs was reduced on the device"
                );
            }
        }
    }
}

/// The same over 4-byte columns, read and widened as the device gathers
/// them: SUM of Int32 and UInt32 (which DataFusion casts to Int64 and
/// UInt64 first), MIN and MAX of Int32, UInt32 and Date32 across their
/// whole ranges (negative values, and unsigned ones above 2^31 that a sign
/// extension would get wrong), by hash join and by sort-merge join. A SUM of
/// an Int16 column is not gathered on the device: its rows are made on the
/// host, with the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_in_the_join_over_four_byte_columns() {
    let Some(_) = require_gpu("aggregates_in_the_join_over_four_byte_columns") else {
        return;
    };
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::Int64Type;
    let rows = 50_000usize;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("i", DataType::Int32, false),
        Field::new("u", DataType::UInt32, false),
        Field::new("d", DataType::Date32, false),
        Field::new("h", DataType::Int16, false),
    ]));
    let make = |salt: i64| {
        table_from_columns(Arc::clone(&schema), rows, 3, 3000, move |range| {
            let mix = |i: usize| (i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64) ^ salt;
            vec![
                Arc::new(Int64Array::from_iter_values(
                    range.clone().map(|i| (i as i64 * 7 + salt) % 9_000),
                )) as ArrayRef,
                Arc::new(Int32Array::from_iter_values(range.clone().map(
                    |i| match i % 1000 {
                        0 => i32::MIN,
                        1 => i32::MAX,
                        _ => (mix(i) >> 32) as i32,
                    },
                ))),
                Arc::new(UInt32Array::from_iter_values(
                    range
                        .clone()
                        .map(|i| (mix(i) as u32) | (0x8000_0000 * (i % 2) as u32)),
                )),
                Arc::new(Date32Array::from_iter_values(
                    range.clone().map(|i| (mix(i) % 200_000) as i32),
                )),
                Arc::new(Int16Array::from_iter_values(range.map(|i| mix(i) as i16))),
            ]
        })
    };
    let on_device = "SELECT sum(x.i), min(x.i), max(y.i), sum(y.u), min(x.u), max(y.u), \
                     min(x.d), max(y.d), count(*) FROM x JOIN y ON x.k = y.k";
    let on_host = "SELECT sum(x.h), max(y.i), count(*) FROM x JOIN y ON x.k = y.k";
    // Three folds while the hash join probes: the probe side's two 4-byte
    // columns travel through the partitioning in the two halves of the
    // words its keys carry (over pinned tables); each side's key column is
    // counted, which needs it on the device but neither folded nor carried.
    let folded = "SELECT sum(x.i), min(y.i), max(y.u), count(x.k), count(y.k), count(*) \
                  FROM x JOIN y ON x.k = y.k";
    // (join, its operator, settings, modes: DataFusion plans a sort-merge
    // join only over hash partitions)
    let joins: [(&str, &str, &[&str], &[JoinMode]); 2] = [
        ("hash join", "HashJoinExec", &[], &JoinMode::ALL),
        (
            "sort-merge join",
            "SortMergeJoinExec",
            &["SET datafusion.optimizer.prefer_hash_join = false"],
            &[JoinMode::Partitioned, JoinMode::PartitionedKept],
        ),
    ];
    for (join, operator, extra, modes) in joins {
        for &mode in modes {
            let gpu = gpu_context(mode, 4, extra).await;
            let cpu = cpu_context(mode, 4, extra).await;
            for ctx in [&gpu, &cpu] {
                ctx.register_table("x", make(1)).unwrap();
                ctx.register_table("y", make(2)).unwrap();
            }
            // (query, reduced on the device, its count(*) column)
            for (sql, reduced_on_device, count_column) in
                [(on_device, true, 8), (on_host, false, 2), (folded, true, 5)]
            {
                let (gpu_batches, gpu_nodes, plan) = run_counting(&gpu, sql, operator).await;
                let (cpu_batches, _, _) = run(&cpu, sql).await;
                assert!(
                    gpu_nodes >= 1,
                    "{join}, {mode:?}: {sql} did not run on the GPU"
                );
                assert_eq!(
                    string_rows(&gpu_batches),
                    string_rows(&cpu_batches),
                    "{join}, {mode:?}: {sql}"
                );
                let reduced = plan_metric(&plan, "rows_aggregated_on_device");
                if reduced_on_device {
                    let count = cpu_batches[0]
                        .column(count_column)
                        .as_primitive::<Int64Type>();
                    let pairs = count.value(0) as usize;
                    assert!(pairs > 100_000, "{join}, {mode:?}: {pairs} pairs");
                    assert_eq!(
                        reduced, pairs,
                        "{join}, {mode:?}: the pairs were not all reduced on the device"
                    );
                    let folded_pairs = plan_metric(&plan, "pairs_folded_while_probing");
                    // The tables' columns are staged through the host: the
                    // probe keys carry row ids (see the pinned run below).
                    let carrying = plan_metric(&plan, "probe_rows_carrying_values");
                    assert_eq!(
                        carrying, 0,
                        "{join}, {mode:?}: {sql}: staged values carried"
                    );
                    if sql == folded && operator == "HashJoinExec" {
                        assert_eq!(folded_pairs, pairs, "{join}, {mode:?}: {sql}");
                    } else {
                        // Eight aggregated columns: more than the hash
                        // join folds while probing, so its pairs were
                        // written out (as the sort-merge join's always
                        // are).
                        assert_eq!(folded_pairs, 0, "{join}, {mode:?}: {sql}: folded");
                    }
                } else {
                    assert_eq!(reduced, 0, "{join}, {mode:?}: an Int16 sum on the device");
                }
            }
            // Over pinned copies the hash join's probe keys carry its two
            // 4-byte columns (or the one, by the side the planner probes
            // with) in the halves of their words, but through DataFusion's
            // hash repartitions, whose batches are new ones.
            if operator == "HashJoinExec" {
                let pinned = gpu_context(mode, 4, extra).await;
                pinned
                    .register_table("x", pinned_table(&make(1)).await)
                    .unwrap();
                pinned
                    .register_table("y", pinned_table(&make(2)).await)
                    .unwrap();
                let (gpu_batches, _, plan) = run(&pinned, folded).await;
                let (cpu_batches, _, _) = run(&cpu, folded).await;
                assert_eq!(
                    string_rows(&gpu_batches),
                    string_rows(&cpu_batches),
                    "{join}, {mode:?}, pinned: {folded}"
                );
                let count = cpu_batches[0].column(5).as_primitive::<Int64Type>();
                assert_eq!(
                    plan_metric(&plan, "pairs_folded_while_probing"),
                    count.value(0) as usize,
                    "{join}, {mode:?}, pinned: pairs folded"
                );
                let carrying = plan_metric(&plan, "probe_rows_carrying_values");
                assert_eq!(
                    carrying > 0,
                    mode != JoinMode::PartitionedKept,
                    "{join}, {mode:?}, pinned: {carrying} probe rows carried values"
                );
            }
        }
    }
}

/// The build side's keys carry the values its folds read (seed 002's GFTR
/// on the build side, `gpu.tuning.carry_folded_values`): one 4-byte column beside
/// Int32 keys in one-word rows, an 8-byte one beside them in two words,
/// two 4-byte columns or one 8-byte column beside wide Int64 keys; three
/// columns are read by row id. A probe column with NULLs cannot be folded:
/// the pairs are then written out against the build rows partitioned again
/// by row id. Same answers as the CPU, and with the option off, in every
/// mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn build_keys_carry_the_values_their_folds_read() {
    let Some(_) = require_gpu("build_keys_carry_the_values_their_folds_read") else {
        return;
    };
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::Int64Type;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int32, false),
        Field::new("k64", DataType::Int64, false),
        Field::new("v", DataType::Int32, false),
        Field::new("u", DataType::UInt32, false),
        Field::new("w", DataType::Int64, false),
        Field::new("n", DataType::Int32, true),
    ]));
    // x (the build side) holds fewer rows than y, so the planner keeps it
    // on the build side; keys repeat on both sides.
    let make = |rows: usize, salt: i64| {
        table_from_columns(Arc::clone(&schema), rows, 3, 3000, move |range| {
            let mix = |i: usize| (i as i64).wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64) ^ salt;
            let key = |i: usize| (mix(i) as u64 % 7_000) as i64;
            vec![
                Arc::new(Int32Array::from_iter_values(
                    range.clone().map(|i| key(i) as i32),
                )) as ArrayRef,
                Arc::new(Int64Array::from_iter_values(
                    range.clone().map(|i| (key(i) << 40) | 5),
                )),
                Arc::new(Int32Array::from_iter_values(
                    range.clone().map(|i| (mix(i) >> 32) as i32),
                )),
                Arc::new(UInt32Array::from_iter_values(
                    range
                        .clone()
                        .map(|i| mix(i) as u32 | (0x8000_0000 * (i % 2) as u32)),
                )),
                Arc::new(Int64Array::from_iter_values(range.clone().map(mix))),
                Arc::new(Int32Array::from_iter(
                    range.map(|i| (i % 10 != 3).then_some((mix(i) >> 40) as i32)),
                )),
            ]
        })
    };
    // (query, whether the build side carries values, whether every pair is
    // folded, its count(*) column)
    let queries = [
        (
            "SELECT sum(x.v), max(y.v), count(*) FROM x JOIN y ON x.k = y.k",
            true,
            true,
            2,
        ),
        (
            "SELECT sum(x.w), max(y.v), count(*) FROM x JOIN y ON x.k = y.k",
            true,
            true,
            2,
        ),
        (
            "SELECT sum(x.v), min(x.u), max(x.w), count(*) FROM x JOIN y ON x.k = y.k",
            false,
            true,
            3,
        ),
        (
            "SELECT sum(x.v), min(x.u), max(y.w), count(*) FROM x JOIN y ON x.k64 = y.k64",
            true,
            true,
            3,
        ),
        (
            "SELECT sum(x.w), max(x.w), min(y.v), count(*) FROM x JOIN y ON x.k64 = y.k64",
            true,
            true,
            3,
        ),
        (
            "SELECT sum(x.v), sum(y.n), count(*) FROM x JOIN y ON x.k = y.k",
            true,
            false,
            2,
        ),
    ];
    // The devices the 4 probe partitions are spread over.
    let build_copies = gpu_runtime().map_or(1, |runtime| runtime.devices().len().min(4));
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &[]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        let uncarried = gpu_context(mode, 4, &["SET gpu.tuning.carry_folded_values = false"]).await;
        for ctx in [&gpu, &cpu, &uncarried] {
            ctx.register_table("x", make(20_000, 1)).unwrap();
            ctx.register_table("y", make(60_000, 2)).unwrap();
        }
        for (sql, carries, folds_every_pair, count_column) in queries {
            let (gpu_batches, gpu_nodes, plan) = run_counting(&gpu, sql, "HashJoinExec").await;
            let (cpu_batches, _, _) = run(&cpu, sql).await;
            assert!(gpu_nodes >= 1, "{mode:?}: {sql} did not run on the GPU");
            assert_eq!(
                string_rows(&gpu_batches),
                string_rows(&cpu_batches),
                "{mode:?}: {sql}"
            );
            let pairs = cpu_batches[0]
                .column(count_column)
                .as_primitive::<Int64Type>()
                .value(0) as usize;
            assert!(pairs > 100_000, "{mode:?}: {sql}: {pairs} pairs");
            let carrying = plan_metric(&plan, "build_rows_carrying_values");
            let build_rows = plan_metric(&plan, "build_rows");
            assert_eq!(
                carrying > 0,
                carries,
                "{mode:?}: {sql}: {carrying} build rows carried values"
            );
            // A build side collected once is partitioned again on each
            // device its probe partitions run on (one copy a device).
            let copies = match mode {
                JoinMode::CollectLeft => build_copies,
                _ => 1,
            };
            assert!(
                carrying <= build_rows * copies,
                "{mode:?}: {sql}: {carrying} > {build_rows} x {copies}"
            );
            let folded = plan_metric(&plan, "pairs_folded_while_probing");
            assert_eq!(
                folded,
                if folds_every_pair { pairs } else { 0 },
                "{mode:?}: {sql}: pairs folded"
            );
            // Pairs written out against a table that carries values were
            // found by the build rows partitioned again by row id, on the
            // device.
            let by_row_id = plan_metric(&plan, "build_rows_by_row_id");
            assert_eq!(
                by_row_id > 0,
                carries && !folds_every_pair,
                "{mode:?}: {sql}: {by_row_id} build rows partitioned by row id"
            );
            assert!(by_row_id <= build_rows * copies, "{mode:?}: {sql}");
            assert_eq!(
                plan_metric(&plan, "cpu_fallback_chunks"),
                0,
                "{mode:?}: {sql}: chunks joined on the host"
            );
            let (uncarried_batches, _, uncarried_plan) = run(&uncarried, sql).await;
            assert_eq!(
                string_rows(&uncarried_batches),
                string_rows(&cpu_batches),
                "{mode:?}, option off: {sql}"
            );
            assert_eq!(
                plan_metric(&uncarried_plan, "build_rows_carrying_values"),
                0,
                "{mode:?}, option off: {sql}"
            );
        }
    }
}

/// The same over other column types: timestamps with a time zone (MIN and
/// MAX), unsigned integers (wrapping SUM), floats (SUM of integral values,
/// exact in any order), with the option off as the reference's twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_in_the_join_over_timestamps_unsigned_and_floats() {
    let Some(_) = require_gpu("aggregates_in_the_join_over_timestamps_unsigned_and_floats") else {
        return;
    };
    use datafusion::arrow::array::{Float64Array, Int64Array, UInt64Array};
    let rows = 50_000usize;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+02:00".into())),
            false,
        ),
        Field::new("u", DataType::UInt64, false),
        Field::new("f", DataType::Float64, false),
    ]));
    let make = |salt: i64| {
        table_from_columns(Arc::clone(&schema), rows, 3, 3000, move |range| {
            let mix = |i: usize| (i as i64).wrapping_mul(0x9E37_79B9).wrapping_add(salt);
            vec![
                Arc::new(Int64Array::from_iter_values(
                    range.clone().map(|i| (i as i64 * 7 + salt) % 9_000),
                )) as ArrayRef,
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        range
                            .clone()
                            .map(|i| mix(i) % 1_000_000_000_000 - 400_000_000_000),
                    )
                    .with_timezone("+02:00"),
                ),
                Arc::new(UInt64Array::from_iter_values(
                    range.clone().map(|i| (mix(i) as u64).rotate_left(17)),
                )),
                Arc::new(Float64Array::from_iter_values(
                    range.map(|i| (mix(i) % 1_000) as f64 - 300.0),
                )),
            ]
        })
    };
    let sql = "SELECT min(x.ts), max(y.ts), sum(x.u), min(y.u), max(x.u), sum(y.f), count(*) \
               FROM x JOIN y ON x.k = y.k";
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &[]).await;
        let off = gpu_context(mode, 4, &["SET gpu.tuning.aggregate_in_join = false"]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        for ctx in [&gpu, &off, &cpu] {
            ctx.register_table("x", make(1)).unwrap();
            ctx.register_table("y", make(2)).unwrap();
        }
        let (gpu_batches, gpu_nodes, plan) = run(&gpu, sql).await;
        let (off_batches, _, _) = run(&off, sql).await;
        let (cpu_batches, _, _) = run(&cpu, sql).await;
        assert!(gpu_nodes >= 1, "{mode:?}: {sql} did not run on the GPU");
        assert!(
            plan_metric(&plan, "rows_aggregated_on_device") > 100_000,
            "{mode:?}: the pairs were not reduced on the device"
        );
        assert_eq!(
            string_rows(&gpu_batches),
            string_rows(&cpu_batches),
            "{mode:?}"
        );
        assert_eq!(
            string_rows(&off_batches),
            string_rows(&cpu_batches),
            "{mode:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn float_keys_with_many_equal_values_match_the_cpu() {
    // Zeros of both signs, NaNs of three payloads, infinities and NULLs,
    // each held by many rows on both sides: DataFusion calls -0.0 and 0.0
    // equal and a NaN equal to a NaN of the same bits only. The output
    // carries each side's key as stored, so a -0.0 must come back as -0.0.
    let Some(_) = require_gpu("float_keys_with_many_equal_values_match_the_cpu") else {
        return;
    };
    use datafusion::arrow::array::{Float32Array, Float64Array, Int64Array};
    let specials = [
        0.0,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff8_0000_0000_0001),
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
        1.5,
        -1.5,
        1e300,
    ];
    let schema = Arc::new(Schema::new(vec![
        Field::new("f", DataType::Float64, true),
        Field::new("g", DataType::Float32, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let make = |rows: usize, salt: usize| {
        let value = move |i: usize| {
            let i = i.wrapping_mul(7).wrapping_add(salt);
            (!i.is_multiple_of(13)).then(|| specials[i % specials.len()])
        };
        table_from_columns(Arc::clone(&schema), rows, 3, 700, move |range| {
            vec![
                Arc::new(Float64Array::from_iter(range.clone().map(value))) as ArrayRef,
                Arc::new(Float32Array::from_iter(
                    range.clone().map(|i| value(i).map(|v| v as f32)),
                )),
                Arc::new(Int64Array::from_iter_values(range.map(|i| i as i64))),
            ]
        })
    };
    let (r, s) = (make(1_500, 0), make(1_100, 5));
    let mut gpu_nodes = 0;
    for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
        let gpu = gpu_context(mode, 4, &[]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("r", Arc::clone(&r) as _).unwrap();
            ctx.register_table("s", Arc::clone(&s) as _).unwrap();
        }
        for key in ["f", "g"] {
            for sql in [
                format!("SELECT r.{key}, s.{key}, r.v, s.v FROM r JOIN s ON r.{key} = s.{key}"),
                format!(
                    "SELECT r.{key}, s.{key}, r.v, s.v FROM r LEFT JOIN s ON r.{key} = s.{key}"
                ),
                format!(
                    "SELECT r.{key}, s.{key}, r.v, s.v FROM r FULL JOIN s ON r.{key} = s.{key}"
                ),
                format!("SELECT r.{key}, r.v FROM r LEFT SEMI JOIN s ON r.{key} = s.{key}"),
                format!("SELECT r.{key}, r.v FROM r LEFT ANTI JOIN s ON r.{key} = s.{key}"),
                format!(
                    "SELECT r.{key}, s.{key}, r.v, s.v FROM r JOIN s \
                     ON r.{key} IS NOT DISTINCT FROM s.{key}"
                ),
            ] {
                let (gpu_batches, nodes, _) = run(&gpu, &sql).await;
                let (cpu_batches, cpu_nodes, _) = run(&cpu, &sql).await;
                assert_eq!(cpu_nodes, 0);
                assert!(nodes >= 1, "{mode:?} {sql}: not on the GPU");
                gpu_nodes += nodes;
                let (gpu_rows, cpu_rows) = (string_rows(&gpu_batches), string_rows(&cpu_batches));
                assert!(!cpu_rows.is_empty(), "{sql}");
                assert_eq!(gpu_rows.len(), cpu_rows.len(), "{mode:?} {sql}: row counts");
                assert!(gpu_rows == cpu_rows, "{mode:?} {sql}: rows differ");
            }
        }
    }
    assert!(gpu_nodes >= 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_over_thousands_of_one_row_batches_is_not_quadratic() {
    // Every output batch of 8 rows took its rows by interleaving all 10,000
    // one-row probe batches: 27,000 batches times 10,000 pieces. A right
    // join keeps the probe side's rows, and the keys all match.
    let Some(_) = require_gpu("output_over_thousands_of_one_row_batches_is_not_quadratic") else {
        return;
    };
    let r: Vec<Option<i64>> = (0..64).map(|_| Some(1)).collect();
    let s: Vec<Option<i64>> = (0..10_000).map(|i| (i % 3 == 0).then_some(1)).collect();
    for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
        let extra = ["SET datafusion.execution.batch_size = 8"];
        let gpu = gpu_context(mode, 1, &extra).await;
        let cpu = cpu_context(mode, 1, &extra).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("r", key_value_table(&r, 11, 1, 64))
                .unwrap();
            ctx.register_table("s", key_value_table(&s, 23, 1, 1))
                .unwrap();
        }
        let sql = "SELECT r.v, s.v FROM r RIGHT JOIN s ON r.k = s.k";
        let rows = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            assert_same_int64_rows(&gpu, &cpu, sql, 1),
        )
        .await
        .unwrap_or_else(|_| panic!("{mode:?}: no answer in 60 s"));
        assert_eq!(rows, 64 * 3334 + 6666);
    }
}

/// A device error before a probe chunk's first output (injected where its
/// device part would run) joins that chunk on the host: the same rows as
/// DataFusion's, counted in `device_error_fallback_chunks`. Where the
/// session asks device errors to fail (as every other test does), the
/// query fails with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_error_before_a_chunks_output_joins_it_on_the_host() {
    let Some(_) = require_gpu("a_device_error_before_a_chunks_output_joins_it_on_the_host") else {
        return;
    };
    let r = gen_keys(20_000, Keys::Uniform { domain: 5_000 }, 0.05, 1);
    let s = gen_keys(30_000, Keys::Uniform { domain: 5_000 }, 0.05, 2);
    let extra = [
        "SET gpu_test.device_errors_fail = false",
        "SET gpu_test.inject_device_error = true",
    ];
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &extra).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        register([&gpu, &cpu], &r, &s, 3, 1000).await;
        let (gpu_rows, gpu_nodes, plan) = run(&gpu, JOIN_ROWS).await;
        let (cpu_rows, _, _) = run(&cpu, JOIN_ROWS).await;
        assert!(gpu_nodes >= 1, "{mode:?}: no GPU join");
        assert_eq!(int64_rows(&gpu_rows), int64_rows(&cpu_rows), "{mode:?}");
        let failed = plan_metric(&plan, "device_error_fallback_chunks");
        assert!(failed > 0, "{mode:?}: no chunk counted");
        assert_eq!(
            failed,
            plan_metric(&plan, "cpu_fallback_chunks"),
            "{mode:?}"
        );
        gpu.sql("SET gpu_test.device_errors_fail = true")
            .await
            .unwrap();
        let failing = gpu.sql(JOIN_ROWS).await.unwrap().collect().await;
        let error = failing.expect_err("an injected device error with errors failing");
        assert!(error.to_string().contains("injected"), "{mode:?}: {error}");
    }
}

/// The join's `output_ranges` and `pairs_written` once they stop
/// changing: the partitions a `LIMIT` stops reading may still be writing
/// the range they began on the device, counting it once the query has its
/// rows, the range first and its pairs after. Read as they move, a range's
/// pairs could be counted without the range.
async fn settled_range_metrics(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
    let read = || {
        (
            plan_metric(plan, "output_ranges"),
            plan_metric(plan, "pairs_written"),
        )
    };
    let mut last = read();
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the join's range metrics still moving after 2 s: {last:?}");
}

/// A LIMIT over an inner join where one key matches 8,192 rows on each
/// side (2^26 pairs): the fetch pushed into the join stops each probe chunk
/// at its first range of at most `gpu.max_output_pairs` pairs (2^20), so
/// the device writes one range a chunk, not all 64, and the answer is ten
/// of the pairs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_over_a_join_of_one_key_matching_many_rows_stops_at_one_range() {
    let Some(_) =
        require_gpu("a_limit_over_a_join_of_one_key_matching_many_rows_stops_at_one_range")
    else {
        return;
    };
    let rows = 1i64 << 13;
    let max_pairs = 1usize << 20;
    let table = |first_id: i64| -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("id", DataType::Int64, false),
        ]));
        let partitions = (0..4)
            .map(|p| {
                let ids = first_id + p * rows / 4..first_id + (p + 1) * rows / 4;
                let k: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.clone().map(|_| 7)));
                let id: ArrayRef = Arc::new(Int64Array::from_iter_values(ids));
                vec![RecordBatch::try_new(Arc::clone(&schema), vec![k, id]).unwrap()]
            })
            .collect();
        Arc::new(MemTable::try_new(schema, partitions).unwrap())
    };
    let sql = "SELECT r.k, s.k, r.id, s.id FROM r JOIN s ON r.k = s.k LIMIT 10";
    let bound = format!("SET gpu.max_output_pairs = {max_pairs}");
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &[bound.as_str()]).await;
        gpu.register_table("r", table(0)).unwrap();
        gpu.register_table("s", table(1_000_000)).unwrap();
        let (got, gpu_nodes, plan) = run(&gpu, sql).await;
        assert!(gpu_nodes >= 1, "{mode:?}: no GPU join");
        let got = int64_rows(&got);
        assert_eq!(got.len(), 10, "{mode:?}");
        let distinct: std::collections::BTreeSet<_> = got.iter().collect();
        assert_eq!(distinct.len(), 10, "{mode:?}: {got:?}");
        for row in &got {
            assert_eq!((row[0], row[1]), (Some(7), Some(7)), "{mode:?}: {row:?}");
            let (r_id, s_id) = (row[2].unwrap(), row[3].unwrap());
            assert!((0..rows).contains(&r_id), "{mode:?}: {row:?}");
            assert!(
                (1_000_000..1_000_000 + rows).contains(&s_id),
                "{mode:?}: {row:?}"
            );
        }
        // No partition reads more than one chunk of these 8,192 probe rows
        // (four partitions of 2,048, or all in one), and a chunk stops at
        // its first range: at most four ranges (a chunk counts in
        // `probe_chunks` only when it ends, and the LIMIT may drop it
        // first), where without the fetch there would be 64.
        let (ranges, written) = settled_range_metrics(&plan).await;
        assert!((1..=4).contains(&ranges), "{mode:?}: {ranges} ranges");
        assert!(
            written <= max_pairs * ranges,
            "{mode:?}: {written} pairs written in {ranges} ranges"
        );
    }
}

/// String keys whose probe side holds more string bytes than a chunk may:
/// the chunks end before a batch that would carry them past the bound
/// (lowered here to 64 KiB), the same rows as DataFusion's. Batches of 100
/// rows (20,000 bytes of keys) each fit a chunk, so the 4,000,000 bytes of
/// probe keys take at least 62 chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn probe_chunks_of_long_strings_stay_within_their_bytes() {
    let Some(_) = require_gpu("probe_chunks_of_long_strings_stay_within_their_bytes") else {
        return;
    };
    let (r, s) = long_string_tables(2_000, 20_000, 200, 4);
    let sql = "SELECT r.id, s.id FROM r JOIN s ON r.k = s.k";
    let small_batches = "SET datafusion.execution.batch_size = 100";
    for mode in JoinMode::ALL {
        let gpu = gpu_context(
            mode,
            4,
            &[small_batches, "SET gpu_test.max_probe_chunk_bytes = 65536"],
        )
        .await;
        let cpu = cpu_context(mode, 4, &[small_batches]).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("r", Arc::clone(&r) as _).unwrap();
            ctx.register_table("s", Arc::clone(&s) as _).unwrap();
        }
        let (gpu_rows, gpu_nodes, plan) = run(&gpu, sql).await;
        let (cpu_rows, _, _) = run(&cpu, sql).await;
        assert!(gpu_nodes >= 1, "{mode:?}: no GPU join");
        assert_eq!(int64_rows(&gpu_rows), int64_rows(&cpu_rows), "{mode:?}");
        let chunks = plan_metric(&plan, "probe_chunks");
        assert!(chunks >= 62, "{mode:?}: {chunks} probe chunks");
    }
}

/// A probe side of more than 2 GiB of string keys (600,000 keys of 4,000
/// bytes) read as one stream, with chunks of a million rows asked for: one
/// chunk's contiguous key column could not hold them (32-bit offsets), so
/// the chunks end at the built-in bound; the same count as DataFusion's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_side_of_more_than_2_gib_of_string_keys_is_joined() {
    let Some(_) = require_gpu("a_probe_side_of_more_than_2_gib_of_string_keys_is_joined") else {
        return;
    };
    let (r, s) = long_string_tables(1_000, 600_000, 4_000, 1);
    let sql = "SELECT count(*), sum(r.id), sum(s.id) FROM r JOIN s ON r.k = s.k";
    let one_chunk = ["SET gpu.tuning.probe_chunk_rows = 1048576"];
    let gpu = gpu_context(JoinMode::CollectLeft, 1, &one_chunk).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 1, &[]).await;
    for ctx in [&gpu, &cpu] {
        ctx.register_table("r", Arc::clone(&r) as _).unwrap();
        ctx.register_table("s", Arc::clone(&s) as _).unwrap();
    }
    let (gpu_rows, gpu_nodes, plan) = run(&gpu, sql).await;
    let (cpu_rows, _, _) = run(&cpu, sql).await;
    assert!(gpu_nodes >= 1, "no GPU join");
    assert_eq!(string_rows(&gpu_rows), string_rows(&cpu_rows));
    assert!(plan_metric(&plan, "probe_chunks") >= 3);
}

/// Tables r (`build` rows) and s (`probe` rows) of (k Utf8, id Int64): keys
/// of `width` bytes, s's drawn from 1.5 times r's, so about two thirds of
/// s's rows find one match; s in batches of 8,192 rows in `partitions`
/// partitions.
fn long_string_tables(
    build: usize,
    probe: usize,
    width: usize,
    partitions: usize,
) -> (
    Arc<datafusion::datasource::MemTable>,
    Arc<datafusion::datasource::MemTable>,
) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("id", DataType::Int64, false),
    ]));
    let key = |i: usize| format!("{i:0width$}");
    let table = |rows: usize, domain: usize, partitions: usize| {
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(8_192)
            .map(|start| {
                let end = (start + 8_192).min(rows);
                let k =
                    StringArray::from_iter_values((start..end).map(|i| key(i * 7_919 % domain)));
                let id = Int64Array::from_iter_values((start..end).map(|i| i as i64));
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(id)]).unwrap()
            })
            .collect();
        let mut parts = vec![Vec::new(); partitions];
        for (i, batch) in batches.into_iter().enumerate() {
            parts[i % partitions].push(batch);
        }
        Arc::new(datafusion::datasource::MemTable::try_new(Arc::clone(&schema), parts).unwrap())
    };
    (
        table(build, build, 1),
        table(probe, build * 3 / 2, partitions),
    )
}

/// Row groups of the Parquet scans in `plan` that their predicates pruned
/// by statistics.
fn row_groups_pruned(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let here: usize = plan.metrics().map_or(0, |metrics| {
        metrics
            .iter()
            .map(|metric| match metric.value() {
                MetricValue::PruningMetrics {
                    name,
                    pruning_metrics,
                } if name.as_ref() == "row_groups_pruned_statistics" => pruning_metrics.pruned(),
                _ => 0,
            })
            .sum()
    });
    here + plan
        .children()
        .into_iter()
        .map(row_groups_pruned)
        .sum::<usize>()
}

/// `batch` written to a Parquet file at `path`, with `properties` or the
/// writer's defaults.
fn write_parquet(
    path: &std::path::Path,
    batch: &RecordBatch,
    properties: Option<WriterProperties>,
) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), properties).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

/// The probe side of a join read from Parquet, keys sorted, in 64 row
/// groups of 1,024 rows; build sides of few keys (listed) and of many in a
/// narrow range. The GPU join publishes the build keys as DataFusion's
/// dynamic filter, so the scan skips the row groups no build key falls in,
/// as under DataFusion's own join collected once: 62 of 64 both times, the
/// same answer; the GPU join re-planned over DataFusion's partitions
/// (`JoinMode::Partitioned`) publishes one filter of all partitions' keys
/// and prunes as many.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_join_prunes_its_parquet_probe_side_by_the_build_keys_as_datafusion_does() {
    let dir = std::env::temp_dir().join(format!(
        "datafusion-gpu-probe-filter-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.parquet");
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let k = Int64Array::from_iter_values(0..1 << 16);
    let v = Int64Array::from_iter_values((0..1 << 16).map(|i| i * 7));
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1024))
        .build();
    write_parquet(
        &path,
        &RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(v)]).unwrap(),
        Some(properties),
    );
    let build = |keys: Vec<i64>| -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("w", DataType::Int64, false),
        ]));
        let w = Int64Array::from_iter_values(keys.iter().map(|k| k + 1));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(keys)), Arc::new(w)],
        )
        .unwrap();
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())
    };
    let sql = "SELECT r.k, r.w, s.v FROM r JOIN s ON r.k = s.k";
    // Few keys, listed: 5 in the first row group, 40,000 and 40,001 in the
    // 40th. Many keys, a range: 20,000 to 21,497, in the 20th and 21st.
    let cases = [
        vec![5, 40_000, 40_001],
        (0..500).map(|j| 20_000 + 3 * j).collect(),
    ];
    let gpu_present = require_gpu(
        "a_gpu_join_prunes_its_parquet_probe_side_by_the_build_keys_as_datafusion_does",
    )
    .is_some();
    for keys in cases {
        // DataFusion's own join prunes them with its build side collected
        // once: the test's premise. (Its partitioned join's filter routes
        // each key to its partition's keys by hash, which a scan's row
        // group statistics cannot test.)
        let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
        cpu.register_table("r", build(keys.clone())).unwrap();
        cpu.register_parquet("s", path.to_str().unwrap(), Default::default())
            .await
            .unwrap();
        let (_, _, plan) = run(&cpu, sql).await;
        assert_eq!(
            row_groups_pruned(&plan),
            62,
            "DataFusion, {} keys",
            keys.len()
        );
        if !gpu_present {
            continue;
        }
        for mode in JoinMode::ALL {
            let gpu = gpu_context(mode, 4, &[]).await;
            gpu.register_table("r", build(keys.clone())).unwrap();
            gpu.register_parquet("s", path.to_str().unwrap(), Default::default())
                .await
                .unwrap();
            let (got, gpu_nodes, plan) = run(&gpu, sql).await;
            assert!(gpu_nodes >= 1, "{mode:?}: no GPU join");
            let mut got = int64_rows(&got);
            got.sort();
            let expected: Vec<Vec<Option<i64>>> = keys
                .iter()
                .map(|&k| vec![Some(k), Some(k + 1), Some(k * 7)])
                .collect();
            assert_eq!(got, expected, "{mode:?}");
            // Where DataFusion's partitions stay, a partition's probe side
            // may start before the other partitions' build sides are in,
            // and so before the filter is: its scan may prune fewer.
            if mode != JoinMode::PartitionedKept {
                let pruned = row_groups_pruned(&plan);
                assert_eq!(pruned, 62, "{mode:?}, {} keys", keys.len());
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Float keys: a join takes -0.0 and 0.0 as one key. A Parquet probe side
/// holding both zeros, read with row filters (`pushdown_filters`), so that
/// the GPU join's dynamic filter is applied to each of its rows, joined to
/// build sides holding one zero (beside a NaN, the greatest float, or 7.5):
/// the filter keeps both zeros and the join matches both, as DataFusion's
/// join does without its own dynamic filter, whose range and list order
/// floats totally and drop the other zero (DataFusion 55).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_float_zeros_pass_the_gpu_joins_filter_and_match_either_zero() {
    use datafusion::arrow::array::Float64Array;
    let dir = std::env::temp_dir().join(format!(
        "datafusion-gpu-float-zero-filter-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.parquet");
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Float64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let k = Float64Array::from(vec![0.0, 1.5, -0.0, 3.0, 7.5, 9.0]);
    let v = Int64Array::from(vec![1, 10, 100, 1_000, 10_000, 100_000]);
    write_parquet(
        &path,
        &RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(k), Arc::new(v)]).unwrap(),
        None,
    );
    let build = |keys: Vec<f64>| -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Float64, false),
            Field::new("w", DataType::Int64, false),
        ]));
        let w = Int64Array::from_iter_values(1..=keys.len() as i64);
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Float64Array::from(keys)), Arc::new(w)],
        )
        .unwrap();
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())
    };
    let sql = "SELECT count(*), sum(r.w), sum(s.v) FROM r JOIN s ON r.k = s.k";
    let row_filters = "SET datafusion.execution.parquet.pushdown_filters = true";
    let no_dynamic_filter = "SET datafusion.optimizer.enable_dynamic_filter_pushdown = false";
    let gpu_present =
        require_gpu("both_float_zeros_pass_the_gpu_joins_filter_and_match_either_zero").is_some();
    // Each build side matches both zeros of the probe side (v 1 and 100),
    // and 7.5 its own row.
    let builds = [
        (vec![-0.0, f64::NAN], vec![Some(2), Some(2), Some(101)]),
        (vec![0.0, 7.5], vec![Some(3), Some(4), Some(10_101)]),
        (vec![-0.0], vec![Some(2), Some(2), Some(101)]),
    ];
    for (keys, expected) in builds {
        // DataFusion's join without its dynamic filter: the test's premise.
        let cpu = cpu_context(JoinMode::CollectLeft, 4, &[row_filters, no_dynamic_filter]).await;
        cpu.register_table("r", build(keys.clone())).unwrap();
        cpu.register_parquet("s", path.to_str().unwrap(), Default::default())
            .await
            .unwrap();
        let (cpu_rows, _, _) = run(&cpu, sql).await;
        assert_eq!(
            int64_rows(&cpu_rows),
            vec![expected.clone()],
            "DataFusion, {keys:?}"
        );
        if !gpu_present {
            continue;
        }
        for mode in JoinMode::ALL {
            let gpu = gpu_context(mode, 4, &[row_filters]).await;
            gpu.register_table("r", build(keys.clone())).unwrap();
            gpu.register_parquet("s", path.to_str().unwrap(), Default::default())
                .await
                .unwrap();
            let (got, gpu_nodes, _) = run(&gpu, sql).await;
            assert!(gpu_nodes >= 1, "{mode:?}: no GPU join");
            assert_eq!(
                int64_rows(&got),
                vec![expected.clone()],
                "{mode:?}, {keys:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
