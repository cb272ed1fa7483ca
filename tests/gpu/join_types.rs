//! Differential tests of every join type, key type, NULL semantics and
//! residual filter: the GPU join against DataFusion's `HashJoinExec` on the
//! same generated tables (NULL keys, duplicates, skew, empty sides), in both
//! partition modes, with small chunks and output ranges in one variant.
//! Every query must run its joins on the GPU, and the tests fail unless every
//! DataFusion join type was seen on the GPU.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
    LargeStringArray, StringArray, StringViewArray, TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_gpu::GpuHashJoinExec;

use crate::support::*;

/// How the keys of a generated table are drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    rows: usize,
    /// Distinct key values (duplicates when smaller than `rows`).
    domain: u64,
    /// Every `null_every`-th row has NULL in every key column (0: none).
    null_every: usize,
    /// Fraction of rows, in percent, that all take key 0 (skew).
    hot_percent: u64,
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A table whose key columns of many types all derive from one key per row,
/// so a join on any of them has the same shape.
fn typed_table(shape: Shape, seed: u64) -> Arc<MemTable> {
    typed_table_in(shape, seed, 3)
}

/// [`typed_table`] in `partitions` partitions.
pub(crate) fn typed_table_in(shape: Shape, seed: u64, partitions: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new("k64", DataType::Int64, true),
        Field::new("k32", DataType::Int32, true),
        Field::new("ks", DataType::Utf8, true),
        Field::new("kls", DataType::LargeUtf8, true),
        Field::new("kv", DataType::Utf8View, true),
        Field::new("kf", DataType::Float64, true),
        Field::new("kd", DataType::Decimal128(15, 2), true),
        Field::new("kb", DataType::Boolean, true),
        Field::new("kdate", DataType::Date32, true),
        Field::new("kts", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        Field::new("kwide", DataType::Int64, true),
    ]));
    let key = move |i: usize| -> Option<u64> {
        if shape.null_every > 0 && i % shape.null_every == shape.null_every - 1 {
            return None;
        }
        let h = mix(seed ^ (i as u64).wrapping_mul(31));
        if h % 100 < shape.hot_percent {
            Some(0)
        } else {
            Some(mix(h) % shape.domain.max(1))
        }
    };
    table_from_columns(
        Arc::clone(&schema),
        shape.rows,
        partitions,
        700,
        move |range| {
            let keys: Vec<Option<u64>> = range.clone().map(key).collect();
            let map_i64 =
                |f: &dyn Fn(u64) -> i64| Int64Array::from_iter(keys.iter().map(|k| k.map(f)));
            let text = |prefix: &str, k: u64| format!("{prefix}{k}");
            vec![
                Arc::new(Int64Array::from_iter_values(
                    range
                        .clone()
                        .map(|i| (seed as i64) * 1_000_000_000 + i as i64),
                )) as ArrayRef,
                Arc::new(Int64Array::from_iter_values(
                    range.clone().map(|i| (mix(seed + i as u64) % 1000) as i64),
                )),
                Arc::new(map_i64(&|k| k as i64 * 1_000_003 - 5_000_000)),
                Arc::new(Int32Array::from_iter(
                    keys.iter().map(|k| k.map(|k| k as i32 - 40)),
                )),
                Arc::new(StringArray::from_iter(
                    keys.iter().map(|k| k.map(|k| text("k", k))),
                )),
                Arc::new(LargeStringArray::from_iter(
                    keys.iter().map(|k| k.map(|k| text("large-", k))),
                )),
                Arc::new(StringViewArray::from_iter(keys.iter().map(|k| {
                    k.map(|k| text("a view string longer than twelve bytes ", k))
                }))),
                Arc::new(Float64Array::from_iter(keys.iter().map(|k| {
                    k.map(|k| match k {
                        1 => -0.0,
                        2 => 0.0,
                        3 => f64::NAN,
                        k => k as f64 * 0.25,
                    })
                }))),
                Arc::new(
                    Decimal128Array::from_iter(
                        keys.iter().map(|k| k.map(|k| k as i128 * 100 + 37)),
                    )
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
                ),
                Arc::new(BooleanArray::from_iter(
                    keys.iter().map(|k| k.map(|k| k % 3 == 0)),
                )),
                Arc::new(Date32Array::from_iter(
                    keys.iter().map(|k| k.map(|k| 19_000 + k as i32)),
                )),
                Arc::new(TimestampNanosecondArray::from_iter(
                    keys.iter().map(|k| k.map(|k| k as i64 * 1_000_000_007)),
                )),
                Arc::new(map_i64(&|k| {
                    if k % 2 == 0 {
                        i64::MIN + k as i64
                    } else {
                        i64::MAX - k as i64
                    }
                })),
            ]
        },
    )
}

