//! A table's parts as the column cache keeps them, each under a key that
//! changes with its data, and the reading of a part's columns where the
//! cache misses them: every row, whatever filter the query has.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::Field;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::config::TableParquetOptions;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::physical_plan::{ParquetFileReaderFactory, ParquetSource};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::file::metadata::PageIndexPolicy;
use datafusion::physical_expr_adapter::PhysicalExprAdapterFactory;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, FileSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::ExecutionPlan;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};

use super::read_types;
use super::row_groups::RowGroups;
use super::shape::TableSource;
use crate::encode::table_words::word_kind;
use crate::gpu::WordKind;
use crate::trace;

/// Rows a batch of a part read to fill the cache: fewer, longer batches,
/// less work a batch, in the decoder and in the coding into words after it.
const READ_BATCH_ROWS: usize = 1 << 16;

/// One part of a table: a Parquet file (or byte range of one, with the
/// row groups it was cut to, see [`super::row_groups`]) or a `MemTable`
/// partition. A table has a few parts, one per file or byte range, so the
/// file's description is kept inline rather than boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum Part {
    File(PartitionedFile, Option<RowGroups>),
    Memory(Arc<Vec<RecordBatch>>),
}

impl TableSource {
    /// The table's rows, where known without reading it: a `MemTable`'s
    /// counted from its batches, files' from the statistics of `scan`,
    /// the table's own scan node (their footers; a node above it would
    /// give its own estimate). (A `MemTable`'s statistics weigh every
    /// array of every batch, thousands of them at a large table's 8,192
    /// rows a batch.)
    pub fn rows(&self, scan: &dyn ExecutionPlan) -> Option<usize> {
        match self {
            TableSource::Memory(partitions) => Some(
                partitions
                    .batches()
                    .iter()
                    .flat_map(|batches| batches.iter())
                    .map(RecordBatch::num_rows)
                    .sum(),
            ),
            TableSource::Parquet { .. } => StatisticsContext::new()
                .compute(scan, &StatisticsArgs::new())
                .ok()
                .and_then(|statistics| statistics.num_rows.get_value().copied()),
        }
    }

    /// The table's parts, in groups of about the same size (the scan's
    /// partitions), each read by one task in turn.
    pub fn part_groups(&self) -> Vec<Vec<Part>> {
        match self {
            TableSource::Parquet { groups, .. } => groups
                .iter()
                .map(|files| files.iter().map(|file| Part::File(file.clone(), None)).collect())
                .collect(),
            TableSource::Memory(partitions) => partitions
                .shared()
                .iter()
                .map(|batches| vec![Part::Memory(Arc::clone(batches))])
                .collect(),
        }
    }

    /// The parts of group `index` (partition `index` of the scan), if any.
    pub fn part_group(&self, index: usize) -> Option<Vec<Part>> {
        match self {
            TableSource::Parquet { groups, .. } => groups
                .get(index)
                .map(|files| files.iter().map(|file| Part::File(file.clone(), None)).collect()),
            TableSource::Memory(partitions) => partitions
                .shared()
                .get(index)
                .map(|batches| vec![Part::Memory(Arc::clone(batches))]),
        }
    }

    /// What the table is, for `EXPLAIN`.
    pub fn describe(&self) -> String {
        match self {
            TableSource::Parquet { .. } => format!("parquet, {} files or ranges", self.part_count()),
            TableSource::Memory(partitions) => {
                format!("memory, {} partitions", partitions.batches().len())
            }
        }
    }

    /// How many groups of parts the table has (the scan's partitions).
    pub fn group_count(&self) -> usize {
        match self {
            TableSource::Parquet { groups, .. } => groups.len(),
            TableSource::Memory(partitions) => partitions.batches().len(),
        }
    }

    /// How many parts the table has.
    pub fn part_count(&self) -> usize {
        match self {
            TableSource::Parquet { groups, .. } => groups.iter().map(Vec::len).sum(),
            TableSource::Memory(partitions) => partitions.batches().len(),
        }
    }
}

