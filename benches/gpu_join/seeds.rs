//! The seeds' benchmark workloads as criterion benchmarks (`--seeds`):
//! the join workloads RT-1 to RT-4 (seed 000), HE-3 (seed 004) and B2 to
//! B9 (seed 002), and the group-by workloads B10, B11 and B12 (seed 002),
//! each as SQL over `MemTable`s on DataFusion's own operators (a plain
//! `SessionContext`, all cores) and with the GPU rule (size thresholds at
//! zero, so the GPU operator is what is measured).
//!
//! Data is generated before a workload's benchmarks and dropped after them,
//! outside the timed region. Each timed iteration is planning, execution and
//! collecting the (small) answer. Throughput is input tuples per second.
//! Before timing, the GPU answer is checked against DataFusion's (an
//! order-independent checksum of every output row) and the GPU operator is
//! checked to have run; a mismatch is reported and makes the process fail
//! after the remaining workloads. The device time of each GPU iteration
//! (kernels and copies, read from CUDA events and summed over the
//! partitions that ran concurrently) is reported beside criterion's wall
//! time, as `SEED` lines and a closing Markdown table, with the read-once
//! floor: every input byte read once at the device memory's bandwidth
//! (measured in the same process by a device-to-device copy, bytes read and
//! written). That is a bound on any join, not the kernels' floor of the
//! performance method (the bytes each kernel must move), which
//! BENCHMARKS.md works out per kernel and `scripts/ncu_floor.py` reads,
//! as the DRAM bytes the hardware counted, from a profiled `--check-only`
//! run.
//!
//! Sizes follow the seeds scaled to a 16-core host's CPU baseline (the
//! papers' 2^27 to 2^28 rows become 2^24 to 2^26); `--log2-rows n` moves
//! every size (the default n = 24 is the base join size N). `--seeds a,b`
//! keeps the workload families whose name contains one of the words
//! (`rt1`, `b10`, `join`, `group_by`, ...). `--check-only` runs each
//! workload once on the GPU, checked and untimed (for a profiler).
//! `--pinned` gives the GPU runs pinned copies of the tables (`pin_batches`),
//! as a pipeline that pins its batches would: a hash join then carries its
//! probe side's folded values through the partitioning
//! (`gpu.tuning.carry_folded_values`), which it does only from pinned memory.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
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

use super::{median, operator_metric};

const JOIN_NARROW: &str = "SELECT count(*), sum(r.p1), sum(s.p1) FROM r JOIN s ON r.k = s.k";
const JOIN_WIDE: &str =
    "SELECT count(*), sum(r.p1), sum(r.p2), sum(s.p1), sum(s.p2) FROM r JOIN s ON r.k = s.k";
const JOIN_FOUR: &str = "SELECT count(*), sum(r.p1), sum(r.p2), sum(r.p3), sum(r.p4), \
     sum(s.p1), sum(s.p2), sum(s.p3), sum(s.p4) FROM r JOIN s ON r.k = s.k";
const GROUP_BY: &str = "SELECT k, max(r1), max(r2) FROM r GROUP BY k";

/// One column of generated data.
enum Column {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::Int32(v) => v.len(),
            Column::Int64(v) => v.len(),
        }
    }

    fn slice(&self, start: usize, end: usize) -> ArrayRef {
        match self {
            Column::Int32(v) => Arc::new(Int32Array::from(v[start..end].to_vec())),
            Column::Int64(v) => Arc::new(Int64Array::from(v[start..end].to_vec())),
        }
    }

    fn data_type(&self) -> DataType {
        match self {
            Column::Int32(_) => DataType::Int32,
            Column::Int64(_) => DataType::Int64,
        }
    }
}

/// A table of equally long columns, split into `partitions` partitions of
/// 8192-row batches (each batch owns its buffers, as a scan's would).
fn mem_table(columns: Vec<(&str, Column)>, partitions: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, c)| Field::new(*name, c.data_type(), false))
            .collect::<Vec<_>>(),
    ));
    let rows = columns.first().map_or(0, |(_, c)| c.len());
    let per = rows.div_ceil(partitions).max(1);
    let parts = (0..partitions)
        .map(|p| {
            let (start, end) = ((p * per).min(rows), ((p + 1) * per).min(rows));
            (start..end)
                .step_by(8192)
                .map(|first| {
                    let last = (first + 8192).min(end);
                    let arrays = columns.iter().map(|(_, c)| c.slice(first, last)).collect();
                    RecordBatch::try_new(Arc::clone(&schema), arrays).expect("generated batch")
                })
                .collect()
        })
        .collect();
    Arc::new(MemTable::try_new(schema, parts).expect("generated table"))
}

