//! A chunk's remap table (the tables the interpreter's code tests, join key
//! tests and `LIKE` patterns look up, held in pieces, never copied on the
//! host), and the copies on a device that chunks sharing the same tables
//! share. A scan whose tables are shared by all its parts (join key sets,
//! LIKE patterns; not a part's own dictionary tests) would copy them again
//! for each part: a key set over a wide span of keys is megabytes.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};
use datafusion::arrow::datatypes::ToByteSlice;

use crate::gpu::{upload_byte_pieces, GpuDevice, GpuResult, PhaseTimer};

/// 32-bit words a remap table holds, shared rather than copied: a join key
/// set's bitmap (up to megabytes) is the same table for every chunk of a
/// scan, and goes to the device from where it lies.
pub type SharedWords = Arc<dyn AsRef<[u32]> + Send + Sync>;

/// A chunk's remap table: where each key's table starts within it (one word
/// a key, counted from the table's first word), then the tables, end to
/// end, held in pieces.
#[derive(Clone, Default)]
pub struct RemapTable {
    pieces: Vec<SharedWords>,
    len: usize,
}

impl RemapTable {
    /// The table of `tables`, key `k`'s table being `tables[k]`.
    pub fn new(tables: Vec<SharedWords>) -> Self {
        let mut starts = Vec::with_capacity(tables.len());
        let mut start = tables.len();
        for table in &tables {
            starts.push(start as u32);
            start += table.as_ref().as_ref().len();
        }
        let mut pieces: Vec<SharedWords> = Vec::with_capacity(1 + tables.len());
        pieces.push(Arc::new(starts));
        pieces.extend(tables);
        Self { pieces, len: start }
    }

    /// A table given word by word, its starts included (as the kernel reads
    /// it).
    #[cfg(any(test, feature = "test-support"))]
    pub fn from_words(words: Vec<u32>) -> Self {
        let len = words.len();
        Self {
            pieces: vec![Arc::new(words)],
            len,
        }
    }

    /// Its words.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `other` holds the very same tables (the same shared words,
    /// not only equal ones; the starts follow from their lengths): then one
    /// copy on the device serves both.
    pub fn same_tables(&self, other: &RemapTable) -> bool {
        self.len == other.len
            && self.pieces.len() == other.pieces.len()
            && self.pieces.iter().zip(&other.pieces).skip(1).all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Whether every table holds a word: a table of none (a join key set
    /// not read yet) is made afresh for each chunk.
    pub(super) fn tables_hold_words(&self) -> bool {
        self.pieces.iter().skip(1).all(|piece| !piece.as_ref().as_ref().is_empty())
    }

    /// Its words on the device, and one word more (the kernels take an
    /// address).
    pub(super) fn upload(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let mut bytes = self.byte_pieces();
        bytes.push(&[0; 4]);
        upload_byte_pieces(device, stream, &bytes, timer)
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Word `index`, if the table holds it.
    pub fn word(&self, index: usize) -> Option<u32> {
        let mut at = index;
        for piece in &self.pieces {
            let words = piece.as_ref().as_ref();
            match words.get(at) {
                Some(&word) => return Some(word),
                None => at -= words.len(),
            }
        }
        None
    }

    /// Its bytes as the kernel reads them (32-bit little-endian words), in
    /// pieces, none copied.
    pub fn byte_pieces(&self) -> Vec<&[u8]> {
        self.pieces
            .iter()
            .map(|piece| piece.as_ref().as_ref().to_byte_slice())
            .collect()
    }
}

// The kernels read the remap table's words as little-endian, and the
// table's pieces go to the device as they lie in host memory.
#[cfg(target_endian = "big")]
compile_error!("the device reads host words as little-endian");


/// Copies kept past one chunk: at most this many, then tables are copied
/// for each chunk again (a scan holds one set of tables, or a few).
const MAX_KEPT: usize = 8;

/// Remap tables on their devices, kept for the chunks that share them; the
/// copies are freed when it is dropped (with the plan node that holds it).
#[derive(Default)]
pub struct RemapUploads {
    kept: Mutex<Vec<KeptRemap>>,
}

struct KeptRemap {
    device: u64,
    /// The tables, held so that their words stay the ones copied.
    table: RemapTable,
    words: Arc<CudaSlice<u64>>,
}

impl std::fmt::Debug for RemapUploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map_or(0, |kept| kept.len());
        f.debug_struct("RemapUploads").field("kept", &kept).finish()
    }
}

impl RemapUploads {
    /// `table` on `device`: the copy made for a chunk with the same tables
    /// before (see [`RemapTable::same_tables`]), or a new one, copied on
    /// `stream` and kept where every table holds words.
    pub fn on_device(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        table: &RemapTable,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Arc<CudaSlice<u64>>> {
        // Held while copying: the partitions of a scan starting together
        // wait for one copy rather than each making its own.
        let mut kept = match self.kept.lock() {
            Ok(kept) => kept,
            Err(poisoned) => poisoned.into_inner(),
        };
        let same = |entry: &&KeptRemap| entry.device == device.id() && entry.table.same_tables(table);
        if let Some(entry) = kept.iter().find(same) {
            return Ok(Arc::clone(&entry.words));
        }
        let words = Arc::new(table.upload(device, stream, timer)?);
        if kept.len() < MAX_KEPT && table.tables_hold_words() {
            kept.push(KeptRemap {
                device: device.id(),
                table: table.clone(),
                words: Arc::clone(&words),
            });
        }
        Ok(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_the_same_only_where_they_are_the_very_same_words() {
        let keys: SharedWords = Arc::new(vec![1u32, 2, 3]);
        let pattern: SharedWords = Arc::new(vec![9u32]);
        let table = RemapTable::new(vec![Arc::clone(&keys), Arc::clone(&pattern)]);
        let again = RemapTable::new(vec![Arc::clone(&keys), Arc::clone(&pattern)]);
        assert!(table.same_tables(&again) && table.same_tables(&table.clone()));
        // Equal words in another allocation, another order, one table fewer.
        let copied = RemapTable::new(vec![Arc::new(vec![1u32, 2, 3]), Arc::clone(&pattern)]);
        assert!(!table.same_tables(&copied));
        assert!(!table.same_tables(&RemapTable::new(vec![Arc::clone(&pattern), Arc::clone(&keys)])));
        assert!(!table.same_tables(&RemapTable::new(vec![Arc::clone(&keys)])));
        // A key set not read yet is an empty table, made for each chunk.
        assert!(table.tables_hold_words());
        assert!(!RemapTable::new(vec![keys, Arc::new(Vec::<u32>::new())]).tables_hold_words());
    }
}
