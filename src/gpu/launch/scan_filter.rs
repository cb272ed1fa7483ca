//! Typed launches of `ptx/scan_filter.cu`: the scan interpreter's program
//! run over one chunk of table rows, counting the rows its predicate keeps
//! per tile and marking each, then writing the kept rows' output registers
//! packed and in row order, from only the instructions those depend on.
//! The program and the chunk are validated once, when the launches are
//! prepared, so the kernels never index outside their registers, columns
//! or remap table.

use cudarc::driver::{CudaSlice, PushKernelArg, SyncOnDrop};

use super::scan_aggregate::{
    check_chunks, check_instructions, check_register, column_addresses, instructions_for,
    le_bytes_u32,
};
use super::{config, grid_stride_blocks, Launcher, RemapUploads, ScanChunk, ScanColumn};
use crate::gpu::{
    upload_byte_pieces, upload_u64, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase,
    PhaseTimer,
};

/// Rows of one tile (`FILTER_TILE` in `ptx/scan_filter.cu`): one block's.
pub const FILTER_TILE: usize = 2048;

/// Bit of an output's flag ([`FilterLaunch::write`]) set where some kept
/// row's output is NULL (`OUTPUT_HAS_NULL` in `ptx/scan_filter.cu`).
pub const OUTPUT_HAS_NULL: u32 = 1;
/// Bit of an output's flag set where some kept row's word is not a 32-bit
/// integer sign-extended (`OUTPUT_IS_WIDE` in `ptx/scan_filter.cu`).
pub const OUTPUT_IS_WIDE: u32 = 2;

/// The program of a filtering scan: `instructions` in order on every row;
/// the row is kept where there is no `predicate` register or it is valid
/// and non-zero; a kept row's `outputs` registers are written.
pub struct FilterProgram<'a> {
    pub instructions: &'a [[i64; 5]],
    pub predicate: Option<u32>,
    pub outputs: &'a [u32],
}

