//! The predicate a probe side's scan tests its rows with: whether the join
//! key is among the build side's keys.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::compute::kernels::boolean::and;
use datafusion::arrow::compute::{filter_record_batch, prep_null_mask_filter};
use datafusion::common::ScalarValue;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::arrow::array::RecordBatch;

use super::bitmap::KeyBitmap;
use super::set::{JoinKeySet, MAX_KEPT_SHARE};

/// `key IN (the build side's keys)`, once the build side's every partition
/// was read (see [`JoinKeySet`]); before, and where no set could be made,
/// true for every row. Never NULL: a NULL key is false once the set is
/// there (it matches no build row in a join where NULL equals nothing).
///
/// A row it drops has no match on the build side, so it only holds where
/// such probe rows make no output: inner, left, left semi, right semi, left
/// anti and left mark joins where NULL equals nothing and NULLs are not
/// awaited (`NOT IN`).
#[derive(Debug, Clone)]
pub struct JoinKeyFilterExpr {
    key: Arc<dyn PhysicalExpr>,
    keys: Arc<JoinKeySet>,
    /// The smallest and largest key of the probe side, where statistics
    /// know them: how much of its range the keys cover estimates the share
    /// of rows the test keeps.
    probe_range: Option<(i64, i64)>,
    /// The share of rows the latest set keeps ([`Self::kept_share`]), by
    /// the set's id: counted once a set, not once a batch.
    share: Arc<Mutex<Option<(u64, f64)>>>,
}

impl JoinKeyFilterExpr {
    /// The test of `key` against `keys`, whose probe side's keys lie
    /// within `probe_range` where it is known.
    pub fn new(
        key: Arc<dyn PhysicalExpr>,
        keys: Arc<JoinKeySet>,
        probe_range: Option<(i64, i64)>,
    ) -> Self {
        Self {
            key,
            keys,
            probe_range,
            share: Arc::default(),
        }
    }

    /// About the share of the probe side's rows the test keeps, once the
    /// set is there: the share of the probe keys' range (or, unknown, of
    /// the values the set spans) that the set holds.
    pub fn kept_share(&self) -> Option<f64> {
        let keys = self.keys.keys()?;
        Some(self.share_of(&keys))
    }

    fn share_of(&self, keys: &KeyBitmap) -> f64 {
        let id = keys.id();
        let mut share = self.share.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match *share {
            Some((seen, kept)) if seen == id => kept,
            _ => {
                let kept = keys.share_of(self.probe_range);
                *share = Some((id, kept));
                kept
            }
        }
    }

    /// The key tested.
    pub fn key(&self) -> &Arc<dyn PhysicalExpr> {
        &self.key
    }

    /// The set it is tested against.
    pub fn keys(&self) -> &Arc<JoinKeySet> {
        &self.keys
    }
}

impl fmt::Display for JoinKeyFilterExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} IN join keys #{}", self.key, self.keys.id())
    }
}

impl PartialEq for JoinKeyFilterExpr {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.keys, &other.keys) && self.key.as_ref() == other.key.as_ref()
    }
}

impl Eq for JoinKeyFilterExpr {}

impl Hash for JoinKeyFilterExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.keys.id().hash(state);
        self.key.hash(state);
    }
}

