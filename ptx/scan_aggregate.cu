// A filtering, aggregating scan over table rows in one kernel: a small
// register-machine program (compiled on the host from the query's
// expressions) runs per row, a predicate register decides whether the row
// counts, a group register picks its group, and each accumulator folds one
// register into its slot of that group. The host side is
// `src/gpu/launch/scan_aggregate.rs`, which validates the program first.
//
// Columns: `columns` holds two words per column, the device address of its
// values (one 8-byte word per row: an i64, or an f64's bits; or, where the
// address has its lowest bit set, one 4-byte signed integer per row, read
// sign-extended: allocations are aligned, so the bit is free) and of its
// validity bitmap (bit r of word r / 64 set = row r valid), 0 when every row
// is valid.
//
// Program: `instructions` instructions of 5 i64 words, [op, dst, a, b, c],
// run in order on every row. 32 registers, each an i64 (f64 bits for floats)
// and a valid flag; a register read before an instruction of this row wrote
// it is 0 and invalid, and an invalid register's value always reads as 0.
// `remap` holds `remap_len` u32s: remap[k] is where key k's table of
// dictionary codes to global codes starts in it.
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
#include "common.cuh"

// Opcodes: `ScanOp` in the Rust wrapper has the same values.
#define OP_LOAD_I64 0
#define OP_LOAD_F64 1
#define OP_LOAD_CODE 2
#define OP_CONST 3
#define OP_NULL 4
#define OP_ADD_I64 5
#define OP_SUB_I64 6
#define OP_MUL_I64 7
#define OP_NEG_I64 8
#define OP_SCALE_I64 9
#define OP_ADD_F64 10
#define OP_SUB_F64 11
#define OP_MUL_F64 12
#define OP_DIV_F64 13
#define OP_NEG_F64 14
#define OP_I64_TO_F64 15
#define OP_EQ_I64 16
#define OP_NE_I64 17
#define OP_LT_I64 18
#define OP_LE_I64 19
#define OP_GT_I64 20
#define OP_GE_I64 21
#define OP_EQ_F64 22
#define OP_NE_F64 23
#define OP_LT_F64 24
#define OP_LE_F64 25
#define OP_GT_F64 26
#define OP_GE_F64 27
#define OP_AND 28
#define OP_OR 29
#define OP_NOT 30
#define OP_IS_NULL 31
#define OP_IS_NOT_NULL 32
#define OP_SELECT 33

// Accumulator kinds: `AccumulatorKind` in the Rust wrapper.
#define ACC_SUM_I64 0
#define ACC_SUM_F64 1
#define ACC_COUNT 2
#define ACC_MIN_I64 3
#define ACC_MAX_I64 4

#define SCAN_REGISTERS 32
#define FULL_MASK 0xffffffffu
// The key of a lane whose row does not count (or lies past the chunk):
// above every group, since groups <= 2^32 - 1.
#define NO_GROUP 0xffffffffu
#define I64_MAX 0x7fffffffffffffffLL
#define I64_MIN (-I64_MAX - 1LL)

// One thread's registers: values in (local) memory, indexed by the
// program, and valid flags as the bits of one word, kept apart so that the
// word stays in a hardware register. A register index is taken modulo 32,
// so even a malformed program stays within the file.
struct Registers {
    long long* value;  // SCAN_REGISTERS of them
    u32& valid;

    __device__ __forceinline__ bool ok(long long r) const { return (valid >> (r & 31)) & 1u; }
    // The value, 0 where invalid (also a value left by an earlier row).
    __device__ __forceinline__ long long get(long long r) const {
        return ok(r) ? value[r & 31] : 0;
    }
    __device__ __forceinline__ void set(long long r, long long v, bool is_valid) {
        const u32 bit = 1u << (r & 31);
        value[r & 31] = v;
        valid = is_valid ? (valid | bit) : (valid & ~bit);
    }
};

__device__ __forceinline__ double as_f64(long long bits) { return __longlong_as_double(bits); }
__device__ __forceinline__ long long f64_bits(double x) { return __double_as_longlong(x); }

// Rust's `f64::total_cmp` key: ordering these as signed integers orders the
// doubles as Arrow's comparison kernels do (-NaN < -inf < ... < -0.0 < +0.0
// < ... < +inf < NaN, a NaN equal to itself).
__device__ __forceinline__ long long total_order_key(long long bits) {
    return bits ^ (long long)((u64)(bits >> 63) >> 1);
}

// Signed 64-bit arithmetic with overflow detection; the results wrap.
__device__ __forceinline__ long long add_checked(long long x, long long y, bool& overflowed) {
    const long long r = (long long)((u64)x + (u64)y);
    overflowed = ((x ^ r) & (y ^ r)) < 0;
    return r;
}

__device__ __forceinline__ long long sub_checked(long long x, long long y, bool& overflowed) {
    const long long r = (long long)((u64)x - (u64)y);
    overflowed = ((x ^ y) & (x ^ r)) < 0;
    return r;
}

__device__ __forceinline__ long long mul_checked(long long x, long long y, bool& overflowed) {
    const long long low = (long long)((u64)x * (u64)y);
    // The product fits iff its high 64 bits are the sign extension of the low.
    overflowed = __mul64hi(x, y) != (low >> 63);
    return low;
}

