//! End-to-end benchmarks: the same SQL on DataFusion's CPU operators (all
//! cores) and on the GPU ones, in one process on one machine, answers checked.
//!
//!     cargo bench --bench gpu_join -- [--log2-rows 24] [--runs 5]
//!                                      [--match-percent 100] [--zipf 0]
//!                                      [--unordered] [--explain-analyze]
//!                                      [--repartitioned] [--host-gather] [--int32]
//!                                      [--pinned]
//!                                      [--set gpu.KEY=VALUE ...]
//!     cargo bench --bench gpu_join -- --group-by [--log2-rows 24] [--runs 5]
//!                                      [--log2-groups 1,4,8,12,16,20,24] [--zipf 0]
//!                                      [--two-phase] [--order-by-key] [--explain-analyze]
//!                                      [--partitioned] [--pinned] [--set gpu.KEY=VALUE ...]
//!                                      [--pinned-ab gpu.KEY=A,B (with --pinned)]
//!     cargo bench --bench gpu_join -- --seeds [rt1,b10,...] [--log2-rows 24]
//!                                      [--check-only] [--pinned] [--set gpu.KEY=VALUE ...]
//!     cargo bench --bench gpu_join -- --sort-merge [--log2-rows 24] [--runs 5]
//!                                      [--set gpu.KEY=VALUE ...] [--pinned]
//!     cargo bench --bench gpu_join -- --shapes [--log2-rows-list 20,22,24,26]
//!                                      [--runs 2] [--only word,...]
//!
//! `--seeds` runs the seeds' workloads as criterion benchmarks (see
//! `gpu_join/seeds.rs`); `--shapes` the placement sweep (see `gpu_join/shapes.rs`); `--sort-merge` the sort-merge join (see
//! `gpu_join/sort_merge.rs`; it ends with a hash join sorted on its key,
//! which the GPU plans as a sort-merge join); the other two modes are the end-to-end
//! measurements quoted in BENCHMARKS.md.
//!
//! The join benchmark (the default):
//! R has keys 0..2^n in random order (a primary key), S has 2^n foreign keys
//! drawn uniformly so that `--match-percent` of them hit R (100: every one),
//! or, with `--zipf s` > 0, drawn from a Zipf(s) distribution over R's keys;
//! both carry an Int64 payload `v` (with `--int32`, keys and payloads are
//! Int32, as in the seeds' workloads). Times are wall clock
//! for planning + execution + collecting the one-row answer, data already in
//! memory (`MemTable`s, one partition per core). "Cold" is the first GPU
//! query of the process (driver and PTX load included), "warm" the median of
//! the following runs. The GPU join runs once over all input partitions
//! (`gpu.tuning.merge_partitions`, the default); `--repartitioned` also times it
//! over DataFusion's CPU hash repartitions (`gpu.tuning.merge_partitions = false`),
//! in the same process; `--host-gather`
//! times the GPU join with its output columns gathered on the host
//! (`gpu.tuning.device_gather = false`); `--pinned` copies both tables into pinned
//! host memory (`pin_batches`) and times both paths again over them. The
//! floor is the pinned PCIe time of the bytes the GPU path must move (keys
//! in, matched row-id pairs out), measured here.

use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::gpu::{gpu_runtime, measure_copy_bandwidth};
use datafusion_gpu::gpu_session_context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

#[path = "gpu_join/group_by.rs"]
mod group_by;
#[path = "gpu_join/seeds.rs"]
mod seeds;
#[path = "gpu_join/shapes.rs"]
mod shapes;
#[path = "gpu_join/sort_merge.rs"]
mod sort_merge;

