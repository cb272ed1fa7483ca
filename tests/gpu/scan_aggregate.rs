//! `GpuScanAggregateExec` against DataFusion: filters, arguments and
//! aggregates over every type it reads, NULLs, empty and filtered-out
//! tables, string group keys, overflow; and the device column cache it
//! reads (hits, a changed `MemTable`, a rewritten Parquet file, eviction
//! under a small share, `cache_table`, two sessions, `gpu.cache = false`).

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, StringViewArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpu::encode::table_words::MIN_PINNED_ROWS;
use datafusion_gpu::{gpu_cache_stats, gpu_decisions, GpuScanAggregateExec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::{
    cpu_context, gpu_context, physical_plan, plan_metric, require_gpu, same_rows_as_datafusion,
    table_from_columns, JoinMode,
};

const FLAGS: [&str; 3] = ["A", "N", "R"];
const STATUSES: [&str; 2] = ["F", "O"];

pub(crate) fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("flag", DataType::Utf8, true),
        Field::new("status", DataType::Utf8View, true),
        Field::new("i", DataType::Int64, true),
        Field::new("n", DataType::Int32, true),
        Field::new("d", DataType::Decimal128(15, 2), true),
        Field::new("f", DataType::Float64, true),
        Field::new("dt", DataType::Date32, true),
        Field::new("b", DataType::Boolean, true),
    ]))
}

/// `rows` rows of every type the node reads, about a tenth NULL, values
/// with duplicates, negatives and both signs of zero.
pub(crate) fn columns(seed: u64) -> impl Fn(std::ops::Range<usize>) -> Vec<ArrayRef> {
    move |range: std::ops::Range<usize>| {
        let mut rng = StdRng::seed_from_u64(seed ^ range.start as u64);
        let n = range.len();
        let mut maybe = |p: f64| rng.random_bool(p);
        let nulls: Vec<[bool; 8]> = (0..n)
            .map(|_| std::array::from_fn(|_| maybe(0.9)))
            .collect();
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(31) ^ range.start as u64);
        let flag: StringArray = (0..n)
            .map(|r| nulls[r][0].then(|| FLAGS[rng.random_range(0..3)]))
            .collect();
        let status: StringViewArray = (0..n)
            .map(|r| nulls[r][1].then(|| STATUSES[rng.random_range(0..2)]))
            .collect();
        let i: Int64Array = (0..n)
            .map(|r| nulls[r][2].then(|| rng.random_range(-1_000_000i64..1_000_000)))
            .collect();
        let small: Int32Array = (0..n)
            .map(|r| nulls[r][3].then(|| rng.random_range(-50..50)))
            .collect();
        let d = Decimal128Array::from_iter(
            (0..n).map(|r| nulls[r][4].then(|| rng.random_range(-100_000i128..10_000_000))),
        )
        .with_precision_and_scale(15, 2)
        .unwrap();
        let f: Float64Array = (0..n)
            .map(|r| {
                nulls[r][5].then(|| match rng.random_range(0..20) {
                    0 => -0.0,
                    1 => 0.0,
                    _ => rng.random_range(-1e6..1e6),
                })
            })
            .collect();
        let dt: Date32Array = (0..n)
            .map(|r| nulls[r][6].then(|| rng.random_range(8000..11000)))
            .collect();
        let b: BooleanArray = (0..n)
            .map(|r| nulls[r][7].then(|| rng.random_bool(0.5)))
            .collect();
        vec![
            Arc::new(flag),
            Arc::new(status),
            Arc::new(i),
            Arc::new(small),
            Arc::new(d),
            Arc::new(f),
            Arc::new(dt),
            Arc::new(b),
        ]
    }
}

pub(crate) fn table(rows: usize, partitions: usize, seed: u64) -> Arc<MemTable> {
    table_from_columns(schema(), rows, partitions, 4096, columns(seed))
}

async fn contexts(extra: &[&str]) -> (SessionContext, SessionContext) {
    (
        gpu_context(JoinMode::CollectLeft, 4, extra).await,
        cpu_context(JoinMode::CollectLeft, 4, &[]).await,
    )
}

