// Hash group-by (seed 002 §4.2, HGB): stage 1 gives every row a dense group
// id through one global hash table, stage 2 reduces each aggregate column
// into per-group slots, privatized in shared memory when the groups fit.
//
// Stage 1, `group_insert`: linear probing on mix64(key) in a table of
// `capacity` (a power of two) key slots plus one reserved slot for the key
// EMPTY_KEY itself, so every u64 is a valid key. The thread that claims a
// slot takes the next group id from an atomic counter and records the row
// as the group's first row (the host reads the group's key columns from
// that row). Every row records its slot; the next kernel, `group_resolve`,
// turns slots into group ids (a separate launch, so every claimed slot's
// group id is visible by then). A table sized to twice the rows always has
// room; one sized from an estimate of the groups may not, and gives up
// (see group_insert).
//
// Stage 2, `aggregate_u64` / `aggregate_f64_sum` / `aggregate_i128_sum`:
// SUM, MIN, MAX and COUNT over 64-bit values. The host maps every type to
// an unsigned value whose order is the type's order (signed integers with
// the sign bit flipped), so MIN and MAX are unsigned atomics; wrapping SUM
// is the same on signed and unsigned bits. NULL rows (and rows a FILTER
// drops) are skipped through a validity bitmap, 64 rows per word.
#include "common.cuh"
#include "fold.cuh"

#define EMPTY_KEY 0xffffffffffffffffULL

// Whether row i's bit is set in a validity bitmap (null: every row's is).
__device__ __forceinline__ bool row_valid(const u64* valid_bits, u64 i) {
    return valid_bits == nullptr || ((valid_bits[i >> 6] >> (i & 63)) & 1ULL);
}

// Writes `value` to out[0..n). Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void fill_u64(u64* out, u64 n, u64 value) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}

// Stage 1. `table_keys` holds capacity + 1 entries, all EMPTY_KEY on entry;
// `group_count` is 0 on entry. Writes the claimed slot of every row to
// `row_slots[i]`, and for each new group g: table_groups[slot] = g and
// group_first_rows[g] = the claiming row. At most n groups, so
// `group_first_rows` needs n entries.
// With `overflow` null, the table must have at least twice as many slots as
// rows, so every probe ends. With `overflow` non-null (0 on entry), the
// table was sized from an estimate of the groups and may fill up: a row
// that has probed GIVE_UP_PROBES slots while the table is at least three
// quarters full (or has probed every slot) sets *overflow and its thread
// stops (a table sized to at least four times the estimate fills that far
// only where the estimate was low by three times or more), and the other
// threads stop within 32 rows of seeing it. The table and the outputs are
// then incomplete: the host numbers the rows again in a table sized to
// them.
// Launch: any grid (grid-stride), block = BLOCK_THREADS.
#define GIVE_UP_PROBES 64
extern "C" __global__ void group_insert(const u64* keys, u64 n, u64* table_keys, u64* table_groups,
                                        u64 capacity, u64* group_count, u64* group_first_rows,
                                        u64* row_slots, u64* overflow) {
    const u64 mask = capacity - 1;
    u32 rows_seen = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        if (overflow != nullptr && (++rows_seen & 31) == 0 && *(volatile u64*)overflow != 0) return;
        const u64 key = keys[i];
        u64 slot;
        bool claimed;
        if (key == EMPTY_KEY) {
            // The reserved slot: its stored value (0) only marks it
            // claimed. Read first, so that only its first rows take the
            // atomic; a stale EMPTY_KEY only sends a row to the CAS.
            slot = capacity;
            claimed = read_monotone_word(&table_keys[slot]) == EMPTY_KEY &&
                      atomicCAS(&table_keys[slot], EMPTY_KEY, 0ULL) == EMPTY_KEY;
        } else {
            slot = mix64(key) & mask;
            u64 probes = 0;
            while (true) {
                // A read first: most rows find their key already there. A
                // stale EMPTY_KEY only sends the row to the CAS below.
                const u64 seen = read_monotone_word(&table_keys[slot]);
                if (seen == key) {
                    claimed = false;
                    break;
                }
                if (seen == EMPTY_KEY) {
                    const u64 old = atomicCAS(&table_keys[slot], EMPTY_KEY, key);
                    if (old == EMPTY_KEY) {
                        claimed = true;
                        break;
                    }
                    if (old == key) {
                        claimed = false;
                        break;
                    }
                }
                slot = (slot + 1) & mask;
                if (overflow != nullptr && ++probes >= GIVE_UP_PROBES &&
                    (probes >= capacity || 4 * *(volatile u64*)group_count >= 3 * capacity)) {
                    atomicExch(overflow, 1ULL);
                    return;
                }
            }
        }
        if (claimed) {
            const u64 group = atomicAdd(group_count, 1ULL);
            table_groups[slot] = group;
            group_first_rows[group] = i;
        }
        row_slots[i] = slot;
    }
}

// Stage 1 and stage 2 in one pass (fused HGB), over a table sized from an
// estimate of the groups: each row finds or claims its key's slot as in
// group_insert, and folds each aggregated value straight into that slot's
// results, so no row's slot or group id is ever written out nor read back,
// and every column is read once. A slot holds its folds' words and its key
// together (table_slot_words), so that a row's probe of a slot meets one
// sector of L2 for up to three folds. Only rows that change their slot's
// words go on to atomics, and lanes of a warp that change the same slot
// are combined first (combine_peers), so that one atomic per fold reaches
// it: that keeps hot keys (few groups, or skew) from serializing on their
// slots.
//
// Every fold's word starts at zero: COUNT and SUM add, MAX keeps the
// largest word, a MIN keeps the largest complemented word (~0, MIN's
// identity, once complemented back), FOLD_F64_SUM adds doubles (+0.0 is
// all zero bits). A slot's key is kept complemented, so that a table of
// zeros is empty: a key word of 0 is an empty slot (the key EMPTY_KEY,
// whose complement is 0, has the reserved slot, where 1 marks it
// claimed). `table_fold_results` then moves each claimed slot's words to
// its group.
#define MAX_TABLE_FOLDS 4
#define FULL_WARP 0xffffffffu

