//! A filtering scan of one chunk of table rows on the device: the scan
//! interpreter's program keeps rows by its predicate, and the kept rows'
//! output registers come back packed, in row order (count the kept rows
//! per tile, an exclusive prefix sum of the counts, write each kept row at
//! its place, copy the outputs back).

use std::sync::Arc;

use crate::gpu::launch::{FilterLaunch, FilterProgram, ScanChunk};
use crate::gpu::{
    alloc_zeroed, download_u64, DeviceStream, DriverResultExt, GpuDevice, GpuResult, PhaseTimer,
    ReservationKind,
};
use crate::ops::scan::exclusive_scan;

/// The rows a filtering scan kept, output by output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilteredRows {
    /// Rows kept.
    pub rows: usize,
    /// Output `o`'s words are `values[o * rows..(o + 1) * rows]`: an i64,
    /// or an f64's bits, as the program's register held it.
    pub values: Vec<u64>,
    /// Output `o`'s validity likewise, one byte a row (1 valid, 0 NULL).
    pub valid: Vec<u8>,
    /// An i64 overflowed in the program, or a dictionary code fell outside
    /// its table: the rows are not the filter's.
    pub overflowed: bool,
}

impl FilteredRows {
    /// Output `output`'s words.
    pub fn values_of(&self, output: usize) -> &[u64] {
        &self.values[output * self.rows..(output + 1) * self.rows]
    }

    /// Output `output`'s validity bytes.
    pub fn valid_of(&self, output: usize) -> &[u8] {
        &self.valid[output * self.rows..(output + 1) * self.rows]
    }
}

/// Runs `program` over `chunk` on `stream` and copies the kept rows'
/// outputs back; the device memory of the outputs is reserved in the
/// budget (within `memory_fraction` of the device) while they are made.
pub fn filter_chunk(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    chunk: &ScanChunk<'_>,
    program: &FilterProgram<'_>,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<FilteredRows> {
    let launch = FilterLaunch::new(device, device.launcher(stream), chunk, program, timer)?;
    let ran = run(device, stream, &launch, program.outputs.len(), memory_fraction, timer);
    // The kernels read the chunk's columns through raw addresses: whatever
    // happened, they finish before the chunk's borrow ends.
    let waited = stream.synchronize().during("waiting for scan_filter");
    drop(launch);
    let rows = ran?;
    waited?;
    Ok(rows)
}

fn run(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    launch: &FilterLaunch<'_>,
    outputs: usize,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<FilteredRows> {
    let tiles = launch.tiles();
    if tiles == 0 {
        return Ok(FilteredRows::default());
    }
    // One more entry than tiles: after the prefix sum it holds the total.
    let mut starts = alloc_zeroed::<u64>(stream, tiles + 1, "allocating the filter's tile counts")?;
    // One word, of which the kernels write the low 4 bytes (a u32).
    let mut overflow = alloc_zeroed::<u64>(stream, 1, "allocating the filter's overflow flag")?;
    launch.count(&mut starts, &mut overflow, timer)?;
    exclusive_scan(device, stream, &mut starts, tiles + 1)?;
    let mut total = Vec::with_capacity(1);
    download_u64(device, stream, &starts.slice(tiles..tiles + 1), &mut total, timer)?;
    let mut flag = Vec::with_capacity(1);
    download_u64(device, stream, &overflow.as_view(), &mut flag, timer)?;
    let overflowed = flag.first().is_some_and(|&word| word != 0);
    let rows = total.first().copied().unwrap_or(0) as usize;
    if overflowed || rows == 0 || outputs == 0 {
        return Ok(FilteredRows {
            rows,
            values: Vec::new(),
            valid: vec![],
            overflowed,
        });
    }
    let slots = rows * outputs;
    let _reservation = device.budget().reserve(
        8 * slots + slots.div_ceil(8) * 8,
        memory_fraction,
        ReservationKind::Transient,
    )?;
    let mut values = alloc_zeroed::<u64>(stream, slots, "allocating the filter's output values")?;
    let mut valid = alloc_zeroed::<u64>(stream, slots.div_ceil(8), "allocating the filter's output validity")?;
    launch.write(&starts, rows, &mut values, &mut valid, &mut overflow, timer)?;
    let mut value_words = Vec::with_capacity(slots);
    download_u64(device, stream, &values.as_view(), &mut value_words, timer)?;
    let mut valid_words = Vec::with_capacity(slots.div_ceil(8));
    download_u64(device, stream, &valid.as_view(), &mut valid_words, timer)?;
    download_u64(device, stream, &overflow.as_view(), &mut flag, timer)?;
    let mut valid_bytes: Vec<u8> = valid_words.iter().flat_map(|w| w.to_le_bytes()).collect();
    valid_bytes.truncate(slots);
    Ok(FilteredRows {
        rows,
        values: value_words,
        valid: valid_bytes,
        overflowed: flag.first().is_some_and(|&word| word != 0),
    })
}

/// CPU references.
#[cfg(any(test, feature = "test-support"))]
pub mod reference {
    /// The rows `keep` keeps, in order, and each one's outputs: `rows`
    /// rows, output `o` of row `r` at `outputs(r)[o]`.
    pub fn filter(
        rows: usize,
        output_count: usize,
        keep: impl Fn(usize) -> bool,
        outputs: impl Fn(usize) -> Vec<(u64, bool)>,
    ) -> super::FilteredRows {
        let kept: Vec<usize> = (0..rows).filter(|&r| keep(r)).collect();
        let mut values = vec![0; kept.len() * output_count];
        let mut valid = vec![0; kept.len() * output_count];
        for (place, &row) in kept.iter().enumerate() {
            for (o, (value, is_valid)) in outputs(row).into_iter().enumerate() {
                values[o * kept.len() + place] = value;
                valid[o * kept.len() + place] = u8::from(is_valid);
            }
        }
        super::FilteredRows {
            rows: kept.len(),
            values,
            valid,
            overflowed: false,
        }
    }
}
