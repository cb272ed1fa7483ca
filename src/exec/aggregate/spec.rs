//! Which `AggregateExec` nodes the GPU can run, decided from the plan alone.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef, SchemaRef};
use datafusion::common::NullEquality;
use datafusion::functions_aggregate::average::Avg;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::min_max::{Max, Min};
use datafusion::functions_aggregate::sum::Sum;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode};
use datafusion::arrow::compute::SortOptions;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode};

use crate::encode::keys::KeySpec;
pub(crate) use crate::encode::words::ValueKind;

/// An aggregate function the GPU computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggregateKind {
    /// `COUNT(x)`, `COUNT(*)`.
    Count,
    /// `SUM(x)`.
    Sum,
    /// `MIN(x)`.
    Min,
    /// `MAX(x)`.
    Max,
    /// `AVG(x)`.
    Avg,
}

/// The order groups leave a `GpuAggregateExec` in, where it replaced a
/// sort on its group keys.
#[derive(Debug, Clone)]
pub(crate) struct GroupOrder {
    /// The sort it replaced, over the node's output columns.
    pub(crate) ordering: LexOrdering,
    /// Group expression indexes, most significant first, each with its
    /// direction and NULL placement: the sort's keys, then the group keys
    /// it left out (ascending), so that equal codes are equal groups.
    pub(crate) keys: Vec<(usize, SortOptions)>,
}

/// One aggregate expression as the GPU computes it: its function, the type
/// of each of its input columns (the argument, or the partial states), and
/// the DataFusion expression whose accumulator finishes it on the host.
#[derive(Debug, Clone)]
pub(crate) struct GpuAggregate {
    pub(crate) kind: AggregateKind,
    /// Value kind of each input column.
    pub(crate) inputs: Vec<Option<ValueKind>>,
    /// The state fields, in DataFusion's order and types.
    pub(crate) state_fields: Vec<FieldRef>,
    /// Whether the final value is the one state column as it is: the
    /// function's accumulator, fed one state per group, would hand back
    /// the same array ([`state_is_final_value`]).
    pub(crate) state_is_final_value: bool,
    pub(crate) expr: Arc<AggregateFunctionExpr>,
}

/// Everything the GPU needs to know about an `AggregateExec`.
#[derive(Debug, Clone)]
pub(crate) struct AggregateSpec {
    /// Whether the inputs are partial states (Final, FinalPartitioned,
    /// PartialReduce) rather than raw rows.
    pub(crate) merges_states: bool,
    /// Group key types (empty for an aggregate without GROUP BY).
    pub(crate) keys: Option<KeySpec>,
    /// Whether the keys are hashed whatever their values (see
    /// `group_keys`): not every key packs, and they are not a single float
    /// column (its own word where it has no NULLs).
    pub(crate) keys_need_hashing: bool,
    pub(crate) aggregates: Vec<GpuAggregate>,
}

