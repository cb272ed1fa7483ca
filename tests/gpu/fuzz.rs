//! A differential fuzzer: random tables and random joins and aggregations
//! over them, each run with the rule (every threshold at zero) and without
//! it, the answers compared.
//!
//! * Tables: one to three key columns of a type drawn from every type a
//!   GPU join or aggregation takes and a few it does not (dictionaries),
//!   NULL rates from none to all, keys uniform over small and large
//!   domains, Zipf, one heavy hitter, or aimed at one hash partition (equal
//!   low bits), floats with both zeros, NaNs and infinities, strings short,
//!   long and past the 12 bytes a view holds inline; 0 to 30,000 rows in
//!   1 to 4 partitions of batches from 1 to 8192 rows, so that empty and
//!   one-row partitions come up; a dictionary column's batches slices of
//!   one dictionary, or each a dictionary of its own where merging them
//!   would take too much memory.
//! * Queries: joins of every type on one to three keys, with NULLs equal
//!   or not, with and without a residual filter; aggregations (COUNT, SUM,
//!   MIN, MAX, AVG over decimals, COUNT(DISTINCT), FILTER) by zero to two
//!   keys, some with a HAVING; aggregations over joins; a LIMIT over a
//!   join (its row count).
//! * Settings: target partitions, batch size, hash or sort-merge joins,
//!   partition modes and small output ranges.
//! * Joins left on the CPU (a case in four, from a generator of its own):
//!   their build keys filter the scans of their probe sides (join key
//!   filters), and in two of five of those cases the query is one whose
//!   probe side aggregates by the key or joins again.
//! * Two joins stacked (a case in five of the others, from a generator of
//!   its own, where the tables' keys make at most 2^20 rows of the three-way
//!   join, counted on them before the case runs), in one partition, their
//!   order free: where DataFusion makes the lower one the upper one's probe
//!   side, it hands its output up on the device where its columns allow it,
//!   else as host batches. With a GPU, a run of 1000 cases or more fails
//!   where none handed rows on the device.
//! * Where the tables lie: in memory, or (three cases in ten) in Parquet
//!   files, one a partition, in row groups of 16 to 4,096 rows, scanned
//!   with DataFusion's dynamic filters, by row group statistics or (half of
//!   those cases) row by row (`pushdown_filters`): a join's filter that
//!   dropped a row that matches shows as a missing row.
//!
//! `DATAFUSION_GPU_FUZZ_CASES=START..END` picks the case seeds (default
//! `0..200`, the run CI makes); `DATAFUSION_GPU_FUZZ_PARALLEL` how many run
//! at once (default 4). A case is one seed: the same seed makes the same
//! tables, query and settings. Each path of a case runs under a time
//! limit, DataFusion's own first: the GPU path past it is a hang; a case
//! whose DataFusion path is past it is listed and not compared (at most
//! one in a hundred). DataFusion's own path runs on two threads of its
//! own, so that a query spinning past the limit there leaves the cases
//! beside it their threads. Without a GPU the rule leaves every plan to
//! DataFusion, and the run checks that path; with one, at least one node of
//! the run must have run on the GPU.

use std::io::Write;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, DictionaryArray, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, LargeStringArray, RecordBatch,
    StringArray, StringViewArray, TimestampMicrosecondArray, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema, TimeUnit};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::catalog::TableProvider;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::MemTable;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpu::gpu::gpu_runtime;
use datafusion_gpu::gpu_decisions;
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::Zipf;

use crate::support::*;

const CASES_VAR: &str = "DATAFUSION_GPU_FUZZ_CASES";
const PARALLEL_VAR: &str = "DATAFUSION_GPU_FUZZ_PARALLEL";
/// A path of a case that takes longer than this has hung: on the GPU path,
/// a failure; on DataFusion's own path, the case is left uncompared (its
/// sort-merge join can spin on some inputs, with no GPU in the plan).
const CASE_TIME_LIMIT: Duration = Duration::from_secs(120);

/// Key column types: what the GPU takes, and dictionaries, which it does not.
#[derive(Debug, Clone, Copy, PartialEq)]
enum KeyType {
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Decimal(u8, i8),
    Date32,
    Timestamp,
    Utf8,
    LargeUtf8,
    Utf8View,
    Boolean,
    Dictionary,
}

const KEY_TYPES: &[KeyType] = &[
    KeyType::Int8,
    KeyType::Int16,
    KeyType::Int32,
    KeyType::Int64,
    KeyType::Int64,
    KeyType::UInt8,
    KeyType::UInt32,
    KeyType::UInt64,
    KeyType::Float32,
    KeyType::Float64,
    KeyType::Decimal(12, 2),
    KeyType::Decimal(38, 4),
    KeyType::Date32,
    KeyType::Timestamp,
    KeyType::Utf8,
    KeyType::LargeUtf8,
    KeyType::Utf8View,
    KeyType::Boolean,
    KeyType::Dictionary,
];

impl KeyType {
    fn data_type(self) -> DataType {
        match self {
            KeyType::Int8 => DataType::Int8,
            KeyType::Int16 => DataType::Int16,
            KeyType::Int32 => DataType::Int32,
            KeyType::Int64 => DataType::Int64,
            KeyType::UInt8 => DataType::UInt8,
            KeyType::UInt32 => DataType::UInt32,
            KeyType::UInt64 => DataType::UInt64,
            KeyType::Float32 => DataType::Float32,
            KeyType::Float64 => DataType::Float64,
            KeyType::Decimal(p, s) => DataType::Decimal128(p, s),
            KeyType::Date32 => DataType::Date32,
            KeyType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            KeyType::Utf8 => DataType::Utf8,
            KeyType::LargeUtf8 => DataType::LargeUtf8,
            KeyType::Utf8View => DataType::Utf8View,
            KeyType::Boolean => DataType::Boolean,
            KeyType::Dictionary => {
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
            }
        }
    }
}

/// How a column's key ids are drawn.
#[derive(Debug, Clone, Copy)]
enum Distribution {
    Uniform {
        domain: u64,
    },
    Zipf {
        domain: u64,
    },
    /// Half the rows hold one key, the rest uniform.
    HeavyHitter {
        domain: u64,
    },
    /// Distinct ids whose low 24 bits are equal.
    Aimed {
        domain: u64,
    },
    /// Row `i` holds id `i`.
    Sequential,
}

impl Distribution {
    fn random(rng: &mut StdRng, rows: usize) -> Self {
        let domain = *[1u64, 2, 10, 1000, (rows as u64 * 2).max(1), 1 << 40]
            .choose(rng)
            .unwrap();
        match rng.random_range(0..6) {
            0 => Distribution::Zipf { domain },
            1 => Distribution::HeavyHitter { domain },
            2 => Distribution::Aimed { domain },
            3 => Distribution::Sequential,
            _ => Distribution::Uniform { domain },
        }
    }

