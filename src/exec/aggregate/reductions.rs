//! Each aggregate as device reductions, and its DataFusion state rebuilt
//! from their results.
//!
//! The device produces, per group, exactly the state DataFusion's own
//! accumulator keeps (COUNT: a count; SUM, MIN, MAX: a value or NULL; AVG:
//! a count and a sum, both NULL without values). A partial aggregation
//! emits it as it is; a final one hands it to the function's own
//! `GroupsAccumulator` (`merge_batch`, then `evaluate`), so result types,
//! decimal rounding and NULL rules are DataFusion's.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::EmitTo;

use super::spec::{AggregateKind, GpuAggregate, ValueKind};
use crate::encode::words::{
    column_from_words, ordered_words, row_validity, sum_words, ColumnWords, SIGN,
};
use crate::host::mapped_ahead::MappedAhead;
use crate::ops::group_by::{DeviceWordPiece, ReduceInput, ReducedWindow, Reduction, Words};

/// How one state column comes from the reductions' results.
#[derive(Debug, Clone)]
struct StateColumn {
    /// Index of the reduction holding the values.
    reduced: usize,
    kind: ValueKind,
    /// The values are ordered words (MIN, MAX).
    ordered: bool,
    /// Index of a `Count` reduction: NULL in groups where it is zero.
    null_where_empty: Option<usize>,
}

/// The device work of every aggregate of one node, and how to read it back.
#[derive(Debug, Default)]
pub(crate) struct DeviceWork {
    pub(crate) inputs: Vec<ReduceInput>,
    pub(crate) bitmaps: Vec<Vec<u64>>,
    /// The bitmap (or none) of each unfiltered column seen, by the
    /// addresses of its pieces: aggregates over one column share it.
    bitmap_of_column: HashMap<Vec<usize>, Option<usize>>,
    /// Every aggregate's input columns `add` saw, held so that no later
    /// column's pieces can take the addresses `bitmap_of_column` knows.
    /// Moved in, not cloned: a clone of each of tens of thousands of
    /// pieces is a write to a cold cache line, milliseconds a column.
    held_inputs: Vec<Vec<Vec<ArrayRef>>>,
    /// Per aggregate, its state columns.
    states: Vec<Vec<StateColumn>>,
    /// Sum doubles in an order-independent way ([`Reduction::SumF64Fixed`]).
    deterministic_float_sums: bool,
}

impl DeviceWork {
    /// No work yet; float sums deterministic or not.
    pub(crate) fn new(deterministic_float_sums: bool) -> Self {
        Self {
            deterministic_float_sums,
            ..Self::default()
        }
    }

    /// Whether this work has the inputs (reductions, value flips and
    /// bitmaps) and state columns of `shape`, the same aggregates' work over
    /// no rows: the device memory sized from the shape then holds it.
    pub(crate) fn has_shape_of(&self, shape: &DeviceWork) -> bool {
        self.bitmaps.len() == shape.bitmaps.len()
            && self.inputs.len() == shape.inputs.len()
            && self
                .inputs
                .iter()
                .zip(&shape.inputs)
                .all(|(input, planned)| {
                    input.reduction == planned.reduction
                        && input.flip == planned.flip
                        && input.valid == planned.valid
                })
            && self.states.len() == shape.states.len()
    }

    /// The reduction whose results are aggregate `aggregate`'s one state
    /// as a signed integer (128-bit where the reduction has high words),
    /// with the word the results are XORed with to read it so: a COUNT, or
    /// a SUM of signed integers or decimals (as they are), or a MIN or MAX
    /// of signed integers (their words ordered: the sign bit flipped).
    /// `None` for any other state, and for an aggregate of several.
    pub(crate) fn integer_state(&self, aggregate: usize) -> Option<(usize, u64)> {
        let [state] = self.states.get(aggregate)?.as_slice() else {
            return None;
        };
        match (state.kind, state.ordered) {
            (ValueKind::Signed | ValueKind::Decimal128, false) => Some((state.reduced, 0)),
            (ValueKind::Signed, true) => Some((state.reduced, SIGN)),
            _ => None,
        }
    }

    fn sum_reduction(&self, kind: ValueKind) -> Reduction {
        match kind {
            ValueKind::Float64 if self.deterministic_float_sums => Reduction::SumF64Fixed,
            ValueKind::Float64 => Reduction::SumF64,
            ValueKind::Decimal128 => Reduction::SumI128,
            ValueKind::Signed | ValueKind::Unsigned => Reduction::Sum,
        }
    }

