//! The `gpu.*` session options, settable with SQL `SET gpu.<name> = <value>`.
//!
//! Options a user chooses sit at the top of [`GpuOptions`]. Switches between
//! algorithms, kept for benchmarking and comparing them, sit under
//! `gpu.tuning.*` ([`GpuTuning`]); their defaults are the measured choices
//! (BENCHMARKS.md).

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, Visit};
use datafusion::common::{config_err, config_namespace};
use datafusion::config::{ConfigOptions, ExtensionOptions};
use datafusion::error::Result;
use std::any::Any;

/// Implements `ConfigField` for an option value `$type` that is set by
/// parsing its text (`FromStr`) and shown by `Display`; `$name` names the
/// option in errors.
macro_rules! config_field_by_parsing {
    ($type:ty, $name:literal) => {
        impl ConfigField for $type {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, _: &str, value: &str) -> Result<()> {
                *self = value.parse()?;
                Ok(())
            }

            fn reset(&mut self, key: &str) -> Result<()> {
                if !key.is_empty() {
                    return config_err!("{} has no field {key}", $name);
                }
                *self = <$type>::default();
                Ok(())
            }
        }
    };
}

mod devices;
#[cfg(feature = "test-support")]
mod test_options;
pub use devices::DeviceSelection;
#[cfg(feature = "test-support")]
pub use test_options::GpuTestOptions;

/// The bits of a hashed group key the device groups by: 64, or fewer where
/// a test says so (`gpu_test.hashed_group_key_bits`, `test-support` only).
pub(crate) fn hashed_group_key_bits(config: &ConfigOptions) -> u32 {
    #[cfg(feature = "test-support")]
    return test_options::hashed_group_key_bits(config);
    #[cfg(not(feature = "test-support"))]
    {
        let _ = config;
        64
    }
}

/// What a device error before an operator's first output does: by default
/// the CPU operator takes the work over; tests (`gpu_test.*`,
/// `test-support` only) make it fail instead, or inject one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DeviceErrorPolicy {
    /// End the query with the error.
    pub(crate) fail: bool,
    /// Report a driver error where the device part ends.
    pub(crate) inject: bool,
}

/// Bytes a hash join's probe chunk stays within: `built_in`, or what a test
/// set (`gpu_test.max_probe_chunk_bytes`, `test-support` only).
pub(crate) fn max_probe_chunk_bytes(config: &ConfigOptions, built_in: usize) -> usize {
    #[cfg(feature = "test-support")]
    return test_options::max_probe_chunk_bytes(config).unwrap_or(built_in);
    #[cfg(not(feature = "test-support"))]
    {
        let _ = config;
        built_in
    }
}

/// The session's [`DeviceErrorPolicy`].
pub(crate) fn device_error_policy(config: &ConfigOptions) -> DeviceErrorPolicy {
    #[cfg(feature = "test-support")]
    return test_options::device_error_policy(config);
    #[cfg(not(feature = "test-support"))]
    {
        let _ = config;
        DeviceErrorPolicy::default()
    }
}

