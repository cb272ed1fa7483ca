//! Placing join key filters (see [`crate::exec::join_keys`]): each hash join
//! that stays on the CPU gathers one integer key of its build side for the
//! scan of its probe side, which then keeps only the rows whose key the
//! build side holds: on the device where it reads the column cache, else
//! in a `FilterExec` on the host.
//! The probe side's column is followed through inner joins below, to the
//! input it comes from and, by the equi-join key it is, to the other; and
//! through aggregations that group by it, whose groups of keys the build
//! side lacks the join drops whole.
//!
//! The other way round, a GPU hash join that keeps probe rows by whether a
//! build row matches (a right semi or anti join, as DataFusion plans
//! `EXISTS` and `NOT EXISTS` with the subquery's table as the build side)
//! gathers its probe side's keys for the scan of its build side on the
//! device ([`with_build_key_filters`]).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinType, NullEquality, ScalarValue};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{replace_children_if_necessary, ExecutionPlan};

use super::decision::device_constants;
use super::scan_size::gpu_scan_placed;
use super::shape::{estimated_rows, exact_rows, threads};
use super::statistics::plan_statistics;
use crate::config::GpuOptions;
use crate::cost;
use crate::exec::dynamic_filter_of;
use crate::exec::join_keys::{
    gathers_keys_of, JoinKeyCollectorExec, JoinKeyFilterExpr, JoinKeySet, JoinKeyWaitExec,
};
use crate::exec::{coalesced_input, GpuAggregateExec, GpuHashJoinExec, GpuScanFilterExec};

/// Under `gpu.placement = 'cost'`, a probe side's scan with filters of its
/// own that the scan filters left on the CPU reads the device column cache
/// for the join only where the build side holds at most this share of its
/// rows by DataFusion's estimates: its keys then drop most rows (a key a
/// probe row shares with several build rows aside), and the rows that
/// cross the bus back are few. (A scan that only tests keys decides at run
/// time, by the set.)
const MAX_BUILD_SHARE: f64 = 0.125;

/// `plan` with a join key filter for each hash join it can serve.
pub(crate) fn with_join_key_filters(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if gpu.is_err() || !options.tuning.join_key_filters {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        match filtered_sides(join, options) {
            Some((left, right)) => Ok(Transformed::yes(replace_children_if_necessary(
                Arc::clone(&node),
                vec![left, right],
            )?)),
            None => Ok(Transformed::no(node)),
        }
    })
    .map(|t| t.data)
}

