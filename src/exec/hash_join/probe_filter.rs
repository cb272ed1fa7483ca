//! The dynamic filter a GPU hash join hands its probe side, as DataFusion's
//! `HashJoinExec` does. DataFusion's filter pushdown puts a placeholder
//! (`true`) into the probe side's scan and gives the join the other end;
//! once the build side is collected, the join replaces the placeholder by
//! the build keys' range, and for a small build side by their values, so
//! that a Parquet scan below skips the files and row groups no build key
//! can match. The filter only removes probe rows that cannot match, so the
//! join's answer is the same with it or without it; where it cannot be
//! made (a key type without an order, a type the scan does not share), the
//! placeholder stays and prunes nothing. Nothing waits for it.

use std::any::Any;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::{concat, filter as keep_rows, is_not_null};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{NullEquality, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::{Accumulator, Operator};
use datafusion::physical_expr::expressions::{
    lit, BinaryExpr, DynamicFilterPhysicalExpr, InListExpr, IsNullExpr,
};
use datafusion::physical_expr::{PhysicalExpr, PhysicalExprRef};
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::{GpuScanAggregateExec, GpuScanFilterExec};
use crate::host::copy::host_threads;
use crate::host::parallel::on_ranges;
use crate::trace;

/// The dynamic filter `join` produces, if DataFusion gave it one.
pub(crate) fn dynamic_filter_of(join: &HashJoinExec) -> Option<Arc<DynamicFilterPhysicalExpr>> {
    join.dynamic_expressions_produced()
        .into_iter()
        .find_map(|expr| {
            let expr: Arc<dyn Any + Send + Sync> = expr;
            expr.downcast::<DynamicFilterPhysicalExpr>().ok()
        })
}

/// `rebuilt` (a re-planned `original`, over the same probe input) with
/// `original`'s dynamic filter: DataFusion's builder drops it when it resets
/// a join's state, while the probe side's scan still holds the other end.
pub(crate) fn with_filter_of(original: &HashJoinExec, rebuilt: HashJoinExec) -> Result<HashJoinExec> {
    match dynamic_filter_of(original) {
        Some(filter) => rebuilt.with_dynamic_filter_expr(filter),
        None => Ok(rebuilt),
    }
}

/// Whether an expression in `plan` (a node or any expression below a node's
/// expressions) has the identity `id`.
fn plan_holds_expression(plan: &Arc<dyn ExecutionPlan>, id: u64) -> bool {
    plan_holds_expression_above(plan, id, &|_| false)
}

/// [`plan_holds_expression`], not looking below the nodes `ends` picks.
fn plan_holds_expression_above(
    plan: &Arc<dyn ExecutionPlan>,
    id: u64,
    ends: &dyn Fn(&dyn ExecutionPlan) -> bool,
) -> bool {
    let mut found = false;
    let walked = plan.apply(|node| {
        node.apply_expressions(&mut |root| {
            root.apply(|expr| {
                found |= expr.expression_id() == Some(id);
                Ok(match found {
                    true => TreeNodeRecursion::Stop,
                    false => TreeNodeRecursion::Continue,
                })
            })
        })?;
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false if ends(node.as_ref()) => TreeNodeRecursion::Jump,
            false => TreeNodeRecursion::Continue,
        })
    });
    walked.is_ok() && found
}

/// Whether `node` is a GPU scan over the device column cache, whose input
/// (DataFusion's scan) is read only where the GPU scan falls back to it.
fn reads_the_column_cache(node: &dyn ExecutionPlan) -> bool {
    node.downcast_ref::<GpuScanFilterExec>().is_some()
        || node.downcast_ref::<GpuScanAggregateExec>().is_some()
}

/// How many build key values the filter may list (beside their range), as
/// DataFusion's `hash_join_inlist_pushdown_max_*` options say for its own
/// join.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MembershipLimits {
    pub(crate) max_values: usize,
    pub(crate) max_bytes: usize,
}

impl MembershipLimits {
    fn allow(&self, values: &dyn Array) -> bool {
        values.len() <= self.max_values && values.get_array_memory_size() <= self.max_bytes
    }
}

/// What one key's build values bound.
#[derive(Debug, Clone, PartialEq)]
enum KeyBounds {
    /// The least and greatest non-NULL value.
    Range(ScalarValue, ScalarValue),
    /// No build row has a non-NULL value: no probe row matches by value.
    NoValue,
    /// No range can be given (a type without an order).
    Unknown,
}

/// Build rows a thread bounds at least: a large build side's bounds are
/// taken on every core (one pass over 15 million keys took about 36 ms on
/// one), a small one's on one.
const ROWS_PER_BOUNDS_TASK: usize = 1 << 20;

