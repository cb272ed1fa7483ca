//! The types a Parquet part's columns are read as to fill the column cache:
//! cheaper to decode than the table's own where the device's words come
//! out the same. The words keep the table's type, so the cache keys do not
//! change.
//!
//! - A decimal of at most 18 digits is read as a 64-bit decimal: Parquet
//!   stores it as a 32- or 64-bit integer (or a short byte array), and
//!   Arrow's reader would otherwise widen every value to 128 bits, which the
//!   cache then narrows again. Only where the file stores the column as the
//!   table declares it (same precision and scale): a file that differs is
//!   read as DataFusion reads it, its values cast to the table's type.
//! - A string column the fill codes is read as a dictionary (`Int32` keys
//!   into `Utf8` values): Parquet stores such a column's few distinct
//!   values once a column chunk and a key a row, and Arrow's reader then
//!   hands the keys on as they are, where it would otherwise make a string
//!   (a view) of every row, which the fill would look up again, row by row.
//!   Only where the file stores the column as strings.

use std::sync::Arc;

use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Schema, SchemaRef, DECIMAL64_MAX_PRECISION,
};
use datafusion::datasource::table_schema::TableSchema;

use crate::encode::table_words::word_kind;
use crate::gpu::WordKind;

/// The type a string column is read as where the fill codes it.
pub(crate) fn coded_string_read_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// Whether columns of `data_type` are strings, as the cache codes them.
fn is_string(data_type: &DataType) -> bool {
    word_kind(data_type) == Some(WordKind::Code)
}

/// The narrower type a column of `data_type` is read as, if any; `coded`:
/// whether the fill codes the column (a string column).
fn narrow_type(data_type: &DataType, coded: bool) -> Option<DataType> {
    match data_type {
        DataType::Decimal128(precision, scale) if *precision <= DECIMAL64_MAX_PRECISION => {
            Some(DataType::Decimal64(*precision, *scale))
        }
        data_type if coded && is_string(data_type) => Some(coded_string_read_type()),
        _ => None,
    }
}

/// Whether any of `table_columns` (indices into the table's columns), of
/// which `coded` are string columns the fill codes, is of a type read
/// narrower: only then is the file's own schema worth fetching.
pub(crate) fn may_narrow(table: &TableSchema, table_columns: &[usize], coded: &[usize]) -> bool {
    let fields = table.file_schema().fields();
    table_columns.iter().any(|&c| {
        fields
            .get(c)
            .is_some_and(|field| narrow_type(field.data_type(), coded.contains(&c)).is_some())
    })
}

/// The schema of the table and the schema of the file (whose own schema,
/// as Arrow's reader makes it, is `own`) to read a part of the file by:
/// each decimal column of at most 18 digits that the file stores as the
/// table declares it, in both, as a `Decimal64` of the same precision and
/// scale, and each string column of `coded` (indices into the table's
/// columns) that the file stores as strings as a dictionary; `None` where
/// there is no such column.
pub(crate) fn narrowed_for_file(
    table: &TableSchema,
    own: &Schema,
    coded: &[usize],
) -> Option<(TableSchema, SchemaRef)> {
    let narrowed: Vec<(&str, DataType)> = table
        .file_schema()
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(c, field)| {
            let narrow = narrow_type(field.data_type(), coded.contains(&c))?;
            let stored = own.field_with_name(field.name()).ok()?.data_type();
            let as_declared = match &narrow {
                DataType::Dictionary(..) => is_string(stored),
                _ => stored == field.data_type(),
            };
            as_declared.then_some((field.name().as_str(), narrow))
        })
        .collect();
    if narrowed.is_empty() {
        return None;
    }
    let file_schema = with_types(table.file_schema(), &narrowed);
    let table = TableSchema::builder(file_schema)
        .with_table_partition_cols(table.table_partition_cols().clone())
        .with_virtual_columns(table.virtual_columns().clone())
        .build();
    Some((table, with_types(own, &narrowed)))
}

