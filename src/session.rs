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
    /// Nothing else in the session changes: a query that stays on the CPU
    /// runs as it did. (A GPU hash join in place of a `HashJoinExec`
    /// publishes the dynamic filter DataFusion pushed into its probe side's
    /// scan, as `HashJoinExec` does.)
    fn with_gpu(self) -> Self;
}

impl SessionStateBuilderGpuExt for SessionStateBuilder {
    fn with_gpu(mut self) -> Self {
        let config = self.config().get_or_insert_with(SessionConfig::new);
        add_gpu_options(config);
        self.with_physical_optimizer_rule(Arc::new(GpuOptimizerRule::new()))
    }
}

/// `config` with the `gpu.*` options registered (unless already there), so
/// that sessions built from it accept `SET gpu.…` and hand the settings to
/// [`GpuOptimizerRule`] wherever it runs: for a process that runs the rule
/// itself (a distributed engine's executor) or only passes the settings on
/// (its scheduler). [`SessionStateBuilderGpuExt::with_gpu`] does this too.
pub fn with_gpu_options(mut config: SessionConfig) -> SessionConfig {
    add_gpu_options(&mut config);
    config
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
        ctx.sql("SET gpu.placement = 'always'").await.unwrap();
        ctx.sql("SET gpu.enabled = false").await.unwrap();
        let options = GpuOptions::from_config(ctx.state().config_options());
        assert!(options.placement.always());
        assert!(!options.enabled);
        assert!(ctx.sql("SET gpu.no_such_option = 1").await.is_err());
    }

    #[tokio::test]
    async fn a_config_with_the_options_takes_them_without_the_rule() {
        let ctx = SessionContext::new_with_config(with_gpu_options(SessionConfig::new()));
        ctx.sql("SET gpu.placement = 'always'").await.unwrap();
        let options = GpuOptions::from_config(ctx.state().config_options());
        assert!(options.placement.always());
        let rules = ctx.state().physical_optimizers().to_vec();
        assert!(rules.iter().all(|rule| rule.name() != "datafusion_gpu"));
        // Without them, DataFusion refuses the setting.
        assert!(SessionContext::new()
            .sql("SET gpu.placement = 'always'")
            .await
            .is_err());
    }

    #[tokio::test]
    async fn the_rule_is_registered_after_the_default_rules() {
        let ctx = gpu_session_context(SessionConfig::new());
        let state = ctx.state();
        let rules = state.physical_optimizers();
        assert_eq!(rules.last().unwrap().name(), "datafusion_gpu");
    }

    #[test]
    fn the_sessions_own_options_are_left_as_they_were() {
        for dynamic_filters in [true, false] {
            let mut config = SessionConfig::new().with_target_partitions(3);
            config
                .options_mut()
                .optimizer
                .enable_join_dynamic_filter_pushdown = dynamic_filters;
            let before = config.options().entries();
            let ctx = gpu_session_context(config.clone());
            let state = ctx.state();
            let after = state.config_options();
            assert_eq!(
                after.optimizer.enable_join_dynamic_filter_pushdown,
                dynamic_filters
            );
            // Every DataFusion option as the session had it (the rule's
            // own options are new).
            let datafusion = |entries: Vec<datafusion::config::ConfigEntry>| -> Vec<_> {
                entries
                    .into_iter()
                    .filter(|entry| entry.key.starts_with("datafusion."))
                    .map(|entry| (entry.key, entry.value))
                    .collect()
            };
            let (before, after) = (datafusion(before), datafusion(after.entries()));
            assert!(before.len() > 100, "{} options", before.len());
            let changed: Vec<_> = after.iter().filter(|e| !before.contains(e)).collect();
            assert!(changed.is_empty(), "options changed: {changed:?}");
            assert_eq!(after.len(), before.len());
        }
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
