//! A filter of the groups (a `HAVING`) run on the device before the groups
//! come back: the groups whose results compare with constants as asked are
//! gathered into a smaller [`DeviceGrouped`], so that only they cross the
//! bus and are made into rows. The comparisons are a part of the filter
//! (the terms of its conjunction the device can test), so the groups kept
//! may still hold some the filter drops: the caller runs the filter again
//! over the rows.

use std::sync::Arc;

use super::results::DeviceReduced;
use super::{DeviceGrouped, GroupsBack};
use crate::gpu::launch::{self, CompareOp, GroupValues};
use crate::gpu::{
    alloc_uninit, alloc_zeroed, download_word, DeviceReservation, DeviceStream, DeviceVec,
    GpuDevice, GpuResult, Phase, PhaseTimer, ReservationKind,
};
use crate::ops::gather::gather_u64;
use crate::ops::scan::exclusive_scan;

/// A group is kept where reduction `reduction`'s result compares with
/// `constant` as `op` says. The result is the reduction's 128-bit value
/// where it has high words, else its word XOR `flip` as a signed 64-bit
/// integer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupComparison {
    pub reduction: usize,
    pub flip: u64,
    pub op: CompareOp,
    pub constant: i128,
}

impl DeviceGrouped {
    /// 8-byte words each kept group takes in the new results: its id, its
    /// identity and a word of every result vector.
    fn words_per_kept_group(&self) -> usize {
        let vectors: usize = self
            .reduced
            .iter()
            .map(|reduced| match reduced {
                DeviceReduced::Identity { .. } => 0,
                DeviceReduced::Words { high, .. } => 1 + usize::from(high.is_some()),
                DeviceReduced::FixedF64 { .. } => 4,
            })
            .sum();
        2 + vectors
    }

    /// The groups that satisfy every one of `comparisons` the device can
    /// test (over reductions whose results are words, of groups told apart
    /// by their key words), gathered in group order into new results on
    /// the same stream; `None` where it can test none of them. Reads back
    /// one word, the count kept. Its device memory is reserved in the
    /// budget (within `memory_fraction`): the flags while they are used,
    /// the kept groups' in the returned reservation, to be held as long as
    /// they are.
    pub fn keep_where(
        &self,
        device: &GpuDevice,
        comparisons: &[GroupComparison],
        memory_fraction: f64,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<(DeviceGrouped, DeviceReservation)>> {
        let Some(identities) = &self.identities else {
            return Ok(None);
        };
        if self.back != GroupsBack::KeyWords {
            return Ok(None);
        }
        let testable: Vec<(GroupValues<'_>, &GroupComparison)> = comparisons
            .iter()
            .filter_map(|comparison| match self.reduced.get(comparison.reduction)? {
                DeviceReduced::Words { values, high } => {
                    if high.is_some() && comparison.flip != 0 {
                        return None;
                    }
                    let values = GroupValues {
                        low: values,
                        high: high.as_ref(),
                        flip: comparison.flip,
                    };
                    Some((values, comparison))
                }
                DeviceReduced::Identity { .. } | DeviceReduced::FixedF64 { .. } => None,
            })
            .collect();
        if testable.is_empty() {
            return Ok(None);
        }
        let stream = &self.stream;
        let groups = self.groups;
        let launcher = device.launcher(stream);
        // One flag per group and a last one left 0, scanned in place into
        // each group's place among the kept ones and, last, their count.
        let word = std::mem::size_of::<u64>();
        let budget = device.budget();
        let _flags_memory =
            budget.reserve((groups + 1) * word, memory_fraction, ReservationKind::Transient)?;
        let mut places =
            alloc_zeroed::<u64>(stream, groups + 1, "allocating the kept groups' flags")?;
        timer.time_on(stream, Phase::Kernel, || -> GpuResult<()> {
            for (i, (values, comparison)) in testable.iter().enumerate() {
                launch::group_keep_compare(
                    &launcher,
                    *values,
                    groups,
                    comparison.op,
                    comparison.constant,
                    i > 0,
                    &mut places,
                )?;
            }
            exclusive_scan(device, stream, &mut places, groups + 1)
        })?;
        let kept = download_word(
            device,
            stream,
            &places.slice(groups..groups + 1),
            "the kept groups' count",
            timer,
        )? as usize;
        let kept_bytes = kept.max(1) * self.words_per_kept_group() * word;
        let memory = budget.reserve(kept_bytes, memory_fraction, ReservationKind::Transient)?;
        // `gather_u64` writes every one of the `kept` ids' words.
        let mut ids = alloc_uninit::<u64>(stream, kept, "allocating the kept groups' ids")?;
        timer.time_on(stream, Phase::Kernel, || -> GpuResult<()> {
            launch::group_keep_ids(&launcher, &places, groups, &mut ids)
        })?;
        let gather = |words: &DeviceVec<u64>| gather_kept(device, stream, words, &ids, kept);
        let reduced = timer.time_on(stream, Phase::Kernel, || -> GpuResult<Vec<DeviceReduced>> {
            self.reduced
                .iter()
                .map(|reduced| {
                    Ok(match reduced {
                        DeviceReduced::Identity { word, wide } => DeviceReduced::Identity {
                            word: *word,
                            wide: *wide,
                        },
                        DeviceReduced::Words { values, high } => DeviceReduced::Words {
                            values: gather(values)?,
                            high: high.as_ref().map(gather).transpose()?,
                        },
                        DeviceReduced::FixedF64 {
                            top,
                            specials,
                            lo,
                            hi,
                        } => DeviceReduced::FixedF64 {
                            top: gather(top)?,
                            specials: gather(specials)?,
                            lo: gather(lo)?,
                            hi: gather(hi)?,
                        },
                    })
                })
                .collect()
        })?;
        let identities = timer.time_on(stream, Phase::Kernel, || gather(identities))?;
        let kept = DeviceGrouped {
            groups: kept,
            identities: Some(identities),
            back: self.back,
            row_groups: Vec::new(),
            reduced,
            numbered_in_partitions: self.numbered_in_partitions,
            table_overflowed: self.table_overflowed,
            folded_in_table: self.folded_in_table,
            folding_table_grown: self.folding_table_grown,
            stream: Arc::clone(stream),
            // Made on `stream`, before anything enqueued on it from now on.
            identities_made: None,
            reductions_made: Vec::new(),
            inputs_reduced_as_they_landed: self.inputs_reduced_as_they_landed,
        };
        Ok(Some((kept, memory)))
    }
}

/// The words of `words` at `ids[..kept]`, in a new vector of `kept` words
/// (one word where none is kept, never read).
fn gather_kept(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    words: &DeviceVec<u64>,
    ids: &DeviceVec<u64>,
    kept: usize,
) -> GpuResult<DeviceVec<u64>> {
    match kept {
        0 => alloc_zeroed::<u64>(stream, 1, "allocating a kept group's words"),
        _ => gather_u64(device, stream, words, ids, kept),
    }
}
