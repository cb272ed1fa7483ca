// Per-partition shared-memory hash join (seed 000 §3.2 phase 2; seed 002 A6
// match-finding, after Sioulas et al.). Both sides are radix partitioned on
// the low `partition_bits` bits of mix64(key) (`radix_partition.cu`), so a
// build partition only meets the probe partition with the same id. One block
// takes one partition at a time (grid-stride), loads up to TABLE_CAPACITY
// build keys into a chained hash table in shared memory, indexed by the hash
// bits above the partition bits, and streams the probe partition through it.
// A build partition larger than the table is processed in chunks (block
// nested loop), so any skew stays correct.
//
// Output is sized exactly: `hash_join_count` counts matches per partition,
// the host scans the counts, and `hash_join_write` writes each partition's
// (build row id, probe row id) pairs from its offset. The host may write a
// range of partitions at a time to bound the output buffer.
//
// A skewed side (Zipf 1.5: one key holds about a third of the rows) leaves
// one block streaming most of the rows of one partition while the others
// idle, and one key matching many rows on both sides gives one partition
// more pairs than an output range may hold. The host then hands the kernels
// a list of tasks in place of the partitions: task t joins probe rows
// [task_ranges[4t], task_ranges[4t + 1]) with build rows
// [task_ranges[4t + 2], task_ranges[4t + 3]), a slice of one partition's
// rows on each side, so a heavy partition is spread over many blocks and
// its pairs over many tasks (the host splits a task until its pairs fit a
// range). Without a list (a null pointer), task t is partition t with all
// its rows.
//
// A side may be one word a row (`layouts`: BUILD_ONE_WORD, PROBE_ONE_WORD;
// see `radix_partition.cu`): its keys array then holds the key in each
// word's low half and the row's word (its row id, or a carried 4-byte
// value) in the high half, and its ids array is null. The shared-memory
// table keeps a build row's whole word, so a one-word build side's row id
// is read from shared memory, not again from its partition.
#include "common.cuh"
#include "fold.cuh"

// 2048 build rows a table, about twice the rows the host plans a partition
// (`RadixPlan::for_join`). Links are 16-bit: 16 KiB of keys, 4 KiB of links
// and 16 KiB of heads, so that more blocks fit a multiprocessor's shared
// memory. (A table of 3072 rows with partitions of about 2048 would take
// 2^27 build rows in two radix passes of 8 bits in place of three of 5 or
// 6, but the two passes take longer than the three, as a tile of 2048 rows
// then writes runs of about 8 rows a digit, part sectors, and the larger
// partitions slow the probe too.)
#define TABLE_CAPACITY 2048
#define TABLE_SLOTS 4096
// The end of a chain, in heads and links alike (never a row of the table).
#define EMPTY_SLOT 0xffffu
static_assert(TABLE_CAPACITY < EMPTY_SLOT, "a row index fits a 16-bit link");

#define BUILD_ONE_WORD 1u
#define PROBE_ONE_WORD 2u

// The mask that leaves a side's key of its word.
__device__ __forceinline__ u64 key_mask(bool one_word) {
    return one_word ? 0xffffffffULL : ~0ULL;
}

// The row's word of a side: its row id (or the values carried in its place)
// from the ids array, or the high half of a one-word row.
__device__ __forceinline__ u64 row_word(bool one_word, u64 key_word, const u64* ids, u64 i) {
    return one_word ? key_word >> 32 : ids[i];
}

struct SharedTable {
    // The build rows' key words (with a one-word side, key and row id).
    u64 keys[TABLE_CAPACITY];
    unsigned short next[TABLE_CAPACITY];
    u32 heads[TABLE_SLOTS];
};

__device__ __forceinline__ u32 table_slot(u64 key, u32 partition_bits) {
    return (u32)(mix64(key) >> partition_bits) & (TABLE_SLOTS - 1);
}

// Build rows a thread loads into a table.
#define TABLE_ROWS_PER_THREAD (TABLE_CAPACITY / BLOCK_THREADS)
static_assert(TABLE_CAPACITY % BLOCK_THREADS == 0, "a table's rows spread evenly over a block");