/// `n` values from `value(rng)`, generated on every core in chunks of 2^20
/// whose random streams depend only on `seed` and the chunk's position, so
/// the data is the same whatever the number of cores.
fn generate<T: Send + Default + Clone>(
    n: usize,
    seed: u64,
    value: impl Fn(&mut StdRng) -> T + Sync,
) -> Vec<T> {
    const CHUNK: usize = 1 << 20;
    let mut out = vec![T::default(); n];
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let per_thread = n.div_ceil(cores).div_ceil(CHUNK).max(1) * CHUNK;
    std::thread::scope(|scope| {
        for (t, part) in out.chunks_mut(per_thread).enumerate() {
            let value = &value;
            scope.spawn(move || {
                for (c, chunk) in part.chunks_mut(CHUNK).enumerate() {
                    let index = (t * per_thread / CHUNK + c) as u64;
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9) ^ index);
                    chunk.iter_mut().for_each(|v| *v = value(&mut rng));
                }
            });
        }
    });
    out
}

/// The keys 1..=n in random order.
fn shuffled_keys(n: usize, seed: u64) -> Vec<i32> {
    let mut keys: Vec<i32> = (1..=n as i32).collect();
    keys.shuffle(&mut StdRng::seed_from_u64(seed));
    keys
}

fn tuple_ids(n: usize) -> Vec<i32> {
    (0..n as i32).collect()
}

fn payload(n: usize, seed: u64) -> Column {
    Column::Int32(generate(n, seed, |rng| rng.random_range(0..1_000_000)))
}

/// Ranks 0..n drawn from Zipf(z) (uniform for z = 0).
fn zipf_ranks(n: usize, domain: usize, z: f64, seed: u64) -> Vec<usize> {
    if z == 0.0 {
        return generate(n, seed, |rng| rng.random_range(0..domain));
    }
    let zipf = rand_distr::Zipf::new(domain as f64, z).expect("Zipf parameters");
    generate(n, seed, |rng| rng.sample(zipf) as usize - 1)
}

/// A join's two tables: R(k, p1[, p2 ...]) and S(k, p1[, p2 ...]), with
/// Int32 keys and payloads (p1 the tuple id, the others random).
fn join_tables(
    r_keys: Vec<i32>,
    s_keys: Vec<i32>,
    payloads: usize,
    partitions: usize,
) -> Vec<(&'static str, Arc<MemTable>)> {
    typed_join_tables(r_keys, s_keys, payloads, Widths::default(), partitions)
}

/// Eight-byte keys or payloads in place of four-byte ones (seed 002's B8).
#[derive(Default, Clone, Copy)]
struct Widths {
    keys: bool,
    payloads: bool,
}

fn typed_join_tables(
    r_keys: Vec<i32>,
    s_keys: Vec<i32>,
    payloads: usize,
    widths: Widths,
    partitions: usize,
) -> Vec<(&'static str, Arc<MemTable>)> {
    const NAMES: [&str; 4] = ["p1", "p2", "p3", "p4"];
    let side = |keys: Vec<i32>, seed: u64| {
        let n = keys.len();
        let keys = if widths.keys {
            // Spread over 64 bits so the keys need all eight bytes.
            Column::Int64(
                keys.into_iter()
                    .map(|k| (k as i64) << 32 | k as i64)
                    .collect(),
            )
        } else {
            Column::Int32(keys)
        };
        let mut columns = vec![("k", keys)];
        for (i, name) in NAMES.iter().take(payloads).enumerate() {
            let values = if i == 0 {
                Column::Int32(tuple_ids(n))
            } else {
                payload(n, seed + i as u64)
            };
            let values = match (widths.payloads, values) {
                (true, Column::Int32(v)) => Column::Int64(v.into_iter().map(i64::from).collect()),
                (_, values) => values,
            };
            columns.push((*name, values));
        }
        mem_table(columns, partitions)
    };
    vec![("r", side(r_keys, 11)), ("s", side(s_keys, 21))]
}

