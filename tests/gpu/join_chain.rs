//! Two GPU hash joins stacked, the lower one the upper one's probe side:
//! the lower keeps its output on the device and the upper probes with it
//! there (`gpu.tuning.device_rows_between_joins`). Each case is checked
//! against DataFusion, and the metrics say which way the rows went.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Decimal128Array, Int32Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::support::*;

/// The upper join (build `a`, the smallest) probes with the lower one's
/// output (build `c`, probe `b`). Its rows' order can be seen: the joins
/// keep `HashJoinExec`'s, and hand rows on on the device only with
/// `gpu.preserve_order = false`.
const CHAIN: &str = "SELECT a.x, b.y, c.z, b.k2 FROM c JOIN b ON c.k2 = b.k2 JOIN a ON a.k1 = b.k1";

/// [`CHAIN`] under an aggregation, which leaves the joins' order free.
const CHAIN_GROUPED: &str = "SELECT a.x, b.y, c.z, b.k2, count(*) FROM c JOIN b ON c.k2 = b.k2 \
     JOIN a ON a.k1 = b.k1 GROUP BY a.x, b.y, c.z, b.k2";

/// Order free for [`CHAIN`].
const ORDER_FREE: &str = "SET gpu.preserve_order = false";

/// A table of the key columns `keys` (Int64, or Int32 for `k1` where
/// `narrow`) and the value column `value`, NULL at every `null_every`-th
/// row where given.
fn table(
    keys: &[(&str, &[Option<i64>])],
    value: &str,
    narrow: bool,
    null_every: Option<usize>,
) -> Arc<MemTable> {
    let key_type = |name: &str| match narrow && name == "k1" {
        true => DataType::Int32,
        false => DataType::Int64,
    };
    let mut fields: Vec<Field> = keys
        .iter()
        .map(|(name, _)| Field::new(*name, key_type(name), true))
        .collect();
    fields.push(Field::new(value, DataType::Int64, true));
    let schema = Arc::new(Schema::new(fields));
    let rows = keys[0].1.len();
    table_from_columns(Arc::clone(&schema), rows, 3, 1000, |range| {
        let mut out: Vec<ArrayRef> = keys
            .iter()
            .map(|(name, column)| -> ArrayRef {
                let values = &column[range.clone()];
                match key_type(name) {
                    DataType::Int32 => Arc::new(Int32Array::from_iter(
                        values.iter().map(|v| v.map(|v| v as i32)),
                    )),
                    _ => Arc::new(Int64Array::from(values.to_vec())),
                }
            })
            .collect();
        out.push(Arc::new(Int64Array::from_iter(range.map(|i| {
            match null_every.is_some_and(|n| i % n == 0) {
                true => None,
                false => Some((i as i64).wrapping_mul(0x9E37_79B9) % 1_000_003),
            }
        }))));
        out
    })
}

/// `plan` with its metrics, for a failure's message.
fn with_metrics(plan: &Arc<dyn ExecutionPlan>) -> String {
    DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(true)
        .to_string()
}

/// Registers a (k1, x), b (k1, k2, y) and c (k2, z) in both contexts.
fn register(ctxs: [&SessionContext; 2], narrow: bool, null_every: Option<usize>) {
    let a = gen_keys(2_000, Keys::Permutation, 0.0, 1);
    let b1 = gen_keys(60_000, Keys::Uniform { domain: 3_000 }, 0.0, 2);
    let b2 = gen_keys(
        60_000,
        Keys::Zipf {
            domain: 1_500,
            s: 1.1,
        },
        0.0,
        3,
    );
    let c = gen_keys(1_200, Keys::Uniform { domain: 1_000 }, 0.0, 4);
    for ctx in ctxs {
        let tables = [
            ("a", table(&[("k1", &a)], "x", narrow, None)),
            (
                "b",
                table(&[("k1", &b1), ("k2", &b2)], "y", narrow, null_every),
            ),
            ("c", table(&[("k2", &c)], "z", false, None)),
        ];
        for (name, table) in tables {
            ctx.register_table(name, table).unwrap();
        }
    }
}