    fn id(self, rng: &mut StdRng, row: usize) -> u64 {
        match self {
            Distribution::Uniform { domain } => rng.random_range(0..domain),
            Distribution::Zipf { domain } => {
                let zipf = Zipf::new(domain.min(1 << 20) as f64, 1.1).unwrap();
                rng.sample(zipf) as u64
            }
            Distribution::HeavyHitter { domain } => match rng.random_bool(0.5) {
                true => 7,
                false => rng.random_range(0..domain),
            },
            Distribution::Aimed { domain } => rng.random_range(0..domain.min(1 << 30)) << 24,
            Distribution::Sequential => row as u64,
        }
    }
}

/// One key column's recipe.
#[derive(Debug, Clone, Copy)]
struct KeyColumn {
    key_type: KeyType,
    distribution: Distribution,
    null_rate: f64,
    /// Floats: ids below 16 become zeros of both signs, NaNs, infinities.
    specials: bool,
    /// Strings: the prefix (long ones live outside a view).
    prefix: &'static str,
}

/// The array of `key` for key ids `ids`.
fn key_array(key: &KeyColumn, ids: &[Option<u64>]) -> ArrayRef {
    let float = |id: u64| -> f64 {
        if key.specials && id < 16 {
            let nan = f64::from_bits(0x7ff8_0000_0000_0000 | (id & 3));
            return [
                0.0,
                -0.0,
                f64::NAN,
                -f64::NAN,
                nan,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::MIN_POSITIVE,
            ][(id % 8) as usize];
        }
        id as f64 * 0.5 - 1000.0
    };
    let text = |id: u64| format!("{}{id}", key.prefix);
    let it = ids.iter().copied();
    match key.key_type {
        KeyType::Int8 => Arc::new(Int8Array::from_iter(it.map(|v| v.map(|v| v as i8)))),
        KeyType::Int16 => Arc::new(Int16Array::from_iter(it.map(|v| v.map(|v| v as i16)))),
        KeyType::Int32 => Arc::new(Int32Array::from_iter(
            it.map(|v| v.map(|v| (v as i32).wrapping_sub(1 << 20))),
        )),
        KeyType::Int64 => Arc::new(Int64Array::from_iter(it.map(|v| {
            v.map(|v| match v % 2 {
                0 => v as i64,
                _ => -(v as i64),
            })
        }))),
        KeyType::UInt8 => Arc::new(UInt8Array::from_iter(it.map(|v| v.map(|v| v as u8)))),
        KeyType::UInt32 => Arc::new(UInt32Array::from_iter(it.map(|v| v.map(|v| v as u32)))),
        KeyType::UInt64 => Arc::new(UInt64Array::from_iter(
            it.map(|v| v.map(|v| v.wrapping_mul(0x9E37_79B9_7F4A_7C15))),
        )),
        KeyType::Float32 => Arc::new(Float32Array::from_iter(
            it.map(|v| v.map(|v| float(v) as f32)),
        )),
        KeyType::Float64 => Arc::new(Float64Array::from_iter(it.map(|v| v.map(float)))),
        KeyType::Decimal(p, s) => Arc::new(
            Decimal128Array::from_iter(it.map(|v| v.map(|v| (v % 1_000_000_000) as i128 * 37 - 5)))
                .with_precision_and_scale(p, s)
                .unwrap(),
        ),
        KeyType::Date32 => Arc::new(Date32Array::from_iter(
            it.map(|v| v.map(|v| 19_000 + (v % 100_000) as i32)),
        )),
        KeyType::Timestamp => Arc::new(TimestampMicrosecondArray::from_iter(
            it.map(|v| v.map(|v| (v % (1 << 50)) as i64 * 1_000_003)),
        )),
        KeyType::Utf8 => Arc::new(StringArray::from_iter(it.map(|v| v.map(text)))),
        KeyType::LargeUtf8 => Arc::new(LargeStringArray::from_iter(it.map(|v| v.map(text)))),
        KeyType::Utf8View => Arc::new(StringViewArray::from_iter(it.map(|v| v.map(text)))),
        KeyType::Boolean => Arc::new(BooleanArray::from_iter(it.map(|v| v.map(|v| v % 2 == 0)))),
        KeyType::Dictionary => {
            let texts: Vec<Option<String>> = it.map(|v| v.map(text)).collect();
            Arc::new(
                texts
                    .iter()
                    .map(Option::as_deref)
                    .collect::<DictionaryArray<Int32Type>>(),
            )
        }
    }
}

/// A table's recipe: its keys, rows and layout.
#[derive(Debug, Clone)]
struct TableRecipe {
    keys: Vec<KeyColumn>,
    rows: usize,
    partitions: usize,
    batch_rows: usize,
}

/// The columns every table has besides its keys.
fn value_fields() -> Vec<Field> {
    vec![
        Field::new("v", DataType::Int64, true),
        Field::new("w", DataType::Float64, true),
        Field::new("d", DataType::Decimal128(12, 2), true),
        Field::new("t", DataType::Utf8, true),
    ]
}