/// One workload: a family (criterion's group), a parameter, and how to make
/// its tables.
struct Workload {
    family: &'static str,
    parameter: String,
    /// Input tuples, the throughput's unit.
    tuples: u64,
    sql: &'static str,
    /// The GPU operator that must have run.
    operator: &'static str,
    tables: Box<dyn Fn(usize) -> NamedTables>,
}

/// A workload's tables by name, made for a size.
type NamedTables = Vec<(&'static str, Arc<MemTable>)>;

fn workloads(n: usize) -> Vec<Workload> {
    let big = 1usize << n;
    let mut all = Vec::new();
    // RT-1: unique 32-bit keys on both sides, payload = tuple id, one match
    // per tuple; |R| = |S| = N for N = 2^n .. 2^(n+2).
    for log2 in n..=n + 2 {
        let rows = 1usize << log2;
        all.push(Workload {
            family: "rt1_join_unique_keys",
            parameter: format!("2^{log2}"),
            tuples: 2 * rows as u64,
            sql: JOIN_NARROW,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                join_tables(shuffled_keys(rows, 1), shuffled_keys(rows, 2), 1, p)
            }),
        });
    }
    // RT-2: output multiplier m: R holds N/m distinct keys m times each and
    // every S key matches m of them, so the join emits m * N rows. RT-3
    // (the output-buffer ablation) is the same at 4x outputs and twice the
    // size: our join counts its output before writing it, so the paper's
    // page sizes have no counterpart here and only the size sweep remains.
    let multiplied = |family: &'static str, log2: usize, m: usize| {
        let rows = 1usize << log2;
        Workload {
            family,
            parameter: format!("2^{log2},{m}x"),
            tuples: 2 * rows as u64,
            sql: JOIN_NARROW,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let distinct = rows / m;
                let mut r: Vec<i32> = (0..rows).map(|i| (i % distinct) as i32 + 1).collect();
                r.shuffle(&mut StdRng::seed_from_u64(3));
                let s = generate(rows, 4, |rng| rng.random_range(1..=distinct as i32));
                join_tables(r, s, 1, p)
            }),
        }
    };
    for m in [1usize, 4, 16] {
        all.push(multiplied("rt2_join_output_multiplier", n, m));
    }
    all.push(multiplied("rt3_join_output_size", n + 1, 4));
    // RT-4: S keys Zipf(z) over R's keys in the hashed domain (rank i is
    // R's i-th key in shuffled order, so hot keys are spread over the hash
    // space).
    for z in [0.0, 0.25, 0.5, 0.75, 1.0] {
        all.push(Workload {
            family: "rt4_join_zipf",
            parameter: format!("z={z}"),
            tuples: 2 * big as u64,
            sql: JOIN_NARROW,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let r = shuffled_keys(big, 5);
                let s = zipf_ranks(big, big, z, 6)
                    .into_iter()
                    .map(|i| r[i])
                    .collect();
                join_tables(r, s, 1, p)
            }),
        });
    }
    // HE-3: X % of R's tuples get key 1 (the rest keep unique keys), S
    // uniform over 1..=N.
    for percent in [0usize, 25, 50, 100] {
        all.push(Workload {
            family: "he3_join_build_duplicates",
            parameter: format!("{percent}%"),
            tuples: 2 * big as u64,
            sql: JOIN_NARROW,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let mut r = shuffled_keys(big, 7);
                let duplicated = big * percent / 100;
                r[..duplicated].iter_mut().for_each(|k| *k = 1);
                let s = generate(big, 8, |rng| rng.random_range(1..=big as i32));
                join_tables(r, s, 1, p)
            }),
        });
    }
    // B2 / B3: narrow (one payload a side) and wide (two) PK-FK joins with
    // |S| = 2 |R|, |R| = N.
    for (family, wide) in [
        ("b2_join_narrow_pk_fk", false),
        ("b3_join_wide_pk_fk", true),
    ] {
        all.push(Workload {
            family,
            parameter: format!("R=2^{n},S=2^{}", n + 1),
            tuples: 3 * big as u64,
            sql: if wide { JOIN_WIDE } else { JOIN_NARROW },
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let s = generate(2 * big, 9, |rng| rng.random_range(1..=big as i32));
                join_tables(shuffled_keys(big, 10), s, if wide { 2 } else { 1 }, p)
            }),
        });
    }
    // B6: match ratio: S keys uniform over a domain 100/mr times R's.
    for match_percent in [100.0, 50.0, 25.0, 12.5] {
        all.push(Workload {
            family: "b6_join_match_ratio",
            parameter: format!("{match_percent}%"),
            tuples: 2 * big as u64,
            sql: JOIN_WIDE,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let domain = (big as f64 * 100.0 / match_percent) as i32;
                let s = generate(big, 13, |rng| rng.random_range(1..=domain));
                join_tables(shuffled_keys(big, 14), s, 2, p)
            }),
        });
    }
    // B4: size ratio: |S| = 2N, |R| from 2N down to N/8, two payloads.
    for log2_r in [n + 1, n.saturating_sub(1), n.saturating_sub(3)] {
        let r_rows = 1usize << log2_r;
        all.push(Workload {
            family: "b4_join_size_ratio",
            parameter: format!("R=2^{log2_r},S=2^{}", n + 1),
            tuples: (r_rows + 2 * big) as u64,
            sql: JOIN_WIDE,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let s = generate(2 * big, 22, |rng| rng.random_range(1..=r_rows as i32));
                join_tables(shuffled_keys(r_rows, 23), s, 2, p)
            }),
        });
    }
    // B5: payload count: one, two and four payload columns a side.
    for (payloads, sql) in [(1, JOIN_NARROW), (2, JOIN_WIDE), (4, JOIN_FOUR)] {
        all.push(Workload {
            family: "b5_join_payload_count",
            parameter: format!("{payloads}"),
            tuples: 2 * big as u64,
            sql,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let s = generate(big, 24, |rng| rng.random_range(1..=big as i32));
                join_tables(shuffled_keys(big, 25), s, payloads, p)
            }),
        });
    }
    // B7: foreign-key skew beyond RT-4's range, two payloads.
    for z in [0.5, 1.0, 1.5] {
        all.push(Workload {
            family: "b7_join_fk_skew",
            parameter: format!("z={z}"),
            tuples: 2 * big as u64,
            sql: JOIN_WIDE,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let r = shuffled_keys(big, 26);
                let s = zipf_ranks(big, big, z, 27)
                    .into_iter()
                    .map(|i| r[i])
                    .collect();
                join_tables(r, s, 2, p)
            }),
        });
    }
    // B8: data types: 4-byte keys with 8-byte payloads, 8-byte both.
    for (parameter, keys) in [("4B_key,8B_payload", false), ("8B_key,8B_payload", true)] {
        all.push(Workload {
            family: "b8_join_data_types",
            parameter: parameter.into(),
            tuples: 2 * big as u64,
            sql: JOIN_WIDE,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let s = generate(big, 28, |rng| rng.random_range(1..=big as i32));
                let widths = Widths {
                    keys,
                    payloads: true,
                };
                typed_join_tables(shuffled_keys(big, 29), s, 2, widths, p)
            }),
        });
    }
    // B9: many-to-many: both sides' keys uniform over K = N/8 .. N/2 keys,
    // N^2 / K output rows.
    for log2_k in [
        n.saturating_sub(3),
        n.saturating_sub(2),
        n.saturating_sub(1),
    ] {
        all.push(Workload {
            family: "b9_join_many_to_many",
            parameter: format!("K=2^{log2_k}"),
            tuples: 2 * big as u64,
            sql: JOIN_WIDE,
            operator: "GpuHashJoinExec",
            tables: Box::new(move |p| {
                let k = 1i32 << log2_k;
                let r = generate(big, 30, |rng| rng.random_range(1..=k));
                let s = generate(big, 31, |rng| rng.random_range(1..=k));
                join_tables(r, s, 2, p)
            }),
        });
    }
    // B10 / B11 / B12: MAX of two payloads grouped by keys uniform over g
    // groups (Int32 keys; B11 Int64 keys) or Zipf(z) (B12) over 4 N rows.
    let rows = 4 * big;
    let group_by = |family: &'static str, log2_g: u32, z: f64, wide_keys: bool| Workload {
        family,
        parameter: if family.starts_with("b12") {
            format!("g=2^{log2_g},z={z}")
        } else {
            format!("g=2^{log2_g}")
        },
        tuples: rows as u64,
        sql: GROUP_BY,
        operator: "GpuAggregateExec",
        tables: Box::new(move |p| {
            let ranks = zipf_ranks(rows, 1 << log2_g, z, 15);
            let k = if wide_keys {
                // Spread over 64 bits so the keys need all eight bytes.
                Column::Int64(ranks.into_iter().map(|i| (i as i64) << 31 | 7).collect())
            } else {
                Column::Int32(ranks.into_iter().map(|i| i as i32).collect())
            };
            let columns = vec![
                ("k", k),
                ("r1", payload(rows, 16)),
                ("r2", payload(rows, 17)),
            ];
            vec![("r", mem_table(columns, p))]
        }),
    };
    for log2_g in [1, 4, 8, 12, 16, 20, 24] {
        all.push(group_by("b10_group_by_int32_keys", log2_g, 0.0, false));
    }
    for log2_g in [4, 16, 24] {
        all.push(group_by("b11_group_by_int64_keys", log2_g, 0.0, true));
    }
    for log2_g in [12, 16] {
        for z in [0.5, 1.0, 1.5] {
            all.push(group_by("b12_group_by_zipf", log2_g, z, false));
        }
    }
    all
}

