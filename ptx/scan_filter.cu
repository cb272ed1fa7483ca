// A filtering scan over table rows: the interpreter's program
// (`interpreter.cuh`) runs per row, a predicate register decides whether
// the row is kept, and the kept rows' output registers are written packed,
// in row order, for the host to make Arrow columns of. The host side is
// `src/gpu/launch/scan_filter.rs`, which validates the program first.
//
// Two launches over the same tiles of FILTER_TILE rows (block b takes rows
// [b * FILTER_TILE, (b + 1) * FILTER_TILE)):
// - `scan_filter_count` runs the whole program, writes each tile's kept rows
//   to tile_counts[b] and each row's verdict to bit r % 32 of kept_bits[r /
//   32];
// - the host turns the counts into each tile's first output row (an
//   exclusive prefix sum), and `scan_filter_write` runs, for the kept rows
//   alone, the instructions the outputs depend on (the host prunes the rest:
//   the predicate is not evaluated twice), each kept row finding its place
//   from its tile's start and the kept rows before it in the tile (so the
//   output keeps the rows' order). The count has evaluated every
//   instruction over every row, so it has set *overflow wherever the write
//   could.
// Output register o of the row at place p goes to values[o * capacity + p]
// (its value word) and valid[o * capacity + p] (1 valid, 0 NULL), and
// output_flags[o] gathers what the host needs to copy less back: bit 0 where
// some row's output o is NULL, bit 1 where some row's word is not a 32-bit
// integer sign-extended. A place at or past `capacity`, an i64 overflow in
// the program or a dictionary code outside its table sets *overflow = 1: the
// host then hands the part back to the CPU.
//
// `scan_filter_narrow` then packs the words of an output whose flag says
// they all fit into 4 bytes each, for a copy back half the size.
#include "interpreter.cuh"

// Rows of one tile: FILTER_ROUNDS rounds of BLOCK_THREADS rows (the same
// constant as `FILTER_TILE` in the Rust wrapper).
#define FILTER_ROUNDS 8
#define FILTER_TILE (BLOCK_THREADS * FILTER_ROUNDS)

// Bits of `output_flags` (the same constants as in the Rust wrapper).
#define OUTPUT_HAS_NULL 1u
#define OUTPUT_IS_WIDE 2u

__device__ __forceinline__ bool row_kept(const Registers& regs, int predicate) {
    return predicate < 0 || (regs.ok(predicate) && regs.get(predicate) != 0);
}