/// `plan` with the probe keys of each GPU right semi or anti join it can
/// serve gathered for the scan of its build side (see
/// [`build_side_filtered`]). Not for a stage of a distributed plan, whose
/// task runs only some of a probe side's partitions: no set of them all
/// would be made.
pub(crate) fn with_build_key_filters(
    plan: Arc<dyn ExecutionPlan>,
    options: &GpuOptions,
    gpu: std::result::Result<(), &str>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if gpu.is_err() || !options.tuning.build_key_filters {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let Some(gpu_join) = node.downcast_ref::<GpuHashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match build_side_filtered(gpu_join) {
            Some(children) => {
                Transformed::yes(replace_children_if_necessary(Arc::clone(&node), children)?)
            }
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// Whether a probe row of `join` whose key no build row holds makes no
/// output: the probe side may then drop it.
fn drops_unmatched_probe_rows(join: &HashJoinExec) -> bool {
    use JoinType::*;
    matches!(
        join.join_type(),
        Inner | Left | LeftSemi | LeftAnti | RightSemi | LeftMark
    ) && join.null_equality() == NullEquality::NullEqualsNothing
        && !join.null_aware
}

/// `join`'s build side under a [`JoinKeyCollectorExec`] and its probe side
/// with the scan that tests the keys, where it has such a scan.
fn filtered_sides(
    join: &HashJoinExec,
    options: &GpuOptions,
) -> Option<(Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>)> {
    if !drops_unmatched_probe_rows(join)
        || join.left().downcast_ref::<JoinKeyCollectorExec>().is_some()
    {
        return None;
    }
    let (build_key, probe_key) = gathered_key(join)?;
    let build_rows = plan_statistics(join.left())
        .ok()
        .and_then(|s| s.num_rows.get_value().copied());
    let build_exact = exact_rows(join.left());
    // An empty build side: DataFusion's join skips its probe side already.
    if build_exact == Some(0) && !options.placement.always() {
        return None;
    }
    let partitions = join
        .left()
        .properties()
        .output_partitioning()
        .partition_count();
    let keys = Arc::new(JoinKeySet::new(partitions));
    let probe = Probe {
        keys: &keys,
        build_rows,
        build_exact,
        scan_right_below: scan_right_below(join.right()),
        options,
    };
    let right = probe.with_filter(join.right(), probe_key.index())?;
    let left = Arc::new(JoinKeyCollectorExec::new(
        Arc::clone(join.left()),
        Arc::new(build_key),
        keys,
    ));
    Some((left, right))
}

/// `gpu_join`'s children with its probe side under a [`JoinKeyCollectorExec`]
/// of a set [`JoinKeySet::of_probe_side`] and its build side's scan on the
/// device testing its rows against that set, where the join is a right semi or
/// anti join (a build row whose key no probe row holds makes no output) without
/// a limit, its probe side is executed with the join (not read through a merge,
/// which the join starts only once its build side is read) and not pruned by
/// the join's dynamic filter (read ahead, it would be read before the filter is
/// there), and its build side is a [`GpuScanFilterExec`] under merges,
/// repartitions and projections of columns. The join reads its probe side after
/// its build side, so the scan waits for the set only where the probe side is
/// read ahead (a multi-threaded runtime), and a probe side too large to hold
/// ([`MAX_PROBE_SIDE_HELD`](crate::exec::join_keys::collector::MAX_PROBE_SIDE_HELD))
/// makes no set: the scan then reads every row, as it would have.
fn build_side_filtered(gpu_join: &GpuHashJoinExec) -> Option<Vec<Arc<dyn ExecutionPlan>>> {
    let join = gpu_join.hash_join();
    let keeps_probe_rows = matches!(join.join_type(), JoinType::RightSemi | JoinType::RightAnti);
    if !keeps_probe_rows
        || join.fetch().is_some()
        || dynamic_filter_of(join).is_some()
        || join.null_equality() != NullEquality::NullEqualsNothing
        || join.null_aware
        || join
            .right()
            .downcast_ref::<JoinKeyCollectorExec>()
            .is_some()
        || join
            .right()
            .downcast_ref::<CoalescePartitionsExec>()
            .is_some()
    {
        return None;
    }
    let (build_key, probe_key) = gathered_key(join)?;
    let partitions = join
        .right()
        .properties()
        .output_partitioning()
        .partition_count();
    let keys = Arc::new(JoinKeySet::of_probe_side(partitions));
    let left = with_scan_test(join.left(), build_key.index(), &keys)?;
    let right = Arc::new(JoinKeyCollectorExec::new(
        Arc::clone(join.right()),
        Arc::new(probe_key),
        keys,
    ));
    Some(vec![left, right])
}

/// `node` with its rows tested against `keys` by its column `column`, at
/// the [`GpuScanFilterExec`] it is under merges, repartitions and
/// projections of columns; `None` where it is none such.
fn with_scan_test(
    node: &Arc<dyn ExecutionPlan>,
    column: usize,
    keys: &Arc<JoinKeySet>,
) -> Option<Arc<dyn ExecutionPlan>> {
    if let Some(scan) = node.downcast_ref::<GpuScanFilterExec>() {
        let name = node.schema().field(column).name().clone();
        let filter = Arc::new(JoinKeyFilterExpr::new(
            Arc::new(Column::new(&name, column)),
            Arc::clone(keys),
            value_range(node, column),
        ));
        let tested = scan.with_join_filter(filter).ok().flatten()?;
        return Some(Arc::new(tested));
    }
    let (input, below) = if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
        let expr = &projection.expr().get(column)?.expr;
        (projection.input(), expr.downcast_ref::<Column>()?.index())
    } else if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
        (repartition.input(), column)
    } else if let Some(merge) = node.downcast_ref::<CoalescePartitionsExec>() {
        (merge.input(), column)
    } else {
        return None;
    };
    let tested = with_scan_test(input, below, keys)?;
    replace_children_if_necessary(Arc::clone(node), vec![tested]).ok()
}

/// The equi-join key whose build side values a join key set gathers: the
/// first of one integer (or date) type on both sides, build then probe.
fn gathered_key(join: &HashJoinExec) -> Option<(Column, Column)> {
    let (left_schema, right_schema) = (join.left().schema(), join.right().schema());
    join.on().iter().find_map(|(l, r)| {
        let (l, r) = (l.downcast_ref::<Column>()?, r.downcast_ref::<Column>()?);
        let l_type = left_schema.field(l.index()).data_type();
        let r_type = right_schema.field(r.index()).data_type();
        (l_type == r_type && gathers_keys_of(l_type)).then(|| (l.clone(), r.clone()))
    })
}

/// Where `join` on the CPU has (or would be given) a join key filter whose
/// test the device makes in a scan of its probe side from the column
/// cache: the share of the probe side's rows the keys keep, by
/// DataFusion's estimate of the build side's rows over the span of the
/// probe key's values (each value taken as common as another). `None`
/// where no scan on the device tests the keys or the statistics do not
/// tell. A GPU join in its place reads every probe row from DataFusion's
/// scan instead: the placement weighs the two ([`super::decision`]).
pub(super) fn probe_share_kept_on_device(join: &HashJoinExec, options: &GpuOptions) -> Option<f64> {
    if !options.tuning.join_key_filters || !drops_unmatched_probe_rows(join) {
        return None;
    }
    let tested = |collector: &Arc<dyn ExecutionPlan>, probe: &Arc<dyn ExecutionPlan>| {
        collector
            .downcast_ref::<JoinKeyCollectorExec>()
            .is_some_and(|collector| tested_on_device(probe, collector.keys()))
    };
    let build = match join.left().downcast_ref::<JoinKeyCollectorExec>() {
        Some(collector) => {
            if !tested(join.left(), join.right()) {
                return None;
            }
            collector.input()
        }
        None => {
            let (collector, probe) = filtered_sides(join, options)?;
            if !tested(&collector, &probe) {
                return None;
            }
            join.left()
        }
    };
    let (_, probe_key) = gathered_key(join)?;
    let build_rows = *plan_statistics(build).ok()?.num_rows.get_value()?;
    let (low, high) = value_range(join.right(), probe_key.index())?;
    let span = (high as f64 - low as f64 + 1.0).max(1.0);
    Some((build_rows as f64 / span).min(1.0))
}

/// Whether a scan on the device in `plan` tests its rows against `keys`.
fn tested_on_device(plan: &Arc<dyn ExecutionPlan>, keys: &Arc<JoinKeySet>) -> bool {
    plan.downcast_ref::<GpuScanFilterExec>()
        .is_some_and(|scan| scan.tests_keys_of(keys))
        || plan
            .children()
            .into_iter()
            .any(|child| tested_on_device(child, keys))
}

/// What placing the filter on a probe side needs.
struct Probe<'a> {
    keys: &'a Arc<JoinKeySet>,
    build_rows: Option<usize>,
    /// The build side's rows where statistics know them exactly.
    build_exact: Option<usize>,
    /// Whether the probe side is its scan, with only filters and
    /// projections between (see [`scan_right_below`]).
    scan_right_below: bool,
    options: &'a GpuOptions,
}

