//! A filtering scan of one chunk of table rows on the device: the scan
//! interpreter's program keeps rows by its predicate, and the kept rows'
//! output registers come back packed, in row order (count the kept rows
//! per tile, an exclusive prefix sum of the counts, write each kept row at
//! its place, copy the outputs back).

use std::sync::Arc;

use datafusion::arrow::buffer::{Buffer, ScalarBuffer};
use datafusion::arrow::datatypes::ToByteSlice;

use crate::gpu::launch::{
    FilterLaunch, FilterProgram, RemapUploads, ScanChunk, ScanColumn, OUTPUT_HAS_NULL, OUTPUT_IS_WIDE,
};
use crate::gpu::{
    alloc_zeroed, download_byte_pieces, download_u64, download_word, DeviceStream, DeviceVec, DriverResultExt, GpuDevice,
    GpuResult, PhaseTimer, ReservationKind,
};
use crate::ops::scan::exclusive_scan;

/// The rows a filtering scan kept, output by output. Two are equal where
/// they keep the same rows with the same words and validity, however the
/// words came back (gathered strings are not compared).
#[derive(Debug, Clone, Default)]
pub struct FilteredRows {
    /// Rows kept.
    pub rows: usize,
    /// Each output's words and validity, `rows` of each; none where no row
    /// was kept or the rows overflowed.
    pub outputs: Vec<FilterOutput>,
    /// An i64 overflowed in the program, or a dictionary code fell outside
    /// its table: the rows are not the filter's.
    pub overflowed: bool,
}

/// One output of the kept rows.
#[derive(Debug, Clone)]
pub struct FilterOutput {
    pub words: OutputWords,
    /// One byte a row (1 valid, 0 NULL); `None` where every row is valid.
    pub valid: Option<Vec<u8>>,
    /// For an output of strings kept as their bytes (its words the rows'
    /// places in the part), the kept rows' strings gathered on the device,
    /// or why they could not be.
    pub strings: Option<Result<KeptStrings, String>>,
}

/// The strings of the kept rows, end to end: row `i`'s between offsets `i`
/// and `i + 1` (equal where it is NULL).
#[derive(Debug, Clone)]
pub struct KeptStrings {
    pub offsets: ScalarBuffer<i32>,
    pub bytes: Buffer,
}

/// An output's words as they came back from the device.
#[derive(Debug, Clone)]
pub enum OutputWords {
    /// One 8-byte word a row: an i64, or an f64's bits, as the program's
    /// register held it.
    Wide(ScalarBuffer<u64>),
    /// Every word was a 32-bit integer sign-extended: that integer, copied
    /// back in half the bytes.
    Narrow(ScalarBuffer<i32>),
}

impl OutputWords {
    /// The rows it holds a word of.
    pub fn rows(&self) -> usize {
        match self {
            OutputWords::Wide(words) => words.len(),
            OutputWords::Narrow(values) => values.len(),
        }
    }

    /// Row `row`'s word, as the register held it.
    pub fn word(&self, row: usize) -> u64 {
        match self {
            OutputWords::Wide(words) => words[row],
            OutputWords::Narrow(values) => i64::from(values[row]) as u64,
        }
    }

    /// Every row's word, as the registers held them.
    pub fn words(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        match self {
            OutputWords::Wide(words) => Box::new(words.iter().copied()),
            OutputWords::Narrow(values) => Box::new(values.iter().map(|&v| i64::from(v) as u64)),
        }
    }
}

impl FilteredRows {
    /// No rows, and no outputs.
    fn empty(overflowed: bool) -> Self {
        FilteredRows {
            rows: 0,
            outputs: Vec::new(),
            overflowed,
        }
    }

    /// Output `output`'s words, or `None` where no row was kept.
    pub fn words_of(&self, output: usize) -> Option<&OutputWords> {
        self.outputs.get(output).map(|o| &o.words)
    }

    /// Output `output`'s validity bytes; `None` where every row is valid.
    pub fn valid_of(&self, output: usize) -> Option<&[u8]> {
        self.outputs.get(output).and_then(|o| o.valid.as_deref())
    }
}

