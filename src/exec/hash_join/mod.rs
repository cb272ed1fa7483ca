//! `GpuHashJoinExec`: the plan node ([`exec`]), the build side shared by the
//! partitions ([`build_side`]), the probe stream ([`stream`]), the order
//! rows leave in ([`order`]), the dynamic filter it hands the probe side's
//! scan ([`probe_filter`]), the probe input read ahead while the build
//! side is collected ([`probe_reader`]) and the host join used when the
//! device lacks memory ([`host_fallback`]). What it shares with the
//! sort-merge join is in [`crate::exec::join`].

mod build_side;
mod exec;
mod host_fallback;
mod order;
mod probe_filter;
mod probe_reader;
mod stream;

pub use exec::GpuHashJoinExec;
pub(crate) use probe_filter::{dynamic_filter_of, with_filter_of};
