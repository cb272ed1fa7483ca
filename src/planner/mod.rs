//! Planning: the configuration, the per-node GPU/CPU decisions with their
//! reasons, and the physical optimizer rule that applies them.

mod decision;
mod merge_for_order;
mod partitioning;
mod phases;
mod rule;
mod shape;
mod statistics;

pub(crate) use decision::decide_scan_aggregate;
pub use decision::{
    decide_aggregate, decide_hash_join, decide_sort_merge_join, gpu_decisions, NodeDecision,
    Placement,
};
pub use rule::GpuOptimizerRule;