// Loads build key words [begin, begin + len) into the table, each chained
// under its key (the word & build_mask). Block-wide; ends with a barrier so
// the table is complete for every thread. `len` <= TABLE_CAPACITY.
// READ_AHEAD: a thread reads all its rows' words before it stores any, so
// that the reads of a table wait on memory once, not once a row, and
// overlap the heads' reset; a table is a few microseconds of work, and a
// join builds one per partition and probe chunk (2^18 at seed 002's narrow
// join). It takes registers: hash_join_fold, which has them to spare under
// its bound, reads ahead; the count and write kernels would lose a block a
// multiprocessor, and do not.
template <bool READ_AHEAD>
__device__ void build_table(SharedTable& table, const u64* build_keys, u64 build_mask, u64 begin,
                            u32 len, u32 partition_bits) {
    if (READ_AHEAD) {
        u64 words[TABLE_ROWS_PER_THREAD];
#pragma unroll
        for (u32 r = 0; r < TABLE_ROWS_PER_THREAD; ++r) {
            const u32 j = threadIdx.x + r * BLOCK_THREADS;
            words[r] = j < len ? build_keys[begin + j] : 0;
        }
        for (u32 s = threadIdx.x; s < TABLE_SLOTS; s += BLOCK_THREADS) table.heads[s] = EMPTY_SLOT;
        __syncthreads();
#pragma unroll
        for (u32 r = 0; r < TABLE_ROWS_PER_THREAD; ++r) {
            const u32 j = threadIdx.x + r * BLOCK_THREADS;
            if (j < len) {
                table.keys[j] = words[r];
                table.next[j] = (unsigned short)atomicExch(
                    &table.heads[table_slot(words[r] & build_mask, partition_bits)], j);
            }
        }
    } else {
        for (u32 s = threadIdx.x; s < TABLE_SLOTS; s += BLOCK_THREADS) table.heads[s] = EMPTY_SLOT;
        __syncthreads();
        for (u32 j = threadIdx.x; j < len; j += BLOCK_THREADS) {
            const u64 word = build_keys[begin + j];
            table.keys[j] = word;
            table.next[j] = (unsigned short)atomicExch(
                &table.heads[table_slot(word & build_mask, partition_bits)], j);
        }
    }
    __syncthreads();
}

// Joins build partition [build_begin, build_end) with probe partition
// [probe_begin, probe_end), one shared-memory table chunk at a time.
// COUNT_ONLY: returns this thread's match count. Otherwise each match takes a
// slot from the block's `cursor` and writes its (build id, probe id) pair.
// Block-wide: every thread must call it with the same partition.
template <bool COUNT_ONLY>
__device__ u64 join_partition(SharedTable& table, u32 layouts, const u64* build_keys,
                              const u64* build_ids, u64 build_begin, u64 build_end,
                              const u64* probe_keys, const u64* probe_ids, u64 probe_begin,
                              u64 probe_end, u32 partition_bits, unsigned long long* cursor,
                              u64* out_build_ids, u64* out_probe_ids) {
    u64 matches = 0;
    if (probe_end <= probe_begin) return 0;
    const bool build_one_word = layouts & BUILD_ONE_WORD;
    const bool probe_one_word = layouts & PROBE_ONE_WORD;
    const u64 build_mask = key_mask(build_one_word);
    const u64 probe_mask = key_mask(probe_one_word);
    for (u64 chunk = build_begin; chunk < build_end; chunk += TABLE_CAPACITY) {
        const u32 len = (u32)min((u64)TABLE_CAPACITY, build_end - chunk);
        build_table<false>(table, build_keys, build_mask, chunk, len, partition_bits);
        for (u64 i = probe_begin + threadIdx.x; i < probe_end; i += BLOCK_THREADS) {
            const u64 probe_word = probe_keys[i];
            const u64 key = probe_word & probe_mask;
            for (u32 j = table.heads[table_slot(key, partition_bits)]; j != EMPTY_SLOT; j = table.next[j]) {
                const u64 build_word = table.keys[j];
                if ((build_word & build_mask) != key) continue;
                if (COUNT_ONLY) {
                    ++matches;
                } else {
                    const u64 pos = atomicAdd(cursor, 1ULL);
                    out_build_ids[pos] = row_word(build_one_word, build_word, build_ids, chunk + j);
                    out_probe_ids[pos] = row_word(probe_one_word, probe_word, probe_ids, i);
                }
            }
        }
        __syncthreads();  // the table is rebuilt for the next chunk
    }
    return matches;
}

// The probe and build rows of task t (see the header).
struct JoinTask {
    u64 probe_begin;
    u64 probe_end;
    u64 build_begin;
    u64 build_end;
};

__device__ __forceinline__ JoinTask join_task(u64 t, const u64* probe_starts,
                                              const u64* build_starts, const u64* task_ranges) {
    if (task_ranges == nullptr) {
        return JoinTask{probe_starts[t], probe_starts[t + 1], build_starts[t], build_starts[t + 1]};
    }
    const u64* range = task_ranges + 4 * t;
    return JoinTask{range[0], range[1], range[2], range[3]};
}

