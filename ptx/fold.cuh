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

// atomic_apply where it can change the target: a MIN or MAX whose target
// already holds a value at least as good is skipped, so that once a group's
// best is found its other rows only read it (the atomics of a hot group
// would serialize). The target only ever moves towards the op's best, so a
// read that is stale can only let through an atomic that changes nothing,
// never skip one that would (read_monotone_word). `target` is in global or
// shared memory (a block's privatized groups), so the read is generic.
__device__ __forceinline__ void atomic_apply_if_better(u32 op, u64* target, u64 value) {
    if (op == OP_MIN || op == OP_MAX) {
        u64 seen;
        asm volatile("ld.u64 %0, [%1];" : "=l"(seen) : "l"(target));
        if (op == OP_MIN ? seen <= value : seen >= value) return;
    }
    atomic_apply(op, target, value);
}

// Fold f's parameter among four: kernels take one parameter per fold, so
// that a loop over f unrolled reads each from the parameter space (f is a
// constant there). Shared by the join's folds and the group-by's table
// folds.
template <typename T>
__device__ __forceinline__ T* fold_parameter(u32 f, T* p0, T* p1, T* p2, T* p3) {
    switch (f) {
        case 0: return p0;
        case 1: return p1;
        case 2: return p2;
        default: return p3;
    }
}

// A sum of doubles, in the order the atomics add: an op of the fold kernels
// only (the join's folds and the group-by's table folds).
#define FOLD_F64_SUM 4

__device__ __forceinline__ u64 fold_identity(u32 op) {
    return op == FOLD_F64_SUM ? 0ULL : identity_of(op);  // +0.0 is all zero bits
}

__device__ __forceinline__ u64 fold_combine(u32 op, u64 a, u64 b) {
    if (op == FOLD_F64_SUM) {
        return (u64)__double_as_longlong(__longlong_as_double((long long)a) +
                                         __longlong_as_double((long long)b));
    }
    return combine(op, a, b);
}
