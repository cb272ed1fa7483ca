//! Join keys coded on many threads (see [`KeyEncoder::encode_parallel`]),
//! from contiguous key columns or from the batches' own pieces.

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::error::{DataFusionError, Result};

use super::{equality_column, raw_keys, Encoding, KeyEncoder, NormalizedKeys};
use crate::gpu::zeroed_for_fill;
use crate::host::parallel::on_row_chunks;

impl KeyEncoder {
    /// Whether [`Self::encode_pieces_parallel`] can code key columns held in
    /// `pieces` in place, and the concatenated columns are not needed after
    /// it: packed keys (exact, so never checked against the columns on the
    /// host) without NULLs.
    pub fn codes_pieces_in_place(&self, pieces: &[Vec<ArrayRef>]) -> bool {
        matches!(self.encoding, Encoding::Packed(_))
            && pieces.iter().flatten().all(|piece| piece.logical_null_count() == 0)
    }

    /// [`Self::encode_parallel`] over key columns held in pieces (per key
    /// column, its arrays batch by batch, every column cut at the same
    /// rows), without concatenating them first: each thread codes its range
    /// of rows piece by piece, into one buffer of keys. For the packed
    /// encoding (see [`Self::codes_pieces_in_place`]).
    pub fn encode_pieces_parallel(
        &self,
        pieces: &[Vec<ArrayRef>],
        threads: usize,
    ) -> Result<NormalizedKeys> {
        if !matches!(self.encoding, Encoding::Packed(_)) {
            return Err(DataFusionError::Internal(
                "only packed keys are coded piece by piece".into(),
            ));
        }
        let batches = pieces.first().map_or(0, Vec::len);
        if pieces.iter().any(|column| column.len() != batches) {
            return Err(DataFusionError::Internal(
                "key columns cut into different numbers of pieces".into(),
            ));
        }
        let by_batch: Vec<Vec<ArrayRef>> = (0..batches)
            .map(|b| pieces.iter().map(|column| equality_column(&column[b])).collect())
            .collect();
        // Where each batch's rows end, counted over all of them.
        let mut ends = Vec::with_capacity(batches);
        let mut rows = 0;
        for columns in &by_batch {
            rows += self.spec.check_columns(columns)?;
            ends.push(rows);
        }
        self.encode_rows_in_parallel(rows, threads, |start, keys, dropped| {
            let end = start + keys.len();
            // The first batch holding row `start` (empty ones skipped).
            let mut batch = ends.partition_point(|&e| e <= start);
            let mut at = start;
            while at < end {
                let first = if batch == 0 { 0 } else { ends[batch - 1] };
                let until = ends[batch].min(end);
                if until > at {
                    let slice: Vec<ArrayRef> = by_batch[batch]
                        .iter()
                        .map(|c| c.slice(at - first, until - at))
                        .collect();
                    let (from, to) = (at - start, until - start);
                    self.encode_into(&slice, &mut keys[from..to], &mut dropped[from..to])?;
                }
                at = until;
                batch += 1;
            }
            Ok(())
        })
    }

    /// [`Self::encode`] on up to `threads` threads, each writing the codes
    /// of a contiguous slice of rows (of at least `MIN_ROWS_PER_THREAD`)
    /// into its own range of one buffer, with the same result as one call
    /// over all rows. One buffer, first touched by the threads that fill
    /// it: a build side of many millions of rows is encoded while every
    /// probe partition waits, so neither a merge of per-thread pieces nor
    /// one thread faulting in hundreds of megabytes may be on that path.
    pub fn encode_parallel(&self, columns: &[ArrayRef], threads: usize) -> Result<NormalizedKeys> {
        let columns: Vec<ArrayRef> = columns.iter().map(equality_column).collect();
        let columns = &columns[..];
        let rows = self.spec.check_columns(columns)?;
        if self.encoding == Encoding::Raw {
            return Ok(raw_keys(&columns[0]));
        }
        self.encode_rows_in_parallel(rows, threads, |start, keys, dropped| {
            let slice: Vec<ArrayRef> = columns.iter().map(|c| c.slice(start, keys.len())).collect();
            self.encode_into(&slice, keys, dropped)
        })
    }

    /// The codes of `rows` rows, written on up to `threads` threads (each
    /// range of at least `MIN_ROWS_PER_THREAD` rows) by `encode_range`
    /// (`encode_into` over the rows from `start`, as many as `keys` holds),
    /// into one buffer, less the rows it drops.
    fn encode_rows_in_parallel(
        &self,
        rows: usize,
        threads: usize,
        encode_range: impl Fn(usize, &mut [u64], &mut [bool]) -> Result<()> + Sync,
    ) -> Result<NormalizedKeys> {
        let threads = threads.min(rows / MIN_ROWS_PER_THREAD).max(1);
        // Both zeroed lazily by the allocator. The threads write every code
        // without reading the buffer first (and mark only the rows they
        // drop): a read before the first write maps the shared zero page,
        // and replacing it on the write costs every core running the
        // process a TLB flush, which can make several threads slower than one.
        let mut keys = zeroed_for_fill::<u64>(rows);
        let mut dropped = zeroed_for_fill::<bool>(rows);
        on_row_chunks(
            &mut keys,
            Some(&mut dropped),
            rows.div_ceil(threads),
            |start, keys, dropped| {
                let dropped = dropped.ok_or_else(|| {
                    DataFusionError::Internal("key encoding without its drop flags".into())
                })?;
                encode_range(start, keys, dropped)
            },
        )?;
        Ok(compact(keys, &dropped))
    }
}

/// Key encoding splits its rows over threads where each gets this many.
const MIN_ROWS_PER_THREAD: usize = 1 << 20;

/// Keeps the rows not marked in `dropped`.
fn compact(keys: Vec<u64>, dropped: &[bool]) -> NormalizedKeys {
    if !dropped.contains(&true) {
        return NormalizedKeys {
            keys: keys.into(),
            row_ids: None,
        };
    }
    let row_ids: Vec<u64> = dropped
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| (!d).then_some(i as u64))
        .collect();
    let keys = row_ids.iter().map(|&i| keys[i as usize]).collect();
    NormalizedKeys {
        keys,
        row_ids: Some(row_ids),
    }
}
