//! The group-by benchmark (seed 002's B10/B12 workload), `--group-by`:
//! `SELECT k, max(a), max(b) FROM r GROUP BY k` over 2^n rows with keys
//! uniform over g groups (or Zipf with `--zipf s`), for each g of
//! `--log2-groups` (a comma-separated list), on DataFusion's CPU
//! aggregation (all cores) and on the GPU aggregation, in one process,
//! answers checked by an order-independent checksum of every output row.
//! The GPU path runs as one GPU aggregation over all input partitions
//! (`gpu.tuning.aggregate_single_phase`, the default); `--two-phase` also times it
//! in DataFusion's two phases, both on the GPU; `--partitioned` also times
//! it with the groups numbered in hash partitions
//! (`gpu.tuning.min_groups_to_partition = 0`, seed 002's PGB) where the default
//! numbers them in one hash table; `--pinned` copies the table into pinned
//! host memory (`pin_batches`) and times both paths again over it.
//! `--string-keys` makes the keys Utf8 strings (`key-<n>`), which the GPU
//! path groups by a 64-bit hash and checks on the host. `--order-by-key`
//! adds `ORDER BY k`: DataFusion sorts the groups after aggregating them,
//! the GPU aggregation numbers them by sorting the keys on the device and
//! emits them in order (`algorithm=sort_group_by`); the output's order is
//! checked too.
//! The floor is the pinned PCIe time of the bytes the GPU path moves in
//! (one 8-byte word per key, or key hash, and per value).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::gpu::{gpu_runtime, measure_copy_bandwidth};
use datafusion_gpu::gpu_session_context;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::median;

const SQL: &str = "SELECT k, max(a), max(b) FROM r GROUP BY k";
const SQL_ORDERED: &str = "SELECT k, max(a), max(b) FROM r GROUP BY k ORDER BY k";

fn order_by_key() -> bool {
    std::env::args().any(|a| a == "--order-by-key")
}

fn sql() -> &'static str {
    if order_by_key() {
        SQL_ORDERED
    } else {
        SQL
    }
}

fn explain_analyze() -> bool {
    std::env::args().any(|a| a == "--explain-analyze")
}

fn string_keys() -> bool {
    std::env::args().any(|a| a == "--string-keys")
}

fn table(rows: usize, groups: u64, zipf: f64, partitions: usize) -> Arc<MemTable> {
    let key_type = if string_keys() {
        DataType::Utf8
    } else {
        DataType::Int64
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", key_type, false),
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Int64, false),
    ]));
    let per = rows.div_ceil(partitions);
    let parts = (0..partitions)
        .map(|p| {
            let mut rng = StdRng::seed_from_u64(p as u64);
            let zipf = (zipf > 0.0)
                .then(|| rand_distr::Zipf::new(groups as f64, zipf).expect("Zipf parameters"));
            let start = (p * per).min(rows);
            let end = ((p + 1) * per).min(rows);
            (start..end)
                .step_by(8192)
                .map(|first| {
                    let len = 8192.min(end - first);
                    let keys: Vec<i64> = (0..len)
                        .map(|_| match zipf {
                            Some(z) => rng.sample(z) as i64 - 1,
                            None => rng.random_range(0..groups) as i64,
                        })
                        .collect();
                    let k: ArrayRef = if string_keys() {
                        Arc::new(StringArray::from_iter_values(
                            keys.iter().map(|k| format!("key-{k}")),
                        ))
                    } else {
                        Arc::new(Int64Array::from(keys))
                    };
                    let a = Int64Array::from_iter_values((0..len).map(|_| rng.random::<i64>()));
                    let b = Int64Array::from_iter_values((0..len).map(|_| rng.random::<i64>()));
                    RecordBatch::try_new(Arc::clone(&schema), vec![k, Arc::new(a), Arc::new(b)])
                        .unwrap()
                })
                .collect()
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

/// Wall time of planning, executing and collecting, and a checksum of the
/// output rows that does not depend on their order.
async fn run_once(ctx: &SessionContext) -> (Duration, (usize, u64), Arc<dyn ExecutionPlan>) {
    let start = Instant::now();
    datafusion_gpu::trace::event(|| "bench: query started".into());
    let plan = ctx
        .sql(sql())
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
        .await
        .unwrap();
    let elapsed = start.elapsed();
    datafusion_gpu::trace::event(|| format!("bench: {} batches collected", batches.len()));
    let mut rows = 0;
    let mut checksum = 0u64;
    let mut previous_key: Option<i64> = None;
    for batch in &batches {
        if order_by_key() && !string_keys() {
            for &key in batch.column(0).as_primitive::<Int64Type>().values().iter() {
                assert!(
                    previous_key.is_none_or(|p| p < key),
                    "groups out of key order"
                );
                previous_key = Some(key);
            }
        }
        let column = |i: usize| batch.column(i).as_primitive::<Int64Type>();
        let (a, b) = (column(1), column(2));
        let keys = batch.column(0);
        let key = |i: usize| -> u64 {
            match keys.as_string_opt::<i32>() {
                Some(strings) => strings
                    .value(i)
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, byte| {
                        (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
                    }),
                None => keys.as_primitive::<Int64Type>().value(i) as u64,
            }
        };
        for i in 0..batch.num_rows() {
            let row = key(i)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((a.value(i) as u64).rotate_left(17))
                .wrapping_add((b.value(i) as u64).rotate_left(41));
            checksum = checksum.wrapping_add(datafusion_gpu::ops::murmur3_finalizer(row));
        }
        rows += batch.num_rows();
    }
    (elapsed, (rows, checksum), plan)
}

/// The median time of three plannings of the query (SQL text to physical
/// plan), the part of a run's wall time before execution starts.
async fn planning_time(ctx: &SessionContext) -> Duration {
    let mut times = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        ctx.sql(sql())
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        times.push(start.elapsed());
    }
    median(&mut times)
}

/// The setting of `--pinned-ab gpu.KEY=A,B`, if given.
fn pinned_ab_setting() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2)
        .find(|pair| pair[0] == "--pinned-ab")
        .map(|pair| pair[1].clone())
}

