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

/// The workspace, or `None` after a visible line saying why the
/// conformance of `what` is skipped.
fn workspace_or_skip(what: &str) -> Option<&'static Path> {
    workspace()
        .map_err(|reason| {
            let _ = writeln!(std::io::stderr(), "SKIPPED conformance {what}: {reason}");
        })
        .ok()
}

/// The per-process copy of the test files, laid out as DataFusion's repo
/// lays them out, with the working directory set to it. An error (with the
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
            // The package's `data` folder beside `test_files`, which a few
            // files read, where it came along.
            if let Some(data) = source
                .parent()
                .map(|p| p.join("data"))
                .filter(|d| d.is_dir())
            {
                copy_dir(&data, &dir.join("data")).map_err(|e| e.to_string())?;
            }
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
            let mut options = GpuOptions {
                placement: PlacementPolicy::Always,
                ..GpuOptions::default()
            };
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
            let mut state = builder
                .with_physical_optimizer_rule(Arc::new(CountingGpuRule {
                    rule: GpuOptimizerRule::new(),
                    gpu_nodes: counter,
                }))
                .build();
            as_the_file_had_it(&test_ctx.session_ctx().state(), &mut state)?;
            SessionContext::new_with_state(state)
        }
    };
    let with_rule = !Arc::ptr_eq(&test_ctx.session_ctx().state_ref(), &ctx.state_ref());
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
    runner.with_validator(if with_rule {
        validator_past_gpu_options
    } else {
        df_value_validator
    });
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

/// One file run both ways: its summary line, the records that failed only
/// with the rule, and the GPU nodes the rule planned.
#[derive(Debug)]
struct Comparison {
    summary: String,
    failures: Vec<String>,
    gpu_nodes: usize,
    sort_merge_joins: usize,
}

/// Puts back in `state`, built from the file's own session `original` by
/// `SessionStateBuilder::new_from_existing`, what that rebuild changes
/// besides the rule and its options: the builder turns off
/// `create_default_catalog_and_schema` (the catalogs exist), and it
/// registers the functions again in no fixed order, so a name two functions
/// claim (Spark's `array_contains` and DataFusion's alias of `array_has`)
/// may come to mean the other one.
fn as_the_file_had_it(
    original: &datafusion::execution::SessionState,
    state: &mut datafusion::execution::SessionState,
) -> Result<()> {
    use datafusion::execution::FunctionRegistry;
    state
        .config_mut()
        .options_mut()
        .catalog
        .create_default_catalog_and_schema = original
        .config_options()
        .catalog
        .create_default_catalog_and_schema;
    // Registering a function again takes all its names back; a few rounds
    // settle names claimed by several.
    macro_rules! put_back {
        ($functions:ident, $register:ident, $changed:ident) => {
            for (name, function) in original.$functions() {
                let same = state
                    .$functions()
                    .get(name)
                    .is_some_and(|f| Arc::ptr_eq(f, function));
                if !same {
                    state.$register(Arc::clone(function))?;
                    $changed = true;
                }
            }
        };
    }
    for _ in 0..4 {
        let mut changed = false;
        put_back!(scalar_functions, register_udf, changed);
        put_back!(aggregate_functions, register_udaf, changed);
        put_back!(window_functions, register_udwf, changed);
        if !changed {
            return Ok(());
        }
    }
    Err(datafusion::error::DataFusionError::Internal(
        "the rebuilt session's functions do not settle to the file's own".into(),
    ))
}

/// `df_value_validator` for the run with the rule, over the rows of a
/// settings listing (`SHOW ALL`) that are not this crate's options:
/// registering the rule adds its `gpu.*` options (and the tests'
/// `GpuTestOptions`) to the listing, by design; every other row must be as
/// the file expects, and any other result is validated as it is.
fn validator_past_gpu_options(
    normalizer: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    use datafusion::config::ExtensionOptions;
    let test_options: Vec<String> = GpuTestOptions::default()
        .entries()
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    let ours = |row: &Vec<String>| {
        row.first()
            .is_some_and(|name| name.starts_with("gpu.") || test_options.contains(name))
    };
    let rest: Vec<Vec<String>> = actual.iter().filter(|row| !ours(row)).cloned().collect();
    df_value_validator(normalizer, &rest, expected)
}

/// Runs one file both ways, prints its summary line, and fails on a record
/// that only fails with the rule.
async fn conformance(relative: &str, expects_gpu_nodes: bool) {
    conformance_with(relative, expects_gpu_nodes, false).await;
}

/// [`conformance`]; with `expects_sort_merge_joins`, sort-merge joins must
/// also have run on the GPU.
async fn conformance_with(relative: &str, expects_gpu_nodes: bool, expects_sort_merge_joins: bool) {
    let Some(workspace) = workspace_or_skip(relative) else {
        return;
    };
    let compared = compare(workspace, Path::new(relative)).await;
    log_comparison(&compared);
    let summary = &compared.summary;
    assert!(
        compared.failures.is_empty(),
        "{summary}\n{}",
        compared.failures.join("\n---\n")
    );
    if gpu_status().is_ok() && expects_gpu_nodes {
        assert!(compared.gpu_nodes > 0, "{summary}: no node ran on the GPU");
    }
    if gpu_status().is_ok() && expects_sort_merge_joins {
        assert!(
            compared.sort_merge_joins > 0,
            "{summary}: no sort-merge join ran on the GPU"
        );
    }
    if gpu_status().is_err() {
        assert_eq!(compared.gpu_nodes, 0, "{summary}: GPU nodes without a GPU");
    }
}