config_namespace! {
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
        /// Replace `AggregateExec` by `GpuAggregateExec` where supported.
        pub aggregate: bool, default = true
        /// Fraction of the device memory free at start-up that GPU operators
        /// may hold at once, in (0, 1].
        pub memory_fraction: f64, default = 0.8
        /// Where a supported node runs: `cost` (the default) places it on
        /// the GPU where its estimated time there, from statistics and the
        /// device's constants measured at first use, is well below
        /// DataFusion's (`gpu_decisions` prints both estimates), and a
        /// sample of an aggregation's keys checks its groups at run time;
        /// `always` sends every supported node to the GPU, as conformance
        /// and differential tests do.
        pub placement: PlacementPolicy, default = PlacementPolicy::Cost
        /// Emit join rows in the order `HashJoinExec` would: probe rows in
        /// arrival order, each with its build matches in build order, and
        /// unmatched probe rows where `HashJoinExec` puts them. SQL leaves
        /// that order unspecified, but applications and test suites may
        /// depend on it. The rule keeps it only where the order can be seen.
        /// `false` emits in the device's partition order.
        pub preserve_order: bool, default = true
        /// Sum floating-point values on the GPU so that the result does not
        /// depend on the order the device adds them in (128-bit fixed point
        /// on a scale set by each group's largest magnitude, rounded to a
        /// double once). Off: the device adds doubles with atomics, and the
        /// last bits of SUM and AVG over Float64 may differ between runs.
        pub deterministic_float_sums: bool, default = false
        /// Run aggregations whose group keys must be hashed on the GPU
        /// (strings, binary, floats with NULLs or beside other columns,
        /// integer-like keys whose ranges do not fit 64 bits together): the
        /// device groups rows by a 64-bit hash and the host checks every
        /// row's key against its group's. Off, such aggregations stay on the
        /// CPU and `gpu_decisions` says why.
        pub hashed_group_keys: bool, default = false
        /// Join output pairs kept on the device at once before they are
        /// copied back and turned into batches.
        pub max_output_pairs: usize, default = 8_388_608
        /// Keep the table columns that GPU scans read in device memory
        /// between queries (the device column cache), so that the next
        /// query over them copies nothing. Off, each query copies the
        /// columns it reads and frees them after.
        pub cache: bool, default = true
        /// Fraction of the device memory free at start-up that the column
        /// cache may hold, in [0, 1]. Cached columns no query reads give
        /// way to any work that needs the memory.
        pub cache_memory_fraction: f64, default = 0.5
        /// Probe chunks that start device work on one device at once; the
        /// others wait, which bounds the device work in flight (device memory
        /// is bounded by `memory_fraction` either way).
        pub max_concurrent_tasks: usize, default = 16
        /// The GPUs the session's work may use: `all` (the default), or
        /// device numbers such as `0` or `0,1`, as CUDA numbers the devices
        /// `CUDA_VISIBLE_DEVICES` leaves visible. A node's partitions are
        /// spread round robin over them. Numbers the process lacks are
        /// passed over (executors of one cluster may have different
        /// devices); a list that names none of its devices keeps every node
        /// on the CPU, with the reason in `gpu_decisions`.
        pub devices: DeviceSelection, default = DeviceSelection::All
        /// Algorithm switches for benchmarking (`gpu.tuning.*`).
        pub tuning: GpuTuning, default = GpuTuning::default()
    }
}