/// `schema` with the columns `narrowed` names in the types it gives them.
fn with_types(schema: &Schema, narrowed: &[(&str, DataType)]) -> SchemaRef {
    let fields: Vec<FieldRef> = schema
        .fields()
        .iter()
        .map(|field| match narrowed.iter().find(|(name, _)| name == field.name()) {
            Some((_, narrow)) => Arc::new(Field::clone(field).with_data_type(narrow.clone())),
            None => Arc::clone(field),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(fields: Vec<Field>) -> TableSchema {
        TableSchema::builder(Arc::new(Schema::new(fields))).build()
    }

    #[test]
    fn decimals_of_up_to_18_digits_stored_as_declared_are_read_in_64_bits() {
        let declared = vec![
            Field::new("price", DataType::Decimal128(15, 2), false),
            Field::new("widest", DataType::Decimal128(18, 0), true),
            Field::new("wide", DataType::Decimal128(19, 2), true),
            Field::new("rescaled", DataType::Decimal128(15, 2), true),
            Field::new("key", DataType::Int64, false),
            Field::new("missing", DataType::Decimal128(9, 1), true),
        ];
        // The file: `rescaled` at another scale, `missing` absent, the
        // columns in another order, `price` nullable there.
        let own = Schema::new(vec![
            Field::new("key", DataType::Int64, false),
            Field::new("rescaled", DataType::Decimal128(15, 4), true),
            Field::new("wide", DataType::Decimal128(19, 2), true),
            Field::new("widest", DataType::Decimal128(18, 0), true),
            Field::new("price", DataType::Decimal128(15, 2), true),
        ]);
        let t = table(declared.clone());
        assert!(may_narrow(&t, &[0], &[]));
        assert!(!may_narrow(&t, &[2, 4], &[]), "19 digits and an integer");
        assert!(!may_narrow(&t, &[99], &[99]));
        let (narrow_table, narrow_file) = narrowed_for_file(&t, &own, &[]).unwrap();
        let types = |s: &Schema| -> Vec<DataType> { s.fields().iter().map(|f| f.data_type().clone()).collect() };
        assert_eq!(
            types(narrow_table.file_schema()),
            [
                DataType::Decimal64(15, 2),
                DataType::Decimal64(18, 0),
                DataType::Decimal128(19, 2),
                DataType::Decimal128(15, 2),
                DataType::Int64,
                DataType::Decimal128(9, 1),
            ]
        );
        // The file's own fields, order and nullability: only the types of
        // the columns narrowed in the table change.
        assert_eq!(
            types(&narrow_file),
            [
                DataType::Int64,
                DataType::Decimal128(15, 4),
                DataType::Decimal128(19, 2),
                DataType::Decimal64(18, 0),
                DataType::Decimal64(15, 2),
            ]
        );
        for (before, after) in own.fields().iter().zip(narrow_file.fields()) {
            assert_eq!((before.name(), before.is_nullable()), (after.name(), after.is_nullable()));
        }
        // Nothing stored as declared: nothing narrowed.
        let t = table(vec![Field::new("rescaled", DataType::Decimal128(15, 2), true)]);
        assert!(narrowed_for_file(&t, &own, &[]).is_none());
    }

    #[test]
    fn a_tables_partition_columns_stay_as_they_are() {
        let file = Arc::new(Schema::new(vec![Field::new("price", DataType::Decimal128(12, 2), true)]));
        let day = Arc::new(Field::new("day", DataType::Decimal128(8, 0), false));
        let t = TableSchema::builder(Arc::clone(&file))
            .with_table_partition_cols(vec![Arc::clone(&day)])
            .build();
        assert!(!may_narrow(&t, &[1], &[1]), "the partition column is not read from the file");
        let (narrow, _) = narrowed_for_file(&t, &file, &[]).unwrap();
        assert_eq!(narrow.file_schema().field(0).data_type(), &DataType::Decimal64(12, 2));
        assert_eq!(narrow.table_partition_cols()[0].as_ref(), day.as_ref());
        assert_eq!(narrow.table_schema().fields().len(), 2);
    }

    #[test]
    fn string_columns_the_fill_codes_are_read_as_dictionaries_where_stored_as_strings() {
        let declared = vec![
            Field::new("mode", DataType::Utf8View, false),
            Field::new("comment", DataType::Utf8View, true),
            Field::new("flag", DataType::Utf8, true),
            Field::new("blob", DataType::Utf8View, true),
            Field::new("price", DataType::Decimal128(15, 2), false),
        ];
        // The file stores `blob` as binary: read as DataFusion reads it.
        let own = Schema::new(vec![
            Field::new("mode", DataType::Utf8, false),
            Field::new("comment", DataType::Utf8View, true),
            Field::new("flag", DataType::LargeUtf8, true),
            Field::new("blob", DataType::Binary, true),
            Field::new("price", DataType::Decimal128(15, 2), false),
        ]);
        let t = table(declared);
        // Strings the fill keeps as their bytes (`comment`) are not coded.
        assert!(!may_narrow(&t, &[0, 1], &[]));
        assert!(may_narrow(&t, &[0, 1], &[0]));
        let (narrow_table, narrow_file) = narrowed_for_file(&t, &own, &[0, 2, 3]).unwrap();
        let types = |s: &Schema| -> Vec<DataType> { s.fields().iter().map(|f| f.data_type().clone()).collect() };
        let dictionary = coded_string_read_type();
        assert_eq!(
            types(narrow_table.file_schema()),
            [
                dictionary.clone(),
                DataType::Utf8View,
                dictionary.clone(),
                DataType::Utf8View,
                DataType::Decimal64(15, 2),
            ]
        );
        assert_eq!(
            types(&narrow_file),
            [
                dictionary.clone(),
                DataType::Utf8View,
                dictionary,
                DataType::Binary,
                DataType::Decimal64(15, 2),
            ]
        );
        for (before, after) in own.fields().iter().zip(narrow_file.fields()) {
            assert_eq!((before.name(), before.is_nullable()), (after.name(), after.is_nullable()));
        }
        // Only strings coded: nothing to narrow where the file holds none.
        let t = table(vec![Field::new("blob", DataType::Utf8View, true)]);
        assert!(narrowed_for_file(&t, &own, &[0]).is_none());
    }
}
