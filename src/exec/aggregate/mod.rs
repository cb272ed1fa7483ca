//! `GpuAggregateExec`: the plan node ([`exec`]), which aggregations the
//! GPU takes ([`spec`]), each aggregate as device reductions and its
//! DataFusion state rebuilt from them ([`reductions`]), and one partition's
//! stream with its run-time CPU fallback ([`stream`]). Group keys and values
//! become device words in [`crate::encode`].

mod cpu_phases;
mod exec;
mod group_filter;
mod reductions;
mod result_passes;
mod spec;
mod stream;

pub(crate) use exec::describe_aggregate;
pub use exec::GpuAggregateExec;
pub(crate) use spec::{aggregate_kind, AggregateKind, AggregateSpec, ValueKind};

use datafusion::physical_plan::aggregates::AggregateExec;

/// Whether `agg` (of `spec`) can read its table's columns from the device
/// column cache ([`GpuAggregateExec::with_cached_input`]).
pub(crate) fn can_read_cached_input(agg: &AggregateExec, spec: &AggregateSpec) -> bool {
    stream::reads_cache_if_asked(agg, spec)
}
