//! Join keys normalized into one u64 per row: the bit patterns of the key
//! columns packed side by side. Packing is injective, so two rows have equal
//! normalized keys exactly when every key column is equal, and the device
//! compares one word per row whatever the key types.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::*;
use datafusion::error::{DataFusionError, Result};

/// How the key columns of a join pack into a u64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    types: Vec<DataType>,
}

/// Keys of the rows whose key columns are all non-null (a NULL key never
/// matches under SQL equality).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NormalizedKeys {
    /// One packed key per kept row.
    pub keys: Vec<u64>,
    /// Index of each kept row in the input, or `None` when every row was kept.
    pub row_ids: Option<Vec<u64>>,
}

/// Bits a key column of `data_type` takes, or why it cannot be a GPU key.
pub fn key_bits(data_type: &DataType) -> std::result::Result<u32, String> {
    match data_type {
        DataType::Int8 | DataType::UInt8 => Ok(8),
        DataType::Int16 | DataType::UInt16 => Ok(16),
        DataType::Int32 | DataType::UInt32 | DataType::Date32 => Ok(32),
        DataType::Int64 | DataType::UInt64 | DataType::Date64 | DataType::Timestamp(_, _) => Ok(64),
        other => Err(format!("key type {other} is not supported on the GPU yet")),
    }
}

impl KeyLayout {
    /// The layout for key columns of `types`, or why the GPU cannot take them.
    pub fn try_new(types: &[DataType]) -> std::result::Result<Self, String> {
        if types.is_empty() {
            return Err("the join has no equi-join keys".into());
        }
        let mut total = 0u32;
        for t in types {
            total += key_bits(t)?;
        }
        if total > 64 {
            return Err(format!(
                "the composite key of {} columns takes {total} bits, more than the 64 the GPU join packs",
                types.len()
            ));
        }
        Ok(Self {
            types: types.to_vec(),
        })
    }

    /// Bits of the packed key.
    pub fn total_bits(&self) -> u32 {
        self.types.iter().map(|t| key_bits(t).unwrap_or(64)).sum()
    }

    /// Packs `columns` (one array per key column, equal lengths, types as in
    /// the layout) and drops rows with a NULL in any key column.
    pub fn normalize(&self, columns: &[ArrayRef]) -> Result<NormalizedKeys> {
        if columns.len() != self.types.len() {
            return Err(DataFusionError::Internal(format!(
                "{} key columns for a layout of {}",
                columns.len(),
                self.types.len()
            )));
        }
        let rows = columns.first().map(|c| c.len()).unwrap_or(0);
        let mut packed = vec![0u64; rows];
        let mut nulls: Option<NullBuffer> = None;
        for (column, data_type) in columns.iter().zip(&self.types) {
            if column.data_type() != data_type || column.len() != rows {
                return Err(DataFusionError::Internal(format!(
                    "key column of type {} and length {} where {data_type} and {rows} were planned",
                    column.data_type(),
                    column.len()
                )));
            }
            let bits = key_bits(data_type).map_err(DataFusionError::NotImplemented)?;
            append_bits(&mut packed, column, bits)?;
            nulls = NullBuffer::union(nulls.as_ref(), column.logical_nulls().as_ref());
        }
        Ok(match nulls {
            Some(nulls) if nulls.null_count() > 0 => {
                let row_ids: Vec<u64> = nulls.valid_indices().map(|i| i as u64).collect();
                let keys = row_ids.iter().map(|&i| packed[i as usize]).collect();
                NormalizedKeys {
                    keys,
                    row_ids: Some(row_ids),
                }
            }
            _ => NormalizedKeys {
                keys: packed,
                row_ids: None,
            },
        })
    }
}

