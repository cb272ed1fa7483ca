//! The radix-partitioned hash join on device columns (seed 000 §3.2, seed 002
//! A6): both sides partitioned with the same [`RadixPlan`], matches counted
//! per partition, the output sized exactly from the counts, then written
//! range of partitions by range so the output buffer stays bounded.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::radix::{radix_partition, PartitionedColumn, RadixPlan};
use crate::gpu::launch;
use crate::gpu::{
    download_u64, upload_u64, DeviceVec, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase,
    PhaseTimer,
};

/// The build side of a join, partitioned and resident on one device.
#[derive(Debug)]
pub struct DeviceBuildTable {
    plan: RadixPlan,
    build: PartitionedColumn,
}

impl DeviceBuildTable {
    /// Copies the build keys (and row ids, or `0..n` when `None`) to the
    /// device and partitions them by `plan`.
    pub fn build(
        device: &GpuDevice,
        stream: &Arc<CudaStream>,
        keys: &[u64],
        row_ids: Option<&[u64]>,
        plan: RadixPlan,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let build = upload_and_partition(device, stream, keys, row_ids, &plan, timer)?;
        Ok(Self { plan, build })
    }

    /// The partitioning shared by both sides.
    pub fn plan(&self) -> &RadixPlan {
        &self.plan
    }

    /// Build rows on the device.
    pub fn rows(&self) -> usize {
        self.build.rows()
    }

    /// Device bytes a build table of `rows` rows holds once built.
    pub fn resident_bytes(rows: usize, plan: &RadixPlan) -> usize {
        8 * (2 * rows + plan.partitions() + 1)
    }
}

fn upload_and_partition(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    keys: &[u64],
    row_ids: Option<&[u64]>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<PartitionedColumn> {
    let device_keys = upload_u64(device, stream, keys, timer)?;
    let device_ids = match row_ids {
        Some(ids) => {
            if ids.len() != keys.len() {
                return Err(GpuError::Invalid(format!(
                    "{} row ids for {} keys",
                    ids.len(),
                    keys.len()
                )));
            }
            upload_u64(device, stream, ids, timer)?
        }
        None => {
            // SAFETY: iota writes every element.
            let mut ids =
                unsafe { stream.alloc::<u64>(keys.len()) }.during("allocating row ids")?;
            timer.time(Phase::Kernel, || {
                launch::iota(device.kernels(), stream, device.sm_count(), &mut ids, 0)
            })?;
            ids
        }
    };
    timer.time(Phase::Kernel, || {
        radix_partition(device, stream, device_keys, device_ids, plan)
    })
}

/// Device bytes one probe chunk of `rows` rows needs beside the build table,
/// with at most `max_pairs` output pairs on the device at a time.
pub fn probe_device_bytes(rows: usize, plan: &RadixPlan, max_pairs: usize, sm_count: u32) -> usize {
    plan.device_bytes(rows, sm_count) + 8 * 2 * (plan.partitions() + 1) + 16 * max_pairs
}

/// Joins one chunk of probe keys against `table`. For each range of
/// partitions whose output fits `max_pairs` (or a single larger partition),
/// calls `emit(build_row_ids, probe_row_ids)` with the matching pairs in
/// host memory. Returns the number of pairs.
#[allow(clippy::too_many_arguments)]
pub fn probe(
    device: &GpuDevice,
    stream: &Arc<CudaStream>,
    table: &DeviceBuildTable,
    keys: &[u64],
    row_ids: Option<&[u64]>,
    max_pairs: usize,
    timer: &mut PhaseTimer,
    mut emit: impl FnMut(Vec<u64>, Vec<u64>) -> GpuResult<()>,
) -> GpuResult<u64> {
    if keys.is_empty() || table.rows() == 0 {
        return Ok(0);
    }
    let plan = table.plan();
    let probe = upload_and_partition(device, stream, keys, row_ids, plan, timer)?;
    let partitions = plan.partitions() as u64;
    let sm_count = device.sm_count();

    let mut counts = stream
        .alloc_zeros::<u64>(plan.partitions())
        .during("allocating match counts")?;
    timer.time(Phase::Kernel, || {
        launch::hash_join_count(
            device.kernels(),
            stream,
            sm_count,
            table.build.side(),
            probe.side(),
            plan.partition_bits(),
            0..partitions,
            &mut counts,
        )
    })?;
    let mut host_counts = Vec::new();
    download_u64(device, stream, &counts.as_view(), &mut host_counts, timer)?;
    let offsets = exclusive_offsets(&host_counts);
    let total = *offsets.last().unwrap_or(&0);
    if total == 0 {
        return Ok(0);
    }
    let device_offsets = upload_u64(device, stream, &offsets[..plan.partitions()], timer)?;

    for range in output_ranges(&offsets, max_pairs as u64) {
        let base = offsets[range.start];
        let len = (offsets[range.end] - base) as usize;
        // SAFETY (both): hash_join_write writes every one of the `len` pairs
        // of the range, as counted by hash_join_count over the same inputs.
        let mut out_build: DeviceVec<u64> =
            unsafe { stream.alloc(len) }.during("allocating join output")?;
        let mut out_probe: DeviceVec<u64> =
            unsafe { stream.alloc(len) }.during("allocating join output")?;
        timer.time(Phase::Kernel, || {
            launch::hash_join_write(
                device.kernels(),
                stream,
                sm_count,
                table.build.side(),
                probe.side(),
                plan.partition_bits(),
                range.start as u64..range.end as u64,
                &device_offsets,
                base,
                len,
                &mut out_build,
                &mut out_probe,
            )
        })?;
        let mut build_ids = Vec::with_capacity(len);
        let mut probe_ids = Vec::with_capacity(len);
        download_u64(device, stream, &out_build.as_view(), &mut build_ids, timer)?;
        download_u64(device, stream, &out_probe.as_view(), &mut probe_ids, timer)?;
        emit(build_ids, probe_ids)?;
    }
    Ok(total)
}

/// `offsets[p]` = pairs before partition p; `offsets[counts.len()]` = total.
pub fn exclusive_offsets(counts: &[u64]) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut running = 0u64;
    offsets.push(0);
    for &c in counts {
        running += c;
        offsets.push(running);
    }
    offsets
}

