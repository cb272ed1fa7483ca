//! `GpuSortMergeJoinExec`: the plan node ([`exec`]), one partition's
//! collect, device sort and merge, and output ([`stream`]), the keys coded
//! in sort order ([`crate::encode::ordered_keys`]) and the rows each join type emits in
//! `SortMergeJoinExec`'s order ([`emit`]). Join-type roles, the output
//! assembly, the host-side filter and the gather of output columns on the
//! device are shared with the hash join.

mod emit;
mod exec;
mod stream;

pub use exec::GpuSortMergeJoinExec;
