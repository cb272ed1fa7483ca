//! An aggregation whose device work needs more memory than the device's
//! whole budget (seed 000 §4's out-of-core partitioning, applied to the
//! group-by): the input's rows are split on the host by a hash of their
//! group keys into partitions that each fit, and the device aggregates one
//! partition after the other. Equal keys land in one partition, so the
//! partitions' groups are disjoint and their outputs, laid end to end, are
//! the aggregation's.

use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::take_record_batch;
use datafusion::common::hash_utils::{create_hashes, RandomState};

use super::*;

/// Partitions an input is split into at most; an input that would need
/// more goes to DataFusion's operator, which spills.
const MAX_PARTITIONS: usize = 256;

/// The seed of the hash the rows are split by: not DataFusion's
/// repartition seed (0), under which the rows of one partition of a hash
/// repartition on the same keys would all land in one part.
const SPLIT_SEED: u64 = 0x6f75_745f_6f66_5f63;

/// Each partition's device work is planned to need at most this share of
/// the budget: the hash of the keys spreads rows unevenly, and the budget
/// may be shared.
const PARTITION_SHARE_OF_LIMIT: f64 = 0.5;

/// The partitions (a power of two) that split device work of `requested`
/// bytes into parts of at most [`PARTITION_SHARE_OF_LIMIT`] of `limit`;
/// `None` above [`MAX_PARTITIONS`].
pub(super) fn partitions_for(requested: usize, limit: usize) -> Option<usize> {
    let share = (limit as f64 * PARTITION_SHARE_OF_LIMIT).max(1.0);
    let partitions = ((requested as f64 / share).ceil() as usize)
        .max(2)
        .next_power_of_two();
    (partitions <= MAX_PARTITIONS).then_some(partitions)
}

/// `batches`' rows split into `partitions` by a hash of the values of
/// `group_exprs` (with `-0.0` taken as `+0.0`, as the groups take it), each
/// partition's batches in input order; no row is lost or repeated.
pub(super) fn split_by_group_keys(
    batches: &[RecordBatch],
    group_exprs: &[Arc<dyn PhysicalExpr>],
    partitions: usize,
) -> Result<Vec<Vec<RecordBatch>>> {
    let random_state = RandomState::with_seed(SPLIT_SEED);
    let per_batch = map_pieces(batches.len(), |b| {
        let batch = &batches[b];
        let rows = batch.num_rows();
        let keys = group_exprs
            .iter()
            .map(|expr| Ok(vec![expr.evaluate(batch)?.into_array(rows)?]))
            .collect::<Result<Vec<_>>>()?;
        let keys: Vec<ArrayRef> = fold_negative_zeros(keys)?
            .into_iter()
            .flatten()
            .collect();
        let mut hashes = vec![0u64; rows];
        create_hashes(&keys, &random_state, &mut hashes)?;
        let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); partitions];
        for (row, hash) in hashes.iter().enumerate() {
            // The high bits: the low ones may follow the repartition's.
            rows_of[((*hash >> 32) % partitions as u64) as usize].push(row as u32);
        }
        rows_of
            .into_iter()
            .map(|rows| match rows.len() {
                0 => Ok(None),
                n if n == batch.num_rows() => Ok(Some(batch.clone())),
                _ => take_record_batch(batch, &UInt32Array::from(rows))
                    .map(Some)
                    .map_err(DataFusionError::from),
            })
            .collect::<Result<Vec<Option<RecordBatch>>>>()
    })?;
    let mut split = vec![Vec::new(); partitions];
    for parts in per_batch {
        for (partition, part) in parts.into_iter().enumerate() {
            split[partition].extend(part);
        }
    }
    Ok(split)
}

impl DeviceAggregation {
    /// The input, whose device work needs `requested` bytes where the
    /// budget holds `limit` (`too_large`), aggregated in hash partitions of
    /// its group keys that fit, one after the other; DataFusion's operator
    /// takes the whole input where that cannot be done (no group keys,
    /// groups that must leave in key order, too many partitions, a partition
    /// that still does not fit or goes to the CPU by its sample, host memory
    /// the pool refuses for the partitions' copies).
    pub(super) fn aggregate_in_partitions(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
        reservation: &mut MemoryReservation,
        too_large: (usize, usize),
    ) -> Result<Outcome> {
        let (requested, limit) = too_large;
        let Some(partitions) = partitions_for(requested, limit) else {
            return Ok(Outcome::OnCpu);
        };
        if inputs.group_exprs.is_empty() || self.group_order.is_some() {
            return Ok(Outcome::OnCpu);
        }
        // The partitions are copies of the input's rows.
        let copied: usize = batches.iter().map(get_record_batch_memory_size).sum();
        if reservation.try_grow(copied).is_err() {
            return Ok(Outcome::PoolRefused);
        }
        trace::event(|| {
            format!("aggregation: {requested} bytes for a device budget of {limit}, in {partitions} partitions")
        });
        let outcome = self.aggregate_parts(batches, inputs, reservation, partitions);
        // The copies are gone, whatever the outcome.
        reservation.shrink(copied.min(reservation.size()));
        outcome
    }