    /// The index of the validity bitmap of `column` under `filter`
    /// ([`row_validity`]), made once per unfiltered column. `column` must
    /// stay alive as long as `self` (`add` holds its inputs).
    fn validity(&mut self, column: &[ArrayRef], filter: Option<&[BooleanArray]>) -> Option<usize> {
        let key = filter.is_none().then(|| {
            column
                .iter()
                .map(|p| Arc::as_ptr(p) as *const () as usize)
                .collect()
        });
        if let Some(known) = key.as_ref().and_then(|k| self.bitmap_of_column.get(k)) {
            return *known;
        }
        let index = row_validity(column, filter).map(|bits| {
            self.bitmaps.push(bits);
            self.bitmaps.len() - 1
        });
        if let Some(key) = key {
            self.bitmap_of_column.insert(key, index);
        }
        index
    }

    fn reduce(&mut self, reduction: Reduction, words: ColumnWords, valid: Option<usize>) -> usize {
        self.inputs.push(ReduceInput {
            reduction,
            values: words.low,
            high_words: words.high,
            flip: words.flip,
            valid,
        });
        self.inputs.len() - 1
    }

    /// The count of the rows valid under `valid`: one input however many
    /// aggregates need it (a SUM, MIN, MAX or AVG of a nullable column each
    /// counts its values), so that the device counts them once.
    fn count(&mut self, valid: Option<usize>) -> usize {
        let known = self
            .inputs
            .iter()
            .position(|input| input.reduction == Reduction::Count && input.valid == valid);
        match known {
            Some(index) => index,
            None => self.reduce(Reduction::Count, ColumnWords::default(), valid),
        }
    }

    /// Adds the reductions of one aggregate over its input columns `args`
    /// (its argument, or its partial states; each column in pieces, one per
    /// input batch, held from now on), with its FILTER (in the same pieces)
    /// if any.
    /// `with_keys`: every group has a row (without keys the one group
    /// exists even without rows, and its SUM, MIN, MAX are then NULL).
    pub(crate) fn add(
        &mut self,
        aggregate: &GpuAggregate,
        merges_states: bool,
        args: Vec<Vec<ArrayRef>>,
        filter: Option<&[BooleanArray]>,
        with_keys: bool,
    ) -> Result<()> {
        let arg = |i: usize| -> Result<(&[ArrayRef], ValueKind)> {
            let array = args
                .get(i)
                .ok_or_else(|| DataFusionError::Internal(format!("aggregate input {i} missing")))?;
            let kind = aggregate.inputs.get(i).copied().flatten();
            Ok((array.as_slice(), kind.unwrap_or(ValueKind::Signed)))
        };
        let mut states = Vec::new();
        match (aggregate.kind, merges_states) {
            (AggregateKind::Count, false) => {
                let (array, _) = arg(0)?;
                let valid = self.validity(array, filter);
                let reduced = self.count(valid);
                states.push(plain(reduced, ValueKind::Signed));
            }
            (AggregateKind::Count, true) => {
                let (array, kind) = arg(0)?;
                let valid = self.validity(array, None);
                let reduced = self.reduce(Reduction::Sum, sum_words(array, kind)?, valid);
                states.push(plain(reduced, ValueKind::Signed));
            }
            (AggregateKind::Sum, _) => {
                let (array, kind) = arg(0)?;
                states.push(self.sum(array, kind, filter, with_keys)?);
            }
            (AggregateKind::Min | AggregateKind::Max, _) => {
                let (array, kind) = arg(0)?;
                let valid = self.validity(array, filter);
                let nullable = valid.is_some() || !with_keys;
                let wide = kind == ValueKind::Decimal128;
                let reduction = match (aggregate.kind == AggregateKind::Min, wide) {
                    (true, false) => Reduction::Min,
                    (true, true) => Reduction::MinI128,
                    (false, false) => Reduction::Max,
                    (false, true) => Reduction::MaxI128,
                };
                let reduced = self.reduce(reduction, ordered_words(array, kind)?, valid);
                states.push(StateColumn {
                    reduced,
                    kind,
                    ordered: true,
                    null_where_empty: nullable.then(|| self.count(valid)),
                });
            }
            (AggregateKind::Avg, false) => {
                let (array, kind) = arg(0)?;
                let valid = self.validity(array, filter);
                let count = self.count(valid);
                let sum = self.reduce(self.sum_reduction(kind), sum_words(array, kind)?, valid);
                // DataFusion's AVG state is NULL, count included, in a group
                // without values (a count of 0 would be divided by).
                states.push(StateColumn {
                    reduced: count,
                    kind: ValueKind::Unsigned,
                    ordered: false,
                    null_where_empty: Some(count),
                });
                states.push(StateColumn {
                    reduced: sum,
                    kind,
                    ordered: false,
                    null_where_empty: Some(count),
                });
            }
            (AggregateKind::Avg, true) => {
                let (counts, count_kind) = arg(0)?;
                let valid = self.validity(counts, None);
                let count = self.reduce(Reduction::Sum, sum_words(counts, count_kind)?, valid);
                // As DataFusion's merge: a group has a count once any of its
                // partial counts is not NULL.
                let seen = (valid.is_some() || !with_keys).then(|| self.count(valid));
                states.push(StateColumn {
                    reduced: count,
                    kind: ValueKind::Unsigned,
                    ordered: false,
                    null_where_empty: seen,
                });
                let (sums, kind) = arg(1)?;
                states.push(self.sum(sums, kind, None, with_keys)?);
            }
        }
        self.states.push(states);
        self.held_inputs.push(args);
        Ok(())
    }

