//! DataFusion `PhysicalExpr`s compiled into the device interpreter's
//! program (`ptx/scan_aggregate.cu`): one instruction a node, each value in
//! a register, an expression met twice computed once. Values keep
//! DataFusion's semantics: integers and decimals as exact 64-bit integers
//! (an overflow sends the whole node to DataFusion, which computes in its
//! own, wider or wrapping, way), floats as doubles compared in Arrow's total
//! order, SQL's three-valued logic. What the interpreter cannot evaluate
//! exactly as DataFusion does is refused, with the reason.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{new_null_array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr_common::physical_expr::is_volatile;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr,
    Literal, NegativeExpr, NotExpr,
};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::scalar_subquery::ScalarSubqueryExpr;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

use super::like::{like_table, substr_table, text_table};
use crate::encode::table_words::word_kind;
use crate::exec::join_keys::{gathers_keys_of, JoinKeyFilterExpr, JoinKeySet};
use crate::gpu::launch::{ScanOp, SCAN_MAX_INSTRUCTIONS, SCAN_REGISTERS};
use crate::gpu::WordKind;

/// What a register holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ValueType {
    /// A signed integer (integers, dates, timestamps).
    Int,
    /// A decimal's unscaled value, at this scale.
    Decimal(i8),
    Float,
    /// 0 or 1.
    Bool,
}

/// A compiled value: its register and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Value {
    pub register: u32,
    pub value_type: ValueType,
}

/// A predicate over one string column kept as dictionary codes, evaluated
/// by DataFusion on the host over each part's dictionary: the device looks
/// each row's result up by its code (`ScanOp::CodeTest`).
#[derive(Debug, Clone)]
pub(crate) struct CodeTest {
    /// The scan column it reads.
    pub column: usize,
    /// The predicate over a one-column batch of that column's values.
    pub predicate: Arc<dyn PhysicalExpr>,
    /// Where the test is a join key filter instead (`ScanOp::KeyTest`):
    /// the build side's keys, its table made from them.
    pub join_keys: Option<Arc<JoinKeySet>>,
    /// Where the test is a LIKE over a column of string bytes instead
    /// (`ScanOp::Like`): the pattern's table (see [`like_table`]).
    pub pattern: Option<Arc<Vec<u32>>>,
}

/// Builds one program over the columns of one scan.
pub(crate) struct ProgramBuilder<'a> {
    schema: &'a Schema,
    instructions: Vec<[i64; 5]>,
    /// Scan columns the program reads, in the order the kernel gets them.
    columns: Vec<usize>,
    /// Expressions compiled so far, compared as expressions (their text
    /// can be the same for different ones: `a - (b + c)` prints as
    /// `a - b + c`).
    compiled: Vec<(Arc<dyn PhysicalExpr>, Value)>,
    /// Constants emitted so far, by value and type.
    constants: HashMap<(i64, ValueType), Value>,
    next_register: u32,
    /// String predicates, their keys from `first_test_key` on.
    tests: Vec<CodeTest>,
    first_test_key: usize,
    /// String columns kept as their bytes (read only by `LIKE`, `=`, `<>`
    /// and `IN` with text, and `IS NULL`).
    byte_columns: Vec<usize>,
    /// Whether the values of scalar subqueries are constants of the
    /// program (see [`Self::with_run_time_values`]).
    run_time_values: bool,
    /// Whether the program holds such a value, and whether one of them was
    /// not known yet (its type's NULL in its place).
    uses_run_time_values: bool,
    pending_values: bool,
}

type Compiled<T> = std::result::Result<T, String>;

impl<'a> ProgramBuilder<'a> {
    /// A program over rows of `schema` (the scan's output).
    pub fn new(schema: &'a Schema) -> Self {
        Self {
            schema,
            instructions: Vec::new(),
            columns: Vec::new(),
            compiled: Vec::new(),
            constants: HashMap::new(),
            next_register: 0,
            tests: Vec::new(),
            first_test_key: 0,
            byte_columns: Vec::new(),
            run_time_values: false,
            uses_run_time_values: false,
            pending_values: false,
        }
    }

    /// The value of an uncorrelated scalar subquery (DataFusion's
    /// `ScalarSubqueryExpr`, set once the subquery has run, before the
    /// plan that reads it runs) is a constant of the program; until it is
    /// set, its type's NULL holds its place, and the caller compiles the
    /// program again when it runs (see [`Self::pending_values`]). Without
    /// this, such a value is refused.
    pub fn with_run_time_values(mut self) -> Self {
        self.run_time_values = true;
        self
    }

    /// Whether the program holds the value of a scalar subquery.
    pub fn uses_run_time_values(&self) -> bool {
        self.uses_run_time_values
    }

