// Stable LSD radix partitioning of (key, row id) pairs on the bits of
// mix64(key) (seed 000 §3.2 phase 1; seed 002 A6 and A10: histogram +
// exclusive scan + stable scatter, never atomic bucket chains).
//
// One pass moves every pair once: `radix_histogram` counts digits per block,
// the host scans the [digit][block] matrix (`scan.cu`), `radix_scatter` writes
// each pair to its digit's region keeping input order within a digit. After
// the passes over bits [0, B) the pairs are ordered by `mix64(key) & (2^B-1)`,
// the partition id, and `partition_bounds` finds where each partition starts.
// The same passes on the key's own bits (`radix_sort_*`) are the LSD radix
// sort of the sort-merge join.
//
// One-word rows: a join side whose keys lie below 2^32 travels as one word
// a row, the key in the low half and its row id (or one carried 4-byte
// value, `pack_key_words` in hash_join.cu) in the high half. Such rows are
// passed with `ids_in`/`ids_out` null and `key_mask` 0xffffffff, so that
// every pass moves 8 bytes a row in place of 16 and the digits come from
// the key alone; otherwise `key_mask` is all ones.
#include "common.cuh"

#define MAX_RADIX_BITS 8
#define MAX_BINS (1 << MAX_RADIX_BITS)

// The digit of a pass: bits [shift, shift + log2(bins)) of mix64(key) when
// partitioning for a hash join (HASHED), of the key itself when sorting.
template <bool HASHED>
__device__ __forceinline__ u32 radix_digit(u64 key, u32 shift, u32 bins) {
    return (u32)((HASHED ? mix64(key) : key) >> shift) & (bins - 1);
}

// Writes `first + i` to `out[i]` for i < n (the initial row ids).
// Launch: any grid, block = BLOCK_THREADS (grid-stride loop).
extern "C" __global__ void iota_u64(u64* out, u64 n, u64 first) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = first + i;
    }
}

// Counts the digit (radix_digit) of the rows owned by each block. Block b owns rows [b * rows_per_block, (b + 1) * rows_per_block).
// Launch: grid = ceil(n / rows_per_block), block = BLOCK_THREADS, bits <= 8,
// rows_per_block < 2^32. Output: histogram[digit * gridDim.x + block].
template <bool HASHED>
__device__ void histogram_body(const u64* keys, u64 n, u64 key_mask, u32 shift, u32 bits,
                               u64 rows_per_block, u64* histogram) {
    __shared__ u32 counts[MAX_BINS];
    const u32 bins = 1u << bits;
    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) counts[b] = 0;
    __syncthreads();

    const u64 begin = (u64)blockIdx.x * rows_per_block;
    const u64 end = min(n, begin + rows_per_block);
    for (u64 i = begin + threadIdx.x; i < end; i += BLOCK_THREADS) {
        const u32 digit = radix_digit<HASHED>(keys[i] & key_mask, shift, bins);
        atomicAdd(&counts[digit], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
        histogram[(u64)b * gridDim.x + blockIdx.x] = counts[b];
    }
}

// Rows a block of `scatter_body` places per tile: BLOCK_THREADS per step,
// SCATTER_ITEMS steps. A tile is ordered by digit in shared memory before it
// is written, so each digit's rows of the tile (16 on average for 2^7
// digits) go out as one contiguous run, in whole sectors, not one 16-byte
// write per row to as many places as there are digits.
#define SCATTER_ITEMS 8
#define SCATTER_TILE (BLOCK_THREADS * SCATTER_ITEMS)
// Rows of a tile one warp ranks.
#define WARP_ROWS (32 * SCATTER_ITEMS)
// Blocks of the scatter a multiprocessor must hold (64 registers a thread;
// four blocks' shared memory fits too): without the bound the one-word
// rows' branches take it past 64 registers, to three blocks, which slows
// the scatter even of (key, row id) pairs (seed 002's narrow join).
#define SCATTER_BLOCKS_PER_SM 4
// The tile's digit counts are scanned with one thread per digit.
static_assert(MAX_BINS <= BLOCK_THREADS, "one thread per digit in the scatter's scan");

