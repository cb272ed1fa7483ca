//! Group numbering launched and not yet finished: the inputs checked, and the
//! numbering each algorithm leaves pending.

use super::*;

pub(super) fn check_inputs(
    keys: Option<&Words>,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
) -> GpuResult<()> {
    if let Some(keys) = keys {
        if keys.len() != rows {
            return Err(GpuError::Invalid(format!(
                "{} keys for {rows} rows",
                keys.len()
            )));
        }
    }
    for bits in bitmaps {
        if bits.len() != rows.div_ceil(64) {
            return Err(GpuError::Invalid(format!(
                "validity bitmap of {} words for {rows} rows",
                bits.len()
            )));
        }
    }
    for input in inputs {
        let values = if input.reduction == Reduction::Count {
            0
        } else {
            rows
        };
        let high = if input.reduction.is_wide() { rows } else { 0 };
        if input.values.len() != values || input.high_words.len() != high {
            return Err(GpuError::Invalid(format!(
                "{:?} over {} words and {} high words for {rows} rows",
                input.reduction,
                input.values.len(),
                input.high_words.len()
            )));
        }
        if input.valid.is_some_and(|i| i >= bitmaps.len()) {
            return Err(GpuError::Invalid(format!(
                "validity bitmap {:?} of {}",
                input.valid,
                bitmaps.len()
            )));
        }
    }
    Ok(())
}

/// Stage 1 on the device, enqueued: the group id of every row.
pub(super) struct PendingGroups {
    /// The keys, kept for the gather of each group's key word: in row
    /// order (hashed ids), or sorted (sorted ids).
    pub(super) keys: DeviceVec<u64>,
    pub(super) group_count: DeviceVec<u64>,
    /// Where each group's first row is in `keys`: its row (hashed ids), or
    /// its position in the sorted keys (sorted ids).
    pub(super) first_rows: DeviceVec<u64>,
    pub(super) row_groups: PendingRowGroups,
    pub(super) rows: usize,
    /// Partitioned ids: positions stand for rows of their own.
    pub(super) partitioned: Option<PartitionedPositions>,
}

/// What a partitioned numbering leaves beside its positions.
pub(super) struct PartitionedPositions {
    /// The row at each position of the partitioned keys.
    pub(super) row_ids: DeviceVec<u64>,
    /// Nonzero where a partition held too many groups to be numbered.
    pub(super) overflow: DeviceVec<u64>,
}

/// Where stage 1 leaves each row's group, before the host has read what
/// it found.
pub(super) enum PendingRowGroups {
    /// A group id per row.
    Ids(DeviceVec<u64>),
    /// A slot per row of a table sized from an estimate, resolved into
    /// group ids once the table is known not to have filled up.
    Slots {
        row_slots: DeviceVec<u64>,
        table: SizedTable,
    },
    /// Every input folded into the slots of a table sized from an estimate
    /// ([`launch_table_folds`]), no group per row: moved to the groups once the
    /// table is known not to have filled up.
    Folded(TableFolds),
}

/// What stage 1 leaves for stage 2 once the host knows its table held.
pub(super) enum NumberedRows {
    /// The group of every row, for each input's reduction.
    RowGroups(DeviceVec<u64>),
    /// Every input already folded into the table's slots.
    Folded(TableFolds),
}

/// A hash table sized from an estimate of the groups, which may have
/// filled up ([`launch::group_insert`] with an overflow flag).
pub(super) struct SizedTable {
    pub(super) table_groups: DeviceVec<u64>,
    pub(super) capacity: u64,
    /// One entry, nonzero where the table filled up.
    pub(super) overflow: DeviceVec<u64>,
}

/// Enqueues stage 1 as `ids` asks, over the device `keys` (`None`: no
/// rows), with `folds` folded into a hash table sized from an estimate
/// where given ([`table_fold_capacity`] says where).
pub(super) fn launch_pending_groups(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: Option<DeviceVec<u64>>,
    ids: GroupIds,
    folds: Option<FoldInputs<'_>>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    match ids {
        GroupIds::Hashed { expected_groups } => {
            launch_group_assignment(device, stream, keys, None, expected_groups, folds, timer)
        }
        GroupIds::Partitioned { partition_bits } => {
            launch_partitioned_group_assignment(device, stream, keys, partition_bits, timer)
        }
        GroupIds::HashedInKeyOrder {
            transform,
            expected_groups,
            ..
        } => launch_group_assignment(
            device,
            stream,
            keys,
            transform,
            expected_groups,
            folds,
            timer,
        ),
        GroupIds::Sorted {
            key_bits,
            transform,
        } => launch_sorted_group_assignment(device, stream, keys, key_bits, transform, timer),
    }
}
