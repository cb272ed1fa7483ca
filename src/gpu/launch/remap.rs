//! A chunk's remap table (the tables the interpreter's code tests, join key
//! tests and `LIKE` patterns look up, held in pieces, never copied on the
//! host), and the copies on a device that chunks sharing the same tables
//! share. A scan whose tables are shared by all its parts (join key sets,
//! LIKE patterns; not a part's own dictionary tests) would copy them again
//! for each part: a key set over a wide span of keys is megabytes. A table
//! mostly of zeros (a key set of few keys over a wide span) crosses the bus
//! as the positions of its set bits, and is made on the device; a large
//! table the chunks share goes to each device once, and each chunk's table
//! is put together there (the shared tables copied into place, the
//! chunk's own tables, such as its dictionary tests, sent beside them).

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};
use datafusion::arrow::datatypes::ToByteSlice;

use super::set_table_bits;
use crate::gpu::{
    alloc_zeroed, upload_byte_pieces, DeviceReservation, DriverResultExt, GpuDevice, GpuError,
    GpuResult, PhaseTimer,
};

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

    /// Whether every chunk of a scan shares this very table (a join key
    /// set; not a chunk's own dictionary test): a large one then goes to
    /// each device once (see [`RemapUploads`]).
    fn shared_by_chunks(&self) -> bool {
        false
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
/// end, in key order (the kernels find a table's end at the next one's
/// start), held in pieces: a piece may be sent as its set bits (see
/// [`TableWords::set_bits`]).
#[derive(Clone, Default)]
pub struct RemapTable {
    pieces: Vec<SharedWords>,
    len: usize,
    /// Whether it holds tables of its chunk's own (a dictionary's tests):
    /// no other chunk has the same tables, so it is not kept whole.
    tables_of_its_own: bool,
}

impl RemapTable {
    /// The table of `tables`, key `k`'s table being `tables[k]`.
    pub fn new(tables: Vec<SharedWords>) -> Self {
        let mut starts = Vec::with_capacity(tables.len());
        let mut start = tables.len();
        for table in &tables {
            starts.push(start as u32);
            start += table.words().len();
        }
        let mut pieces: Vec<SharedWords> = Vec::with_capacity(1 + tables.len());
        pieces.push(Arc::new(starts));
        pieces.extend(tables);
        Self {
            pieces,
            len: start,
            tables_of_its_own: false,
        }
    }

    /// This table, which holds tables of its chunk's own (made from the
    /// chunk's dictionaries): only the large tables it shares with other
    /// chunks are kept on a device for them (see [`RemapUploads`]).
    pub fn with_tables_of_its_own(self) -> Self {
        Self {
            tables_of_its_own: true,
            ..self
        }
    }

    /// A table given word by word, its starts included (as the kernel reads
    /// it).
    #[cfg(any(test, feature = "test-support"))]
    pub fn from_words(words: Vec<u32>) -> Self {
        let len = words.len();
        Self {
            pieces: vec![Arc::new(words)],
            len,
            tables_of_its_own: false,
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
        self.pieces.iter().skip(1).all(|piece| !piece.words().is_empty())
    }

    /// Its words on the device, and one word more (the kernels take an
    /// address), made afresh: see [`Self::assemble`].
    pub(super) fn upload(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        self.assemble(device, stream, &mut |_, _| Ok(None), timer)
    }

    /// Its words on the device, and one word more (the kernels take an
    /// address). A piece `kept` gives a device copy of (its words, at least
    /// as many as the piece holds) is copied into place on the device, a
    /// piece sent as its set bits is made there, and the runs of pieces
    /// between them are sent as their words; where there are neither, the
    /// whole table is sent as one upload.
    fn assemble(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        kept: &mut KeptPieceOf<'_>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<CudaSlice<u64>> {
        let mut placed = Vec::with_capacity(self.pieces.len());
        for piece in &self.pieces {
            placed.push(match kept(piece, timer)? {
                Some(copy) => Placement::Copied(copy),
                None if piece.set_bits().is_some() => Placement::Made,
                None => Placement::Sent,
            });
        }
        if placed.iter().all(|placement| matches!(placement, Placement::Sent)) {
            let mut bytes = self.byte_pieces();
            bytes.push(&[0; 4]);
            return upload_byte_pieces(device, stream, &bytes, timer);
        }
        let mut table =
            alloc_zeroed::<u64>(stream, (self.len + 1).div_ceil(2), "allocating a remap table")?;
        // The run of pieces sent as their words not yet sent, from `run_at`.
        let mut run: Vec<&[u8]> = Vec::new();
        let (mut run_at, mut at) = (0, 0);
        for (piece, placement) in self.pieces.iter().zip(&placed) {
            let words = piece.words().len();
            if !matches!(placement, Placement::Sent) {
                send_run(device, stream, &mut run, &mut table, run_at, timer)?;
                run_at = at + words;
            }
            match placement {
                Placement::Sent => run.push(piece.words().to_byte_slice()),
                Placement::Copied(copy) => copy_words(stream, copy, &mut table, at, words)?,
                Placement::Made => {
                    let positions = piece.set_bits().unwrap_or_default();
                    made_from_bits(device, stream, &mut table, at, positions, timer)?;
                }
            }
            at += words;
        }
        send_run(device, stream, &mut run, &mut table, run_at, timer)?;
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

/// Where a piece of a remap table comes from on the device.
enum Placement {
    /// Sent as its words, with the pieces beside it that are too.
    Sent,
    /// Made there from its set bits.
    Made,
    /// Copied from a copy of its words already there.
    Copied(Arc<CudaSlice<u64>>),
}

/// The device copy kept of a table of a remap table, if one is (see
/// [`RemapUploads`]).
type KeptPieceOf<'a> =
    dyn FnMut(&SharedWords, &mut PhaseTimer) -> GpuResult<Option<Arc<CudaSlice<u64>>>> + 'a;

/// Sends the pieces of `run` (whole 32-bit words) to the device as one
/// upload and copies them into `table` from its 32-bit word `at`; empties
/// `run`.
fn send_run(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    run: &mut Vec<&[u8]>,
    table: &mut CudaSlice<u64>,
    at: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let words: usize = run.iter().map(|bytes| bytes.len() / 4).sum();
    if words > 0 {
        let sent = upload_byte_pieces(device, stream, run, timer)?;
        copy_words(stream, &sent, table, at, words)?;
    }
    run.clear();
    Ok(())
}

/// Copies the first `words` 32-bit words of `source` into `table` from its
/// 32-bit word `at`, on `stream`.
fn copy_words(
    stream: &Arc<CudaStream>,
    source: &CudaSlice<u64>,
    table: &mut CudaSlice<u64>,
    at: usize,
    words: usize,
) -> GpuResult<()> {
    if words == 0 {
        return Ok(());
    }
    let table_words = 2 * table.len();
    // SAFETY: both are views of 64-bit device words as twice as many 32-bit
    // words, and every bit pattern is a `u32`; `transmute` and
    // `transmute_mut` return `None` where the memory does not hold the
    // words asked for.
    let source = unsafe { source.transmute::<u32>(words) };
    let mut target = unsafe { table.transmute_mut::<u32>(table_words) };
    let into = target.as_mut().and_then(|target| target.try_slice_mut(at..at + words));
    let (Some(source), Some(mut into)) = (source, into) else {
        return Err(GpuError::Invalid(format!(
            "copying {words} words into a remap table of {table_words} at {at}"
        )));
    };
    stream
        .memcpy_dtod(&source, &mut into)
        .during("copying a table into a remap table")
}

/// Sets, in `table`'s zeroed words from its 32-bit word `at`, the bits at
/// `positions` (bit `p % 32` of word `at + p / 32`).
fn made_from_bits(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    table: &mut CudaSlice<u64>,
    at: usize,
    positions: &[u32],
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    if positions.is_empty() {
        return Ok(());
    }
    let sent = upload_byte_pieces(device, stream, &[positions.to_byte_slice()], timer)?;
    set_table_bits(&device.launcher(stream), table, at, &sent, positions.len())
}

/// A table's words alone on the device (made there from its set bits where
/// it is sent so), for chunks to copy into their remap tables.
fn piece_on_device(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    piece: &SharedWords,
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    match piece.set_bits() {
        Some(positions) => {
            let words = piece.words().len().div_ceil(2).max(1);
            let mut table = alloc_zeroed::<u64>(stream, words, "allocating a shared table")?;
            made_from_bits(device, stream, &mut table, 0, positions, timer)?;
            Ok(table)
        }
        None => upload_byte_pieces(device, stream, &[piece.words().to_byte_slice()], timer),
    }
}

// The kernels read the remap table's words as little-endian, and the
// table's pieces go to the device as they lie in host memory.
#[cfg(target_endian = "big")]
compile_error!("the device reads host words as little-endian");


/// Copies kept past one chunk: at most this many, then tables are copied
/// for each chunk again (a scan holds one set of tables, or a few).
const MAX_KEPT: usize = 8;

/// A table the chunks share goes to each device once where it holds at
/// least this many 32-bit words (64 KiB): a join key set over a wide span
/// of keys, which a chunk's own tables would otherwise send again.
pub const SHARED_TABLE_MIN_WORDS: usize = 1 << 14;

/// Shared tables kept on the devices at most.
const MAX_KEPT_TABLES: usize = 16;

/// Remap tables on their devices, kept for the chunks that share them, and
/// the large tables the chunks share, kept for chunks whose other tables
/// differ (see [`TableWords::shared_by_chunks`]); the copies are freed
/// when it is dropped (with the plan node that holds it). A copy is kept
/// only where its bytes are free in the device's budget, and holds them
/// there while it lives; where they are not, each chunk makes its own
/// copy, freed with the chunk, and nothing cached is evicted for it.
#[derive(Default)]
pub struct RemapUploads {
    kept: Mutex<Vec<KeptRemap>>,
    tables: Mutex<Vec<KeptTable>>,
}

/// A shared table's words on a device.
struct KeptTable {
    device: u64,
    /// The table, held so that its words stay the ones copied.
    table: SharedWords,
    words: Arc<CudaSlice<u64>>,
    _memory: DeviceReservation,
}

struct KeptRemap {
    device: u64,
    /// The tables, held so that their words stay the ones copied.
    table: RemapTable,
    words: Arc<CudaSlice<u64>>,
    _memory: DeviceReservation,
}

/// The device bytes of `words`' copy.
fn copy_bytes(words: &CudaSlice<u64>) -> usize {
    8 * words.len()
}

impl std::fmt::Debug for RemapUploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().map_or(0, |kept| kept.len());
        f.debug_struct("RemapUploads").field("kept", &kept).finish()
    }
}

impl RemapUploads {
    /// Device bytes its kept copies hold in their devices' budgets.
    #[cfg(any(test, feature = "test-support"))]
    pub fn reserved_bytes(&self) -> usize {
        // In `on_device`'s order.
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        tables.iter().map(|t| t._memory.bytes()).sum::<usize>()
            + kept.iter().map(|k| k._memory.bytes()).sum::<usize>()
    }

    /// `table` on `device`: the copy made for a chunk with the same tables
    /// before (see [`RemapTable::same_tables`]), or a new one, copied on
    /// `stream` and kept where every table holds words and none is the
    /// chunk's own; a new one's large shared tables are copied from their
    /// copies on the device, made for the first chunk that held them.
    /// A copy is kept where its bytes are free within `memory_fraction` of
    /// the device's budget.
    pub fn on_device(
        &self,
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        table: &RemapTable,
        memory_fraction: f64,
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
        let mut tables = match self.tables.lock() {
            Ok(tables) => tables,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut kept_table = |piece: &SharedWords, timer: &mut PhaseTimer| {
            if !piece.shared_by_chunks() || piece.words().len() < SHARED_TABLE_MIN_WORDS {
                return Ok(None);
            }
            let same = |entry: &&KeptTable| entry.device == device.id() && Arc::ptr_eq(&entry.table, piece);
            if let Some(entry) = tables.iter().find(same) {
                return Ok(Some(Arc::clone(&entry.words)));
            }
            if tables.len() >= MAX_KEPT_TABLES {
                return Ok(None);
            }
            // The words `piece_on_device` allocates: two of the table's a word.
            let bytes = 8 * piece.words().len().div_ceil(2).max(1);
            let Some(memory) = device.budget().reserve_if_free(bytes, memory_fraction) else {
                return Ok(None);
            };
            let words = Arc::new(piece_on_device(device, stream, piece, timer)?);
            tables.push(KeptTable {
                device: device.id(),
                table: Arc::clone(piece),
                words: Arc::clone(&words),
                _memory: memory,
            });
            Ok(Some(words))
        };
        let words = Arc::new(table.assemble(device, stream, &mut kept_table, timer)?);
        if kept.len() < MAX_KEPT && table.tables_hold_words() && !table.tables_of_its_own {
            if let Some(memory) = device.budget().reserve_if_free(copy_bytes(&words), memory_fraction) {
                kept.push(KeptRemap {
                    device: device.id(),
                    table: table.clone(),
                    words: Arc::clone(&words),
                    _memory: memory,
                });
            }
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
    fn tables_sent_as_their_set_bits_keep_their_place_in_key_order() {
        let bits: SharedWords = Arc::new(Bits(vec![0, 4], vec![34]));
        let words: SharedWords = Arc::new(vec![7u32, 8]);
        // The kernels find a table's end at the next one's start: a table
        // sent as its bits lies where its words would.
        let first = RemapTable::new(vec![Arc::clone(&bits), Arc::clone(&words)]);
        let all: Vec<u32> = (0..7).map_while(|i| first.word(i)).collect();
        assert_eq!(all, [2, 4, 0, 4, 7, 8]);
        let last = RemapTable::new(vec![Arc::clone(&words), Arc::clone(&bits), Arc::clone(&bits)]);
        let all: Vec<u32> = (0..10).map_while(|i| last.word(i)).collect();
        assert_eq!(all, [3, 5, 7, 7, 8, 0, 4, 0, 4]);
        assert_eq!(last.len(), 9);
        assert!(!first.same_tables(&RemapTable::new(vec![words, bits])));
    }
}
