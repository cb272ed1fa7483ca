//! [`GpuScanAggregateExec`]: a partial aggregation, its filters and
//! projections and its table scan, run on the device over the table's
//! columns kept in the device column cache.

mod exec;
mod fill_lock;
mod like;
mod part_fill;
mod program;
mod read_types;
mod row_groups;
mod run;
mod shape;
mod shared_read;
mod source;
mod states;
mod warm;

pub use exec::GpuScanAggregateExec;
pub(crate) use program::{CodeTest, ProgramBuilder, ValueType};
pub(crate) use run::{learn_uncodable, part_columns, scan_chunk, table_columns, test_tables, Loaded, Reading};
pub(crate) use fill_lock::being_filled;
pub(crate) use row_groups::holds_no_row_group;
pub(crate) use shared_read::help_reads_in_turn;
pub(crate) use source::{source_url, uncodable_columns, Part};
pub(crate) use shape::{
    coalesced_input, filter_projection, scan_fields, substitute, table_scan_columns, table_source,
    ScanColumn, TableSource,
};
pub(crate) use warm::warm_scan;
pub use warm::WarmedColumns;
