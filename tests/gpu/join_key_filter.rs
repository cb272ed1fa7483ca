//! Join key filters against DataFusion: a hash join left on the CPU hands
//! its build keys to the scan of its probe side (on the GPU, or on the host
//! where the device does not read it), which drops the rows no build key
//! matches. Inner, semi, left and anti joins; Int64, Int32 and
//! Date32 keys, one of two keys, keys followed through inner joins below
//! and through aggregations grouped by them, to scans that wait for them;
//! NULL, duplicate, negative and unmatched
//! keys; an empty build side; build keys too spread for a set (every row
//! then passes); a probe side with filters of its own; `MemTable`s and
//! Parquet files; the build side collected once or hash-partitioned.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpu::{gpu_decisions, GpuScanFilterExec};

use crate::scan_aggregate::{table, temp_dir, write_batch, write_parquet};
use crate::scan_filter::varied_string;
use crate::support::{
    alone_on_the_device, cpu_context, gpu_context, physical_plan, plan_metric, require_gpu,
    same_rows_as_datafusion, JoinMode,
};

/// Sessions whose joins stay on the CPU (so that their probe sides take
/// the keys), every other GPU node placed whatever its size.
async fn contexts(mode: JoinMode) -> (SessionContext, SessionContext) {
    contexts_of_partitions(mode, 4).await
}

/// [`contexts`] with `partitions` target partitions.
async fn contexts_of_partitions(
    mode: JoinMode,
    partitions: usize,
) -> (SessionContext, SessionContext) {
    let extra = [
        "SET gpu.hash_join = false",
        "SET gpu.sort_merge_join = false",
        "SET gpu.tuning.scan_aggregate = false",
    ];
    (
        gpu_context(mode, partitions, &extra).await,
        cpu_context(mode, partitions, &[]).await,
    )
}

/// Build tables: `k` (Int64 `key`, Int32 `n`, Date32 `day`, Utf8 `tag`)
/// with keys that `t` holds, NULLs, duplicates, negatives and keys no row
/// of `t` has; `wide`, whose keys span more values than a set holds.
fn build_tables(rows: usize) -> (Arc<MemTable>, Arc<MemTable>) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, true),
        Field::new("n", DataType::Int32, true),
        Field::new("day", DataType::Date32, true),
        Field::new("tag", DataType::Utf8, true),
    ]));
    // Every 97th value of t's range, a few hundred others, NULLs.
    let keys: Vec<Option<i64>> = (0..rows)
        .map(|r| match r % 11 {
            0 => None,
            1 => Some(-1_000_000 + (r as i64 % 50)),
            2 => Some(5_000_000 + r as i64),
            _ => Some(-1_000_000 + (r as i64 * 97) % 2_000_000),
        })
        .collect();
    let columns = |keys: Vec<Option<i64>>| -> Vec<ArrayRef> {
        let n = keys.len();
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int32Array::from(
                (0..n)
                    .map(|r| (r % 13 != 0).then_some((r as i32 % 60) - 30))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Date32Array::from(
                (0..n)
                    .map(|r| (r % 7 != 0).then_some(8000 + (r as i32 * 37) % 3000))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|r| format!("tag{}", r % 5)),
            )),
        ]
    };
    let k = RecordBatch::try_new(Arc::clone(&schema), columns(keys.clone())).unwrap();
    let mut spread = keys;
    spread.push(Some(1 << 40));
    let wide = RecordBatch::try_new(Arc::clone(&schema), columns(spread)).unwrap();
    let table = |batch: RecordBatch| {
        let half = batch.num_rows() / 2;
        let parts = vec![
            vec![batch.slice(0, half)],
            vec![batch.slice(half, batch.num_rows() - half)],
        ];
        Arc::new(MemTable::try_new(Arc::clone(&schema), parts).unwrap())
    };
    (table(k), table(wide))
}

