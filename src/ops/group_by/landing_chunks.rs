//! Inputs reduced chunk by chunk as they land. Where the rows' groups are
//! numbered before any aggregate is reduced (in partitions, or in a hash
//! table that does not fold the inputs), a column whose reduction reads
//! every row once crosses the bus in chunks, and each chunk is reduced into
//! its groups' slots once it has landed and the groups are numbered, by
//! the group of each of its rows in row order. Whole, the column is reduced
//! only after its last chunk has crossed (in partitions, gathered into the
//! partitions' order first), while the device has little to do during the
//! column's copy, and the whole reduction is left after the last copy. In
//! chunks only the last chunk's reduction is left then, which shortens the
//! device's part of a query with many groups (BENCHMARKS.md has the
//! measurements). The price: numbered in partitions, each row's group is put
//! back in row order (one scatter for all inputs, one more word per row
//! held), and a chunk's atomics meet groups all over the table rather than a
//! partition's few, which costs more device time but runs while the next
//! chunks cross the bus.

use std::ops::Range;
use std::sync::Arc;

use crate::gpu::DeviceStream;

use super::{
    DeviceReduced, ReduceInput, Reduction, ReductionOutputs, UploadedInput,
};
#[cfg(any(test, feature = "test-support"))]
use super::FOLD_CHUNK_ROWS;
use crate::gpu::launch::GroupRows;
use crate::gpu::{DeviceVec, GpuDevice, GpuError, GpuResult, PhaseTimer, StagingWindows};

/// How an aggregation's inputs cross the bus ([`super::group_on_device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputChunks {
    /// Rows a chunk holds, rounded up to a multiple of 64 (a table's fold
    /// reads a chunk's validity bits from the chunk's first word).
    pub rows: usize,
    /// Fold the inputs, chunk by chunk, into a hash table sized from an
    /// estimate of the groups as the rows find their groups, where the
    /// inputs allow it (`table_folds`).
    pub fold_into_table: bool,
    /// Elsewhere, reduce each input whose reduction takes one pass chunk
    /// by chunk as it lands (this module).
    pub reduce_as_they_land: bool,
}

impl InputChunks {
    #[cfg(any(test, feature = "test-support"))]
    /// Whole columns, each reduced once it has crossed the bus.
    pub const WHOLE: Self = Self {
        rows: FOLD_CHUNK_ROWS,
        fold_into_table: false,
        reduce_as_they_land: false,
    };

    #[cfg(any(test, feature = "test-support"))]
    /// Chunks of `rows` rows, folded into a table or reduced as they land,
    /// wherever they can be.
    pub const fn of(rows: usize) -> Self {
        Self {
            rows,
            fold_into_table: true,
            reduce_as_they_land: true,
        }
    }

    /// The rows of a chunk, a multiple of 64.
    pub(super) fn chunk_rows(&self) -> usize {
        self.rows.max(1).next_multiple_of(64)
    }
}

/// Whether `reduction` reads each row once, in any order, so that its rows
/// may be reduced a chunk at a time: every reduction but the deterministic
/// float sum (each group's scale first) and the 128-bit minimum and
/// maximum (each group's high word first).
pub(super) fn reduces_in_one_pass(reduction: Reduction) -> bool {
    match reduction {
        Reduction::Count
        | Reduction::Sum
        | Reduction::Min
        | Reduction::Max
        | Reduction::SumF64
        | Reduction::SumI128 => true,
        Reduction::SumF64Fixed | Reduction::MinI128 | Reduction::MaxI128 => false,
    }
}

/// One chunk of an input on the device: its rows and their values.
pub(super) struct LandedChunk {
    rows: Range<usize>,
    column: UploadedInput,
}

