//! A plan node's inputs as the cost model sees them ([`crate::cost`]): rows
//! and bytes from DataFusion's statistics, widths from the schemas, threads
//! from the partitions. `None` where statistics do not give the rows.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::stats::Precision;
use datafusion::common::JoinType;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode, SortMergeJoinExec};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::ExecutionPlan;

use super::statistics::plan_statistics;
use crate::cost::{AggregateShape, JoinAlgorithm, JoinShape};
use crate::exec::tracks_build_matches;

/// Bytes taken for a value of a type without a fixed width (strings,
/// binary, nested): what a short string costs with its offset.
const VARIABLE_WIDTH_BYTES: u64 = 24;

/// Bytes of one row of `schema`.
fn row_bytes(schema: &Schema) -> u64 {
    schema
        .fields()
        .iter()
        .map(|field| value_bytes(field.data_type()))
        .sum()
}

/// Bytes of one value of `data_type`.
fn value_bytes(data_type: &DataType) -> u64 {
    match data_type {
        DataType::Boolean => 1,
        DataType::Dictionary(key, _) => value_bytes(key),
        other => other
            .primitive_width()
            .map_or(VARIABLE_WIDTH_BYTES, |width| width as u64),
    }
}

/// Whether every value of `schema` has a fixed width the device gathers.
fn fixed_width(schema: &Schema) -> bool {
    schema
        .fields()
        .iter()
        .all(|field| matches!(field.data_type().primitive_width(), Some(4 | 8 | 16)))
}

/// The threads DataFusion runs `plan`'s work on: the most partitions any
/// node of it has (a node re-planned to read all partitions as one has a
/// single partition, but DataFusion's own plan below it runs on them all),
/// at most the host's cores.
pub(super) fn threads(plan: &Arc<dyn ExecutionPlan>) -> usize {
    fn widest(plan: &Arc<dyn ExecutionPlan>) -> usize {
        let own = plan.properties().output_partitioning().partition_count();
        plan.children()
            .into_iter()
            .map(widest)
            .fold(own, usize::max)
    }
    let cores = crate::host::copy::host_threads();
    widest(plan).clamp(1, cores)
}

/// Rows a join of `join_type` makes when statistics do not say: each probe
/// row matches at most once (the common key to foreign key join), outer
/// joins keep their preserved sides' rows, semi and anti joins their side's.
fn output_rows_by_type(join_type: JoinType, build: u64, probe: u64) -> u64 {
    match join_type {
        JoinType::Inner | JoinType::Right => probe,
        JoinType::Left => build.max(probe),
        JoinType::Full => build + probe,
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => build,
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => probe,
    }
}

/// Whether `plan` (or the sort directly on it) reads a hash repartition.
fn hash_repartitioned(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let below_sort = match plan.downcast_ref::<SortExec>() {
        Some(sort) => sort.input(),
        None => plan,
    };
    below_sort
        .downcast_ref::<RepartitionExec>()
        .is_some_and(|r| {
            matches!(
                r.partitioning(),
                datafusion::physical_expr::Partitioning::Hash(..)
            )
        })
}

/// The join's shape; `output_folded` where an aggregation above takes its
/// pairs on the device.
#[allow(clippy::too_many_arguments)]
fn join_shape(
    algorithm: JoinAlgorithm,
    node: &Arc<dyn ExecutionPlan>,
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    join_type: JoinType,
    keys: usize,
    has_filter: bool,
    output_folded: bool,
    device_gather: bool,
) -> Option<JoinShape> {
    let build_rows = estimated_rows(left)? as u64;
    let probe_rows = estimated_rows(right)? as u64;
    let output_rows = estimated_rows(node)
        .map(|rows| rows as u64)
        .unwrap_or_else(|| output_rows_by_type(join_type, build_rows, probe_rows));
    let schema = node.schema();
    Some(JoinShape {
        algorithm,
        build_rows,
        probe_rows,
        keys: keys.max(1) as u64,
        output_rows,
        output_row_bytes: row_bytes(&schema),
        gathered_on_device: device_gather
            && join_type == JoinType::Inner
            && !has_filter
            && fixed_width(&schema),
        // Only an inner join without a residual filter hands its pairs to
        // an aggregation above.
        output_folded: output_folded && join_type == JoinType::Inner && !has_filter,
        threads: threads(node),
        build_on_one_thread: false,
        repartitioned: false,
        sorted_for_join: [false, false],
        probe_skipped: false,
        build_matches_tracked: tracks_build_matches(join_type),
        output_reads_build: !matches!(
            join_type,
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
        ),
    })
}