/// Whether `probe` (a join's probe side) is a table scan, with only
/// filters, projections and merges of partitions between: a test of its
/// rows against the build keys there, on the host or by the device over a
/// table in memory, then saves nothing the join would not do as cheaply
/// (its probe of each row), and costs the scan's wait for the keys.
/// (Below a repartition, another join or an aggregation, the rows the test
/// drops are rows those no longer take.)
fn scan_right_below(probe: &Arc<dyn ExecutionPlan>) -> bool {
    if probe.downcast_ref::<DataSourceExec>().is_some()
        || probe.downcast_ref::<GpuScanFilterExec>().is_some()
    {
        return true;
    }
    let passes = in_scan_chain(probe) || probe.downcast_ref::<CoalescePartitionsExec>().is_some();
    match (passes, probe.children().as_slice()) {
        (true, [input]) => scan_right_below(input),
        _ => false,
    }
}

/// Whether `node` belongs to a chain of filters and projections over a
/// table scan (the scan included), as a [`GpuScanFilterExec`] takes it.
fn in_scan_chain(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.downcast_ref::<ProjectionExec>().is_some()
        || node.downcast_ref::<FilterExec>().is_some()
        || node.downcast_ref::<DataSourceExec>().is_some()
        || node.downcast_ref::<JoinKeyWaitExec>().is_some()
        || coalesced_input(node).is_some()
}

