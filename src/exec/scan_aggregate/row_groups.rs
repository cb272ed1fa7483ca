//! A Parquet part read in pieces of whole row groups, each by a task of
//! its own, so that the reading of a table into the cache is shared out
//! evenly among the host's cores.
//!
//! DataFusion splits a table's files into byte ranges, one group of them
//! a partition, each range holding the row groups that start in it. A
//! range holds whole row groups, so ranges of about the same bytes hold
//! different numbers of them (three in one, five in another), and the
//! range with the most, read by one task, ends long after the rest: cold,
//! the last part of a table is read alone on an otherwise idle host. A part
//! the cache misses where its table is read all at once (see
//! [`super::run::Reading`]) is therefore read in pieces of a few row groups
//! each (at least `gpu.tuning.min_part_rows` rows), every piece by a task
//! of its own, as many at once in the process as the host has cores, and
//! coded into the part's words in the part's order as the pieces come: the
//! part stays what the cache keeps and the scans read, only its reading is
//! shared.
//!
//! A piece is read as DataFusion reads a range: the range only narrowed to
//! start at its first row group's first page and end right after its last
//! row group's first page, so that exactly its row groups start in it (the
//! rule DataFusion's reader keeps a row group by).

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::ArrayRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::error::{DataFusionError, Result};
use datafusion::datasource::listing::FileRange;
use datafusion::execution::TaskContext;
use datafusion::parquet::file::metadata::{PageIndexPolicy, RowGroupMetaData};
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::Semaphore;

use super::source::Part;
use super::TableSource;
use crate::trace;

/// The row groups a part of a Parquet file was cut to: the file's row
/// groups `first..first + count` (in the order they lie in the file), of
/// `rows` rows in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowGroups {
    pub first: usize,
    pub count: usize,
    pub rows: usize,
}

/// Pieces read at once in the process: as many as the host has cores.
static PIECE_READS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    Arc::new(Semaphore::new(cores))
});

/// Every row of table columns `table_columns` of `part`, as
/// [`Part::batches`] reads them (`coded`: the string columns the fill
/// codes), in the part's order; where the part cuts into `pieces` (what
/// [`pieces_of`] found, asked by the caller once), each piece read whole
/// by a task of its own, at most [`PIECE_READS`] at once, and counted in
/// `pieces_read`. The tasks end when the stream is dropped.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn batches_in_pieces(
    source: &TableSource,
    part: &Part,
    pieces: Option<Vec<Part>>,
    table_columns: &[usize],
    coded: &[usize],
    context: Arc<TaskContext>,
    pieces_read: &datafusion::physical_plan::metrics::Count,
) -> Result<BoxStream<'static, Result<Vec<ArrayRef>>>> {
    let Some(pieces) = pieces else {
        return part.batches(source, table_columns, coded, context);
    };
    pieces_read.add(pieces.len());
    let tasks: Vec<SpawnedTask<Result<Vec<Vec<ArrayRef>>>>> = pieces
        .into_iter()
        .map(|piece| {
            let (source, table_columns, coded) = (source.clone(), table_columns.to_vec(), coded.to_vec());
            let context = Arc::clone(&context);
            SpawnedTask::spawn(async move {
                let _turn = Arc::clone(&PIECE_READS)
                    .acquire_owned()
                    .await
                    .map_err(|e| DataFusionError::Internal(format!("the pieces' reads: {e}")))?;
                let read = read_whole(&piece, &source, &table_columns, &coded, context).await?;
                trace::event(|| format!("{}: read", piece.describe()));
                Ok(read)
            })
        })
        .collect();
    Ok(futures::stream::iter(tasks)
        .then(|task| async move {
            match task.join().await {
                Ok(Ok(batches)) => futures::stream::iter(batches.into_iter().map(Ok)).boxed(),
                Ok(Err(e)) => futures::stream::once(async move { Err(e) }).boxed(),
                Err(e) => {
                    let e = DataFusionError::Execution(format!("a read of a piece of a table failed: {e}"));
                    futures::stream::once(async move { Err(e) }).boxed()
                }
            }
        })
        .flatten()
        .boxed())
}