/// The shape of `join` (the plan node `node`, possibly re-planned).
pub(super) fn hash_join_shape(
    join: &HashJoinExec,
    node: &Arc<dyn ExecutionPlan>,
    output_folded: bool,
    device_gather: bool,
) -> Option<JoinShape> {
    let shape = join_shape(
        JoinAlgorithm::Hash,
        node,
        join.left(),
        join.right(),
        *join.join_type(),
        join.on().len(),
        join.filter().is_some(),
        output_folded,
        device_gather,
    )?;
    Some(JoinShape {
        build_on_one_thread: *join.partition_mode() == PartitionMode::CollectLeft,
        // A `Partitioned` join's hash repartitions stay below the GPU join
        // that takes its place: the same work in both plans, left out of
        // both estimates. (The rule's re-planned join, which reads their
        // inputs, is estimated as the `CollectLeft` join it is.)
        repartitioned: false,
        probe_skipped: shape.build_rows == 0
            && join.join_type().empty_build_side_produces_empty_result(),
        ..shape
    })
}

/// The shape of `join` (the plan node `node`).
pub(super) fn sort_merge_join_shape(
    join: &SortMergeJoinExec,
    node: &Arc<dyn ExecutionPlan>,
    output_folded: bool,
) -> Option<JoinShape> {
    let shape = join_shape(
        JoinAlgorithm::SortMerge,
        node,
        join.left(),
        join.right(),
        join.join_type(),
        join.on().len(),
        join.filter().is_some(),
        output_folded,
        true,
    )?;
    let sides = [join.left(), join.right()];
    Some(JoinShape {
        repartitioned: sides.iter().all(|side| hash_repartitioned(side)),
        sorted_for_join: sides.map(|side| side.downcast_ref::<SortExec>().is_some()),
        ..shape
    })
}

/// The shape of `agg`, and whether statistics know its groups; groups they
/// do not know are taken as one in four rows (the sample of the keys at run
/// time decides again).
pub(super) fn aggregate_shape(
    agg: &AggregateExec,
    hashed_keys: bool,
) -> Option<(AggregateShape, bool)> {
    let input = agg.input();
    let rows = estimated_rows(input)? as u64;
    let keys = agg.group_expr().expr().len() as u64;
    let aggregates = agg.aggr_expr().len() as u64;
    let known = estimated_groups(agg);
    let groups = known.map_or(rows.div_ceil(4), |groups| groups as u64);
    let input_schema = input.schema();
    let value_bytes: u64 = agg
        .aggr_expr()
        .iter()
        .flat_map(|function| function.expressions())
        .map(|expr| {
            expr.data_type(&input_schema)
                .map_or(8, |data_type| value_bytes(&data_type))
        })
        .sum();
    let shape = AggregateShape {
        rows,
        groups,
        keys,
        value_bytes,
        aggregates,
        group_bytes: 8 * (keys + aggregates),
        threads: threads(input),
        hashed_keys,
    };
    Some((shape, known.is_some()))
}

/// Rows of `plan` by statistics, exact or estimated; `None` without any.
pub(super) fn estimated_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let stats = plan_statistics(plan).ok()?;
    match stats.num_rows {
        Precision::Exact(n) | Precision::Inexact(n) => Some(n),
        Precision::Absent => None,
    }
}

/// Rows of `plan` where statistics know them exactly (a whole table).
pub(super) fn exact_rows(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    match plan_statistics(plan).ok()?.num_rows {
        Precision::Exact(n) => Some(n),
        _ => None,
    }
}

/// The groups `agg` makes: one without grouping keys, else the product of
/// its key columns' distinct counts in its input's statistics; `None` when
/// a key is not a plain column or has no distinct count.
pub(super) fn estimated_groups(agg: &AggregateExec) -> Option<usize> {
    let exprs = agg.group_expr().expr();
    if exprs.is_empty() {
        return Some(1);
    }
    let stats = plan_statistics(agg.input()).ok()?;
    exprs.iter().try_fold(1usize, |groups, (expr, _)| {
        let column = expr.downcast_ref::<Column>()?;
        let distinct = match stats.column_statistics.get(column.index())?.distinct_count {
            Precision::Exact(n) | Precision::Inexact(n) => n,
            Precision::Absent => return None,
        };
        Some(groups.saturating_mul(distinct.max(1)))
    })
}