impl Part {
    /// Which part this is, for the trace: a file's name and byte range, or
    /// a `MemTable` partition's rows.
    pub fn describe(&self) -> String {
        match self {
            Part::File(file, row_groups) => {
                let name = file.object_meta.location.filename().unwrap_or_default();
                match (row_groups, &file.range) {
                    (Some(groups), _) => format!("{name} {}", groups.describe()),
                    (None, Some(r)) => format!("{name}:{}..{}", r.start, r.end),
                    (None, None) => name.to_string(),
                }
            }
            Part::Memory(batches) => {
                let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
                format!("a partition of {rows} rows")
            }
        }
    }

    /// The cache key of table column `table_index` (`field`) of this part:
    /// what identifies its data. A file by its store, path, size,
    /// modification time, e-tag and version, and the byte range read; a
    /// `MemTable` partition by the identity of its batches' arrays, which
    /// the cache entry holds so that they cannot be freed and their
    /// addresses reused.
    pub fn column_key(&self, url: &str, table_index: usize, field: &Field) -> String {
        let column = format!("{table_index}:{}:{}", field.name(), field.data_type());
        match self {
            Part::File(..) => format!("{}|{column}", self.fill_key(url)),
            Part::Memory(batches) => {
                let mut key = String::from("memory|");
                for batch in batches.iter() {
                    let array = batch.column(table_index);
                    key.push_str(&format!(
                        "{:p}+{}.{};",
                        Arc::as_ptr(array) as *const u8,
                        array.offset(),
                        array.len()
                    ));
                }
                key.push_str(&column);
                key
            }
        }
    }

    /// What identifies the part's data, whatever its columns (see
    /// [`Self::column_key`]): one fill of it at a time
    /// ([`super::fill_lock::fill_guard`]).
    pub fn fill_key(&self, url: &str) -> String {
        match self {
            Part::File(file, _) => {
                let meta = &file.object_meta;
                format!(
                    "parquet|{url}|{}|{}|{}|{:?}|{:?}|{:?}",
                    meta.location,
                    meta.size,
                    meta.last_modified.timestamp_nanos_opt().unwrap_or_default(),
                    meta.e_tag,
                    meta.version,
                    file.range.as_ref().map(|r| (r.start, r.end)),
                )
            }
            Part::Memory(batches) => {
                let mut key = String::from("memory|");
                for batch in batches.iter() {
                    if let Some(array) = batch.columns().first() {
                        key.push_str(&format!("{:p}+{};", Arc::as_ptr(array) as *const u8, array.len()));
                    }
                }
                key
            }
        }
    }

    /// About how many rows the part holds, so that its words are sized
    /// once ([`Self::rows_estimate`]); 0 where the file has no statistics.
    pub fn rows_hint(&self) -> usize {
        self.rows_estimate().unwrap_or(0)
    }

    /// About how many rows the part holds: a `MemTable` partition's rows;
    /// a file's rows from its statistics in proportion to the byte range
    /// read, and an eighth more (a range holds whole row groups, which need
    /// not split evenly by bytes); `None` where the file has no statistics.
    pub fn rows_estimate(&self) -> Option<usize> {
        match self {
            Part::Memory(batches) => Some(batches.iter().map(RecordBatch::num_rows).sum()),
            Part::File(_, Some(groups)) => Some(groups.rows),
            Part::File(file, None) => {
                let rows = file
                    .statistics
                    .as_ref()
                    .and_then(|s| s.num_rows.get_value().copied())?;
                let size = file.object_meta.size as f64;
                let share = match &file.range {
                    Some(range) if size > 0.0 => {
                        ((range.end - range.start) as f64 / size).clamp(0.0, 1.0)
                    }
                    _ => 1.0,
                };
                Some((rows as f64 * share * 1.125).ceil() as usize)
            }
        }
    }

    /// Host arrays that a cached column of this part keeps alive (see
    /// [`Self::column_key`]).
    pub fn keep_alive(&self, table_index: usize) -> Vec<ArrayRef> {
        match self {
            Part::File(..) => Vec::new(),
            Part::Memory(batches) => batches
                .iter()
                .map(|b| Arc::clone(b.column(table_index)))
                .collect(),
        }
    }

