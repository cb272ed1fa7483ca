//! Typed launch of `ptx/scan_aggregate.cu`: a register-machine program run
//! over every row of a table's chunks, which filters the rows, picks each
//! one's group and folds registers into per-group accumulators, all in one
//! kernel per chunk. The program is validated here, so the kernel never
//! indexes outside its registers, columns or remap table.

use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg, SyncOnDrop};

use super::{config, grid_stride_blocks, Launcher, RemapTable};
use crate::gpu::{
    alloc_zeroed, download_u64, upload_byte_pieces, upload_u64, DriverResultExt, GpuDevice,
    GpuError, GpuResult, Phase, PhaseTimer,
};

/// Registers of the interpreter (`SCAN_REGISTERS` in `ptx/scan_aggregate.cu`).
pub const SCAN_REGISTERS: usize = 32;
/// Instructions one program holds at most.
pub const SCAN_MAX_INSTRUCTIONS: usize = 256;
/// Words of the kernels' column table per column (`COLUMN_WORDS` in
/// `ptx/interpreter.cuh`).
pub const COLUMN_WORDS: usize = 4;
/// Dynamic shared memory one block's accumulator slots take at most.
pub const SCAN_MAX_SHARED_BYTES: usize = 48 * 1024;
/// Slots (groups times accumulators) one launch holds at most: each takes
/// two words of shared memory.
pub const SCAN_MAX_SLOTS: usize = SCAN_MAX_SHARED_BYTES / 16;

/// The interpreter's instructions, `[op, dst, a, b, c]`, with the opcodes of
/// `ptx/scan_aggregate.cu`. Registers hold an i64 (a double's bits for
/// floats) and a valid flag; an instruction on a NULL input gives NULL
/// unless it says otherwise.
#[repr(i64)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScanOp {
    /// `dst` = column `a`'s i64 at the row; valid as its validity bit.
    LoadI64 = 0,
    /// `dst` = column `a`'s word at the row, the bits of an f64.
    LoadF64 = 1,
    /// `dst` = 1 + key `b`'s global code of column `a`'s dictionary code
    /// (`remap[remap[b] + code]`), 0 for NULL; always valid.
    LoadCode = 2,
    /// `dst` = the immediate `a` (raw bits), valid.
    Const = 3,
    /// `dst` = NULL.
    Null = 4,
    /// `dst` = `a + b`; an overflow flags the launch.
    AddI64 = 5,
    /// `dst` = `a - b`; an overflow flags the launch.
    SubI64 = 6,
    /// `dst` = `a * b`; an overflow flags the launch.
    MulI64 = 7,
    /// `dst` = `-a`; `i64::MIN` flags the launch.
    NegI64 = 8,
    /// `dst` = `a *` the immediate `b` (a decimal rescale); an overflow
    /// flags the launch.
    ScaleI64 = 9,
    /// `dst` = `a + b` on doubles.
    AddF64 = 10,
    /// `dst` = `a - b` on doubles.
    SubF64 = 11,
    /// `dst` = `a * b` on doubles.
    MulF64 = 12,
    /// `dst` = `a / b` on doubles (IEEE: a zero divisor gives inf or NaN).
    DivF64 = 13,
    /// `dst` = `-a` on doubles.
    NegF64 = 14,
    /// `dst` = `a` (an i64) as a double, rounded to nearest.
    I64ToF64 = 15,
    /// `dst` = `a == b` (1 or 0), signed.
    EqI64 = 16,
    /// `dst` = `a != b`.
    NeI64 = 17,
    /// `dst` = `a < b`, signed.
    LtI64 = 18,
    /// `dst` = `a <= b`, signed.
    LeI64 = 19,
    /// `dst` = `a > b`, signed.
    GtI64 = 20,
    /// `dst` = `a >= b`, signed.
    GeI64 = 21,
    /// `dst` = `a == b` on doubles in `f64::total_cmp` order (Arrow's: NaN
    /// equals NaN and lies above +inf, -0.0 lies below +0.0).
    EqF64 = 22,
    /// `dst` = `a != b` on doubles, total order.
    NeF64 = 23,
    /// `dst` = `a < b` on doubles, total order.
    LtF64 = 24,
    /// `dst` = `a <= b` on doubles, total order.
    LeF64 = 25,
    /// `dst` = `a > b` on doubles, total order.
    GtF64 = 26,
    /// `dst` = `a >= b` on doubles, total order.
    GeF64 = 27,
    /// `dst` = `a AND b`, SQL's three-valued logic: false if either is a
    /// valid false, else NULL if either is NULL, else true.
    And = 28,
    /// `dst` = `a OR b`: true if either is a valid true, else NULL if
    /// either is NULL, else false.
    Or = 29,
    /// `dst` = `NOT a`; NULL stays NULL.
    Not = 30,
    /// `dst` = `a IS NULL`, always valid.
    IsNull = 31,
    /// `dst` = `a IS NOT NULL`, always valid.
    IsNotNull = 32,
    /// `dst` = `b` where `a` is valid and non-zero, else `c` (value and
    /// valid flag): `CASE WHEN a THEN b ELSE c END`.
    Select = 33,
    /// `dst` = a string predicate's result on column `a`'s dictionary
    /// code, from key `b`'s table (`remap[remap[b] + code]`: 0 false, 1
    /// true, 2 NULL), or the immediate `c` (the same coding) where the
    /// column is NULL.
    CodeTest = 34,
    /// `dst` = whether column `a`'s integer is in key `b`'s set: a table of
    /// the set's smallest value (two words, low first) and a bitmap of the
    /// values from it; an empty table holds no set yet, and every row
    /// passes. NULL never passes; always valid.
    KeyTest = 35,
    /// `dst` = whether column `a`'s string (a column of strings kept as
    /// their bytes, see [`ScanColumn::bytes`]) matches the LIKE pattern of
    /// key `b`'s table: the segment count, whether the pattern starts with
    /// `%` and whether it ends with one (1 or 0), then per segment its byte
    /// length and its bytes, four to a little-endian word. NULL for a NULL
    /// string.
    Like = 36,
    /// `dst` = the row's index in the chunk, valid where column `a`'s value
    /// is (a column of any kind): how a string kept as its bytes is output.
    RowOf = 37,
}

