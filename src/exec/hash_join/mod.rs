//! `GpuHashJoinExec`: the plan node ([`exec`]), the build side shared by the
//! partitions ([`build_side`]), the probe stream ([`stream`]), the host
//! checks of device candidates ([`candidates`]), what each join type does
//! with matches ([`matches`]), the order rows leave in ([`order`]), the host join used when the device lacks
//! memory ([`host_fallback`]) and the assembly of output batches from row
//! ids ([`output`]).

mod build_side;
mod candidates;
mod exec;
mod host_fallback;
mod matches;
mod order;
mod output;
mod stream;

pub use exec::GpuHashJoinExec;
// Shared with the sort-merge join: join-type roles, output assembly and the
// host-side filter over candidate pairs.
pub(crate) use candidates::evaluate_filter;
pub(crate) use matches::emits_pairs;
pub(crate) use output::{compact_views, ColumnSource, OutputAssembler, OutputRows, SideRows};
