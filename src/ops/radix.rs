//! Stable radix partitioning of (key, row id) pairs on the low bits of
//! `mix64(key)` (seed 000 §3.2; seed 002 A6/A10), in passes of at most
//! [`MAX_RADIX_BITS`] bits, least significant digit first. Keys below 2^32
//! may instead travel as one-word rows, the row id (or a carried value) in
//! each word's high half ([`launch::pack_key_words`]): every pass then
//! moves 8 bytes a row in place of 16.

use std::sync::Arc;

use crate::gpu::alloc_zeroed;
use crate::gpu::alloc_uninit;
use crate::gpu::DeviceStream;

use super::scan::exclusive_scan;
use crate::gpu::launch::{self, RadixDigits, RadixGrid, JOIN_TABLE_CAPACITY, MAX_RADIX_BITS};
use crate::gpu::{DeviceVec, GpuDevice, GpuError, GpuResult};

/// Largest partition count: 2^18 partitions of [`JOIN_TABLE_CAPACITY`] build
/// rows each covers 2^29 build rows without chunking.
pub const MAX_PARTITION_BITS: u32 = 18;
/// Probe rows per partition that keep every multiprocessor busy.
const PROBE_ROWS_PER_PARTITION: u64 = 1 << 14;

/// How many hash bits select a partition, and how they split into passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadixPlan {
    partition_bits: u32,
    pass_bits: Vec<u32>,
}

impl RadixPlan {
    /// A plan over `partition_bits` bits, split evenly into the fewest passes
    /// of at most [`MAX_RADIX_BITS`] bits.
    pub fn new(partition_bits: u32) -> Self {
        let partition_bits = partition_bits.min(MAX_PARTITION_BITS);
        let passes = partition_bits.div_ceil(MAX_RADIX_BITS);
        let pass_bits = (0..passes)
            .map(|i| partition_bits / passes + u32::from(i < partition_bits % passes))
            .collect();
        Self {
            partition_bits,
            pass_bits,
        }
    }

    /// The plan for a join: enough partitions that an average build partition
    /// fits one shared-memory table, and that the probe side is spread over
    /// enough partitions to fill the device. (Fewer passes of more bits are
    /// slower: see `TABLE_CAPACITY` in `ptx/hash_join.cu`.)
    pub fn for_join(build_rows: u64, probe_rows_hint: u64) -> Self {
        let bits_for = |rows: u64, per_partition: u64| -> u32 {
            let partitions = rows.div_ceil(per_partition).max(1);
            64 - (partitions - 1).leading_zeros()
        };
        let build_bits = bits_for(build_rows, JOIN_TABLE_CAPACITY as u64 / 2);
        let probe_bits = bits_for(probe_rows_hint, PROBE_ROWS_PER_PARTITION);
        Self::new(build_bits.max(probe_bits))
    }

    /// Hash bits that select a partition.
    pub fn partition_bits(&self) -> u32 {
        self.partition_bits
    }

    /// Number of partitions.
    pub fn partitions(&self) -> usize {
        1 << self.partition_bits
    }

    /// Bits of each pass, least significant first.
    pub fn pass_bits(&self) -> &[u32] {
        &self.pass_bits
    }

    /// Device bytes needed to partition `rows` rows, inputs included.
    pub fn device_bytes(&self, rows: usize, sm_count: u32) -> usize {
        let grid = RadixGrid::new(rows as u64, sm_count);
        let histogram = (grid.blocks as usize) << MAX_RADIX_BITS;
        8 * (4 * rows + histogram + histogram.div_ceil(1024) * 2 + self.partitions() + 1)
    }
}

/// Keys radix partitioned on the device, with their row ids: `Ids` is
/// their array ([`radix_partition`]), none for one-word rows
/// ([`radix_partition_one_word`]), or either ([`JoinSide`]).
#[derive(Debug)]
pub struct PartitionedColumn<Ids = DeviceVec<u64>> {
    /// Keys ordered by partition id, stable within a partition (one-word
    /// rows: each word's low half is the key, its high half the row's id
    /// or the value carried in its place).
    pub keys: DeviceVec<u64>,
    /// Row ids moved with the keys (or, for a side partitioned carrying
    /// values, `ops::hash_join::partition_probe_carrying` or
    /// `DeviceBuildTable::build_carrying`, the values in their place).
    pub row_ids: Ids,
    /// `starts[p]` is the first row of partition p; `starts[partitions]` = rows.
    pub starts: DeviceVec<u64>,
}

