//! The join kernels' tasks for one partitioned probe chunk: each partition
//! a task, unless the device finds a partition too large for one block
//! (its largest partition's rows, one word read back); then the sides'
//! partition starts are read back and the heavy partitions split into
//! slices ([`crate::ops::join_tasks`]).

use std::sync::Arc;

use super::{DeviceBuildTable, PROBE_TASK_ROWS};
use crate::gpu::launch;
use crate::gpu::{
    alloc_zeroed, download_u64, download_word, upload_u64, DeviceStream, DeviceVec, GpuDevice, GpuError,
    GpuResult, Phase, PhaseTimer,
};
use crate::ops::join_tasks::{check_task_rows, partition_tasks, TaskRows, BUILD_TASK_ROWS};
use crate::ops::radix::JoinSide;

/// The join kernels' tasks for one partitioned probe chunk (see
/// [`crate::ops::join_tasks`]): partitions with many probe or build rows
/// split into tasks of slices of each, or a task's pieces; otherwise each
/// partition is a task and there is no list.
pub(super) struct JoinTaskList {
    /// Each task's rows, on the host and on the device.
    list: Option<(Vec<TaskRows>, DeviceVec<u64>)>,
    pub(super) count: usize,
    /// The probe side's partition starts, where read back.
    probe_starts: Option<Vec<u64>>,
}

impl JoinTaskList {
    pub(super) fn new(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        table: &DeviceBuildTable,
        probe: &JoinSide,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        // Partitions of no more rows than a slice on the probe side and a
        // table on the build side are not split: neither side's starts
        // are read back then, only the largest partition's rows (none of
        // a probe chunk of no more rows than a slice, or where the build
        // side already has a partition to split).
        let heavy = table.largest_partition(device, stream, timer)? > BUILD_TASK_ROWS
            || (probe.rows() as u64 > PROBE_TASK_ROWS
                && largest_partition(device, stream, probe, table.plan.partitions(), timer)?
                    > PROBE_TASK_ROWS);
        if !heavy {
            return Ok(Self::of_partitions(table));
        }
        let build_starts = table.host_starts(device, stream, timer)?;
        let probe_starts = starts_on_host(device, stream, probe, timer)?;
        let max_tasks = MAX_TASKS_PER_PARTITION_OR_SLICE
            * (table.plan.partitions() + probe.rows().div_ceil(PROBE_TASK_ROWS as usize));
        let split = partition_tasks(
            &probe_starts,
            build_starts,
            PROBE_TASK_ROWS,
            BUILD_TASK_ROWS,
            max_tasks,
        );
        let mut list = match split {
            Some(tasks) => Self::of(device, stream, table, probe, tasks, timer)?,
            None => Self::of_partitions(table),
        };
        list.probe_starts = Some(probe_starts);
        Ok(list)
    }

    /// No list: each partition is a task.
    fn of_partitions(table: &DeviceBuildTable) -> Self {
        Self {
            list: None,
            count: table.plan.partitions(),
            probe_starts: None,
        }
    }

    /// A list of `tasks`, checked against both sides' rows and copied to
    /// the device.
    pub(super) fn of(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        table: &DeviceBuildTable,
        probe: &JoinSide,
        tasks: Vec<TaskRows>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        check_task_rows(&tasks, probe.rows() as u64, table.rows() as u64)
            .map_err(GpuError::Invalid)?;
        let flat: Vec<u64> = tasks.iter().flatten().copied().collect();
        Ok(Self {
            count: tasks.len(),
            list: Some((tasks, upload_u64(device, stream, &flat, timer)?)),
            probe_starts: None,
        })
    }

    pub(super) fn tasks(&self) -> Option<launch::JoinTasks<'_>> {
        self.list
            .as_ref()
            .map(|(_, ranges)| launch::JoinTasks { ranges })
    }

    /// Task `t`'s rows: from the list, or partition `t`'s on both sides
    /// (the probe side's starts read back the first time).
    pub(super) fn rows(
        &mut self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        table: &DeviceBuildTable,
        probe: &JoinSide,
        t: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<TaskRows> {
        if let Some((tasks, _)) = &self.list {
            return Ok(tasks[t]);
        }
        if self.probe_starts.is_none() {
            self.probe_starts = Some(starts_on_host(device, stream, probe, timer)?);
        }
        let probe_starts = self.probe_starts.as_deref().unwrap_or_default();
        let build_starts = table.host_starts(device, stream, timer)?;
        Ok([
            probe_starts[t],
            probe_starts[t + 1],
            build_starts[t],
            build_starts[t + 1],
        ])
    }
}

/// The most rows one of `side`'s `partitions` partitions holds, found on
/// the device (one word read back, where the starts are as many words).
pub(super) fn largest_partition(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    side: &JoinSide,
    partitions: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<u64> {
    let mut largest = alloc_zeroed::<u64>(stream, 1, "allocating the largest partition's rows")?;
    timer.time(Phase::Kernel, || {
        launch::largest_partition(
            &device.launcher(stream),
            &side.starts,
            partitions as u64,
            &mut largest,
        )
    })?;
    download_word(device, stream, &largest.as_view(), "the largest partition", timer)
}

/// A side's partition starts, read back from the device.
pub(super) fn starts_on_host(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    side: &JoinSide,
    timer: &mut PhaseTimer,
) -> GpuResult<Vec<u64>> {
    let mut starts = Vec::new();
    download_u64(device, stream, &side.starts.as_view(), &mut starts, timer)?;
    Ok(starts)
}

/// Tasks a partition, or a slice of `PROBE_TASK_ROWS` probe rows, becomes at
/// most where build partitions are split (see
/// [`crate::ops::join_tasks::partition_tasks`]): the task list stays within
/// a few words a partition.
pub(super) const MAX_TASKS_PER_PARTITION_OR_SLICE: usize = 4;
