//! GPU aggregation against DataFusion's `AggregateExec` on generated data:
//! every supported aggregate and key type, NULLs, FILTER, empty input,
//! group counts on both sides of the shared-memory threshold, skew, every
//! aggregation mode (Single with one partition or in place of DataFusion's
//! two phases; Partial, Final and FinalPartitioned with four partitions),
//! groups sorted on the device in place of a sort on their keys (compared
//! row by row, in order), and the run-time CPU fallbacks.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_gpu::gpu::{launch, GpuError, PhaseTimer};
use datafusion_gpu::ops::group_by::{
    self, GroupIds, GroupsBack, InputChunks, ReduceInput, Reduction, ResultParts, Words,
};
use datafusion_gpu::GpuAggregateExec;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::{
    cpu_context, gen_keys, gpu_context, node_metric, pinned_table, require_gpu, rows_in_order,
    run_counting, sanitized_rows, sanitizing, string_rows, table_from_columns, JoinMode, Keys,
};

/// Rows of the test table `t`: keys drawn from `keys`, every value column
/// with some NULLs, floats that are multiples of 1/4 (so their sums are
/// exact in any order and compare exactly).
fn table(rows: usize, keys: Keys, partitions: usize, seed: u64) -> Arc<MemTable> {
    let k = gen_keys(rows, keys, 0.05, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let v: Vec<Option<i64>> = (0..rows)
        .map(|_| {
            rng.random_bool(0.9)
                .then(|| rng.random_range(-1_000_000_000i64..1_000_000_000))
        })
        .collect();
    let d: Vec<Option<i128>> = (0..rows)
        .map(|_| {
            rng.random_bool(0.9).then(|| {
                rng.random_range(-10_000_000_000_000i64..10_000_000_000_000)
                    .into()
            })
        })
        .collect();
    let big: Vec<i128> = (0..rows)
        .map(|_| {
            let magnitude = rng.random_range(0..1_000_000_000_000_000i64) as i128;
            let scale = 100_000_000_000_000i128; // up to 1e32 in all
            let value = magnitude * scale + rng.random_range(0..scale as i64) as i128;
            if rng.random_bool(0.5) {
                -value
            } else {
                value
            }
        })
        .collect();
    let f: Vec<Option<f64>> = (0..rows)
        .map(|_| {
            rng.random_bool(0.95)
                .then(|| rng.random_range(-4_000_000i64..4_000_000) as f64 / 4.0)
        })
        .collect();
    let u: Vec<u32> = (0..rows).map(|_| rng.random_range(0..u32::MAX)).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("k2", DataType::Int32, true),
        Field::new("dt", DataType::Date32, true),
        Field::new("b", DataType::Boolean, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new("u", DataType::UInt32, false),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("big", DataType::Decimal128(38, 0), false),
        Field::new("f", DataType::Float64, true),
        Field::new("fk", DataType::Float64, true),
    ]));
    let columns = move |range: std::ops::Range<usize>| -> Vec<ArrayRef> {
        let keys = &k[range.clone()];
        vec![
            Arc::new(Int64Array::from(keys.to_vec())),
            Arc::new(Int32Array::from(
                keys.iter()
                    .map(|k| k.map(|k| (k % 7) as i32))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Date32Array::from(
                keys.iter()
                    .map(|k| k.map(|k| (k % 5000) as i32))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(BooleanArray::from(
                keys.iter()
                    .map(|k| k.map(|k| k % 3 == 0))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                keys.iter()
                    .map(|k| k.map(|k| format!("s{}", k % 11)))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(v[range.clone()].to_vec())),
            Arc::new(UInt32Array::from(u[range.clone()].to_vec())),
            Arc::new(
                Decimal128Array::from(d[range.clone()].to_vec())
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            Arc::new(
                Decimal128Array::from(big[range.clone()].to_vec())
                    .with_precision_and_scale(38, 0)
                    .unwrap(),
            ),
            Arc::new(Float64Array::from(f[range].to_vec())),
            // A float key: both zeros, two NaN payloads, both infinities.
            Arc::new(Float64Array::from(
                keys.iter()
                    .map(|k| {
                        k.map(|k| match k.rem_euclid(13) {
                            0 => -0.0,
                            1 => 0.0,
                            2 => f64::NAN,
                            3 => f64::from_bits(0x7ff8_0000_0000_0001),
                            4 => f64::INFINITY,
                            5 => f64::NEG_INFINITY,
                            r => r as f64 * 0.5 + (k % 1000) as f64,
                        })
                    })
                    .collect::<Vec<_>>(),
            )),
        ]
    };
    table_from_columns(schema, rows, partitions, 4096, columns)
}

const AGGREGATES: &str = "count(*), count(v), sum(v), min(v), max(v), avg(v), \
     sum(d), min(d), max(d), avg(d), sum(big), min(big), max(big), \
     sum(f), avg(f), min(u), max(u), sum(u), min(dt), max(k2), count(s)";

/// Input partitions and how the rule places the aggregation phases: one
/// partition (DataFusion plans `Single`); four, DataFusion's `Partial`,
/// repartition and `FinalPartitioned` (or `Final`) replaced by one GPU
/// aggregation; four, both phases on the GPU.
const PLANS: [(usize, &str); 3] = [
    (1, "SET gpu.tuning.aggregate_single_phase = true"),
    (4, "SET gpu.tuning.aggregate_single_phase = true"),
    (4, "SET gpu.tuning.aggregate_single_phase = false"),
];

/// Rows and keys of the grouped tests: few groups with many duplicates;
/// groups across the shared-memory threshold (4096); nearly every row its
/// own group; Zipf skew.
const GROUPED_INPUTS: [(usize, Keys); 4] = [
    (20_000, Keys::Uniform { domain: 50 }),
    (30_000, Keys::Uniform { domain: 9_000 }),
    (10_000, Keys::Uniform { domain: 1 << 40 }),
    (
        30_000,
        Keys::Zipf {
            domain: 5_000,
            s: 1.5,
        },
    ),
];

/// Settings that bring an aggregation's results back in windows of one
/// batch of 512 groups each: every grouped input makes several.
const SMALL_RESULT_WINDOWS: [&str; 2] = [
    "SET gpu.tuning.result_window_words = 1",
    "SET datafusion.execution.batch_size = 512",
];

async fn contexts(partitions: usize, extra: &[&str]) -> (SessionContext, SessionContext) {
    // These tests are GpuAggregateExec's: aggregations over a table scan
    // that a GpuScanAggregateExec would take stay with it (that node's own
    // tests are in `scan_aggregate`).
    let mut extra = extra.to_vec();
    extra.insert(0, "SET gpu.tuning.scan_aggregate = false");
    let extra = extra.as_slice();
    (
        gpu_context(JoinMode::CollectLeft, partitions, extra).await,
        cpu_context(JoinMode::CollectLeft, partitions, &[]).await,
    )
}

/// Runs `sql` on both contexts: the same rows (exactly, as text), and at
/// least one aggregation on the GPU. Returns the GPU plan.
async fn check(gpu: &SessionContext, cpu: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    compare(gpu, cpu, sql, false).await
}

/// [`check`], with the rows compared in the order they came when `in_order`
/// (as a sorted multiset otherwise).
async fn compare(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
    in_order: bool,
) -> Arc<dyn ExecutionPlan> {
    let (gpu_batches, gpu_nodes, plan) = run_counting(gpu, sql, "AggregateExec").await;
    let (cpu_batches, cpu_nodes, _) = run_counting(cpu, sql, "AggregateExec").await;
    assert_eq!(cpu_nodes, 0);
    assert!(
        gpu_nodes >= 1,
        "{sql}: no aggregation ran on the GPU\n{}",
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
    );
    let rows = if in_order { rows_in_order } else { string_rows };
    let (gpu_rows, cpu_rows) = (rows(&gpu_batches), rows(&cpu_batches));
    assert_eq!(gpu_rows.len(), cpu_rows.len(), "{sql}: row counts differ");
    if let Some(i) = (0..gpu_rows.len()).find(|&i| gpu_rows[i] != cpu_rows[i]) {
        let which = if in_order {
            "in output order"
        } else {
            "sorted"
        };
        panic!(
            "{sql}: results differ at row {i} ({which})\n gpu {}\n cpu {}",
            gpu_rows[i], cpu_rows[i]
        );
    }
    plan
}

fn register(ctxs: [&SessionContext; 2], table: Arc<MemTable>) {
    for ctx in ctxs {
        ctx.deregister_table("t").unwrap();
        ctx.register_table("t", Arc::clone(&table) as _).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grouped_aggregates_match_the_cpu_for_every_key_type_and_mode() {
    let Some(_) = require_gpu("grouped_aggregates_match_the_cpu_for_every_key_type_and_mode")
    else {
        return;
    };
    // Keys with NULLs are packed; a single integer or float key without
    // NULLs is its own word ("coalesce(k, -1)", "u % 1000", "coalesce(fk, 1.5)");
    // strings, floats with NULLs or beside other columns, and keys too wide
    // to pack are hashed and checked on the host (the rest).
    let keys = [
        "k",
        "k2",
        "dt",
        "b",
        "d",
        "k, k2",
        "k2, b, dt",
        "k % 100",
        "coalesce(k, -1)",
        "u % 1000",
        "coalesce(fk, 1.5)",
        "s",
        "fk",
        "CAST(fk AS REAL)",
        "s, k2",
        "fk, b",
        "CAST(k AS VARCHAR)",
        "CAST(k AS VARCHAR), s, dt",
        "k, big",
    ];
    // Every plan with the groups numbered in one hash table (the default
    // below 2^25 groups), and two with them numbered in hash partitions.
    let runs = PLANS
        .iter()
        .map(|&(partitions, phases)| (partitions, phases, false))
        .chain([PLANS[0], PLANS[1]].map(|(partitions, phases)| (partitions, phases, true)));
    for (partitions, phases, in_partitions) in runs {
        let mut settings = vec![phases];
        if in_partitions {
            settings.push("SET gpu.tuning.min_groups_to_partition = 0");
            // And the results brought back in many windows of one small
            // batch each.
            settings.extend(SMALL_RESULT_WINDOWS);
        }
        let (gpu, cpu) = contexts(partitions, &settings).await;
        for (rows, dist) in GROUPED_INPUTS {
            register([&gpu, &cpu], table(rows, dist, partitions, rows as u64));
            for key in keys {
                let sql = format!("SELECT {key}, {AGGREGATES} FROM t GROUP BY {key}");
                let plan = check(&gpu, &cpu, &sql).await;
                let partitioned = gpu_aggregate_metric(&plan, "partitioned_groups_partitions");
                if in_partitions {
                    // The partitions of a few hundred groups each hold them
                    // all (none overflowed into the one table).
                    assert!(partitioned > 0, "{sql}: in partitions");
                    assert_eq!(
                        gpu_aggregate_metric(&plan, "partition_overflow_partitions"),
                        0,
                        "{sql}"
                    );
                } else {
                    assert_eq!(partitioned, 0, "{sql}: in one table");
                }
            }
        }
    }
}

/// Groups leave in the order their first rows come, as DataFusion's hash
/// aggregation emits them (a sort above with ties, or a plan reading the
/// groups as they come, sees that order), whichever way the device numbers
/// them: in one hash table (rows numbered, or every input folded into the
/// table), or in hash partitions; keys packed, their own word, or hashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_leave_in_the_order_of_their_first_rows_as_on_the_cpu() {
    let Some(_) = require_gpu("groups_leave_in_the_order_of_their_first_rows_as_on_the_cpu") else {
        return;
    };
    let keys = [
        "k",
        "k, k2",
        "coalesce(k, -1)",
        "s",
        "fk",
        "CAST(k AS VARCHAR)",
        "s, k2",
    ];
    // Foldable into the table (a count and, over a column without NULLs
    // that shares it, a minimum, a maximum and a sum: four folds), and not
    // (every aggregate).
    let foldable = "count(*), min(u), max(u), sum(u)";
    let mut folded = 0;
    for in_partitions in [false, true] {
        let mut settings = vec![PLANS[0].1];
        if in_partitions {
            settings.push("SET gpu.tuning.min_groups_to_partition = 0");
        }
        let (gpu, cpu) = contexts(1, &settings).await;
        for (rows, dist) in GROUPED_INPUTS {
            register([&gpu, &cpu], table(rows, dist, 1, rows as u64 ^ 0xf1));
            for key in keys {
                for aggregates in [foldable, AGGREGATES] {
                    let sql = format!("SELECT {key}, {aggregates} FROM t GROUP BY {key}");
                    let plan = compare(&gpu, &cpu, &sql, true).await;
                    folded += gpu_aggregate_metric(&plan, "table_fold_partitions");
                    let partitioned = gpu_aggregate_metric(&plan, "partitioned_groups_partitions");
                    assert_eq!(partitioned > 0, in_partitions, "{sql}");
                }
            }
        }
    }
    assert!(
        folded > 0,
        "no aggregation folded its inputs into the table"
    );
}

/// Under a session memory limit far below the input: a `MemTable`'s
/// batches, which the table holds already, are not reserved again, and the
/// aggregation runs on the GPU; an input streamed through a projection,
/// which the pool cannot hold whole, goes with the batches read to
/// DataFusion's operator, which spills; hashed keys whose rows' groups the
/// pool cannot hold go there too. The same rows as DataFusion's under the
/// same limit, never the pool's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_larger_than_the_memory_pool_still_aggregate() {
    let Some(_) = require_gpu("inputs_larger_than_the_memory_pool_still_aggregate") else {
        return;
    };
    // About 40 MB of table against a pool of 2 MiB.
    let limit = 2 << 20;
    for (partitions, phases) in [PLANS[0], PLANS[2]] {
        let (gpu, cpu) = crate::support::memory_limited_contexts(
            limit,
            JoinMode::CollectLeft,
            partitions,
            &[phases, "SET gpu.tuning.scan_aggregate = false"],
        )
        .await;
        let t = table(400_000, Keys::Uniform { domain: 300 }, partitions, 17);
        register([&gpu, &cpu], t);
        let fallbacks = |plan: &Arc<dyn ExecutionPlan>| {
            (
                gpu_aggregate_metric(plan, "memory_pool_fallback_partitions"),
                gpu_aggregate_metric(plan, "cpu_fallback_partitions"),
            )
        };
        // Straight from the table: on the GPU.
        let sql = "SELECT k, count(*), sum(v), min(v), max(u) FROM t GROUP BY k";
        let plan = check(&gpu, &cpu, sql).await;
        assert_eq!(fallbacks(&plan), (0, 0), "{sql} ({phases})");
        // Streamed: the pool refuses the input, DataFusion's operator
        // takes it.
        let sql = "SELECT g, count(*), sum(w) FROM \
                   (SELECT k % 97 AS g, v + 1 AS w FROM t) GROUP BY g";
        let plan = check(&gpu, &cpu, sql).await;
        let (pool, all) = fallbacks(&plan);
        assert!(pool > 0 && pool <= all, "{sql} ({phases}): {pool} of {all}");
        // Hashed string keys from the table: in one partition, each row's
        // group (3.2 MB) cannot be held for the check.
        let sql = "SELECT s, k2, count(*), max(v) FROM t GROUP BY s, k2";
        let plan = check(&gpu, &cpu, sql).await;
        let (pool, _) = fallbacks(&plan);
        if partitions == 1 {
            assert!(pool > 0, "{sql} ({phases})");
        }
    }
}

/// A device error before any output (injected where the device part ends)
/// sends the partition to DataFusion's operator: the same rows, counted in
/// `device_error_fallback_partitions`. Where the session asks device
/// errors to fail (as every other test does), the query fails with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_error_before_output_hands_the_partition_to_the_cpu() {
    let Some(_) = require_gpu("a_device_error_before_output_hands_the_partition_to_the_cpu") else {
        return;
    };
    for (partitions, phases) in PLANS {
        let settings = [
            phases,
            "SET gpu_test.device_errors_fail = false",
            "SET gpu_test.inject_device_error = true",
        ];
        let (gpu, cpu) = contexts(partitions, &settings).await;
        register(
            [&gpu, &cpu],
            table(30_000, Keys::Uniform { domain: 500 }, partitions, 3),
        );
        let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
        let plan = check(&gpu, &cpu, &sql).await;
        let failed = gpu_aggregate_metric(&plan, "device_error_fallback_partitions");
        assert!(failed > 0, "{phases}: no device error counted");
        assert_eq!(
            failed,
            gpu_aggregate_metric(&plan, "cpu_fallback_partitions"),
            "{phases}"
        );
        gpu.sql("SET gpu_test.device_errors_fail = true")
            .await
            .unwrap();
        let failing = gpu.sql(&sql).await.unwrap().collect().await;
        let error = failing.expect_err("an injected device error with errors failing");
        assert!(error.to_string().contains("injected"), "{phases}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_without_group_by_and_over_empty_input_match_the_cpu() {
    let Some(_) = require_gpu("aggregates_without_group_by_and_over_empty_input_match_the_cpu")
    else {
        return;
    };
    for (partitions, phases) in PLANS {
        let (gpu, cpu) = contexts(partitions, &[phases]).await;
        for rows in [0usize, 1, 3, 50_000] {
            register(
                [&gpu, &cpu],
                table(rows, Keys::Uniform { domain: 100 }, partitions, 7),
            );
            check(&gpu, &cpu, &format!("SELECT {AGGREGATES} FROM t")).await;
            // Every value filtered out: counts 0, the rest NULL.
            check(
                &gpu,
                &cpu,
                &format!("SELECT {AGGREGATES} FROM t WHERE v > 2000000000"),
            )
            .await;
            if rows > 0 {
                check(
                    &gpu,
                    &cpu,
                    &format!("SELECT k, {AGGREGATES} FROM t WHERE v IS NULL GROUP BY k"),
                )
                .await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn filtered_aggregates_match_the_cpu() {
    let Some(_) = require_gpu("filtered_aggregates_match_the_cpu") else {
        return;
    };
    for (partitions, phases) in PLANS {
        let (gpu, cpu) = contexts(partitions, &[phases]).await;
        register(
            [&gpu, &cpu],
            table(40_000, Keys::Uniform { domain: 300 }, partitions, 11),
        );
        for sql in [
            "SELECT k2, count(*) FILTER (WHERE v > 0), sum(v) FILTER (WHERE v % 3 = 0), \
             max(d) FILTER (WHERE b), avg(f) FILTER (WHERE f < 0) FROM t GROUP BY k2",
            "SELECT count(v) FILTER (WHERE k IS NULL), min(big) FILTER (WHERE u > 100) FROM t",
        ] {
            check(&gpu, &cpu, sql).await;
        }
    }
}

/// A `HAVING` runs inside the GPU aggregation (`filter=[...]` in its
/// plan, no `FilterExec` left): groups whose predicate is NULL, keeping
/// none, every one, or few, with its projection above, output in windows
/// of one batch each, in every placement of the phases; and, where a
/// device error hands the partition to DataFusion's aggregation, that
/// filters its groups too. The same rows as DataFusion's. Where a term of
/// the filter compares an integer or decimal aggregate with a constant
/// (SUM and COUNT, MIN and MAX of signed integers and dates; `<`, `<=`,
/// `>`, `>=`, `<>`, the constant on either side, negative, at 128 bits;
/// an `=` makes its column constant, and its filter stays a `FilterExec`),
/// the groups it drops are dropped on the device, before they come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn having_filters_the_groups_inside_the_gpu_aggregation() {
    let Some(_) = require_gpu("having_filters_the_groups_inside_the_gpu_aggregation") else {
        return;
    };
    // Each query, and whether the device drops some of its groups.
    let queries = [
        (
            "SELECT k, count(*), sum(v) FROM t GROUP BY k HAVING sum(v) > 0",
            true,
        ),
        (
            "SELECT k FROM t GROUP BY k HAVING count(*) > 4 AND max(d) IS NOT NULL",
            true,
        ),
        (
            "SELECT k2, avg(f) FROM t GROUP BY k2 HAVING count(*) < 0",
            true,
        ),
        (
            "SELECT k, min(dt) FROM t GROUP BY k HAVING count(*) > 0",
            false,
        ),
        ("SELECT sum(v), count(*) FROM t HAVING sum(v) > 0", false),
        (
            "SELECT k, sum(d) FROM t GROUP BY k HAVING sum(d) <= -1000.00",
            true,
        ),
        (
            "SELECT k, sum(big) FROM t GROUP BY k HAVING 0 < sum(big) AND count(*) <> 3",
            true,
        ),
        (
            "SELECT k, min(v), max(v) FROM t GROUP BY k \
             HAVING min(v) >= -500000000 AND -5 <> max(v)",
            true,
        ),
        (
            "SELECT k, max(dt) FROM t GROUP BY k HAVING max(dt) <= DATE '1970-01-10'",
            true,
        ),
        (
            "SELECT k, sum(v) FROM t GROUP BY k HAVING sum(v) > 0 OR count(*) = 1",
            false,
        ),
    ];
    for (partitions, phases) in PLANS {
        let mut settings = SMALL_RESULT_WINDOWS.to_vec();
        settings.push(phases);
        let (gpu, cpu) = contexts(partitions, &settings).await;
        register(
            [&gpu, &cpu],
            table(30_000, Keys::Uniform { domain: 9_000 }, partitions, 5),
        );
        for (sql, drops_on_device) in queries {
            let plan = check(&gpu, &cpu, sql).await;
            let text = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            assert!(text.contains(", filter=["), "{phases}: {sql}\n{text}");
            assert!(!text.contains("FilterExec"), "{phases}: {sql}\n{text}");
            let dropped = gpu_aggregate_metric(&plan, "groups_dropped_on_device");
            assert_eq!(
                dropped > 0,
                drops_on_device,
                "{phases}: {sql}: {dropped} dropped"
            );
        }
        let (gpu, cpu) = contexts(
            partitions,
            &[
                phases,
                "SET gpu_test.device_errors_fail = false",
                "SET gpu_test.inject_device_error = true",
            ],
        )
        .await;
        register(
            [&gpu, &cpu],
            table(30_000, Keys::Uniform { domain: 9_000 }, partitions, 6),
        );
        let plan = check(&gpu, &cpu, queries[1].0).await;
        assert!(gpu_aggregate_metric(&plan, "device_error_fallback_partitions") > 0);
    }
}

/// `rows` rows whose key `k` (Int64) and values `u` (UInt32), `x` (Int64)
/// and `big` (Decimal128) cannot be NULL, and `v` (Int64) can, in
/// `partitions` partitions of batches of at most 4,096 rows.
fn not_null_table(rows: usize, keys: Keys, partitions: usize, seed: u64) -> Arc<MemTable> {
    let k: Vec<i64> = gen_keys(rows, keys, 0.0, seed)
        .into_iter()
        .map(|k| k.expect("no NULL keys"))
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0dd);
    let u: Vec<u32> = (0..rows).map(|_| rng.random_range(0..u32::MAX)).collect();
    let x: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(i64::MIN..i64::MAX))
        .collect();
    let big: Vec<i128> = (0..rows)
        .map(|_| i128::from(rng.random_range(i64::MIN..i64::MAX)) << 20)
        .collect();
    let v: Vec<Option<i64>> = (0..rows)
        .map(|_| rng.random_bool(0.8).then(|| rng.random_range(-1000..1000)))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("u", DataType::UInt32, false),
        Field::new("x", DataType::Int64, false),
        Field::new("big", DataType::Decimal128(38, 0), false),
        Field::new("v", DataType::Int64, true),
    ]));
    let per_partition = rows.div_ceil(partitions.max(1)).max(1);
    let mut parts = vec![Vec::new(); partitions.max(1)];
    for (i, start) in (0..rows).step_by(4096).enumerate() {
        let range = start..(start + 4096).min(rows);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(k[range.clone()].to_vec())),
            Arc::new(UInt32Array::from(u[range.clone()].to_vec())),
            Arc::new(Int64Array::from(x[range.clone()].to_vec())),
            Arc::new(
                Decimal128Array::from(big[range.clone()].to_vec())
                    .with_precision_and_scale(38, 0)
                    .unwrap(),
            ),
            Arc::new(Int64Array::from(v[range].to_vec())),
        ];
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
        parts[(i * 4096 / per_partition).min(partitions.max(1) - 1)].push(batch);
    }
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

/// Aggregates without FILTER whose arguments cannot be NULL, over keys in
/// pinned memory (their own words), have their inputs prepared while the
/// keys cross the bus. Such arguments are columns that cannot be NULL, the
/// casts `sum(u)` and `avg(u)` of a UInt32 are planned with, and the literal
/// of `count(*)`. Over a nullable column, a computed argument, under a
/// FILTER, or over keys staged on the host, the inputs are prepared before
/// the device starts. Every way agrees with the CPU: in one hash table (the
/// aggregates folded into it or not), in hash partitions, and without keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_prepared_while_the_keys_cross_match_the_cpu() {
    let Some(_) = require_gpu("inputs_prepared_while_the_keys_cross_match_the_cpu") else {
        return;
    };
    const NOT_NULL: &str = "count(*), count(u), sum(u), min(u), max(u), avg(u), min(x), max(x), \
         sum(big), min(big), max(big)";
    for (plan, in_partitions) in [(PLANS[0], false), (PLANS[1], false), (PLANS[0], true)] {
        let (partitions, phases) = plan;
        // The inputs as this test prepares them cross the bus: a table
        // scan's columns read from the column cache on the device do not
        // (`cached_input`'s tests).
        let mut settings = vec![phases, "SET gpu.tuning.cached_gpu_inputs = false"];
        if in_partitions {
            settings.push("SET gpu.tuning.min_groups_to_partition = 0");
        }
        let (gpu, cpu) = contexts(partitions, &settings).await;
        for (rows, dist) in GROUPED_INPUTS {
            let table = not_null_table(rows, dist, partitions, rows as u64 + 5);
            for pinned in [true, false] {
                let table = match pinned {
                    true => pinned_table(&table).await,
                    false => Arc::clone(&table),
                };
                register([&gpu, &cpu], table);
                for (sql, grouped, never_null_args) in [
                    (
                        format!("SELECT k, {NOT_NULL} FROM t GROUP BY k"),
                        true,
                        true,
                    ),
                    // Two folds of one word each: folded into a sized table.
                    (
                        "SELECT k, min(x), max(x) FROM t GROUP BY k".into(),
                        true,
                        true,
                    ),
                    // Computed arguments: the schema's word on them is not
                    // trusted to size the device memory.
                    (
                        "SELECT k, max(u % 7), sum(x % 1000) FROM t GROUP BY k".into(),
                        true,
                        false,
                    ),
                    (format!("SELECT {NOT_NULL} FROM t"), false, true),
                    // v may be NULL; a FILTER decides which rows count.
                    (
                        "SELECT k, max(u), sum(v) FROM t GROUP BY k".into(),
                        true,
                        false,
                    ),
                    (
                        "SELECT k, max(u) FILTER (WHERE u > 100) FROM t GROUP BY k".into(),
                        true,
                        false,
                    ),
                ] {
                    let plan = check(&gpu, &cpu, &sql).await;
                    let prepared_during_copy =
                        gpu_aggregate_metric(&plan, "inputs_prepared_during_key_copy_partitions");
                    // Without keys nothing crosses before the inputs.
                    let expected = pinned && grouped && never_null_args;
                    assert_eq!(
                        prepared_during_copy > 0,
                        expected,
                        "{sql} (pinned {pinned})"
                    );
                    if in_partitions && grouped {
                        assert!(
                            gpu_aggregate_metric(&plan, "partitioned_groups_partitions") > 0,
                            "{sql}: in partitions"
                        );
                    }
                }
            }
        }
    }
}

/// Output buffers mapped while the device works (`gpu.tuning.map_output_ahead`),
/// by the host's idle cores once the inputs are prepared, where the device
/// reads the keys from pinned memory: with batches of 512 groups and no
/// size threshold (`gpu.tuning.min_output_bytes_mapped_ahead = 0`), the sample of
/// 9,000 keys foresees enough output to map its 8-byte columns ahead. The
/// columns filled into them (keys from their own words; counts, sums,
/// minima and maxima, NULL where a group saw no value; the partial states
/// of two phases) agree with the CPU, as do the same aggregations with
/// nothing mapped: switched off, below the default threshold, or over a
/// table the host stages, whose cores are then busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_mapped_ahead_matches_the_cpu() {
    let Some(_) = require_gpu("output_mapped_ahead_matches_the_cpu") else {
        return;
    };
    let queries = [
        "SELECT k, count(*), count(v), sum(x), min(x), max(x), sum(v), min(v), max(v), \
         avg(v), sum(u), max(u), min(big), max(big) FROM t GROUP BY k",
        // Folded into the hash table as the rows find their groups.
        "SELECT k, min(x), max(x) FROM t GROUP BY k",
        // Computed arguments: the inputs are prepared before the device starts.
        "SELECT k, max(u % 7), sum(x % 1000) FROM t GROUP BY k",
    ];
    // (gpu.tuning.map_output_ahead, no size threshold): only both map.
    let switches = [(true, true), (false, true), (true, false)];
    for (plan, (partitions, phases)) in PLANS.into_iter().enumerate() {
        for (map_ahead, no_threshold) in switches {
            let map_setting = format!("SET gpu.tuning.map_output_ahead = {map_ahead}");
            let mut settings = vec![
                phases,
                "SET datafusion.execution.batch_size = 512",
                map_setting.as_str(),
            ];
            if no_threshold {
                settings.push("SET gpu.tuning.min_output_bytes_mapped_ahead = 0");
            }
            if plan == 0 {
                settings.push("SET gpu.tuning.min_groups_to_partition = 0");
            }
            let (gpu, cpu) = contexts(partitions, &settings).await;
            let table = not_null_table(40_000, Keys::Uniform { domain: 9_000 }, partitions, 77);
            for pinned in [true, false] {
                let table = match pinned {
                    true => pinned_table(&table).await,
                    false => Arc::clone(&table),
                };
                register([&gpu, &cpu], table);
                for (i, sql) in queries.into_iter().enumerate() {
                    let plan = check(&gpu, &cpu, sql).await;
                    let mapped = gpu_aggregate_metric(&plan, "output_buffers_mapped_ahead");
                    let context = format!(
                        "{sql} ({phases}, pinned {pinned}, map {map_ahead}, \
                         no threshold {no_threshold})"
                    );
                    if !(map_ahead && no_threshold && pinned) {
                        assert_eq!(mapped, 0, "{context}: output mapped ahead");
                    } else if i == 0 {
                        // Eleven 8-byte output columns, the key's
                        // included (more as partial states): enough
                        // buffers whatever the partition's share of the
                        // groups. How many are taken depends on how far
                        // the threads got.
                        assert!(mapped > 0, "{context}: no output mapped ahead");
                    }
                }
            }
        }
    }
}

