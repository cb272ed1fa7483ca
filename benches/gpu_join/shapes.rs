//! The placement sweep, `--shapes`: join and aggregation shapes a user may
//! run (an empty and a tiny build side, outer joins, two keys, semi and
//! anti joins, few and many groups), each at 2^n rows a side for n in
//! `--log2-rows-list` (default `20,22,24,26`), timed three ways in one
//! process: DataFusion alone (`gpu.enabled = false`), the defaults
//! (`gpu.placement = 'cost'`) and every supported node on the GPU
//! (`gpu.placement = 'always'`). Each way runs once to warm up, then the
//! ways take turns `--runs` times (default 2; more for a shape whose
//! slowest warm-up run takes milliseconds: as many as 400 ms holds of
//! that run, at most 25), the median counting; every answer is checked
//! against DataFusion's by an order-independent checksum of all its rows.
//! `--only a,b` runs the shapes whose names contain one of the words.
//!
//! Per shape and size it prints the three times, the defaults' and the
//! GPU's ratio to DataFusion, where the defaults placed each join and
//! aggregation, and the cost model's estimates (`gpu_decisions`) beside the
//! measured times of the GPU path and of DataFusion: the error of the
//! estimates; and each way's median planning time (SQL to the physical
//! plan, the rule's rewrite included), the share of a small shape's time
//! that placement cannot win back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::{gpu_decisions, gpu_session_context, NodeDecision, Placement};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::median;

/// A shape: its name and its SQL over `r` (unique keys), `s` (keys drawn
/// from `r`'s), `tiny` (1,000 of `r`'s rows) and `empty` (none).
const SHAPES: &[(&str, &str)] = &[
    (
        "inner join, aggregated",
        "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k",
    ),
    (
        "inner join, rows out",
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k",
    ),
    (
        "inner join, two keys",
        "SELECT r.v, s.v FROM r JOIN s ON r.k = s.k AND r.k2 = s.k2",
    ),
    (
        "tiny build side",
        "SELECT t.v, s.v FROM tiny t JOIN s ON t.k = s.k",
    ),
    (
        "empty build side",
        "SELECT e.v, s.v FROM empty e JOIN s ON e.k = s.k",
    ),
    (
        "left join",
        "SELECT r.v, s.v FROM r LEFT JOIN s ON r.k = s.k",
    ),
    (
        "right join",
        "SELECT r.v, s.v FROM r RIGHT JOIN s ON r.k = s.k",
    ),
    (
        "full join, two keys",
        "SELECT r.v, s.v FROM r FULL JOIN s ON r.k = s.k AND r.k2 = s.k2",
    ),
    (
        "semi join",
        "SELECT s.v FROM s WHERE EXISTS (SELECT 1 FROM r WHERE r.k = s.k)",
    ),
    (
        "anti join",
        "SELECT s.v FROM s WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.k = s.k AND r.v < 500000)",
    ),
    (
        "no GROUP BY",
        "SELECT count(*), sum(v), min(v), max(v) FROM s",
    ),
    (
        "16 groups",
        "SELECT g16, count(*), sum(v) FROM s GROUP BY g16",
    ),
    (
        "65,536 groups",
        "SELECT g64k, count(*), sum(v) FROM s GROUP BY g64k",
    ),
    (
        "rows/4 groups",
        "SELECT gmany, count(*), sum(v), max(k) FROM s GROUP BY gmany",
    ),
];

/// The three ways a shape runs.
const WAYS: [(&str, &[&str]); 3] = [
    ("DataFusion", &["SET gpu.enabled = false"]),
    (
        "defaults",
        &["SET gpu.enabled = true", "SET gpu.placement = 'cost'"],
    ),
    (
        "GPU always",
        &["SET gpu.enabled = true", "SET gpu.placement = 'always'"],
    ),
];

/// `columns` (all Int64) in `partitions` partitions of 8,192-row batches.
fn table(columns: Vec<(&str, Vec<i64>)>, partitions: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, _)| Field::new(*name, DataType::Int64, false))
            .collect::<Vec<_>>(),
    ));
    let rows = columns.first().map_or(0, |(_, values)| values.len());
    let per = rows.div_ceil(partitions.max(1)).max(1);
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions.max(1)];
    for (p, start) in (0..rows).step_by(per).enumerate() {
        let end = (start + per).min(rows);
        for batch_start in (start..end).step_by(8192) {
            let batch_end = (batch_start + 8192).min(end);
            let arrays: Vec<ArrayRef> = columns
                .iter()
                .map(|(_, values)| {
                    Arc::new(Int64Array::from(values[batch_start..batch_end].to_vec())) as ArrayRef
                })
                .collect();
            parts[p].push(RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap());
        }
    }
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

