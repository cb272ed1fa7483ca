//! Differential tests of the GPU sort-merge join against DataFusion's
//! `SortMergeJoinExec` (`prefer_hash_join = false` on both sides): every
//! join type the planner makes a sort-merge join of, every fixed-width key
//! type, residual filters, NULLs, duplicates, skew and empty sides, the
//! output order nodes above rely on, inputs that arrive sorted, bounded
//! output ranges, and the run-time fallback to the CPU join.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::logical_expr::{col, SortExpr};
use datafusion::physical_plan::joins::SortMergeJoinExec;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::SessionContext;
use datafusion_gpu::GpuSortMergeJoinExec;

use crate::join_types::{shape, typed_table_in, Shape, KEYS, QUERIES};
use crate::support::*;

/// DataFusion plans a sort-merge join for an equi-join with this, when
/// there are several target partitions.
const SORT_MERGE: &str = "SET datafusion.optimizer.prefer_hash_join = false";

/// Where a join is expected to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// On the GPU.
    Gpu,
    /// Planned on the GPU, joined by DataFusion's operator at run time (keys
    /// whose ranges need more than 64 bits together).
    GpuFallingBack,
    /// On the CPU (no order-preserving code for the key type).
    Cpu,
}

/// Where a join on the key condition named `key` (in `KEYS`) runs: types
/// with order-preserving codes on the GPU, unless their ranges are too
/// wide; the others (strings, floats) on the CPU.
fn expect(key: &str) -> Expect {
    let fixed_width = !["Utf8", "Float64", "Utf8View", "LargeUtf8"]
        .iter()
        .any(|t| key.split('+').any(|part| part == *t));
    match (fixed_width, key.contains("wide")) {
        (false, _) => Expect::Cpu,
        (true, true) => Expect::GpuFallingBack,
        (true, false) => Expect::Gpu,
    }
}

fn show(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

/// The join types of the GPU and the CPU sort-merge joins in `plan`.
fn merge_join_types(
    plan: &Arc<dyn ExecutionPlan>,
    gpu: &mut BTreeSet<String>,
    cpu: &mut BTreeSet<String>,
) {
    if let Some(join) = plan.downcast_ref::<GpuSortMergeJoinExec>() {
        gpu.insert(join.sort_merge_join().join_type().to_string());
    }
    if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        cpu.insert(join.join_type().to_string());
    }
    for child in plan.children() {
        merge_join_types(child, gpu, cpu);
    }
}

/// The sum of metric `name` over the GPU sort-merge joins of `plan`.
fn merge_join_metric(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    node_metric::<GpuSortMergeJoinExec>(plan, name)
}

/// The contexts a query runs in: sort-merge joins with the GPU rule, the
/// same on DataFusion's CPU operators, and DataFusion's hash joins.
struct Contexts {
    gpu: SessionContext,
    cpu: SessionContext,
    cpu_hash: SessionContext,
}

/// `mode` is `Partitioned` for the GPU join over all input partitions
/// (`gpu.tuning.merge_partitions`, by default only over sorted partitions, here
/// over unsorted ones too), `PartitionedKept` for one GPU join per
/// partition of DataFusion's repartitions.
async fn contexts(mode: JoinMode, partitions: usize, extra: &[&str]) -> Contexts {
    let mut statements = vec![SORT_MERGE];
    if mode == JoinMode::Partitioned {
        statements.push("SET gpu.tuning.merge_unsorted_sort_merge_inputs = true");
    }
    statements.extend_from_slice(extra);
    Contexts {
        gpu: gpu_context(mode, partitions, &statements).await,
        cpu: cpu_context(mode, partitions, &statements).await,
        cpu_hash: cpu_context(mode, partitions, extra).await,
    }
}

/// Both ways a GPU sort-merge join runs: once over all input partitions,
/// and per partition of DataFusion's repartitions.
const MODES: [JoinMode; 2] = [JoinMode::Partitioned, JoinMode::PartitionedKept];

/// Whether `plan` holds a GPU sort-merge join over all input partitions.
fn runs_over_all_partitions(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<GpuSortMergeJoinExec>()
        .is_some_and(|join| join.repartitions_removed())
        || plan.children().into_iter().any(runs_over_all_partitions)
}

fn register(ctxs: [&SessionContext; 3], r: Shape, s: Shape, partitions: usize) {
    for ctx in ctxs {
        ctx.register_table("r", typed_table_in(r, 1, partitions))
            .unwrap();
        ctx.register_table("s", typed_table_in(s, 2, partitions))
            .unwrap();
    }
}