impl AggregateSpec {
    /// The spec of `agg`, or why the GPU cannot run it.
    pub(crate) fn try_new(agg: &AggregateExec) -> Result<Self, String> {
        if !agg.group_expr().is_single() {
            return Err("GROUPING SETS, ROLLUP and CUBE stay on the CPU".into());
        }
        if agg.limit_options().is_some() {
            return Err(
                "a grouped aggregation with a LIMIT pushed into it stays on the CPU".into(),
            );
        }
        if *agg.input_order_mode() != InputOrderMode::Linear {
            return Err("the aggregation streams over input sorted on its keys".into());
        }
        if agg.properties().output_ordering().is_some() {
            return Err("the aggregation's output ordering may be relied on above it".into());
        }
        let input_schema = agg.input().schema();
        let merges_states = agg.mode().input_mode() == AggregateInputMode::Partial;
        let keys = key_spec(agg, &input_schema)?;
        let aggregates = agg
            .aggr_expr()
            .iter()
            .zip(agg.filter_expr())
            .map(|(expr, filter)| {
                if merges_states && filter.is_some() {
                    return Err("a FILTER on merged partial states".to_string());
                }
                gpu_aggregate(expr, merges_states, &input_schema)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keys_need_hashing = keys.as_ref().is_some_and(|spec| {
            !spec.packable() && !matches!(spec.types(), [DataType::Float32 | DataType::Float64])
        });
        Ok(Self {
            merges_states,
            keys,
            keys_need_hashing,
            aggregates,
        })
    }
}

fn key_spec(agg: &AggregateExec, input_schema: &SchemaRef) -> Result<Option<KeySpec>, String> {
    let exprs = agg.group_expr().expr();
    if exprs.is_empty() {
        return Ok(None);
    }
    let types = exprs
        .iter()
        .map(|(expr, _)| expr.data_type(input_schema).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    // NULL is a group of its own: NULL keys compare equal. Keys that do not
    // pack are hashed and checked on the host (`group_keys`).
    let spec = KeySpec::try_new(&types, NullEquality::NullEqualsNull).map_err(|_| {
        let other = types
            .iter()
            .find(|t| {
                KeySpec::try_new(std::slice::from_ref(t), NullEquality::NullEqualsNull).is_err()
            })
            .map_or_else(|| format!("{types:?}"), |t| t.to_string());
        format!("group key type {other} is not supported on the GPU")
    })?;
    Ok(Some(spec))
}

/// The GPU's name for the function of `expr`, if it computes it.
pub(crate) fn aggregate_kind(expr: &AggregateFunctionExpr) -> Option<AggregateKind> {
    let function: &dyn Any = expr.fun().inner().as_ref();
    if function.is::<Count>() {
        Some(AggregateKind::Count)
    } else if function.is::<Sum>() {
        Some(AggregateKind::Sum)
    } else if function.is::<Min>() {
        Some(AggregateKind::Min)
    } else if function.is::<Max>() {
        Some(AggregateKind::Max)
    } else if function.is::<Avg>() {
        Some(AggregateKind::Avg)
    } else {
        None
    }
}

pub(super) fn gpu_aggregate(
    expr: &Arc<AggregateFunctionExpr>,
    merges_states: bool,
    input_schema: &SchemaRef,
) -> Result<GpuAggregate, String> {
    let name = expr.fun().name();
    let kind = aggregate_kind(expr)
        .ok_or_else(|| format!("aggregate function {name} is not supported on the GPU"))?;
    if expr.is_distinct() {
        return Err(format!("{name}(DISTINCT ...) is not supported on the GPU"));
    }
    if !expr.order_bys().is_empty() {
        return Err(format!("{name} with ORDER BY stays on the CPU"));
    }
    if !expr.groups_accumulator_supported() {
        return Err(format!(
            "{name} over these types has no grouped accumulator"
        ));
    }
    let state_fields = expr.state_fields().map_err(|e| e.to_string())?;
    let input_types: Vec<DataType> = if merges_states {
        state_fields.iter().map(|f| f.data_type().clone()).collect()
    } else {
        expr.expressions()
            .iter()
            .map(|e| e.data_type(input_schema).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?
    };
    let unsupported = |t: &DataType| Err(format!("{name} over {t} is not supported on the GPU"));
    let expected_inputs = if merges_states && kind == AggregateKind::Avg {
        2
    } else {
        1
    };
    if input_types.len() != expected_inputs {
        return Err(format!(
            "{name} with {} input columns is not supported on the GPU",
            input_types.len()
        ));
    }
    let mut inputs = Vec::with_capacity(input_types.len());
    for (i, data_type) in input_types.iter().enumerate() {
        let value = ValueKind::of(data_type);
        let fits = match (kind, merges_states, i) {
            // COUNT reads only validity; its state is an Int64 count.
            (AggregateKind::Count, false, _) => true,
            (AggregateKind::Count, true, _) => value == Some(ValueKind::Signed),
            (AggregateKind::Sum, ..) => {
                matches!(
                    data_type,
                    DataType::Int64 | DataType::UInt64 | DataType::Float64
                ) || value == Some(ValueKind::Decimal128)
            }
            // MIN and MAX over floats depend on the order rows arrive in
            // DataFusion (NaN and -0.0 compare neither less nor greater).
            (AggregateKind::Min | AggregateKind::Max, ..) => {
                value.is_some() && value != Some(ValueKind::Float64)
            }
            // AVG's partial count.
            (AggregateKind::Avg, true, 0) => *data_type == DataType::UInt64,
            (AggregateKind::Avg, ..) => {
                matches!(value, Some(ValueKind::Float64 | ValueKind::Decimal128))
            }
        };
        if !fits {
            return unsupported(data_type);
        }
        inputs.push(value);
    }
    // The device writes each state as words of a type it holds: a wider
    // state (AVG keeps its sum of a Decimal128 wider than 25 digits as
    // Decimal256) stays with DataFusion's accumulators. Checked after the
    // inputs, so that an input type the device cannot read is the reason.
    if let Some(state) = state_fields
        .iter()
        .find(|state| ValueKind::of(state.data_type()).is_none())
    {
        return Err(format!(
            "{name} keeps its state {} as {}, which the GPU does not make",
            state.name(),
            state.data_type()
        ));
    }
    let state_is_final_value = state_is_final_value(kind, &inputs, &state_fields, expr);
    Ok(GpuAggregate {
        kind,
        inputs,
        state_fields,
        state_is_final_value,
        expr: Arc::clone(expr),
    })
}

/// Whether merging one state per group into a fresh accumulator and
/// evaluating it returns the state unchanged, so a final aggregation can
/// emit the state column itself and skip two passes over its groups.
/// COUNT, MIN and MAX keep their value (or NULL) as their state; SUM too,
/// except over floats, where the accumulator's `0.0 + -0.0` turns a
/// negative zero positive. The state's type must be the result's.
fn state_is_final_value(
    kind: AggregateKind,
    inputs: &[Option<ValueKind>],
    state_fields: &[FieldRef],
    expr: &AggregateFunctionExpr,
) -> bool {
    let identity = match kind {
        AggregateKind::Count | AggregateKind::Min | AggregateKind::Max => true,
        AggregateKind::Sum => !inputs.contains(&Some(ValueKind::Float64)),
        AggregateKind::Avg => false,
    };
    identity && matches!(state_fields, [state] if state.data_type() == expr.field().data_type())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        ArrayRef, Decimal128Array, Float64Array, Int32Array, Int64Array, TimestampSecondArray,
        UInt64Array,
    };
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};
    use datafusion::functions_aggregate::average::avg_udaf;
    use datafusion::functions_aggregate::count::count_udaf;
    use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::logical_expr::{AggregateUDF, EmitTo};
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;

    /// `function(a)` over a column `a` of `data_type`, as the GPU sees it.
    fn aggregate(function: Arc<AggregateUDF>, data_type: DataType) -> GpuAggregate {
        let schema = Arc::new(Schema::new(vec![Field::new("a", data_type, true)]));
        let expr = AggregateExprBuilder::new(function, vec![col("a", &schema).unwrap()])
            .schema(Arc::clone(&schema))
            .alias("x")
            .build()
            .unwrap();
        gpu_aggregate(&Arc::new(expr), false, &schema).unwrap()
    }

    /// A state column of `aggregate` with a NULL (where the state may be
    /// NULL), a negative value and a large one.
    fn state_column(aggregate: &GpuAggregate) -> ArrayRef {
        match aggregate.state_fields[0].data_type() {
            DataType::Int64 if aggregate.kind == AggregateKind::Count => {
                Arc::new(Int64Array::from(vec![0, 3, i64::MAX]))
            }
            DataType::Int64 => Arc::new(Int64Array::from(vec![None, Some(-7), Some(i64::MAX)])),
            DataType::Int32 => Arc::new(Int32Array::from(vec![None, Some(-7), Some(i32::MAX)])),
            DataType::UInt64 => Arc::new(UInt64Array::from(vec![None, Some(0), Some(u64::MAX)])),
            DataType::Float64 => Arc::new(Float64Array::from(vec![None, Some(-0.0), Some(1.5)])),
            DataType::Timestamp(TimeUnit::Second, zone) => Arc::new(
                TimestampSecondArray::from(vec![None, Some(-7), Some(1 << 40)])
                    .with_timezone_opt(zone.clone()),
            ),
            DataType::Decimal128(precision, scale) => Arc::new(
                Decimal128Array::from(vec![None, Some(-12_345), Some(10i128.pow(20))])
                    .with_precision_and_scale(*precision, *scale)
                    .unwrap(),
            ),
            other => panic!("no test state for {other}"),
        }
    }

    #[test]
    fn a_state_is_emitted_as_the_final_value_only_where_the_accumulator_keeps_it() {
        let zoned = DataType::Timestamp(TimeUnit::Second, Some("+02:00".into()));
        let cases = [
            (count_udaf(), DataType::Int32, true),
            (min_udaf(), DataType::Int32, true),
            (max_udaf(), DataType::Int64, true),
            (max_udaf(), zoned.clone(), true),
            (min_udaf(), DataType::Decimal128(12, 2), true),
            (sum_udaf(), DataType::Int64, true),
            (sum_udaf(), DataType::UInt64, true),
            (sum_udaf(), DataType::Decimal128(12, 2), true),
            // 0.0 + -0.0 is 0.0: the accumulator does not keep a float sum.
            (sum_udaf(), DataType::Float64, false),
            // AVG's state is a count and a sum.
            (avg_udaf(), DataType::Float64, false),
        ];
        for (function, data_type, expected) in cases {
            let name = format!("{}({data_type})", function.name());
            let aggregate = aggregate(function, data_type);
            assert_eq!(aggregate.state_is_final_value, expected, "{name}");
            if !expected {
                continue;
            }
            // What the shortcut skips: one state per group merged into a
            // fresh accumulator, then evaluated.
            let state = state_column(&aggregate);
            let groups = state.len();
            let mut accumulator = aggregate.expr.create_groups_accumulator().unwrap();
            accumulator
                .merge_batch(
                    std::slice::from_ref(&state),
                    &(0..groups).collect::<Vec<_>>(),
                    groups,
                )
                .unwrap();
            let evaluated = accumulator.evaluate(EmitTo::All).unwrap();
            assert_eq!(evaluated.to_data(), state.to_data(), "{name}");
        }
    }

    #[test]
    fn an_aggregate_whose_state_the_device_cannot_make_stays_on_the_cpu() {
        // AVG sums a Decimal128 with 13 digits to spare: up to 25 digits
        // that is a Decimal128(38); wider, a Decimal256, on the CPU. SUM
        // keeps a Decimal128 at any precision.
        let schema_of = |data_type: DataType| Arc::new(Schema::new(vec![Field::new("a", data_type, true)]));
        for (function, data_type, on_gpu) in [
            (avg_udaf(), DataType::Decimal128(15, 2), true),
            (avg_udaf(), DataType::Decimal128(25, 0), true),
            (avg_udaf(), DataType::Decimal128(26, 0), false),
            (avg_udaf(), DataType::Decimal128(30, 2), false),
            (avg_udaf(), DataType::Decimal128(38, 0), false),
            (sum_udaf(), DataType::Decimal128(38, 0), true),
            (sum_udaf(), DataType::Decimal128(30, 2), true),
        ] {
            let name = format!("{}({data_type})", function.name());
            let schema = schema_of(data_type);
            let expr = AggregateExprBuilder::new(function, vec![col("a", &schema).unwrap()])
                .schema(Arc::clone(&schema))
                .alias("x")
                .build()
                .unwrap();
            let expr = Arc::new(expr);
            let states: Vec<DataType> = expr
                .state_fields()
                .unwrap()
                .iter()
                .map(|f| f.data_type().clone())
                .collect();
            match gpu_aggregate(&expr, false, &schema) {
                Ok(_) => assert!(on_gpu, "{name} (states {states:?}) planned on the GPU"),
                Err(reason) => {
                    assert!(!on_gpu, "{name} (states {states:?}) refused: {reason}");
                    assert!(reason.contains("Decimal256(76"), "{name}: {reason}");
                }
            }
        }
    }
}
