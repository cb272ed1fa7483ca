//! Candidate pairs from the device, narrowed to the join's real matches on
//! the host: equal keys where keys were hashed, then the residual join
//! filter. Both run on one bounded batch of pairs at a time, so the full
//! candidate set is never materialized.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, UInt64Array};
use datafusion::arrow::compute::filter;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::JoinSide;
use datafusion::common::NullEquality;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::joins::utils::{JoinFilter, JoinKeyComparator};

use crate::exec::join::row_source::RowSource;

/// `HashJoinExec`'s key equality between the build side's key columns and
/// one probe chunk's, for keys that were hashed.
pub(crate) fn key_comparator(
    build_keys: &[ArrayRef],
    probe_keys: &[ArrayRef],
    null_equality: NullEquality,
) -> Result<JoinKeyComparator> {
    let options = vec![SortOptions::default(); build_keys.len()];
    JoinKeyComparator::new(build_keys, probe_keys, &options, null_equality)
}

/// Keeps the pairs whose keys are equal (when `keys_equal` is given, for
/// hashed keys) and for which the residual filter is true.
pub(crate) fn confirm_pairs(
    keys_equal: Option<&JoinKeyComparator>,
    join_filter: Option<&JoinFilter>,
    build: &dyn RowSource,
    probe: &dyn RowSource,
    build_ids: UInt64Array,
    probe_ids: UInt64Array,
) -> Result<(UInt64Array, UInt64Array)> {
    if build_ids.is_empty() || (keys_equal.is_none() && join_filter.is_none()) {
        return Ok((build_ids, probe_ids));
    }
    let keep: Option<BooleanArray> = keys_equal.map(|comparator| {
        build_ids
            .values()
            .iter()
            .zip(probe_ids.values())
            .map(|(&b, &p)| Some(comparator.is_equal(b as usize, p as usize)))
            .collect()
    });
    if let Some(join_filter) = join_filter {
        // Evaluate the filter only on pairs that survived the key check.
        let (b, p) = match &keep {
            Some(k) => (narrow(&build_ids, k)?, narrow(&probe_ids, k)?),
            None => (build_ids.clone(), probe_ids.clone()),
        };
        let passed = evaluate_filter(join_filter, build, probe, &b, &p)?;
        return Ok((narrow(&b, &passed)?, narrow(&p, &passed)?));
    }
    let keep = keep.expect("set when verification is needed");
    Ok((narrow(&build_ids, &keep)?, narrow(&probe_ids, &keep)?))
}

fn narrow(ids: &UInt64Array, keep: &BooleanArray) -> Result<UInt64Array> {
    // NULL in `keep` (a comparison with NULL) drops the pair, as SQL does.
    Ok(filter(ids, keep)?.as_primitive().clone())
}

/// The filter's value on each pair.
pub(crate) fn evaluate_filter(
    join_filter: &JoinFilter,
    build: &dyn RowSource,
    probe: &dyn RowSource,
    build_ids: &UInt64Array,
    probe_ids: &UInt64Array,
) -> Result<BooleanArray> {
    // Each side's columns are taken together (a probe chunk of several
    // batches locates its rows once), then put in the filter's order.
    let indices = join_filter.column_indices();
    let side_columns = |side: JoinSide| -> Vec<usize> {
        indices
            .iter()
            .filter(|c| c.side == side)
            .map(|c| c.index)
            .collect()
    };
    let mut left = build
        .take_columns(&side_columns(JoinSide::Left), build_ids)?
        .into_iter();
    let mut right = probe
        .take_columns(&side_columns(JoinSide::Right), probe_ids)?
        .into_iter();
    let columns = indices
        .iter()
        .map(|column| {
            match column.side {
                JoinSide::Left => left.next(),
                JoinSide::Right => right.next(),
                JoinSide::None => None,
            }
            .ok_or_else(|| {
                DataFusionError::Internal("a join filter column from neither side".into())
            })
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(build_ids.len()));
    let intermediate =
        RecordBatch::try_new_with_options(Arc::clone(join_filter.schema()), columns, &options)?;
    let value = join_filter
        .expression()
        .evaluate(&intermediate)?
        .into_array(intermediate.num_rows())?;
    let value = value.as_boolean_opt().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "join filter returned {} instead of Boolean",
            value.data_type()
        ))
    })?;
    // `filter` treats NULL as false, as SQL's WHERE does.
    Ok(value.clone())
}