// Launch: any grid (grid-stride over tasks [task_begin, task_end)), block =
// BLOCK_THREADS, static shared memory only. `layouts` says which sides are
// one word a row (their ids arrays null, see the header). `*_starts` hold
// 2^partition_bits + 1 entries; a task list holds four entries a task, each
// task's rows within one partition of each side.
// Writes match_counts[t] for every t in range.
extern "C" __global__ void hash_join_count(const u64* build_keys, const u64* build_starts,
                                           const u64* probe_keys, const u64* probe_starts,
                                           const u64* task_ranges, u32 layouts,
                                           u32 partition_bits, u64 task_begin, u64 task_end,
                                           u64* match_counts) {
    __shared__ SharedTable table;
    __shared__ u64 scratch[WARPS_PER_BLOCK];
    for (u64 t = task_begin + blockIdx.x; t < task_end; t += gridDim.x) {
        const JoinTask task = join_task(t, probe_starts, build_starts, task_ranges);
        const u64 matches = join_partition<true>(
            table, layouts, build_keys, nullptr, task.build_begin, task.build_end, probe_keys,
            nullptr, task.probe_begin, task.probe_end, partition_bits, nullptr, nullptr, nullptr);
        const u64 total = block_sum_u64(matches, scratch);
        if (threadIdx.x == 0) match_counts[t] = total;
    }
}

// Launch: as hash_join_count, over the same or a narrower task range.
// `match_offsets[t]` is the exclusive scan of hash_join_count's counts;
// task t's pairs go to [match_offsets[t] - output_base, ...) of the output
// arrays, which must hold the range's total. Order within a task is
// unspecified.
extern "C" __global__ void hash_join_write(const u64* build_keys, const u64* build_ids,
                                           const u64* build_starts, const u64* probe_keys,
                                           const u64* probe_ids, const u64* probe_starts,
                                           const u64* task_ranges, u32 layouts,
                                           u32 partition_bits, u64 task_begin, u64 task_end,
                                           const u64* match_offsets, u64 output_base,
                                           u64* out_build_ids, u64* out_probe_ids) {
    __shared__ SharedTable table;
    __shared__ unsigned long long cursor;
    for (u64 t = task_begin + blockIdx.x; t < task_end; t += gridDim.x) {
        const JoinTask task = join_task(t, probe_starts, build_starts, task_ranges);
        if (threadIdx.x == 0) cursor = match_offsets[t] - output_base;
        __syncthreads();
        join_partition<false>(table, layouts, build_keys, build_ids, task.build_begin,
                              task.build_end, probe_keys, probe_ids, task.probe_begin,
                              task.probe_end, partition_bits, &cursor, out_build_ids,
                              out_probe_ids);
        __syncthreads();  // cursor is reset for the next task
    }
}

// ---------------------------------------------------------------------------
// Folding the pairs as they are found: an aggregation without GROUP BY
// above an inner join (`SELECT count(*), sum(r.v), max(s.w) FROM r JOIN s
// ...`) needs no pair written out. `hash_join_fold` walks the same tasks as
// `hash_join_write`, and for each match folds every aggregated value into a
// register, read from its column by the side's row id: the (build id, probe
// id) pairs are never written to device memory nor read back, and no match
// count is needed beforehand (hash_join_count and the host's scan go too).
//
// Fold f reads its column `src_f` (values packed in 8-byte words) at the row
// id of its side and combines it into out[1 + f]; out[0] counts the pairs.
// `specs` holds three words per fold: the values in src_f, the flags
// (bits 0-7: width in bytes, 4 or 8; bit 8: a 4-byte value is sign-extended,
// else zero-extended; bit 9: read by the probe row, else the build row;
// bits 10-11: FOLD_CARRIED and FOLD_HIGH_HALF, below; bits 16-23: the op:
// OP_SUM, OP_MIN, OP_MAX or FOLD_F64_SUM) and the word XORed into every
// value (the sign bit, so that signed values compare as unsigned words).
// out holds each fold's identity on entry (0.0 for a float sum, 0 for
// out[0]).
#define MAX_JOIN_FOLDS 4
// Blocks of hash_join_fold a multiprocessor must hold: at most 85
// registers a thread. Without the bound the one-word layouts take it past
// 85 registers, to two blocks, which slows the fold; four blocks (64
// registers) spill.
#define FOLD_BLOCKS_PER_SM 3
// Probe rows a thread of hash_join_fold reads at once.
#define PROBE_BATCH 4