/// One side of a hash join: (key, row id) pairs, or one-word rows (`None`).
pub type JoinSide = PartitionedColumn<Option<DeviceVec<u64>>>;

impl<Ids> PartitionedColumn<Ids> {
    /// Rows.
    pub fn rows(&self) -> usize {
        self.keys.len()
    }
}

impl From<PartitionedColumn> for JoinSide {
    fn from(pairs: PartitionedColumn) -> Self {
        Self {
            keys: pairs.keys,
            row_ids: Some(pairs.row_ids),
            starts: pairs.starts,
        }
    }
}

impl From<PartitionedColumn<()>> for JoinSide {
    fn from(rows: PartitionedColumn<()>) -> Self {
        Self {
            keys: rows.keys,
            row_ids: None,
            starts: rows.starts,
        }
    }
}

impl JoinSide {
    /// The kernels' view of this side.
    pub fn side(&self) -> launch::PartitionedSide<'_> {
        launch::PartitionedSide {
            keys: &self.keys,
            row_ids: self.row_ids.as_ref(),
            starts: &self.starts,
        }
    }

    /// Whether the rows are one word each (no row-id array).
    pub fn one_word(&self) -> bool {
        self.row_ids.is_none()
    }
}

/// Partitions `keys` with their `row_ids` (same length) by `plan`.
pub fn radix_partition(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    mut keys: DeviceVec<u64>,
    mut row_ids: DeviceVec<u64>,
    plan: &RadixPlan,
) -> GpuResult<PartitionedColumn> {
    let starts = partition_in_place(device, stream, &mut keys, Some(&mut row_ids), plan)?;
    Ok(PartitionedColumn {
        keys,
        row_ids,
        starts,
    })
}

/// Partitions one-word rows (each key, below 2^32, in its word's low half;
/// see [`launch::pack_key_words`]) by `plan`, by the keys alone.
pub fn radix_partition_one_word(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    mut words: DeviceVec<u64>,
    plan: &RadixPlan,
) -> GpuResult<PartitionedColumn<()>> {
    let starts = partition_in_place(device, stream, &mut words, None, plan)?;
    Ok(PartitionedColumn {
        keys: words,
        row_ids: (),
        starts,
    })
}

/// The passes of [`radix_partition`] (or, without row ids,
/// [`radix_partition_one_word`]); returns the partition starts.
fn partition_in_place(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &mut DeviceVec<u64>,
    row_ids: Option<&mut DeviceVec<u64>>,
    plan: &RadixPlan,
) -> GpuResult<DeviceVec<u64>> {
    let rows = keys.len();
    let mut starts = alloc_zeroed::<u64>(stream, plan.partitions() + 1, "allocating partition starts")?;
    if rows == 0 {
        return Ok(starts);
    }
    let digits = match row_ids {
        Some(_) => RadixDigits::Hashed,
        None => RadixDigits::HashedLowHalf,
    };
    radix_passes_in_place(device, stream, keys, row_ids, digits, plan.pass_bits())?;
    launch::partition_bounds(
        &device.launcher(stream),
        keys,
        digits,
        plan.partition_bits(),
        &mut starts)?;
    Ok(starts)
}

/// Stable LSD radix passes over (key, row id) pairs: pass `i` orders them by
/// `pass_bits[i]` bits of the digits' source (`mix64(key)` or the key),
/// least significant first, keeping the order of equal digits.
pub fn stable_radix_passes(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    mut keys: DeviceVec<u64>,
    mut row_ids: DeviceVec<u64>,
    digits: RadixDigits,
    pass_bits: &[u32],
) -> GpuResult<(DeviceVec<u64>, DeviceVec<u64>)> {
    radix_passes_in_place(
        device,
        stream,
        &mut keys,
        Some(&mut row_ids),
        digits,
        pass_bits,
    )?;
    Ok((keys, row_ids))
}

