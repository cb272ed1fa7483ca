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
// A skewed probe side (Zipf 1.5: one key holds about a third of the rows)
// leaves one block streaming most of the probe rows through its table while
// the others idle. The host then hands the kernels a list of tasks in place
// of the partitions: task t joins build partition `task_partitions[t]` with
// probe rows [task_probe_starts[t], task_probe_starts[t + 1]), a slice of
// that partition's rows, so a heavy partition is spread over many blocks,
// each loading the same build partition. Without a list (null pointers),
// task t is partition t with all its probe rows.
#include "common.cuh"

#define TABLE_CAPACITY 2048
#define TABLE_SLOTS 4096
#define EMPTY_SLOT 0xffffffffu

struct SharedTable {
    u64 keys[TABLE_CAPACITY];
    u32 next[TABLE_CAPACITY];
    u32 heads[TABLE_SLOTS];
};

__device__ __forceinline__ u32 table_slot(u64 key, u32 partition_bits) {
    return (u32)(mix64(key) >> partition_bits) & (TABLE_SLOTS - 1);
}

// Loads build keys [begin, begin + len) into the table. Block-wide; ends with
// a barrier so the table is complete for every thread.
__device__ void build_table(SharedTable& table, const u64* build_keys, u64 begin, u32 len,
                            u32 partition_bits) {
    for (u32 s = threadIdx.x; s < TABLE_SLOTS; s += BLOCK_THREADS) table.heads[s] = EMPTY_SLOT;
    __syncthreads();
    for (u32 j = threadIdx.x; j < len; j += BLOCK_THREADS) {
        const u64 key = build_keys[begin + j];
        table.keys[j] = key;
        table.next[j] = atomicExch(&table.heads[table_slot(key, partition_bits)], j);
    }
    __syncthreads();
}

// Joins build partition [build_begin, build_end) with probe partition
// [probe_begin, probe_end), one shared-memory table chunk at a time.
// COUNT_ONLY: returns this thread's match count. Otherwise each match takes a
// slot from the block's `cursor` and writes its (build id, probe id) pair.
// Block-wide: every thread must call it with the same partition.
template <bool COUNT_ONLY>
__device__ u64 join_partition(SharedTable& table, const u64* build_keys, const u64* build_ids,
                              u64 build_begin, u64 build_end, const u64* probe_keys,
                              const u64* probe_ids, u64 probe_begin, u64 probe_end,
                              u32 partition_bits, unsigned long long* cursor,
                              u64* out_build_ids, u64* out_probe_ids) {
    u64 matches = 0;
    if (probe_end <= probe_begin) return 0;
    for (u64 chunk = build_begin; chunk < build_end; chunk += TABLE_CAPACITY) {
        const u32 len = (u32)min((u64)TABLE_CAPACITY, build_end - chunk);
        build_table(table, build_keys, chunk, len, partition_bits);
        for (u64 i = probe_begin + threadIdx.x; i < probe_end; i += BLOCK_THREADS) {
            const u64 key = probe_keys[i];
            for (u32 j = table.heads[table_slot(key, partition_bits)]; j != EMPTY_SLOT; j = table.next[j]) {
                if (table.keys[j] != key) continue;
                if (COUNT_ONLY) {
                    ++matches;
                } else {
                    const u64 pos = atomicAdd(cursor, 1ULL);
                    out_build_ids[pos] = build_ids[chunk + j];
                    out_probe_ids[pos] = probe_ids[i];
                }
            }
        }
        __syncthreads();  // the table is rebuilt for the next chunk
    }
    return matches;
}

// The build partition and probe rows of task t (see the header).
struct JoinTask {
    u64 partition;
    u64 probe_begin;
    u64 probe_end;
};

__device__ __forceinline__ JoinTask join_task(u64 t, const u64* probe_starts,
                                              const u64* task_partitions,
                                              const u64* task_probe_starts) {
    if (task_partitions == nullptr) return JoinTask{t, probe_starts[t], probe_starts[t + 1]};
    return JoinTask{task_partitions[t], task_probe_starts[t], task_probe_starts[t + 1]};
}

// Launch: any grid (grid-stride over tasks [task_begin, task_end)), block =
// BLOCK_THREADS, static shared memory only. `*_starts` hold
// 2^partition_bits + 1 entries; with a task list, `task_partitions` holds a
// partition id per task and `task_probe_starts` one more entry than tasks.
// Writes match_counts[t] for every t in range.
extern "C" __global__ void hash_join_count(const u64* build_keys, const u64* build_starts,
                                           const u64* probe_keys, const u64* probe_starts,
                                           const u64* task_partitions,
                                           const u64* task_probe_starts, u32 partition_bits,
                                           u64 task_begin, u64 task_end, u64* match_counts) {
    __shared__ SharedTable table;
    __shared__ u64 scratch[WARPS_PER_BLOCK];
    for (u64 t = task_begin + blockIdx.x; t < task_end; t += gridDim.x) {
        const JoinTask task = join_task(t, probe_starts, task_partitions, task_probe_starts);
        const u64 matches = join_partition<true>(
            table, build_keys, nullptr, build_starts[task.partition],
            build_starts[task.partition + 1], probe_keys, nullptr, task.probe_begin,
            task.probe_end, partition_bits, nullptr, nullptr, nullptr);
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
                                           const u64* task_partitions,
                                           const u64* task_probe_starts, u32 partition_bits,
                                           u64 task_begin, u64 task_end,
                                           const u64* match_offsets, u64 output_base,
                                           u64* out_build_ids, u64* out_probe_ids) {
    __shared__ SharedTable table;
    __shared__ unsigned long long cursor;
    for (u64 t = task_begin + blockIdx.x; t < task_end; t += gridDim.x) {
        const JoinTask task = join_task(t, probe_starts, task_partitions, task_probe_starts);
        if (threadIdx.x == 0) cursor = match_offsets[t] - output_base;
        __syncthreads();
        join_partition<false>(table, build_keys, build_ids, build_starts[task.partition],
                              build_starts[task.partition + 1], probe_keys, probe_ids,
                              task.probe_begin, task.probe_end, partition_bits, &cursor,
                              out_build_ids, out_probe_ids);
        __syncthreads();  // cursor is reset for the next task
    }
}
