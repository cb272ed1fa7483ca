//! [`group_uploaded_keys`]: the rows numbered into groups and every input
//! reduced per group, over keys already on their way to the device.

use super::*;
use crate::gpu::DeviceEvent;

/// [`group_on_device`] over keys already enqueued for the device
/// ([`upload_group_keys`], with the same streams and `rows`).
#[allow(clippy::too_many_arguments)]
pub fn group_uploaded_keys(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    copy_stream: &Arc<DeviceStream>,
    keys: UploadedKeys,
    ids: GroupIds,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
    back: GroupsBack,
    chunks: InputChunks,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceGrouped> {
    check_grouping(&keys, ids, rows, inputs, bitmaps, back)?;
    let Enqueued {
        pending,
        device_bitmaps,
        uploaded_columns,
        fold_chunks,
    } = enqueue_grouping(
        device,
        (stream, copy_stream),
        keys,
        ids,
        (rows, inputs, bitmaps),
        back,
        &chunks,
        timer,
    )?;
    let numbering = NumberedGroups::finish(pending, device, stream, ids, back, timer)?;
    let (row_groups, folded) = match numbering.numbered {
        Some(NumberedRows::RowGroups(row_groups)) => (Some(row_groups), None),
        Some(NumberedRows::Folded(folded)) => (None, Some(folded)),
        None => (None, None),
    };
    let folded_in_table = folded.is_some();
    let columns =
        columns_to_reduce(uploaded_columns, folded_in_table, fold_chunks, stream, inputs.len(), rows)?;
    let permutation = numbering.permutation.as_ref();
    let rows_in_order = RowGroupsInOrder::arrange(
        device,
        stream,
        row_groups.as_ref(),
        permutation,
        wants_row_order(back, &columns, rows),
        rows,
        timer,
    )?;
    let partition_bitmaps = match permutation {
        Some(positions) => {
            bitmaps_in_partitions(device, stream, inputs, &columns, &device_bitmaps, positions, timer)?
        }
        None => Vec::new(),
    };
    let kept_row_groups = match (back, rows_in_order.for_the_host()) {
        (GroupsBack::RowsAndRowGroups, Some(in_row_order)) if rows > 0 => {
            let mut kept = Vec::with_capacity(rows);
            match numbering.key_order.as_ref() {
                // The groups leave in another order than numbered (their
                // first rows'): each row's group by its new position.
                Some(order) => {
                    let ranks = ranks_of(device, stream, order, timer)?;
                    let renumbered = timer.time(Phase::Kernel, || {
                        crate::ops::gather::gather_u64(device, stream, &ranks, in_row_order, rows)
                    })?;
                    download_u64(device, stream, &renumbered.slice(0..rows), &mut kept, timer)?;
                }
                None => {
                    download_u64(device, stream, &in_row_order.slice(0..rows), &mut kept, timer)?
                }
            }
            kept
        }
        _ => Vec::new(),
    };
    let reductions = match folded {
        // Every input is reduced already.
        Some(folded) => Reductions {
            reduced: folded.into_reduced(
                device,
                stream,
                numbering.groups,
                numbering.key_order.as_ref(),
                timer,
            )?,
            made: Vec::new(),
            as_they_landed: 0,
        },
        None => {
            let rows_of = GroupedRows {
                rows,
                groups: numbering.groups,
                row_groups: row_groups.as_ref(),
                in_row_order: rows_in_order.in_row_order(permutation.is_some()),
                permutation,
                bitmaps: &device_bitmaps,
                partition_bitmaps: &partition_bitmaps,
                key_order: numbering.key_order.as_ref(),
            };
            reduce_inputs(device, stream, &rows_of, inputs, columns, timer)?
        }
    };
    Ok(DeviceGrouped {
        groups: numbering.groups,
        identities: numbering.identities,
        back,
        row_groups: kept_row_groups,
        reduced: reductions.reduced,
        numbered_in_partitions: numbering.numbered_in_partitions,
        table_overflowed: numbering.table_overflowed,
        folded_in_table,
        folding_table_grown: numbering.folding_table_grown,
        stream: Arc::clone(stream),
        identities_made: numbering.identities_made,
        reductions_made: reductions.made,
        inputs_reduced_as_they_landed: reductions.as_they_landed,
    })
}

/// What [`enqueue_grouping`] put on the streams.
struct Enqueued {
    /// The rows' numbering into groups (`None` without keys).
    pending: Option<PendingGroups>,
    device_bitmaps: Vec<DeviceVec<u64>>,
    /// The inputs' columns, where the table does not fold them.
    uploaded_columns: Option<Vec<InputColumn>>,
    /// Where the table folds them, their chunks once folded.
    fold_chunks: FoldedChunks,
}

/// Everything enqueued before the host first waits for the device: the
/// keys' copy (already) and the grouping kernels, then every column's copy
/// on the copy stream, so that the host stages the columns and the bus
/// carries them while the grouping kernels run. Where the table folds the
/// inputs, its kernel reads them: it is enqueued chunk by chunk, each
/// launch after its chunk's copies, and their values cross the bus chunk
/// by chunk as it folds them, never whole.
#[allow(clippy::too_many_arguments)]
fn enqueue_grouping(
    device: &GpuDevice,
    (stream, copy_stream): (&Arc<DeviceStream>, &Arc<DeviceStream>),
    keys: UploadedKeys,
    ids: GroupIds,
    (rows, inputs, bitmaps): (usize, &[ReduceInput], &[Vec<u64>]),
    back: GroupsBack,
    chunks: &InputChunks,
    timer: &mut PhaseTimer,
) -> GpuResult<Enqueued> {
    // Inputs on the device already are laid out whole: nothing crosses
    // the bus for the folds or reductions to overlap.
    let fold_into_table = chunks.fold_into_table
        && keys.with_keys
        && !inputs.iter().any(ReduceInput::lies_on_device)
        && table_fold_capacity(ids, back, rows, inputs).is_some();
    let mut device_keys = keys.words;
    let mut pending = if keys.with_keys && !fold_into_table {
        Some(launch_pending_groups(device, stream, device_keys.take(), ids, None, timer)?)
    } else {
        None
    };
    let device_bitmaps = bitmaps
        .iter()
        .map(|bits| upload_u64(device, copy_stream, bits, timer))
        .collect::<GpuResult<Vec<_>>>()?;
    let mut fold_chunks = FoldedChunks::default();
    let uploaded_columns = if fold_into_table {
        let fold = FoldInputs {
            inputs,
            bitmaps: &device_bitmaps,
            copy_stream,
            chunk_rows: chunks.chunk_rows(),
            chunks: &mut fold_chunks,
        };
        pending = Some(launch_pending_groups(
            device,
            stream,
            device_keys.take(),
            ids,
            Some(fold),
            timer,
        )?);
        None
    } else {
        Some(upload_columns(
            device,
            copy_stream,
            inputs,
            rows,
            chunks,
            keys.with_keys,
            timer,
        )?)
    };
    Ok(Enqueued {
        pending,
        device_bitmaps,
        uploaded_columns,
        fold_chunks,
    })
}

/// The columns the inputs are reduced from: as uploaded, none where the
/// table folded them all, or, where the table that folded filled up (the
/// rows were numbered again), each input's whole column, joined from the
/// chunks that crossed the bus.
fn columns_to_reduce(
    uploaded_columns: Option<Vec<InputColumn>>,
    folded_in_table: bool,
    fold_chunks: FoldedChunks,
    stream: &Arc<DeviceStream>,
    inputs: usize,
    rows: usize,
) -> GpuResult<Vec<InputColumn>> {
    Ok(match uploaded_columns {
        Some(columns) => columns,
        None if folded_in_table => {
            // Freed in stream order, each after the fold that read it.
            drop(fold_chunks);
            Vec::new()
        }
        None => fold_chunks
            .into_columns(stream, inputs, rows)?
            .into_iter()
            .map(InputColumn::Whole)
            .collect(),
    })
}

/// The arguments of [`group_uploaded_keys`] agree with each other.
fn check_grouping(
    keys: &UploadedKeys,
    ids: GroupIds,
    rows: usize,
    inputs: &[ReduceInput],
    bitmaps: &[Vec<u64>],
    back: GroupsBack,
) -> GpuResult<()> {
    if keys.rows != rows {
        return Err(GpuError::Invalid(format!(
            "keys uploaded for {} rows, grouping {rows}",
            keys.rows
        )));
    }
    check_inputs(None, rows, inputs, bitmaps)?;
    if ids.in_key_order() && back == GroupsBack::RowsAndRowGroups {
        return Err(GpuError::Invalid(
            "sorted group ids give each group's key word, not a row of it".into(),
        ));
    }
    Ok(())
}

/// Every input's copy to the device enqueued on `copy_stream`: whole, or
/// in chunks that are reduced as they land where the reduction takes one
/// pass. The chunks of every input share two staging windows, as a
/// table's folds do.
fn upload_columns(
    device: &GpuDevice,
    copy_stream: &Arc<DeviceStream>,
    inputs: &[ReduceInput],
    rows: usize,
    chunks: &InputChunks,
    with_keys: bool,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<InputColumn>> {
    let mut staging = StagingWindows::standard(device);
    inputs
        .iter()
        .map(|input| {
            let in_chunks = chunks.reduce_as_they_land
                && with_keys
                && !input.lies_on_device()
                && rows > 0
                && reduces_in_one_pass(input.reduction);
            Ok(if in_chunks {
                InputColumn::InChunks(upload_in_chunks(
                    &mut staging,
                    copy_stream,
                    input,
                    rows,
                    chunks.chunk_rows(),
                    timer,
                )?)
            } else {
                InputColumn::Whole(upload_input(device, copy_stream, input, rows, timer)?)
            })
        })
        .collect()
}

/// The rows' numbering into groups, waited for (one group without keys).
struct NumberedGroups {
    groups: usize,
    identities: Option<DeviceVec<u64>>,
    /// The end of the identities' making, where they were made: nothing
    /// enqueued after it writes them.
    identities_made: Option<DeviceEvent>,
    numbered: Option<NumberedRows>,
    key_order: Option<DeviceVec<u64>>,
    permutation: Option<DeviceVec<u64>>,
    numbered_in_partitions: bool,
    table_overflowed: bool,
    folding_table_grown: bool,
}

impl NumberedGroups {
    fn finish(
        pending: Option<PendingGroups>,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        ids: GroupIds,
        back: GroupsBack,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let Some(pending) = pending else {
            return Ok(Self {
                groups: 1,
                identities: None,
                identities_made: None,
                numbered: None,
                key_order: None,
                permutation: None,
                numbered_in_partitions: false,
                table_overflowed: false,
                folding_table_grown: false,
            });
        };
        let order_bits = match ids {
            GroupIds::HashedInKeyOrder { key_bits, .. } => Some(key_bits),
            _ => None,
        };
        let first_seen = !ids.in_key_order();
        let finished = pending.finish(device, stream, back, (order_bits, first_seen), timer)?;
        let identities_made = match finished.identities {
            Some(_) => Some(
                stream
                    .record_event(None)
                    .during("recording the identities' end")?,
            ),
            None => None,
        };
        Ok(Self {
            groups: finished.groups,
            identities: finished.identities,
            identities_made,
            numbered: Some(finished.numbered),
            key_order: finished.key_order,
            permutation: finished.permutation,
            numbered_in_partitions: finished.numbered_in_partitions,
            table_overflowed: finished.table_overflowed,
            folding_table_grown: finished.folding_table_grown,
        })
    }
}

/// Whether the rows' groups are wanted in row order: the host asks for
/// each row's group, or an input is reduced chunk by chunk as it lands.
fn wants_row_order(back: GroupsBack, columns: &[InputColumn], rows: usize) -> bool {
    let any_in_chunks = columns
        .iter()
        .any(|column| matches!(column, InputColumn::InChunks(_)));
    (back == GroupsBack::RowsAndRowGroups || any_in_chunks) && rows > 0
}

/// The rows' groups, and where they were numbered in the partitions'
/// order and are wanted in row order, the same scattered back to it.
struct RowGroupsInOrder<'a> {
    row_groups: Option<&'a DeviceVec<u64>>,
    by_row: Option<DeviceVec<u64>>,
}

impl<'a> RowGroupsInOrder<'a> {
    fn arrange(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        row_groups: Option<&'a DeviceVec<u64>>,
        permutation: Option<&DeviceVec<u64>>,
        wanted: bool,
        rows: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let by_row = match (row_groups, permutation) {
            (Some(row_groups), Some(positions)) if wanted => {
                // The scatter writes every row's entry, a permutation's
                // ids covering 0..rows.
                let mut by_row: DeviceVec<u64> =
                    alloc_uninit(stream, rows, "allocating row groups")?;
                timer.time(Phase::Kernel, || {
                    launch::scatter_u64(&device.launcher(stream), row_groups, positions, &mut by_row)
                })?;
                Some(by_row)
            }
            _ => None,
        };
        Ok(Self { row_groups, by_row })
    }

    /// What the host reads each row's group from: in row order where
    /// scattered back, else as numbered.
    fn for_the_host(&self) -> Option<&DeviceVec<u64>> {
        self.by_row.as_ref().or(self.row_groups)
    }

    /// The rows' groups in row order: scattered back where the groups were
    /// numbered in the partitions' order, else as numbered.
    fn in_row_order(&self, permuted: bool) -> Option<&DeviceVec<u64>> {
        if permuted {
            self.by_row.as_ref()
        } else {
            self.row_groups
        }
    }
}

/// Where the groups are numbered in the partitions' order, so are the
/// inputs reduced whole (each column just before its reduction), with
/// their validity bitmaps; inputs reduced in chunks read them in row order.
fn bitmaps_in_partitions(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    inputs: &[ReduceInput],
    columns: &[InputColumn],
    device_bitmaps: &[DeviceVec<u64>],
    positions: &DeviceVec<u64>,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<Option<DeviceVec<u64>>>> {
    let mut in_partitions: Vec<Option<DeviceVec<u64>>> =
        (0..device_bitmaps.len()).map(|_| None).collect();
    for (input, column) in inputs.iter().zip(columns) {
        if let (InputColumn::Whole(_), Some(i)) = (column, input.valid) {
            let bits = device_bitmaps
                .get(i)
                .ok_or_else(|| GpuError::Invalid(format!("no validity bitmap {i}")))?;
            if in_partitions[i].is_none() {
                in_partitions[i] = Some(gathered_bits(device, stream, bits, positions, timer)?);
            }
        }
    }
    Ok(in_partitions)
}

/// What each input's reduction reads besides its column.
struct GroupedRows<'a> {
    rows: usize,
    groups: usize,
    /// Each row's group as numbered (in the partitions' order where
    /// `permutation` is set).
    row_groups: Option<&'a DeviceVec<u64>>,
    /// Each row's group in row order, where made.
    in_row_order: Option<&'a DeviceVec<u64>>,
    /// The row at each position, where the rows were partitioned.
    permutation: Option<&'a DeviceVec<u64>>,
    bitmaps: &'a [DeviceVec<u64>],
    /// `bitmaps` in the partitions' order, where the rows were partitioned.
    partition_bitmaps: &'a [Option<DeviceVec<u64>>],
    key_order: Option<&'a DeviceVec<u64>>,
}

/// The inputs' reductions, each one's end recorded.
struct Reductions {
    reduced: Vec<DeviceReduced>,
    made: Vec<DeviceEvent>,
    as_they_landed: usize,
}

/// Each input is reduced (a whole one gathered first, in partitions)
/// before the next input's turn, and its end recorded: the inputs cross
/// the bus one after the other, so the first inputs' results are made,
/// and can come back, while the last ones still cross. (A chunk dropped
/// once its reduction is enqueued makes the copy stream wait for that
/// reduction before freeing it: every copy is enqueued already.)
fn reduce_inputs(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    rows_of: &GroupedRows<'_>,
    inputs: &[ReduceInput],
    columns: Vec<InputColumn>,
    timer: &mut PhaseTimer,
) -> GpuResult<Reductions> {
    let mut reductions = Reductions {
        reduced: Vec::with_capacity(inputs.len()),
        made: Vec::with_capacity(inputs.len()),
        as_they_landed: 0,
    };
    for (input, column) in inputs.iter().zip(columns) {
        let reduced = match column {
            InputColumn::InChunks(chunks) => {
                let groups_of_rows = rows_of.in_row_order.ok_or_else(|| {
                    GpuError::Invalid("an input in chunks without row groups".into())
                })?;
                let in_row_order = RowsInRowOrder {
                    groups_of_rows,
                    rows: rows_of.rows,
                    bitmaps: rows_of.bitmaps,
                    groups: rows_of.groups,
                };
                reductions.as_they_landed += 1;
                reduce_chunks(
                    device,
                    stream,
                    &in_row_order,
                    input,
                    &chunks,
                    rows_of.key_order,
                    timer,
                )?
            }
            InputColumn::Whole(column) => {
                reduce_whole(device, stream, rows_of, input, column, timer)?
            }
        };
        reductions.made.push(
            stream
                .record_event(None)
                .during("recording a reduction's end")?,
        );
        reductions.reduced.push(reduced);
    }
    Ok(reductions)
}

/// One input reduced from its whole column, gathered into the partitions'
/// order first where the groups were numbered in it.
fn reduce_whole(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    rows_of: &GroupedRows<'_>,
    input: &ReduceInput,
    mut column: UploadedInput,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceReduced> {
    let valid_bits = match input.valid {
        None => None,
        // In the partitions' order, as the groups are.
        Some(i) if rows_of.permutation.is_some() => Some(
            rows_of
                .partition_bitmaps
                .get(i)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    GpuError::Invalid(format!(
                        "validity bitmap {i} not in the partitions' order"
                    ))
                })?,
        ),
        Some(i) => Some(
            rows_of
                .bitmaps
                .get(i)
                .ok_or_else(|| GpuError::Invalid(format!("no validity bitmap {i}")))?,
        ),
    };
    if let Some(positions) = rows_of.permutation {
        column.gather(device, stream, positions, timer)?;
    }
    let group_rows_of = GroupRows {
        groups_of_rows: rows_of.row_groups,
        rows: rows_of.rows,
        valid_bits,
        groups: rows_of.groups,
        span: None,
    };
    reduce(
        device,
        stream,
        group_rows_of,
        input,
        column,
        rows_of.key_order,
        timer,
    )
}
