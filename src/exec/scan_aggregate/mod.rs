//! [`GpuScanAggregateExec`]: a partial aggregation, its filters and
//! projections and its table scan, run on the device over the table's
//! columns kept in the device column cache.

mod exec;
mod program;
mod run;
mod shape;
mod source;
mod states;
mod warm;

pub use exec::GpuScanAggregateExec;
pub(crate) use warm::warm_scan;
pub use warm::WarmedColumns;