fn make_table(recipe: &TableRecipe, rng: &mut StdRng) -> Arc<MemTable> {
    let mut fields: Vec<Field> = recipe
        .keys
        .iter()
        .enumerate()
        .map(|(i, key)| Field::new(format!("k{i}"), key.key_type.data_type(), true))
        .collect();
    fields.extend(value_fields());
    let schema = Arc::new(Schema::new(fields));
    let rows = recipe.rows;
    let mut columns: Vec<ArrayRef> = Vec::new();
    for key in &recipe.keys {
        let ids: Vec<Option<u64>> = (0..rows)
            .map(|row| {
                let id = key.distribution.id(rng, row);
                (!rng.random_bool(key.null_rate)).then_some(id)
            })
            .collect();
        columns.push(key_array(key, &ids));
    }
    let maybe = |rng: &mut StdRng| !rng.random_bool(0.05);
    let v: Int64Array = (0..rows)
        .map(|_| maybe(rng).then(|| rng.random_range(-1000..1000)))
        .collect();
    let w: Float64Array = (0..rows)
        .map(|_| maybe(rng).then(|| rng.random_range(-100..100) as f64 * 0.25))
        .collect();
    let d = (0..rows)
        .map(|_| maybe(rng).then(|| rng.random_range(-100_000i128..100_000)))
        .collect::<Decimal128Array>()
        .with_precision_and_scale(12, 2)
        .unwrap();
    let t: StringArray = (0..rows)
        .map(|_| maybe(rng).then(|| format!("t{}", rng.random_range(0..50))))
        .collect();
    columns.extend([
        Arc::new(v) as ArrayRef,
        Arc::new(w),
        Arc::new(d),
        Arc::new(t),
    ]);
    // A dictionary column's batches are slices of one table-wide
    // dictionary, each carrying all of it, unless there are so many that
    // merging them would take too much memory: arrow merges such
    // dictionaries when it concatenates them (DataFusion's sort-merge join
    // at small batch sizes does, batch after batch), in memory that grows
    // as batches times the dictionary's values. Seed 53557 (30,000 values
    // in batches of 8 rows) asked for gigabytes on DataFusion's own path
    // and ended the whole run; past the limit each batch holds a
    // dictionary of its own values.
    let batches = rows.div_ceil(recipe.batch_rows.max(1)) + recipe.partitions;
    let own_dictionaries: Vec<bool> = columns
        .iter()
        .map(|c| {
            c.as_any_dictionary_opt()
                .is_some_and(|d| batches * d.values().len() > MAX_MERGED_DICTIONARY_VALUES)
        })
        .collect();
    let slice = |range: Range<usize>| -> Vec<ArrayRef> {
        columns
            .iter()
            .zip(&own_dictionaries)
            .map(|(c, &own)| {
                let sliced = c.slice(range.start, range.len());
                match own {
                    true => dictionary_of_its_own(&sliced),
                    false => sliced,
                }
            })
            .collect()
    };
    if rows == 0 {
        let empty = RecordBatch::new_empty(Arc::clone(&schema));
        let parts = vec![vec![empty]; recipe.partitions];
        return Arc::new(MemTable::try_new(schema, parts).unwrap());
    }
    table_from_columns(schema, rows, recipe.partitions, recipe.batch_rows, slice)
}

/// Batches times dictionary values past which a table's dictionary column
/// gives each batch a dictionary of its own (see [`make_table`]).
const MAX_MERGED_DICTIONARY_VALUES: usize = 1 << 22;

/// `dictionary` (of `Int32` keys and `Utf8` values) with a dictionary of
/// the values its keys use alone, in the order first used.
fn dictionary_of_its_own(dictionary: &ArrayRef) -> ArrayRef {
    let dictionary = dictionary.as_dictionary::<Int32Type>();
    let values = dictionary.values().as_string::<i32>();
    let texts = dictionary
        .keys()
        .iter()
        .map(|key| key.map(|k| values.value(k as usize)));
    Arc::new(texts.collect::<DictionaryArray<Int32Type>>())
}

/// Tables written as Parquet files rather than held in memory.
#[derive(Debug, Clone, Copy)]
struct ParquetLayout {
    row_group_rows: usize,
    /// The scan filters rows by its predicate, not only row groups.
    pushdown_filters: bool,
    /// `gpu.tuning.min_part_rows`: 0 reads DataFusion's byte ranges as
    /// they are; 1,000 cuts them into parts of a few row groups each.
    min_part_rows: usize,
}

impl ParquetLayout {
    /// The layout of case `seed`'s tables, from a generator of its own, so
    /// that every case's tables, query and settings stay what they were.
    fn for_case(seed: u64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9a7e_f11e);
        rng.random_bool(0.3).then(|| Self {
            row_group_rows: *[16usize, 256, 4096].choose(&mut rng).unwrap(),
            pushdown_filters: rng.random_bool(0.5),
            min_part_rows: *[0usize, 1000, 524_288].choose(&mut rng).unwrap(),
        })
    }

    /// Writes `table`, one file a partition, under `dir`.
    async fn write(&self, table: &MemTable, dir: &std::path::Path) {
        std::fs::create_dir_all(dir).unwrap();
        for (i, partition) in table.batches.iter().enumerate() {
            let batches = partition.read().await;
            let properties = WriterProperties::builder()
                .set_max_row_group_row_count(Some(self.row_group_rows))
                .build();
            let file = std::fs::File::create(dir.join(format!("part-{i}.parquet"))).unwrap();
            let mut writer = ArrowWriter::try_new(file, table.schema(), Some(properties)).unwrap();
            for batch in batches.iter() {
                writer.write(batch).unwrap();
            }
            writer.close().unwrap();
        }
    }
}

/// One case: two tables, settings and a query.
#[derive(Debug)]
struct Case {
    seed: u64,
    tables: [TableRecipe; 2],
    parquet: Option<ParquetLayout>,
    mode: JoinMode,
    target_partitions: usize,
    settings: Vec<String>,
    sql: String,
    /// The two stacked joins run after `sql`, where the tables' keys make
    /// few enough rows of them (see [`ChainedJoins::fits`]).
    chained: Option<&'static ChainedJoins>,
}

fn random_key(rng: &mut StdRng, key_type: KeyType, rows: usize) -> KeyColumn {
    KeyColumn {
        key_type,
        distribution: Distribution::random(rng, rows),
        null_rate: *[0.0, 0.0, 0.01, 0.3, 1.0].choose(rng).unwrap(),
        specials: rng.random_bool(0.5),
        prefix: ["", "key-", "a prefix longer than twelve bytes "]
            .choose(rng)
            .copied()
            .unwrap(),
    }
}

/// Table sizes: empty, one row, and either side of the thresholds.
const ROWS: &[usize] = &[0, 1, 3, 64, 255, 257, 1000, 2049, 4097, 10_000, 30_000];