/// `packed[i] = (packed[i] << bits) | bit pattern of column[i]`.
fn append_bits(packed: &mut [u64], column: &ArrayRef, bits: u32) -> Result<()> {
    macro_rules! pack {
        ($arrow_type:ty, $unsigned:ty) => {{
            let values = column.as_primitive::<$arrow_type>().values();
            for (slot, &v) in packed.iter_mut().zip(values.iter()) {
                let pattern = (v as $unsigned) as u64;
                *slot = if bits == 64 {
                    pattern
                } else {
                    (*slot << bits) | pattern
                };
            }
        }};
    }
    match column.data_type() {
        DataType::Int8 => pack!(Int8Type, u8),
        DataType::Int16 => pack!(Int16Type, u16),
        DataType::Int32 => pack!(Int32Type, u32),
        DataType::Int64 => pack!(Int64Type, u64),
        DataType::UInt8 => pack!(UInt8Type, u8),
        DataType::UInt16 => pack!(UInt16Type, u16),
        DataType::UInt32 => pack!(UInt32Type, u32),
        DataType::UInt64 => pack!(UInt64Type, u64),
        DataType::Date32 => pack!(Date32Type, u32),
        DataType::Date64 => pack!(Date64Type, u64),
        DataType::Timestamp(TimeUnit::Second, _) => pack!(TimestampSecondType, u64),
        DataType::Timestamp(TimeUnit::Millisecond, _) => pack!(TimestampMillisecondType, u64),
        DataType::Timestamp(TimeUnit::Microsecond, _) => pack!(TimestampMicrosecondType, u64),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => pack!(TimestampNanosecondType, u64),
        other => {
            return Err(DataFusionError::NotImplemented(format!(
                "GPU join key of type {other}"
            )))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        Date32Array, Int16Array, Int32Array, Int64Array, StringArray, UInt8Array,
    };
    use std::sync::Arc;

    #[test]
    fn layouts_accept_integer_and_date_keys_up_to_64_bits() {
        assert_eq!(
            KeyLayout::try_new(&[DataType::Int64]).unwrap().total_bits(),
            64
        );
        assert_eq!(
            KeyLayout::try_new(&[DataType::Int32, DataType::Date32])
                .unwrap()
                .total_bits(),
            64
        );
        assert_eq!(
            KeyLayout::try_new(&[DataType::UInt8, DataType::Int16, DataType::Int32])
                .unwrap()
                .total_bits(),
            56
        );
    }

    #[test]
    fn layouts_reject_wide_composites_and_other_types_with_a_reason() {
        let err = KeyLayout::try_new(&[DataType::Int64, DataType::Int32]).unwrap_err();
        assert!(err.contains("96 bits"), "{err}");
        let err = KeyLayout::try_new(&[DataType::Utf8]).unwrap_err();
        assert!(err.contains("Utf8"), "{err}");
        assert!(KeyLayout::try_new(&[]).is_err());
    }

    #[test]
    fn negative_values_keep_their_identity() {
        let layout = KeyLayout::try_new(&[DataType::Int32]).unwrap();
        let col: ArrayRef = Arc::new(Int32Array::from(vec![-1, 1, i32::MIN, 0]));
        let keys = layout.normalize(&[col]).unwrap();
        assert_eq!(keys.keys, vec![0xffff_ffff, 1, 0x8000_0000, 0]);
        assert_eq!(keys.row_ids, None);
    }

    #[test]
    fn composite_keys_pack_in_column_order() {
        let layout = KeyLayout::try_new(&[DataType::Int16, DataType::UInt8]).unwrap();
        let a: ArrayRef = Arc::new(Int16Array::from(vec![1, -1]));
        let b: ArrayRef = Arc::new(UInt8Array::from(vec![2, 255]));
        let keys = layout.normalize(&[a, b]).unwrap();
        assert_eq!(keys.keys, vec![0x0102, 0xffff_ff]);
    }

    #[test]
    fn composite_packing_is_injective_where_naive_concatenation_is_not() {
        // (1, 23) and (12, 3) would collide as decimal strings "123".
        let layout = KeyLayout::try_new(&[DataType::Int32, DataType::Int32]).unwrap();
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 12]));
        let b: ArrayRef = Arc::new(Int32Array::from(vec![23, 3]));
        let keys = layout.normalize(&[a, b]).unwrap();
        assert_ne!(keys.keys[0], keys.keys[1]);
    }

    #[test]
    fn rows_with_any_null_key_are_dropped_and_the_rest_keep_their_index() {
        let layout = KeyLayout::try_new(&[DataType::Int32, DataType::Date32]).unwrap();
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let b: ArrayRef = Arc::new(Date32Array::from(vec![Some(10), Some(20), None, Some(40)]));
        let keys = layout.normalize(&[a, b]).unwrap();
        assert_eq!(keys.row_ids, Some(vec![0, 3]));
        assert_eq!(keys.keys, vec![(1 << 32) | 10, (4 << 32) | 40]);
    }

    #[test]
    fn timestamps_keep_their_value_in_every_unit() {
        use datafusion::arrow::array::TimestampMicrosecondArray;
        let data_type = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let layout = KeyLayout::try_new(std::slice::from_ref(&data_type)).unwrap();
        let col: ArrayRef =
            Arc::new(TimestampMicrosecondArray::from(vec![-5, 7]).with_timezone("UTC"));
        assert_eq!(
            layout.normalize(&[col]).unwrap().keys,
            vec![(-5i64) as u64, 7]
        );
    }

    #[test]
    fn a_type_mismatch_is_an_error_not_a_panic() {
        let layout = KeyLayout::try_new(&[DataType::Int64]).unwrap();
        let col: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        assert!(layout.normalize(&[col]).is_err());
        let col: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        assert!(layout.normalize(&[Arc::clone(&col), col]).is_err());
    }
}
