//! `GpuScanFilterExec` against DataFusion: filters and output expressions
//! over every type it reads (strings as codes, string predicates evaluated
//! over each part's dictionary), NULLs, empty and filtered-out tables, from
//! `MemTable`s and Parquet files, under a GPU join and aggregation, the
//! rows' order within a partition, and the fallbacks to DataFusion's plan
//! (too many distinct strings, a 64-bit overflow), also where a Parquet
//! part shows them only in a later batch of its read; LIKE over strings too
//! varied to code, matched over their bytes; byte ranges of a file that
//! hold no row group passed over.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpu::{gpu_decisions, GpuScanFilterExec};

use crate::scan_aggregate::{table, temp_dir, write_parquet, write_parquet_in_row_groups};
use crate::support::{
    cpu_context, gpu_context, physical_plan, plan_metric, require_gpu, rows_in_order,
    same_rows_as_datafusion, table_from_columns, JoinMode,
};

/// The GPU session leaves aggregations over filters to the filter node
/// (no scan aggregation), so aggregates and zero-column outputs above it
/// are tested too.
async fn contexts(target_partitions: usize) -> (SessionContext, SessionContext) {
    (
        gpu_context(
            JoinMode::CollectLeft,
            target_partitions,
            &["SET gpu.tuning.scan_aggregate = false"],
        )
        .await,
        cpu_context(JoinMode::CollectLeft, target_partitions, &[]).await,
    )
}

fn register(contexts: [&SessionContext; 2], name: &str, table: Arc<MemTable>) {
    for ctx in contexts {
        let _ = ctx.deregister_table(name);
        ctx.register_table(name, Arc::clone(&table) as _).unwrap();
    }
}