/// What an instruction's operand `a`, `b` or `c` is to an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operand {
    /// Not read.
    Unused,
    /// A register index.
    Register,
    /// A column index.
    Column,
    /// A key index: where its remap table starts is `remap[key]`.
    Key,
    /// A raw 64-bit value.
    Immediate,
}

impl ScanOp {
    /// Every opcode, at the index of its value.
    const ALL: [ScanOp; 38] = [
        ScanOp::LoadI64,
        ScanOp::LoadF64,
        ScanOp::LoadCode,
        ScanOp::Const,
        ScanOp::Null,
        ScanOp::AddI64,
        ScanOp::SubI64,
        ScanOp::MulI64,
        ScanOp::NegI64,
        ScanOp::ScaleI64,
        ScanOp::AddF64,
        ScanOp::SubF64,
        ScanOp::MulF64,
        ScanOp::DivF64,
        ScanOp::NegF64,
        ScanOp::I64ToF64,
        ScanOp::EqI64,
        ScanOp::NeI64,
        ScanOp::LtI64,
        ScanOp::LeI64,
        ScanOp::GtI64,
        ScanOp::GeI64,
        ScanOp::EqF64,
        ScanOp::NeF64,
        ScanOp::LtF64,
        ScanOp::LeF64,
        ScanOp::GtF64,
        ScanOp::GeF64,
        ScanOp::And,
        ScanOp::Or,
        ScanOp::Not,
        ScanOp::IsNull,
        ScanOp::IsNotNull,
        ScanOp::Select,
        ScanOp::CodeTest,
        ScanOp::KeyTest,
        ScanOp::Like,
        ScanOp::RowOf,
    ];

    /// The opcode of value `code`, if there is one.
    pub fn from_code(code: i64) -> Option<Self> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i))
            .copied()
    }

    /// What the opcode reads in `a`, `b` and `c` (`dst` is always a
    /// register).
    fn operands(self) -> [Operand; 3] {
        use Operand::*;
        use ScanOp::*;
        match self {
            LoadI64 | LoadF64 | RowOf => [Column, Unused, Unused],
            LoadCode => [Column, Key, Unused],
            CodeTest => [Column, Key, Immediate],
            KeyTest | Like => [Column, Key, Unused],
            Const => [Immediate, Unused, Unused],
            Null => [Unused, Unused, Unused],
            ScaleI64 => [Register, Immediate, Unused],
            NegI64 | NegF64 | I64ToF64 | Not | IsNull | IsNotNull => [Register, Unused, Unused],
            Select => [Register, Register, Register],
            AddI64 | SubI64 | MulI64 | AddF64 | SubF64 | MulF64 | DivF64 | EqI64 | NeI64
            | LtI64 | LeI64 | GtI64 | GeI64 | EqF64 | NeF64 | LtF64 | LeF64 | GtF64 | GeF64
            | And | Or => [Register, Register, Unused],
        }
    }
}

/// What an accumulator folds into its slot's two words (`ACC_*` in
/// `ptx/scan_aggregate.cu`). NULLs are skipped by every kind.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccumulatorKind {
    /// The exact 128-bit sum of the register's i64s: (low word, high word)
    /// of its two's complement.
    SumI64 = 0,
    /// The sum of the register's doubles (in no fixed order) and how many
    /// were added: (f64 bits, count).
    SumF64 = 1,
    /// Rows whose register is valid, or every counted row without a
    /// register: (count, unused).
    Count = 2,
    /// The least i64 and how many were seen: (minimum, count); the minimum
    /// means nothing where the count is 0.
    MinI64 = 3,
    /// The greatest i64 and how many were seen: (maximum, count).
    MaxI64 = 4,
}

