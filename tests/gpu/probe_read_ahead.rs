//! A GPU hash join reads its probe side ahead while its build side is
//! collected (`gpu.tuning.read_probe_ahead`, set here): the build side's scan
//! waits before its first batch, as a slow file scan would, and the join's
//! `probe_rows_read_ahead` says how many probe rows were read meanwhile.
//! Each case is checked against DataFusion, with the read ahead on, off,
//! and where it does not read ahead: under a memory pool with a limit, for
//! a join with a limit, and over a Parquet probe side that the join's
//! dynamic filter prunes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::statistics::ChildStats;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
    Statistics, StatisticsArgs,
};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use futures::TryStreamExt;

use crate::scan_aggregate::{temp_dir, write_batch};
use crate::support::*;

/// How long the build side's scan waits before its first batch.
const BUILD_DELAY: Duration = Duration::from_millis(600);

/// A scan that waits [`BUILD_DELAY`] before it reads its input.
#[derive(Debug)]
struct DelayedExec {
    input: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for DelayedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DelayedExec")
    }
}

impl ExecutionPlan for DelayedExec {
    fn name(&self) -> &str {
        "DelayedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Self { input })),
            _ => Err(DataFusionError::Internal(
                "DelayedExec has one child".into(),
            )),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    // The input's: the optimizer sees how small the build side is.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        input_stats
            .first()
            .cloned()
            .ok_or_else(|| DataFusionError::Internal("DelayedExec has one child".into()))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = Arc::clone(&self.input);
        let stream = futures::stream::once(async move {
            tokio::time::sleep(BUILD_DELAY).await;
            input.execute(partition, context)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }
}

/// A `MemTable` whose scans are [`DelayedExec`]s.
#[derive(Debug)]
struct DelayedTable(Arc<MemTable>);

#[async_trait]
impl TableProvider for DelayedTable {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = self.0.scan(state, projection, filters, limit).await?;
        Ok(Arc::new(DelayedExec { input }))
    }
}

/// Rows of the probe side `b`.
const PROBE_ROWS: usize = 60_000;

/// A table of Int64 columns `names`, each row's values from `value(column,
/// row)`, in 3 partitions of batches of 1,000 rows.
fn table(
    names: &[&str],
    rows: usize,
    value: impl Fn(usize, usize) -> Option<i64>,
) -> Arc<MemTable> {
    let fields: Vec<Field> = names
        .iter()
        .map(|name| Field::new(*name, DataType::Int64, true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    table_from_columns(schema, rows, 3, 1_000, |range| {
        (0..names.len())
            .map(|column| -> ArrayRef {
                Arc::new(Int64Array::from_iter(
                    range.clone().map(|row| value(column, row)),
                ))
            })
            .collect()
    })
}

/// Registers `a` (k1, x; its scans wait), `b` (k1, k2, y: duplicate and
/// skewed keys, `k1` NULL at a twentieth of the rows where `nulls`) and `c`
/// (k2, z) in both contexts.
fn register(ctxs: [&SessionContext; 2], nulls: bool) {
    let a_keys = gen_keys(2_000, Keys::Permutation, 0.0, 11);
    let null_fraction = if nulls { 0.05 } else { 0.0 };
    let b_k1 = gen_keys(
        PROBE_ROWS,
        Keys::Uniform { domain: 3_000 },
        null_fraction,
        12,
    );
    let b_k2 = gen_keys(
        PROBE_ROWS,
        Keys::Zipf {
            domain: 1_500,
            s: 1.1,
        },
        0.0,
        13,
    );
    let c_keys = gen_keys(1_200, Keys::Uniform { domain: 1_000 }, 0.0, 14);
    let mix = |row: usize| Some((row as i64).wrapping_mul(0x9E37_79B9) % 1_000_003);
    for ctx in ctxs {
        let a = table(&["k1", "x"], a_keys.len(), |column, row| match column {
            0 => a_keys[row],
            _ => mix(row),
        });
        let b = table(&["k1", "k2", "y"], PROBE_ROWS, |column, row| match column {
            0 => b_k1[row],
            1 => b_k2[row],
            _ => mix(row + 7),
        });
        let c = table(&["k2", "z"], c_keys.len(), |column, row| match column {
            0 => c_keys[row],
            _ => mix(row + 3),
        });
        ctx.register_table("a", Arc::new(DelayedTable(a))).unwrap();
        ctx.register_table("b", b).unwrap();
        ctx.register_table("c", c).unwrap();
    }
}

/// Runs `sql` with the GPU rule and without it, asserts the same rows and
/// at least `joins` GPU joins, and returns the probe rows read ahead.
async fn rows_read_ahead(
    gpu: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
    joins: usize,
) -> usize {
    let (gpu_rows, gpu_joins, plan) = run(gpu, sql).await;
    let (cpu_rows, _, _) = run(cpu, sql).await;
    assert!(gpu_joins >= joins, "{sql}: {gpu_joins} GPU joins");
    let rows = int64_rows(&gpu_rows);
    assert!(rows.len() > 10_000, "{sql}: {} rows", rows.len());
    assert_eq!(rows, int64_rows(&cpu_rows), "{sql}");
    plan_metric(&plan, "probe_rows_read_ahead")
}

const JOIN: &str = "SELECT a.x, b.y, b.k1 FROM a JOIN b ON a.k1 = b.k1";

/// The read ahead, off by default.
const READ_AHEAD: &str = "SET gpu.tuning.read_probe_ahead = true";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_join_reads_its_probe_side_while_its_build_side_is_collected() {
    let Some(_) = require_gpu("a_gpu_join_reads_its_probe_side_while_its_build_side_is_collected")
    else {
        return;
    };
    for mode in JoinMode::ALL {
        let gpu = gpu_context(mode, 4, &[]).await;
        let cpu = cpu_context(mode, 4, &[]).await;
        register([&gpu, &cpu], true);
        let read = rows_read_ahead(&gpu, &cpu, JOIN, 1).await;
        assert_eq!(read, 0, "{mode:?} by default");
        gpu.sql(READ_AHEAD).await.unwrap();
        // Every probe row is read while the build side's scan waits.
        let read = rows_read_ahead(&gpu, &cpu, JOIN, 1).await;
        assert_eq!(read, PROBE_ROWS, "{mode:?}");
    }
    // Under a memory pool with a limit the build side's batches come first.
    let (gpu, cpu) =
        memory_limited_contexts(256 << 20, JoinMode::CollectLeft, 4, &[READ_AHEAD]).await;
    register([&gpu, &cpu], true);
    assert_eq!(
        rows_read_ahead(&gpu, &cpu, JOIN, 1).await,
        0,
        "a limited pool"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_reading_ahead_starts_the_gpu_join_below_it() {
    let Some(_) = require_gpu("a_join_reading_ahead_starts_the_gpu_join_below_it") else {
        return;
    };
    // The upper join (build `a`, which waits) probes with the lower one's
    // output (build `c`, probe `b`), kept on the device in many chunks:
    // reading ahead, it takes the lower join's first rows on the device and
    // stops there, the lower join driven from the start. Rows go on on the
    // device only without NULLs.
    let sql = "SELECT a.x, b.y, c.z, b.k2 FROM c JOIN b ON c.k2 = b.k2 JOIN a ON a.k1 = b.k1";
    let extra = [
        "SET gpu.preserve_order = false",
        "SET gpu.tuning.probe_chunk_rows = 777",
        READ_AHEAD,
    ];
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &extra).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &extra).await;
    register([&gpu, &cpu], false);
    let (gpu_rows, gpu_joins, plan) = run(&gpu, sql).await;
    let (cpu_rows, _, _) = run(&cpu, sql).await;
    assert!(gpu_joins >= 2, "{gpu_joins} GPU joins");
    assert_eq!(int64_rows(&gpu_rows), int64_rows(&cpu_rows));
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    // The GPU joins, the upper one first.
    let mut joins = Vec::new();
    plan.apply(|node| {
        if node.name() == "GpuHashJoinExec" {
            joins.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    assert_eq!(joins.len(), 2, "{shown}");
    let metric = |node: &Arc<dyn ExecutionPlan>, name: &str| {
        node.metrics()
            .and_then(|m| m.sum_by_name(name))
            .map_or(0, |v| v.as_usize())
    };
    let kept = metric(&joins[1], "output_rows_kept_on_device");
    assert!(kept > 0, "{shown}");
    let read = metric(&joins[0], "probe_rows_read_ahead");
    // At most one chunk's rows a partition, of many.
    assert!(
        read > 0 && read < kept,
        "{read} of {kept} rows read ahead\n{shown}"
    );
}

/// Writes `b` (as registered in the first of `ctxs`) as three Parquet files
/// in `dir` and registers them as `b` in its place in both contexts.
async fn b_from_parquet(ctxs: [&SessionContext; 2], dir: &std::path::Path) {
    let batches = ctxs[0].table("b").await.unwrap().collect().await.unwrap();
    let all = concat_batches(&batches[0].schema(), &batches).unwrap();
    let third = all.num_rows().div_ceil(3);
    for (file, start) in (0..all.num_rows()).step_by(third).enumerate() {
        let rows = third.min(all.num_rows() - start);
        write_batch(
            &dir.join(format!("b{file}.parquet")),
            &all.slice(start, rows),
        );
    }
    for ctx in ctxs {
        ctx.deregister_table("b").unwrap();
        ctx.register_parquet("b", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_side_the_joins_dynamic_filter_prunes_is_not_read_ahead() {
    let Some(_) = require_gpu("a_probe_side_the_joins_dynamic_filter_prunes_is_not_read_ahead")
    else {
        return;
    };
    let dir = temp_dir("probe-read-ahead-pruned");
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &[READ_AHEAD]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
    register([&gpu, &cpu], true);
    b_from_parquet([&gpu, &cpu], &dir).await;
    // The scan of `b` prunes by the join's dynamic filter, which is there
    // only once the build side is in: read before, it would read all.
    let plan = physical_plan(&gpu, JOIN).await;
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    assert!(shown.contains("DynamicFilter"), "{shown}");
    assert_eq!(rows_read_ahead(&gpu, &cpu, JOIN, 1).await, 0, "{shown}");
    // Without the filter the files are read ahead, as a table in memory is.
    gpu.sql("SET datafusion.optimizer.enable_join_dynamic_filter_pushdown = false")
        .await
        .unwrap();
    assert_eq!(rows_read_ahead(&gpu, &cpu, JOIN, 1).await, PROBE_ROWS);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_with_a_limit_does_not_read_its_probe_side_ahead() {
    let Some(_) = require_gpu("a_join_with_a_limit_does_not_read_its_probe_side_ahead") else {
        return;
    };
    let gpu = gpu_context(JoinMode::CollectLeft, 4, &[READ_AHEAD]).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 4, &[]).await;
    register([&gpu, &cpu], true);
    // Rows read ahead past the limit would be read for nothing.
    let limited = format!("{JOIN} LIMIT 50");
    let (rows, joins, plan) = run(&gpu, &limited).await;
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    assert_eq!(joins, 1, "{shown}");
    assert!(
        shown
            .lines()
            .any(|line| line.contains("GpuHashJoinExec") && line.contains("fetch=50")),
        "{shown}"
    );
    assert_eq!(plan_metric(&plan, "probe_rows_read_ahead"), 0, "{shown}");
    // Any 50 rows of the join: each one of DataFusion's, no more often.
    let rows = int64_rows(&rows);
    assert_eq!(rows.len(), 50, "{shown}");
    let (all, _, _) = run(&cpu, JOIN).await;
    let mut all = int64_rows(&all);
    for row in rows {
        let at = all.iter().position(|r| *r == row);
        let at = at.unwrap_or_else(|| panic!("{row:?} is not a row of the join\n{shown}"));
        all.swap_remove(at);
    }
}
