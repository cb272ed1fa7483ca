//! The program a filtering scan runs on the device (its predicate and one
//! register per output column), and the Arrow columns made of the words
//! the device returns for the rows kept.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, LargeStringBuilder, PrimitiveArray, StringBuilder,
    StringViewBuilder, UInt32Array,
};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Field, Int16Type,
    Int32Type, Int64Type, Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt8Type,
};
use datafusion::physical_expr::expressions::Column;

use super::shape::ScanFilterShape;
use crate::encode::table_words::word_kind;
use crate::exec::scan_aggregate::{CodeTest, ProgramBuilder, TableSource, ValueType};
use crate::gpu::WordKind;
use crate::ops::scan_filter::OutputWords;

type Compiled<T> = std::result::Result<T, String>;

/// How an output column is made from its register's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputKind {
    /// String column `column` (of the scan) kept as codes: 1 + the part's
    /// dictionary code, 0 for NULL (key `key`'s table maps each code to
    /// itself).
    Code { key: usize, column: usize },
    /// The register's value as the output column's type.
    Word,
    /// String column `column` (of the scan) kept as its bytes: the
    /// register holds the row's index in the part, and the string is taken
    /// from the column's offsets and bytes brought back whole.
    Bytes { column: usize },
}

/// The compiled program of a filtering scan.
#[derive(Debug)]
pub(crate) struct FilterProgram {
    pub instructions: Vec<[i64; 5]>,
    /// Scan columns the kernel reads, by slot.
    pub columns: Vec<usize>,
    pub predicate: u32,
    /// Each output column's register and how it is made.
    pub outputs: Vec<(u32, OutputKind)>,
    /// Keys of coded outputs come first (one identity table each), then
    /// those of the string predicates.
    pub coded_outputs: usize,
    pub tests: Vec<CodeTest>,
    /// Scan columns kept as string bytes (read only by `LIKE`, `=`, `<>`
    /// and `IN` with text, and `IS NULL`).
    pub byte_columns: Vec<usize>,
    /// Whether the program holds the value of a scalar subquery, and
    /// whether one was not set when it was compiled (the program must then
    /// be compiled again once it is, before it runs: see [`compile`]).
    pub run_time_values: bool,
    pub pending_values: bool,
}

impl FilterProgram {
    /// The slots (in [`Self::columns`]) of the columns kept as string
    /// bytes.
    pub fn byte_slots(&self) -> Vec<usize> {
        (0..self.columns.len())
            .filter(|&slot| self.byte_columns.contains(&self.columns[slot]))
            .collect()
    }
}