impl PartialEq for FilteredRows {
    fn eq(&self, other: &Self) -> bool {
        let output = |rows: &FilteredRows, o: usize| -> (Vec<u64>, Vec<u8>) {
            match rows.outputs.get(o) {
                Some(output) => (
                    output.words.words().collect(),
                    output.valid.clone().unwrap_or_else(|| vec![1; rows.rows]),
                ),
                None => (Vec::new(), Vec::new()),
            }
        };
        let outputs = match self.rows {
            0 => 0,
            _ => self.outputs.len().max(other.outputs.len()),
        };
        self.rows == other.rows
            && self.overflowed == other.overflowed
            && (0..outputs).all(|o| output(self, o) == output(other, o))
    }
}

/// Runs `program` over `chunk` on `stream` and copies the kept rows'
/// outputs back; the device memory of the outputs is reserved in the
/// budget (within `memory_fraction` of the device) while they are made.
/// Where `strings[o]` names a column of the chunk kept as its bytes, output
/// `o` holds each kept row's place in the chunk, and the kept rows' strings
/// of that column come back too, gathered on the device
/// ([`FilterOutput::strings`]). The chunk's remap table is copied through
/// `remaps` where given: once for all the chunks that share its tables,
/// where that copy fits within `memory_fraction` too.
#[allow(clippy::too_many_arguments)]
pub fn filter_chunk(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    chunk: &ScanChunk<'_>,
    program: &FilterProgram<'_>,
    strings: &[Option<usize>],
    remaps: Option<&RemapUploads>,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<FilteredRows> {
    let launch = FilterLaunch::new(
        device,
        device.launcher(stream),
        chunk,
        program,
        remaps,
        memory_fraction,
        timer,
    )?;
    let outputs = Outputs {
        count: program.outputs.len(),
        strings,
        chunk,
    };
    let ran = run(device, stream, &launch, &outputs, memory_fraction, timer);
    // The kernels read the chunk's columns through raw addresses: whatever
    // happened, they finish before the chunk's borrow ends.
    let waited = stream.synchronize().during("waiting for scan_filter");
    drop(launch);
    let rows = ran?;
    waited?;
    Ok(rows)
}

/// What [`run`] brings back: `count` outputs, those `strings` names with
/// the strings of the chunk's columns.
struct Outputs<'a> {
    count: usize,
    strings: &'a [Option<usize>],
    chunk: &'a ScanChunk<'a>,
}

