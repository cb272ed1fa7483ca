//! The `gpu.*` session options, settable with SQL `SET gpu.<name> = <value>`.

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;
use datafusion::config::ConfigOptions;

extensions_options! {
    /// Options of datafusion-gpu, registered under the prefix `gpu`.
    pub struct GpuOptions {
        /// Run supported operators on the GPU at all.
        pub enabled: bool, default = true
        /// Replace `HashJoinExec` by `GpuHashJoinExec` where supported.
        pub hash_join: bool, default = true
        /// Replace `SortMergeJoinExec` by `GpuSortMergeJoinExec` where
        /// supported (with the `SortExec`s DataFusion put below it just for
        /// the join, which then sort on the device).
        pub sort_merge_join: bool, default = true
        /// Plan a GPU sort-merge join in place of a `Partitioned` inner or
        /// outer hash join whose output is sorted on exactly the join keys
        /// right after (`ORDER BY` the key): the device sorts both inputs
        /// as part of the join and the rows come out in key order, so the
        /// CPU sort of the join's output is dropped. Off by default: with
        /// every row collected through DataFusion's merge of the sorted
        /// partitions, it measured 1.07x and 1.26x of DataFusion at 2^24 and
        /// 2^26 rows a side, but slower than the GPU hash join with the CPU
        /// sort at 2^24 (1493.7 against 1227.8 ms; 4847.2 against 4940.3 ms
        /// at 2^26, BENCHMARKS.md).
        pub sort_merge_join_for_order: bool, default = false
        /// Replace `AggregateExec` by `GpuAggregateExec` where supported.
        pub aggregate: bool, default = true
        /// Replace DataFusion's two aggregation phases (a partial
        /// aggregation per partition, a CPU repartition, a final one) by one
        /// GPU aggregation over all input partitions. Its groups are
        /// repartitioned as the final aggregation's were where a node above
        /// relies on that (by hash) or ran on several threads (round
        /// robin); its CPU fallback runs DataFusion's two phases. On by
        /// default: measured faster at 2^28 rows (BENCHMARKS.md).
        pub aggregate_single_phase: bool, default = true
        /// Run a `Partitioned` hash join once over all input partitions,
        /// without DataFusion's CPU hash repartition of its inputs (the GPU
        /// partitions the keys itself): as it is where no node above
        /// depends on the join's hash partitioning, and with its output
        /// hash-repartitioned as the join's was where one does (unless
        /// statistics say the join makes more rows than it reads, or its
        /// projection dropped the partitioning columns). Measured faster
        /// than the GPU join over DataFusion's repartitions from 2^24 rows a
        /// side (BENCHMARKS.md), and unharmed by skewed keys, which the CPU
        /// repartition sends to one partition (Zipf 1.5 at 2^24: 2.49x
        /// against 1.06x). At 2^22 rows a side the two traded places
        /// between runs: there the whole build side, collected before any
        /// probe starts, costs about what the repartition saves.
        /// A sort-merge join with a CPU hash repartition below each input,
        /// one of which keeps the order of sorted input partitions (a merge
        /// of the sorted streams on one thread per output partition), runs
        /// once over all input partitions too, where no node above depends
        /// on its hash partitioning: each input is merged into one
        /// partition and sorted on the device (one that is already a single
        /// sorted partition is not), and the output, in key order, is spread
        /// round robin over the join's partitions, each still sorted.
        /// Measured 1.53x of DataFusion at 2^26 rows a side, where the join
        /// per partition over the order-keeping repartitions ran at 0.99x
        /// (BENCHMARKS.md). A `CollectLeft` hash join that computes the
        /// aggregation above it (`gpu.aggregate_in_join`) reads all its
        /// probe partitions as one (`probe_reads_merge_inputs`), so each
        /// chunk's kernels build the shared-memory tables from the build side
        /// once for all of them: at 2^26 rows a side over pinned tables,
        /// 87 ms against 98 ms with 16 probe partitions on one machine.
        pub merge_partitions: bool, default = true
        /// With `merge_partitions`, run a sort-merge join once over all
        /// input partitions also where its inputs are unsorted (DataFusion
        /// sorts each hash partition for the join). Off by default: at 2^26
        /// rows a side it measured 840 ms against 765 ms for one GPU join
        /// per partition, whose host work (collecting, coding keys, staging
        /// copies) runs on every core at once (BENCHMARKS.md).
        pub merge_unsorted_sort_merge_inputs: bool, default = false
        /// Keep a node on the CPU when its inputs hold fewer rows than this by
        /// statistics (build + probe for a join, the input of an aggregation). 0 sends every supported node
        /// to the GPU, as conformance and differential tests do. Inputs
        /// without statistics count as large. The default is the measured
        /// crossover (BENCHMARKS.md): the GPU join lost at 2 M rows and at
        /// every TPC-H SF 1 join (up to 7.5 M rows), and won from 8 M rows.
        pub min_rows: usize, default = 8_000_000
        /// Keep an aggregation on the CPU when it makes fewer groups than
        /// this: one without GROUP BY, else the product of its key columns'
        /// distinct counts by statistics (without them it counts as many).
        /// Its input crosses PCIe whatever the groups, and with few groups
        /// one CPU pass over host memory is faster: the GPU aggregation
        /// measured 0.48x to 0.52x of DataFusion's from 2 to 2^12 groups and
        /// 1.22x at 2^16 (BENCHMARKS.md). At run time, a sample of 65,536
        /// keys spread over each partition is counted before the keys are
        /// encoded: few distinct keys (each repeated 8 times on average, and
        /// 8 times their count under this) send the partition to
        /// DataFusion's operator (`few_groups_partitions`). 0 sends every
        /// supported aggregation to the GPU, as conformance and
        /// differential tests do.
        pub min_groups: usize, default = 65_536
        /// Number an aggregation's groups in hash partitions sized to
        /// shared memory (seed 002's partition-based group-by) where the
        /// sample of its keys estimates at least this many groups; below,
        /// one hash table in device memory numbers them (seed 002's HGB).
        /// The estimate counts the sample's repeats as if the keys were
        /// equally likely, so heavy keys lower it and skewed keys stay in
        /// the one table, as the seed advises. The default, 2^25, is the
        /// measured crossover: at 2^28 rows the partitioned numbering took
        /// 84.6 ms of kernels at 2^26 groups against the one table's 104.9,
        /// and more than the table from 2^16 to 2^24 groups (87.0 against
        /// 77.2 ms at 2^24), its radix passes costing more than the
        /// table's random accesses in device memory save (BENCHMARKS.md).
        /// 0 partitions every aggregation with keys (tests).
        pub min_groups_to_partition: usize, default = 33_554_432
        /// Where an aggregation's groups are numbered in one hash table
        /// sized from the sample's estimate, and every reduction is a
        /// count, or a sum, minimum or maximum of one word per row (four at
        /// most), fold the values into the table's slots as the rows find
        /// them: one pass over the rows, no group id written per row nor
        /// read back per aggregate (`table_fold_partitions` in `EXPLAIN
        /// ANALYZE`). `false` numbers the rows, then reduces one column at
        /// a time.
        pub fold_into_table: bool, default = true
        /// Where an aggregation's groups are numbered before its
        /// aggregates are reduced (in partitions, or in a hash table that
        /// does not fold them), send each input whose reduction reads every
        /// row once (a count, sum, minimum, maximum, float sum or 128-bit
        /// sum; not the deterministic float sum nor a 128-bit minimum or
        /// maximum) in chunks, and reduce each chunk by its rows' groups
        /// once it has landed, while the next ones cross the bus
        /// (`inputs_reduced_as_they_landed` in `EXPLAIN ANALYZE`). `false`
        /// reduces each input once its whole column has crossed (in
        /// partitions, gathered into the partitions' order first).
        pub reduce_as_they_land: bool, default = true
        /// Where the device reads an aggregation's keys from pinned memory
        /// (the host's cores idle while the input crosses), map the host
        /// memory of the output columns the sample of the keys says will be
        /// needed (8-byte columns, one buffer per column of each output
        /// batch, up to 2 GiB, each counted in the memory pool first) once
        /// the inputs are prepared, on at most half the host's cores for all
        /// aggregations together, so that the results, once back, are
        /// copied into memory the kernel has already mapped rather than
        /// fault it in page by page (`output_buffers_mapped_ahead` in
        /// `EXPLAIN ANALYZE`).
        pub map_output_ahead: bool, default = true
        /// Output bytes (of those columns, by the sample's estimate) from
        /// which `gpu.map_output_ahead` maps them. The default, 512 MiB,
        /// lies between the two sizes measured: at 2^26 groups (1.5 GiB)
        /// mapping ahead made the query 4 to 13 % faster; at 2^24 (384 MiB)
        /// it gained nothing (BENCHMARKS.md). 0 maps whatever the size
        /// (tests).
        pub min_output_bytes_mapped_ahead: usize, default = 536_870_912
        /// Where the device makes an aggregation's reductions one after
        /// the other (in partitions, or not folded into the table), each
        /// once its input has crossed the bus, bring back the aggregates
        /// whose reductions are made first, and build their output columns,
        /// while the device still makes the others
        /// (`aggregates_brought_back_early` in `EXPLAIN ANALYZE`). `false`
        /// brings every aggregate back once the device has made them all.
        pub results_back_early: bool, default = true
        /// Fraction of the device memory free at start-up that GPU operators
        /// may hold at once, in (0, 1].
        pub memory_fraction: f64, default = 0.8
        /// Probe rows joined per GPU launch sequence; a larger chunk amortises
        /// launches, a smaller one needs less device memory. 0 (the default):
        /// as many as the build side has rows, within 4,194,304 and
        /// 134,217,728, because every chunk rebuilds the build side's
        /// shared-memory tables, twice (counting, then writing): with 2^22-row
        /// chunks against a 2^27-row build side that rebuilding was three
        /// quarters of the join's kernel time (BENCHMARKS.md).
        pub probe_chunk_rows: usize, default = 0
        /// Join output pairs kept on the device at once before they are copied
        /// back and turned into batches.
        pub max_output_pairs: usize, default = 8_388_608
        /// Emit join rows in the order `HashJoinExec` would: probe rows in
        /// arrival order, each with its build matches in build order, and
        /// unmatched probe rows where `HashJoinExec` puts them. SQL leaves
        /// that order unspecified, but applications and test suites may
        /// depend on it; it costs a counting sort of each chunk's matches on
        /// the host. The rule keeps it only where the order can be seen:
        /// not below a node that merges partitions as they come, nor for a
        /// join whose inputs arrive in no fixed order already (through such
        /// a merge), whose rows `HashJoinExec` emits in no fixed order
        /// either. `false` emits in the device's partition order.
        pub preserve_order: bool, default = true
        /// Gather the output columns of an inner join without a residual
        /// filter on the device: 4-, 8- and 16-byte columns without NULLs
        /// are copied there (the build side's once, a probe chunk's when at
        /// least half its rows match) and gathered by the matching pairs,
        /// and with `preserve_order` the pairs are ordered there too,
        /// instead of gathering every column row by row on the host. `false`
        /// gathers on the host, as other joins always do.
        pub device_gather: bool, default = true
        /// Compute an aggregation without GROUP BY (`COUNT`, `SUM`, `MIN`,
        /// `MAX`) right above a GPU inner join without a residual filter in
        /// the join itself: the aggregated columns are gathered by the
        /// matching pairs and reduced on the device, and one row of partial
        /// states per partition comes back instead of the join's output
        /// rows, which then never cross the bus nor become batches.
        /// `EXPLAIN` shows `partial_aggregate=[...]` on the join. `false`
        /// leaves DataFusion's partial aggregation above the join.
        pub aggregate_in_join: bool, default = true
        /// With `aggregate_in_join`, fold the aggregates of a hash join's
        /// pairs while the device probes (up to four aggregated columns),
        /// so the pairs are never written to device memory nor read back:
        /// at seed 002's narrow PK-FK join (2^27 x 2^28 rows) the writing,
        /// counting and gathering by pair was 26 of 57 ms of kernels.
        /// `false` writes the pairs, then reduces them (the only way with
        /// more than four aggregated columns).
        pub fold_while_probing: bool, default = true
        /// With `fold_while_probing`, partition each probe chunk's keys
        /// with the values its folds read (one 8-byte column, or one or two
        /// 4-byte ones) in place of row ids (seed 002's GFTR), so that the
        /// folds read them in order beside the keys, not at random rows.
        /// Only where the chunk's columns that go to the device all lie in
        /// pinned memory: staged through the host, the chunk waits on the
        /// host, not the device.
        /// The build side's keys carry the values its folds read too (one
        /// 8-byte column, or one or two 4-byte ones, whatever memory they
        /// come from: the build side goes to the device once): a lone
        /// 4-byte column rides in one-word rows (`one_word_join_rows`),
        /// more makes them two words. A chunk whose folds then cannot run
        /// (a column with NULLs) is joined against the build rows
        /// partitioned again by row id, made once on first need
        /// (`build_rows_by_row_id`).
        /// `EXPLAIN ANALYZE` counts the rows in `probe_rows_carrying_values`
        /// and `build_rows_carrying_values`. `false` carries row ids.
        pub carry_folded_values: bool, default = true
        /// Where a join's keys fit 32 bits (a packed key encoding of at
        /// most 32 bits: an Int32 column, or columns of narrow ranges),
        /// each side goes through the radix partitioning as one 8-byte
        /// word a row, the key in its low half and the row id (or the one
        /// 4-byte value a side carries, `carry_folded_values`) in
        /// its high half, in place of a key word and a row-id word: half
        /// the bytes every radix pass reads and writes.
        /// `EXPLAIN ANALYZE` counts the rows in `rows_in_one_word`.
        /// `false` keeps two words a row.
        pub one_word_join_rows: bool, default = true
        /// Probe chunks that start device work on one device at once; the
        /// others wait, which bounds the device work in flight (device
        /// memory is bounded by `memory_fraction` either way). A chunk
        /// gives its slot up when its first matches reach the host. 16
        /// (one per core of the measuring host) beat 4 and 8 at 2^26 rows a
        /// side: a chunk holds its slot while its output is copied back, and
        /// with 4 slots 16 partitions queued for them (BENCHMARKS.md).
        pub max_concurrent_tasks: usize, default = 16
        /// Sum floating-point values on the GPU so that the result does not
        /// depend on the order the device adds them in: each value becomes
        /// a 128-bit fixed-point integer on a scale set by its group's
        /// largest magnitude, the integers are summed, and the sum is
        /// rounded to a double once. Bits below 2^-62 of a group's largest
        /// magnitude are dropped (within DataFusion's own rounding error
        /// for sums of up to millions of values). Off: the device adds the
        /// doubles with atomics, and the last bits of SUM and AVG over
        /// Float64 may differ from run to run. Either way a result may
        /// differ from DataFusion's in its last bits, whose additions run
        /// in yet another order.
        pub deterministic_float_sums: bool, default = false
        /// Run aggregations whose group keys must be hashed on the GPU:
        /// strings, binary, floats with NULLs or beside other columns, and
        /// integer-like keys whose ranges do not fit 64 bits together. The
        /// device groups rows by a 64-bit hash of the key and the host
        /// checks every row's key against its group's (two keys that
        /// shared a hash send the partition to the CPU operator). Off by
        /// default: that host work mirrors DataFusion's own hash table, and
        /// the GPU path measured 0.39x to 0.95x of DataFusion's for Utf8
        /// keys at 2^26 rows (BENCHMARKS.md). Off, such aggregations stay
        /// on the CPU and `gpu_decisions` says why.
        pub hashed_group_keys: bool, default = false
        /// For testing the check of hashed group keys: the low bits of each
        /// hashed key that the device groups by, 1 to 64. Group keys that
        /// do not pack into 64 bits (strings, floats with other columns,
        /// wide ranges) are grouped by a hash, and every row's key is then
        /// compared with its group's on the host; keys that shared a hash
        /// send the partition to DataFusion's CPU operator. Fewer bits make
        /// that happen on purpose. Keep 64.
        pub hashed_group_key_bits: u32, default = 64
        /// Words (8 bytes each) of pinned host memory that one window of an
        /// aggregation's per-group results takes as it comes back from the
        /// device: the host turns one window into output batches, on every
        /// core, while the next crosses the bus. A window holds at least one
        /// output batch's groups (`datafusion.execution.batch_size`); 1
        /// makes every batch a window of its own (tests). The default
        /// (16 MiB) keeps the bus and the host both busy at 2^24 groups.
        pub result_window_words: usize, default = 2_097_152
    }
}