fn gen_case(seed: u64) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let key_types: Vec<KeyType> = (0..rng.random_range(1..=3))
        .map(|_| *KEY_TYPES.choose(&mut rng).unwrap())
        .collect();
    // At most 2^20 pairs, however few keys the tables hold.
    let r_rows = *ROWS.choose(&mut rng).unwrap();
    let s_rows = *ROWS
        .iter()
        .filter(|&&rows| rows * r_rows <= 1 << 20)
        .copied()
        .collect::<Vec<_>>()
        .choose(&mut rng)
        .unwrap();
    let tables = [r_rows, s_rows].map(|rows| TableRecipe {
        keys: key_types
            .iter()
            .map(|&t| random_key(&mut rng, t, rows))
            .collect(),
        rows,
        partitions: rng.random_range(1..=4),
        batch_rows: *[1usize, 5, 128, 1000, 8192].choose(&mut rng).unwrap(),
    });
    let mut settings = vec![format!(
        "SET datafusion.execution.batch_size = {}",
        [8, 1024, 8192].choose(&mut rng).unwrap()
    )];
    if rng.random_bool(0.15) {
        settings.push("SET datafusion.optimizer.prefer_hash_join = false".into());
    }
    if rng.random_bool(0.2) {
        // Small ranges of output pairs, each a device round trip (tens of
        // microseconds, and a batch through the plan): at most about 1024 of
        // them for the most pairs the tables can make, so that the case
        // tests where ranges split, not how long a million round trips take.
        let fewest = (r_rows * s_rows) >> 10;
        settings.push(format!(
            "SET gpu.max_output_pairs = {}",
            [1, 100, 4096].choose(&mut rng).unwrap().max(&fewest)
        ));
    }
    let mode = *JoinMode::ALL.choose(&mut rng).unwrap();
    let target_partitions = *[1usize, 2, 4, 8].choose(&mut rng).unwrap();
    let mut sql = gen_query(&mut rng, key_types.len());
    if let Some(query) = cpu_joins_for_case(seed) {
        settings.push("SET gpu.hash_join = false".into());
        settings.push("SET gpu.sort_merge_join = false".into());
        if let Some(query) = query {
            sql = query.into();
        }
    }
    let chained = cpu_joins_for_case(seed)
        .is_none()
        .then(|| chained_joins_for_case(seed))
        .flatten();
    let mut tables = tables;
    if chained.is_some_and(|joins| joins.reads_x) {
        // The lower join keeps its output on the device only where its
        // columns hold no NULLs: its key columns here.
        for table in &mut tables {
            table.keys[0].null_rate = 0.0;
        }
    }
    Case {
        seed,
        tables,
        parquet: ParquetLayout::for_case(seed),
        mode,
        target_partitions,
        settings,
        sql,
        chained,
    }
}

/// Queries whose probe sides take join keys through aggregations grouped
/// by the key and through inner joins.
const KEY_FILTER_QUERIES: &[&str] = &[
    "SELECT s.k0, s.v, a.n, a.m FROM s JOIN \
     (SELECT k0, COUNT(*) AS n, MAX(v) AS m FROM r GROUP BY k0) a ON s.k0 = a.k0",
    "SELECT s.k0, s.w FROM s WHERE s.k0 IN (SELECT k0 FROM r GROUP BY k0 HAVING COUNT(*) > 1)",
    "SELECT r.k0, r.v, a.t FROM r JOIN s ON r.k0 = s.k0 JOIN \
     (SELECT k0, SUM(v) AS t FROM r GROUP BY k0) a ON r.k0 = a.k0 WHERE s.v > 0",
    "SELECT s.k0, COUNT(*) FROM s JOIN r ON s.k0 = r.k0 \
     WHERE r.v < (SELECT AVG(r2.v) FROM r r2 WHERE r2.k0 = r.k0) GROUP BY s.k0",
];

/// Whether case `seed` leaves its joins on the CPU (so that their build
/// keys filter their probe sides' scans), and then the query it runs in
/// place of its own, if any: from a generator of its own, so that every
/// case's tables, query and settings otherwise stay what they were.
fn cpu_joins_for_case(seed: u64) -> Option<Option<&'static str>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e75_cc1e);
    if !rng.random_bool(0.25) {
        return None;
    }
    Some(
        rng.random_bool(0.4)
            .then(|| *KEY_FILTER_QUERIES.choose(&mut rng).unwrap()),
    )
}

/// Two joins, the lower one the upper one's probe side, and how many rows
/// the three-way join makes on given tables.
#[derive(Debug)]
struct ChainedJoins {
    sql: &'static str,
    /// The rows of the three-way join, from the keys' counts in `r` and
    /// `s` (NULL keys match nothing).
    rows_sql: &'static str,
    /// The query reads a table `x`: the first rows of `r`, half as many as
    /// the smaller of `r` and `s` hold ([`first_rows`]); the tables' `k0`
    /// then hold no NULLs, so that the lower join may keep its output on
    /// the device.
    reads_x: bool,
}

/// The rows of a three-way join over `r` and `s` joined on `k0`, from
/// `$product` of the key's rows in `r` (`a.n`) and in `s` (`b.n`) summed
/// over the keys both hold.
macro_rules! three_way_rows {
    ($product:literal) => {
        concat!(
            "SELECT COALESCE(SUM(",
            $product,
            "), 0) FROM (SELECT k0, COUNT(*) AS n FROM r GROUP BY k0) a ",
            "JOIN (SELECT k0, COUNT(*) AS n FROM s GROUP BY k0) b ON a.k0 = b.k0"
        )
    };
}

/// Stacked joins: output columns that are keys (no NULLs past an
/// equality), a value column with NULLs, an aggregation above, a filter
/// on the upper join's build side. DataFusion joins the first two tables
/// first and makes the smaller side by statistics the build side: the
/// lower join, estimated at about the smaller table's rows, is the upper
/// one's build side against a whole table (unless NULL keys make its
/// estimate larger), and its probe side against `x`, a smaller part of
/// `r` (`x`'s rows are among `r`'s, so `r`'s counts bound the rows).
const CHAINED_JOIN_QUERIES: &[ChainedJoins] = &[
    ChainedJoins {
        sql: "SELECT r.k0, s.k0, x.k0 FROM r JOIN s ON r.k0 = s.k0 JOIN r x ON x.k0 = s.k0",
        rows_sql: three_way_rows!("a.n * a.n * b.n"),
        reads_x: false,
    },
    ChainedJoins {
        sql: "SELECT s.k0, x.v, COUNT(*) FROM r JOIN s ON r.k0 = s.k0 JOIN s x ON x.k0 = r.k0 \
              GROUP BY s.k0, x.v",
        rows_sql: three_way_rows!("a.n * b.n * b.n"),
        reads_x: false,
    },
    ChainedJoins {
        sql: "SELECT r.k0, r.d, s.k0 FROM r JOIN s ON r.k0 = s.k0 JOIN s x ON x.k0 = r.k0 \
              WHERE x.v > 0",
        rows_sql: three_way_rows!("a.n * b.n * b.n"),
        reads_x: false,
    },
    ChainedJoins {
        sql: "SELECT r.k0, s.k0, x.k0 FROM r JOIN s ON r.k0 = s.k0 JOIN x ON x.k0 = s.k0",
        rows_sql: three_way_rows!("a.n * a.n * b.n"),
        reads_x: true,
    },
    ChainedJoins {
        sql: "SELECT s.k0, x.v, COUNT(*) FROM r JOIN s ON r.k0 = s.k0 JOIN x ON x.k0 = r.k0 \
              GROUP BY s.k0, x.v",
        rows_sql: three_way_rows!("a.n * a.n * b.n"),
        reads_x: true,
    },
    ChainedJoins {
        sql: "SELECT r.k0, s.k0, x.w FROM r JOIN s ON r.k0 = s.k0 JOIN x ON x.k0 = r.k0 \
              WHERE x.v > 0",
        rows_sql: three_way_rows!("a.n * a.n * b.n"),
        reads_x: true,
    },
];

