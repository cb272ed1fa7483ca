//! Each side's key words as the device sorts them: raw words or codes over
//! the two sides' joint key range, and whether they arrive ascending.

use super::*;

/// The values `side`'s raw keys span, found on the device on `stream`
/// (words XORed with `flip` compare as the values do); `(1, 0)` without
/// keys.
pub(super) fn device_key_range(
    device: &GpuDevice,
    side: &SortedSide,
    stream: &Arc<DeviceStream>,
    flip: u64,
    timer: &mut PhaseTimer,
) -> GpuResult<(i128, i128)> {
    Ok(match side.key_range(device, stream, flip, timer)? {
        Some((low, high)) => (raw_word_value(low, flip), raw_word_value(high, flip)),
        None => (1, 0),
    })
}

/// The smallest range holding both (`max < min`: empty).
pub(super) fn union_of_ranges(a: (i128, i128), b: (i128, i128)) -> (i128, i128) {
    match (a.0 <= a.1, b.0 <= b.1) {
        (true, true) => (a.0.min(b.0), a.1.max(b.1)),
        (true, false) => a,
        (false, _) => b,
    }
}

/// How the codes the device sorts are made.
#[derive(Debug, Clone, Copy)]
pub(super) enum KeyCoding {
    /// Fixed on the host from both sides' value ranges: codes of `bits`
    /// bits, which the device makes from raw keys by `transform` where
    /// given (else the host made them).
    Known {
        bits: u32,
        transform: Option<CodeTransform>,
    },
    /// One raw 8-byte key column without NULLs, both sides sorted on the
    /// device: the device finds the value range (words XORed with `flip`
    /// compare as the values do) before it codes and sorts them.
    RangeOnDevice { flip: u64 },
}

/// One side's join keys as they go to the device.
pub(super) enum SideKeys {
    /// Order-preserving codes made on the host.
    Coded(Vec<u64>),
    /// The key column's own values, batch by batch, which the device codes
    /// (see [`OrderedKeyEncoder::device_transform`]).
    Raw(Vec<ScalarBuffer<u64>>),
}

impl SideKeys {
    /// The keys of one side (its rows, key expressions, and their values
    /// batch by batch): raw where `transform` is given, else made
    /// contiguous and coded on `threads` threads.
    pub(super) fn new(
        encoder: &OrderedKeyEncoder,
        transform: Option<CodeTransform>,
        (rows, on, pieces): (&ArrivedBatches, &[PhysicalExprRef], &[Vec<ArrayRef>]),
        side: KeySide,
        threads: usize,
    ) -> Result<Self> {
        Ok(match (transform, pieces) {
            (Some(_), [column]) => Self::Raw(column.iter().map(raw_words).collect()),
            _ => {
                let columns = rows.concat_key_pieces(on, pieces, threads)?;
                Self::Coded(encoder.encode(&columns, side, threads)?)
            }
        })
    }

    /// One raw key column's values, batch by batch, as they are.
    pub(super) fn raw(pieces: &[Vec<ArrayRef>]) -> Self {
        Self::Raw(pieces.iter().flatten().map(raw_words).collect())
    }

    /// The keys, in row order, in pieces.
    pub(super) fn pieces(&self) -> Vec<&[u64]> {
        match self {
            Self::Coded(codes) => vec![codes.as_slice()],
            Self::Raw(pieces) => pieces.iter().map(|p| &p[..]).collect(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.pieces().iter().map(|p| p.len()).sum()
    }

    /// Whether the keys cross the bus straight from pinned host memory
    /// (codes made on the host never do).
    pub(super) fn in_pinned_memory(&self) -> bool {
        let pieces = self.pieces();
        let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
        in_pinned_memory(&bytes)
    }

    /// Whether the codes ascend (raw keys coded by `transform` first).
    pub(super) fn ascending(&self, transform: Option<CodeTransform>) -> bool {
        // Codes made on the host are compared as they are.
        let transform = match self {
            Self::Raw(_) => transform,
            Self::Coded(_) => None,
        };
        let mut last = 0;
        self.pieces()
            .into_iter()
            .flatten()
            .map(|&key| transform.map_or(key, |t| t.code(key)))
            .all(|key| std::mem::replace(&mut last, key) <= key)
    }
}

/// Why the device part stopped: the device (which may mean falling back to
/// the CPU) or the host work on its output.
pub(super) enum DeviceFailure {
    Gpu(GpuError),
    Host(DataFusionError),
}

impl From<GpuError> for DeviceFailure {
    fn from(e: GpuError) -> Self {
        DeviceFailure::Gpu(e)
    }
}