impl PhysicalExpr for JoinKeyFilterExpr {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _input_schema: &Schema) -> Result<bool> {
        Ok(false)
    }

    /// On the host (a CPU filter, or a part the device could not take): no
    /// set, or one estimated to keep more than [`MAX_KEPT_SHARE`] of the
    /// rows, passes every row as it is.
    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let rows = batch.num_rows();
        let every_row = ColumnarValue::Scalar(ScalarValue::Boolean(Some(true)));
        let Some(keys) = self.keys.keys() else {
            return Ok(every_row);
        };
        if self.share_of(&keys) > MAX_KEPT_SHARE {
            return Ok(every_row);
        }
        let array = self.key.evaluate(batch)?.into_array(rows)?;
        let mut values = Vec::with_capacity(rows);
        if !super::collector::append_key_values(&array, &mut values) && rows > 0 {
            return Err(DataFusionError::Internal(format!(
                "join keys of type {} tested against a set of integers",
                array.data_type()
            )));
        }
        // No NULL among them: one key a row.
        if values.len() == rows {
            let passes = BooleanBuffer::collect_bool(rows, |row| keys.contains(values[row]));
            return Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(passes, None))));
        }
        // `values` holds the valid rows' keys in order.
        let mut valid = values.into_iter();
        let passes: BooleanArray = (0..rows)
            .map(|row| {
                Some(array.is_valid(row) && valid.next().is_some_and(|v| keys.contains(v)))
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(passes)))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.key]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        match (children.pop(), children.is_empty()) {
            (Some(key), true) => Ok(Arc::new(Self {
                key,
                keys: Arc::clone(&self.keys),
                probe_range: self.probe_range,
                share: Arc::clone(&self.share),
            })),
            _ => Err(DataFusionError::Internal(
                "a join key test has one child".into(),
            )),
        }
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// About the share of a scan's rows that the join key tests among
/// `predicates` keep together: the least of their estimates
/// ([`JoinKeyFilterExpr::kept_share`]) whose sets are there; `None` where
/// none is. A scan that tests nothing else reads the device only where it
/// is at most [`MAX_KEPT_SHARE`] (or, outputting strings kept as their
/// bytes from files, [`super::MAX_KEPT_SHARE_OF_STRINGS`]).
pub(crate) fn kept_by_join_keys<'a>(
    predicates: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
) -> Option<f64> {
    predicates
        .into_iter()
        .filter_map(|predicate| predicate.downcast_ref::<JoinKeyFilterExpr>())
        .filter_map(JoinKeyFilterExpr::kept_share)
        .reduce(f64::min)
}

