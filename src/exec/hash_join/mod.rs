//! `GpuHashJoinExec`: the plan node ([`exec`]), the build side shared by the
//! partitions ([`build_side`]), the probe stream ([`stream`]) and the
//! assembly of output batches from matched row ids ([`output`]).

mod build_side;
mod exec;
mod output;
mod stream;

pub use exec::GpuHashJoinExec;
