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
//! ctx.sql("SET gpu.placement = 'always'").await?; // even where the CPU is estimated faster
//! let plan = ctx.sql("SELECT 1").await?.create_physical_plan().await?;
//! for decision in datafusion_gpu::gpu_decisions(&plan, ctx.state().config_options()) {
//!     println!("{decision}");
//! }
//! # Ok(()) }
//! ```
//!
//! The public face is the session extension ([`SessionStateBuilderGpuExt`],
//! [`with_gpu_context`], [`gpu_session_context`]), the options
//! ([`GpuOptions`], settable with `SET gpu.<name>`), where each node ran
//! ([`gpu_decisions`], [`gpu_status`]), tables in pinned host memory
//! ([`pin_batches`]), the device column cache ([`cache_table`],
//! [`gpu_cache_stats`], [`clear_gpu_cache`]) and the plan nodes the rule
//! puts in a plan. The CUDA
//! kernels are in `ptx/`, compiled ahead of time and embedded in the library.
//!
//! [Apache DataFusion]: https://datafusion.apache.org

/// Declares the crate's layers: private to the crate, and public (hidden from
/// the docs) with the `test-support` feature, for the crate's own integration
/// tests and benchmarks, which exercise the device layers directly.
macro_rules! layers {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "test-support")]
        #[doc(hidden)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "test-support"))]
        pub(crate) mod $name;
    )*};
}

layers! {
    /// Estimates of an operator's time on the CPU and on the GPU, by which
    /// the planner places each node.
    cost;
    /// Arrow columns as device words and back, and record batches in
    /// device memory.
    encode;
    /// Plan nodes: DataFusion's `ExecutionPlan`s that run on the GPU.
    exec;
    /// The device runtime over the CUDA driver.
    gpu;
    /// Algorithms on device columns, knowing nothing of DataFusion.
    ops;
    /// Wall-clock tracing of the GPU operators (`DATAFUSION_GPU_TRACE`).
    trace;
}

mod column_cache;
mod config;
mod host;
mod pinned_tables;
mod planner;
mod session;

pub use column_cache::{cache_table, clear_gpu_cache, gpu_cache_stats, GpuCacheStats};
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub use config::GpuTestOptions;
pub use config::{DeviceSelection, GpuOptions, GpuTuning, PlacementPolicy};
pub use exec::{
    GpuAggregateExec, GpuHashJoinExec, GpuScanAggregateExec, GpuScanFilterExec,
    GpuSortMergeJoinExec, JoinKeyCollectorExec, JoinKeyWaitExec, WarmedColumns,
};
pub use gpu::GpuUnavailable;
pub use pinned_tables::{is_pinned, pin_batches};
pub use planner::{gpu_decisions, GpuOptimizerRule, NodeDecision, Placement};
pub use session::{
    gpu_session_context, with_gpu_context, with_gpu_options, SessionStateBuilderGpuExt,
};

/// Whether this process can use a GPU, and if not, why not. The first call
/// in a process opens the GPUs and measures the first one for placement by
/// cost (a fraction of a second); call it at startup to keep that off the
/// first query.
pub fn gpu_status() -> Result<String, gpu::GpuUnavailable> {
    gpu::gpu_runtime().map(|runtime| runtime.describe())
}
