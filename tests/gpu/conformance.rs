//! Conformance: DataFusion's own sqllogictest files, run with the GPU rule
//! registered (every supported node forced onto the GPU, `gpu.placement = 'always'`)
//! and, as the baseline, on plain DataFusion.
//!
//! A record fails the test when it passes on plain DataFusion and fails with
//! the rule. Skipped, with the reason counted: `EXPLAIN` records (the rule
//! rewrites plans on purpose), records for another engine (`onlyif` /
//! `skipif`), and records that fail on plain DataFusion too (they read data
//! files the published crate does not ship). On a GPU machine a file that
//! exercises joins must also have had GPU nodes planned, or it fails.
//!
//! The `.slt` files come from the `datafusion-sqllogictest` package: set
//! `DATAFUSION_SLT_TEST_FILES` to its `test_files` folder, or let the test
//! find it in the cargo registry. TPC-H SF 0.1 data is generated in-process.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu::{
    gpu_decisions, gpu_status, GpuOptimizerRule, GpuOptions, GpuTestOptions, PlacementPolicy,
};
use datafusion_sqllogictest::{
    df_value_validator, setup_scratch_dir, value_normalizer, DataFusion, TestContext,
};
use sqllogictest::{parse_file, strict_column_validator, Condition, Record};

#[path = "../common/slt_files.rs"]
mod slt_files;
use slt_files::find_test_files;

/// GPU nodes placed over a run: all of them, and the sort-merge joins.
#[derive(Debug, Default)]
struct GpuNodeCounts {
    all: AtomicUsize,
    sort_merge_joins: AtomicUsize,
    scan_filters: AtomicUsize,
}

/// The rule, counting the GPU nodes it places, so a run can prove that the
/// GPU was used.
#[derive(Debug)]
struct CountingGpuRule {
    rule: GpuOptimizerRule,
    gpu_nodes: Arc<GpuNodeCounts>,
}

impl PhysicalOptimizerRule for CountingGpuRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.rule.optimize(plan, config)?;
        let placed: Vec<_> = gpu_decisions(&plan, config)
            .into_iter()
            .filter(|d| d.on_gpu())
            .collect();
        let merge_joins = placed
            .iter()
            .filter(|d| d.operator == "SortMergeJoinExec")
            .count();
        self.gpu_nodes
            .all
            .fetch_add(placed.len(), Ordering::Relaxed);
        self.gpu_nodes
            .sort_merge_joins
            .fetch_add(merge_joins, Ordering::Relaxed);
        let scan_filters = placed
            .iter()
            .filter(|d| d.to_string().contains("scan_filter"))
            .count();
        self.gpu_nodes
            .scan_filters
            .fetch_add(scan_filters, Ordering::Relaxed);
        Ok(plan)
    }

    fn name(&self) -> &str {
        self.rule.name()
    }

    fn schema_check(&self) -> bool {
        self.rule.schema_check()
    }
}

/// What happened to the records of one file in one configuration, by line.
#[derive(Debug, Default)]
struct FileRun {
    /// (location, passed) of every statement and query that ran.
    records: Vec<(String, bool, String)>,
    explain_skipped: usize,
    other_engine_skipped: usize,
}

