//! Remap tables copied to a device once for every chunk that holds the
//! same tables. A scan whose tables are shared by all its parts (join key
//! sets, LIKE patterns; not a part's own dictionary tests) would copy them
//! again for each part: a key set over a wide span of keys is megabytes.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};

use super::RemapTable;
use crate::gpu::{GpuDevice, GpuResult, PhaseTimer};

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