const QUERIES: &[&str] = &[
    "SELECT t.i, t.flag, k.tag FROM t JOIN k ON t.i = k.key",
    "SELECT t.i, t.d FROM t WHERE t.i IN (SELECT key FROM k)",
    "SELECT k.key, k.tag, t.flag FROM k LEFT JOIN t ON k.key = t.i",
    "SELECT k.key FROM k WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.i = k.key)",
    "SELECT t.n, t.dt, t.i FROM t JOIN k ON t.n = k.n AND t.dt = k.day",
    "SELECT t.i, t.status FROM t JOIN k ON t.i = k.key WHERE t.status <> 'F' AND t.f > 0.0",
    "SELECT t.i FROM t JOIN k ON t.i = k.key WHERE k.key > 100000000000",
    "SELECT t.i, w.key FROM t JOIN wide w ON t.i = w.key",
    "SELECT count(*), sum(t.d) FROM t JOIN k ON t.i = k.key",
    // Semi joins over inner joins: their keys reach both inputs' scans.
    "SELECT t.i, k.tag FROM t JOIN k ON t.i = k.key \
     WHERE t.i IN (SELECT key FROM wide WHERE tag = 'tag1')",
    "SELECT t.i, sum(t.d) FROM t JOIN k ON t.i = k.key \
     WHERE k.key IN (SELECT key FROM k WHERE n > 0) GROUP BY t.i",
    // Keys that reach the scan of another join's build side, which
    // DataFusion starts before the join above has read its own build
    // side (read in one partition): the scan waits for them.
    "SELECT t.flag, k.tag FROM t JOIN k ON t.i = k.key JOIN \
     (SELECT DISTINCT n FROM k WHERE tag = 'tag3' AND n < -20) sel ON k.n = sel.n",
    // Aggregations grouped by the key on the probe side: the keys reach
    // the scan below them (not under grouping sets).
    "SELECT k.key, k.tag, a.rows, a.total FROM k JOIN \
     (SELECT i, count(*) AS rows, sum(d) AS total FROM t GROUP BY i) a ON a.i = k.key",
    "SELECT k.key, k.tag FROM k WHERE k.key IN (SELECT i FROM t GROUP BY i HAVING count(*) > 1)",
    "SELECT sum(t.d) FROM k JOIN t ON k.key = t.i \
     WHERE t.d < (SELECT 2 * avg(t2.d) FROM t t2 WHERE t2.i = t.i)",
    "SELECT k.key, a.n, a.c FROM k JOIN \
     (SELECT i, n, count(*) AS c FROM t GROUP BY ROLLUP(i, n)) a ON a.i = k.key",
];

