//! A probe chunk's pairs written range by range: the tasks' match counts
//! scanned into offsets on the device, their total read back, and the
//! pairs written in output ranges of a bounded number of pairs, a task
//! with more split into pieces counted and written the same way.

use std::sync::Arc;

use super::task_list::JoinTaskList;
use super::{DeviceBuildTable, DeviceJoinPairs};
use crate::gpu::launch;
use crate::gpu::{
    alloc_uninit, alloc_zeroed, download_u64, download_word, DeviceStream, DeviceVec, GpuDevice,
    GpuResult, Phase, PhaseTimer,
};
use crate::ops::join_tasks::{output_ranges, split_task};
use crate::ops::radix::JoinSide;
use crate::ops::scan::exclusive_scan;

/// Where each task's pairs begin in a probe chunk's output: the exclusive
/// scan of the tasks' match counts, one entry more than tasks (the last
/// the total). It stays on the device; the host reads the total, and the
/// rest only where the pairs fill more than one output range and must be
/// cut into ranges.
pub(super) struct TaskOffsets {
    device: DeviceVec<u64>,
    pub(super) total: u64,
    /// The offsets on the host, read back where `total` exceeds the pairs
    /// of one output range.
    host: Option<Vec<u64>>,
}

impl TaskOffsets {
    /// The output ranges of at most `max_pairs` pairs the tasks' pairs are
    /// written in (see [`super::output_ranges`]): all tasks at once where the
    /// offsets stayed on the device.
    fn ranges(&self, tasks: usize, max_pairs: u64) -> Vec<std::ops::Range<usize>> {
        match &self.host {
            Some(offsets) => output_ranges(offsets, max_pairs),
            None if self.total > 0 => std::iter::once(0..tasks).collect(),
            None => Vec::new(),
        }
    }

    /// The first pair of `range`'s tasks and their pairs.
    fn pairs_of(&self, range: &std::ops::Range<usize>) -> (u64, u64) {
        match &self.host {
            Some(offsets) => (offsets[range.start], offsets[range.end] - offsets[range.start]),
            // One range of every task (see `ranges`).
            None => (0, self.total),
        }
    }
}

/// Match counts of tasks `0..count` of `tasks` (the partitions without a
/// list), scanned into their offsets on the device; the offsets read back
/// only where their total exceeds `max_pairs` (see [`TaskOffsets`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn count_pairs(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    table: &DeviceBuildTable,
    probe: &JoinSide,
    tasks: Option<launch::JoinTasks<'_>>,
    count: usize,
    max_pairs: u64,
    timer: &mut PhaseTimer,
) -> GpuResult<TaskOffsets> {
    // One entry more than tasks, left zero by the count: the exclusive
    // scan turns it into the total.
    let mut offsets = alloc_zeroed::<u64>(stream, count + 1, "allocating match counts")?;
    timer.time(Phase::Kernel, || {
        launch::hash_join_count(
            &device.launcher(stream),
            table.build.side(),
            probe.side(),
            tasks,
            table.plan.partition_bits(),
            0..count as u64,
            &mut offsets)?;
        exclusive_scan(device, stream, &mut offsets, count + 1)
    })?;
    let total = download_word(device, stream, &offsets.slice(count..count + 1), "the match total", timer)?;
    let host = match total > max_pairs {
        true => {
            let mut host = Vec::new();
            download_u64(device, stream, &offsets.as_view(), &mut host, timer)?;
            Some(host)
        }
        false => None,
    };
    Ok(TaskOffsets {
        device: offsets,
        total,
        host,
    })
}

/// Writes a probe chunk's pairs range by range (see [`super::probe_partitioned`]).
pub(super) struct RangeWriter<'a, 'e> {
    pub(super) device: &'a GpuDevice,
    pub(super) stream: &'a Arc<DeviceStream>,
    pub(super) table: &'a DeviceBuildTable,
    pub(super) probe: &'a JoinSide,
    pub(super) max_pairs: u64,
    /// Pairs still to hand on (the pair limit).
    pub(super) left: u64,
    pub(super) emit: &'e mut dyn FnMut(DeviceJoinPairs<'_>, &mut PhaseTimer) -> GpuResult<()>,
}

impl RangeWriter<'_, '_> {
    /// Writes the pairs of `tasks`, whose counts' exclusive scan is
    /// `offsets`, in ranges of tasks of at most `max_pairs` pairs; a task
    /// with more is split, its pieces counted and written the same way.
    /// `whole`: these tasks hold every pair of the chunk.
    pub(super) fn write(
        &mut self,
        tasks: &mut JoinTaskList,
        offsets: &TaskOffsets,
        whole: bool,
        timer: &mut PhaseTimer,
    ) -> GpuResult<()> {
        let (device, stream) = (self.device, self.stream);
        let ranges = offsets.ranges(tasks.count, self.max_pairs);
        let whole_chunk = whole && ranges.len() == 1;
        for range in ranges {
            if self.left == 0 {
                break;
            }
            let (base, len) = offsets.pairs_of(&range);
            if len > self.max_pairs {
                // One task (see `output_ranges`): split it.
                let task = tasks.rows(device, stream, self.table, self.probe, range.start, timer)?;
                let pieces = split_task(task, len, self.max_pairs);
                if pieces.len() > 1 {
                    let mut pieces = JoinTaskList::of(device, stream, self.table, self.probe, pieces, timer)?;
                    let piece_offsets = count_pairs(
                        device,
                        stream,
                        self.table,
                        self.probe,
                        pieces.tasks(),
                        pieces.count,
                        self.max_pairs,
                        timer,
                    )?;
                    self.write(&mut pieces, &piece_offsets, false, timer)?;
                    continue;
                }
            }
            let len = len as usize;
            // Both: hash_join_write writes every one of the `len` pairs
            // of the range, as counted by hash_join_count over the same
            // inputs and tasks.
            let mut out_build: DeviceVec<u64> =
                alloc_uninit(stream, len, "allocating join output")?;
            let mut out_probe: DeviceVec<u64> =
                alloc_uninit(stream, len, "allocating join output")?;
            timer.time(Phase::Kernel, || {
                launch::hash_join_write(
                    &device.launcher(stream),
                    self.table.build.side(),
                    self.probe.side(),
                    tasks.tasks(),
                    self.table.plan.partition_bits(),
                    range.start as u64..range.end as u64,
                    &offsets.device,
                    base,
                    len,
                    &mut out_build,
                    &mut out_probe)
            })?;
            let handed = (len as u64).min(self.left);
            self.left -= handed;
            (self.emit)(
                DeviceJoinPairs {
                    build_ids: &out_build,
                    probe_ids: &out_probe,
                    len: handed as usize,
                    written: len,
                    whole_chunk: whole_chunk && handed == len as u64,
                },
                timer,
            )?;
        }
        Ok(())
    }
}
