//! A Parquet part read in pieces, each by a task of its own, so that the
//! reading of a table into the cache is shared out evenly among the host's
//! cores: runs of whole row groups, or slices of rows of one large row
//! group.
//!
//! DataFusion splits a table's files into byte ranges, one group of them
//! a partition, each range holding the row groups that start in it. A
//! range holds whole row groups, so ranges of about the same bytes hold
//! different numbers of them (three in one, five in another, none in a
//! third where a file has fewer row groups than ranges), and the range
//! with the most, read by one task, ends long after the rest: cold, the
//! last part of a table is read alone on an otherwise idle host. A part
//! the cache misses where its table is read all at once (see
//! [`super::run::Reading`]) is therefore read in pieces of at least
//! `gpu.tuning.min_part_rows` rows each, every piece by a task of its own,
//! as many at once in the process as the host has cores, and coded into
//! the part's words in the part's order as the pieces come: the part stays
//! what the cache keeps and the scans read, only its reading is shared. A
//! row group of at least twice that many rows (and of [`MIN_SLICE_ROWS`])
//! is cut into slices of its rows, so that a part of one large row group
//! (a byte range of a file written in large row groups, or a file written
//! as one) is not read by one task either.
//!
//! A piece is read as DataFusion reads a range: the range only narrowed to
//! start at its first row group's first page and end right after its last
//! row group's first page, so that exactly its row groups start in it (the
//! rule DataFusion's reader keeps a row group by). A slice is read so too,
//! with an access plan that selects its rows of its row group; its file's
//! page index, where written, is read once (and kept with the footer in
//! DataFusion's cache, which often holds it already), so that a slice read
//! through DataFusion's default reader fetches only the pages that hold its
//! rows (where the cache has let the index go, every page, and skips them).

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::ArrayRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::physical_plan::parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::error::{DataFusionError, Result};
use datafusion::datasource::listing::{FileRange, PartitionedFile};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::TaskContext;
use datafusion::parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, RowGroupMetaData};
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::Semaphore;

use super::source::Part;
use super::TableSource;
use crate::trace;

/// The row groups a part of a Parquet file was cut to: the file's row
/// groups `first..first + count` (in the order they lie in the file), of
/// `rows` rows in all; or, with `slice_from`, rows `from..from + rows` of
/// row group `first` alone (`count` 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowGroups {
    pub first: usize,
    pub count: usize,
    pub rows: usize,
    pub slice_from: Option<usize>,
}

impl RowGroups {
    /// Whole row groups `first..first + count`, of `rows` rows in all.
    fn whole(first: usize, count: usize, rows: usize) -> Self {
        Self {
            first,
            count,
            rows,
            slice_from: None,
        }
    }

    /// What the piece holds, for the trace.
    pub fn describe(&self) -> String {
        match self.slice_from {
            Some(from) => format!("row group {} rows {}..{}", self.first, from, from + self.rows),
            None => format!("row groups {}..{}", self.first, self.first + self.count),
        }
    }
}

/// Rows a slice of one row group holds at least, whatever
/// `gpu.tuning.min_part_rows` asks for: a slice is read as a file is (its
/// footer, its pages' headers, a dictionary page a column), worth it only
/// for many rows.
pub(crate) const MIN_SLICE_ROWS: usize = 1 << 13;

/// Slices a row group is cut into at most (larger slices past that): a
/// row group's rows come from its file's footer, whatever they claim.
const MAX_SLICES_A_ROW_GROUP: usize = 64;