// The op a fold's words combine with: a COUNT adds its ones, a MIN (kept
// complemented) is a MAX.
__device__ __forceinline__ u32 table_fold_combine_op(u32 op) {
    return op == OP_COUNT ? OP_SUM : op == OP_MIN ? OP_MAX : op;
}

// Combines `word` over the lanes of `peers` (this lane's group of lanes)
// into the lowest of them, in log steps: each lane still in play takes the
// word of the next one above it in its group, then the lanes at odd ranks
// among those in play (just taken) leave. Every lane of the warp calls it
// together, with the same `op`; only the lowest lane of a group ends with
// its group's result.
__device__ __forceinline__ u64 combine_peers(u32 op, u32 peers, u64 word) {
    const u32 lane = lane_id();
    // Lanes of the group above this one, not yet taken (lane 31: none).
    u32 above = lane == 31 ? 0u : peers & (~0u << (lane + 1));
    u32 rank = __popc(peers & lanemask_lt());
    while (__any_sync(FULL_WARP, above != 0)) {
        const u32 next = above != 0 ? __ffs(above) - 1 : lane;
        const u64 theirs = __shfl_sync(FULL_WARP, word, next);
        if (above != 0) word = fold_combine(op, word, theirs);
        above &= __ballot_sync(FULL_WARP, (rank & 1) == 0);
        rank >>= 1;
    }
    return word;
}

// Words of each slot of slot_results for `folds` folds: the folds' words
// from the slot's first word, its key (complemented) in its last, and as
// many words between as make a power of two, so that a slot is one aligned
// piece of 16, 32 or 64 bytes, read 16 bytes at a time: the key and up to
// three folds' words share one 32-byte sector.
__host__ __device__ constexpr u32 table_slot_words(u32 folds) {
    return folds == 1 ? 2u : folds <= 3 ? 4u : 8u;
}

// A claimed slot's key word, for a key other than EMPTY_KEY, and the mark
// of the reserved slot (the key EMPTY_KEY's) once claimed.
__device__ __forceinline__ u64 stored_key(u64 key) { return ~key; }
#define RESERVED_SLOT_CLAIMED 1ULL

// A word of a column the fold reads once, under `policy`
// (streamed_policy). `asm volatile`, so that the load stays behind the
// test of its row's range.
__device__ __forceinline__ u64 read_streamed(const u64* at, u64 policy) {
    u64 word;
    asm volatile("ld.global.L2::cache_hint.u64 %0, [%1], %2;"
                 : "=l"(word)
                 : "l"(at), "l"(policy));
    return word;
}

