use datafusion::arrow::compute::CastOptions;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{binary, lit, TryCastExpr};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::prelude::SessionContext;

use super::*;

#[test]
fn only_columns_that_cannot_be_null_literals_and_their_failing_casts_never_give_null() {
    let schema = Schema::new(vec![
        Field::new("u", DataType::Int32, false),
        Field::new("v", DataType::Int32, true),
    ]);
    let u: Arc<dyn PhysicalExpr> = Arc::new(Column::new("u", 0));
    let v: Arc<dyn PhysicalExpr> = Arc::new(Column::new("v", 1));
    let cast = |expr: &Arc<dyn PhysicalExpr>, to: DataType, safe: bool| {
        let options = CastOptions {
            safe,
            ..Default::default()
        };
        Arc::new(CastExpr::new(Arc::clone(expr), to, Some(options))) as Arc<dyn PhysicalExpr>
    };
    assert!(never_null(&u, &schema));
    assert!(!never_null(&v, &schema));
    // As `sum(u)` and `avg(u)` are planned.
    assert!(never_null(&cast(&u, DataType::Int64, false), &schema));
    assert!(never_null(&cast(&u, DataType::Float64, false), &schema));
    assert!(!never_null(&cast(&v, DataType::Int64, false), &schema));
    // A cast that gives NULL where it cannot convert.
    assert!(!never_null(&cast(&u, DataType::Int8, true), &schema));
    let try_cast: Arc<dyn PhysicalExpr> =
        Arc::new(TryCastExpr::new(Arc::clone(&u), DataType::Int8));
    assert!(!never_null(&try_cast, &schema));
    // Computed arguments are not trusted, whatever they say.
    let modulo = binary(Arc::clone(&u), Operator::Modulo, lit(7i32), &schema).unwrap();
    assert!(!modulo.nullable(&schema).unwrap());
    assert!(!never_null(&modulo, &schema));
    // A column past the schema's end.
    assert!(!never_null(&(Arc::new(Column::new("w", 2)) as _), &schema));
    // Literals: `count(*)` is planned as `count(1)`.
    assert!(never_null(&lit(1i64), &schema));
    assert!(!never_null(&lit(ScalarValue::Int64(None)), &schema));
}

/// Every argument of the aggregates as DataFusion plans them over
/// columns that cannot be NULL (`count(*)` as a literal, `sum` and
/// `avg` of a narrow integer over a cast) never gives NULL, so their
/// inputs may be prepared while the keys cross the bus.
#[tokio::test]
async fn the_planned_arguments_of_aggregates_over_columns_without_null_never_give_null() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("u", DataType::UInt32, false),
        Field::new("x", DataType::Int64, false),
        Field::new("big", DataType::Decimal128(38, 0), false),
        Field::new("v", DataType::Int64, true),
    ]));
    let ctx = SessionContext::new();
    let table = MemTable::try_new(Arc::clone(&schema), vec![vec![]]).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    let arguments = |sql: &'static str| {
        let ctx = ctx.clone();
        async move {
            let plan = ctx.sql(sql).await?.create_physical_plan().await?;
            let mut args = Vec::new();
            let mut plans = vec![plan];
            while let Some(plan) = plans.pop() {
                if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
                    let input = aggregate.input_schema();
                    for expr in aggregate.aggr_expr() {
                        for arg in expr.expressions() {
                            args.push((expr.name().to_string(), never_null(&arg, &input)));
                        }
                    }
                }
                plans.extend(plan.children().into_iter().cloned());
            }
            Ok::<_, DataFusionError>(args)
        }
    };
    let args = arguments(
        "SELECT k, count(*), count(u), sum(u), min(u), max(u), avg(u), min(x), max(x), \
         sum(big), min(big), max(big) FROM t GROUP BY k",
    )
    .await
    .unwrap();
    assert_eq!(args.len(), 11);
    for (aggregate, never) in args {
        assert!(never, "{aggregate}");
    }
    for sql in [
        "SELECT k, max(v) FROM t GROUP BY k",
        "SELECT k, max(u % 7) FROM t GROUP BY k",
    ] {
        let args = arguments(sql).await.unwrap();
        assert!(
            !args.is_empty() && args.iter().all(|(_, never)| !never),
            "{sql}"
        );
    }
}
