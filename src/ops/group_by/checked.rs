//! Hashed group keys checked on the host, and rows numbered again in the
//! global table where the check found keys that shared a hash.

use crate::gpu::alloc_uninit;
use super::*;

/// What numbering the rows again ([`number_again_in_global_table`]) writes
/// over, and the keys it reads.
pub(super) struct Numbering<'a> {
    pub(super) keys: &'a DeviceVec<u64>,
    pub(super) first_rows: &'a mut DeviceVec<u64>,
    pub(super) group_count: &'a mut DeviceVec<u64>,
}

impl Numbering<'_> {
    /// The same numbering, borrowed for one call.
    pub(super) fn reborrow(&mut self) -> Numbering<'_> {
        Numbering {
            keys: self.keys,
            first_rows: &mut *self.first_rows,
            group_count: &mut *self.group_count,
        }
    }
}

/// The group of every row, once a table sized from an estimate is known
/// not to have filled up (its slots then resolved into group ids), or the
/// inputs folded into such a table. Where it filled up, the rows are
/// numbered again in a table sized to them (`true`), without folds. Waits
/// for the device where the table was sized from an estimate.
pub(super) fn checked_row_groups(
    pending: PendingRowGroups,
    numbering: Numbering<'_>,
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    timer: &mut PhaseTimer,
) -> GpuResult<(NumberedRows, bool)> {
    let sized_table = match &pending {
        PendingRowGroups::Ids(_) => None,
        PendingRowGroups::Slots { table, .. } => Some(table),
        PendingRowGroups::Folded(folded) => Some(&folded.table),
    };
    let Some(table) = sized_table else {
        let PendingRowGroups::Ids(ids) = pending else {
            unreachable!("only ids come without a sized table")
        };
        return Ok((NumberedRows::RowGroups(ids), false));
    };
    let capacity = table.capacity;
    let mut overflow = Vec::with_capacity(1);
    download_u64(
        device,
        stream,
        &table.overflow.as_view(),
        &mut overflow,
        timer,
    )?;
    if overflow[0] == 0 {
        let numbered = match pending {
            PendingRowGroups::Ids(ids) => NumberedRows::RowGroups(ids),
            PendingRowGroups::Slots {
                mut row_slots,
                table,
            } => {
                timer.time(Phase::Kernel, || {
                    launch::group_resolve(
                        &device.launcher(stream),
                        &mut row_slots,
                        &table.table_groups)
                })?;
                NumberedRows::RowGroups(row_slots)
            }
            PendingRowGroups::Folded(folded) => NumberedRows::Folded(folded),
        };
        return Ok((numbered, false));
    }
    trace::event(|| {
        format!(
            "aggregation: a hash table of {capacity} slots filled up; the rows are numbered again"
        )
    });
    // Every output of the first try is incomplete: start again, with the
    // small table (and its folds) freed first, in stream order, so that the
    // device holds no more than a table sized to the rows.
    let mut row_groups = match pending {
        PendingRowGroups::Slots { row_slots, table } => {
            drop(table);
            row_slots
        }
        other => {
            drop(other);
            // The numbering below writes every row's group.
            alloc_uninit(stream, numbering.keys.len(), "allocating row groups")?
        }
    };
    number_again_in_global_table(device, stream, numbering, &mut row_groups, timer)?;
    Ok((NumberedRows::RowGroups(row_groups), true))
}

/// Enqueues the numbering of every row again, the group count reset
/// first, in a table sized to the rows: where a smaller table or a
/// partition filled up.
pub(super) fn number_again_in_global_table(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    numbering: Numbering<'_>,
    row_groups: &mut DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    timer.time(Phase::Kernel, || {
        launch::fill_u64(
            &device.launcher(stream),
            numbering.group_count,
            0)
    })?;
    number_in_global_table(
        device,
        stream,
        numbering.keys,
        GlobalNumbering {
            row_groups,
            first_rows: numbering.first_rows,
            group_count: numbering.group_count,
        },
        timer,
    )
}