    /// Every row of table columns `table_columns` of this part, one list of
    /// arrays per column, of the table's types.
    pub async fn read(
        &self,
        source: &TableSource,
        table_columns: &[usize],
        context: Arc<TaskContext>,
    ) -> Result<Vec<Vec<ArrayRef>>> {
        let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); table_columns.len()];
        let mut batches = self.batches_of(source, table_columns, context, READ_BATCH_ROWS)?;
        while let Some(batch) = batches.next().await {
            for (column, array) in columns.iter_mut().zip(batch?) {
                column.push(array);
            }
        }
        Ok(columns)
    }

    /// Every row of table columns `table_columns` of this part, a batch at
    /// a time (one array per column), to fill the cache: as the scan would
    /// read them, but for a file's short decimals, read in 64 bits where the
    /// file stores them as the table declares them, and its string columns
    /// `coded` (the fill codes them), read as dictionaries where the file
    /// stores them as strings ([`read_types`]).
    pub fn batches(
        &self,
        source: &TableSource,
        table_columns: &[usize],
        coded: &[usize],
        context: Arc<TaskContext>,
    ) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
        self.stream(source, table_columns, context, READ_BATCH_ROWS, Some(coded))
    }

    /// Every row of table columns `table_columns` of this part, of the
    /// table's types, in batches of `batch_rows` rows (a `MemTable`
    /// partition's batches as they are).
    pub fn batches_of(
        &self,
        source: &TableSource,
        table_columns: &[usize],
        context: Arc<TaskContext>,
        batch_rows: usize,
    ) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
        self.stream(source, table_columns, context, batch_rows, None)
    }

    fn stream(
        &self,
        source: &TableSource,
        table_columns: &[usize],
        context: Arc<TaskContext>,
        batch_rows: usize,
        // Whether the part is read narrower to fill the cache, and the
        // string columns that fill codes.
        narrow: Option<&[usize]>,
    ) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
        let (file, url, source) = match (self, source) {
            (Part::Memory(batches), _) => {
                let columns: Vec<Result<Vec<ArrayRef>>> = batches
                    .iter()
                    .map(|b| Ok(table_columns.iter().map(|&c| Arc::clone(b.column(c))).collect()))
                    .collect();
                return Ok(futures::stream::iter(columns).boxed());
            }
            (Part::File(file, _), TableSource::Parquet { url, source, .. }) => (file, url, source),
            (Part::File(..), TableSource::Memory(_)) => {
                return Err(DataFusionError::Internal("a file part of a memory table".into()))
            }
        };
        let parquet = source
            .file_source()
            .downcast_ref::<ParquetSource>()
            .ok_or_else(|| DataFusionError::Internal("a Parquet part of another scan".into()))?;
        let read = FileRead {
            url: url.clone(),
            options: parquet.table_parquet_options().clone(),
            reader_factory: parquet.parquet_file_reader_factory().cloned(),
            expr_adapter: source.expr_adapter_factory.clone(),
            table_columns: table_columns.to_vec(),
            batch_rows,
        };
        let table = parquet.table_schema().clone();
        let coded = match narrow {
            Some(coded) if read_types::may_narrow(&table, table_columns, coded) => coded.to_vec(),
            _ => return read.rows(table, file.clone(), context),
        };
        // The file's own schema (its footer, from DataFusion's metadata
        // cache where the scan or the statistics read it), for the types
        // the reader is asked for: a file that differs from the table, or
        // whose footer cannot be read here, is read as the table's.
        let Ok(store) = context.runtime_env().object_store(url) else {
            return read.rows(table, file.clone(), context);
        };
        let footers = context.runtime_env().cache_manager.get_file_metadata_cache();
        let file = file.clone();
        Ok(futures::stream::once(async move {
            let own = DFParquetMetadata::new(store.as_ref(), &file.object_meta)
                .with_file_metadata_cache(Some(footers))
                .with_page_index_policy(Some(PageIndexPolicy::Skip))
                .fetch_schema()
                .await;
            let Some((narrow_table, own_narrow)) =
                own.ok().and_then(|own| read_types::narrowed_for_file(&table, &own, &coded))
            else {
                return read.rows(table, file, context);
            };
            let narrow_file = file.clone().with_arrow_schema(own_narrow);
            let mut narrow = read.rows(narrow_table, narrow_file, Arc::clone(&context))?.fuse();
            // A type the reader cannot give it (its error comes as it opens
            // the file, before any row): read as the table's.
            match narrow.next().await {
                Some(Err(e)) => {
                    let part = Part::File(file.clone(), None).describe();
                    trace::event(|| format!("{part}: read as the table's types ({e})"));
                    read.rows(table, file, context)
                }
                first => Ok(futures::stream::iter(first).chain(narrow).boxed()),
            }
        })
        .try_flatten()
        .boxed())
    }
}

