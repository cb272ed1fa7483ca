//! The rows of one side of a join, as the join reads them: a batch, or the
//! batches of a probe chunk, a hash join's build side or a sort-merge
//! join's input, kept as they arrived.
//!
//! A probe chunk is not concatenated into one batch before the device sees
//! its keys: that would copy every column of every probe row through host
//! memory, while a selective join (TPC-H's `part` against all of
//! `lineitem`) needs only the keys on the device and a few rows of the
//! other columns after, and the copy would be most of such a join's time.
//! Only the key columns are made contiguous; output rows are taken from
//! the arrived batches by chunk-wide row id, and a column that goes to the
//! device is copied there piece by piece. A hash join's build side is kept
//! the same way: its keys are made contiguous once, the rest stays as it
//! came (a build side of gigabytes, such as TPC-H q18's, is slow to
//! concatenate).

use datafusion::arrow::array::{new_empty_array, new_null_array, Array, ArrayRef, UInt64Array};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExprRef;

use crate::encode::concat::concat_column_in_parallel;

use datafusion::arrow::compute::take;

/// Rows that a join takes output rows from by row id.
pub(crate) trait RowSource: Sync {
    /// Rows in all.
    fn num_rows(&self) -> usize;

    /// Columns per row.
    fn num_columns(&self) -> usize;

    /// The type of column `column`.
    fn data_type(&self, column: usize) -> &DataType;

    /// Column `column` in pieces, in row order (one piece for a batch).
    fn pieces(&self, column: usize) -> Vec<&ArrayRef>;

    /// Rows `ids` (row ids over all pieces; a NULL id makes a NULL row) of
    /// each of `columns`, in the order of `ids`. Views are not compacted:
    /// a join filter's intermediate columns are dropped at once, and
    /// output columns are compacted where they are made (see
    /// [`crate::exec::join::compact_views`]).
    fn take_columns(&self, columns: &[usize], ids: &UInt64Array) -> Result<Vec<ArrayRef>>;
}

impl RowSource for RecordBatch {
    fn num_rows(&self) -> usize {
        RecordBatch::num_rows(self)
    }

    fn num_columns(&self) -> usize {
        RecordBatch::num_columns(self)
    }

    fn data_type(&self, column: usize) -> &DataType {
        self.column(column).data_type()
    }

    fn pieces(&self, column: usize) -> Vec<&ArrayRef> {
        vec![self.column(column)]
    }

    fn take_columns(&self, columns: &[usize], ids: &UInt64Array) -> Result<Vec<ArrayRef>> {
        columns
            .iter()
            .map(|&column| Ok(take(self.column(column).as_ref(), ids, None)?))
            .collect()
    }
}

/// The batches of a probe chunk, a build side or a sort-merge join's input
/// as they arrived, never concatenated.
#[derive(Debug, Clone)]
pub(crate) struct ArrivedBatches {
    schema: SchemaRef,
    /// Non-empty batches.
    batches: Vec<RecordBatch>,
    /// The row id after each batch's last row (running row counts).
    ends: Vec<usize>,
    /// The batch that holds row `b << BLOCK_BITS`, for each block `b` of
    /// rows: a random id's batch lies between its block's and the next
    /// block's, so it is found without a search over all batches.
    block_batches: Vec<u32>,
}

/// Rows per block of [`ArrivedBatches::block_batches`].
const BLOCK_BITS: u32 = 10;