impl Probe<'_> {
    /// `node` with its rows tested against the keys, by their column
    /// `column`: at a GPU scan filter that reads the column, made or found
    /// under nodes that pass rows through with their columns, and on either
    /// side of inner joins; where the device does not read the scan, by a
    /// `FilterExec` above it on the host.
    fn with_filter(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        column: usize,
    ) -> Option<Arc<dyn ExecutionPlan>> {
        // Below a limit, the rows a test drops would let others in.
        if node.fetch().is_some() {
            return None;
        }
        let filter = || -> Arc<dyn PhysicalExpr> {
            let name = node.schema().field(column).name().clone();
            Arc::new(JoinKeyFilterExpr::new(
                Arc::new(Column::new(&name, column)),
                Arc::clone(self.keys),
                value_range(node, column),
            ))
        };
        if let Some(scan) = node.downcast_ref::<GpuScanFilterExec>() {
            if self.build_too_large_for(scan.scan_rows()) {
                return None;
            }
            return scan
                .with_join_filter(filter())
                .ok()
                .flatten()
                .map(|scan| Arc::new(scan) as Arc<dyn ExecutionPlan>);
        }
        if in_scan_chain(node) {
            if let Ok(Some(scan)) =
                GpuScanFilterExec::with_join_filters(Arc::clone(node), vec![filter()])
            {
                if self.placed(&scan) {
                    return Some(Arc::new(scan));
                }
            }
        }
        // A scan the device does not read: tested on the host, where the
        // set is worth it (see `JoinKeyFilterExpr::evaluate`), read once
        // the keys are there where the wait cannot hang (a build side of
        // one partition; see `JoinKeySet::settled`).
        let at_scan = node.downcast_ref::<DataSourceExec>().is_some()
            || node.downcast_ref::<JoinKeyWaitExec>().is_some();
        if at_scan
            && (self.build_too_large_for(estimated_rows(node)) || self.nothing_saved_right_below())
        {
            return None;
        }
        let waits = self.keys.partitions() == 1;
        let scan: Option<Arc<dyn ExecutionPlan>> =
            if node.downcast_ref::<DataSourceExec>().is_some() {
                Some(match waits {
                    true => Arc::new(JoinKeyWaitExec::new(
                        Arc::clone(node),
                        vec![Arc::clone(self.keys)],
                    )),
                    false => Arc::clone(node),
                })
            } else {
                node.downcast_ref::<JoinKeyWaitExec>()
                    .map(|wait| match waits {
                        true => {
                            Arc::new(wait.with_set(Arc::clone(self.keys))) as Arc<dyn ExecutionPlan>
                        }
                        false => Arc::clone(node),
                    })
            };
        if let Some(scan) = scan {
            let tested = FilterExec::try_new(filter(), scan).ok()?;
            return Some(Arc::new(tested));
        }
        // Below: the input column that is `column` here.
        let (input, below) = if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
            let expr = &projection.expr().get(column)?.expr;
            (projection.input(), expr.downcast_ref::<Column>()?.index())
        } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
            let below = match filter.projection() {
                Some(projection) => *projection.get(column)?,
                None => column,
            };
            (filter.input(), below)
        } else if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
            (repartition.input(), column)
        } else if let Some(coalesce) = node.downcast_ref::<CoalescePartitionsExec>() {
            (coalesce.input(), column)
        } else if let Some(collector) = node.downcast_ref::<JoinKeyCollectorExec>() {
            (collector.input(), column)
        } else if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
            (aggregate.input(), group_key_column(aggregate, column)?)
        } else if let Some(gpu_aggregate) = node.downcast_ref::<GpuAggregateExec>() {
            // Its child is its aggregation's.
            let aggregate = gpu_aggregate.aggregate();
            (aggregate.input(), group_key_column(aggregate, column)?)
        } else if let Some(input) = coalesced_input(node) {
            let filtered = self.with_filter(&input, column)?;
            return replace_children_if_necessary(Arc::clone(node), vec![filtered]).ok();
        } else if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            return self.through_inner_join(node, join, column);
        } else if let Some(gpu_join) = node.downcast_ref::<GpuHashJoinExec>() {
            // Its children are its hash join's; not where it aggregates
            // its pairs (its output is then the aggregation's).
            if gpu_join.partial_aggregate_node().is_some() {
                return None;
            }
            return self.through_inner_join(node, gpu_join.hash_join(), column);
        } else {
            return None;
        };
        let filtered = self.with_filter(input, below)?;
        replace_children_if_necessary(Arc::clone(node), vec![filtered]).ok()
    }

    /// `node`, an inner join (`join`, or the GPU join that takes its place),
    /// with its output column `column` tested in the input it comes from
    /// and, where it is an equi-join key, in the other input by its
    /// partner: a row either test drops makes no output row whose key is
    /// among the keys.
    fn through_inner_join(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        join: &HashJoinExec,
        column: usize,
    ) -> Option<Arc<dyn ExecutionPlan>> {
        if *join.join_type() != JoinType::Inner {
            return None;
        }
        let column = match &join.projection {
            Some(projection) => *projection.get(column)?,
            None => column,
        };
        let left_width = join.left().schema().fields().len();
        let (left_column, right_column) = match column < left_width {
            true => {
                let partner = join.on().iter().find_map(|(l, r)| {
                    let l = l.downcast_ref::<Column>()?;
                    (l.index() == column).then(|| r.downcast_ref::<Column>().map(Column::index))?
                });
                (Some(column), partner)
            }
            false => {
                let column = column - left_width;
                let partner = join.on().iter().find_map(|(l, r)| {
                    let r = r.downcast_ref::<Column>()?;
                    (r.index() == column).then(|| l.downcast_ref::<Column>().map(Column::index))?
                });
                (partner, Some(column))
            }
        };
        let left = left_column.and_then(|c| self.with_filter(join.left(), c));
        let right = right_column.and_then(|c| self.with_filter(join.right(), c));
        if left.is_none() && right.is_none() {
            return None;
        }
        let children = vec![
            left.unwrap_or_else(|| Arc::clone(join.left())),
            right.unwrap_or_else(|| Arc::clone(join.right())),
        ];
        replace_children_if_necessary(Arc::clone(node), children).ok()
    }

    /// Whether a scan that tests the keys should read the cache in place
    /// of DataFusion's scan.
    fn placed(&self, scan: &GpuScanFilterExec) -> bool {
        if !self.options.tuning.scan_filter {
            return false;
        }
        let rows = scan.scan_rows();
        if gpu_scan_placed(self.options, "a scan filter", rows).is_err() {
            return false;
        }
        if self.options.placement.always() {
            return true;
        }
        if self.build_too_large_for(rows) {
            return false;
        }
        // A scan that only tests keys leaves a partition to DataFusion's
        // scan at run time, before it reads anything into the cache, where
        // the set would keep many rows (see `MAX_KEPT_SHARE`): DataFusion's
        // estimate of the build side is not needed (nor often right, under
        // a `HAVING` or a join). Of a table in memory, it saves DataFusion
        // no decoding, only its join's probes: the device's fixed costs
        // must pay by the estimate.
        if !scan.filters_of_its_own() {
            return scan.reads_files()
                || (!self.nothing_saved_right_below() && self.memory_key_test_faster(scan));
        }
        match (self.build_rows, rows) {
            (Some(build), Some(rows)) => build as f64 <= MAX_BUILD_SHARE * rows as f64,
            _ => false,
        }
    }
}

