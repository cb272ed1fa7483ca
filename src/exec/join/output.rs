//! Output batches of a join from row ids. The join schema is laid out as
//! `HashJoinExec` lays it out for each join type (build columns, probe
//! columns, the mark column), and the node's embedded projection picks the
//! columns emitted.

use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, ArrayRef, AsArray, BooleanArray, GenericByteViewArray, UInt64Array,
};
use datafusion::arrow::datatypes::{ByteViewType, DataType, SchemaRef};
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};

use crate::exec::join::row_source::RowSource;

/// Where each output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnSource {
    Build(usize),
    Probe(usize),
    /// The `mark` column of a mark join: whether the row found a match.
    Mark,
}

/// The rows of one side that make up the output rows.
#[derive(Debug, Clone)]
pub(crate) enum SideRows {
    /// Row `i` of the output takes row `ids[i]` of this side.
    Ids(UInt64Array),
    /// This side contributes NULLs (the unmatched rows of an outer join).
    Null,
}

impl SideRows {
    fn slice(&self, offset: usize, len: usize) -> Self {
        match self {
            Self::Ids(ids) => Self::Ids(ids.slice(offset, len)),
            Self::Null => Self::Null,
        }
    }

    /// Each of `columns` of `source` for these rows (`rows` of them).
    fn columns(
        &self,
        source: &dyn RowSource,
        columns: &[usize],
        rows: usize,
    ) -> Result<Vec<ArrayRef>> {
        match self {
            Self::Ids(ids) => Ok(source
                .take_columns(columns, ids)?
                .into_iter()
                .map(compact_views)
                .collect()),
            Self::Null => Ok(columns
                .iter()
                .map(|&c| new_null_array(source.data_type(c), rows))
                .collect()),
        }
    }
}

/// A `take` from a view array (`Utf8View`, `BinaryView`) keeps every data
/// buffer of its source alive, however few strings it took. Batches passed
/// on like that add up: a downstream concatenation (the build side of the
/// next join) copies each batch's buffers whole, so memory and time grow
/// with batches x source bytes, and stacked joins multiply it. As
/// DataFusion's own join output does (through arrow's batch coalescer), the
/// strings are copied into dense buffers when the buffers hold more than
/// twice the bytes the rows use.
pub(crate) fn compact_views(array: ArrayRef) -> ArrayRef {
    fn compact<T: ByteViewType + ?Sized>(views: &GenericByteViewArray<T>) -> Option<ArrayRef> {
        let held: usize = views.data_buffers().iter().map(|b| b.capacity()).sum();
        (held > 2 * views.total_buffer_bytes_used()).then(|| Arc::new(views.gc()) as ArrayRef)
    }
    let compacted = match array.data_type() {
        DataType::Utf8View => compact(array.as_string_view()),
        DataType::BinaryView => compact(array.as_binary_view()),
        _ => None,
    };
    compacted.unwrap_or(array)
}

/// Output rows described by row ids into the build and probe batches.
#[derive(Debug, Clone)]
pub(crate) struct OutputRows {
    pub(crate) len: usize,
    pub(crate) build: SideRows,
    pub(crate) probe: SideRows,
    pub(crate) mark: Option<BooleanArray>,
}

impl OutputRows {
    /// Matched pairs.
    pub(crate) fn pairs(build_ids: UInt64Array, probe_ids: UInt64Array) -> Self {
        debug_assert_eq!(build_ids.len(), probe_ids.len());
        Self {
            len: build_ids.len(),
            build: SideRows::Ids(build_ids),
            probe: SideRows::Ids(probe_ids),
            mark: None,
        }
    }

    /// Build rows alone (probe columns NULL or absent), with an optional mark.
    pub(crate) fn build_only(ids: UInt64Array, mark: Option<BooleanArray>) -> Self {
        Self {
            len: ids.len(),
            build: SideRows::Ids(ids),
            probe: SideRows::Null,
            mark,
        }
    }

    /// Probe rows alone (build columns NULL or absent), with an optional mark.
    pub(crate) fn probe_only(ids: UInt64Array, mark: Option<BooleanArray>) -> Self {
        Self {
            len: ids.len(),
            build: SideRows::Null,
            probe: SideRows::Ids(ids),
            mark,
        }
    }
}

/// Builds output batches of at most `batch_size` rows.
#[derive(Debug, Clone)]
pub(crate) struct OutputAssembler {
    schema: SchemaRef,
    sources: Vec<ColumnSource>,
    batch_size: usize,
}