/// The first `rows` rows of `table` (fewer where it holds fewer), in its
/// partitions' order, as a table of one partition.
async fn first_rows(table: &MemTable, rows: usize) -> Arc<MemTable> {
    let mut batches = Vec::new();
    let mut left = rows;
    for partition in &table.batches {
        for batch in partition.read().await.iter() {
            if left == 0 {
                break;
            }
            let taken = batch.num_rows().min(left);
            batches.push(batch.slice(0, taken));
            left -= taken;
        }
    }
    Arc::new(MemTable::try_new(table.schema(), vec![batches]).unwrap())
}

/// The most rows of the three-way join a case stacking joins may make.
const MAX_CHAINED_ROWS: i64 = 1 << 20;

impl ChainedJoins {
    /// Whether the three-way join makes at most [`MAX_CHAINED_ROWS`] rows
    /// of tables `r` and `s`, counted by DataFusion alone; `false` where
    /// the count fails (the case then runs its own query).
    async fn fits(&self, r: &Arc<MemTable>, s: &Arc<MemTable>) -> bool {
        let ctx = SessionContext::new();
        ctx.register_table("r", Arc::clone(r) as _).unwrap();
        ctx.register_table("s", Arc::clone(s) as _).unwrap();
        let batches = match ctx.sql(self.rows_sql).await {
            Ok(counted) => counted.collect().await,
            Err(e) => Err(e),
        };
        let Ok(batches) = batches else {
            return false;
        };
        let rows = batches.iter().find(|b| b.num_rows() > 0).and_then(|b| {
            b.column(0)
                .as_primitive_opt::<Int64Type>()
                .map(|c| c.value(0))
        });
        rows.is_some_and(|rows| rows <= MAX_CHAINED_ROWS)
    }
}

/// The stacked joins case `seed` runs besides its own query, if any
/// and if its tables allow ([`ChainedJoins::fits`]): from a generator of
/// its own, so that every case's tables, query and settings otherwise stay
/// what they were.
fn chained_joins_for_case(seed: u64) -> Option<&'static ChainedJoins> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0c4a_1d5e);
    rng.random_bool(0.2)
        .then(|| CHAINED_JOIN_QUERIES.choose(&mut rng).unwrap())
}

/// A join condition on the first `keys` key columns.
fn join_condition(rng: &mut StdRng, keys: usize) -> String {
    let keys = rng.random_range(1..=keys);
    let mut terms: Vec<String> = (0..keys)
        .map(|i| match rng.random_bool(0.1) {
            true => format!("(r.k{i} IS NOT DISTINCT FROM s.k{i})"),
            false => format!("r.k{i} = s.k{i}"),
        })
        .collect();
    if rng.random_bool(0.25) {
        terms.push("r.v < s.v + 50".into());
    }
    terms.join(" AND ")
}

fn gen_query(rng: &mut StdRng, keys: usize) -> String {
    const AGGREGATES: &[&str] = &[
        "COUNT(*)",
        "COUNT(v)",
        "SUM(v)",
        "MIN(v)",
        "MAX(v)",
        "MIN(w)",
        "MAX(w)",
        "AVG(d)",
        "SUM(d)",
        "COUNT(DISTINCT v)",
        "MIN(t)",
        "MAX(t)",
        "SUM(v) FILTER (WHERE w > 0)",
        "COUNT(*) FILTER (WHERE v % 2 = 0)",
    ];
    match rng.random_range(0..10) {
        0..=3 => {
            let on = join_condition(rng, keys);
            let (join, columns) = *[
                ("JOIN", "r.k0, r.v, s.v, s.t, r.w"),
                ("LEFT JOIN", "r.k0, r.v, s.v, s.t, r.w"),
                ("RIGHT JOIN", "s.k0, r.v, s.v, r.t, s.d"),
                ("FULL JOIN", "r.k0, s.k0, r.v, s.v"),
                ("LEFT SEMI JOIN", "r.k0, r.v, r.t"),
                ("LEFT ANTI JOIN", "r.k0, r.v, r.d"),
                ("RIGHT SEMI JOIN", "s.k0, s.v, s.w"),
                ("RIGHT ANTI JOIN", "s.k0, s.v"),
            ]
            .choose(rng)
            .unwrap();
            format!("SELECT {columns} FROM r {join} s ON {on}")
        }
        4..=6 => {
            let groups: Vec<String> = (0..rng.random_range(0..=keys.min(2)))
                .map(|i| format!("k{i}"))
                .collect();
            let count = rng.random_range(1..=4);
            let aggregates: Vec<&str> = AGGREGATES.sample(rng, count).copied().collect();
            let filter = match rng.random_bool(0.3) {
                true => " WHERE v > -500",
                false => "",
            };
            // A HAVING where the aggregate count is even (no draw of its
            // own, so the other cases stay as they were).
            let having = match count % 2 {
                0 => " HAVING COUNT(*) > 1",
                _ => "",
            };
            match groups.is_empty() {
                true => format!("SELECT {} FROM r{filter}", aggregates.join(", ")),
                false => format!(
                    "SELECT {g}, {} FROM r{filter} GROUP BY {g}{having}",
                    aggregates.join(", "),
                    g = groups.join(", ")
                ),
            }
        }
        7..=8 => {
            let on = join_condition(rng, keys);
            format!(
                "SELECT r.k0, COUNT(*), SUM(s.v), MAX(s.d), COUNT(DISTINCT s.t) \
                 FROM r JOIN s ON {on} GROUP BY r.k0"
            )
        }
        _ => {
            let on = join_condition(rng, keys);
            // The row count is fixed even where the rows are not.
            format!("SELECT COUNT(*) FROM (SELECT r.v, s.v FROM r JOIN s ON {on} LIMIT 7) x")
        }
    }
}

/// A query's answer: its rows as sorted text, or its error.
type Answer = Result<Vec<String>, String>;

