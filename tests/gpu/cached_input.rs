//! A `GpuAggregateExec` over a whole table scan reads the table's columns
//! from the device column cache on the device (`input=column_cache`),
//! against DataFusion: integer, date and decimal keys and values, 4-byte
//! and 8-byte cached words in one column (parts that fit 32 bits and parts
//! that do not), negative values, skewed and unique keys, `HAVING`, from
//! `MemTable`s and Parquet files, cold and warm; and where a run cannot
//! read the cache so (NULLs, an empty table, a device budget too small for
//! the table, the cache off), the node reads its input as before and says
//! why.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::{ParquetReadOptions, SessionContext};

use crate::scan_aggregate::temp_dir;
use crate::support::{
    alone_on_the_device, cpu_context, gpu_context, physical_plan, plan_metric, require_gpu,
    same_rows_as_datafusion, table_from_columns, JoinMode,
};

fn schema(nullable: bool) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("n", DataType::Int32, nullable),
        Field::new("i", DataType::Int64, false),
        Field::new("d", DataType::Decimal128(15, 2), false),
        Field::new("f", DataType::Float64, false),
        Field::new("dt", DataType::Date32, false),
    ]))
}

/// `rows` rows: `k` skewed (a third of the rows on key 7) among `keys`
/// keys, negative and positive; `i` within 32 bits in rows below `wide_from`
/// and beyond them from there; `n` NULL in every 13th row where `nulls`.
fn columns(
    keys: i64,
    wide_from: usize,
    nulls: bool,
) -> impl Fn(std::ops::Range<usize>) -> Vec<ArrayRef> {
    move |rows| {
        let mix = |r: usize| (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17;
        let k = rows.clone().map(|r| match r % 3 {
            0 => 7,
            _ => (mix(r) as i64 % keys) - keys / 2,
        });
        let n = rows
            .clone()
            .map(|r| (!(nulls && r % 13 == 0)).then_some((mix(r) % 2001) as i32 - 1000));
        let i = rows.clone().map(|r| {
            let small = (mix(r + 5) % 100_000) as i64 - 50_000;
            if r >= wide_from {
                small * 1_000_000_007
            } else {
                small
            }
        });
        let d = rows
            .clone()
            .map(|r| (mix(r + 9) % 10_000_000) as i128 - 5_000_000);
        let f = rows
            .clone()
            .map(|r| (mix(r + 3) % 1000) as f64 / 8.0 - 60.0);
        let dt = rows.clone().map(|r| 8000 + (mix(r + 1) % 2500) as i32);
        vec![
            Arc::new(Int64Array::from_iter_values(k)) as ArrayRef,
            Arc::new(Int32Array::from_iter(n)),
            Arc::new(Int64Array::from_iter_values(i)),
            Arc::new(
                Decimal128Array::from_iter_values(d)
                    .with_precision_and_scale(15, 2)
                    .unwrap(),
            ),
            Arc::new(Float64Array::from_iter_values(f)),
            Arc::new(Date32Array::from_iter_values(dt)),
        ]
    }
}

fn table(rows: usize, keys: i64, wide_from: usize, nulls: bool) -> Arc<MemTable> {
    table_from_columns(
        schema(nulls),
        rows,
        4,
        4096,
        columns(keys, wide_from, nulls),
    )
}

/// The sessions: one GPU aggregation over all of a scan's partitions (the
/// default), no scan aggregation (so the aggregation over the scan is the
/// node's own).
async fn contexts(extra: &[&str]) -> (SessionContext, SessionContext) {
    let mut settings = vec!["SET gpu.tuning.scan_aggregate = false"];
    settings.extend_from_slice(extra);
    (
        gpu_context(JoinMode::Partitioned, 4, &settings).await,
        cpu_context(JoinMode::Partitioned, 4, &[]).await,
    )
}

const QUERIES: &[&str] = &[
    "SELECT k, count(*), sum(i), sum(d), avg(d), min(i), max(i), sum(f), sum(n), count(n) \
     FROM t GROUP BY k",
    "SELECT k, sum(d) AS total FROM t GROUP BY k HAVING sum(d) > 100000.00",
    "SELECT dt, count(*), max(k), min(dt) FROM t GROUP BY dt",
    "SELECT i, count(*) FROM t GROUP BY i",
];

/// Runs `sql` on both sessions, asserts the same rows, and returns the GPU
/// plan after its run.
async fn check(gpu: &SessionContext, cpu: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    let plan = physical_plan(gpu, sql).await;
    assert!(
        displayable(plan.as_ref())
            .indent(true)
            .to_string()
            .contains("input=column_cache"),
        "{sql}: the aggregation does not read the cache\n{}",
        displayable(plan.as_ref()).indent(true)
    );
    same_rows_as_datafusion(gpu, cpu, sql, &plan).await;
    plan
}

fn shown_with_metrics(plan: &Arc<dyn ExecutionPlan>) -> String {
    DisplayableExecutionPlan::with_metrics(plan.as_ref())
        .indent(true)
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregations_over_a_whole_table_read_its_cached_columns_on_the_device() {
    let Some(_) =
        require_gpu("aggregations_over_a_whole_table_read_its_cached_columns_on_the_device")
    else {
        return;
    };
    let (gpu, cpu) = contexts(&[]).await;
    // One row; few keys in 4-byte words; many keys, the last partition's
    // `i` in 8-byte words; nearly every key unique.
    for (rows, keys, wide_from) in [
        (1, 5, usize::MAX),
        (3000, 5, usize::MAX),
        (200_000, 1000, 150_001),
        (300_000, 1 << 40, 0),
    ] {
        let t = table(rows, keys, wide_from, false);
        for ctx in [&gpu, &cpu] {
            let _ = ctx.deregister_table("t");
            ctx.register_table("t", Arc::clone(&t) as _).unwrap();
        }
        for sql in QUERIES {
            // Cold (the table's columns read into the cache), then warm.
            for run in ["cold", "warm"] {
                let plan = check(&gpu, &cpu, sql).await;
                let shown = shown_with_metrics(&plan);
                assert_eq!(
                    plan_metric(&plan, "cached_input_partitions"),
                    1,
                    "{sql} ({rows} rows, {run})\n{shown}"
                );
                assert_eq!(
                    plan_metric(&plan, "cpu_fallback_partitions"),
                    0,
                    "{sql}\n{shown}"
                );
                // The `HAVING`'s comparison drops groups on the device,
                // before they come back (most of them at many keys).
                if sql.contains("HAVING") && rows >= 200_000 {
                    let dropped = plan_metric(&plan, "groups_dropped_on_device");
                    assert!(dropped > 0, "{sql} ({rows} rows)\n{shown}");
                }
                // Tests beside this one evict entries (a small share's
                // inserts evict down to that share), so what must hit is
                // checked where this test has the device to itself.
                if run == "warm" && alone_on_the_device() {
                    assert_eq!(plan_metric(&plan, "cache_misses"), 0, "{sql}\n{shown}");
                    assert!(plan_metric(&plan, "cache_hits") > 0, "{sql}\n{shown}");
                }
            }
        }
    }
    // The same rows from Parquet files, one a partition.
    let dir = temp_dir("cached-input");
    let t = table(120_000, 700, 90_001, false);
    let partitions =
        datafusion::catalog::TableProvider::scan(t.as_ref(), &gpu.state(), None, &[], None)
            .await
            .unwrap();
    let batches = datafusion::physical_plan::collect(partitions, gpu.task_ctx())
        .await
        .unwrap();
    for (p, batch) in batches.chunks(batches.len().div_ceil(3)).enumerate() {
        let file = std::fs::File::create(dir.join(format!("p{p}.parquet"))).unwrap();
        let mut writer =
            datafusion::parquet::arrow::ArrowWriter::try_new(file, schema(false), None).unwrap();
        for batch in batch {
            writer.write(batch).unwrap();
        }
        writer.close().unwrap();
    }
    for ctx in [&gpu, &cpu] {
        let _ = ctx.deregister_table("t");
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    for sql in QUERIES {
        for _ in 0..2 {
            let plan = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cached_input_partitions"), 1, "{sql}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_aggregation_that_cannot_read_the_cache_reads_its_input_and_says_why() {
    let Some(_) =
        require_gpu("an_aggregation_that_cannot_read_the_cache_reads_its_input_and_says_why")
    else {
        return;
    };
    let (gpu, cpu) = contexts(&[]).await;
    let sql = "SELECT k, count(*), sum(n), max(i) FROM t GROUP BY k";
    // NULLs in `n`: the whole table is read from the input, on the GPU.
    for (rows, reason) in [(50_000, "column n has NULLs"), (0, "")] {
        let t = table(rows, 300, usize::MAX, true);
        for ctx in [&gpu, &cpu] {
            let _ = ctx.deregister_table("t");
            ctx.register_table("t", Arc::clone(&t) as _).unwrap();
        }
        let plan = check(&gpu, &cpu, sql).await;
        let shown = shown_with_metrics(&plan);
        assert_eq!(plan_metric(&plan, "cached_input_partitions"), 0, "{shown}");
        // (An empty table's parts may be refused before its rows are
        // counted: the reason is not pinned.)
        assert!(
            shown.contains(&format!("cached_input_refusals=[1: {reason}")),
            "{shown}"
        );
        if rows > 0 {
            assert_eq!(plan_metric(&plan, "input_rows"), rows, "{shown}");
            assert_eq!(plan_metric(&plan, "cpu_fallback_partitions"), 0, "{shown}");
        }
    }
    // A device budget too small for the table's rows: the cache is neither
    // read nor filled, and the input goes the way it would without it.
    let (gpu, cpu) = contexts(&["SET gpu.memory_fraction = 0.000000001"]).await;
    let t = table(20_000, 300, usize::MAX, false);
    for ctx in [&gpu, &cpu] {
        ctx.register_table("t", Arc::clone(&t) as _).unwrap();
    }
    let plan = check(&gpu, &cpu, sql).await;
    let shown = shown_with_metrics(&plan);
    assert_eq!(plan_metric(&plan, "cached_input_partitions"), 0, "{shown}");
    assert_eq!(plan_metric(&plan, "cache_misses"), 0, "{shown}");
    assert!(shown.contains("more than the budget's"), "{shown}");
    // With the cache off the plan does not read it.
    let (gpu, cpu) = contexts(&["SET gpu.cache = false"]).await;
    let t = table(20_000, 300, usize::MAX, false);
    for ctx in [&gpu, &cpu] {
        ctx.register_table("t", Arc::clone(&t) as _).unwrap();
    }
    let plan = physical_plan(&gpu, sql).await;
    let shown = displayable(plan.as_ref()).indent(true).to_string();
    assert!(
        shown.contains("GpuAggregateExec") && !shown.contains("input=column_cache"),
        "{shown}"
    );
    same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
    assert_eq!(plan_metric(&plan, "cached_input_partitions"), 0);
}
