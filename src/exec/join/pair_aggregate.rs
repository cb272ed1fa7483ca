//! A partial aggregation without `GROUP BY` computed from a join's pairs:
//! the `AggregateExec` in `Partial` mode right above an inner join without
//! a residual filter, as in `SELECT count(*), sum(r.v) FROM r JOIN s ON
//! r.k = s.k`. Each aggregated column is gathered by the pairs on the
//! device and reduced there (see
//! [`crate::exec::join::device_gather::reduce_pairs`]), so one word per aggregate
//! comes back instead of every output row: the join's output never crosses
//! the bus, is never assembled on the host, and is never read again by the
//! CPU aggregation.
//!
//! The words are merged into DataFusion's own accumulators as partial
//! states, and the node emits what the replaced `AggregateExec` would: one
//! row of states per partition, for the `Final` aggregation above. A range
//! of pairs whose columns are not all on the device (a side with NULLs,
//! pairs checked on the host) is assembled into output batches as before
//! and fed to the same accumulators, so every path gives DataFusion's
//! answer.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, ArrayData, ArrayRef, Int64Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::ExecutionPlan;

use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use datafusion::common::JoinType;

use crate::exec::aggregate::{aggregate_kind, AggregateKind, ValueKind};
use crate::exec::join::matches::gathers_by_pair;
use crate::exec::join::ColumnSource;
use crate::gpu::launch::{AggregateOp, GatheredValues};

/// What the device computes for one aggregate function over a range of
/// pairs. Columns are indices into the join's output schema (the
/// aggregation's input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PairReduction {
    /// `COUNT` of a non-NULL literal (`COUNT(*)`): every pair.
    CountPairs,
    /// `COUNT` of a column: every pair, where the column is on the device
    /// (columns with NULLs never are).
    CountColumn(usize),
    /// `SUM` (wrapping), `MIN` or `MAX` of a column of 4- or 8-byte
    /// integers (or a type stored as one), each value read as `values`
    /// says and XORed with `flip` so that signed values compare as unsigned
    /// words.
    Fold {
        column: usize,
        op: AggregateOp,
        flip: u64,
        values: GatheredValues,
    },
    /// `SUM` of a `Float64` column, in the order the device's atomics add.
    SumF64(usize),
}

impl PairReduction {
    /// The output column the device reads, if any.
    pub(crate) fn column(self) -> Option<usize> {
        match self {
            PairReduction::CountPairs => None,
            PairReduction::CountColumn(column)
            | PairReduction::Fold { column, .. }
            | PairReduction::SumF64(column) => Some(column),
        }
    }
}

/// The partial aggregation computed by a join node: the replaced
/// `AggregateExec` and what the device computes for each of its functions.
#[derive(Debug)]
pub(crate) struct PairAggregate {
    /// The `AggregateExec` (`Partial`, no `GROUP BY`) over the CPU join.
    aggregate: Arc<dyn ExecutionPlan>,
    reductions: Vec<PairReduction>,
}

/// Checks that a join of `join_type` (with a residual filter where
/// `has_filter`) can compute an aggregation from its pairs: only an inner
/// join without a filter emits exactly one row per pair.
pub(crate) fn check_join_emits_pairs(join_type: JoinType, has_filter: bool) -> Result<()> {
    if gathers_by_pair(join_type, has_filter) {
        return Ok(());
    }
    Err(DataFusionError::Plan(format!(
        "a {join_type} join{} does not emit one row per pair",
        if has_filter { " with a filter" } else { "" }
    )))
}

/// Whether the aggregation `node` can be computed from the pairs of a join
/// below it ([`PairAggregate::try_new`]).
pub(crate) fn folds_pairs_below(node: &Arc<dyn ExecutionPlan>, deterministic_float_sums: bool) -> bool {
    PairAggregate::try_new(node, deterministic_float_sums).is_ok()
}