/// Which row groups of a part are cut into slices of their rows (those of
/// at least twice a slice's rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slicing {
    /// Every such row group: the part is read by tasks of their own
    /// (`Reading::WithItsTable`).
    Every,
    /// Only a row group the part holds alone: the part is read in turn by
    /// its own task, its last pieces by idle tasks (`Reading::InTurn`);
    /// a part of several row groups has pieces enough for that, and each
    /// piece more is one more that an idle task may read ahead of its turn.
    Alone,
    /// None: the pieces are not read by tasks of their own (a part read in
    /// turn where no idle task can help), and a part of one row group is
    /// left whole, to have its columns read apart.
    Never,
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
/// one cuts into (in the order they lie in the file): runs of its row
/// groups, and slices of a large one as `slicing` allows (see [`pieces`]),
/// where they make two or more; `None` for every other part: a `MemTable`
/// partition, a piece already, a file read with an access plan of its own
/// (DataFusion's `extensions`), a file whose footer cannot be read here
/// (the read reports it), and any part where `min_rows` is 0.
pub(crate) async fn pieces_of(
    source: &TableSource,
    part: &Part,
    context: &TaskContext,
    min_rows: usize,
    slicing: Slicing,
) -> Option<Vec<Part>> {
    let TableSource::Parquet { url, .. } = source else {
        return None;
    };
    let file = match part {
        Part::File(file, None) if min_rows > 0 && file.extensions.is_empty() => file,
        _ => return None,
    };
    let starts = match row_group_starts(url, file, context).await {
        Ok(starts) => starts,
        Err(e) => {
            trace::event(|| format!("{}: not cut at its row groups ({e})", part.describe()));
            return None;
        }
    };
    let cut = pieces(&starts, file.range.as_ref(), min_rows, slicing)?;
    if cut.iter().any(|(_, groups)| groups.slice_from.is_some()) {
        // The page index, kept with the footer in DataFusion's cache where
        // the file has one, tells a slice's read which pages hold its rows.
        if let Err(e) = footer(url, file, context, PageIndexPolicy::Optional).await {
            trace::event(|| format!("{}: page index not read ({e})", part.describe()));
        }
    }
    Some(
        cut.into_iter()
            .map(|(range, groups)| {
                let mut piece = file.clone();
                piece.range = Some(range);
                if let Some(from) = groups.slice_from {
                    piece = piece.with_extension(slice_plan(&starts, groups.first, from, groups.rows));
                }
                Part::File(piece, Some(groups))
            })
            .collect(),
    )
}

/// Whether `part` is a byte range of a Parquet file that no row group
/// starts in, so that DataFusion's reader reads no row of it: told by the
/// file's footer (from DataFusion's cache where it holds it). `false`
/// where it cannot be told so: another kind of part, a piece, a file read
/// with an access plan of its own, a footer that cannot be read here.
pub(crate) async fn holds_no_row_group(source: &TableSource, part: &Part, context: &TaskContext) -> bool {
    let TableSource::Parquet { url, .. } = source else {
        return false;
    };
    let (file, range) = match part {
        Part::File(file, None) if file.extensions.is_empty() => match &file.range {
            Some(range) => (file, range),
            None => return false,
        },
        _ => return false,
    };
    match row_group_starts(url, file, context).await {
        Ok(starts) => !starts.iter().any(|start| range.contains(start.offset)),
        Err(_) => false,
    }
}

/// Where each row group of `file` starts, and its rows, from its footer.
async fn row_group_starts(
    url: &ObjectStoreUrl,
    file: &PartitionedFile,
    context: &TaskContext,
) -> Result<Vec<RowGroupStart>> {
    let metadata = footer(url, file, context, PageIndexPolicy::Skip).await?;
    Ok(metadata.row_groups().iter().map(RowGroupStart::of).collect())
}

/// `file`'s footer, with its page index as `page_index` asks, from
/// DataFusion's cache where it holds it (and kept there).
async fn footer(
    url: &ObjectStoreUrl,
    file: &PartitionedFile,
    context: &TaskContext,
    page_index: PageIndexPolicy,
) -> Result<Arc<ParquetMetaData>> {
    let store = context.runtime_env().object_store(url)?;
    DFParquetMetadata::new(store.as_ref(), &file.object_meta)
        .with_metadata_size_hint(file.metadata_size_hint)
        .with_file_metadata_cache(Some(context.runtime_env().cache_manager.get_file_metadata_cache()))
        .with_page_index_policy(Some(page_index))
        .fetch_metadata()
        .await
}