fn run(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    launch: &FilterLaunch<'_>,
    wanted: &Outputs<'_>,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<FilteredRows> {
    let outputs = wanted.count;
    let tiles = launch.tiles();
    if tiles == 0 {
        return Ok(FilteredRows::default());
    }
    // One more entry than tiles: after the prefix sum it holds the total.
    let mut starts = alloc_zeroed::<u64>(stream, tiles + 1, "allocating the filter's tile counts")?;
    // One word, of which the kernels write the low 4 bytes (a u32).
    let mut overflow = alloc_zeroed::<u64>(stream, 1, "allocating the filter's overflow flag")?;
    // A bit a row: whether the predicate kept it (the write reads them).
    let mut kept_bits = alloc_zeroed::<u64>(stream, launch.kept_bits_words(), "allocating the filter's row marks")?;
    launch.count(&mut starts, &mut kept_bits, &mut overflow, timer)?;
    exclusive_scan(device, stream, &mut starts, tiles + 1)?;
    let rows = download_word(device, stream, &starts.slice(tiles..tiles + 1), "the kept rows' total", timer)? as usize;
    let overflowed = download_word(device, stream, &overflow.as_view(), "the filter's overflow flag", timer)? != 0;
    if overflowed || rows == 0 || outputs == 0 {
        return Ok(FilteredRows {
            rows,
            ..FilteredRows::empty(overflowed)
        });
    }
    let slots = rows * outputs;
    // The words, their validity, and the narrowed copy of those that fit
    // 4 bytes (at most half as large again).
    let _reservation = device.budget().reserve(
        12 * slots + slots.div_ceil(8) * 8,
        memory_fraction,
        ReservationKind::Transient,
    )?;
    let mut values = alloc_zeroed::<u64>(stream, slots, "allocating the filter's output values")?;
    let mut valid = alloc_zeroed::<u64>(stream, slots.div_ceil(8), "allocating the filter's output validity")?;
    let mut output_flags = alloc_zeroed::<u64>(stream, outputs.div_ceil(2), "allocating the filter's output flags")?;
    launch.write(&kept_bits, &starts, rows, &mut values, &mut valid, &mut output_flags, &mut overflow, timer)?;
    let mut flag_words = Vec::with_capacity(outputs.div_ceil(2));
    download_u64(device, stream, &output_flags.as_view(), &mut flag_words, timer)?;
    // Four-byte flags, two to a word, the first in the low half.
    let flags: Vec<u32> = (0..outputs)
        .map(|o| flag_words.get(o / 2).map_or(u32::MAX, |w| (w >> (32 * (o % 2))) as u32))
        .collect();
    let narrow: Vec<usize> = (0..outputs).filter(|&o| flags[o] & OUTPUT_IS_WIDE == 0).collect();
    let narrowed = match narrow.is_empty() {
        true => None,
        false => {
            let mut packed = alloc_zeroed::<u64>(
                stream,
                (rows * narrow.len()).div_ceil(2),
                "allocating the filter's narrowed outputs",
            )?;
            for (j, &o) in narrow.iter().enumerate() {
                launch.narrow(&values, o * rows, rows, &mut packed, j * rows, timer)?;
            }
            let mut words = Vec::with_capacity(packed.len());
            download_u64(device, stream, &packed.as_view(), &mut words, timer)?;
            Some(Buffer::from_vec(words))
        }
    };
    // Each run of outputs side by side that stay 8 bytes a row comes back
    // in one copy.
    let mut out = Vec::with_capacity(outputs);
    let mut o = 0;
    while o < outputs {
        if let (Some(j), Some(packed)) = (narrow.iter().position(|&n| n == o), &narrowed) {
            let words = OutputWords::Narrow(ScalarBuffer::new(packed.clone(), j * rows, rows));
            out.push(FilterOutput { words, valid: None, strings: None });
            o += 1;
            continue;
        }
        let end = (o..outputs).find(|e| narrow.contains(e)).unwrap_or(outputs);
        let mut words = Vec::with_capacity((end - o) * rows);
        download_u64(device, stream, &values.slice(o * rows..end * rows), &mut words, timer)?;
        let words = Buffer::from_vec(words);
        for i in 0..end - o {
            let words = OutputWords::Wide(ScalarBuffer::new(words.clone(), i * rows, rows));
            out.push(FilterOutput { words, valid: None, strings: None });
        }
        o = end;
    }
    if flags.iter().any(|&f| f & OUTPUT_HAS_NULL != 0) {
        let mut valid_words = Vec::with_capacity(slots.div_ceil(8));
        download_u64(device, stream, &valid.as_view(), &mut valid_words, timer)?;
        let valid_bytes = valid_words.to_byte_slice();
        for (o, output) in out.iter_mut().enumerate() {
            if flags[o] & OUTPUT_HAS_NULL != 0 {
                output.valid = Some(valid_bytes[o * rows..(o + 1) * rows].to_vec());
            }
        }
    }
    for (o, output) in out.iter_mut().enumerate() {
        let Some(column) = wanted.strings.get(o).copied().flatten() else {
            continue;
        };
        let Some(column) = wanted.chunk.columns.get(column) else {
            output.strings = Some(Err("a string output without its column".into()));
            continue;
        };
        let at = StringsAt {
            values: &values,
            valid: &valid,
            from: o * rows,
            rows,
        };
        output.strings = Some(gather_strings(device, stream, launch, &at, column, wanted.chunk.rows, memory_fraction, timer)?);
    }
    let overflowed = download_word(device, stream, &overflow.as_view(), "the filter's overflow flag", timer)? != 0;
    Ok(FilteredRows {
        rows,
        outputs: if overflowed { Vec::new() } else { out },
        overflowed,
    })
}

