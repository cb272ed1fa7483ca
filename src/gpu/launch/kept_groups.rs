//! Typed launches of the kernels of a filter of the groups run on the
//! device (`group_keep_compare`, `group_keep_ids` in `ptx/group_by.cu`).

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::Launcher;
use super::{arg_or_null, check_len, config, grid_stride_blocks};
use crate::gpu::{DriverResultExt, GpuResult};

/// How a group's value compares with a constant (`op` of
/// `group_keep_compare`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq = 0,
    NotEq = 1,
    Lt = 2,
    LtEq = 3,
    Gt = 4,
    GtEq = 5,
}

impl CompareOp {
    /// The comparison with its sides swapped (`c < x` is `x > c`).
    pub fn swapped(self) -> Self {
        match self {
            CompareOp::Eq | CompareOp::NotEq => self,
            CompareOp::Lt => CompareOp::Gt,
            CompareOp::LtEq => CompareOp::GtEq,
            CompareOp::Gt => CompareOp::Lt,
            CompareOp::GtEq => CompareOp::LtEq,
        }
    }
}

/// One value per group on the device: `high[g] * 2^64 + low[g]` with
/// `high`, else `low[g] ^ flip` as a signed 64-bit integer.
#[derive(Debug, Clone, Copy)]
pub struct GroupValues<'a> {
    pub low: &'a CudaSlice<u64>,
    pub high: Option<&'a CudaSlice<u64>>,
    pub flip: u64,
}

/// `group_keep_compare`: `keep[g]` for `g < groups` becomes whether group
/// `g`'s value compares with `constant` as `op` says, or (`and_into`)
/// stays set only where it also does.
pub fn group_keep_compare(
    launcher: &Launcher<'_>,
    values: GroupValues<'_>,
    groups: usize,
    op: CompareOp,
    constant: i128,
    and_into: bool,
    keep: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_len(values.low, groups, "group values (low words)")?;
    if let Some(high) = values.high {
        check_len(high, groups, "group values (high words)")?;
    }
    check_len(keep, groups, "kept groups' flags")?;
    if groups == 0 {
        return Ok(());
    }
    let n = groups as u64;
    let op = op as u32;
    // The constant's two's complement words.
    let (constant_low, constant_high) = (constant as u64, (constant >> 64) as u64);
    let and_into = u32::from(and_into);
    let mut launch = stream.launch_builder(&kernels.group_keep_compare);
    launch.arg(values.low);
    arg_or_null(&mut launch, values.high);
    launch
        .arg(&values.flip)
        .arg(&n)
        .arg(&op)
        .arg(&constant_low)
        .arg(&constant_high)
        .arg(&and_into)
        .arg(&mut *keep);
    // SAFETY: the kernel reads low[..groups], high[..groups] where it is
    // not null, and writes keep[..groups]: all three lengths are checked
    // above.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching group_keep_compare")?;
    Ok(())
}

/// `group_keep_ids`: with `places` the exclusive prefix sum of `groups + 1`
/// keep flags (the last 0), writes each kept group's id to `ids`, in group
/// order (`ids` holds `places[groups]` of them).
pub fn group_keep_ids(
    launcher: &Launcher<'_>,
    places: &CudaSlice<u64>,
    groups: usize,
    ids: &mut CudaSlice<u64>,
) -> GpuResult<()> {
    let Launcher { kernels, stream, sm_count } = *launcher;
    check_len(places, groups + 1, "kept groups' places")?;
    if groups == 0 || ids.is_empty() {
        return Ok(());
    }
    let n = groups as u64;
    let ids_len = ids.len() as u64;
    let mut launch = stream.launch_builder(&kernels.group_keep_ids);
    launch.arg(places).arg(&n).arg(&mut *ids).arg(&ids_len);
    // SAFETY: the kernel reads places[..groups + 1] (checked above) and
    // writes ids only below ids_len, its length.
    unsafe { launch.launch(config(grid_stride_blocks(n, sm_count))?) }
        .during("launching group_keep_ids")?;
    Ok(())
}
