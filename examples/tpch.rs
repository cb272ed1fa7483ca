//! A TPC-H-derived benchmark: CPU against GPU, answers checked.
//!
//! Generates the eight tables at a chosen scale factor and, by default,
//! writes them once as Parquet with DataFusion's writer (`--data DIR`,
//! reused when present) and reads them as listing tables through
//! `object_store`, as users keep their data; `--format memory` keeps the
//! generated batches as `MemTable`s instead. Runs the 22 queries on
//! DataFusion's CPU operators and again with the GPU rule, checks that the
//! answers agree, and prints a table of timings, speedups and where each
//! join ran. Numbers are "derived from TPC-H"; they are not TPC-H results.
//!
//! ```text
//! cargo run --release --example tpch -- [--sf 1] [--format parquet|memory] [--data DIR]
//!     [--runs 3] [--queries 1,3,9] [--partitions N] [--json out.json] [--set KEY=VALUE]
//!     [--one-device]
//! ```
//!
//! The query text is DataFusion's TPC-H-derived benchmark SQL (Apache-2.0,
//! derived from TPC-H under the TPC Fair Use Policy), as the published
//! `datafusion-sqllogictest` package carries it in `test_files/tpch/answers`;
//! set `DATAFUSION_SLT_TEST_FILES` to that folder on a machine without the
//! cargo registry. Without a GPU the CPU column is printed with the reason
//! the GPU column is empty.

#[path = "../tests/common/plan_metrics.rs"]
mod plan_metrics;
#[path = "../tests/common/slt_files.rs"]
mod slt_files;
#[path = "common/tpch.rs"]
mod tpch_data;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use datafusion::arrow::array::RecordBatch;
use datafusion::catalog::TableProvider;
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_gpu::{gpu_decisions, gpu_session_context, gpu_status, Placement};
use indicatif::{ProgressBar, ProgressStyle};
use plan_metrics::plan_metric;
use tpch_data::{
    answers_agree, check_fixed_size, query_sql, tpch_sources, write_parquet_tables, TABLES,
};

/// Where the tables come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// Parquet files under `--data`, written once by DataFusion's Parquet
    /// writer and read as listing tables through `object_store`.
    Parquet,
    /// The generated batches as `MemTable`s, nothing on disk.
    Memory,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Memory => "memory",
        }
    }
}

/// TPC-H-derived queries (not TPC-H results): DataFusion on the CPU against
/// the same session with the GPU rule, answers checked.
#[derive(Debug, clap::Parser)]
#[command(name = "tpch")]
struct Args {
    /// Scale factor (1 is about 1 GB of data).
    #[arg(long = "sf", default_value_t = 1.0, value_parser = positive_scale_factor)]
    scale_factor: f64,
    /// Runs of each query on each side; the median is reported. The GPU
    /// session's cold time is the median of as many runs, each with the
    /// device column cache emptied first (the first of them is reported
    /// too).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Queries to run, e.g. 1,3,9.
    #[arg(long, value_delimiter = ',', default_values_t = 1..=22u32,
          value_parser = clap::value_parser!(u32).range(1..=22))]
    queries: Vec<u32>,
    /// DataFusion's target partitions (and the generator's parts); default:
    /// the host's cores.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    partitions: Option<u32>,
    /// Where the tables come from.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    format: Format,
    /// Folder of the Parquet files (`SF<sf>/<table>/` below it), written
    /// when missing and reused when present.
    #[arg(long, default_value = "tpch-data")]
    data: PathBuf,
    /// Writes the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Every run's time (a cold run's with its GPU nodes' fill times) and
    /// each query's total on stderr, with the plans and their metrics.
    #[arg(long)]
    verbose: bool,
    /// Also times DuckDB on the same Parquet files and queries
    /// (`duckdb_tpch.py` beside this program or in `scripts/`; needs
    /// python3 and the duckdb package), beside the other columns.
    #[arg(long)]
    duckdb: bool,
    /// Writes a bar chart of the per-query speedups (GPU warm against
    /// DataFusion, and against DuckDB with --duckdb) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Where each join and aggregation of each query ran, with the cost
    /// model's estimates (`gpu_decisions`), on stderr.
    #[arg(long)]
    decisions: bool,
    /// Also runs the GPU session on its first device alone (`gpu.devices =
    /// 0`), cold and warm, answers checked: the `1 GPU` columns, and the
    /// totals' ratio, show what the other devices add.
    #[arg(long)]
    one_device: bool,
    /// A setting of the GPU session, e.g. gpu.placement=always (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = setting)]
    settings: Vec<(String, String)>,
}

impl Args {
    fn partitions(&self) -> usize {
        self.partitions.map_or_else(
            || std::thread::available_parallelism().map_or(4, |n| n.get()),
            |p| p as usize,
        )
    }
}

