//! The GPU integration tests: one binary (each links all of DataFusion).
//!
//! Without a GPU every test that needs one prints a `SKIPPED` line and
//! passes; with `DATAFUSION_GPU_REQUIRE_GPU=1` it fails instead, which is how
//! a GPU machine runs them.

mod support;

mod aggregate;
mod cached_input;
mod concurrency;
mod conformance;
mod device_batch;
mod device_budget;
mod device_fault;
mod fill_words;
mod fuzz;
mod join_chain;
mod join_key_filter;
mod join_sql;
mod join_types;
mod ops;
mod probe_read_ahead;
mod runtime;
mod scan_aggregate;
mod scan_filter;
mod sort_merge_join;
