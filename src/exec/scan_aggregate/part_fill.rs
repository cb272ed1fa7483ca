//! A part's missing columns pushed from the batches read into their host
//! form: from one read of every column, or, where the part is read whole
//! by one task and holds string columns, from reads of its columns apart,
//! side by side, each string column by a task of its own and the
//! fixed-width columns together by one more (`gpu.tuning.read_columns_apart`).
//!
//! A table of few row groups (a row group a file, as DataFusion's writer
//! makes TPC-H's `customer`, `part` and `supplier` at SF 10) is read by as
//! many tasks as it has row groups, whatever the host's cores, and its
//! string columns take most of a part's reading and coding: names,
//! addresses and comments of hundreds of thousands of rows. Read apart,
//! a part takes about as long as its largest column, not all of them, and
//! a scan waiting for such a table (a join's keys tested against it, its
//! rows the build side above) waits that much less. Each read is
//! DataFusion's over the same part with fewer columns, so every builder
//! gets every row of its column in the part's order, as from one read.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::ArrayRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use futures::future::Either;
use futures::stream::{BoxStream, FusedStream, FuturesUnordered, StreamExt};

use super::source::Part;
use super::TableSource;
use crate::encode::string_bytes::StringBytesBuilder;
use crate::encode::table_words::{HostWords, WordsBuilder};
use crate::exec::GpuScanMetrics;
use crate::gpu::WordKind;

/// A column's host form as a part is read: words (codes for strings), or a
/// string column's bytes.
pub(super) enum ColumnBuilder {
    Words(WordsBuilder),
    Bytes(StringBytesBuilder),
}

impl ColumnBuilder {
    pub(super) fn push(&mut self, piece: &ArrayRef) -> bool {
        match self {
            ColumnBuilder::Words(builder) => builder.push(piece),
            ColumnBuilder::Bytes(builder) => builder.push(piece),
        }
    }

    pub(super) fn finish(self) -> HostWords {
        match self {
            ColumnBuilder::Words(builder) => builder.finish(),
            ColumnBuilder::Bytes(builder) => builder.finish(),
        }
    }

    /// Whether a piece it refuses makes the column uncodable: a string
    /// column coded.
    pub(super) fn codes_strings(&self) -> bool {
        matches!(self, ColumnBuilder::Words(b) if b.kind() == WordKind::Code)
    }

}

/// What filling builders took (summed over the reads side by side), the
/// rows pushed into each builder, and the first builder (its index) that
/// refused a piece, where one did: the reading then stopped.
#[derive(Debug, Default)]
pub(super) struct Filled {
    pub(super) read: Duration,
    pub(super) coded: Duration,
    pub(super) rows: usize,
    pub(super) refused: Option<usize>,
}

/// Pushes every batch of `batches` (one array per builder, in order) into
/// `builders`, string columns coded first in each batch, so that one too
/// varied to code ends the read before the batch's other columns are
/// coded for nothing. Reading and coding are counted in `metrics`. The
/// stream is dropped when this returns (a part read in turn then no
/// longer counts as reading).
pub(super) async fn fill(
    mut batches: BoxStream<'static, Result<Vec<ArrayRef>>>,
    builders: &mut [ColumnBuilder],
    metrics: &GpuScanMetrics,
) -> Result<Filled> {
    let mut order: Vec<usize> = (0..builders.len()).collect();
    order.sort_by_key(|&b| !builders[b].codes_strings());
    let mut filled = Filled::default();
    loop {
        let reading = Instant::now();
        let Some(batch) = batches.next().await else {
            break;
        };
        filled.read += reading.elapsed();
        metrics.read_time.add_duration(reading.elapsed());
        let coding = Instant::now();
        let batch = batch?;
        if batch.len() != builders.len() {
            return Err(DataFusionError::Internal(format!(
                "a part's batch of {} columns for {} builders",
                batch.len(),
                builders.len()
            )));
        }
        filled.refused = order.iter().copied().find(|&b| !builders[b].push(&batch[b]));
        filled.rows += batch.first().map_or(0, |column| column.len());
        filled.coded += coding.elapsed();
        metrics.encode_time.add_duration(coding.elapsed());
        if filled.refused.is_some() {
            break;
        }
    }
    Ok(filled)
}

/// Bytes of a part's batches read and held, at most (the batch that
/// reaches it included), while its builders are still being made
/// ([`fill_as_made`]): a few of the batches a fill reads.
const MAX_HELD_BYTES: usize = 64 << 20;