/// Every batch of `piece` (as [`Part::batches`] reads them), held.
pub(super) async fn read_whole(
    piece: &Part,
    source: &TableSource,
    table_columns: &[usize],
    coded: &[usize],
    context: Arc<TaskContext>,
) -> Result<Vec<Vec<ArrayRef>>> {
    let mut batches = piece.batches(source, table_columns, coded, context)?;
    let mut read = Vec::new();
    while let Some(batch) = batches.next().await {
        read.push(batch?);
    }
    Ok(read)
}

/// The pieces of at least `min_rows` rows a Parquet file or byte range of
/// one cuts into (in the order they lie in the file), where its row groups
/// make two or more; `None` for every other part: a `MemTable` partition,
/// a piece already, a file read with an access plan of its own
/// (DataFusion's `extensions`), a file whose footer cannot be read here
/// (the read reports it), and any part where `min_rows` is 0.
pub(crate) async fn pieces_of(
    source: &TableSource,
    part: &Part,
    context: &TaskContext,
    min_rows: usize,
) -> Option<Vec<Part>> {
    let TableSource::Parquet { url, .. } = source else {
        return None;
    };
    let file = match part {
        Part::File(file, None) if min_rows > 0 && file.extensions.is_empty() => file,
        _ => return None,
    };
    let store = context.runtime_env().object_store(url).ok()?;
    let footers = context.runtime_env().cache_manager.get_file_metadata_cache();
    let metadata = DFParquetMetadata::new(store.as_ref(), &file.object_meta)
        .with_metadata_size_hint(file.metadata_size_hint)
        .with_file_metadata_cache(Some(footers))
        .with_page_index_policy(Some(PageIndexPolicy::Skip))
        .fetch_metadata()
        .await;
    let starts: Vec<RowGroupStart> = match &metadata {
        Ok(metadata) => metadata.row_groups().iter().map(RowGroupStart::of).collect(),
        Err(e) => {
            trace::event(|| format!("{}: not cut at its row groups ({e})", part.describe()));
            return None;
        }
    };
    let cut = pieces(&starts, file.range.as_ref(), min_rows)?;
    Some(
        cut.into_iter()
            .map(|(range, groups)| {
                let mut piece = file.clone();
                piece.range = Some(range);
                Part::File(piece, Some(groups))
            })
            .collect(),
    )
}

/// Where a row group starts in its file (where DataFusion's reader looks
/// for it: its first column's dictionary page, or first data page), and
/// its rows.
#[derive(Debug, Clone, Copy)]
struct RowGroupStart {
    offset: i64,
    rows: usize,
}

impl RowGroupStart {
    fn of(group: &RowGroupMetaData) -> Self {
        let offset = match group.num_columns() {
            0 => -1,
            _ => {
                let column = group.column(0);
                column.dictionary_page_offset().unwrap_or_else(|| column.data_page_offset())
            }
        };
        Self {
            offset,
            rows: usize::try_from(group.num_rows()).unwrap_or(0),
        }
    }
}

