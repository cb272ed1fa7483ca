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
    alloc_uninit, alloc_zeroed, download_word, DeviceStream, DeviceVec, GpuDevice, GpuResult,
    Phase, PhaseTimer,
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
    /// Device bytes [`Self::keep_where`] allocates at most: a flag and an id
    /// a group (and one flag more), and each result vector and the
    /// identities gathered again, were every group kept.
    pub fn keep_where_bytes(&self) -> usize {
        let vectors: usize = self
            .reduced
            .iter()
            .map(|reduced| match reduced {
                DeviceReduced::Identity { .. } => 0,
                DeviceReduced::Words { high, .. } => 1 + usize::from(high.is_some()),
                DeviceReduced::FixedF64 { .. } => 4,
            })
            .sum();
        let words = (self.groups + 1) + self.groups * (1 + vectors + 1);
        words.saturating_mul(std::mem::size_of::<u64>())
    }

    /// The groups that satisfy every one of `comparisons` the device can
    /// test (over reductions whose results are words, of groups told apart
    /// by their key words), gathered in group order into new results on
    /// the same stream; `None` where it can test none of them. Reads back
    /// one word, the count kept. The caller reserves
    /// [`Self::keep_where_bytes`] of device memory for it.
    pub fn keep_where(
        &self,
        device: &GpuDevice,
        comparisons: &[GroupComparison],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<DeviceGrouped>> {
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
        Ok(Some(DeviceGrouped {
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
        }))
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
