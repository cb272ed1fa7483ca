// Exclusive prefix sum over u64 (seed 000 §3.2 phase 1b: offsets of every
// (partition, block) histogram entry). Three launches per level, driven from
// `src/ops/scan.rs`: `scan_tiles` scans tiles of SCAN_TILE values and writes
// each tile's total; the host scans the totals recursively with the same
// kernel; `scan_add_tile_offsets` adds each tile's offset back.
#include "common.cuh"

#define ITEMS_PER_THREAD 4
#define SCAN_TILE (BLOCK_THREADS * ITEMS_PER_THREAD)

// Scans `values` in place, tile by tile.
// Launch: grid = ceil(n / SCAN_TILE), block = BLOCK_THREADS, no dynamic smem.
// `tile_totals` has one entry per block.
extern "C" __global__ void scan_tiles(u64* values, u64 n, u64* tile_totals) {
    __shared__ u64 warp_totals[WARPS_PER_BLOCK];
    const u64 tile_start = (u64)blockIdx.x * SCAN_TILE;
    const u64 first = tile_start + (u64)threadIdx.x * ITEMS_PER_THREAD;

    u64 items[ITEMS_PER_THREAD];
    u64 thread_total = 0;
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
        items[i] = (first + i < n) ? values[first + i] : 0;
        thread_total += items[i];
    }

    // Inclusive scan of the thread totals within the warp.
    u64 inclusive = thread_total;
    for (int offset = 1; offset < 32; offset *= 2) {
        u64 up = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane_id() >= (u32)offset) inclusive += up;
    }
    const u32 warp = threadIdx.x / 32;
    if (lane_id() == 31) warp_totals[warp] = inclusive;
    __syncthreads();

    u64 warp_offset = 0;
    u64 block_total = 0;
    for (u32 w = 0; w < WARPS_PER_BLOCK; ++w) {
        if (w < warp) warp_offset += warp_totals[w];
        block_total += warp_totals[w];
    }

    u64 running = warp_offset + inclusive - thread_total;
#pragma unroll
    for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
        if (first + i < n) values[first + i] = running;
        running += items[i];
    }
    if (threadIdx.x == 0) tile_totals[blockIdx.x] = block_total;
}

// Launch: grid = ceil(n / SCAN_TILE), block = BLOCK_THREADS.
// `tile_offsets` is the exclusive scan of the tile totals.
extern "C" __global__ void scan_add_tile_offsets(u64* values, u64 n, const u64* tile_offsets) {
    const u64 tile_start = (u64)blockIdx.x * SCAN_TILE;
    const u64 offset = tile_offsets[blockIdx.x];
    for (u32 i = threadIdx.x; i < SCAN_TILE; i += BLOCK_THREADS) {
        const u64 idx = tile_start + i;
        if (idx < n) values[idx] += offset;
    }
}