// An L2 policy under which lines leave L2 first: the columns' lines, each
// read once, then make way before the table's. Where the table competes
// with the columns for L2 (2^18 groups, a table of 32 MiB), a chunk's fold
// then reads less from DRAM and takes less time; at fewer groups, whose
// tables stay in L2 either way, it changes nothing (BENCHMARKS.md has the
// measurements).
__device__ __forceinline__ u64 streamed_policy() {
    u64 policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// The slot at `at`: its FOLDS folds' words into `seen`, and its key word,
// returned, in 16-byte loads through L1 (read_monotone_pair: a slot's key and
// words only ever move one way), only of the pairs holding either. A slot's key
// and up to three folds' words then cost L2 one request (four folds' take two
// sectors), and L1 answers most reads of a table's hot slots. Read past L1
// (`ld.relaxed.gpu`), every read goes to L2, and the fold kernel takes
// markedly longer with few groups (BENCHMARKS.md has the measurements).
template <u32 FOLDS>
__device__ __forceinline__ u64 read_slot(const u64* at, u64 (&seen)[FOLDS]) {
    constexpr u32 words = table_slot_words(FOLDS);
    u64 key_word = 0;
#pragma unroll
    for (u32 p = 0; p < words; p += 2) {
        if (p >= FOLDS && p + 2 != words) continue;
        u64 first, second;
        read_monotone_pair(at + p, first, second);
        if (p < FOLDS) seen[p] = first;
        if (p + 1 < FOLDS) seen[p + 1] = second;
        if (p + 2 == words) key_word = second;
    }
    return key_word;
}

// A fold's constants, decoded once per launch from its spec (its op and
// the word XORed into each of its values): how a row's value becomes its
// word, and how words combine.
struct FoldCode {
    u64 xor_mask;    // the flip, complemented for a MIN (kept complemented)
    u32 combine_op;  // OP_SUM, OP_MAX or FOLD_F64_SUM
    bool counts;     // a COUNT: each counted row's word is 1
};

__device__ __forceinline__ FoldCode decode_fold(const u64* specs, u32 f) {
    const u32 op = (u32)specs[2 * f];
    const u64 flip = specs[2 * f + 1];
    FoldCode code;
    code.counts = op == OP_COUNT;
    code.combine_op = table_fold_combine_op(op);
    code.xor_mask = op == FOLD_F64_SUM ? 0ULL : op == OP_MIN ? ~flip : flip;
    return code;
}

// Whether a row's word of a fold can change a slot whose word was seen: a
// MAX (or a complemented MIN) only where it is larger, a sum where it is
// not zero. The slot's words only move towards their best, so a stale
// `seen` can only let a word through that changes nothing.
__device__ __forceinline__ bool word_changes_slot(u32 combine_op, u64 word, u64 seen) {
    return combine_op == OP_MAX ? word > seen : word != 0;
}

// One launch folds the rows [first_row, end_row) of `keys`, so that the rows'
// values can cross the bus in chunks, each folded while the next one is copied:
// values_f holds the chunk's values alone (row i's at i - first_row), while the
// keys, the bitmaps and group_first_rows are indexed by the row itself.
// Launches over the chunks of one table go in order on one stream.
// `table_groups` holds capacity + 1 entries set to EMPTY_KEY (slots left
// unclaimed keep it); `group_count` and `overflow` are 0 before the first
// chunk; `group_first_rows` holds an entry per row. `specs` holds two words per
// fold: its op (OP_SUM, OP_MIN, OP_MAX, OP_COUNT or FOLD_F64_SUM) and the word
// XORed into each of its values. Fold f reads values_f[i - first_row] (unused
// by a COUNT) for each row i whose bit is set in valid_f (null: every row).
// `slot_results` holds (capacity + 1) * table_slot_words(FOLDS) words, 0 on
// entry: fold f of slot s at s * table_slot_words(FOLDS) + f, the slot's key
// word at (s + 1) * table_slot_words(FOLDS) - 1. Writes, for each new group g,
// table_groups[slot] = g and group_first_rows[g] = a row of it. A full table
// sets *overflow as group_insert does, and leaves every output incomplete.
//
// Each lane finds its own row's slot, reading each slot it probes whole (its
// key and words), and keeps only the folds its row would change: a MIN or MAX
// whose slot already holds a better word is done, which after a group's first
// rows is nearly every row. Only the lanes whose rows change their slots go on,
// and only where two or more of them share a slot do they combine first (a vote
// on the slot, then a shuffle tree) so that one atomic per fold reaches it:
// that keeps a hot slot (few groups, skew, or values that keep growing) from
// serializing, without every warp paying for a vote and shuffles that most rows
// do not need.
// Launch: any grid (grid-stride over warps), block = BLOCK_THREADS, one
// entry point per fold count (group_insert_fold_1 to _4).
#define OVERFLOW_CHECK_STEPS 32
template <u32 FOLDS>
__device__ __forceinline__ void insert_fold_rows(
    const u64* keys, u64 first_row, u64 end_row, u64* table_groups, u64 capacity,
    u64* group_count, u64* group_first_rows, u64* overflow, const u64* specs,
    const u64* values0, const u64* values1, const u64* values2, const u64* values3,
    const u64* valid0, const u64* valid1, const u64* valid2, const u64* valid3,
    u64* slot_results) {
    static_assert(FOLDS >= 1 && FOLDS <= MAX_TABLE_FOLDS, "one column parameter per fold");
    FoldCode codes[FOLDS];
#pragma unroll
    for (u32 f = 0; f < FOLDS; ++f) codes[f] = decode_fold(specs, f);
    const u64 mask = capacity - 1;
    constexpr u32 slot_words = table_slot_words(FOLDS);
    const u64 policy = streamed_policy();
    // Whether the slots' words are read before their atomics: where every
    // fold is a sum, every counted row changes its slot anyway, and only
    // the key is read.
    bool reads_slots = false;
#pragma unroll
    for (u32 f = 0; f < FOLDS; ++f) reads_slots |= codes[f].combine_op == OP_MAX;
    // Slots compared in 32 bits where they fit: a narrower vote.
    const bool narrow_slots = capacity < (1ULL << 31);
    const u32 lane = lane_id();
    const u64 warp = (u64)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32;
    const u64 warp_stride = (u64)gridDim.x * WARPS_PER_BLOCK * 32;
    u32 steps = 0;
    // The loop is uniform across the warp: every lane takes each step, in
    // range or not, for the warp-wide votes and shuffles.
    for (u64 base = first_row + warp * 32; base < end_row; base += warp_stride) {
        // Checked at a warp's first step too: a chunk after the one whose
        // rows filled the table stops at once.
        if (steps++ % OVERFLOW_CHECK_STEPS == 0) {
            const u32 stop = lane == 0 ? (u32)(*(volatile u64*)overflow != 0) : 0u;
            if (__shfl_sync(FULL_WARP, stop, 0)) return;
        }
        const u64 i = base + lane;
        const bool in_range = i < end_row;
        const u64 key = in_range ? read_streamed(&keys[i], policy) : 0;
        // Every load of the row is issued before any of them is used, so
        // that the warp waits for memory once a step, not once a column.
        u64 words[FOLDS];
        u64 valid_words[FOLDS];
#pragma unroll
        for (u32 f = 0; f < FOLDS; ++f) {
            const u64* column = fold_parameter(f, values0, values1, values2, values3);
            const u64* valid_bits = fold_parameter(f, valid0, valid1, valid2, valid3);
            words[f] = in_range && !codes[f].counts
                           ? read_streamed(&column[i - first_row], policy)
                           : 0;
            valid_words[f] = in_range && valid_bits != nullptr ? valid_bits[i >> 6] : ~0ULL;
        }
        u64 slot = capacity;
        bool claimed = false;
        bool gave_up = false;
        u64 seen[FOLDS];
#pragma unroll
        for (u32 f = 0; f < FOLDS; ++f) seen[f] = 0;
        if (in_range) {
            // The probe of one slot: its key word, and its words where
            // they are read.
            // A slot's key word, the last of its words.
            const auto key_word = [&](u64 at_slot) -> u64* {
                return slot_results + (at_slot + 1) * slot_words - 1;
            };
            const auto probe = [&](u64 at_slot) -> u64 {
                return reads_slots ? read_slot<FOLDS>(slot_results + at_slot * slot_words, seen)
                                   : read_monotone_word(key_word(at_slot));
            };
            if (key == EMPTY_KEY) {
                // The reserved slot: read first, so that only its first
                // rows take the atomic, not all of them (a stale 0 only
                // sends a row to the CAS).
                if (probe(slot) == 0) {
                    claimed = atomicCAS(key_word(slot), 0ULL, RESERVED_SLOT_CLAIMED) == 0;
                }
            } else {
                const u64 wanted = stored_key(key);
                slot = mix64(key) & mask;
                u64 probes = 0;
                while (true) {
                    // As in group_insert: a stale empty key word only
                    // sends the row to the CAS, which returns the slot's
                    // true one. Where the row claims the slot, the words
                    // it read are zeros: no row folds into a slot before
                    // its key is claimed.
                    const u64 found = probe(slot);
                    if (found == wanted) break;
                    if (found == 0) {
                        const u64 old = atomicCAS(key_word(slot), 0ULL, wanted);
                        if (old == 0) {
                            claimed = true;
                            break;
                        }
                        if (old == wanted) break;
                    }
                    slot = (slot + 1) & mask;
                    if (++probes >= GIVE_UP_PROBES &&
                        (probes >= capacity || 4 * *(volatile u64*)group_count >= 3 * capacity)) {
                        atomicExch(overflow, 1ULL);
                        gave_up = true;
                        break;
                    }
                }
            }
            if (claimed) {
                const u64 group = atomicAdd(group_count, 1ULL);
                table_groups[slot] = group;
                group_first_rows[group] = i;
            }
        }
        if (__any_sync(FULL_WARP, gave_up)) return;
        // Each fold's word of the row (0, every fold's start, where the row
        // does not count), and whether any of them changes the slot.
        bool changes = false;
#pragma unroll
        for (u32 f = 0; f < FOLDS; ++f) {
            const bool counted = in_range && ((valid_words[f] >> (i & 63)) & 1ULL) != 0;
            const u64 word = codes[f].counts ? 1ULL : words[f] ^ codes[f].xor_mask;
            words[f] = counted ? word : 0;
            changes |= word_changes_slot(codes[f].combine_op, words[f], seen[f]);
        }
        const u32 changing = __ballot_sync(FULL_WARP, changes);
        if (changing == 0) continue;
        // Lanes whose rows change the same slot combine their words into
        // the lowest of them; the others stand alone, each with a vote no
        // slot can equal.
        u32 peers = 1u << lane;
        if ((changing & (changing - 1)) != 0) {
            peers = narrow_slots
                        ? __match_any_sync(FULL_WARP, changes ? (u32)slot : 0x80000000u | lane)
                        : __match_any_sync(FULL_WARP, changes ? slot : ~(u64)lane);
            if (__any_sync(FULL_WARP, peers != 1u << lane)) {
#pragma unroll
                for (u32 f = 0; f < FOLDS; ++f) {
                    words[f] = combine_peers(codes[f].combine_op, peers, words[f]);
                }
            }
        }
        if (changes && lane == __ffs(peers) - 1) {
            u64* results = slot_results + slot * slot_words;
#pragma unroll
            for (u32 f = 0; f < FOLDS; ++f) {
                if (!word_changes_slot(codes[f].combine_op, words[f], seen[f])) continue;
                if (codes[f].combine_op == FOLD_F64_SUM) {
                    atomicAdd((double*)&results[f], __longlong_as_double((long long)words[f]));
                } else if (codes[f].combine_op == OP_MAX) {
                    atomicMax(&results[f], words[f]);
                } else {
                    atomicAdd(&results[f], words[f]);
                }
            }
        }
    }
}

#define GROUP_INSERT_FOLD(FOLDS)                                                               \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, fold_blocks_per_sm(FOLDS))     \
        group_insert_fold_##FOLDS(                                                             \
            const u64* keys, u64 first_row, u64 end_row, u64* table_groups, u64 capacity,      \
            u64* group_count, u64* group_first_rows, u64* overflow, const u64* specs,          \
            const u64* values0, const u64* values1, const u64* values2, const u64* values3,    \
            const u64* valid0, const u64* valid1, const u64* valid2, const u64* valid3,        \
            u64* slot_results) {                                                               \
        insert_fold_rows<FOLDS>(keys, first_row, end_row, table_groups, capacity, group_count, \
                                group_first_rows, overflow, specs, values0, values1, values2,  \
                                values3, valid0, valid1, valid2, valid3, slot_results);        \
    }