/// A query's answer, the nodes its plan ran on the GPU, whether joins
/// handed their build keys to the scans of their probe sides, whether a
/// join kept its output on the device for the join above, and the plan as
/// it ran (with its metrics, for a failure's message).
async fn answer(
    ctx: &SessionContext,
    sql: &str,
) -> (Answer, usize, bool, bool, Option<Arc<dyn ExecutionPlan>>) {
    let plan = match ctx.sql(sql).await {
        Ok(df) => df.create_physical_plan().await,
        Err(e) => Err(e),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return (Err(e.to_string()), 0, false, false, None),
    };
    let gpu_nodes = gpu_decisions(&plan, ctx.state().config_options())
        .iter()
        .filter(|d| d.on_gpu())
        .count();
    let mut key_filters = false;
    let _ = plan.apply(|node| {
        key_filters |= node.name() == "JoinKeyCollectorExec";
        Ok(TreeNodeRecursion::Continue)
    });
    // In a task of its own, so that a panic (DataFusion's own sort-merge
    // join panics on NaN keys) is an answer to compare, not the run's end.
    // Aborted when this future is dropped at the time limit, so that a
    // query past it stops taking the runtime's threads from the others.
    let executed = Arc::clone(&plan);
    let task = SpawnedTask::spawn(datafusion::physical_plan::collect(plan, ctx.task_ctx()));
    let answer = match task.join().await {
        Ok(batches) => batches.map(|b| sorted_rows(&b)).map_err(|e| e.to_string()),
        Err(e) => Err(format!("panic: {e}")),
    };
    let rows_on_device = plan_metric(&executed, "output_rows_kept_on_device") > 0;
    (
        answer,
        gpu_nodes,
        key_filters,
        rows_on_device,
        Some(executed),
    )
}

/// The rows of `batches` as text, sorted: a multiset to compare.
fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            rows.push(cells.join("|"));
        }
    }
    rows.sort_unstable();
    rows
}

/// What a case that agreed found.
struct Agreed {
    gpu_nodes: usize,
    /// Joins handed their build keys to their probe sides' scans.
    key_filters: bool,
    /// A join kept its output on the device for the join above.
    rows_on_device: bool,
    /// The case ran two stacked joins besides its own query (set by
    /// [`Agreed::and_stacked`]).
    chained: bool,
    /// Both paths failed (the query's own error, such as an overflow).
    error: Option<String>,
    /// DataFusion's own path ran past the time limit: nothing compared.
    datafusion_past_limit: bool,
    /// DataFusion's answer lost rows to its dynamic filters that its join
    /// keeps without them, and the GPU path's is the answer without them
    /// (see [`datafusion_unfiltered_answer`]).
    datafusion_filter_dropped_rows: bool,
}

impl Agreed {
    /// What a case found over its own query and its stacked joins.
    fn and_stacked(self, stacked: Agreed) -> Agreed {
        Agreed {
            gpu_nodes: self.gpu_nodes + stacked.gpu_nodes,
            key_filters: self.key_filters || stacked.key_filters,
            rows_on_device: self.rows_on_device || stacked.rows_on_device,
            chained: true,
            error: self.error.or(stacked.error),
            datafusion_past_limit: self.datafusion_past_limit || stacked.datafusion_past_limit,
            datafusion_filter_dropped_rows: self.datafusion_filter_dropped_rows
                || stacked.datafusion_filter_dropped_rows,
        }
    }
}

/// How a case failed.
enum Failure {
    /// The GPU path ran past the time limit (DataFusion's did not).
    Hang(String),
    /// The answers differ.
    Mismatch(String),
}

impl Failure {
    /// The same failure, said to be of the case's query `what`.
    fn in_query(self, what: &str) -> Failure {
        match self {
            Failure::Hang(text) => Failure::Hang(format!("{what}: {text}")),
            Failure::Mismatch(text) => Failure::Mismatch(format!("{what}: {text}")),
        }
    }
}

/// What one case found, or how the paths disagreed: its own query, then,
/// where it stacks two joins ([`Case::chained`]) and its tables allow, the
/// stacked joins too, with settings of their own.
async fn run_case(case: Case) -> Result<Agreed, Failure> {
    let mut rng = StdRng::seed_from_u64(case.seed ^ 0x7ab1e5);
    let r = make_table(&case.tables[0], &mut rng);
    let s = make_table(&case.tables[1], &mut rng);
    let mut settings: Vec<&str> = case.settings.iter().map(String::as_str).collect();
    if case.parquet.is_some_and(|layout| layout.pushdown_filters) {
        settings.push("SET datafusion.execution.parquet.pushdown_filters = true");
    }
    let part_rows = case
        .parquet
        .map(|layout| format!("SET gpu.tuning.min_part_rows = {}", layout.min_part_rows));
    settings.extend(part_rows.as_deref());
    let own = run_query(&case, &r, &s, &settings, &case.sql, None).await?;
    let Some(joins) = case.chained else {
        return Ok(own);
    };
    if !joins.fits(&r, &s).await {
        return Ok(own);
    }
    // One partition: no repartition comes between the two joins.
    settings.push("SET datafusion.execution.target_partitions = 1");
    settings.push("SET gpu.preserve_order = false");
    let x = match joins.reads_x {
        true => Some(first_rows(&r, case.tables[0].rows.min(case.tables[1].rows) / 2).await),
        false => None,
    };
    let stacked = run_query(&case, &r, &s, &settings, joins.sql, x)
        .await
        .map_err(|failure| failure.in_query("the stacked joins"))?;
    Ok(own.and_stacked(stacked))
}

/// A case's tables, as each context registers them: `r`, `s` (from the
/// Parquet files under `parquet`, where the case reads files) and `x`,
/// where the query reads it.
struct Tables<'a> {
    r: &'a Arc<MemTable>,
    s: &'a Arc<MemTable>,
    x: Option<&'a Arc<MemTable>>,
    parquet: Option<&'a std::path::Path>,
}

impl Tables<'_> {
    async fn register(&self, ctx: &SessionContext) {
        match self.parquet {
            Some(folder) => {
                for name in ["r", "s"] {
                    let dir = folder.join(name);
                    ctx.register_parquet(
                        name,
                        dir.to_str().unwrap(),
                        ParquetReadOptions::default(),
                    )
                    .await
                    .unwrap();
                }
            }
            None => {
                ctx.register_table("r", Arc::clone(self.r) as _).unwrap();
                ctx.register_table("s", Arc::clone(self.s) as _).unwrap();
            }
        }
        if let Some(x) = self.x {
            ctx.register_table("x", Arc::clone(x) as _).unwrap();
        }
    }
}

