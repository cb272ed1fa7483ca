//! Helpers shared by the GPU tests: the GPU gate, data generators, and
//! differential comparison of SQL results with and without the rule.

use std::io::Write;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::gpu::{gpu_runtime, GpuRuntime};
use datafusion_gpu::{gpu_decisions, gpu_session_context, with_gpu_context};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::Zipf;

#[path = "../common/plan_metrics.rs"]
mod plan_metrics;
pub use plan_metrics::plan_metric;

/// Metric `name` summed over the nodes of `plan` of type `T` and their
/// partitions: one of this crate's, or DataFusion's own (`output_rows`,
/// `output_bytes`), which `MetricsSet::sum_by_name` does not find.
pub fn node_metric<T: ExecutionPlan + 'static>(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    let here = plan
        .downcast_ref::<T>()
        .and_then(|node| node.metrics())
        .and_then(|m| m.sum(|metric| metric.value().name() == name))
        .map_or(0, |v| v.as_usize());
    here + plan
        .children()
        .into_iter()
        .map(|c| node_metric::<T>(c, name))
        .sum::<usize>()
}

/// Environment variable that turns a missing GPU into a test failure.
pub const REQUIRE_GPU_VAR: &str = "DATAFUSION_GPU_REQUIRE_GPU";

/// Set by `run.sh sanitize`: the tests run under compute-sanitizer.
pub const SANITIZE_VAR: &str = "DATAFUSION_GPU_SANITIZE";

/// Rows a device test's case takes: `rows`, or under compute-sanitizer
/// ([`SANITIZE_VAR`]), where every launch and access is checked, at most
/// 20,000 (still past every group and chunk threshold those tests cross).
pub fn sanitized_rows(rows: usize) -> usize {
    match sanitizing() {
        true => rows.min(20_000),
        false => rows,
    }
}

/// Whether the tests run under compute-sanitizer ([`SANITIZE_VAR`]).
pub fn sanitizing() -> bool {
    std::env::var_os(SANITIZE_VAR).is_some()
}

/// Whether this test has the device to itself (`DATAFUSION_GPU_TEST_ALONE=1`,
/// as the bundle's run script runs the tests whose outcome depends on the
/// device memory or cache that tests beside them would take): only then
/// must what a share of device memory leads to, or a cached column, be
/// there to see.
pub fn alone_on_the_device() -> bool {
    std::env::var("DATAFUSION_GPU_TEST_ALONE").is_ok_and(|v| v == "1")
}

/// The GPU runtime, or `None` after printing a visible skip line (written to
/// the process's stderr directly, which the test harness does not capture).
/// Panics when no GPU is there and [`REQUIRE_GPU_VAR`] is set.
pub fn require_gpu(test: &str) -> Option<Arc<GpuRuntime>> {
    match gpu_runtime() {
        Ok(runtime) => Some(runtime),
        Err(reason) => {
            if std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v == "1") {
                panic!("{test}: a GPU is required ({REQUIRE_GPU_VAR}=1) but {reason}");
            }
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
            None
        }
    }
}

/// Key distributions of the generated tables.
#[derive(Debug, Clone, Copy)]
pub enum Keys {
    /// A permutation of 0..n (a primary key).
    Permutation,
    /// Uniform in 0..domain.
    Uniform { domain: u64 },
    /// Zipf with exponent `s` over 1..=domain.
    Zipf { domain: u64, s: f64 },
}

/// `rows` keys drawn from `keys`, with a fraction `null_fraction` of NULLs.
pub fn gen_keys(rows: usize, keys: Keys, null_fraction: f64, seed: u64) -> Vec<Option<i64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut values: Vec<i64> = match keys {
        Keys::Permutation => {
            let mut v: Vec<i64> = (0..rows as i64).collect();
            v.shuffle(&mut rng);
            v
        }
        Keys::Uniform { domain } => (0..rows)
            .map(|_| rng.random_range(0..domain.max(1)) as i64)
            .collect(),
        Keys::Zipf { domain, s } => {
            let zipf = Zipf::new(domain.max(1) as f64, s).expect("valid Zipf parameters");
            (0..rows).map(|_| rng.sample(zipf) as i64).collect()
        }
    };
    // Spread keys over the whole i64 range sometimes, so tests do not rely on
    // small or non-negative keys: negate odd keys (still injective).
    for v in values.iter_mut() {
        if *v % 2 == 1 {
            *v = -*v;
        }
    }
    values
        .into_iter()
        .map(|v| {
            if null_fraction > 0.0 && rng.random_bool(null_fraction) {
                None
            } else {
                Some(v)
            }
        })
        .collect()
}

