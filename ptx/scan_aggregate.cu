// A filtering, aggregating scan over table rows in one kernel: a small
// register-machine program (compiled on the host from the query's
// expressions) runs per row, a predicate register decides whether the row
// counts, a group register picks its group, and each accumulator folds one
// register into its slot of that group. The host side is
// `src/gpu/launch/scan_aggregate.rs`, which validates the program first.
//
// Columns, program and remap tables: see `interpreter.cuh`.
//
// Output: `out` holds 2 words per slot, slot g * accumulator_count + a for
// group g and accumulator a, set by the host to each kind's initial value
// (`accumulator_init`); every launch adds its rows into them, so one `out`
// accumulates the launches over a table's chunks. An i64 overflow in the
// program, a group value outside [0, groups) or a dictionary code whose
// entry lies past remap_len sets *overflow = 1 (and the row is skipped where
// its group is wrong): the host then hands the whole aggregate back to the
// CPU. The host checks register, column and key operands before launching;
// a remapped code is device data, so the kernel checks it itself.
//
// Launch: any grid, block = BLOCK_THREADS (grid-stride over rows), dynamic
// shared memory = 16 * groups * accumulator_count bytes (48 KiB at most).
#include "interpreter.cuh"

// Accumulator kinds: `AccumulatorKind` in the Rust wrapper.
#define ACC_SUM_I64 0
#define ACC_SUM_F64 1
#define ACC_COUNT 2
#define ACC_MIN_I64 3
#define ACC_MAX_I64 4

// A row's (or a run of rows') share of one accumulator, as the two words
// of its slot. Lanes whose row does not count hold the kind's identity.
struct Partial {
    u64 w0, w1;
};

__device__ __forceinline__ u64 initial_word0(int kind) {
    return kind == ACC_MIN_I64 ? (u64)I64_MAX : kind == ACC_MAX_I64 ? (u64)I64_MIN : 0ULL;
}

__device__ __forceinline__ Partial row_partial(int kind, bool has, long long v) {
    Partial p;
    switch (kind) {
    case ACC_SUM_I64:
        p.w0 = has ? (u64)v : 0ULL;
        p.w1 = has && v < 0 ? ~0ULL : 0ULL;
        break;
    case ACC_SUM_F64:
        p.w0 = has ? (u64)v : 0ULL;
        p.w1 = has ? 1ULL : 0ULL;
        break;
    case ACC_COUNT:
        p.w0 = has ? 1ULL : 0ULL;
        p.w1 = 0;
        break;
    default:
        p.w0 = has ? (u64)v : initial_word0(kind);
        p.w1 = has ? 1ULL : 0ULL;
        break;
    }
    return p;
}

// `p` with `q` folded in (both partials of the same kind).
__device__ __forceinline__ Partial combine(int kind, Partial p, Partial q) {
    switch (kind) {
    case ACC_SUM_I64: {
        const u64 lo = p.w0 + q.w0;
        p.w1 = p.w1 + q.w1 + (lo < p.w0 ? 1ULL : 0ULL);
        p.w0 = lo;
        break;
    }
    case ACC_SUM_F64:
        p.w0 = (u64)f64_bits(__dadd_rn(as_f64((long long)p.w0), as_f64((long long)q.w0)));
        p.w1 += q.w1;
        break;
    case ACC_COUNT: p.w0 += q.w0; break;
    case ACC_MIN_I64:
        p.w0 = (u64)min((long long)p.w0, (long long)q.w0);
        p.w1 += q.w1;
        break;
    default:
        p.w0 = (u64)max((long long)p.w0, (long long)q.w0);
        p.w1 += q.w1;
        break;
    }
    return p;
}

// Adds `p` into the slot at `slot` (shared or global memory) with atomics,
// exactly for 128-bit sums whatever the order: each carry comes from the
// value the atomic found. A partial that adds nothing is skipped.
__device__ __forceinline__ void atomic_merge(int kind, u64* slot, Partial p) {
    switch (kind) {
    case ACC_SUM_I64:
        if (p.w0 != 0 || p.w1 != 0) {
            const u64 old = atomicAdd(&slot[0], p.w0);
            const u64 carry = old + p.w0 < old ? 1ULL : 0ULL;
            atomicAdd(&slot[1], p.w1 + carry);
        }
        break;
    case ACC_SUM_F64:
        if (p.w1 != 0) {
            atomicAdd((double*)&slot[0], as_f64((long long)p.w0));
            atomicAdd(&slot[1], p.w1);
        }
        break;
    case ACC_COUNT:
        if (p.w0 != 0) atomicAdd(&slot[0], p.w0);
        break;
    case ACC_MIN_I64:
        if (p.w1 != 0) {
            atomicMin((long long*)&slot[0], (long long)p.w0);
            atomicAdd(&slot[1], p.w1);
        }
        break;
    default:
        if (p.w1 != 0) {
            atomicMax((long long*)&slot[0], (long long)p.w0);
            atomicAdd(&slot[1], p.w1);
        }
        break;
    }
}

