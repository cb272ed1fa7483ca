//! Output batches of an inner join from matched (build row, probe row) ids:
//! the join schema is the build columns followed by the probe columns, and
//! the `HashJoinExec`'s embedded projection picks the columns emitted.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};
use datafusion::error::Result;

/// Where each output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnSource {
    Build(usize),
    Probe(usize),
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
    /// indexes into the join schema, whose first `build_columns` columns come
    /// from the build side.
    pub(crate) fn new(
        schema: SchemaRef,
        projection: Option<&[usize]>,
        build_columns: usize,
        probe_columns: usize,
        batch_size: usize,
    ) -> Self {
        let all: Vec<usize> = (0..build_columns + probe_columns).collect();
        let sources = projection
            .unwrap_or(&all)
            .iter()
            .map(|&i| {
                if i < build_columns {
                    ColumnSource::Build(i)
                } else {
                    ColumnSource::Probe(i - build_columns)
                }
            })
            .collect();
        Self {
            schema,
            sources,
            batch_size: batch_size.max(1),
        }
    }

    /// The rows `(build[build_ids[i]], probe[probe_ids[i]])`, in that order.
    /// The id vectors become Arrow arrays without a copy; each batch takes a
    /// zero-copy slice of them.
    pub(crate) fn assemble(
        &self,
        build: &RecordBatch,
        probe: &RecordBatch,
        build_ids: Vec<u64>,
        probe_ids: Vec<u64>,
    ) -> Result<Vec<RecordBatch>> {
        debug_assert_eq!(build_ids.len(), probe_ids.len());
        let rows = build_ids.len();
        let needs = |side: fn(&ColumnSource) -> bool| self.sources.iter().any(side);
        let build_ids =
            needs(|s| matches!(s, ColumnSource::Build(_))).then(|| UInt64Array::from(build_ids));
        let probe_ids =
            needs(|s| matches!(s, ColumnSource::Probe(_))).then(|| UInt64Array::from(probe_ids));
        let mut batches = Vec::with_capacity(rows.div_ceil(self.batch_size));
        for start in (0..rows).step_by(self.batch_size) {
            let end = (start + self.batch_size).min(rows);
            let build_take = build_ids.as_ref().map(|ids| ids.slice(start, end - start));
            let probe_take = probe_ids.as_ref().map(|ids| ids.slice(start, end - start));
            let columns = self
                .sources
                .iter()
                .map(|source| -> Result<ArrayRef> {
                    Ok(match source {
                        ColumnSource::Build(i) => take(
                            build.column(*i),
                            build_take.as_ref().expect("built when needed"),
                            None,
                        )?,
                        ColumnSource::Probe(i) => take(
                            probe.column(*i),
                            probe_take.as_ref().expect("built when needed"),
                            None,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(end - start));
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
    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

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

    #[test]
    fn assembles_build_then_probe_columns_in_batches() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::new(vec![
            Field::new("bk", DataType::Int32, false),
            Field::new("bv", DataType::Utf8, false),
            Field::new("pk", DataType::Int32, false),
        ]));
        let out = OutputAssembler::new(schema, None, 2, 1, 1)
            .assemble(&build, &probe, vec![2, 0], vec![0, 1])
            .unwrap();
        assert_eq!(out.len(), 2);
        let rows: Vec<(i32, String, i32)> = out
            .iter()
            .map(|b| {
                let c0 = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .value(0);
                let c1 = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap()
                    .value(0)
                    .to_string();
                let c2 = b
                    .column(2)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .value(0);
                (c0, c1, c2)
            })
            .collect();
        assert_eq!(rows, vec![(3, "c".into(), 3), (1, "a".into(), 1)]);
    }

    #[test]
    fn an_empty_projection_keeps_the_row_count() {
        let (build, probe) = sides();
        let schema = Arc::new(Schema::empty());
        let out = OutputAssembler::new(schema, Some(&[]), 2, 1, 8192)
            .assemble(&build, &probe, vec![0, 1, 2], vec![1, 1, 0])
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
        let out = OutputAssembler::new(schema, Some(&[2, 1]), 2, 1, 10)
            .assemble(&build, &probe, vec![0], vec![1])
            .unwrap();
        let pk = out[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap()
            .value(0);
        let bv = out[0]
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .value(0);
        assert_eq!((pk, bv), (1, "a"));
    }
}