#define FOLD_SIGN_EXTEND (1u << 8)
#define FOLD_PROBE_SIDE (1u << 9)
// The side was partitioned carrying its values in place of row ids (seed
// 002's GFTR, `pack_carried_words`): the side's word is the value (8 bytes)
// or holds it in its low or, with FOLD_HIGH_HALF, high 4 bytes. The fold
// then reads nothing at a random row; `src` is not read.
#define FOLD_CARRIED (1u << 10)
#define FOLD_HIGH_HALF (1u << 11)

// `word` is the pair's word of the fold's side: its row id, or with
// FOLD_CARRIED the values carried in its place.
__device__ __forceinline__ u64 fold_value(const void* src, u64 src_len, u32 flags, u64 flip,
                                          u64 word, bool* found) {
    u64 wide;
    if (flags & FOLD_CARRIED) {
        *found = true;
        if ((flags & 0xffu) == 8) return word ^ flip;
        const u32 narrow = (u32)(word >> ((flags & FOLD_HIGH_HALF) ? 32 : 0));
        wide = (flags & FOLD_SIGN_EXTEND) ? (u64)(long long)(int)narrow : (u64)narrow;
        return wide ^ flip;
    }
    *found = word < src_len;  // the join kernels never make such an id
    if (!*found) return 0;
    if ((flags & 0xffu) == 8) return ((const u64*)src)[word] ^ flip;
    const u32 narrow = ((const u32*)src)[word];
    wide = (flags & FOLD_SIGN_EXTEND) ? (u64)(long long)(int)narrow : (u64)narrow;
    return wide ^ flip;
}

// Builds the words a side carries through its partitioning in place of row
// ids (see FOLD_CARRIED): for i < n, with id = row_ids[i] (or i where
// row_ids is null), out[i] = the 8-byte value low[id] (low_width 8), or the
// 4-byte values low[id] | high[id] << 32 (low_width 4; high null: 0). An id
// at or past `rows` gives 0; the host never makes one.
// Launch: any grid, block = BLOCK_THREADS (grid-stride loop).
extern "C" __global__ void pack_carried_words(u64* out, u64 n, const u64* row_ids, u64 rows,
                                              const void* low, u32 low_width,
                                              const void* high) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 id = row_ids ? row_ids[i] : i;
        u64 word = 0;
        if (id < rows) {
            if (low_width == 8) {
                word = ((const u64*)low)[id];
            } else {
                word = ((const u32*)low)[id];
                if (high) word |= (u64)((const u32*)high)[id] << 32;
            }
        }
        out[i] = word;
    }
}

// Makes one-word rows in place (see the header): for i < n, keys[i] keeps
// its low half, the key (below 2^32), and takes in its high half its row's
// word: the row id id = row_ids[i] (or i where row_ids is null), or, with
// `values`, the 4-byte value values[id] (0 for an id at or past `rows`; the
// host never makes one), the word a fold then reads in its low slot.
// Launch: any grid, block = BLOCK_THREADS (grid-stride loop).
extern "C" __global__ void pack_key_words(u64* keys, u64 n, const u64* row_ids, u64 rows,
                                          const u32* values) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 id = row_ids ? row_ids[i] : i;
        const u64 word = values ? (id < rows ? (u64)values[id] : 0) : id;
        keys[i] = (keys[i] & 0xffffffffULL) | (word << 32);
    }
}