extern "C" __global__ void scan_filter_count(const u64* columns, u64 rows, const long long* program,
                                             u32 instructions, const u32* remap, u32 remap_len,
                                             int predicate, u64* tile_counts, u32* kept_bits,
                                             u32* overflow) {
    __shared__ u64 scratch[WARPS_PER_BLOCK];
    long long register_values[SCAN_REGISTERS];
    u32 valid = 0;
    Registers regs = {register_values, valid};
    const u32 lane = lane_id();
    const u64 tile_start = (u64)blockIdx.x * FILTER_TILE;
    u64 kept = 0;
    for (u32 round = 0; round < FILTER_ROUNDS; ++round) {
        const u64 row = tile_start + (u64)round * BLOCK_THREADS + threadIdx.x;
        bool keep = false;
        if (row < rows) {
            run_program(regs, columns, row, program, instructions, remap, remap_len, overflow);
            keep = row_kept(regs, predicate);
        }
        // Every lane reaches the ballot; a warp's 32 rows start at a
        // multiple of 32 (tiles and rounds are multiples of 32 rows).
        const u32 ballot = __ballot_sync(FULL_MASK, keep);
        const u64 first = row - lane;
        if (lane == 0 && first < rows) kept_bits[first / 32] = ballot;
        kept += keep ? 1 : 0;
    }
    const u64 total = block_sum_u64(kept, scratch);
    if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

extern "C" __global__ void scan_filter_write(const u64* columns, u64 rows, const long long* program,
                                             u32 instructions, const u32* remap, u32 remap_len,
                                             const u32* kept_bits, const int* outputs, u32 output_count,
                                             const u64* tile_starts, u64 capacity,
                                             long long* values, unsigned char* valid_out,
                                             u32* output_flags, u32* overflow) {
    __shared__ u32 warp_kept[WARPS_PER_BLOCK];
    __shared__ u64 next_place;
    long long register_values[SCAN_REGISTERS];
    u32 valid = 0;
    Registers regs = {register_values, valid};
    const u32 lane = lane_id();
    const u32 warp = threadIdx.x / 32;
    if (threadIdx.x == 0) next_place = tile_starts[blockIdx.x];
    __syncthreads();
    const u64 tile_start = (u64)blockIdx.x * FILTER_TILE;
    for (u32 round = 0; round < FILTER_ROUNDS; ++round) {
        const u64 row = tile_start + (u64)round * BLOCK_THREADS + threadIdx.x;
        const bool kept = row < rows && ((__ldg(kept_bits + row / 32) >> (row % 32)) & 1);
        if (kept) {
            run_program(regs, columns, row, program, instructions, remap, remap_len, overflow);
        }
        // Every lane of the block reaches the ballot and the barriers:
        // rows past the end are simply not kept.
        const u32 ballot = __ballot_sync(FULL_MASK, kept);
        if (lane == 0) warp_kept[warp] = __popc(ballot);
        __syncthreads();
        u64 place = next_place + __popc(ballot & lanemask_lt());
        u64 round_kept = 0;
        for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) {
            const u32 count = warp_kept[w];
            if (w < warp) place += count;
            round_kept += count;
        }
        if (kept) {
            if (place < capacity) {
                for (u32 o = 0; o < output_count; ++o) {
                    const int reg = __ldg(outputs + o);
                    const long long value = regs.get(reg);
                    const bool ok = regs.ok(reg);
                    values[(u64)o * capacity + place] = value;
                    valid_out[(u64)o * capacity + place] = ok ? 1 : 0;
                    const u32 flags = (ok ? 0u : OUTPUT_HAS_NULL) |
                                      ((long long)(int)value == value ? 0u : OUTPUT_IS_WIDE);
                    // The flags only ever gain bits: a stale read costs an
                    // atomic that changes nothing, never a bit missed.
                    if (flags != 0 && (*(volatile u32*)(output_flags + o) & flags) != flags) {
                        atomicOr(output_flags + o, flags);
                    }
                }
            } else {
                *overflow = 1;
            }
        }
        // Everyone has read next_place and warp_kept before they change.
        __syncthreads();
        if (threadIdx.x == 0) next_place += round_kept;
        __syncthreads();
    }
}

// The low 4 bytes of words[from + i] to out[offset + i] for i < n: an
// output's words that the write's flags found to be 32-bit integers
// sign-extended, so that the host gets them back whole from half the bytes.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void scan_filter_narrow(const u64* words, u64 from, u64 n, u32* out,
                                              u64 offset) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        out[offset + i] = (u32)words[from + i];
    }
}

// Strings kept as their bytes, gathered for the kept rows only. The part's
// column is `part_rows + 1` four-byte offsets into its `byte_count` bytes
// (row r's string between offsets r and r + 1); a kept row's output word at
// words[from + i] is its row in the part, and valid[from + i] its validity
// byte (0: NULL, no string).
//
// `scan_filter_string_lengths` writes each kept row's string length to
// lengths[i] for i < n (0 where NULL); a row past the part, or offsets out of
// order or past the bytes, set *bad = 1 (and count 0). The host turns the
// lengths into each string's start (an exclusive prefix sum over n + 1
// entries, the last the total) and, where nothing was bad, launches
// `scan_filter_string_copy`, a warp a row, to lay the strings end to end.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void scan_filter_string_lengths(const u64* words, u64 from,
                                                      const unsigned char* valid,
                                                      const u32* offsets, u64 part_rows,
                                                      u64 byte_count, u64 n, u64* lengths,
                                                      u32* bad) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u64 length = 0;
        if (valid[from + i] != 0) {
            const u64 row = words[from + i];
            if (row < part_rows && offsets[row] <= offsets[row + 1] &&
                offsets[row + 1] <= byte_count) {
                length = offsets[row + 1] - offsets[row];
            } else {
                *bad = 1;
            }
        }
        lengths[i] = length;
    }
}

extern "C" __global__ void scan_filter_string_copy(const u64* words, u64 from,
                                                   const u32* offsets,
                                                   const unsigned char* bytes,
                                                   const u64* starts, u64 n,
                                                   unsigned char* out) {
    const u64 warps = ((u64)gridDim.x * blockDim.x) / 32;
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; i < n; i += warps) {
        const u64 start = starts[i];
        const u64 length = starts[i + 1] - start;
        if (length == 0) continue;
        const unsigned char* src = bytes + offsets[words[from + i]];
        for (u64 j = lane_id(); j < length; j += 32) out[start + j] = src[j];
    }
}