/// Where a string output's kept rows lie: their places in the part at
/// `values[from..from + rows]`, their validity bytes at `from..` of `valid`.
struct StringsAt<'a> {
    values: &'a DeviceVec<u64>,
    valid: &'a DeviceVec<u64>,
    from: usize,
    rows: usize,
}

/// The kept rows' strings of `column` (kept as its bytes, `part_rows`
/// rows), gathered on the device and copied back: their lengths, the
/// lengths' prefix sum (each string's start), the strings end to end; the
/// reason where they cannot be (a row outside the part, more than 2 GiB).
#[allow(clippy::too_many_arguments)]
fn gather_strings(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    launch: &FilterLaunch<'_>,
    at: &StringsAt<'_>,
    column: &ScanColumn<'_>,
    part_rows: usize,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<Result<KeptStrings, String>> {
    let Some((_, part_bytes)) = column.bytes else {
        return Ok(Err("a string output of a column not kept as its bytes".into()));
    };
    let rows = at.rows;
    // The starts, their 4-byte copy, and at most the part's bytes.
    let _reservation = device.budget().reserve(
        12 * (rows + 1) + part_bytes.div_ceil(8) * 8,
        memory_fraction,
        ReservationKind::Transient,
    )?;
    let mut starts = alloc_zeroed::<u64>(stream, rows + 1, "allocating the kept strings' starts")?;
    let mut bad = alloc_zeroed::<u64>(stream, 1, "allocating the kept strings' flag")?;
    launch.string_lengths(at.values, at.from, at.valid, column, part_rows, rows, &mut starts, &mut bad, timer)?;
    exclusive_scan(device, stream, &mut starts, rows + 1)?;
    let total = download_word(device, stream, &starts.slice(rows..rows + 1), "the kept strings' bytes", timer)? as usize;
    if download_word(device, stream, &bad.as_view(), "the kept strings' flag", timer)? != 0 {
        return Ok(Err("a kept row outside its part's strings".into()));
    }
    if total > i32::MAX as usize {
        return Ok(Err("a part's kept strings past 2 GiB".into()));
    }
    let mut gathered = alloc_zeroed::<u64>(stream, total.div_ceil(8).max(1), "allocating the kept strings")?;
    launch.string_copy(at.values, at.from, column, &starts, rows, total, &mut gathered, timer)?;
    // Every start fits 4 bytes (the total does): copied back so.
    let mut packed = alloc_zeroed::<u64>(stream, (rows + 1).div_ceil(2), "allocating the kept strings' offsets")?;
    launch.narrow(&starts, 0, rows + 1, &mut packed, 0, timer)?;
    let mut offsets = Vec::with_capacity(packed.len());
    download_u64(device, stream, &packed.as_view(), &mut offsets, timer)?;
    let offsets = ScalarBuffer::new(Buffer::from_vec(offsets), 0, rows + 1);
    let bytes = match total {
        0 => Buffer::from_vec(Vec::<u8>::new()),
        total => {
            let mut pieces = download_byte_pieces(device, stream, &gathered.as_view(), total, total, 1, timer)?;
            match (pieces.pop(), pieces.is_empty()) {
                (Some(piece), true) => piece,
                _ => return Ok(Err("the kept strings not in one piece".into())),
            }
        }
    };
    Ok(Ok(KeptStrings { offsets, bytes }))
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
        let outputs = match kept.len() {
            0 => Vec::new(),
            rows => (0..output_count)
                .map(|o| super::FilterOutput {
                    words: super::OutputWords::Wide(values[o * rows..(o + 1) * rows].to_vec().into()),
                    valid: Some(valid[o * rows..(o + 1) * rows].to_vec()),
                    strings: None,
                })
                .collect(),
        };
        super::FilteredRows {
            rows: kept.len(),
            outputs,
            overflowed: false,
        }
    }
}
