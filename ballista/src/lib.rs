//! GPU executors for [Ballista](https://datafusion.apache.org/ballista/),
//! DataFusion's distributed engine.
//!
//! The scheduler plans each query with DataFusion's own operators and ships
//! its stages to the executors as it always does. An executor started with
//! [`with_gpu`] runs each stage it receives through datafusion-gpu's rule
//! ([`GpuOptimizerRule`]) first, so that the stage's joins, aggregations and
//! scans run on that executor's GPU where the rule places them; an executor
//! without a GPU (or without [`with_gpu`]) runs the stage as it came. The
//! scheduler, the client and the plans on the wire need no change, and
//! GPU and CPU executors can serve one cluster.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
//!
//! # async fn run() -> ballista_core::error::Result<()> {
//! let config = datafusion_gpu_ballista::with_gpu(ExecutorProcessConfig {
//!     scheduler_host: "localhost".into(),
//!     scheduler_port: 50050,
//!     ..Default::default()
//! });
//! start_executor_process(Arc::new(config)).await
//! # }
//! ```
//!
//! `gpu.*` options set in the client's session (`SET gpu.placement =
//! 'always'`) reach the executors' stages where the scheduler's sessions
//! know them too: give the scheduler [`gpu_session_config`] as its config
//! producer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use ballista_core::extension::SessionConfigExt;
use ballista_core::{ConfigProducer, JobId};
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use ballista_executor::executor_process::ExecutorProcessConfig;
use datafusion::common::tree_node::TreeNode;
use datafusion::error::Result;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion::prelude::SessionConfig;
use datafusion_gpu::with_gpu_options;
pub use datafusion_gpu::GpuOptimizerRule;

/// Runs each query stage through [`GpuOptimizerRule::optimize_stage`] under
/// the stage's session options, then as Ballista's default engine does (its shuffle
/// writer over the rewritten plan).
#[derive(Default)]
pub struct GpuExecutionEngine {
    rule: GpuOptimizerRule,
    stages: DefaultExecutionEngine,
    stages_made: AtomicUsize,
    stages_on_gpu: AtomicUsize,
}

impl GpuExecutionEngine {
    /// Stages (one a task) this engine made.
    pub fn stages_made(&self) -> usize {
        self.stages_made.load(Ordering::Relaxed)
    }

    /// Stages this engine made with at least one GPU node in their plan.
    pub fn stages_on_gpu(&self) -> usize {
        self.stages_on_gpu.load(Ordering::Relaxed)
    }
}

impl ExecutionEngine for GpuExecutionEngine {
    fn create_query_stage_exec(
        &self,
        job_id: JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> Result<Arc<dyn QueryStageExecutor>> {
        // The stage's root is Ballista's shuffle writer, which the rule
        // keeps, rewriting what lies below it. This task executes one of
        // the stage's partitions, and other executors (with the rule or
        // without) the others: the rewrite keeps each partition's rows.
        let given = tracing().then(|| Arc::clone(&plan));
        let plan = self.rule.optimize_stage(plan, config.options())?;
        if let Some(given) = given {
            eprintln!(
                "[gpu-trace] stage {stage_id} task {task_id} (output partitions \
                 {global_output_partition_ids:?}) as given:\n{}rewritten:\n{}",
                displayable(given.as_ref()).indent(true),
                displayable(plan.as_ref()).indent(true)
            );
        }
        self.stages_made.fetch_add(1, Ordering::Relaxed);
        if gpu_nodes(&plan)? > 0 {
            self.stages_on_gpu.fetch_add(1, Ordering::Relaxed);
        }
        self.stages.create_query_stage_exec(
            job_id,
            stage_id,
            task_id,
            global_output_partition_ids,
            plan,
            work_dir,
            config,
        )
    }
}

/// Whether datafusion-gpu traces its work (`DATAFUSION_GPU_TRACE` set): the
/// engine then prints each stage's plan as given and as rewritten.
fn tracing() -> bool {
    static TRACING: OnceLock<bool> = OnceLock::new();
    *TRACING.get_or_init(|| std::env::var_os("DATAFUSION_GPU_TRACE").is_some())
}

/// The plan nodes of `plan` that run on the GPU.
fn gpu_nodes(plan: &Arc<dyn ExecutionPlan>) -> Result<usize> {
    let mut count = 0;
    plan.apply(|node| {
        if node.name().starts_with("Gpu") {
            count += 1;
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    Ok(count)
}

/// Ballista's session configuration with the `gpu.*` options registered:
/// for executors (which [`with_gpu`] gives it) and for the scheduler, so
/// that options a client sets reach the stages.
pub fn gpu_session_config() -> SessionConfig {
    with_gpu_options(SessionConfig::new_with_ballista())
}

/// `config` with its query stages run by a [`GpuExecutionEngine`] (one
/// shared by the executor's tasks, returned beside it to read its counts;
/// it takes the place of any engine `config` set) and its sessions knowing
/// the `gpu.*` options (around a config producer already set, else
/// Ballista's default).
pub fn with_gpu_engine(
    config: ExecutorProcessConfig,
) -> (ExecutorProcessConfig, Arc<GpuExecutionEngine>) {
    let engine = Arc::new(GpuExecutionEngine::default());
    let producer: ConfigProducer = match config.override_config_producer.clone() {
        Some(theirs) => Arc::new(move || with_gpu_options(theirs())),
        None => Arc::new(gpu_session_config),
    };
    let config = ExecutorProcessConfig {
        override_execution_engine: Some(Arc::clone(&engine) as Arc<dyn ExecutionEngine>),
        override_config_producer: Some(producer),
        ..config
    };
    (config, engine)
}

/// `config` with its query stages run through datafusion-gpu's rule (see
/// [`with_gpu_engine`]).
pub fn with_gpu(config: ExecutorProcessConfig) -> ExecutorProcessConfig {
    with_gpu_engine(config).0
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion_gpu::GpuOptions;

    #[test]
    fn a_gpu_executor_gets_the_engine_and_sessions_that_know_the_gpu_options() {
        let (config, engine) = with_gpu_engine(ExecutorProcessConfig::default());
        assert!(config.override_execution_engine.is_some());
        assert_eq!(engine.stages_made(), 0);
        let session = (config.override_config_producer.unwrap())();
        assert!(session.options().extensions.get::<GpuOptions>().is_some());
        // A config producer already set is kept, the options added to it.
        let theirs: ConfigProducer =
            Arc::new(|| SessionConfig::new_with_ballista().with_target_partitions(3));
        let config = with_gpu(ExecutorProcessConfig {
            override_config_producer: Some(theirs),
            ..Default::default()
        });
        let mut session = (config.override_config_producer.unwrap())();
        assert_eq!(session.options().execution.target_partitions, 3);
        session
            .options_mut()
            .set("gpu.placement", "always")
            .expect("the gpu options are registered");
        let options = GpuOptions::from_config(session.options());
        assert!(options.placement.always());
    }
}
