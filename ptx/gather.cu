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