/// `batch`'s rows that pass every one of `tests` (join key tests over its
/// columns, each passing every row while its set is not there or would keep
/// many rows), the batch itself where every test passes every row.
pub(crate) fn rows_passing(batch: RecordBatch, tests: &[Arc<dyn PhysicalExpr>]) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut passing: Option<BooleanArray> = None;
    for test in tests {
        let passes = match test.evaluate(&batch)? {
            ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))) => continue,
            value => value.into_array(rows)?,
        };
        let passes = passes.as_boolean_opt().ok_or_else(|| {
            DataFusionError::Internal(format!("a join key test of type {}", passes.data_type()))
        })?;
        // NULL fails, as in a filter.
        let passes = match passes.null_count() {
            0 => passes.clone(),
            _ => prep_null_mask_filter(passes),
        };
        passing = Some(match passing {
            Some(before) => and(&before, &passes)?,
            None => passes,
        });
    }
    match passing {
        Some(passing) => Ok(filter_record_batch(&batch, &passing)?),
        None => Ok(batch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::Column;

    #[test]
    fn rows_pass_while_there_is_no_set_then_only_build_keys() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let column: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(5), Some(2)]));
        let batch = RecordBatch::try_new(schema, vec![column]).unwrap();
        let keys = Arc::new(JoinKeySet::new(1));
        let key = || Arc::new(Column::new("k", 0)) as Arc<dyn PhysicalExpr>;
        let expr = JoinKeyFilterExpr::new(key(), Arc::clone(&keys), Some((0, 19)));
        let passes = |expr: &JoinKeyFilterExpr| -> Vec<bool> {
            let result = expr.evaluate(&batch).unwrap().into_array(4).unwrap();
            result.as_boolean().iter().map(|v| v.unwrap()).collect()
        };
        assert_eq!(passes(&expr), [true; 4]);
        assert_eq!(expr.kept_share(), None);
        let round = keys.start(0);
        keys.finish(round, Some(vec![2, 5, 9]));
        assert_eq!(passes(&expr), [false, false, true, true]);
        assert_eq!(expr.kept_share(), Some(0.15), "3 of the 20 probe keys 0 to 19");
        assert!(expr.to_string().contains("IN join keys #"));
        // A set that holds more than a quarter of the probe keys' range
        // is not worth testing on the host: every row passes.
        let narrow = JoinKeyFilterExpr::new(key(), Arc::clone(&keys), Some((0, 9)));
        assert_eq!(narrow.kept_share(), Some(0.3));
        assert_eq!(passes(&narrow), [true; 4]);
        // The next round's set is counted anew.
        keys.start(0);
        let next = keys.start(0);
        keys.finish(next, Some((0..20).collect()));
        assert_eq!(expr.kept_share(), Some(1.0));
        assert_eq!(passes(&expr), [true; 4]);
    }

    #[test]
    fn a_column_with_and_without_nulls_is_tested_row_by_row() {
        // Keys -3 to 3000 (every seventh NULL where `nulls`) against a set
        // of the multiples of 5 in 0..1000 and -2: the same answers
        // either way, a NULL never passing.
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let keys = Arc::new(JoinKeySet::new(1));
        let round = keys.start(0);
        let set: Vec<i64> = (0..1000).filter(|k| k % 5 == 0).chain([-2]).collect();
        keys.finish(round, Some(set.clone()));
        let expr = JoinKeyFilterExpr::new(
            Arc::new(Column::new("k", 0)),
            Arc::clone(&keys),
            Some((-3, 30_000)),
        );
        for nulls in [false, true] {
            let values: Vec<Option<i64>> = (-3..3000)
                .map(|k| (!nulls || k % 7 != 0).then_some(k))
                .collect();
            let column: ArrayRef = Arc::new(Int64Array::from(values.clone()));
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column]).unwrap();
            let result = expr.evaluate(&batch).unwrap().into_array(values.len()).unwrap();
            let result = result.as_boolean();
            assert_eq!(result.null_count(), 0);
            let expected: Vec<bool> = values
                .iter()
                .map(|v| v.is_some_and(|v| set.contains(&v)))
                .collect();
            let got: Vec<bool> = result.iter().map(|v| v.unwrap()).collect();
            assert_eq!(got, expected, "nulls: {nulls}");
        }
    }

    #[test]
    fn rows_passing_keeps_the_rows_every_test_passes_and_drops_nulls() {
        use datafusion::arrow::array::BooleanArray;
        use datafusion::physical_expr::expressions::lit;
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Boolean, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("v", DataType::Int64, false),
        ]));
        let a = BooleanArray::from(vec![Some(true), None, Some(true), Some(false), Some(true)]);
        let b = BooleanArray::from(vec![Some(true), Some(true), Some(false), Some(true), Some(true)]);
        let v = Int64Array::from(vec![1, 2, 3, 4, 5]);
        let batch = RecordBatch::try_new(schema, vec![Arc::new(a), Arc::new(b), Arc::new(v)]).unwrap();
        let column = |name: &str, index: usize| Arc::new(Column::new(name, index)) as Arc<dyn PhysicalExpr>;
        let kept = |tests: &[Arc<dyn PhysicalExpr>]| -> Vec<i64> {
            let passed = rows_passing(batch.clone(), tests).unwrap();
            passed.column(2).as_primitive::<datafusion::arrow::datatypes::Int64Type>().values().to_vec()
        };
        // A test that passes every row as a scalar leaves the batch whole.
        assert_eq!(kept(&[lit(true)]), [1, 2, 3, 4, 5]);
        assert_eq!(kept(&[]), [1, 2, 3, 4, 5]);
        // NULL fails; two tests must both pass.
        assert_eq!(kept(&[column("a", 0)]), [1, 3, 5]);
        assert_eq!(kept(&[column("a", 0), lit(true), column("b", 1)]), [1, 5]);
        // A test that is not boolean is an error, not a guess.
        assert!(rows_passing(batch.clone(), &[column("v", 2)]).is_err());
    }

    use datafusion::arrow::array::ArrayRef;
}