/// Nodes of `plan` named `name`.
fn nodes_named(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = Vec::new();
    plan.apply(|node| {
        if node.name() == name {
            found.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found
}

/// What the scans that test join keys did.
#[derive(Debug, Default)]
struct Tested {
    kept: usize,
    scanned: usize,
    /// Partitions left to DataFusion's scan (no set when they started).
    on_cpu: usize,
}

/// Runs `sql` on both sessions, asserts the same rows, and returns the
/// GPU plan (run) and what its key-testing scans did.
async fn check(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
) -> (Arc<dyn ExecutionPlan>, Tested) {
    let plan = physical_plan(gpu, sql).await;
    same_rows_as_datafusion(gpu, cpu, sql, &plan).await;
    let mut tested = Tested::default();
    for node in nodes_named(&plan, "GpuScanFilterExec") {
        let scan = node.downcast_ref::<GpuScanFilterExec>().unwrap();
        if !displayable(scan)
            .one_line()
            .to_string()
            .contains("IN join keys")
        {
            continue;
        }
        let metrics = node.metrics().unwrap();
        let count = |name| metrics.sum_by_name(name).map_or(0, |v| v.as_usize());
        tested.kept += metrics.output_rows().unwrap_or(0);
        tested.scanned += count("rows_scanned");
        tested.on_cpu += count("cpu_fallback");
    }
    (plan, tested)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_key_filters_answer_as_datafusion_does() {
    let Some(_) = require_gpu("join_key_filters_answer_as_datafusion_does") else {
        return;
    };
    for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
        let (gpu, cpu) = contexts(mode).await;
        for (rows, build_rows, seed) in [(0, 0, 1), (1, 3, 2), (5000, 200, 3), (200_000, 3000, 4)] {
            let (k, wide) = build_tables(build_rows);
            for ctx in [&gpu, &cpu] {
                for (name, table) in [
                    ("t", table(rows, 4, seed)),
                    ("k", k.clone()),
                    ("wide", wide.clone()),
                ] {
                    let _ = ctx.deregister_table(name);
                    ctx.register_table(name, table as _).unwrap();
                }
            }
            let mut filtered = 0;
            for sql in QUERIES {
                let (plan, tested) = check(&gpu, &cpu, sql).await;
                let collectors = nodes_named(&plan, "JoinKeyCollectorExec");
                if collectors.is_empty() {
                    continue;
                }
                filtered += 1;
                let decisions = gpu_decisions(&plan, gpu.state().config_options());
                assert!(
                    decisions
                        .iter()
                        .any(|d| d.to_string().contains("filter the scan of its probe side")),
                    "{sql}: {decisions:?}"
                );
                // A build side collected once is whole before the probe side
                // starts: the scan tests every row.
                if mode == JoinMode::CollectLeft && rows >= 5000 && build_rows > 0 {
                    let Tested {
                        kept,
                        scanned,
                        on_cpu,
                    } = tested;
                    let sets = plan_metric(&plan, "join_key_sets");
                    if sql.contains("JOIN wide w") {
                        // No set: the scan has no filter of its own, and
                        // DataFusion's reads every partition.
                        assert_eq!((sets, scanned, on_cpu), (0, 0, 4), "{sql}");
                        continue;
                    }
                    assert!(sets >= 1, "{sql}: no set made");
                    if sql.contains("100000000000") {
                        // DataFusion's join may skip a probe side whose
                        // build side is empty; where it reads it, no row
                        // passes.
                        assert_eq!(kept, 0, "{sql}: an empty build side keeps no row");
                    } else if sql.contains("ON t.n = k.n") {
                        // Keys -30 to 29, each there: a test estimated to
                        // keep most rows, so DataFusion's scan reads them.
                        assert_eq!((scanned, on_cpu), (0, 4), "{sql}");
                    } else if sql.contains("sum(d) AS total FROM t GROUP BY i") {
                        // The scan below the aggregation tests every row.
                        assert!(scanned >= rows, "{sql}: {scanned} of {rows} rows scanned");
                        assert!(kept < rows / 5, "{sql}: {kept} of {rows} rows kept");
                    } else if sql.contains("JOIN k ON t.i = k.key") {
                        assert!(scanned >= rows, "{sql}: {scanned} of {rows} rows scanned");
                        assert!(kept < rows / 5, "{sql}: {kept} of {rows} rows kept");
                    }
                }
            }
            assert!(
                filtered >= 5,
                "{mode:?}, {rows} rows: {filtered} queries filtered by join keys"
            );
        }
    }
}

/// `t` from the Parquet files in `dir`, with the build tables `k` and
/// `wide`, in each session.
async fn register_parquet_probe_side(
    contexts: [&SessionContext; 2],
    dir: &std::path::Path,
    k: &Arc<MemTable>,
    wide: &Arc<MemTable>,
) {
    for ctx in contexts {
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        ctx.register_table("k", Arc::clone(k) as _).unwrap();
        ctx.register_table("wide", Arc::clone(wide) as _).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_key_filters_read_parquet_probe_sides() {
    let Some(_) = require_gpu("join_key_filters_read_parquet_probe_sides") else {
        return;
    };
    let dir = temp_dir("join-keys");
    for (file, seed) in [("a.parquet", 11), ("b.parquet", 12), ("c.parquet", 13)] {
        write_parquet(&dir.join(file), 40_000, seed);
    }
    let (k, wide) = build_tables(1500);
    for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
        let (gpu, cpu) = contexts(mode).await;
        register_parquet_probe_side([&gpu, &cpu], &dir, &k, &wide).await;
        let mut filtered = 0;
        for sql in QUERIES {
            let (plan, tested) = check(&gpu, &cpu, sql).await;
            if nodes_named(&plan, "JoinKeyCollectorExec").is_empty() {
                continue;
            }
            filtered += 1;
            // Collected once, the build side's set is whole before the
            // files are read: the scan tests all of their rows, and keeps
            // the few whose key `k` holds.
            if mode == JoinMode::CollectLeft && sql == &QUERIES[0] {
                assert!(
                    plan_metric(&plan, "join_key_sets") >= 1,
                    "{sql}: no set made"
                );
                assert!(tested.scanned >= 120_000, "{sql}: {tested:?}");
                assert!(tested.kept < tested.scanned / 20, "{sql}: {tested:?}");
            }
        }
        assert!(
            filtered >= 5,
            "{mode:?}: {filtered} queries filtered by join keys"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_key_filters_on_the_host_answer_as_datafusion_does() {
    let Some(_) = require_gpu("join_key_filters_on_the_host_answer_as_datafusion_does") else {
        return;
    };
    // Without the column cache, every probe side's scan is tested on the
    // host. Under the cost placement (a table of 200,000 rows is below the
    // GPU scans' size) too, but not a scan right below its join, where
    // the test saves nothing the join's probe does not do.
    let host = [
        "SET gpu.hash_join = false",
        "SET gpu.sort_merge_join = false",
        "SET gpu.cache = false",
    ];
    let cost = [
        "SET gpu.hash_join = false",
        "SET gpu.sort_merge_join = false",
        "SET gpu.placement = 'cost'",
    ];
    for (extra, mode) in [
        (&host, JoinMode::CollectLeft),
        (&host, JoinMode::Partitioned),
        (&cost, JoinMode::CollectLeft),
        (&cost, JoinMode::Partitioned),
    ] {
        let placed_by_cost = extra == &cost;
        let gpu = gpu_context(mode, 4, extra).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        let rows = 200_000;
        let (k, wide) = build_tables(3000);
        for ctx in [&gpu, &cpu] {
            for (name, table) in [
                ("t", table(rows, 4, 7)),
                ("k", k.clone()),
                ("wide", wide.clone()),
            ] {
                ctx.register_table(name, table as _).unwrap();
            }
        }
        let mut tested = 0;
        for sql in QUERIES {
            let (plan, _) = check(&gpu, &cpu, sql).await;
            let filters: Vec<_> = nodes_named(&plan, "FilterExec")
                .into_iter()
                .filter(|f| {
                    displayable(f.as_ref())
                        .one_line()
                        .to_string()
                        .contains("IN join keys")
                })
                .collect();
            if filters.is_empty() {
                continue;
            }
            tested += 1;
            let kept: usize = filters
                .iter()
                .map(|f| f.metrics().and_then(|m| m.output_rows()).unwrap_or(0))
                .sum();
            if placed_by_cost && mode == JoinMode::CollectLeft {
                // Each test is below a repartition, a join or an
                // aggregation of the probe side.
                let text = displayable(plan.as_ref()).indent(true).to_string();
                assert!(
                    !sql.starts_with("SELECT t.i, t.flag, k.tag FROM t JOIN k"),
                    "{sql}: a scan right below its join tested\n{text}"
                );
                continue;
            }
            if mode == JoinMode::CollectLeft
                && sql.starts_with("SELECT t.i, t.flag, k.tag FROM t JOIN k")
            {
                assert!(
                    kept < rows / 5,
                    "{sql}: {kept} of {rows} rows kept on the host"
                );
            }
            if mode == JoinMode::CollectLeft && sql.contains("sel ON k.n = sel.n") {
                // `sel` holds two of k's 60 values of `n`: the test of k's
                // scan (below the build side of the join of t and k) drops
                // most of its 3,000 rows once it waits for them.
                let k_kept: usize = filters
                    .iter()
                    .filter(|f| f.schema().field_with_name("tag").is_ok())
                    .map(|f| f.metrics().and_then(|m| m.output_rows()).unwrap_or(0))
                    .sum();
                assert!(
                    nodes_named(&plan, "JoinKeyWaitExec").len() >= 2,
                    "{sql}: {}",
                    displayable(plan.as_ref()).indent(true)
                );
                assert!(
                    k_kept < 300,
                    "{sql}: {k_kept} of k's 3000 rows kept\n{}",
                    displayable(plan.as_ref()).indent(true)
                );
            }
        }
        let least = if placed_by_cost { 2 } else { 5 };
        assert!(
            tested >= least,
            "{mode:?} (cost: {placed_by_cost}): {tested} queries tested on the host"
        );
    }
}

/// The scan of a join's probe side with a filter of its own is read into
/// the column cache from the plan's start, beside the build side, each part
/// once: the fill ahead and the scan take turns on a part, never both read
/// it. The build side is collected once, where the Parquet probe side is a
/// GPU scan testing the keys (see `join_key_filters_read_parquet_probe_sides`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plans_scans_are_filled_ahead_each_part_once() {
    let Some(_) = require_gpu("a_plans_scans_are_filled_ahead_each_part_once") else {
        return;
    };
    let (k, wide) = build_tables(1500);
    // Files of their own: the cache has none of their parts.
    let dir = temp_dir("fill-ahead");
    let rows_per_file = 40_000;
    for (file, seed) in [("a.parquet", 21), ("b.parquet", 22), ("c.parquet", 23)] {
        write_parquet(&dir.join(file), rows_per_file, seed);
    }
    let (gpu, cpu) = contexts(JoinMode::CollectLeft).await;
    register_parquet_probe_side([&gpu, &cpu], &dir, &k, &wide).await;
    // A scan that only tests keys waits for them before it fills (below).
    let sql = QUERIES[5];
    let mut filled_ahead = 0;
    for run in ["cold", "warm"] {
        let (plan, tested) = check(&gpu, &cpu, sql).await;
        let scans = nodes_named(&plan, "GpuScanFilterExec");
        assert_eq!(
            scans.len(),
            1,
            "one scan of t: {}",
            displayable(plan.as_ref()).indent(true)
        );
        let read = plan_metric(&scans[0], "rows_read");
        let filled = plan_metric(&scans[0], "rows_filled_ahead");
        let parts_filled = plan_metric(&plan, "parts_filled_ahead");
        match run {
            // Every row read once, by the scan or ahead of it (a partition
            // the scan left to DataFusion reads none); twice only where
            // other tests' device memory evicted a part filled ahead
            // before its scan read it.
            "cold" if tested.on_cpu == 0 && alone_on_the_device() => {
                assert_eq!(read + filled, 3 * rows_per_file, "{tested:?}")
            }
            "cold" if tested.on_cpu == 0 => {
                assert!(read + filled >= 3 * rows_per_file, "{tested:?}")
            }
            "cold" if alone_on_the_device() => {
                assert!(read + filled <= 3 * rows_per_file, "{tested:?}")
            }
            "cold" => {}
            // All in the cache already (where no other test of the process
            // evicts it meanwhile).
            _ if alone_on_the_device() => assert_eq!((read, filled, parts_filled), (0, 0, 0)),
            _ => {}
        }
        filled_ahead += parts_filled;
    }
    // The fills start with the plan, the scan once the build side is in:
    // they take parts before it.
    assert!(filled_ahead > 0, "no part was filled ahead");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `MemTable` of one partition of one non-null Int64 column `column`.
fn key_table(column: &str, values: Vec<i64>) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        column,
        DataType::Int64,
        false,
    )]));
    let values: ArrayRef = Arc::new(Int64Array::from(values));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![values]).unwrap();
    Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())
}

