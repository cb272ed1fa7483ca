//! A record batch in device memory: its schema and one device column per
//! Arrow column, in Arrow's layout, so that GPU operators can hand each
//! other batches without a trip through host memory. Dictionary-encoded
//! columns keep their codes on the device and their dictionary on the host.
//! Fixed-width types (integers, floats, decimals, dates, times, timestamps,
//! durations, intervals), booleans, and `Utf8`, `LargeUtf8`, `Binary` and
//! `LargeBinary` are supported; [`DeviceBatch::supports`] says which type is.
//!
//! This is the data model the GPU-to-GPU pipeline builds on; until a GPU
//! node hands its output on as device batches, only tests use it.
#![cfg_attr(not(any(test, feature = "test-support")), allow(dead_code))]

use std::sync::Arc;

use datafusion::arrow::array::{
    make_array, Array, ArrayData, ArrayRef, AsArray, DictionaryArray, RecordBatch,
    RecordBatchOptions,
};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::arrow::datatypes::{
    ArrowDictionaryKeyType, DataType, Int16Type, Int32Type, Int64Type, Int8Type, SchemaRef,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{DeviceColumn, DeviceStream, GpuDevice, HostColumn, PhaseTimer};

/// One column of a [`DeviceBatch`].
pub enum DeviceArray {
    /// Every buffer on the device.
    Plain(DeviceColumn),
    /// A dictionary-encoded column: its codes on the device, its dictionary
    /// (the values the codes index) on the host.
    Dictionary {
        codes: DeviceColumn,
        dictionary: ArrayRef,
    },
}

/// A record batch in device memory (see the module docs).
pub struct DeviceBatch {
    schema: SchemaRef,
    rows: usize,
    columns: Vec<DeviceArray>,
}

impl DeviceBatch {
    /// Whether columns of `data_type` can live on the device.
    pub fn supports(data_type: &DataType) -> bool {
        match data_type {
            DataType::Dictionary(key, value) => {
                key.is_dictionary_key_type() && !matches!(**value, DataType::Dictionary(..))
            }
            other => layout(other).is_some(),
        }
    }

    /// Copies `batch` to `device` on `stream`, each column's memory reserved
    /// in the device budget (`memory_fraction` of it at most). Call it from
    /// a blocking thread. Returns once the copies are enqueued.
    pub fn upload(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        batch: &RecordBatch,
        memory_fraction: f64,
        timer: &mut PhaseTimer,
    ) -> Result<Self> {
        let columns = batch
            .columns()
            .iter()
            .map(|column| match column.data_type() {
                DataType::Dictionary(..) => {
                    let dictionary = column.as_any_dictionary();
                    let codes = dictionary.keys();
                    Ok(DeviceArray::Dictionary {
                        codes: upload_column(device, stream, codes, memory_fraction, timer)?,
                        dictionary: Arc::clone(dictionary.values()),
                    })
                }
                _ => Ok(DeviceArray::Plain(upload_column(
                    device,
                    stream,
                    column.as_ref(),
                    memory_fraction,
                    timer,
                )?)),
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            schema: batch.schema(),
            rows: batch.num_rows(),
            columns,
        })
    }

    /// Copies the batch back to the host as a record batch equal to the one
    /// uploaded, and waits for the copies.
    pub fn download(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> Result<RecordBatch> {
        let columns = self
            .columns
            .iter()
            .zip(self.schema.fields())
            .map(|(column, field)| match (column, field.data_type()) {
                (DeviceArray::Plain(column), data_type) => {
                    array_of(data_type, &column.download(device, stream, timer)?)
                }
                (DeviceArray::Dictionary { codes, dictionary }, DataType::Dictionary(key, _)) => {
                    let codes = array_of(key, &codes.download(device, stream, timer)?)?;
                    dictionary_of(key, codes, Arc::clone(dictionary))
                }
                (DeviceArray::Dictionary { .. }, other) => Err(DataFusionError::Internal(
                    format!("a dictionary column on the device has type {other}"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }

    /// The batch's schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows in the batch.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The device columns, in the schema's order.
    pub fn columns(&self) -> &[DeviceArray] {
        &self.columns
    }

    /// Bytes the batch's columns hold reserved in the device budget.
    pub fn reserved_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|column| match column {
                DeviceArray::Plain(column) => column.reserved_bytes(),
                DeviceArray::Dictionary { codes, .. } => codes.reserved_bytes(),
            })
            .sum()
    }

    /// Device memory the batch holds, padding included.
    pub fn device_bytes(&self) -> usize {
        self.columns
            .iter()
            .map(|column| match column {
                DeviceArray::Plain(column) => column.device_bytes(),
                DeviceArray::Dictionary { codes, .. } => codes.device_bytes(),
            })
            .sum()
    }
}

/// How a type's values lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `width` bytes a value.
    Fixed(usize),
    /// One bit a value.
    Bits,
    /// Offsets of `width` bytes into a buffer of bytes.
    Variable(usize),
}

fn layout(data_type: &DataType) -> Option<Layout> {
    match data_type {
        DataType::Boolean => Some(Layout::Bits),
        DataType::Utf8 | DataType::Binary => Some(Layout::Variable(4)),
        DataType::LargeUtf8 | DataType::LargeBinary => Some(Layout::Variable(8)),
        other => other.primitive_width().map(Layout::Fixed),
    }
}

/// The host buffers of `array` as the device column holds them: values,
/// bits and validity from bit 0, offsets from 0 (sliced arrays are
/// realigned, copying only what must move).
fn upload_column(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    array: &dyn Array,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> Result<DeviceColumn> {
    let data_type = array.data_type();
    let Some(layout) = layout(data_type) else {
        return Err(DataFusionError::NotImplemented(format!(
            "columns of type {data_type} cannot be copied to the device"
        )));
    };
    let data = array.to_data();
    let (offset, rows) = (data.offset(), data.len());
    let validity = data.nulls().map(|nulls| nulls.inner().sliced());
    let (values, offsets): (Buffer, Option<Buffer>) = match layout {
        Layout::Fixed(width) => {
            let bytes = &data.buffers()[0].as_slice()[offset * width..(offset + rows) * width];
            (Buffer::from_slice_ref(bytes), None)
        }
        Layout::Bits => (
            BooleanBuffer::new(data.buffers()[0].clone(), offset, rows).sliced(),
            None,
        ),
        Layout::Variable(4) => {
            let offsets = &data.buffer::<i32>(0)[offset..=offset + rows];
            rebased(offsets, data.buffers()[1].as_slice())
        }
        Layout::Variable(_) => {
            let offsets = &data.buffer::<i64>(0)[offset..=offset + rows];
            rebased(offsets, data.buffers()[1].as_slice())
        }
    };
    let host = HostColumn {
        rows,
        values: values.as_slice(),
        validity: validity.as_ref().map(Buffer::as_slice),
        offsets: offsets.as_ref().map(Buffer::as_slice),
    };
    Ok(DeviceColumn::upload(
        device,
        stream,
        &host,
        memory_fraction,
        timer,
    )?)
}

/// `offsets` made to start at 0, and the bytes they cover.
fn rebased<O>(offsets: &[O], bytes: &[u8]) -> (Buffer, Option<Buffer>)
where
    O: Copy + Into<i64> + TryFrom<i64> + datafusion::arrow::datatypes::ArrowNativeType,
{
    let first: i64 = offsets[0].into();
    let last: i64 = offsets[offsets.len() - 1].into();
    let values = Buffer::from_slice_ref(&bytes[first as usize..last as usize]);
    let offsets = match first {
        0 => Buffer::from_slice_ref(offsets),
        _ => Buffer::from_iter(offsets.iter().map(|&o| {
            let o: i64 = o.into();
            O::try_from(o - first).unwrap_or_else(|_| unreachable!("a smaller offset fits"))
        })),
    };
    (values, Some(offsets))
}

/// The Arrow array of `data_type` whose buffers came back from the device.
fn array_of(data_type: &DataType, host: &HostColumn<Buffer>) -> Result<ArrayRef> {
    let nulls = host
        .validity
        .as_ref()
        .map(|bits| NullBuffer::new(BooleanBuffer::new(bits.clone(), 0, host.rows)));
    let mut buffers = Vec::with_capacity(2);
    buffers.extend(host.offsets.clone());
    buffers.push(host.values.clone());
    let data = ArrayData::builder(data_type.clone())
        .len(host.rows)
        .nulls(nulls)
        .buffers(buffers)
        .build()?;
    Ok(make_array(data))
}

/// The dictionary array of `codes` (of type `key`) into `dictionary`.
fn dictionary_of(key: &DataType, codes: ArrayRef, dictionary: ArrayRef) -> Result<ArrayRef> {
    fn typed<K: ArrowDictionaryKeyType>(codes: ArrayRef, dictionary: ArrayRef) -> Result<ArrayRef> {
        let codes = codes.as_primitive::<K>().clone();
        Ok(Arc::new(DictionaryArray::<K>::try_new(codes, dictionary)?))
    }
    match key {
        DataType::Int8 => typed::<Int8Type>(codes, dictionary),
        DataType::Int16 => typed::<Int16Type>(codes, dictionary),
        DataType::Int32 => typed::<Int32Type>(codes, dictionary),
        DataType::Int64 => typed::<Int64Type>(codes, dictionary),
        DataType::UInt8 => typed::<UInt8Type>(codes, dictionary),
        DataType::UInt16 => typed::<UInt16Type>(codes, dictionary),
        DataType::UInt32 => typed::<UInt32Type>(codes, dictionary),
        DataType::UInt64 => typed::<UInt64Type>(codes, dictionary),
        other => Err(DataFusionError::Internal(format!(
            "dictionary key type {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{IntervalUnit, TimeUnit};

    #[test]
    fn supported_types_are_those_with_an_arrow_layout_the_device_holds() {
        for supported in [
            DataType::Int8,
            DataType::UInt64,
            DataType::Float64,
            DataType::Decimal128(38, 2),
            DataType::Date32,
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            DataType::Interval(IntervalUnit::MonthDayNano),
            DataType::Boolean,
            DataType::Utf8,
            DataType::LargeBinary,
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ] {
            assert!(DeviceBatch::supports(&supported), "{supported}");
        }
        for unsupported in [
            DataType::Utf8View,
            DataType::Null,
            DataType::new_list(DataType::Int64, true),
            DataType::Dictionary(Box::new(DataType::Float32), Box::new(DataType::Utf8)),
        ] {
            assert!(!DeviceBatch::supports(&unsupported), "{unsupported}");
        }
    }

    #[test]
    fn sliced_offsets_start_at_zero_and_cover_only_their_bytes() {
        let offsets: [i32; 4] = [3, 5, 5, 9];
        let (values, rebased_offsets) = rebased(&offsets, b"abcdefghijkl");
        assert_eq!(values.as_slice(), b"defghi");
        let rebased_offsets = rebased_offsets.unwrap();
        assert_eq!(rebased_offsets.typed_data::<i32>(), &[0, 2, 2, 6]);
    }
}