// Blocks of a fold kernel resident on one multiprocessor, which its
// registers must allow: three or four folds' words and constants need
// more registers than six blocks leave. The host launches that many per
// multiprocessor (`fold_blocks_per_sm` in `src/gpu/launch/group_by.rs`),
// so that every block runs in one wave.
constexpr u32 fold_blocks_per_sm(u32 folds) { return folds <= 2 ? 6 : 5; }
GROUP_INSERT_FOLD(1)
GROUP_INSERT_FOLD(2)
GROUP_INSERT_FOLD(3)
GROUP_INSERT_FOLD(4)

// Each group's first row, for groups that leave in the order their first
// rows come (as DataFusion's hash aggregation emits them): min_rows holds
// one entry per group, u64::MAX on entry; row_groups[i] is the group of
// position i, whose row is positions[i] (null: i itself). Groups at or
// past `groups` are skipped. A row reads its group's entry first and takes
// the atomic only where it is smaller: after a group's first rows, nearly
// none do, so hot groups do not serialize.
// Launch: any grid (grid-stride), block = BLOCK_THREADS.
extern "C" __global__ void group_min_rows(const u64* row_groups, const u64* positions, u64 n,
                                          u64* min_rows, u64 groups) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 group = row_groups[i];
        if (group >= groups) continue;
        const u64 row = positions == nullptr ? i : positions[i];
        if (row < read_monotone_word(&min_rows[group])) atomicMin(&min_rows[group], row);
    }
}

// As group_min_rows, after group_insert_fold into a table that held every
// row's key (no overflow): each row finds its key's slot again (the table
// as group_insert_fold left it, `slot_words` words a slot, `capacity`
// slots plus the reserved one), and its group in table_groups. A row whose
// key is not found within `capacity` probes, or whose slot has no group
// below `groups`, is skipped.
// Launch: any grid (grid-stride), block = BLOCK_THREADS.
extern "C" __global__ void table_group_min_rows(const u64* keys, u64 n, const u64* slot_results,
                                                u32 slot_words, const u64* table_groups,
                                                u64 capacity, u64* min_rows, u64 groups) {
    const u64 mask = capacity - 1;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 key = keys[i];
        u64 slot = capacity;
        if (key != EMPTY_KEY) {
            const u64 wanted = stored_key(key);
            slot = mix64(key) & mask;
            u64 probes = 0;
            while (slot_results[(slot + 1) * slot_words - 1] != wanted) {
                slot = (slot + 1) & mask;
                if (++probes >= capacity) {
                    slot = capacity + 1;
                    break;
                }
            }
            if (slot > capacity) continue;
        }
        const u64 group = table_groups[slot];
        if (group >= groups) continue;
        if (i < read_monotone_word(&min_rows[group])) atomicMin(&min_rows[group], i);
    }
}