impl ArrivedBatches {
    /// The batches of `schema`, in order; empty ones are dropped.
    pub(crate) fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let ends = batches
            .iter()
            .scan(0, |end, batch| {
                *end += batch.num_rows();
                Some(*end)
            })
            .collect::<Vec<usize>>();
        let rows = ends.last().copied().unwrap_or(0);
        let mut block_batches = Vec::with_capacity(rows.div_ceil(1 << BLOCK_BITS));
        let mut batch = 0;
        for first_row in (0..rows).step_by(1 << BLOCK_BITS) {
            while ends[batch] <= first_row {
                batch += 1;
            }
            block_batches.push(batch as u32);
        }
        Self {
            schema,
            batches,
            ends,
            block_batches,
        }
    }

    /// The row id after each batch's last row.
    pub(crate) fn batch_ends(&self) -> &[usize] {
        &self.ends
    }

    /// The batches.
    pub(crate) fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// The values of `on` (key expressions) over all rows, each one
    /// contiguous array: evaluated on every batch, then concatenated on up
    /// to `threads` threads. The device needs the keys contiguous; the
    /// other columns stay in their batches.
    #[cfg(test)]
    pub(crate) fn key_columns(
        &self,
        on: &[PhysicalExprRef],
        threads: usize,
    ) -> Result<Vec<ArrayRef>> {
        let per_key = self.key_pieces(on)?;
        self.concat_key_pieces(on, &per_key, threads)
    }

    /// The values of `on` (key expressions) batch by batch: per key, one
    /// array per batch. A plain column is taken from each batch as it is
    /// (a 2^26-row side comes in 8,192 batches, and evaluating the
    /// expression costs several times as much per batch).
    pub(crate) fn key_pieces(&self, on: &[PhysicalExprRef]) -> Result<Vec<Vec<ArrayRef>>> {
        let mut per_key: Vec<Vec<ArrayRef>> =
            vec![Vec::with_capacity(self.batches.len()); on.len()];
        let columns: Vec<Option<usize>> = on
            .iter()
            .map(|expr| expr.downcast_ref::<Column>().map(Column::index))
            .collect();
        for batch in &self.batches {
            for ((pieces, expr), column) in per_key.iter_mut().zip(on).zip(&columns) {
                let taken = column.and_then(|i| batch.columns().get(i)).cloned();
                pieces.push(match taken {
                    Some(values) => values,
                    None => expr.evaluate(batch)?.into_array(batch.num_rows())?,
                });
            }
        }
        Ok(per_key)
    }

    /// [`Self::key_pieces`]' output made contiguous, one array per key, on
    /// up to `threads` threads.
    pub(crate) fn concat_key_pieces(
        &self,
        on: &[PhysicalExprRef],
        per_key: &[Vec<ArrayRef>],
        threads: usize,
    ) -> Result<Vec<ArrayRef>> {
        on.iter()
            .zip(per_key)
            .map(|(expr, pieces)| {
                let pieces: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
                match concat_column_in_parallel(&pieces, threads)? {
                    Some(array) => Ok(array),
                    None => Ok(new_empty_array(&expr.data_type(&self.schema)?)),
                }
            })
            .collect()
    }

    /// The (batch, row within it) of each id; a NULL id (the missing side
    /// of an outer join's row) is row 0 of piece `batches.len()`, where
    /// [`RowSource::take_columns`] puts a NULL. A probe chunk's ids mostly
    /// come in runs within one batch, so the batch is looked up only when
    /// an id leaves the current one; a build side's come in random order,
    /// and are looked up between the batches of their block of rows.
    fn locate(&self, ids: &UInt64Array) -> Result<Vec<(usize, usize)>> {
        let mut located = Vec::with_capacity(ids.len());
        let mut batch = 0;
        let rows = self.num_rows();
        let has_nulls = ids.null_count() > 0;
        for (i, &id) in ids.values().iter().enumerate() {
            if has_nulls && ids.is_null(i) {
                located.push((self.batches.len(), 0));
                continue;
            }
            let id = id as usize;
            let start = |b: usize| if b == 0 { 0 } else { self.ends[b - 1] };
            if batch >= self.ends.len() || id < start(batch) || id >= self.ends[batch] {
                if id >= rows {
                    return Err(DataFusionError::Internal(format!(
                        "row id {id} past the {rows} rows of a join input"
                    )));
                }
                // The id's batch lies from its block's first row's batch to
                // the next block's.
                let block = id >> BLOCK_BITS;
                let low = self.block_batches[block] as usize;
                let high = self
                    .block_batches
                    .get(block + 1)
                    .map_or(self.ends.len() - 1, |&b| b as usize);
                batch = low + self.ends[low..=high].partition_point(|&end| end <= id);
            }
            located.push((batch, id - start(batch)));
        }
        Ok(located)
    }
}

