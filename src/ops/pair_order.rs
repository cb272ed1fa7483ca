//! A GPU hash join's pairs put in `HashJoinExec`'s order on the device: by
//! probe row, then by the build row's arrival, with two stable radix sorts
//! and gathers.

use std::sync::Arc;

use super::hash_join::{bits_below, DeviceJoinPairs};
use super::merge_join::radix_sort;
use crate::gpu::launch;
use crate::gpu::{
    alloc_uninit, DeviceStream, DeviceVec, DriverResultExt, GpuDevice, GpuResult, Phase,
    PhaseTimer,
};

/// Device bytes [`order_by_probe_row`] allocates for `pairs` pairs, the
/// radix histograms aside.
pub fn order_device_bytes(pairs: usize) -> usize {
    // Ranks, permutation, the sort's second buffers, probe and build ids.
    8 * 6 * pairs
}

/// `pairs` in `HashJoinExec`'s order: by probe row, then by the arrival
/// rank of the build row (`build_ranks[build row]`, or the build row itself
/// when `None`: the rows arrived in row order). Two stable LSD radix sorts, the rank first, then
/// the probe row over the rank order, and gathers. `build_rows` and
/// `probe_rows` bound the ranks and probe row ids. Returns the ordered
/// (build row ids, probe row ids).
pub fn order_by_probe_row(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    pairs: &DeviceJoinPairs<'_>,
    build_ranks: Option<&DeviceVec<u64>>,
    (build_rows, probe_rows): (u64, u64),
    timer: &mut PhaseTimer,
) -> GpuResult<(DeviceVec<u64>, DeviceVec<u64>)> {
    let len = pairs.len;
    let alloc = |what: &'static str| -> GpuResult<DeviceVec<u64>> {
        // Each buffer is written whole (iota, gather_u64 over `len`
        // elements, or the sort) before it is read.
        alloc_uninit::<u64>(stream, len, what)
    };
    let mut order = alloc("allocating the pair order")?;
    timer.time(Phase::Kernel, || {
        launch::iota(&device.launcher(stream), &mut order, 0)
    })?;
    let pair_ranks = match build_ranks {
        Some(ranks) => {
            let mut pair_ranks = alloc("allocating pair ranks")?;
            timer.time(Phase::Kernel, || {
                launch::gather_u64(
                    &device.launcher(stream),
                    ranks,
                    pairs.build_ids,
                    len,
                    &mut pair_ranks)
            })?;
            pair_ranks
        }
        None => timer.time(Phase::Kernel, || {
            stream
                .clone_dtod(pairs.build_ids)
                .during("copying build row ids")
        })?,
    };
    order = timer
        .time(Phase::Kernel, || {
            radix_sort(device, stream, pair_ranks, order, bits_below(build_rows))
        })?
        .row_ids;
    let mut probe_in_order = alloc("allocating ordered probe ids")?;
    timer.time(Phase::Kernel, || {
        launch::gather_u64(
            &device.launcher(stream),
            pairs.probe_ids,
            &order,
            len,
            &mut probe_in_order)
    })?;
    let sorted = timer.time(Phase::Kernel, || {
        radix_sort(
            device,
            stream,
            probe_in_order,
            order,
            bits_below(probe_rows),
        )
    })?;
    let mut build_in_order = alloc("allocating ordered build ids")?;
    timer.time(Phase::Kernel, || {
        launch::gather_u64(
            &device.launcher(stream),
            pairs.build_ids,
            &sorted.row_ids,
            len,
            &mut build_in_order)
    })?;
    Ok((build_in_order, sorted.keys))
}