    /// Whether the program holds the value of a scalar subquery that was
    /// not set yet: it must be compiled again before it runs.
    pub fn pending_values(&self) -> bool {
        self.pending_values
    }

    /// The string columns `columns` (of the scan) are kept as their bytes:
    /// read only by `LIKE` with patterns of text and `%`, `=`, `<>` and
    /// `IN` with text, and `IS NULL`.
    pub fn with_byte_columns(mut self, columns: &[usize]) -> Self {
        self.byte_columns = columns.to_vec();
        self
    }

    /// String predicates take keys from `key` on (keys below are the
    /// caller's: group keys, coded outputs).
    pub fn with_test_keys_from(mut self, key: usize) -> Self {
        self.first_test_key = key;
        self
    }

    /// The string predicates compiled so far, in key order (from the
    /// first test key on).
    pub fn tests(&self) -> &[CodeTest] {
        &self.tests
    }

    /// The instructions so far.
    pub fn instructions(&self) -> &[[i64; 5]] {
        &self.instructions
    }

    /// Scan columns read, by kernel column slot.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    fn register(&mut self) -> Compiled<u32> {
        let register = self.next_register;
        if register as usize >= SCAN_REGISTERS {
            return Err(format!(
                "the expressions need more than {SCAN_REGISTERS} device registers"
            ));
        }
        self.next_register += 1;
        Ok(register)
    }

    fn emit(&mut self, op: ScanOp, a: i64, b: i64, c: i64, value_type: ValueType) -> Compiled<Value> {
        if self.instructions.len() >= SCAN_MAX_INSTRUCTIONS {
            return Err(format!(
                "the expressions need more than {SCAN_MAX_INSTRUCTIONS} device instructions"
            ));
        }
        let register = self.register()?;
        self.instructions
            .push([op as i64, i64::from(register), a, b, c]);
        Ok(Value {
            register,
            value_type,
        })
    }

    fn column_slot(&mut self, column: usize) -> i64 {
        let slot = match self.columns.iter().position(|&c| c == column) {
            Some(slot) => slot,
            None => {
                self.columns.push(column);
                self.columns.len() - 1
            }
        };
        slot as i64
    }

    /// A group key: the coded column `column`'s code, 0 for NULL and one
    /// more than the key's global code otherwise (key `key`'s remap table).
    pub fn group_code(&mut self, column: usize, key: usize) -> Compiled<Value> {
        self.not_bytes(column)?;
        let data_type = self.schema.field(column).data_type();
        if word_kind(data_type) != Some(WordKind::Code) {
            return Err(format!(
                "group keys of type {data_type} are not coded on the device"
            ));
        }
        let slot = self.column_slot(column);
        self.emit(ScanOp::LoadCode, slot, key as i64, 0, ValueType::Int)
    }

    /// The row's index in the chunk, valid where column `column`'s value
    /// is: how a string column kept as its bytes is output (the host makes
    /// the strings from the column's offsets and bytes).
    pub fn row_of(&mut self, column: usize) -> Compiled<Value> {
        let slot = self.column_slot(column);
        self.emit(ScanOp::RowOf, slot, 0, 0, ValueType::Int)
    }

    /// The constant `value`.
    pub fn constant(&mut self, value: i64, value_type: ValueType) -> Compiled<Value> {
        if let Some(&v) = self.constants.get(&(value, value_type)) {
            return Ok(v);
        }
        let v = self.emit(ScanOp::Const, value, 0, 0, value_type)?;
        self.constants.insert((value, value_type), v);
        Ok(v)
    }

    /// `a op b` on integers, exact (an overflow is flagged).
    pub fn int_op(&mut self, op: ScanOp, a: Value, b: Value) -> Compiled<Value> {
        self.emit(op, a.register.into(), b.register.into(), 0, ValueType::Int)
    }

    /// `expr`'s value on each row.
    pub fn compile(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<Value> {
        if let Some((_, v)) = self
            .compiled
            .iter()
            .find(|(seen, _)| seen.as_ref() == expr.as_ref())
        {
            return Ok(*v);
        }
        let v = self.compile_new(expr)?;
        self.compiled.push((Arc::clone(expr), v));
        Ok(v)
    }

    fn data_type(&self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<DataType> {
        expr.data_type(self.schema).map_err(|e| e.to_string())
    }

    fn compile_new(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<Value> {
        if let Some(filter) = expr.downcast_ref::<JoinKeyFilterExpr>() {
            return self.join_key_test(filter);
        }
        if let Some(value) = self.text_test_on_bytes(expr)? {
            return Ok(value);
        }
        if let Some(test) = self.code_test(expr)? {
            return Ok(test);
        }
        if let Some(column) = expr.downcast_ref::<Column>() {
            return self.column(column.index());
        }
        if let Some(literal) = expr.downcast_ref::<Literal>() {
            return self.literal(literal.value());
        }
        if expr.downcast_ref::<ScalarSubqueryExpr>().is_some() {
            return self.run_time_value(expr);
        }
        if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
            let result = self.data_type(expr)?;
            return self.binary(binary, &result);
        }
        if let Some(not) = expr.downcast_ref::<NotExpr>() {
            let arg = self.compile(not.arg())?;
            expect_bool(arg, "NOT")?;
            return self.emit(ScanOp::Not, arg.register.into(), 0, 0, ValueType::Bool);
        }
        if let Some(is_null) = expr.downcast_ref::<IsNullExpr>() {
            let arg = self.compile(is_null.arg())?;
            return self.emit(ScanOp::IsNull, arg.register.into(), 0, 0, ValueType::Bool);
        }
        if let Some(is_not_null) = expr.downcast_ref::<IsNotNullExpr>() {
            let arg = self.compile(is_not_null.arg())?;
            return self.emit(ScanOp::IsNotNull, arg.register.into(), 0, 0, ValueType::Bool);
        }
        if let Some(negative) = expr.downcast_ref::<NegativeExpr>() {
            // DataFusion negates narrower integers wrapping at their width.
            let arg_type = self.data_type(negative.arg())?;
            if matches!(arg_type, DataType::Int8 | DataType::Int16 | DataType::Int32) {
                return Err(format!("the negation of a {arg_type} (it wraps at its width)"));
            }
            let arg = self.compile(negative.arg())?;
            let op = match arg.value_type {
                ValueType::Float => ScanOp::NegF64,
                ValueType::Int | ValueType::Decimal(_) => ScanOp::NegI64,
                ValueType::Bool => return Err("negation of a boolean".into()),
            };
            return self.emit(op, arg.register.into(), 0, 0, arg.value_type);
        }
        if let Some(cast) = expr.downcast_ref::<CastExpr>() {
            let from = self.data_type(cast.expr())?;
            let arg = self.compile(cast.expr())?;
            return self.cast(arg, &from, cast.cast_type());
        }
        if let Some(in_list) = expr.downcast_ref::<InListExpr>() {
            return self.in_list(in_list);
        }
        if let Some(case) = expr.downcast_ref::<CaseExpr>() {
            return self.case(case);
        }
        Err(format!("the expression {expr} is not evaluated on the device"))
    }

    /// `expr` as one lookup of its result by dictionary code, where it is a
    /// deterministic boolean expression of one coded (string) column; it
    /// is then evaluated by DataFusion itself, once per part over the
    /// part's dictionary (see [`code_test_table`]).
    fn code_test(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<Option<Value>> {
        if self.data_type(expr)? != DataType::Boolean || is_volatile(expr) {
            return Ok(None);
        }
        // A scalar subquery's value is set when the plan runs, after the
        // test's results on NULL would be taken here.
        let reads_a_subquery = Arc::clone(expr)
            .exists(|e| Ok(e.downcast_ref::<ScalarSubqueryExpr>().is_some()))
            .map_err(|e| e.to_string())?;
        if reads_a_subquery {
            return Ok(None);
        }
        let columns = collect_columns(expr);
        let Some(column) = columns.iter().next().filter(|_| columns.len() == 1) else {
            return Ok(None);
        };
        let index = column.index();
        let field = self.schema.field(index).clone();
        if word_kind(field.data_type()) != Some(WordKind::Code) || self.byte_columns.contains(&index) {
            return Ok(None);
        }
        let predicate = Arc::clone(expr)
            .transform_up(|e| match e.downcast_ref::<Column>() {
                Some(c) => Ok(Transformed::yes(
                    Arc::new(Column::new(c.name(), 0)) as Arc<dyn PhysicalExpr>
                )),
                None => Ok(Transformed::no(e)),
            })
            .map_err(|e| e.to_string())?
            .data;
        let null = new_null_array(field.data_type(), 1);
        let on_null = test_results(&predicate, &field, null)?;
        let key = self.first_test_key + self.tests.len();
        let slot = self.column_slot(index);
        let on_null = on_null.first().copied().unwrap_or(TEST_NULL);
        let value = self.emit(ScanOp::CodeTest, slot, key as i64, i64::from(on_null), ValueType::Bool)?;
        self.tests.push(CodeTest {
            column: index,
            predicate,
            join_keys: None,
            pattern: None,
        });
        Ok(Some(value))
    }

    /// The value of scalar subquery `expr` as a constant, its type's NULL
    /// where it is not set yet (see [`Self::with_run_time_values`]).
    fn run_time_value(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<Value> {
        if !self.run_time_values {
            return Err(format!("{expr}: a scalar subquery's value is not read on the device here"));
        }
        self.uses_run_time_values = true;
        let no_rows = RecordBatch::new_empty(Arc::new(Schema::empty()));
        let value = match expr.evaluate(&no_rows) {
            Ok(ColumnarValue::Scalar(value)) => value,
            _ => {
                self.pending_values = true;
                ScalarValue::try_from(self.data_type(expr)?).map_err(|e| e.to_string())?
            }
        };
        self.literal(&value)
    }

    /// Refuses `column` where it is kept as string bytes.
    fn not_bytes(&self, column: usize) -> Compiled<()> {
        match self.byte_columns.contains(&column) {
            true => Err(format!(
                "the string column {} holds more distinct values in a part than the device \
                 codes, and is read on the device only by LIKE, =, <> and IN with text (its own or \
                 its first characters', substr(s, 1, n)), and IS NULL",
                self.schema.field(column).name()
            )),
            false => Ok(()),
        }
    }

    /// `expr`, where it is a LIKE, `=`, `<>` or `IN` list of a column kept
    /// as string bytes and text, or its IS [NOT] NULL: one match of the
    /// text's segments a row (`ScanOp::Like`; `=` text is one segment, both
    /// ends closed) a pattern or value, negated for NOT LIKE, `<>` and NOT
    /// IN. `=`, `<>` and `IN` also compare the column's first characters
    /// (`substr(column, 1, n)`, TPC-H q22's country codes): text of `n`
    /// characters as a prefix. `None` where it is not of that shape.
    fn text_test_on_bytes(&mut self, expr: &Arc<dyn PhysicalExpr>) -> Compiled<Option<Value>> {
        let text = |e: &Arc<dyn PhysicalExpr>| match e.downcast_ref::<Literal>().map(Literal::value) {
            Some(
                ScalarValue::Utf8(Some(t)) | ScalarValue::Utf8View(Some(t)) | ScalarValue::LargeUtf8(Some(t)),
            ) => Some(t.clone()),
            _ => None,
        };
        // IS [NOT] NULL: of a match every valid string passes ("%").
        let null_test = match (expr.downcast_ref::<IsNullExpr>(), expr.downcast_ref::<IsNotNullExpr>()) {
            (Some(is_null), _) => Some((is_null.arg(), ScanOp::IsNull)),
            (_, Some(is_not_null)) => Some((is_not_null.arg(), ScanOp::IsNotNull)),
            _ => None,
        };
        if let Some((arg, op)) = null_test {
            let Some(column) = self.byte_column(arg) else {
                return Ok(None);
            };
            let any = self.text_match(expr, column, vec![0, 1, 1])?;
            return Ok(Some(self.emit(op, any.register.into(), 0, 0, ValueType::Bool)?));
        }
        if let Some(in_list) = expr.downcast_ref::<InListExpr>() {
            let Some((column, length)) = self.text_of_byte_column(in_list.expr()) else {
                return Ok(None);
            };
            let Some(values) = in_list.list().iter().map(text).collect::<Option<Vec<String>>>() else {
                return Ok(None);
            };
            let mut tables = Vec::with_capacity(values.len());
            for value in &values {
                tables.extend(value_table(expr, value, length)?);
            }
            if tables.is_empty() {
                // No value a substring can equal: without a match, a NULL
                // string would not give NULL.
                return Ok(None);
            }
            // One match a value, ORed, negated for NOT IN.
            let mut any = self.constant(0, ValueType::Bool)?;
            for table in tables {
                let matched = self.text_match(expr, column, table)?;
                any = self.emit(ScanOp::Or, any.register.into(), matched.register.into(), 0, ValueType::Bool)?;
            }
            return match in_list.negated() {
                true => Ok(Some(self.emit(ScanOp::Not, any.register.into(), 0, 0, ValueType::Bool)?)),
                false => Ok(Some(any)),
            };
        }
        let (column, table, negated) = if let Some(like) = expr.downcast_ref::<LikeExpr>() {
            let Some(column) = self.byte_column(like.expr()) else {
                return Ok(None);
            };
            if like.case_insensitive() {
                return Err(format!("{expr}: ILIKE is not evaluated on the device"));
            }
            let Some(pattern) = text(like.pattern()) else {
                return Err(format!("{expr}: a LIKE pattern that is not a string literal"));
            };
            let Some(table) = like_table(&pattern) else {
                return Err(format!("{expr}: a LIKE pattern with `_` or an escape"));
            };
            (column, table, like.negated())
        } else if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
            let negated = match binary.op() {
                Operator::Eq => false,
                Operator::NotEq => true,
                _ => return Ok(None),
            };
            let (left, right) = (binary.left(), binary.right());
            let ((column, length), value) = match (self.text_of_byte_column(left), self.text_of_byte_column(right)) {
                (Some(column), None) => (column, text(right)),
                (None, Some(column)) => (column, text(left)),
                _ => return Ok(None),
            };
            let Some(value) = value else {
                return Ok(None);
            };
            let Some(table) = value_table(expr, &value, length)? else {
                return Ok(None);
            };
            (column, table, negated)
        } else {
            return Ok(None);
        };
        let matched = self.text_match(expr, column, table)?;
        match negated {
            true => Ok(Some(self.emit(ScanOp::Not, matched.register.into(), 0, 0, ValueType::Bool)?)),
            false => Ok(Some(matched)),
        }
    }

    /// One match of column `column` (kept as string bytes) with the
    /// pattern `table` ([`like_table`]), for `expr`.
    fn text_match(&mut self, expr: &Arc<dyn PhysicalExpr>, column: usize, table: Vec<u32>) -> Compiled<Value> {
        let key = self.first_test_key + self.tests.len();
        let slot = self.column_slot(column);
        let matched = self.emit(ScanOp::Like, slot, key as i64, 0, ValueType::Bool)?;
        self.tests.push(CodeTest {
            column,
            predicate: Arc::clone(expr),
            join_keys: None,
            pattern: Some(Arc::new(table)),
        });
        Ok(matched)
    }

    /// The text `expr` compares, where it is a column kept as string bytes
    /// (its index, `None`) or its first characters (`substr(column, 1,
    /// length)`, a literal length of at least one: its index and the
    /// length).
    fn text_of_byte_column(&self, expr: &Arc<dyn PhysicalExpr>) -> Option<(usize, Option<usize>)> {
        if let Some(column) = self.byte_column(expr) {
            return Some((column, None));
        }
        let function = expr.downcast_ref::<ScalarFunctionExpr>()?;
        let [string, start, length] = function.args() else {
            return None;
        };
        let integer = |e: &Arc<dyn PhysicalExpr>| match e.downcast_ref::<Literal>()?.value() {
            ScalarValue::Int64(Some(v)) => Some(*v),
            ScalarValue::Int32(Some(v)) => Some(i64::from(*v)),
            _ => None,
        };
        let column = self.byte_column(string)?;
        let length = usize::try_from(integer(length)?).ok().filter(|&n| n >= 1)?;
        (function.name() == "substr" && integer(start)? == 1).then_some((column, Some(length)))
    }

    /// The scan column `expr` is, where it is one kept as string bytes.
    fn byte_column(&self, expr: &Arc<dyn PhysicalExpr>) -> Option<usize> {
        expr.downcast_ref::<Column>()
            .map(Column::index)
            .filter(|c| self.byte_columns.contains(c))
    }

    /// A join key filter: one lookup of the key column's value in a bitmap
    /// of the build side's keys, made at run time.
    fn join_key_test(&mut self, filter: &JoinKeyFilterExpr) -> Compiled<Value> {
        let Some(column) = filter.key().downcast_ref::<Column>() else {
            return Err(format!("the join key {} is not a column of the table", filter.key()));
        };
        let index = column.index();
        let data_type = self.schema.field(index).data_type();
        if !gathers_keys_of(data_type) {
            return Err(format!("join keys of type {data_type} are not tested on the device"));
        }
        let key = self.first_test_key + self.tests.len();
        let slot = self.column_slot(index);
        let value = self.emit(ScanOp::KeyTest, slot, key as i64, 0, ValueType::Bool)?;
        self.tests.push(CodeTest {
            column: index,
            predicate: Arc::new(filter.clone()),
            join_keys: Some(Arc::clone(filter.keys())),
            pattern: None,
        });
        Ok(value)
    }

    fn column(&mut self, index: usize) -> Compiled<Value> {
        self.not_bytes(index)?;
        let data_type = self.schema.field(index).data_type().clone();
        let value_type = match (word_kind(&data_type), &data_type) {
            (Some(WordKind::I64), DataType::Decimal128(_, scale)) => ValueType::Decimal(*scale),
            (Some(WordKind::I64), DataType::Boolean) => ValueType::Bool,
            (Some(WordKind::I64), _) => ValueType::Int,
            (Some(WordKind::F64), _) => ValueType::Float,
            (Some(WordKind::Code | WordKind::Bytes), _) => {
                return Err(format!(
                    "the {data_type} column {} is read on the device only as a group key",
                    self.schema.field(index).name()
                ))
            }
            (None, _) => {
                return Err(format!(
                    "columns of type {data_type} are not read on the device"
                ))
            }
        };
        let slot = self.column_slot(index);
        let op = match value_type {
            ValueType::Float => ScanOp::LoadF64,
            _ => ScanOp::LoadI64,
        };
        self.emit(op, slot, 0, 0, value_type)
    }

    fn literal(&mut self, value: &ScalarValue) -> Compiled<Value> {
        let data_type = value.data_type();
        let value_type = match &data_type {
            DataType::Decimal128(_, scale) => ValueType::Decimal(*scale),
            DataType::Float64 => ValueType::Float,
            DataType::Boolean => ValueType::Bool,
            t if word_kind(t) == Some(WordKind::I64) => ValueType::Int,
            t => return Err(format!("literals of type {t} are not used on the device")),
        };
        if value.is_null() {
            return self.emit(ScanOp::Null, 0, 0, 0, value_type);
        }
        let bits = match value {
            ScalarValue::Int8(Some(v)) => i64::from(*v),
            ScalarValue::Int16(Some(v)) => i64::from(*v),
            ScalarValue::Int32(Some(v)) => i64::from(*v),
            ScalarValue::Int64(Some(v)) => *v,
            ScalarValue::UInt8(Some(v)) => i64::from(*v),
            ScalarValue::UInt16(Some(v)) => i64::from(*v),
            ScalarValue::UInt32(Some(v)) => i64::from(*v),
            ScalarValue::Date32(Some(v)) => i64::from(*v),
            ScalarValue::Date64(Some(v)) => *v,
            ScalarValue::TimestampSecond(Some(v), _)
            | ScalarValue::TimestampMillisecond(Some(v), _)
            | ScalarValue::TimestampMicrosecond(Some(v), _)
            | ScalarValue::TimestampNanosecond(Some(v), _) => *v,
            ScalarValue::Boolean(Some(v)) => i64::from(*v),
            ScalarValue::Float64(Some(v)) => v.to_bits() as i64,
            ScalarValue::Decimal128(Some(v), _, _) => i64::try_from(*v)
                .map_err(|_| format!("the decimal literal {value} exceeds 64 bits"))?,
            other => return Err(format!("the literal {other} is not used on the device")),
        };
        self.constant(bits, value_type)
    }

    fn binary(&mut self, binary: &BinaryExpr, result: &DataType) -> Compiled<Value> {
        use Operator::*;
        let op = *binary.op();
        if matches!(op, And | Or) {
            let left = self.compile(binary.left())?;
            let right = self.compile(binary.right())?;
            expect_bool(left, "AND/OR")?;
            expect_bool(right, "AND/OR")?;
            let op = if op == And { ScanOp::And } else { ScanOp::Or };
            return self.emit(op, left.register.into(), right.register.into(), 0, ValueType::Bool);
        }
        if matches!(op, Plus | Minus | Multiply) {
            // Integers, decimals and doubles only: DataFusion's date and
            // time arithmetic has units of its own (Date64 - Date64 is in
            // days, say).
            for side in [binary.left(), binary.right()] {
                let data_type = self.data_type(side)?;
                let numeric = integer_digits(&data_type).is_some()
                    || matches!(data_type, DataType::Decimal128(_, _) | DataType::Float64);
                if !numeric {
                    return Err(format!("arithmetic on {data_type} is not evaluated on the device"));
                }
            }
        }
        let left = self.compile(binary.left())?;
        let right = self.compile(binary.right())?;
        match op {
            Eq | NotEq | Lt | LtEq | Gt | GtEq => self.comparison(op, left, right),
            Plus | Minus | Multiply => self.arithmetic(op, left, right, result),
            other => Err(format!("the operator {other} is not evaluated on the device")),
        }
    }

    fn comparison(&mut self, op: Operator, left: Value, right: Value) -> Compiled<Value> {
        use Operator::*;
        let (left, right, float) = match (left.value_type, right.value_type) {
            (ValueType::Float, ValueType::Float) => (left, right, true),
            (ValueType::Int, ValueType::Int) | (ValueType::Bool, ValueType::Bool) => {
                (left, right, false)
            }
            (ValueType::Decimal(a), ValueType::Decimal(b)) => {
                let scale = a.max(b);
                (self.rescale(left, scale)?, self.rescale(right, scale)?, false)
            }
            (a, b) => return Err(format!("a comparison of {a:?} with {b:?}")),
        };
        let code = match (op, float) {
            (Eq, false) => ScanOp::EqI64,
            (NotEq, false) => ScanOp::NeI64,
            (Lt, false) => ScanOp::LtI64,
            (LtEq, false) => ScanOp::LeI64,
            (Gt, false) => ScanOp::GtI64,
            (GtEq, false) => ScanOp::GeI64,
            (Eq, true) => ScanOp::EqF64,
            (NotEq, true) => ScanOp::NeF64,
            (Lt, true) => ScanOp::LtF64,
            (LtEq, true) => ScanOp::LeF64,
            (Gt, true) => ScanOp::GtF64,
            (GtEq, true) => ScanOp::GeF64,
            (other, _) => return Err(format!("the comparison {other}")),
        };
        self.emit(code, left.register.into(), right.register.into(), 0, ValueType::Bool)
    }

    /// `value` (a decimal) at `scale`, at least its own.
    fn rescale(&mut self, value: Value, scale: i8) -> Compiled<Value> {
        let ValueType::Decimal(own) = value.value_type else {
            return Err("a rescale of a value that is not a decimal".into());
        };
        if own == scale {
            return Ok(value);
        }
        let factor = power_of_ten(i32::from(scale) - i32::from(own))?;
        self.emit(
            ScanOp::ScaleI64,
            value.register.into(),
            factor,
            0,
            ValueType::Decimal(scale),
        )
    }

    fn arithmetic(
        &mut self,
        op: Operator,
        left: Value,
        right: Value,
        result: &DataType,
    ) -> Compiled<Value> {
        use Operator::*;
        match (result, left.value_type, right.value_type) {
            (DataType::Float64, ValueType::Float, ValueType::Float) => {
                let code = match op {
                    Plus => ScanOp::AddF64,
                    Minus => ScanOp::SubF64,
                    _ => ScanOp::MulF64,
                };
                self.emit(code, left.register.into(), right.register.into(), 0, ValueType::Float)
            }
            // Narrower integers wrap at their own width in DataFusion.
            (DataType::Int64, ValueType::Int, ValueType::Int) => {
                let code = match op {
                    Plus => ScanOp::AddI64,
                    Minus => ScanOp::SubI64,
                    _ => ScanOp::MulI64,
                };
                self.int_op(code, left, right)
            }
            (DataType::Decimal128(_, scale), ValueType::Decimal(a), ValueType::Decimal(b)) => {
                let (code, left, right, own) = match op {
                    Plus | Minus => {
                        let s = a.max(b);
                        let code = if op == Plus { ScanOp::AddI64 } else { ScanOp::SubI64 };
                        (code, self.rescale(left, s)?, self.rescale(right, s)?, s)
                    }
                    _ => (ScanOp::MulI64, left, right, a.checked_add(b).ok_or("scale")?),
                };
                if own != *scale {
                    return Err(format!(
                        "decimal arithmetic to scale {scale} from operands at scales {a} and {b}"
                    ));
                }
                self.emit(code, left.register.into(), right.register.into(), 0, ValueType::Decimal(own))
            }
            (t, a, b) => Err(format!("arithmetic to {t} on {a:?} and {b:?}")),
        }
    }

    fn cast(&mut self, arg: Value, from: &DataType, to: &DataType) -> Compiled<Value> {
        use DataType::*;
        if from == to {
            return Ok(arg);
        }
        let refused = || Err(format!("CAST from {from} to {to} is not evaluated on the device"));
        match (from, to) {
            (f, Int64) if integer_digits(f).is_some() => Ok(Value {
                value_type: ValueType::Int,
                ..arg
            }),
            (Int8 | UInt8, Int16 | Int32) | (Int16 | UInt16, Int32) => Ok(arg),
            (f, Decimal128(p, s)) if integer_digits(f).is_some() => {
                let digits = integer_digits(f).unwrap_or(u8::MAX);
                if i32::from(*p) - i32::from(*s) < i32::from(digits) {
                    return refused();
                }
                let factor = power_of_ten(i32::from(*s))?;
                self.emit(ScanOp::ScaleI64, arg.register.into(), factor, 0, ValueType::Decimal(*s))
            }
            (Decimal128(p1, s1), Decimal128(p2, s2)) => {
                let widens = s2 >= s1 && i32::from(*p2) - i32::from(*s2) >= i32::from(*p1) - i32::from(*s1);
                if !widens {
                    return refused();
                }
                self.rescale(arg, *s2)
            }
            (f, Float64) if integer_digits(f).is_some() => {
                self.emit(ScanOp::I64ToF64, arg.register.into(), 0, 0, ValueType::Float)
            }
            (Decimal128(_, s), Float64) if *s >= 0 => {
                // Arrow divides the value, as a double, by 10^scale.
                let float = self.emit(ScanOp::I64ToF64, arg.register.into(), 0, 0, ValueType::Float)?;
                let divisor = self.constant(10f64.powi(i32::from(*s)).to_bits() as i64, ValueType::Float)?;
                self.emit(ScanOp::DivF64, float.register.into(), divisor.register.into(), 0, ValueType::Float)
            }
            _ => refused(),
        }
    }

    fn in_list(&mut self, in_list: &InListExpr) -> Compiled<Value> {
        let mut any: Option<Value> = None;
        for item in in_list.list() {
            let equal = BinaryExpr::new(Arc::clone(in_list.expr()), Operator::Eq, Arc::clone(item));
            let equal: Arc<dyn PhysicalExpr> = Arc::new(equal);
            let equal = self.compile(&equal)?;
            any = Some(match any {
                None => equal,
                Some(previous) => self.emit(
                    ScanOp::Or,
                    previous.register.into(),
                    equal.register.into(),
                    0,
                    ValueType::Bool,
                )?,
            });
        }
        let any = any.ok_or("an empty IN list")?;
        match in_list.negated() {
            true => self.emit(ScanOp::Not, any.register.into(), 0, 0, ValueType::Bool),
            false => Ok(any),
        }
    }

    fn case(&mut self, case: &CaseExpr) -> Compiled<Value> {
        let mut value = match case.else_expr() {
            Some(otherwise) => self.compile(otherwise)?,
            None => {
                let first = case.when_then_expr().first().ok_or("a CASE without WHEN")?;
                let then = self.compile(&first.1)?;
                self.emit(ScanOp::Null, 0, 0, 0, then.value_type)?
            }
        };
        for (when, then) in case.when_then_expr().iter().rev() {
            let condition = match case.expr() {
                Some(base) => {
                    let equal: Arc<dyn PhysicalExpr> =
                        Arc::new(BinaryExpr::new(Arc::clone(base), Operator::Eq, Arc::clone(when)));
                    self.compile(&equal)?
                }
                None => self.compile(when)?,
            };
            expect_bool(condition, "CASE WHEN")?;
            let then = self.compile(then)?;
            if then.value_type != value.value_type {
                return Err("CASE branches of different types".into());
            }
            value = self.emit(
                ScanOp::Select,
                condition.register.into(),
                then.register.into(),
                value.register.into(),
                value.value_type,
            )?;
        }
        Ok(value)
    }
}

/// A code test's result for a value: false, true, NULL.
const TEST_FALSE: u32 = 0;
const TEST_TRUE: u32 = 1;
const TEST_NULL: u32 = 2;

/// The match table of a string column's text equal to `value`: the whole
/// string (`length` `None`), or its first `length` characters
/// ([`substr_table`]; `None` where no string's can equal `value`).
fn value_table(expr: &Arc<dyn PhysicalExpr>, value: &str, length: Option<usize>) -> Compiled<Option<Vec<u32>>> {
    let table = match length {
        None => text_table(value).map(Some),
        Some(length) => substr_table(value, length),
    };
    table.ok_or_else(|| format!("{expr}: text of 4 GiB or more"))
}

/// `predicate` (over one column, `field`) evaluated by DataFusion on
/// `values`, as code test results.
fn test_results(predicate: &Arc<dyn PhysicalExpr>, field: &Field, values: ArrayRef) -> Compiled<Vec<u32>> {
    let schema = Arc::new(Schema::new(vec![field.clone().with_nullable(true)]));
    let rows = values.len();
    let batch = RecordBatch::try_new(schema, vec![values]).map_err(|e| e.to_string())?;
    let result = predicate
        .evaluate(&batch)
        .and_then(|v| v.into_array(rows))
        .map_err(|e| format!("the string predicate {predicate}: {e}"))?;
    let result = result
        .as_boolean_opt()
        .ok_or_else(|| format!("the string predicate {predicate} is not a boolean"))?;
    Ok(result
        .iter()
        .map(|r| match r {
            Some(true) => TEST_TRUE,
            Some(false) => TEST_FALSE,
            None => TEST_NULL,
        })
        .collect())
}

/// Code test `test`'s table for a part whose column has `dictionary`: the
/// result for each code.
pub(crate) fn code_test_table(test: &CodeTest, field: &Field, dictionary: &ArrayRef) -> Compiled<Vec<u32>> {
    let values = match dictionary.data_type() == field.data_type() {
        true => Arc::clone(dictionary),
        false => datafusion::arrow::compute::cast(dictionary, field.data_type()).map_err(|e| e.to_string())?,
    };
    test_results(&test.predicate, field, values)
}

fn expect_bool(value: Value, what: &str) -> Compiled<()> {
    match value.value_type {
        ValueType::Bool => Ok(()),
        other => Err(format!("{what} over {other:?}")),
    }
}

/// Decimal digits every value of the integer type `data_type` fits in,
/// or `None` where it is not an integer type.
fn integer_digits(data_type: &DataType) -> Option<u8> {
    use DataType::*;
    match data_type {
        Int8 | UInt8 => Some(3),
        Int16 | UInt16 => Some(5),
        Int32 | UInt32 => Some(10),
        Int64 => Some(19),
        _ => None,
    }
}

fn power_of_ten(exponent: i32) -> Compiled<i64> {
    u32::try_from(exponent)
        .ok()
        .and_then(|e| 10i64.checked_pow(e))
        .ok_or_else(|| format!("a decimal rescale by 10^{exponent}"))
}

#[cfg(test)]
#[path = "program_tests.rs"]
mod tests;