impl PairAggregate {
    /// The aggregation `node` computed from the pairs of the join below it,
    /// or why it cannot be: it must be a `Partial` `AggregateExec` without
    /// `GROUP BY`, `FILTER`, `DISTINCT` or `ORDER BY`, whose functions are
    /// `COUNT`, `SUM`, `MIN` and `MAX` of output columns of types the
    /// device reduces (with `deterministic_float_sums`, a `Float64` sum
    /// stays with the CPU aggregation, whose order of additions the device
    /// would not keep either).
    pub(crate) fn try_new(
        node: &Arc<dyn ExecutionPlan>,
        deterministic_float_sums: bool,
    ) -> Result<Self, String> {
        let agg = node
            .downcast_ref::<AggregateExec>()
            .ok_or_else(|| format!("{} is not an AggregateExec", node.name()))?;
        if *agg.mode() != AggregateMode::Partial {
            return Err(format!("a {:?} aggregation", agg.mode()));
        }
        if !agg.group_expr().is_empty() {
            return Err("an aggregation with GROUP BY".into());
        }
        if agg.filter_expr().iter().any(Option::is_some) {
            return Err("an aggregate with FILTER".into());
        }
        let input_schema = agg.input().schema();
        let reductions = agg
            .aggr_expr()
            .iter()
            .map(|expr| reduction_of(expr, &input_schema, deterministic_float_sums))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            aggregate: Arc::clone(node),
            reductions,
        })
    }

    /// The replaced `AggregateExec`.
    pub(crate) fn aggregate(&self) -> &Arc<dyn ExecutionPlan> {
        &self.aggregate
    }

    /// The same aggregation over a new join (`with_new_children`).
    pub(crate) fn over(&self, cpu_join: Arc<dyn ExecutionPlan>) -> Result<Self> {
        #[allow(deprecated)]
        let aggregate = Arc::clone(&self.aggregate).with_new_children(vec![cpu_join])?;
        Ok(Self {
            aggregate,
            reductions: self.reductions.clone(),
        })
    }

    fn aggregate_exec(&self) -> &AggregateExec {
        self.aggregate
            .downcast_ref::<AggregateExec>()
            .expect("checked in try_new")
    }

    /// What the device computes, one entry per aggregate function.
    pub(crate) fn reductions(&self) -> &[PairReduction] {
        &self.reductions
    }

    /// Of the columns of each side that the join's output uses (`build`
    /// and `probe`, or left and right, as `sources` names them), those
    /// that a reduction reads: the only ones worth putting on the device.
    pub(crate) fn columns_read(
        &self,
        sources: &[ColumnSource],
        build: Vec<bool>,
        probe: Vec<bool>,
    ) -> (Vec<bool>, Vec<bool>) {
        let mut read = [vec![false; build.len()], vec![false; probe.len()]];
        for position in self.reductions.iter().filter_map(|r| r.column()) {
            let slot = match sources.get(position) {
                Some(ColumnSource::Build(i)) => read[0].get_mut(*i),
                Some(ColumnSource::Probe(i)) => read[1].get_mut(*i),
                _ => None,
            };
            if let Some(slot) = slot {
                *slot = true;
            }
        }
        let [build_read, probe_read] = read;
        let both = |wanted: Vec<bool>, read: Vec<bool>| -> Vec<bool> {
            wanted.iter().zip(read).map(|(&w, r)| w && r).collect()
        };
        (both(build, build_read), both(probe, probe_read))
    }

    /// The partial states of every row of `rows` (the join's output, made
    /// by DataFusion's own join where the device could not take it), as one
    /// batch once `rows` ends: what the replaced `AggregateExec` emits.
    pub(crate) fn over_rows(&self, rows: SendableRecordBatchStream) -> SendableRecordBatchStream {
        let states = self.start();
        let folded = futures::stream::once(async move {
            let mut states = states?;
            let mut rows = rows;
            while let Some(batch) = rows.next().await {
                states.update(&batch?)?;
            }
            states.finish()
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema(), folded))
    }

    /// The functions as `EXPLAIN` shows them.
    pub(crate) fn functions_text(&self) -> String {
        self.aggregate_exec()
            .aggr_expr()
            .iter()
            .map(|expr| expr.name().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The output schema: the partial states.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.aggregate.schema()
    }

    /// Fresh accumulators for one partition.
    pub(crate) fn start(&self) -> Result<PartialStates> {
        let exprs = self.aggregate_exec().aggr_expr().to_vec();
        let accumulators = exprs
            .iter()
            .map(|expr| expr.create_accumulator())
            .collect::<Result<Vec<_>>>()?;
        Ok(PartialStates {
            exprs,
            reductions: self.reductions.clone(),
            accumulators,
            schema: self.schema(),
        })
    }
}

