//! Groups numbered in hash partitions sized to shared memory (seed 002's
//! partition-based group-by).

use crate::gpu::alloc_zeroed;
use crate::gpu::alloc_uninit;
use super::*;

/// Enqueues the radix partitioning of the device `keys` (`None`: no rows)
/// with their row ids and the numbering of each partition's groups (seed
/// 002's PGB).
pub(super) fn launch_partitioned_group_assignment(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: Option<DeviceVec<u64>>,
    partition_bits: u32,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let Some(device_keys) = keys else {
        return launch_group_assignment(device, stream, None, None, None, None, timer);
    };
    let rows = device_keys.len();
    let plan = RadixPlan::new(partition_bits);
    let partitions = plan.partitions();
    // All four: iota writes every row id; partitioned_group_ids
    // writes every position's local id, and [starts[p], starts[p] + its
    // groups) of the positions, the only ones the resolve reads; the
    // resolve writes group_firsts[0..groups), the only ones read later.
    let mut ids: DeviceVec<u64> = alloc_uninit(stream, rows, "allocating row ids")?;
    let mut local_ids: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating row groups")?;
    let mut first_positions: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating group positions")?;
    let mut group_firsts: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating group positions")?;
    // Zeros: a partition left unnumbered (after an overflow) counts none,
    // and the entry after the last makes the scan's last entry the total.
    let mut group_counts = alloc_zeroed::<u64>(stream, partitions + 1, "allocating partition group counts")?;
    let mut overflow = alloc_zeroed::<u64>(stream, 1, "allocating the overflow flag")?;
    let mut group_count = alloc_zeroed::<u64>(stream, 1, "allocating the group counter")?;
    let partitioned = timer.time(Phase::Kernel, || {
        launch::iota(&device.launcher(stream), &mut ids, 0)?;
        let partitioned = radix_partition(device, stream, device_keys, ids, &plan)?;
        launch::partitioned_group_ids(
            &device.launcher(stream),
            &partitioned.keys,
            &partitioned.starts,
            PartitionGroupIds {
                local_ids: &mut local_ids,
                group_counts: &mut group_counts,
                first_positions: &mut first_positions,
                overflow: &mut overflow,
            })?;
        exclusive_scan(device, stream, &mut group_counts, partitions + 1)?;
        launch::partitioned_group_resolve(
            &device.launcher(stream),
            &partitioned.starts,
            &group_counts,
            &mut local_ids,
            &first_positions,
            &mut group_firsts,
            &mut group_count)?;
        Ok(partitioned)
    })?;
    Ok(PendingGroups {
        keys: partitioned.keys,
        group_count,
        first_rows: group_firsts,
        row_groups: PendingRowGroups::Ids(local_ids),
        rows,
        partitioned: Some(PartitionedPositions {
            row_ids: partitioned.row_ids,
            overflow,
        }),
    })
}

/// `bits` (a validity bitmap) in the order of `positions`: bit `i` of the
/// result is bit `positions[i]` of `bits`.
pub(super) fn gathered_bits(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    bits: &DeviceVec<u64>,
    positions: &DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    // gather_bits writes every word of the result.
    let mut out: DeviceVec<u64> = alloc_uninit(stream, positions.len().div_ceil(64).max(1), "allocating a validity bitmap")?;
    timer.time(Phase::Kernel, || {
        launch::gather_bits(
            &device.launcher(stream),
            bits,
            positions,
            &mut out)
    })?;
    Ok(out)
}