/// Runs `sql` with the GPU rule and without it and asserts the same rows;
/// returns the GPU plan (with its metrics) and the rows.
async fn check(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
) -> (Arc<dyn ExecutionPlan>, usize) {
    let (gpu_rows, gpu_joins, plan) = run(gpu, sql).await;
    let (cpu_rows, _, _) = run(cpu, sql).await;
    assert!(gpu_joins >= 2, "{sql}: {gpu_joins} GPU joins");
    let rows = int64_rows(&gpu_rows);
    assert_eq!(rows, int64_rows(&cpu_rows), "{sql}");
    (plan, rows.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joins_output_is_probed_on_the_device_by_the_join_above() {
    let Some(_) = require_gpu("a_joins_output_is_probed_on_the_device_by_the_join_above") else {
        return;
    };
    for mode in JoinMode::ALL {
        for (sql, extra) in [
            (CHAIN_GROUPED, &[][..]),
            (CHAIN, &[ORDER_FREE][..]),
            (
                CHAIN,
                &[
                    ORDER_FREE,
                    "SET gpu.tuning.probe_chunk_rows = 777",
                    "SET gpu.max_output_pairs = 5000",
                ][..],
            ),
        ] {
            let gpu = gpu_context(mode, 4, extra).await;
            let cpu = cpu_context(mode, 4, extra).await;
            register([&gpu, &cpu], false, None);
            let (plan, rows) = check(&gpu, &cpu, sql).await;
            assert!(rows > 10_000, "{mode:?} {extra:?}: {rows} rows");
            if mode == JoinMode::CollectLeft {
                let kept = plan_metric(&plan, "output_rows_kept_on_device");
                let probed = plan_metric(&plan, "probe_rows_from_device");
                assert!(
                    kept > 0,
                    "{mode:?} {extra:?}: no rows kept on the device\n{}",
                    with_metrics(&plan)
                );
                assert_eq!(kept, probed, "{mode:?} {extra:?}");
                assert_eq!(plan_metric(&plan, "probe_rows_copied_down"), 0, "{mode:?}");
            }
            // Turned off, the same rows go through the host.
            gpu.sql("SET gpu.tuning.device_rows_between_joins = false")
                .await
                .unwrap();
            let (plan, _) = check(&gpu, &cpu, sql).await;
            assert_eq!(
                plan_metric(&plan, "output_rows_kept_on_device"),
                0,
                "{mode:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_the_join_above_cannot_probe_in_place_are_copied_down() {
    let Some(_) = require_gpu("rows_the_join_above_cannot_probe_in_place_are_copied_down") else {
        return;
    };
    // A 4-byte key is coded, not read in place: the rows kept on the
    // device come down and are joined as host batches.
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &[ORDER_FREE]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
    register([&gpu, &cpu], true, None);
    let (plan, rows) = check(&gpu, &cpu, CHAIN).await;
    assert!(rows > 10_000);
    let kept = plan_metric(&plan, "output_rows_kept_on_device");
    assert!(
        kept > 0,
        "no rows kept on the device\n{}",
        with_metrics(&plan)
    );
    assert_eq!(plan_metric(&plan, "probe_rows_copied_down"), kept);
    assert_eq!(plan_metric(&plan, "probe_rows_from_device"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_with_nulls_empty_sides_and_aggregates_above_match_datafusion() {
    let Some(_) =
        require_gpu("output_with_nulls_empty_sides_and_aggregates_above_match_datafusion")
    else {
        return;
    };
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &[ORDER_FREE]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
    // A value column with NULLs is taken on the host: its rows come as
    // host batches.
    register([&gpu, &cpu], false, Some(7));
    let (plan, _) = check(&gpu, &cpu, CHAIN).await;
    assert_eq!(plan_metric(&plan, "output_rows_kept_on_device"), 0);
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &[ORDER_FREE]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
    register([&gpu, &cpu], false, None);
    for sql in [
        // No build row below, and none above.
        "SELECT a.x, b.y FROM c JOIN b ON c.k2 = b.k2 JOIN a ON a.k1 = b.k1 WHERE c.z < -1",
        "SELECT a.x, b.y FROM c JOIN b ON c.k2 = b.k2 JOIN a ON a.k1 = b.k1 WHERE a.x < -1",
        // An aggregation above the chain, on the CPU.
        "SELECT b.k2, count(*), sum(a.x) FROM c JOIN b ON c.k2 = b.k2 \
         JOIN a ON a.k1 = b.k1 GROUP BY b.k2",
    ] {
        check(&gpu, &cpu, sql).await;
    }
}

/// How far the decimals of [`register_decimals`] reach.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reach {
    /// Up to 9 digits, both signs: every value fits 32 bits.
    Within32,
    /// Up to 15 digits, both signs, and the bounds of 64 bits.
    Within64,
    /// As `Within64`, the first row of each table 30 digits instead.
    Past64,
}

/// Registers a (k1, x), b (k1, k2, y) and c (k2, z) with the keys of
/// [`register`] and `Decimal128(38, 2)` values as far as `reach`.
fn register_decimals(ctxs: [&SessionContext; 2], reach: Reach) {
    let money = |i: usize| -> i128 {
        match (i, reach) {
            (_, Reach::Within32) => (i as i128 * 0x9E37_79B9) % 10i128.pow(9) * 2 - 10i128.pow(9),
            (0, Reach::Past64) => 10i128.pow(30) + 7,
            (1, _) => i64::MAX.into(),
            (2, _) => i64::MIN.into(),
            _ => (i as i128 * 0x9E37_79B9) % 10i128.pow(15) - 5 * 10i128.pow(14),
        }
    };
    let table = |keys: &[(&str, &[Option<i64>])], value: &str| {
        let mut fields: Vec<Field> = keys
            .iter()
            .map(|(name, _)| Field::new(*name, DataType::Int64, true))
            .collect();
        fields.push(Field::new(value, DataType::Decimal128(38, 2), false));
        let schema = Arc::new(Schema::new(fields));
        table_from_columns(Arc::clone(&schema), keys[0].1.len(), 3, 1000, |range| {
            let mut out: Vec<ArrayRef> = keys
                .iter()
                .map(|(_, column)| -> ArrayRef {
                    Arc::new(Int64Array::from(column[range.clone()].to_vec()))
                })
                .collect();
            let values = Decimal128Array::from_iter_values(range.map(money));
            out.push(Arc::new(values.with_precision_and_scale(38, 2).unwrap()));
            out
        })
    };
    let a = gen_keys(2_000, Keys::Permutation, 0.0, 1);
    let b1 = gen_keys(60_000, Keys::Uniform { domain: 3_000 }, 0.0, 2);
    let b2 = gen_keys(60_000, Keys::Uniform { domain: 1_500 }, 0.0, 3);
    let c = gen_keys(1_200, Keys::Uniform { domain: 1_000 }, 0.0, 4);
    for ctx in ctxs {
        ctx.register_table("a", table(&[("k1", &a)], "x")).unwrap();
        ctx.register_table("b", table(&[("k1", &b1), ("k2", &b2)], "y"))
            .unwrap();
        ctx.register_table("c", table(&[("k2", &c)], "z")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decimals_cross_the_bus_in_four_or_eight_bytes_where_they_fit() {
    let Some(_) = require_gpu("decimals_cross_the_bus_in_four_or_eight_bytes_where_they_fit")
    else {
        return;
    };
    // The same joins over decimals that fit 32 bits, 64 bits, and over
    // decimals one of which per table does not fit 64: the answers are
    // DataFusion's each time, the rows are handed on on the device each
    // time, and each sends at least 4 (then 8) bytes fewer per build row
    // than the next (a's 2,000 and c's 1,200, each side copied whole: 4
    // bytes a value, 8, or 16 for a column with a value past 64 bits).
    let reaches = [Reach::Within32, Reach::Within64, Reach::Past64];
    let mut sent = Vec::new();
    for reach in reaches {
        let gpu = gpu_context(JoinMode::CollectLeft, 4, &[ORDER_FREE]).await;
        let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
        register_decimals([&gpu, &cpu], reach);
        let (gpu_rows, gpu_joins, plan) = run(&gpu, CHAIN).await;
        let (cpu_rows, _, _) = run(&cpu, CHAIN).await;
        assert!(gpu_joins >= 2, "{gpu_joins} GPU joins");
        let rows = string_rows(&gpu_rows);
        assert!(rows.len() > 10_000, "{} rows", rows.len());
        assert_eq!(rows, string_rows(&cpu_rows), "{reach:?}");
        assert!(
            plan_metric(&plan, "output_rows_kept_on_device") > 0,
            "{reach:?}: no rows kept on the device\n{}",
            with_metrics(&plan)
        );
        assert_eq!(plan_metric(&plan, "probe_rows_copied_down"), 0);
        sent.push(plan_metric(&plan, "h2d_bytes"));
    }
    assert!(
        sent[1] >= sent[0] + 4 * (2_000 + 1_200) && sent[2] >= sent[1] + 8 * (2_000 + 1_200),
        "bytes up within 32 bits, 64 bits, past them: {sent:?}"
    );
    // The sort-merge join gathers the same way: the same answers.
    let sort_merge = ["SET datafusion.optimizer.prefer_hash_join = false"];
    for reach in reaches {
        let gpu = gpu_context(JoinMode::Partitioned, 4, &sort_merge).await;
        let cpu = cpu_context(JoinMode::Partitioned, 4, &sort_merge).await;
        register_decimals([&gpu, &cpu], reach);
        let (gpu_rows, _, plan) = run_counting(&gpu, CHAIN, "SortMergeJoinExec").await;
        let (cpu_rows, _, _) = run(&cpu, CHAIN).await;
        assert_eq!(
            string_rows(&gpu_rows),
            string_rows(&cpu_rows),
            "sort-merge, {reach:?}"
        );
        assert!(
            node_metric::<datafusion_gpu::GpuSortMergeJoinExec>(&plan, "h2d_bytes") > 0,
            "no sort-merge join ran on the GPU\n{}",
            with_metrics(&plan)
        );
    }
}