fn positive_scale_factor(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(sf) if sf > 0.0 && sf.is_finite() => Ok(sf),
        _ => Err(format!("{text} is not a positive scale factor")),
    }
}

fn setting(text: &str) -> std::result::Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or(format!("{text}: expected KEY=VALUE"))?;
    Ok((key.trim().to_string(), value.trim().to_string()))
}

/// The eight tables, generated in memory.
async fn tpch_tables(
    sf: f64,
    parts: usize,
    progress: &ProgressBar,
) -> Result<Vec<(&'static str, Arc<MemTable>)>> {
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(parts));
    let mut tables = Vec::new();
    for (name, source) in tpch_sources(sf, parts)? {
        progress.set_message(format!("generating {name}"));
        let schema = source.schema();
        let partitions = ctx.read_table(source)?.collect_partitioned().await?;
        let rows = partitions.iter().flatten().map(|b| b.num_rows()).sum();
        check_fixed_size(name, rows)?;
        tables.push((name, Arc::new(MemTable::try_new(schema, partitions)?)));
        progress.inc(1);
    }
    Ok(tables)
}

/// DuckDB's warm median per query on the Parquet files under `folder`
/// (`duckdb_tpch.py`, the same queries, cold run then median of `runs`).
fn duckdb_times(folder: &Path, args: &Args) -> Result<std::collections::HashMap<u32, f64>> {
    let script = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("duckdb_tpch.py")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("scripts").join("duckdb_tpch.py"));
    let report = std::env::temp_dir().join(format!("tpch-duckdb-{}.json", std::process::id()));
    let queries: Vec<String> = args.queries.iter().map(u32::to_string).collect();
    let output = std::process::Command::new("python3")
        .arg(&script)
        .arg("--data")
        .arg(folder)
        .args([
            "--runs",
            &args.runs.to_string(),
            "--queries",
            &queries.join(","),
        ])
        .arg("--json")
        .arg(&report)
        .output()
        .map_err(|e| DataFusionError::Execution(format!("python3 {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(DataFusionError::Execution(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let text = std::fs::read_to_string(&report)
        .map_err(|e| DataFusionError::Execution(format!("{}: {e}", report.display())))?;
    let _ = std::fs::remove_file(&report);
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| DataFusionError::Execution(format!("{}: {e}", report.display())))?;
    let mut times = std::collections::HashMap::new();
    for query in json["queries"].as_array().into_iter().flatten() {
        if let (Some(n), Some(warm)) = (query["query"].as_u64(), query["warm_ms"].as_f64()) {
            times.insert(n as u32, warm);
        }
    }
    println!(
        "DuckDB {} on the same files: {} queries timed",
        json["version"].as_str().unwrap_or("?"),
        times.len()
    );
    Ok(times)
}

/// Plans and runs `sql`, returning the answer, the time and the plan.
async fn run_once(
    ctx: &SessionContext,
    sql: &str,
) -> Result<(Vec<RecordBatch>, Duration, Arc<dyn ExecutionPlan>)> {
    let start = Instant::now();
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    Ok((batches, start.elapsed(), plan))
}

/// `runs` runs of `sql`, each with the device column cache emptied first:
/// every run's answer, its time, and the first run's plan with its metrics.
async fn cold_runs(
    ctx: &SessionContext,
    sql: &str,
    runs: u32,
) -> Result<(Vec<Vec<RecordBatch>>, Vec<ColdRun>, Arc<dyn ExecutionPlan>)> {
    let mut answers = Vec::new();
    let mut colds = Vec::new();
    let mut first_plan = None;
    for _ in 0..runs.max(1) {
        datafusion_gpu::clear_gpu_cache();
        let (answer, time, plan) = run_once(ctx, sql).await?;
        answers.push(answer);
        colds.push(ColdRun {
            time,
            fill: fill_times(&plan),
        });
        first_plan.get_or_insert(plan);
    }
    let plan = first_plan.ok_or_else(|| DataFusionError::Internal("no cold run".into()))?;
    Ok((answers, colds, plan))
}

/// One cold run: its time, and its GPU nodes' fill times ([`fill_times`]).
struct ColdRun {
    time: Duration,
    fill: String,
}

/// The times the GPU nodes of `plan` spent filling the column cache,
/// summed over the plan's nodes and partitions: making the words' builders
/// (`pinned_alloc_time`, which locks new page-locked memory where the pool
/// has none idle), reading, coding and copying up; and the parts filled
/// ahead of the nodes, whose times are not in those.
fn fill_times(plan: &Arc<dyn ExecutionPlan>) -> String {
    let times = [
        "pinned_alloc_time",
        "read_time",
        "encode_time",
        "upload_time",
    ];
    let mut parts: Vec<String> = times
        .iter()
        .map(|name| format!("{name} {:.1} ms", plan_metric(plan, name) as f64 / 1e6))
        .collect();
    parts.push(format!(
        "parts_filled_ahead {}",
        plan_metric(plan, "parts_filled_ahead")
    ));
    parts.join(", ")
}

/// Whether every run's answer agrees with `cpu` ([`answers_agree`]); the
/// first that does not is named by its run.
fn answers_agree_every(
    cpu: &[RecordBatch],
    runs: &[Vec<RecordBatch>],
) -> Result<std::result::Result<(), String>> {
    for (run, answer) in runs.iter().enumerate() {
        if let Err(difference) = answers_agree(cpu, answer)? {
            return Ok(Err(format!("cold run {}: {difference}", run + 1)));
        }
    }
    Ok(Ok(()))
}

/// Bytes the GPU nodes of an executed plan copied to the host only for
/// another GPU node to read them: the `d2h_bytes` of each GPU node whose
/// consumer, through projections, batch coalescing and repartitioning, is
/// a GPU node. A GPU scan filter's rows pass through host memory to a GPU
/// join above it; a GPU join handing its rows on the device copies down
/// only its counts.
fn bytes_down_between_gpu_nodes(plan: &Arc<dyn ExecutionPlan>) -> usize {
    fn walk(node: &Arc<dyn ExecutionPlan>, gpu_above: bool) -> usize {
        let on_gpu = node.name().starts_with("Gpu");
        let own = match gpu_above {
            true => gpu_node_bytes(node, "d2h_bytes"),
            false => 0,
        };
        let passes_through = matches!(
            node.name(),
            "ProjectionExec" | "CoalesceBatchesExec" | "RepartitionExec" | "CoalescePartitionsExec"
        );
        let above = on_gpu || (passes_through && gpu_above);
        own + node
            .children()
            .into_iter()
            .map(|child| walk(child, above))
            .sum::<usize>()
    }
    walk(plan, false)
}

/// Bytes every GPU node of an executed plan copied over the bus: to the
/// device (`h2d_bytes`) and to the host (`d2h_bytes`), whoever reads them.
fn bytes_over_the_bus(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
    plan.children().into_iter().map(bytes_over_the_bus).fold(
        (
            gpu_node_bytes(plan, "h2d_bytes"),
            gpu_node_bytes(plan, "d2h_bytes"),
        ),
        |(up, down), (u, d)| (up + u, down + d),
    )
}

/// `node`'s byte count `metric` (summed over its partitions) where it is a
/// GPU node; 0 for any other node.
fn gpu_node_bytes(node: &Arc<dyn ExecutionPlan>, metric: &str) -> usize {
    match node.name().starts_with("Gpu") {
        true => node
            .metrics()
            .and_then(|m| m.sum_by_name(metric))
            .map_or(0, |bytes| bytes.as_usize()),
        false => 0,
    }
}

/// `bytes` in bytes, KB or MB, whichever reads best.
fn byte_count(bytes: usize) -> String {
    match bytes {
        0..1_000 => format!("{bytes} bytes"),
        1_000..1_000_000 => format!("{:.1} KB", bytes as f64 / 1e3),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn count_nodes(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    usize::from(plan.name() == name)
        + plan
            .children()
            .iter()
            .map(|c| count_nodes(c, name))
            .sum::<usize>()
}

/// One row of the report.
struct QueryReport {
    query: usize,
    cpu: Duration,
    /// Cold (the median of cold runs) and warm.
    gpu: Option<(Duration, Duration)>,
    /// The GPU session's first cold run.
    first_cold: Option<Duration>,
    /// Bytes GPU nodes copied to the host for another GPU node to read
    /// ([`bytes_down_between_gpu_nodes`]), in the first cold run and the
    /// last warm one.
    between_gpu_nodes: Option<(usize, usize)>,
    /// Bytes every GPU node copied up and down in the last warm run
    /// ([`bytes_over_the_bus`]).
    warm_over_the_bus: Option<(usize, usize)>,
    /// Cold and warm on the first device alone (`--one-device`).
    one_device: Option<(Duration, Duration)>,
    /// DuckDB's warm median in milliseconds (`--duckdb`).
    duckdb: Option<f64>,
    joins_on_gpu: usize,
    joins: usize,
    aggregations_on_gpu: usize,
    aggregations: usize,
    /// Filters and projections over table scans run on the GPU.
    scan_filters_on_gpu: usize,
    first_cpu_reason: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The host's processor (its model name, where Linux names it) and the
/// threads it runs at once.
fn host_description() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| name.trim().to_owned())
        })
        .unwrap_or_else(|| "processor not named".into());
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {threads} threads")
}

