//! The part of a filter of the groups (a `HAVING` the node runs, see
//! [`super::GpuAggregateExec::with_output_filter`]) that the device tests
//! before the groups come back: each term of the filter's conjunction that
//! compares an aggregate's integer or decimal value with a constant of its
//! type (`sum(l_quantity) > 300`, `count(*) >= 2`). The groups that fail
//! one stay on the device; the filter itself still runs over the rows that
//! come back, so terms the device cannot test are left to it alone.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::split_conjunction;
use datafusion::physical_expr::PhysicalExpr;

use super::reductions::DeviceWork;
use super::spec::GpuAggregate;
use crate::gpu::launch::CompareOp;
use crate::ops::group_by::GroupComparison;

/// The comparisons of `predicate` (over the final output `schema`: the
/// group keys, then one column per aggregate of `aggregates`) the device
/// can test on the results of `work`; empty where there are none.
pub(super) fn device_comparisons(
    predicate: &Arc<dyn PhysicalExpr>,
    schema: &Schema,
    aggregates: &[GpuAggregate],
    work: &DeviceWork,
) -> Vec<GroupComparison> {
    let Some(keys) = schema.fields().len().checked_sub(aggregates.len()) else {
        return Vec::new();
    };
    split_conjunction(predicate)
        .into_iter()
        .filter_map(|term| {
            let (column, op, constant) = column_compared(term.as_ref())?;
            let aggregate = column.index().checked_sub(keys)?;
            if !aggregates.get(aggregate)?.state_is_final_value {
                return None;
            }
            let field = schema.fields().get(column.index())?;
            if constant.data_type() != *field.data_type() {
                return None;
            }
            let (reduction, flip) = work.integer_state(aggregate)?;
            Some(GroupComparison {
                reduction,
                flip,
                op,
                constant: integer_value(constant)?,
            })
        })
        .collect()
}

/// `term` as a column compared with a constant, the column first.
fn column_compared(term: &dyn PhysicalExpr) -> Option<(&Column, CompareOp, &ScalarValue)> {
    let binary = term.downcast_ref::<BinaryExpr>()?;
    let op = match binary.op() {
        Operator::Eq => CompareOp::Eq,
        Operator::NotEq => CompareOp::NotEq,
        Operator::Lt => CompareOp::Lt,
        Operator::LtEq => CompareOp::LtEq,
        Operator::Gt => CompareOp::Gt,
        Operator::GtEq => CompareOp::GtEq,
        _ => return None,
    };
    let (left, right) = (binary.left().as_ref(), binary.right().as_ref());
    match (column(left), constant(right), constant(left), column(right)) {
        (Some(column), Some(value), _, _) => Some((column, op, value)),
        (_, _, Some(value), Some(column)) => Some((column, op.swapped(), value)),
        _ => None,
    }
}

fn column(expr: &dyn PhysicalExpr) -> Option<&Column> {
    expr.downcast_ref::<Column>()
}

fn constant(expr: &dyn PhysicalExpr) -> Option<&ScalarValue> {
    expr.downcast_ref::<Literal>().map(Literal::value)
}

