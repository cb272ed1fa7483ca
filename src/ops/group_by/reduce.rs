//! Each aggregate's input uploaded and reduced by the rows' group ids into
//! per-group slots.

use crate::gpu::{alloc_uninit, upload_u64_pieces};
use super::*;

/// One input on its way to the device: its whole column, reduced once it
/// has crossed, or chunks, each reduced once it has landed
/// ([`landing_chunks`]).
pub(super) enum InputColumn {
    Whole(UploadedInput),
    InChunks(Vec<landing_chunks::LandedChunk>),
}

/// One input's columns on the device (none without rows).
pub(super) struct UploadedInput {
    pub(super) values: Option<DeviceVec<u64>>,
    pub(super) high: Option<DeviceVec<u64>>,
}

impl UploadedInput {
    /// Each column in the order of `positions` (`out[i] = column[positions[i]]`).
    pub(super) fn gather(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        positions: &DeviceVec<u64>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        for column in [&mut self.values, &mut self.high].into_iter().flatten() {
            let rows = positions.len();
            // The gather writes all `rows` words.
            let mut gathered: DeviceVec<u64> =
                alloc_uninit(stream, rows, "allocating a gathered input")?;
            timer.time(Phase::Kernel, || {
                launch::gather_u64(
                    &device.launcher(stream),
                    column,
                    positions,
                    rows,
                    &mut gathered)
            })?;
            // The column is freed in stream order, after the gather.
            *column = gathered;
        }
        Ok(())
    }
}