fn reduction_of(
    expr: &Arc<AggregateFunctionExpr>,
    input_schema: &SchemaRef,
    deterministic_float_sums: bool,
) -> Result<PairReduction, String> {
    let name = expr.name();
    let kind = aggregate_kind(expr).ok_or_else(|| format!("{name} is not reduced over pairs"))?;
    if expr.is_distinct() || !expr.order_bys().is_empty() {
        return Err(format!("{name} with DISTINCT or ORDER BY"));
    }
    let args = expr.expressions();
    let [arg] = args.as_slice() else {
        return Err(format!("{name} with {} arguments", args.len()));
    };
    let states = expr.state_fields().map_err(|e| e.to_string())?;
    let [state] = states.as_slice() else {
        return Err(format!("{name} with {} state fields", states.len()));
    };
    let state_type = state.data_type();
    let column = arg.downcast_ref::<Column>().map(Column::index);
    let arg_type = arg.data_type(input_schema).map_err(|e| e.to_string())?;
    let unsupported = || Err(format!("{name} over {arg_type} is not reduced over pairs"));
    if kind == AggregateKind::Count {
        return match (arg.downcast_ref::<Literal>(), column) {
            _ if *state_type != DataType::Int64 => unsupported(),
            (Some(literal), _) if !literal.value().is_null() => Ok(PairReduction::CountPairs),
            (_, Some(column)) => Ok(PairReduction::CountColumn(column)),
            _ => unsupported(),
        };
    }
    // Each state below is one value of the argument's own type.
    if *state_type != arg_type {
        return unsupported();
    }
    let op = match kind {
        AggregateKind::Sum => AggregateOp::Sum,
        AggregateKind::Min => AggregateOp::Min,
        AggregateKind::Max => AggregateOp::Max,
        AggregateKind::Count | AggregateKind::Avg => return unsupported(),
    };
    if op == AggregateOp::Sum {
        if arg_type == DataType::Float64 {
            return match column {
                Some(column) if !deterministic_float_sums => Ok(PairReduction::SumF64(column)),
                _ => unsupported(),
            };
        }
        // A wrapping sum of 8-byte integers: a column of them, or one of
        // 4-byte integers widened by a cast (how DataFusion sums an Int32
        // column into an Int64).
        if !matches!(arg_type, DataType::Int64 | DataType::UInt64) {
            return unsupported();
        }
        return match widened_column(arg, input_schema, &arg_type) {
            Some((column, values)) => Ok(PairReduction::Fold {
                column,
                op,
                flip: 0,
                values,
            }),
            None => unsupported(),
        };
    }
    // MIN and MAX: a column of 4- or 8-byte integers (or a type stored as
    // one), each value XORed into a word whose unsigned order is its own.
    let Some(column) = column else {
        return unsupported();
    };
    let (flip, values) = match (ValueKind::of(&arg_type), arg_type.primitive_width()) {
        (Some(ValueKind::Signed), Some(8)) => (1 << 63, GatheredValues::Eight),
        (Some(ValueKind::Signed), Some(4)) => (1 << 63, GatheredValues::FourSigned),
        (Some(ValueKind::Unsigned), Some(8)) => (0, GatheredValues::Eight),
        (Some(ValueKind::Unsigned), Some(4)) => (0, GatheredValues::FourUnsigned),
        // Float order is DataFusion's (NaN, -0.0), not the bits'; narrower
        // integers are not moved by the device gather.
        _ => return unsupported(),
    };
    Ok(PairReduction::Fold {
        column,
        op,
        flip,
        values,
    })
}

/// The column a SUM's argument of `sum_type` (Int64 or UInt64) reads, and
/// how its values become the sum's words: the column itself where it is of
/// that type, or a cast to it from a 4-byte integer column that widens
/// every value exactly (Int32 to Int64, UInt32 to Int64 or UInt64).
fn widened_column(
    arg: &Arc<dyn PhysicalExpr>,
    input_schema: &SchemaRef,
    sum_type: &DataType,
) -> Option<(usize, GatheredValues)> {
    if let Some(column) = arg.downcast_ref::<Column>() {
        return Some((column.index(), GatheredValues::Eight));
    }
    let cast = arg.downcast_ref::<CastExpr>()?;
    let column = cast.expr().downcast_ref::<Column>()?;
    let values = match (cast.expr().data_type(input_schema).ok()?, sum_type) {
        (DataType::Int32, DataType::Int64) => GatheredValues::FourSigned,
        (DataType::UInt32, DataType::Int64 | DataType::UInt64) => GatheredValues::FourUnsigned,
        _ => return None,
    };
    Some((column.index(), values))
}