/// Compiles `shape`, with the string columns `byte_columns` (of the scan)
/// kept as their bytes, or the reason the device cannot run it.
pub(crate) fn compile(shape: &ScanFilterShape, byte_columns: &[usize]) -> Compiled<FilterProgram> {
    let coded_column = |expr: &Arc<dyn datafusion::physical_expr::PhysicalExpr>| {
        expr.downcast_ref::<Column>()
            .map(|c| c.index())
            .filter(|&c| word_kind(shape.scan_schema.field(c).data_type()) == Some(WordKind::Code))
    };
    // A string column too varied to code is output from its bytes (all of a
    // part's brought back, see `string_column`) where the table is Parquet
    // files, whose every string DataFusion's scan would decode; a
    // `MemTable`'s DataFusion reads in place.
    let bytes_output = |expr: &Arc<dyn datafusion::physical_expr::PhysicalExpr>| {
        coded_column(expr).filter(|c| byte_columns.contains(c))
    };
    let files = matches!(shape.source, TableSource::Parquet { .. });
    // Output from its bytes only from files (`bytes_output` is a string
    // column: `coded_column` took it).
    if let Some(column) = shape.outputs.iter().filter_map(bytes_output).find(|_| !files) {
        return Err(format!(
            "the string column {} holds more distinct values in a part than the device codes, \
             and is output ({} of a {})",
            shape.scan_schema.field(column).name(),
            shape.scan_schema.field(column).data_type(),
            if files { "file" } else { "MemTable" }
        ));
    }
    let coded_column = |expr: &Arc<dyn datafusion::physical_expr::PhysicalExpr>| {
        coded_column(expr).filter(|c| !byte_columns.contains(c))
    };
    let coded_outputs = shape.outputs.iter().filter(|e| coded_column(e).is_some()).count();
    let mut program = ProgramBuilder::new(&shape.scan_schema)
        .with_test_keys_from(coded_outputs)
        .with_byte_columns(byte_columns)
        .with_run_time_values();
    let predicate = program.compile(&shape.predicate)?;
    if predicate.value_type != ValueType::Bool {
        return Err("a filter that is not a boolean".into());
    }
    let mut outputs = Vec::with_capacity(shape.outputs.len());
    let mut key = 0;
    for (expr, field) in shape.outputs.iter().zip(shape.output_schema.fields()) {
        if let Some(column) = bytes_output(expr) {
            let row = program.row_of(column)?;
            outputs.push((row.register, OutputKind::Bytes { column }));
            continue;
        }
        if let Some(column) = coded_column(expr) {
            let code = program.group_code(column, key)?;
            outputs.push((code.register, OutputKind::Code { key, column }));
            key += 1;
            continue;
        }
        let value = program.compile(expr)?;
        if !word_fits(value.value_type, field.data_type()) {
            return Err(format!(
                "the output {expr} of type {} from a device value of {:?}",
                field.data_type(),
                value.value_type
            ));
        }
        outputs.push((value.register, OutputKind::Word));
    }
    Ok(FilterProgram {
        instructions: program.instructions().to_vec(),
        columns: program.columns().to_vec(),
        predicate: predicate.register,
        outputs,
        coded_outputs,
        tests: program.tests().to_vec(),
        byte_columns: byte_columns.to_vec(),
        run_time_values: program.uses_run_time_values(),
        pending_values: program.pending_values(),
    })
}

/// `program`, compiled again where it holds the values of scalar
/// subqueries (DataFusion runs them before the plan that reads them, so
/// they are set when the scan runs), or the reason the device cannot run
/// it now.
pub(crate) fn with_run_time_values(
    shape: &ScanFilterShape,
    program: Arc<FilterProgram>,
) -> Compiled<Arc<FilterProgram>> {
    if !program.run_time_values {
        return Ok(program);
    }
    let program = compile(shape, &program.byte_columns)?;
    match program.pending_values {
        true => Err("a scalar subquery's value was not set when the scan ran".into()),
        false => Ok(Arc::new(program)),
    }
}

/// Whether a register of `value_type` holds values of `data_type` exactly.
fn word_fits(value_type: ValueType, data_type: &DataType) -> bool {
    use DataType::*;
    match value_type {
        ValueType::Int => matches!(
            data_type,
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 | Date64 | Timestamp(_, _)
        ),
        ValueType::Decimal(scale) => matches!(data_type, Decimal128(_, s) if *s == scale),
        ValueType::Float => *data_type == Float64,
        ValueType::Bool => *data_type == Boolean,
    }
}

/// The validity of `valid` (one byte a row), `None` where every row is
/// valid (or none was given).
fn nulls(valid: Option<&[u8]>) -> Option<NullBuffer> {
    let valid = valid?;
    match valid.iter().all(|&v| v != 0) {
        true => None,
        false => Some(NullBuffer::from(valid.iter().map(|&v| v != 0).collect::<Vec<_>>())),
    }
}

fn primitive<T: ArrowPrimitiveType>(
    words: &OutputWords,
    nulls: Option<NullBuffer>,
    convert: impl Fn(i64) -> T::Native,
) -> PrimitiveArray<T> {
    let values: ScalarBuffer<T::Native> = match words {
        OutputWords::Wide(words) => words.iter().map(|&w| convert(w as i64)).collect(),
        OutputWords::Narrow(values) => values.iter().map(|&v| convert(i64::from(v))).collect(),
    };
    PrimitiveArray::new(values, nulls)
}