/// [`fill`], with the builders still being made (`made`: the page-locked
/// room of large integer columns, which a process's first fills must lock,
/// the driver taking the locks in turn): the part's first batches are read
/// meanwhile and held, up to [`MAX_HELD_BYTES`], and pushed once the
/// builders come, so that the host's cores read rather than wait. The
/// builders are handed back with what was filled.
pub(super) async fn fill_as_made(
    batches: BoxStream<'static, Result<Vec<ArrayRef>>>,
    made: impl Future<Output = Result<Vec<ColumnBuilder>>>,
    metrics: &GpuScanMetrics,
) -> Result<(Vec<ColumnBuilder>, Filled)> {
    let mut batches = batches.fuse();
    let mut made = std::pin::pin!(made);
    let (mut held, mut held_bytes, mut read) = (Vec::new(), 0, Duration::ZERO);
    let mut builders = loop {
        if held_bytes >= MAX_HELD_BYTES || batches.is_terminated() {
            break made.as_mut().await?;
        }
        let reading = Instant::now();
        // `next` loses nothing where the builders come first and it is
        // dropped: the stream keeps what it was reading for the next poll.
        match futures::future::select(made.as_mut(), batches.next()).await {
            Either::Left((builders, _)) => break builders?,
            Either::Right((batch, _)) => {
                read += reading.elapsed();
                if let Some(batch) = batch {
                    let batch = batch?;
                    held_bytes += batch.iter().map(|column| column.get_array_memory_size()).sum::<usize>();
                    held.push(batch);
                }
            }
        }
    };
    metrics.read_time.add_duration(read);
    let rest = futures::stream::iter(held.into_iter().map(Ok)).chain(batches).boxed();
    let mut filled = fill(rest, &mut builders, metrics).await?;
    filled.read += read;
    Ok((builders, filled))
}

/// The groups (indices into a part's builders) its columns are read apart
/// in, where `holds_strings` marks the builders of string columns (coded
/// or kept as their bytes): each string column alone, the rest together;
/// `None` where that makes fewer than two groups (one read does).
pub(super) fn groups_apart(holds_strings: &[bool]) -> Option<Vec<Vec<usize>>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut fixed = Vec::new();
    for (b, &strings) in holds_strings.iter().enumerate() {
        match strings {
            true => groups.push(vec![b]),
            false => fixed.push(b),
        }
    }
    if !fixed.is_empty() {
        groups.push(fixed);
    }
    (groups.len() >= 2).then_some(groups)
}

/// What the reads apart of one part share.
pub(super) struct PartRead<'a> {
    pub(super) source: &'a TableSource,
    pub(super) part: &'a Part,
    /// The table column each builder fills.
    pub(super) table_columns: &'a [usize],
    /// The string columns (table column indices) read as dictionaries.
    pub(super) coded_strings: &'a [usize],
    pub(super) context: &'a Arc<TaskContext>,
    pub(super) metrics: &'a GpuScanMetrics,
}