/// Runs `relative` on plain DataFusion, then with the rule, and compares
/// them record by record. A run that fails as a whole (its file cannot be
/// read, the runs see different records) is a failure of the comparison.
async fn compare(workspace: &Path, relative: &Path) -> Comparison {
    let failed = |reason: String| failed_file(relative, reason);
    if relative.starts_with("tpch") {
        if let Err(e) = tpch_data(workspace) {
            return failed(format!("writing TPC-H SF 0.1 data: {e}"));
        }
    }
    let baseline = match run_file(relative, None).await {
        Ok(run) => run,
        Err(e) => return failed(format!("the run without the rule failed: {e}")),
    };
    let counter = Arc::new(GpuNodeCounts::default());
    let with_rule = match run_file(relative, Some(Arc::clone(&counter))).await {
        Ok(run) => run,
        Err(e) => return failed(format!("the run with the rule failed: {e}")),
    };
    if baseline.records.len() != with_rule.records.len() {
        return failed(format!(
            "the two runs saw different records ({} without the rule, {} with it)",
            baseline.records.len(),
            with_rule.records.len()
        ));
    }
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
    Comparison {
        summary,
        failures,
        gpu_nodes,
        sort_merge_joins,
    }
}

/// The comparison of a file that could not be compared, for `reason`.
fn failed_file(relative: &Path, reason: String) -> Comparison {
    Comparison {
        summary: format!("conformance {}: {reason}", relative.display()),
        failures: vec![reason],
        gpu_nodes: 0,
        sort_merge_joins: 0,
    }
}

/// Prints a comparison's summary line, and appends it with its failures to
/// `DATAFUSION_GPU_CONFORMANCE_LOG` where that is set.
fn log_comparison(compared: &Comparison) {
    let _ = writeln!(std::io::stderr(), "{}", compared.summary);
    if let Ok(path) = std::env::var("DATAFUSION_GPU_CONFORMANCE_LOG") {
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(log, "{}", compared.summary);
            for failure in &compared.failures {
                let _ = writeln!(log, "  FAILED {failure}");
            }
        }
    }
}

/// Every `.slt` file under `dir`, relative to it, in name order.
fn slt_files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut folders = vec![PathBuf::new()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(dir.join(&folder))? {
            let entry = entry?;
            let relative = folder.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                folders.push(relative);
            } else if relative.extension().is_some_and(|e| e == "slt") {
                found.push(relative);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Files of the package compared at once in [`every_other_slt_file`] (each
/// runs its records one after the other, as DataFusion's own runner does).
const FILES_AT_ONCE: usize = 8;

/// A file's two runs together may take at most this long.
const FILE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The files the tests below run on their own (with their own checks of
/// the GPU nodes planned).
const FILES_WITH_OWN_TESTS: [&str; 8] = [
    "joins.slt",
    "join_is_not_distinct_from.slt",
    "null_aware_anti_join.slt",
    "join_disable_repartition_joins.slt",
    "aggregate.slt",
    "group_by.slt",
    "sort_merge_join.slt",
    "tpch/tpch.slt",
];

/// Every other file the `datafusion-sqllogictest` package ships, compared as
/// the tests below compare theirs, several at once. Fails on any record
/// that passes without the rule and fails with it, on a file whose runs
/// fail or take longer than [`FILE_TIME_LIMIT`], and, on a GPU machine,
/// when no file had a GPU node planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn every_other_slt_file() {
    use futures::StreamExt;
    let Some(workspace) = workspace_or_skip("of every other file") else {
        return;
    };
    let files: Vec<PathBuf> = slt_files_under(&workspace.join("test_files"))
        .expect("listing the .slt files")
        .into_iter()
        .filter(|f| !FILES_WITH_OWN_TESTS.iter().any(|own| f == Path::new(own)))
        .collect();
    let started = std::time::Instant::now();
    let comparisons: Vec<Comparison> =
        futures::stream::iter(files)
            .map(|relative| async move {
                let task = tokio::spawn({
                    let relative = relative.clone();
                    async move {
                        tokio::time::timeout(FILE_TIME_LIMIT, compare(workspace, &relative)).await
                    }
                });
                let compared = match task.await {
                    Ok(Ok(compared)) => compared,
                    Ok(Err(_)) => {
                        let reason = format!("took longer than {} s", FILE_TIME_LIMIT.as_secs());
                        failed_file(&relative, reason)
                    }
                    Err(e) => failed_file(&relative, format!("its run ended in a panic: {e}")),
                };
                log_comparison(&compared);
                compared
            })
            .buffer_unordered(FILES_AT_ONCE)
            .collect()
            .await;
    let failed: Vec<&Comparison> = comparisons
        .iter()
        .filter(|c| !c.failures.is_empty())
        .collect();
    let gpu_nodes: usize = comparisons.iter().map(|c| c.gpu_nodes).sum();
    let with_gpu_nodes = comparisons.iter().filter(|c| c.gpu_nodes > 0).count();
    let total = format!(
        "conformance of every other file: {} files, {} with a record failing only with the rule, {with_gpu_nodes} with GPU nodes planned ({gpu_nodes} nodes), {:.0} s",
        comparisons.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    log_comparison(&Comparison {
        summary: total.clone(),
        failures: Vec::new(),
        gpu_nodes,
        sort_merge_joins: 0,
    });
    let details: Vec<String> = failed
        .iter()
        .map(|c| format!("{}\n  {}", c.summary, c.failures.join("\n  ")))
        .collect();
    assert!(failed.is_empty(), "{total}\n{}", details.join("\n"));
    if gpu_status().is_ok() {
        assert!(gpu_nodes > 0, "{total}: no node ran on the GPU");
    } else {
        assert_eq!(gpu_nodes, 0, "{total}: GPU nodes without a GPU");
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