/// What reading a Parquet part takes: the scan's options, but neither its
/// predicate nor its projection (every row of the columns asked for).
struct FileRead {
    url: ObjectStoreUrl,
    options: TableParquetOptions,
    reader_factory: Option<Arc<dyn ParquetFileReaderFactory>>,
    expr_adapter: Option<Arc<dyn PhysicalExprAdapterFactory>>,
    table_columns: Vec<usize>,
    batch_rows: usize,
}

impl FileRead {
    /// The rows of `file` read as a table of `table`'s columns.
    fn rows(
        &self,
        table: TableSchema,
        file: PartitionedFile,
        context: Arc<TaskContext>,
    ) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
        let mut fresh = ParquetSource::new(table).with_table_parquet_options(self.options.clone());
        if let Some(factory) = &self.reader_factory {
            fresh = fresh.with_parquet_file_reader_factory(Arc::clone(factory));
        }
        let config = FileScanConfigBuilder::new(self.url.clone(), Arc::new(fresh))
            .with_file_group(FileGroup::new(vec![file]))
            .with_expr_adapter(self.expr_adapter.clone())
            .with_batch_size(Some(self.batch_rows))
            .with_projection_indices(Some(self.table_columns.clone()))?
            .build();
        let scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        Ok(scan
            .execute(0, context)?
            .map(|batch| batch.map(|b| b.columns().to_vec()))
            .boxed())
    }
}

pub(crate) fn source_url(source: &TableSource) -> String {
    match source {
        TableSource::Parquet { url, .. } => url.as_str().to_owned(),
        TableSource::Memory(_) => String::new(),
    }
}

/// Cache keys of string columns found to hold more distinct values in a
/// part than the device codes: a property of the data the key names.
static UNCODABLE: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

/// Keys remembered at most (a `MemTable`'s keys outlive its data; past
/// this the set starts again).
const UNCODABLE_KEYS: usize = 100_000;

pub(crate) fn remember_uncodable(key: &str) {
    let mut keys = UNCODABLE.lock().unwrap_or_else(|p| p.into_inner());
    if keys.len() >= UNCODABLE_KEYS {
        keys.clear();
    }
    keys.insert(key.to_owned());
}

/// Whether the column of a part cached under `key` was found too varied to
/// code (see [`remember_uncodable`]).
pub(crate) fn is_uncodable(key: &str) -> bool {
    UNCODABLE.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
}

