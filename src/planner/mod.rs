//! Planning: the configuration, the per-node GPU/CPU decisions with their
//! reasons, and the physical optimizer rule that applies them.

mod aggregate_filters;
mod cached_inputs;
mod decision;
pub(crate) mod fills_ahead;
mod join_key_filters;
mod merge_for_order;
mod partitioning;
mod phases;
mod rule;
mod scan_size;
mod shape;
mod statistics;

pub use decision::{
    decide_aggregate, decide_hash_join, decide_sort_merge_join, gpu_decisions, NodeDecision,
    Placement,
};
pub(crate) use decision::{decide_scan_aggregate, decide_scan_filter};
pub use rule::GpuOptimizerRule;