/// A folder removed, with what it holds, when dropped.
struct RemovedOnDrop(std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Threads of the runtime each query of DataFusion's own path runs on.
const APART_THREADS: usize = 2;

/// [`answer`] on DataFusion's own path, under `CASE_TIME_LIMIT`, on a
/// runtime of its own in a thread of its own; `None` past the limit. Its
/// sort-merge join can spin inside an operator on some inputs, where no
/// abort reaches it, on as many threads as the plan has partitions: on the
/// runtime the cases share, that took every thread and the cases beside it
/// stopped too. Apart, it keeps its own two threads, which are left to it
/// past the limit.
async fn datafusion_answer(ctx: &SessionContext, sql: &str) -> Option<Answer> {
    let (ctx, sql) = (ctx.clone(), sql.to_string());
    let (sender, receiver) = futures::channel::oneshot::channel();
    std::thread::Builder::new()
        .name("fuzz-datafusion".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(APART_THREADS)
                .enable_all()
                .build();
            let answered = match runtime {
                Ok(runtime) => {
                    // A panic in planning (execution's is caught in
                    // `answer`) is an answer to compare, as there.
                    let answered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        runtime.block_on(answer(&ctx, &sql)).0
                    }))
                    .unwrap_or_else(|_| Err("panic while planning".into()));
                    runtime.shutdown_background();
                    answered
                }
                Err(e) => Err(format!("no runtime for DataFusion's own path: {e}")),
            };
            // The receiver is gone past the time limit: nothing to tell.
            let _ = sender.send(answered);
        })
        .expect("a thread for DataFusion's own path");
    match tokio::time::timeout(CASE_TIME_LIMIT, receiver).await {
        Ok(Ok(answered)) => Some(answered),
        // The limit passed (the thread is left to the query).
        Ok(Err(_)) | Err(_) => None,
    }
}

/// DataFusion's own answer with its dynamic filters off, asked where the
/// GPU path's answer differs from DataFusion's with them. DataFusion 55's
/// hash join pushes into its probe side's scan a range and a list of its
/// build keys that order floats totally (-0.0 below 0.0, apart from it),
/// while the join takes -0.0 and 0.0 as one key: with row filters in the
/// Parquet scan, a probe row of one zero is dropped before the join would
/// match it to a build row of the other, or kept, as the filter is ready
/// before the scan reads it or not. The GPU join's own filter keeps both
/// zeros; its answer is then DataFusion's without the filters, and the
/// case agrees. `None` where that answer is not had in time.
async fn datafusion_unfiltered_answer(
    case: &Case,
    tables: &Tables<'_>,
    settings: &[&str],
    sql: &str,
) -> Option<Vec<String>> {
    let mut settings = settings.to_vec();
    settings.push("SET datafusion.optimizer.enable_dynamic_filter_pushdown = false");
    let plain = cpu_context(case.mode, case.target_partitions, &settings).await;
    tables.register(&plain).await;
    datafusion_answer(&plain, sql).await?.ok()
}

/// One query of a case over its tables `r`, `s` (and `x`, where the query
/// reads it) with `settings`. DataFusion's own path runs first: where it
/// runs past the time limit, the GPU path is not run.
async fn run_query(
    case: &Case,
    r: &Arc<MemTable>,
    s: &Arc<MemTable>,
    settings: &[&str],
    sql: &str,
    x: Option<Arc<MemTable>>,
) -> Result<Agreed, Failure> {
    let gpu = gpu_context(case.mode, case.target_partitions, settings).await;
    let cpu = cpu_context(case.mode, case.target_partitions, settings).await;
    let folder = std::env::temp_dir().join(format!(
        "datafusion-gpu-fuzz-{}-{}",
        std::process::id(),
        case.seed
    ));
    // The files go once the query's answers are compared.
    let _files = case.parquet.map(|_| RemovedOnDrop(folder.clone()));
    if let Some(layout) = case.parquet {
        for (name, table) in [("r", r), ("s", s)] {
            layout.write(table, &folder.join(name)).await;
        }
    }
    let tables = Tables {
        r,
        s,
        x: x.as_ref(),
        parquet: case.parquet.map(|_| folder.as_path()),
    };
    for ctx in [&gpu, &cpu] {
        tables.register(ctx).await;
    }
    let began = Instant::now();
    let cpu_answer = datafusion_answer(&cpu, sql).await;
    let cpu_took = began.elapsed();
    let gpu_answer = match cpu_answer {
        Some(_) => tokio::time::timeout(CASE_TIME_LIMIT, answer(&gpu, sql))
            .await
            .ok(),
        None => None,
    };
    let (cpu_answer, (gpu_answer, gpu_nodes, key_filters, rows_on_device, gpu_plan)) =
        match (cpu_answer, gpu_answer) {
            (None, _) => {
                return Ok(Agreed {
                    gpu_nodes: 0,
                    key_filters: false,
                    rows_on_device: false,
                    chained: false,
                    error: None,
                    datafusion_past_limit: true,
                    datafusion_filter_dropped_rows: false,
                })
            }
            (Some(_), None) => {
                return Err(Failure::Hang(format!(
                    "the GPU path past {CASE_TIME_LIMIT:?}, DataFusion's own in {cpu_took:.1?}"
                )))
            }
            (Some(cpu_answer), Some(gpu)) => (cpu_answer, gpu),
        };
    let agreed = |error: Option<String>, datafusion_filter_dropped_rows: bool| Agreed {
        gpu_nodes,
        key_filters,
        rows_on_device,
        chained: false,
        error,
        datafusion_past_limit: false,
        datafusion_filter_dropped_rows,
    };
    match (&gpu_answer, &cpu_answer) {
        (Ok(g), Ok(c)) if g == c => Ok(agreed(None, false)),
        (Err(_), Err(c)) => Ok(agreed(Some(c.clone()), false)),
        (Ok(g), Ok(_))
            if datafusion_unfiltered_answer(case, &tables, settings, sql).await
                == Some(g.clone()) =>
        {
            Ok(agreed(None, true))
        }
        (Ok(g), Ok(c)) => {
            // The first row that differs, or the first that one side has
            // beyond the other's last.
            let first = g
                .iter()
                .zip(c)
                .position(|(a, b)| a != b)
                .or_else(|| (g.len() != c.len()).then(|| g.len().min(c.len())));
            let plan = gpu_plan.map_or_else(String::new, |plan| {
                DisplayableExecutionPlan::with_metrics(plan.as_ref())
                    .indent(true)
                    .to_string()
            });
            Err(Failure::Mismatch(format!(
                "{} rows on the GPU path, {} on the CPU; first difference at sorted row {first:?}: {:?} against {:?}\n  the GPU path's plan as it ran:\n{plan}",
                g.len(),
                c.len(),
                first.and_then(|i| g.get(i)),
                first.and_then(|i| c.get(i)),
            )))
        }
        (g, c) => Err(Failure::Mismatch(format!(
            "GPU path: {:?}; CPU: {:?}",
            g.as_ref().err(),
            c.as_ref().err()
        ))),
    }
}

fn case_range() -> Range<u64> {
    let text = std::env::var(CASES_VAR).unwrap_or_else(|_| "0..200".into());
    let (start, end) = text
        .split_once("..")
        .unwrap_or_else(|| panic!("{CASES_VAR}={text}: expected START..END"));
    let parse = |s: &str| {
        s.trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{CASES_VAR}={text}: {e}"))
    };
    parse(start)..parse(end)
}