impl Probe<'_> {
    /// Under `gpu.placement = 'cost'`, whether the build side holds, by
    /// exact statistics (a whole table), more than [`MAX_BUILD_SHARE`] of
    /// the rows of a scan of `scan_rows`: its keys then keep many of them,
    /// and the scan waiting for the whole build side costs the join more
    /// than the test saves. (An estimate of the build side is no reason:
    /// under a filter, a `HAVING` or a join, it is often far off.)
    fn build_too_large_for(&self, scan_rows: Option<usize>) -> bool {
        if self.options.placement.always() {
            return false;
        }
        match (self.build_exact, scan_rows) {
            (Some(build), Some(rows)) => build as f64 > MAX_BUILD_SHARE * rows as f64,
            _ => false,
        }
    }

    /// Under `gpu.placement = 'cost'`, whether the scan is right below the
    /// join (see [`scan_right_below`]), where a test on the host, or by the
    /// device over a table in memory, saves nothing.
    fn nothing_saved_right_below(&self) -> bool {
        self.scan_right_below && !self.options.placement.always()
    }

    /// Whether a scan of a table in memory that only tests keys is
    /// estimated faster on the device, at best, than DataFusion's join
    /// probing each of its rows.
    fn memory_key_test_faster(&self, scan: &GpuScanFilterExec) -> bool {
        let Some(rows) = scan.scan_rows() else {
            return false;
        };
        let shape = cost::KeyTestShape {
            probe_rows: rows as u64,
            build_rows: self.build_rows.map(|rows| rows as u64),
            threads: threads(scan.cpu_input()),
        };
        cost::memory_key_test(&shape, &device_constants()).gpu_faster()
    }
}