const SQL: &str = "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k";

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn arg_f64(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// R or S: key `k` and payload `v`, Int64 or (`int32`) Int32, in
/// `partitions` partitions of 8192-row batches.
fn table(keys: &[i64], salt: i64, partitions: usize, int32: bool) -> Arc<MemTable> {
    let data_type = if int32 {
        DataType::Int32
    } else {
        DataType::Int64
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", data_type.clone(), false),
        Field::new("v", data_type.clone(), false),
    ]));
    let typed = |column: ArrayRef| cast(&column, &data_type).expect("keys and payloads fit");
    let per = keys.len().div_ceil(partitions);
    let parts = keys
        .chunks(per.max(1))
        .enumerate()
        .map(|(p, chunk)| {
            chunk
                .chunks(8192)
                .enumerate()
                .map(|(b, ks)| {
                    let first = p * per + b * 8192;
                    let v = Int64Array::from_iter_values(
                        (0..ks.len()).map(|i| ((first + i) as i64 * 31 + salt) % 1_000_003),
                    );
                    RecordBatch::try_new(
                        Arc::clone(&schema),
                        vec![
                            typed(Arc::new(Int64Array::from(ks.to_vec()))),
                            typed(Arc::new(v)),
                        ],
                    )
                    .unwrap()
                })
                .collect()
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

async fn run_once(ctx: &SessionContext) -> (Duration, Vec<i64>, Arc<dyn ExecutionPlan>) {
    datafusion_gpu::trace::event(|| "query: planning".into());
    let start = Instant::now();
    let plan = ctx
        .sql(SQL)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    datafusion_gpu::trace::event(|| "query: executing".into());
    // Read as `collect` does, with an event at the first batch and at the
    // stream's end, so that a trace shows the time the plan's streams take
    // to end and to be dropped.
    let mut stream =
        datafusion::physical_plan::execute_stream(Arc::clone(&plan), ctx.task_ctx()).unwrap();
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        if batches.is_empty() {
            datafusion_gpu::trace::event(|| "query: first batch".into());
        }
        batches.push(batch.unwrap());
    }
    datafusion_gpu::trace::event(|| "query: stream ended".into());
    drop(stream);
    let elapsed = start.elapsed();
    datafusion_gpu::trace::event(|| "query: answered".into());
    let answer = batches[0]
        .columns()
        .iter()
        .map(|c| c.as_primitive::<Int64Type>().value(0))
        .collect();
    (elapsed, answer, plan)
}

/// Prints `plan` with each operator's metrics from its last execution.
fn print_metrics(path: &str, plan: &Arc<dyn ExecutionPlan>) {
    let shown =
        datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(plan.as_ref())
            .indent(true)
            .to_string();
    println!("{path} plan with metrics (last run):\n{shown}");
}

/// The warm median of `runs` GPU runs with `option` set to its first value
/// (then back to its second), each answer checked against `expected`.
async fn timed_variant(
    ctx: &SessionContext,
    runs: usize,
    (option, value, restore): (&str, &str, &str),
    label: &str,
    (expected, explain_analyze): (&[i64], bool),
) -> Duration {
    ctx.sql(&format!("SET {option} = {value}")).await.unwrap();
    let mut times = Vec::new();
    for _ in 0..runs {
        let (t, answer, plan) = run_once(ctx).await;
        assert_eq!(answer, expected, "GPU answer differs from the CPU's");
        times.push(t);
        if explain_analyze && times.len() == runs {
            print_metrics(label, &plan);
        }
    }
    ctx.sql(&format!("SET {option} = {restore}")).await.unwrap();
    let warm = median(&mut times);
    println!(
        "{label} ({option} = {value}): warm median {:>9.1} ms",
        warm.as_secs_f64() * 1e3
    );
    warm
}

/// `table` copied into pinned host memory partition by partition
/// (`pin_batches`), with its sort order, and how long that took.
async fn pinned_copy(table: &MemTable) -> (Arc<MemTable>, Duration) {
    let start = Instant::now();
    let mut partitions = Vec::new();
    for partition in &table.batches {
        let batches = partition.read().await;
        partitions.push(datafusion_gpu::pin_batches(&batches).unwrap());
    }
    let schema = datafusion::catalog::TableProvider::schema(table);
    let order = table.sort_order.lock().clone();
    let pinned = MemTable::try_new(schema, partitions)
        .unwrap()
        .with_sort_order(order);
    (Arc::new(pinned), start.elapsed())
}

/// The median of `runs` runs of `ctx`'s query (`run`), each answer checked
/// against `expected`, and the last run's plan.
async fn timed_runs<
    A: PartialEq + std::fmt::Debug,
    F: std::future::Future<Output = (Duration, A, Arc<dyn ExecutionPlan>)>,
>(
    runs: usize,
    expected: &A,
    mut run: impl FnMut() -> F,
) -> (Duration, Arc<dyn ExecutionPlan>) {
    let mut times = Vec::new();
    let mut last_plan = None;
    for _ in 0..runs.max(1) {
        let (t, answer, plan) = run().await;
        assert_eq!(&answer, expected, "answer differs from the CPU's");
        times.push(t);
        last_plan = Some(plan);
    }
    (median(&mut times), last_plan.expect("at least one run"))
}

/// The process's minor page faults so far (Linux), `None` elsewhere.
fn minor_page_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the parenthesized command name; minflt is field 10.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    fields.get(7)?.parse().ok()
}

