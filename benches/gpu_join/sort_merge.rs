//! `--sort-merge`: the sort-merge join end to end, DataFusion's
//! `SortMergeJoinExec` (with its `SortExec`s, on all cores) against
//! `GpuSortMergeJoinExec`, on the join benchmark's tables: R a shuffled
//! primary key 0..2^n, S 2^n uniform foreign keys, both with an Int64
//! payload, `prefer_hash_join = false`. Twice: with unsorted inputs, and
//! with each `MemTable` partition sorted on `k` and declared so, and
//! `prefer_existing_sort = true` (DataFusion then keeps the order through its
//! hash repartition, merging the sorted streams, and plans no sort; the GPU
//! join merges without sorting). Then `ORDER BY` the key of a join
//! DataFusion plans as a hash join (`prefer_hash_join` as by default), every
//! row collected: `HashJoinExec` and a `SortExec` against the GPU sort-merge
//! join planned in their place, and against the GPU hash join with the CPU
//! sort (`gpu.tuning.sort_merge_join_for_order = false`); `--no-order-by` skips
//! that last part.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{col, SortExpr};
use datafusion::physical_plan::displayable;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::gpu::{gpu_runtime, measure_copy_bandwidth};
use datafusion_gpu::gpu_session_context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::{median, operator_metric, run_once};