/// A scan of Parquet files that only tests join keys and outputs strings
/// too varied to code reads the device where the keys keep up to half of
/// its rows, the strings made from their bytes (the first run finds them
/// too varied on a part's first rows; later plans keep them as bytes from
/// the start); above that, and for a `MemTable` above a quarter, DataFusion
/// scans the table. (TPC-H q10's `customer`, 28 % kept.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scan_testing_only_join_keys_outputs_strings_too_varied_to_code() {
    let Some(_) = require_gpu("a_scan_testing_only_join_keys_outputs_strings_too_varied_to_code")
    else {
        return;
    };
    let dir = temp_dir("key-only-strings");
    let rows = 60_000;
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("note", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
            Arc::new(StringArray::from_iter(
                (0..rows).map(|r| (r % 17 != 0).then(|| format!("Customer#{r:09}"))),
            )),
            Arc::new(StringArray::from_iter((0..rows).map(varied_string))),
        ],
    )
    .unwrap();
    write_batch(&dir.join("p.parquet"), &batch);
    let halves = vec![
        vec![batch.slice(0, rows / 2)],
        vec![batch.slice(rows / 2, rows - rows / 2)],
    ];
    let memory = Arc::new(MemTable::try_new(Arc::clone(&schema), halves).unwrap());
    let keys =
        |keep: fn(i64) -> bool| key_table("k", (0..rows as i64).filter(|&k| keep(k)).collect());
    let (third, two_thirds) = (keys(|k| k % 3 == 0), keys(|k| k % 3 != 0));
    let (gpu, cpu) = contexts(JoinMode::CollectLeft).await;
    for ctx in [&gpu, &cpu] {
        ctx.register_parquet("p", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        ctx.register_table("m", Arc::clone(&memory) as _).unwrap();
        ctx.register_table("third", Arc::clone(&third) as _)
            .unwrap();
        ctx.register_table("two_thirds", Arc::clone(&two_thirds) as _)
            .unwrap();
    }
    for (sql, on_gpu) in [
        (
            "SELECT p.key, p.name, p.note FROM p JOIN third o ON p.key = o.k",
            true,
        ),
        (
            "SELECT p.key, p.name FROM p JOIN two_thirds o ON p.key = o.k",
            false,
        ),
        (
            "SELECT m.key, m.name, m.note FROM m JOIN third o ON m.key = o.k",
            false,
        ),
    ] {
        for run in ["first", "next"] {
            let (plan, tested) = check(&gpu, &cpu, sql).await;
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert_eq!(
                nodes_named(&plan, "GpuScanFilterExec").len(),
                1,
                "{sql}:\n{text}"
            );
            assert!(text.contains("IN join keys"), "{sql}:\n{text}");
            if on_gpu && run == "first" {
                // Partitions of byte ranges that hold no row group have no
                // rows to learn from, and leave their (empty) ranges to
                // DataFusion.
                assert_eq!(tested.kept, rows / 3, "{sql} ({run} run): {tested:?}");
            } else if on_gpu {
                assert_eq!(
                    (tested.on_cpu, tested.kept),
                    (0, rows / 3),
                    "{sql} ({run} run)"
                );
                assert!(
                    text.contains("strings_as_bytes=[name, note]"),
                    "{sql}:\n{text}"
                );
            } else {
                assert!(tested.on_cpu > 0, "{sql} ({run} run): {tested:?}");
            }
        }
    }
    // One partition whose first file holds no rows: the first run learns
    // from the next, and reads the device already.
    let empty_first = temp_dir("key-only-strings-empty-first");
    write_batch(&empty_first.join("a.parquet"), &batch.slice(0, 0));
    write_batch(&empty_first.join("b.parquet"), &batch);
    let (gpu, cpu) = contexts_of_partitions(JoinMode::CollectLeft, 1).await;
    for ctx in [&gpu, &cpu] {
        let folder = empty_first.to_str().unwrap();
        ctx.register_parquet("e", folder, ParquetReadOptions::default())
            .await
            .unwrap();
        ctx.register_table("third", Arc::clone(&third) as _)
            .unwrap();
    }
    let sql = "SELECT e.key, e.name, e.note FROM e JOIN third o ON e.key = o.k";
    let (plan, tested) = check(&gpu, &cpu, sql).await;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert_eq!(
        (tested.on_cpu, tested.kept),
        (0, rows / 3),
        "{sql}:\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty_first);
}

/// A scan that only tests join keys reads the device only where they keep
/// few of its rows (by the share of its keys' range they hold): its fill
/// ahead waits for the keys, and reads nothing into the cache where they
/// keep many, as the scan then leaves every partition to DataFusion. Where
/// they keep few, each part is read once, by the fill or by the scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scan_testing_only_join_keys_is_filled_only_where_they_keep_few_rows() {
    let Some(_) =
        require_gpu("a_scan_testing_only_join_keys_is_filled_only_where_they_keep_few_rows")
    else {
        return;
    };
    // The probe side: keys 0 to 99,999, three rows each, in one file.
    let dir = temp_dir("fill-ahead-keys");
    let rows = 300_000;
    let probe = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("v", DataType::Int32, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&probe),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|r| r % 100_000),
            )) as ArrayRef,
            Arc::new(Int32Array::from_iter(
                (0..rows as i32).map(|r| (r % 7 != 0).then_some(r % 1000)),
            )),
        ],
    )
    .unwrap();
    write_batch(&dir.join("p.parquet"), &batch);
    // Build sides smaller than the probe side (so that DataFusion builds on
    // them): `half` holds every other key, `rare` one in a thousand.
    let half = key_table("key", (0..50_000).map(|k| 2 * k).collect());
    let rare = key_table("key", (0..100).map(|k| 1000 * k + 7).collect());
    let (gpu, cpu) = contexts(JoinMode::CollectLeft).await;
    for ctx in [&gpu, &cpu] {
        ctx.register_parquet("p", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        ctx.register_table("half", Arc::clone(&half) as _).unwrap();
        ctx.register_table("rare", Arc::clone(&rare) as _).unwrap();
    }
    for (sql, keep_many) in [
        ("SELECT p.i, p.v FROM p JOIN half h ON p.i = h.key", true),
        ("SELECT p.i, p.v FROM p JOIN rare r ON p.i = r.key", false),
    ] {
        let (plan, tested) = check(&gpu, &cpu, sql).await;
        let text = displayable(plan.as_ref()).indent(true).to_string();
        let scans = nodes_named(&plan, "GpuScanFilterExec");
        assert_eq!(
            scans.len(),
            1,
            "{sql}: one scan of p testing the keys:\n{text}"
        );
        assert!(text.contains("IN join keys"), "{sql}:\n{text}");
        // A fill that went on after the query would count its parts by now.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let read = plan_metric(&scans[0], "rows_read");
        let filled = plan_metric(&scans[0], "rows_filled_ahead");
        if keep_many {
            assert!(tested.on_cpu > 0 && tested.kept == 0, "{sql}: {tested:?}");
            assert_eq!((read, filled), (0, 0), "{sql}: nothing read into the cache");
            assert_eq!(plan_metric(&plan, "parts_filled_ahead"), 0, "{sql}");
        } else {
            assert_eq!(tested.on_cpu, 0, "{sql}: {tested:?}");
            assert_eq!(tested.kept, 300, "{sql}: {tested:?}");
            if alone_on_the_device() {
                assert_eq!(read + filled, rows, "{sql}: each row read once");
            } else {
                assert!(read + filled >= rows, "{sql}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `b` (the build side of an `EXISTS` join: `k` with duplicates and NULLs
/// over 0..50,000, `s`, `v` all above 0) and `p` (its probe side: keys over
/// 0..5,000, a few NULL, each in several rows of each of four `s`: its
/// groups are far fewer than its rows, which DataFusion takes for their
/// estimate), `build_rows` and `probe_rows` rows.
fn exists_tables(build_rows: usize, probe_rows: usize) -> (RecordBatch, RecordBatch) {
    let schema = |names: &[&str]| {
        Arc::new(Schema::new(
            names
                .iter()
                .map(|name| Field::new(*name, DataType::Int64, true))
                .collect::<Vec<_>>(),
        ))
    };
    let b = RecordBatch::try_new(
        schema(&["k", "s", "v"]),
        vec![
            Arc::new(Int64Array::from_iter(
                (0..build_rows as i64).map(|r| (r % 101 != 0).then_some((r * 7919) % 50_000)),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..build_rows as i64).map(|r| r % 4),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..build_rows as i64).map(|r| 1 + r % 9),
            )),
        ],
    )
    .unwrap();
    let p = RecordBatch::try_new(
        schema(&["k", "s"]),
        vec![
            Arc::new(Int64Array::from_iter(
                (0..probe_rows as i64).map(|r| (r % 97 != 0).then_some((r * 31) % 5_000)),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..probe_rows as i64).map(|r| (r / 3) % 4),
            )),
        ],
    )
    .unwrap();
    (b, p)
}

const EXISTS_QUERIES: &[&str] = &[
    // As TPC-H q21's `NOT EXISTS`: the subquery's table, estimated the
    // smaller side (the groups are estimated as many as `p`'s rows), is
    // the build side.
    "SELECT o.k, o.s FROM (SELECT k, s FROM p GROUP BY k, s) o WHERE NOT EXISTS \
     (SELECT 1 FROM b WHERE b.k = o.k AND b.s <> o.s AND b.v > 0)",
    "SELECT o.k, o.s FROM (SELECT k, s FROM p GROUP BY k, s) o WHERE EXISTS \
     (SELECT 1 FROM b WHERE b.k = o.k AND b.v > 0)",
    "SELECT o.k FROM (SELECT k FROM p GROUP BY k) o WHERE NOT EXISTS \
     (SELECT 1 FROM b WHERE b.k = o.k AND b.v > 5)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_exists_join_reads_only_build_rows_its_probe_keys_match() {
    let Some(_) = require_gpu("a_gpu_exists_join_reads_only_build_rows_its_probe_keys_match")
    else {
        return;
    };
    // `b` in four partitions (four files), as many as the sessions' target
    // partitions: its scan and filter become a scan filter.
    let quarters = |batch: &RecordBatch| -> Vec<Vec<RecordBatch>> {
        let quarter = batch.num_rows() / 4;
        (0..4)
            .map(|i| {
                let rows = if i == 3 {
                    batch.num_rows() - 3 * quarter
                } else {
                    quarter
                };
                vec![batch.slice(i * quarter, rows)]
            })
            .collect()
    };
    for (build_rows, probe_rows) in [(0, 0), (10, 0), (0, 10), (200_000, 300_000)] {
        let (b, p) = exists_tables(build_rows, probe_rows);
        let dir = temp_dir(&format!("exists-build-keys-{build_rows}"));
        for (i, part) in quarters(&b).iter().enumerate() {
            write_batch(&dir.join(format!("{i}.parquet")), &part[0]);
        }
        for parquet in [false, true] {
            for mode in [JoinMode::CollectLeft, JoinMode::Partitioned] {
                let gpu = gpu_context(mode, 4, &[]).await;
                let cpu = cpu_context(mode, 4, &[]).await;
                for ctx in [&gpu, &cpu] {
                    let halves = |batch: &RecordBatch| {
                        let half = batch.num_rows() / 2;
                        vec![
                            vec![batch.slice(0, half)],
                            vec![batch.slice(half, batch.num_rows() - half)],
                        ]
                    };
                    let memory = |batch: &RecordBatch| {
                        Arc::new(MemTable::try_new(batch.schema(), halves(batch)).unwrap())
                    };
                    match parquet {
                        true => ctx
                            .register_parquet(
                                "b",
                                dir.to_str().unwrap(),
                                ParquetReadOptions::default(),
                            )
                            .await
                            .unwrap(),
                        false => {
                            let table = MemTable::try_new(b.schema(), quarters(&b)).unwrap();
                            ctx.register_table("b", Arc::new(table)).unwrap();
                        }
                    }
                    ctx.register_table("p", memory(&p)).unwrap();
                }
                let with = format!(
                    "{build_rows} build rows, {probe_rows} probe rows, parquet {parquet}, {mode:?}"
                );
                let mut tested = 0;
                for sql in EXISTS_QUERIES {
                    let (plan, build) = check(&gpu, &cpu, sql).await;
                    let text = displayable(plan.as_ref()).indent(true).to_string();
                    if !text.contains("(for the scan of the build side)") {
                        continue;
                    }
                    tested += 1;
                    assert_eq!(
                        nodes_named(&plan, "GpuHashJoinExec").len(),
                        1,
                        "{sql}, {with}\n{text}"
                    );
                    if build_rows == 0 || probe_rows == 0 {
                        continue;
                    }
                    // The probe side was read ahead and its set made; the
                    // build side's scan kept only rows whose key it holds.
                    assert!(
                        plan_metric(&plan, "probe_side_read_ahead") >= 1,
                        "{sql}, {with}\n{text}"
                    );
                    assert_eq!(
                        plan_metric(&plan, "probe_side_left_to_join"),
                        0,
                        "{sql}, {with}"
                    );
                    assert!(
                        plan_metric(&plan, "join_key_sets") >= 1,
                        "{sql}, {with}\n{text}"
                    );
                    let threshold = if sql.contains("b.v > 5") { 5 } else { 0 };
                    let unfiltered = (0..build_rows as i64)
                        .filter(|r| 1 + r % 9 > threshold)
                        .count();
                    assert!(build.scanned >= build_rows, "{sql}, {with}: {build:?}");
                    assert!(
                        build.kept > 0 && build.kept < unfiltered / 5,
                        "{sql}, {with}: {} of {unfiltered} build rows kept",
                        build.kept
                    );
                }
                // Collected once, the join's probe side is its own (not
                // merged by the rule): the build side is tested.
                if mode == JoinMode::CollectLeft && build_rows > 0 && probe_rows > 0 {
                    assert!(
                        tested >= 2,
                        "{with}: {tested} joins tested their build side"
                    );
                }
            }
        }
    }
}
