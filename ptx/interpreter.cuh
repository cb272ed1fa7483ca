// The scan interpreter shared by `scan_aggregate.cu` and `scan_filter.cu`:
// a small register-machine program, compiled on the host from a query's
// expressions (`src/exec/scan_aggregate/program.rs`) and validated by the
// launch wrappers (`src/gpu/launch/scan_aggregate.rs`), run per table row.
//
// Columns: `columns` holds COLUMN_WORDS words per column: the device
// address of its values (one 8-byte word per row: an i64, or an f64's bits;
// or, where the address has its lowest bit set, one 4-byte signed integer
// per row, read sign-extended: allocations are aligned, so the bit is free),
// of its validity bitmap (bit r of word r / 64 set = row r valid), 0 when
// every row is valid, and, for a column of strings kept as their bytes, of
// those bytes and their count (0 and 0 otherwise): its values are then
// rows + 1 offsets into the bytes, row r's string lying in
// [offset r, offset r + 1).
//
// Program: `instructions` instructions of 5 i64 words, [op, dst, a, b, c],
// run in order on every row. 32 registers, each an i64 (f64 bits for floats)
// and a valid flag; a register read before an instruction of this row wrote
// it is 0 and invalid, and an invalid register's value always reads as 0.
// `remap` holds `remap_len` u32s: remap[k] is where key k's table of
// dictionary codes starts in it (group keys map codes to global codes,
// code tests map them to a test's result; a key test's table is a set of
// integers instead, see OP_KEY_TEST). Tables lie end to end after the
// starts, so remap[0] is the number of keys.
#pragma once
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
#define OP_CODE_TEST 34
#define OP_KEY_TEST 35
#define OP_LIKE 36
#define OP_ROW_OF 37

#define COLUMN_WORDS 4

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

// Column `a`'s value word at `row` (an 8-byte word, or a 4-byte integer
// sign-extended where the address's lowest bit is set).
__device__ __forceinline__ long long column_word(u64 address, u64 row) {
    return (address & 1) ? (long long)__ldg((const int*)(address - 1) + row)
                         : __ldg((const long long*)address + row);
}

// Byte `i` of a pattern's literal bytes, packed four to a little-endian
// word of the remap table from word `at`.
__device__ __forceinline__ unsigned char pattern_byte(const u32* remap, u64 at, u32 i) {
    return (unsigned char)(__ldg(remap + at + i / 4) >> (8 * (i % 4)));
}

// Whether segment bytes [at..) of length `len`, from byte `from` on, equal
// the string's bytes from `s` (which holds the segment's byte `from`).
__device__ __forceinline__ bool segment_at(const unsigned char* s, const u32* remap, u64 at,
                                           u32 len, u32 from = 0) {
    for (u32 i = from; i < len; ++i) {
        if (__ldg(s + i - from) != pattern_byte(remap, at, i)) return false;
    }
    return true;
}