// Stable scatter. `offsets` is the exclusive scan of `radix_histogram`'s
// output for the same keys, shift, bits and rows_per_block, so each block
// knows where its rows of every digit start. A block takes its rows in
// tiles of SCATTER_TILE in input order. Warp w of the block ranks rows
// [w * WARP_ROWS, (w + 1) * WARP_ROWS) of the tile alone, SCATTER_ITEMS
// steps of 32 rows: a row's rank among its warp's rows of its digit comes
// from the warp's earlier steps (its own digit counts) and earlier lanes
// (__match_any_sync), with no barrier of the block between steps. Once
// every warp has ranked its rows, one thread per digit turns the warps'
// counts into where each warp's rows of that digit start within the
// tile's, which keeps input order. The tile is then laid out in shared
// memory by digit and written run by run. A tile takes 7 barriers of the
// block; ranking it a block-wide step at a time would take 3 a step, 29 a
// tile, and slow the scatter.
// Launch: same grid and block as radix_histogram, with the same key_mask.
// `*_out` must not alias `*_in`; `ids_in` and `ids_out` are both null for
// one-word rows (only the keys move).
template <bool HASHED>
__device__ void scatter_body(const u64* keys_in, const u64* ids_in, u64 n, u64 key_mask,
                             u32 shift, u32 bits, u64 rows_per_block, const u64* offsets,
                             u64* keys_out, u64* ids_out) {
    __shared__ u64 tile_keys[SCATTER_TILE];
    __shared__ u64 tile_ids[SCATTER_TILE];
    // Where the block's next row of each digit goes.
    __shared__ u64 digit_base[MAX_BINS];
    // Each warp's rows of each digit in the tile; then, once ranked, how
    // many of the tile's rows of the digit earlier warps hold.
    __shared__ u32 warp_counts[WARPS_PER_BLOCK][MAX_BINS];
    // Rows of each digit in the tile, and where the tile's rows of each
    // digit start in shared memory.
    __shared__ u32 tile_counts[MAX_BINS];
    __shared__ u32 tile_starts[MAX_BINS];
    __shared__ u32 warp_totals[WARPS_PER_BLOCK];
    const u32 bins = 1u << bits;
    const u32 warp = threadIdx.x / 32;
    const u32 lane = threadIdx.x % 32;

    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
        digit_base[b] = offsets[(u64)b * gridDim.x + blockIdx.x];
        for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) warp_counts[w][b] = 0;
    }
    __syncthreads();

    const u64 begin = (u64)blockIdx.x * rows_per_block;
    const u64 end = min(n, begin + rows_per_block);
    for (u64 tile = begin; tile < end; tile += SCATTER_TILE) {
        u64 key[SCATTER_ITEMS], id[SCATTER_ITEMS];
        u32 digit[SCATTER_ITEMS], rank[SCATTER_ITEMS];
        const u64 warp_first = tile + (u64)warp * WARP_ROWS;
#pragma unroll
        for (u32 step = 0; step < SCATTER_ITEMS; ++step) {
            const u64 i = warp_first + (u64)step * 32 + lane;
            key[step] = 0;
            id[step] = 0;
            digit[step] = 0xffffffffu;  // never equal to a real digit
            if (i < end) {
                key[step] = keys_in[i];
                if (ids_in) id[step] = ids_in[i];
                digit[step] = radix_digit<HASHED>(key[step] & key_mask, shift, bins);
            }
            const u32 d = digit[step];
            const u32 peers = __match_any_sync(0xffffffffu, d);
            const u32 rank_in_step = __popc(peers & lanemask_lt());
            rank[step] = 0;
            if (i < end) rank[step] = warp_counts[warp][d] + rank_in_step;
            __syncwarp();  // every lane has read the count before it grows
            if (i < end && rank_in_step == 0) warp_counts[warp][d] += __popc(peers);
            __syncwarp();
        }
        __syncthreads();

        // Per digit: the tile's rows, and each warp's first place among
        // them (an exclusive scan over the warps, in place).
        for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
            u32 running = 0;
            for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) {
                const u32 count = warp_counts[w][b];
                warp_counts[w][b] = running;
                running += count;
            }
            tile_counts[b] = running;
        }
        __syncthreads();

        // tile_starts: the exclusive scan of tile_counts (bins <= BLOCK_THREADS).
        const u32 count = threadIdx.x < bins ? tile_counts[threadIdx.x] : 0;
        u32 inclusive = count;
        for (u32 offset = 1; offset < 32; offset <<= 1) {
            const u32 before = __shfl_up_sync(0xffffffffu, inclusive, offset);
            if (lane >= offset) inclusive += before;
        }
        if (lane == 31) warp_totals[warp] = inclusive;
        __syncthreads();
        if (threadIdx.x < bins) {
            u32 start = inclusive - count;
            for (u32 w = 0; w < warp; ++w) start += warp_totals[w];
            tile_starts[threadIdx.x] = start;
        }
        __syncthreads();