/// Join conditions over the typed tables, `r` and `s` standing for the sides.
pub(crate) const KEYS: &[(&str, &str)] = &[
    ("Int64", "r.k64 = s.k64"),
    ("Int32", "r.k32 = s.k32"),
    ("Utf8", "r.ks = s.ks"),
    ("LargeUtf8", "r.kls = s.kls"),
    ("Utf8View", "r.kv = s.kv"),
    ("Float64", "r.kf = s.kf"),
    ("Decimal128", "r.kd = s.kd"),
    // Boolean alone would make a near cross product; with a second column it
    // still takes the packed path.
    ("Int32+Boolean", "r.k32 = s.k32 AND r.kb = s.kb"),
    ("Date32", "r.kdate = s.kdate"),
    ("Timestamp", "r.kts = s.kts"),
    ("Int64+Utf8", "r.k64 = s.k64 AND r.ks = s.ks"),
    ("Int64+Int32 packed", "r.k64 = s.k64 AND r.k32 = s.k32"),
    (
        "Int64 wide+Int64 hashed",
        "r.kwide = s.kwide AND r.k64 = s.k64",
    ),
];

/// Queries per join type; `{on}` is the join condition.
pub(crate) const QUERIES: &[&str] = &[
    "SELECT r.id, s.id FROM r JOIN s ON {on}",
    "SELECT r.id, s.id FROM r LEFT JOIN s ON {on}",
    "SELECT r.id, s.id FROM r RIGHT JOIN s ON {on}",
    "SELECT r.id, s.id FROM r FULL JOIN s ON {on}",
    "SELECT r.id FROM r LEFT SEMI JOIN s ON {on}",
    "SELECT s.id FROM r RIGHT SEMI JOIN s ON {on}",
    "SELECT r.id FROM r LEFT ANTI JOIN s ON {on}",
    "SELECT s.id FROM r RIGHT ANTI JOIN s ON {on}",
    // A subquery in a disjunction plans as a mark join.
    "SELECT r.id FROM r WHERE EXISTS (SELECT 1 FROM s WHERE {on}) OR r.v < 100",
    "SELECT s.id FROM s WHERE EXISTS (SELECT 1 FROM r WHERE {on}) OR s.v < 100",
    // Residual filters, on matched pairs and on outer joins.
    "SELECT r.id, s.id FROM r JOIN s ON {on} AND r.v > s.v",
    "SELECT r.id, s.id FROM r LEFT JOIN s ON {on} AND r.v - 300 <= s.v AND s.v <= r.v + 300",
    "SELECT r.id, s.id FROM r FULL JOIN s ON {on} AND (r.v + s.v) % 3 <> 0",
    "SELECT r.id FROM r LEFT ANTI JOIN s ON {on} AND s.v < r.v",
    "SELECT s.id FROM r RIGHT SEMI JOIN s ON {on} AND s.v < r.v",
];

/// Marks, among the join types seen, a GPU join that ran over all input
/// partitions with DataFusion's CPU hash repartitions removed.
const OVER_ALL_PARTITIONS: &str = "over all input partitions";

