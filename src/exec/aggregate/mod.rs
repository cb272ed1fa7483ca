//! `GpuAggregateExec`: the plan node ([`exec`]), which aggregations the
//! GPU takes ([`spec`]), group keys as device words and the check of hashed
//! ones ([`group_keys`]), each aggregate as device reductions and its
//! DataFusion state rebuilt from them ([`reductions`]), Arrow columns as
//! device words and back ([`words`]), and one partition's stream with its
//! run-time CPU fallback ([`stream`]).

mod exec;
mod group_keys;
mod reductions;
mod result_passes;
mod spec;
mod stream;
mod words;

pub(crate) use exec::describe_aggregate;
pub use exec::GpuAggregateExec;
pub(crate) use spec::{aggregate_kind, AggregateKind, AggregateSpec, ValueKind};