/// The batches `located` (batch, row) pairs name, in first use, and the
/// pairs renumbered over that list: `interleave` reads every piece it is
/// given, so a few rows taken from an input of thousands of small batches
/// would otherwise cost a pass over all of them for each output batch.
/// One hash map lookup per pair where the batch changes: for pairs fewer
/// than the batches.
fn referenced_pieces(mut located: Vec<(usize, usize)>) -> (Vec<usize>, Vec<(usize, usize)>) {
    let mut used: Vec<usize> = Vec::new();
    let mut index_of: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    let mut last: Option<(usize, usize)> = None;
    for (batch, _) in located.iter_mut() {
        let index = match last {
            // Ids mostly run through one batch at a time.
            Some((previous, index)) if previous == *batch => index,
            _ => *index_of.entry(*batch).or_insert_with(|| {
                used.push(*batch);
                used.len() - 1
            }),
        };
        last = Some((*batch, index));
        *batch = index;
    }
    (used, located)
}

impl RowSource for ArrivedBatches {
    fn num_rows(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn num_columns(&self) -> usize {
        self.schema.fields().len()
    }

    fn data_type(&self, column: usize) -> &DataType {
        self.schema.field(column).data_type()
    }

    fn pieces(&self, column: usize) -> Vec<&ArrayRef> {
        self.batches.iter().map(|b| b.column(column)).collect()
    }

    fn take_columns(&self, columns: &[usize], ids: &UInt64Array) -> Result<Vec<ArrayRef>> {
        if let [batch] = self.batches.as_slice() {
            return batch.take_columns(columns, ids);
        }
        if ids.is_empty() {
            return Ok(columns
                .iter()
                .map(|&c| new_empty_array(self.data_type(c)))
                .collect());
        }
        let located = self.locate(ids)?;
        // Fewer rows than batches (a small output batch over thousands of
        // tiny input batches): only the batches they use, renumbered.
        let has_nulls = ids.null_count() > 0;
        let batches = self.batches.len();
        let (used, located) = match located.len() < batches {
            true => referenced_pieces(located),
            // Every batch, and the NULL piece after them where an id is NULL.
            false => ((0..batches).chain(has_nulls.then_some(batches)).collect(), located),
        };
        columns
            .iter()
            .map(|&column| {
                // NULL ids take the one row of a NULL piece after the batches.
                let null = has_nulls.then(|| new_null_array(self.data_type(column), 1));
                let pieces = used
                    .iter()
                    .map(|&batch| match self.batches.get(batch) {
                        Some(b) => Ok(b.column(column).as_ref()),
                        None => null.as_deref().ok_or_else(|| {
                            DataFusionError::Internal("a NULL row taken without a NULL id".into())
                        }),
                    })
                    .collect::<Result<Vec<&dyn Array>>>()?;
                // One pass over the ids.
                Ok(interleave(&pieces, &located)?)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_pieces_the_ids_use_are_interleaved() {
        let located = vec![(7, 0), (7, 1), (2, 5), (7, 2), (9, 0), (2, 0)];
        let (used, renumbered) = super::referenced_pieces(located);
        assert_eq!(used, vec![7, 2, 9]);
        assert_eq!(renumbered, vec![(0, 0), (0, 1), (1, 5), (0, 2), (2, 0), (1, 0)]);
        assert_eq!(super::referenced_pieces(vec![]), (vec![], vec![]));
    }

    use super::*;
    use datafusion::arrow::array::{AsArray, Int32Array, Int64Array, StringViewArray};
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int32, true),
            Field::new("s", DataType::Utf8View, true),
        ]))
    }

    /// Batches of 3, 0, 1 and 4 rows; row i has k = 10 * i.
    fn arrived() -> ArrivedBatches {
        let batch = |from: i64, rows: i64| {
            let k: Vec<i64> = (from..from + rows).map(|i| 10 * i).collect();
            let v: Int32Array = (from..from + rows)
                .map(|i| (i % 3 != 0).then_some(i as i32))
                .collect();
            let s: StringViewArray = (from..from + rows)
                .map(|i| Some(format!("a string longer than twelve bytes {i}")))
                .collect();
            RecordBatch::try_new(
                schema(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(v), Arc::new(s)],
            )
            .unwrap()
        };
        ArrivedBatches::new(
            schema(),
            vec![batch(0, 3), batch(3, 0), batch(3, 1), batch(4, 4)],
        )
    }

    #[test]
    fn rows_are_taken_across_batches_as_from_their_concatenation() {
        let rows = arrived();
        assert_eq!(rows.batches().len(), 3, "the empty batch is dropped");
        assert_eq!(rows.batch_ends(), &[3, 4, 8]);
        assert_eq!(RowSource::num_rows(&rows), 8);
        let whole = concat_batches(&schema(), rows.batches()).unwrap();
        // Out of order, repeated, crossing every batch boundary both ways.
        let ids = UInt64Array::from(vec![7, 0, 3, 3, 2, 4, 1, 6, 0, 5]);
        let taken = rows.take_columns(&[2, 0, 1], &ids).unwrap();
        let expected = whole.take_columns(&[2, 0, 1], &ids).unwrap();
        assert_eq!(taken.len(), 3);
        for (t, e) in taken.iter().zip(&expected) {
            assert_eq!(t.as_ref(), e.as_ref());
        }
        assert_eq!(
            taken[1].as_primitive::<Int64Type>().values().to_vec(),
            vec![70, 0, 30, 30, 20, 40, 10, 60, 0, 50]
        );
        // v is NULL on rows 0, 3 and 6.
        assert_eq!(taken[2].null_count(), 5);
        assert_eq!(
            taken[0].as_string_view().value(0),
            "a string longer than twelve bytes 7"
        );
        assert_eq!(
            taken[0].as_string_view().value(9),
            "a string longer than twelve bytes 5"
        );
    }

    #[test]
    fn fewer_ids_than_batches_take_the_same_rows_nulls_included() {
        let rows = arrived();
        let whole = concat_batches(&schema(), rows.batches()).unwrap();
        // Fewer ids than the three batches: only the batches used are
        // interleaved, and a NULL id still makes a NULL row.
        for ids in [
            UInt64Array::from(vec![5]),
            UInt64Array::from(vec![Some(7), None]),
            UInt64Array::from(vec![None, Some(0)]),
            UInt64Array::from(vec![None, None]),
        ] {
            let taken = rows.take_columns(&[2, 0, 1], &ids).unwrap();
            let expected = whole.take_columns(&[2, 0, 1], &ids).unwrap();
            for (t, e) in taken.iter().zip(&expected) {
                assert_eq!(t.as_ref(), e.as_ref(), "{ids:?}");
            }
        }
    }

    #[test]
    fn random_ids_over_many_batches_and_blocks_are_found() {
        // A build side's ids come in random order over thousands of
        // batches: tiny ones many to a block of rows, and large ones
        // spanning several blocks, with empty ones between.
        let sizes: Vec<usize> = (0..1200)
            .map(|i| match i % 12 {
                0..=7 => i % 3,
                8 => 3000,
                9 => 7,
                10 => 1024,
                _ => 100,
            })
            .collect();
        let mut from = 0i64;
        let batches: Vec<RecordBatch> = sizes
            .iter()
            .map(|&n| {
                let k: Int64Array = (from..from + n as i64).collect();
                from += n as i64;
                let v: Int32Array = (0..n as i32).map(|i| (i % 4 != 0).then_some(i)).collect();
                let s: StringViewArray = (0..n).map(|i| Some(format!("row {i}"))).collect();
                RecordBatch::try_new(schema(), vec![Arc::new(k), Arc::new(v), Arc::new(s)]).unwrap()
            })
            .collect();
        let rows = ArrivedBatches::new(schema(), batches);
        let total = RowSource::num_rows(&rows) as u64;
        assert_eq!(total, from as u64);
        assert!(total > 200 << BLOCK_BITS, "{total} rows span many blocks");
        let whole = concat_batches(&schema(), rows.batches()).unwrap();
        // A multiplicative walk visits ids all over the rows, both ends too.
        let mut ids: Vec<u64> = (0..50_000u64)
            .map(|i| (i * 2_654_435_761) % total)
            .collect();
        ids.extend([0, total - 1, 1 << BLOCK_BITS, (1 << BLOCK_BITS) - 1]);
        let ids = UInt64Array::from(ids);
        let taken = rows.take_columns(&[0, 1, 2], &ids).unwrap();
        let expected = whole.take_columns(&[0, 1, 2], &ids).unwrap();
        for (t, e) in taken.iter().zip(&expected) {
            assert_eq!(t.as_ref(), e.as_ref());
        }
        // Row ids are the k column's values.
        assert_eq!(
            taken[0].as_primitive::<Int64Type>().values().to_vec(),
            ids.values().iter().map(|&i| i as i64).collect::<Vec<_>>()
        );
        let err = rows
            .take_columns(&[0], &UInt64Array::from(vec![total - 1, total]))
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("row id {total}")),
            "{err}"
        );
    }

    #[test]
    fn null_ids_take_null_rows_also_from_no_batches() {
        // The missing side of an outer join's rows has NULL ids.
        let rows = arrived();
        let whole = concat_batches(&schema(), rows.batches()).unwrap();
        let ids = UInt64Array::from(vec![Some(5), None, Some(1), None, Some(7)]);
        let taken = rows.take_columns(&[0, 1, 2], &ids).unwrap();
        let expected = whole.take_columns(&[0, 1, 2], &ids).unwrap();
        for (t, e) in taken.iter().zip(&expected) {
            assert_eq!(t.as_ref(), e.as_ref());
        }
        assert!(taken[0].is_null(1) && taken[0].is_null(3) && taken[0].is_valid(4));

        let empty = ArrivedBatches::new(schema(), vec![]);
        let all_null = UInt64Array::from(vec![None, None]);
        let taken = empty.take_columns(&[2, 0], &all_null).unwrap();
        assert_eq!(taken[0].len(), 2);
        assert_eq!(taken[0].null_count(), 2);
        assert_eq!(taken[1].data_type(), &DataType::Int64);
        assert_eq!(taken[1].null_count(), 2);
    }

    #[test]
    fn no_ids_take_empty_columns_and_a_row_past_the_end_is_an_error() {
        let rows = arrived();
        let none = rows
            .take_columns(&[0, 2], &UInt64Array::from(Vec::<u64>::new()))
            .unwrap();
        assert!(none.iter().all(|c| c.is_empty()));
        assert_eq!(none[1].data_type(), &DataType::Utf8View);
        let err = rows
            .take_columns(&[0], &UInt64Array::from(vec![1, 8]))
            .unwrap_err();
        assert!(err.to_string().contains("row id 8"), "{err}");
    }

    #[test]
    fn plain_key_columns_are_taken_from_their_batches_and_others_evaluated() {
        use datafusion::physical_expr::expressions::{col, Column};
        let rows = arrived();
        let k = col("k", &schema()).unwrap();
        let pieces = rows.key_pieces(&[k]).unwrap();
        // The batches' own arrays.
        assert_eq!(pieces[0].len(), rows.batches().len());
        for (piece, batch) in pieces[0].iter().zip(rows.batches()) {
            assert!(Arc::ptr_eq(piece, batch.column(0)));
        }
        // A column past the batch's end is the expression's own error.
        let past: PhysicalExprRef = Arc::new(Column::new("k", 7));
        assert!(rows.key_pieces(&[past]).is_err());
    }

    #[test]
    fn key_columns_are_contiguous_and_other_columns_stay_in_pieces() {
        use datafusion::logical_expr::Operator;
        use datafusion::physical_expr::expressions::{col, BinaryExpr};
        let rows = arrived();
        let pieces: Vec<usize> = rows.pieces(0).iter().map(|p| p.len()).collect();
        assert_eq!(pieces, vec![3, 1, 4]);
        let k = col("k", &schema()).unwrap();
        let doubled: PhysicalExprRef = Arc::new(BinaryExpr::new(
            Arc::clone(&k),
            Operator::Plus,
            Arc::clone(&k),
        ));
        for threads in [1, 4] {
            let keys = rows
                .key_columns(
                    &[k.clone(), doubled.clone(), col("v", &schema()).unwrap()],
                    threads,
                )
                .unwrap();
            assert_eq!(
                keys[0].as_primitive::<Int64Type>().values().to_vec(),
                (0..8).map(|i| 10 * i).collect::<Vec<i64>>()
            );
            assert_eq!(
                keys[1].as_primitive::<Int64Type>().values().to_vec(),
                (0..8).map(|i| 20 * i).collect::<Vec<i64>>()
            );
            // v keeps its NULLs (rows 0, 3, 6).
            assert_eq!(keys[2].len(), 8);
            assert_eq!(keys[2].null_count(), 3);
        }
        let none = ArrivedBatches::new(schema(), vec![]);
        let keys = none.key_columns(&[k], 2).unwrap();
        assert!(keys[0].is_empty());
        assert_eq!(keys[0].data_type(), &DataType::Int64);
    }
}
