//! Groups put in the order their first rows come, as DataFusion's hash
//! aggregation emits them: the hash table numbers groups in the order its
//! threads claim slots, which varies from run to run and with the hash's
//! seed, while a sort above with ties, or a plan that reads the groups as
//! they come, sees the order DataFusion gives. Each group's first row is
//! found on the device (one pass over the rows' groups, or over the keys
//! where the inputs were folded into the table) and the groups sorted by
//! it; the results are then gathered in that order, as for groups in key
//! order.

use super::*;
use crate::ops::hash_join::bits_below;

/// The groups in the order of their first rows.
pub(super) struct FirstSeenOrder {
    /// The group at each position.
    pub(super) order: DeviceVec<u64>,
    /// The first row of the group at each position (ascending).
    pub(super) first_rows: DeviceVec<u64>,
}

/// How to find each row's group, for [`first_seen_order`].
pub(super) enum RowsOfGroups<'a> {
    /// The group of each position, whose row is `positions[i]` (`None`:
    /// `i` itself).
    Numbered {
        row_groups: &'a DeviceVec<u64>,
        positions: Option<&'a DeviceVec<u64>>,
    },
    /// The inputs folded into a table: each row's key found there again.
    Folded {
        keys: &'a DeviceVec<u64>,
        folded: &'a TableFolds,
    },
}

/// The `groups` groups of `rows` rows sorted by their first rows.
pub(super) fn first_seen_order(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    rows_of: RowsOfGroups<'_>,
    rows: usize,
    groups: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<FirstSeenOrder> {
    // fill_u64 writes every entry; every group has a row, so each ends
    // below u64::MAX.
    let mut min_rows: DeviceVec<u64> = alloc_uninit(stream, groups, "allocating first rows")?;
    let mut ids: DeviceVec<u64> = alloc_uninit(stream, groups, "allocating group numbers")?;
    let sorted = timer.time(Phase::Kernel, || {
        launch::fill_u64(&device.launcher(stream), &mut min_rows, u64::MAX)?;
        match rows_of {
            RowsOfGroups::Numbered {
                row_groups,
                positions,
            } => launch::group_min_rows(
                &device.launcher(stream),
                row_groups,
                positions,
                rows,
                &mut min_rows,
            )?,
            RowsOfGroups::Folded { keys, folded } => {
                folded.first_rows_into(device, stream, keys, rows, &mut min_rows)?
            }
        }
        launch::iota(&device.launcher(stream), &mut ids, 0)?;
        radix_sort(device, stream, min_rows, ids, bits_below(rows as u64))
    })?;
    Ok(FirstSeenOrder {
        order: sorted.row_ids,
        first_rows: sorted.keys,
    })
}

/// The position of each group in `order` (the group at each position):
/// `rank[order[p]] = p`.
pub(super) fn ranks_of(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    order: &DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    let groups = order.len();
    // iota writes every position; the scatter writes every rank, `order`
    // being a permutation of the groups.
    let mut positions: DeviceVec<u64> = alloc_uninit(stream, groups, "allocating positions")?;
    let mut ranks: DeviceVec<u64> = alloc_uninit(stream, groups, "allocating group ranks")?;
    timer.time(Phase::Kernel, || {
        launch::iota(&device.launcher(stream), &mut positions, 0)?;
        launch::scatter_u64(&device.launcher(stream), &positions, order, &mut ranks)
    })?;
    Ok(ranks)
}