/// A chunk and a program on the device, ready for [`Self::count`] and
/// [`Self::write`]. It holds guards of the chunk's column addresses (the
/// kernels read them through the uploaded address table): the caller waits
/// for the stream before the chunk's borrow ends.
pub struct FilterLaunch<'a> {
    launcher: Launcher<'a>,
    rows: u64,
    columns: CudaSlice<u64>,
    /// The chunk's remap table on the device, perhaps shared with other
    /// chunks (see [`RemapUploads`]).
    remap: std::sync::Arc<CudaSlice<u64>>,
    remap_len: u32,
    program: CudaSlice<u64>,
    instructions: u32,
    predicate: i32,
    /// The instructions the outputs depend on, which the write runs.
    output_program: CudaSlice<u64>,
    output_instructions: u32,
    outputs: CudaSlice<u64>,
    output_count: u32,
    _guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> FilterLaunch<'a> {
    /// Checks `program` against `chunk` (opcodes, register, column and key
    /// operands, the columns' lengths) and uploads both; the chunk's remap
    /// table through `remaps` where given (copied once for the chunks that
    /// share its tables, where the copy fits within `memory_fraction` of
    /// the device's budget). Returns [`GpuError::Invalid`] where they break the
    /// kernels' contract.
    pub fn new(
        device: &GpuDevice,
        launcher: Launcher<'a>,
        chunk: &'a ScanChunk<'a>,
        program: &FilterProgram<'_>,
        remaps: Option<&RemapUploads>,
        memory_fraction: f64,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let stream = launcher.stream;
        check_instructions(program.instructions)?;
        if let Some(predicate) = program.predicate {
            check_register(i64::from(predicate), "the filter's predicate")?;
        }
        for &output in program.outputs {
            check_register(i64::from(output), "a filter output")?;
        }
        check_chunks(std::slice::from_ref(chunk), program.instructions)?;
        let mut guards = Vec::with_capacity(2 * chunk.columns.len());
        let mut addresses = column_addresses(chunk, stream, &mut guards)?;
        // One word at least: the kernels take an address.
        addresses.push(0);
        let columns = upload_u64(device, stream, &addresses, timer)?;
        let remap_len = u32::try_from(chunk.remap.len()).map_err(|_| {
            GpuError::Invalid("a remap table of 2^32 entries or more".into())
        })?;
        let remap = match remaps {
            Some(remaps) => remaps.on_device(device, stream, &chunk.remap, memory_fraction, timer)?,
            None => std::sync::Arc::new(chunk.remap.upload(device, stream, timer)?),
        };
        // Its words and one more: the kernels take an address.
        check(
            2 * remap.len() > chunk.remap.len(),
            "the remap table on the device is shorter than the chunk's",
        )?;
        let device_program = upload_program(device, stream, program.instructions, timer)?;
        // The write runs only what the outputs read; the whole program
        // where a register is read before it is written.
        let output_instructions = instructions_for(program.instructions, program.outputs)
            .unwrap_or_else(|| program.instructions.to_vec());
        let output_program = upload_program(device, stream, &output_instructions, timer)?;
        let outputs = upload_byte_pieces(
            device,
            stream,
            &[&le_bytes_u32(program.outputs.iter().copied().chain([0]))],
            timer,
        )?;
        Ok(Self {
            launcher,
            rows: chunk.rows as u64,
            columns,
            remap,
            remap_len,
            program: device_program,
            // check_instructions bounds it by SCAN_MAX_INSTRUCTIONS.
            instructions: program.instructions.len() as u32,
            predicate: program.predicate.map_or(-1, |r| r as i32),
            // At most the program's instructions.
            output_instructions: output_instructions.len() as u32,
            output_program,
            outputs,
            output_count: program.outputs.len() as u32,
            _guards: guards,
        })
    }

    /// Tiles of [`FILTER_TILE`] rows the chunk spans: the length
    /// [`Self::count`] writes and [`Self::write`] reads.
    pub fn tiles(&self) -> usize {
        (self.rows as usize).div_ceil(FILTER_TILE)
    }

    /// Words of the row marks [`Self::count`] writes and [`Self::write`]
    /// reads: a bit a row.
    pub fn kept_bits_words(&self) -> usize {
        (self.rows as usize).div_ceil(64)
    }

    /// Writes each tile's kept rows to `tile_counts[..tiles]` and marks
    /// each kept row in `kept_bits` (bit `r % 64` of word `r / 64`, of
    /// [`Self::kept_bits_words`] words); an overflow or a bad code sets
    /// `overflow`'s first 4 bytes.
    pub fn count(
        &self,
        tile_counts: &mut CudaSlice<u64>,
        kept_bits: &mut CudaSlice<u64>,
        overflow: &mut CudaSlice<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let tiles = self.tiles();
        if tiles == 0 {
            return Ok(());
        }
        check(tile_counts.len() >= tiles, "the tile counts are shorter than the tiles")?;
        check(kept_bits.len() >= self.kept_bits_words(), "the row marks are fewer than the rows")?;
        check(!overflow.is_empty(), "no overflow flag")?;
        let stream = self.launcher.stream;
        let function = &self.launcher.kernels.scan_filter_count;
        let launch_config = config(tiles as u64)?;
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(function);
            launch
                .arg(&self.columns)
                .arg(&self.rows)
                .arg(&self.program)
                .arg(&self.instructions)
                .arg(self.remap.as_ref())
                .arg(&self.remap_len)
                .arg(&self.predicate)
                .arg(&mut *tile_counts)
                .arg(&mut *kept_bits)
                .arg(&mut *overflow);
            // SAFETY: `columns` holds two addresses per column of the chunk
            // (values of at least `rows` words, or half as many for 4-byte
            // values, and validity of rows / 64 words rounded up, or 0), all
            // checked in `new`; the kernel reads them at rows below `rows`
            // and only columns the program names, which `new` checked lie
            // below the column count. The guards held in `self` keep those
            // slices' reads ordered on the stream, and the caller waits for
            // the stream before the chunk's borrow ends. Registers lie below
            // SCAN_REGISTERS, key operands within `remap` (checked), and the
            // kernel checks each code against remap_len. It writes
            // tile_counts[..tiles] (checked above), the 4-byte marks of the
            // warps whose first row is below `rows` (rows / 32 rounded up:
            // within kept_bits_words words, checked above) and overflow's
            // first 4 bytes (one word, checked).
            unsafe { launch.launch(launch_config) }
                .during("launching scan_filter_count")
                .map(|_| ())
        })
    }

    /// Writes the outputs of the rows [`Self::count`] marked in `kept_bits`
    /// (running only the instructions the outputs depend on): output `o`
    /// of the row at place `p`
    /// to `values[o * capacity + p]` and byte `o * capacity + p` of
    /// `valid` (1 valid, 0 NULL), the places starting at each tile's
    /// `tile_starts` entry, and ORs into the 4-byte flag `o` of
    /// `output_flags` (zeroed by the caller, two to a word, the first in
    /// the low half) [`OUTPUT_HAS_NULL`] and [`OUTPUT_IS_WIDE`] as the
    /// rows find them. A place at or past `capacity` is not written and
    /// sets `overflow`.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        kept_bits: &CudaSlice<u64>,
        tile_starts: &CudaSlice<u64>,
        capacity: usize,
        values: &mut CudaSlice<u64>,
        valid: &mut CudaSlice<u64>,
        output_flags: &mut CudaSlice<u64>,
        overflow: &mut CudaSlice<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let tiles = self.tiles();
        if tiles == 0 || capacity == 0 || self.output_count == 0 {
            return Ok(());
        }
        let slots = capacity
            .checked_mul(self.output_count as usize)
            .ok_or_else(|| GpuError::Invalid("a filter output beyond the address space".into()))?;
        check(tile_starts.len() >= tiles, "the tile starts are shorter than the tiles")?;
        check(kept_bits.len() >= self.kept_bits_words(), "the row marks are fewer than the rows")?;
        check(values.len() >= slots, "the output values are shorter than their rows")?;
        check(valid.len() >= slots.div_ceil(8), "the output validity is shorter than its rows")?;
        check(
            output_flags.len() >= (self.output_count as usize).div_ceil(2),
            "the output flags are fewer than the outputs",
        )?;
        check(!overflow.is_empty(), "no overflow flag")?;
        let stream = self.launcher.stream;
        let function = &self.launcher.kernels.scan_filter_write;
        let launch_config = config(tiles as u64)?;
        let capacity = capacity as u64;
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(function);
            launch
                .arg(&self.columns)
                .arg(&self.rows)
                .arg(&self.output_program)
                .arg(&self.output_instructions)
                .arg(self.remap.as_ref())
                .arg(&self.remap_len)
                .arg(kept_bits)
                .arg(&self.outputs)
                .arg(&self.output_count)
                .arg(tile_starts)
                .arg(&capacity)
                .arg(&mut *values)
                .arg(&mut *valid)
                .arg(&mut *output_flags)
                .arg(&mut *overflow);
            // SAFETY: as for `count` for the chunk, program and remap table
            // (the output program is a subset of the checked instructions,
            // in order); `outputs` holds output_count registers (uploaded
            // whole, each checked below SCAN_REGISTERS). The kernel reads
            // the 4-byte marks of rows below `rows` (within kept_bits_words
            // words, checked) and tile_starts[..tiles] (checked) and writes values and valid
            // only at o * capacity + p for o < output_count and p <
            // capacity: within output_count * capacity words of `values`
            // and bytes of `valid` (both checked above); the 4-byte flags
            // 0..output_count of `output_flags` (checked above); overflow's
            // first 4 bytes.
            unsafe { launch.launch(launch_config) }
                .during("launching scan_filter_write")
                .map(|_| ())
        })
    }

    /// Launches `scan_filter_narrow`: the low 4 bytes of `words[from..from + n]`
    /// written to the 4-byte values `offset..offset + n` of `out` (two to a
    /// word, the first in the low half): the words of an output whose flag
    /// lacks [`OUTPUT_IS_WIDE`], for a copy back half the size.
    pub fn narrow(
        &self,
        words: &CudaSlice<u64>,
        from: usize,
        n: usize,
        out: &mut CudaSlice<u64>,
        offset: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let Launcher { kernels, stream, sm_count } = self.launcher;
        if n == 0 {
            return Ok(());
        }
        let end = from.checked_add(n);
        check(end.is_some_and(|end| end <= words.len()), "narrowed words past their output")?;
        let out_end = offset.checked_add(n);
        check(
            out_end.is_some_and(|end| end.div_ceil(2) <= out.len()),
            "narrowed words past their room",
        )?;
        let (from, n, offset) = (from as u64, n as u64, offset as u64);
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(&kernels.scan_filter_narrow);
            launch
                .arg(words)
                .arg(&from)
                .arg(&n)
                .arg(&mut *out)
                .arg(&offset);
            // SAFETY: the kernel reads words[from..from + n] and writes the
            // 4-byte values offset..offset + n of `out`, both checked above to
            // lie within their slices.
            unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
                .during("launching scan_filter_narrow")
                .map(|_| ())
        })
    }

    /// Launches `scan_filter_string_lengths` over `n` kept rows of a string
    /// output: row `i`'s part row is `words[from + i]`, its validity byte
    /// `from + i` of `valid`; `column` is the part's column of strings kept
    /// as their bytes (`part_rows + 1` narrow offsets and the bytes). Writes
    /// each row's string length to `lengths[i]` (0 where NULL); a row or
    /// offsets outside the part set `bad`'s first 4 bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn string_lengths(
        &self,
        words: &CudaSlice<u64>,
        from: usize,
        valid: &CudaSlice<u64>,
        column: &ScanColumn<'_>,
        part_rows: usize,
        n: usize,
        lengths: &mut CudaSlice<u64>,
        bad: &mut CudaSlice<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let Launcher { kernels, stream, sm_count } = self.launcher;
        if n == 0 {
            return Ok(());
        }
        let Some((_, byte_count)) = column.bytes else {
            return Err(GpuError::Invalid("scan filter: strings of a column not kept as bytes".into()));
        };
        let end = from.checked_add(n);
        check(end.is_some_and(|end| end <= words.len()), "string rows past their output")?;
        check(end.is_some_and(|end| end <= 8 * valid.len()), "string rows past their validity")?;
        check(column.narrow, "string offsets not four bytes each")?;
        check(
            (part_rows + 1).div_ceil(2) <= column.values.len(),
            "string offsets fewer than the part's rows",
        )?;
        check(lengths.len() >= n, "string lengths fewer than the rows")?;
        check(!bad.is_empty(), "no flag for bad strings")?;
        let (from, part_rows, byte_count, n) = (from as u64, part_rows as u64, byte_count as u64, n as u64);
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(&kernels.scan_filter_string_lengths);
            launch
                .arg(words)
                .arg(&from)
                .arg(valid)
                .arg(column.values)
                .arg(&part_rows)
                .arg(&byte_count)
                .arg(&n)
                .arg(&mut *lengths)
                .arg(&mut *bad);
            // SAFETY: the kernel reads words[from..from + n] and validity
            // bytes from..from + n (both checked above to lie within their
            // slices), offsets r and r + 1 of `column.values` only for r <
            // part_rows (it checks each row; the offsets, four bytes each,
            // checked to cover part_rows + 1), and writes lengths[..n]
            // (checked) and bad's first 4 bytes (one word at least, checked).
            unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
                .during("launching scan_filter_string_lengths")
                .map(|_| ())
        })
    }

    /// Launches `scan_filter_string_copy`: the strings whose lengths
    /// [`Self::string_lengths`] found, with nothing bad, laid end to end in
    /// `out` at `starts` (their exclusive prefix sum, `n + 1` entries, the
    /// last `total`), a warp a row.
    #[allow(clippy::too_many_arguments)]
    pub fn string_copy(
        &self,
        words: &CudaSlice<u64>,
        from: usize,
        column: &ScanColumn<'_>,
        starts: &CudaSlice<u64>,
        n: usize,
        total: usize,
        out: &mut CudaSlice<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let Launcher { kernels, stream, sm_count } = self.launcher;
        if n == 0 || total == 0 {
            return Ok(());
        }
        let Some((bytes, _)) = column.bytes else {
            return Err(GpuError::Invalid("scan filter: strings of a column not kept as bytes".into()));
        };
        check(from.checked_add(n).is_some_and(|end| end <= words.len()), "string rows past their output")?;
        check(starts.len() > n, "string starts fewer than the rows and one")?;
        check(total <= 8 * out.len(), "gathered strings past their room")?;
        let (from, n) = (from as u64, n as u64);
        // A warp a row.
        let blocks = grid_stride_blocks(n.saturating_mul(32), sm_count);
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(&kernels.scan_filter_string_copy);
            launch
                .arg(words)
                .arg(&from)
                .arg(column.values)
                .arg(bytes)
                .arg(starts)
                .arg(&n)
                .arg(&mut *out);
            // SAFETY: called, as its contract says, only after
            // `string_lengths` over the same words, validity and column
            // found nothing bad, with `starts` their exclusive prefix sum
            // whose last entry, `total`, fits `out` (checked above): each
            // row of non-zero length then has a part row whose offsets lie
            // in order within the part's bytes, and its copy writes
            // out[starts[i]..starts[i + 1]] within the first `total` bytes.
            // The kernel reads words[from..from + n] (checked) and
            // starts[..n + 1] (checked).
            unsafe { launch.launch(config(blocks)?) }
                .during("launching scan_filter_string_copy")
                .map(|_| ())
        })
    }
}

/// `instructions` on the device, five words each, and one word more (the
/// kernels take an address).
fn upload_program(
    device: &GpuDevice,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    instructions: &[[i64; 5]],
    timer: &mut PhaseTimer,
) -> GpuResult<CudaSlice<u64>> {
    let words: Vec<u64> = instructions
        .iter()
        .flatten()
        .map(|&word| word as u64)
        .chain([0])
        .collect();
    upload_u64(device, stream, &words, timer)
}

fn check(holds: bool, what: &str) -> GpuResult<()> {
    match holds {
        true => Ok(()),
        false => Err(GpuError::Invalid(format!("scan filter: {what}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_matches_the_kernel() {
        let source = include_str!("../../../ptx/scan_filter.cu");
        assert!(source.contains("#define FILTER_ROUNDS 8"));
        assert_eq!(FILTER_TILE, super::super::BLOCK_THREADS as usize * 8);
        assert!(source.contains(&format!("#define OUTPUT_HAS_NULL {OUTPUT_HAS_NULL}u")));
        assert!(source.contains(&format!("#define OUTPUT_IS_WIDE {OUTPUT_IS_WIDE}u")));
    }
}
