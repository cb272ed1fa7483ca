//! Adding the GPU rule and options to a session.

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::config::GpuOptions;
use crate::planner::GpuOptimizerRule;

/// Adds datafusion-gpu to a [`SessionStateBuilder`].
pub trait SessionStateBuilderGpuExt {
    /// Registers the `gpu.*` options (unless already there) and appends
    /// [`GpuOptimizerRule`] after DataFusion's physical optimizer rules.
    ///
    /// It also turns off the join dynamic filter pushdown: a replaced
    /// `HashJoinExec` would never fill in the filter it pushed into the probe
    /// scan, so it would cost a placeholder and buy nothing.
    fn with_gpu(self) -> Self;
}

impl SessionStateBuilderGpuExt for SessionStateBuilder {
    fn with_gpu(mut self) -> Self {
        let config = self.config().get_or_insert_with(SessionConfig::new);
        add_gpu_options(config);
        self.with_physical_optimizer_rule(Arc::new(GpuOptimizerRule::new()))
    }
}

fn add_gpu_options(config: &mut SessionConfig) {
    let options = config.options_mut();
    if options.extensions.get::<GpuOptions>().is_none() {
        options.extensions.insert(GpuOptions::default());
    }
    #[cfg(feature = "test-support")]
    if options
        .extensions
        .get::<crate::config::GpuTestOptions>()
        .is_none()
    {
        options
            .extensions
            .insert(crate::config::GpuTestOptions::default());
    }
    options.optimizer.enable_join_dynamic_filter_pushdown = false;
}

/// A new [`SessionContext`] with DataFusion's default features, `config`, and
/// datafusion-gpu.
pub fn gpu_session_context(config: SessionConfig) -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_gpu()
        .build();
    SessionContext::new_with_state(state)
}

/// A context that shares `ctx`'s catalogs, functions and options, with
/// datafusion-gpu added.
pub fn with_gpu_context(ctx: &SessionContext) -> SessionContext {
    let state = SessionStateBuilder::new_from_existing(ctx.state())
        .with_gpu()
        .build();
    SessionContext::new_with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn options_are_settable_from_sql() {
        let ctx = gpu_session_context(SessionConfig::new());
        ctx.sql("SET gpu.min_rows = 42").await.unwrap();
        ctx.sql("SET gpu.enabled = false").await.unwrap();
        let options = GpuOptions::from_config(ctx.state().config_options());
        assert_eq!(options.min_rows, 42);
        assert!(!options.enabled);
        assert!(ctx.sql("SET gpu.no_such_option = 1").await.is_err());
    }

    #[tokio::test]
    async fn the_rule_is_registered_after_the_default_rules() {
        let ctx = gpu_session_context(SessionConfig::new());
        let state = ctx.state();
        let rules = state.physical_optimizers();
        assert_eq!(rules.last().unwrap().name(), "datafusion_gpu");
    }

    #[tokio::test]
    async fn an_existing_context_keeps_its_tables() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t AS VALUES (1), (2)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let gpu_ctx = with_gpu_context(&ctx);
        let batches = gpu_ctx
            .sql("SELECT count(*) FROM t")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(batches[0].num_rows(), 1);
    }
}