/// The join types of the GPU joins in `plan`.
fn gpu_join_types(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeSet<String>) {
    if let Some(join) = plan.downcast_ref::<GpuHashJoinExec>() {
        let mut name = join.hash_join().join_type().to_string();
        if join.hash_join().null_aware {
            name.push_str(" (null-aware)");
        }
        out.insert(name);
        if join.repartition_removed() {
            out.insert(OVER_ALL_PARTITIONS.to_string());
        }
    }
    for child in plan.children() {
        gpu_join_types(child, out);
    }
}

/// Registers `r` and `s` on both contexts.
fn register(ctxs: [&SessionContext; 2], r: Shape, s: Shape) {
    for ctx in ctxs {
        ctx.register_table("r", typed_table(r, 1)).unwrap();
        ctx.register_table("s", typed_table(s, 2)).unwrap();
    }
}

/// Runs `sql` on both contexts; asserts equal rows and a GPU join.
async fn check(gpu: &SessionContext, cpu: &SessionContext, sql: &str, seen: &mut BTreeSet<String>) {
    let (gpu_batches, gpu_nodes, plan) = run(gpu, sql).await;
    let (cpu_batches, _, _) = run(cpu, sql).await;
    assert!(
        gpu_nodes >= 1,
        "{sql}: no join ran on the GPU\n{}",
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
    );
    gpu_join_types(&plan, seen);
    let (g, c) = (string_rows(&gpu_batches), string_rows(&cpu_batches));
    if g != c {
        let first = g.iter().zip(&c).position(|(a, b)| a != b);
        panic!(
            "{sql}: GPU {} rows, CPU {} rows, first difference at sorted row {first:?}\n{}",
            g.len(),
            c.len(),
            datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
        );
    }
}

async fn every_join_type_and_key(
    name: &str,
    r: Shape,
    s: Shape,
    extra: &[&str],
) -> Option<BTreeSet<String>> {
    require_gpu(name)?;
    let mut seen = BTreeSet::new();
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, extra).await;
        let cpu = cpu_context(mode, 4, extra).await;
        register([&gpu, &cpu], r, s);
        for (_, on) in KEYS {
            for query in QUERIES {
                check(&gpu, &cpu, &query.replace("{on}", on), &mut seen).await;
            }
        }
    }
    Some(seen)
}

pub(crate) const fn shape(rows: usize, domain: u64, null_every: usize, hot_percent: u64) -> Shape {
    Shape {
        rows,
        domain,
        null_every,
        hot_percent,
    }
}

/// The join types of the CPU hash joins in `plan`.
fn cpu_join_types(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeSet<String>) {
    if let Some(join) = plan.downcast_ref::<datafusion::physical_plan::joins::HashJoinExec>() {
        out.insert(join.join_type().to_string());
    }
    for child in plan.children() {
        cpu_join_types(child, out);
    }
}

/// Runs without a GPU too: the queries above plan hash joins of every join
/// type, so the differential tests cover them all.
#[tokio::test]
async fn the_differential_queries_plan_every_hash_join_type() {
    let mut seen = BTreeSet::new();
    for (r, s) in [
        (shape(1_500, 700, 11, 0), shape(4_000, 900, 13, 0)),
        (shape(5_000, 2_000, 7, 0), shape(900, 400, 0, 0)),
    ] {
        for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
            let cpu = cpu_context(mode, 4, &[]).await;
            let other = cpu_context(mode, 4, &[]).await;
            register([&cpu, &other], r, s);
            for (_, on) in KEYS {
                for query in QUERIES {
                    let sql = query.replace("{on}", on);
                    let plan = cpu
                        .sql(&sql)
                        .await
                        .unwrap()
                        .create_physical_plan()
                        .await
                        .unwrap();
                    let mut here = BTreeSet::new();
                    cpu_join_types(&plan, &mut here);
                    assert!(
                        !here.is_empty(),
                        "{sql} plans no hash join\n{}",
                        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
                    );
                    seen.extend(here);
                }
            }
        }
    }
    for join_type in ALL_JOIN_TYPES {
        assert!(
            seen.contains(*join_type),
            "{join_type} never planned; seen: {seen:?}"
        );
    }
}