/// `words` as 8-byte values of `T` (`i64` in all but name) without a copy
/// where they came back 8 bytes a row.
fn wide_primitive<T: ArrowPrimitiveType<Native = i64>>(
    words: &OutputWords,
    nulls: Option<NullBuffer>,
) -> PrimitiveArray<T> {
    match words {
        OutputWords::Wide(words) => {
            PrimitiveArray::new(ScalarBuffer::new(words.inner().clone(), 0, words.len()), nulls)
        }
        OutputWords::Narrow(_) => primitive::<T>(words, nulls, |v| v),
    }
}

/// `words` as 4-byte values of `T` (`i32` in all but name) without a copy
/// where they came back 4 bytes a row.
fn narrow_primitive<T: ArrowPrimitiveType<Native = i32>>(
    words: &OutputWords,
    nulls: Option<NullBuffer>,
) -> PrimitiveArray<T> {
    match words {
        OutputWords::Narrow(values) => PrimitiveArray::new(values.clone(), nulls),
        OutputWords::Wide(_) => primitive::<T>(words, nulls, |v| v as i32),
    }
}

/// An output column of `field`'s type from its register's words, NULL
/// where `valid` (one byte a row, `None` for none NULL) says so.
pub(crate) fn word_column(field: &Field, words: &OutputWords, valid: Option<&[u8]>) -> Compiled<ArrayRef> {
    use DataType::*;
    let nulls = nulls(valid);
    // The device computed each value exactly in 64 bits from columns and
    // literals of this type (see `word_fits`): the narrowing casts below
    // only drop bits that are the sign's.
    let array: ArrayRef = match field.data_type() {
        Int8 => Arc::new(primitive::<Int8Type>(words, nulls, |v| v as i8)),
        Int16 => Arc::new(primitive::<Int16Type>(words, nulls, |v| v as i16)),
        Int32 => Arc::new(narrow_primitive::<Int32Type>(words, nulls)),
        Int64 => Arc::new(wide_primitive::<Int64Type>(words, nulls)),
        UInt8 => Arc::new(primitive::<UInt8Type>(words, nulls, |v| v as u8)),
        UInt16 => Arc::new(primitive::<UInt16Type>(words, nulls, |v| v as u16)),
        UInt32 => Arc::new(primitive::<UInt32Type>(words, nulls, |v| v as u32)),
        Date32 => Arc::new(narrow_primitive::<Date32Type>(words, nulls)),
        Date64 => Arc::new(wide_primitive::<Date64Type>(words, nulls)),
        Timestamp(unit, tz) => match unit {
            TimeUnit::Second => Arc::new(
                wide_primitive::<TimestampSecondType>(words, nulls).with_timezone_opt(tz.clone()),
            ),
            TimeUnit::Millisecond => Arc::new(
                wide_primitive::<TimestampMillisecondType>(words, nulls)
                    .with_timezone_opt(tz.clone()),
            ),
            TimeUnit::Microsecond => Arc::new(
                wide_primitive::<TimestampMicrosecondType>(words, nulls)
                    .with_timezone_opt(tz.clone()),
            ),
            TimeUnit::Nanosecond => Arc::new(
                wide_primitive::<TimestampNanosecondType>(words, nulls)
                    .with_timezone_opt(tz.clone()),
            ),
        },
        Decimal128(precision, scale) => Arc::new(
            primitive::<Decimal128Type>(words, nulls, i128::from)
                .with_precision_and_scale(*precision, *scale)
                .map_err(|e| e.to_string())?,
        ),
        Float64 => Arc::new(Float64Array::new(
            words.words().map(f64::from_bits).collect(),
            nulls,
        )),
        Boolean => Arc::new(BooleanArray::new(
            words.words().map(|w| w != 0).collect(),
            nulls,
        )),
        other => return Err(format!("an output column of type {other}")),
    };
    Ok(array)
}