impl KeyBounds {
    /// The bounds of the values of `pieces`, taken over consecutive runs of
    /// pieces on several threads where they hold many rows.
    fn of(pieces: &[ArrayRef]) -> Self {
        let rows: usize = pieces.iter().map(|piece| piece.len()).sum();
        let tasks = host_threads().min(rows / ROWS_PER_BOUNDS_TASK).max(1);
        if tasks == 1 {
            return Self::of_on_one_thread(pieces);
        }
        let runs = on_ranges(pieces.len(), tasks, |run| {
            Ok(Self::of_on_one_thread(&pieces[run]))
        });
        match runs {
            Ok(runs) => runs.into_iter().reduce(Self::union).unwrap_or(Self::NoValue),
            Err(_) => Self::Unknown,
        }
    }

    fn of_on_one_thread(pieces: &[ArrayRef]) -> Self {
        let Some(first) = pieces.first() else {
            return Self::NoValue;
        };
        let value_type = match first.data_type() {
            DataType::Dictionary(_, values) => values.as_ref().clone(),
            other => other.clone(),
        };
        let bounds = || -> Result<Self> {
            let mut min = MinAccumulator::try_new(&value_type)?;
            let mut max = MaxAccumulator::try_new(&value_type)?;
            for piece in pieces {
                min.update_batch(std::slice::from_ref(piece))?;
                max.update_batch(std::slice::from_ref(piece))?;
            }
            let (min, max) = (min.evaluate()?, max.evaluate()?);
            Ok(match min.is_null() || max.is_null() {
                true => Self::NoValue,
                false => Self::Range(min, max),
            })
        };
        bounds().unwrap_or(Self::Unknown)
    }

    /// The bounds of the union of the values `self` and `other` bound.
    fn union(self, other: Self) -> Self {
        match (self, other) {
            (Self::Unknown, _) | (_, Self::Unknown) => Self::Unknown,
            (Self::NoValue, other) | (other, Self::NoValue) => other,
            (Self::Range(min_a, max_a), Self::Range(min_b, max_b)) => {
                let least = match min_a.partial_cmp(&min_b) {
                    Some(order) if order.is_le() => Some(min_a),
                    Some(_) => Some(min_b),
                    None => None,
                };
                let greatest = match max_a.partial_cmp(&max_b) {
                    Some(order) if order.is_ge() => Some(max_a),
                    Some(_) => Some(max_b),
                    None => None,
                };
                match (least, greatest) {
                    (Some(min), Some(max)) => Self::Range(min, max),
                    _ => Self::Unknown,
                }
            }
        }
    }
}

/// What a build side (one partition's, or the one all partitions share)
/// tells the filter about its keys.
#[derive(Debug, Clone)]
pub(crate) struct BuildKeySummary {
    bounds: Vec<KeyBounds>,
    /// Some build key value is NULL.
    has_null: bool,
    /// A single key's non-NULL values, where within the limits.
    values: Option<ArrayRef>,
}

impl BuildKeySummary {
    /// The summary of the key columns `per_key` (each key's values in
    /// pieces, the same pieces for every key).
    pub(crate) fn of(per_key: &[Vec<ArrayRef>], limits: MembershipLimits) -> Self {
        let bounds = per_key.iter().map(|pieces| KeyBounds::of(pieces)).collect();
        let has_null = per_key
            .iter()
            .flatten()
            .any(|piece| piece.logical_null_count() > 0);
        let values = match per_key {
            [pieces] => single_key_values(pieces, limits),
            _ => None,
        };
        Self {
            bounds,
            has_null,
            values,
        }
    }

    fn union(self, other: Self, limits: MembershipLimits) -> Self {
        let values = match (self.values, other.values) {
            (Some(a), Some(b)) => concat(&[a.as_ref(), b.as_ref()])
                .ok()
                .filter(|values| limits.allow(values.as_ref())),
            _ => None,
        };
        Self {
            bounds: self
                .bounds
                .into_iter()
                .zip(other.bounds)
                .map(|(a, b)| a.union(b))
                .collect(),
            has_null: self.has_null || other.has_null,
            values,
        }
    }