// After group_insert_fold: out_f[g] = fold f's word of group g, for each
// fold f below `folds`, from every claimed slot (table_groups[slot] not
// EMPTY_KEY) of the `slots` (capacity + 1), a MIN's word complemented back.
// `specs` and slot_results as there; out_f holds one entry per group.
// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void table_fold_results(const u64* table_groups, u64 slots,
                                              const u64* slot_results, u32 folds,
                                              const u64* specs, u64* out0, u64* out1, u64* out2,
                                              u64* out3) {
    const u32 slot_words = table_slot_words(folds);
    for (u64 s = (u64)blockIdx.x * blockDim.x + threadIdx.x; s < slots;
         s += (u64)gridDim.x * blockDim.x) {
        const u64 group = table_groups[s];
        if (group == EMPTY_KEY) continue;
#pragma unroll
        for (u32 f = 0; f < MAX_TABLE_FOLDS; ++f) {
            if (f >= folds) break;
            const u64 word = slot_results[s * slot_words + f];
            u64* out = fold_parameter(f, out0, out1, out2, out3);
            out[group] = (u32)specs[2 * f] == OP_MIN ? ~word : word;
        }
    }
}

// Replaces each row's slot by its group id. Launch: any grid, BLOCK_THREADS.
extern "C" __global__ void group_resolve(u64* row_groups, u64 n, const u64* table_groups) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        row_groups[i] = table_groups[row_groups[i]];
    }
}

// Partition-based group ids (seed 002 §4.3, PGB). HGB's table is sized to
// the rows, so at millions of groups each row's probe and each group id it
// reads back are random accesses to DRAM. Here the keys are first radix
// partitioned with their row ids on the low bits of mix64(key)
// (radix_partition.cu) into partitions of a few hundred groups each, and
// each partition is numbered by one block in a shared-memory hash table, so
// the random accesses of the numbering stay on chip:
//
//   1. `partitioned_group_ids`: every row of a partition claims or finds its
//      key's slot (linear probing on bits 32 and up of mix64(key): the low
//      bits are the partition's own), claimed slots then take the
//      partition's dense local ids, and every row's slot becomes its local
//      id. A partition with more than PART_TABLE_LIMIT groups sets
//      `overflow` and is left unnumbered: the host then numbers all rows
//      with the global table (group_insert) instead.
//   2. The host scans the partitions' group counts (exclusive) into bases.
//   3. `partitioned_group_resolve`: local ids become global ones (base +
//      local), and each group's claiming position is written at its id.
//
// The group ids and positions are those of the partitioned order; the row
// ids moved with the keys map them back to rows.
#define PART_TABLE_SLOTS 2048
// Claims stop here; up to one more per thread of the block can race past,
// which leaves free slots, so every probe ends.
#define PART_TABLE_LIMIT 1536

// `starts` holds partitions + 1 entries (radix_partition's bounds);
// `local_ids` and `first_positions` n entries each; `group_counts`
// partitions entries; `overflow` one entry, 0 on entry. Writes, for each
// partition p, group_counts[p], the local id of each of its rows at the
// row's position, and first_positions[starts[p] + id] = a position of group
// id's key. Launch: grid = min(partitions, any), block = BLOCK_THREADS.
extern "C" __global__ void partitioned_group_ids(const u64* keys, const u64* starts,
                                                 u64 partitions, u64* local_ids,
                                                 u64* group_counts, u64* first_positions,
                                                 u64* overflow) {
    // One more slot, reserved for the key EMPTY_KEY (claimed: set to 0).
    __shared__ u64 slot_keys[PART_TABLE_SLOTS + 1];
    __shared__ u64 slot_firsts[PART_TABLE_SLOTS + 1];
    __shared__ u32 slot_ids[PART_TABLE_SLOTS + 1];
    __shared__ u32 claimed;
    __shared__ u32 numbered;
    __shared__ u32 stop;
    for (u64 p = blockIdx.x; p < partitions; p += gridDim.x) {
        const u64 begin = starts[p];
        const u64 end = starts[p + 1];
        for (u32 s = threadIdx.x; s <= PART_TABLE_SLOTS; s += blockDim.x) slot_keys[s] = EMPTY_KEY;
        if (threadIdx.x == 0) {
            claimed = 0;
            numbered = 0;
            // Another partition overflowed: the host renumbers everything.
            // Read by one thread, so the whole block leaves together.
            stop = *(volatile u64*)overflow != 0;
        }
        __syncthreads();
        if (stop) return;
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const u64 key = keys[i];
            u32 slot;
            if (key == EMPTY_KEY) {
                slot = PART_TABLE_SLOTS;
                if (atomicCAS(&slot_keys[slot], EMPTY_KEY, 0ULL) == EMPTY_KEY) {
                    slot_firsts[slot] = i;
                    atomicAdd(&claimed, 1u);
                }
            } else {
                slot = (u32)(mix64(key) >> 32) & (PART_TABLE_SLOTS - 1);
                while (true) {
                    const u64 seen = ((volatile u64*)slot_keys)[slot];
                    if (seen == key) break;
                    if (seen == EMPTY_KEY) {
                        // Shared memory is coherent within the block, so
                        // this read sees every claim counted so far.
                        if (*(volatile u32*)&claimed >= PART_TABLE_LIMIT) break;
                        const u64 old = atomicCAS(&slot_keys[slot], EMPTY_KEY, key);
                        if (old == EMPTY_KEY) {
                            slot_firsts[slot] = i;
                            atomicAdd(&claimed, 1u);
                            break;
                        }
                        if (old == key) break;
                    }
                    slot = (slot + 1) & (PART_TABLE_SLOTS - 1);
                }
            }
            local_ids[i] = slot;
        }
        __syncthreads();
        if (claimed >= PART_TABLE_LIMIT) {
            // Possibly a row without a slot: give up on partitions.
            if (threadIdx.x == 0) atomicExch(overflow, 1ULL);
            return;
        }
        for (u32 s = threadIdx.x; s <= PART_TABLE_SLOTS; s += blockDim.x) {
            if (slot_keys[s] != EMPTY_KEY) {
                const u32 id = atomicAdd(&numbered, 1u);
                slot_ids[s] = id;
                first_positions[begin + id] = slot_firsts[s];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) group_counts[p] = numbered;
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
            local_ids[i] = slot_ids[local_ids[i]];
        }
        __syncthreads();
    }
}