/// Scan filter nodes in `plan`.
fn scan_filters(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let mut found = 0;
    plan.apply(|node| {
        if node.downcast_ref::<GpuScanFilterExec>().is_some() {
            found += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    found
}

/// Runs `sql` on both sessions and asserts the same rows (a sorted
/// multiset of their text) and a scan filter on the GPU. Returns the GPU
/// plan and its batches.
async fn check(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
) -> (Arc<dyn ExecutionPlan>, Vec<RecordBatch>) {
    let plan = physical_plan(gpu, sql).await;
    // DataFusion answers some queries over empty tables from statistics,
    // reading no table at all.
    let reads_a_table = plan
        .exists(|node| Ok(node.children().is_empty() && node.name() == "DataSourceExec"))
        .unwrap()
        || scan_filters(&plan) > 0;
    if reads_a_table {
        assert!(
            scan_filters(&plan) > 0,
            "{sql}: no scan filter on the GPU\n{}",
            displayable(plan.as_ref()).indent(true)
        );
        assert!(
            gpu_decisions(&plan, gpu.state().config_options())
                .iter()
                .any(|d| d.on_gpu() && d.to_string().contains(GpuScanFilterExec::ALGORITHM)),
            "{sql}: the decisions do not name the scan filter"
        );
    }
    let gpu_batches = same_rows_as_datafusion(gpu, cpu, sql, &plan).await;
    (plan, gpu_batches)
}

/// Filters and outputs over every type (`crate::scan_aggregate::schema`:
/// flag Utf8, status Utf8View, i Int64, n Int32, d Decimal(15, 2), f
/// Float64, dt Date32, b Boolean; about a tenth of each NULL).
const QUERIES: &[&str] = &[
    "SELECT * FROM t WHERE i > 0",
    "SELECT flag, status, i, n, d, f, dt, b FROM t WHERE flag = 'A' OR status IN ('F')",
    "SELECT i + n, d * d, f * 2.5 - 1.0, NOT b, CASE WHEN i > 0 THEN d ELSE -d END, \
     CAST(n AS BIGINT) * 3 FROM t WHERE dt BETWEEN DATE '1992-01-01' AND DATE '1997-06-30'",
    "SELECT flag, i FROM t WHERE flag LIKE 'A%' OR flag IS NULL",
    "SELECT status, d FROM t WHERE status <> 'F' AND d IS NOT NULL AND NOT b",
    "SELECT flag, f FROM t WHERE flag NOT IN ('A', 'R') AND f >= -0.0",
    "SELECT dt, n FROM t WHERE starts_with(status, 'O') AND n IN (1, 2, 3, -4)",
    "SELECT i FROM t WHERE i > 10000000",
    "SELECT count(*) FROM t WHERE b",
    "SELECT flag, count(*), sum(d), min(dt) FROM t WHERE f > 0.0 AND flag <> 'N' GROUP BY flag",
    "SELECT a.i, a.flag, b.d FROM t a JOIN t b ON a.i = b.i \
     WHERE a.flag = 'A' AND b.d > 100.00 AND a.i IS NOT NULL",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scan_filters_answer_as_datafusion_does() {
    let Some(_) = require_gpu("scan_filters_answer_as_datafusion_does") else {
        return;
    };
    let (gpu, cpu) = contexts(4).await;
    // Empty, one row, one batch, several batches and partitions (4, the
    // sessions' target, so no round robin lies between filter and scan).
    for (rows, seed) in [(0, 1), (1, 2), (3000, 3), (200_000, 4)] {
        register([&gpu, &cpu], "t", table(rows, 4, seed));
        for sql in QUERIES {
            let (plan, _) = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql} ({rows} rows)");
            assert!(
                plan_metric(&plan, "rows_scanned") >= rows,
                "{sql} ({rows} rows)"
            );
        }
    }
}

/// A filter comparing with the value of an uncorrelated scalar subquery
/// (TPC-H q22's `c_acctbal > (SELECT avg(c_acctbal) ...)`) runs on the
/// device, the value a constant of the program compiled when the scan runs
/// (DataFusion runs the subquery first); a NULL value keeps no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scalar_subquerys_value_is_read_when_the_scan_runs() {
    let Some(_) = require_gpu("a_scalar_subquerys_value_is_read_when_the_scan_runs") else {
        return;
    };
    let (gpu, cpu) = contexts(4).await;
    register([&gpu, &cpu], "t", table(200_000, 4, 7));
    for (sql, keeps_rows) in [
        ("SELECT i, d FROM t WHERE d > (SELECT avg(d) FROM t WHERE n > 0)", true),
        (
            "SELECT count(*), sum(d) FROM t \
             WHERE i < (SELECT max(i) FROM t WHERE b) - 5 AND f > (SELECT avg(f) FROM t WHERE i > 0)",
            true,
        ),
        ("SELECT i FROM t WHERE d > (SELECT avg(d) FROM t WHERE n > 2147483000)", false),
    ] {
        let (plan, _) = check(&gpu, &cpu, sql).await;
        let mut outer = Vec::new();
        plan.apply(|node| {
            let line = displayable(node.as_ref()).one_line().to_string();
            if node.downcast_ref::<GpuScanFilterExec>().is_some() && line.contains("scalar_subquery") {
                outer.push(Arc::clone(node));
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let text = displayable(plan.as_ref()).indent(true).to_string();
        assert_eq!(outer.len(), 1, "{sql}:\n{text}");
        let metrics = outer[0].metrics().unwrap();
        let count = |name| metrics.sum_by_name(name).map_or(0, |v| v.as_usize());
        assert_eq!(count("cpu_fallback"), 0, "{sql}:\n{text}");
        assert_eq!(count("rows_scanned"), 200_000, "{sql}:\n{text}");
        let kept = metrics.output_rows().unwrap_or(0);
        assert_eq!(kept > 0, keeps_rows, "{sql}: {kept} rows kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scan_filters_read_parquet_files_and_keep_each_partitions_order() {
    let Some(_) = require_gpu("scan_filters_read_parquet_files_and_keep_each_partitions_order")
    else {
        return;
    };
    let (gpu, cpu) = contexts(2).await;
    let dir = temp_dir("scan-filter");
    write_parquet(&dir.join("a.parquet"), 70_000, 11);
    write_parquet(&dir.join("b.parquet"), 50_000, 12);
    for ctx in [&gpu, &cpu] {
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    for sql in QUERIES {
        let (plan, _) = check(&gpu, &cpu, sql).await;
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
    }
    // The same files again (other paths, so other cache entries), their
    // coded strings read a string a row rather than as dictionaries.
    let strings = temp_dir("scan-filter-strings");
    for name in ["a.parquet", "b.parquet"] {
        std::fs::copy(dir.join(name), strings.join(name)).unwrap();
    }
    let a_string_a_row = gpu_context(
        JoinMode::CollectLeft,
        2,
        &[
            "SET gpu.tuning.scan_aggregate = false",
            "SET gpu.tuning.dictionary_reads = false",
        ],
    )
    .await;
    for ctx in [&a_string_a_row, &cpu] {
        let _ = ctx.deregister_table("t");
        ctx.register_parquet(
            "t",
            strings.to_str().unwrap(),
            ParquetReadOptions::default(),
        )
        .await
        .unwrap();
    }
    for sql in QUERIES {
        let (plan, _) = check(&a_string_a_row, &cpu, sql).await;
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
    }
    let _ = std::fs::remove_dir_all(&strings);
    // One partition, no order asked for: the rows come in the scan's order,
    // as DataFusion's filter passes them.
    let (gpu, cpu) = contexts(1).await;
    register([&gpu, &cpu], "t", table(20_000, 1, 5));
    let sql = "SELECT i, flag, d FROM t WHERE d > 1000.00 OR flag = 'R'";
    let (_, gpu_batches) = check(&gpu, &cpu, sql).await;
    let cpu_batches = cpu.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        rows_in_order(&gpu_batches),
        rows_in_order(&cpu_batches),
        "{sql}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn too_many_strings_or_an_overflow_run_the_partition_on_datafusion() {
    let Some(_) = require_gpu("too_many_strings_or_an_overflow_run_the_partition_on_datafusion")
    else {
        return;
    };
    let (gpu, cpu) = contexts(2).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    // Partition 0 has 2,500 distinct strings (more than a part codes),
    // partition 1 three: only the first runs DataFusion's plan.
    let mixed = table_from_columns(Arc::clone(&schema), 5000, 2, 1000, |range| {
        let distinct = if range.start < 2500 { 2500 } else { 3 };
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| r as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                range.map(|r| format!("s{}", r % distinct)),
            )),
        ]
    });
    register([&gpu, &cpu], "u", mixed);
    let sql = "SELECT s, i FROM u WHERE i > 7 AND s <> 's1'";
    let (plan, _) = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1);
    // The next plan over those parts stays DataFusion's, and says why.
    let plan = physical_plan(&gpu, sql).await;
    assert_eq!(scan_filters(&plan), 0);
    assert!(
        gpu_decisions(&plan, gpu.state().config_options())
            .iter()
            .any(|d| d
                .to_string()
                .contains("holds more distinct values in a part")),
        "{sql}: no reason given"
    );
    // Near i64::MAX, twice the value leaves 64 bits (DataFusion wraps).
    let big = table_from_columns(Arc::clone(&schema), 3000, 2, 1000, |range| {
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| i64::MAX - r as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                range.map(|r| format!("s{}", r % 3)),
            )),
        ]
    });
    register([&gpu, &cpu], "u", big);
    let (plan, _) = check(&gpu, &cpu, "SELECT s, i * 2 FROM u WHERE i > 0").await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parquet_part_that_widens_or_turns_too_varied_late_in_its_read_answers_right() {
    let Some(_) = require_gpu(
        "a_parquet_part_that_widens_or_turns_too_varied_late_in_its_read_answers_right",
    ) else {
        return;
    };
    // One partition of two parts (files). The second has 200,000 rows,
    // read in batches of 65,536: `i` leaves 32 bits only from its row
    // 150,000 (its words widen in the fourth batch), and `s` takes 2,000
    // distinct values only from row 140,000 (more than a part codes, found
    // in the third batch). The first part is plain: 3 strings, small `i`.
    let dir = temp_dir("scan-filter-late");
    let write = |name: &str, rows: usize, late: bool| {
        let i = move |r: usize| match late && r >= 150_000 {
            true => (1i64 << 40) + r as i64,
            false => r as i64 - 1000,
        };
        let s = move |r: usize| match late && r >= 140_000 {
            true => format!("s{}", r % 2000),
            false => format!("s{}", r % 3),
        };
        write_ints_and_strings(&dir.join(name), rows, i, s);
    };
    write("a-first.parquet", 50_000, false);
    write("b-late.parquet", 200_000, true);
    let rows = 250_000;
    let (gpu, cpu) = contexts(1).await;
    register_parquet([&gpu, &cpu], "late", &dir).await;
    let sql = "SELECT i, i * 3 FROM late WHERE i > 5 AND i <> 13";
    let (plan, _) = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
    assert_eq!(plan_metric(&plan, "rows_scanned"), rows, "{sql}");
    // The first part on the device, the second filtered on the host (`<`
    // reads strings too varied to code otherwise than the device can), the
    // rows in the scan's order.
    let sql = "SELECT s, i FROM late WHERE i > 7 AND s < 's1'";
    let (plan, gpu_batches) = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1, "{sql}");
    let cpu_batches = cpu.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        rows_in_order(&gpu_batches),
        rows_in_order(&cpu_batches),
        "{sql}"
    );
    let plan = physical_plan(&gpu, sql).await;
    assert_eq!(
        scan_filters(&plan),
        0,
        "{sql}: the next plan stays DataFusion's"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_part_too_varied_after_parts_that_kept_no_row_leaves_the_partition_to_datafusion() {
    let Some(_) = require_gpu(
        "a_part_too_varied_after_parts_that_kept_no_row_leaves_the_partition_to_datafusion",
    ) else {
        return;
    };
    // One partition of two files: the first keeps no row (every `i` is
    // negative), the second has more distinct strings than a part codes.
    // With nothing kept, DataFusion's chain takes the partition, streaming,
    // rather than the second file being read again and filtered on the
    // host (as after a part that kept rows).
    let dir = temp_dir("scan-filter-none-kept");
    write_ints_and_strings(
        &dir.join("a.parquet"),
        20_000,
        |r| -(r as i64) - 1,
        |r| format!("s{}", r % 3),
    );
    write_ints_and_strings(
        &dir.join("b.parquet"),
        20_000,
        |r| r as i64,
        |r| format!("s{}", r % 2500),
    );
    let (gpu, cpu) = contexts(1).await;
    register_parquet([&gpu, &cpu], "none_kept", &dir).await;
    // `<` reads strings too varied to code otherwise than the device can.
    let sql = "SELECT s, i FROM none_kept WHERE i > 7 AND s < 's1'";
    let (plan, gpu_batches) = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1, "{sql}");
    let mut kept_by_the_node = None;
    plan.apply(|node| {
        if node.downcast_ref::<GpuScanFilterExec>().is_some() {
            kept_by_the_node = node.metrics().and_then(|m| m.output_rows());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    assert_eq!(
        kept_by_the_node,
        Some(0),
        "{sql}: rows filtered on the host"
    );
    let cpu_batches = cpu.sql(sql).await.unwrap().collect().await.unwrap();
    assert_eq!(
        rows_in_order(&gpu_batches),
        rows_in_order(&cpu_batches),
        "{sql}"
    );
    assert!(!cpu_batches.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// How a test's Parquet files are written and read in pieces.
struct PieceLayout {
    /// Each file's name, rows, seed and rows a row group.
    files: &'static [(&'static str, usize, u64, usize)],
    /// `gpu.tuning.min_part_rows` for a scan aggregation, which reads its
    /// table at once, and for scan filters, which read their parts in turn.
    aggregate_piece_rows: usize,
    filter_piece_rows: usize,
    /// Pieces the scan aggregation reads by tasks of their own: exactly
    /// (where alone on the device), or at least.
    pieces_alone: Option<usize>,
    least_pieces: usize,
}

/// The files of `layout`, read by three partitions in byte ranges: a scan
/// aggregation, in a cache that holds none of their columns, reads every
/// row once, in pieces; scan filters over copies of the files (other cache
/// keys), which read their parts by one task each, but for the last pieces
/// an idle fill-ahead task reads for it (`gpu.tuning.steal_pieces`), read
/// every row once, by the scan or ahead of it (twice only where other
/// tests' device memory evicted a part between the two), and without
/// stealing, no piece; every answer DataFusion's.
async fn parquet_read_in_pieces_answers_right(name: &str, layout: PieceLayout) {
    let dir = temp_dir(name);
    for &(file, rows, seed, group_rows) in layout.files {
        write_parquet_in_row_groups(&dir.join(file), rows, seed, group_rows);
    }
    let rows: usize = layout.files.iter().map(|file| file.1).sum();
    let ranges = "SET datafusion.optimizer.repartition_file_min_size = 0";
    let cpu = cpu_context(JoinMode::CollectLeft, 3, &[ranges]).await;
    cpu.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    let aggregate_pieces = format!(
        "SET gpu.tuning.min_part_rows = {}",
        layout.aggregate_piece_rows
    );
    let gpu = gpu_context(JoinMode::CollectLeft, 3, &[ranges, &aggregate_pieces]).await;
    gpu.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    for sql in [
        "SELECT flag, count(*), sum(d), min(dt), max(i) FROM t WHERE f > 0.0 GROUP BY flag",
        "SELECT count(*), sum(n) FROM t WHERE b AND status <> 'F'",
    ] {
        let plan = physical_plan(&gpu, sql).await;
        let shown = displayable(plan.as_ref()).indent(true).to_string();
        assert!(
            shown.contains("GpuScanAggregateExec"),
            "{sql}: no scan aggregation\n{shown}"
        );
        same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
        if sql.contains("GROUP BY") {
            let shown = displayable(plan.as_ref()).indent(true).to_string();
            let (read, pieces) = (
                plan_metric(&plan, "rows_read"),
                plan_metric(&plan, "pieces_read"),
            );
            match crate::support::alone_on_the_device() {
                true => assert_eq!(read, rows, "{sql}\n{shown}"),
                false => assert!(read >= rows, "{sql}: {read} rows read\n{shown}"),
            }
            match (crate::support::alone_on_the_device(), layout.pieces_alone) {
                (true, Some(wanted)) => assert_eq!(pieces, wanted, "{sql}\n{shown}"),
                _ => assert!(
                    pieces >= layout.least_pieces,
                    "{sql}: {pieces} pieces\n{shown}"
                ),
            }
        }
    }
    for steal in [false, true] {
        let copy = temp_dir(&format!("{name}-copy-{steal}"));
        for &(file, ..) in layout.files {
            std::fs::copy(dir.join(file), copy.join(file)).unwrap();
        }
        let steal_pieces = format!("SET gpu.tuning.steal_pieces = {steal}");
        let filter_pieces = format!(
            "SET gpu.tuning.min_part_rows = {}",
            layout.filter_piece_rows
        );
        let settings = [
            "SET gpu.tuning.scan_aggregate = false",
            ranges,
            &filter_pieces,
            &steal_pieces,
        ];
        let gpu = gpu_context(JoinMode::CollectLeft, 3, &settings).await;
        gpu.register_parquet("t", copy.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        for (at, sql) in QUERIES.iter().enumerate() {
            let (plan, _) = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
            if at == 0 {
                let read =
                    plan_metric(&plan, "rows_read") + plan_metric(&plan, "rows_filled_ahead");
                match crate::support::alone_on_the_device() {
                    true => assert_eq!(read, rows, "{sql}, {steal_pieces}"),
                    false => assert!(read >= rows, "{sql}, {steal_pieces}: {read} rows read"),
                }
                if !steal {
                    assert_eq!(plan_metric(&plan, "pieces_read"), 0, "{sql}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&copy);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parquet_parts_read_in_pieces_of_row_groups_answer_right_and_read_each_row_once() {
    let Some(_) = require_gpu(
        "parquet_parts_read_in_pieces_of_row_groups_answer_right_and_read_each_row_once",
    ) else {
        return;
    };
    // Two files of 12 and 5 row groups of 5,000 rows, each range read in
    // pieces of one row group, then of two: 17 row groups in at most four
    // ranges, some read in pieces.
    let layout = PieceLayout {
        files: &[
            ("a.parquet", 60_000, 31, 5_000),
            ("b.parquet", 25_000, 32, 5_000),
        ],
        aggregate_piece_rows: 5_000,
        filter_piece_rows: 9_000,
        pieces_alone: None,
        least_pieces: 2,
    };
    parquet_read_in_pieces_answers_right("row-group-pieces", layout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parquet_row_group_read_in_slices_of_its_rows_answers_right_and_reads_each_row_once() {
    let Some(_) = require_gpu(
        "a_parquet_row_group_read_in_slices_of_its_rows_answers_right_and_reads_each_row_once",
    ) else {
        return;
    };
    // One file of one row group of 60,000 rows (two of the three ranges hold
    // no row group), cut into six slices of 10,000 rows, read by tasks of
    // their own, or in turn, the last by idle tasks.
    let layout = PieceLayout {
        files: &[("a.parquet", 60_000, 33, 60_000)],
        aggregate_piece_rows: 10_000,
        filter_piece_rows: 10_000,
        pieces_alone: Some(6),
        least_pieces: 6,
    };
    parquet_read_in_pieces_answers_right("row-group-slices", layout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parquet_parts_of_one_row_group_read_their_columns_apart_and_answer_right() {
    let Some(_) =
        require_gpu("parquet_parts_of_one_row_group_read_their_columns_apart_and_answer_right")
    else {
        return;
    };
    // Three files of one row group each, one part a file: each part read
    // whole by one task, its two coded string columns each by a read of
    // its own and the other columns together by one more
    // (`gpu.tuning.read_columns_apart`), or every column by one read.
    let dir = temp_dir("columns-apart");
    for (at, seed) in [(0, 41), (1, 42), (2, 43)] {
        write_parquet(&dir.join(format!("p{at}.parquet")), 30_000, seed);
    }
    // A string a row, kept as its bytes, beside an integer column: three
    // files too, so that no round robin lies between filter and scan.
    let varied = temp_dir("columns-apart-varied");
    let varied_files = [
        ("a.parquet", 0),
        ("b.parquet", 20_000),
        ("c.parquet", 40_000),
    ];
    for (name, start) in varied_files {
        write_ints_and_strings(
            &varied.join(name),
            20_000,
            |r| (start + r) as i64,
            |r| varied_string(start + r).unwrap_or_default(),
        );
    }
    let whole_files = "SET datafusion.optimizer.repartition_file_scans = false";
    let cpu = cpu_context(JoinMode::CollectLeft, 3, &[whole_files]).await;
    for (name, dir) in [("t", &dir), ("w", &varied)] {
        cpu.register_parquet(name, dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
    for apart in [true, false] {
        // Copies of the files: other paths, so parts the cache misses.
        let (copy, copy_varied) = (
            temp_dir(&format!("columns-apart-{apart}")),
            temp_dir(&format!("columns-apart-varied-{apart}")),
        );
        for at in 0..3 {
            let name = format!("p{at}.parquet");
            std::fs::copy(dir.join(&name), copy.join(&name)).unwrap();
        }
        for (name, _) in varied_files {
            std::fs::copy(varied.join(name), copy_varied.join(name)).unwrap();
        }
        let setting = format!("SET gpu.tuning.read_columns_apart = {apart}");
        let settings = [
            "SET gpu.tuning.scan_aggregate = false",
            whole_files,
            &setting,
        ];
        let gpu = gpu_context(JoinMode::CollectLeft, 3, &settings).await;
        for (name, dir) in [("t", &copy), ("w", &copy_varied)] {
            gpu.register_parquet(name, dir.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap();
        }
        for (at, sql) in QUERIES.iter().enumerate() {
            let (plan, _) = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}, {setting}");
            if at == 0 {
                // Every column of every part missed, read by the scan or
                // ahead of it: three parts, read apart or not at all so
                // (more only where other tests' device memory evicted a
                // part between two reads).
                let (read, parts_apart) = (
                    plan_metric(&plan, "rows_read") + plan_metric(&plan, "rows_filled_ahead"),
                    plan_metric(&plan, "parts_read_apart"),
                );
                let shown = displayable(plan.as_ref()).indent(true).to_string();
                assert!(
                    read >= 90_000,
                    "{sql}, {setting}: {read} rows read\n{shown}"
                );
                match (apart, crate::support::alone_on_the_device()) {
                    (true, true) => assert_eq!(parts_apart, 3, "{sql}\n{shown}"),
                    (true, false) => assert!(parts_apart >= 3, "{sql}: {parts_apart}\n{shown}"),
                    (false, _) => assert_eq!(parts_apart, 0, "{sql}\n{shown}"),
                }
            }
        }
        // The strings too varied to code: the first plan finds them so and
        // reads them as their bytes, the next from the start; matched by
        // LIKE and output.
        for sql in [
            LIKE_QUERIES[0],
            "SELECT s, i FROM w WHERE s LIKE 'special%'",
            "SELECT i, s FROM w WHERE i > 20000 OR s LIKE '%requests'",
        ] {
            let (plan, _) = check(&gpu, &cpu, sql).await;
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}, {setting}");
        }
        let _ = std::fs::remove_dir_all(&copy);
        let _ = std::fs::remove_dir_all(&copy_varied);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&varied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_left_to_datafusion_reads_only_its_own_files() {
    let Some(_) = require_gpu("a_partition_left_to_datafusion_reads_only_its_own_files") else {
        return;
    };
    // Two files, one partition each: the first with more distinct strings
    // than a part codes (its partition runs DataFusion's chain), the second
    // plain (its partition runs on the device). DataFusion's scan would let
    // the first partition's stream take the second file too, once done with
    // its own, as no other stream of the scan runs.
    let dir = temp_dir("scan-filter-own-files");
    for (name, distinct) in [("a.parquet", 2500), ("b.parquet", 3)] {
        let s = move |r: usize| format!("s{}", r % distinct);
        write_ints_and_strings(&dir.join(name), 20_000, |r| r as i64, s);
    }
    let (gpu, cpu) = contexts(2).await;
    register_parquet([&gpu, &cpu], "own", &dir).await;
    // `<` reads the strings the device keeps as bytes otherwise than it can.
    let sql = "SELECT s, i FROM own WHERE i > 7 AND s < 's1'";
    let (plan, _) = check(&gpu, &cpu, sql).await;
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 1, "{sql}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Row `r`'s string for the LIKE tests: nearly every row distinct (more
/// than a part codes), with NULLs, empty strings, the patterns' texts at
/// the start, the end, the middle, in the wrong order, overlapping,
/// multibyte characters and newlines between them.
pub(crate) fn varied_string(r: usize) -> Option<String> {
    Some(match r % 13 {
        0 => return None,
        1 => String::new(),
        2 => format!("special{r}requests"),
        3 => format!("{r} requests special"),
        4 => format!("spécial€{r}\nrequests"),
        5 => format!("specialrequests{r}"),
        6 => format!("{r}special\nrequests"),
        7 => "special".into(),
        8 => format!("x{r}special"),
        9 => "ab".into(),
        10 => "aba".into(),
        11 => format!("ab{r}ab"),
        _ => format!("€{r}"),
    })
}

/// LIKE predicates of text and `%`, `=`, `<>` and `IN` with text (of the
/// string or of its first characters), and their negations, that the
/// device matches over a column's bytes.
const LIKE_QUERIES: &[&str] = &[
    "SELECT i FROM w WHERE s NOT LIKE '%special%requests%'",
    "SELECT i, i * 2 FROM w WHERE s LIKE '%special%requests%' AND i > 10",
    "SELECT i FROM w WHERE s LIKE 'special%'",
    "SELECT i FROM w WHERE s LIKE '%requests'",
    "SELECT i FROM w WHERE s LIKE 'special'",
    "SELECT i FROM w WHERE s LIKE ''",
    "SELECT i FROM w WHERE s LIKE '%' OR i < 3",
    "SELECT i FROM w WHERE s LIKE 'ab%ab'",
    "SELECT i FROM w WHERE s LIKE 'a%%a'",
    "SELECT count(*) FROM w WHERE s LIKE '%€%' OR s IS NULL",
    "SELECT i FROM w WHERE NOT (s NOT LIKE '%e%') AND i < 5000",
    "SELECT i FROM w WHERE s LIKE '%special%\nrequests'",
    // A segment whose first byte comes often before it matches, or in
    // the middle of a multibyte character's bytes.
    "SELECT i FROM w WHERE s LIKE '%es%ts' AND s NOT LIKE '%ab%b'",
    "SELECT i FROM w WHERE s LIKE '%€1%' OR s LIKE '%\u{82}%'",
    "SELECT i FROM w WHERE s = 'aba' OR s <> '' AND i > 20000",
    "SELECT i FROM w WHERE s IN ('ab', 'special', '€5') OR 'a%' = s",
    "SELECT i FROM w WHERE s NOT IN ('ab', 'aba', '') AND s NOT LIKE '%€%'",
    // Their first characters: a prefix of as many, the whole string for a
    // shorter value, nothing for a longer one.
    "SELECT i FROM w WHERE substr(s, 1, 2) IN ('ab', 'sp', '€1', 'x', '', 'abc')",
    "SELECT i FROM w WHERE substr(s, 1, 3) NOT IN ('spe', 'aba', 'ab') AND i < 20000",
    "SELECT count(*) FROM w WHERE substr(s, 1, 1) = '€' OR substring(s FROM 1 FOR 7) <> 'special'",
];

/// Runs [`LIKE_QUERIES`] over table `w`, whose `s` the device must keep as
/// bytes: the first run, planned to code it, finds it too varied and reads
/// its bytes instead; the next plans read its bytes from the start; a plan
/// that reads `s` otherwise stays DataFusion's, and says why, but for `s`
/// output from files (`from_files`), which comes from its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn byte_ranges_that_hold_no_row_group_copy_nothing_to_the_device() {
    let Some(_) = require_gpu("byte_ranges_that_hold_no_row_group_copy_nothing_to_the_device")
    else {
        return;
    };
    // One file of one row group, cut into four byte ranges (no least size
    // for a cut): a range holds the rows of the row groups that start in
    // it, so three hold none, and their parts are passed over, nothing
    // set up on the device for them.
    let dir = temp_dir("scan-filter-empty-ranges");
    write_ints_and_strings(
        &dir.join("a.parquet"),
        50_000,
        |r| r as i64,
        |r| format!("s{}", r % 7),
    );
    let settings = [
        "SET gpu.tuning.scan_aggregate = false",
        "SET datafusion.optimizer.repartition_file_min_size = 0",
    ];
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &settings).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &settings[1..]).await;
    register_parquet([&gpu, &cpu], "one_group", &dir).await;
    let sql = "SELECT s, i FROM one_group WHERE i > 100 AND s <> 's2'";
    // The first run fills the cache; the second reads it.
    check(&gpu, &cpu, sql).await;
    let (plan, _) = check(&gpu, &cpu, sql).await;
    let mut by_partition: Vec<(usize, usize, usize)> = Vec::new();
    plan.apply(|node| {
        if node.downcast_ref::<GpuScanFilterExec>().is_some() {
            let metrics = node.metrics().unwrap();
            let partitions = node.properties().output_partitioning().partition_count();
            let of = |name: &str, p: usize| -> usize {
                metrics
                    .iter()
                    .filter(|m| m.partition() == Some(p) && m.value().name() == name)
                    .map(|m| m.value().as_usize())
                    .sum()
            };
            by_partition = (0..partitions)
                .map(|p| {
                    (
                        of("rows_scanned", p),
                        of("h2d_bytes", p),
                        of("d2h_bytes", p),
                    )
                })
                .collect();
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    assert_eq!(
        by_partition.len(),
        4,
        "{sql}: the file is cut into 4 ranges"
    );
    let scanned: Vec<usize> = by_partition.iter().map(|&(rows, _, _)| rows).collect();
    assert_eq!(scanned.iter().sum::<usize>(), 50_000, "{sql}: {scanned:?}");
    assert_eq!(
        scanned.iter().filter(|&&rows| rows > 0).count(),
        1,
        "{sql}: one range holds the row group: {scanned:?}"
    );
    for &(rows, up, down) in &by_partition {
        if rows == 0 {
            assert_eq!(
                (up, down),
                (0, 0),
                "{sql}: an empty range's bytes copied: {by_partition:?}"
            );
        } else {
            assert!(
                up > 0 && down > 0,
                "{sql}: the range of rows: {by_partition:?}"
            );
        }
    }
    assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
    let _ = std::fs::remove_dir_all(&dir);
}

async fn like_queries_match_bytes(gpu: &SessionContext, cpu: &SessionContext, from_files: bool) {
    let (plan, _) = check(gpu, cpu, LIKE_QUERIES[0]).await;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert!(
        !text.contains("strings_as_bytes"),
        "the first plan codes `s`:\n{text}"
    );
    assert_eq!(
        plan_metric(&plan, "cpu_fallback"),
        0,
        "the first run reads the bytes"
    );
    for sql in LIKE_QUERIES {
        let (plan, _) = check(gpu, cpu, sql).await;
        let text = displayable(plan.as_ref()).indent(true).to_string();
        assert!(text.contains("strings_as_bytes=[s]"), "{sql}:\n{text}");
        assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
    }
    let outputs = [
        "SELECT s, i FROM w WHERE s LIKE 'special%'",
        "SELECT i, s FROM w WHERE i > 20000 OR s IS NULL",
        "SELECT s FROM w WHERE s NOT LIKE '%e%' AND i > 100",
    ];
    if from_files {
        for sql in outputs {
            let (plan, _) = check(gpu, cpu, sql).await;
            let text = displayable(plan.as_ref()).indent(true).to_string();
            assert_eq!(scan_filters(&plan), 1, "{sql}:\n{text}");
            assert!(text.contains("strings_as_bytes=[s]"), "{sql}:\n{text}");
            assert_eq!(plan_metric(&plan, "cpu_fallback"), 0, "{sql}");
        }
    }
    let output = (!from_files).then_some((outputs[0], "and is output"));
    for (sql, reason) in output.into_iter().chain([
        ("SELECT i FROM w WHERE s LIKE 'a_a'", "`_`"),
        ("SELECT i FROM w WHERE s < 'aba'", "only by LIKE"),
        (
            "SELECT i FROM w WHERE substr(s, 1, 1) IN ('ab', 'cd')",
            "is not evaluated on the device",
        ),
    ]) {
        let plan = physical_plan(gpu, sql).await;
        assert_eq!(scan_filters(&plan), 0, "{sql}");
        assert!(
            gpu_decisions(&plan, gpu.state().config_options())
                .iter()
                .any(|d| d.to_string().contains(reason)),
            "{sql}: no reason given"
        );
        same_rows_as_datafusion(gpu, cpu, sql, &plan).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn like_over_strings_too_varied_to_code_matches_their_bytes() {
    let Some(_) = require_gpu("like_over_strings_too_varied_to_code_matches_their_bytes") else {
        return;
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]));
    let table = table_from_columns(Arc::clone(&schema), 30_000, 2, 4096, |range| {
        vec![
            Arc::new(Int64Array::from_iter_values(
                range.clone().map(|r| r as i64),
            )),
            Arc::new(StringArray::from_iter(range.map(varied_string))),
        ]
    });
    let (gpu, cpu) = contexts(2).await;
    register([&gpu, &cpu], "w", table);
    like_queries_match_bytes(&gpu, &cpu, false).await;
    // From Parquet (strings read as views), two files.
    let dir = temp_dir("scan-filter-like");
    for (name, start) in [("a.parquet", 0), ("b.parquet", 20_000)] {
        let schema = Arc::clone(&schema);
        let rows = 20_000;
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(
                    (start..start + rows).map(|r| r as i64),
                )),
                Arc::new(StringArray::from_iter(
                    (start..start + rows).map(varied_string),
                )),
            ],
        )
        .unwrap();
        let file = std::fs::File::create(dir.join(name)).unwrap();
        let mut writer =
            datafusion::parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }
    let (gpu, cpu) = contexts(2).await;
    register_parquet([&gpu, &cpu], "w", &dir).await;
    like_queries_match_bytes(&gpu, &cpu, true).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Parquet file of `rows` rows: `i` (Int64) and `s` (Utf8) of each row.
fn write_ints_and_strings(
    path: &std::path::Path,
    rows: usize,
    i: impl Fn(usize) -> i64,
    s: impl Fn(usize) -> String,
) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("i", DataType::Int64, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values((0..rows).map(i))),
            Arc::new(StringArray::from_iter_values((0..rows).map(s))),
        ],
    )
    .unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = datafusion::parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// Registers the Parquet files of `dir` as table `name` in each session.
async fn register_parquet(contexts: [&SessionContext; 2], name: &str, dir: &std::path::Path) {
    for ctx in contexts {
        ctx.register_parquet(name, dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
}