// Whether the string s[0..n) matches a LIKE pattern of literal segments
// separated by `%` (no `_`, no escapes), as compiled by the host
// (`like_table` in `src/exec/scan_aggregate/program.rs`): the table at
// `start` (of `end - start` words) holds the segment count k, then whether
// the pattern starts with `%` and whether it ends with one, then per
// segment its byte length and its bytes (four to a word). Segments match
// leftmost first, which decides such patterns: the first is a prefix unless
// the pattern starts with `%`, the last a suffix unless it ends with one,
// the others found in turn after each other. A table that does not hold
// what its counts say sets `bad`.
__device__ bool like_matches(const unsigned char* s, u64 n, const u32* remap, u64 start, u64 end,
                             bool& bad) {
    if (end < start + 3) {
        bad = true;
        return false;
    }
    const u32 k = __ldg(remap + start);
    const bool open_start = __ldg(remap + start + 1) != 0;
    const bool open_end = __ldg(remap + start + 2) != 0;
    // Each segment's length word and where its bytes start.
    u64 at = start + 3;
    u64 pos = 0;  // bytes of s consumed so far
    for (u32 seg = 0; seg < k; ++seg) {
        if (at >= end) {
            bad = true;
            return false;
        }
        const u32 len = __ldg(remap + at);
        const u64 bytes_at = at + 1;
        at = bytes_at + ((u64)len + 3) / 4;  // in 64 bits: a length near 2^32 must not wrap
        if (at > end) {
            bad = true;
            return false;
        }
        const bool first = seg == 0, last = seg + 1 == k;
        if (last && !open_end) {
            // A suffix, after what the segments before it took.
            if (n < pos + len) return false;
            if (first && !open_start && n != len) return false;
            if (!segment_at(s + (n - len), remap, bytes_at, len)) return false;
            pos = n;
            continue;
        }
        if (first && !open_start) {
            if (n < len || !segment_at(s, remap, bytes_at, len)) return false;
            pos = len;
            continue;
        }
        // Leftmost occurrence at or after pos: the string's bytes are
        // scanned for the segment's first byte, held in a register, and the
        // rest compared only where it is found.
        if (len == 0) continue;
        const unsigned char head = pattern_byte(remap, bytes_at, 0);
        bool found = false;
        for (u64 p = pos; p + len <= n; ++p) {
            if (__ldg(s + p) == head && segment_at(s + p + 1, remap, bytes_at, len, 1)) {
                pos = p + len;
                found = true;
                break;
            }
        }
        if (!found) return false;
    }
    // No segment: "%" (or "%%") matches everything, "" only the empty string.
    if (k == 0) return open_start || open_end || n == 0;
    return true;
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
            const u64 address = __ldg(columns + COLUMN_WORDS * a);
            const u64* bitmap = (const u64*)__ldg(columns + COLUMN_WORDS * a + 1);
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
        case OP_CODE_TEST: {
            // A string predicate evaluated on the host over the part's
            // dictionary: entry 0 false, 1 true, 2 NULL; `c` the result for
            // a NULL input.
            const u64 address = __ldg(columns + COLUMN_WORDS * a);
            const u64* bitmap = (const u64*)__ldg(columns + COLUMN_WORDS * a + 1);
            const bool valid = bitmap == nullptr || ((__ldg(bitmap + (row >> 6)) >> (row & 63)) & 1);
            long long result = __ldg(ins + 4);
            if (valid) {
                const long long word = (address & 1)
                    ? (long long)__ldg((const int*)(address - 1) + row)
                    : __ldg((const long long*)address + row);
                const u64 start = (u64)b < remap_len ? (u64)__ldg(remap + b) : (u64)remap_len;
                const u64 at = start + (u64)word;
                if (at < remap_len && at >= start) {
                    result = (long long)__ldg(remap + at);
                } else {
                    result = 2;
                    *overflow = 1;
                }
            }
            regs.set(dst, result == 1 ? 1 : 0, result != 2);
            break;
        }
        case OP_KEY_TEST: {
            // Whether column `a`'s integer is in key `b`'s set: a table of
            // the set's smallest value (two words, low first) and a bitmap
            // from it (bit v - smallest of word (v - smallest) / 32). An
            // empty table holds no set yet: every row passes. A NULL never
            // passes. Always valid.
            const u64 keys = remap_len > 0 ? (u64)__ldg(remap) : 0;
            const u64 start = (u64)b < remap_len ? (u64)__ldg(remap + b) : (u64)remap_len;
            u64 end = (u64)b + 1 < keys && (u64)b + 1 < remap_len ? (u64)__ldg(remap + b + 1)
                                                                 : (u64)remap_len;
            if (end > remap_len) end = remap_len;
            long long result = 1;
            if (end > start) {
                const u64 address = __ldg(columns + COLUMN_WORDS * a);
                const u64* bitmap = (const u64*)__ldg(columns + COLUMN_WORDS * a + 1);
                const bool valid =
                    bitmap == nullptr || ((__ldg(bitmap + (row >> 6)) >> (row & 63)) & 1);
                result = 0;
                if (valid && end - start >= 2) {
                    const long long word = (address & 1)
                        ? (long long)__ldg((const int*)(address - 1) + row)
                        : __ldg((const long long*)address + row);
                    const u64 smallest =
                        (u64)__ldg(remap + start) | ((u64)__ldg(remap + start + 1) << 32);
                    const u64 offset = (u64)word - smallest;
                    const u64 words = end - start - 2;
                    if (offset / 32 < words) {
                        result = (__ldg(remap + start + 2 + offset / 32) >> (offset % 32)) & 1;
                    }
                }
            }
            regs.set(dst, result, true);
            break;
        }
        case OP_LIKE: {
            // Whether column `a`'s string (kept as its bytes) matches the
            // LIKE pattern of key `b`'s table (see like_matches); NULL for
            // a NULL string.
            const u64* column = columns + COLUMN_WORDS * a;
            const u64 offsets = __ldg(column);
            const u64* bitmap = (const u64*)__ldg(column + 1);
            const unsigned char* bytes = (const unsigned char*)__ldg(column + 2);
            const u64 byte_count = __ldg(column + 3);
            const bool valid = bitmap == nullptr || ((__ldg(bitmap + (row >> 6)) >> (row & 63)) & 1);
            long long result = 0;
            if (valid) {
                const long long from = column_word(offsets, row);
                const long long to = column_word(offsets, row + 1);
                const u64 keys = remap_len > 0 ? (u64)__ldg(remap) : 0;
                const u64 start = (u64)b < remap_len ? (u64)__ldg(remap + b) : (u64)remap_len;
                u64 end = (u64)b + 1 < keys && (u64)b + 1 < remap_len ? (u64)__ldg(remap + b + 1)
                                                                     : (u64)remap_len;
                if (end > remap_len) end = remap_len;
                bool bad = bytes == nullptr || from < 0 || to < from || (u64)to > byte_count;
                if (!bad) {
                    result = like_matches(bytes + from, (u64)(to - from), remap, start, end, bad)
                        ? 1 : 0;
                }
                if (bad) {
                    result = 0;
                    *overflow = 1;
                }
            }
            regs.set(dst, result, valid);
            break;
        }
        case OP_ROW_OF: {
            // The row's index in the chunk, valid where column `a`'s value
            // is: a string kept as its bytes is output so, and made on the
            // host from the column's offsets and bytes.
            const u64* bitmap = (const u64*)__ldg(columns + COLUMN_WORDS * a + 1);
            const bool valid = bitmap == nullptr || ((__ldg(bitmap + (row >> 6)) >> (row & 63)) & 1);
            regs.set(dst, (long long)row, valid);
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
