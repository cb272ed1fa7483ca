// Columns gathered on the device by row id (seed 002's gather by row id):
// out[i] = src[ids[i]] for i < n. A join's output columns are gathered by its
// pairs' row ids so the host copies whole output columns instead of taking
// them row by row, and the sort-merge join maps sorted positions to rows the
// same way. One kernel per value width (4, 8 and 16 bytes: Int32-like,
// Int64-like and Decimal128-like columns), each moving a value with one load
// and one store. An id at or beyond src_len (never made by the join kernels)
// writes nothing.
// Launch: any grid, block = BLOCK_THREADS (grid-stride). `src` and `out` are
// whole device allocations, so 16-byte values are 16-byte aligned.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void gather(const T* src, u64 src_len, const u64* ids, u64 n,
                                       T* out) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 id = ids[i];
        if (id < src_len) out[i] = src[id];
    }
}

extern "C" __global__ void gather_u32(const u32* src, u64 src_len, const u64* ids, u64 n,
                                      u32* out) {
    gather(src, src_len, ids, n, out);
}

extern "C" __global__ void gather_u64(const u64* src, u64 src_len, const u64* ids, u64 n,
                                      u64* out) {
    gather(src, src_len, ids, n, out);
}

extern "C" __global__ void gather_u128(const ulonglong2* src, u64 src_len, const u64* ids,
                                       u64 n, ulonglong2* out) {
    gather(src, src_len, ids, n, out);
}

// The inverse of gather_u64 where `ids` is a permutation of 0..n:
// out[ids[i]] = src[i] for i < n (a partitioned group-by's row groups put
// back in row order). An id at or beyond out_len writes nothing.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void scatter_u64(const u64* src, const u64* ids, u64 n, u64* out,
                                       u64 out_len) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 id = ids[i];
        if (id < out_len) out[id] = src[i];
    }
}

// Bits gathered by row id: bit i of `out` is bit ids[i] of `bits` (64 rows
// a word, `bits_len` words), for i < n; the rest of the last word, and the
// bit of an id beyond the bitmap, are 0. One thread builds one output
// word, so no two threads write the same word.
// Launch: any grid, block = BLOCK_THREADS (grid-stride over words).
extern "C" __global__ void gather_bits(const u64* bits, u64 bits_len, const u64* ids, u64 n,
                                       u64* out) {
    const u64 words = (n + 63) / 64;
    for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w < words;
         w += (u64)gridDim.x * blockDim.x) {
        u64 word = 0;
        const u64 first = w * 64;
        const u64 last = min(n, first + 64);
        for (u64 i = first; i < last; ++i) {
            const u64 id = ids[i];
            if ((id >> 6) < bits_len) word |= ((bits[id >> 6] >> (id & 63)) & 1ULL) << (i - first);
        }
        out[w] = word;
    }
}

// A cached column's values as one 64-bit word a row, written to out[offset +
// i] for i < n: 4-byte values (two to a word) sign-extended where `narrow`,
// else the 8-byte words as they are; where `sign_only`, each word is instead
// the sign of the value (all ones for a negative value, else 0): the high
// word of a 128-bit sum's input. The column's parts are laid end to end in
// `out` one launch each, so that a node reads a table's cached columns as one
// column without a copy through the host.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void widen_words(const void* src, u32 narrow, u32 sign_only, u64 n,
                                       u64* out, u64 offset) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const long long value = narrow ? (long long)((const int*)src)[i]
                                       : ((const long long*)src)[i];
        out[offset + i] = sign_only ? (u64)(value >> 63) : (u64)value;
    }
}

// A remap table's mostly zero table (a join key set of few keys over a wide
// span of values) made on the device from where its bits are set, so that
// only those positions cross the bus: sets bit positions[i] % 32 of
// words[first_word + positions[i] / 32] for i < n, the words zeroed before.
// A position past `words_len` words sets nothing.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void set_table_bits(u32* words, u64 first_word, u64 words_len,
                                          const u32* positions, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 position = positions[i];
        const u64 word = first_word + position / 32;
        if (word < words_len) atomicOr(&words[word], 1u << (position % 32));
    }
}