/// `keys` in `partitions` partitions of 8192-row batches, each partition
/// sorted on `k` (and declared so) when `sorted`.
fn table(keys: &[i64], salt: i64, partitions: usize, sorted: bool) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let per = keys.len().div_ceil(partitions).max(1);
    let parts = keys
        .chunks(per)
        .map(|chunk| {
            let mut chunk = chunk.to_vec();
            if sorted {
                chunk.sort_unstable();
            }
            chunk
                .chunks(8192)
                .map(|ks| {
                    let v = Int64Array::from_iter_values(
                        ks.iter().map(|k| (k * 31 + salt) % 1_000_003),
                    );
                    RecordBatch::try_new(
                        Arc::clone(&schema),
                        vec![
                            Arc::new(Int64Array::from(ks.to_vec())) as ArrayRef,
                            Arc::new(v),
                        ],
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect();
    let table = MemTable::try_new(schema, parts).unwrap();
    Arc::new(if sorted {
        table.with_sort_order(vec![vec![SortExpr::new(col("k"), true, true)]])
    } else {
        table
    })
}

/// The median of `runs` runs after a warm-up, the answer, the last run's
/// plan, and its GPU join's metrics; with `--explain-analyze`, the last
/// run's plan is printed with every node's metrics under `label`.
async fn timed(
    ctx: &SessionContext,
    runs: usize,
    label: &str,
) -> (Duration, Vec<i64>, String, String) {
    let (_, answer, _) = run_once(ctx).await; // warm-up
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let (t, a, plan) = run_once(ctx).await;
        assert_eq!(a, answer, "answers differ between runs");
        times.push(t);
        last = Some(plan);
    }
    let plan = last.expect("one run");
    if std::env::args().any(|a| a == "--explain-analyze") {
        super::print_metrics(label, &plan);
    }
    let text = displayable(plan.as_ref()).indent(true).to_string();
    // The GPU join's last run, summed over its partitions (which overlap).
    let ms = |name: &str| operator_metric(&plan, "GpuSortMergeJoinExec", name).1 as f64 / 1e6;
    let breakdown = format!(
        "collect_ms={:.1} encode_ms={:.1} device_wall_ms={:.1} kernel_ms={:.1} transfer_ms={:.1} emit_ms={:.1} memory_wait_ms={:.1} admission_wait_ms={:.1} staging_ms={:.1} h2d_bytes={} h2d_direct_bytes={} d2h_bytes={} rows_aggregated_on_device={}",
        ms("collect_time"),
        ms("encode_time"),
        ms("device_wall_time"),
        ms("kernel_time"),
        ms("transfer_time"),
        ms("emit_time"),
        ms("device_memory_wait"),
        ms("device_admission_wait"),
        ms("staging_time"),
        operator_metric(&plan, "GpuSortMergeJoinExec", "h2d_bytes").1,
        operator_metric(&plan, "GpuSortMergeJoinExec", "h2d_direct_bytes").1,
        operator_metric(&plan, "GpuSortMergeJoinExec", "d2h_bytes").1,
        operator_metric(&plan, "GpuSortMergeJoinExec", "rows_aggregated_on_device").1,
    );
    (median(&mut times), answer, text, breakdown)
}

/// `--set KEY=VALUE` arguments, as `KEY = VALUE`: options for the GPU
/// path's runs only (e.g. `gpu.max_concurrent_tasks=16`).
pub(crate) fn gpu_settings() -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .filter(|pair| pair[0] == "--set")
        .filter_map(|pair| pair[1].split_once('='))
        .map(|(key, value)| format!("{key} = {value}"))
        .collect()
}

/// Runs both input layouts at 2^`log2` rows a side.
pub async fn benchmark(log2: usize, runs: usize) {
    let rows = 1usize << log2;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rng = StdRng::seed_from_u64(42);
    let mut r_keys: Vec<i64> = (0..rows as i64).collect();
    r_keys.shuffle(&mut rng);
    let s_keys: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(0..rows as i64))
        .collect();
    println!("sort-merge join benchmark: |R| = |S| = 2^{log2} Int64 rows, {cores} cores, {runs} timed runs per path, GPU settings {:?}", gpu_settings());
    let gpu_available = gpu_runtime().is_ok();
    if let Ok(runtime) = gpu_runtime() {
        // The bytes the GPU join must move: 8-byte codes of both sides in,
        // one (position, row id) pair of 8-byte words per output row out
        // (2^n rows: every S key matches one R key), and the sorted side's
        // row ids back; with the aggregation computed in the join, the four
        // columns the query reads in and nothing back.
        let bandwidth = measure_copy_bandwidth(&runtime.devices()[0], 1 << 30, 5).unwrap();
        let floor = 16.0 * rows as f64 / bandwidth.host_to_device
            + 24.0 * rows as f64 / bandwidth.device_to_host;
        let columns_floor = 32.0 * rows as f64 / bandwidth.host_to_device;
        println!(
            "pinned copy bandwidth: {:.1} GB/s to device, {:.1} GB/s back; floor for 2^{log2} x 2^{log2}: {:.1} ms (codes in, pairs out), {:.1} ms (columns in)",
            bandwidth.host_to_device / 1e9,
            bandwidth.device_to_host / 1e9,
            floor * 1e3,
            columns_floor * 1e3
        );
    }
    for sorted in [false, true] {
        let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(cores));
        let (r_table, s_table) = (
            table(&r_keys, 1, cores, sorted),
            table(&s_keys, 2, cores, sorted),
        );
        ctx.register_table("r", Arc::clone(&r_table) as _).unwrap();
        ctx.register_table("s", Arc::clone(&s_table) as _).unwrap();
        let keep_order = format!("SET datafusion.optimizer.prefer_existing_sort = {sorted}");
        for statement in [
            "SET datafusion.optimizer.prefer_hash_join = false",
            keep_order.as_str(),
            "SET gpu.placement = 'always'",
            // The final aggregation stays DataFusion's on both paths; the
            // partial one is computed in the GPU join from its pairs
            // (`gpu.tuning.aggregate_in_join`, `--set gpu.tuning.aggregate_in_join=false`
            // to leave it to DataFusion too).
            "SET gpu.aggregate = false",
            "SET gpu.enabled = false",
        ] {
            ctx.sql(statement).await.unwrap();
        }
        let layout = if sorted { "presorted" } else { "unsorted" };
        let (cpu, cpu_answer, cpu_plan, _) = timed(&ctx, runs, &format!("{layout} CPU")).await;
        println!("{layout}: CPU plan\n{cpu_plan}");
        if !gpu_available {
            println!(
                "{layout}: CPU {:.1} ms; GPU not measured (no GPU)",
                cpu.as_secs_f64() * 1e3
            );
            continue;
        }
        ctx.sql("SET gpu.enabled = true").await.unwrap();
        for setting in gpu_settings() {
            ctx.sql(&format!("SET {setting}")).await.unwrap();
        }
        let (gpu, gpu_answer, gpu_plan, breakdown) =
            timed(&ctx, runs, &format!("{layout} GPU")).await;
        println!("{layout}: GPU plan\n{gpu_plan}");
        assert_eq!(gpu_answer, cpu_answer, "GPU answer differs from the CPU's");
        assert!(
            gpu_plan.contains("GpuSortMergeJoinExec"),
            "the GPU join did not run"
        );
        println!(
            "RESULT_SMJ layout={layout} log2_rows={log2} cpu_ms={:.1} gpu_ms={:.1} speedup={:.2} answer={cpu_answer:?}",
            cpu.as_secs_f64() * 1e3,
            gpu.as_secs_f64() * 1e3,
            cpu.as_secs_f64() / gpu.as_secs_f64(),
        );
        println!("  GPU join, last run, summed over partitions: {breakdown}");
        // --pinned: both tables copied into pinned host memory
        // (pin_batches), both paths timed again over them.
        if std::env::args().any(|a| a == "--pinned") {
            let (r_pinned, r_pin) = super::pinned_copy(&r_table).await;
            let (s_pinned, s_pin) = super::pinned_copy(&s_table).await;
            for (name, table) in [("r", r_pinned), ("s", s_pinned)] {
                ctx.deregister_table(name).unwrap();
                ctx.register_table(name, table).unwrap();
            }
            ctx.sql("SET gpu.enabled = false").await.unwrap();
            let (cpu, cpu_pinned_answer, _, _) =
                timed(&ctx, runs, &format!("{layout} CPU, pinned")).await;
            assert_eq!(
                cpu_pinned_answer, cpu_answer,
                "pinned tables changed the answer"
            );
            ctx.sql("SET gpu.enabled = true").await.unwrap();
            let (gpu, gpu_answer, gpu_plan, breakdown) =
                timed(&ctx, runs, &format!("{layout} GPU, pinned")).await;
            assert_eq!(gpu_answer, cpu_answer, "GPU answer differs from the CPU's");
            assert!(
                gpu_plan.contains("GpuSortMergeJoinExec"),
                "the GPU join did not run"
            );
            println!(
                "RESULT_SMJ_PINNED layout={layout} log2_rows={log2} pin_ms={:.1} cpu_ms={:.1} gpu_ms={:.1} speedup={:.2}",
                (r_pin + s_pin).as_secs_f64() * 1e3,
                cpu.as_secs_f64() * 1e3,
                gpu.as_secs_f64() * 1e3,
                cpu.as_secs_f64() / gpu.as_secs_f64(),
            );
            println!("  GPU join over pinned tables, last run: {breakdown}");
        }
    }
    if gpu_available && !std::env::args().any(|a| a == "--no-order-by") {
        order_by(&r_keys, &s_keys, log2, runs, cores).await;
    }
}