    /// Adds the reductions of one aggregate over raw rows (not states)
    /// whose arguments lie on the device without NULLs (the columns of a
    /// cached table, [`super::cached_input`]): per argument, its words and
    /// value kind, `None` for a literal (a count of every row). `Err` names
    /// what this cannot take (the caller then reads the rows on the host).
    pub(crate) fn add_on_device(
        &mut self,
        aggregate: &GpuAggregate,
        args: &[Option<(&[DeviceWordPiece], ValueKind)>],
        with_keys: bool,
    ) -> std::result::Result<(), String> {
        let words = |pieces: &[DeviceWordPiece], sign_only: bool| {
            Words::on_device(
                pieces
                    .iter()
                    .map(|piece| DeviceWordPiece {
                        sign_only,
                        ..piece.clone()
                    })
                    .collect(),
            )
        };
        let column = |kind: ValueKind, flip: u64, pieces: &[DeviceWordPiece]| ColumnWords {
            low: words(pieces, false),
            high: match kind {
                ValueKind::Decimal128 => words(pieces, true),
                _ => Words::default(),
            },
            flip,
        };
        let name = aggregate.expr.fun().name().to_string();
        let mut states = Vec::new();
        match (aggregate.kind, args) {
            (AggregateKind::Count, [_]) => {
                let reduced = self.count(None);
                states.push(plain(reduced, ValueKind::Signed));
            }
            (AggregateKind::Sum | AggregateKind::Avg, [Some((pieces, kind))])
                if *kind != ValueKind::Unsigned =>
            {
                let count = (aggregate.kind == AggregateKind::Avg || !with_keys)
                    .then(|| self.count(None));
                let sum = self.reduce(self.sum_reduction(*kind), column(*kind, 0, pieces), None);
                if aggregate.kind == AggregateKind::Avg {
                    states.push(StateColumn {
                        reduced: count.unwrap_or_default(),
                        kind: ValueKind::Unsigned,
                        ordered: false,
                        null_where_empty: count,
                    });
                }
                states.push(StateColumn {
                    reduced: sum,
                    kind: *kind,
                    ordered: false,
                    null_where_empty: count,
                });
            }
            (AggregateKind::Min | AggregateKind::Max, [Some((pieces, ValueKind::Signed))]) => {
                let reduction = match aggregate.kind {
                    AggregateKind::Min => Reduction::Min,
                    _ => Reduction::Max,
                };
                let reduced =
                    self.reduce(reduction, column(ValueKind::Signed, SIGN, pieces), None);
                states.push(StateColumn {
                    reduced,
                    kind: ValueKind::Signed,
                    ordered: true,
                    null_where_empty: (!with_keys).then(|| self.count(None)),
                });
            }
            _ => return Err(format!("{name} over these arguments")),
        }
        self.states.push(states);
        Ok(())
    }

    fn sum(
        &mut self,
        array: &[ArrayRef],
        kind: ValueKind,
        filter: Option<&[BooleanArray]>,
        with_keys: bool,
    ) -> Result<StateColumn> {
        let valid = self.validity(array, filter);
        let nullable = valid.is_some() || !with_keys;
        let reduced = self.reduce(self.sum_reduction(kind), sum_words(array, kind)?, valid);
        Ok(StateColumn {
            reduced,
            kind,
            ordered: false,
            null_where_empty: nullable.then(|| self.count(valid)),
        })
    }