config_namespace! {
    /// Switches between algorithms, for benchmarking and comparing them
    /// (`gpu.tuning.*`). The defaults are the measured choices.
    pub struct GpuTuning {
        /// Plan a GPU sort-merge join in place of a `Partitioned` inner or
        /// outer hash join whose output is sorted on exactly the join keys
        /// right after, dropping the CPU sort of its output.
        pub sort_merge_join_for_order: bool, default = false
        /// Replace DataFusion's two aggregation phases (partial, CPU
        /// repartition, final) by one GPU aggregation over all input
        /// partitions, its groups repartitioned as the final aggregation's
        /// were where a node above relies on it.
        pub aggregate_single_phase: bool, default = true
        /// Run a `Partitioned` hash join, or a sort-merge join whose inputs
        /// are hash-repartitioned, once over all input partitions without
        /// DataFusion's CPU repartition of its inputs (the GPU partitions the
        /// keys itself), repartitioning its output where a node above
        /// depends on it; a `CollectLeft` join that aggregates in the join
        /// reads its probe partitions as one.
        pub merge_partitions: bool, default = true
        /// With `merge_partitions`, run a sort-merge join once over all
        /// input partitions also where its inputs are unsorted.
        pub merge_unsorted_sort_merge_inputs: bool, default = false
        /// Number an aggregation's groups in hash partitions sized to shared
        /// memory (seed 002's partition-based group-by) where the sample of
        /// its keys estimates at least this many groups; below, one hash
        /// table in device memory numbers them. 0 partitions every
        /// aggregation with keys.
        pub min_groups_to_partition: usize, default = 33_554_432
        /// Where groups are numbered in one hash table and every reduction
        /// is a count, or a sum, minimum or maximum of one word a row (four
        /// at most), fold the values into the table as the rows find their
        /// slots (`table_fold_partitions`). `false` numbers the rows, then
        /// reduces one column at a time.
        pub fold_into_table: bool, default = true
        /// Where groups are numbered before the aggregates are reduced, send
        /// each single-pass reduction's input in chunks and reduce each
        /// chunk once it has landed, while the next ones cross the bus
        /// (`inputs_reduced_as_they_landed`).
        pub reduce_as_they_land: bool, default = true
        /// Where the device reads an aggregation's keys from pinned memory,
        /// map the host memory of its 8-byte output columns on idle host
        /// cores while the device works (`output_buffers_mapped_ahead`).
        pub map_output_ahead: bool, default = true
        /// Output bytes (by the sample's estimate) from which
        /// `map_output_ahead` maps them. 0 maps whatever the size.
        pub min_output_bytes_mapped_ahead: usize, default = 536_870_912
        /// Bring back the aggregates whose reductions are made first, and
        /// build their columns, while the device still makes the others
        /// (`aggregates_brought_back_early`).
        pub results_back_early: bool, default = true
        /// Probe rows joined per GPU launch sequence. 0: as many as the build
        /// side has rows, within 4,194,304 and 134,217,728 (every chunk
        /// builds the build side's shared-memory tables again).
        pub probe_chunk_rows: usize, default = 0
        /// Gather the output columns of an inner join without a residual
        /// filter on the device (4-, 8- and 16-byte columns without NULLs),
        /// in place of gathering every column row by row on the host.
        pub device_gather: bool, default = true
        /// With `device_gather`, keep a GPU hash join's output on the device
        /// where its consumer is a GPU hash join that probes with it there
        /// (an 8-byte key without NULLs): the rows never cross the bus
        /// between the two joins.
        pub device_rows_between_joins: bool, default = true
        /// Compute an aggregation without GROUP BY (`COUNT`, `SUM`, `MIN`,
        /// `MAX`) right above a GPU inner join without a residual filter in
        /// the join itself: one row of partial states per partition comes
        /// back in place of the join's rows (`partial_aggregate=[...]`).
        pub aggregate_in_join: bool, default = true
        /// With `aggregate_in_join`, fold the aggregates of a hash join's
        /// pairs while the device probes (up to four aggregated columns), so
        /// the pairs are never written to device memory.
        pub fold_while_probing: bool, default = true
        /// With `fold_while_probing`, partition each side's keys with the
        /// values its folds read in place of row ids (seed 002's GFTR); a
        /// probe chunk only where its columns lie in pinned memory
        /// (`probe_rows_carrying_values`, `build_rows_carrying_values`).
        pub carry_folded_values: bool, default = true
        /// Where a join's keys fit 32 bits, each side goes through the radix
        /// partitioning as one 8-byte word a row (key and row id or one
        /// carried 4-byte value) in place of two (`rows_in_one_word`).
        pub one_word_join_rows: bool, default = true
        /// Run a partial aggregation over filters, projections and one table
        /// scan as one `GpuScanAggregateExec` over the table's cached
        /// columns. `false` leaves such aggregations to `GpuAggregateExec`
        /// or DataFusion, as placed.
        pub scan_aggregate: bool, default = true
        /// Run filters and projections over one table scan as one
        /// `GpuScanFilterExec` over the table's cached columns, which hands
        /// the rows kept to the nodes above. `false` leaves them to
        /// DataFusion.
        pub scan_filter: bool, default = true
        /// Where a hash join stays on the CPU and its probe side is a scan
        /// the device can read from the column cache, hand the build side's
        /// keys (one integer key) to a `GpuScanFilterExec` there, which keeps
        /// only the rows whose key the build side holds. `false` leaves the
        /// probe side as placed.
        pub join_key_filters: bool, default = true
        /// Where a GPU hash join keeps probe rows by whether a build row
        /// matches (a right anti join, `NOT EXISTS`; a right semi join,
        /// `EXISTS`, only where DataFusion gave it no dynamic filter), its
        /// build side is a `GpuScanFilterExec` and it has no limit, gather the
        /// probe side's keys (one integer key) as it is read ahead of the join
        /// (at most 512 MiB of its batches held, a quarter of a limited memory
        /// pool), and test the build side's rows against them on the device: a
        /// build row no probe row matches makes no output there. `false` leaves
        /// the build side as placed.
        pub build_key_filters: bool, default = true
        /// While a GPU hash join's build side is collected, read its probe
        /// side ahead (host batches, up to 512 MiB held a join, counted in
        /// the session's memory pool; up to the first rows a GPU join below
        /// keeps on the device), so that the scans and joins below it run
        /// beside the build side's (`probe_rows_read_ahead`). Not where a
        /// scan of the probe side reads the files pruned by the join's
        /// dynamic filter (it would be read before the filter is there),
        /// under a memory pool that is not unbounded, for a join with a
        /// limit, in a single-threaded runtime, or where the probe side is
        /// read ahead already (by its key gatherer) or read through its
        /// merge. Off by default: where both sides' scans decode files on
        /// every core, reading them at once is no faster warm and slower
        /// cold; it is for build sides that wait on their storage.
        pub read_probe_ahead: bool, default = false
        /// Where a GPU join or aggregation reads a filtered Parquet table
        /// scan that keeps too many rows for a `GpuScanFilterExec` of its
        /// own, read it through one all the same (its rows go to the device
        /// anyway); and where a GPU aggregation reads a whole table scan
        /// (with `gpu.cache`), read the table's cached columns on the
        /// device. `false` leaves DataFusion's scans and filters there.
        pub cached_gpu_inputs: bool, default = true
        /// Read a Parquet string column the column cache codes as a
        /// dictionary (the file's keys into its values, as stored), in place
        /// of a string a row that the fill then looks up again.
        pub dictionary_reads: bool, default = true
        /// Rows a piece of a Parquet part holds at least where the device
        /// column cache reads the part with the rest of its table at once (a
        /// scan aggregation, a GPU aggregation over cached columns,
        /// `cache_table`): each byte range DataFusion reads as one is read
        /// in pieces of whole row groups, of at least this many rows each
        /// (the last may hold fewer), each by a task of its own (ranges of
        /// about the same bytes hold unequal numbers of row groups); a row
        /// group of at least twice this many rows (and 16,384) is read in
        /// slices of its rows (64 at most). 0 reads each range by one task. A scan
        /// filter's parts are read by one task each, but for the pieces
        /// `gpu.tuning.steal_pieces` hands to idle tasks (a part of one such
        /// row group in slices).
        pub min_part_rows: usize, default = 524_288
        /// Where a task reads a Parquet part the device column cache misses
        /// in turn with its partition's others (a scan filter, the fill
        /// ahead of a plan), a fill-ahead task with no part left to take
        /// reads that part's last unread pieces (of at least
        /// `gpu.tuning.min_part_rows` rows) for it, so that a scan's
        /// last parts are not each read by one task on an otherwise idle
        /// host. `false` leaves each such part to its own task.
        pub steal_pieces: bool, default = true
        /// Where the device column cache reads a Parquet part with string
        /// columns whole, by one task (no pieces of it to share out: a file
        /// or byte range of one row group of fewer than twice
        /// `gpu.tuning.min_part_rows` rows or 16,384, as small tables are
        /// written, or of any size read in turn where no idle task helps),
        /// its columns are read apart, side by side: each string column by a
        /// task of its own, the others together by one more, so that the
        /// part takes about as long as its largest column. Not where
        /// `gpu.tuning.min_part_rows` is 0 (each part read by one task) or
        /// the runtime has one thread. `false` reads the part's
        /// columns together.
        pub read_columns_apart: bool, default = true
        /// Words (8 bytes each) of pinned host memory that one window of an
        /// aggregation's per-group results takes as it comes back: the host
        /// turns one window into batches while the next crosses the bus. A
        /// window holds at least one output batch's groups.
        pub result_window_words: usize, default = 2_097_152
    }
}

