//! [`GpuScanFilterExec`]: filters and projections over a table scan, run on
//! the device over the table's columns kept in the device column cache,
//! handing the rows kept to the nodes above.

mod exec;
mod program;
mod run;
mod shape;

pub use exec::GpuScanFilterExec;