/// Enqueues the copy of one input's columns.
pub(super) fn upload_input(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    input: &ReduceInput,
    rows: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<UploadedInput> {
    let upload = |words: &Words, timer: &mut PhaseTimer| {
        (rows > 0 && !words.is_empty())
            .then(|| match words.lie_on_device() {
                true => device_words::lay_out(device, stream, words, timer),
                false => upload_u64_pieces(device, stream, &words.pieces(), timer),
            })
            .transpose()
    };
    Ok(UploadedInput {
        values: upload(&input.values, timer)?,
        high: upload(&input.high_words, timer)?,
    })
}

/// `out`, one result per group, gathered on the device into `key_order`
/// where given (the group at each position of `groups`).
pub(super) fn in_key_order(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    out: DeviceVec<u64>,
    key_order: Option<&DeviceVec<u64>>,
    groups: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceVec<u64>> {
    let Some(order) = key_order else {
        return Ok(out);
    };
    // The gather writes all `groups` words.
    let mut ordered: DeviceVec<u64> =
        alloc_uninit(stream, groups.max(1), "allocating ordered results")?;
    timer.time(Phase::Kernel, || {
        launch::gather_u64(
            &device.launcher(stream),
            &out,
            order,
            groups,
            &mut ordered)
    })?;
    Ok(ordered)
}

/// Stage 2 for one input over all its rows; with `key_order`, each result
/// comes back in that order of the groups (the group at each position).
pub(super) fn reduce(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    rows: GroupRows<'_>,
    input: &ReduceInput,
    column: UploadedInput,
    key_order: Option<&DeviceVec<u64>>,
    timer: &mut PhaseTimer,
) -> GpuResult<DeviceReduced> {
    if rows.rows == 0 {
        // Nothing to reduce: every group (the one group without keys) keeps
        // the identity.
        return Ok(DeviceReduced::Identity {
            word: input.reduction.identity(),
            wide: input.reduction.is_wide(),
        });
    }
    let mut outputs = ReductionOutputs::new(device, stream, input.reduction, rows.groups, timer)?;
    outputs.reduce(device, stream, rows, input, &column, timer)?;
    outputs.into_reduced(device, stream, key_order, timer)
}

/// One input's results on the device while its rows are reduced into
/// them: each group's slot starts at the reduction's identity.
pub(super) struct ReductionOutputs {
    /// Groups: the slots of each vector (of at least one slot).
    pub(super) groups: usize,
    /// Words or the fixed-point sum's parts, never the identity alone.
    pub(super) slots: DeviceReduced,
}

impl ReductionOutputs {
    /// Enqueues the slots of `groups` groups for `reduction`, each set to
    /// its identity.
    pub(super) fn new(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        reduction: Reduction,
        groups: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let mut slots = |identity: u64| -> GpuResult<DeviceVec<u64>> {
            // Filled right below, before any read.
            let mut out: DeviceVec<u64> =
                alloc_uninit(stream, groups.max(1), "allocating aggregate output")?;
            timer.time(Phase::Kernel, || {
                launch::fill_u64(
                    &device.launcher(stream),
                    &mut out,
                    identity)
            })?;
            Ok(out)
        };
        let slots = match reduction {
            Reduction::Count | Reduction::Sum | Reduction::Min | Reduction::Max => {
                DeviceReduced::Words {
                    values: slots(reduction.identity())?,
                    high: None,
                }
            }
            Reduction::SumF64 => DeviceReduced::Words {
                values: slots(0f64.to_bits())?,
                high: None,
            },
            Reduction::SumF64Fixed => DeviceReduced::FixedF64 {
                top: slots(0)?,
                specials: slots(0)?,
                lo: slots(0)?,
                hi: slots(0)?,
            },
            Reduction::SumI128 => DeviceReduced::Words {
                values: slots(0)?,
                high: Some(slots(0)?),
            },
            Reduction::MinI128 | Reduction::MaxI128 => {
                let op = min_or_max(reduction);
                let high = slots(op.identity())?;
                DeviceReduced::Words {
                    values: slots(op.identity())?,
                    high: Some(high),
                }
            }
        };
        Ok(Self { groups, slots })
    }

    /// Enqueues the reduction of `rows` (all of them, or a chunk whose
    /// values `column` holds, where the reduction takes one pass:
    /// [`reduces_in_one_pass`]) into these slots.
    pub(super) fn reduce(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        rows: GroupRows<'_>,
        input: &ReduceInput,
        column: &UploadedInput,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let UploadedInput { values, high } = column;
        let missing = || GpuError::Invalid(format!("{:?} without its values", input.reduction));
        let mismatch = || {
            GpuError::Invalid(format!(
                "{:?} reduced into the slots of another reduction",
                input.reduction
            ))
        };
        match (input.reduction, &mut self.slots) {
            (
                reduction @ (Reduction::Count | Reduction::Sum | Reduction::Min | Reduction::Max),
                DeviceReduced::Words { values: out, .. },
            ) => {
                let op = match reduction {
                    Reduction::Count => AggregateOp::Count,
                    Reduction::Sum => AggregateOp::Sum,
                    Reduction::Min => AggregateOp::Min,
                    _ => AggregateOp::Max,
                };
                timer.time(Phase::Kernel, || {
                    launch::aggregate_u64(
                        &device.launcher(stream),
                        rows,
                        values.as_ref(),
                        None,
                        op,
                        input.flip,
                        out)
                })
            }
            (Reduction::SumF64, DeviceReduced::Words { values: out, .. }) => {
                let values = values.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_f64_sum(&device.launcher(stream), rows, values, out)
                })
            }
            (
                Reduction::SumF64Fixed,
                DeviceReduced::FixedF64 {
                    top,
                    specials,
                    lo,
                    hi,
                },
            ) => {
                let values = values.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::f64_sum_scale(&device.launcher(stream), rows, values, top, specials)?;
                    launch::f64_sum_fixed(&device.launcher(stream), rows, values, top, lo, hi)
                })
            }
            (
                Reduction::SumI128,
                DeviceReduced::Words {
                    values: out_lo,
                    high: Some(out_hi),
                },
            ) => {
                let lo = values.as_ref().ok_or_else(missing)?;
                let hi = high.as_ref().ok_or_else(missing)?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_i128_sum(
                        &device.launcher(stream), rows, lo, hi, out_lo, out_hi)
                })
            }
            (
                reduction @ (Reduction::MinI128 | Reduction::MaxI128),
                DeviceReduced::Words {
                    values: out_lo,
                    high: Some(out_hi),
                },
            ) => {
                let lo = values.as_ref().ok_or_else(missing)?;
                let hi = high.as_ref().ok_or_else(missing)?;
                let op = min_or_max(reduction);
                // The high words decide; the low words only among rows that
                // tie with their group's best high word, so the rows are
                // read twice: they come whole, never in chunks.
                rows.whole()?;
                timer.time(Phase::Kernel, || {
                    launch::aggregate_u64(
                        &device.launcher(stream),
                        rows,
                        Some(hi),
                        None,
                        op,
                        0,
                        out_hi)?;
                    launch::aggregate_u64(
                        &device.launcher(stream),
                        rows,
                        Some(lo),
                        Some((hi, &*out_hi)),
                        op,
                        0,
                        out_lo)
                })
            }
            _ => Err(mismatch()),
        }
    }

    /// The results, gathered on the device into `key_order` where given
    /// (the group at each position).
    pub(super) fn into_reduced(
        self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        key_order: Option<&DeviceVec<u64>>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<DeviceReduced> {
        let groups = self.groups;
        let mut ordered =
            |out: DeviceVec<u64>| in_key_order(device, stream, out, key_order, groups, timer);
        Ok(match self.slots {
            identity @ DeviceReduced::Identity { .. } => identity,
            DeviceReduced::Words { values, high } => DeviceReduced::Words {
                values: ordered(values)?,
                high: high.map(&mut ordered).transpose()?,
            },
            DeviceReduced::FixedF64 {
                top,
                specials,
                lo,
                hi,
            } => DeviceReduced::FixedF64 {
                top: ordered(top)?,
                specials: ordered(specials)?,
                lo: ordered(lo)?,
                hi: ordered(hi)?,
            },
        })
    }
}

/// The op of a 128-bit minimum or maximum.
pub(super) fn min_or_max(reduction: Reduction) -> AggregateOp {
    match reduction {
        Reduction::MinI128 | Reduction::Min => AggregateOp::Min,
        _ => AggregateOp::Max,
    }
}
