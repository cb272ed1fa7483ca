//! Pending group numbering finished: group ids read back, tables grown or
//! numbered again where they overflowed.

use crate::gpu::{alloc_uninit, download_word};
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
    /// results; only key words come back then. Without it, and with
    /// `first_seen`, the groups come back in the order of their first rows
    /// ([`first_seen_order`]), with that order for the results.
    pub(super) fn finish(
        self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        back: GroupsBack,
        (order_bits, first_seen): (Option<u32>, bool),
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
            return Ok(FinishedGroups::without_rows(row_groups, folding_table_grown));
        }
        if back == GroupsBack::RowsAndRowGroups && order_bits.is_some() {
            return Err(GpuError::Invalid(
                "groups in key order give key words, not rows".into(),
            ));
        }
        let mut numbering = Numbering {
            keys: &keys,
            first_rows: &mut first_rows,
            group_count: &mut group_count,
        };
        let (mut numbered, table_overflowed) =
            checked_row_groups(row_groups, numbering.reborrow(), device, stream, timer)?;
        let numbered_in_partitions = match &partitioned {
            Some(partitioned) => held_in_partitions(
                device,
                stream,
                partitioned,
                numbering.reborrow(),
                &mut numbered,
                timer,
            )?,
            None => false,
        };
        let groups = download_word(device, stream, &group_count.as_view(), "the group count", timer)? as usize;
        if groups == 0 || groups > rows {
            return Err(GpuError::Invalid(format!(
                "{groups} groups reported for {} rows",
                rows
            )));
        }
        let in_first_seen_order = match order_bits {
            None if first_seen => {
                let rows_of = match &numbered {
                    NumberedRows::RowGroups(row_groups) => RowsOfGroups::Numbered {
                        row_groups,
                        positions: partitioned.as_ref().map(|p| &p.row_ids),
                    },
                    NumberedRows::Folded(folded) => RowsOfGroups::Folded {
                        keys: &keys,
                        folded,
                    },
                };
                Some(first_seen_order(device, stream, rows_of, rows, groups, timer)?)
            }
            _ => None,
        };
        if let Some(FirstSeenOrder {
            order,
            first_rows: rows_in_order,
        }) = in_first_seen_order
        {
            let identities = match back {
                // Each group's first row is a row of it.
                GroupsBack::RowsAndRowGroups => rows_in_order,
                // The key at the position that numbered each group (a row
                // of it), in the groups' new order.
                GroupsBack::KeyWords => {
                    let group_keys =
                        gathered_words(device, stream, &keys, &first_rows, groups, timer)?;
                    gathered_words(device, stream, &group_keys, &order, groups, timer)?
                }
            };
            return Ok(FinishedGroups {
                groups,
                identities: Some(identities),
                numbered,
                key_order: Some(order),
                permutation: partitioned.map(|p| p.row_ids),
                numbered_in_partitions,
                table_overflowed,
                folding_table_grown,
            });
        }
        let mut key_order = None;
        let identities = match (back, &partitioned) {
            // Each group's position, mapped to its row.
            (GroupsBack::RowsAndRowGroups, Some(partitioned)) => {
                gathered_words(device, stream, &partitioned.row_ids, &first_rows, groups, timer)?
            }
            (GroupsBack::RowsAndRowGroups, None) => first_rows,
            (GroupsBack::KeyWords, _) => {
                let group_keys = gathered_words(device, stream, &keys, &first_rows, groups, timer)?;
                match order_bits {
                    Some(key_bits) => {
                        let (sorted, order) =
                            sorted_group_keys(device, stream, group_keys, key_bits, timer)?;
                        key_order = Some(order);
                        sorted
                    }
                    None => group_keys,
                }
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

impl FinishedGroups {
    /// No rows: no groups, the numbering as it stands.
    fn without_rows(row_groups: PendingRowGroups, folding_table_grown: bool) -> Self {
        FinishedGroups {
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
        }
    }
}

/// Whether every partition numbered its groups; where one held too many,
/// the global table numbers the partitioned keys instead, in their order.
fn held_in_partitions(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    partitioned: &PartitionedPositions,
    numbering: Numbering<'_>,
    numbered: &mut NumberedRows,
    timer: &mut PhaseTimer,
) -> GpuResult<bool> {
    let mut overflow = Vec::with_capacity(1);
    download_u64(
        device,
        stream,
        &partitioned.overflow.as_view(),
        &mut overflow,
        timer,
    )?;
    if overflow[0] == 0 {
        return Ok(true);
    }
    let NumberedRows::RowGroups(row_groups) = numbered else {
        return Err(GpuError::Invalid("partitions folded into a table".into()));
    };
    number_again_in_global_table(device, stream, numbering, row_groups, timer)?;
    Ok(false)
}

/// `words` at the first `groups` of `positions`.
fn gathered_words(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    words: &DeviceVec<u64>,
    positions: &DeviceVec<u64>,
    groups: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    // The gather writes all `groups` words, and only those are read.
    let mut gathered: DeviceVec<u64> =
        alloc_uninit(stream, groups, "allocating the groups' words")?;
    timer.time(Phase::Kernel, || {
        launch::gather_u64(&device.launcher(stream), words, positions, groups, &mut gathered)
    })?;
    Ok(gathered)
}

/// The groups' key words (below `2^key_bits`) sorted on the device, and
/// the group at each position.
fn sorted_group_keys(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    group_keys: DeviceVec<u64>,
    key_bits: u32,
    timer: &mut PhaseTimer,
) -> GpuResult<(DeviceVec<u64>, DeviceVec<u64>)> {
    let groups = group_keys.len();
    let sorted = timer.time(Phase::Kernel, || {
        // iota writes every element.
        let mut ids: DeviceVec<u64> = alloc_uninit(stream, groups, "allocating group numbers")?;
        launch::iota(&device.launcher(stream), &mut ids, 0)?;
        radix_sort(device, stream, group_keys, ids, key_bits)
    })?;
    Ok((sorted.keys, sorted.row_ids))
}