/// Fills `builders` (one per column of `read.table_columns`) from reads of
/// the part's columns in `groups` ([`groups_apart`]), each a task of its
/// own, all at once. Returns the builders in their order and what filling
/// them took; on the first builder that refuses a piece, the reads left
/// are stopped (their tasks dropped) and the builders returned are those
/// the reads ended with (the caller drops them). Reads that end with
/// different numbers of rows (a file changed between them) are an error:
/// their columns would not line up.
pub(super) async fn fill_apart(
    read: PartRead<'_>,
    builders: Vec<ColumnBuilder>,
    groups: &[Vec<usize>],
) -> Result<(Vec<ColumnBuilder>, Filled)> {
    let count = builders.len();
    let mut slots: Vec<Option<ColumnBuilder>> = builders.into_iter().map(Some).collect();
    let mut tasks = FuturesUnordered::new();
    for (g, group) in groups.iter().enumerate() {
        let columns: Vec<usize> = group.iter().map(|&b| read.table_columns[b]).collect();
        let coded: Vec<usize> = read
            .coded_strings
            .iter()
            .copied()
            .filter(|c| columns.contains(c))
            .collect();
        let mut own: Vec<ColumnBuilder> = Vec::with_capacity(group.len());
        for &b in group {
            let builder = slots[b].take().ok_or_else(|| {
                DataFusionError::Internal(format!("column {b} of a part read apart twice"))
            })?;
            own.push(builder);
        }
        let (source, part) = (read.source.clone(), read.part.clone());
        let (context, metrics) = (Arc::clone(read.context), read.metrics.clone());
        let task = SpawnedTask::spawn(async move {
            let batches = part.batches(&source, &columns, &coded, context)?;
            let filled = fill(batches, &mut own, &metrics).await?;
            Ok::<_, DataFusionError>((own, filled))
        });
        tasks.push(async move { (g, task.join().await) });
    }
    let mut filled = Filled::default();
    // The rows of the reads ended so far, alike.
    let mut rows: Option<usize> = None;
    while let Some((g, joined)) = tasks.next().await {
        let (own, group_filled) = joined
            .map_err(|e| DataFusionError::Execution(format!("a read of a part's columns failed: {e}")))??;
        filled.read += group_filled.read;
        filled.coded += group_filled.coded;
        let group = &groups[g];
        if group_filled.refused.is_none() {
            match rows {
                None => rows = Some(group_filled.rows),
                Some(rows) if rows != group_filled.rows => {
                    return Err(DataFusionError::Execution(format!(
                        "the reads apart of {} gave {rows} and {} rows: was the file changed?",
                        read.part.describe(),
                        group_filled.rows
                    )))
                }
                Some(_) => {}
            }
        }
        for (&b, builder) in group.iter().zip(own) {
            slots[b] = Some(builder);
        }
        if let Some(refused) = group_filled.refused {
            // The reads left stop with their tasks, dropped here.
            filled.refused = Some(group[refused]);
            return Ok((slots.into_iter().flatten().collect(), filled));
        }
    }
    filled.rows = rows.unwrap_or(0);
    let builders: Vec<ColumnBuilder> = slots.into_iter().flatten().collect();
    if builders.len() != count {
        return Err(DataFusionError::Internal(
            "a part's columns read apart came back short".into(),
        ));
    }
    Ok((builders, filled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Decimal128Array, Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};

    const ROWS: usize = 20_000;

    /// A file of one row group: `i` (Int64, every seventh row NULL),
    /// `name` (a string a row, every eleventh NULL), `code` (three strings
    /// and NULLs), `d` (Decimal128(15, 2)), as one part of a table, with the
    /// table's types of its four columns.
    async fn a_file_of_one_row_group(name: &str) -> (TableSource, Part, Vec<DataType>, Arc<TaskContext>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("datafusion-gpu-part-fill-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("code", DataType::Utf8, true),
            Field::new("d", DataType::Decimal128(15, 2), false),
        ]));
        let i = Int64Array::from_iter((0..ROWS as i64).map(|r| (r % 7 != 0).then_some(r * 31 - 5_000)));
        let names = StringArray::from_iter((0..ROWS).map(|r| (r % 11 != 0).then(|| format!("customer #{r:09} of many"))));
        let codes = StringArray::from_iter((0..ROWS).map(|r| ["A", "BB", "", "x"].get(r % 5).copied()));
        let d = Decimal128Array::from_iter_values((0..ROWS as i128).map(|r| r * 97 - 123_456))
            .with_precision_and_scale(15, 2)
            .unwrap();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(i), Arc::new(names), Arc::new(codes), Arc::new(d)],
        )
        .unwrap();
        let file = std::fs::File::create(dir.join("t.parquet")).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        let mut scan = ctx.sql("SELECT * FROM t").await.unwrap().create_physical_plan().await.unwrap();
        while scan.downcast_ref::<DataSourceExec>().is_none() {
            scan = Arc::clone(scan.children()[0]);
        }
        let types: Vec<DataType> = scan.schema().fields().iter().map(|f| f.data_type().clone()).collect();
        let (source, _) = super::super::table_source(scan.downcast_ref::<DataSourceExec>().unwrap()).unwrap().unwrap();
        let parts: Vec<Part> = source.part_groups().into_iter().flatten().collect();
        assert_eq!(parts.len(), 1, "one part");
        let part = parts.into_iter().next().unwrap();
        (source, part, types, ctx.task_ctx(), dir)
    }

    /// Builders of the four columns: `name` as its bytes or coded, `code`
    /// coded.
    fn builders(types: &[DataType], name_as_bytes: bool) -> Vec<ColumnBuilder> {
        let words = |t: &DataType| ColumnBuilder::Words(WordsBuilder::with_rows_hint(t, ROWS).unwrap());
        vec![
            words(&types[0]),
            match name_as_bytes {
                true => ColumnBuilder::Bytes(StringBytesBuilder::with_rows_hint(&types[1], ROWS).unwrap()),
                false => words(&types[1]),
            },
            words(&types[2]),
            words(&types[3]),
        ]
    }

    /// Which of `builders` hold strings, as [`groups_apart`] takes them.
    fn holds(builders: &[ColumnBuilder]) -> Vec<bool> {
        builders
            .iter()
            .map(|builder| matches!(builder, ColumnBuilder::Bytes(_)) || builder.codes_strings())
            .collect()
    }

    fn same_words(a: &HostWords, b: &HostWords, column: usize) {
        assert_eq!(a.rows, b.rows, "column {column}");
        assert_eq!(a.kind, b.kind, "column {column}");
        assert_eq!(a.values.bytes(), b.values.bytes(), "column {column}");
        assert_eq!(a.validity, b.validity, "column {column}");
        assert_eq!(a.bytes, b.bytes, "column {column}");
        assert_eq!(
            a.dictionary.as_ref().map(|d| d.to_data()),
            b.dictionary.as_ref().map(|d| d.to_data()),
            "column {column}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn columns_read_apart_make_the_words_one_read_makes() {
        let (source, part, types, context, dir) = a_file_of_one_row_group("apart").await;
        let metrics = GpuScanMetrics::new(&datafusion::physical_plan::metrics::ExecutionPlanMetricsSet::new(), 0);
        let table_columns = [0, 1, 2, 3];
        for dictionary_reads in [false, true] {
            let coded_strings: Vec<usize> = match dictionary_reads {
                true => vec![2],
                false => Vec::new(),
            };
            let mut together = builders(&types, true);
            let batches = part.batches(&source, &table_columns, &coded_strings, Arc::clone(&context)).unwrap();
            let filled = fill(batches, &mut together, &metrics).await.unwrap();
            assert_eq!((filled.refused, filled.rows), (None, ROWS));

            let apart = builders(&types, true);
            let groups = groups_apart(&holds(&apart)).unwrap();
            // Each string column alone, the fixed-width ones together.
            assert_eq!(groups, vec![vec![1], vec![2], vec![0, 3]]);
            let read = PartRead {
                source: &source,
                part: &part,
                table_columns: &table_columns,
                coded_strings: &coded_strings,
                context: &context,
                metrics: &metrics,
            };
            let (apart, filled) = fill_apart(read, apart, &groups).await.unwrap();
            assert_eq!((filled.refused, filled.rows), (None, ROWS));
            assert_eq!(apart.len(), 4);
            for (column, (a, b)) in together.into_iter().zip(apart).enumerate() {
                let (a, b) = (a.finish(), b.finish());
                assert_eq!(a.rows, ROWS, "column {column}");
                same_words(&a, &b, column);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_column_too_varied_to_code_read_apart_is_the_one_refused() {
        let (source, part, types, context, dir) = a_file_of_one_row_group("refused").await;
        let metrics = GpuScanMetrics::new(&datafusion::physical_plan::metrics::ExecutionPlanMetricsSet::new(), 0);
        let table_columns = [0, 1, 2, 3];
        // `name` coded: a string a row, past the codes a part may hold.
        let apart = builders(&types, false);
        assert!(apart[1].codes_strings());
        let groups = groups_apart(&holds(&apart)).unwrap();
        let read = PartRead {
            source: &source,
            part: &part,
            table_columns: &table_columns,
            coded_strings: &[1, 2],
            context: &context,
            metrics: &metrics,
        };
        let (_, filled) = fill_apart(read, apart, &groups).await.unwrap();
        assert_eq!(filled.refused, Some(1));
        // One read of every column refuses the same builder.
        let mut together = builders(&types, false);
        let batches = part.batches(&source, &table_columns, &[1, 2], Arc::clone(&context)).unwrap();
        assert_eq!(fill(batches, &mut together, &metrics).await.unwrap().refused, Some(1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Rows a batch of [`int_batches`] holds: a fill's batch.
    const BATCH_ROWS: usize = 1 << 16;

    /// `count` batches of two Int64 columns (the second NULL every ninth
    /// row, values past 4 bytes every fifth batch).
    fn int_batches(count: usize) -> Vec<Vec<ArrayRef>> {
        (0..count)
            .map(|b| {
                let base = (b * BATCH_ROWS) as i64;
                let wide = if b % 5 == 4 { 1i64 << 40 } else { 1 };
                let a: ArrayRef = Arc::new(Int64Array::from_iter_values((0..BATCH_ROWS as i64).map(|r| (base + r) * wide)));
                let n: ArrayRef =
                    Arc::new(Int64Array::from_iter((0..BATCH_ROWS as i64).map(|r| (r % 9 != 0).then_some(base - r))));
                vec![a, n]
            })
            .collect()
    }

    fn int_builders() -> Vec<ColumnBuilder> {
        (0..2)
            .map(|_| ColumnBuilder::Words(WordsBuilder::with_rows_hint(&DataType::Int64, BATCH_ROWS).unwrap()))
            .collect()
    }

    /// What one plain [`fill`] of `batches` makes.
    async fn filled_at_once(batches: Vec<Vec<ArrayRef>>, metrics: &GpuScanMetrics) -> Vec<HostWords> {
        let mut builders = int_builders();
        let stream = futures::stream::iter(batches.into_iter().map(Ok)).boxed();
        let filled = fill(stream, &mut builders, metrics).await.unwrap();
        assert_eq!(filled.refused, None);
        builders.into_iter().map(ColumnBuilder::finish).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_read_while_the_builders_are_made_are_held_up_to_a_limit_and_none_lost() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let metrics = GpuScanMetrics::new(&datafusion::physical_plan::metrics::ExecutionPlanMetricsSet::new(), 0);
        let batch_bytes: usize = int_batches(1)[0].iter().map(|column| column.get_array_memory_size()).sum();
        let held = MAX_HELD_BYTES.div_ceil(batch_bytes);
        let count = 2 * held + 3;
        let expected = filled_at_once(int_batches(count), &metrics).await;
        // Builders that come late, after an instant stream: the batches up
        // to the limit are read and held meanwhile, no more.
        let read = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&read);
        let stream = futures::stream::iter(int_batches(count).into_iter().map(Ok))
            .inspect(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .boxed();
        let read_at_arrival = Arc::new(AtomicUsize::new(usize::MAX));
        let (seen, arrival) = (Arc::clone(&read), Arc::clone(&read_at_arrival));
        let made = async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            arrival.store(seen.load(Ordering::SeqCst), Ordering::SeqCst);
            Ok(int_builders())
        };
        let (builders, filled) = fill_as_made(stream, made, &metrics).await.unwrap();
        assert_eq!(read_at_arrival.load(Ordering::SeqCst), held);
        assert_eq!((filled.refused, filled.rows), (None, count * BATCH_ROWS));
        for (column, (got, want)) in builders.into_iter().map(ColumnBuilder::finish).zip(&expected).enumerate() {
            same_words(&got, want, column);
        }

        // A slow stream whose reads the builders interrupt (a read dropped
        // half done), builders at once, and a stream that ends first: the
        // same words every time.
        let slow = || {
            futures::stream::iter(int_batches(7))
                .then(|batch| async move {
                    tokio::time::sleep(std::time::Duration::from_millis(4)).await;
                    Ok(batch)
                })
                .boxed()
        };
        let expected = filled_at_once(int_batches(7), &metrics).await;
        let late = async {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            Ok(int_builders())
        };
        let at_once = async { Ok(int_builders()) };
        let after_the_end = async {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Ok(int_builders())
        };
        let runs = [
            fill_as_made(slow(), late, &metrics).await.unwrap(),
            fill_as_made(slow(), at_once, &metrics).await.unwrap(),
            fill_as_made(slow(), after_the_end, &metrics).await.unwrap(),
        ];
        for (builders, filled) in runs {
            assert_eq!((filled.refused, filled.rows), (None, 7 * BATCH_ROWS));
            for (column, (got, want)) in builders.into_iter().map(ColumnBuilder::finish).zip(&expected).enumerate() {
                same_words(&got, want, column);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_while_the_builders_are_made_is_the_fills() {
        let metrics = GpuScanMetrics::new(&datafusion::physical_plan::metrics::ExecutionPlanMetricsSet::new(), 0);
        let mut batches: Vec<Result<Vec<ArrayRef>>> = int_batches(2).into_iter().map(Ok).collect();
        batches.push(Err(DataFusionError::Execution("the file went away".into())));
        let made = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Ok(int_builders())
        };
        let error = fill_as_made(futures::stream::iter(batches).boxed(), made, &metrics).await.err().expect("the read's error");
        assert!(error.to_string().contains("the file went away"), "{error}");
        // The builders' own error, with every batch read.
        let made = async { Err(DataFusionError::Internal("no builders".into())) };
        let batches = futures::stream::iter(int_batches(2).into_iter().map(Ok)).boxed();
        let error = fill_as_made(batches, made, &metrics).await.err().expect("the builders' error");
        assert!(error.to_string().contains("no builders"), "{error}");
    }

    #[test]
    fn fixed_width_columns_alone_are_read_together() {
        let words = |t: DataType| ColumnBuilder::Words(WordsBuilder::with_rows_hint(&t, 10).unwrap());
        assert_eq!(groups_apart(&holds(&[words(DataType::Int64), words(DataType::Float64)])), None);
        assert_eq!(groups_apart(&holds(&[words(DataType::Utf8View)])), None);
        assert_eq!(
            groups_apart(&holds(&[words(DataType::Utf8View), words(DataType::Int32)])),
            Some(vec![vec![0], vec![1]])
        );
    }
}
