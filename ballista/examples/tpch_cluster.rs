//! The TPC-H-derived queries through a Ballista cluster of GPU and CPU
//! executors, answers checked against DataFusion alone.
//!
//! Starts a scheduler and executors in this process (by default one whose
//! stages run through datafusion-gpu's rule and one plain Ballista
//! executor), writes the eight tables as Parquet once (`--data DIR`, shared
//! with the crate's `tpch` example), runs each query on DataFusion in this
//! process and through the cluster, and prints both times and whether the
//! answers agree. Exits with an error where any answer differs.
//!
//! ```text
//! cargo run --release -p datafusion-gpu-ballista --example tpch_cluster -- \
//!     [--sf 1] [--executors gpu,cpu] [--queries 1,3,9] [--set gpu.placement=always]
//! ```

#[path = "common/cluster.rs"]
mod cluster;
#[path = "../../tests/common/slt_files.rs"]
mod slt_files;
#[path = "../../examples/common/tpch.rs"]
mod tpch_data;

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use indicatif::ProgressBar;

use cluster::Executor;
use tpch_data::{answers_agree, query_sql, write_parquet_tables, TABLES};

#[derive(Debug, clap::Parser)]
#[command(name = "tpch_cluster")]
struct Args {
    /// Scale factor (1 is about 1 GB of data).
    #[arg(long = "sf", default_value_t = 1.0)]
    scale_factor: f64,
    /// The executors, in order: `gpu` (stages through datafusion-gpu's
    /// rule) or `cpu` (Ballista's own engine).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("gpu"), String::from("cpu")])]
    executors: Vec<String>,
    /// Queries to run, e.g. 1,3,9.
    #[arg(long, value_delimiter = ',', default_values_t = 1..=22u32,
          value_parser = clap::value_parser!(u32).range(1..=22))]
    queries: Vec<u32>,
    /// Target partitions of both sessions; default: the host's cores.
    #[arg(long)]
    partitions: Option<usize>,
    /// Task slots of each executor (fewer than the partitions: a task
    /// runs several partitions of a stage); default: the partitions.
    #[arg(long)]
    slots: Option<usize>,
    /// Folder of the Parquet files (`SF<sf>/<table>/` below it).
    #[arg(long, default_value = "tpch-data")]
    data: PathBuf,
    /// A setting of the cluster's session, e.g. gpu.placement=always
    /// (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.scale_factor.is_nan() || args.scale_factor <= 0.0 {
        return Err(DataFusionError::Configuration(
            "--sf must be positive".into(),
        ));
    }
    let executors = args
        .executors
        .iter()
        .map(|kind| match kind.as_str() {
            "gpu" => Ok(Executor::Gpu),
            "cpu" => Ok(Executor::Cpu),
            other => Err(DataFusionError::Configuration(format!(
                "--executors: {other} is neither gpu nor cpu"
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    if executors.is_empty() {
        return Err(DataFusionError::Configuration("--executors: none".into()));
    }
    let partitions = args
        .partitions
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()));
    let test_files = slt_files::find_test_files().map_err(DataFusionError::Execution)?;
    println!(
        "GPU: {}",
        datafusion_gpu::gpu_status().unwrap_or_else(|e| format!("none ({e})"))
    );

    let folder = args.data.join(format!("SF{}", args.scale_factor));
    let started = Instant::now();
    if write_parquet_tables(
        &folder,
        args.scale_factor,
        partitions,
        &ProgressBar::hidden(),
    )
    .await?
        > 0
    {
        println!(
            "wrote the tables in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    let local =
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(partitions));
    let slots = args.slots.unwrap_or(partitions);
    let cluster = cluster::start(&executors, slots, partitions).await?;
    for setting in &args.settings {
        let (key, value) = setting.split_once('=').ok_or_else(|| {
            DataFusionError::Configuration(format!("--set {setting}: expected KEY=VALUE"))
        })?;
        cluster.ctx.sql(&format!("SET {key} = '{value}'")).await?;
    }
    for name in TABLES {
        let path = folder.join(name);
        let path = path
            .to_str()
            .ok_or_else(|| DataFusionError::Execution(format!("{}: not UTF-8", path.display())))?;
        for ctx in [&local, &cluster.ctx] {
            ctx.register_parquet(name, path, ParquetReadOptions::default())
                .await?;
        }
    }

    println!(
        "{:>5} {:>14} {:>12}  answers",
        "query", "DataFusion ms", "cluster ms"
    );
    let (mut local_total, mut cluster_total, mut differing) = (0.0, 0.0, Vec::new());
    for &q in &args.queries {
        let sql = query_sql(&test_files, q as usize)?;
        let time = |start: Instant| start.elapsed().as_secs_f64() * 1e3;
        let start = Instant::now();
        let expected = local.sql(&sql).await?.collect().await?;
        let local_ms = time(start);
        let start = Instant::now();
        let answer = cluster.ctx.sql(&sql).await?.collect().await?;
        let cluster_ms = time(start);
        let verdict = match answers_agree(&expected, &answer)? {
            Ok(()) => "agree".to_string(),
            Err(why) => {
                differing.push(q);
                format!("DIFFER: {why}")
            }
        };
        println!(
            "{:>5} {local_ms:>14.1} {cluster_ms:>12.1}  {verdict}",
            format!("q{q}")
        );
        local_total += local_ms;
        cluster_total += cluster_ms;
    }
    println!("{:>5} {local_total:>14.1} {cluster_total:>12.1}", "total");
    println!(
        "{} executors ({}); tasks on the GPU executors: {}, with GPU nodes: {}",
        executors.len(),
        args.executors.join(", "),
        cluster.stages_made(),
        cluster.stages_on_gpu()
    );
    if !differing.is_empty() {
        return Err(DataFusionError::Execution(format!(
            "answers differ for queries {differing:?}"
        )));
    }
    println!("answers agree on all {} queries", args.queries.len());
    Ok(())
}