/// The rows of `sql` on DataFusion's `SortMergeJoinExec`, or, where that
/// fails, on its `HashJoinExec`, with the failure: DataFusion 55.2's
/// sort-merge join errors on Left and Full joins whose filter reads a
/// non-nullable column of the buffered side ("declared as non-nullable but
/// contains null values", the family of apache/datafusion#21197), which the
/// GPU join answers.
async fn reference_rows(ctxs: &Contexts, sql: &str) -> (Vec<RecordBatch>, Option<String>) {
    let planned = ctxs
        .cpu
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    match planned.collect().await {
        Ok(batches) => (batches, None),
        Err(e) => (run(&ctxs.cpu_hash, sql).await.0, Some(e.to_string())),
    }
}

/// Runs `sql` on the GPU and on the CPU; asserts equal rows and, for
/// fixed-width keys, a sort-merge join on the GPU. Returns the GPU plan and
/// its rows (a plan runs once: DataFusion's repartitions cannot rerun).
async fn check(
    ctxs: &Contexts,
    sql: &str,
    expect: Expect,
) -> (Arc<dyn ExecutionPlan>, Vec<RecordBatch>) {
    let on_gpu = expect != Expect::Cpu;
    let (cpu_batches, smj_failure) = reference_rows(ctxs, sql).await;
    if let (true, Some(failure)) = (expect != Expect::Gpu, &smj_failure) {
        // DataFusion's own join runs (planned so, or as the fallback), and
        // fails the same way on both paths.
        let plan = ctxs
            .gpu
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        assert_eq!(
            show(&plan).contains("GpuSortMergeJoinExec"),
            on_gpu,
            "{sql}"
        );
        eprintln!("not compared, DataFusion's sort-merge join fails either way: {sql}: {failure}");
        return (plan, vec![]);
    }
    if let Some(failure) = &smj_failure {
        eprintln!("reference for {sql}: HashJoinExec, as SortMergeJoinExec fails: {failure}");
    }
    let (gpu_batches, gpu_nodes, plan) = run_counting(&ctxs.gpu, sql, "SortMergeJoinExec").await;
    if on_gpu {
        assert!(
            gpu_nodes >= 1,
            "{sql}: no sort-merge join on the GPU\n{}",
            show(&plan)
        );
    } else {
        assert_eq!(
            gpu_nodes,
            0,
            "{sql}: a key type without codes on the GPU\n{}",
            show(&plan)
        );
    }
    let (g, c) = (string_rows(&gpu_batches), string_rows(&cpu_batches));
    if g != c {
        let first = g.iter().zip(&c).position(|(a, b)| a != b);
        panic!(
            "{sql}: GPU {} rows, CPU {} rows, first difference at sorted row {first:?}\n{}",
            g.len(),
            c.len(),
            show(&plan)
        );
    }
    (plan, gpu_batches)
}