#[test]
fn random_joins_and_aggregations_match_the_cpu() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(std::panic::AssertUnwindSafe(run_cases()).catch_unwind());
    // A query stopped at its time limit may still be spinning inside
    // DataFusion's own operator, where no abort reaches it: the runtime is
    // left to it rather than waited for.
    runtime.shutdown_background();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn run_cases() {
    let cases = case_range();
    let parallel: usize = std::env::var(PARALLEL_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(1);
    let gpu = gpu_runtime().is_ok();
    if !gpu {
        // Fails where a GPU is required; otherwise the CPU path is checked.
        let _ = require_gpu("fuzz::random_joins_and_aggregations_match_the_cpu");
    }
    let started = Instant::now();
    let mut failures: Vec<String> = Vec::new();
    let (mut run, mut on_gpu, mut gpu_nodes, mut hangs) = (0usize, 0usize, 0usize, 0usize);
    // Agreeing cases whose joins handed their build keys to their scans.
    let mut key_filtered = 0usize;
    // Agreeing cases stacking two joins, and those where a join kept its
    // output on the device.
    let (mut chained, mut rows_on_device) = (0usize, 0usize);
    // Cases read from Parquet files, and those of them with GPU nodes.
    let (mut from_parquet, mut from_parquet_on_gpu) = (0usize, 0usize);
    let mut errors: Vec<String> = Vec::new();
    let mut datafusion_past_limit: Vec<u64> = Vec::new();
    let mut datafusion_filter_dropped_rows: Vec<u64> = Vec::new();
    let mut slowest: Vec<(Duration, u64)> = Vec::new();
    let mut pending = tokio::task::JoinSet::new();
    let mut seeds = cases.clone();
    loop {
        while pending.len() < parallel {
            let Some(seed) = seeds.next() else { break };
            pending.spawn(async move {
                let case = gen_case(seed);
                let text = format!("{case:?}");
                let began = Instant::now();
                // Each path has its own limit; this one is a backstop.
                let outcome = tokio::time::timeout(5 * CASE_TIME_LIMIT, run_case(case)).await;
                (seed, text, outcome, began.elapsed())
            });
        }
        let Some(done) = pending.join_next().await else {
            break;
        };
        let (seed, text, outcome, took) = done.unwrap_or_else(|e| panic!("a case panicked: {e}"));
        run += 1;
        slowest.push((took, seed));
        slowest.sort_unstable_by(|a, b| b.cmp(a));
        slowest.truncate(5);
        if run % 500 == 0 {
            let _ = writeln!(
                std::io::stderr(),
                "fuzz: {run} cases run, {} failed, {:.1} s",
                failures.len(),
                started.elapsed().as_secs_f64()
            );
        }
        match outcome {
            Ok(Ok(agreed)) => {
                gpu_nodes += agreed.gpu_nodes;
                on_gpu += usize::from(agreed.gpu_nodes > 0);
                key_filtered += usize::from(agreed.key_filters);
                chained += usize::from(agreed.chained);
                rows_on_device += usize::from(agreed.rows_on_device);
                if ParquetLayout::for_case(seed).is_some() {
                    from_parquet += 1;
                    from_parquet_on_gpu += usize::from(agreed.gpu_nodes > 0);
                }
                errors.extend(agreed.error.map(|e| format!("case {seed}: {e}")));
                if agreed.datafusion_past_limit {
                    datafusion_past_limit.push(seed);
                }
                if agreed.datafusion_filter_dropped_rows {
                    datafusion_filter_dropped_rows.push(seed);
                }
            }
            Ok(Err(Failure::Mismatch(difference))) => {
                failures.push(format!("case {seed}: {difference}\n  {text}"))
            }
            Ok(Err(Failure::Hang(what))) => {
                hangs += 1;
                failures.push(format!("case {seed}: {what}\n  {text}"));
            }
            Err(_) => {
                hangs += 1;
                failures.push(format!(
                    "case {seed}: past {:?}\n  {text}",
                    5 * CASE_TIME_LIMIT
                ));
            }
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "fuzz: cases {}..{} ({}): {run} run, {on_gpu} with GPU nodes ({gpu_nodes} nodes), \
         {key_filtered} with join key filters, \
         {chained} stacking two joins ({rows_on_device} with rows handed between joins on the device), \
         {from_parquet} agreeing from Parquet files ({from_parquet_on_gpu} with GPU nodes), {} mismatches, {hangs} hangs, {} failing alike on both paths, in {:.1} s",
        cases.start,
        cases.end,
        if gpu {
            "GPU path against the CPU"
        } else {
            "no GPU: the CPU path"
        },
        failures.len() - hangs,
        errors.len(),
        started.elapsed().as_secs_f64(),
    );
    let slowest: Vec<String> = slowest
        .iter()
        .map(|(took, seed)| format!("{seed} ({:.1} s)", took.as_secs_f64()))
        .collect();
    let _ = writeln!(std::io::stderr(), "  slowest cases: {}", slowest.join(", "));
    if !datafusion_past_limit.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "  past {CASE_TIME_LIMIT:?} on DataFusion's own path, not compared: {datafusion_past_limit:?}"
        );
    }
    if !datafusion_filter_dropped_rows.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "  DataFusion's dynamic filters dropped rows its own join keeps; the GPU path agrees \
             with DataFusion without them: {datafusion_filter_dropped_rows:?}"
        );
    }
    for error in errors.iter().take(5) {
        let _ = writeln!(std::io::stderr(), "  {error}");
    }
    // A query both paths reject checks nothing: such cases stay rare.
    assert!(
        errors.len() * 20 <= run.max(20),
        "{} of {run} cases failed on both paths",
        errors.len()
    );
    // As rare: a case DataFusion itself cannot finish compares nothing.
    assert!(
        datafusion_past_limit.len() * 100 <= run.max(100),
        "{} of {run} cases past the limit on DataFusion's own path",
        datafusion_past_limit.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(run, (cases.end - cases.start) as usize);
    if gpu {
        assert!(gpu_nodes > 0, "no case ran a node on the GPU");
        // A case in ten or so places join key filters.
        assert!(
            run < 200 || key_filtered > 0,
            "no case of {run} placed join key filters"
        );
        // Stacked joins come up in about a case in seven, and hand their
        // rows on the device in a share of those: the lower join on the
        // upper one's probe side, its output columns of 4, 8 or 16 bytes
        // without NULLs, rows that match.
        assert!(
            run < 1000 || rows_on_device > 0,
            "no case of {run} handed rows between joins on the device ({chained} stacking two joins)"
        );
    }
}