// Rounds of the in-warp reduction of lanes that share a key: a run of up
// to 32 peers halves each round.
#define REDUCE_ROUNDS 5

extern "C" __global__ void scan_aggregate(const u64* columns, u64 rows, const long long* program,
                                          u32 instructions, const u32* remap, u32 remap_len,
                                          int predicate, int group, u32 groups,
                                          const int* accumulators, u32 accumulator_count,
                                          u64* out, u32* overflow) {
    extern __shared__ u64 slots[];
    const u32 slot_count = groups * accumulator_count;
    for (u32 s = threadIdx.x; s < slot_count; s += BLOCK_THREADS) {
        slots[2 * s] = initial_word0(__ldg(accumulators + 2 * (s % accumulator_count)));
        slots[2 * s + 1] = 0;
    }
    __syncthreads();

    long long register_values[SCAN_REGISTERS];
    u32 valid = 0;
    Registers regs = {register_values, valid};
    const u32 lane = lane_id();
    const u64 stride = (u64)gridDim.x * BLOCK_THREADS;
    // `base` is the same for the whole block, so every lane of a warp runs
    // each iteration and takes part in the warp's collectives below.
    for (u64 base = (u64)blockIdx.x * BLOCK_THREADS; base < rows; base += stride) {
        const u64 row = base + threadIdx.x;
        u32 key = NO_GROUP;
        if (row < rows) {
            run_program(regs, columns, row, program, instructions, remap, remap_len, overflow);
            if (predicate < 0 || (regs.ok(predicate) && regs.get(predicate) != 0)) {
                const u64 g = group < 0 ? 0ULL : (u64)regs.get(group);
                if (g < groups) {
                    key = (u32)g;
                } else {
                    *overflow = 1;
                }
            }
        }

        // Lanes of one key reduce their partials in the warp first (a tree
        // over the peers in lane order, after Westphal's "reduce_peers"), so
        // one lane per key and warp reaches shared memory: a group many rows
        // share costs one shared atomic per warp, not one per row (on an
        // H200, 2 to 3 times faster where all rows share a group, as fast
        // where they spread over hundreds). The
        // pattern of the tree depends on the keys alone, so it is found once
        // here for every accumulator: in round r a lane folds in the partial
        // of `source[r]` (-1: none).
        const u32 peers = __match_any_sync(FULL_MASK, key);
        const bool leader = (peers & lanemask_lt()) == 0;
        u32 above = peers & (0xfffffffeu << lane);
        u32 rank = __popc(peers & lanemask_lt());
        int source[REDUCE_ROUNDS];
        int rounds = 0;
#pragma unroll
        for (int r = 0; r < REDUCE_ROUNDS; ++r) {
            source[r] = above != 0 ? __ffs(above) - 1 : -1;
            if (__any_sync(FULL_MASK, above != 0)) rounds = r + 1;
            // Peers of odd rank (among those left) gave their partial to
            // the one below them this round: nobody reads theirs again.
            above &= ~__ballot_sync(FULL_MASK, rank & 1);
            rank >>= 1;
        }

        for (u32 acc = 0; acc < accumulator_count; ++acc) {
            const int kind = __ldg(accumulators + 2 * acc);
            const int reg = __ldg(accumulators + 2 * acc + 1);
            const bool has = key != NO_GROUP && (reg < 0 || regs.ok(reg));
            Partial p = row_partial(kind, has, reg < 0 ? 0 : regs.get(reg));
#pragma unroll
            for (int r = 0; r < REDUCE_ROUNDS; ++r) {
                // `rounds` is the same on every lane: the shuffles see the
                // whole warp.
                if (r < rounds) {
                    Partial q;
                    q.w0 = __shfl_sync(FULL_MASK, p.w0, source[r] & 31);
                    q.w1 = __shfl_sync(FULL_MASK, p.w1, source[r] & 31);
                    if (source[r] >= 0) p = combine(kind, p, q);
                }
            }
            if (leader && key != NO_GROUP) {
                atomic_merge(kind, &slots[2 * ((u64)key * accumulator_count + acc)], p);
            }
        }
    }
    __syncthreads();

    for (u32 s = threadIdx.x; s < slot_count; s += BLOCK_THREADS) {
        const Partial p = {slots[2 * s], slots[2 * s + 1]};
        atomic_merge(__ldg(accumulators + 2 * (s % accumulator_count)), &out[2 * (u64)s], p);
    }
}