/// A table `(k Int64 nullable, v Int64)` split into `partitions` MemTable
/// partitions of batches of at most `batch_rows` rows; `v` is a distinct,
/// random-looking value per row so every output row is identifiable.
pub fn key_value_table(
    keys: &[Option<i64>],
    value_seed: i64,
    partitions: usize,
    batch_rows: usize,
) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, false),
    ]));
    let columns = |range: std::ops::Range<usize>| -> Vec<ArrayRef> {
        let k = Int64Array::from(keys[range.clone()].to_vec());
        let v = Int64Array::from_iter_values(range.map(|i| {
            (i as i64)
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(value_seed)
        }));
        vec![Arc::new(k), Arc::new(v)]
    };
    table_from_columns(schema, keys.len(), partitions, batch_rows, columns)
}

/// A MemTable of `rows` rows whose columns `columns(range)` makes per batch.
pub fn table_from_columns(
    schema: Arc<Schema>,
    rows: usize,
    partitions: usize,
    batch_rows: usize,
    columns: impl Fn(std::ops::Range<usize>) -> Vec<ArrayRef>,
) -> Arc<MemTable> {
    let partitions = partitions.max(1);
    let per_partition = rows.div_ceil(partitions);
    let mut parts = Vec::with_capacity(partitions);
    for p in 0..partitions {
        let start = (p * per_partition).min(rows);
        let end = ((p + 1) * per_partition).min(rows);
        let mut batches = Vec::new();
        let mut s = start;
        while s < end {
            let e = (s + batch_rows.max(1)).min(end);
            batches.push(RecordBatch::try_new(Arc::clone(&schema), columns(s..e)).unwrap());
            s = e;
        }
        parts.push(batches);
    }
    Arc::new(MemTable::try_new(schema, parts).unwrap())
}

/// How DataFusion should plan the hash joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinMode {
    /// The build side collected once (small build sides).
    CollectLeft,
    /// Both sides hash-repartitioned by DataFusion; the GPU rule runs the
    /// join over all input partitions instead where it may
    /// (`gpu.tuning.merge_partitions = true`).
    Partitioned,
    /// As `Partitioned`, with `gpu.tuning.merge_partitions = false`: the GPU join
    /// runs per hash partition, over DataFusion's repartitions.
    PartitionedKept,
}

impl JoinMode {
    /// Every mode, for tests that cover them all.
    pub const ALL: [JoinMode; 3] = [
        JoinMode::CollectLeft,
        JoinMode::Partitioned,
        JoinMode::PartitionedKept,
    ];
}

/// A context with the GPU rule, forcing every supported join onto the GPU
/// (`gpu.placement = 'always'`) and the chosen partition mode, plus extra `SET`s.
pub async fn gpu_context(
    mode: JoinMode,
    target_partitions: usize,
    extra: &[&str],
) -> SessionContext {
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(target_partitions));
    configure(&ctx, mode, true, extra).await;
    ctx
}

/// The same configuration with the rule switched off (`gpu.enabled = false`).
pub async fn cpu_context(
    mode: JoinMode,
    target_partitions: usize,
    extra: &[&str],
) -> SessionContext {
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(target_partitions));
    configure(&ctx, mode, false, extra).await;
    ctx
}

/// [`gpu_context`] and [`cpu_context`] in sessions whose memory pool holds
/// `bytes` (DataFusion's memory limit; operators that can spill do).
pub async fn memory_limited_contexts(
    bytes: usize,
    mode: JoinMode,
    target_partitions: usize,
    extra: &[&str],
) -> (SessionContext, SessionContext) {
    pool_limited_contexts(
        || Arc::new(GreedyMemoryPool::new(bytes)),
        mode,
        target_partitions,
        extra,
    )
    .await
}

/// [`memory_limited_contexts`] with the pool `pool` makes (one for each
/// context), e.g. DataFusion's `FairSpillPool`, under which its spilling
/// operators share the limit evenly.
pub async fn pool_limited_contexts(
    pool: impl Fn() -> Arc<dyn MemoryPool>,
    mode: JoinMode,
    target_partitions: usize,
    extra: &[&str],
) -> (SessionContext, SessionContext) {
    let context = |gpu: bool, pool: Arc<dyn MemoryPool>| async move {
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .build_arc()
            .unwrap();
        let config = SessionConfig::new().with_target_partitions(target_partitions);
        let ctx = with_gpu_context(&SessionContext::new_with_config_rt(config, runtime));
        configure(&ctx, mode, gpu, extra).await;
        ctx
    };
    (context(true, pool()).await, context(false, pool()).await)
}

