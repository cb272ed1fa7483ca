//! Groups numbered in one global hash table (seed 002's HGB), its slots
//! sized from the sample, and the rows inserted.

use crate::gpu::alloc_zeroed;
use crate::gpu::alloc_uninit;
use super::*;

/// Enqueues the kernels that give every row of the device `keys` (`None`:
/// no rows) a group, the keys made codes first with `transform`, in a table
/// sized to `expected_groups` where that is smaller than one sized to the
/// rows ([`sized_table_capacity`]), with `folds` folded into that table
/// where given ([`launch_table_folds`]).
pub(super) fn launch_group_assignment(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: Option<DeviceVec<u64>>,
    transform: Option<CodeTransform>,
    expected_groups: Option<usize>,
    folds: Option<FoldInputs<'_>>,
    timer: &mut PhaseTimer,
) -> GpuResult<PendingGroups> {
    let mut group_count = alloc_zeroed::<u64>(stream, 1, "allocating the group counter")?;
    let Some(mut device_keys) = keys else {
        // No groups; the reductions launch nothing for no rows.
        let none = || alloc_zeroed::<u64>(stream, 1, "allocating row groups");
        return Ok(PendingGroups {
            keys: none()?,
            group_count,
            first_rows: none()?,
            row_groups: PendingRowGroups::Ids(none()?),
            rows: 0,
            partitioned: None,
        });
    };
    let rows = device_keys.len();
    if let Some(transform) = transform {
        timer.time(Phase::Kernel, || {
            launch::ordered_codes(
                &device.launcher(stream),
                &mut device_keys,
                transform)
        })?;
    }
    // First rows: entries [0, groups) are written, only those are read.
    let mut first_rows: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating group rows")?;
    let sized = expected_groups
        .map(sized_table_capacity)
        .filter(|&capacity| capacity < table_capacity(rows));
    if let (Some(capacity), Some(folds)) = (sized, folds) {
        trace::event(|| {
            format!(
                "aggregation: {} inputs folded into a hash table of {capacity} slots",
                folds.inputs.len()
            )
        });
        let folded = launch_table_folds(
            device,
            stream,
            &device_keys,
            capacity,
            folds,
            FoldCounts {
                group_count: &mut group_count,
                first_rows: &mut first_rows,
            },
            timer,
        )?;
        return Ok(PendingGroups {
            keys: device_keys,
            group_count,
            first_rows,
            row_groups: PendingRowGroups::Folded(folded),
            rows,
            partitioned: None,
        });
    }
    // Row groups: group_insert writes one slot per row (unless a
    // table sized from an estimate fills up: then they are numbered again).
    let mut row_groups: DeviceVec<u64> =
        alloc_uninit(stream, rows, "allocating row groups")?;
    let row_groups = match sized {
        None => {
            number_in_global_table(
                device,
                stream,
                &device_keys,
                GlobalNumbering {
                    row_groups: &mut row_groups,
                    first_rows: &mut first_rows,
                    group_count: &mut group_count,
                },
                timer,
            )?;
            PendingRowGroups::Ids(row_groups)
        }
        Some(capacity) => {
            let mut overflow = alloc_zeroed::<u64>(stream, 1, "allocating the overflow flag")?;
            let table_groups = insert_into_table(
                device,
                stream,
                &device_keys,
                capacity,
                TableOutputs {
                    row_slots: &mut row_groups,
                    first_rows: &mut first_rows,
                    group_count: &mut group_count,
                    overflow: Some(&mut overflow),
                },
                timer,
            )?;
            PendingRowGroups::Slots {
                row_slots: row_groups,
                table: SizedTable {
                    table_groups,
                    capacity,
                    overflow,
                },
            }
        }
    };
    Ok(PendingGroups {
        keys: device_keys,
        group_count,
        first_rows,
        row_groups,
        rows,
        partitioned: None,
    })
}

/// Where [`number_in_global_table`] writes.
pub(super) struct GlobalNumbering<'a> {
    /// The group of each key (`keys.len()` entries).
    pub(super) row_groups: &'a mut DeviceVec<u64>,
    /// A position of each group (`keys.len()` entries, `[0, groups)` written).
    pub(super) first_rows: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry: the number of groups.
    pub(super) group_count: &'a mut DeviceVec<u64>,
}

/// Enqueues HGB's stage 1 over `keys` (at least one): a table of twice as
/// many slots as keys, every key's group, each group's first position.
pub(super) fn number_in_global_table(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &DeviceVec<u64>,
    out: GlobalNumbering<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<()> {
    let table_groups = insert_into_table(
        device,
        stream,
        keys,
        table_capacity(keys.len()),
        TableOutputs {
            row_slots: &mut *out.row_groups,
            first_rows: out.first_rows,
            group_count: out.group_count,
            overflow: None,
        },
        timer,
    )?;
    timer.time(Phase::Kernel, || {
        launch::group_resolve(
            &device.launcher(stream),
            out.row_groups,
            &table_groups)
    })
    // The table is freed in stream order, after the kernels that read it.
}

/// Where [`insert_into_table`] writes.
pub(super) struct TableOutputs<'a> {
    /// The slot of each key (`keys.len()` entries).
    pub(super) row_slots: &'a mut DeviceVec<u64>,
    /// A position of each group (`keys.len()` entries, `[0, groups)` written).
    pub(super) first_rows: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry: the number of groups.
    pub(super) group_count: &'a mut DeviceVec<u64>,
    /// One entry, 0 on entry, set where the table fills up; required for a
    /// table of fewer than twice as many slots as keys.
    pub(super) overflow: Option<&'a mut DeviceVec<u64>>,
}

/// Enqueues a table of `capacity` slots (and the reserved one) and the
/// insertion of `keys` (at least one) into it; returns the group of each
/// claimed slot (the table's keys are freed in stream order, after the
/// insertion).
pub(super) fn insert_into_table(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &DeviceVec<u64>,
    capacity: u64,
    out: TableOutputs<'_>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    let slots = capacity as usize + 1;
    // Table keys: filled with EMPTY_KEY below before any read.
    let mut table_keys: DeviceVec<u64> =
        alloc_uninit(stream, slots, "allocating the group hash table")?;
    // Table groups: group_insert writes the slots it claims, and
    // only claimed slots are read.
    let mut table_groups: DeviceVec<u64> =
        alloc_uninit(stream, slots, "allocating the group hash table")?;
    timer.time(Phase::Kernel, || {
        launch::fill_u64(
            &device.launcher(stream),
            &mut table_keys,
            u64::MAX)?;
        launch::group_insert(
            &device.launcher(stream),
            keys,
            &mut table_keys,
            &mut table_groups,
            capacity,
            out.group_count,
            out.first_rows,
            out.row_slots,
            out.overflow)
    })?;
    Ok(table_groups)
}