// Launch: as hash_join_count, with folds <= MAX_JOIN_FOLDS and src_f a
// column for each fold f below `folds` (the others are never read).
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, FOLD_BLOCKS_PER_SM)
hash_join_fold(const u64* build_keys, const u64* build_ids,
                                          const u64* build_starts, const u64* probe_keys,
                                          const u64* probe_ids, const u64* probe_starts,
                                          const u64* task_ranges, u32 layouts,
                                          u32 partition_bits, u64 task_begin, u64 task_end,
                                          u32 folds,
                                          const u64* specs, const void* src0,
                                          const void* src1, const void* src2, const void* src3,
                                          u64* out) {
    static_assert(MAX_JOIN_FOLDS == 4, "one source parameter per fold");
    __shared__ SharedTable table;
    __shared__ u64 spec_len[MAX_JOIN_FOLDS];
    __shared__ u32 spec_flags[MAX_JOIN_FOLDS];
    __shared__ u64 spec_flip[MAX_JOIN_FOLDS];
    for (u32 f = threadIdx.x; f < folds; f += BLOCK_THREADS) {
        spec_len[f] = specs[3 * f];
        spec_flags[f] = (u32)specs[3 * f + 1];
        spec_flip[f] = specs[3 * f + 2];
    }
    __syncthreads();
    bool any_build = false, any_probe = false;
#pragma unroll
    for (u32 f = 0; f < MAX_JOIN_FOLDS; ++f) {
        if (f < folds) {
            if (spec_flags[f] & FOLD_PROBE_SIDE) any_probe = true;
            else any_build = true;
        }
    }

    const bool build_one_word = layouts & BUILD_ONE_WORD;
    const bool probe_one_word = layouts & PROBE_ONE_WORD;
    const u64 build_mask = key_mask(build_one_word);
    const u64 probe_mask = key_mask(probe_one_word);

    u64 pairs = 0;
    u64 own[MAX_JOIN_FOLDS];
#pragma unroll
    for (u32 f = 0; f < MAX_JOIN_FOLDS; ++f) {
        own[f] = f < folds ? fold_identity(spec_flags[f] >> 16) : 0;
    }

    for (u64 t = task_begin + blockIdx.x; t < task_end; t += gridDim.x) {
        const JoinTask task = join_task(t, probe_starts, build_starts, task_ranges);
        const u64 build_begin = task.build_begin;
        const u64 build_end = task.build_end;
        if (task.probe_end <= task.probe_begin) continue;  // uniform across the block
        for (u64 chunk = build_begin; chunk < build_end; chunk += TABLE_CAPACITY) {
            const u32 len = (u32)min((u64)TABLE_CAPACITY, build_end - chunk);
            build_table<true>(table, build_keys, build_mask, chunk, len, partition_bits);
            // A thread reads PROBE_BATCH probe rows' words before it joins
            // any, so that their reads wait on memory together.
            for (u64 batch = task.probe_begin; batch < task.probe_end;
                 batch += PROBE_BATCH * BLOCK_THREADS) {
                u64 probe_word[PROBE_BATCH], probe_id[PROBE_BATCH];
#pragma unroll
                for (u32 r = 0; r < PROBE_BATCH; ++r) {
                    const u64 i = batch + r * BLOCK_THREADS + threadIdx.x;
                    probe_word[r] = i < task.probe_end ? probe_keys[i] : 0;
                    // The pair's words: row ids, or the values carried in their place.
                    probe_id[r] = any_probe && !probe_one_word && i < task.probe_end ? probe_ids[i]
                                                                                   : 0;
                }
#pragma unroll
                for (u32 r = 0; r < PROBE_BATCH; ++r) {
                    if (batch + r * BLOCK_THREADS + threadIdx.x >= task.probe_end) break;
                    const u64 key = probe_word[r] & probe_mask;
                    const u64 probe_row = probe_one_word ? probe_word[r] >> 32 : probe_id[r];
                    for (u32 j = table.heads[table_slot(key, partition_bits)]; j != EMPTY_SLOT;
                         j = table.next[j]) {
                        const u64 build_word = table.keys[j];
                        if ((build_word & build_mask) != key) continue;
                        ++pairs;
                        const u64 build_row =
                            any_build ? row_word(build_one_word, build_word, build_ids, chunk + j)
                                      : 0;
#pragma unroll
                        for (u32 f = 0; f < MAX_JOIN_FOLDS; ++f) {
                            if (f >= folds) break;
                            const u32 flags = spec_flags[f];
                            bool found;
                            const u64 value = fold_value(
                                fold_parameter(f, src0, src1, src2, src3), spec_len[f], flags,
                                spec_flip[f], (flags & FOLD_PROBE_SIDE) ? probe_row : build_row,
                                &found);
                            if (found) own[f] = fold_combine(flags >> 16, own[f], value);
                        }
                    }
                }
            }
            __syncthreads();  // the table is rebuilt for the next chunk or task
        }
    }

    // Each warp combines its lanes; one atomic per warp and word.
    for (int offset = 16; offset > 0; offset /= 2) {
        pairs += __shfl_down_sync(0xffffffffu, pairs, offset);
    }
    if (lane_id() == 0 && pairs != 0) atomicAdd(&out[0], pairs);
#pragma unroll
    for (u32 f = 0; f < MAX_JOIN_FOLDS; ++f) {
        if (f >= folds) break;
        const u32 op = spec_flags[f] >> 16;
        u64 word = own[f];
        for (int offset = 16; offset > 0; offset /= 2) {
            word = fold_combine(op, word, __shfl_down_sync(0xffffffffu, word, offset));
        }
        if (lane_id() != 0 || word == fold_identity(op)) continue;
        if (op == FOLD_F64_SUM) {
            atomicAdd((double*)&out[1 + f], __longlong_as_double((long long)word));
        } else {
            atomic_apply(op, &out[1 + f], word);
        }
    }
}