/// Metric `name` summed over the plan's GPU aggregations.
fn gpu_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    super::operator_metric(plan, "GpuAggregateExec", name).1
}

/// The median of `runs` runs of the query (on the GPU or, with it switched
/// off, the CPU), each answer checked, and the last run's plan.
async fn time_gpu(
    ctx: &SessionContext,
    runs: usize,
    cpu_answer: (usize, u64),
) -> (Duration, Arc<dyn ExecutionPlan>) {
    super::timed_runs(runs, &cpu_answer, || run_once(ctx)).await
}

pub async fn benchmark(log2_rows: usize, log2_groups: &[u32], zipf: f64, runs: usize) {
    let rows = 1usize << log2_rows;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let runtime = gpu_runtime();
    println!(
        "group-by benchmark: 2^{log2_rows} rows (k {}, a, b Int64), {cores} cores, {runs} timed runs per path, keys {}, GPU settings {:?}",
        if string_keys() { "Utf8" } else { "Int64" },
        if zipf > 0.0 { format!("Zipf {zipf}") } else { "uniform".into() },
        super::sort_merge::gpu_settings()
    );
    println!("query: {}", sql());
    let bandwidth = match &runtime {
        Ok(runtime) => {
            println!("{}", runtime.describe());
            Some(measure_copy_bandwidth(&runtime.devices()[0], 1 << 30, 5).unwrap())
        }
        Err(reason) => {
            println!("GPU: not measured, {reason}");
            None
        }
    };
    for &log2_g in log2_groups {
        let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(cores));
        let r_table = table(rows, 1u64 << log2_g, zipf, cores);
        ctx.register_table("r", Arc::clone(&r_table) as _).unwrap();
        ctx.sql("SET gpu.enabled = false").await.unwrap();
        let (_, cpu_answer, _) = run_once(&ctx).await;
        let mut cpu_times = Vec::new();
        for _ in 0..runs {
            cpu_times.push(run_once(&ctx).await.0);
        }
        let cpu = median(&mut cpu_times);
        let cpu_plan_ms = planning_time(&ctx).await.as_secs_f64() * 1e3;
        let Some(bandwidth) = bandwidth else {
            println!(
                "RESULT_GROUP_BY log2_rows={log2_rows} log2_groups={log2_g} zipf={zipf} cpu_ms={:.1}",
                cpu.as_secs_f64() * 1e3
            );
            continue;
        };
        ctx.sql("SET gpu.enabled = true").await.unwrap();
        ctx.sql("SET gpu.placement = 'always'").await.unwrap();
        ctx.sql("SET gpu.hashed_group_keys = true").await.unwrap();
        // --set gpu.KEY=VALUE: options of the GPU path's runs.
        for setting in super::sort_merge::gpu_settings() {
            ctx.sql(&format!("SET {setting}")).await.unwrap();
        }
        let (cold, gpu_answer, _) = run_once(&ctx).await;
        assert_eq!(gpu_answer, cpu_answer, "GPU answer differs from the CPU's");
        let mut warm_times = Vec::new();
        let mut last_plan = None;
        for _ in 0..runs {
            let (t, answer, plan) = run_once(&ctx).await;
            assert_eq!(answer, cpu_answer, "GPU answer differs from the CPU's");
            warm_times.push(t);
            last_plan = Some(plan);
        }
        let warm = median(&mut warm_times);
        let plan = last_plan.expect("at least one run");
        // --two-phase: also time the GPU aggregation in DataFusion's two
        // phases (gpu.tuning.aggregate_single_phase = false).
        let mut variants = if std::env::args().any(|a| a == "--two-phase") {
            ctx.sql("SET gpu.tuning.aggregate_single_phase = false")
                .await
                .unwrap();
            let (time, two_phase_plan) = time_gpu(&ctx, runs, cpu_answer).await;
            if let Some(plan) = Some(two_phase_plan).filter(|_| explain_analyze()) {
                let shown =
                    datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                        plan.as_ref(),
                    )
                    .indent(true)
                    .to_string();
                println!("GPU two-phase plan with metrics (last run), 2^{log2_g} groups:\n{shown}");
            }
            ctx.sql("SET gpu.tuning.aggregate_single_phase = true")
                .await
                .unwrap();
            format!(" gpu_two_phase_warm_ms={:.1}", time.as_secs_f64() * 1e3)
        } else {
            String::new()
        };
        // --partitioned: also time the groups numbered in hash partitions
        // (seed 002's PGB) where the default numbers them in one table.
        if std::env::args().any(|a| a == "--partitioned") {
            ctx.sql("SET gpu.tuning.min_groups_to_partition = 0")
                .await
                .unwrap();
            let (time, partitioned_plan) = time_gpu(&ctx, runs, cpu_answer).await;
            if explain_analyze() {
                let shown =
                    datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                        partitioned_plan.as_ref(),
                    )
                    .indent(true)
                    .to_string();
                println!(
                    "GPU partitioned plan with metrics (last run), 2^{log2_g} groups:\n{shown}"
                );
            }
            variants.push_str(&format!(
                " gpu_partitioned_warm_ms={:.1} partitioned_kernel_ms={:.1} partitioned_device_wall_ms={:.1} partitioned_groups_partitions={}",
                time.as_secs_f64() * 1e3,
                gpu_metric(&partitioned_plan, "kernel_time") as f64 / 1e6,
                gpu_metric(&partitioned_plan, "device_wall_time") as f64 / 1e6,
                gpu_metric(&partitioned_plan, "partitioned_groups_partitions"),
            ));
            let default = datafusion_gpu::GpuOptions::default()
                .tuning
                .min_groups_to_partition;
            ctx.sql(&format!(
                "SET gpu.tuning.min_groups_to_partition = {default}"
            ))
            .await
            .unwrap();
        }
        // --pinned: the table copied into pinned host memory (pin_batches),
        // both paths timed again over it.
        if std::env::args().any(|a| a == "--pinned") {
            let (pinned, pin_time) = super::pinned_copy(&r_table).await;
            ctx.deregister_table("r").unwrap();
            ctx.register_table("r", pinned).unwrap();
            ctx.sql("SET gpu.enabled = false").await.unwrap();
            let (cpu_pinned, _) = time_gpu(&ctx, runs, cpu_answer).await;
            ctx.sql("SET gpu.enabled = true").await.unwrap();
            run_once(&ctx).await;
            let (gpu_pinned, pinned_plan) = time_gpu(&ctx, runs, cpu_answer).await;
            if explain_analyze() {
                let shown =
                    datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                        pinned_plan.as_ref(),
                    )
                    .indent(true)
                    .to_string();
                println!("GPU plan over the pinned table with metrics (last run), 2^{log2_g} groups:\n{shown}");
            }
            variants.push_str(&format!(
                " pin_ms={:.1} cpu_pinned_ms={:.1} gpu_pinned_warm_ms={:.1} speedup_pinned={:.2} pinned_kernel_ms={:.1} pinned_transfer_ms={:.1} pinned_device_wall_ms={:.1} pinned_staging_ms={:.1} pinned_input_ms={:.1} pinned_prepare_ms={:.1} pinned_emit_ms={:.1} pinned_table_fold_partitions={} pinned_folding_table_grown_partitions={} h2d_direct_bytes={}",
                pin_time.as_secs_f64() * 1e3,
                cpu_pinned.as_secs_f64() * 1e3,
                gpu_pinned.as_secs_f64() * 1e3,
                cpu_pinned.as_secs_f64() / gpu_pinned.as_secs_f64(),
                gpu_metric(&pinned_plan, "kernel_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "transfer_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "device_wall_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "staging_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "input_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "prepare_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "emit_time") as f64 / 1e6,
                gpu_metric(&pinned_plan, "table_fold_partitions"),
                gpu_metric(&pinned_plan, "folding_table_grown_partitions"),
                gpu_metric(&pinned_plan, "h2d_direct_bytes"),
            ));
            // --pinned-ab gpu.KEY=A,B: over the pinned table, the GPU path
            // timed again in rounds that alternate the two values (A, B, A,
            // B), for a comparison within one process; left at A.
            if let Some(setting) = pinned_ab_setting() {
                let (key, values) = setting.split_once('=').expect("--pinned-ab gpu.KEY=A,B");
                let (value_a, value_b) = values.split_once(',').expect("--pinned-ab gpu.KEY=A,B");
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for _ in 0..2 {
                    for (value, times) in [(value_a, &mut a), (value_b, &mut b)] {
                        ctx.sql(&format!("SET {key} = {value}")).await.unwrap();
                        let (time, _) = time_gpu(&ctx, runs, cpu_answer).await;
                        times.push(format!("{:.1}", time.as_secs_f64() * 1e3));
                    }
                }
                ctx.sql(&format!("SET {key} = {value_a}")).await.unwrap();
                variants.push_str(&format!(
                    " pinned_ab={key}:{value_a}->{value_b} pinned_a_ms={} pinned_b_ms={}",
                    a.join(","),
                    b.join(",")
                ));
            }
        }
        if explain_analyze() {
            let shown = datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(
                plan.as_ref(),
            )
            .indent(true)
            .to_string();
            println!("GPU plan with metrics (last run), 2^{log2_g} groups:\n{shown}");
        }
        assert!(
            gpu_metric(&plan, "input_rows") > 0,
            "the GPU aggregation did not run"
        );
        let plan_ms = planning_time(&ctx).await.as_secs_f64() * 1e3;
        // Where the warm run's wall time went, on the host's clock.
        let phases: String = [
            "input_time",
            "prepare_time",
            "device_wall_time",
            "staging_time",
            "emit_time",
        ]
        .iter()
        .map(|name| {
            format!(
                " {}_ms={:.1}",
                name.trim_end_matches("_time"),
                gpu_metric(&plan, name) as f64 / 1e6
            )
        })
        .collect();
        let kernel_ms = gpu_metric(&plan, "kernel_time") as f64 / 1e6;
        let transfer_ms = gpu_metric(&plan, "transfer_time") as f64 / 1e6;
        let fallbacks = gpu_metric(&plan, "cpu_fallback_partitions");
        let folds = gpu_metric(&plan, "table_fold_partitions");
        let grown = gpu_metric(&plan, "folding_table_grown_partitions");
        let floor = 24.0 * rows as f64 / bandwidth.host_to_device;
        println!(
            "RESULT_GROUP_BY log2_rows={log2_rows} log2_groups={log2_g} zipf={zipf} key_type={} groups={} cpu_ms={:.1} gpu_cold_ms={:.1} gpu_warm_ms={:.1} speedup_warm={:.2} kernel_ms={kernel_ms:.1} transfer_ms={transfer_ms:.1} floor_ms={:.1} cpu_plan_ms={cpu_plan_ms:.1} plan_ms={plan_ms:.1}{phases} cpu_fallback_partitions={fallbacks} table_fold_partitions={folds} folding_table_grown_partitions={grown}{variants}",
            if string_keys() { "utf8" } else { "int64" },
            cpu_answer.0,
            cpu.as_secs_f64() * 1e3,
            cold.as_secs_f64() * 1e3,
            warm.as_secs_f64() * 1e3,
            cpu.as_secs_f64() / warm.as_secs_f64(),
            floor * 1e3
        );
    }
}