/// One partition's accumulators of a [`PairAggregate`].
#[derive(Debug)]
pub(crate) struct PartialStates {
    exprs: Vec<Arc<AggregateFunctionExpr>>,
    reductions: Vec<PairReduction>,
    accumulators: Vec<Box<dyn Accumulator>>,
    schema: SchemaRef,
}

impl PartialStates {
    /// Adds the rows of `batch`, output rows of the join assembled on the
    /// host, as `AggregateExec` adds its input.
    pub(crate) fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        for (expr, accumulator) in self.exprs.iter().zip(&mut self.accumulators) {
            let values = expr
                .expressions()
                .iter()
                .map(|arg| arg.evaluate(batch)?.into_array(batch.num_rows()))
                .collect::<Result<Vec<_>>>()?;
            accumulator.update_batch(&values)?;
        }
        Ok(())
    }

    /// Merges the device's words for `pairs` pairs, one per reduction (see
    /// [`crate::exec::join::device_gather::reduce_pairs`]), as partial states.
    pub(crate) fn merge_device(&mut self, words: &[u64], pairs: usize) -> Result<()> {
        if words.len() != self.reductions.len() {
            return Err(DataFusionError::Internal(format!(
                "{} device results for {} aggregates",
                words.len(),
                self.reductions.len()
            )));
        }
        // No pairs: nothing to merge (a SUM of no rows stays NULL).
        if pairs == 0 {
            return Ok(());
        }
        for (i, accumulator) in self.accumulators.iter_mut().enumerate() {
            let state: ArrayRef = match self.reductions[i] {
                PairReduction::CountPairs | PairReduction::CountColumn(_) => {
                    Arc::new(Int64Array::from(vec![pairs as i64]))
                }
                PairReduction::Fold { flip, .. } => {
                    word_array(self.schema.field(i).data_type(), words[i] ^ flip)?
                }
                PairReduction::SumF64(_) => word_array(&DataType::Float64, words[i])?,
            };
            accumulator.merge_batch(&[state])?;
        }
        Ok(())
    }

    /// The partition's one row of partial states.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch> {
        let mut columns = Vec::with_capacity(self.schema.fields().len());
        for accumulator in &mut self.accumulators {
            for value in accumulator.state()? {
                columns.push(value.to_array()?);
            }
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}