fn report_json(
    args: &Args,
    gpu: &std::result::Result<String, String>,
    reports: &[QueryReport],
) -> String {
    let queries: Vec<String> = reports
        .iter()
        .map(|r| {
            let (cold, warm, speedup) = match r.gpu {
                Some((cold, warm)) => (
                    format!("{:.3}", ms(cold)),
                    format!("{:.3}", ms(warm)),
                    format!("{:.3}", ms(r.cpu) / ms(warm).max(1e-9)),
                ),
                None => ("null".into(), "null".into(), "null".into()),
            };
            let duckdb = r.duckdb.map_or("null".into(), |d| format!("{d:.3}"));
            let first_cold = r.first_cold.map_or("null".into(), |d| format!("{:.3}", ms(d)));
            let (between_cold, between_warm) = r
                .between_gpu_nodes
                .map_or(("null".into(), "null".into()), |(c, w)| (c.to_string(), w.to_string()));
            let (warm_up, warm_down) = r
                .warm_over_the_bus
                .map_or(("null".into(), "null".into()), |(u, d)| (u.to_string(), d.to_string()));
            let (one_cold, one_warm) = match r.one_device {
                Some((cold, warm)) => (format!("{:.3}", ms(cold)), format!("{:.3}", ms(warm))),
                None => ("null".into(), "null".into()),
            };
            format!(
                "{{\"query\":{},\"cpu_ms\":{:.3},\"gpu_cold_ms\":{cold},\"gpu_first_cold_ms\":{first_cold},\"cold_bytes_down_between_gpu_nodes\":{between_cold},\"warm_bytes_down_between_gpu_nodes\":{between_warm},\"warm_bytes_up\":{warm_up},\"warm_bytes_down\":{warm_down},\"gpu_warm_ms\":{warm},\"speedup\":{speedup},\"one_gpu_cold_ms\":{one_cold},\"one_gpu_warm_ms\":{one_warm},\"duckdb_warm_ms\":{duckdb},\"joins_on_gpu\":{},\"joins\":{},\"aggregations_on_gpu\":{},\"aggregations\":{},\"scan_filters_on_gpu\":{},\"first_cpu_reason\":{}}}",
                r.query,
                ms(r.cpu),
                r.joins_on_gpu,
                r.joins,
                r.aggregations_on_gpu,
                r.aggregations,
                r.scan_filters_on_gpu,
                r.first_cpu_reason.as_deref().map_or("null".into(), json_string),
            )
        })
        .collect();
    format!(
        "{{\"scale_factor\":{},\"format\":\"{}\",\"runs\":{},\"partitions\":{},\"host\":{},\"gpu\":{},\"queries\":[{}]}}\n",
        args.scale_factor,
        args.format.name(),
        args.runs,
        args.partitions(),
        json_string(&host_description()),
        match gpu {
            Ok(description) => json_string(description),
            Err(reason) => json_string(&format!("unavailable: {reason}")),
        },
        queries.join(",")
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let partitions = args.partitions();
    let test_files = slt_files::find_test_files().map_err(DataFusionError::Execution)?;
    let gpu = gpu_status().map_err(|reason| reason.0);
    println!(
        "TPC-H-derived benchmark (not TPC-H results), SF {}, {} tables, {partitions} partitions, \
         median of {} runs",
        args.scale_factor,
        args.format.name(),
        args.runs
    );
    // Cold ratios move with the host's cores (the Parquet decode both sides
    // share): a table names the host it was taken on.
    println!("host: {}", host_description());
    match &gpu {
        Ok(description) => {
            println!("GPU: {description}");
            // What placement by cost weighs every node with in this process.
            let first = datafusion_gpu::gpu::gpu_runtime()
                .ok()
                .and_then(|runtime| runtime.devices().first().cloned());
            if let Some(device) = first {
                match device.constants() {
                    Ok(constants) => println!("device constants: {constants}"),
                    Err(reason) => println!("device constants not measured: {reason}"),
                }
            }
        }
        Err(reason) => {
            println!("no GPU ({reason}): the GPU columns are the session with the rule, on the CPU")
        }
    }

    let style = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let config = || SessionConfig::new().with_target_partitions(partitions);
    let cpu_ctx = SessionContext::new_with_config(config());
    let gpu_ctx = gpu_session_context(config());
    for (key, value) in &args.settings {
        gpu_ctx.sql(&format!("SET {key} = {value}")).await?;
        println!("GPU session: SET {key} = {value}");
    }
    // The same session on the first device alone (`--one-device`).
    let one_ctx = match args.one_device {
        true => {
            let ctx = gpu_session_context(config());
            for (key, value) in &args.settings {
                ctx.sql(&format!("SET {key} = {value}")).await?;
            }
            ctx.sql("SET gpu.devices = '0'").await?;
            println!("1 GPU session: the same, and SET gpu.devices = '0'");
            Some(ctx)
        }
        false => None,
    };
    let gpu_contexts: Vec<&SessionContext> = std::iter::once(&gpu_ctx).chain(&one_ctx).collect();
    let progress = ProgressBar::new(8).with_style(style.clone());
    let started = Instant::now();
    let mut duckdb = std::collections::HashMap::new();
    match args.format {
        Format::Memory if args.duckdb => {
            eprintln!("--duckdb reads the Parquet files: it needs --format parquet");
            std::process::exit(2);
        }
        Format::Memory => {
            let tables = tpch_tables(args.scale_factor, partitions, &progress).await?;
            for (name, table) in &tables {
                cpu_ctx.register_table(*name, Arc::clone(table) as _)?;
                for ctx in &gpu_contexts {
                    ctx.register_table(*name, Arc::clone(table) as _)?;
                }
            }
            progress.finish_and_clear();
            println!(
                "generated 8 tables in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        Format::Parquet => {
            let folder = args.data.join(format!("SF{}", args.scale_factor));
            let written =
                write_parquet_tables(&folder, args.scale_factor, partitions, &progress).await?;
            for name in TABLES {
                let path = folder.join(name);
                let path = path.to_str().ok_or_else(|| {
                    DataFusionError::Execution(format!("{}: not UTF-8", path.display()))
                })?;
                cpu_ctx
                    .register_parquet(name, path, ParquetReadOptions::default())
                    .await?;
                for ctx in &gpu_contexts {
                    ctx.register_parquet(name, path, ParquetReadOptions::default())
                        .await?;
                }
            }
            progress.finish_and_clear();
            if args.duckdb {
                duckdb = duckdb_times(&folder, &args)?;
            }
            match written {
                0 => println!("reading the Parquet files under {}", folder.display()),
                n => println!(
                    "wrote {n} tables as Parquet under {} in {:.1} s",
                    folder.display(),
                    started.elapsed().as_secs_f64()
                ),
            }
        }
    }

    let progress = ProgressBar::new(args.queries.len() as u64).with_style(style);
    let mut reports = Vec::new();
    let mut disagreements: Vec<String> = Vec::new();
    let mut failures = Vec::new();
    let with_duckdb = args.duckdb;
    print_header(with_duckdb, args.one_device);
    for &n in &args.queries {
        progress.set_message(format!("q{n}"));
        match run_query(
            &args,
            &test_files,
            n as usize,
            &cpu_ctx,
            &gpu_ctx,
            one_ctx.as_ref(),
        )
        .await
        {
            Ok((mut report, disagreement)) => {
                report.duckdb = duckdb.get(&n).copied();
                progress.suspend(|| print_row(&report, with_duckdb, args.one_device));
                reports.push(report);
                disagreements.extend(disagreement);
            }
            Err(e) => failures.push(format!("q{n}: {e}")),
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    print_totals(&args, &gpu, &reports)?;
    if !failures.is_empty() {
        eprintln!("QUERIES FAILED:");
        for f in &failures {
            eprintln!("  {f}");
        }
    }
    if !disagreements.is_empty() {
        eprintln!("ANSWERS DISAGREE between the CPU and the GPU:");
        for d in &disagreements {
            eprintln!("  {d}");
        }
    }
    if !failures.is_empty() || !disagreements.is_empty() {
        std::process::exit(1);
    }
    println!("answers agree on all {} queries", reports.len());
    Ok(())
}

/// Runs query `n` on both contexts: its report, and how the answers
/// disagree if they do.
async fn run_query(
    args: &Args,
    test_files: &Path,
    n: usize,
    cpu_ctx: &SessionContext,
    gpu_ctx: &SessionContext,
    one_ctx: Option<&SessionContext>,
) -> Result<(QueryReport, Option<String>)> {
    let mut disagreement = None;
    let sql = query_sql(test_files, n)?;
    let started = Instant::now();
    let result = {
        let (cpu_answer, _, cpu_plan) = run_once(cpu_ctx, &sql).await?;
        let mut cpu_times = Vec::new();
        let mut last_cpu_plan = Arc::clone(&cpu_plan);
        for _ in 0..args.runs {
            let (_, time, plan) = run_once(cpu_ctx, &sql).await?;
            cpu_times.push(time);
            last_cpu_plan = plan;
            if args.verbose {
                eprintln!("q{n}: CPU run {:.1} ms", ms(time));
            }
        }
        if args.verbose {
            eprintln!(
                "q{n}: CPU plan with the metrics of the last run\n{}",
                DisplayableExecutionPlan::with_metrics(last_cpu_plan.as_ref()).indent(true)
            );
        }
        let joins =
            count_nodes(&cpu_plan, "HashJoinExec") + count_nodes(&cpu_plan, "SortMergeJoinExec");
        let aggregations = count_nodes(&cpu_plan, "AggregateExec");
        let mut report = QueryReport {
            query: n,
            cpu: median(cpu_times),
            gpu: None,
            first_cold: None,
            between_gpu_nodes: None,
            warm_over_the_bus: None,
            one_device: None,
            duckdb: None,
            joins_on_gpu: 0,
            joins,
            aggregations_on_gpu: 0,
            scan_filters_on_gpu: 0,
            aggregations,
            first_cpu_reason: None,
        };
        // Without a GPU the session with the rule runs too (on the CPU), so
        // its answers and its time show what registering the rule costs.
        {
            if args.verbose {
                let plan = gpu_ctx.sql(&sql).await?.create_physical_plan().await?;
                eprintln!(
                    "q{n}: GPU plan\n{}",
                    datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
                );
            }
            // Cold: the device column cache starts empty for each query.
            let (gpu_answer, cold, gpu_plan) = cold_runs(gpu_ctx, &sql, args.runs).await?;
            let colds: Vec<Duration> = cold.iter().map(|run| run.time).collect();
            if args.verbose {
                for run in &cold {
                    eprintln!("q{n}: GPU cold run {:.1} ms ({})", ms(run.time), run.fill);
                }
                eprintln!(
                    "q{n}: GPU plan with the metrics of the cold run\n{}",
                    DisplayableExecutionPlan::with_metrics(gpu_plan.as_ref()).indent(true)
                );
            }
            let mut warm = Vec::new();
            let mut last_gpu_plan = Arc::clone(&gpu_plan);
            for _ in 0..args.runs {
                let (_, time, plan) = run_once(gpu_ctx, &sql).await?;
                warm.push(time);
                last_gpu_plan = plan;
                if args.verbose {
                    eprintln!("q{n}: GPU run {:.1} ms", ms(time));
                }
            }
            report.first_cold = Some(colds[0]);
            let (cold_between, warm_between) = (
                bytes_down_between_gpu_nodes(&gpu_plan),
                bytes_down_between_gpu_nodes(&last_gpu_plan),
            );
            if args.verbose {
                eprintln!(
                    "q{n}: bytes copied down between GPU nodes: cold {cold_between}, warm {warm_between}"
                );
            }
            report.between_gpu_nodes = Some((cold_between, warm_between));
            let (warm_up, warm_down) = bytes_over_the_bus(&last_gpu_plan);
            if args.verbose {
                eprintln!("q{n}: bytes over the bus, warm: up {warm_up}, down {warm_down}");
            }
            report.warm_over_the_bus = Some((warm_up, warm_down));
            report.gpu = Some((median(colds), median(warm)));
            if args.verbose {
                // The last warm run's metrics: the cold run's include
                // one-time costs (kernel loading, pinned buffers).
                eprintln!(
                    "q{n}: GPU plan with the metrics of the last warm run\n{}",
                    DisplayableExecutionPlan::with_metrics(last_gpu_plan.as_ref()).indent(true)
                );
            }
            let decisions = gpu_decisions(&gpu_plan, gpu_ctx.state().config_options());
            if args.decisions {
                for decision in &decisions {
                    eprintln!("q{n}: {decision}");
                }
            }
            report.joins_on_gpu = decisions
                .iter()
                .filter(|d| d.on_gpu() && d.operator.contains("Join"))
                .count();
            report.aggregations_on_gpu = decisions
                .iter()
                .filter(|d| d.on_gpu() && d.operator.contains("Aggregate"))
                .count();
            report.scan_filters_on_gpu = decisions
                .iter()
                .filter(|d| d.on_gpu() && d.to_string().contains("scan_filter"))
                .count();
            // A join's or aggregation's reason first: filters are listed
            // too, and most that stay on the CPU are small.
            let cpu_reason = |d: &datafusion_gpu::NodeDecision| match &d.placement {
                Placement::Cpu { reason } => Some(format!("{}: {reason}", d.operator)),
                Placement::Gpu { .. } => None,
            };
            report.first_cpu_reason = decisions
                .iter()
                .filter(|d| d.operator != "FilterExec")
                .find_map(cpu_reason)
                .or_else(|| decisions.iter().find_map(cpu_reason));
            // Said as soon as it is known, so that a run stopped before
            // its end still tells which answers were checked.
            match answers_agree_every(&cpu_answer, &gpu_answer)? {
                Ok(()) if args.verbose => eprintln!("q{n}: answers agree"),
                Ok(()) => {}
                Err(difference) => {
                    eprintln!("q{n}: ANSWERS DISAGREE: {difference}");
                    disagreement = Some(format!("q{n}: {difference}"));
                }
            }
        }
        if let Some(one_ctx) = one_ctx {
            let (one_answers, cold, _) = cold_runs(one_ctx, &sql, args.runs).await?;
            let colds = cold.iter().map(|run| run.time).collect();
            let mut warm = Vec::new();
            for _ in 0..args.runs {
                warm.push(run_once(one_ctx, &sql).await?.1);
            }
            report.one_device = Some((median(colds), median(warm)));
            if let Err(difference) = answers_agree_every(&cpu_answer, &one_answers)? {
                eprintln!("q{n}: ANSWERS DISAGREE on one GPU: {difference}");
                disagreement.get_or_insert(format!("q{n} on one GPU: {difference}"));
            }
        }
        Ok((report, disagreement))
    };
    if args.verbose {
        eprintln!(
            "q{n}: {:.1} ms in all, timed runs included",
            ms(started.elapsed())
        );
    }
    result
}

fn print_header(with_duckdb: bool, with_one_device: bool) {
    println!();
    let duckdb = match with_duckdb {
        true => format!(" {:>10} {:>8}", "DuckDB ms", "vs DuckDB"),
        false => String::new(),
    };
    let one_device = match with_one_device {
        true => format!(" {:>12} {:>12}", "1 GPU cold", "1 GPU warm"),
        false => String::new(),
    };
    println!(
        "{:>5} {:>10} {:>12} {:>12} {:>8}{duckdb}{one_device} {:>7} {:>7} {:>6}  first reason a node stayed on the CPU",
        "query", "CPU ms", "GPU cold ms", "GPU warm ms", "speedup", "joins", "aggs", "scans"
    );
}

/// One row of the table, printed as soon as its query has run.
fn print_row(r: &QueryReport, with_duckdb: bool, with_one_device: bool) {
    let (cold, warm, speedup) = match r.gpu {
        Some((cold, warm)) => (
            format!("{:.1}", ms(cold)),
            format!("{:.1}", ms(warm)),
            format!("{:.2}x", ms(r.cpu) / ms(warm).max(1e-9)),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let duckdb = match (with_duckdb, r.duckdb, r.gpu) {
        (false, _, _) => String::new(),
        (true, Some(duck), Some((_, warm))) => {
            format!(
                " {duck:>10.1} {:>8}",
                format!("{:.2}x", duck / ms(warm).max(1e-9))
            )
        }
        (true, _, _) => format!(" {:>10} {:>8}", "-", "-"),
    };
    let one_device = match (with_one_device, r.one_device) {
        (false, _) => String::new(),
        (true, Some((cold, warm))) => format!(" {:>12.1} {:>12.1}", ms(cold), ms(warm)),
        (true, None) => format!(" {:>12} {:>12}", "-", "-"),
    };
    println!(
        "{:>5} {:>10.1} {cold:>12} {warm:>12} {speedup:>8}{duckdb}{one_device} {:>7} {:>7} {:>6}  {}",
        format!("q{}", r.query),
        ms(r.cpu),
        format!("{}/{}", r.joins_on_gpu, r.joins),
        format!("{}/{}", r.aggregations_on_gpu, r.aggregations),
        r.scan_filters_on_gpu,
        r.first_cpu_reason.as_deref().unwrap_or("")
    );
}

/// The totals line (and the JSON file and the chart when asked).
fn print_totals(
    args: &Args,
    gpu: &std::result::Result<String, String>,
    reports: &[QueryReport],
) -> Result<()> {
    let total_cpu: f64 = reports.iter().map(|r| ms(r.cpu)).sum();
    let total_cold: f64 = reports.iter().filter_map(|r| r.gpu.map(|g| ms(g.0))).sum();
    let total_warm: f64 = reports.iter().filter_map(|r| r.gpu.map(|g| ms(g.1))).sum();
    let duckdb = match args.duckdb {
        true => {
            let total: f64 = reports.iter().filter_map(|r| r.duckdb).sum();
            format!(
                " {total:>10.1} {:>8}",
                format!("{:.2}x", total / total_warm.max(1e-9))
            )
        }
        false => String::new(),
    };
    // The first device alone (`--one-device`): its totals, cold and warm.
    let one_device_totals = args.one_device.then(|| {
        let total = |pick: fn((Duration, Duration)) -> Duration| -> f64 {
            reports
                .iter()
                .filter_map(|r| r.one_device.map(|g| ms(pick(g))))
                .sum()
        };
        (total(|g| g.0), total(|g| g.1))
    });
    let one_device = one_device_totals.map_or(String::new(), |(cold, warm)| {
        format!(" {cold:>12.1} {warm:>12.1}")
    });
    println!(
        "total {total_cpu:>10.1} {total_cold:>12.1} {total_warm:>12.1} {:>7.2}x{duckdb}{one_device}",
        total_cpu / total_warm.max(1e-9)
    );
    let between: Vec<(usize, usize)> = reports
        .iter()
        .filter_map(|r| r.between_gpu_nodes.map(|(_, warm)| (r.query, warm)))
        .filter(|&(_, warm)| warm > 0)
        .collect();
    if !between.is_empty() {
        let each: Vec<String> = between
            .iter()
            .map(|&(q, bytes)| format!("q{q} {}", byte_count(bytes)))
            .collect();
        println!("copied down between GPU nodes, warm: {}", each.join(", "));
    }
    let over_the_bus: Vec<String> = reports
        .iter()
        .filter_map(|r| r.warm_over_the_bus.map(|bytes| (r.query, bytes)))
        .filter(|&(_, (up, down))| up + down > 0)
        .map(|(q, (up, down))| format!("q{q} {} up, {} down", byte_count(up), byte_count(down)))
        .collect();
    if !over_the_bus.is_empty() {
        println!(
            "over the bus, warm, every GPU node: {}",
            over_the_bus.join("; ")
        );
    }
    if args.runs > 1 {
        let first_cold: f64 = reports.iter().filter_map(|r| r.first_cold.map(ms)).sum();
        println!(
            "the first of each query's cold runs: {first_cold:.1} ms in all, {:.2}x",
            total_cpu / first_cold.max(1e-9)
        );
    }
    if let Some((cold, warm)) = one_device_totals {
        println!(
            "every device against the first alone: cold {:.2}x, warm {:.2}x",
            cold / total_cold.max(1e-9),
            warm / total_warm.max(1e-9)
        );
    }
    if let Some(path) = &args.json {
        std::fs::File::create(path)
            .and_then(|mut f| f.write_all(report_json(args, gpu, reports).as_bytes()))
            .map_err(|e| DataFusionError::Execution(format!("{}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.chart {
        let against = |other: &dyn Fn(&QueryReport) -> Option<f64>| -> Vec<(u32, f64)> {
            reports
                .iter()
                .filter_map(|r| Some((r.query as u32, other(r)? / ms(r.gpu?.1).max(1e-9))))
                .collect()
        };
        let mut series = vec![("GPU warm against DataFusion", against(&|r| Some(ms(r.cpu))))];
        if args.duckdb {
            series.push(("GPU warm against DuckDB", against(&|r| r.duckdb)));
        }
        let title = format!(
            "TPC-H-derived SF {} ({} tables): speedup per query",
            args.scale_factor,
            args.format.name()
        );
        write_chart(path, &title, &series).map_err(DataFusionError::Execution)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// A bar chart of `series` (name, (query, speedup) per query) as SVG at
/// `path`, with a line at 1x.
fn write_chart(
    path: &Path,
    title: &str,
    series: &[(&str, Vec<(u32, f64)>)],
) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let queries: Vec<u32> = series
        .first()
        .map_or_else(Vec::new, |(_, v)| v.iter().map(|(q, _)| *q).collect());
    let n = queries.len().max(1) as f64;
    let top = series
        .iter()
        .flat_map(|(_, v)| v.iter().map(|(_, r)| *r))
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (1000, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..top)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(queries.len())
        .x_label_formatter(&|x| {
            // A label at each whole position, the query there.
            let i = x.round();
            match (i >= 0.0 && (x - i).abs() < 1e-6).then(|| queries.get(i as usize)) {
                Some(Some(q)) => format!("q{q}"),
                _ => String::new(),
            }
        })
        .y_desc("speedup (x)")
        .draw()
        .map_err(|e| fail(&e))?;
    let colors = [RGBColor(46, 125, 50), RGBColor(21, 101, 192)];
    let width = 0.8 / series.len().max(1) as f64;
    for (s, (name, values)) in series.iter().enumerate() {
        let color = colors[s % colors.len()];
        let left = -0.4 + s as f64 * width;
        let bars = values.iter().map(|(q, r)| {
            let x = queries.iter().position(|p| p == q).unwrap_or(0) as f64 + left;
            Rectangle::new([(x, 0.0), (x + width, *r)], color.filled())
        });
        chart
            .draw_series(bars)
            .map_err(|e| fail(&e))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            [(-0.5, 1.0), (n - 0.5, 1.0)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| fail(&e))?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
