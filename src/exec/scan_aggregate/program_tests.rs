//! Tests of the compile of expressions into scan programs.

use super::*;
use datafusion::arrow::datatypes::Field;
use datafusion::physical_expr::expressions::{col, lit};

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("price", DataType::Decimal128(15, 2), true),
        Field::new("discount", DataType::Decimal128(15, 2), true),
        Field::new("flag", DataType::Utf8View, true),
        Field::new("x", DataType::Float64, true),
        Field::new("n", DataType::Int32, true),
    ])
}

#[test]
fn a_string_predicate_is_one_lookup_of_its_result_by_code() {
    use datafusion::arrow::array::StringViewArray;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, is_null, like};
    let schema = schema();
    let flag = col("flag", &schema).unwrap();
    let dictionary: ArrayRef = Arc::new(StringViewArray::from(vec!["A", "N", "R"]));
    let field = schema.field(2);

    // `flag = 'A'`: one instruction, NULL where flag is NULL.
    let equal = binary(Arc::clone(&flag), Operator::Eq, lit(ScalarValue::Utf8View(Some("A".into()))), &schema).unwrap();
    let mut program = ProgramBuilder::new(&schema).with_test_keys_from(2);
    let value = program.compile(&equal).unwrap();
    assert_eq!(value.value_type, ValueType::Bool);
    assert_eq!(program.instructions().len(), 1);
    let [op, _, slot, key, on_null] = program.instructions()[0];
    assert_eq!((op, slot, key, on_null), (ScanOp::CodeTest as i64, 0, 2, 2));
    assert_eq!(program.columns(), [2]);
    let test = &program.tests()[0];
    assert_eq!(code_test_table(test, field, &dictionary).unwrap(), [1, 0, 0]);

    // Several tests of one column under OR stay one test; a NULL flag
    // is true here.
    let starts = like(false, false, Arc::clone(&flag), lit(ScalarValue::Utf8View(Some("N%".into()))), &schema).unwrap();
    let either = binary(is_null(Arc::clone(&flag)).unwrap(), Operator::Or, starts, &schema).unwrap();
    let mut program = ProgramBuilder::new(&schema);
    program.compile(&either).unwrap();
    assert_eq!(program.instructions().len(), 1);
    assert_eq!(program.instructions()[0][4], 1);
    assert_eq!(code_test_table(&program.tests()[0], field, &dictionary).unwrap(), [0, 1, 0]);

    // A test beside a numeric comparison: two registers and an AND.
    let numeric = binary(col("n", &schema).unwrap(), Operator::Gt, lit(3i32), &schema).unwrap();
    let both = binary(equal, Operator::And, numeric, &schema).unwrap();
    let mut program = ProgramBuilder::new(&schema);
    program.compile(&both).unwrap();
    assert_eq!(program.tests().len(), 1);
    assert_eq!(program.instructions().last().unwrap()[0], ScanOp::And as i64);
}

#[test]
fn an_expression_met_twice_is_computed_once_and_columns_are_read_once() {
    let schema = schema();
    let mut program = ProgramBuilder::new(&schema);
    let product: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        col("price", &schema).unwrap(),
        Operator::Multiply,
        col("discount", &schema).unwrap(),
    ));
    let first = program.compile(&product).unwrap();
    let again = program.compile(&product).unwrap();
    assert_eq!(first, again);
    assert_eq!(first.value_type, ValueType::Decimal(4));
    assert_eq!(program.instructions().len(), 3);
    assert_eq!(program.columns(), [0, 1]);
}

#[test]
fn decimals_at_different_scales_are_rescaled_before_they_are_added() {
    let schema = schema();
    let mut program = ProgramBuilder::new(&schema);
    let one = lit(ScalarValue::Decimal128(Some(1), 20, 0));
    let sum: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        one,
        Operator::Minus,
        col("discount", &schema).unwrap(),
    ));
    // DataFusion types it Decimal128(23, 2).
    let value = program.compile(&sum).unwrap();
    assert_eq!(value.value_type, ValueType::Decimal(2));
    let ops: Vec<i64> = program.instructions().iter().map(|i| i[0]).collect();
    assert!(ops.contains(&(ScanOp::ScaleI64 as i64)), "{ops:?}");
    let scale = program
        .instructions()
        .iter()
        .find(|i| i[0] == ScanOp::ScaleI64 as i64)
        .unwrap();
    assert_eq!(scale[3], 100);
}

#[test]
fn what_the_device_cannot_evaluate_exactly_is_refused_with_a_reason() {
    let schema = schema();
    let refused = |expr: Arc<dyn PhysicalExpr>| {
        ProgramBuilder::new(&schema).compile(&expr).unwrap_err()
    };
    let division: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        col("price", &schema).unwrap(),
        Operator::Divide,
        col("discount", &schema).unwrap(),
    ));
    assert!(refused(division).contains("operator"));
    // Int32 arithmetic wraps at 32 bits in DataFusion.
    let narrow: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        col("n", &schema).unwrap(),
        Operator::Plus,
        col("n", &schema).unwrap(),
    ));
    assert!(refused(narrow).contains("Int32"));
    let string = col("flag", &schema).unwrap();
    assert!(refused(string).contains("group key"));
}

