//! Groups numbered by radix-sorting the rows by key: each run of equal keys is
//! a group (seed 002's SGB).

use crate::gpu::alloc_zeroed;
use crate::gpu::alloc_uninit;
use super::*;

/// Enqueues the sort of the device `keys` (`None`: no rows) and the
/// kernels that give every row the rank of its key among the distinct keys.
pub(super) fn launch_sorted_group_assignment(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: Option<DeviceVec<u64>>,
    key_bits: u32,
    transform: Option<CodeTransform>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let Some(mut device_keys) = keys else {
        return launch_group_assignment(device, stream, None, None, None, None, timer);
    };
    let rows = device_keys.len();
    // All four: iota, the heads kernel and sorted_group_ids write
    // every element of the first three; group_firsts[0..groups) is written
    // and only that is read.
    let mut ids: DeviceVec<u64> = alloc_uninit(stream, rows, "allocating row ids")?;
    let mut ranks: DeviceVec<u64> = alloc_uninit(stream, rows, "allocating run ranks")?;
    let mut row_groups: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating row groups")?;
    let mut group_firsts: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating group first positions")?;
    let mut group_count = alloc_zeroed::<u64>(stream, 1, "allocating the group counter")?;
    let sorted = timer.time(Phase::Kernel, || {
        if let Some(transform) = transform {
            launch::ordered_codes(&device.launcher(stream), &mut device_keys, transform)?;
        }
        launch::iota(&device.launcher(stream), &mut ids, 0)?;
        let sorted = radix_sort(device, stream, device_keys, ids, key_bits)?;
        launch::sorted_group_heads(&device.launcher(stream), &sorted.keys, &mut ranks)?;
        exclusive_scan(device, stream, &mut ranks, rows)?;
        launch::sorted_group_ids(
            &device.launcher(stream),
            &sorted.keys,
            &ranks,
            &sorted.row_ids,
            SortedGroupIds {
                row_groups: &mut row_groups,
                group_firsts: &mut group_firsts,
                group_count: &mut group_count,
            })?;
        Ok(sorted)
    })?;
    Ok(PendingGroups {
        keys: sorted.keys,
        group_count,
        first_rows: group_firsts,
        row_groups: PendingRowGroups::Ids(row_groups),
        rows,
        partitioned: None,
    })
}