/// The per-process copy of the test files, laid out as DataFusion's repo
/// lays them out, with the working directory set to it. `None` (with the
/// reason) when the files cannot be found.
fn workspace() -> std::result::Result<&'static Path, String> {
    static WORKSPACE: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    WORKSPACE
        .get_or_init(|| {
            let source = find_test_files()?;
            remove_stale_workspaces();
            let root =
                std::env::temp_dir().join(format!("{WORKSPACE_PREFIX}{}", std::process::id()));
            let dir = root.join("datafusion").join("sqllogictest");
            copy_dir(&source, &dir.join("test_files")).map_err(|e| e.to_string())?;
            // The files name their data and scratch folders relative to here.
            std::env::set_current_dir(&dir).map_err(|e| e.to_string())?;
            Ok(dir)
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

/// The per-process workspace's name, before the process id.
const WORKSPACE_PREFIX: &str = "datafusion-gpu-conformance-";

/// Removes the workspaces of earlier test processes that have ended (about
/// 110 MB each, with the TPC-H data): a test binary has no hook at exit to
/// remove its own, so each run clears what the ones before it left. Only
/// where `/proc` tells which processes live; elsewhere nothing is removed.
fn remove_stale_workspaces() {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(WORKSPACE_PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            // Best effort: another user's folder, or one a concurrent run
            // is removing, is left as it is.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Writes TPC-H SF 0.1 `.tbl` files where `tpch/tpch.slt` reads them.
fn tpch_data(workspace: &Path) -> std::io::Result<()> {
    static GENERATED: Mutex<bool> = Mutex::new(false);
    let mut done = GENERATED.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return Ok(());
    }
    let dir = workspace.join("test_files").join("tpch").join("data");
    std::fs::create_dir_all(&dir)?;
    let sf = 0.1;
    macro_rules! table {
        ($name:literal, $generator:ty) => {{
            let mut out =
                std::io::BufWriter::new(std::fs::File::create(dir.join(concat!($name, ".tbl")))?);
            for row in <$generator>::new(sf, 1, 1).iter() {
                writeln!(out, "{row}")?;
            }
            out.flush()?;
        }};
    }
    use tpchgen::generators::*;
    table!("nation", NationGenerator);
    table!("region", RegionGenerator);
    table!("part", PartGenerator);
    table!("supplier", SupplierGenerator);
    table!("partsupp", PartSuppGenerator);
    table!("customer", CustomerGenerator);
    table!("orders", OrderGenerator);
    table!("lineitem", LineItemGenerator);
    *done = true;
    Ok(())
}

fn is_explain(sql: &str) -> bool {
    sql.trim_start()
        .get(..7)
        .is_some_and(|w| w.eq_ignore_ascii_case("explain"))
}

fn for_other_engine(conditions: &[Condition]) -> bool {
    conditions.iter().any(|c| match c {
        Condition::OnlyIf { label } => label != "Datafusion",
        Condition::SkipIf { label } => label == "Datafusion",
    })
}

/// Runs every record of `relative` (relative to the workspace), with the
/// GPU rule or without it.
async fn run_file(relative: &Path, gpu_nodes: Option<Arc<GpuNodeCounts>>) -> Result<FileRun> {
    let Some(test_ctx) = TestContext::try_new_for_test_file(relative).await else {
        return Ok(FileRun::default());
    };
    let ctx = match gpu_nodes {
        None => test_ctx.session_ctx().clone(),
        Some(counter) => {
            let mut builder =
                SessionStateBuilder::new_from_existing(test_ctx.session_ctx().state());
            let config = builder.config().get_or_insert_with(SessionConfig::new);
            let mut options = GpuOptions::default();
            options.placement = PlacementPolicy::Always;
            // Groups numbered in hash partitions (the newest path; the
            // differential tests cover the one table too).
            options.tuning.min_groups_to_partition = 0;
            options.hashed_group_keys = true;
            config.options_mut().extensions.insert(options);
            // A kernel's fault fails the record rather than running on the
            // CPU.
            let mut test_options = GpuTestOptions::default();
            test_options.device_errors_fail = true;
            config.options_mut().extensions.insert(test_options);
            let state = builder
                .with_physical_optimizer_rule(Arc::new(CountingGpuRule {
                    rule: GpuOptimizerRule::new(),
                    gpu_nodes: counter,
                }))
                .build();
            SessionContext::new_with_state(state)
        }
    };
    setup_scratch_dir(relative)?;
    let path = Path::new("test_files").join(relative);
    let records =
        parse_file(&path).map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    let relative_path = relative.to_path_buf();
    let mut runner = sqllogictest::Runner::new(move || {
        let ctx = ctx.clone();
        let relative_path = relative_path.clone();
        async move {
            Ok(DataFusion::new(
                ctx,
                relative_path,
                indicatif::ProgressBar::hidden(),
            ))
        }
    });
    runner.add_label("Datafusion");
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);
    let mut run = FileRun::default();
    for record in records {
        let (loc, sql, conditions) = match &record {
            Record::Halt { .. } => break,
            Record::Statement {
                loc,
                sql,
                conditions,
                ..
            }
            | Record::Query {
                loc,
                sql,
                conditions,
                ..
            } => (loc.to_string(), sql.clone(), conditions.clone()),
            _ => {
                // Control records (settings, includes) run but are not counted.
                let _ = runner.run_async(record).await;
                continue;
            }
        };
        if is_explain(&sql) {
            run.explain_skipped += 1;
            continue;
        }
        if for_other_engine(&conditions) {
            run.other_engine_skipped += 1;
            continue;
        }
        let outcome = runner.run_async(record).await;
        let message = match &outcome {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        run.records.push((loc, outcome.is_ok(), message));
    }
    runner.shutdown_async().await;
    drop(test_ctx);
    Ok(run)
}

/// Runs one file both ways, prints its summary line, and fails on a record
/// that only fails with the rule.
async fn conformance(relative: &str, expects_gpu_nodes: bool) {
    conformance_with(relative, expects_gpu_nodes, false).await;
}

/// [`conformance`]; with `expects_sort_merge_joins`, sort-merge joins must
/// also have run on the GPU.
async fn conformance_with(relative: &str, expects_gpu_nodes: bool, expects_sort_merge_joins: bool) {
    let workspace = match workspace() {
        Ok(w) => w,
        Err(reason) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED conformance {relative}: {reason}"
            );
            return;
        }
    };
    if relative.starts_with("tpch/") {
        tpch_data(workspace).expect("writing TPC-H SF 0.1 data");
    }
    let relative = Path::new(relative);
    let baseline = run_file(relative, None).await.expect("baseline run");
    let counter = Arc::new(GpuNodeCounts::default());
    let with_rule = run_file(relative, Some(Arc::clone(&counter)))
        .await
        .expect("run with the rule");
    assert_eq!(
        baseline.records.len(),
        with_rule.records.len(),
        "{}: the two runs saw different records",
        relative.display()
    );
    let mut passed = 0;
    let mut environment = 0;
    let mut failures = Vec::new();
    for ((loc, base_ok, _), (_, gpu_ok, message)) in baseline.records.iter().zip(&with_rule.records)
    {
        match (base_ok, gpu_ok) {
            (_, true) => passed += 1,
            (false, false) => environment += 1,
            (true, false) => failures.push(format!("{loc}: {message}")),
        }
    }
    let gpu_nodes = counter.all.load(Ordering::Relaxed);
    let sort_merge_joins = counter.sort_merge_joins.load(Ordering::Relaxed);
    let scan_filters = counter.scan_filters.load(Ordering::Relaxed);
    let summary = format!(
        "conformance {}: records {}, passed {passed}, failed {}, skipped {} ({} EXPLAIN, {} other engine, {environment} failing without the rule too); GPU nodes planned: {gpu_nodes} ({sort_merge_joins} sort-merge joins, {scan_filters} scan filters)",
        relative.display(),
        with_rule.records.len() + with_rule.explain_skipped + with_rule.other_engine_skipped,
        failures.len(),
        with_rule.explain_skipped + with_rule.other_engine_skipped + environment,
        with_rule.explain_skipped,
        with_rule.other_engine_skipped,
    );
    let _ = writeln!(std::io::stderr(), "{summary}");
    if let Ok(path) = std::env::var("DATAFUSION_GPU_CONFORMANCE_LOG") {
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(log, "{summary}");
            for failure in &failures {
                let _ = writeln!(log, "  FAILED {failure}");
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{summary}\n{}",
        failures.join("\n---\n")
    );
    if gpu_status().is_ok() && expects_gpu_nodes {
        assert!(gpu_nodes > 0, "{summary}: no node ran on the GPU");
    }
    if gpu_status().is_ok() && expects_sort_merge_joins {
        assert!(
            sort_merge_joins > 0,
            "{summary}: no sort-merge join ran on the GPU"
        );
    }
    if gpu_status().is_err() {
        assert_eq!(gpu_nodes, 0, "{summary}: GPU nodes without a GPU");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_slt() {
    conformance("joins.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_is_not_distinct_from_slt() {
    conformance("join_is_not_distinct_from.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn null_aware_anti_join_slt() {
    conformance("null_aware_anti_join.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_disable_repartition_joins_slt() {
    conformance("join_disable_repartition_joins.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregate_slt() {
    conformance("aggregate.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_by_slt() {
    conformance("group_by.slt", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sort_merge_join_slt() {
    conformance_with("sort_merge_join.slt", true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpch_slt_at_sf_0_1() {
    // The file answers the 22 queries twice: with hash joins, then with
    // `prefer_hash_join = false`, which plans sort-merge joins.
    conformance_with("tpch/tpch.slt", true, true).await;
}