/// Where the device makes the reductions one after the other (in
/// partitions, or numbered without folding), the aggregates whose
/// reductions are made first come back, and their columns are built,
/// while the device still makes the others: the same results, over many
/// output batches, with every aggregate type, NULLs and shared counts
/// (AVG's); the metric counts them, and none come back early where a
/// table folded every reduction at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_brought_back_early_match_the_cpu() {
    let Some(_) = require_gpu("aggregates_brought_back_early_match_the_cpu") else {
        return;
    };
    let queries = [
        format!("SELECT k, {AGGREGATES} FROM t GROUP BY k"),
        // A MAX first, then aggregates of one nullable column, which share
        // its count (AVG's read by COUNT and SUM too): two passes.
        "SELECT k, max(u), avg(v), count(v), sum(v) FROM t GROUP BY k".to_string(),
        // Where the table folds (by default), one pass; apart, two.
        "SELECT k, min(u), max(u) FROM t GROUP BY k".to_string(),
        // Every aggregate of one nullable column shares its count: one
        // pass, which brings each reduction back once. (AVG is not among
        // them: it reads a cast of the column, whose count is its own.)
        "SELECT k, sum(v), min(v), max(v), count(v) FROM t GROUP BY k".to_string(),
    ];
    let unfolded = "SET gpu.tuning.fold_into_table = false";
    // Batches of 64 groups in windows of 2,048 words: several windows a
    // pass, each cut into tasks of one or more batches.
    let small = [
        "SET datafusion.execution.batch_size = 64",
        "SET gpu.tuning.result_window_words = 2048",
    ];
    let in_partitions = "SET gpu.tuning.min_groups_to_partition = 0";
    let numberings: [(&str, &[&str]); 5] = [
        ("in partitions", &[in_partitions]),
        (
            "in partitions, whole columns",
            &[in_partitions, "SET gpu.tuning.reduce_as_they_land = false"],
        ),
        ("unfolded", &[unfolded]),
        (
            "unfolded, all at the end",
            &[unfolded, "SET gpu.tuning.results_back_early = false"],
        ),
        ("default", &[]),
    ];
    for (partitions, phases) in PLANS {
        for (numbering, setting) in numberings {
            let mut settings = vec![phases];
            settings.extend(small);
            settings.extend(setting);
            let (gpu, cpu) = contexts(partitions, &settings).await;
            let table = table(30_000, Keys::Uniform { domain: 6_000 }, partitions, 91);
            register([&gpu, &cpu], table);
            for (i, sql) in queries.iter().enumerate() {
                let plan = check(&gpu, &cpu, sql).await;
                let early = gpu_aggregate_metric(&plan, "aggregates_brought_back_early");
                let folded = gpu_aggregate_metric(&plan, "table_fold_partitions");
                let landed = gpu_aggregate_metric(&plan, "inputs_reduced_as_they_landed");
                let context = format!("{sql} ({phases}, {numbering})");
                // Numbered first, the inputs are reduced as they land
                // (all but the 128-bit minima and maxima), unless whole
                // columns are asked for.
                match numbering {
                    "in partitions" | "unfolded" => {
                        assert!(landed > 0, "{context}: nothing reduced as it landed")
                    }
                    "in partitions, whole columns" => {
                        assert_eq!(landed, 0, "{context}: reduced as they landed")
                    }
                    _ => {}
                }
                match numbering {
                    "in partitions" | "in partitions, whole columns" | "unfolded" => {
                        assert_eq!(folded, 0, "{context}: folded");
                        if i < 3 {
                            assert!(early > 0, "{context}: nothing came back early");
                        } else if phases.ends_with("true") {
                            // (A final phase's state columns each have
                            // their own count.)
                            assert_eq!(early, 0, "{context}: a shared count came back early");
                        }
                    }
                    "unfolded, all at the end" => {
                        assert_eq!(early, 0, "{context}: some came back early");
                    }
                    _ => {}
                }
                if partitions == 1 && folded > 0 {
                    assert_eq!(early, 0, "{context}: folded, yet some came back early");
                }
            }
        }
    }
}