const ALL_JOIN_TYPES: &[&str] = &[
    "Inner",
    "Left",
    "Right",
    "Full",
    "LeftSemi",
    "RightSemi",
    "LeftAnti",
    "RightAnti",
    "LeftMark",
    "RightMark",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_join_type_on_every_key_type() {
    // r smaller than s and the other way round, so the planner swaps sides
    // and both the Left and the Right variant of each type reach the GPU.
    let mut seen = BTreeSet::new();
    for (r, s) in [
        (shape(1_500, 700, 11, 0), shape(4_000, 900, 13, 0)),
        (shape(5_000, 2_000, 7, 0), shape(900, 400, 0, 0)),
    ] {
        let Some(types) =
            every_join_type_and_key("every_join_type_on_every_key_type", r, s, &[]).await
        else {
            return;
        };
        seen.extend(types);
    }
    for join_type in ALL_JOIN_TYPES {
        assert!(
            seen.contains(*join_type),
            "{join_type} never ran on the GPU; seen: {seen:?}"
        );
    }
    assert!(
        seen.contains(OVER_ALL_PARTITIONS),
        "no GPU join ran over all input partitions; seen: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skew_small_chunks_and_bounded_output_ranges() {
    // A tenth of each side on one key, chunks of 500 probe rows and output
    // ranges of 300 pairs: every per-chunk and per-range path is taken.
    every_join_type_and_key(
        "skew_small_chunks_and_bounded_output_ranges",
        shape(1_000, 300, 9, 10),
        shape(1_200, 300, 0, 10),
        &[
            "SET gpu.tuning.probe_chunk_rows = 500",
            "SET gpu.max_output_pairs = 300",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn empty_and_all_null_sides() {
    for (r, s) in [
        (shape(0, 1, 0, 0), shape(1_000, 100, 5, 0)),
        (shape(1_000, 100, 5, 0), shape(0, 1, 0, 0)),
        (shape(500, 50, 1, 0), shape(800, 50, 3, 0)),
        (shape(800, 50, 3, 0), shape(500, 50, 1, 0)),
    ] {
        if every_join_type_and_key("empty_and_all_null_sides", r, s, &[])
            .await
            .is_none()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn null_equals_null_and_the_null_aware_anti_join() {
    let Some(_) = require_gpu("null_equals_null_and_the_null_aware_anti_join") else {
        return;
    };
    let queries = [
        "SELECT r.id, s.id FROM r JOIN s ON r.k32 IS NOT DISTINCT FROM s.k32",
        "SELECT r.id, s.id FROM r FULL JOIN s ON r.ks IS NOT DISTINCT FROM s.ks",
        "SELECT r.id, s.id FROM r LEFT JOIN s ON (r.k64 IS NOT DISTINCT FROM s.k64) AND (r.kb IS NOT DISTINCT FROM s.kb)",
        "SELECT r.id, s.id FROM r JOIN s ON r.kwide IS NOT DISTINCT FROM s.kwide",
        "SELECT r.id FROM r WHERE r.k64 NOT IN (SELECT s.k64 FROM s)",
        "SELECT r.id FROM r WHERE r.ks NOT IN (SELECT s.ks FROM s WHERE s.v < 500)",
        "SELECT r.id FROM r WHERE r.k32 NOT IN (SELECT s.k32 FROM s WHERE s.k32 IS NOT NULL)",
        "SELECT r.id FROM r WHERE r.k32 NOT IN (SELECT s.k32 FROM s WHERE s.v < 0)",
    ];
    let mut seen = BTreeSet::new();
    for (r, s) in [
        (shape(1_200, 300, 10, 0), shape(2_000, 400, 17, 0)),
        (shape(1_200, 300, 10, 0), shape(2_000, 400, 0, 0)),
        (shape(0, 1, 0, 0), shape(300, 40, 4, 0)),
    ] {
        for mode in JoinMode::ALL {
            let gpu = gpu_context(mode, 4, &[]).await;
            let cpu = cpu_context(mode, 4, &[]).await;
            register([&gpu, &cpu], r, s);
            for sql in queries {
                check(&gpu, &cpu, sql, &mut seen).await;
            }
        }
    }
    assert!(
        seen.contains("LeftAnti (null-aware)"),
        "no null-aware anti join ran on the GPU: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_pushed_into_the_join_limits_its_output() {
    let Some(_) = require_gpu("a_fetch_pushed_into_the_join_limits_its_output") else {
        return;
    };
    let gpu = gpu_context(JoinMode::CollectLeft, 1, &[]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 1, &[]).await;
    register(
        [&gpu, &cpu],
        shape(3_000, 100, 0, 0),
        shape(3_000, 100, 0, 0),
    );
    let sql = "SELECT count(*) FROM (SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64 LIMIT 77)";
    let (gpu_batches, gpu_nodes, _) = run(&gpu, sql).await;
    let (cpu_batches, _, _) = run(&cpu, sql).await;
    assert!(gpu_nodes >= 1);
    assert_eq!(string_rows(&gpu_batches), string_rows(&cpu_batches));
    assert_eq!(int64_rows(&gpu_batches), vec![vec![Some(77)]]);
}

/// The sum of metric `name` over the GPU joins of `plan`.
fn gpu_join_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    node_metric::<GpuHashJoinExec>(plan, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_budget_too_small_for_the_join_falls_back_to_the_host() {
    let Some(_) = require_gpu("a_device_budget_too_small_for_the_join_falls_back_to_the_host")
    else {
        return;
    };
    // A budget of a few bytes: every device reservation fails, the chunks
    // are joined on the host, and the query still succeeds with the same rows.
    let tiny = ["SET gpu.memory_fraction = 0.000000001"];
    let queries = [
        "SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64",
        "SELECT r.id, s.id FROM r FULL JOIN s ON r.ks = s.ks AND r.v > s.v",
        "SELECT r.id FROM r LEFT ANTI JOIN s ON r.k32 = s.k32",
        "SELECT r.id FROM r WHERE r.k64 NOT IN (SELECT s.k64 FROM s)",
    ];
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &tiny).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        register(
            [&gpu, &cpu],
            shape(2_000, 500, 9, 0),
            shape(3_000, 600, 0, 0),
        );
        for sql in queries {
            let mut seen = BTreeSet::new();
            check(&gpu, &cpu, sql, &mut seen).await;
            let (_, _, plan) = run(&gpu, sql).await;
            assert!(
                gpu_join_metric(&plan, "cpu_fallback_chunks") > 0,
                "{sql}: no chunk fell back to the host"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_leave_in_the_order_hash_join_exec_emits_them() {
    let Some(_) = require_gpu("rows_leave_in_the_order_hash_join_exec_emits_them") else {
        return;
    };
    // One partition per input: DataFusion's output order is deterministic,
    // and with gpu.preserve_order (the default) the GPU join must match it
    // row for row, duplicates, unmatched rows and several probe batches included.
    let queries = [
        "SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64",
        "SELECT r.id, s.id FROM r LEFT JOIN s ON r.ks = s.ks",
        "SELECT r.id, s.id FROM r RIGHT JOIN s ON r.k32 = s.k32 AND r.v < s.v",
        "SELECT r.id, s.id FROM r FULL JOIN s ON r.kf = s.kf",
        "SELECT r.id FROM r LEFT SEMI JOIN s ON r.k64 = s.k64",
        "SELECT s.id FROM r RIGHT ANTI JOIN s ON r.kd = s.kd",
        "SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64 LIMIT 50",
        "SELECT r.id, s.id FROM r RIGHT JOIN (SELECT * FROM s ORDER BY v LIMIT 500) s ON r.k64 = s.k64",
    ];
    // Output ranges of 300 pairs split a chunk's pairs, which are then
    // ordered on the host; with the default bound each chunk's pairs are one
    // range, and an inner join orders and gathers them on the device.
    for (ranges, extra) in [
        (
            "several ranges a chunk",
            &[
                "SET gpu.tuning.probe_chunk_rows = 1000",
                "SET gpu.max_output_pairs = 300",
            ][..],
        ),
        (
            "one range a chunk",
            &["SET gpu.tuning.probe_chunk_rows = 1000"][..],
        ),
    ] {
        let gpu = gpu_context(JoinMode::CollectLeft, 1, extra).await;
        let cpu = cpu_context(JoinMode::CollectLeft, 1, extra).await;
        for ctx in [&gpu, &cpu] {
            // Tables of 700-row batches: the build side arrives in three,
            // so arrival order differs from the concatenated rows' order.
            ctx.register_table("r", typed_table_in(shape(1_500, 400, 11, 5), 1, 1))
                .unwrap();
            ctx.register_table("s", typed_table_in(shape(2_500, 500, 13, 5), 2, 1))
                .unwrap();
        }
        let mut gathered_on_device = 0;
        for sql in queries {
            let (gpu_batches, gpu_nodes, plan) = run(&gpu, sql).await;
            let (cpu_batches, _, _) = run(&cpu, sql).await;
            assert!(gpu_nodes >= 1, "{sql} ({ranges}): no join ran on the GPU");
            gathered_on_device += gpu_join_metric(&plan, "rows_gathered_on_device");
            let (g, c) = (rows_in_order(&gpu_batches), rows_in_order(&cpu_batches));
            assert_eq!(g.len(), c.len(), "{sql} ({ranges}): row counts differ");
            if let Some(first) = g.iter().zip(&c).position(|(a, b)| a != b) {
                panic!(
                    "{sql} ({ranges}): row {first} differs: GPU {} CPU {}\n{}",
                    g[first],
                    c[first],
                    datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
                );
            }
        }
        if ranges == "one range a chunk" {
            assert!(
                gathered_on_device > 0,
                "no inner join gathered its output on the device"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inner_joins_gather_their_output_on_the_device() {
    let Some(_) = require_gpu("inner_joins_gather_their_output_on_the_device") else {
        return;
    };
    // 4-, 8- and 16-byte columns without NULLs are gathered on the device;
    // the others (NULL-bearing columns, strings, booleans) on the host from
    // the same pairs, in one batch. Every variant must give DataFusion's rows
    // and must have gathered on the device, in both partition modes, with
    // and without the order kept, with small chunks too.
    let queries = [
        "SELECT r.id, s.id, r.v, s.v FROM r JOIN s ON r.k64 = s.k64",
        "SELECT s.v, r.k64, r.k32, s.ks, r.kd, r.kf FROM r JOIN s ON r.k32 = s.k32",
        "SELECT r.kts, s.kdate, s.id FROM r JOIN s ON r.k64 = s.k64 AND r.kdate = s.kdate",
        "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k64 = s.k64",
        // t, the smaller side, builds: 4-, 8- and 16-byte columns without
        // NULLs from both sides (Int32, Date32, Float64, Decimal128).
        "SELECT t.k32, s.kd, t.kd, s.kdate, t.kf, s.k32, t.id FROM t JOIN s ON t.k64 = s.k64",
        // A few percent of the probe rows match: the build side's columns
        // are gathered on the device, the probe's taken on the host.
        "SELECT t.kd, s.kd, t.k32, s.v FROM (SELECT * FROM t WHERE id % 50 = 0) t \
         JOIN s ON t.k64 = s.k64",
    ];
    for extra in [
        &[][..],
        &["SET gpu.preserve_order = false"][..],
        &["SET gpu.tuning.probe_chunk_rows = 700"][..],
        &["SET datafusion.execution.batch_size = 100"][..],
    ] {
        for mode in JoinMode::ALL {
            let gpu = gpu_context(mode, 4, extra).await;
            let cpu = cpu_context(mode, 4, extra).await;
            register(
                [&gpu, &cpu],
                shape(3_000, 1_000, 17, 3),
                shape(5_000, 1_200, 0, 0),
            );
            for ctx in [&gpu, &cpu] {
                ctx.register_table("t", typed_table(shape(2_000, 1_500, 0, 2), 3))
                    .unwrap();
            }
            for sql in queries {
                let mut seen = BTreeSet::new();
                check(&gpu, &cpu, sql, &mut seen).await;
                let (_, _, plan) = run(&gpu, sql).await;
                // The aggregation without GROUP BY is computed in the join
                // (`gpu.tuning.aggregate_in_join`): its pairs are reduced where
                // they are gathered, and no row is made, where its columns
                // are on the device.
                // Where r.v has NULLs in the build side's batches, the
                // pairs are made into rows (s.v gathered on the device) and
                // aggregated on the host.
                let on_device = gpu_join_metric(&plan, "rows_gathered_on_device")
                    + gpu_join_metric(&plan, "rows_aggregated_on_device");
                assert!(
                    on_device > 0,
                    "{sql} {extra:?} {mode:?}: nothing gathered on the device"
                );
            }
            // Each batch holds its own rows' memory, not a slice of a
            // column gathered for a whole range.
            let (batches, _, _) = run(&gpu, queries[0]).await;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
            assert!(
                bytes <= 2 * 4 * 8 * rows + 4096 * batches.len(),
                "{extra:?} {mode:?}: {bytes} bytes held for {rows} rows of four Int64 columns"
            );
            // Switched off, the host gathers everything.
            let off = gpu_context(mode, 4, &["SET gpu.tuning.device_gather = false"]).await;
            off.register_table("r", typed_table(shape(3_000, 1_000, 17, 3), 1))
                .unwrap();
            off.register_table("s", typed_table(shape(5_000, 1_200, 0, 0), 2))
                .unwrap();
            let mut seen = BTreeSet::new();
            check(&off, &cpu, queries[0], &mut seen).await;
            let (_, _, plan) = run(&off, queries[0]).await;
            assert_eq!(gpu_join_metric(&plan, "rows_gathered_on_device"), 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_aimed_at_the_unseeded_hash_join_and_group_as_on_the_cpu() {
    let Some(_) = require_gpu("keys_aimed_at_the_unseeded_hash_join_and_group_as_on_the_cpu")
    else {
        return;
    };
    // 2^20 distinct keys whose unseeded hashes share their low 20 bits:
    // one partition and one probe chain each, but for the seed. A self-join
    // and a group-by over them answer as DataFusion does (in well under
    // the hang guard: quadratic work would take many seconds).
    let keys: Vec<Option<i64>> = (0..1u64 << 20)
        .map(|i| Some(datafusion_gpu::ops::murmur3_finalizer_inverse(i << 20) as i64))
        .collect();
    let queries = [
        (
            "SELECT count(*), sum(a.v), sum(b.v) FROM t a JOIN t b ON a.k = b.k",
            "HashJoinExec",
        ),
        (
            "SELECT k, count(*), sum(v) FROM t GROUP BY k",
            "AggregateExec",
        ),
    ];
    for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
        let gpu = gpu_context(mode, 4, &[]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        for ctx in [&gpu, &cpu] {
            ctx.register_table("t", key_value_table(&keys, 5, 4, 8192))
                .unwrap();
        }
        for (sql, operator) in queries {
            let guard = std::time::Duration::from_secs(60);
            let (gpu_batches, gpu_nodes, _) =
                tokio::time::timeout(guard, run_counting(&gpu, sql, operator))
                    .await
                    .unwrap_or_else(|_| panic!("{sql}: not done in {guard:?}"));
            let (cpu_batches, _, _) = run_counting(&cpu, sql, operator).await;
            assert!(gpu_nodes >= 1, "{sql}: no {operator} on the GPU");
            assert_eq!(
                string_rows(&gpu_batches),
                string_rows(&cpu_batches),
                "{sql}"
            );
        }
    }
}