async fn configure(ctx: &SessionContext, mode: JoinMode, gpu: bool, extra: &[&str]) {
    let threshold = match mode {
        JoinMode::CollectLeft => "1000000000000",
        JoinMode::Partitioned | JoinMode::PartitionedKept => "0",
    };
    let mut statements = vec![
        format!("SET gpu.enabled = {gpu}"),
        "SET gpu.placement = 'always'".to_string(),
        "SET gpu.hashed_group_keys = true".to_string(),
        // A kernel's fault fails the test rather than running on the CPU.
        "SET gpu_test.device_errors_fail = true".to_string(),
        format!("SET datafusion.optimizer.hash_join_single_partition_threshold = {threshold}"),
        format!("SET datafusion.optimizer.hash_join_single_partition_threshold_rows = {threshold}"),
    ];
    statements.push(format!(
        "SET gpu.tuning.merge_partitions = {}",
        mode == JoinMode::Partitioned
    ));
    statements.extend(extra.iter().map(|s| s.to_string()));
    for statement in statements {
        ctx.sql(&statement)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

/// The physical plan of `sql` in `ctx`, as the session would run it.
pub async fn physical_plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    let df = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    df.create_physical_plan()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Runs `plan`, the GPU session's plan of `sql`, and `sql` on DataFusion's
/// own session `cpu`, asserts the same rows (a sorted multiset of their
/// text), and returns the GPU path's batches.
pub async fn same_rows_as_datafusion(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
    plan: &Arc<dyn ExecutionPlan>,
) -> Vec<RecordBatch> {
    let gpu_batches = datafusion::physical_plan::collect(Arc::clone(plan), gpu.task_ctx())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let cpu_batches = cpu.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        string_rows(&gpu_batches),
        string_rows(&cpu_batches),
        "{sql}: results differ\n{}",
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
    );
    gpu_batches
}

/// Runs `sql` and returns its batches, the number of joins that ran on the
/// GPU, and the plan.
pub async fn run(
    ctx: &SessionContext,
    sql: &str,
) -> (Vec<RecordBatch>, usize, Arc<dyn ExecutionPlan>) {
    run_counting(ctx, sql, "HashJoinExec").await
}

/// Runs `sql` and returns its batches, the number of `operator` nodes
/// (`HashJoinExec`, `AggregateExec`) that ran on the GPU, and the plan.
pub async fn run_counting(
    ctx: &SessionContext,
    sql: &str,
    operator: &str,
) -> (Vec<RecordBatch>, usize, Arc<dyn ExecutionPlan>) {
    let plan = physical_plan(ctx, sql).await;
    let gpu_nodes = gpu_decisions(&plan, ctx.state().config_options())
        .iter()
        .filter(|d| d.on_gpu() && d.operator == operator)
        .count();
    let batches = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    (batches, gpu_nodes, plan)
}

/// Rows of Int64 (nullable) columns, as a sortable multiset.
pub fn int64_rows(batches: &[RecordBatch]) -> Vec<Vec<Option<i64>>> {
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| c.as_primitive::<Int64Type>())
            .collect();
        for i in 0..batch.num_rows() {
            rows.push(
                columns
                    .iter()
                    .map(|c| if c.is_null(i) { None } else { Some(c.value(i)) })
                    .collect(),
            );
        }
    }
    rows.sort_unstable();
    rows
}

/// Rows of any columns rendered as strings, as a sortable multiset (for
/// key types other than Int64).
pub fn string_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut rows = rows_in_order(batches);
    rows.sort_unstable();
    rows
}

/// Output rows in the order they came, rendered as text.
pub fn rows_in_order(batches: &[RecordBatch]) -> Vec<String> {
    datafusion::arrow::util::pretty::pretty_format_batches(batches)
        .unwrap()
        .to_string()
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// Runs `sql` on both contexts and asserts equal multisets of Int64 rows and
/// at least `min_gpu_nodes` GPU operators in the GPU plan. Returns the row count.
pub async fn assert_same_int64_rows(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
    min_gpu_nodes: usize,
) -> usize {
    let (gpu_batches, gpu_nodes, plan) = run(gpu, sql).await;
    let (cpu_batches, cpu_nodes, _) = run(cpu, sql).await;
    assert_eq!(cpu_nodes, 0, "the CPU context must not use the GPU");
    assert!(
        gpu_nodes >= min_gpu_nodes,
        "{sql}: {gpu_nodes} GPU nodes, expected at least {min_gpu_nodes}\n{}",
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
    );
    let gpu_rows = int64_rows(&gpu_batches);
    let cpu_rows = int64_rows(&cpu_batches);
    assert_eq!(gpu_rows.len(), cpu_rows.len(), "{sql}: row counts differ");
    if gpu_rows != cpu_rows {
        let first = gpu_rows.iter().zip(&cpu_rows).position(|(a, b)| a != b);
        panic!("{sql}: results differ; first difference at sorted row {first:?}");
    }
    gpu_rows.len()
}

/// `table` with every partition copied into pinned host memory
/// (`pin_batches`), as a user keeps a hot table.
pub async fn pinned_table(table: &MemTable) -> Arc<MemTable> {
    let mut partitions = Vec::new();
    for partition in &table.batches {
        let batches = partition.read().await;
        partitions.push(datafusion_gpu::pin_batches(&batches).unwrap());
    }
    Arc::new(
        MemTable::try_new(
            datafusion::catalog::TableProvider::schema(table),
            partitions,
        )
        .unwrap(),
    )
}