/// Rows as (text of the exact columns, float columns), sorted by the text.
fn split_float_rows(batches: &[RecordBatch], float_columns: &[usize]) -> Vec<(String, Vec<f64>)> {
    let mut rows = Vec::new();
    for batch in batches {
        for i in 0..batch.num_rows() {
            let mut exact = String::new();
            let mut floats = Vec::new();
            for (c, column) in batch.columns().iter().enumerate() {
                if float_columns.contains(&c) {
                    let f = column
                        .as_any()
                        .downcast_ref::<Float64Array>()
                        .expect("a Float64 column");
                    floats.push(if f.is_null(i) { f64::NAN } else { f.value(i) });
                } else {
                    let value =
                        datafusion::arrow::util::display::array_value_to_string(column, i).unwrap();
                    exact.push_str(&value);
                    exact.push('|');
                }
            }
            rows.push((exact, floats));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn float_sums_agree_within_a_relative_tolerance() {
    let Some(_) = require_gpu("float_sums_agree_within_a_relative_tolerance") else {
        return;
    };
    // Sums of arbitrary doubles depend on the order of additions, which
    // differs between the device's atomics and the CPU's loop: the
    // results must agree to 1e-9 relative to the sum of magnitudes. With
    // `gpu.deterministic_float_sums` the GPU's must also be the same bits
    // in every run.
    const TOLERANCE: f64 = 1e-9;
    let rows = 60_000;
    let mut rng = StdRng::seed_from_u64(3);
    let k: Vec<i64> = (0..rows).map(|_| rng.random_range(0..500)).collect();
    let x: Vec<f64> = (0..rows)
        .map(|_| rng.random_range(-1.0..1.0) * 10f64.powi(rng.random_range(-3..6)))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("x", DataType::Float64, false),
    ]));
    let columns = {
        let (k, x) = (k.clone(), x.clone());
        move |range: std::ops::Range<usize>| {
            vec![
                Arc::new(Int64Array::from(k[range.clone()].to_vec())) as ArrayRef,
                Arc::new(Float64Array::from(x[range].to_vec())),
            ]
        }
    };
    let table = table_from_columns(Arc::clone(&schema), rows, 4, 4096, columns.clone());

    // One partition, one aggregation over all rows: with the option, each
    // sum is exactly the fixed-point sum of its group's values, bit for bit.
    let (gpu, _) = contexts(
        1,
        &[
            "SET gpu.tuning.aggregate_single_phase = true",
            "SET gpu.deterministic_float_sums = true",
        ],
    )
    .await;
    gpu.register_table("t", table_from_columns(schema, rows, 1, 4096, columns))
        .unwrap();
    let (batches, gpu_nodes, _) =
        run_counting(&gpu, "SELECT k, sum(x) FROM t GROUP BY k", "AggregateExec").await;
    assert!(gpu_nodes >= 1);
    let mut groups = std::collections::HashMap::<i64, Vec<f64>>::new();
    for (&key, &value) in k.iter().zip(&x) {
        groups.entry(key).or_default().push(value);
    }
    let mut checked = 0;
    for batch in &batches {
        let keys = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let sums = batch
            .column(1)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        for i in 0..batch.num_rows() {
            let values = &groups[&keys.value(i)];
            let top = values
                .iter()
                .filter_map(|v| group_by::fixed_point_scale(v.to_bits()).ok())
                .max()
                .unwrap_or(0);
            let total: i128 = values
                .iter()
                .map(|v| group_by::fixed_point_term(v.to_bits(), top))
                .sum();
            let want = group_by::fixed_sum_to_f64(total, top, 0);
            assert_eq!(
                sums.value(i).to_bits(),
                want.to_bits(),
                "group {}",
                keys.value(i)
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 500);

    for deterministic in [false, true] {
        let (gpu, cpu) = contexts(
            4,
            &[&format!(
                "SET gpu.deterministic_float_sums = {deterministic}"
            )],
        )
        .await;
        register([&gpu, &cpu], Arc::clone(&table));
        // The exact columns (key and count) are compared as text.
        for sql in [
            "SELECT k, count(*), sum(x), avg(x), sum(abs(x)) FROM t GROUP BY k",
            "SELECT k % 7, count(*), sum(x), avg(x), sum(abs(x)) FROM t GROUP BY k % 7",
        ] {
            let (cpu_batches, _, _) = run_counting(&cpu, sql, "AggregateExec").await;
            let cpu_rows = split_float_rows(&cpu_batches, &[2, 3, 4]);
            let mut first_run: Option<Vec<(String, Vec<f64>)>> = None;
            for _ in 0..3 {
                let (gpu_batches, gpu_nodes, _) = run_counting(&gpu, sql, "AggregateExec").await;
                assert!(gpu_nodes >= 1);
                let gpu_rows = split_float_rows(&gpu_batches, &[2, 3, 4]);
                assert_eq!(gpu_rows.len(), cpu_rows.len());
                for (g, c) in gpu_rows.iter().zip(&cpu_rows) {
                    assert_eq!(g.0, c.0);
                    // The magnitude sum bounds the rounding error of either
                    // order of additions; an average's error is the sum's
                    // over the count.
                    let scale = c.1[2].abs().max(f64::MIN_POSITIVE);
                    let count: f64 = g.0.split('|').nth(1).unwrap().parse().unwrap();
                    let bounds = [scale, scale / count, scale];
                    for ((a, b), bound) in g.1.iter().zip(&c.1).zip(bounds) {
                        assert!(
                            (a - b).abs() <= TOLERANCE * bound,
                            "{sql}, group {}: GPU {a} against CPU {b}",
                            g.0
                        );
                    }
                }
                if deterministic {
                    let bits = |rows: &[(String, Vec<f64>)]| -> Vec<Vec<u64>> {
                        rows.iter()
                            .map(|r| r.1.iter().map(|v| v.to_bits()).collect())
                            .collect()
                    };
                    match &first_run {
                        Some(first) => assert_eq!(
                            bits(first),
                            bits(&gpu_rows),
                            "{sql}: deterministic sums changed between runs"
                        ),
                        None => first_run = Some(gpu_rows),
                    }
                }
            }
        }
    }
}

/// The sum of metric `name` over the GPU aggregations of `plan` ([`node_metric`]).
fn gpu_aggregate_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    node_metric::<GpuAggregateExec>(plan, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_larger_than_the_device_budget_are_aggregated_in_key_partitions() {
    let Some(_) =
        require_gpu("inputs_larger_than_the_device_budget_are_aggregated_in_key_partitions")
    else {
        return;
    };
    // Budgets of a few MiB, below what the device's work over a million
    // rows needs: the input is split on the host by a hash of its keys and
    // each part aggregated on the device in turn, with the same answer.
    // Which budgets are below that need depends on the device, so the test
    // asserts that, for each way of planning the phases, at least one ran
    // in parts with no fallback (with both phases on the GPU, the final
    // phase's partitions are those of DataFusion's hash repartition on the
    // same keys, which the split must still spread). That holds only with
    // the device to itself (tests beside it take device memory from the
    // same budget, and a partition then waits for memory or falls back):
    // the bundle's run script runs it again alone; beside others, the
    // answers are checked all the same.
    let free = datafusion_gpu::gpu::gpu_runtime().expect("a GPU").devices()[0]
        .budget()
        .free_at_open();
    let t = table(1 << 20, Keys::Uniform { domain: 200_000 }, 4, 29);
    let sqls = [
        "SELECT k, count(*), sum(v), min(v), max(v), avg(v), sum(d), count(s) FROM t GROUP BY k",
        "SELECT k, u, count(*), sum(v) FROM t GROUP BY k, u",
    ];
    for phases in [
        "SET gpu.tuning.aggregate_single_phase = true",
        "SET gpu.tuning.aggregate_single_phase = false",
    ] {
        let mut in_parts = 0;
        for budget_mib in [64usize, 16, 4] {
            let memory = format!(
                "SET gpu.memory_fraction = {:.12}",
                (budget_mib << 20) as f64 / free as f64
            );
            let (gpu, cpu) = contexts(4, &[&memory, phases]).await;
            register([&gpu, &cpu], Arc::clone(&t));
            for sql in sqls {
                let plan = check(&gpu, &cpu, sql).await;
                let parts = gpu_aggregate_metric(&plan, "out_of_core_partitions");
                let fallbacks = gpu_aggregate_metric(&plan, "cpu_fallback_partitions");
                if parts > 0 && fallbacks == 0 {
                    assert!(gpu_aggregate_metric(&plan, "groups") > 0);
                    in_parts += 1;
                }
            }
        }
        assert!(
            in_parts > 0 || !crate::support::alone_on_the_device(),
            "{phases}: no budget made the aggregation run in parts"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn work_the_device_cannot_take_runs_on_the_cpu_operator() {
    let Some(_) = require_gpu("work_the_device_cannot_take_runs_on_the_cpu_operator") else {
        return;
    };
    // A device budget of a few bytes: every partition falls back, to the
    // replaced node, or to DataFusion's two phases where one GPU
    // aggregation replaced them.
    for phases in [
        "SET gpu.tuning.aggregate_single_phase = false",
        "SET gpu.tuning.aggregate_single_phase = true",
    ] {
        let (gpu, cpu) = contexts(4, &["SET gpu.memory_fraction = 0.000000001", phases]).await;
        register(
            [&gpu, &cpu],
            table(20_000, Keys::Uniform { domain: 700 }, 4, 5),
        );
        let sql = format!("SELECT k, {AGGREGATES} FROM t GROUP BY k");
        let plan = check(&gpu, &cpu, &sql).await;
        assert!(
            gpu_aggregate_metric(&plan, "cpu_fallback_partitions") > 0,
            "{phases}"
        );
        let sql = format!("SELECT {AGGREGATES} FROM t");
        let plan = check(&gpu, &cpu, &sql).await;
        assert!(
            gpu_aggregate_metric(&plan, "cpu_fallback_partitions") > 0,
            "{phases}"
        );
    }

    // Keys whose ranges need more than 64 bits together (full-range Int64
    // keys on two columns) are hashed and checked: they stay on the GPU.
    let (gpu, cpu) = contexts(4, &[]).await;
    register(
        [&gpu, &cpu],
        table(20_000, Keys::Uniform { domain: 1 << 62 }, 4, 6),
    );
    let sql = "SELECT k, v, count(*), sum(u) FROM t GROUP BY k, v";
    let plan = check(&gpu, &cpu, sql).await;
    assert_eq!(gpu_aggregate_metric(&plan, "cpu_fallback_partitions"), 0);
    assert_eq!(gpu_aggregate_metric(&plan, "hashed_key_collisions"), 0);
    assert!(gpu_aggregate_metric(&plan, "groups") > 0);
    assert_output_counted(&plan);
    // Without gpu.hashed_group_keys, those keys run on the CPU operator,
    // found at run time (their types pack; their ranges do not).
    let (gpu, cpu) = contexts(4, &["SET gpu.hashed_group_keys = false"]).await;
    register(
        [&gpu, &cpu],
        table(20_000, Keys::Uniform { domain: 1 << 62 }, 4, 6),
    );
    let plan = check(&gpu, &cpu, sql).await;
    assert!(gpu_aggregate_metric(&plan, "cpu_fallback_partitions") > 0);
    assert_eq!(gpu_aggregate_metric(&plan, "groups"), 0);

    // Placed by cost, an aggregation whose groups statistics do not know
    // goes to the GPU where its input is large (unknown counts as many; on
    // one partition, 4 M rows are enough); at run time, a partition whose
    // sampled keys show few groups runs on the CPU operator, where the cost
    // model then estimates it faster, and one with many stays on the GPU.
    for phases in [
        "SET gpu.tuning.aggregate_single_phase = false",
        "SET gpu.tuning.aggregate_single_phase = true",
    ] {
        let (gpu, cpu) = contexts(1, &["SET gpu.placement = 'cost'", phases]).await;
        register(
            [&gpu, &cpu],
            table(1 << 22, Keys::Uniform { domain: 1 << 40 }, 1, 9),
        );
        let plan = check(&gpu, &cpu, "SELECT s, count(*), sum(v) FROM t GROUP BY s").await;
        assert!(
            gpu_aggregate_metric(&plan, "few_groups_partitions") > 0,
            "{phases}"
        );
        let plan = check(&gpu, &cpu, "SELECT k, count(*), sum(v) FROM t GROUP BY k").await;
        assert_eq!(
            gpu_aggregate_metric(&plan, "few_groups_partitions"),
            0,
            "{phases}"
        );
        assert!(gpu_aggregate_metric(&plan, "groups") > 0, "{phases}");
    }

    // Hashes cut to 3 bits: different keys share a hash, the host check
    // finds it, and those partitions run on the CPU operator with the same
    // answer.
    let (gpu, cpu) = contexts(4, &["SET gpu_test.hashed_group_key_bits = 3"]).await;
    register(
        [&gpu, &cpu],
        table(20_000, Keys::Uniform { domain: 700 }, 4, 8),
    );
    for sql in [
        "SELECT s, k2, count(*), sum(v), max(d) FROM t GROUP BY s, k2",
        "SELECT CAST(k AS VARCHAR), min(v), avg(f) FROM t GROUP BY CAST(k AS VARCHAR)",
    ] {
        let plan = check(&gpu, &cpu, sql).await;
        let collisions = gpu_aggregate_metric(&plan, "hashed_key_collisions");
        assert!(collisions > 0, "{sql}: no collision with 3-bit hashes");
        assert!(gpu_aggregate_metric(&plan, "cpu_fallback_partitions") >= collisions);
        // The batches made before the collision was found never left.
        assert_output_counted(&plan);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hash_table_sized_from_a_misleading_sample_is_built_again() {
    let Some(_) = require_gpu("a_hash_table_sized_from_a_misleading_sample_is_built_again") else {
        return;
    };
    // The sample reads every fourth row of 2^18 (65,536 rows): those hold
    // one key, every other row a key of its own. The table sized from the
    // sample (4,096 slots) fills up, and the rows are numbered again in a
    // table sized to them, with the same answer; keys the sample sees
    // truly keep the small table.
    let rows = 1 << 18;
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]));
    let misleading = |range: std::ops::Range<usize>| -> Vec<ArrayRef> {
        let keys: Int64Array = range
            .clone()
            .map(|i| if i % 4 == 0 { 7 } else { 1_000 + i as i64 })
            .collect();
        let values: Int64Array = range
            .map(|i| (i % 9 != 0).then_some((i as i64 * 37) % 1001 - 500))
            .collect();
        vec![Arc::new(keys), Arc::new(values)]
    };
    let truthful = |range: std::ops::Range<usize>| -> Vec<ArrayRef> {
        let keys: Int64Array = range.clone().map(|i| (i % 300) as i64).collect();
        let values: Int64Array = range.map(|i| Some(i as i64 % 1001 - 500)).collect();
        vec![Arc::new(keys), Arc::new(values)]
    };
    // The input crosses the bus in chunks that the table folds (a table
    // scan's columns read from the column cache on the device are laid out
    // whole, and not folded: `cached_input`'s tests).
    let (gpu, cpu) = contexts(
        1,
        &[
            "SET gpu.tuning.aggregate_single_phase = true",
            "SET gpu.placement = 'always'",
            "SET gpu.tuning.cached_gpu_inputs = false",
        ],
    )
    .await;
    // The same GPU aggregation with `gpu.tuning.fold_into_table` off: numbered,
    // then reduced one column at a time, never folded.
    let unfolded = gpu_context(
        JoinMode::CollectLeft,
        1,
        &[
            "SET gpu.tuning.aggregate_single_phase = true",
            "SET gpu.placement = 'always'",
            "SET gpu.tuning.fold_into_table = false",
            "SET gpu.tuning.scan_aggregate = false",
            "SET gpu.tuning.cached_gpu_inputs = false",
        ],
    )
    .await;
    // (the columns, whether the table overflows, whether values are NULL)
    for (columns, overflows, values_have_nulls) in [
        (
            &misleading as &dyn Fn(std::ops::Range<usize>) -> Vec<ArrayRef>,
            true,
            true,
        ),
        (&truthful, false, false),
    ] {
        let table = table_from_columns(Arc::clone(&schema), rows, 1, 8192, columns);
        register([&gpu, &cpu], Arc::clone(&table));
        register([&unfolded, &cpu], table);
        // Every reduction over words (minima and maxima skip the atomics
        // that would change nothing), and a sum of doubles, folded into
        // the table where it holds and they are four at most. The first
        // query counts every row and the values: one count where the
        // values have no NULLs (the sum, minimum and maximum share it),
        // two, and five reductions in all, where they have some. The
        // second's reductions (a maximum, a count of the values shared
        // with the average, a sum) are three; the third's five.
        for (sql, foldable) in [
            (
                "SELECT k, count(*), count(v), sum(v), min(v), max(v) FROM t GROUP BY k",
                !values_have_nulls,
            ),
            ("SELECT k, max(v), avg(v) FROM t GROUP BY k", true),
            (
                "SELECT k, count(*), sum(v), min(v), max(v), sum(v + 1) FROM t GROUP BY k",
                false,
            ),
        ] {
            let plan = check(&gpu, &cpu, sql).await;
            assert_eq!(
                gpu_aggregate_metric(&plan, "table_overflow_partitions"),
                usize::from(overflows),
                "{sql}"
            );
            assert_eq!(
                gpu_aggregate_metric(&plan, "table_fold_partitions"),
                usize::from(foldable && !overflows),
                "{sql}"
            );
            assert_eq!(gpu_aggregate_metric(&plan, "cpu_fallback_partitions"), 0);
            assert_output_counted(&plan);
            let plan = check(&unfolded, &cpu, sql).await;
            assert_eq!(
                gpu_aggregate_metric(&plan, "table_overflow_partitions"),
                usize::from(overflows),
                "{sql}, folding off"
            );
            assert_eq!(
                gpu_aggregate_metric(&plan, "table_fold_partitions"),
                0,
                "{sql}, folding off"
            );
            assert_output_counted(&plan);
        }
    }
}

/// Each GPU aggregation counts as its output the groups it made, one row
/// each, and their bytes; nothing where the CPU operator took over (the
/// batches made before a collision was found are dropped).
fn assert_output_counted(plan: &Arc<dyn ExecutionPlan>) {
    let rows = gpu_aggregate_metric(plan, "output_rows");
    assert_eq!(rows, gpu_aggregate_metric(plan, "groups"));
    let bytes = gpu_aggregate_metric(plan, "output_bytes");
    assert_eq!(bytes > 0, rows > 0, "{rows} rows in {bytes} bytes");
    let batches = gpu_aggregate_metric(plan, "output_batches");
    assert_eq!(batches > 0, rows > 0, "{rows} rows in {batches} batches");
}

/// The GPU aggregations of `plan` that sort their groups.
fn sorting_aggregations(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuAggregateExec> {
    let mut found: Vec<&GpuAggregateExec> = plan
        .downcast_ref::<GpuAggregateExec>()
        .filter(|agg| agg.group_ordering().is_some())
        .into_iter()
        .collect();
    for child in plan.children() {
        found.extend(sorting_aggregations(child));
    }
    found
}

/// Runs `sql`, whose ORDER BY names every group key, on both contexts: the
/// same rows in the same order, at least one aggregation on the GPU, and
/// the sort done by a GPU aggregation (no `SortExec` left). Returns the GPU
/// plan.
async fn check_ordered(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
) -> Arc<dyn ExecutionPlan> {
    let plan = compare(gpu, cpu, sql, true).await;
    let text = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    assert_eq!(sorting_aggregations(&plan).len(), 1, "{sql}\n{text}");
    assert!(!text.contains("SortExec"), "{sql}\n{text}");
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_sorted_on_the_device_come_in_the_order_of_the_sort_they_replace() {
    let Some(_) =
        require_gpu("groups_sorted_on_the_device_come_in_the_order_of_the_sort_they_replace")
    else {
        return;
    };
    // Every direction and NULL placement; one key (its raw values coded on
    // the device where it has no NULLs), several keys packed on the host,
    // decimals and booleans; a limit; a projection between.
    let queries = [
        "SELECT k, count(*), sum(v), max(d) FROM t GROUP BY k ORDER BY k",
        "SELECT k, count(*), min(v) FROM t GROUP BY k ORDER BY k DESC NULLS LAST",
        "SELECT coalesce(k, -7) AS c, count(*), sum(v) FROM t GROUP BY c ORDER BY c",
        "SELECT coalesce(k, -7) AS c, count(*), max(v) FROM t GROUP BY c ORDER BY c DESC",
        "SELECT k2, b, dt, count(*), avg(d) FROM t GROUP BY k2, b, dt \
         ORDER BY b DESC, k2 NULLS FIRST, dt DESC NULLS LAST",
        "SELECT d, count(*) FROM t GROUP BY d ORDER BY d DESC",
        "SELECT u % 1000 AS m, k2, sum(v), min(big) FROM t GROUP BY m, k2 ORDER BY k2, m DESC",
        "SELECT k, k2, count(*) FROM t GROUP BY k, k2 ORDER BY k2 DESC, k LIMIT 37",
        // The sort above a projection of the groups.
        "SELECT k2 + 1 AS k1, count(*), sum(v) FROM t GROUP BY k2 ORDER BY k2 DESC",
    ];
    // Queries whose groups were numbered by sorting the rows (nearly every
    // row its own group), and by sorting the hash table's groups.
    let (mut rows_sorted, mut groups_sorted) = (0, 0);
    for (plan, (partitions, phases)) in PLANS.into_iter().enumerate() {
        // One plan with its results brought back in many small windows,
        // whose batches must follow each other in key order.
        let mut settings = vec![phases];
        if plan == 1 {
            settings.extend(SMALL_RESULT_WINDOWS);
        }
        let (gpu, cpu) = contexts(partitions, &settings).await;
        let empty = (0, Keys::Uniform { domain: 10 });
        for (rows, dist) in std::iter::once(empty).chain(GROUPED_INPUTS) {
            register([&gpu, &cpu], table(rows, dist, partitions, rows as u64 + 3));
            for sql in queries {
                let plan = check_ordered(&gpu, &cpu, sql).await;
                if rows > 0 {
                    assert!(gpu_aggregate_metric(&plan, "groups") > 0, "{sql}");
                    assert_eq!(
                        gpu_aggregate_metric(&plan, "cpu_fallback_partitions"),
                        0,
                        "{sql}"
                    );
                    match gpu_aggregate_metric(&plan, "sorted_rows_partitions") {
                        0 => groups_sorted += 1,
                        _ => rows_sorted += 1,
                    }
                }
            }
        }
    }
    assert!(
        rows_sorted > 0 && groups_sorted > 0,
        "{rows_sorted}, {groups_sorted}"
    );
    // Where the device cannot sort (codes of more than 64 bits: two
    // full-range keys), or cannot take the work (a budget of a few
    // bytes), the CPU fallback sorts its groups: the same rows, in order.
    let no_budget: &[&str] = &["SET gpu.memory_fraction = 0.000000001"];
    for (extra, dist) in [
        (&[] as &[&str], Keys::Uniform { domain: 1 << 62 }),
        (no_budget, Keys::Uniform { domain: 700 }),
    ] {
        for (partitions, phases) in PLANS {
            let settings: Vec<&str> = extra.iter().copied().chain([phases]).collect();
            let (gpu, cpu) = contexts(partitions, &settings).await;
            register([&gpu, &cpu], table(20_000, dist, partitions, 17));
            let sql = "SELECT k, v, count(*), sum(u) FROM t GROUP BY k, v ORDER BY v DESC, k";
            let plan = check_ordered(&gpu, &cpu, sql).await;
            assert!(
                gpu_aggregate_metric(&plan, "cpu_fallback_partitions") > 0,
                "{extra:?}, {phases}"
            );
        }
    }
}

/// `words` split into pieces of uneven sizes (as batches would be).
fn in_pieces(words: Vec<u64>) -> Words {
    let mut pieces = Words::default();
    let mut rest = words.as_slice();
    let mut size = 1;
    while !rest.is_empty() {
        let (head, tail) = rest.split_at(size.min(rest.len()));
        pieces.push(Box::new(head.to_vec()));
        rest = tail;
        size = size * 7 % 10_007 + 1;
    }
    pieces
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn device_group_by_matches_the_reference() {
    let Some(runtime) = require_gpu("device_group_by_matches_the_reference") else {
        return;
    };
    let device = Arc::clone(&runtime.devices()[0]);
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // A second stream for the inputs' copies, as the operator uses.
    let copy_stream = device.stream().unwrap();
    let copy_stream = copy_stream.stream();
    for (rows, domain) in [
        (0usize, 1u64),
        (1, 1),
        (5_000, 3),
        (50_000, 4_096),
        (50_000, 4_097),
        (200_000, 1 << 30),
    ] {
        let rows = sanitized_rows(rows);
        let mut rng = StdRng::seed_from_u64(rows as u64 + domain);
        let keys: Vec<u64> = (0..rows)
            .map(|_| match rng.random_range(0..4) {
                // The reserved slot's key, and ordinary ones.
                0 => u64::MAX,
                _ => rng.random_range(0..domain),
            })
            .collect();
        let words = |rng: &mut StdRng| -> Vec<u64> { (0..rows).map(|_| rng.random()).collect() };
        let bitmaps = vec![group_by::validity_bitmap(rows, |i| i % 5 != 2)];
        let mut inputs = Vec::new();
        for reduction in [
            Reduction::Count,
            Reduction::Sum,
            Reduction::Min,
            Reduction::Max,
            Reduction::SumI128,
            Reduction::MinI128,
            Reduction::MaxI128,
            // Random words: doubles of every exponent, NaNs and infinities
            // among them; the reference reproduces the device's bits.
            Reduction::SumF64Fixed,
        ] {
            for valid in [None, Some(0)] {
                let values = if reduction == Reduction::Count {
                    Vec::new()
                } else {
                    words(&mut rng)
                };
                let high_words = if reduction.is_wide() {
                    // Few distinct high words, so ties decide by low words.
                    (0..rows).map(|_| rng.random_range(0..3u64)).collect()
                } else {
                    Vec::new()
                };
                // Signed MIN and MAX flip the sign bit on the device.
                let flip = if rng.random_bool(0.5) { 1 << 63 } else { 0 };
                inputs.push(ReduceInput {
                    reduction,
                    values: in_pieces(values),
                    high_words: in_pieces(high_words),
                    flip,
                    valid,
                });
            }
        }
        let key_words = in_pieces(keys.clone());
        let sorted = GroupIds::Sorted {
            key_bits: 64,
            transform: None,
        };
        let hashed_in_key_order = |expected_groups| GroupIds::HashedInKeyOrder {
            key_bits: 64,
            transform: None,
            expected_groups,
        };
        let hashed = |expected_groups| GroupIds::Hashed { expected_groups };
        // A table sized to the groups, and one sized to a single group,
        // which fills up once the keys outnumber its slots and is built
        // again.
        let groups_here = Some(rows.min(domain as usize + 1));
        // One partition (which overflows into the global table beyond
        // 1536 groups), a few, and as many as the groups call for.
        let in_partitions = |partition_bits| GroupIds::Partitioned { partition_bits };
        let planned_bits = group_by::partition_bits_for_groups(rows.min(domain as usize));
        for (case, (with_keys, ids, back)) in [
            (true, hashed(None), GroupsBack::KeyWords),
            (true, hashed(None), GroupsBack::RowsAndRowGroups),
            (false, hashed(None), GroupsBack::KeyWords),
            (true, sorted, GroupsBack::KeyWords),
            (true, hashed_in_key_order(None), GroupsBack::KeyWords),
            (true, in_partitions(0), GroupsBack::KeyWords),
            (true, in_partitions(0), GroupsBack::RowsAndRowGroups),
            (true, in_partitions(3), GroupsBack::RowsAndRowGroups),
            (true, in_partitions(planned_bits), GroupsBack::KeyWords),
            (false, in_partitions(3), GroupsBack::KeyWords),
            (true, hashed(groups_here), GroupsBack::KeyWords),
            (true, hashed(groups_here), GroupsBack::RowsAndRowGroups),
            (true, hashed(Some(1)), GroupsBack::KeyWords),
            (true, hashed(Some(1)), GroupsBack::RowsAndRowGroups),
            (false, hashed(Some(1)), GroupsBack::KeyWords),
            (true, hashed_in_key_order(groups_here), GroupsBack::KeyWords),
            (true, hashed_in_key_order(Some(1)), GroupsBack::KeyWords),
        ]
        .into_iter()
        .enumerate()
        {
            let keys = with_keys.then_some(keys.as_slice());
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            // The inputs in one chunk, in chunks of 4,992 rows, and whole,
            // in turn for each pair of cases, so that every way of
            // numbering meets several chunks with keys (sorted ids, in
            // partitions with either `back`, in key order).
            let chunks = match (case / 2) % 3 {
                0 => InputChunks::of(group_by::FOLD_CHUNK_ROWS),
                1 => InputChunks::of(4_992),
                _ => InputChunks::WHOLE,
            };
            let on_device = group_by::group_on_device(
                &device,
                stream,
                copy_stream,
                with_keys.then_some(&key_words),
                ids,
                rows,
                &inputs,
                &bitmaps,
                back,
                chunks,
                &mut timer,
            )
            .unwrap();
            // No table folds these inputs (128-bit ones among them): with
            // keys, every input whose reduction reads each row once is
            // reduced chunk by chunk, the others whole.
            let one_pass = inputs
                .iter()
                .filter(|i| {
                    !matches!(
                        i.reduction,
                        Reduction::SumF64Fixed | Reduction::MinI128 | Reduction::MaxI128
                    )
                })
                .count();
            let in_chunks = chunks.reduce_as_they_land && with_keys && rows > 0;
            assert_eq!(
                on_device.inputs_reduced_as_they_landed,
                if in_chunks { one_pass } else { 0 },
                "rows {rows}, domain {domain}, case {case}"
            );
            let got = if case % 2 == 0 {
                // All at once.
                on_device
                    .download(&device, group_by::DOWNLOAD_WINDOW_WORDS, &mut timer)
                    .unwrap()
            } else {
                // The results through 4 threads taking tasks of 3 groups
                // from about five windows, then downloaded in about as many
                // (the last one shorter) through two pinned buffers in turn:
                // every group once, in order, each task's words as
                // downloaded.
                // Each pass of some parts brings back the same words as
                // one pass of all: the identities on a stream of their own
                // first, while the device may still reduce.
                let window = (on_device.groups / 5).max(1);
                let window_words = window * on_device.words_per_group(ResultParts::All) + 1;
                let groups = on_device.groups;
                let task = |w: &group_by::GroupedWindow<'_>, groups: std::ops::Range<usize>| {
                    let words = |all: &[u64]| all.get(groups.clone()).unwrap_or(&[]).to_vec();
                    let reduced: Vec<(Vec<u64>, Vec<u64>)> = w
                        .reduced
                        .iter()
                        .map(|r| (words(&r.values), words(&r.high_words)))
                        .collect();
                    Ok::<_, GpuError>((
                        w.groups.start + groups.start..w.groups.start + groups.end,
                        words(w.identities),
                        reduced,
                    ))
                };
                let side_stream = device.stream().unwrap();
                let mut bring_back = |stream, parts| {
                    on_device
                        .bring_back_in_parallel(
                            &device,
                            (stream, parts),
                            window,
                            3,
                            4,
                            &mut timer,
                            task,
                        )
                        .unwrap()
                };
                // The reductions split in two passes: the first ones on a
                // stream of their own as soon as they are made (the first
                // pass of all, while the device may still reduce), the
                // others after.
                let split = inputs.len() / 2;
                let first_reductions: Vec<usize> = (0..split).collect();
                let last_reductions: Vec<usize> = (split..inputs.len()).collect();
                let some = |reductions: &[usize]| ResultParts::some_reductions(reductions).unwrap();
                let first_part = bring_back(side_stream.stream(), some(&first_reductions));
                let early = bring_back(side_stream.stream(), ResultParts::Identities);
                let late = bring_back(on_device.stream(), ResultParts::Reductions);
                let last_part = bring_back(on_device.stream(), some(&last_reductions));
                let tasks = bring_back(on_device.stream(), ResultParts::All);
                for pass in [&early, &late, &first_part, &last_part] {
                    assert!(pass.iter().map(|t| &t.0).eq(tasks.iter().map(|t| &t.0)));
                }
                for ((early, late), all) in early.iter().zip(&late).zip(&tasks) {
                    assert_eq!(early.1, all.1, "rows {rows}, domain {domain}");
                    assert!(early.2.is_empty());
                    assert!(late.1.is_empty());
                    assert_eq!(late.2, all.2, "rows {rows}, domain {domain}");
                }
                let no_words = (Vec::new(), Vec::new());
                for ((first_part, last_part), all) in first_part.iter().zip(&last_part).zip(&tasks)
                {
                    assert!(first_part.1.is_empty() && last_part.1.is_empty());
                    for (i, all) in all.2.iter().enumerate() {
                        let (here, not_here) = match i < split {
                            true => (&first_part.2[i], &last_part.2[i]),
                            false => (&last_part.2[i], &first_part.2[i]),
                        };
                        assert_eq!(here, all, "rows {rows}, domain {domain}, reduction {i}");
                        assert_eq!(not_here, &no_words, "reduction {i} not brought back");
                    }
                }
                if groups > 6 {
                    // A failing task's error comes back; a panicking
                    // task's as an error of its own.
                    let failed = on_device.bring_back_in_parallel(
                        &device,
                        (on_device.stream(), ResultParts::All),
                        window,
                        3,
                        4,
                        &mut timer,
                        |w, g| match w.groups.start + g.start {
                            3 => Err(GpuError::Invalid("task at 3".into())),
                            _ => Ok(()),
                        },
                    );
                    assert!(matches!(failed, Err(GpuError::Invalid(m)) if m == "task at 3"));
                    let panicked = on_device.bring_back_in_parallel(
                        &device,
                        (on_device.stream(), ResultParts::All),
                        window,
                        3,
                        4,
                        &mut timer,
                        |w, g| {
                            assert_ne!(w.groups.start + g.start, 6, "a planted panic");
                            Ok::<_, GpuError>(())
                        },
                    );
                    assert!(panicked.is_err());
                }
                let got = on_device
                    .download(&device, window_words, &mut timer)
                    .unwrap();
                assert_eq!(tasks.len(), groups.div_ceil(3));
                let mut next = 0;
                let mut identities = Vec::new();
                let mut reduced = vec![(Vec::new(), Vec::new()); inputs.len()];
                for (groups, task_identities, task_reduced) in tasks {
                    assert_eq!(groups.start, next, "rows {rows}, domain {domain}");
                    assert!(groups.len() <= 3 && !groups.is_empty());
                    next = groups.end;
                    identities.extend(task_identities);
                    for (all, (values, high)) in reduced.iter_mut().zip(task_reduced) {
                        all.0.extend(values);
                        all.1.extend(high);
                    }
                }
                assert_eq!(next, groups);
                let downloaded = match back {
                    GroupsBack::KeyWords => &got.group_keys,
                    GroupsBack::RowsAndRowGroups => &got.group_rows,
                };
                assert_eq!(&identities, downloaded, "rows {rows}, domain {domain}");
                for (i, (all, want)) in reduced.iter().zip(&got.reduced).enumerate() {
                    assert_eq!(
                        all.0, want.values,
                        "rows {rows}, domain {domain}, input {i}"
                    );
                    assert_eq!(
                        all.1, want.high_words,
                        "rows {rows}, domain {domain}, input {i}"
                    );
                }
                got
            };
            timer.finish().unwrap();
            let want = group_by::reference::group_by(keys, rows, &inputs, &bitmaps);
            assert_eq!(got.groups, want.groups, "rows {rows}, domain {domain}");
            // A table sized to one group has the fewest slots, 4096 (and
            // the reserved one, for the key u64::MAX): it cannot hold more
            // keys than that, and gives up only once three quarters full.
            let sized_to_one = matches!(
                ids,
                GroupIds::Hashed {
                    expected_groups: Some(1)
                } | GroupIds::HashedInKeyOrder {
                    expected_groups: Some(1),
                    ..
                }
            );
            if sized_to_one && with_keys && want.groups > 4097 {
                assert!(got.table_overflowed, "rows {rows}, domain {domain}");
            } else if !sized_to_one || want.groups < 3072 {
                assert!(!got.table_overflowed, "rows {rows}, domain {domain}");
            }
            match ids {
                // One partition holds every group: numbered there below
                // the limit, in the global table from it on.
                GroupIds::Partitioned { partition_bits: 0 } if with_keys && rows > 0 => assert_eq!(
                    got.numbered_in_partitions,
                    want.groups < launch::PARTITION_GROUP_LIMIT,
                    "rows {rows}, domain {domain}"
                ),
                GroupIds::Partitioned { partition_bits } if with_keys && rows > 0 => {
                    if partition_bits == planned_bits {
                        assert!(got.numbered_in_partitions, "rows {rows}, domain {domain}");
                    }
                }
                _ => assert!(!got.numbered_in_partitions),
            }
            // What identifies the groups, as asked for.
            let key_of_group: Vec<u64> = match (keys, back) {
                (None, _) => {
                    assert!(got.row_groups.is_empty() && got.group_rows.is_empty());
                    assert!(got.group_keys.is_empty());
                    Vec::new()
                }
                (Some(keys), GroupsBack::RowsAndRowGroups) => {
                    // Every row's group: the group whose row has its key.
                    assert!(got.group_keys.is_empty());
                    assert_eq!(got.row_groups.len(), rows);
                    for (row, &group) in got.row_groups.iter().enumerate() {
                        let first = got.group_rows[group as usize] as usize;
                        assert_eq!(keys[first], keys[row], "row {row} in group {group}");
                    }
                    got.group_rows
                        .iter()
                        .map(|&row| keys[row as usize])
                        .collect()
                }
                (Some(_), GroupsBack::KeyWords) => {
                    // Each group's key word: every key once; sorted ids
                    // number the groups in ascending key order.
                    assert!(got.row_groups.is_empty() && got.group_rows.is_empty());
                    let mut sorted = got.group_keys.clone();
                    sorted.sort_unstable();
                    let mut want_keys = want.group_keys.clone();
                    want_keys.sort_unstable();
                    assert_eq!(sorted, want_keys, "rows {rows}, domain {domain}");
                    if ids.in_key_order() {
                        assert_eq!(got.group_keys, sorted, "rows {rows}, domain {domain}");
                    }
                    got.group_keys.clone()
                }
            };
            // Groups not in key order come in the order of their first
            // rows, as the reference numbers them: the same identities, and
            // every row in the same group.
            if keys.is_some() && !ids.in_key_order() {
                match back {
                    GroupsBack::KeyWords => assert_eq!(
                        got.group_keys, want.group_keys,
                        "rows {rows}, domain {domain}, case {case}: groups in first-row order"
                    ),
                    GroupsBack::RowsAndRowGroups => {
                        assert_eq!(
                            got.group_rows, want.group_rows,
                            "rows {rows}, domain {domain}, case {case}: first rows"
                        );
                        assert_eq!(
                            got.row_groups, want.row_groups,
                            "rows {rows}, domain {domain}, case {case}: rows' groups"
                        );
                    }
                }
            }
            // Compare the results by key (groups in key order come sorted).
            let order = |grouped: &group_by::Grouped, key_of_group: &[u64]| -> Vec<usize> {
                let mut ids: Vec<usize> = (0..grouped.groups).collect();
                if keys.is_some() {
                    ids.sort_by_key(|&g| key_of_group[g]);
                }
                ids
            };
            let (got_order, want_order) =
                (order(&got, &key_of_group), order(&want, &want.group_keys));
            for (i, (g, w)) in got.reduced.iter().zip(&want.reduced).enumerate() {
                let pick = |r: &[u64], order: &[usize]| -> Vec<u64> {
                    if r.is_empty() {
                        Vec::new()
                    } else {
                        order.iter().map(|&g| r[g]).collect()
                    }
                };
                assert_eq!(
                    pick(&g.values, &got_order),
                    pick(&w.values, &want_order),
                    "rows {rows}, domain {domain}, input {i} ({:?})",
                    inputs[i].reduction
                );
                assert_eq!(
                    pick(&g.high_words, &got_order),
                    pick(&w.high_words, &want_order),
                    "rows {rows}, domain {domain}, input {i} high words"
                );
            }
        }
    }
}

/// Table folds over few groups, and over groups across the shared-memory
/// threshold (4,096).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn device_table_folds_match_the_reference() {
    table_folds_match_the_reference(
        "device_table_folds_match_the_reference",
        &[
            (0, 1, 0.0, 1),
            (1, 1, 0.0, 1),
            (5_000, 3, 0.0, 4),
            (50_000, 4_096, 0.0, 4_097),
            (50_000, 4_097, 0.0, 4_098),
        ],
    )
    .await;
}

/// Table folds over many groups (a table that grows) and a hot key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn device_table_folds_of_many_groups_and_a_hot_key_match_the_reference() {
    table_folds_match_the_reference(
        "device_table_folds_of_many_groups_and_a_hot_key_match_the_reference",
        &[
            (400_000, 1 << 30, 0.0, 100_000),
            // 50,000 groups: a table sized for one fills up in the first
            // chunk of 4,992 rows and grows, once, to hold them all.
            (400_000, 50_000, 0.0, 50_000),
            // Most rows on one key: the lanes of a warp share it.
            (200_000, 1 << 16, 0.9, 16_384),
        ],
    )
    .await;
}

/// Every way of numbering and folding `cases` (rows, key domain, share of
/// rows on one hot key, estimated groups) against the reference.
async fn table_folds_match_the_reference(test: &str, cases: &[(usize, u64, f64, usize)]) {
    let Some(runtime) = require_gpu(test) else {
        return;
    };
    let device = Arc::clone(&runtime.devices()[0]);
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let copy_stream = device.stream().unwrap();
    let copy_stream = copy_stream.stream();
    let mut folded_cases = 0;
    let mut folded_fold_counts = std::collections::BTreeSet::new();
    for &(rows, domain, hot_share, estimate) in cases {
        // Under the sanitizer the inputs are smaller, but for the table that
        // grows: it needs its rows to grow large enough to hold every group,
        // and keeps them, numbered and chunked only the ways that grow it.
        let grows = domain == 50_000;
        let only_growth = grows && sanitizing();
        let rows = if grows { rows } else { sanitized_rows(rows) };
        let mut rng = StdRng::seed_from_u64(rows as u64 ^ domain);
        let keys: Vec<u64> = (0..rows)
            .map(|_| match rng.random_range(0..8) {
                // The reserved slot's key, and ordinary ones.
                0 => u64::MAX,
                _ if rng.random_bool(hot_share) => 7,
                _ => rng.random_range(0..domain),
            })
            .collect();
        let bitmaps = vec![
            group_by::validity_bitmap(rows, |i| i % 5 != 2),
            group_by::validity_bitmap(rows, |i| i % 3 == 0),
        ];
        let mut words = || -> Vec<u64> { (0..rows).map(|_| rng.random()).collect() };
        let input = |reduction, values: Vec<u64>, flip, valid| ReduceInput {
            reduction,
            high_words: if reduction == Reduction::SumI128 {
                in_pieces((0..rows as u64).map(|i| i % 3).collect())
            } else {
                Words::default()
            },
            values: in_pieces(values),
            flip,
            valid,
        };
        // Quarters: a float sum exact in any order of the additions.
        let quarters: Vec<u64> = (0..rows)
            .map(|i| ((i as f64 % 8_000.0 - 4_000.0) / 4.0).to_bits())
            .collect();
        let words_sets = [
            vec![
                input(Reduction::Count, Vec::new(), 0, None),
                input(Reduction::Sum, words(), 1 << 63, Some(0)),
                input(Reduction::Min, words(), 1 << 63, Some(1)),
                input(Reduction::Max, words(), 0, None),
            ],
            vec![
                input(Reduction::SumF64, quarters, 0, Some(0)),
                input(Reduction::Count, Vec::new(), 0, Some(1)),
                input(Reduction::Min, words(), 0, None),
                input(Reduction::Max, words(), 1 << 63, Some(1)),
            ],
            // One, two and three folds (each count has a kernel of its
            // own). Values that only grow (a MAX) or only shrink (a MIN)
            // change their slot at every row, so that every lane of a warp
            // sharing a slot takes part in its atomics.
            vec![input(
                Reduction::Max,
                (0..rows as u64).collect(),
                1 << 63,
                None,
            )],
            vec![
                input(Reduction::Min, (0..rows as u64).rev().collect(), 0, Some(0)),
                input(Reduction::Count, Vec::new(), 0, Some(1)),
            ],
            vec![
                input(Reduction::Sum, words(), 0, None),
                input(Reduction::Max, words(), 0, Some(1)),
                input(Reduction::Min, (0..rows as u64).collect(), 1 << 63, None),
            ],
            // Five inputs, one more than a table folds.
            vec![
                input(Reduction::Count, Vec::new(), 0, None),
                input(Reduction::Sum, words(), 0, Some(0)),
                input(Reduction::Min, words(), 0, Some(1)),
                input(Reduction::Max, words(), 0, None),
                input(Reduction::Sum, words(), 0, None),
            ],
            // A 128-bit sum, which a table does not fold.
            vec![
                input(Reduction::Max, words(), 0, None),
                input(Reduction::SumI128, words(), 0, Some(0)),
            ],
        ];
        let key_words = in_pieces(keys.clone());
        let hashed_in_key_order = |expected_groups| GroupIds::HashedInKeyOrder {
            key_bits: 64,
            transform: None,
            expected_groups,
        };
        let hashed = |expected_groups| GroupIds::Hashed { expected_groups };
        for inputs in &words_sets {
            let want = group_by::reference::group_by(Some(&keys), rows, inputs, &bitmaps);
            let foldable = inputs.len() <= launch::MAX_TABLE_FOLDS
                && inputs.iter().all(|i| !i.reduction.is_wide());
            let cases = [
                hashed(Some(estimate)),
                hashed(Some(1)),
                hashed(None),
                hashed_in_key_order(Some(estimate)),
                hashed_in_key_order(Some(1)),
                // Numbered in partitions, which never fold: each input is
                // reduced as it lands where it comes in chunks, or gathered
                // into the partitions' order and reduced whole.
                GroupIds::Partitioned { partition_bits: 3 },
                GroupIds::Partitioned {
                    partition_bits: group_by::partition_bits_for_groups(estimate),
                },
            ]
            .into_iter()
            // Whole columns, in one chunk, and in chunks of 64 rows and of
            // 4,992 (the second a multiple of 64, the first rounded up to
            // it); and in chunks of 4,992 reduced as they land but never
            // folded.
            .flat_map(|ids| {
                [
                    InputChunks::WHOLE,
                    InputChunks::of(group_by::FOLD_CHUNK_ROWS),
                    InputChunks::of(37),
                    InputChunks::of(4_992),
                    InputChunks {
                        fold_into_table: false,
                        ..InputChunks::of(4_992)
                    },
                ]
                .map(|chunks| (ids, chunks))
                .into_iter()
                // Chunks of 64 rows make a launch each: under the sanitizer,
                // only over the smaller inputs, and numbered two ways (one
                // hashed, one partitioned), which run every kernel the
                // others do.
                .filter(move |(ids, chunks)| {
                    chunks.rows >= 64
                        || !sanitizing()
                        || (rows <= 5_000
                            && matches!(
                                ids,
                                GroupIds::Hashed {
                                    expected_groups: Some(_)
                                } | GroupIds::Partitioned { partition_bits: 3 }
                            ))
                })
                .filter(move |(ids, chunks)| {
                    !only_growth
                        || (*chunks == InputChunks::of(4_992)
                            && matches!(
                                ids,
                                GroupIds::Hashed {
                                    expected_groups: Some(_)
                                }
                            ))
                })
            });
            for (ids, chunks) in cases {
                let mut timer = PhaseTimer::new(Arc::clone(stream));
                let got = group_by::group_on_device(
                    &device,
                    stream,
                    copy_stream,
                    Some(&key_words),
                    ids,
                    rows,
                    inputs,
                    &bitmaps,
                    GroupsBack::KeyWords,
                    chunks,
                    &mut timer,
                )
                .and_then(|grouped| {
                    grouped.download(&device, group_by::DOWNLOAD_WINDOW_WORDS, &mut timer)
                })
                .unwrap();
                timer.finish().unwrap();
                let case = format!("rows {rows}, domain {domain}, {ids:?}, {chunks:?}, {inputs:?}");
                let estimated = match ids {
                    GroupIds::Hashed { expected_groups }
                    | GroupIds::HashedInKeyOrder {
                        expected_groups, ..
                    } => expected_groups,
                    _ => None,
                };
                // A table sized from an estimate, smaller than one sized to
                // the rows, folds where it holds all the groups.
                let sized = estimated.is_some_and(|g| {
                    group_by::sized_table_capacity(g) < (2 * rows as u64).max(2).next_power_of_two()
                });
                // A table of 4,096 slots cannot hold more groups: it filled
                // up, or, folding in chunks, its first chunk showed it would
                // and it grew.
                if sized && estimated == Some(1) && want.groups > 4097 {
                    assert!(got.table_overflowed || got.folding_table_grown, "{case}");
                }
                // It grows only after a first chunk with more to follow.
                let first_chunk = chunks
                    .fold_into_table
                    .then(|| chunks.rows.max(1).next_multiple_of(64))
                    .filter(|&c| c < rows);
                if got.folding_table_grown {
                    assert!(first_chunk.is_some() && foldable && sized, "{case}");
                }
                if domain == 50_000 && estimated == Some(1) && foldable {
                    // The first 4,992 rows hold more than 1,536 groups (three
                    // eighths of the table): grown to hold every group, and
                    // folded without filling up. The first 64 rows cannot
                    // tell: that table fills up later.
                    let first_groups = keys[..4_992]
                        .iter()
                        .collect::<std::collections::HashSet<_>>()
                        .len();
                    assert!(8 * first_groups > 3 * 4_096, "{case}: {first_groups}");
                    match first_chunk {
                        Some(4_992) => {
                            assert!(got.folding_table_grown && !got.table_overflowed, "{case}")
                        }
                        Some(_) => {
                            assert!(!got.folding_table_grown && got.table_overflowed, "{case}")
                        }
                        None => assert!(!got.folding_table_grown, "{case}"),
                    }
                }
                let tries_to_fold = chunks.fold_into_table && rows > 0 && foldable && sized;
                let folds = tries_to_fold && !got.table_overflowed;
                assert_eq!(got.folded_in_table, folds, "{case}");
                // Where no table tried to fold them (a table that filled up
                // reduces the chunks it kept as whole columns), every input
                // is reduced as it lands: each of these reads every row once.
                let in_chunks = chunks.reduce_as_they_land && rows > 0 && !tries_to_fold;
                assert_eq!(
                    got.inputs_reduced_as_they_landed,
                    if in_chunks { inputs.len() } else { 0 },
                    "{case}"
                );
                folded_cases += usize::from(folds);
                if folds {
                    folded_fold_counts.insert(inputs.len());
                }
                assert_eq!(got.groups, want.groups, "{case}");
                if ids.in_key_order() {
                    assert!(got.group_keys.is_sorted(), "{case}");
                } else {
                    // In the order of their first rows, folded or not.
                    assert_eq!(got.group_keys, want.group_keys, "{case}: group order");
                }
                let group_of_key: std::collections::HashMap<u64, usize> = got
                    .group_keys
                    .iter()
                    .enumerate()
                    .map(|(g, &k)| (k, g))
                    .collect();
                assert_eq!(group_of_key.len(), want.groups, "{case}");
                for (i, (g, w)) in got.reduced.iter().zip(&want.reduced).enumerate() {
                    for (w_group, key) in want.group_keys.iter().enumerate() {
                        let g_group = group_of_key[key];
                        assert_eq!(
                            g.values[g_group], w.values[w_group],
                            "{case}: input {i}, key {key}"
                        );
                        if !w.high_words.is_empty() {
                            assert_eq!(
                                g.high_words[g_group], w.high_words[w_group],
                                "{case}: input {i}, key {key}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Every kind of case above folded somewhere.
    // (Under the sanitizer, the table that grows folds in ten.)
    let enough = if sanitizing() { 10 } else { 20 };
    assert!(folded_cases >= enough, "{folded_cases} cases folded");
    // And every fold count's kernel ran.
    assert_eq!(
        folded_fold_counts.into_iter().collect::<Vec<_>>(),
        (1..=launch::MAX_TABLE_FOLDS).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn device_float_sums_of_exact_values_are_exact() {
    let Some(runtime) = require_gpu("device_float_sums_of_exact_values_are_exact") else {
        return;
    };
    let device = Arc::clone(&runtime.devices()[0]);
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let rows = 100_000;
    let keys: Vec<u64> = (0..rows as u64).map(|i| i % 10).collect();
    // Quarters sum exactly in any order.
    let values: Vec<u64> = (0..rows)
        .map(|i| ((i as f64 - 50_000.0) / 4.0).to_bits())
        .collect();
    let inputs = [ReduceInput {
        reduction: Reduction::SumF64,
        values: values.into(),
        high_words: Words::default(),
        flip: 0,
        valid: None,
    }];
    let key_words: Words = keys.clone().into();
    for with_keys in [true, false] {
        let keys = with_keys.then_some(keys.as_slice());
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        // One stream for the copies and the kernels alike.
        let got = group_by::group_on_device(
            &device,
            stream,
            stream,
            with_keys.then_some(&key_words),
            GroupIds::Hashed {
                expected_groups: None,
            },
            rows,
            &inputs,
            &[],
            GroupsBack::KeyWords,
            InputChunks::of(group_by::FOLD_CHUNK_ROWS),
            &mut timer,
        )
        .and_then(|grouped| grouped.download(&device, group_by::DOWNLOAD_WINDOW_WORDS, &mut timer))
        .unwrap();
        timer.finish().unwrap();
        let want = group_by::reference::group_by(keys, rows, &inputs, &[]);
        let total = |g: &group_by::Grouped| -> f64 {
            g.reduced[0].values.iter().map(|&w| f64::from_bits(w)).sum()
        };
        assert_eq!(got.groups, want.groups);
        assert_eq!(total(&got), total(&want));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn averages_of_wide_decimals_match_the_cpu() {
    let Some(_) = require_gpu("averages_of_wide_decimals_match_the_cpu") else {
        return;
    };
    // DataFusion keeps AVG's sum of a Decimal128 wider than 25 digits as a
    // Decimal256: those aggregations stay on the CPU, with the reason, and
    // answer as it does; narrower ones run on the GPU.
    let wide = [
        "SELECT avg(big) FROM t",
        "SELECT k, avg(big) FROM t GROUP BY k",
        "SELECT avg(CAST(d AS DECIMAL(30, 2))) FROM t",
        "SELECT k, avg(CAST(d AS DECIMAL(30, 2))), sum(big) FROM t GROUP BY k",
    ];
    for (partitions, phases) in PLANS {
        let (gpu, cpu) = contexts(partitions, &[phases]).await;
        for rows in [0usize, 1, 50_000] {
            register(
                [&gpu, &cpu],
                table(rows, Keys::Uniform { domain: 100 }, partitions, 11),
            );
            for sql in wide {
                let (gpu_batches, gpu_nodes, plan) = run_counting(&gpu, sql, "AggregateExec").await;
                let (cpu_batches, _, _) = run_counting(&cpu, sql, "AggregateExec").await;
                assert_eq!(
                    gpu_nodes, 0,
                    "{sql}: a wide decimal average planned on the GPU"
                );
                assert_eq!(
                    string_rows(&gpu_batches),
                    string_rows(&cpu_batches),
                    "{sql}"
                );
                let decisions = datafusion_gpu::gpu_decisions(&plan, gpu.state().config_options());
                assert!(
                    decisions.iter().any(|d| matches!(
                        &d.placement,
                        datafusion_gpu::Placement::Cpu { reason } if reason.contains("Decimal256(76")
                    )),
                    "{sql}: {decisions:?}"
                );
            }
            check(
                &gpu,
                &cpu,
                "SELECT k, avg(CAST(d AS DECIMAL(25, 2))) FROM t GROUP BY k",
            )
            .await;
        }
    }
}