/// A coded output column from its codes (1 + the dictionary code, 0 for
/// NULL) and the part's `dictionary`, as `field`'s type.
pub(crate) fn coded_column(field: &Field, words: &OutputWords, dictionary: &ArrayRef) -> Compiled<ArrayRef> {
    let indices: UInt32Array = words
        .words()
        .map(|w| match w {
            0 => None,
            code => u32::try_from(code - 1).ok(),
        })
        .collect();
    if indices
        .iter()
        .flatten()
        .any(|i| i as usize >= dictionary.len())
    {
        return Err("a code past its dictionary".into());
    }
    let values = take(dictionary.as_ref(), &indices, None).map_err(|e| e.to_string())?;
    match values.data_type() == field.data_type() {
        true => Ok(values),
        false => datafusion::arrow::compute::cast(&values, field.data_type()).map_err(|e| e.to_string()),
    }
}

/// A part's column of strings kept as their bytes, brought back whole for
/// the rows a scan keeps of it: `rows + 1` offsets into its bytes.
pub(crate) struct PartStrings {
    pub offsets: Vec<i32>,
    pub bytes: Buffer,
}

/// A column of `field`'s string type (`Utf8`, `LargeUtf8` or `Utf8View`):
/// for each kept row, the string of row `rows[i]` of the part's `strings`,
/// NULL where `valid[i]` is 0. Views point into the part's bytes, which are
/// copied instead where the kept strings take less than half of them (so
/// that the batch holds no more than it needs). The bytes are checked to
/// be UTF-8 where they are read.
pub(crate) fn string_column(
    field: &Field,
    rows: &OutputWords,
    valid: Option<&[u8]>,
    strings: &PartStrings,
) -> Compiled<ArrayRef> {
    let kept = rows.rows().min(valid.map_or(usize::MAX, <[u8]>::len));
    // Each kept row's string: `None` for NULL, else where its bytes lie.
    let ranges = (0..kept).map(|i| -> Compiled<Option<(usize, usize)>> {
        if valid.is_some_and(|valid| valid[i] == 0) {
            return Ok(None);
        }
        let row = usize::try_from(rows.word(i)).map_err(|e| e.to_string())?;
        match (strings.offsets.get(row), strings.offsets.get(row + 1)) {
            (Some(&from), Some(&to)) if 0 <= from && from <= to && to as usize <= strings.bytes.len() => {
                Ok(Some((from as usize, to as usize)))
            }
            _ => Err(format!("a kept row ({row}) outside its part's strings")),
        }
    });
    let text = |(from, to): (usize, usize)| -> Compiled<&str> {
        std::str::from_utf8(&strings.bytes[from..to]).map_err(|e| e.to_string())
    };
    let array: ArrayRef = match field.data_type() {
        DataType::Utf8View => {
            if strings.bytes.len() >= u32::MAX as usize {
                return Err("a part's strings past 4 GiB".into());
            }
            let mut builder = StringViewBuilder::with_capacity(kept);
            let block = builder.append_block(strings.bytes.clone());
            let mut kept_bytes = 0;
            for range in ranges {
                let Some((from, to)) = range? else {
                    builder.append_null();
                    continue;
                };
                kept_bytes += to - from;
                builder
                    .try_append_view(block, from as u32, (to - from) as u32)
                    .map_err(|e| e.to_string())?;
            }
            let array = builder.finish();
            Arc::new(match 2 * kept_bytes < strings.bytes.len() {
                true => array.gc(),
                false => array,
            })
        }
        DataType::Utf8 => {
            let mut builder = StringBuilder::with_capacity(kept, 0);
            for range in ranges {
                builder.append_option(range?.map(text).transpose()?);
            }
            Arc::new(builder.finish())
        }
        DataType::LargeUtf8 => {
            let mut builder = LargeStringBuilder::with_capacity(kept, 0);
            for range in ranges {
                builder.append_option(range?.map(text).transpose()?);
            }
            Arc::new(builder.finish())
        }
        other => return Err(format!("strings kept as bytes output as {other}")),
    };
    Ok(array)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        Date32Array, Decimal128Array, Int32Array, Int64Array, StringArray, StringViewArray,
        TimestampMicrosecondArray,
    };

    fn wide(words: &[u64]) -> OutputWords {
        OutputWords::Wide(words.to_vec().into())
    }

    #[test]
    fn words_become_columns_of_the_output_type_with_their_nulls() {
        let signed = [-3i64, 0, 7];
        let valid = [1u8, 0, 1];
        // The same words as they come back 8 bytes a row and 4.
        let both = [
            wide(&signed.map(|v| v as u64)),
            OutputWords::Narrow(signed.map(|v| v as i32).to_vec().into()),
        ];
        for words in &both {
            let column = |data_type: DataType| {
                word_column(&Field::new("c", data_type, true), words, Some(&valid)).unwrap()
            };
            assert_eq!(
                column(DataType::Int32).as_ref(),
                &Int32Array::from(vec![Some(-3), None, Some(7)]) as &dyn Array
            );
            assert_eq!(
                column(DataType::Int64).as_ref(),
                &Int64Array::from(vec![Some(-3), None, Some(7)]) as &dyn Array
            );
            assert_eq!(
                column(DataType::Date32).as_ref(),
                &Date32Array::from(vec![Some(-3), None, Some(7)]) as &dyn Array
            );
            let decimal = Decimal128Array::from(vec![Some(-3i128), None, Some(7)])
                .with_precision_and_scale(15, 2)
                .unwrap();
            assert_eq!(column(DataType::Decimal128(15, 2)).as_ref(), &decimal as &dyn Array);
            let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
            let timestamps =
                TimestampMicrosecondArray::from(vec![Some(-3), None, Some(7)]).with_timezone("UTC");
            assert_eq!(column(utc).as_ref(), &timestamps as &dyn Array);
            let booleans = column(DataType::Boolean);
            assert_eq!(
                booleans.as_ref(),
                &BooleanArray::from(vec![Some(true), None, Some(true)]) as &dyn Array
            );
            // No validity: no NULL.
            let all_valid = word_column(&Field::new("c", DataType::Int64, true), words, None).unwrap();
            assert_eq!(all_valid.as_ref(), &Int64Array::from(vec![-3, 0, 7]) as &dyn Array);
            assert!(word_column(&Field::new("u", DataType::UInt64, true), words, Some(&valid)).is_err());
        }
        let floats = word_column(
            &Field::new("f", DataType::Float64, true),
            &wide(&[(-0.0f64).to_bits(), 2.5f64.to_bits()]),
            Some(&[1, 1]),
        )
        .unwrap();
        let floats = floats.as_any().downcast_ref::<Float64Array>().unwrap();
        assert!(floats.null_count() == 0 && floats.value(0).is_sign_negative());
        assert_eq!(floats.value(1), 2.5);
        // A float whose bits fit 4 bytes (0.0) comes back exactly.
        let zero = word_column(
            &Field::new("f", DataType::Float64, true),
            &OutputWords::Narrow(vec![0i32].into()),
            None,
        )
        .unwrap();
        let zero = zero.as_any().downcast_ref::<Float64Array>().unwrap();
        assert!(zero.value(0) == 0.0 && zero.value(0).is_sign_positive());
    }

    #[test]
    fn words_of_the_columns_width_are_not_copied() {
        let narrow = OutputWords::Narrow(vec![1i32, -2].into());
        let column = word_column(&Field::new("d", DataType::Date32, false), &narrow, None).unwrap();
        let OutputWords::Narrow(values) = &narrow else { unreachable!() };
        assert_eq!(column.to_data().buffers()[0].as_ptr(), values.inner().as_ptr());
        let words = wide(&[5, u64::MAX]);
        let column = word_column(&Field::new("i", DataType::Int64, false), &words, None).unwrap();
        let OutputWords::Wide(values) = &words else { unreachable!() };
        assert_eq!(column.to_data().buffers()[0].as_ptr(), values.inner().as_ptr());
        assert_eq!(column.as_ref(), &Int64Array::from(vec![5, -1]) as &dyn Array);
    }

    /// A part's strings as the cache keeps them as bytes (a NULL row an
    /// empty string there), and the column a scan makes of the kept rows.
    fn part_strings(values: &[Option<&str>]) -> PartStrings {
        let mut offsets = vec![0i32];
        let mut bytes = Vec::new();
        for value in values {
            bytes.extend_from_slice(value.unwrap_or("").as_bytes());
            offsets.push(bytes.len() as i32);
        }
        PartStrings {
            offsets,
            bytes: Buffer::from_vec(bytes),
        }
    }

    #[test]
    fn kept_rows_of_strings_kept_as_bytes_become_columns_of_every_string_type() {
        let long = "a string longer than twelve bytes, with ünïcödé";
        let values = [Some("short"), None, Some(""), Some(long), Some("€"), Some("twelve bytes")];
        let strings = part_strings(&values);
        // Kept rows in any order, repeated; a NULL where the row's is.
        let rows = [3u64, 0, 1, 2, 3, 4, 5];
        let valid = [1u8, 1, 0, 1, 1, 1, 1];
        let expected: Vec<Option<&str>> =
            rows.iter().zip(valid).map(|(&r, v)| (v == 1).then(|| values[r as usize].unwrap())).collect();
        for data_type in [DataType::Utf8View, DataType::Utf8, DataType::LargeUtf8] {
            let field = Field::new("s", data_type.clone(), true);
            let column = string_column(&field, &wide(&rows), Some(&valid), &strings).unwrap();
            assert_eq!(column.data_type(), &data_type);
            let as_utf8 = datafusion::arrow::compute::cast(&column, &DataType::Utf8).unwrap();
            assert_eq!(
                as_utf8.as_ref(),
                &StringArray::from(expected.clone()) as &dyn Array,
                "{data_type}"
            );
        }
        // Views keep the part's bytes where most are kept, and copy the
        // few kept where not.
        let field = Field::new("s", DataType::Utf8View, true);
        let most = string_column(&field, &wide(&[3, 3, 3]), None, &strings).unwrap();
        let views = most.as_any().downcast_ref::<StringViewArray>().unwrap();
        assert_eq!(views.data_buffers()[0].len(), strings.bytes.len());
        let few = string_column(&field, &OutputWords::Narrow(vec![0].into()), None, &strings).unwrap();
        let views = few.as_any().downcast_ref::<StringViewArray>().unwrap();
        assert!(views.data_buffers().iter().all(|b| b.len() < strings.bytes.len()));
        assert_eq!(views.value(0), "short");
        // No row kept; a row past the part's; bytes that are not UTF-8.
        let empty = string_column(&field, &wide(&[]), Some(&[]), &strings).unwrap();
        assert_eq!(empty.len(), 0);
        for data_type in [DataType::Utf8View, DataType::Utf8, DataType::LargeUtf8] {
            let field = Field::new("s", data_type, true);
            assert!(string_column(&field, &wide(&[6]), Some(&[1]), &strings).is_err());
            let broken = PartStrings {
                offsets: vec![0, 2],
                bytes: Buffer::from_vec(vec![0xe2u8, 0x82]),
            };
            assert!(string_column(&field, &wide(&[0]), None, &broken).is_err());
        }
        assert!(string_column(&Field::new("s", DataType::Binary, true), &wide(&[0]), None, &strings).is_err());
    }

    #[test]
    fn codes_become_the_dictionarys_strings() {
        let dictionary: ArrayRef = Arc::new(StringArray::from(vec!["x", "yy"]));
        let field = Field::new("s", DataType::Utf8, true);
        let column = coded_column(&field, &OutputWords::Narrow(vec![2, 0, 1, 2].into()), &dictionary).unwrap();
        assert_eq!(
            column.as_ref(),
            &StringArray::from(vec![Some("yy"), None, Some("x"), Some("yy")]) as &dyn Array
        );
        let view = Field::new("s", DataType::Utf8View, true);
        assert_eq!(coded_column(&view, &wide(&[1]), &dictionary).unwrap().data_type(), &DataType::Utf8View);
        assert!(coded_column(&field, &wide(&[3]), &dictionary).is_err());
    }
}