/// The query of a hash join sorted on its key (`ORDER BY` the join key),
/// every row collected: DataFusion's `HashJoinExec` and `SortExec` against
/// the GPU sort-merge join planned in their place
/// (`gpu.tuning.sort_merge_join_for_order`).
const ORDER_BY_SQL: &str = "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k";

/// Row count, sums of both columns, and whether the keys ascend.
fn ordered_checksum(batches: &[RecordBatch]) -> (usize, i64, i64, bool) {
    let (mut rows, mut k_sum, mut v_sum, mut ascending, mut last) = (0, 0i64, 0i64, true, i64::MIN);
    for batch in batches {
        let k = batch.column(0).as_primitive::<Int64Type>();
        let v = batch.column(1).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            ascending &= k.value(i) >= last;
            last = k.value(i);
            k_sum = k_sum.wrapping_add(k.value(i));
            v_sum = v_sum.wrapping_add(v.value(i));
        }
        rows += batch.num_rows();
    }
    (rows, k_sum, v_sum, ascending)
}

async fn timed_collect(
    ctx: &SessionContext,
    runs: usize,
) -> (Duration, (usize, i64, i64, bool), String) {
    let run = || async {
        let start = std::time::Instant::now();
        let df = ctx.sql(ORDER_BY_SQL).await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
            .await
            .unwrap();
        let elapsed = start.elapsed();
        let text = displayable(plan.as_ref()).indent(true).to_string();
        (elapsed, ordered_checksum(&batches), text)
    };
    let (_, answer, _) = run().await; // warm-up
    let mut times = Vec::new();
    let mut text = String::new();
    for _ in 0..runs {
        let (t, a, plan) = run().await;
        assert_eq!(a, answer, "answers differ between runs");
        times.push(t);
        text = plan;
    }
    (median(&mut times), answer, text)
}

async fn order_by(r_keys: &[i64], s_keys: &[i64], log2: usize, runs: usize, cores: usize) {
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(cores));
    ctx.register_table("r", table(r_keys, 1, cores, false))
        .unwrap();
    ctx.register_table("s", table(s_keys, 2, cores, false))
        .unwrap();
    for statement in ["SET gpu.placement = 'always'", "SET gpu.enabled = false"] {
        ctx.sql(statement).await.unwrap();
    }
    let (cpu, cpu_answer, cpu_plan) = timed_collect(&ctx, runs).await;
    println!("order-by: CPU plan\n{cpu_plan}");
    ctx.sql("SET gpu.enabled = true").await.unwrap();
    ctx.sql("SET gpu.tuning.sort_merge_join_for_order = true")
        .await
        .unwrap();
    let (gpu, gpu_answer, gpu_plan) = timed_collect(&ctx, runs).await;
    println!("order-by: GPU plan\n{gpu_plan}");
    assert_eq!(gpu_answer, cpu_answer, "GPU answer differs from the CPU's");
    assert!(cpu_answer.3, "the CPU's rows are not in key order");
    assert!(
        gpu_plan.contains("in_place_of=HashJoinExec"),
        "no sort-merge join in place of the hash join"
    );
    ctx.sql("SET gpu.tuning.sort_merge_join_for_order = false")
        .await
        .unwrap();
    let (hash, hash_answer, _) = timed_collect(&ctx, runs).await;
    assert_eq!(
        hash_answer, cpu_answer,
        "GPU hash join answer differs from the CPU's"
    );
    println!(
        "RESULT_SMJ layout=order-by log2_rows={log2} cpu_ms={:.1} gpu_ms={:.1} speedup={:.2} gpu_hash_join_and_cpu_sort_ms={:.1} rows={}",
        cpu.as_secs_f64() * 1e3,
        gpu.as_secs_f64() * 1e3,
        cpu.as_secs_f64() / gpu.as_secs_f64(),
        hash.as_secs_f64() * 1e3,
        cpu_answer.0,
    );
}
