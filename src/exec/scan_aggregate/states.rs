//! The program a partial aggregation runs on the device (its filter, group
//! code and accumulators), and the partial states DataFusion's final
//! aggregation merges, made from the accumulators the device returns.

use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, Decimal128Array, Float64Array, Int64Array, RecordBatch,
    UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::error::Result;

use super::program::{CodeTest, ProgramBuilder, ValueType};
use super::shape::ScanAggregateShape;
use super::source::uncodable_columns;
use crate::exec::aggregate::AggregateKind;
use crate::gpu::launch::{AccumulatorKind, ScanOp, SCAN_MAX_SLOTS};

type Compiled<T> = std::result::Result<T, String>;

/// How one state column is made from the accumulators.
#[derive(Debug, Clone, Copy)]
enum StateColumn {
    /// A count: word `word` of accumulator `acc`; NULL where it is 0 and
    /// `null_where_none` (AVG's count, as DataFusion's grouped AVG keeps
    /// it, and its final aggregations, the GPU's too, read it).
    Count {
        acc: usize,
        word: usize,
        null_where_none: bool,
    },
    /// An exact sum of integers or decimals (accumulator `sum`), NULL where
    /// accumulator `count` counted no value.
    ExactSum { sum: usize, count: usize },
    /// A sum of doubles, NULL where it added no value.
    FloatSum { acc: usize },
    /// A minimum or maximum, NULL where it saw no value.
    Extreme { acc: usize },
}

/// The compiled program and how its results become states.
#[derive(Debug)]
pub(crate) struct DeviceProgram {
    pub instructions: Vec<[i64; 5]>,
    /// Scan columns the kernel reads, by slot.
    pub columns: Vec<usize>,
    pub predicate: Option<u32>,
    pub group: Option<u32>,
    pub groups: u32,
    /// Accumulator 0 counts each group's rows.
    pub accumulators: Vec<(AccumulatorKind, Option<u32>)>,
    /// String predicates, keyed after the group keys.
    pub tests: Vec<CodeTest>,
    states: Vec<StateColumn>,
}

