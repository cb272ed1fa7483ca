// Block-wide helpers shared by every kernel file. Kept header-only so each
// `.cu` compiles to one self-contained PTX module.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

// Threads per block for every kernel in this crate. The host launch helpers in
// `src/gpu/launch.rs` use the same constant; kernels rely on it for shared
// memory sizing.
#define BLOCK_THREADS 256
#define WARPS_PER_BLOCK (BLOCK_THREADS / 32)

// MurmurHash3's 64-bit finalizer: a bijection on u64, so distinct keys never
// collide in the full 64 bits, and every output bit depends on every input
// bit, so low bits are good radix digits even for sequential keys.
__device__ __forceinline__ u64 mix64(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31; }

__device__ __forceinline__ u32 lanemask_lt() {
    u32 mask;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
    return mask;
}

// Sum of `value` over the block; the result is valid in thread 0 only.
// `scratch` must hold WARPS_PER_BLOCK entries.
__device__ __forceinline__ u64 block_sum_u64(u64 value, u64* scratch) {
    for (int offset = 16; offset > 0; offset /= 2) {
        value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    if (lane_id() == 0) scratch[threadIdx.x / 32] = value;
    __syncthreads();
    u64 total = 0;
    if (threadIdx.x == 0) {
        for (int w = 0; w < WARPS_PER_BLOCK; ++w) total += scratch[w];
    }
    __syncthreads();
    return total;
}