/// The string columns of `fields` (their indices in it) that a part of
/// `source` was found to hold too many distinct values of to code on the
/// device: a plan reads them as their bytes where it can, and stays
/// DataFusion's where it cannot, rather than read the parts twice.
pub(crate) fn uncodable_columns(source: &TableSource, fields: &[(usize, Field)]) -> Vec<usize> {
    let strings: Vec<usize> = (0..fields.len())
        .filter(|&i| word_kind(fields[i].1.data_type()) == Some(WordKind::Code))
        .collect();
    if strings.is_empty() {
        return Vec::new();
    }
    let keys = UNCODABLE.lock().unwrap_or_else(|p| p.into_inner());
    if keys.is_empty() {
        return Vec::new();
    }
    let url = source_url(source);
    let parts: Vec<Part> = source.part_groups().into_iter().flatten().collect();
    strings
        .into_iter()
        .filter(|&i| {
            let (table_index, field) = &fields[i];
            parts
                .iter()
                .any(|part| keys.contains(&part.column_key(&url, *table_index, field)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Schema};
    use datafusion::common::stats::Precision;
    use datafusion::common::Statistics;

    fn file_of(rows: Option<usize>) -> PartitionedFile {
        let file = PartitionedFile::new("t/part-0.parquet", 1_000);
        match rows {
            Some(rows) => {
                let schema = Schema::new(vec![Field::new("a", DataType::Int64, true)]);
                let statistics = Statistics::new_unknown(&schema).with_num_rows(Precision::Exact(rows));
                file.with_statistics(Arc::new(statistics))
            }
            None => file,
        }
    }

    #[test]
    fn a_parts_rows_are_guessed_from_its_statistics_and_range() {
        // A whole file: its rows and an eighth more.
        assert_eq!(Part::File(file_of(Some(8_000)), None).rows_hint(), 9_000);
        // A quarter of its bytes: a quarter of its rows, and an eighth more.
        let quarter = file_of(Some(8_000)).with_range(250, 500);
        assert_eq!(Part::File(quarter, None).rows_hint(), 2_250);
        // A range past the file's end holds no more than the file.
        let beyond = file_of(Some(8_000)).with_range(0, 4_000);
        assert_eq!(Part::File(beyond, None).rows_hint(), 9_000);
        // No statistics: no guess.
        assert_eq!(Part::File(file_of(None), None).rows_hint(), 0);
        assert_eq!(Part::File(file_of(None), None).rows_estimate(), None);
        assert_eq!(Part::File(file_of(Some(8_000)), None).rows_estimate(), Some(9_000));
        // A MemTable partition's rows exactly.
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let batch = |n: i64| {
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(0..n))])
                .unwrap()
        };
        assert_eq!(Part::Memory(Arc::new(vec![batch(3), batch(0), batch(5)])).rows_hint(), 8);
    }

    /// An empty folder of this process and test thread, named by `label`.
    fn empty_dir(label: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "datafusion-gpu-{label}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes `columns` (name, type, nullable, values) to `dir`/`name`.parquet.
    fn write_file(dir: &std::path::Path, name: &str, columns: Vec<(&str, DataType, bool, ArrayRef)>) {
        use datafusion::parquet::arrow::ArrowWriter;
        let fields: Vec<Field> = columns.iter().map(|(n, t, null, _)| Field::new(*n, t.clone(), *null)).collect();
        let schema = Arc::new(Schema::new(fields));
        let arrays = columns.into_iter().map(|(_, _, _, a)| a).collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap();
        let file = std::fs::File::create(dir.join(format!("{name}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// Decimals of `scale` digits after the point, of 15 digits.
    fn decimals(values: &[Option<i64>], scale: i8) -> ArrayRef {
        use datafusion::arrow::array::Decimal128Array;
        let values: Vec<Option<i128>> = values.iter().map(|v| v.map(i128::from)).collect();
        Arc::new(Decimal128Array::from(values).with_precision_and_scale(15, scale).unwrap())
    }

    /// Table `t` over `dir` (of `schema` where given), the arrays of each of
    /// its parts as the cache fill reads them (`price`, `qty`), file by
    /// file, and the prices DataFusion's own scan reads, as text.
    async fn parts_as_filled(
        dir: &std::path::Path,
        schema: Option<&Schema>,
    ) -> (Vec<(String, Vec<ArrayRef>)>, Vec<String>) {
        use datafusion::prelude::{ParquetReadOptions, SessionContext};
        let ctx = SessionContext::new();
        let mut options = ParquetReadOptions::default();
        if let Some(schema) = schema {
            options = options.schema(schema);
        }
        ctx.register_parquet("t", dir.to_str().unwrap(), options).await.unwrap();
        let sql = "SELECT price, qty FROM t";
        let scan = scan_of(&ctx, sql).await;
        let (source, columns) =
            super::super::table_source(scan.downcast_ref::<DataSourceExec>().unwrap()).unwrap().unwrap();
        let table_columns: Vec<usize> = columns.iter().map(|c| c.table_index).collect();
        let mut read = Vec::new();
        let table_types: Vec<DataType> = scan.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        for part in source.part_groups().into_iter().flatten() {
            // The host's read (a part filtered by DataFusion's expressions)
            // keeps the table's types.
            let on_host = part.read(&source, &table_columns, ctx.task_ctx()).await.unwrap();
            for (pieces, table_type) in on_host.iter().zip(&table_types) {
                assert!(pieces.iter().all(|a| a.data_type() == table_type), "{table_type}");
            }
            let mut batches = part.batches(&source, &table_columns, &[], ctx.task_ctx()).unwrap();
            let mut pieces: Vec<Vec<ArrayRef>> = vec![Vec::new(); table_columns.len()];
            while let Some(batch) = batches.next().await {
                for (column, array) in pieces.iter_mut().zip(batch.unwrap()) {
                    column.push(array);
                }
            }
            let arrays = pieces
                .into_iter()
                .map(|pieces| {
                    let pieces: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                    datafusion::arrow::compute::concat(&pieces).unwrap()
                })
                .collect();
            read.push((part.describe(), arrays));
        }
        read.sort_by(|a, b| a.0.cmp(&b.0));
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let prices: Vec<String> = batches.iter().flat_map(|b| decimal_text(b.column(0))).collect();
        (read, prices)
    }

    /// `array` (a decimal array of 64 or 128 bits) as text, as its type
    /// would print it.
    fn decimal_text(array: &ArrayRef) -> Vec<String> {
        use datafusion::arrow::array::AsArray;
        let text = datafusion::arrow::compute::cast(array, &DataType::Utf8).unwrap();
        text.as_string::<i32>().iter().map(|v| v.unwrap_or("NULL").to_string()).collect()
    }

    #[tokio::test]
    async fn short_decimals_stored_as_the_table_declares_are_filled_in_64_bits() {
        let dir = empty_dir("read-types");
        // a.parquet's price has no NULLs and says so; b.parquet's may (the
        // table's may: the files' schemas merged). Each is read by its own
        // schema: both in 64 bits.
        let prices = [vec![Some(-12_345i64), Some(7), Some(i64::from(i32::MAX) + 9)], vec![
            Some(1),
            None,
            Some(-99_999_999_999),
        ]];
        for (name, (values, nullable)) in ["a", "b"].iter().zip(prices.iter().zip([false, true])) {
            let qty: ArrayRef = Arc::new(Int64Array::from_iter_values(0..values.len() as i64));
            write_file(&dir, name, vec![
                ("price", DataType::Decimal128(15, 2), nullable, decimals(values, 2)),
                ("qty", DataType::Int64, false, qty),
            ]);
        }
        let (read, _) = parts_as_filled(&dir, None).await;
        assert_eq!(read.len(), 2, "one part a file: {:?}", read.iter().map(|r| &r.0).collect::<Vec<_>>());
        for ((name, arrays), values) in read.iter().zip(&prices) {
            assert_eq!(arrays[0].data_type(), &DataType::Decimal64(15, 2), "{name}");
            let expected = decimal_text(&decimals(values, 2));
            assert_eq!(decimal_text(&arrays[0]), expected, "{name}");
            assert_eq!(arrays[1].data_type(), &DataType::Int64);
            assert_eq!(arrays[1].len(), values.len());
        }

        // A table declared at scale 2 over a file that stores scale 4:
        // the file's values are cast to the table's type as DataFusion
        // casts them, not read as if they were of the table's scale.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stored = [Some(123_456i64), None, Some(-7_000_000)];
        let qty: ArrayRef = Arc::new(Int64Array::from_iter_values(0..3));
        write_file(&dir, "c", vec![
            ("price", DataType::Decimal128(15, 4), true, decimals(&stored, 4)),
            ("qty", DataType::Int64, false, qty),
        ]);
        let declared = Schema::new(vec![
            Field::new("price", DataType::Decimal128(15, 2), true),
            Field::new("qty", DataType::Int64, false),
        ]);
        let (read, answer) = parts_as_filled(&dir, Some(&declared)).await;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(read.len(), 1);
        let price = &read[0].1[0];
        assert_eq!(price.data_type(), &DataType::Decimal128(15, 2), "cast by DataFusion");
        assert_eq!(decimal_text(price), answer, "as DataFusion's scan reads them");
        assert_eq!(answer[1], "NULL");
        assert!(answer[0].starts_with("12.3") && answer[2] == "-700.00", "{answer:?}");
    }

    /// The scan of `sql`'s only table in `ctx`.
    async fn scan_of(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        let mut node = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        while node.downcast_ref::<DataSourceExec>().is_none() {
            node = Arc::clone(node.children()[0]);
        }
        node
    }

    /// A session with `m`, a `MemTable` of nullable `Int64` `columns`, each
    /// partition's batches of the given row counts (every column `0..rows`).
    fn session_with_memtable(columns: &[&str], partitions: &[&[i64]]) -> datafusion::prelude::SessionContext {
        let fields: Vec<Field> = columns.iter().map(|c| Field::new(*c, DataType::Int64, true)).collect();
        let schema = Arc::new(Schema::new(fields));
        let batch = |n: i64| {
            let values: Vec<ArrayRef> = (0..columns.len())
                .map(|_| Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef)
                .collect();
            RecordBatch::try_new(Arc::clone(&schema), values).unwrap()
        };
        let partitions = partitions.iter().map(|rows| rows.iter().map(|&n| batch(n)).collect()).collect();
        let table = datafusion::datasource::MemTable::try_new(Arc::clone(&schema), partitions).unwrap();
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("m", Arc::new(table)).unwrap();
        ctx
    }

    #[tokio::test]
    async fn a_tables_rows_are_counted_as_datafusion_counts_them() {
        use datafusion::prelude::ParquetReadOptions;
        // Partitions of several batches, an empty batch and an empty partition.
        let ctx = session_with_memtable(&["a", "b"], &[&[3, 0, 5], &[], &[7]]);
        let scan = scan_of(&ctx, "SELECT b FROM m").await;
        let data_source = scan.downcast_ref::<DataSourceExec>().unwrap();
        let (source, columns) = super::super::table_source(data_source).unwrap().unwrap();
        let checked = super::super::table_scan_columns(data_source).unwrap().unwrap();
        let indices = |columns: &[super::super::ScanColumn]| -> Vec<usize> {
            columns.iter().map(|c| c.table_index).collect()
        };
        assert_eq!(indices(&checked), indices(&columns), "the check finds the columns the source reads");
        assert_eq!(indices(&columns), vec![1]);
        let statistics = StatisticsContext::new()
            .compute(scan.as_ref(), &StatisticsArgs::new())
            .unwrap();
        assert_eq!(source.rows(scan.as_ref()), Some(15));
        assert_eq!(statistics.num_rows.get_value().copied(), Some(15));

        // Files: their footers' rows.
        let dir = empty_dir("table-rows");
        for (name, rows) in [("a", 4), ("b", 9)] {
            let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
            write_file(&dir, name, vec![("v", DataType::Int64, false, values)]);
        }
        ctx.register_parquet("f", dir.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        let scan = scan_of(&ctx, "SELECT v FROM f").await;
        let data_source = scan.downcast_ref::<DataSourceExec>().unwrap();
        let (source, _) = super::super::table_source(data_source).unwrap().unwrap();
        assert_eq!(source.rows(scan.as_ref()), Some(13));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_memtables_parts_are_its_scans_batches_taken_once_for_every_task() {
        let ctx = session_with_memtable(&["a"], &[&[3, 5], &[], &[7]]);
        let scan = scan_of(&ctx, "SELECT a FROM m").await;
        let data_source = scan.downcast_ref::<DataSourceExec>().unwrap();
        let (source, _) = super::super::table_source(data_source).unwrap().unwrap();
        assert_eq!((source.group_count(), source.part_count()), (3, 3));
        assert_eq!(source.describe(), "memory, 3 partitions");
        assert_eq!(source.rows(scan.as_ref()), Some(15));

        // Each group is one part, the scan's partition: its batches, the
        // same arrays.
        use datafusion::datasource::memory::MemorySourceConfig;
        let memory = data_source.data_source().downcast_ref::<MemorySourceConfig>().unwrap();
        // A task's clone, made before any part was taken.
        let task = source.clone();
        let groups = source.part_groups();
        assert_eq!(groups.len(), 3);
        for (group, batches) in groups.iter().zip(memory.partitions()) {
            let [Part::Memory(taken)] = group.as_slice() else {
                panic!("a group of one memory part");
            };
            assert_eq!(taken.len(), batches.len());
            for (taken, batch) in taken.iter().zip(batches) {
                assert!(Arc::ptr_eq(taken.column(0), batch.column(0)));
            }
        }
        // Taken once: the task's clone and a later call share the lists.
        let again = task.part_group(2).unwrap();
        match (&groups[2][0], &again[0]) {
            (Part::Memory(first), Part::Memory(second)) => assert!(Arc::ptr_eq(first, second)),
            _ => panic!("memory parts"),
        }
        assert!(source.part_group(3).is_none());
    }

    #[tokio::test]
    async fn string_columns_the_fill_codes_are_read_as_dictionaries_and_code_as_their_strings() {
        use crate::encode::table_words::WordsBuilder;
        use datafusion::arrow::array::{AsArray, StringArray};
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::file::properties::WriterProperties;
        use datafusion::prelude::{ParquetReadOptions, SessionContext};
        let dir = empty_dir("coded-strings");
        let rows = 5_000usize;
        let mode: ArrayRef = Arc::new(StringArray::from_iter(
            (0..rows).map(|i| (i % 11 != 3).then(|| ["MAIL", "SHIP", "a mode longer than twelve bytes"][i * 7 % 3])),
        ));
        // 700 distinct values: past the dictionary page's limit, so the
        // writer falls back to plain pages, which the reader still hands
        // on as a dictionary.
        let tag: ArrayRef = Arc::new(StringArray::from_iter_values((0..rows).map(|i| format!("tag {}", i % 700))));
        let qty: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
        let schema = Arc::new(Schema::new(vec![
            Field::new("mode", DataType::Utf8, true),
            Field::new("tag", DataType::Utf8, false),
            Field::new("qty", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![mode, tag, qty]).unwrap();
        // Row groups of 1,500 rows: four dictionaries a column.
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1_500))
            .set_dictionary_page_size_limit(512)
            .build();
        let file = std::fs::File::create(dir.join("a.parquet")).unwrap();
        let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let ctx = SessionContext::new();
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        let sql = "SELECT mode, tag, qty FROM t";
        let scan = scan_of(&ctx, sql).await;
        let (source, columns) =
            super::super::table_source(scan.downcast_ref::<DataSourceExec>().unwrap()).unwrap().unwrap();
        let table_columns: Vec<usize> = columns.iter().map(|c| c.table_index).collect();
        let table_types: Vec<DataType> = scan.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        assert_eq!(table_types[0], DataType::Utf8View, "DataFusion reads strings as views");
        let parts: Vec<Part> = source.part_groups().into_iter().flatten().collect();
        let read = |coded: Vec<usize>| {
            let (source, table_columns, ctx) = (source.clone(), table_columns.clone(), ctx.task_ctx());
            let parts = parts.clone();
            async move {
                let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); table_columns.len()];
                for part in &parts {
                    let mut batches = part.batches(&source, &table_columns, &coded, Arc::clone(&ctx)).unwrap();
                    while let Some(batch) = batches.next().await {
                        for (column, array) in columns.iter_mut().zip(batch.unwrap()) {
                            column.push(array);
                        }
                    }
                }
                columns
            }
        };
        let as_read = read(vec![]).await;
        let as_coded = read(vec![table_columns[0], table_columns[1]]).await;
        let _ = std::fs::remove_dir_all(&dir);
        let dictionary = read_types::coded_string_read_type();
        for (c, table_type) in table_types.iter().enumerate() {
            assert!(as_read[c].iter().all(|a| a.data_type() == table_type), "{c}: the table's type");
            let expected = match c {
                2 => table_type,
                _ => &dictionary,
            };
            assert!(as_coded[c].iter().all(|a| a.data_type() == expected), "{c}: read as {expected}");
            let rows_read: usize = as_coded[c].iter().map(|a| a.len()).sum();
            assert_eq!(rows_read, rows);
        }
        // The words the fill makes of them are those of the strings.
        for c in 0..2 {
            let words = |pieces: &[ArrayRef]| {
                let mut builder = WordsBuilder::with_rows_hint(&table_types[c], rows).unwrap();
                assert!(pieces.iter().all(|piece| builder.push(piece)));
                builder.finish()
            };
            let (from_strings, from_dictionaries) = (words(&as_read[c]), words(&as_coded[c]));
            assert_eq!(from_strings.values.bytes(), from_dictionaries.values.bytes(), "column {c}");
            assert_eq!(from_strings.validity, from_dictionaries.validity, "column {c}");
            let values = |w: &crate::encode::table_words::HostWords| {
                let d = w.dictionary.as_ref().unwrap();
                d.as_string_view().iter().map(|v| v.map(str::to_owned)).collect::<Vec<_>>()
            };
            assert_eq!(values(&from_strings), values(&from_dictionaries), "column {c}");
            assert_eq!(values(&from_strings).len(), [3, 700][c]);
        }
    }
}