    /// The predicate on the probe keys that keeps every probe row that can
    /// match a build row: each key within its range, the single key among
    /// the values where they are listed, and where `keep_null_keys`, any
    /// row with a NULL key. `None` where nothing would be pruned.
    fn predicate(
        &self,
        probe_keys: &[PhysicalExprRef],
        probe_schema: &SchemaRef,
        keep_null_keys: bool,
    ) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        let matching: Option<Arc<dyn PhysicalExpr>> =
            if self.bounds.contains(&KeyBounds::NoValue) {
                Some(lit(false))
            } else {
                let mut terms = Vec::new();
                for (bounds, key) in self.bounds.iter().zip(probe_keys) {
                    let KeyBounds::Range(min, max) = bounds else {
                        continue;
                    };
                    let key_type = value_type(key.data_type(probe_schema)?);
                    if min.data_type() != key_type || max.data_type() != key_type {
                        continue;
                    }
                    let (min, max) = (signed_zero(min, true), signed_zero(max, false));
                    let at_least = binary(Arc::clone(key), Operator::GtEq, lit(min));
                    let at_most = binary(Arc::clone(key), Operator::LtEq, lit(max));
                    terms.push(binary(at_least, Operator::And, at_most));
                }
                if let (Some(values), [key]) = (&self.values, probe_keys) {
                    // The scan's type must be the values' (`try_new_from_array` checks).
                    if let Ok(in_list) = InListExpr::try_new_from_array(
                        Arc::clone(key),
                        Arc::clone(values),
                        false,
                        probe_schema,
                    ) {
                        terms.push(Arc::new(in_list));
                    }
                }
                terms
                    .into_iter()
                    .reduce(|all, term| binary(all, Operator::And, term))
            };
        let Some(matching) = matching else {
            return Ok(None);
        };
        if !keep_null_keys {
            return Ok(Some(matching));
        }
        let mut any_null: Option<Arc<dyn PhysicalExpr>> = None;
        for key in probe_keys {
            if !key.nullable(probe_schema)? {
                continue;
            }
            let is_null: Arc<dyn PhysicalExpr> = Arc::new(IsNullExpr::new(Arc::clone(key)));
            any_null = Some(match any_null {
                Some(others) => binary(others, Operator::Or, is_null),
                None => is_null,
            });
        }
        Ok(Some(match any_null {
            Some(any_null) => binary(any_null, Operator::Or, matching),
            None => matching,
        }))
    }
}

fn binary(
    left: Arc<dyn PhysicalExpr>,
    op: Operator,
    right: Arc<dyn PhysicalExpr>,
) -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(left, op, right))
}

fn value_type(data_type: DataType) -> DataType {
    match data_type {
        DataType::Dictionary(_, values) => *values,
        other => other,
    }
}

/// The non-NULL values of a single key, where within `limits` (looked at
/// only when its row count is).
fn single_key_values(pieces: &[ArrayRef], limits: MembershipLimits) -> Option<ArrayRef> {
    let rows: usize = pieces.iter().map(|piece| piece.len()).sum();
    if rows > limits.max_values {
        return None;
    }
    let all = match pieces {
        [] => return None,
        [one] => Arc::clone(one),
        _ => concat(&pieces.iter().map(|p| p.as_ref()).collect::<Vec<_>>()).ok()?,
    };
    let values = match all.logical_null_count() {
        0 => all,
        _ => keep_rows(all.as_ref(), &is_not_null(all.as_ref()).ok()?).ok()?,
    };
    let values = with_both_zeros(values)?;
    limits.allow(values.as_ref()).then_some(values)
}

// Float keys: the join takes -0.0 and 0.0 as one key (it hashes and
// compares a float by its bits, -0.0 read as 0.0), while the filter's
// comparisons and list order floats totally, -0.0 below 0.0 and apart from
// it. A range that ends at a zero, or a list that holds one, then covers
// both zeros, or a probe row of the other zero that the join matches would
// be dropped before it (DataFusion 55's own join filter drops it so).

/// A half float, as Arrow holds it.
type F16 = <datafusion::arrow::datatypes::Float16Type as datafusion::arrow::datatypes::ArrowPrimitiveType>::Native;

/// `bound`, or the zero of the sign asked for where it is a float zero
/// (-0.0 to start a range, 0.0 to end one).
fn signed_zero(bound: &ScalarValue, negative: bool) -> ScalarValue {
    let zero = if negative { -0.0 } else { 0.0 };
    match bound {
        ScalarValue::Float64(Some(v)) if *v == 0.0 => ScalarValue::Float64(Some(zero)),
        ScalarValue::Float32(Some(v)) if *v == 0.0 => ScalarValue::Float32(Some(zero as f32)),
        ScalarValue::Float16(Some(v)) if f32::from(*v) == 0.0 => {
            ScalarValue::Float16(Some(F16::from_f32(zero as f32)))
        }
        other => other.clone(),
    }
}

/// Float `values` with both zeros where they hold either; other values as
/// they are. `None` where they cannot be extended.
fn with_both_zeros(values: ArrayRef) -> Option<ArrayRef> {
    use datafusion::arrow::array::{AsArray, Float32Array, Float64Array};
    use datafusion::arrow::datatypes::{Float32Type, Float64Type};
    let zeros: ArrayRef = match values.data_type() {
        DataType::Float64 if values.as_primitive::<Float64Type>().values().contains(&0.0) => {
            Arc::new(Float64Array::from(vec![-0.0, 0.0]))
        }
        DataType::Float32 if values.as_primitive::<Float32Type>().values().contains(&0.0) => {
            Arc::new(Float32Array::from(vec![-0.0f32, 0.0]))
        }
        // A half-float list is not made (none of the scans reads them).
        DataType::Float16 => return None,
        _ => return Some(values),
    };
    concat(&[values.as_ref(), zeros.as_ref()]).ok()
}

