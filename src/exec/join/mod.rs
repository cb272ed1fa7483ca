//! Join machinery both GPU joins share: what each join type does with
//! matches ([`matches`]), the host checks of candidate pairs and the
//! residual filter ([`candidates`]), the rows of a side as the join reads
//! them ([`row_source`]), output batches assembled from row ids
//! ([`output`]), output columns gathered on the device ([`device_gather`])
//! and an aggregation without `GROUP BY` computed from the pairs
//! ([`pair_aggregate`]).

pub(crate) mod candidates;
pub(crate) mod device_gather;
pub(crate) mod device_rows;
pub(crate) mod matches;
pub(crate) mod output;
pub(crate) mod pair_aggregate;
pub(crate) mod row_source;

pub(crate) use candidates::evaluate_filter;
pub(crate) use matches::emits_pairs;
pub(crate) use output::{compact_views, ColumnSource, OutputAssembler, OutputRows, SideRows};