/// Registers `r`, `s`, `tiny` and `empty` at 2^`log2` rows a side.
fn register(ctx: &SessionContext, log2: usize, partitions: usize) {
    let rows = 1usize << log2;
    let mut rng = StdRng::seed_from_u64(log2 as u64);
    let mut r_keys: Vec<i64> = (0..rows as i64).collect();
    r_keys.shuffle(&mut rng);
    let r_v: Vec<i64> = (0..rows).map(|_| rng.random_range(0..1_000_000)).collect();
    let s_keys: Vec<i64> = (0..rows)
        .map(|_| rng.random_range(0..rows as i64))
        .collect();
    let s_v: Vec<i64> = (0..rows).map(|_| rng.random_range(0..1_000_000)).collect();
    let k2 = |keys: &[i64]| keys.iter().map(|k| k % 1024).collect::<Vec<_>>();
    let side =
        |keys: &[i64], v: &[i64]| vec![("k", keys.to_vec()), ("k2", k2(keys)), ("v", v.to_vec())];
    let tiny = 1000.min(rows);
    let s_columns = vec![
        ("k", s_keys.clone()),
        ("k2", k2(&s_keys)),
        ("v", s_v.clone()),
        ("g16", s_keys.iter().map(|k| k % 16).collect()),
        ("g64k", s_keys.iter().map(|k| k % 65_536).collect()),
        ("gmany", s_keys.iter().map(|k| k / 4).collect()),
    ];
    ctx.register_table("r", table(side(&r_keys, &r_v), partitions))
        .unwrap();
    ctx.register_table("s", table(s_columns, partitions))
        .unwrap();
    ctx.register_table(
        "tiny",
        table(side(&r_keys[..tiny], &r_v[..tiny]), partitions),
    )
    .unwrap();
    ctx.register_table("empty", table(side(&[], &[]), partitions))
        .unwrap();
}

/// An order-independent checksum of every row (NULL counted as a value of
/// its own), and the rows.
fn checksum(batches: &[RecordBatch]) -> (u64, usize) {
    let mut sum = 0u64;
    let mut rows = 0;
    for batch in batches {
        let columns: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .map(|c| cast(c, &DataType::Int64).expect("every output column is an integer"))
            .collect();
        for row in 0..batch.num_rows() {
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for column in &columns {
                let value = match column.is_null(row) {
                    true => 0x9e37_79b9_7f4a_7c15,
                    false => column.as_primitive::<Int64Type>().value(row) as u64,
                };
                h = (h ^ value).wrapping_mul(0x0100_0000_01b3);
            }
            sum = sum.wrapping_add(h);
        }
        rows += batch.num_rows();
    }
    (sum, rows)
}

/// Sets a way's options.
async fn set(ctx: &SessionContext, settings: &[&str]) {
    for setting in settings {
        ctx.sql(setting).await.unwrap();
    }
}

/// The time, in milliseconds, of the timed runs of a shape's slowest way
/// (by its warm-up run): a shape of a few milliseconds runs more often
/// than `--runs`, so that its median is not one run's noise.
const MIN_TIMED_MS: u64 = 400;

/// The most timed runs a way takes.
const MAX_TIMED_RUNS: usize = 25;

/// The timed runs of each way: `runs`, or more where the slowest warm-up
/// run took less than [`MIN_TIMED_MS`] over `runs`.
fn timed_runs(runs: usize, slowest_warm_up: Duration) -> usize {
    let per_run = slowest_warm_up.as_millis().max(1) as u64;
    let wanted = MIN_TIMED_MS.div_ceil(per_run) as usize;
    runs.max(1).max(wanted.min(MAX_TIMED_RUNS))
}

/// One run of `sql`.
struct Run {
    /// Planning and execution.
    time: Duration,
    /// Planning alone (SQL to the physical plan, the rule included).
    planning: Duration,
    answer: (u64, usize),
    plan: Arc<dyn ExecutionPlan>,
}

async fn run_once(ctx: &SessionContext, sql: &str) -> Run {
    let start = Instant::now();
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let planning = start.elapsed();
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
        .await
        .unwrap();
    Run {
        time: start.elapsed(),
        planning,
        answer: checksum(&batches),
        plan,
    }
}