/// The GPU hash join's end of a dynamic filter: collects the summaries of
/// the build sides it expects (one in `CollectLeft` mode, one per
/// partition in `Partitioned` mode), and when the last arrives, publishes
/// the filter of their union (a probe row matches a build row of some
/// partition, so the union keeps every row that can match) and marks it
/// complete.
#[derive(Debug)]
pub(crate) struct ProbeFilterPublisher {
    filter: Arc<DynamicFilterPhysicalExpr>,
    probe_keys: Vec<PhysicalExprRef>,
    probe_schema: SchemaRef,
    /// `NOT IN`: every probe NULL must reach the join.
    null_aware: bool,
    /// NULL keys match: probe NULLs must reach a build side that has one.
    null_equal: bool,
    limits: MembershipLimits,
    pending: Mutex<Pending>,
}

#[derive(Debug)]
struct Pending {
    build_sides_left: usize,
    summary: Option<BuildKeySummary>,
}

impl ProbeFilterPublisher {
    /// The publisher of `join`'s dynamic filter: `None` where DataFusion
    /// gave the join none, the session turned join filters off, or no node
    /// of the probe side holds the filter (nothing would read it).
    pub(crate) fn for_join(join: &HashJoinExec, config: &ConfigOptions) -> Option<Self> {
        if !config.optimizer.enable_join_dynamic_filter_pushdown {
            return None;
        }
        let filter = dynamic_filter_of(join)?;
        let id = filter.expression_id()?;
        if !plan_holds_expression(join.right(), id) {
            return None;
        }
        let build_sides = match join.partition_mode() {
            PartitionMode::Partitioned => join
                .left()
                .properties()
                .output_partitioning()
                .partition_count(),
            _ => 1,
        };
        Some(Self {
            filter,
            probe_keys: join.on().iter().map(|(_, probe)| Arc::clone(probe)).collect(),
            probe_schema: join.right().schema(),
            null_aware: join.null_aware,
            null_equal: join.null_equality() == NullEquality::NullEqualsNull,
            limits: MembershipLimits {
                max_values: config.optimizer.hash_join_inlist_pushdown_max_distinct_values,
                max_bytes: config.optimizer.hash_join_inlist_pushdown_max_size,
            },
            pending: Mutex::new(Pending {
                build_sides_left: build_sides.max(1),
                summary: None,
            }),
        })
    }

    /// Whether a scan of `probe` (the join's probe side) prunes what it
    /// reads by the filter: a node holds it other than below a GPU scan,
    /// which reads the device column cache (its input, which holds the
    /// filter, is read only where it falls back). A probe side read before
    /// the filter is there loses that pruning, and only that.
    pub(crate) fn prunes_the_probe_side(&self, probe: &Arc<dyn ExecutionPlan>) -> bool {
        self.filter
            .expression_id()
            .is_none_or(|id| plan_holds_expression_above(probe, id, &reads_the_column_cache))
    }

    /// How many build key values the filter may list.
    pub(crate) fn limits(&self) -> MembershipLimits {
        self.limits
    }

    /// Adds one build side's summary; the last one publishes. A filter that
    /// cannot be made leaves the placeholder: it prunes nothing, and the
    /// join's answer does not depend on it.
    pub(crate) fn report(&self, summary: BuildKeySummary) {
        let summary = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.build_sides_left == 0 {
                return;
            }
            pending.build_sides_left -= 1;
            let merged = match pending.summary.take() {
                Some(earlier) => earlier.union(summary, self.limits),
                None => summary,
            };
            if pending.build_sides_left > 0 {
                pending.summary = Some(merged);
                return;
            }
            merged
        };
        let keep_null_keys = self.null_aware || (self.null_equal && summary.has_null);
        match summary.predicate(&self.probe_keys, &self.probe_schema, keep_null_keys) {
            Ok(Some(predicate)) => {
                trace::event(|| format!("hash join: probe filter {predicate}"));
                if let Err(e) = self.filter.update(predicate) {
                    trace::event(|| format!("hash join: probe filter not published: {e}"));
                }
            }
            Ok(None) => {}
            Err(e) => trace::event(|| format!("hash join: probe filter not made: {e}")),
        }
        self.filter.mark_complete();
    }
}

#[cfg(test)]
#[path = "probe_filter_tests.rs"]
mod tests;
