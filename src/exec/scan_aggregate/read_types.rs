//! The types a Parquet part's columns are read as to fill the column cache:
//! cheaper to decode than the table's own where the device's words come
//! out the same. A decimal of at most 18 digits is read as a 64-bit decimal:
//! Parquet stores it in 32 or 64 bits, and Arrow's reader would otherwise
//! widen every value to 128 bits, which the cache then narrows again.
//! The words keep the table's type (its precision and scale), so the cache
//! keys do not change.

use std::sync::Arc;

use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Schema, SchemaRef, DECIMAL64_MAX_PRECISION,
};
use datafusion::datasource::table_schema::TableSchema;

/// `schema` with each decimal of at most [`DECIMAL64_MAX_PRECISION`] digits
/// as a `Decimal64` of the same precision and scale; `None` where it has no
/// such decimal.
pub(crate) fn narrowed(schema: &Schema) -> Option<SchemaRef> {
    let mut changed = false;
    let fields: Vec<FieldRef> = schema
        .fields()
        .iter()
        .map(|field| match narrow_type(field.data_type()) {
            Some(narrow) => {
                changed = true;
                Arc::new(Field::clone(field).with_data_type(narrow))
            }
            None => Arc::clone(field),
        })
        .collect();
    changed.then(|| Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())))
}

/// The narrower type `data_type` is read as, if any.
fn narrow_type(data_type: &DataType) -> Option<DataType> {
    match data_type {
        DataType::Decimal128(precision, scale) if *precision <= DECIMAL64_MAX_PRECISION => {
            Some(DataType::Decimal64(*precision, *scale))
        }
        _ => None,
    }
}

/// `table` with its file columns [`narrowed`]; `None` where none is.
pub(crate) fn narrowed_table(table: &TableSchema) -> Option<TableSchema> {
    let file_schema = narrowed(table.file_schema())?;
    Some(
        TableSchema::builder(file_schema)
            .with_table_partition_cols(table.table_partition_cols().clone())
            .with_virtual_columns(table.virtual_columns().clone())
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_of_up_to_18_digits_are_read_in_64_bits_and_nothing_else_changes() {
        let schema = Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), false),
            Field::new("widest", DataType::Decimal128(18, 0), true),
            Field::new("wide", DataType::Decimal128(19, 2), true),
            Field::new("key", DataType::Int64, false),
            Field::new("name", DataType::Utf8View, true),
        ]);
        let narrow = narrowed(&schema).unwrap();
        let types: Vec<&DataType> = narrow.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::Decimal64(15, 2),
                &DataType::Decimal64(18, 0),
                &DataType::Decimal128(19, 2),
                &DataType::Int64,
                &DataType::Utf8View
            ]
        );
        // Names and nullability as they were: the reader checks both.
        for (before, after) in schema.fields().iter().zip(narrow.fields()) {
            assert_eq!(
                (before.name(), before.is_nullable()),
                (after.name(), after.is_nullable())
            );
        }
        let plain = Schema::new(vec![Field::new("key", DataType::Int64, false)]);
        assert!(narrowed(&plain).is_none());
    }

    #[test]
    fn a_tables_partition_columns_stay_as_they_are() {
        let file = Arc::new(Schema::new(vec![Field::new("price", DataType::Decimal128(12, 2), true)]));
        let day = Arc::new(Field::new("day", DataType::Decimal128(8, 0), false));
        let table = TableSchema::builder(file)
            .with_table_partition_cols(vec![Arc::clone(&day)])
            .build();
        let narrow = narrowed_table(&table).unwrap();
        assert_eq!(narrow.file_schema().field(0).data_type(), &DataType::Decimal64(12, 2));
        assert_eq!(narrow.table_partition_cols()[0].as_ref(), day.as_ref());
        assert_eq!(narrow.table_schema().fields().len(), 2);
    }
}