/// The passes of [`stable_radix_passes`] over `keys` and `row_ids` in
/// place, or over one-word rows without row ids ([`RadixDigits::HashedLowHalf`]
/// and only it).
fn radix_passes_in_place(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &mut DeviceVec<u64>,
    mut row_ids: Option<&mut DeviceVec<u64>>,
    digits: RadixDigits,
    pass_bits: &[u32],
) -> GpuResult<()> {
    let rows = keys.len();
    if row_ids.is_some() == digits.one_word() {
        return Err(GpuError::Invalid(format!(
            "radix passes over {digits:?} digits {} row ids",
            if row_ids.is_some() { "with" } else { "without" }
        )));
    }
    if rows == 0 || pass_bits.is_empty() {
        return Ok(());
    }
    let grid = RadixGrid::new(rows as u64, device.sm_count());
    // Both: every element is written by the first scatter.
    let mut keys_out = alloc_uninit::<u64>(stream, rows, "allocating radix buffers")?;
    let mut ids_out = match row_ids {
        Some(_) => Some(alloc_uninit::<u64>(stream, rows, "allocating radix buffers")?),
        None => None,
    };
    let mut shift = 0;
    for &bits in pass_bits {
        let histogram_len = (grid.blocks as usize) << bits;
        let mut offsets = alloc_zeroed::<u64>(stream, histogram_len, "allocating a radix histogram")?;
        launch::radix_histogram(
            &device.launcher(stream),
            digits,
            keys,
            shift,
            bits,
            grid,
            &mut offsets)?;
        exclusive_scan(device, stream, &mut offsets, histogram_len)?;
        let ids = row_ids.as_deref().zip(ids_out.as_mut());
        launch::radix_scatter(
            &device.launcher(stream),
            digits,
            keys,
            ids,
            shift,
            bits,
            grid,
            &offsets,
            &mut keys_out)?;
        std::mem::swap(keys, &mut keys_out);
        if let (Some(ids), Some(out)) = (row_ids.as_deref_mut(), ids_out.as_mut()) {
            std::mem::swap(ids, out);
        }
        shift += bits;
    }
    Ok(())
}

/// CPU references.
#[cfg(any(test, feature = "test-support"))]
pub mod reference {
    use super::RadixPlan;
    use crate::ops::mix64;

    /// What [`super::radix_partition`] must produce: pairs stably ordered by
    /// partition id, and the partition starts.
    pub fn radix_partition(
        keys: &[u64],
        row_ids: &[u64],
        plan: &RadixPlan,
    ) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let mask = (1u64 << plan.partition_bits()) - 1;
        let partition = |k: u64| (mix64(k) & mask) as usize;
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| partition(keys[i])); // stable
        let mut starts = vec![0u64; plan.partitions() + 1];
        for &k in keys {
            starts[partition(k) + 1] += 1;
        }
        for p in 0..plan.partitions() {
            starts[p + 1] += starts[p];
        }
        (
            order.iter().map(|&i| keys[i]).collect(),
            order.iter().map(|&i| row_ids[i]).collect(),
            starts,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_split_bits_evenly() {
        assert_eq!(RadixPlan::new(0).pass_bits(), &[] as &[u32]);
        assert_eq!(RadixPlan::new(5).pass_bits(), &[5]);
        assert_eq!(RadixPlan::new(8).pass_bits(), &[8]);
        assert_eq!(RadixPlan::new(9).pass_bits(), &[5, 4]);
        assert_eq!(RadixPlan::new(14).pass_bits(), &[7, 7]);
        assert_eq!(RadixPlan::new(17).pass_bits(), &[6, 6, 5]);
        assert_eq!(RadixPlan::new(40).partition_bits(), MAX_PARTITION_BITS);
    }

    #[test]
    fn join_plans_fit_build_partitions_in_shared_memory() {
        assert_eq!(RadixPlan::for_join(1, 1).partition_bits(), 0);
        assert_eq!(RadixPlan::for_join(1024, 1).partition_bits(), 0);
        assert_eq!(RadixPlan::for_join(1025, 1).partition_bits(), 1);
        assert_eq!(RadixPlan::for_join(1 << 24, 1).partition_bits(), 14);
        // A tiny build side with a large probe side still gets partitions.
        assert_eq!(RadixPlan::for_join(10, 1 << 24).partition_bits(), 10);
    }

    #[test]
    fn reference_partition_is_stable_and_bounded() {
        let keys: Vec<u64> = (0..1000).map(|i| i % 37).collect();
        let ids: Vec<u64> = (0..1000).collect();
        let plan = RadixPlan::new(4);
        let (pk, pi, starts) = reference::radix_partition(&keys, &ids, &plan);
        assert_eq!(starts[0], 0);
        assert_eq!(*starts.last().unwrap(), 1000);
        for p in 0..16 {
            let range = starts[p] as usize..starts[p + 1] as usize;
            assert!(pk[range.clone()]
                .iter()
                .all(|&k| (crate::ops::mix64(k) & 15) as usize == p));
            assert!(
                pi[range].windows(2).all(|w| w[0] < w[1]),
                "stable within a partition"
            );
        }
    }
}