    /// [`Self::aggregate_in_partitions`] once the partitions' copies are
    /// reserved: the copies made, then aggregated one after the other.
    fn aggregate_parts(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
        reservation: &mut MemoryReservation,
        partitions: usize,
    ) -> Result<Outcome> {
        let split = split_by_group_keys(batches, &inputs.group_exprs, partitions)?;
        self.metrics.out_of_core_partitions.add(partitions);
        let mut output = Vec::new();
        for part in split.iter().filter(|part| !part.is_empty()) {
            match self.aggregate(part, inputs, reservation)? {
                Outcome::Batches(batches) => output.extend(batches),
                Outcome::PoolRefused => return Ok(Outcome::PoolRefused),
                Outcome::OnCpu | Outcome::TooLarge { .. } => return Ok(Outcome::OnCpu),
            }
        }
        Ok(Outcome::Batches(output))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field};

    #[test]
    fn partitions_leave_headroom_and_stop_at_the_most() {
        assert_eq!(partitions_for(101, 100), Some(4));
        assert_eq!(partitions_for(100, 100), Some(2));
        assert_eq!(partitions_for(1000, 100), Some(32));
        assert_eq!(partitions_for(128 * 100, 100), Some(256));
        assert_eq!(partitions_for(129 * 100, 100), None);
    }

    #[test]
    fn equal_keys_share_a_partition_and_every_row_lands_once() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
            Field::new("row", DataType::Int64, false),
        ]));
        let batch = |start: i64| {
            let rows = 1000;
            let k: Int64Array = (0..rows)
                .map(|i| ((start + i) % 7 != 0).then_some((start + i) % 97))
                .collect();
            // -0.0 and +0.0 are one group.
            let f: Float64Array = (0..rows)
                .map(|i| Some(if (start + i) % 2 == 0 { 0.0 } else { -0.0 }))
                .collect();
            let row: Int64Array = (start..start + rows).collect::<Vec<_>>().into();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(k), Arc::new(f), Arc::new(row)],
            )
            .unwrap()
        };
        let batches = vec![batch(0), batch(1000), batch(2000)];
        let exprs: Vec<Arc<dyn PhysicalExpr>> = vec![
            Arc::new(Column::new("k", 0)),
            Arc::new(Column::new("f", 1)),
        ];
        let split = split_by_group_keys(&batches, &exprs, 8).unwrap();
        assert_eq!(split.len(), 8);
        let mut seen = vec![0usize; 3000];
        let mut partition_of_key = std::collections::HashMap::new();
        let mut partitions_used = 0;
        for (partition, part) in split.iter().enumerate() {
            partitions_used += usize::from(!part.is_empty());
            for batch in part {
                let k = batch.column(0).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                let row = batch.column(2).as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                for i in 0..batch.num_rows() {
                    seen[row.value(i) as usize] += 1;
                    let key = k.is_valid(i).then(|| k.value(i));
                    let first = *partition_of_key.entry(key).or_insert(partition);
                    assert_eq!(first, partition, "key {key:?} in two partitions");
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "a row lost or repeated");
        // 98 keys (NULL among them) over 8 partitions use more than one.
        assert!(partitions_used > 1);
        assert_eq!(partition_of_key.len(), 98);
    }

    #[test]
    fn one_partition_of_datafusions_hash_repartition_still_splits() {
        // The keys a `RepartitionExec` on them (seed 0, 16 partitions)
        // sends to its partition 3: what a `FinalPartitioned` aggregation's
        // partition reads.
        let all: Vec<i64> = (0..20_000).collect();
        let column: ArrayRef = Arc::new(Int64Array::from(all.clone()));
        let mut hashes = vec![0u64; all.len()];
        create_hashes(&[column], &RandomState::with_seed(0), &mut hashes).unwrap();
        let keys: Vec<i64> = all
            .iter()
            .zip(&hashes)
            .filter(|(_, hash)| *hash % 16 == 3)
            .map(|(key, _)| *key)
            .collect();
        assert!(keys.len() > 1000);
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(keys.clone()))]).unwrap();
        let exprs: Vec<Arc<dyn PhysicalExpr>> = vec![Arc::new(Column::new("k", 0))];
        let split = split_by_group_keys(&[batch], &exprs, 8).unwrap();
        let sizes: Vec<usize> = split
            .iter()
            .map(|part| part.iter().map(RecordBatch::num_rows).sum())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), keys.len());
        // Every part within a quarter of its share.
        let share = keys.len() / 8;
        assert!(
            sizes.iter().all(|&n| n > share * 3 / 4 && n < share * 5 / 4),
            "{sizes:?}"
        );
    }
}
