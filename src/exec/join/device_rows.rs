//! A join's output rows kept on the device for the GPU join above it: the
//! output columns gathered there are handed on as they lie, and the join
//! above probes with them without a trip over the bus (seed 002's
//! pipeline of joins; the whole-queries guide's device batches between GPU
//! nodes). A join hands rows on so only to the GPU hash join above it that
//! asked for them; that join copies them down where it cannot probe with
//! them in place.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};

use crate::exec::join::device_gather::ResidentColumns;
use crate::exec::join::row_source::RowSource;
use crate::gpu::{DeviceReservation, GpuDevice};

/// Rows of `schema` whose every column is on one device, in the words a
/// join gathers its output columns from (see [`ResidentColumns`]).
pub(crate) struct DeviceRows {
    /// The device the columns lie on.
    pub(crate) device: Arc<GpuDevice>,
    /// The columns, one per field of the shape's schema, all resident.
    pub(crate) columns: ResidentColumns,
    /// Their schema and row count.
    pub(crate) shape: RowsShape,
    /// The columns' device memory, held in the device's budget until the
    /// rows are dropped.
    pub(crate) memory: DeviceReservation,
}

impl std::fmt::Debug for DeviceRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRows")
            .field("device", &self.device.ordinal())
            .field("rows", &self.shape.rows)
            .field("bytes", &self.memory.bytes())
            .finish()
    }
}

impl DeviceRows {
    /// Rows in all.
    pub(crate) fn num_rows(&self) -> usize {
        self.shape.rows
    }
}

/// The schema and row count of rows whose columns are on the device: what
/// a join asks of such rows beyond the columns themselves (their count,
/// each column's type). It has no host pieces; taking rows from it is an
/// error.
#[derive(Debug, Clone)]
pub(crate) struct RowsShape {
    pub(crate) schema: SchemaRef,
    pub(crate) rows: usize,
}

impl RowSource for RowsShape {
    fn num_rows(&self) -> usize {
        self.rows
    }

    fn num_columns(&self) -> usize {
        self.schema.fields().len()
    }

    fn data_type(&self, column: usize) -> &DataType {
        self.schema.field(column).data_type()
    }

    fn pieces(&self, _column: usize) -> Vec<&ArrayRef> {
        // Every column is on the device: no piece on the host, and none
        // with NULLs.
        Vec::new()
    }

    fn take_columns(&self, _columns: &[usize], _ids: &UInt64Array) -> Result<Vec<ArrayRef>> {
        Err(DataFusionError::Internal(
            "rows on the device were taken from on the host".into(),
        ))
    }
}

/// What a GPU join hands on: a host batch, or rows on the device.
#[derive(Debug)]
pub(crate) enum JoinedRows {
    Host(RecordBatch),
    Device(DeviceRows),
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn a_shape_gives_counts_and_types_and_refuses_host_rows() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("d", DataType::Decimal128(15, 2), false),
        ]));
        let shape = RowsShape { schema, rows: 7 };
        assert_eq!(shape.num_rows(), 7);
        assert_eq!(shape.num_columns(), 2);
        assert_eq!(shape.data_type(1), &DataType::Decimal128(15, 2));
        // No piece on the host, hence none with NULLs.
        assert!(shape.pieces(0).is_empty());
        let ids = UInt64Array::from(vec![0, 3]);
        let error = shape.take_columns(&[0], &ids).unwrap_err();
        assert!(error.to_string().contains("on the host"), "{error}");
    }
}
