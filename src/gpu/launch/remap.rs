//! A chunk's remap table (the tables the interpreter's code tests, join key
//! tests and `LIKE` patterns look up, held in pieces, never copied on the
//! host), and the copies on a device that chunks sharing the same tables
//! share. A scan whose tables are shared by all its parts (join key sets,
//! LIKE patterns; not a part's own dictionary tests) would copy them again
//! for each part: a key set over a wide span of keys is megabytes. A table
//! mostly of zeros (a key set of few keys over a wide span) crosses the bus
//! as the positions of its set bits, and is made on the device.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};
use datafusion::arrow::datatypes::ToByteSlice;

use super::set_table_bits;
use crate::gpu::{alloc_zeroed, upload_byte_pieces, DriverResultExt, GpuDevice, GpuResult, PhaseTimer};

/// The 32-bit words of one table of a remap table.
pub trait TableWords: Send + Sync {
    /// Its words.
    fn words(&self) -> &[u32];

    /// Where its words are mostly zeros, the position of each bit set in
    /// them (bit `p % 32` of word `p / 32`; a position may come twice):
    /// those go to the device in place of the words. `None` sends the
    /// words.
    fn set_bits(&self) -> Option<&[u32]> {
        None
    }
}

impl TableWords for Vec<u32> {
    fn words(&self) -> &[u32] {
        self
    }
}

/// A table's words, shared rather than copied: a join key set's bitmap (up
/// to megabytes) is the same table for every chunk of a scan, and goes to
/// the device from where it lies.
pub type SharedWords = Arc<dyn TableWords>;

/// A chunk's remap table: where each key's table starts within it (one word
/// a key, counted from the table's first word), then the tables, end to
/// end, held in pieces: the last ones may be sent as their set bits (see
/// [`TableWords::set_bits`]).
#[derive(Clone, Default)]
pub struct RemapTable {
    pieces: Vec<SharedWords>,
    /// How many of `pieces` (the starts included) are sent as their words.
    sent_as_words: usize,
    len: usize,
}

impl RemapTable {
    /// The table of `tables`, key `k`'s table being `tables[k]`. The
    /// kernels find a table's end at the next one's start, so the tables
    /// lie in key order; those after the last one sent as its words are
    /// sent as their set bits where they give them.
    pub fn new(tables: Vec<SharedWords>) -> Self {
        let mut starts = Vec::with_capacity(tables.len());
        let mut start = tables.len();
        for table in &tables {
            starts.push(start as u32);
            start += table.words().len();
        }
        let as_bits = tables.iter().rev().take_while(|table| table.set_bits().is_some()).count();
        let sent_as_words = 1 + tables.len() - as_bits;
        let mut pieces: Vec<SharedWords> = Vec::with_capacity(1 + tables.len());
        pieces.push(Arc::new(starts));
        pieces.extend(tables);
        Self {
            pieces,
            sent_as_words,
            len: start,
        }
    }

    /// A table given word by word, its starts included (as the kernel reads
    /// it).
    #[cfg(any(test, feature = "test-support"))]
    pub fn from_words(words: Vec<u32>) -> Self {
        let len = words.len();
        Self {
            pieces: vec![Arc::new(words)],
            sent_as_words: 1,
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
            && self.sent_as_words == other.sent_as_words
            && self.pieces.len() == other.pieces.len()
            && self.pieces.iter().zip(&other.pieces).skip(1).all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Whether every table holds a word: a table of none (a join key set
    /// not read yet) is made afresh for each chunk.
    pub(super) fn tables_hold_words(&self) -> bool {
        self.pieces.iter().skip(1).all(|piece| !piece.words().is_empty())
    }

    /// Its words on the device, and one word more (the kernels take an
    /// address): the tables sent as their words copied, the others made
    /// there from their set bits in zeroed words.
    pub(super) fn upload(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let (as_words, as_bits) = self.pieces.split_at(self.sent_as_words);
        let mut bytes: Vec<&[u8]> = as_words.iter().map(|p| p.words().to_byte_slice()).collect();
        if as_bits.is_empty() {
            bytes.push(&[0; 4]);
            return upload_byte_pieces(device, stream, &bytes, timer);
        }
        let copied = upload_byte_pieces(device, stream, &bytes, timer)?;
        let mut table =
            alloc_zeroed::<u64>(stream, (self.len + 1).div_ceil(2), "allocating a remap table")?;
        if !copied.is_empty() {
            // The copied words' last u64 may hold a zero past them, over
            // the first word of a table made below (zero until then).
            let mut head = table.slice_mut(0..copied.len());
            stream
                .memcpy_dtod(&copied, &mut head)
                .during("copying a remap table's words into place")?;
        }
        let mut first_word: usize = as_words.iter().map(|p| p.words().len()).sum();
        for piece in as_bits {
            let positions = piece.set_bits().unwrap_or_default();
            let sent = upload_byte_pieces(device, stream, &[positions.to_byte_slice()], timer)?;
            let launcher = device.launcher(stream);
            set_table_bits(&launcher, &mut table, first_word, &sent, positions.len())?;
            first_word += piece.words().len();
        }
        Ok(table)
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Word `index`, if the table holds it.
    pub fn word(&self, index: usize) -> Option<u32> {
        let mut at = index;
        for piece in &self.pieces {
            let words = piece.words();
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
            .map(|piece| piece.words().to_byte_slice())
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

    /// A table sent as the positions of its set bits.
    struct Bits(Vec<u32>, Vec<u32>);

    impl TableWords for Bits {
        fn words(&self) -> &[u32] {
            &self.0
        }

        fn set_bits(&self) -> Option<&[u32]> {
            Some(&self.1)
        }
    }

    #[test]
    fn only_the_last_tables_are_sent_as_their_set_bits_in_key_order() {
        let bits: SharedWords = Arc::new(Bits(vec![0, 4], vec![34]));
        let words: SharedWords = Arc::new(vec![7u32, 8]);
        // A table sent as bits before one sent as words goes as its words:
        // the kernels find a table's end at the next one's start.
        let first = RemapTable::new(vec![Arc::clone(&bits), Arc::clone(&words)]);
        let all: Vec<u32> = (0..7).map_while(|i| first.word(i)).collect();
        assert_eq!(all, [2, 4, 0, 4, 7, 8]);
        assert_eq!(first.sent_as_words, 3);
        let last = RemapTable::new(vec![Arc::clone(&words), Arc::clone(&bits), Arc::clone(&bits)]);
        let all: Vec<u32> = (0..9).map_while(|i| last.word(i)).collect();
        assert_eq!(all, [3, 5, 7, 7, 8, 0, 4, 0, 4]);
        assert_eq!((last.sent_as_words, last.len()), (2, 9));
        assert!(!first.same_tables(&RemapTable::new(vec![words, bits])));
    }
}