/// Compiles `shape` with group keys of `cardinalities` distinct values
/// (each key's codes then run from 1 to its cardinality, 0 for NULL), the
/// string columns `byte_columns` (of the scan) kept as their bytes.
pub(crate) fn compile(
    shape: &ScanAggregateShape,
    cardinalities: &[usize],
    byte_columns: &[usize],
) -> Compiled<DeviceProgram> {
    let mut program = ProgramBuilder::new(&shape.scan_schema)
        .with_test_keys_from(shape.group_columns.len())
        .with_byte_columns(byte_columns);
    let predicate = match &shape.predicate {
        Some(predicate) => {
            let value = program.compile(predicate)?;
            if value.value_type != ValueType::Bool {
                return Err("a filter that is not a boolean".into());
            }
            Some(value.register)
        }
        None => None,
    };
    let mut groups: usize = 1;
    let mut group = None;
    for (key, &column) in shape.group_columns.iter().enumerate() {
        let code = program.group_code(column, key)?;
        let cardinality = cardinalities.get(key).copied().unwrap_or(1);
        let term = match groups {
            1 => code,
            stride => {
                let stride = program.constant(stride as i64, ValueType::Int)?;
                program.int_op(ScanOp::MulI64, code, stride)?
            }
        };
        group = Some(match group {
            None => term,
            Some(sum) => program.int_op(ScanOp::AddI64, sum, term)?,
        });
        groups = groups
            .checked_mul(cardinality + 1)
            .filter(|&g| g <= SCAN_MAX_SLOTS)
            .ok_or_else(|| format!("more than {SCAN_MAX_SLOTS} combinations of group keys"))?;
    }
    let mut accumulators = vec![(AccumulatorKind::Count, None)];
    let mut add = |kind, register| {
        accumulators.push((kind, Some(register)));
        accumulators.len() - 1
    };
    let mut states = Vec::new();
    for (aggregate, state_types) in shape.aggregates.iter().zip(&shape.state_types) {
        let argument = aggregate.argument.as_ref().ok_or("an aggregate without argument")?;
        let value = program.compile(argument)?;
        let register = value.value_type;
        let r = value.register;
        let unsupported = || {
            Err(format!(
                "{:?} over {register:?} with states {state_types:?} on the device",
                aggregate.kind
            ))
        };
        match (aggregate.kind, register, state_types.as_slice()) {
            (AggregateKind::Count, _, [DataType::Int64]) => {
                states.push(StateColumn::Count {
                    acc: add(AccumulatorKind::Count, r),
                    word: 0,
                    null_where_none: false,
                });
            }
            (AggregateKind::Sum, ValueType::Float, [DataType::Float64]) => {
                states.push(StateColumn::FloatSum { acc: add(AccumulatorKind::SumF64, r) });
            }
            (AggregateKind::Sum, ValueType::Int, [DataType::Int64])
            | (AggregateKind::Sum, ValueType::Decimal(_), [DataType::Decimal128(_, _)]) => {
                let sum = add(AccumulatorKind::SumI64, r);
                let count = add(AccumulatorKind::Count, r);
                states.push(StateColumn::ExactSum { sum, count });
            }
            (AggregateKind::Avg, ValueType::Float, [DataType::UInt64, DataType::Float64]) => {
                let acc = add(AccumulatorKind::SumF64, r);
                states.push(StateColumn::Count {
                    acc,
                    word: 1,
                    null_where_none: true,
                });
                states.push(StateColumn::FloatSum { acc });
            }
            (AggregateKind::Avg, ValueType::Decimal(_), [DataType::UInt64, DataType::Decimal128(_, _)]) => {
                let sum = add(AccumulatorKind::SumI64, r);
                let count = add(AccumulatorKind::Count, r);
                states.push(StateColumn::Count {
                    acc: count,
                    word: 0,
                    null_where_none: true,
                });
                states.push(StateColumn::ExactSum { sum, count });
            }
            (AggregateKind::Min | AggregateKind::Max, ValueType::Int | ValueType::Decimal(_) | ValueType::Bool, [_]) => {
                let kind = match aggregate.kind {
                    AggregateKind::Min => AccumulatorKind::MinI64,
                    _ => AccumulatorKind::MaxI64,
                };
                states.push(StateColumn::Extreme { acc: add(kind, r) });
            }
            _ => return unsupported(),
        }
    }
    if groups * accumulators.len() > SCAN_MAX_SLOTS {
        return Err(format!(
            "{groups} groups of {} accumulators exceed the device's {SCAN_MAX_SLOTS}",
            accumulators.len()
        ));
    }
    Ok(DeviceProgram {
        instructions: program.instructions().to_vec(),
        columns: program.columns().to_vec(),
        predicate,
        group: group.map(|g| g.register),
        groups: groups as u32,
        accumulators,
        tests: program.tests().to_vec(),
        states,
    })
}

/// Compiles `shape` once, as the node will at run time (one value a
/// group key): the reason where the device cannot run it.
pub(crate) fn check(shape: &ScanAggregateShape) -> Compiled<()> {
    // A part's rows are its columns' rows.
    let (columns, _) = columns_read(shape)?;
    if columns.is_empty() {
        return Err("the aggregation reads no column of the table".into());
    }
    Ok(())
}

/// The scan columns the program reads, by kernel slot, and those of them
/// kept as string bytes: the string columns parts of the table were found
/// too varied to code (the reason where the program cannot read them so).
pub(crate) fn columns_read(shape: &ScanAggregateShape) -> Compiled<(Vec<usize>, Vec<usize>)> {
    let one_value_a_key = vec![1; shape.group_columns.len()];
    let columns = compile(shape, &one_value_a_key, &[])?.columns;
    let byte_columns: Vec<usize> = uncodable_columns(&shape.source, &shape.fields_of(&columns))
        .into_iter()
        .map(|slot| columns[slot])
        .collect();
    if byte_columns.is_empty() {
        return Ok((columns, byte_columns));
    }
    let columns = compile(shape, &one_value_a_key, &byte_columns)?.columns;
    Ok((columns, byte_columns))
}