/// Splits partitions into consecutive ranges of at most `max_pairs` output
/// pairs each (a single partition above it gets a range of its own); ranges
/// without output are dropped.
pub fn output_ranges(offsets: &[u64], max_pairs: u64) -> Vec<Range<usize>> {
    let partitions = offsets.len().saturating_sub(1);
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < partitions {
        let mut end = start + 1;
        while end < partitions && offsets[end + 1] - offsets[start] <= max_pairs {
            end += 1;
        }
        if offsets[end] > offsets[start] {
            ranges.push(start..end);
        }
        start = end;
    }
    ranges
}

/// CPU references.
pub mod reference {
    use std::collections::HashMap;

    /// Every (build row id, probe row id) pair with equal keys, sorted.
    pub fn hash_join(
        build_keys: &[u64],
        build_ids: &[u64],
        probe_keys: &[u64],
        probe_ids: &[u64],
    ) -> Vec<(u64, u64)> {
        let mut table: HashMap<u64, Vec<u64>> = HashMap::new();
        for (&k, &id) in build_keys.iter().zip(build_ids) {
            table.entry(k).or_default().push(id);
        }
        let mut pairs = Vec::new();
        for (&k, &probe_id) in probe_keys.iter().zip(probe_ids) {
            if let Some(ids) = table.get(&k) {
                pairs.extend(ids.iter().map(|&b| (b, probe_id)));
            }
        }
        pairs.sort_unstable();
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_end_with_the_total() {
        assert_eq!(exclusive_offsets(&[2, 0, 3]), vec![0, 2, 2, 5]);
        assert_eq!(exclusive_offsets(&[]), vec![0]);
    }

    #[test]
    fn output_ranges_respect_the_bound_and_cover_every_pair() {
        let counts = [3, 0, 4, 10, 1, 1, 0, 2];
        let offsets = exclusive_offsets(&counts);
        let ranges = output_ranges(&offsets, 5);
        assert_eq!(ranges, vec![0..2, 2..3, 3..4, 4..8]);
        let covered: u64 = ranges
            .iter()
            .map(|r| offsets[r.end] - offsets[r.start])
            .sum();
        assert_eq!(covered, 21);
        for r in &ranges {
            let pairs = offsets[r.end] - offsets[r.start];
            assert!(pairs <= 5 || r.len() == 1, "{r:?} holds {pairs}");
        }
    }

    #[test]
    fn output_ranges_drop_empty_ranges() {
        let offsets = exclusive_offsets(&[0, 0, 0]);
        assert!(output_ranges(&offsets, 10).is_empty());
    }

    #[test]
    fn reference_join_handles_duplicates_on_both_sides() {
        let pairs = reference::hash_join(&[1, 1, 2], &[10, 11, 12], &[1, 3, 1], &[0, 1, 2]);
        assert_eq!(pairs, vec![(10, 0), (10, 2), (11, 0), (11, 2)]);
    }
}