impl OutputAssembler {
    /// `schema` is the output schema (projection applied); `projection`
    /// indexes into the join schema of `join_type`.
    pub(crate) fn new(
        schema: SchemaRef,
        join_type: JoinType,
        projection: Option<&[usize]>,
        build_columns: usize,
        probe_columns: usize,
        batch_size: usize,
    ) -> Self {
        let build = (0..build_columns).map(ColumnSource::Build);
        let probe = (0..probe_columns).map(ColumnSource::Probe);
        let join_columns: Vec<ColumnSource> = match join_type {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
                build.chain(probe).collect()
            }
            JoinType::LeftSemi | JoinType::LeftAnti => build.collect(),
            JoinType::LeftMark => build.chain([ColumnSource::Mark]).collect(),
            JoinType::RightSemi | JoinType::RightAnti => probe.collect(),
            JoinType::RightMark => probe.chain([ColumnSource::Mark]).collect(),
        };
        let sources = match projection {
            Some(projection) => projection.iter().map(|&i| join_columns[i]).collect(),
            None => join_columns,
        };
        Self {
            schema,
            sources,
            batch_size: batch_size.max(1),
        }
    }

    /// The side columns that `pick` finds among the sources, in order.
    fn side_columns(&self, pick: impl Fn(ColumnSource) -> Option<usize>) -> Vec<usize> {
        self.sources.iter().filter_map(|&s| pick(s)).collect()
    }

    /// Where each output column comes from, in the output schema's order.
    pub(crate) fn sources(&self) -> &[ColumnSource] {
        &self.sources
    }

    /// Rows per output batch.
    pub(crate) fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// One output batch of `rows` rows from its columns, in the output
    /// schema's order.
    pub(crate) fn batch_from_columns(
        &self,
        columns: Vec<ArrayRef>,
        rows: usize,
    ) -> Result<RecordBatch> {
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }

    /// The output batches of `rows`, in order. Each batch takes a zero-copy
    /// slice of the id arrays.
    pub(crate) fn assemble(
        &self,
        build: &dyn RowSource,
        probe: &dyn RowSource,
        rows: &OutputRows,
    ) -> Result<Vec<RecordBatch>> {
        let build_columns: Vec<usize> = self.side_columns(|s| match s {
            ColumnSource::Build(i) => Some(i),
            _ => None,
        });
        let probe_columns: Vec<usize> = self.side_columns(|s| match s {
            ColumnSource::Probe(i) => Some(i),
            _ => None,
        });
        let mut batches = Vec::with_capacity(rows.len.div_ceil(self.batch_size));
        for start in (0..rows.len).step_by(self.batch_size) {
            let len = (start + self.batch_size).min(rows.len) - start;
            // Each side's columns are taken together: a probe chunk of
            // several batches locates its rows once for all of them.
            let mut build_taken = rows
                .build
                .slice(start, len)
                .columns(build, &build_columns, len)?
                .into_iter();
            let mut probe_taken = rows
                .probe
                .slice(start, len)
                .columns(probe, &probe_columns, len)?
                .into_iter();
            let columns = self
                .sources
                .iter()
                .map(|source| -> Result<ArrayRef> {
                    let taken = match source {
                        ColumnSource::Build(_) => build_taken.next(),
                        ColumnSource::Probe(_) => probe_taken.next(),
                        ColumnSource::Mark => {
                            return Ok(Arc::new(
                                rows.mark
                                    .as_ref()
                                    .map(|m| m.slice(start, len))
                                    .unwrap_or_else(|| BooleanArray::from(vec![false; len])),
                            ))
                        }
                    };
                    taken.ok_or_else(|| {
                        DataFusionError::Internal("an output column was not taken".into())
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(len));
            batches.push(RecordBatch::try_new_with_options(
                Arc::clone(&self.schema),
                columns,
                &options,
            )?);
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};

    fn sides() -> (RecordBatch, RecordBatch) {
        let build = RecordBatch::try_from_iter([
            ("bk", Arc::new(Int32Array::from(vec![1, 2, 3])) as ArrayRef),
            (
                "bv",
                Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef,
            ),
        ])
        .unwrap();
        let probe = RecordBatch::try_from_iter([(
            "pk",
            Arc::new(Int32Array::from(vec![3, 1])) as ArrayRef,
        )])
        .unwrap();
        (build, probe)
    }

    fn ids(v: Vec<u64>) -> UInt64Array {
        UInt64Array::from(v)
    }

    #[test]
    fn assembles_build_then_probe_columns_in_batches() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::new(vec![
            Field::new("bk", DataType::Int32, false),
            Field::new("bv", DataType::Utf8, false),
            Field::new("pk", DataType::Int32, false),
        ]));
        let out = OutputAssembler::new(schema, JoinType::Inner, None, 2, 1, 1)
            .assemble(
                &build,
                &probe,
                &OutputRows::pairs(ids(vec![2, 0]), ids(vec![0, 1])),
            )
            .unwrap();
        assert_eq!(out.len(), 2);
        let rows: Vec<(i32, String, i32)> = out
            .iter()
            .map(|b| {
                (
                    b.column(0).as_primitive::<Int32Type>().value(0),
                    b.column(1).as_string::<i32>().value(0).to_string(),
                    b.column(2).as_primitive::<Int32Type>().value(0),
                )
            })
            .collect();
        assert_eq!(rows, vec![(3, "c".into(), 3), (1, "a".into(), 1)]);
    }

    #[test]
    fn an_empty_projection_keeps_the_row_count() {
        let (build, probe) = sides();
        let out = OutputAssembler::new(
            Arc::new(Schema::empty()),
            JoinType::Inner,
            Some(&[]),
            2,
            1,
            8192,
        )
        .assemble(
            &build,
            &probe,
            &OutputRows::pairs(ids(vec![0, 1, 2]), ids(vec![1, 1, 0])),
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].num_rows(), 3);
        assert_eq!(out[0].num_columns(), 0);
    }

    #[test]
    fn a_projection_picks_and_reorders_columns() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::new(vec![
            Field::new("pk", DataType::Int32, false),
            Field::new("bv", DataType::Utf8, false),
        ]));
        let out = OutputAssembler::new(schema, JoinType::Inner, Some(&[2, 1]), 2, 1, 10)
            .assemble(
                &build,
                &probe,
                &OutputRows::pairs(ids(vec![0]), ids(vec![1])),
            )
            .unwrap();
        let pk = out[0].column(0).as_primitive::<Int32Type>().value(0);
        let bv = out[0].column(1).as_string::<i32>().value(0);
        assert_eq!((pk, bv), (1, "a"));
    }

    #[test]
    fn unmatched_rows_get_nulls_on_the_other_side() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::new(vec![
            Field::new("bk", DataType::Int32, true),
            Field::new("bv", DataType::Utf8, true),
            Field::new("pk", DataType::Int32, true),
        ]));
        let assembler = OutputAssembler::new(schema, JoinType::Full, None, 2, 1, 10);
        let out = assembler
            .assemble(&build, &probe, &OutputRows::build_only(ids(vec![1]), None))
            .unwrap();
        assert_eq!(out[0].column(0).as_primitive::<Int32Type>().value(0), 2);
        assert!(out[0].column(2).is_null(0));
        // An empty build batch still gives NULL build columns.
        let empty_build = build.slice(0, 0);
        let out = assembler
            .assemble(
                &empty_build,
                &probe,
                &OutputRows::probe_only(ids(vec![0, 1]), None),
            )
            .unwrap();
        assert_eq!(out[0].column(0).null_count(), 2);
        assert_eq!(
            out[0].column(2).as_primitive::<Int32Type>().values(),
            &[3, 1]
        );
    }

    #[test]
    fn string_views_taken_from_a_large_side_are_compacted() {
        use datafusion::arrow::array::StringViewArray;
        let long = |i: usize| format!("a string longer than twelve bytes #{i:06}");
        let build_strings = StringViewArray::from_iter_values((0..10_000).map(long));
        let source_bytes: usize = build_strings
            .data_buffers()
            .iter()
            .map(|b| b.capacity())
            .sum();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let build =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(build_strings)]).unwrap();
        let probe = RecordBatch::new_empty(Arc::new(Schema::empty()));
        let assembler = OutputAssembler::new(schema, JoinType::LeftSemi, None, 1, 0, 8192);
        let out = assembler
            .assemble(
                &build,
                &probe,
                &OutputRows::build_only(ids(vec![7, 9_999, 7]), None),
            )
            .unwrap();
        let column = out[0].column(0).as_string_view();
        let expected = [long(7), long(9_999), long(7)];
        assert_eq!(
            column
                .iter()
                .map(|v| v.unwrap().to_string())
                .collect::<Vec<_>>(),
            expected
        );
        let held: usize = column.data_buffers().iter().map(|b| b.capacity()).sum();
        assert!(
            held <= 2 * column.total_buffer_bytes_used(),
            "held {held} bytes"
        );
        assert!(
            held * 100 < source_bytes,
            "held {held} of the source's {source_bytes} bytes"
        );
    }

    #[test]
    fn mark_joins_append_the_mark_column() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::new(vec![
            Field::new("pk", DataType::Int32, false),
            Field::new("mark", DataType::Boolean, false),
        ]));
        let out = OutputAssembler::new(schema, JoinType::RightMark, None, 2, 1, 10)
            .assemble(
                &build,
                &probe,
                &OutputRows::probe_only(
                    ids(vec![0, 1]),
                    Some(BooleanArray::from(vec![true, false])),
                ),
            )
            .unwrap();
        assert_eq!(
            out[0].column(1).as_boolean(),
            &BooleanArray::from(vec![true, false])
        );
    }
}