/// The tuning options, by name: a `SET gpu.<name>` of one of these is
/// rejected with the name it has now.
const TUNING_OPTIONS: &[&str] = &[
    "sort_merge_join_for_order",
    "aggregate_single_phase",
    "merge_partitions",
    "merge_unsorted_sort_merge_inputs",
    "min_groups_to_partition",
    "fold_into_table",
    "reduce_as_they_land",
    "map_output_ahead",
    "min_output_bytes_mapped_ahead",
    "results_back_early",
    "probe_chunk_rows",
    "device_gather",
    "device_rows_between_joins",
    "aggregate_in_join",
    "fold_while_probing",
    "carry_folded_values",
    "one_word_join_rows",
    "result_window_words",
    "scan_aggregate",
    "scan_filter",
    "join_key_filters",
    "build_key_filters",
    "read_probe_ahead",
    "cached_gpu_inputs",
    "dictionary_reads",
    "min_part_rows",
    "steal_pieces",
    "read_columns_apart",
];

/// Options that are no longer options, with what to do instead.
const REMOVED_OPTIONS: &[(&str, &str)] = &[
    (
        "hashed_group_key_bits",
        "it was a test-only setting; hashed group keys always use 64 bits",
    ),
    (
        "min_rows",
        "nodes are placed by estimated cost (gpu.placement = 'cost'); \
         SET gpu.placement = 'always' sends every supported node to the GPU",
    ),
    (
        "min_groups",
        "nodes are placed by estimated cost (gpu.placement = 'cost'); \
         SET gpu.placement = 'always' sends every supported node to the GPU",
    ),
];