#[test]
fn expressions_that_print_alike_are_compiled_apart() {
    let schema = schema();
    let column = |name: &str| col(name, &schema).unwrap();
    let binary = |l, op, r| Arc::new(BinaryExpr::new(l, op, r)) as Arc<dyn PhysicalExpr>;
    // price - (discount + price) and (price - discount) + price print alike.
    let grouped_right = binary(
        column("price"),
        Operator::Minus,
        binary(column("discount"), Operator::Plus, column("price")),
    );
    let grouped_left = binary(
        binary(column("price"), Operator::Minus, column("discount")),
        Operator::Plus,
        column("price"),
    );
    assert_eq!(grouped_right.to_string(), grouped_left.to_string());
    let mut program = ProgramBuilder::new(&schema);
    let a = program.compile(&grouped_right).unwrap();
    let b = program.compile(&grouped_left).unwrap();
    assert_ne!(a.register, b.register);
}

#[test]
fn date_arithmetic_and_the_negation_of_narrow_integers_are_refused() {
    let schema = Schema::new(vec![
        Field::new("d1", DataType::Date64, true),
        Field::new("d2", DataType::Date64, true),
        Field::new("n", DataType::Int32, true),
    ]);
    let difference: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        col("d1", &schema).unwrap(),
        Operator::Minus,
        col("d2", &schema).unwrap(),
    ));
    let error = ProgramBuilder::new(&schema).compile(&difference).unwrap_err();
    assert!(error.contains("Date64"), "{error}");
    let negation: Arc<dyn PhysicalExpr> = Arc::new(NegativeExpr::new(col("n", &schema).unwrap()));
    let error = ProgramBuilder::new(&schema).compile(&negation).unwrap_err();
    assert!(error.contains("wraps"), "{error}");
}

#[test]
fn too_many_registers_are_refused() {
    let schema = schema();
    let mut program = ProgramBuilder::new(&schema);
    let mut result = Ok(());
    for i in 0..=SCAN_REGISTERS as i64 {
        if let Err(e) = program.constant(i, ValueType::Int) {
            result = Err(e);
        }
    }
    assert!(result.unwrap_err().contains("registers"));
}

#[test]
fn a_scalar_subquerys_value_is_a_constant_once_set() {
    use datafusion::logical_expr::physical_planning_context::{ScalarSubqueryResults, SubqueryIndex};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::binary;
    let schema = schema();
    let results = ScalarSubqueryResults::new(1);
    let index = SubqueryIndex::new(0);
    let subquery: Arc<dyn PhysicalExpr> = Arc::new(ScalarSubqueryExpr::new(
        DataType::Decimal128(15, 2),
        true,
        index,
        results.clone(),
    ));
    let above = binary(col("price", &schema).unwrap(), Operator::Gt, subquery, &schema).unwrap();
    // Not allowed: refused, with the reason.
    let refused = ProgramBuilder::new(&schema).compile(&above).unwrap_err();
    assert!(refused.contains("scalar subquery"), "{refused}");
    // Not set yet: the type's NULL holds its place, and the program says so.
    let mut pending = ProgramBuilder::new(&schema).with_run_time_values();
    pending.compile(&above).unwrap();
    assert!(pending.uses_run_time_values() && pending.pending_values());
    assert!(pending.instructions().iter().any(|i| i[0] == ScanOp::Null as i64));
    // Set: its value is a constant.
    results.set(index, ScalarValue::Decimal128(Some(499_815), 15, 2)).unwrap();
    let mut set = ProgramBuilder::new(&schema).with_run_time_values();
    set.compile(&above).unwrap();
    assert!(set.uses_run_time_values() && !set.pending_values());
    assert!(set.instructions().iter().all(|i| i[0] != ScanOp::Null as i64));
    assert!(set.instructions().iter().any(|i| i[0] == ScanOp::Const as i64 && i.contains(&499_815)));
    // An expression without one does not use them.
    let mut plain = ProgramBuilder::new(&schema).with_run_time_values();
    plain.compile(&col("price", &schema).unwrap()).unwrap();
    assert!(!plain.uses_run_time_values());
}

#[test]
fn a_string_test_reading_a_scalar_subquery_is_not_a_code_test() {
    use datafusion::logical_expr::physical_planning_context::{ScalarSubqueryResults, SubqueryIndex};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::binary;
    let schema = schema();
    let results = ScalarSubqueryResults::new(1);
    let index = SubqueryIndex::new(0);
    results.set(index, ScalarValue::Utf8View(Some("A".into()))).unwrap();
    let subquery: Arc<dyn PhysicalExpr> =
        Arc::new(ScalarSubqueryExpr::new(DataType::Utf8View, true, index, results));
    // `flag = (SELECT ...)`: its results by code would be taken before the
    // plan runs, so it is not compiled, even with the value set.
    let equal = binary(col("flag", &schema).unwrap(), Operator::Eq, subquery, &schema).unwrap();
    let mut program = ProgramBuilder::new(&schema).with_run_time_values();
    assert!(program.compile(&equal).is_err());
    assert!(program.tests().is_empty());
}