/// The two words a slot of `kind` holds before any row is added.
pub fn accumulator_init(kind: AccumulatorKind) -> [u64; 2] {
    match kind {
        AccumulatorKind::SumI64 | AccumulatorKind::Count => [0, 0],
        AccumulatorKind::SumF64 => [0f64.to_bits(), 0],
        AccumulatorKind::MinI64 => [i64::MAX as u64, 0],
        AccumulatorKind::MaxI64 => [i64::MIN as u64, 0],
    }
}

/// One column of a chunk on the device: one word per row, and its validity
/// bitmap (bit `r` of word `r / 64` set where row `r` is valid), `None`
/// where every row is valid.
pub struct ScanColumn<'a> {
    pub values: &'a CudaSlice<u64>,
    pub validity: Option<&'a CudaSlice<u64>>,
    /// The values are 4-byte signed integers, two to a word (the first in
    /// the low half), read sign-extended.
    pub narrow: bool,
    /// For strings kept as their bytes: the bytes (padded to whole words)
    /// and how many there are. The values are then `rows + 1` narrow
    /// offsets into them, row `r`'s string lying between offsets `r` and
    /// `r + 1`.
    pub bytes: Option<(&'a CudaSlice<u64>, usize)>,
}

/// `rows` rows of a table on the device: its columns, in the order the
/// program's column indexes name them, and its remap table (the start of
/// each key's table within it first, then the tables, each mapping the
/// chunk's dictionary codes of that key to global codes).
pub struct ScanChunk<'a> {
    pub rows: usize,
    pub columns: Vec<ScanColumn<'a>>,
    pub remap: RemapTable,
}

/// The program run over every row: `instructions` in order; then the row
/// counts where there is no `predicate` register or it is valid and
/// non-zero; its group is the `group` register's value (0 without one),
/// which must lie below `groups` (a row outside sets the output's
/// `overflowed`); and each accumulator folds its register into the group's
/// slot (a `Count` without a register counts the rows).
pub struct ScanProgram<'a> {
    pub instructions: &'a [[i64; 5]],
    pub predicate: Option<u32>,
    pub group: Option<u32>,
    pub groups: u32,
    pub accumulators: &'a [(AccumulatorKind, Option<u32>)],
}

/// What a scan accumulated: slot `g * accumulators + a` (group `g`,
/// accumulator `a`) is `words[2 * slot..2 * slot + 2]`, as its
/// [`AccumulatorKind`] says. Where `overflowed`, an i64 overflowed in the
/// program (or a group or dictionary code fell outside its range): the
/// words are not the aggregate's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanAggregateOutput {
    pub words: Vec<u64>,
    pub overflowed: bool,
}

fn invalid<T>(message: String) -> GpuResult<T> {
    Err(GpuError::Invalid(message))
}

/// A register index in an operand or an option: below [`SCAN_REGISTERS`].
pub(super) fn check_register(register: i64, what: &str) -> GpuResult<()> {
    if !(0..SCAN_REGISTERS as i64).contains(&register) {
        return invalid(format!(
            "{what} names register {register}, outside 0..{SCAN_REGISTERS}"
        ));
    }
    Ok(())
}

/// Checks a program's instructions: how many, their opcodes and their
/// register operands.
pub(super) fn check_instructions(instructions: &[[i64; 5]]) -> GpuResult<()> {
    if instructions.len() > SCAN_MAX_INSTRUCTIONS {
        return invalid(format!(
            "a scan program of {} instructions, at most {SCAN_MAX_INSTRUCTIONS}",
            instructions.len()
        ));
    }
    for (i, instruction) in instructions.iter().enumerate() {
        let Some(op) = ScanOp::from_code(instruction[0]) else {
            return invalid(format!(
                "instruction {i} of a scan program has the unknown opcode {}",
                instruction[0]
            ));
        };
        check_register(
            instruction[1],
            &format!("instruction {i} ({op:?})'s destination"),
        )?;
        for (operand, &value) in op.operands().iter().zip(&instruction[2..]) {
            if *operand == Operand::Register {
                check_register(value, &format!("instruction {i} ({op:?})"))?;
            }
        }
    }
    Ok(())
}

/// The instructions of a checked program (see [`check_instructions`]) that
/// the values of `registers` after it depend on, in their order: each
/// instruction whose result some later kept instruction, or the end, reads
/// before another writes that register. Every instruction writes its
/// destination whole and reads only its register operands, so the kept
/// ones leave `registers` as the whole program does. `None` where some
/// register read is written by no instruction before it (its value then
/// is whatever the program's start leaves there), or an instruction is
/// not checked.
pub(super) fn instructions_for(instructions: &[[i64; 5]], registers: &[u32]) -> Option<Vec<[i64; 5]>> {
    let mut live = [false; SCAN_REGISTERS];
    for &register in registers {
        *live.get_mut(register as usize)? = true;
    }
    let mut kept = vec![false; instructions.len()];
    for (i, instruction) in instructions.iter().enumerate().rev() {
        let op = ScanOp::from_code(instruction[0])?;
        let destination = usize::try_from(instruction[1]).ok()?;
        if !std::mem::take(live.get_mut(destination)?) {
            continue;
        }
        kept[i] = true;
        for (operand, &value) in op.operands().iter().zip(&instruction[2..]) {
            if *operand == Operand::Register {
                *live.get_mut(usize::try_from(value).ok()?)? = true;
            }
        }
    }
    if live.iter().any(|&read| read) {
        return None;
    }
    Some(
        instructions
            .iter()
            .zip(kept)
            .filter_map(|(instruction, kept)| kept.then_some(*instruction))
            .collect(),
    )
}