/// The access plan that reads rows `from..from + rows` of row group `group`
/// of a file whose row groups are `starts`, and nothing else.
fn slice_plan(starts: &[RowGroupStart], group: usize, from: usize, rows: usize) -> ParquetAccessPlan {
    let mut plan = ParquetAccessPlan::new_none(starts.len());
    let after = starts[group].rows.saturating_sub(from + rows);
    let selectors: Vec<RowSelector> = [RowSelector::skip(from), RowSelector::select(rows), RowSelector::skip(after)]
        .into_iter()
        .filter(|selector| selector.row_count > 0)
        .collect();
    plan.set(group, RowGroupAccess::Selection(RowSelection::from(selectors)));
    plan
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

/// The parts of at least `min_rows` rows (but the last, and a run of row
/// groups right before a sliced one) that the row groups starting in
/// `range` (the whole file where `None`) make, each the byte range that
/// exactly its row groups start in: runs of whole row groups, and slices
/// of at least `min_rows` and [`MIN_SLICE_ROWS`] rows of a row group of
/// twice as many, [`MAX_SLICES_A_ROW_GROUP`] at most (with
/// [`Slicing::Alone`], only where it is the only row group starting in
/// `range`; with [`Slicing::Never`], none). `None` where they make fewer
/// than two, or the row groups' starts are not all distinct or not in the
/// footer's order (a file this cannot cut safely).
fn pieces(
    starts: &[RowGroupStart],
    range: Option<&FileRange>,
    min_rows: usize,
    slicing: Slicing,
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
    // DataFusion reads a part's row groups in the footer's order: pieces
    // in file order must give its rows in that order too.
    if kept.windows(2).any(|w| w[0] > w[1]) {
        return None;
    }
    let slice_rows = min_rows.max(MIN_SLICE_ROWS);
    let may_slice = match slicing {
        Slicing::Every => true,
        Slicing::Alone => kept.len() == 1,
        Slicing::Never => false,
    };
    let mut pieces: Vec<(FileRange, RowGroups)> = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    let mut rows = 0usize;
    let end_run = |run: &mut Vec<usize>, rows: &mut usize, pieces: &mut Vec<(FileRange, RowGroups)>| {
        let (Some(&first), Some(&last)) = (run.first(), run.last()) else {
            return;
        };
        pieces.push((
            FileRange {
                start: starts[first].offset,
                end: starts[last].offset + 1,
            },
            RowGroups::whole(first, run.len(), *rows),
        ));
        run.clear();
        *rows = 0;
    };
    for (at, &g) in kept.iter().enumerate() {
        let group_rows = starts[g].rows;
        if may_slice && group_rows >= slice_rows.saturating_mul(2) {
            end_run(&mut run, &mut rows, &mut pieces);
            let count = (group_rows / slice_rows).min(MAX_SLICES_A_ROW_GROUP);
            let only_its_start = FileRange {
                start: starts[g].offset,
                end: starts[g].offset + 1,
            };
            for slice in 0..count {
                let at = |slice: usize| (group_rows as u128 * slice as u128 / count as u128) as usize;
                let (from, to) = (at(slice), at(slice + 1));
                let groups = RowGroups {
                    first: g,
                    count: 1,
                    rows: to - from,
                    slice_from: Some(from),
                };
                pieces.push((only_its_start.clone(), groups));
            }
            continue;
        }
        run.push(g);
        rows += group_rows;
        if rows >= min_rows || at + 1 == kept.len() {
            end_run(&mut run, &mut rows, &mut pieces);
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
        let cut = pieces(&starts, Some(&whole), 2000, Slicing::Every).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(range, _)| kept_by_range(&starts, range)).collect();
        assert_eq!(groups, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        let described: Vec<RowGroups> = cut.iter().map(|(_, groups)| *groups).collect();
        assert_eq!(
            described,
            vec![
                RowGroups::whole(0, 2, 2000),
                RowGroups::whole(2, 2, 2000),
                RowGroups::whole(4, 2, 1500),
            ]
        );
        // Every row group once, at one row a part.
        let single = pieces(&starts, None, 1, Slicing::Every).unwrap();
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
        let cut = pieces(&starts, Some(&range), 1000, Slicing::Every).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(r, _)| kept_by_range(&starts, r)).collect();
        assert_eq!(groups, vec![vec![2], vec![3], vec![4]]);
        for (piece, _) in &cut {
            assert!(piece.start >= range.start && piece.end <= range.end);
        }
        // One part's worth of rows, or none: left as it is.
        assert!(pieces(&starts, Some(&range), 3000, Slicing::Every).is_none());
        assert!(pieces(&starts, Some(&FileRange { start: 5, end: 100 }), 1, Slicing::Every).is_none());
        assert!(pieces(&[], None, 1, Slicing::Every).is_none());
    }

    /// `batch` written with `properties` to a file `t.parquet` in a fresh
    /// directory of its own named after `name`, as a table that reads it in
    /// three byte ranges, with a task context to read it in.
    async fn a_file_in_three_ranges(
        name: &str,
        batch: datafusion::arrow::array::RecordBatch,
        properties: datafusion::parquet::file::properties::WriterProperties,
    ) -> (TableSource, Arc<TaskContext>, std::path::PathBuf) {
        use datafusion::datasource::source::DataSourceExec;
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};

        let dir = std::env::temp_dir().join(format!("datafusion-gpu-row-groups-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = std::fs::File::create(dir.join("t.parquet")).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let config = SessionConfig::new()
            .with_target_partitions(3)
            .set_usize("datafusion.optimizer.repartition_file_min_size", 0);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
        let mut scan = ctx.sql("SELECT * FROM t").await.unwrap().create_physical_plan().await.unwrap();
        while scan.downcast_ref::<DataSourceExec>().is_none() {
            scan = Arc::clone(scan.children()[0]);
        }
        let (source, _) = super::super::table_source(scan.downcast_ref::<DataSourceExec>().unwrap()).unwrap().unwrap();
        assert_eq!(source.part_count(), 3, "three byte ranges of the file");
        (source, ctx.task_ctx(), dir)
    }

    /// A file of ten row groups of 1,000 rows (`v` 0 to 9,999, in order)
    /// in a directory of its own named after `name`, as a table that reads
    /// it in three byte ranges, with a task context to read it in.
    pub(crate) async fn ranges_of_a_file_of_ten_row_groups(
        name: &str,
    ) -> (TableSource, Arc<TaskContext>, std::path::PathBuf) {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::parquet::file::properties::WriterProperties;

        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..10_000))]).unwrap();
        let properties = WriterProperties::builder().set_max_row_group_row_count(Some(1000)).build();
        a_file_in_three_ranges(name, batch, properties).await
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
                match pieces_of(&source, &part, &context, min_rows, Slicing::Every).await {
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
            let pieces = pieces_of(&source, &part, &context, 1, Slicing::Every).await;
            let in_pieces =
                batches_in_pieces(&source, &part, pieces, &[0], &[], Arc::clone(&context), &pieces_read).await.unwrap();
            assert_eq!(values_of(in_pieces).await, whole, "{}", part.describe());
        }
        assert_eq!(pieces_read.value(), 10, "every row group a piece");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_row_group_of_twice_the_rows_asked_for_is_cut_into_slices_that_cover_its_rows_once() {
        let starts = starts(&[1000, 40_000, 1000, 1000, 16_383]);
        let cut = pieces(&starts, None, 10_000, Slicing::Every).unwrap();
        let described: Vec<RowGroups> = cut.iter().map(|(_, groups)| *groups).collect();
        let slice = |from: usize| RowGroups {
            first: 1,
            count: 1,
            rows: 10_000,
            slice_from: Some(from),
        };
        assert_eq!(
            described,
            vec![
                // The run before the sliced row group ends there, short.
                RowGroups::whole(0, 1, 1000),
                slice(0),
                slice(10_000),
                slice(20_000),
                slice(30_000),
                // 16,383 rows: fewer than twice the slices' least rows.
                RowGroups::whole(2, 3, 18_383),
            ]
        );
        for (range, groups) in &cut {
            let kept = kept_by_range(&starts, range);
            assert_eq!((kept[0], kept.len()), (groups.first, groups.count), "{}", groups.describe());
        }
        // At one row a part, slices of the least rows a slice holds, every
        // row once, the last slice the longest.
        let cut = pieces(&starts, None, 1, Slicing::Every).unwrap();
        let slices: Vec<(usize, usize)> = cut
            .iter()
            .filter_map(|(_, groups)| groups.slice_from.map(|from| (from, groups.rows)))
            .collect();
        assert_eq!(slices.len(), 40_000 / MIN_SLICE_ROWS);
        let mut next = 0;
        for (from, rows) in slices {
            assert_eq!(from, next);
            assert!(rows >= MIN_SLICE_ROWS);
            next = from + rows;
        }
        assert_eq!(next, 40_000);
        // One row group alone in its range is cut too; one of too few rows is not.
        let alone = FileRange { start: starts[1].offset, end: starts[2].offset };
        for slicing in [Slicing::Every, Slicing::Alone] {
            assert_eq!(pieces(&starts, Some(&alone), 20_000, slicing).map(|cut| cut.len()), Some(2));
            assert!(pieces(&starts, Some(&alone), 20_001, slicing).is_none());
        }
        // Read in turn, a part of several row groups is cut at its row
        // groups alone.
        let whole: Vec<RowGroups> = pieces(&starts, None, 10_000, Slicing::Alone)
            .unwrap()
            .into_iter()
            .map(|(_, groups)| groups)
            .collect();
        assert_eq!(whole, vec![RowGroups::whole(0, 2, 41_000), RowGroups::whole(2, 3, 18_383)]);
        // Left whole where no task would read the slices.
        assert!(pieces(&starts, Some(&alone), 20_000, Slicing::Never).is_none());
    }

    #[test]
    fn a_row_group_of_more_rows_than_any_file_holds_is_cut_into_a_bounded_number_of_slices() {
        // A footer may claim any count of rows.
        for rows in [1usize << 40, usize::MAX / 2] {
            let starts = [RowGroupStart { offset: 4, rows }];
            let cut = pieces(&starts, None, 1, Slicing::Every).unwrap();
            assert_eq!(cut.len(), MAX_SLICES_A_ROW_GROUP);
            let mut next = 0;
            for (_, groups) in &cut {
                assert_eq!(groups.slice_from, Some(next));
                next += groups.rows;
            }
            assert_eq!(next, rows);
        }
    }

    /// A file of one row group of `rows` rows (`v` 0 to `rows - 1`, in order,
    /// and `s`, seven strings the writer keeps as a dictionary) in a
    /// directory of its own named after `name`, as a table that reads it in
    /// three byte ranges (two hold no row group), with a task context to
    /// read it in.
    pub(crate) async fn a_file_of_one_large_row_group(
        name: &str,
        rows: i64,
    ) -> (TableSource, Arc<TaskContext>, std::path::PathBuf) {
        use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::parquet::file::properties::WriterProperties;

        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let strings = StringArray::from_iter_values((0..rows).map(|v| format!("value {}", v % 7)));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..rows)), Arc::new(strings)])
                .unwrap();
        // Pages of 1,000 rows, so that a slice's read skips whole pages.
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows as usize))
            .set_data_page_row_count_limit(1000)
            .set_write_batch_size(1000)
            .build();
        a_file_in_three_ranges(name, batch, properties).await
    }

    /// The values of `batches`' two columns (`v`, and `s` read as strings
    /// or as a dictionary of them), in order.
    pub(crate) async fn pairs_of(mut batches: BoxStream<'static, Result<Vec<ArrayRef>>>) -> Vec<(i64, String)> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::compute::cast;
        use datafusion::arrow::datatypes::{DataType, Int64Type};
        let mut pairs = Vec::new();
        while let Some(batch) = batches.next().await {
            let batch = batch.unwrap();
            let strings = cast(&batch[1], &DataType::Utf8).unwrap();
            let values = batch[0].as_primitive::<Int64Type>().values().iter().copied();
            pairs.extend(values.zip(strings.as_string::<i32>().iter().map(|s| s.unwrap().to_owned())));
        }
        pairs
    }

    /// A byte range is told to hold no row group exactly where DataFusion's
    /// read of it gives no row; a whole file, a piece, and ranges that each
    /// hold row groups are not.
    #[tokio::test]
    async fn a_range_that_no_row_group_starts_in_is_told_from_the_footer() {
        let (source, context, dir) = a_file_of_one_large_row_group("no-row-group", 50_000).await;
        let mut empty = 0;
        for part in source.part_groups().into_iter().flatten() {
            let read = pairs_of(part.batches(&source, &[0, 1], &[], Arc::clone(&context)).unwrap()).await;
            let told = holds_no_row_group(&source, &part, &context).await;
            assert_eq!(told, read.is_empty(), "{}: {} rows read", part.describe(), read.len());
            empty += usize::from(told);
            let Part::File(file, None) = &part else {
                panic!("{}: a range of a file was expected", part.describe());
            };
            let whole = Part::File(datafusion::datasource::listing::PartitionedFile::new(
                file.object_meta.location.to_string(),
                file.object_meta.size,
            ), None);
            assert!(!holds_no_row_group(&source, &whole, &context).await, "the whole file");
        }
        assert_eq!(empty, 2, "two of the three ranges hold no row group");
        let _ = std::fs::remove_dir_all(&dir);

        let (source, context, dir) = ranges_of_a_file_of_ten_row_groups("each-holds-row-groups").await;
        let mut pieces_seen = 0;
        for part in source.part_groups().into_iter().flatten() {
            assert!(!holds_no_row_group(&source, &part, &context).await, "{}", part.describe());
            let pieces = pieces_of(&source, &part, &context, 1, Slicing::Every).await;
            let pieces = pieces.unwrap_or_else(|| panic!("{} is not cut into pieces", part.describe()));
            assert!(!pieces.is_empty(), "{}: no piece", part.describe());
            for piece in pieces {
                assert!(!holds_no_row_group(&source, &piece, &context).await, "{}", piece.describe());
                pieces_seen += 1;
            }
        }
        assert!(pieces_seen >= 10, "every row group in a piece: {pieces_seen} pieces");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file of one row group, cut into slices of its rows: each slice
    /// reads exactly its rows, and the slices read by tasks of their own, or
    /// in turn, give every row of the part in its order, a dictionary
    /// column's strings too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_slices_of_one_row_group_read_each_row_once_in_order() {
        use super::super::shared_read::batches_read_in_turn;
        let rows = 50_000;
        let (source, context, dir) = a_file_of_one_large_row_group("slices", rows).await;
        let every: Vec<(i64, String)> = (0..rows).map(|v| (v, format!("value {}", v % 7))).collect();
        let pieces_read = datafusion::physical_plan::metrics::Count::new();
        let mut sliced = 0;
        for part in source.part_groups().into_iter().flatten() {
            let whole = pairs_of(part.batches(&source, &[0, 1], &[], Arc::clone(&context)).unwrap()).await;
            let Some(pieces) = pieces_of(&source, &part, &context, 10_000, Slicing::Every).await else {
                // A range no row group starts in.
                assert!(whole.is_empty(), "{}", part.describe());
                continue;
            };
            sliced += 1;
            assert_eq!(whole, every);
            assert_eq!(pieces.len(), 5, "{}", part.describe());
            let mut next = 0i64;
            for piece in &pieces {
                let read = pairs_of(piece.batches(&source, &[0, 1], &[], Arc::clone(&context)).unwrap()).await;
                assert_eq!(read.len(), 10_000, "{}", piece.describe());
                assert_eq!(piece.rows_estimate(), Some(read.len()));
                assert_eq!(read[..], every[next as usize..next as usize + read.len()], "{}", piece.describe());
                next += read.len() as i64;
                // The string column read as a dictionary, as the fill reads
                // a column it codes.
                let coded = pairs_of(piece.batches(&source, &[0, 1], &[1], Arc::clone(&context)).unwrap()).await;
                assert_eq!(coded, read, "{}", piece.describe());
            }
            assert_eq!(next, rows);
            let in_pieces = batches_in_pieces(&source, &part, Some(pieces.clone()), &[0, 1], &[], Arc::clone(&context), &pieces_read)
                .await
                .unwrap();
            assert_eq!(pairs_of(in_pieces).await, every);
            let in_turn = batches_read_in_turn(&source, &part, Some(pieces), &[0, 1], &[1], Arc::clone(&context), &pieces_read)
                .await
                .unwrap();
            assert_eq!(pairs_of(in_turn).await, every);
        }
        assert_eq!(sliced, 1, "the one range the row group starts in");
        assert_eq!(pieces_read.value(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn row_groups_that_start_alike_or_nowhere_are_not_cut() {
        let mut same = starts(&[1000, 1000, 1000]);
        same[2].offset = same[1].offset;
        assert!(pieces(&same, None, 1, Slicing::Every).is_none());
        let mut nowhere = starts(&[1000, 1000, 1000]);
        nowhere[0].offset = -1;
        assert!(pieces(&nowhere, None, 1, Slicing::Every).is_none());
    }

    #[test]
    fn row_groups_out_of_file_order_are_left_whole_and_a_range_of_them_in_order_is_cut() {
        // Row group 1 lies before row group 0 in the file.
        let mut starts = starts(&[1000, 1000, 1000]);
        starts.swap(0, 1);
        let offsets: Vec<i64> = starts.iter().map(|s| s.offset).collect();
        assert!(offsets[1] < offsets[0]);
        // Read whole, DataFusion gives row group 0's rows first; cut where
        // they start, row group 1's would come first, and a column of the
        // part filled one way would not line up with one filled the other.
        assert!(pieces(&starts, None, 1, Slicing::Every).is_none());
        // A range holding row groups 0 and 2 alone holds them in order.
        let range = FileRange { start: offsets[0], end: offsets[2] + 1 };
        let cut = pieces(&starts, Some(&range), 1, Slicing::Every).unwrap();
        let groups: Vec<Vec<usize>> = cut.iter().map(|(r, _)| kept_by_range(&starts, r)).collect();
        assert_eq!(groups, vec![vec![0], vec![2]]);
    }
}