// Runs the program on row `row`, which lies within the chunk.
__device__ __forceinline__ void run_program(Registers regs, const u64* columns, u64 row,
                                            const long long* program, u32 instructions,
                                            const u32* remap, u32 remap_len, u32* overflow) {
    regs.valid = 0;
    bool overflowed = false;
    for (u32 i = 0; i < instructions; ++i) {
        const long long* ins = program + 5 * (u64)i;
        const long long op = __ldg(ins);
        const long long dst = __ldg(ins + 1);
        const long long a = __ldg(ins + 2);
        const long long b = __ldg(ins + 3);
        switch (op) {
        case OP_LOAD_I64:
        case OP_LOAD_F64:
        case OP_LOAD_CODE: {
            const u64 address = __ldg(columns + 2 * a);
            const u64* bitmap = (const u64*)__ldg(columns + 2 * a + 1);
            const long long word = (address & 1)
                ? (long long)__ldg((const int*)(address - 1) + row)
                : __ldg((const long long*)address + row);
            const bool valid = bitmap == nullptr || ((__ldg(bitmap + (row >> 6)) >> (row & 63)) & 1);
            if (op != OP_LOAD_CODE) {
                regs.set(dst, word, valid);
                break;
            }
            // NULL is group code 0, code c of key b is 1 + its global code.
            long long code = 0;
            if (valid) {
                const u64 start = (u64)b < remap_len ? (u64)__ldg(remap + b) : (u64)remap_len;
                const u64 at = start + (u64)word;
                if (at < remap_len && at >= start) {
                    code = (long long)__ldg(remap + at) + 1;
                } else {
                    *overflow = 1;
                }
            }
            regs.set(dst, code, true);
            break;
        }
        case OP_CONST: regs.set(dst, a, true); break;
        case OP_NULL: regs.set(dst, 0, false); break;
        case OP_ADD_I64:
        case OP_SUB_I64:
        case OP_MUL_I64: {
            const bool valid = regs.ok(a) && regs.ok(b);
            long long r = 0;
            if (valid) {
                const long long x = regs.get(a), y = regs.get(b);
                bool over;
                r = op == OP_ADD_I64   ? add_checked(x, y, over)
                    : op == OP_SUB_I64 ? sub_checked(x, y, over)
                                       : mul_checked(x, y, over);
                overflowed |= over;
            }
            regs.set(dst, r, valid);
            break;
        }
        case OP_NEG_I64: {
            const long long x = regs.get(a);
            overflowed |= regs.ok(a) && x == I64_MIN;
            regs.set(dst, (long long)(0ULL - (u64)x), regs.ok(a));
            break;
        }
        case OP_SCALE_I64: {
            const bool valid = regs.ok(a);
            long long r = 0;
            if (valid) {
                bool over;
                r = mul_checked(regs.get(a), b, over);
                overflowed |= over;
            }
            regs.set(dst, r, valid);
            break;
        }
        case OP_ADD_F64:
        case OP_SUB_F64:
        case OP_MUL_F64:
        case OP_DIV_F64: {
            // The intrinsics round each operation on its own: never fused.
            const double x = as_f64(regs.get(a)), y = as_f64(regs.get(b));
            const double r = op == OP_ADD_F64   ? __dadd_rn(x, y)
                             : op == OP_SUB_F64 ? __dsub_rn(x, y)
                             : op == OP_MUL_F64 ? __dmul_rn(x, y)
                                                : __ddiv_rn(x, y);
            regs.set(dst, f64_bits(r), regs.ok(a) && regs.ok(b));
            break;
        }
        case OP_NEG_F64:
            // IEEE negation flips the sign bit, NaNs included.
            regs.set(dst, regs.get(a) ^ I64_MIN, regs.ok(a));
            break;
        case OP_I64_TO_F64: regs.set(dst, f64_bits((double)regs.get(a)), regs.ok(a)); break;
        case OP_EQ_I64:
        case OP_NE_I64:
        case OP_LT_I64:
        case OP_LE_I64:
        case OP_GT_I64:
        case OP_GE_I64:
        case OP_EQ_F64:
        case OP_NE_F64:
        case OP_LT_F64:
        case OP_LE_F64:
        case OP_GT_F64:
        case OP_GE_F64: {
            long long x = regs.get(a), y = regs.get(b);
            long long cmp = op;
            if (op >= OP_EQ_F64) {
                x = total_order_key(x);
                y = total_order_key(y);
                cmp -= OP_EQ_F64 - OP_EQ_I64;
            }
            const bool r = cmp == OP_EQ_I64   ? x == y
                           : cmp == OP_NE_I64 ? x != y
                           : cmp == OP_LT_I64 ? x < y
                           : cmp == OP_LE_I64 ? x <= y
                           : cmp == OP_GT_I64 ? x > y
                                              : x >= y;
            regs.set(dst, r ? 1 : 0, regs.ok(a) && regs.ok(b));
            break;
        }
        case OP_AND:
        case OP_OR: {
            // Kleene logic: a valid operand equal to `decides` (false for
            // AND, true for OR) decides the result; else NULL wins.
            const bool decides = op == OP_OR;
            const bool va = regs.ok(a), vb = regs.ok(b);
            const bool ta = regs.get(a) != 0, tb = regs.get(b) != 0;
            if ((va && ta == decides) || (vb && tb == decides)) {
                regs.set(dst, decides ? 1 : 0, true);
            } else {
                regs.set(dst, decides ? 0 : 1, va && vb);
            }
            break;
        }
        case OP_NOT: regs.set(dst, regs.get(a) == 0 ? 1 : 0, regs.ok(a)); break;
        case OP_IS_NULL: regs.set(dst, regs.ok(a) ? 0 : 1, true); break;
        case OP_IS_NOT_NULL: regs.set(dst, regs.ok(a) ? 1 : 0, true); break;
        case OP_SELECT: {
            const long long c = __ldg(ins + 4);
            const long long chosen = regs.ok(a) && regs.get(a) != 0 ? b : c;
            regs.set(dst, regs.get(chosen), regs.ok(chosen));
            break;
        }
        default:
            // The host rejects unknown opcodes; flag one rather than guess.
            overflowed = true;
            break;
        }
    }
    if (overflowed) *overflow = 1;
}

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