/// Order-independent checksum of every output row (all columns cast to
/// Int64), and the row count.
fn checksum(batches: &[RecordBatch]) -> (usize, u64) {
    let mut rows = 0;
    let mut sum = 0u64;
    for batch in batches {
        let columns: Vec<ArrayRef> = batch
            .columns()
            .iter()
            .map(|c| cast(c, &DataType::Int64).expect("integer answer column"))
            .collect();
        for i in 0..batch.num_rows() {
            let mut row = 0u64;
            for column in &columns {
                let value = column.as_primitive::<Int64Type>();
                let v = if value.is_null(i) {
                    0x5555_5555
                } else {
                    value.value(i) as u64
                };
                row = datafusion_gpu::ops::murmur3_finalizer(row.rotate_left(23) ^ v);
            }
            sum = sum.wrapping_add(row);
        }
        rows += batch.num_rows();
    }
    (rows, sum)
}

async fn run_query(ctx: &SessionContext, sql: &str) -> (Vec<RecordBatch>, Arc<dyn ExecutionPlan>) {
    let plan = ctx
        .sql(sql)
        .await
        .expect("plan")
        .create_physical_plan()
        .await
        .expect("physical plan");
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
        .await
        .expect("execute");
    (batches, plan)
}

/// Device time of one GPU run: kernels and copies of every GPU node.
fn device_time(plan: &Arc<dyn ExecutionPlan>) -> (Duration, Duration) {
    let mut kernels = 0;
    let mut copies = 0;
    for operator in ["GpuHashJoinExec", "GpuAggregateExec"] {
        kernels += operator_metric(plan, operator, "kernel_time").1;
        copies += operator_metric(plan, operator, "transfer_time").1;
    }
    (
        Duration::from_nanos(kernels as u64),
        Duration::from_nanos(copies as u64),
    )
}