/// Checks what does not depend on the chunks: opcodes, register operands,
/// the predicate, group and accumulator registers, and the sizes the kernel
/// takes. Returns the slots (groups times accumulators).
fn check_program(program: &ScanProgram<'_>) -> GpuResult<usize> {
    check_instructions(program.instructions)?;
    if let Some(predicate) = program.predicate {
        check_register(i64::from(predicate), "the scan's predicate")?;
    }
    if let Some(group) = program.group {
        check_register(i64::from(group), "the scan's group")?;
    }
    for (kind, register) in program.accumulators {
        match register {
            Some(register) => check_register(i64::from(*register), "an accumulator")?,
            None if *kind == AccumulatorKind::Count => {}
            None => return invalid(format!("a {kind:?} accumulator without a register")),
        }
    }
    if program.groups == 0 {
        return invalid("a scan with no groups".into());
    }
    let slots = (program.groups as usize)
        .checked_mul(program.accumulators.len())
        .filter(|&slots| slots <= SCAN_MAX_SLOTS);
    match slots {
        Some(slots) => Ok(slots),
        None => invalid(format!(
            "{} groups of {} accumulators exceed the scan's {SCAN_MAX_SLOTS} slots",
            program.groups,
            program.accumulators.len()
        )),
    }
}

/// Checks the program's column and key operands against a chunk of
/// `columns` columns and its `remap` table: every column index names a
/// column, every key index an entry of the table whose start lies within
/// it (the kernel checks each code against the table's end itself).
fn check_operands_against_chunk(
    instructions: &[[i64; 5]],
    of_bytes: &[bool],
    remap: &RemapTable,
) -> GpuResult<()> {
    let columns = of_bytes.len();
    for (i, instruction) in instructions.iter().enumerate() {
        let Some(op) = ScanOp::from_code(instruction[0]) else {
            return invalid(format!(
                "instruction {i} has the unknown opcode {}",
                instruction[0]
            ));
        };
        for (operand, &value) in op.operands().iter().zip(&instruction[2..]) {
            match operand {
                Operand::Column if usize::try_from(value).map_or(true, |c| c >= columns) => {
                    return invalid(format!(
                        "instruction {i} ({op:?}) reads column {value} of a chunk of {columns}"
                    ));
                }
                // Strings kept as bytes are read by LIKE alone, and LIKE
                // reads nothing else (a row's index reads only validity).
                Operand::Column if op == ScanOp::RowOf => {}
                Operand::Column => {
                    let of_bytes = of_bytes[value as usize];
                    if of_bytes != (op == ScanOp::Like) {
                        return invalid(format!(
                            "instruction {i} ({op:?}) reads column {value}, {}",
                            match of_bytes {
                                true => "a column of string bytes",
                                false => "not a column of string bytes",
                            }
                        ));
                    }
                }
                Operand::Key => {
                    let start = usize::try_from(value)
                        .ok()
                        .and_then(|key| remap.word(key))
                        .map(|start| start as usize);
                    if start.is_none_or(|start| start > remap.len()) {
                        return invalid(format!(
                            "instruction {i} ({op:?}) reads key {value}'s codes, which a \
                             remap table of {} entries does not hold",
                            remap.len()
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Checks that each chunk's columns hold its rows (values and validity
/// words), that every chunk has as many columns, and that the program's
/// column and key operands hold for each.
pub(super) fn check_chunks(chunks: &[ScanChunk<'_>], instructions: &[[i64; 5]]) -> GpuResult<()> {
    let Some(first) = chunks.first() else {
        return Ok(());
    };
    for (index, chunk) in chunks.iter().enumerate() {
        if chunk.columns.len() != first.columns.len() {
            return invalid(format!(
                "scan chunk {index} has {} columns, chunk 0 {}",
                chunk.columns.len(),
                first.columns.len()
            ));
        }
        if u32::try_from(chunk.remap.len()).is_err() {
            return invalid(format!(
                "scan chunk {index}'s remap table of {} entries exceeds 2^32",
                chunk.remap.len()
            ));
        }
        for (c, column) in chunk.columns.iter().enumerate() {
            // A column of string bytes holds one offset more than rows.
            let values = chunk.rows + usize::from(column.bytes.is_some());
            let words = match column.narrow {
                true => values.div_ceil(2),
                false => values,
            };
            if let Some((bytes, count)) = column.bytes {
                if !column.narrow || bytes.len() < count.div_ceil(8) {
                    return invalid(format!(
                        "column {c} of scan chunk {index} holds {} words of its {count} string \
                         bytes{}",
                        bytes.len(),
                        if column.narrow { "" } else { ", its offsets not 4-byte" }
                    ));
                }
            }
            if column.values.len() < words {
                return invalid(format!(
                    "column {c} of scan chunk {index} holds {} words, {} rows",
                    column.values.len(),
                    chunk.rows
                ));
            }
            if let Some(validity) = column.validity {
                if validity.len() < chunk.rows.div_ceil(64) {
                    return invalid(format!(
                        "column {c} of scan chunk {index} has {} validity words for {} rows",
                        validity.len(),
                        chunk.rows
                    ));
                }
            }
        }
        let of_bytes: Vec<bool> = chunk.columns.iter().map(|c| c.bytes.is_some()).collect();
        check_operands_against_chunk(instructions, &of_bytes, &chunk.remap)?;
    }
    Ok(())
}

/// The kernels' column table of `chunk`: [`COLUMN_WORDS`] words per column,
/// its values' address (the lowest bit set where they are 4-byte integers),
/// its validity bitmap's (0 for none), and for strings kept as bytes, the
/// bytes' address and count (0 and 0 otherwise). The guards of those addresses go to
/// `guards`: the caller waits for the stream before the chunk's borrow ends.
pub(super) fn column_addresses<'a>(
    chunk: &'a ScanChunk<'a>,
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
    guards: &mut Vec<SyncOnDrop<'a>>,
) -> GpuResult<Vec<u64>> {
    let mut addresses = Vec::with_capacity(COLUMN_WORDS * chunk.columns.len());
    for column in &chunk.columns {
        let (values, guard) = column.values.device_ptr(stream);
        guards.push(guard);
        // The kernel reads 4-byte values where the address's lowest bit is
        // set: device allocations are at least 256-byte aligned.
        if values & 1 != 0 {
            return invalid("a column's device address is not aligned".into());
        }
        addresses.push(values | u64::from(column.narrow));
        match column.validity {
            Some(validity) => {
                let (bits, guard) = validity.device_ptr(stream);
                guards.push(guard);
                addresses.push(bits);
            }
            None => addresses.push(0),
        }
        match column.bytes {
            Some((bytes, count)) => {
                let (address, guard) = bytes.device_ptr(stream);
                guards.push(guard);
                addresses.extend([address, count as u64]);
            }
            None => addresses.extend([0, 0]),
        }
    }
    Ok(addresses)
}

/// The little-endian bytes of 32-bit values, as the kernel reads them from
/// the words they are uploaded in.
pub(super) fn le_bytes_u32(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    values.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// The kernel's `accumulators`: `[kind, register]` per accumulator, -1 for
/// none.
fn accumulator_words(accumulators: &[(AccumulatorKind, Option<u32>)]) -> Vec<u8> {
    le_bytes_u32(accumulators.iter().flat_map(|&(kind, register)| {
        let register = register.map_or(-1, |r| r as i32);
        [kind as i32 as u32, register as u32]
    }))
}

/// The slots' words before the first chunk: each accumulator's
/// [`accumulator_init`], for every group.
fn initial_words(program: &ScanProgram<'_>) -> Vec<u64> {
    (0..program.groups)
        .flat_map(|_| program.accumulators.iter())
        .flat_map(|&(kind, _)| accumulator_init(kind))
        .collect()
}

/// Runs the program over every chunk on the launcher's stream, accumulating
/// into one output, and waits for it. Chunks of no rows are skipped.
/// Returns [`GpuError::Invalid`] where the program or a chunk breaks the
/// kernel's contract: an unknown opcode, a register operand outside
/// [`SCAN_REGISTERS`], a column or key operand a chunk lacks, columns
/// shorter than their rows, chunks of different column counts, no groups,
/// more than [`SCAN_MAX_SLOTS`] slots or [`SCAN_MAX_INSTRUCTIONS`]
/// instructions.
pub fn scan_aggregate(
    device: &GpuDevice,
    launcher: &Launcher<'_>,
    chunks: &[ScanChunk<'_>],
    program: &ScanProgram<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<ScanAggregateOutput> {
    let Launcher { stream, .. } = *launcher;
    let slots = check_program(program)?;
    check_chunks(chunks, program.instructions)?;
    let initial = initial_words(program);
    if chunks.iter().all(|chunk| chunk.rows == 0) {
        return Ok(ScanAggregateOutput {
            words: initial,
            overflowed: false,
        });
    }
    let program_words: Vec<u64> = program
        .instructions
        .iter()
        .flatten()
        .map(|&word| word as u64)
        .collect();
    let device_program = upload_u64(device, stream, &program_words, timer)?;
    let accumulators = upload_byte_pieces(
        device,
        stream,
        &[&accumulator_words(program.accumulators)],
        timer,
    )?;
    let mut out = upload_u64(device, stream, &initial, timer)?;
    // One word, of which the kernel writes the low 4 bytes (a u32).
    let mut overflow = alloc_zeroed::<u64>(stream, 1, "allocating the scan's overflow flag")?;
    let program = DeviceProgram {
        program,
        words: &device_program,
        accumulators: &accumulators,
        slots,
    };
    // Guards of the columns' device addresses, which the kernels read
    // through the uploaded address tables: dropping one records the read on
    // the stream, after every launch enqueued before it.
    let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
    let launched = launch_chunks(
        device,
        launcher,
        chunks,
        &program,
        &mut out,
        &mut overflow,
        &mut guards,
        timer,
    )
    .and_then(|()| {
        let mut words = Vec::with_capacity(initial.len());
        download_u64(device, stream, &out.as_view(), &mut words, timer)?;
        let mut flag = Vec::with_capacity(1);
        download_u64(device, stream, &overflow.as_view(), &mut flag, timer)?;
        Ok((words, flag))
    });
    // The kernels read the borrowed columns through raw addresses: whatever
    // happened above, wait for every launch before the borrows end. (On
    // success the downloads already followed them on the stream.)
    let waited = stream.synchronize().during("waiting for scan_aggregate");
    drop(guards);
    let (words, flag) = launched?;
    waited?;
    Ok(ScanAggregateOutput {
        words,
        overflowed: flag.first().is_some_and(|&word| word != 0),
    })
}

/// The program's parts on the device, shared by every chunk's launch.
struct DeviceProgram<'a> {
    program: &'a ScanProgram<'a>,
    words: &'a CudaSlice<u64>,
    accumulators: &'a CudaSlice<u64>,
    slots: usize,
}

/// Launches the kernel once per chunk with rows, each with the chunk's
/// column address table and remap table, and pushes to `guards` those of
/// the columns' addresses: the caller waits for the stream before it drops
/// them and before the chunks' borrows end. The uploaded tables are freed
/// in stream order, after the launch that reads them.
#[allow(clippy::too_many_arguments)]
fn launch_chunks<'a>(
    device: &GpuDevice,
    launcher: &Launcher<'a>,
    chunks: &'a [ScanChunk<'a>],
    program: &DeviceProgram<'_>,
    out: &mut CudaSlice<u64>,
    overflow: &mut CudaSlice<u64>,
    guards: &mut Vec<SyncOnDrop<'a>>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let Launcher {
        kernels,
        stream,
        sm_count,
    } = *launcher;
    let function = &kernels.scan_aggregate;
    // Within SCAN_MAX_SHARED_BYTES: check_program bounds the slots.
    let shared_bytes = program.slots * 16;
    let instructions = program.program.instructions.len() as u32;
    let predicate = program.program.predicate.map_or(-1, |r| r as i32);
    let group = program.program.group.map_or(-1, |r| r as i32);
    let groups = program.program.groups;
    let accumulator_count = program.program.accumulators.len() as u32;
    for chunk in chunks.iter().filter(|chunk| chunk.rows > 0) {
        let addresses = column_addresses(chunk, stream, guards)?;
        let columns = upload_u64(device, stream, &addresses, timer)?;
        let remap = chunk.remap.upload(device, stream, timer)?;
        // check_chunks bounds the remap table below 2^32 entries.
        let remap_len = chunk.remap.len() as u32;
        let rows = chunk.rows as u64;
        // More blocks than the device holds at once (each merges its slots
        // into `out` once) still pay: the hardware hands the later ones to
        // whichever multiprocessor is free, which evens out the rows' cost.
        let mut launch_config = config(grid_stride_blocks(rows, sm_count))?;
        launch_config.shared_mem_bytes = shared_bytes as u32;
        timer.time_on(stream, Phase::Kernel, || {
            let mut launch = stream.launch_builder(function);
            launch
                .arg(&columns)
                .arg(&rows)
                .arg(program.words)
                .arg(&instructions)
                .arg(&remap)
                .arg(&remap_len)
                .arg(&predicate)
                .arg(&group)
                .arg(&groups)
                .arg(program.accumulators)
                .arg(&accumulator_count)
                .arg(&mut *out)
                .arg(&mut *overflow);
            // SAFETY: `columns` holds two addresses per column of the chunk,
            // each column's values (at least `rows` words) and its validity
            // (at least rows / 64 words, rounded up) or 0, all checked by
            // check_chunks; the kernel reads them only at rows below `rows`,
            // and only columns the program names, which check_chunks put
            // below the column count. Those addresses are of slices the
            // chunks borrow for the whole call, and the caller waits for the
            // stream before it returns, so every launch finishes while they
            // live. The program's register operands lie below
            // SCAN_REGISTERS (check_program), its key operands within
            // `remap` and the kernel checks each remapped code against
            // remap_len. The kernel reads program[..5 * instructions],
            // accumulators[..2 * accumulator_count] (both uploaded whole),
            // and adds into out[..2 * slots] (uploaded whole: the initial
            // words) and overflow's first 4 bytes; its shared memory is
            // 16 * slots bytes, at most SCAN_MAX_SHARED_BYTES.
            unsafe { launch.launch(launch_config) }
                .during("launching scan_aggregate")
                .map(|_| ())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const SUM_AND_COUNT: [(AccumulatorKind, Option<u32>); 2] = [
        (AccumulatorKind::SumI64, Some(1)),
        (AccumulatorKind::Count, None),
    ];

    fn program<'a>(
        instructions: &'a [[i64; 5]],
        accumulators: &'a [(AccumulatorKind, Option<u32>)],
        groups: u32,
    ) -> ScanProgram<'a> {
        ScanProgram {
            instructions,
            predicate: Some(2),
            group: None,
            groups,
            accumulators,
        }
    }

    /// Loads column 0 into r0 and column 1 into r1, r2 = r0 < r1.
    fn well_formed() -> Vec<[i64; 5]> {
        vec![
            [ScanOp::LoadI64 as i64, 0, 0, 0, 0],
            [ScanOp::LoadI64 as i64, 1, 1, 0, 0],
            [ScanOp::LtI64 as i64, 2, 0, 1, 0],
        ]
    }

    #[test]
    fn opcodes_round_trip_their_values() {
        for (i, op) in ScanOp::ALL.iter().enumerate() {
            assert_eq!(*op as i64, i as i64);
            assert_eq!(ScanOp::from_code(i as i64), Some(*op));
        }
        assert_eq!(ScanOp::from_code(-1), None);
        assert_eq!(ScanOp::from_code(ScanOp::ALL.len() as i64), None);
    }

    #[test]
    fn a_well_formed_program_passes() {
        let instructions = well_formed();
        let p = program(&instructions, &SUM_AND_COUNT, 3);
        assert_eq!(check_program(&p).unwrap(), 6);
        check_operands_against_chunk(&instructions, &[false; 2], &RemapTable::default()).unwrap();
    }

    #[test]
    fn the_instructions_registers_depend_on_are_kept_in_order() {
        use ScanOp::*;
        let ins = |op: ScanOp, dst: i64, a: i64, b: i64, c: i64| [op as i64, dst, a, b, c];
        // r0 = col 0, r1 = col 1, r2 = r0 < r1 (a predicate), r3 = col 2
        // LIKE key 0, r2 = r2 AND r3, r4 = r0 * 100 (scaled), r5 = r1 + r4,
        // r1 = 7 (r1 written again after r5 read it), r6 = select(r2, r5, r1).
        let program = [
            ins(LoadI64, 0, 0, 0, 0),
            ins(LoadI64, 1, 1, 0, 0),
            ins(LtI64, 2, 0, 1, 0),
            ins(Like, 3, 2, 0, 0),
            ins(And, 2, 2, 3, 0),
            ins(ScaleI64, 4, 0, 100, 0),
            ins(AddI64, 5, 1, 4, 0),
            ins(Const, 1, 7, 0, 0),
            ins(Select, 6, 2, 5, 1),
        ];
        check_instructions(&program).unwrap();
        // Plain loads: only them.
        assert_eq!(instructions_for(&program, &[0]).unwrap(), [program[0]]);
        assert_eq!(instructions_for(&program, &[0, 1]).unwrap(), [program[0], program[7]]);
        // r5 reads the first r1 and r4 (from r0), not the constant after.
        assert_eq!(
            instructions_for(&program, &[5]).unwrap(),
            [program[0], program[1], program[5], program[6]]
        );
        // The predicate alone needs everything before it that it reads.
        assert_eq!(instructions_for(&program, &[2]).unwrap(), program[..5]);
        // Everything but nothing is needed by the select.
        assert_eq!(instructions_for(&program, &[6]).unwrap(), program);
        assert!(instructions_for(&program, &[]).unwrap().is_empty());
        // A register read before any instruction writes it: not pruned.
        assert_eq!(instructions_for(&program, &[3, 9]), None);
        let reads_unwritten = [ins(AddI64, 0, 8, 8, 0)];
        assert_eq!(instructions_for(&reads_unwritten, &[0]), None);
        // An output outside the registers, an unknown opcode: not pruned.
        assert_eq!(instructions_for(&program, &[SCAN_REGISTERS as u32]), None);
        assert_eq!(instructions_for(&[[99, 0, 0, 0, 0]], &[0]), None);
    }

    #[test]
    fn register_operands_outside_the_file_are_rejected() {
        let mut instructions = well_formed();
        instructions[2][3] = SCAN_REGISTERS as i64;
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, 1)).is_err());
        let mut instructions = well_formed();
        instructions[1][1] = -1;
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, 1)).is_err());
        // A Select reads `c` as a register; a Const's `a` is an immediate.
        let select = [[ScanOp::Select as i64, 0, 1, 2, 99]];
        assert!(check_program(&program(&select, &SUM_AND_COUNT, 1)).is_err());
        let constant = [[ScanOp::Const as i64, 0, 99, 0, 0]];
        check_program(&program(&constant, &SUM_AND_COUNT, 1)).unwrap();
        let instructions = well_formed();
        let mut p = program(&instructions, &SUM_AND_COUNT, 1);
        p.predicate = Some(32);
        assert!(check_program(&p).is_err());
        p.predicate = None;
        p.group = Some(40);
        assert!(check_program(&p).is_err());
        let accumulators = [(AccumulatorKind::MaxI64, Some(32))];
        assert!(check_program(&program(&instructions, &accumulators, 1)).is_err());
        let accumulators = [(AccumulatorKind::SumF64, None)];
        assert!(check_program(&program(&instructions, &accumulators, 1)).is_err());
    }

    #[test]
    fn unknown_opcodes_are_rejected() {
        let instructions = [[ScanOp::ALL.len() as i64, 0, 0, 0, 0]];
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, 1)).is_err());
    }

    #[test]
    fn columns_and_keys_outside_the_chunk_are_rejected() {
        let instructions = well_formed();
        let words = |words: &[u32]| RemapTable::from_words(words.to_vec());
        assert!(check_operands_against_chunk(&instructions, &[false; 1], &words(&[])).is_err());
        let negative = [[ScanOp::LoadF64 as i64, 0, -1, 0, 0]];
        assert!(check_operands_against_chunk(&negative, &[false; 4], &words(&[])).is_err());
        // Key 1's table starts at 2: remap = [starts 2, 2 | no table].
        let code = |key: i64| [[ScanOp::LoadCode as i64, 0, 0, key, 0]];
        check_operands_against_chunk(&code(0), &[false; 1], &words(&[2, 2, 7])).unwrap();
        check_operands_against_chunk(&code(1), &[false; 1], &words(&[2, 3, 7])).unwrap();
        assert!(check_operands_against_chunk(&code(2), &[false; 1], &words(&[1, 9])).is_err());
        assert!(check_operands_against_chunk(&code(0), &[false; 1], &words(&[])).is_err());
        assert!(check_operands_against_chunk(&code(0), &[false; 1], &words(&[3, 0])).is_err());
        assert!(check_operands_against_chunk(&code(-1), &[false; 1], &words(&[1, 0])).is_err());
        // The same from tables held in pieces: key 1's table starts after
        // key 0's; no word 5 to hold a start.
        let tables = RemapTable::new(vec![Arc::new(vec![5u32, 6]), Arc::new(vec![7u32])]);
        assert_eq!(tables.len(), 5);
        let all: Vec<u32> = (0..6).map_while(|i| tables.word(i)).collect();
        assert_eq!(all, [2, 4, 5, 6, 7]);
        assert_eq!(tables.byte_pieces().concat(), le_bytes_u32(all));
        check_operands_against_chunk(&code(1), &[false; 1], &tables).unwrap();
        assert!(check_operands_against_chunk(&code(5), &[false; 1], &tables).is_err());
    }

    #[test]
    fn sizes_beyond_the_kernel_are_rejected() {
        let instructions = well_formed();
        let groups = (SCAN_MAX_SLOTS / SUM_AND_COUNT.len()) as u32;
        check_program(&program(&instructions, &SUM_AND_COUNT, groups)).unwrap();
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, groups + 1)).is_err());
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, u32::MAX)).is_err());
        assert!(check_program(&program(&instructions, &SUM_AND_COUNT, 0)).is_err());
        let long = vec![[ScanOp::Null as i64, 0, 0, 0, 0]; SCAN_MAX_INSTRUCTIONS + 1];
        assert!(check_program(&program(&long, &SUM_AND_COUNT, 1)).is_err());
        assert!(check_program(&program(&long[1..], &SUM_AND_COUNT, 1)).is_ok());
    }

    #[test]
    fn accumulators_start_at_their_identities() {
        assert_eq!(accumulator_init(AccumulatorKind::SumI64), [0, 0]);
        assert_eq!(
            accumulator_init(AccumulatorKind::SumF64),
            [0f64.to_bits(), 0]
        );
        assert_eq!(accumulator_init(AccumulatorKind::Count), [0, 0]);
        assert_eq!(
            accumulator_init(AccumulatorKind::MinI64),
            [i64::MAX as u64, 0]
        );
        assert_eq!(
            accumulator_init(AccumulatorKind::MaxI64),
            [i64::MIN as u64, 0]
        );
        let accumulators = [
            (AccumulatorKind::MinI64, Some(0)),
            (AccumulatorKind::Count, None),
        ];
        let p = program(&[], &accumulators, 2);
        let max = i64::MAX as u64;
        assert_eq!(initial_words(&p), vec![max, 0, 0, 0, max, 0, 0, 0]);
    }

    #[test]
    fn accumulators_travel_as_pairs_of_ints() {
        let words = accumulator_words(&[
            (AccumulatorKind::MaxI64, Some(7)),
            (AccumulatorKind::Count, None),
        ]);
        let ints: Vec<i32> = words
            .chunks(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(ints, vec![4, 7, 2, -1]);
    }
}