fn register(contexts: [&SessionContext; 2], table: Arc<MemTable>) {
    for ctx in contexts {
        let _ = ctx.deregister_table("t");
        ctx.register_table("t", Arc::clone(&table) as _).unwrap();
    }
}

/// Scan aggregations the plan placed on the GPU.
fn scan_aggregations(ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> usize {
    gpu_decisions(plan, ctx.state().config_options())
        .iter()
        .filter(|d| d.on_gpu() && d.to_string().contains(GpuScanAggregateExec::ALGORITHM))
        .count()
}

/// Runs `sql` on both contexts and asserts the same rows (as text, a
/// sorted multiset) and a scan aggregation on the GPU. Returns the GPU plan.
async fn check(gpu: &SessionContext, cpu: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    let plan = gpu
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    assert!(
        scan_aggregations(gpu, &plan) > 0,
        "{sql}: no scan aggregation on the GPU\n{}",
        datafusion::physical_plan::displayable(plan.as_ref()).indent(true)
    );
    same_rows_as_datafusion(gpu, cpu, sql, &plan).await;
    plan
}

/// Queries whose every value is exact (integers, decimals, dates): equal
/// as text.
const EXACT_QUERIES: &[&str] = &[
    "SELECT flag, status, count(*), count(i), sum(i), min(i), max(i), sum(d), avg(d), min(d), \
     max(d), min(dt), max(dt), min(n), max(b) FROM t GROUP BY flag, status",
    "SELECT count(*), sum(i), avg(d), min(dt), max(d) FROM t",
    "SELECT flag, sum(d * d), sum(i * 3 - n), count(b) FROM t WHERE d > 100.00 AND i < 5000 \
     GROUP BY flag",
    "SELECT status, sum(d * (1 - d)), sum(d + CAST(0.5 AS DECIMAL(3, 1))) FROM t \
     WHERE dt BETWEEN DATE '1992-01-01' AND DATE '1997-06-30' OR i IS NULL GROUP BY status",
    "SELECT flag, count(*) FROM t WHERE NOT b OR n IN (1, 2, 3, -4) GROUP BY flag",
    "SELECT sum(CASE WHEN i > 0 THEN d ELSE -d END), sum(CASE WHEN b THEN 1 ELSE 0 END) FROM t",
    "SELECT flag, status, max(i), min(i) FROM t WHERE i IS NOT NULL AND d IS NULL \
     GROUP BY status, flag",
    "SELECT count(*), sum(i) FROM t WHERE i > 10000000",
    "SELECT flag, count(*), sum(i) FROM t WHERE i > 10000000 GROUP BY flag",
    "SELECT sum(CAST(n AS BIGINT) * 2), sum(CAST(i AS DECIMAL(22, 2)) + d) FROM t",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scan_aggregations_answer_as_datafusion_does() {
    let Some(_) = require_gpu("scan_aggregations_answer_as_datafusion_does") else {
        return;
    };
    let (gpu, cpu) = contexts(&[]).await;
    // Empty, one row, one batch, several batches and partitions.
    // (DataFusion plans one aggregation phase over one partition, which
    // this node does not take: two at least.)
    // Parts past `MIN_PINNED_ROWS` rows: their words made in pinned memory.
    for (rows, partitions, seed) in [
        (0, 2, 1),
        (1, 2, 2),
        (3000, 2, 3),
        (200_000, 4, 4),
        (300_000, 2, 5),
    ] {
        register([&gpu, &cpu], table(rows, partitions, seed));
        let mut direct_bytes = 0;
        for sql in EXACT_QUERIES {
            let plan = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql} ({rows} rows)");
            assert_eq!(plan_metric(&plan, "rows_scanned"), rows, "{sql}");
            direct_bytes += plan_metric(&plan, "h2d_direct_bytes");
        }
        // The table is in ordinary memory: only words a fill made in
        // pinned memory are copied without staging, and only for parts
        // (the table's partitions) of the pinned minimum.
        let part_rows = rows / partitions;
        if part_rows >= MIN_PINNED_ROWS {
            assert!(
                direct_bytes > 0,
                "{rows} rows: no words made in pinned memory"
            );
        } else if rows < MIN_PINNED_ROWS {
            assert_eq!(direct_bytes, 0, "{rows} rows");
        }
        // Float sums depend on the order of the additions, on the CPU too.
        let sql = "SELECT flag, sum(f), avg(f), sum(f * 2.5 - 1.0), count(f) FROM t \
                   WHERE f > -1000.0 OR f IS NULL GROUP BY flag ORDER BY flag";
        let gpu_batches = gpu.sql(sql).await.unwrap().collect().await.unwrap();
        let cpu_batches = cpu.sql(sql).await.unwrap().collect().await.unwrap();
        assert_close(&gpu_batches, &cpu_batches, sql);
    }
}

/// The same batches, floats within a relative 1e-9.
fn assert_close(gpu: &[RecordBatch], cpu: &[RecordBatch], sql: &str) {
    let rows = |batches: &[RecordBatch]| batches.iter().map(|b| b.num_rows()).sum::<usize>();
    assert_eq!(rows(gpu), rows(cpu), "{sql}");
    if rows(gpu) == 0 {
        return;
    }
    let gpu = datafusion::arrow::compute::concat_batches(&gpu[0].schema(), gpu).unwrap();
    let cpu = datafusion::arrow::compute::concat_batches(&cpu[0].schema(), cpu).unwrap();
    assert_eq!(gpu.num_rows(), cpu.num_rows(), "{sql}");
    for (g, c) in gpu.columns().iter().zip(cpu.columns()) {
        match g.data_type() {
            DataType::Float64 => {
                let (g, c) = (
                    g.as_any().downcast_ref::<Float64Array>().unwrap(),
                    c.as_any().downcast_ref::<Float64Array>().unwrap(),
                );
                for (g, c) in g.iter().zip(c.iter()) {
                    match (g, c) {
                        (Some(g), Some(c)) => assert!(
                            (g - c).abs() <= 1e-9 * g.abs().max(c.abs()).max(1.0),
                            "{sql}: {g} against {c}"
                        ),
                        (g, c) => assert_eq!(g, c, "{sql}"),
                    }
                }
            }
            _ => assert_eq!(g, c, "{sql}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn values_beyond_64_bits_and_too_many_groups_run_datafusions_plan() {
    let Some(_) = require_gpu("values_beyond_64_bits_and_too_many_groups_run_datafusions_plan")
    else {
        return;
    };
    let (gpu, cpu) = contexts(&[]).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let rows = 5000;
    let big = table_from_columns(Arc::clone(&schema), rows, 2, 1000, |range| {
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| i64::MAX - r as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                range.map(|r| format!("s{}", r % 3)),
            )),
        ]
    });
    register([&gpu, &cpu], big);
    // A product past 64 bits (DataFusion wraps), a sum past them.
    for sql in [
        "SELECT s, sum(i * 2) FROM t GROUP BY s",
        "SELECT sum(i) FROM t",
    ] {
        let plan = check(&gpu, &cpu, sql).await;
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 1, "{sql}");
    }
    // More distinct strings in a partition than the device codes.
    let many = table_from_columns(Arc::clone(&schema), rows, 2, 1000, |range| {
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| r as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                range.map(|r| format!("s{r}")),
            )),
        ]
    });
    register([&gpu, &cpu], many);
    let plan = check(&gpu, &cpu, "SELECT s, count(*), sum(i) FROM t GROUP BY s").await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn like_over_strings_too_varied_to_code_filters_the_aggregation_on_their_bytes() {
    let Some(_) =
        require_gpu("like_over_strings_too_varied_to_code_filters_the_aggregation_on_their_bytes")
    else {
        return;
    };
    let (gpu, cpu) = contexts(&[]).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]));
    let rows = 30_000;
    let table = table_from_columns(Arc::clone(&schema), rows, 2, 4096, |range| {
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| r as i64),
            )),
            Arc::new(StringArray::from_iter(
                range.map(crate::scan_filter::varied_string),
            )),
        ]
    });
    register([&gpu, &cpu], table);
    let queries = [
        "SELECT count(*), sum(i), min(i) FROM t WHERE s NOT LIKE '%special%requests%'",
        "SELECT count(*), max(i) FROM t WHERE s LIKE 'ab%ab' OR s = 'aba' OR s IS NULL",
        "SELECT count(i), sum(i) FROM t WHERE s IN ('ab', 'special') AND i > 100",
        "SELECT count(*) FROM t WHERE s LIKE '%€%' AND s NOT LIKE '%\nrequests'",
    ];
    // The first run, planned to code `s`, finds it too varied to: DataFusion's
    // plan aggregates the table.
    let plan = check(&gpu, &cpu, queries[0]).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1);
    // The next plans read its bytes.
    for sql in queries {
        let plan = check(&gpu, &cpu, sql).await;
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
        assert_eq!(plan_metric(&plan, "rows_scanned"), rows, "{sql}");
    }
    // Grouped by it, the aggregation stays DataFusion's.
    let sql = "SELECT s, count(*) FROM t WHERE i < 100 GROUP BY s";
    let plan = physical_plan(&gpu, sql).await;
    assert_eq!(scan_aggregations(&gpu, &plan), 0, "{sql}");
    same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
}

