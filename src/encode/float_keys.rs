//! Float join keys as integers that are equal exactly where
//! `HashJoinExec` calls the floats equal, so that they are coded like
//! integer keys ([`crate::encode::keys`]).

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
};

/// The integer type [`equality_column`] reads a key column of `data_type`
/// as: a float's signed integer of the same width, any other type itself.
pub(crate) fn equality_type(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Float16 => DataType::Int16,
        DataType::Float32 => DataType::Int32,
        DataType::Float64 => DataType::Int64,
        other => other.clone(),
    }
}

/// A float key column as integers equal exactly where `HashJoinExec` calls
/// the floats equal: each value's bits, with -0.0 read as 0.0 (DataFusion
/// hashes floats so, and compares them by IEEE totalOrder with that zero
/// normalized). NULLs stay NULL. Any other column as it is.
pub(crate) fn equality_column(column: &ArrayRef) -> ArrayRef {
    // The sign bit alone: -0.0, the only value whose bits change.
    fn bits<const WIDTH: u32>(bits: u64) -> u64 {
        if bits << (65 - WIDTH) == 0 {
            0
        } else {
            bits
        }
    }
    match column.data_type() {
        DataType::Float16 => Arc::new(
            column
                .as_primitive::<Float16Type>()
                .unary::<_, Int16Type>(|v| bits::<16>(u64::from(v.to_bits())) as u16 as i16),
        ),
        DataType::Float32 => Arc::new(
            column
                .as_primitive::<Float32Type>()
                .unary::<_, Int32Type>(|v| bits::<32>(u64::from(v.to_bits())) as u32 as i32),
        ),
        DataType::Float64 => Arc::new(
            column
                .as_primitive::<Float64Type>()
                .unary::<_, Int64Type>(|v| bits::<64>(v.to_bits()) as i64),
        ),
        _ => Arc::clone(column),
    }
}