/// The estimate of the plan's costliest node on the CPU (the one the
/// shape is about; a final aggregation of a few partial rows is another):
/// GPU and CPU times in milliseconds, as `gpu_decisions` printed them.
fn estimated_ms(decisions: &[NodeDecision]) -> Option<(f64, f64)> {
    decisions
        .iter()
        .filter_map(|d| {
            let text = match &d.placement {
                Placement::Gpu { algorithm } => algorithm,
                Placement::Cpu { reason } => reason,
            };
            let after = text.split("estimated GPU ").nth(1)?;
            let gpu = parse_ms(after)?;
            let cpu = parse_ms(after.split(" against CPU ").nth(1)?)?;
            Some((gpu, cpu))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn parse_ms(text: &str) -> Option<f64> {
    let (number, rest) = text.split_once(' ')?;
    rest.starts_with("ms")
        .then(|| number.parse().ok())
        .flatten()
}

fn ms(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

/// Runs the sweep.
pub async fn benchmark(log2_list: &[usize], runs: usize, only: &[String]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = SessionConfig::new().with_target_partitions(cores);
    println!(
        "placement sweep: {cores} cores, sizes 2^{log2_list:?} rows a side, a warm-up and {runs} \
         timed runs a way (more where the slowest way's warm-up run fits more in {MIN_TIMED_MS} ms, \
         at most {MAX_TIMED_RUNS}), the ways taking turns, the median counting"
    );
    if let Some(device) = datafusion_gpu::gpu::gpu_runtime()
        .ok()
        .and_then(|runtime| runtime.devices().first().cloned())
    {
        match device.constants() {
            Ok(constants) => println!("device constants: {constants}"),
            Err(reason) => println!("device constants not measured: {reason}"),
        }
    }
    println!(
        "| shape | rows | DataFusion ms | defaults ms | defaults / DF | GPU always ms | always / DF \
         | defaults placed (GPU/all) | estimated GPU / CPU ms | GPU error | CPU error |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut worst_default: Option<(f64, String)> = None;
    for &log2 in log2_list {
        let ctx = gpu_session_context(config.clone());
        register(&ctx, log2, cores);
        for (name, sql) in SHAPES {
            if !only.is_empty() && !only.iter().any(|word| name.contains(word.as_str())) {
                continue;
            }
            let mut expected = None;
            let mut defaults_placed = String::new();
            let mut estimate = None;
            let mut slowest_warm_up = Duration::ZERO;
            for (way, settings) in WAYS {
                set(&ctx, settings).await;
                let Run {
                    time, answer, plan, ..
                } = run_once(&ctx, sql).await;
                slowest_warm_up = slowest_warm_up.max(time);
                let expected = *expected.get_or_insert(answer);
                assert_eq!(
                    answer, expected,
                    "{name} at 2^{log2}, {way}: the answer differs"
                );
                let decisions = gpu_decisions(&plan, ctx.state().config_options());
                if way == "defaults" {
                    let on_gpu = decisions.iter().filter(|d| d.on_gpu()).count();
                    defaults_placed = format!("{on_gpu}/{}", decisions.len());
                }
                if way == "GPU always" {
                    estimate = estimated_ms(&decisions);
                    for decision in &decisions {
                        println!("    2^{log2} {name}, always: {decision}");
                    }
                }
            }
            // The ways take turns, so that a drift of the host's state
            // weighs on each alike.
            let mut way_times: [Vec<Duration>; 3] = Default::default();
            let mut way_planning: [Vec<Duration>; 3] = Default::default();
            for _ in 0..timed_runs(runs, slowest_warm_up) {
                for ((way, settings), (times, planning)) in WAYS
                    .iter()
                    .zip(way_times.iter_mut().zip(way_planning.iter_mut()))
                {
                    set(&ctx, settings).await;
                    let run = run_once(&ctx, sql).await;
                    assert_eq!(
                        Some(run.answer),
                        expected,
                        "{name} at 2^{log2}, {way}: the answer differs"
                    );
                    times.push(run.time);
                    planning.push(run.planning);
                }
            }
            let times: Vec<Duration> = way_times.iter_mut().map(|t| median(t)).collect();
            let planning: Vec<String> = way_planning
                .iter_mut()
                .map(|t| format!("{:.2}", ms(median(t))))
                .collect();
            println!(
                "    2^{log2} {name}, planning ms (median; DataFusion, defaults, always): {}",
                planning.join(", ")
            );
            let [datafusion, defaults, always] = [times[0], times[1], times[2]];
            let ratio = |t: Duration| ms(datafusion) / ms(t).max(1e-3);
            let (estimates, errors) = match estimate {
                Some((gpu, cpu)) => (
                    format!("{gpu:.1} / {cpu:.1}"),
                    format!(
                        "{:+.0} % | {:+.0} %",
                        100.0 * (gpu / ms(always) - 1.0),
                        100.0 * (cpu / ms(datafusion) - 1.0)
                    ),
                ),
                None => ("none".into(), "| ".into()),
            };
            println!(
                "| {name} | 2^{log2} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}x | {defaults_placed} | {estimates} | {errors} |",
                ms(datafusion),
                ms(defaults),
                ratio(defaults),
                ms(always),
                ratio(always),
            );
            let shape = format!("{name} at 2^{log2}");
            if worst_default
                .as_ref()
                .is_none_or(|(worst, _)| ratio(defaults) < *worst)
            {
                worst_default = Some((ratio(defaults), shape));
            }
        }
    }
    if let Some((ratio, shape)) = worst_default {
        println!("slowest under the defaults against DataFusion: {shape}, {ratio:.2}x");
    }
}