/// How the rule places a supported node (`gpu.placement`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// Where its estimated time is lower, by a margin, on the GPU.
    #[default]
    Cost,
    /// Always on the GPU.
    Always,
}

impl PlacementPolicy {
    /// Whether nodes go to the GPU whatever their estimates.
    pub fn always(self) -> bool {
        self == PlacementPolicy::Always
    }
}

impl std::fmt::Display for PlacementPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlacementPolicy::Cost => "cost",
            PlacementPolicy::Always => "always",
        })
    }
}

impl std::str::FromStr for PlacementPolicy {
    type Err = datafusion::error::DataFusionError;

    fn from_str(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "cost" => Ok(PlacementPolicy::Cost),
            "always" => Ok(PlacementPolicy::Always),
            _ => config_err!("gpu.placement is 'cost' or 'always', not '{value}'"),
        }
    }
}

config_field_by_parsing!(PlacementPolicy, "gpu.placement");

impl ConfigExtension for GpuOptions {
    const PREFIX: &'static str = "gpu";
}

impl ExtensionOptions for GpuOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        if TUNING_OPTIONS.contains(&key) {
            return config_err!(
                "gpu.{key} is now gpu.tuning.{key}: SET gpu.tuning.{key} = {value}"
            );
        }
        if let Some((_, why)) = REMOVED_OPTIONS.iter().find(|(name, _)| *name == key) {
            return config_err!("gpu.{key} is no longer an option: {why}");
        }
        ConfigField::set(self, key, value)
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        struct Entries(Vec<ConfigEntry>);
        impl Visit for Entries {
            fn some<V: std::fmt::Display>(
                &mut self,
                key: &str,
                value: V,
                description: &'static str,
            ) {
                self.0.push(ConfigEntry {
                    key: format!("gpu.{}", key.trim_start_matches('.')),
                    value: Some(value.to_string()),
                    description,
                });
            }
            fn none(&mut self, key: &str, description: &'static str) {
                self.0.push(ConfigEntry {
                    key: format!("gpu.{}", key.trim_start_matches('.')),
                    value: None,
                    description,
                });
            }
        }
        let mut entries = Entries(Vec::new());
        // `ConfigOptions::entries` lists extensions' entries as they give
        // them: with the prefix, so that `SHOW ALL` names what `SET` takes.
        ConfigField::visit(self, &mut entries, "", "");
        entries.0
    }
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

    #[test]
    fn options_are_settable_by_key() {
        let mut options = GpuOptions::default();
        ExtensionOptions::set(&mut options, "enabled", "false").unwrap();
        ExtensionOptions::set(&mut options, "placement", "always").unwrap();
        ExtensionOptions::set(&mut options, "memory_fraction", "0.5").unwrap();
        ExtensionOptions::set(&mut options, "tuning.fold_into_table", "false").unwrap();
        assert!(!options.enabled);
        assert_eq!(options.placement, PlacementPolicy::Always);
        assert_eq!(options.memory_fraction, 0.5);
        assert!(!options.tuning.fold_into_table);
        assert!(ExtensionOptions::set(&mut options, "no_such_option", "1").is_err());
        let error = ExtensionOptions::set(&mut options, "placement", "sometimes")
            .unwrap_err()
            .to_string();
        assert!(error.contains("'cost' or 'always'"), "{error}");
        for removed in ["min_rows", "min_groups"] {
            let error = ExtensionOptions::set(&mut options, removed, "0")
                .unwrap_err()
                .to_string();
            assert!(error.contains("gpu.placement = 'always'"), "{error}");
        }
        assert!(ExtensionOptions::set(&mut options, "tuning.no_such_option", "1").is_err());
    }

    #[test]
    fn at_most_fourteen_user_options() {
        let user_options: Vec<_> = ExtensionOptions::entries(&GpuOptions::default())
            .into_iter()
            .filter(|entry| !entry.key.starts_with("gpu.tuning."))
            .map(|entry| entry.key)
            .collect();
        // Eleven, the column cache's two (`cache`, its memory share) and
        // the devices.
        assert!(user_options.len() <= 14, "{user_options:?}");
        assert!(user_options.contains(&"gpu.devices".to_string()));
        assert!(user_options.contains(&"gpu.enabled".to_string()));
    }

    #[test]
    fn every_tuning_option_is_listed_and_its_old_name_is_rejected_with_the_new_one() {
        let tuning: Vec<String> = ExtensionOptions::entries(&GpuOptions::default())
            .into_iter()
            .filter_map(|entry| entry.key.strip_prefix("gpu.tuning.").map(str::to_string))
            .collect();
        let mut listed: Vec<&str> = TUNING_OPTIONS.to_vec();
        listed.sort_unstable();
        let mut found: Vec<&str> = tuning.iter().map(String::as_str).collect();
        found.sort_unstable();
        assert_eq!(listed, found);
        let mut options = GpuOptions::default();
        for name in TUNING_OPTIONS {
            let error = ExtensionOptions::set(&mut options, name, "1")
                .unwrap_err()
                .to_string();
            assert!(error.contains(&format!("gpu.tuning.{name}")), "{error}");
        }
        let error = ExtensionOptions::set(&mut options, "hashed_group_key_bits", "8")
            .unwrap_err()
            .to_string();
        assert!(error.contains("no longer an option"), "{error}");
    }

    #[test]
    fn old_names_are_rejected_through_sql_set() {
        let mut config = ConfigOptions::new();
        config.extensions.insert(GpuOptions::default());
        let error = config
            .set("gpu.fold_into_table", "false")
            .unwrap_err()
            .to_string();
        assert!(error.contains("gpu.tuning.fold_into_table"), "{error}");
        config.set("gpu.tuning.fold_into_table", "false").unwrap();
        assert!(!GpuOptions::from_config(&config).tuning.fold_into_table);
        let keys: Vec<String> = config
            .entries()
            .into_iter()
            .map(|entry| entry.key)
            .collect();
        assert!(keys.contains(&"gpu.placement".to_string()), "{keys:?}");
        config.set("gpu.placement", "ALWAYS").unwrap();
        assert!(GpuOptions::from_config(&config).placement.always());
        let shown = config
            .entries()
            .into_iter()
            .find(|entry| entry.key == "gpu.placement")
            .and_then(|entry| entry.value);
        assert_eq!(shown.as_deref(), Some("always"));
        assert!(
            keys.contains(&"gpu.tuning.fold_into_table".to_string()),
            "{keys:?}"
        );
    }

    #[test]
    fn missing_extension_means_defaults() {
        let config = ConfigOptions::new();
        let options = GpuOptions::from_config(&config);
        assert!(options.enabled && options.hash_join && options.aggregate);
        assert!(options.sort_merge_join && !options.tuning.sort_merge_join_for_order);
        assert_eq!(options.placement, PlacementPolicy::Cost);
        assert!(options.tuning.merge_partitions && options.tuning.aggregate_single_phase);
    }
}