/// A one-row array of the 4- or 8-byte type `data_type` holding `word`'s
/// low bits (a 4-byte value's word is it widened: its low half is the value).
fn word_array(data_type: &DataType, word: u64) -> Result<ArrayRef> {
    let width = data_type
        .primitive_width()
        .filter(|width| matches!(width, 4 | 8))
        .ok_or_else(|| {
            DataFusionError::Internal(format!("a device word as a value of {data_type}"))
        })?;
    let data = ArrayData::builder(data_type.clone())
        .len(1)
        .add_buffer(Buffer::from_slice_ref(&word.to_le_bytes()[..width]))
        .build()?;
    Ok(make_array(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Float64Array, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn words_become_one_value_arrays_of_the_state_type() {
        let array = word_array(&DataType::Int64, (-5i64) as u64).unwrap();
        assert_eq!(array.len(), 1);
        assert_eq!(
            array
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0),
            -5
        );
        let array = word_array(&DataType::Float64, 2.5f64.to_bits()).unwrap();
        assert_eq!(
            array
                .as_any()
                .downcast_ref::<Float64Array>()
                .unwrap()
                .value(0),
            2.5
        );
        let zone = Some(Arc::from("+01:00"));
        let array =
            word_array(&DataType::Timestamp(TimeUnit::Millisecond, zone.clone()), 7).unwrap();
        let timestamps = array
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(timestamps.value(0), 7);
        assert_eq!(timestamps.timezone(), Some("+01:00"));
    }

    /// `function(arg)` over the columns i: Int32, u: UInt32, h: Int16,
    /// l: Int64, d: Date32, f: Float64, as the join's pairs reduce it.
    fn reduction(
        function: Arc<datafusion::logical_expr::AggregateUDF>,
        arg: impl Fn(&SchemaRef) -> Arc<dyn PhysicalExpr>,
    ) -> Result<PairReduction, String> {
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::physical_expr::aggregate::AggregateExprBuilder;
        let schema: SchemaRef = Arc::new(Schema::new(
            [
                ("i", DataType::Int32),
                ("u", DataType::UInt32),
                ("h", DataType::Int16),
                ("l", DataType::Int64),
                ("d", DataType::Date32),
                ("f", DataType::Float64),
            ]
            .map(|(name, data_type)| Field::new(name, data_type, false))
            .to_vec(),
        ));
        let expr = AggregateExprBuilder::new(function, vec![arg(&schema)])
            .schema(Arc::clone(&schema))
            .alias("x")
            .build()
            .unwrap();
        reduction_of(&Arc::new(expr), &schema, false)
    }

    #[test]
    fn four_byte_columns_reduce_widened_and_narrower_ones_stay_on_the_host() {
        use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
        use datafusion::functions_aggregate::sum::sum_udaf;
        use datafusion::physical_expr::expressions::{cast, col};
        let column = |name: &'static str| move |s: &SchemaRef| col(name, s).unwrap();
        let cast_to = |name: &'static str, to: DataType| {
            move |s: &SchemaRef| cast(col(name, s).unwrap(), s, to.clone()).unwrap()
        };
        let fold = |column, op, flip, values| {
            Ok(PairReduction::Fold {
                column,
                op,
                flip,
                values,
            })
        };
        // SUM(i), as DataFusion plans it: a cast to Int64, sign-extended.
        assert_eq!(
            reduction(sum_udaf(), cast_to("i", DataType::Int64)),
            fold(0, AggregateOp::Sum, 0, GatheredValues::FourSigned)
        );
        assert_eq!(
            reduction(sum_udaf(), cast_to("u", DataType::UInt64)),
            fold(1, AggregateOp::Sum, 0, GatheredValues::FourUnsigned)
        );
        assert_eq!(
            reduction(sum_udaf(), column("l")),
            fold(3, AggregateOp::Sum, 0, GatheredValues::Eight)
        );
        assert_eq!(
            reduction(min_udaf(), column("i")),
            fold(0, AggregateOp::Min, 1 << 63, GatheredValues::FourSigned)
        );
        assert_eq!(
            reduction(max_udaf(), column("u")),
            fold(1, AggregateOp::Max, 0, GatheredValues::FourUnsigned)
        );
        assert_eq!(
            reduction(max_udaf(), column("d")),
            fold(4, AggregateOp::Max, 1 << 63, GatheredValues::FourSigned)
        );
        // Two-byte values are not gathered on the device, and a cast that
        // is not an exact widening is the CPU's to evaluate.
        assert!(reduction(sum_udaf(), cast_to("h", DataType::Int64)).is_err());
        assert!(reduction(min_udaf(), column("h")).is_err());
        assert!(reduction(sum_udaf(), cast_to("f", DataType::Int64)).is_err());
        assert!(reduction(max_udaf(), column("f")).is_err());
    }

    #[test]
    fn four_byte_words_become_their_low_halves() {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::{Date32Type, Int32Type, UInt32Type};
        let array = word_array(&DataType::Int32, (-5i64) as u64).unwrap();
        assert_eq!(array.as_primitive::<Int32Type>().value(0), -5);
        let array = word_array(&DataType::UInt32, u64::from(u32::MAX)).unwrap();
        assert_eq!(array.as_primitive::<UInt32Type>().value(0), u32::MAX);
        let array = word_array(&DataType::Date32, (-719_162i64) as u64).unwrap();
        assert_eq!(array.as_primitive::<Date32Type>().value(0), -719_162);
        assert!(word_array(&DataType::Int16, 1).is_err());
    }

    #[test]
    fn reductions_name_the_column_they_read() {
        assert_eq!(PairReduction::CountPairs.column(), None);
        assert_eq!(PairReduction::CountColumn(2).column(), Some(2));
        assert_eq!(PairReduction::SumF64(1).column(), Some(1));
        let fold = PairReduction::Fold {
            column: 3,
            op: AggregateOp::Max,
            flip: 1 << 63,
            values: GatheredValues::Eight,
        };
        assert_eq!(fold.column(), Some(3));
    }
}
