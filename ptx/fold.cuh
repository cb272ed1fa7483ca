// Folding 64-bit words without groups or by group: the aggregate codes the
// host passes (`AggregateOp` in `src/gpu/launch/group_by.rs`), each op's
// identity, and how two words combine, in a register or atomically.
// Shared by the group-by's reductions and the join's folds.
#pragma once

#include "common.cuh"

#define OP_SUM 0
#define OP_MIN 1
#define OP_MAX 2
#define OP_COUNT 3

__device__ __forceinline__ u64 identity_of(u32 op) { return op == OP_MIN ? ~0ULL : 0ULL; }

__device__ __forceinline__ u64 combine(u32 op, u64 a, u64 b) {
    switch (op) {
        case OP_MIN: return a < b ? a : b;
        case OP_MAX: return a > b ? a : b;
        default: return a + b;
    }
}

__device__ __forceinline__ void atomic_apply(u32 op, u64* target, u64 value) {
    switch (op) {
        case OP_MIN: atomicMin(target, value); break;
        case OP_MAX: atomicMax(target, value); break;
        default: atomicAdd(target, value); break;
    }
}