/// Only alone on the device must a cached column still be there for the
/// next query.
fn alone() -> bool {
    crate::support::alone_on_the_device()
}

/// A fresh folder under the system's temporary one.
pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dfgpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub(crate) fn write_parquet(path: &std::path::Path, rows: usize, seed: u64) {
    let batch = RecordBatch::try_new(schema(), columns(seed)(0..rows)).unwrap();
    write_batch(path, &batch);
}

/// [`write_parquet`]'s rows in row groups of `row_group_rows` rows.
pub(crate) fn write_parquet_in_row_groups(
    path: &std::path::Path,
    rows: usize,
    seed: u64,
    row_group_rows: usize,
) {
    use datafusion::parquet::file::properties::WriterProperties;
    let batch = RecordBatch::try_new(schema(), columns(seed)(0..rows)).unwrap();
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// `batch` written to a Parquet file at `path`.
pub(crate) fn write_batch(path: &std::path::Path, batch: &RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(batch).unwrap();
    writer.close().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_column_cache_serves_the_next_query_and_misses_changed_data() {
    let Some(_) = require_gpu("the_column_cache_serves_the_next_query_and_misses_changed_data")
    else {
        return;
    };
    let sql = EXACT_QUERIES[0];
    // Parquet files: the second run reads nothing; a rewritten file misses.
    let dir = temp_dir("cache");
    for (i, seed) in [11, 12, 13].into_iter().enumerate() {
        write_parquet(&dir.join(format!("part-{i}.parquet")), 30_000, seed);
    }
    // One part a file (DataFusion would otherwise read byte ranges of
    // them, each a part of its own).
    let whole_files = "SET datafusion.optimizer.repartition_file_scans = false";
    let (gpu, cpu) = contexts(&[whole_files]).await;
    cpu.sql(whole_files).await.unwrap();
    for ctx in [&gpu, &cpu] {
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    let first = check(&gpu, &cpu, sql).await;
    // Seven columns of three files.
    assert_eq!(
        plan_metric(&first, "cache_misses"),
        21,
        "{}",
        datafusion::physical_plan::display::DisplayableExecutionPlan::with_metrics(first.as_ref())
            .indent(true)
    );
    assert_eq!(plan_metric(&first, "rows_read"), 90_000);
    // Other tests of the process evict entries too (a query short of
    // device memory evicts before it fails), so what must hit is checked
    // where this test has the device to itself.
    let second = check(&gpu, &cpu, sql).await;
    if alone() {
        assert_eq!(plan_metric(&second, "cache_misses"), 0);
        assert_eq!(plan_metric(&second, "cache_hits"), 21);
        assert_eq!(plan_metric(&second, "rows_read"), 0);
    }
    // Another session over the same files shares the device's cache.
    let other = gpu_context(JoinMode::CollectLeft, 4, &[whole_files]).await;
    other
        .register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    let shared = check(&other, &cpu, sql).await;
    if alone() {
        assert_eq!(plan_metric(&shared, "cache_misses"), 0);
    }
    // One file rewritten (other rows, other size): only its columns miss,
    // and the answer is the new data's.
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_parquet(&dir.join("part-1.parquet"), 20_000, 99);
    for ctx in [&gpu, &cpu] {
        ctx.deregister_table("t").unwrap();
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    let rewritten = check(&gpu, &cpu, sql).await;
    let hits = plan_metric(&rewritten, "cache_hits");
    let misses = plan_metric(&rewritten, "cache_misses");
    assert_eq!(hits + misses, 21);
    assert!(misses >= 7, "the rewritten file's columns must miss");
    if alone() {
        assert_eq!((hits, misses), (14, 7));
        assert_eq!(plan_metric(&rewritten, "rows_read"), 20_000);
    }
    let _ = std::fs::remove_dir_all(&dir);

    // A MemTable: cached after the first run; new batches under the same
    // name miss and answer for the new data.
    register([&gpu, &cpu], table(50_000, 2, 21));
    let _ = check(&gpu, &cpu, sql).await;
    let warm = check(&gpu, &cpu, sql).await;
    if alone() {
        assert_eq!(plan_metric(&warm, "cache_misses"), 0);
    }
    register([&gpu, &cpu], table(50_000, 2, 22));
    let changed = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&changed, "cache_hits"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_cache_evicts_and_a_warmed_or_disabled_cache_behaves() {
    let Some(runtime) = require_gpu("a_small_cache_evicts_and_a_warmed_or_disabled_cache_behaves")
    else {
        return;
    };
    let sql = EXACT_QUERIES[2];
    // A share that holds about one table's columns that the query reads
    // (five columns of 2^20 rows, 4 MiB each as 4-byte values): a query
    // over a second table evicts the first's (no query reads them any
    // more), and the first, queried again, is read again. Every answer is
    // right. (Columns a running query reads are never evicted: a column
    // that does not fit beside them is used and not kept.)
    let budget = runtime.devices()[0].budget().free_at_open() as f64;
    let fraction = (24 << 20) as f64 / budget;
    let (gpu, cpu) = contexts(&[&format!("SET gpu.cache_memory_fraction = {fraction}")]).await;
    let first = table(1 << 20, 2, 31);
    let second = table(1 << 20, 2, 34);
    let evictions_before = gpu_cache_stats().evictions;
    for table in [&first, &second, &first] {
        register([&gpu, &cpu], Arc::clone(table));
        let plan = check(&gpu, &cpu, sql).await;
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 0);
        assert!(
            plan_metric(&plan, "cache_misses") > 0,
            "evicted, or never kept"
        );
    }
    assert!(gpu_cache_stats().evictions > evictions_before);

    // Warmed with cache_table, the first query reads nothing.
    let (gpu, cpu) = contexts(&[]).await;
    register([&gpu, &cpu], table(100_000, 3, 32));
    let warmed = datafusion_gpu::cache_table(&gpu, "t").await.unwrap();
    assert_eq!(warmed.cached.len(), 8, "{warmed:?}");
    let plan = check(&gpu, &cpu, sql).await;
    if alone() {
        assert_eq!(plan_metric(&plan, "cache_misses"), 0);
    }

    // Off: the node is not planned, and the decision says why (of the
    // partial aggregation left on the CPU: with hashed keys off, GPU
    // aggregations do not take its string keys either).
    let (gpu, _) = contexts(&["SET gpu.cache = false", "SET gpu.hashed_group_keys = false"]).await;
    register([&gpu, &cpu], table(1000, 2, 33));
    let plan = gpu
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    assert_eq!(scan_aggregations(&gpu, &plan), 0);
    let reasons: Vec<String> = gpu_decisions(&plan, gpu.state().config_options())
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("gpu.cache = false")),
        "{reasons:?}"
    );
    assert!(datafusion_gpu::cache_table(&gpu, "t").await.is_err());
}
