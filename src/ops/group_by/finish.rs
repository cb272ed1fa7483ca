//! Pending group numbering finished: group ids read back, tables grown or
//! numbered again where they overflowed.

use crate::gpu::alloc_uninit;
use super::*;

/// Stage 1, finished.
pub(super) struct FinishedGroups {
    pub(super) groups: usize,
    /// What identifies each group on the host, as asked for, in its first
    /// `groups` words (`None` without rows).
    pub(super) identities: Option<DeviceVec<u64>>,
    /// The group of every row on the device, or the inputs folded into
    /// the table's slots.
    pub(super) numbered: NumberedRows,
    /// Where groups come back in key order: the group at each position.
    pub(super) key_order: Option<DeviceVec<u64>>,
    /// Partitioned ids: the row at each position, where `row_groups`
    /// follow the partitions' order rather than the rows'.
    pub(super) permutation: Option<DeviceVec<u64>>,
    /// Whether the partitions numbered their groups (none overflowed).
    pub(super) numbered_in_partitions: bool,
    /// Whether a table sized from an estimate of the groups filled up, and
    /// the rows were numbered again in one sized to them.
    pub(super) table_overflowed: bool,
    /// Whether the table that folded was built again, larger, after its
    /// first chunk of rows.
    pub(super) folding_table_grown: bool,
}

impl PendingGroups {
    /// Waits for stage 1: the number of groups and what identifies each
    /// group on the host (its key word or a row of it, as `back` asks),
    /// with the group of every row left on the device. With `order_bits`,
    /// the groups' key words (below `2^order_bits`) are sorted on the
    /// device and come back in that order, with the order itself for the
    /// results; only key words come back then.
    pub(super) fn finish(
        self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        back: GroupsBack,
        order_bits: Option<u32>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<FinishedGroups> {
        let PendingGroups {
            keys,
            mut group_count,
            mut first_rows,
            row_groups,
            rows,
            partitioned,
        } = self;
        let folding_table_grown =
            matches!(&row_groups, PendingRowGroups::Folded(folded) if folded.grown);
        if rows == 0 {
            return Ok(FinishedGroups {
                groups: 0,
                identities: None,
                numbered: match row_groups {
                    PendingRowGroups::Ids(ids) => NumberedRows::RowGroups(ids),
                    PendingRowGroups::Slots { row_slots, .. } => NumberedRows::RowGroups(row_slots),
                    PendingRowGroups::Folded(folded) => NumberedRows::Folded(folded),
                },
                key_order: None,
                permutation: None,
                numbered_in_partitions: false,
                table_overflowed: false,
                folding_table_grown,
            });
        }
        let (mut numbered, table_overflowed) = checked_row_groups(
            row_groups,
            Numbering {
                keys: &keys,
                first_rows: &mut first_rows,
                group_count: &mut group_count,
            },
            device,
            stream,
            timer,
        )?;
        let mut numbered_in_partitions = false;
        if let Some(partitioned) = &partitioned {
            let mut overflow = Vec::with_capacity(1);
            download_u64(
                device,
                stream,
                &partitioned.overflow.as_view(),
                &mut overflow,
                timer,
            )?;
            numbered_in_partitions = overflow[0] == 0;
            if !numbered_in_partitions {
                let NumberedRows::RowGroups(row_groups) = &mut numbered else {
                    return Err(GpuError::Invalid("partitions folded into a table".into()));
                };
                // A partition held too many groups: the global table
                // numbers the partitioned keys instead, in their order.
                number_again_in_global_table(
                    device,
                    stream,
                    Numbering {
                        keys: &keys,
                        first_rows: &mut first_rows,
                        group_count: &mut group_count,
                    },
                    row_groups,
                    timer,
                )?;
            }
        }
        let mut count = Vec::with_capacity(1);
        download_u64(device, stream, &group_count.as_view(), &mut count, timer)?;
        let groups = count[0] as usize;
        if groups == 0 || groups > rows {
            return Err(GpuError::Invalid(format!(
                "{groups} groups reported for {} rows",
                rows
            )));
        }
        let mut key_order = None;
        let identities = match back {
            GroupsBack::RowsAndRowGroups if order_bits.is_some() => {
                return Err(GpuError::Invalid(
                    "groups in key order give key words, not rows".into(),
                ))
            }
            GroupsBack::RowsAndRowGroups => match &partitioned {
                // Each group's position, mapped to its row.
                Some(partitioned) => {
                    // The gather writes all `groups` words.
                    let mut group_rows: DeviceVec<u64> =
                        alloc_uninit(&stream, groups, "allocating group rows")?;
                    timer.time(Phase::Kernel, || {
                        launch::gather_u64(
                            &device.launcher(stream),
                            &partitioned.row_ids,
                            &first_rows,
                            groups,
                            &mut group_rows)
                    })?;
                    group_rows
                }
                None => first_rows,
            },
            GroupsBack::KeyWords => {
                // The gather below writes all `groups` words, and
                // only those are read.
                let mut group_keys: DeviceVec<u64> =
                    alloc_uninit(&stream, groups, "allocating group keys")?;
                timer.time(Phase::Kernel, || {
                    launch::gather_u64(
                        &device.launcher(stream),
                        &keys,
                        &first_rows,
                        groups,
                        &mut group_keys)
                })?;
                if let Some(key_bits) = order_bits {
                    let sorted = timer.time(Phase::Kernel, || {
                        // iota writes every element.
                        let mut ids: DeviceVec<u64> =
                            alloc_uninit(&stream, groups, "allocating group numbers")?;
                        launch::iota(&device.launcher(stream), &mut ids, 0)?;
                        radix_sort(device, stream, group_keys, ids, key_bits)
                    })?;
                    group_keys = sorted.keys;
                    key_order = Some(sorted.row_ids);
                }
                group_keys
            }
        };
        Ok(FinishedGroups {
            groups,
            identities: Some(identities),
            numbered,
            key_order,
            permutation: partitioned.map(|p| p.row_ids),
            numbered_in_partitions,
            table_overflowed,
            folding_table_grown,
        })
    }
}