/// One workload's outcome, for the closing table.
struct Summary {
    name: String,
    tuples: u64,
    /// Every input byte read once at the device memory's measured
    /// bandwidth (the answers are a few rows).
    read_once_floor: Option<Duration>,
    cpu: Duration,
    gpu: Option<(Duration, Duration, Duration)>,
    note: String,
}

fn rate(tuples: u64, time: Duration) -> f64 {
    tuples as f64 / time.as_secs_f64() / 1e6
}

pub fn benchmark(log2_rows: usize, families: &[String]) {
    // `--check-only`: each workload's check run alone, untimed.
    let check_only = std::env::args().any(|a| a == "--check-only");
    let pinned = std::env::args().any(|a| a == "--pinned");
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let gpu = gpu_runtime();
    let memory_bandwidth = match &gpu {
        Ok(gpu) => {
            println!("{}", gpu.describe());
            let bandwidth = measure_copy_bandwidth(&gpu.devices()[0], 1 << 30, 5)
                .expect("measuring the copy bandwidth");
            println!(
                "device memory: {:.0} GB/s (a device-to-device copy, bytes read and written)",
                bandwidth.device_memory / 1e9
            );
            Some(bandwidth.device_memory)
        }
        Err(reason) => {
            println!("GPU: not measured, {reason}");
            None
        }
    };
    let selected: Vec<Workload> = workloads(log2_rows)
        .into_iter()
        .filter(|w| families.is_empty() || families.iter().any(|f| w.family.contains(f.as_str())))
        .collect();
    println!(
        "seed workloads: {} selected, N = 2^{log2_rows}, {cores} cores, criterion: 10 samples, flat sampling",
        selected.len()
    );
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .with_output_color(false);
    let mut summaries = Vec::new();
    let mut failures = Vec::new();
    for workload in selected {
        let name = format!("{}/{}", workload.family, workload.parameter);
        let generated = Instant::now();
        let tables = (workload.tables)(cores);
        let bytes = input_bytes(&tables);
        println!(
            "{name}: data generated in {:.1} s, {:.2} GB of input",
            generated.elapsed().as_secs_f64(),
            bytes as f64 / 1e9
        );
        let config = || SessionConfig::new().with_target_partitions(cores);
        let cpu_ctx = SessionContext::new_with_config(config());
        let gpu_ctx = gpu_session_context(config());
        for (table, data) in &tables {
            cpu_ctx
                .register_table(*table, Arc::clone(data) as _)
                .expect("register");
            let gpu_data = match pinned {
                true => runtime.block_on(super::pinned_copy(data)).0,
                false => Arc::clone(data),
            };
            gpu_ctx
                .register_table(*table, gpu_data as _)
                .expect("register");
        }
        runtime.block_on(async {
            gpu_ctx
                .sql("SET gpu.placement = 'always'")
                .await
                .expect("SET");
            // --set gpu.KEY=VALUE: options of the GPU runs.
            for setting in super::sort_merge::gpu_settings() {
                gpu_ctx.sql(&format!("SET {setting}")).await.expect("SET");
            }
        });
        let cpu_answer = checksum(&runtime.block_on(run_query(&cpu_ctx, workload.sql)).0);
        // Before timing: the GPU operator runs and agrees with DataFusion.
        let mut note = String::new();
        let gpu_ok = gpu.is_ok() && {
            let (batches, plan) = runtime.block_on(run_query(&gpu_ctx, workload.sql));
            let (nodes, kernel_ns) = operator_metric(&plan, workload.operator, "kernel_time");
            if checksum(&batches) != cpu_answer {
                failures.push(format!("{name}: GPU answer differs from DataFusion's"));
                note = "ANSWER DIFFERS".into();
                false
            } else if nodes == 0 || kernel_ns == 0 {
                note = format!("{} did not run ({nodes} planned)", workload.operator);
                failures.push(format!("{name}: {note}"));
                false
            } else {
                true
            }
        };
        if check_only {
            // One GPU run per workload and no timing: what a profiler
            // (`ncu --print-summary per-kernel`) should see.
            println!(
                "{name}: GPU answer checked ({})",
                if gpu_ok { "agrees" } else { "not run" }
            );
            drop(tables);
            continue;
        }
        let mut group = criterion.benchmark_group(workload.family);
        group
            .throughput(Throughput::Elements(workload.tuples))
            .sampling_mode(SamplingMode::Flat);
        let cpu_times = RefCell::new(Vec::new());
        group.bench_function(BenchmarkId::new("datafusion", &workload.parameter), |b| {
            b.iter_custom(|iterations| {
                let start = Instant::now();
                for _ in 0..iterations {
                    let one = Instant::now();
                    runtime.block_on(run_query(&cpu_ctx, workload.sql));
                    cpu_times.borrow_mut().push(one.elapsed());
                }
                start.elapsed()
            })
        });
        let gpu_times = RefCell::new(Vec::new());
        let device_times = RefCell::new(Vec::new());
        if gpu_ok {
            group.bench_function(BenchmarkId::new("gpu", &workload.parameter), |b| {
                b.iter_custom(|iterations| {
                    let start = Instant::now();
                    for _ in 0..iterations {
                        let one = Instant::now();
                        let (_, plan) = runtime.block_on(run_query(&gpu_ctx, workload.sql));
                        gpu_times.borrow_mut().push(one.elapsed());
                        device_times.borrow_mut().push(device_time(&plan));
                    }
                    start.elapsed()
                })
            });
        }
        group.finish();
        let cpu = median(&mut cpu_times.borrow_mut());
        let gpu_result = gpu_ok.then(|| {
            let mut devices = device_times.borrow().clone();
            devices.sort_by_key(|(kernels, copies)| *kernels + *copies);
            let (kernels, copies) = devices[devices.len() / 2];
            (median(&mut gpu_times.borrow_mut()), kernels, copies)
        });
        let summary = Summary {
            name,
            tuples: workload.tuples,
            read_once_floor: memory_bandwidth
                .map(|bandwidth| Duration::from_secs_f64(bytes as f64 / bandwidth)),
            cpu,
            gpu: gpu_result,
            note,
        };
        print_summary_line(&summary);
        summaries.push(summary);
        drop(tables);
    }
    criterion.final_summary();
    print_table(&summaries);
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("FAILED {failure}");
        }
        std::process::exit(1);
    }
}

