//! Columns gathered by row id on the device (seed 002's gather), and a
//! gathered column folded into one word: the device half of a join's
//! output columns and of an aggregation computed from a join's pairs.

use std::sync::Arc;

use crate::gpu::launch::{self, AggregateOp, GatheredValues, GroupRows, ValueWidth};
use crate::gpu::{alloc_uninit, DeviceStream, DeviceVec, GpuDevice, GpuResult};

/// Value `i` of `out` becomes value `ids[i]` of `values` (which holds
/// `value_rows` values of `width`), for `i < len`; `out` is reused where it
/// holds `len` values of `width`, else made anew for `len` values of
/// `widest` (the widest column it will serve); returns the values.
#[allow(clippy::too_many_arguments)]
pub fn gather_into<'a>(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    width: ValueWidth,
    values: &DeviceVec<u64>,
    value_rows: usize,
    ids: &DeviceVec<u64>,
    len: usize,
    widest: ValueWidth,
    out: &'a mut Option<DeviceVec<u64>>,
) -> GpuResult<&'a DeviceVec<u64>> {
    if out.as_ref().is_none_or(|target| target.len() < width.words(len)) {
        // The gather below writes the first `len` values, the only ones
        // read.
        let words = widest.max(width).words(len);
        *out = Some(alloc_uninit::<u64>(stream, words, "allocating gathered values")?);
    }
    let Some(target) = out.as_mut() else {
        unreachable!("allocated just above")
    };
    launch::gather_values(&device.launcher(stream), width, values, value_rows, ids, len, target)?;
    Ok(target)
}

/// `ids[i]`-th word of `values` for `i < len`, as a new device vector.
pub fn gather_u64(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    values: &DeviceVec<u64>,
    ids: &DeviceVec<u64>,
    len: usize,
) -> GpuResult<DeviceVec<u64>> {
    // gather_u64 writes the first `len` words, the only ones read.
    let mut out = alloc_uninit::<u64>(stream, len, "allocating gathered ids")?;
    launch::gather_u64(&device.launcher(stream), values, ids, len, &mut out)?;
    Ok(out)
}

/// `op` (a sum, minimum or maximum) over the values `ids[..len]` of
/// `values` (which holds `value_rows` values read as `read_as`, each XORed
/// with `flip`), folded as they are gathered into one word on the device.
#[allow(clippy::too_many_arguments)]
pub fn fold_gathered(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    values: &DeviceVec<u64>,
    value_rows: usize,
    read_as: GatheredValues,
    ids: &DeviceVec<u64>,
    len: usize,
    op: AggregateOp,
    flip: u64,
) -> GpuResult<DeviceVec<u64>> {
    let launcher = device.launcher(stream);
    // Filled with the identity right below, before any read.
    let mut out = alloc_uninit::<u64>(stream, 1, "allocating a reduction's word")?;
    launch::fill_u64(&launcher, &mut out, op.identity())?;
    launch::aggregate_gathered(&launcher, values, value_rows, read_as, ids, len, op, flip, &mut out)?;
    Ok(out)
}

/// The sum of the doubles `ids[..len]` of `values` (`value_rows` of them),
/// in one word on the device, in the order the device's atomics add them;
/// `scratch` holds the gathered values (reused where large enough).
pub fn sum_gathered_f64(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    values: &DeviceVec<u64>,
    value_rows: usize,
    ids: &DeviceVec<u64>,
    len: usize,
    scratch: &mut Option<DeviceVec<u64>>,
) -> GpuResult<DeviceVec<u64>> {
    let eight = ValueWidth::Eight;
    let gathered = gather_into(device, stream, eight, values, value_rows, ids, len, eight, scratch)?;
    let launcher = device.launcher(stream);
    // Filled with zero right below, before any read.
    let mut out = alloc_uninit::<u64>(stream, 1, "allocating a reduction's word")?;
    launch::fill_u64(&launcher, &mut out, 0f64.to_bits())?;
    let rows = GroupRows {
        groups_of_rows: None,
        rows: len,
        valid_bits: None,
        groups: 1,
        span: None,
    };
    launch::aggregate_f64_sum(&launcher, rows, gathered, &mut out)?;
    Ok(out)
}
