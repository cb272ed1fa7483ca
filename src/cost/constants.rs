//! The cost model's fixed constants: DataFusion's per-row costs on one
//! thread of a many-core host, and the GPU path's costs beyond what the
//! device's measured constants give. BENCHMARKS.md ("Placement by cost")
//! holds the sweep they are fitted to (an H200 host with 16 cores); change
//! them only with a new sweep.

/// `RepartitionExec` by hash: hashing a row and taking it into its
/// partition's batch.
pub(super) const CPU_REPARTITION_NS_PER_ROW: f64 = 25.0;
/// `HashJoinExec`'s build: a row inserted into the hash table.
pub(super) const CPU_HASH_BUILD_NS_PER_ROW: f64 = 11.0;
/// `HashJoinExec`'s probe: a row hashed and looked up while the table is in
/// cache.
pub(super) const CPU_HASH_PROBE_NS_PER_ROW: f64 = 13.0;
/// A read at a random place out of cache: a probe of a large hash table,
/// an output row's build columns, an aggregation's group.
pub(super) const CPU_MISS_NS: f64 = 60.0;
/// The cache the cores share (a hash join's table), and one core's own (a
/// partial aggregation's table).
pub(super) const CPU_SHARED_CACHE_BYTES: f64 = 32.0 * (1 << 20) as f64;
pub(super) const CPU_CORE_CACHE_BYTES: f64 = 1.0 * (1 << 20) as f64;
/// Each join key column after the first, per input row.
pub(super) const CPU_EXTRA_KEY_NS_PER_ROW: f64 = 30.0;
/// A join's output: each row, and each byte taken into its columns.
pub(super) const CPU_OUTPUT_NS_PER_ROW: f64 = 10.0;
pub(super) const CPU_OUTPUT_NS_PER_BYTE: f64 = 1.0;
/// `SortExec`: a row's share of the comparisons, per level of the sort.
pub(super) const CPU_SORT_NS_PER_ROW_LOG: f64 = 4.0;
/// `SortMergeJoinExec`: a row of either input merged.
pub(super) const CPU_MERGE_NS_PER_ROW: f64 = 40.0;
/// `AggregateExec`: a row's key hashed and its group found (with GROUP
/// BY), and each aggregate updated.
pub(super) const CPU_AGGREGATE_NS_PER_ROW: f64 = 12.0;
pub(super) const CPU_AGGREGATE_NS_PER_AGGREGATE: f64 = 2.5;

/// What a GPU node pays whatever its size: streams, tasks, waiting for its
/// inputs whole; a join that hands rows on pays more (its output's
/// assembly, pinned buffers for its pairs).
pub(super) const GPU_FIXED_SECONDS: f64 = 0.006;
pub(super) const GPU_FIXED_SECONDS_EMITTING_ROWS: f64 = 0.025;
/// Kernel launches of one node (the radix passes, scans, gathers).
pub(super) const GPU_LAUNCHES_PER_NODE: f64 = 200.0;
/// The host's pass over each input row before it crosses (its keys made
/// into device words), on DataFusion's threads; more where several key
/// columns are packed into one word.
pub(super) const GPU_HOST_NS_PER_INPUT_ROW: f64 = 2.0;
pub(super) const GPU_HOST_NS_PER_ROW_OF_SEVERAL_KEYS: f64 = 30.0;
/// The host's check of a row's hashed group key against its group's.
pub(super) const GPU_HASHED_KEY_CHECK_NS_PER_ROW: f64 = 30.0;
/// The host's gather of an output row by the pairs the device found, a
/// row and each of its bytes (reads at random places of both sides).
pub(super) const GPU_HOST_GATHER_NS_PER_ROW: f64 = 10.0;
pub(super) const GPU_HOST_GATHER_NS_PER_BYTE: f64 = 10.0;
/// A join type that remembers its build side's matches: the host's work
/// per build row, on one thread, to emit the unmatched ones.
pub(super) const GPU_BUILD_MATCHES_NS_PER_ROW: f64 = 48.0;
/// Bytes of one pair of row ids brought back for the host to gather by.
pub(super) const GPU_PAIR_BYTES: f64 = 8.0;
/// Bytes of one key column of one row as the device takes it.
pub(super) const GPU_KEY_BYTES: f64 = 8.0;
/// Passes over each row's key word in device memory: the radix
/// partitioning (three passes, each read and written, and their
/// histograms) and the probe, or the radix sort and the merge.
pub(super) const GPU_HASH_JOIN_PASSES: f64 = 12.0;
pub(super) const GPU_SORT_MERGE_PASSES: f64 = 20.0;
/// Passes over an aggregation's input bytes on the device.
pub(super) const GPU_AGGREGATE_PASSES: f64 = 4.0;

/// The device's aggregation of rows it reads from the column cache, a
/// row, whatever the groups (the hash table's atomics, not the bytes, set
/// its pace). Fitted to the placement sweep's 16 groups at 2^24 and 2^26
/// rows on the device (15 and 44 ms, the fixed costs included).
pub(super) const GPU_CACHED_AGGREGATE_NS_PER_ROW: f64 = 0.55;

/// A GPU scan of a table held in memory (a `MemTable`'s batches) whose
/// columns the device column cache holds: what its node pays whatever the
/// table's size (a task and a cache lookup a partition, a launch a part,
/// the states or rows back), and its work a row on DataFusion's threads
/// (each part's lookup and launch, a part a batch). A scan aggregation,
/// and a scan that only tests a join's build keys (a bitmap of the keys'
/// span sent with each part, the rows kept made into batches). Fitted to
/// the placement sweep's "no GROUP BY" and "tiny build side" shapes.
pub(super) const GPU_MEMORY_SCAN_AGGREGATE_FIXED_SECONDS: f64 = 0.002;
pub(super) const GPU_MEMORY_SCAN_AGGREGATE_NS_PER_ROW: f64 = 4.0;
pub(super) const GPU_MEMORY_KEY_TEST_FIXED_SECONDS: f64 = 0.010;
pub(super) const GPU_MEMORY_KEY_TEST_NS_PER_ROW: f64 = 11.7;