/// The input column that `aggregate`'s output column `column` is, where
/// that column is a group key taken as it is from the input: a row whose
/// key the build side lacks then belongs to a group the join drops. Only
/// a plain GROUP BY (grouping sets are left alone), and not with a limit
/// on the groups (other groups would come out in place of those dropped).
fn group_key_column(aggregate: &AggregateExec, column: usize) -> Option<usize> {
    let group_by = aggregate.group_expr();
    if !group_by.is_single() || aggregate.limit_options().is_some() {
        return None;
    }
    let (expr, _) = group_by.expr().get(column)?;
    expr.downcast_ref::<Column>().map(Column::index)
}

/// The smallest and largest value of `node`'s output column `column`
/// (an integer or date), where its statistics know both.
fn value_range(node: &Arc<dyn ExecutionPlan>, column: usize) -> Option<(i64, i64)> {
    let stats = plan_statistics(node).ok()?;
    let column = stats.column_statistics.get(column)?;
    let bound = |value: &ScalarValue| -> Option<i64> {
        match value.cast_to(&DataType::Int64).ok()? {
            ScalarValue::Int64(Some(v)) => Some(v),
            _ => None,
        }
    };
    let low = bound(column.min_value.get_value()?)?;
    let high = bound(column.max_value.get_value()?)?;
    Some((low, high))
}