#pragma unroll
        for (u32 step = 0; step < SCATTER_ITEMS; ++step) {
            if (digit[step] != 0xffffffffu) {
                const u32 d = digit[step];
                const u32 slot = tile_starts[d] + warp_counts[warp][d] + rank[step];
                tile_keys[slot] = key[step];
                if (ids_in) tile_ids[slot] = id[step];
            }
        }
        __syncthreads();

        // Slot s holds the (s - tile_starts[d])-th row of digit d in the tile.
        const u32 rows = (u32)min((u64)SCATTER_TILE, end - tile);
        for (u32 s = threadIdx.x; s < rows; s += BLOCK_THREADS) {
            const u64 k = tile_keys[s];
            const u32 d = radix_digit<HASHED>(k & key_mask, shift, bins);
            const u64 pos = digit_base[d] + (s - tile_starts[d]);
            keys_out[pos] = k;
            if (ids_out) ids_out[pos] = tile_ids[s];
        }
        __syncthreads();
        for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
            digit_base[b] += tile_counts[b];
            for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) warp_counts[w][b] = 0;
        }
        __syncthreads();
    }
}

extern "C" __global__ void radix_histogram(const u64* keys, u64 n, u64 key_mask, u32 shift,
                                           u32 bits, u64 rows_per_block, u64* histogram) {
    histogram_body<true>(keys, n, key_mask, shift, bits, rows_per_block, histogram);
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, SCATTER_BLOCKS_PER_SM)
radix_scatter(const u64* keys_in, const u64* ids_in, u64 n,
                                         u64 key_mask, u32 shift, u32 bits, u64 rows_per_block,
                                         const u64* offsets, u64* keys_out, u64* ids_out) {
    scatter_body<true>(keys_in, ids_in, n, key_mask, shift, bits, rows_per_block, offsets,
                       keys_out, ids_out);
}

// The same two kernels on the key's own bits: passes over bits [0, B) leave
// the pairs sorted by key & (2^B - 1), stably, which is an LSD radix sort of
// keys below 2^B (the sort-merge join's sort, seed 000 §3.3).
extern "C" __global__ void radix_sort_histogram(const u64* keys, u64 n, u64 key_mask, u32 shift,
                                                u32 bits, u64 rows_per_block, u64* histogram) {
    histogram_body<false>(keys, n, key_mask, shift, bits, rows_per_block, histogram);
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, SCATTER_BLOCKS_PER_SM)
radix_sort_scatter(const u64* keys_in, const u64* ids_in, u64 n,
                                              u64 key_mask, u32 shift, u32 bits,
                                              u64 rows_per_block, const u64* offsets,
                                              u64* keys_out, u64* ids_out) {
    scatter_body<false>(keys_in, ids_in, n, key_mask, shift, bits, rows_per_block, offsets,
                        keys_out, ids_out);
}

// After the last pass, keys are ordered by partition id p = mix64(key &
// key_mask) & (2^total_bits - 1). Writes starts[p] = first row of partition p for every
// p in [0, 2^total_bits], with starts[2^total_bits] = n; empty partitions get
// the start of the next non-empty one. Every entry is written exactly once.
// Launch: any grid, block = BLOCK_THREADS, n >= 1 (the host fills starts with
// zeros when n == 0).
extern "C" __global__ void partition_bounds(const u64* keys, u64 n, u64 key_mask, u32 total_bits,
                                            u64* starts) {
    const u64 mask = (1ULL << total_bits) - 1;
    const u64 partitions = 1ULL << total_bits;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 p = mix64(keys[i] & key_mask) & mask;
        const u64 first_unset = (i == 0) ? 0 : (mix64(keys[i - 1] & key_mask) & mask) + 1;
        for (u64 q = first_unset; q <= p; ++q) starts[q] = i;
        if (i == n - 1) {
            for (u64 q = p + 1; q <= partitions; ++q) starts[q] = n;
        }
    }
}

// Raises *largest to the most rows one of `partitions` partitions holds:
// the largest starts[p + 1] - starts[p] for p < partitions (the host zeroes
// *largest first). What a join asks of a side's partitions before it
// decides whether to split them into tasks, without copying the starts out.
// Launch: any grid, block = BLOCK_THREADS (grid-stride loop); starts holds
// partitions + 1 entries.
extern "C" __global__ void largest_partition(const u64* starts, u64 partitions, u64* largest) {
    u64 most = 0;
    for (u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x; p < partitions;
         p += (u64)gridDim.x * blockDim.x) {
        const u64 from = starts[p], to = starts[p + 1];
        const u64 rows = to > from ? to - from : 0;
        most = rows > most ? rows : most;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const u64 other = __shfl_down_sync(0xffffffffu, most, offset);
        most = other > most ? other : most;
    }
    if ((threadIdx.x & 31) == 0 && most > 0) atomicMax(largest, most);
}
