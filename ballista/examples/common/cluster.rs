//! A Ballista cluster in this process, for the example and the test: a
//! scheduler and executors on loopback ports, each executor with or without
//! the GPU engine, and a client session connected to it.

use std::net::TcpListener;
use std::sync::Arc;

use ballista::extension::SessionContextExt;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::serde::BallistaCodec;
use ballista_core::utils::default_session_builder;
use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::standalone::new_standalone_scheduler_with_builder;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_gpu_ballista::{gpu_session_config, with_gpu_engine, GpuExecutionEngine};

/// An executor's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// Stages through datafusion-gpu's rule (on the CPU where there is no GPU).
    Gpu,
    /// Ballista's default engine.
    Cpu,
}

/// A running cluster: the client's session and each GPU executor's engine.
pub struct LocalCluster {
    pub ctx: SessionContext,
    pub gpu_engines: Vec<Arc<GpuExecutionEngine>>,
}

impl LocalCluster {
    /// Stages (one a task) the GPU executors made.
    pub fn stages_made(&self) -> usize {
        self.gpu_engines.iter().map(|e| e.stages_made()).sum()
    }

    /// Stages the GPU executors made with GPU nodes.
    pub fn stages_on_gpu(&self) -> usize {
        self.gpu_engines.iter().map(|e| e.stages_on_gpu()).sum()
    }
}

fn ballista_error(e: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::External(e.to_string().into())
}

/// A free loopback port (free when asked: another process may take it).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Starts a scheduler and `executors`, each offering `vcores` task slots,
/// and connects a client whose session plans with `target_partitions`.
pub async fn start(
    executors: &[Executor],
    vcores: usize,
    target_partitions: usize,
) -> Result<LocalCluster> {
    // The scheduler's sessions know the `gpu.*` options, so the client's
    // settings reach the executors' stages.
    let scheduler = new_standalone_scheduler_with_builder(
        Arc::new(default_session_builder),
        Arc::new(gpu_session_config),
        BallistaCodec::default(),
    )
    .await
    .map_err(ballista_error)?;
    let mut gpu_engines = Vec::new();
    for &kind in executors {
        let config = ExecutorProcessConfig {
            bind_host: "127.0.0.1".into(),
            external_host: Some("localhost".into()),
            port: free_port()?,
            grpc_port: free_port()?,
            scheduler_host: "localhost".into(),
            scheduler_port: scheduler.port(),
            vcores,
            // The standalone scheduler hands out tasks when executors ask.
            task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
            ..Default::default()
        };
        let config = match kind {
            Executor::Gpu => {
                let (config, engine) = with_gpu_engine(config);
                gpu_engines.push(engine);
                config
            }
            Executor::Cpu => config,
        };
        tokio::spawn(async move {
            if let Err(e) = start_executor_process(Arc::new(config)).await {
                eprintln!("executor stopped: {e}");
            }
        });
    }
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(gpu_session_config().with_target_partitions(target_partitions))
        .build();
    let url = format!("df://localhost:{}", scheduler.port());
    let ctx = SessionContext::remote_with_state(&url, state).await?;
    Ok(LocalCluster { ctx, gpu_engines })
}