/// A non-NULL signed integer, date, time or decimal constant as the
/// integer the device holds (a decimal unscaled); `None` for any other.
fn integer_value(value: &ScalarValue) -> Option<i128> {
    use ScalarValue::*;
    Some(match value {
        Int8(Some(v)) => i128::from(*v),
        Int16(Some(v)) => i128::from(*v),
        Int32(Some(v)) => i128::from(*v),
        Int64(Some(v)) => i128::from(*v),
        Date32(Some(v)) => i128::from(*v),
        Date64(Some(v)) => i128::from(*v),
        Decimal128(Some(v), _, _) => *v,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::words::SIGN;
    use crate::exec::aggregate::spec::gpu_aggregate;
    use datafusion::arrow::array::{ArrayRef, Decimal128Array, Float64Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
    use datafusion::functions_aggregate::average::avg_udaf;
    use datafusion::functions_aggregate::count::count_udaf;
    use datafusion::functions_aggregate::min_max::min_udaf;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::logical_expr::AggregateUDF;
    use datafusion::physical_expr::aggregate::AggregateExprBuilder;
    use datafusion::physical_expr::expressions::col;

    fn compared(column: usize, op: Operator, value: ScalarValue) -> Arc<dyn PhysicalExpr> {
        let column = Arc::new(Column::new("c", column)) as Arc<dyn PhysicalExpr>;
        let value = Arc::new(Literal::new(value)) as Arc<dyn PhysicalExpr>;
        Arc::new(BinaryExpr::new(column, op, value))
    }

    fn swapped(value: ScalarValue, op: Operator, column: usize) -> Arc<dyn PhysicalExpr> {
        let column = Arc::new(Column::new("c", column)) as Arc<dyn PhysicalExpr>;
        let value = Arc::new(Literal::new(value)) as Arc<dyn PhysicalExpr>;
        Arc::new(BinaryExpr::new(value, op, column))
    }

    fn all(terms: Vec<Arc<dyn PhysicalExpr>>) -> Arc<dyn PhysicalExpr> {
        terms
            .into_iter()
            .reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)))
            .unwrap()
    }

    #[test]
    fn terms_comparing_an_integer_or_decimal_aggregate_with_a_constant_go_to_the_device() {
        let input: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
            Field::new("d", DataType::Decimal128(15, 2), true),
            Field::new("f", DataType::Float64, true),
        ]));
        let over = |function: Arc<AggregateUDF>, column: &str| {
            let expr = AggregateExprBuilder::new(function, vec![col(column, &input).unwrap()])
                .schema(Arc::clone(&input))
                .alias(format!("a_{column}"))
                .build()
                .unwrap();
            gpu_aggregate(&Arc::new(expr), false, &input).unwrap()
        };
        // Output: k, then sum(v), count(v), avg(d), min(v), sum(f), sum(d).
        let aggregates = vec![
            over(sum_udaf(), "v"),
            over(count_udaf(), "v"),
            over(avg_udaf(), "d"),
            over(min_udaf(), "v"),
            over(sum_udaf(), "f"),
            over(sum_udaf(), "d"),
        ];
        let mut fields = vec![Field::new("k", DataType::Int64, true)];
        fields.extend(aggregates.iter().map(|a| a.expr.field().as_ref().clone()));
        let output = Schema::new(fields);
        let v: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(-3)]));
        let d: ArrayRef = Arc::new(
            Decimal128Array::from(vec![Some(100), Some(-250), None])
                .with_precision_and_scale(15, 2)
                .unwrap(),
        );
        let f: ArrayRef = Arc::new(Float64Array::from(vec![1.5, 2.0, -0.5]));
        let mut work = DeviceWork::new(false);
        for (aggregate, column) in aggregates.iter().zip([&v, &v, &d, &v, &f, &d]) {
            work.add(aggregate, false, vec![vec![Arc::clone(column)]], None, true)
                .unwrap();
        }
        let decimal = |v: i128| ScalarValue::Decimal128(Some(v), 25, 2);
        let predicate = all(vec![
            compared(1, Operator::Gt, ScalarValue::Int64(Some(10))),
            swapped(ScalarValue::Int64(Some(3)), Operator::LtEq, 2),
            compared(3, Operator::Gt, ScalarValue::Decimal128(Some(1), 19, 6)),
            compared(4, Operator::NotEq, ScalarValue::Int64(Some(-7))),
            compared(5, Operator::Gt, ScalarValue::Float64(Some(1.0))),
            compared(6, Operator::Lt, decimal(-50_000)),
            // Not tested on the device: a key, a disjunction, a constant of
            // another type, NULL, an operator that does not compare.
            compared(0, Operator::Eq, ScalarValue::Int64(Some(1))),
            Arc::new(BinaryExpr::new(
                compared(1, Operator::Gt, ScalarValue::Int64(Some(1))),
                Operator::Or,
                compared(2, Operator::Gt, ScalarValue::Int64(Some(1))),
            )),
            compared(1, Operator::Gt, ScalarValue::Int32(Some(1))),
            compared(1, Operator::Gt, ScalarValue::Int64(None)),
            compared(1, Operator::IsDistinctFrom, ScalarValue::Int64(Some(1))),
        ]);
        let comparisons = device_comparisons(&predicate, &output, &aggregates, &work);
        let reduction = |aggregate: usize| work.integer_state(aggregate).unwrap().0;
        let expected = [
            (reduction(0), 0, CompareOp::Gt, 10),
            (reduction(1), 0, CompareOp::GtEq, 3),
            (reduction(3), SIGN, CompareOp::NotEq, -7),
            (reduction(5), 0, CompareOp::Lt, -50_000),
        ]
        .map(|(reduction, flip, op, constant)| GroupComparison {
            reduction,
            flip,
            op,
            constant,
        });
        assert_eq!(comparisons, expected.to_vec());
        // AVG (two states) and a float SUM have no integer state.
        assert_eq!(work.integer_state(2), None);
        assert_eq!(work.integer_state(4), None);
        // Without as many columns as aggregates, nothing.
        let too_few = Schema::new(vec![Field::new("k", DataType::Int64, true)]);
        assert!(device_comparisons(&predicate, &too_few, &aggregates, &work).is_empty());
    }
}