// `bases` holds partitions + 1 entries, the exclusive scan of the group
// counts with a 0 after the last (so bases[partitions] is the total). Adds
// each partition's base to its rows' local ids, writes group_firsts[base +
// j] = first_positions[starts[p] + j] for its groups j, and group_count[0].
// Launch: grid = min(partitions, any), block = BLOCK_THREADS.
extern "C" __global__ void partitioned_group_resolve(const u64* starts, u64 partitions,
                                                     const u64* bases, u64* row_groups,
                                                     const u64* first_positions,
                                                     u64* group_firsts, u64* group_count) {
    for (u64 p = blockIdx.x; p < partitions; p += gridDim.x) {
        const u64 begin = starts[p];
        const u64 end = starts[p + 1];
        const u64 base = bases[p];
        const u64 count = bases[p + 1] - base;
        for (u64 i = begin + threadIdx.x; i < end; i += blockDim.x) row_groups[i] += base;
        for (u64 j = threadIdx.x; j < count; j += blockDim.x) {
            group_firsts[base + j] = first_positions[begin + j];
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) group_count[0] = bases[partitions];
}

// Sort-based group ids (seed 002 §3.2.2/§4.1.3, SGB): the keys, sorted
// ascending with their row ids, form one group per run of equal keys, so
// group ids follow the keys' order. `sorted_group_heads` marks where each run
// starts; the host scans the marks (exclusive), and `sorted_group_ids` turns
// the scanned marks into each row's group id, each group's first position
// in the sorted keys, and the number of groups.
// Launch (both): any grid (grid-stride), block = BLOCK_THREADS.
extern "C" __global__ void sorted_group_heads(const u64* keys, u64 n, u64* heads) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        heads[i] = (i == 0 || keys[i] != keys[i - 1]) ? 1ULL : 0ULL;
    }
}

// `ranks[i]`: run starts before position i (the exclusive scan of the
// heads). Writes row_groups[row_ids[i]] for every i, group_firsts[g] for
// every group g, and group_count[0]. n must be at least 1.
extern "C" __global__ void sorted_group_ids(const u64* keys, const u64* ranks, const u64* row_ids,
                                            u64 n, u64* row_groups, u64* group_firsts,
                                            u64* group_count) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const bool head = i == 0 || keys[i] != keys[i - 1];
        // A run's first position has `ranks[i]` runs before it; the rest of
        // the run belongs to the last of those.
        const u64 group = head ? ranks[i] : ranks[i] - 1;
        row_groups[row_ids[i]] = group;
        if (head) group_firsts[group] = i;
        if (i == n - 1) group_count[0] = group + 1;
    }
}

// The rows of this block in stage 2: a contiguous chunk of them, so that
// the blocks in flight at any moment work on rows far apart. Rows in the
// partitions' order (or input sorted on its keys) put neighbouring rows in
// the same few groups: a grid-stride loop would have every block in flight
// on one narrow window of rows, and their atomics on the same few groups.
// A warp still reads 32 consecutive rows.
__device__ __forceinline__ u64 block_rows_begin(u64 n) {
    const u64 per_block = (n + gridDim.x - 1) / gridDim.x;
    return min(n, (u64)blockIdx.x * per_block);
}

__device__ __forceinline__ u64 block_rows_end(u64 n) {
    const u64 per_block = (n + gridDim.x - 1) / gridDim.x;
    return min(n, ((u64)blockIdx.x + 1) * per_block);
}

// The same over rows [first, end): a chunk of a column reduced on its own
// as it lands, its rows' groups and validity bits read at their place among
// all the rows.
__device__ __forceinline__ u64 block_span_begin(u64 first, u64 end) {
    return first + block_rows_begin(end - first);
}

__device__ __forceinline__ u64 block_span_end(u64 first, u64 end) {
    return first + block_rows_end(end - first);
}

// Stage 2 for 64-bit values. For each valid row i in [first, n) of group g
// (row_groups[i], or 0 for all rows when row_groups is null):
//   OP_SUM/MIN/MAX: out[g] = op(out[g], values[i - first] ^ flip); OP_COUNT:
//   out[g] += 1 (values unused, may be null). A `flip` of the sign bit turns
//   signed values into words whose unsigned order is theirs. `values` (and
//   `tie_values`) hold the rows from `first` on: a chunk of a column reduced
//   as it lands; row_groups and valid_bits hold every row.
// With `tie_values` non-null, only rows where tie_values[i - first] ==
// tie_best[g] count: the low word of a 128-bit MIN/MAX after its high word's pass.
// `out` holds `groups` entries set to the op's identity (~0 for MIN, else 0).
// With `privatize`, each block first reduces into `groups` slots of dynamic
// shared memory (shared bytes = 8 * groups) and then merges them into `out`.
// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void aggregate_u64(const u64* row_groups, const u64* values,
                                         const u64* valid_bits, const u64* tie_values,
                                         const u64* tie_best, u64 first, u64 n, u32 op, u64 flip,
                                         u64* out, u64 groups, u32 privatize) {
    extern __shared__ u64 local[];
    const u64 identity = identity_of(op);
    u64* target = out;
    if (privatize) {
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) local[g] = identity;
        __syncthreads();
        target = local;
    }
    // Without groups every row goes to group 0: reduce in a register first.
    u64 own = identity;
    for (u64 i = block_span_begin(first, n) + threadIdx.x; i < block_span_end(first, n);
         i += blockDim.x) {
        if (!row_valid(valid_bits, i)) continue;
        const u64 group = row_groups == nullptr ? 0 : row_groups[i];
        if (tie_values != nullptr && tie_values[i - first] != tie_best[group]) continue;
        const u64 value = op == OP_COUNT ? 1ULL : values[i - first] ^ flip;
        if (row_groups == nullptr) {
            own = combine(op, own, value);
        } else {
            atomic_apply_if_better(op, &target[group], value);
        }
    }
    if (row_groups == nullptr && own != identity) atomic_apply(op, &target[0], own);
    if (privatize) {
        __syncthreads();
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) {
            if (local[g] != identity) atomic_apply_if_better(op, &out[g], local[g]);
        }
    }
}