/// Minor page faults per run since `before`.
fn faults_per_run(before: Option<u64>, runs: usize) -> Option<u64> {
    Some((minor_page_faults()? - before?) / runs.max(1) as u64)
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// How many nodes of `plan` are called `operator`, and the sum of their
/// metric `name` (summed over each node's partitions).
fn operator_metric(plan: &Arc<dyn ExecutionPlan>, operator: &str, name: &str) -> (usize, usize) {
    let here = if plan.name() == operator {
        let value = plan
            .metrics()
            .and_then(|m| m.sum_by_name(name))
            .map_or(0, |v| v.as_usize());
        (1, value)
    } else {
        (0, 0)
    };
    plan.children().into_iter().fold(here, |(n, v), child| {
        let (cn, cv) = operator_metric(child, operator, name);
        (n + cn, v + cv)
    })
}

/// Metric `name` summed over the plan's GPU joins.
fn gpu_join_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    operator_metric(plan, "GpuHashJoinExec", name).1
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--seeds") {
        let families: Vec<String> = args
            .get(at + 1)
            .filter(|list| !list.starts_with("--"))
            .map(|list| list.split(',').map(|f| f.trim().to_string()).collect())
            .unwrap_or_default();
        seeds::benchmark(arg("--log2-rows", 24), &families);
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(end_to_end());
}

/// The comma-separated values after `name`, or `default`.
fn arg_list(name: &str, default: &[&str]) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(|v| v.trim().to_string()).collect())
        .unwrap_or_else(|| default.iter().map(|v| v.to_string()).collect())
}