/// The parts of at least `min_rows` rows (but the last) that the row
/// groups starting in `range` (the whole file where `None`) make, each
/// the byte range that exactly its row groups start in; `None` where they
/// make fewer than two, or the row groups' starts are not all distinct
/// (a file this cannot cut safely).
fn pieces(
    starts: &[RowGroupStart],
    range: Option<&FileRange>,
    min_rows: usize,
) -> Option<Vec<(FileRange, RowGroups)>> {
    let mut order: Vec<usize> = (0..starts.len()).collect();
    order.sort_by_key(|&g| starts[g].offset);
    if order.windows(2).any(|w| starts[w[0]].offset == starts[w[1]].offset) {
        return None;
    }
    if starts.iter().any(|start| start.offset < 0) {
        return None;
    }
    let inside = |g: &usize| range.is_none_or(|range| range.contains(starts[*g].offset));
    let kept: Vec<usize> = order.into_iter().filter(inside).collect();
    let mut pieces: Vec<(FileRange, RowGroups)> = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    let mut rows = 0usize;
    for (at, &g) in kept.iter().enumerate() {
        run.push(g);
        rows += starts[g].rows;
        if rows >= min_rows || at + 1 == kept.len() {
            let (first, last) = (run[0], run[run.len() - 1]);
            pieces.push((
                FileRange {
                    start: starts[first].offset,
                    end: starts[last].offset + 1,
                },
                RowGroups {
                    first: *run.iter().min().unwrap_or(&first),
                    count: run.len(),
                    rows,
                },
            ));
            run.clear();
            rows = 0;
        }
    }
    (pieces.len() >= 2).then_some(pieces)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn starts(rows: &[usize]) -> Vec<RowGroupStart> {
        // Row groups laid end to end from byte 4, 100 bytes a thousand rows.
        let mut offset = 4i64;
        rows.iter()
            .map(|&rows| {
                let start = RowGroupStart { offset, rows };
                offset += (rows / 10) as i64;
                start
            })
            .collect()
    }

    /// The row groups each piece's range keeps by DataFusion's rule (a
    /// row group whose start lies in the range).
    fn kept_by_range(starts: &[RowGroupStart], range: &FileRange) -> Vec<usize> {
        (0..starts.len()).filter(|&g| range.contains(starts[g].offset)).collect()
    }

    #[test]
    fn a_range_is_cut_into_parts_of_at_least_the_rows_asked_for_and_each_row_group_is_read_once() {
        let starts = starts(&[1000, 1000, 1000, 1000, 1000, 500]);
        let whole = FileRange { start: 0, end: 10_000 };
        let cut = pieces(&starts, Some(&whole), 2000).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(range, _)| kept_by_range(&starts, range)).collect();
        assert_eq!(groups, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        let described: Vec<RowGroups> = cut.iter().map(|(_, groups)| *groups).collect();
        assert_eq!(
            described,
            vec![
                RowGroups { first: 0, count: 2, rows: 2000 },
                RowGroups { first: 2, count: 2, rows: 2000 },
                RowGroups { first: 4, count: 2, rows: 1500 },
            ]
        );
        // Every row group once, at one row a part.
        let single = pieces(&starts, None, 1).unwrap();
        assert_eq!(single.len(), 6);
        for (g, (range, groups)) in single.iter().enumerate() {
            assert_eq!(kept_by_range(&starts, range), vec![g]);
            assert_eq!((groups.first, groups.count), (g, 1));
        }
    }

    #[test]
    fn only_the_row_groups_starting_in_the_range_are_cut_and_too_few_are_left_whole() {
        let starts = starts(&[1000; 8]);
        // Row groups 2, 3 and 4 start in bytes 204..504.
        let range = FileRange { start: 150, end: 450 };
        let cut = pieces(&starts, Some(&range), 1000).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(r, _)| kept_by_range(&starts, r)).collect();
        assert_eq!(groups, vec![vec![2], vec![3], vec![4]]);
        for (piece, _) in &cut {
            assert!(piece.start >= range.start && piece.end <= range.end);
        }
        // One part's worth of rows, or none: left as it is.
        assert!(pieces(&starts, Some(&range), 3000).is_none());
        assert!(pieces(&starts, Some(&FileRange { start: 5, end: 100 }), 1).is_none());
        assert!(pieces(&[], None, 1).is_none());
    }

    /// A file of ten row groups of 1,000 rows (`v` 0 to 9,999, in order)
    /// in a directory of its own named after `name`, as a table that reads
    /// it in three byte ranges, with a task context to read it in.
    pub(crate) async fn ranges_of_a_file_of_ten_row_groups(
        name: &str,
    ) -> (TableSource, Arc<TaskContext>, std::path::PathBuf) {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::datasource::source::DataSourceExec;
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::file::properties::WriterProperties;
        use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};

        let dir = std::env::temp_dir().join(format!("datafusion-gpu-row-groups-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(0..10_000))])
            .unwrap();
        let properties = WriterProperties::builder().set_max_row_group_row_count(Some(1000)).build();
        let file = std::fs::File::create(dir.join("t.parquet")).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let config = SessionConfig::new()
            .with_target_partitions(3)
            .set_usize("datafusion.optimizer.repartition_file_min_size", 0);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        let mut scan = ctx.sql("SELECT v FROM t").await.unwrap().create_physical_plan().await.unwrap();
        while scan.downcast_ref::<DataSourceExec>().is_none() {
            scan = Arc::clone(scan.children()[0]);
        }
        let (source, _) = super::super::table_source(scan.downcast_ref::<DataSourceExec>().unwrap()).unwrap().unwrap();
        assert_eq!(source.part_count(), 3, "three byte ranges of the file");
        (source, ctx.task_ctx(), dir)
    }

    /// The values of the one Int64 column of `batches`, in order.
    pub(crate) async fn values_of(mut batches: BoxStream<'static, Result<Vec<ArrayRef>>>) -> Vec<i64> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int64Type;
        let mut values = Vec::new();
        while let Some(batch) = batches.next().await {
            values.extend(batch.unwrap()[0].as_primitive::<Int64Type>().values().iter().copied());
        }
        values
    }

    /// The file of [`ranges_of_a_file_of_ten_row_groups`]: cut at one row
    /// group a part and more, every row is read once, by parts whose rows
    /// are known exactly.
    #[tokio::test]
    async fn every_row_of_a_file_cut_into_parts_is_read_once() {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Int64Type;

        let (source, context, dir) = ranges_of_a_file_of_ten_row_groups("read-once").await;
        for (min_rows, parts_wanted) in [(0, Some(3)), (1, Some(10)), (1000, Some(10)), (2500, None), (100_000, Some(3))] {
            let mut parts = Vec::new();
            for part in source.part_groups().into_iter().flatten() {
                match pieces_of(&source, &part, &context, min_rows).await {
                    Some(pieces) => parts.extend(pieces),
                    None => parts.push(part),
                }
            }
            if let Some(wanted) = parts_wanted {
                assert_eq!(parts.len(), wanted, "at {min_rows} rows a part");
            } else {
                assert!(parts.len() > 3 && parts.len() < 10, "at {min_rows} rows a part: {}", parts.len());
            }
            let mut values = Vec::new();
            for part in &parts {
                let columns = part.read(&source, &[0], Arc::clone(&context)).await.unwrap();
                let read: Vec<i64> = columns[0]
                    .iter()
                    .flat_map(|array| array.as_primitive::<Int64Type>().values().to_vec())
                    .collect();
                if let Part::File(_, Some(groups)) = part {
                    assert_eq!(groups.rows, read.len(), "{}", part.describe());
                    assert_eq!(part.rows_estimate(), Some(read.len()));
                }
                values.extend(read);
            }
            values.sort_unstable();
            assert_eq!(values, (0..10_000).collect::<Vec<i64>>(), "at {min_rows} rows a part");
        }
        // Each range read in pieces by tasks of their own gives the rows a
        // read of the whole range gives, in its order.
        let pieces_read = datafusion::physical_plan::metrics::Count::new();
        for part in source.part_groups().into_iter().flatten() {
            let whole = values_of(part.batches(&source, &[0], &[], Arc::clone(&context)).unwrap()).await;
            let pieces = pieces_of(&source, &part, &context, 1).await;
            let in_pieces =
                batches_in_pieces(&source, &part, pieces, &[0], &[], Arc::clone(&context), &pieces_read).await.unwrap();
            assert_eq!(values_of(in_pieces).await, whole, "{}", part.describe());
        }
        assert_eq!(pieces_read.value(), 10, "every row group a piece");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn row_groups_that_start_alike_or_nowhere_are_not_cut() {
        let mut same = starts(&[1000, 1000, 1000]);
        same[2].offset = same[1].offset;
        assert!(pieces(&same, None, 1).is_none());
        let mut nowhere = starts(&[1000, 1000, 1000]);
        nowhere[0].offset = -1;
        assert!(pieces(&nowhere, None, 1).is_none());
    }

    #[test]
    fn row_groups_out_of_file_order_are_cut_by_where_they_start() {
        // Row group 1 lies before row group 0 in the file.
        let mut starts = starts(&[1000, 1000, 1000]);
        starts.swap(0, 1);
        let offsets: Vec<i64> = starts.iter().map(|s| s.offset).collect();
        assert!(offsets[1] < offsets[0]);
        let cut = pieces(&starts, None, 1).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(r, _)| kept_by_range(&starts, r)).collect();
        assert_eq!(groups, vec![vec![1], vec![0], vec![2]]);
    }
}