// SUM, MIN or MAX of a column gathered by row id, without groups: a
// join's aggregate over its pairs, folded as the values are read, so the
// gathered column is never written out. Folds (src[ids[i]] widened to 64
// bits) ^ flip into out[0] for i < n: `width` is 4 or 8 bytes, a 4-byte
// value sign-extended where `sign_extend`, else zero-extended (a SUM of an
// Int32 column cast to Int64, a MIN of a Date32 column). An id at or beyond
// src_len is skipped (the join kernels never make one). Each thread folds
// into a register, each warp combines its lanes, and one atomic per warp
// reaches out[0], which holds the op's identity.
// Launch: any grid, block = BLOCK_THREADS (grid-stride).
extern "C" __global__ void aggregate_gathered(const void* src, u64 src_len, u32 width,
                                              u32 sign_extend, const u64* ids, u64 n, u32 op,
                                              u64 flip, u64* out) {
    const u64 identity = identity_of(op);
    u64 own = identity;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 id = ids[i];
        if (id >= src_len) continue;
        u64 value;
        if (width == 8) {
            value = ((const u64*)src)[id];
        } else {
            const u32 narrow = ((const u32*)src)[id];
            value = sign_extend ? (u64)(long long)(int)narrow : (u64)narrow;
        }
        own = combine(op, own, value ^ flip);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        own = combine(op, own, __shfl_down_sync(0xffffffffu, own, offset));
    }
    if (lane_id() == 0 && own != identity) atomic_apply(op, out, own);
}

// Stage 2 for SUM over doubles: as aggregate_u64 with OP_SUM (rows [first,
// n), `values` from `first` on). The order of the additions varies from run
// to run, so the last bits may too.
extern "C" __global__ void aggregate_f64_sum(const u64* row_groups, const double* values,
                                             const u64* valid_bits, u64 first, u64 n, double* out,
                                             u64 groups, u32 privatize) {
    extern __shared__ double local_sums[];
    double* target = out;
    if (privatize) {
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) local_sums[g] = 0.0;
        __syncthreads();
        target = local_sums;
    }
    double own = 0.0;
    bool any = false;
    for (u64 i = block_span_begin(first, n) + threadIdx.x; i < block_span_end(first, n);
         i += blockDim.x) {
        if (!row_valid(valid_bits, i)) continue;
        if (row_groups == nullptr) {
            own += values[i - first];
            any = true;
        } else {
            atomicAdd(&target[row_groups[i]], values[i - first]);
        }
    }
    if (any) atomicAdd(&target[0], own);
    if (privatize) {
        __syncthreads();
        for (u64 g = threadIdx.x; g < groups; g += blockDim.x) {
            // A +0.0 changes nothing (out starts at +0.0, as the CPU's sum does).
            if (__double_as_longlong(local_sums[g]) != 0) {
                atomicAdd(&out[g], local_sums[g]);
            }
        }
    }
}

// Stage 2 for wrapping 128-bit SUM (Decimal128), the value split into its
// low word `lo` and high word `hi`. out_lo accumulates the low words; every
// addition that wraps it adds one to out_hi, which also accumulates the high
// words, so out_hi * 2^64 + out_lo is the sum modulo 2^128. Rows [first,
// n), `lo` and `hi` from `first` on. No privatization.
// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void aggregate_i128_sum(const u64* row_groups, const u64* lo, const u64* hi,
                                              const u64* valid_bits, u64 first, u64 n,
                                              u64* out_lo, u64* out_hi) {
    u64 own_lo = 0, own_hi = 0;
    for (u64 i = block_span_begin(first, n) + threadIdx.x; i < block_span_end(first, n);
         i += blockDim.x) {
        if (!row_valid(valid_bits, i)) continue;
        const u64 low = lo[i - first], high = hi[i - first];
        if (row_groups == nullptr) {
            const u64 sum = own_lo + low;
            own_hi += high + (sum < own_lo ? 1ULL : 0ULL);
            own_lo = sum;
        } else {
            const u64 group = row_groups[i];
            const u64 old = atomicAdd(&out_lo[group], low);
            const u64 carry = old + low < old ? 1ULL : 0ULL;
            atomicAdd(&out_hi[group], high + carry);
        }
    }
    if (row_groups == nullptr && (own_lo != 0 || own_hi != 0)) {
        const u64 old = atomicAdd(&out_lo[0], own_lo);
        const u64 carry = old + own_lo < old ? 1ULL : 0ULL;
        atomicAdd(&out_hi[0], own_hi + carry);
    }
}

// Deterministic SUM over doubles (`gpu.deterministic_float_sums`), in two
// passes. Integer additions give the same result in any order, so each
// double is turned into a 128-bit fixed-point integer on a scale shared by
// its group and the integers are summed with atomics:
//
//   1. `f64_sum_scale`: per group, the largest exponent field of its finite
//      values (`max_exponent`, 0 on entry), and which of NaN (1), +inf (2)
//      and -inf (4) it saw (`specials`, 0 on entry).
//   2. `f64_sum_fixed`: each finite value v = m * 2^(e - 1075) (e at least
//      1, m its 53-bit significand) counted as m * 2^(e - emax + 9) in units
//      of 2^(emax - 1084), truncated toward zero: the group's largest
//      values take 62 bits, so 2^64 of them cannot overflow 128 bits. The
//      host turns (sum, emax, specials) into the double.
#define F64_EXPONENT(bits) (((bits) >> 52) & 0x7ffULL)
#define F64_SPECIAL 0x7ffULL

// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void f64_sum_scale(const u64* row_groups, const u64* values,
                                         const u64* valid_bits, u64 n, u64* max_exponent,
                                         u64* specials) {
    u64 own_max = 0, own_specials = 0;
    for (u64 i = block_rows_begin(n) + threadIdx.x; i < block_rows_end(n); i += blockDim.x) {
        if (!row_valid(valid_bits, i)) continue;
        const u64 bits = values[i];
        const u64 exponent = F64_EXPONENT(bits);
        u64 special = 0;
        if (exponent == F64_SPECIAL) {
            special = (bits & 0xfffffffffffffULL) != 0 ? 1ULL : ((bits >> 63) ? 4ULL : 2ULL);
        }
        if (row_groups == nullptr) {
            if (special) own_specials |= special;
            else if (exponent > own_max) own_max = exponent;
        } else {
            const u64 group = row_groups[i];
            if (special) atomicOr(&specials[group], special);
            else atomicMax(&max_exponent[group], exponent);
        }
    }
    if (row_groups == nullptr) {
        if (own_max != 0) atomicMax(&max_exponent[0], own_max);
        if (own_specials != 0) atomicOr(&specials[0], own_specials);
    }
}

__device__ __forceinline__ void add_i128(u64* out_lo, u64* out_hi, u64 lo, u64 hi) {
    const u64 old = atomicAdd(out_lo, lo);
    const u64 carry = old + lo < old ? 1ULL : 0ULL;
    atomicAdd(out_hi, hi + carry);
}

// Launch: any grid, block = BLOCK_THREADS. `out_lo` and `out_hi` are 0 on
// entry; `max_exponent` is pass 1's result.
extern "C" __global__ void f64_sum_fixed(const u64* row_groups, const u64* values,
                                         const u64* valid_bits, u64 n, const u64* max_exponent,
                                         u64* out_lo, u64* out_hi) {
    u64 own_lo = 0, own_hi = 0;
    for (u64 i = block_rows_begin(n) + threadIdx.x; i < block_rows_end(n); i += blockDim.x) {
        if (!row_valid(valid_bits, i)) continue;
        const u64 bits = values[i];
        u64 exponent = F64_EXPONENT(bits);
        if (exponent == F64_SPECIAL) continue;
        u64 significand = bits & 0xfffffffffffffULL;
        if (exponent == 0) {
            exponent = 1;  // subnormal: no implicit bit
        } else {
            significand |= 1ULL << 52;
        }
        const u64 group = row_groups == nullptr ? 0 : row_groups[i];
        u64 top = max_exponent[group];
        if (top == 0) top = 1;
        // exponent <= top, so the left shift is at most 9.
        const u64 drop = top - exponent;
        u64 magnitude;
        if (drop <= 9) {
            magnitude = significand << (9 - drop);
        } else if (drop - 9 < 64) {
            magnitude = significand >> (drop - 9);
        } else {
            magnitude = 0;
        }
        if (magnitude == 0) continue;
        // Two's complement of the 128-bit value.
        u64 lo = magnitude, hi = 0;
        if (bits >> 63) {
            lo = ~magnitude + 1ULL;
            hi = ~0ULL;
        }
        if (row_groups == nullptr) {
            const u64 sum = own_lo + lo;
            own_hi += hi + (sum < own_lo ? 1ULL : 0ULL);
            own_lo = sum;
        } else {
            add_i128(&out_lo[group], &out_hi[group], lo, hi);
        }
    }
    if (row_groups == nullptr && (own_lo != 0 || own_hi != 0)) {
        add_i128(&out_lo[0], &out_hi[0], own_lo, own_hi);
    }
}

// A filter of the groups (a HAVING) run before they come back, so that only
// the groups it may keep cross the bus; the host runs the whole filter
// again over those. `group_keep_compare` sets keep[g] (with `and_into`,
// clears it) where group g's value does not compare with the constant as
// `op` says: 0 =, 1 <>, 2 <, 3 <=, 4 >, 5 >=, as signed 128-bit integers.
// The value is high[g] * 2^64 + low[g] where `high` is not null, else
// low[g] ^ flip read as a signed 64-bit integer (`flip` undoes the sign-bit
// flip of MIN and MAX words). The constant is constant_high * 2^64 +
// constant_low.
// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void group_keep_compare(const u64* low, const u64* high, u64 flip, u64 n,
                                              u32 op, u64 constant_low, u64 constant_high,
                                              u32 and_into, u64* keep) {
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += (u64)gridDim.x * blockDim.x) {
        const u64 lo = low[g] ^ flip;
        const u64 hi = high != nullptr ? high[g] : (u64)((long long)lo >> 63);
        int order;
        if ((long long)hi != (long long)constant_high) {
            order = (long long)hi < (long long)constant_high ? -1 : 1;
        } else {
            order = lo < constant_low ? -1 : (lo > constant_low ? 1 : 0);
        }
        const bool holds = op == 0   ? order == 0
                           : op == 1 ? order != 0
                           : op == 2 ? order < 0
                           : op == 3 ? order <= 0
                           : op == 4 ? order > 0
                                     : order >= 0;
        if (!and_into) {
            keep[g] = holds ? 1ULL : 0ULL;
        } else if (!holds) {
            keep[g] = 0ULL;
        }
    }
}

// The kept groups' ids, in group order: `places` is the exclusive prefix sum
// of the keep flags over n + 1 words (the last flag 0), so places[n] is the
// kept count and group g is kept where places[g + 1] != places[g]; it goes
// to ids[places[g]] (where that is below ids_len).
// Launch: any grid, block = BLOCK_THREADS.
extern "C" __global__ void group_keep_ids(const u64* places, u64 n, u64* ids, u64 ids_len) {
    for (u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += (u64)gridDim.x * blockDim.x) {
        const u64 place = places[g];
        if (places[g + 1] != place && place < ids_len) ids[place] = g;
    }
}