/// The partial aggregation's output from the device's accumulator words
/// (`words[(group * accumulators + acc) * 2 + word]`): one row per group
/// that counted rows (one row, always, without group keys), its keys taken
/// from `dictionaries` (each key's values, in global code order). `Err`
/// with a reason where a state does not fit its type.
pub(crate) fn partial_states(
    program: &DeviceProgram,
    words: &[u64],
    cardinalities: &[usize],
    dictionaries: &[ArrayRef],
    schema: &SchemaRef,
) -> Result<std::result::Result<RecordBatch, String>> {
    let accs = program.accumulators.len();
    let word = |group: usize, acc: usize, w: usize| words[(group * accs + acc) * 2 + w];
    let keyed = !cardinalities.is_empty();
    let groups: Vec<usize> = (0..program.groups as usize)
        .filter(|&g| !keyed || word(g, 0, 0) > 0)
        .collect();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    let mut stride = 1usize;
    for (key, (&cardinality, dictionary)) in cardinalities.iter().zip(dictionaries).enumerate() {
        let indices: UInt32Array = groups
            .iter()
            .map(|&g| {
                let code = (g / stride) % (cardinality + 1);
                (code > 0).then(|| (code - 1) as u32)
            })
            .collect();
        let values = take(dictionary.as_ref(), &indices, None)?;
        let field_type = schema.field(key).data_type();
        columns.push(match values.data_type() == field_type {
            true => values,
            false => cast(&values, field_type)?,
        });
        stride *= cardinality + 1;
    }
    for (state, field) in program.states.iter().zip(schema.fields().iter().skip(columns.len())) {
        let data_type = field.data_type();
        let column: ArrayRef = match *state {
            StateColumn::Count {
                acc,
                word: w,
                null_where_none,
            } => {
                let counts = groups
                    .iter()
                    .map(|&g| word(g, acc, w))
                    .map(|c| (c > 0 || !null_where_none).then_some(c));
                match data_type {
                    DataType::UInt64 => Arc::new(UInt64Array::from_iter(counts)),
                    _ => Arc::new(Int64Array::from_iter(counts.map(|c| c.map(|c| c as i64)))),
                }
            }
            StateColumn::ExactSum { sum, count } => {
                let sums: Vec<Option<i128>> = groups
                    .iter()
                    .map(|&g| {
                        let exact = (u128::from(word(g, sum, 1)) << 64 | u128::from(word(g, sum, 0))) as i128;
                        (word(g, count, 0) > 0).then_some(exact)
                    })
                    .collect();
                match data_type {
                    DataType::Decimal128(p, s) => Arc::new(
                        Decimal128Array::from(sums).with_precision_and_scale(*p, *s)?,
                    ),
                    _ => {
                        let mut narrow = Vec::with_capacity(sums.len());
                        for sum in sums {
                            match sum.map(i64::try_from).transpose() {
                                Ok(v) => narrow.push(v),
                                Err(_) => return Ok(Err("an integer sum beyond 64 bits".into())),
                            }
                        }
                        Arc::new(Int64Array::from(narrow))
                    }
                }
            }
            StateColumn::FloatSum { acc } => Arc::new(Float64Array::from_iter(
                groups
                    .iter()
                    .map(|&g| (word(g, acc, 1) > 0).then(|| f64::from_bits(word(g, acc, 0)))),
            )),
            StateColumn::Extreme { acc } => {
                let values: Vec<Option<i64>> = groups
                    .iter()
                    .map(|&g| (word(g, acc, 1) > 0).then(|| word(g, acc, 0) as i64))
                    .collect();
                match data_type {
                    DataType::Decimal128(p, s) => Arc::new(
                        Decimal128Array::from_iter(values.into_iter().map(|v| v.map(i128::from)))
                            .with_precision_and_scale(*p, *s)?,
                    ),
                    other => from_i64(Int64Array::from(values), other)?,
                }
            }
        };
        columns.push(column);
    }
    if columns.len() != schema.fields().len() {
        let missing = &schema.fields()[columns.len()..];
        for field in missing {
            columns.push(new_null_array(field.data_type(), groups.len()));
        }
        return Ok(Err("the partial aggregation's states do not match its schema".into()));
    }
    Ok(Ok(RecordBatch::try_new(Arc::clone(schema), columns)?))
}

/// `values` as `data_type`, an integer-like type every value fits: through
/// the 32-bit integers for the 32-bit types (Arrow casts those from Int32).
fn from_i64(values: Int64Array, data_type: &DataType) -> Result<ArrayRef> {
    let values: ArrayRef = Arc::new(values);
    Ok(match data_type {
        DataType::Int64 => values,
        DataType::Date32 | DataType::Time32(_) => {
            cast(&cast(&values, &DataType::Int32)?, data_type)?
        }
        other => cast(&values, other)?,
    })
}