/// Every query of the hash join's differential tests, as sort-merge joins.
async fn every_query(
    name: &str,
    r: Shape,
    s: Shape,
    extra: &[&str],
) -> Option<[BTreeSet<String>; 2]> {
    require_gpu(name)?;
    let (mut on_gpu, mut on_cpu) = (BTreeSet::new(), BTreeSet::new());
    for mode in MODES {
        let mut over_all_partitions = 0;
        for partitions in [2, 4] {
            let ctxs = contexts(mode, partitions, extra).await;
            register([&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash], r, s, partitions);
            for (key, on) in KEYS {
                for query in QUERIES {
                    let sql = query.replace("{on}", on);
                    let (plan, _) = check(&ctxs, &sql, expect(key)).await;
                    let mut cpu_types = BTreeSet::new();
                    merge_join_types(&plan, &mut on_gpu, &mut cpu_types);
                    if expect(key) != Expect::Cpu {
                        on_cpu.extend(cpu_types);
                    }
                    over_all_partitions += usize::from(runs_over_all_partitions(&plan));
                }
            }
        }
        // Each mode ran the joins it names.
        match mode {
            JoinMode::PartitionedKept => assert_eq!(over_all_partitions, 0, "{name}"),
            _ => assert!(
                over_all_partitions > 0,
                "{name}: no join over all partitions"
            ),
        }
    }
    Some([on_gpu, on_cpu])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_sort_merge_join_type_on_every_fixed_width_key() {
    let mut seen = BTreeSet::new();
    for (r, s) in [
        (shape(1_500, 700, 11, 0), shape(4_000, 900, 13, 0)),
        (shape(5_000, 2_000, 7, 0), shape(900, 400, 0, 0)),
    ] {
        let Some([on_gpu, on_cpu]) = every_query(
            "every_sort_merge_join_type_on_every_fixed_width_key",
            r,
            s,
            &[],
        )
        .await
        else {
            return;
        };
        assert!(
            on_cpu.is_empty(),
            "sort-merge joins on fixed-width keys left on the CPU: {on_cpu:?}"
        );
        seen.extend(on_gpu);
    }
    for join_type in [
        "Inner",
        "Left",
        "Right",
        "Full",
        "LeftSemi",
        "LeftAnti",
        "RightSemi",
        "RightAnti",
    ] {
        assert!(
            seen.contains(join_type),
            "{join_type} never ran as a GPU sort-merge join; seen: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skew_nulls_empty_sides_and_bounded_output_ranges() {
    for (r, s, extra) in [
        // A tenth of each side on one key, output ranges of 300 pairs.
        (
            shape(1_000, 300, 9, 10),
            shape(1_200, 300, 0, 10),
            &["SET gpu.max_output_pairs = 300"][..],
        ),
        (shape(0, 1, 0, 0), shape(1_000, 100, 5, 0), &[][..]),
        (shape(1_000, 100, 5, 0), shape(0, 1, 0, 0), &[][..]),
        (shape(500, 50, 1, 0), shape(800, 50, 3, 0), &[][..]),
    ] {
        if every_query(
            "skew_nulls_empty_sides_and_bounded_output_ranges",
            r,
            s,
            extra,
        )
        .await
        .is_none()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn null_equals_null_as_a_sort_merge_join() {
    let Some(_) = require_gpu("null_equals_null_as_a_sort_merge_join") else {
        return;
    };
    let queries = [
        "SELECT r.id, s.id FROM r JOIN s ON r.k32 IS NOT DISTINCT FROM s.k32",
        "SELECT r.id, s.id FROM r FULL JOIN s ON r.k64 IS NOT DISTINCT FROM s.k64",
        "SELECT r.id, s.id FROM r LEFT JOIN s ON (r.k64 IS NOT DISTINCT FROM s.k64) AND (r.kb IS NOT DISTINCT FROM s.kb)",
    ];
    for (mode, partitions) in MODES.into_iter().flat_map(|m| [(m, 2), (m, 4)]) {
        let ctxs = contexts(mode, partitions, &[]).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(1_200, 300, 10, 0),
            shape(2_000, 400, 17, 0),
            partitions,
        );
        for sql in queries {
            check(&ctxs, sql, Expect::Gpu).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_output_keeps_the_key_order_nodes_above_rely_on() {
    let Some(_) = require_gpu("the_output_keeps_the_key_order_nodes_above_rely_on") else {
        return;
    };
    // The ORDER BY is satisfied by the join's own output order, so no sort
    // runs above it: the rows come out in key order only if the GPU join
    // keeps it (one partition), or keeps it per partition (a merge of four).
    // DataFusion plans its sort-merge joins ascending with NULLs first.
    let queries = [
        "SELECT r.k64, r.id, s.id FROM r JOIN s ON r.k64 = s.k64 ORDER BY r.k64 NULLS FIRST",
        "SELECT r.k64, r.id, s.id FROM r LEFT JOIN s ON r.k64 = s.k64 ORDER BY r.k64 NULLS FIRST",
        "SELECT s.k64, s.id FROM r RIGHT SEMI JOIN s ON r.k64 = s.k64 ORDER BY s.k64 NULLS FIRST",
        "SELECT r.k64, r.id FROM r LEFT ANTI JOIN s ON r.k64 = s.k64 AND r.v < s.v ORDER BY r.k64 NULLS FIRST",
    ];
    for (mode, partitions) in MODES.into_iter().flat_map(|m| [(m, 2), (m, 4)]) {
        let ctxs = contexts(mode, partitions, &[]).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(1_500, 400, 11, 5),
            shape(2_500, 500, 13, 5),
            partitions,
        );
        for sql in queries {
            let (plan, batches) = check(&ctxs, sql, Expect::Gpu).await;
            let text = show(&plan);
            assert!(
                !text.contains("SortExec"),
                "{sql}: a sort remained above or below the join\n{text}"
            );
            let keys: Vec<Option<i64>> = batches
                .iter()
                .flat_map(|b| {
                    let column = b.column(0).as_primitive::<Int64Type>();
                    (0..column.len())
                        .map(|i| column.is_valid(i).then(|| column.value(i)))
                        .collect::<Vec<_>>()
                })
                .collect();
            // Ascending, NULLs first.
            let rank = |k: &Option<i64>| (k.is_some(), k.unwrap_or(0));
            assert!(
                keys.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])),
                "{sql}: rows out of key order\n{text}"
            );
        }
    }
}

/// A table of `rows` rows sorted on `k` in `partitions` partitions (each a
/// stretch of the sorted rows), declared so: DataFusion then plans no sort.
fn sorted_table(rows: i64, step: i64, seed: i64, partitions: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("id", DataType::Int64, false),
    ]));
    // Ten NULLs first, then duplicates (k = i / 3 * step), in key order.
    let k: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..rows).map(|i| (i >= 10).then_some((i - 10) / 3 * step)),
    ));
    let id: ArrayRef = Arc::new(Int64Array::from_iter_values(
        (0..rows).map(|i| seed * 1_000_000 + i),
    ));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![k, id]).unwrap();
    let per_partition = (rows as usize).div_ceil(partitions);
    let parts = (0..partitions)
        .map(|p| {
            let start = (p * per_partition).min(rows as usize);
            let end = ((p + 1) * per_partition).min(rows as usize);
            (start..end)
                .step_by(700)
                .map(|at| batch.slice(at, 700.min(end - at)))
                .collect()
        })
        .collect();
    // Ascending, NULLs first: the order DataFusion's sort-merge join asks for.
    let order = vec![vec![SortExpr::new(col("k"), true, true)]];
    Arc::new(
        MemTable::try_new(schema, parts)
            .unwrap()
            .with_sort_order(order),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_that_arrive_sorted_are_merged_without_a_sort() {
    let Some(_) = require_gpu("inputs_that_arrive_sorted_are_merged_without_a_sort") else {
        return;
    };
    // DataFusion plans sort-merge joins over several partitions only; it
    // keeps the tables' order through its hash repartition when asked to
    // (tables of several sorted partitions), or plans none (tables of one).
    for (mode, partitions) in MODES.into_iter().flat_map(|m| [(m, 1), (m, 3)]) {
        let ctxs = contexts(
            mode,
            2,
            &["SET datafusion.optimizer.prefer_existing_sort = true"],
        )
        .await;
        for ctx in [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash] {
            ctx.register_table("a", sorted_table(3_000, 2, 1, partitions))
                .unwrap();
            ctx.register_table("b", sorted_table(2_000, 3, 2, partitions))
                .unwrap();
        }
        // Where the join runs over all input partitions in place of the
        // repartitions, it sorts the sorted partitions' rows on the device;
        // otherwise each side arrives sorted and is merged as it is. (A
        // table of one partition, read below the repartitions DataFusion
        // put over it, still arrives sorted.)
        let merged = mode == JoinMode::Partitioned;
        let sides = match merged && partitions > 1 {
            true => "sort=[left: device, right: device]",
            false => "sort=[left: input, right: input]",
        };
        for sql in [
            "SELECT a.id, b.id FROM a JOIN b ON a.k = b.k",
            "SELECT a.id, b.id FROM a FULL JOIN b ON a.k = b.k",
            "SELECT a.id FROM a LEFT ANTI JOIN b ON a.k = b.k",
            "SELECT b.id FROM a RIGHT SEMI JOIN b ON a.k = b.k AND a.id % 2 = 0",
        ] {
            let (plan, _) = check(&ctxs, sql, Expect::Gpu).await;
            let text = show(&plan);
            assert!(text.contains(sides), "{sql}: expected {sides}\n{text}");
            if !merged || partitions > 1 {
                assert_eq!(runs_over_all_partitions(&plan), merged, "{sql}\n{text}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_too_wide_or_a_device_too_small_fall_back_to_the_cpu_join() {
    let Some(_) = require_gpu("keys_too_wide_or_a_device_too_small_fall_back_to_the_cpu_join")
    else {
        return;
    };
    let cases = [
        // kwide spans the whole Int64 range: with k64, more than 64 bits.
        (
            "SELECT r.id, s.id FROM r JOIN s ON r.kwide = s.kwide AND r.k64 = s.k64",
            &[][..],
        ),
        // (No filter: DataFusion's own sort-merge join, which then runs,
        // fails on a Full join's filter over these non-nullable columns.)
        (
            "SELECT r.id, s.id FROM r FULL JOIN s ON r.k64 = s.k64",
            &["SET gpu.memory_fraction = 0.000000001"][..],
        ),
        (
            "SELECT r.id FROM r LEFT ANTI JOIN s ON r.k32 = s.k32",
            &["SET gpu.memory_fraction = 0.000000001"][..],
        ),
    ];
    for (mode, (sql, extra)) in MODES.into_iter().flat_map(|m| cases.map(|c| (m, c))) {
        let ctxs = contexts(mode, 4, extra).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(2_000, 500, 9, 0),
            shape(3_000, 600, 0, 0),
            4,
        );
        let (plan, _) = check(&ctxs, sql, Expect::Gpu).await;
        // `check` ran the plan it returns.
        assert!(
            merge_join_metric(&plan, "cpu_fallback_partitions") > 0,
            "{sql}: no partition fell back to the CPU join"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_above_the_join_stops_it_early_with_the_rows_asked_for() {
    let Some(_) = require_gpu("a_limit_above_the_join_stops_it_early_with_the_rows_asked_for")
    else {
        return;
    };
    // Output ranges of 100 pairs, batches of 64 rows: the LIMIT is met
    // within the first ranges, and the join stops when its consumer goes.
    for mode in MODES {
        let ctxs = contexts(
            mode,
            2,
            &[
                "SET gpu.max_output_pairs = 100",
                "SET datafusion.execution.batch_size = 64",
            ],
        )
        .await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(3_000, 50, 0, 0),
            shape(3_000, 50, 0, 0),
            2,
        );
        for (sql, rows) in [
            (
                "SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64 LIMIT 77",
                77,
            ),
            (
                "SELECT r.id, s.id FROM r LEFT JOIN s ON r.k32 = s.k32 AND r.v < s.v LIMIT 130",
                130,
            ),
        ] {
            let (batches, gpu_nodes, plan) =
                run_counting(&ctxs.gpu, sql, "SortMergeJoinExec").await;
            assert!(gpu_nodes >= 1, "{sql}\n{}", show(&plan));
            let got: usize = batches.iter().map(|b| b.num_rows()).sum();
            assert_eq!(got, rows, "{sql}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inner_join_batches_gathered_on_the_device_own_their_rows() {
    let Some(_) = require_gpu("inner_join_batches_gathered_on_the_device_own_their_rows") else {
        return;
    };
    // Output columns gathered on the device for a whole range of pairs come
    // back as one download; each 100-row batch must still hold only its own
    // rows' memory, or memory accounting above the join counts each batch
    // as the whole range.
    let ctxs = contexts(
        JoinMode::PartitionedKept,
        2,
        &["SET datafusion.execution.batch_size = 100"],
    )
    .await;
    register(
        [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
        shape(3_000, 1_000, 0, 0),
        shape(4_000, 1_000, 0, 0),
        2,
    );
    let sql = "SELECT r.id, s.id, r.v, s.v FROM r JOIN s ON r.k64 = s.k64";
    let (plan, batches) = check(&ctxs, sql, Expect::Gpu).await;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert!(rows > 1_000, "{rows} rows\n{}", show(&plan));
    let bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
    assert!(
        bytes <= 2 * 4 * 8 * rows + 4096 * batches.len(),
        "{bytes} bytes held for {rows} rows of four Int64 columns"
    );
}

/// The GPU sort-merge joins in `plan`.
fn gpu_merge_joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<&GpuSortMergeJoinExec> {
    let mut joins: Vec<&GpuSortMergeJoinExec> = plan.downcast_ref().into_iter().collect();
    for child in plan.children() {
        joins.extend(gpu_merge_joins(child));
    }
    joins
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_projection_above_the_join_sends_only_its_columns_to_the_device() {
    let Some(_) = require_gpu("a_projection_above_the_join_sends_only_its_columns_to_the_device")
    else {
        return;
    };
    for mode in MODES {
        let ctxs = contexts(mode, 2, &[]).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(3_000, 1_000, 0, 0),
            shape(4_000, 1_000, 0, 0),
            2,
        );
        // Every column, then two of them, one renamed; the inner join's
        // output is gathered on the device either way.
        let every = "SELECT * FROM r JOIN s ON r.k64 = s.k64";
        let (every_plan, _) = check(&ctxs, every, Expect::Gpu).await;
        let picked = "SELECT s.v AS sv, r.id FROM r JOIN s ON r.k64 = s.k64";
        let (plan, batches) = check(&ctxs, picked, Expect::Gpu).await;
        let joins = gpu_merge_joins(&plan);
        assert_eq!(joins.len(), 1, "{}", show(&plan));
        assert!(joins[0].projection().is_some(), "{mode:?}\n{}", show(&plan));
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert!(rows > 3_000, "{rows} rows");
        assert_eq!(batches[0].schema().field(0).name(), "sv");
        let every_bytes = merge_join_metric(&every_plan, "h2d_bytes");
        let picked_bytes = merge_join_metric(&plan, "h2d_bytes");
        // Both sides' codes, plus two Int64 columns rather than every
        // fixed-width column of both tables.
        assert!(
            picked_bytes <= (3_000 + 4_000) * 8 * 2 + 2 * 4_000 * 8,
            "{mode:?}: {picked_bytes} bytes to the device\n{}",
            show(&plan)
        );
        assert!(
            picked_bytes < every_bytes,
            "{mode:?}: {picked_bytes} against {every_bytes} bytes"
        );
    }
}

/// Whether `plan` holds a `SortExec` directly above a `HashJoinExec`.
fn sorts_a_hash_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let here = plan.name() == "SortExec"
        && plan
            .children()
            .first()
            .is_some_and(|child| child.name() == "HashJoinExec");
    here || plan.children().into_iter().any(sorts_a_hash_join)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hash_join_sorted_on_its_keys_runs_as_a_gpu_merge_join_in_key_order() {
    // DataFusion plans a hash join and sorts its output on the key; the GPU
    // rule plans a sort-merge join instead, whose output is in key order.
    // Checked on the CPU plan everywhere, on the GPU where there is one.
    let r = gen_keys(6_000, Keys::Permutation, 0.0, 11);
    let s = gen_keys(9_000, Keys::Uniform { domain: 7_000 }, 0.05, 12);
    let sql = "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k";
    let cpu = cpu_context(JoinMode::PartitionedKept, 4, &[]).await;
    let gpu = gpu_context(
        JoinMode::PartitionedKept,
        4,
        &["SET gpu.tuning.sort_merge_join_for_order = true"],
    )
    .await;
    for ctx in [&cpu, &gpu] {
        ctx.register_table("r", key_value_table(&r, 1, 4, 500))
            .unwrap();
        ctx.register_table("s", key_value_table(&s, 2, 3, 700))
            .unwrap();
    }
    let (cpu_batches, _, cpu_plan) = run(&cpu, sql).await;
    assert!(sorts_a_hash_join(&cpu_plan), "{}", show(&cpu_plan));
    let Some(_) =
        require_gpu("a_hash_join_sorted_on_its_keys_runs_as_a_gpu_merge_join_in_key_order")
    else {
        return;
    };
    let (gpu_batches, gpu_nodes, plan) = run_counting(&gpu, sql, "SortMergeJoinExec").await;
    assert_eq!(gpu_nodes, 1, "{}", show(&plan));
    assert!(
        show(&plan).contains("in_place_of=HashJoinExec"),
        "{}",
        show(&plan)
    );
    assert!(
        !sorts_a_hash_join(&plan) && !show(&plan).contains("SortExec"),
        "{}",
        show(&plan)
    );
    // The same rows, and the GPU's come out ordered on the key.
    assert_eq!(string_rows(&gpu_batches), string_rows(&cpu_batches));
    let keys: Vec<i64> = int64_rows(&gpu_batches)
        .iter()
        .map(|row| row[0].expect("inner join keys are not NULL"))
        .collect();
    assert!(keys.len() > 5_000, "{} rows", keys.len());
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "not in key order");
}

/// Aggregations without GROUP BY computed inside the GPU sort-merge join
/// from its pairs (`partial_aggregate`), against DataFusion's sort-merge
/// join and aggregation: over unsorted and sorted inputs, per partition and
/// over all partitions, with NULL keys, duplicates, skew, many output
/// ranges, an empty side, a column with NULLs (whose rows are made on the
/// host and fed to the same accumulators), and a device too small (the CPU
/// join's rows aggregated instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_computed_in_the_join_match_the_cpu() {
    let Some(_) = require_gpu("aggregates_computed_in_the_join_match_the_cpu") else {
        return;
    };
    let on_device = "SELECT count(*), sum(r.v), sum(s.id), min(r.id), max(s.v), count(s.v) \
                     FROM r JOIN s ON r.k64 = s.k64";
    // r.k64 has NULLs, so the column is not gathered on the device where
    // the join reads every row of r.
    let on_host = "SELECT count(r.k64), max(r.k64), sum(s.v) FROM r JOIN s ON r.k64 = s.k64";
    // (name, r, s, extra settings)
    let cases = [
        (
            "duplicates and NULL keys",
            shape(3_000, 400, 9, 0),
            shape(5_000, 400, 7, 0),
            &[][..],
        ),
        (
            "skew",
            shape(2_000, 300, 11, 40),
            shape(4_000, 300, 0, 30),
            &[][..],
        ),
        (
            "many ranges",
            shape(3_000, 400, 9, 0),
            shape(5_000, 400, 7, 0),
            &["SET gpu.max_output_pairs = 1000"][..],
        ),
        (
            "empty side",
            shape(3_000, 400, 9, 0),
            shape(0, 400, 0, 0),
            &[][..],
        ),
    ];
    for mode in MODES {
        for (name, r, s, extra) in cases {
            let ctxs = contexts(mode, 4, extra).await;
            register([&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash], r, s, 4);
            let (plan, batches) = check(&ctxs, on_device, Expect::Gpu).await;
            let text = show(&plan);
            assert!(
                text.contains("partial_aggregate=[count(Int64(1)), sum(r.v), sum(s.id)"),
                "{name}, {mode:?}: the join does not compute the aggregation\n{text}"
            );
            // Every pair was reduced on the device: as many as the join has.
            let pairs = int64_rows(&batches)[0][0].unwrap_or(0) as usize;
            assert_eq!(
                merge_join_metric(&plan, "rows_aggregated_on_device"),
                pairs,
                "{name}, {mode:?}\n{text}"
            );
            if name != "empty side" {
                assert!(pairs > 10_000, "{name}: {pairs} pairs");
            }
            let (plan, _) = check(&ctxs, on_host, Expect::Gpu).await;
            if mode == JoinMode::Partitioned {
                assert_eq!(
                    merge_join_metric(&plan, "rows_aggregated_on_device"),
                    0,
                    "{name}: a column with NULLs was reduced on the device"
                );
            }
        }
        // The device cannot take the join: DataFusion's join runs, and its
        // rows feed the same accumulators.
        let ctxs = contexts(mode, 4, &["SET gpu.memory_fraction = 0.000000001"]).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(3_000, 400, 9, 0),
            shape(5_000, 400, 7, 0),
            4,
        );
        let (plan, _) = check(&ctxs, on_device, Expect::Gpu).await;
        assert!(
            show(&plan).contains("partial_aggregate="),
            "{}",
            show(&plan)
        );
        assert!(
            merge_join_metric(&plan, "cpu_fallback_partitions") > 0,
            "{mode:?}: no partition fell back to the CPU join"
        );
        assert_eq!(merge_join_metric(&plan, "rows_aggregated_on_device"), 0);
    }
    // Inputs that arrive sorted: one join over all partitions whose one row
    // of states a round robin spreads, or one per partition, merged as
    // they arrive.
    for mode in MODES {
        let ctxs = contexts(
            mode,
            2,
            &["SET datafusion.optimizer.prefer_existing_sort = true"],
        )
        .await;
        for ctx in [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash] {
            ctx.register_table("a", sorted_table(30_000, 2, 1, 3))
                .unwrap();
            ctx.register_table("b", sorted_table(20_000, 3, 2, 3))
                .unwrap();
        }
        let sql = "SELECT count(*), sum(a.id), max(b.id), min(a.id) FROM a JOIN b ON a.k = b.k";
        let (plan, batches) = check(&ctxs, sql, Expect::Gpu).await;
        let pairs = int64_rows(&batches)[0][0].unwrap_or(0) as usize;
        assert!(pairs > 10_000, "{pairs} pairs");
        assert_eq!(
            merge_join_metric(&plan, "rows_aggregated_on_device"),
            pairs,
            "{mode:?}\n{}",
            show(&plan)
        );
    }
}

/// Raw 8-byte keys without NULLs that the device sorts on both sides: the
/// device finds their value range too (`key_ranges_on_device`). Signed keys
/// over the whole `Int64` range, unsigned ones above `2^63`, timestamps
/// with a time zone; joins of several types and an aggregation, in both
/// partition modes, against DataFusion's sort-merge join.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raw_keys_without_nulls_are_coded_from_a_range_found_on_the_device() {
    use datafusion::arrow::array::{TimestampMicrosecondArray, UInt64Array};
    use datafusion::arrow::datatypes::TimeUnit;
    let Some(_) = require_gpu("raw_keys_without_nulls_are_coded_from_a_range_found_on_the_device")
    else {
        return;
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("u", DataType::UInt64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+01:00".into())),
            false,
        ),
        Field::new("id", DataType::Int64, false),
    ]));
    // Keys drawn from 700 values spread over each type's range, so that
    // the sides share many keys; with `extremes`, every 97th row takes one
    // of the type's ends, so one side's range is wider than the other's
    // (the narrower side's codes are rebased to the join's range).
    let make = |rows: usize, salt: u64, extremes: bool| {
        table_from_columns(Arc::clone(&schema), rows, 3, 900, move |range| {
            let draw = |i: usize| {
                let x = (i as u64)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(salt)
                    % 700;
                match (extremes && i.is_multiple_of(97), i % 2) {
                    (true, 0) => 1 << 63,
                    (true, _) => (1 << 63) - 1,
                    _ => (x + 2).wrapping_mul(0x0123_4567_89AB_CDEF_u64.wrapping_mul(29)) >> 2,
                }
            };
            vec![
                Arc::new(Int64Array::from_iter_values(
                    range.clone().map(|i| draw(i) as i64),
                )) as ArrayRef,
                Arc::new(UInt64Array::from_iter_values(
                    range.clone().map(|i| draw(i) | (1 << 63)),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        range.clone().map(|i| (draw(i) as i64) >> 8),
                    )
                    .with_timezone("+01:00"),
                ),
                Arc::new(Int64Array::from_iter_values(range.map(|i| i as i64))),
            ]
        })
    };
    for mode in MODES {
        let ctxs = contexts(mode, 4, &[]).await;
        for ctx in [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash] {
            ctx.register_table("r", make(6_000, 1, false)).unwrap();
            ctx.register_table("s", make(5_000, 2, true)).unwrap();
        }
        for key in ["k", "u", "ts"] {
            for query in [
                "SELECT r.id, s.id FROM r JOIN s ON r.{key} = s.{key}",
                "SELECT r.id, s.id FROM r LEFT JOIN s ON r.{key} = s.{key} AND r.id < s.id",
                "SELECT r.id, s.id FROM r FULL JOIN s ON r.{key} = s.{key}",
                "SELECT s.id, r.id FROM s JOIN r ON s.{key} = r.{key}",
                "SELECT s.id FROM r RIGHT ANTI JOIN s ON r.{key} = s.{key}",
                "SELECT count(*), sum(r.id), max(s.id) FROM r JOIN s ON r.{key} = s.{key}",
            ] {
                let sql = query.replace("{key}", key);
                let (plan, _) = check(&ctxs, &sql, Expect::Gpu).await;
                assert!(
                    merge_join_metric(&plan, "key_ranges_on_device") > 0,
                    "{mode:?} {sql}: the host found the keys' range\n{}",
                    show(&plan)
                );
            }
        }
    }
}

/// Under a session memory limit below the join's two sides, the GPU join
/// reads no further once the pool refuses a batch: DataFusion's sort-merge
/// join, whose sorts spill, takes the batches read and the rest of both
/// inputs. The same rows as DataFusion's under the same limit, within a
/// time limit (a hang is a failure, not a stuck test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_larger_than_the_memory_pool_go_to_the_cpu_join() {
    let Some(_) = require_gpu("inputs_larger_than_the_memory_pool_go_to_the_cpu_join") else {
        return;
    };
    // Two partitions of 400,000 rows a side (25.6 MB of keys and ids)
    // against a fair pool of 16 MiB, with sorts that reserve little before
    // spilling: DataFusion's join answers there every time (under a greedy
    // pool, or a tighter one, its own sorts can fail for memory).
    let settings = [
        SORT_MERGE,
        "SET datafusion.execution.sort_spill_reservation_bytes = 65536",
    ];
    let (gpu, cpu) = pool_limited_contexts(
        || Arc::new(FairSpillPool::new(16 << 20)),
        JoinMode::Partitioned,
        2,
        &settings,
    )
    .await;
    let table = |seed: i64| -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("id", DataType::Int64, false),
        ]));
        let rows = 800_000i64;
        let k: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| (i * 7_919 + seed) % 600_000),
        ));
        let id: ArrayRef = Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| seed * 1_000_000 + i),
        ));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![k, id]).unwrap();
        let batches = (0..rows as usize)
            .step_by(8_192)
            .map(|at| batch.slice(at, 8_192.min(rows as usize - at)))
            .collect();
        Arc::new(MemTable::try_new(schema, vec![batches]).unwrap())
    };
    for ctx in [&gpu, &cpu] {
        ctx.register_table("r", table(1)).unwrap();
        ctx.register_table("s", table(2)).unwrap();
    }
    // Read through a projection, whose batches are new and reserved as
    // they arrive (a table's own batches are taken as they lie in memory,
    // and not charged again).
    let limit = std::time::Duration::from_secs(120);
    for sql in [
        "SELECT count(*), sum(r.id), sum(s.id) FROM (SELECT k, id + 0 AS id FROM r) r \
         JOIN (SELECT k, id + 0 AS id FROM s) s ON r.k = s.k",
        "SELECT count(*), count(s.id) FROM (SELECT k, id + 0 AS id FROM r) r \
         LEFT JOIN (SELECT k, id + 0 AS id FROM s) s ON r.k = s.k",
    ] {
        let (gpu_rows, gpu_nodes, plan) =
            tokio::time::timeout(limit, run_counting(&gpu, sql, "SortMergeJoinExec"))
                .await
                .unwrap_or_else(|_| panic!("{sql}: no answer on the GPU path in {limit:?}"));
        let (cpu_rows, cpu_nodes, _) =
            tokio::time::timeout(limit, run_counting(&cpu, sql, "SortMergeJoinExec"))
                .await
                .unwrap_or_else(|_| panic!("{sql}: no answer on the CPU in {limit:?}"));
        assert!(
            gpu_nodes >= 1,
            "{sql}: no GPU sort-merge join\n{}",
            show(&plan)
        );
        assert_eq!(cpu_nodes, 0);
        assert_eq!(string_rows(&gpu_rows), string_rows(&cpu_rows), "{sql}");
        assert!(
            merge_join_metric(&plan, "memory_pool_fallback_partitions") > 0,
            "{sql}: no partition went to the CPU join\n{}",
            show(&plan)
        );
    }
}

/// A device error before any output (injected where the device part would
/// run) sends the partition to DataFusion's sort-merge join: the same rows,
/// counted in `device_error_fallback_partitions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_error_before_output_goes_to_the_cpu_join() {
    let Some(_) = require_gpu("a_device_error_before_output_goes_to_the_cpu_join") else {
        return;
    };
    let extra = [
        "SET gpu_test.device_errors_fail = false",
        "SET gpu_test.inject_device_error = true",
    ];
    let sql = "SELECT r.id, s.id FROM r LEFT JOIN s ON r.k64 = s.k64";
    for mode in MODES {
        let ctxs = contexts(mode, 4, &extra).await;
        register(
            [&ctxs.gpu, &ctxs.cpu, &ctxs.cpu_hash],
            shape(2_000, 500, 9, 0),
            shape(3_000, 600, 0, 0),
            4,
        );
        let (plan, _) = check(&ctxs, sql, Expect::Gpu).await;
        let failed = merge_join_metric(&plan, "device_error_fallback_partitions");
        assert!(failed > 0, "{mode:?}: no partition counted");
        assert_eq!(
            failed,
            merge_join_metric(&plan, "cpu_fallback_partitions"),
            "{mode:?}"
        );
    }
}
