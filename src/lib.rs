//! # datafusion-gpu
//!
//! Drop-in GPU acceleration for [Apache DataFusion]. Register the optimizer
//! rule once when the session is built; from then on, joins that a GPU runs
//! faster are replaced by GPU operators, and everything else (including every
//! query on a machine without a GPU) runs on DataFusion's own CPU operators,
//! with the same results.
//!
//! ```no_run
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::{SessionConfig, SessionContext};
//! use datafusion_gpu::SessionStateBuilderGpuExt;
//!
//! # async fn demo() -> datafusion::error::Result<()> {
//! let state = SessionStateBuilder::new()
//!     .with_config(SessionConfig::new())
//!     .with_default_features()
//!     .with_gpu()
//!     .build();
//! let ctx = SessionContext::new_with_state(state);
//! ctx.sql("SET gpu.min_rows = 0").await?; // send even small joins to the GPU
//! let plan = ctx.sql("SELECT 1").await?.create_physical_plan().await?;
//! for decision in datafusion_gpu::gpu_decisions(&plan, ctx.state().config_options()) {
//!     println!("{decision}");
//! }
//! # Ok(()) }
//! ```
//!
//! Layers, top down: [`planner`] (options, decisions, the rule), [`exec`]
//! (DataFusion plan nodes), [`ops`] (algorithms on device columns) and
//! [`gpu`] (the runtime over cudarc). The CUDA kernels are in `ptx/`,
//! compiled ahead of time and embedded in the library.
//!
//! [Apache DataFusion]: https://datafusion.apache.org

mod array_buffers;
pub mod exec;
pub mod gpu;
mod host_copy;
pub mod ops;
pub mod planner;
mod session;
pub mod trace;

pub use exec::{GpuAggregateExec, GpuHashJoinExec, GpuSortMergeJoinExec};
pub use gpu::{is_pinned, pin_batches};
pub use planner::{gpu_decisions, GpuOptimizerRule, GpuOptions, NodeDecision, Placement};
pub use session::{gpu_session_context, with_gpu_context, SessionStateBuilderGpuExt};

/// Whether this process can use a GPU, and if not, why not.
pub fn gpu_status() -> Result<String, gpu::GpuUnavailable> {
    gpu::gpu_runtime().map(|runtime| runtime.describe())
}