impl ConfigExtension for GpuOptions {
    const PREFIX: &'static str = "gpu";
}

impl GpuOptions {
    /// The options of a session, or the defaults where the session has none
    /// registered (the rule was added without [`crate::SessionStateBuilderGpuExt`]).
    pub fn from_config(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<GpuOptions>()
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::config::ExtensionOptions;

    #[test]
    fn options_are_settable_by_key() {
        let mut options = GpuOptions::default();
        options.set("enabled", "false").unwrap();
        options.set("min_rows", "0").unwrap();
        options.set("memory_fraction", "0.5").unwrap();
        assert!(!options.enabled);
        assert_eq!(options.min_rows, 0);
        assert_eq!(options.memory_fraction, 0.5);
        assert!(options.set("no_such_option", "1").is_err());
        assert!(options.set("min_rows", "many").is_err());
    }

    #[test]
    fn missing_extension_means_defaults() {
        let config = ConfigOptions::new();
        let options = GpuOptions::from_config(&config);
        assert!(options.enabled && options.hash_join && options.aggregate);
        assert!(options.sort_merge_join && !options.sort_merge_join_for_order);
        assert_eq!(options.min_rows, 8_000_000);
        assert_eq!(options.min_groups, 65_536);
        assert!(options.merge_partitions && options.aggregate_single_phase);
    }
}