async fn end_to_end() {
    if std::env::args().any(|a| a == "--shapes") {
        let sizes: Vec<usize> = arg_list("--log2-rows-list", &["20", "22", "24", "26"])
            .iter()
            .filter_map(|n| n.parse().ok())
            .collect();
        shapes::benchmark(&sizes, arg("--runs", 2), &arg_list("--only", &[])).await;
        return;
    }
    let log2 = arg("--log2-rows", 24);
    let runs = arg("--runs", 5).max(1);
    if std::env::args().any(|a| a == "--group-by") {
        let args: Vec<String> = std::env::args().collect();
        let groups: Vec<u32> = args
            .iter()
            .position(|a| a == "--log2-groups")
            .and_then(|i| args.get(i + 1))
            .map(|list| {
                list.split(',')
                    .filter_map(|g| g.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_else(|| vec![1, 4, 8, 12, 16, 20, 24]);
        group_by::benchmark(log2, &groups, arg_f64("--zipf", 0.0), runs).await;
        return;
    }
    if std::env::args().any(|a| a == "--sort-merge") {
        sort_merge::benchmark(log2, runs).await;
        return;
    }
    let rows = 1usize << log2;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut rng = StdRng::seed_from_u64(42);
    let mut r_keys: Vec<i64> = (0..rows as i64).collect();
    r_keys.shuffle(&mut rng);
    let match_percent = arg_f64("--match-percent", 100.0).clamp(0.001, 100.0);
    let zipf = arg_f64("--zipf", 0.0);
    let s_keys: Vec<i64> = if zipf > 0.0 {
        let distribution = rand_distr::Zipf::new(rows as f64, zipf).expect("Zipf parameters");
        (0..rows)
            .map(|_| rng.sample(distribution) as i64 - 1)
            .collect()
    } else {
        let domain = ((rows as f64) * 100.0 / match_percent) as i64;
        (0..rows).map(|_| rng.random_range(0..domain)).collect()
    };

    let config = SessionConfig::new().with_target_partitions(cores);
    let ctx = gpu_session_context(config);
    let int32 = std::env::args().any(|a| a == "--int32");
    let (r_table, s_table) = (
        table(&r_keys, 1, cores, int32),
        table(&s_keys, 2, cores, int32),
    );
    ctx.register_table("r", Arc::clone(&r_table) as _).unwrap();
    ctx.register_table("s", Arc::clone(&s_table) as _).unwrap();
    let key_type = if int32 { "Int32" } else { "Int64" };
    println!("join benchmark: |R| = |S| = 2^{log2} {key_type} rows, {cores} cores, {runs} timed runs per path, S keys: {}",
        if zipf > 0.0 { format!("Zipf {zipf}") } else { format!("uniform, {match_percent}% matching") });
    println!("query: {SQL}");

    let explain_analyze = std::env::args().any(|a| a == "--explain-analyze");
    ctx.sql("SET gpu.enabled = false").await.unwrap();
    let (_, cpu_answer, cpu_plan) = run_once(&ctx).await; // warm-up
    if explain_analyze {
        print_metrics("CPU", &cpu_plan);
    }
    let faults_before = minor_page_faults();
    let mut cpu_times: Vec<Duration> = {
        let mut v = Vec::new();
        for _ in 0..runs {
            v.push(run_once(&ctx).await.0);
        }
        v
    };
    let cpu_faults = faults_per_run(faults_before, runs);
    let cpu = median(&mut cpu_times);
    println!(
        "CPU  (DataFusion HashJoinExec): median {:>9.1} ms  answer {cpu_answer:?}",
        cpu.as_secs_f64() * 1e3
    );

    let runtime = match gpu_runtime() {
        Ok(runtime) => runtime,
        Err(reason) => {
            println!("GPU: not measured, {reason}");
            return;
        }
    };
    println!("{}", runtime.describe());
    ctx.sql("SET gpu.enabled = true").await.unwrap();
    // The GPU path is what is measured, whatever the size.
    ctx.sql("SET gpu.placement = 'always'").await.unwrap();
    // --unordered: skip reproducing HashJoinExec's row order (gpu.preserve_order).
    let unordered = std::env::args().any(|a| a == "--unordered");
    if unordered {
        ctx.sql("SET gpu.preserve_order = false").await.unwrap();
    }
    // --set gpu.KEY=VALUE: options of the GPU path's runs.
    for setting in sort_merge::gpu_settings() {
        println!("GPU path: SET {setting}");
        ctx.sql(&format!("SET {setting}")).await.unwrap();
    }
    let (cold, gpu_answer, _) = run_once(&ctx).await;
    let repartitioned_warm = if std::env::args().any(|a| a == "--repartitioned") {
        Some(
            timed_variant(
                &ctx,
                runs,
                ("gpu.tuning.merge_partitions", "false", "true"),
                "GPU over DataFusion's repartitions",
                (&cpu_answer, explain_analyze),
            )
            .await,
        )
    } else {
        None
    };
    let mut warm_times = Vec::new();
    let mut last_plan = None;
    let faults_before = minor_page_faults();
    for _ in 0..runs {
        let (t, answer, plan) = run_once(&ctx).await;
        assert_eq!(answer, cpu_answer, "GPU answer differs from the CPU's");
        warm_times.push(t);
        last_plan = Some(plan);
    }
    let gpu_faults = faults_per_run(faults_before, runs);
    assert_eq!(gpu_answer, cpu_answer, "GPU answer differs from the CPU's");
    let warm = median(&mut warm_times);
    let plan = last_plan.expect("at least one run");
    if explain_analyze {
        print_metrics("GPU", &plan);
    }
    assert!(
        operator_metric(&plan, "GpuHashJoinExec", "probe_rows").0 > 0,
        "the GPU join did not run"
    );
    // --host-gather: the same GPU join with its output gathered on the host
    // (gpu.tuning.device_gather = false), for the comparison in one process.
    let host_gather_warm = if std::env::args().any(|a| a == "--host-gather") {
        Some(
            timed_variant(
                &ctx,
                runs,
                ("gpu.tuning.device_gather", "false", "true"),
                "GPU, output gathered on the host",
                (&cpu_answer, explain_analyze),
            )
            .await,
        )
    } else {
        None
    };
    let kernel_ms = gpu_join_metric(&plan, "kernel_time") as f64 / 1e6;
    let transfer_ms = gpu_join_metric(&plan, "transfer_time") as f64 / 1e6;
    let h2d = gpu_join_metric(&plan, "h2d_bytes");
    let d2h = gpu_join_metric(&plan, "d2h_bytes");

    let bandwidth = measure_copy_bandwidth(&runtime.devices()[0], 1 << 30, 5).unwrap();
    // Keys of both sides in, one pair of row ids per output row out.
    let matches = cpu_answer[0] as f64;
    let floor = (16.0 * rows as f64) / bandwidth.host_to_device
        + (16.0 * matches) / bandwidth.device_to_host;
    println!("GPU  (GpuHashJoinExec):         cold   {:>9.1} ms  warm median {:>9.1} ms  answer {gpu_answer:?}", cold.as_secs_f64() * 1e3, warm.as_secs_f64() * 1e3);
    println!("     last warm run, summed over partitions: kernel {kernel_ms:.1} ms, transfers {transfer_ms:.1} ms, {h2d} B to device, {d2h} B back");
    if let (Some(cpu_faults), Some(gpu_faults)) = (cpu_faults, gpu_faults) {
        // Each fault is a fresh page of host memory the process touched:
        // allocations that the allocator maps anew for every query.
        println!("     minor page faults per run: CPU {cpu_faults}, GPU {gpu_faults}");
    }
    println!(
        "pinned copy bandwidth: {:.1} GB/s to device, {:.1} GB/s back; floor for 2^{log2} keys in + pairs out: {:.1} ms",
        bandwidth.host_to_device / 1e9,
        bandwidth.device_to_host / 1e9,
        floor * 1e3
    );
    if let Some(repartitioned) = repartitioned_warm {
        println!(
            "RESULT_REPARTITIONED log2_rows={log2} gpu_warm_ms={:.1} speedup_warm={:.2}",
            repartitioned.as_secs_f64() * 1e3,
            cpu.as_secs_f64() / repartitioned.as_secs_f64()
        );
    }
    if let Some(host) = host_gather_warm {
        println!(
            "RESULT_HOST_GATHER log2_rows={log2} gpu_warm_ms={:.1} speedup_warm={:.2}",
            host.as_secs_f64() * 1e3,
            cpu.as_secs_f64() / host.as_secs_f64()
        );
    }
    // --pinned: both tables copied into pinned host memory (pin_batches),
    // both paths timed again over them.
    if std::env::args().any(|a| a == "--pinned") {
        let (r_pinned, r_pin) = pinned_copy(&r_table).await;
        let (s_pinned, s_pin) = pinned_copy(&s_table).await;
        for (name, table) in [("r", r_pinned), ("s", s_pinned)] {
            ctx.deregister_table(name).unwrap();
            ctx.register_table(name, table).unwrap();
        }
        ctx.sql("SET gpu.enabled = false").await.unwrap();
        let (cpu_pinned, _) = timed_runs(runs, &cpu_answer, || run_once(&ctx)).await;
        ctx.sql("SET gpu.enabled = true").await.unwrap();
        run_once(&ctx).await;
        let (gpu_pinned, plan) = timed_runs(runs, &cpu_answer, || run_once(&ctx)).await;
        if explain_analyze {
            print_metrics("GPU over pinned tables", &plan);
        }
        println!(
            "RESULT_PINNED log2_rows={log2} pin_ms={:.1} cpu_ms={:.1} gpu_warm_ms={:.1} speedup_warm={:.2} h2d_direct_bytes={} staging_ms={:.1}",
            (r_pin + s_pin).as_secs_f64() * 1e3,
            cpu_pinned.as_secs_f64() * 1e3,
            gpu_pinned.as_secs_f64() * 1e3,
            cpu_pinned.as_secs_f64() / gpu_pinned.as_secs_f64(),
            gpu_join_metric(&plan, "h2d_direct_bytes"),
            gpu_join_metric(&plan, "staging_time") as f64 / 1e6,
        );
    }
    println!(
        "RESULT log2_rows={log2} key_type={key_type} match_percent={match_percent} zipf={zipf} preserve_order={} cpu_ms={:.1} gpu_cold_ms={:.1} gpu_warm_ms={:.1} speedup_warm={:.2} floor_ms={:.1}",
        !unordered,
        cpu.as_secs_f64() * 1e3,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        cpu.as_secs_f64() / warm.as_secs_f64(),
        floor * 1e3
    );
}
