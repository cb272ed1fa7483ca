//! The hash join kernels' task list as launch arguments: checked against
//! the launch's task range, and passed as one device pointer (null
//! without a list).

use cudarc::driver::{CudaSlice, PushKernelArg};

use crate::gpu::{GpuError, GpuResult};

/// Join tasks in place of the partitions (see `hash_join.cu`): task `t`
/// joins probe rows `ranges[4t]..ranges[4t + 1]` with build rows
/// `ranges[4t + 2]..ranges[4t + 3]`, each within one partition of its side.
#[derive(Clone, Copy)]
pub struct JoinTasks<'a> {
    /// Four entries a task.
    pub ranges: &'a CudaSlice<u64>,
}

impl JoinTasks<'_> {
    /// Tasks in the list.
    pub fn count(&self) -> usize {
        self.ranges.len() / 4
    }
}

/// A null device pointer: the join kernels' task list where there is none.
const NO_TASK_LIST: u64 = 0;

/// Checks the kernels' task range against `tasks`, or against the
/// partitions where there is no task list.
pub(super) fn check_join_tasks(
    tasks: Option<JoinTasks<'_>>,
    partition_bits: u32,
    range: &std::ops::Range<u64>,
) -> GpuResult<()> {
    let count = match tasks {
        Some(tasks) => {
            if tasks.ranges.len() % 4 != 0 {
                return Err(GpuError::Invalid(format!(
                    "a join task list of {} entries, not four a task",
                    tasks.ranges.len()
                )));
            }
            tasks.count() as u64
        }
        None => 1u64 << partition_bits,
    };
    if range.start > range.end || range.end > count {
        return Err(GpuError::Invalid(format!(
            "join task range {range:?} beyond {count} tasks"
        )));
    }
    Ok(())
}

/// Pushes the task list's device pointer (null without one).
pub(super) fn push_join_tasks<'a>(launch: &mut cudarc::driver::LaunchArgs<'a>, tasks: &Option<JoinTasks<'a>>) {
    match tasks {
        Some(tasks) => {
            launch.arg(tasks.ranges);
        }
        None => {
            launch.arg(&NO_TASK_LIST);
        }
    }
}