/// Bytes of every column of `tables` (all of them are read by their query).
fn input_bytes(tables: &[(&'static str, Arc<MemTable>)]) -> usize {
    let mut bytes = 0;
    for (_, table) in tables {
        for partition in &table.batches {
            let batches = partition
                .try_read()
                .expect("generated table, not shared yet");
            for batch in batches.iter() {
                for column in batch.columns() {
                    let width = column.data_type().primitive_width().unwrap_or(0);
                    bytes += column.len() * width;
                }
            }
        }
    }
    bytes
}

/// The closing table's columns, with the `SEED` line's key for each.
const COLUMNS: [(&str, &str); 11] = [
    ("workload", "name"),
    ("tuples", "tuples"),
    ("DataFusion ms", "cpu_ms"),
    ("GPU ms", "gpu_ms"),
    ("speedup", "speedup"),
    ("DataFusion Mtuples/s", "cpu_mtuples_s"),
    ("GPU Mtuples/s", "gpu_mtuples_s"),
    ("device kernels ms", "device_kernel_ms"),
    ("device copies ms", "device_copy_ms"),
    ("read-once floor ms", "read_once_floor_ms"),
    ("kernels / read-once floor", "kernels_over_read_once_floor"),
];

impl Summary {
    /// One value per entry of [`COLUMNS`]; the GPU's are empty when it was
    /// not measured, and the GPU time column then says why.
    fn cells(&self) -> [String; 11] {
        let ms = |t: Duration| format!("{:.1}", t.as_secs_f64() * 1e3);
        let floor = self
            .read_once_floor
            .map_or(String::new(), |f| format!("{:.2}", f.as_secs_f64() * 1e3));
        let (gpu, speedup, gpu_rate, kernels, copies, over_floor) = match self.gpu {
            Some((wall, kernels, copies)) => (
                ms(wall),
                format!("{:.2}x", self.cpu.as_secs_f64() / wall.as_secs_f64()),
                format!("{:.0}", rate(self.tuples, wall)),
                ms(kernels),
                ms(copies),
                self.read_once_floor.map_or(String::new(), |f| {
                    format!("{:.1}x", kernels.as_secs_f64() / f.as_secs_f64())
                }),
            ),
            None => {
                let why = if self.note.is_empty() {
                    "not measured"
                } else {
                    &self.note
                };
                (
                    why.to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                )
            }
        };
        [
            self.name.clone(),
            self.tuples.to_string(),
            ms(self.cpu),
            gpu,
            speedup,
            format!("{:.0}", rate(self.tuples, self.cpu)),
            gpu_rate,
            kernels,
            copies,
            floor,
            over_floor,
        ]
    }
}

fn print_summary_line(summary: &Summary) {
    let pairs: Vec<String> = COLUMNS
        .iter()
        .zip(summary.cells())
        .skip(1)
        .filter(|(_, value)| !value.is_empty())
        .map(|((_, key), value)| format!("{key}={}", value.replace(' ', "_")))
        .collect();
    println!("SEED {} {}", summary.name, pairs.join(" "));
}

fn print_table(summaries: &[Summary]) {
    let row = |cells: Vec<String>| format!("| {} |", cells.join(" | "));
    println!();
    println!(
        "{}",
        row(COLUMNS.iter().map(|(title, _)| title.to_string()).collect())
    );
    println!("|---|{}", "---:|".repeat(COLUMNS.len() - 1));
    for summary in summaries {
        println!("{}", row(summary.cells().to_vec()));
    }
}
