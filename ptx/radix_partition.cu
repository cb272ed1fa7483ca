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
__device__ void histogram_body(const u64* keys, u64 n, u32 shift, u32 bits, u64 rows_per_block,
                               u64* histogram) {
    __shared__ u32 counts[MAX_BINS];
    const u32 bins = 1u << bits;
    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) counts[b] = 0;
    __syncthreads();

    const u64 begin = (u64)blockIdx.x * rows_per_block;
    const u64 end = min(n, begin + rows_per_block);
    for (u64 i = begin + threadIdx.x; i < end; i += BLOCK_THREADS) {
        const u32 digit = radix_digit<HASHED>(keys[i], shift, bins);
        atomicAdd(&counts[digit], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
        histogram[(u64)b * gridDim.x + blockIdx.x] = counts[b];
    }
}

// Stable scatter. `offsets` is the exclusive scan of `radix_histogram`'s
// output for the same keys, shift, bits and rows_per_block, so each block
// knows where its rows of every digit start. Rows are processed in tiles of
// BLOCK_THREADS in input order; within a tile a row's rank among equal digits
// comes from earlier warps (per-warp digit counts in shared memory) plus
// earlier lanes of its own warp (__match_any_sync), which keeps input order.
// Launch: same grid and block as radix_histogram. `*_out` must not alias `*_in`.
template <bool HASHED>
__device__ void scatter_body(const u64* keys_in, const u64* ids_in, u64 n, u32 shift, u32 bits,
                             u64 rows_per_block, const u64* offsets, u64* keys_out, u64* ids_out) {
    __shared__ u64 digit_base[MAX_BINS];
    __shared__ u32 warp_counts[WARPS_PER_BLOCK][MAX_BINS];
    const u32 bins = 1u << bits;
    const u32 warp = threadIdx.x / 32;

    for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
        digit_base[b] = offsets[(u64)b * gridDim.x + blockIdx.x];
        for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) warp_counts[w][b] = 0;
    }
    __syncthreads();

    const u64 begin = (u64)blockIdx.x * rows_per_block;
    const u64 end = min(n, begin + rows_per_block);
    for (u64 tile = begin; tile < end; tile += BLOCK_THREADS) {
        const u64 i = tile + threadIdx.x;
        const bool valid = i < end;
        u64 key = 0, id = 0;
        u32 digit = 0xffffffffu;  // never equal to a real digit
        if (valid) {
            key = keys_in[i];
            id = ids_in[i];
            digit = radix_digit<HASHED>(key, shift, bins);
        }
        const u32 peers = __match_any_sync(0xffffffffu, digit);
        const u32 rank_in_warp = __popc(peers & lanemask_lt());
        if (valid && rank_in_warp == 0) warp_counts[warp][digit] = __popc(peers);
        __syncthreads();

        if (valid) {
            u64 pos = digit_base[digit] + rank_in_warp;
            for (u32 w = 0; w < warp; ++w) pos += warp_counts[w][digit];
            keys_out[pos] = key;
            ids_out[pos] = id;
        }
        __syncthreads();

        for (u32 b = threadIdx.x; b < bins; b += BLOCK_THREADS) {
            u32 tile_count = 0;
            for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) {
                tile_count += warp_counts[w][b];
                warp_counts[w][b] = 0;
            }
            digit_base[b] += tile_count;
        }
        __syncthreads();
    }
}

extern "C" __global__ void radix_histogram(const u64* keys, u64 n, u32 shift, u32 bits,
                                           u64 rows_per_block, u64* histogram) {
    histogram_body<true>(keys, n, shift, bits, rows_per_block, histogram);
}

extern "C" __global__ void radix_scatter(const u64* keys_in, const u64* ids_in, u64 n, u32 shift,
                                         u32 bits, u64 rows_per_block, const u64* offsets,
                                         u64* keys_out, u64* ids_out) {
    scatter_body<true>(keys_in, ids_in, n, shift, bits, rows_per_block, offsets, keys_out, ids_out);
}

// The same two kernels on the key's own bits: passes over bits [0, B) leave
// the pairs sorted by key & (2^B - 1), stably, which is an LSD radix sort of
// keys below 2^B (the sort-merge join's sort, seed 000 §3.3).
extern "C" __global__ void radix_sort_histogram(const u64* keys, u64 n, u32 shift, u32 bits,
                                                u64 rows_per_block, u64* histogram) {
    histogram_body<false>(keys, n, shift, bits, rows_per_block, histogram);
}

extern "C" __global__ void radix_sort_scatter(const u64* keys_in, const u64* ids_in, u64 n,
                                              u32 shift, u32 bits, u64 rows_per_block,
                                              const u64* offsets, u64* keys_out, u64* ids_out) {
    scatter_body<false>(keys_in, ids_in, n, shift, bits, rows_per_block, offsets, keys_out,
                        ids_out);
}

// After the last pass, keys are ordered by partition id p = mix64(key) &
// (2^total_bits - 1). Writes starts[p] = first row of partition p for every
// p in [0, 2^total_bits], with starts[2^total_bits] = n; empty partitions get
// the start of the next non-empty one. Every entry is written exactly once.
// Launch: any grid, block = BLOCK_THREADS, n >= 1 (the host fills starts with
// zeros when n == 0).
extern "C" __global__ void partition_bounds(const u64* keys, u64 n, u32 total_bits, u64* starts) {
    const u64 mask = (1ULL << total_bits) - 1;
    const u64 partitions = 1ULL << total_bits;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 p = mix64(keys[i]) & mask;
        const u64 first_unset = (i == 0) ? 0 : (mix64(keys[i - 1]) & mask) + 1;
        for (u64 q = first_unset; q <= p; ++q) starts[q] = i;
        if (i == n - 1) {
            for (u64 q = p + 1; q <= partitions; ++q) starts[q] = n;
        }
    }
}
