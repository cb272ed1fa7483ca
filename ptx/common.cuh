// Block-wide helpers shared by every kernel file. Kept header-only so each
// `.cu` compiles to one self-contained PTX module.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

// Threads per block for every kernel in this crate. The host launch helpers in
// `src/gpu/launch/mod.rs` use the same constant; kernels rely on it for shared
// memory sizing.
#define BLOCK_THREADS 256
#define WARPS_PER_BLOCK (BLOCK_THREADS / 32)

// The process's hash seed, set by the host when it loads the module
// (`src/gpu/launch/hash_seed.rs`): keys chosen to share a partition or a table slot
// under one seed are spread under another, so nobody can aim keys at one.
__constant__ u64 hash_seed;

// MurmurHash3's 64-bit finalizer of the key XOR the seed: a bijection on u64,
// so distinct keys never collide in the full 64 bits, and every output bit
// depends on every input bit, so low bits are good radix digits even for
// sequential keys.
__device__ __forceinline__ u64 mix64(u64 k) {
    k ^= hash_seed;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31; }

// A word that other blocks' atomics only ever move one way (a hash table
// slot's key, claimed once; a MIN or MAX, only towards its best), read in
// a plain (weak) load that L1 may answer from a copy older than L2's. PTX
// does not require such a load to be free of races: it reads a value one
// of the writes to the word left there, not necessarily the last. An older
// value can only send a thread to an atomic that changes nothing (or to
// the CAS of a claimed slot, which returns its key), never let it skip one
// that would; and L1 answers most reads of hot words, where a read past L1
// (`ld.relaxed.gpu`, or volatile) queues at one L2 slice with every other
// block's. `asm volatile`, so that each probe reads again. `at` is in
// global memory.
__device__ __forceinline__ u64 read_monotone_word(const u64* at) {
    u64 word;
    asm volatile("ld.global.u64 %0, [%1];" : "=l"(word) : "l"(at));
    return word;
}

// Two such words side by side, in one 16-byte load (`at` 16-byte aligned).
__device__ __forceinline__ void read_monotone_pair(const u64* at, u64& first, u64& second) {
    asm volatile("ld.global.v2.u64 {%0, %1}, [%2];" : "=l"(first), "=l"(second) : "l"(at));
}

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
