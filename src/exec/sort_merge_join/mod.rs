//! `GpuSortMergeJoinExec`: the plan node ([`exec`]), one partition's
//! collect, device sort and merge, and output ([`stream`]), the keys coded
//! in sort order ([`ordered_keys`]) and the rows each join type emits in
//! `SortMergeJoinExec`'s order ([`emit`]), and output columns gathered on
//! the device ([`device_gather`]). Join-type roles, the output assembly and
//! the host-side filter are the hash join's.

mod device_gather;
mod emit;
mod exec;
mod ordered_keys;
mod stream;

pub use exec::GpuSortMergeJoinExec;
