//! One column in device memory, in Arrow's layout: its values (fixed-width
//! values, booleans as bits, or a variable-width column's bytes), a validity
//! bitmap where it has NULLs, and offsets where it is variable-width. It owns
//! its memory and its share of the device budget, both released when it is
//! dropped. Knows bytes, not Arrow types: `encode::device_batch` maps Arrow
//! arrays onto it.
#![cfg_attr(not(any(test, feature = "test-support")), allow(dead_code))]

use std::sync::Arc;

use datafusion::arrow::buffer::{Buffer, MutableBuffer};

use super::{
    download_byte_pieces, upload_byte_pieces, DeviceReservation, DeviceStream, DeviceVec,
    GpuDevice, GpuResult, PhaseTimer, ReservationKind,
};

/// Bytes in device memory, padded to whole 8-byte words (the padding is
/// zero).
pub struct DeviceBytes {
    words: DeviceVec<u64>,
    bytes: usize,
}

impl DeviceBytes {
    /// The buffer's length in bytes, without the padding.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The words that hold the bytes, for kernels.
    pub fn words(&self) -> &DeviceVec<u64> {
        &self.words
    }
}

/// A column's host buffers, as they are copied to the device or come back.
#[derive(Debug, Clone, PartialEq)]
pub struct HostColumn<B> {
    /// Rows in the column.
    pub rows: usize,
    /// Fixed-width values, booleans one bit a row from bit 0, or the bytes
    /// a variable-width column's offsets point into.
    pub values: B,
    /// One bit a row from bit 0, set where the row is valid; `None` where
    /// every row is.
    pub validity: Option<B>,
    /// `rows + 1` offsets (of 4 or 8 bytes) into `values`, the first 0;
    /// `None` for fixed-width columns.
    pub offsets: Option<B>,
}

/// One column in device memory (see the module docs).
pub struct DeviceColumn {
    rows: usize,
    values: DeviceBytes,
    validity: Option<DeviceBytes>,
    offsets: Option<DeviceBytes>,
    reservation: DeviceReservation,
}

impl DeviceColumn {
    /// Copies `host` to `device` on `stream`, reserving its padded bytes in
    /// the device budget (`memory_fraction` of it at most, as a resident
    /// reservation: one that cannot fit fails at once). Call it from a
    /// blocking thread. Returns once the copies are enqueued.
    pub fn upload(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        host: &HostColumn<&[u8]>,
        memory_fraction: f64,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let padded = |bytes: Option<&[u8]>| bytes.map_or(0, |b| b.len().div_ceil(8) * 8);
        let bytes = padded(Some(host.values)) + padded(host.validity) + padded(host.offsets);
        let reservation =
            device
                .budget()
                .reserve(bytes, memory_fraction, ReservationKind::Resident)?;
        let mut upload = |bytes: &[u8]| -> GpuResult<DeviceBytes> {
            Ok(DeviceBytes {
                words: upload_byte_pieces(device, stream, &[bytes], timer)?,
                bytes: bytes.len(),
            })
        };
        Ok(Self {
            rows: host.rows,
            values: upload(host.values)?,
            validity: host.validity.map(&mut upload).transpose()?,
            offsets: host.offsets.map(&mut upload).transpose()?,
            reservation,
        })
    }

    /// Copies the column back to the host and waits for the copies.
    pub fn download(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<HostColumn<Buffer>> {
        let mut download = |bytes: &DeviceBytes| -> GpuResult<Buffer> {
            if bytes.is_empty() {
                return Ok(empty_buffer());
            }
            let pieces = download_byte_pieces(
                device,
                stream,
                &bytes.words.slice(..),
                bytes.bytes,
                bytes.bytes,
                1,
                timer,
            )?;
            Ok(pieces.into_iter().next().unwrap_or_else(empty_buffer))
        };
        Ok(HostColumn {
            rows: self.rows,
            values: download(&self.values)?,
            validity: self.validity.as_ref().map(&mut download).transpose()?,
            offsets: self.offsets.as_ref().map(&mut download).transpose()?,
        })
    }

    /// Rows in the column.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The values (or a variable-width column's bytes).
    pub fn values(&self) -> &DeviceBytes {
        &self.values
    }

    /// The validity bitmap, where the column has NULLs.
    pub fn validity(&self) -> Option<&DeviceBytes> {
        self.validity.as_ref()
    }

    /// The offsets, where the column is variable-width.
    pub fn offsets(&self) -> Option<&DeviceBytes> {
        self.offsets.as_ref()
    }

    /// Bytes the column holds reserved in the device budget.
    pub fn reserved_bytes(&self) -> usize {
        self.reservation.bytes()
    }

    /// Device memory the column holds, padding included.
    pub fn device_bytes(&self) -> usize {
        [Some(&self.values), self.validity.as_ref(), self.offsets.as_ref()]
            .into_iter()
            .flatten()
            .map(|bytes| 8 * bytes.words.len())
            .sum()
    }
}

/// An empty buffer aligned for any Arrow type (an empty `Vec<u8>`'s
/// dangling pointer is aligned for bytes only, which Arrow rejects for wider
/// values).
fn empty_buffer() -> Buffer {
    MutableBuffer::new(0).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_buffer_is_aligned_for_every_arrow_type() {
        // Decimal128 and intervals need 16 bytes; Arrow allocates to 64.
        assert_eq!(empty_buffer().as_ptr().align_offset(16), 0);
        assert!(empty_buffer().is_empty());
    }
}
