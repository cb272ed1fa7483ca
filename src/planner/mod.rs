//! Planning: the configuration, the per-node GPU/CPU decisions with their
//! reasons, and the physical optimizer rule that applies them.

mod config;
mod decision;
mod merge_for_order;
mod partitioning;
mod phases;
mod rule;
mod statistics;

pub use config::GpuOptions;
pub(crate) use decision::key_spec as key_spec_of;
pub use decision::{
    decide_aggregate, decide_hash_join, decide_sort_merge_join, gpu_decisions, NodeDecision,
    Placement,
};
pub(crate) use phases::cpu_phases_over;
pub use rule::GpuOptimizerRule;