/// Enqueues the copies of `input`'s `rows` rows on `copy_stream`, one chunk
/// of `chunk_rows` rows after the other, through `staging` (pinned words
/// are copied straight from where they lie). A kernel that reads a chunk
/// waits for its copy alone.
pub(super) fn upload_in_chunks(
    staging: &mut StagingWindows<'_>,
    copy_stream: &Arc<DeviceStream>,
    input: &ReduceInput,
    rows: usize,
    chunk_rows: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<LandedChunk>> {
    let mut upload = |words: &super::Words, chunk: &Range<usize>, timer: &mut PhaseTimer| {
        (!words.is_empty())
            .then(|| staging.upload_u64(copy_stream, &words.pieces_in(chunk.clone()), timer))
            .transpose()
    };
    (0..rows)
        .step_by(chunk_rows.max(1))
        .map(|first| {
            let chunk = first..(first + chunk_rows).min(rows);
            let values = upload(&input.values, &chunk, timer)?;
            let high = upload(&input.high_words, &chunk, timer)?;
            Ok(LandedChunk {
                rows: chunk,
                column: UploadedInput { values, high },
            })
        })
        .collect()
}

/// The rows whose groups a chunked reduction reads: the group of each
/// row, in row order, and each input's validity bitmap in row order.
pub(super) struct RowsInRowOrder<'a> {
    /// At least `rows` entries.
    pub(super) groups_of_rows: &'a DeviceVec<u64>,
    pub(super) rows: usize,
    pub(super) bitmaps: &'a [DeviceVec<u64>],
    pub(super) groups: usize,
}

/// Enqueues `input`'s reduction over `chunks` (every one of its rows, in
/// order), each chunk's launch after its own copy; with `key_order`, the
/// results come back in that order of the groups.
pub(super) fn reduce_chunks(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    rows_of: &RowsInRowOrder<'_>,
    input: &ReduceInput,
    chunks: &[LandedChunk],
    key_order: Option<&DeviceVec<u64>>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceReduced> {
    if !reduces_in_one_pass(input.reduction) {
        return Err(GpuError::Invalid(format!(
            "{:?} reduced in chunks",
            input.reduction
        )));
    }
    let rows = rows_of.rows;
    let mut covered = 0;
    let mut outputs =
        ReductionOutputs::new(device, stream, input.reduction, rows_of.groups, timer)?;
    let valid_bits = input
        .valid
        .map(|i| {
            rows_of
                .bitmaps
                .get(i)
                .ok_or_else(|| GpuError::Invalid(format!("no validity bitmap {i}")))
        })
        .transpose()?;
    for chunk in chunks {
        if chunk.rows.start != covered {
            return Err(GpuError::Invalid(format!(
                "a chunk of rows {:?} after {covered} rows",
                chunk.rows
            )));
        }
        covered = chunk.rows.end;
        let group_rows = GroupRows {
            groups_of_rows: Some(rows_of.groups_of_rows),
            rows,
            valid_bits,
            groups: rows_of.groups,
            span: None,
        }
        .chunk(chunk.rows.start, chunk.rows.end);
        outputs.reduce(device, stream, group_rows, input, &chunk.column, timer)?;
    }
    if covered != rows {
        return Err(GpuError::Invalid(format!(
            "chunks of {covered} rows for a column of {rows}"
        )));
    }
    outputs.into_reduced(device, stream, key_order, timer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reductions_that_read_each_row_once_go_in_chunks() {
        let in_chunks: Vec<Reduction> = [
            Reduction::Count,
            Reduction::Sum,
            Reduction::Min,
            Reduction::Max,
            Reduction::SumF64,
            Reduction::SumF64Fixed,
            Reduction::SumI128,
            Reduction::MinI128,
            Reduction::MaxI128,
        ]
        .into_iter()
        .filter(|&r| reduces_in_one_pass(r))
        .collect();
        assert_eq!(
            in_chunks,
            [
                Reduction::Count,
                Reduction::Sum,
                Reduction::Min,
                Reduction::Max,
                Reduction::SumF64,
                Reduction::SumI128
            ]
        );
    }

    #[test]
    fn chunks_start_at_a_word_of_a_bitmap() {
        assert_eq!(InputChunks::of(1).chunk_rows(), 64);
        assert_eq!(InputChunks::of(37).chunk_rows(), 64);
        assert_eq!(InputChunks::of(4_992).chunk_rows(), 4_992);
        assert_eq!(InputChunks::of(0).chunk_rows(), 64);
        assert_eq!(InputChunks::WHOLE.chunk_rows(), FOLD_CHUNK_ROWS);
    }
}