    /// The reductions whose results aggregate `index`'s columns are made
    /// from: those of its values and the counts that make them NULL.
    pub(crate) fn reductions_of(&self, index: usize) -> Vec<usize> {
        let mut reductions: Vec<usize> = self.states[index]
            .iter()
            .flat_map(|column| std::iter::once(column.reduced).chain(column.null_where_empty))
            .collect();
        reductions.sort_unstable();
        reductions.dedup();
        reductions
    }

    /// The output columns of aggregate `index` for the groups `groups` (a
    /// range of the groups whose results `reduced` holds, so that batches
    /// are built on several threads, each owning its memory): its final value (`final_output`), computed
    /// by the function's own accumulator from the state the device
    /// produced, or that state.
    pub(crate) fn finish(
        &self,
        index: usize,
        aggregate: &GpuAggregate,
        reduced: &[ReducedWindow<'_>],
        groups: Range<usize>,
        final_output: bool,
        memory: &MappedAhead,
    ) -> Result<Vec<ArrayRef>> {
        let columns = &self.states[index];
        if columns.len() != aggregate.state_fields.len() {
            return Err(DataFusionError::Internal(format!(
                "{} state columns for {} state fields",
                columns.len(),
                aggregate.state_fields.len()
            )));
        }
        // State columns merged into the function's accumulator below are
        // read once and dropped: only the columns that leave as output
        // take buffers mapped ahead.
        let merged = final_output && !aggregate.state_is_final_value;
        let no_mapping = MappedAhead::none();
        let memory = if merged { &no_mapping } else { memory };
        let state = columns
            .iter()
            .zip(&aggregate.state_fields)
            .map(|(column, field)| {
                let result = &reduced[column.reduced];
                let valid = match column.null_where_empty {
                    Some(count) => Some(
                        window(&reduced[count].values, &groups)?
                            .iter()
                            .map(|&c| c > 0)
                            .collect(),
                    ),
                    None => None,
                };
                let high = if result.high_words.is_empty() {
                    &[][..]
                } else {
                    window(&result.high_words, &groups)?
                };
                column_from_words(
                    field.data_type(),
                    column.kind,
                    column.ordered,
                    window(&result.values, &groups)?,
                    high,
                    valid,
                    memory,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        if !final_output || aggregate.state_is_final_value {
            // Already the state DataFusion's accumulator would emit (its
            // types, and NULL exactly where it has seen no value), one row
            // per group: merging it into a fresh accumulator only to read
            // it back out would copy it twice. Where the function's final
            // value is its state, that holds for the final output too.
            return Ok(state);
        }
        let groups = groups.len();
        let mut accumulator = aggregate.expr.create_groups_accumulator()?;
        let group_indices: Vec<usize> = (0..groups).collect();
        accumulator.merge_batch(&state, &group_indices, groups)?;
        Ok(vec![accumulator.evaluate(EmitTo::All)?])
    }
}

/// The results of the groups `groups`.
fn window<'a>(words: &'a [u64], groups: &Range<usize>) -> Result<&'a [u64]> {
    words.get(groups.clone()).ok_or_else(|| {
        DataFusionError::Internal(format!("groups {groups:?} of {} results", words.len()))
    })
}

fn plain(reduced: usize, kind: ValueKind) -> StateColumn {
    StateColumn {
        reduced,
        kind,
        ordered: false,
        null_where_empty: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    #[test]
    fn aggregates_over_one_column_share_its_bitmap_but_not_under_a_filter() {
        let with_nulls: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![Some(1), None]))];
        let other: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![None, Some(2)]))];
        let no_nulls: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![1, 2]))];
        let mut work = DeviceWork::default();
        let first = work.validity(&with_nulls, None);
        assert_eq!(first, Some(0));
        assert_eq!(work.validity(&with_nulls, None), first);
        assert_eq!(work.validity(&other, None), Some(1));
        assert_eq!(work.validity(&no_nulls, None), None);
        let filter = [BooleanArray::from(vec![true, false])];
        assert_eq!(work.validity(&with_nulls, Some(&filter)), Some(2));
        assert_eq!(work.bitmaps, vec![vec![0b01], vec![0b10], vec![0b01]]);
    }

    /// A column's maximum and its count, as `add` makes them for a MAX.
    fn max_and_count(column: &[ArrayRef]) -> DeviceWork {
        let mut work = DeviceWork::default();
        let valid = work.validity(column, None);
        let words = ordered_words(column, ValueKind::Signed).unwrap();
        work.reduce(Reduction::Max, words, valid);
        work.count(valid);
        work
    }

    #[test]
    fn work_over_no_rows_has_the_shape_of_work_over_values_without_nulls() {
        let shape = max_and_count(&[]);
        assert!(shape.inputs.iter().all(|input| input.values.is_empty()));
        let no_nulls: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![1, -2])),
            Arc::new(Int64Array::from(vec![3])),
        ];
        assert!(max_and_count(&no_nulls).has_shape_of(&shape));
        // A NULL needs a bitmap, which the shape did not size.
        let with_nulls: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![Some(1), None]))];
        assert!(!max_and_count(&with_nulls).has_shape_of(&shape));
        // Another reduction, or another flip of the values, is another shape.
        let mut sum = DeviceWork::default();
        sum.reduce(
            Reduction::Sum,
            sum_words(&no_nulls, ValueKind::Signed).unwrap(),
            None,
        );
        sum.count(None);
        assert!(!sum.has_shape_of(&shape));
    }

    /// The reductions' results of two groups whose values were [5, 7] and
    /// [-3], as the device would leave them for each of `work`'s inputs.
    fn two_groups_results(work: &DeviceWork) -> Vec<Vec<u64>> {
        let sign = 1u64 << 63;
        work.inputs
            .iter()
            .map(|input| match input.reduction {
                // Minima and maxima come back as ordered words.
                Reduction::Max => vec![7u64 ^ sign, (-3i64 as u64) ^ sign],
                Reduction::Count => vec![2, 1],
                Reduction::Sum => vec![12, -3i64 as u64],
                Reduction::SumF64 => vec![12f64.to_bits(), (-3f64).to_bits()],
                other => panic!("no results made up for {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn only_columns_that_leave_as_output_take_buffers_mapped_ahead() {
        use datafusion::arrow::array::{AsArray, Float64Array};
        use datafusion::arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};
        use datafusion::datasource::MemTable;
        use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, UnboundedMemoryPool};
        use datafusion::physical_plan::aggregates::AggregateExec;
        use datafusion::physical_plan::ExecutionPlan;
        use datafusion::prelude::{SessionConfig, SessionContext};

        use crate::exec::aggregate::AggregateSpec;

        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("x", DataType::Int64, false),
        ]));
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
        let table = MemTable::try_new(Arc::clone(&schema), vec![vec![]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let plan = ctx
            .sql("SELECT k, max(x), avg(x) FROM t GROUP BY k")
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let mut plans: Vec<Arc<dyn ExecutionPlan>> = vec![plan];
        let mut spec = None;
        while let Some(plan) = plans.pop() {
            if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
                spec = Some(AggregateSpec::try_new(aggregate).unwrap());
            }
            plans.extend(plan.children().into_iter().cloned());
        }
        let spec = spec.expect("an aggregation");
        let x: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![5, 7, -3]))];
        let mut work = DeviceWork::new(false);
        for aggregate in &spec.aggregates {
            work.add(aggregate, spec.merges_states, vec![x.clone()], None, true)
                .unwrap();
        }
        let results = two_groups_results(&work);
        let reduced: Vec<ReducedWindow<'_>> = results
            .iter()
            .map(|values| ReducedWindow {
                values: values.as_slice().into(),
                high_words: (&[][..]).into(),
            })
            .collect();
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let mapped = MappedAhead::start(4, 8, 1, MemoryConsumer::new("t").register(&pool));
        mapped.wait_for_buffers(4);
        // MAX leaves its state as its value: its column takes a buffer.
        let max = work
            .finish(0, &spec.aggregates[0], &reduced, 0..2, true, &mapped)
            .unwrap();
        assert_eq!(
            max[0].as_primitive::<Int64Type>(),
            &Int64Array::from(vec![7, -3])
        );
        assert_eq!(mapped.taken(), 1);
        // AVG's count and sum are merged into its accumulator and dropped:
        // they take none, and its value is the accumulator's own.
        let avg = work
            .finish(1, &spec.aggregates[1], &reduced, 0..2, true, &mapped)
            .unwrap();
        assert_eq!(
            avg[0].as_primitive::<Float64Type>(),
            &Float64Array::from(vec![6.0, -3.0])
        );
        assert_eq!(mapped.taken(), 1);
        // As partial states, both of AVG's columns leave: they take two.
        let states = work
            .finish(1, &spec.aggregates[1], &reduced, 0..2, false, &mapped)
            .unwrap();
        assert_eq!(states.len(), 2);
        assert_eq!(mapped.taken(), 3);
    }
}
