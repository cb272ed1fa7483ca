//! Typed launches of the kernels in `ptx/group_by.cu` that find each
//! group's first row, for groups put in the order their first rows come.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::group_by::table_slot_words;
use super::{arg_or_null, check_len, config, grid_stride_blocks, Launcher};
use crate::gpu::{DriverResultExt, GpuError, GpuResult};

/// `group_min_rows`: the first row of each group into `min_rows` (one
/// entry per group, `u64::MAX` on entry): `row_groups` holds the group of
/// each position, whose row is `positions[i]` (`None`: `i` itself).
pub fn group_min_rows(
    launcher: &Launcher<'_>,
    row_groups: &CudaSlice<u64>,
    positions: Option<&CudaSlice<u64>>,
    rows: usize,
    min_rows: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_len(row_groups, rows, "row groups")?;
    if let Some(positions) = positions {
        check_len(positions, rows, "row positions")?;
    }
    let n = rows as u64;
    let groups = min_rows.len() as u64;
    if n == 0 || groups == 0 {
        return Ok(());
    }
    let mut launch = stream.launch_builder(&kernels.group_min_rows);
    launch.arg(row_groups);
    arg_or_null(&mut launch, positions);
    launch.arg(&n).arg(&mut *min_rows).arg(&groups);
    // SAFETY: reads row_groups[..rows] and positions[..rows] (lengths
    // checked, or null); writes min_rows only at group ids below its
    // length, which the kernel checks.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching group_min_rows")?;
    Ok(())
}

/// `table_group_min_rows`: as [`group_min_rows`], each row's group found
/// again, from the rows' `keys`, in the table [`group_insert_fold`] filled
/// with `folds` folds (`slot_results`) and numbered (`table_groups`: the
/// group of each slot), which held every key.
#[allow(clippy::too_many_arguments)]
pub fn table_group_min_rows(
    launcher: &Launcher<'_>,
    keys: &CudaSlice<u64>,
    rows: usize,
    table_groups: &CudaSlice<u64>,
    slot_results: &CudaSlice<u64>,
    folds: usize,
    min_rows: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_len(keys, rows, "keys")?;
    let slots = table_groups.len();
    if slots < 2 || !(slots - 1).is_power_of_two() {
        return Err(GpuError::Invalid(format!(
            "a folding table of {slots} slots (a power of two and the reserved one expected)"
        )));
    }
    let slot_words = table_slot_words(folds);
    check_len(slot_results, slots * slot_words, "slot results")?;
    let n = rows as u64;
    let groups = min_rows.len() as u64;
    if n == 0 || groups == 0 {
        return Ok(());
    }
    let capacity = (slots - 1) as u64;
    let slot_words = slot_words as u32;
    let mut launch = stream.launch_builder(&kernels.table_group_min_rows);
    launch
        .arg(keys)
        .arg(&n)
        .arg(slot_results)
        .arg(&slot_words)
        .arg(table_groups)
        .arg(&capacity)
        .arg(&mut *min_rows)
        .arg(&groups);
    // SAFETY: reads keys[..rows] and, for slots up to `capacity` (the
    // reserved one), slot_results at (slot + 1) * slot_words - 1 and
    // table_groups[slot], all within the checked lengths; writes min_rows
    // only at group ids below its length, which the kernel checks.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching table_group_min_rows")?;
    Ok(())
}
