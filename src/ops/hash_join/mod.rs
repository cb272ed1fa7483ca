//! The radix-partitioned hash join on device columns (seed 000 §3.2, seed 002
//! A6): both sides partitioned with the same [`RadixPlan`], matches counted
//! per partition, the output sized exactly from the counts, then written
//! range of partitions by range so the output buffer stays bounded.

use std::sync::Arc;

mod pair_ranges;
mod task_list;

use pair_ranges::{count_pairs, RangeWriter};
use task_list::{
    largest_partition, starts_on_host, JoinTaskList, MAX_TASKS_PER_PARTITION_OR_SLICE,
};

use super::join_tasks::MAX_PIECES;
pub use super::pair_order::{order_by_probe_row, order_device_bytes};
use super::radix::{radix_partition, radix_partition_one_word, JoinSide, RadixPlan};
use crate::gpu::launch::{self, ValueWidth};
use crate::gpu::{
    alloc_uninit, download_u64, upload_u64, upload_words_narrowed, DeviceStream, DeviceVec,
    DriverResultExt, GpuDevice, GpuError, GpuResult, Phase, PhaseTimer,
};

/// What the caller knows of a side's keys and row ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRange {
    /// Keys of any value.
    Full,
    /// Every key, and every row id given, lies below 2^32 (a packed key
    /// encoding of at most 32 bits, on a side of at most 2^32 rows): the
    /// side then travels through the partitioning as one word a row where
    /// what moves with its keys fits beside them ([`radix_partition_one_word`]),
    /// which halves the bytes of every radix pass.
    Below32Bits,
}

/// A side's keys from the host: `pieces` laid end to end, each key's row
/// (`row_ids`, or its place `0..n` when `None`), and their range.
#[derive(Debug, Clone, Copy)]
pub struct HostKeys<'a> {
    pub pieces: &'a [&'a [u64]],
    pub row_ids: Option<&'a [u64]>,
    pub range: KeyRange,
}

impl HostKeys<'_> {
    /// Keys in all.
    fn rows(&self) -> usize {
        self.pieces.iter().map(|piece| piece.len()).sum()
    }
}

/// The build side of a join, partitioned and resident on one device.
#[derive(Debug)]
pub struct DeviceBuildTable {
    plan: RadixPlan,
    build: JoinSide,
    /// Whether the keys carry values in place of row ids (see
    /// [`Self::build_carrying`]).
    carries_values: bool,
    /// The partitions' starts on the host, read back once where a probe
    /// chunk's tasks need them (see [`JoinTaskList`]).
    host_starts: std::sync::OnceLock<Vec<u64>>,
    /// The most rows one partition holds, found on the device once.
    largest_partition: std::sync::OnceLock<u64>,
}

impl DeviceBuildTable {
    #[cfg(any(test, feature = "test-support"))]
    /// Copies the build keys (and row ids, see [`HostKeys`]) to the device
    /// and partitions them by `plan`.
    pub fn build(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        keys: HostKeys<'_>,
        plan: RadixPlan,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        Self::build_carrying(device, stream, keys, |_| Ok(None), plan, timer)
    }

    /// [`Self::build`] carrying the values `carried` gives in place of row
    /// ids (seed 002's GFTR, as [`partition_probe_carrying`] for a probe
    /// chunk), where it gives any: the table can then only be folded
    /// ([`fold_partitioned`]), by build-side folds that find their values
    /// in their [`CarriedSlot`](launch::CarriedSlot) of the word, and its
    /// rows hold no row ids to write pairs with. `carried` is called once,
    /// after the keys' copy is queued: values it copies then cross the bus
    /// behind the keys, while another stream's kernels run, rather than
    /// ahead of them.
    pub fn build_carrying<'v>(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        keys: HostKeys<'_>,
        carried: impl FnOnce(&mut PhaseTimer) -> GpuResult<Option<CarriedValues<'v>>>,
        plan: RadixPlan,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let (build, carries_values) =
            upload_and_partition(device, stream, keys, carried, &plan, timer)?;
        Ok(Self {
            plan,
            build,
            carries_values,
            host_starts: std::sync::OnceLock::new(),
            largest_partition: std::sync::OnceLock::new(),
        })
    }

    /// The build partitions' starts, read back from the device the first
    /// time (a word a partition).
    fn host_starts(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<&[u64]> {
        if let Some(starts) = self.host_starts.get() {
            return Ok(starts);
        }
        let starts = starts_on_host(device, stream, &self.build, timer)?;
        // Another chunk may have read them meanwhile: the same values.
        Ok(self.host_starts.get_or_init(|| starts))
    }

    /// The most rows one build partition holds, found on the device the
    /// first time (one word read back).
    fn largest_partition(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<u64> {
        if let Some(&rows) = self.largest_partition.get() {
            return Ok(rows);
        }
        let rows = largest_partition(device, stream, &self.build, self.plan.partitions(), timer)?;
        Ok(*self.largest_partition.get_or_init(|| rows))
    }

    /// Whether the build rows are one word each (see [`KeyRange`]).
    pub fn one_word(&self) -> bool {
        self.build.one_word()
    }

    /// Whether the keys carry values in place of row ids: such a table is
    /// only folded ([`fold_partitioned`]), its pairs never written.
    pub fn carries_values(&self) -> bool {
        self.carries_values
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

/// Copies keys (and row ids) to the device and partitions them by `plan`,
/// moving with the keys their row ids or the words of the
/// [`CarriedValues`] that `carried` gives (called once, after the keys'
/// copy is queued) at those rows; returns the side and whether it carries
/// values. Every row id must lie below the carried values' `rows`: the
/// packing kernels give a word of 0 to any other, which a fold would then
/// take for a value. Keys below 2^32 go as one-word rows where what moves
/// with them is a row id or one 4-byte value.
fn upload_and_partition<'v>(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: HostKeys<'_>,
    carried: impl FnOnce(&mut PhaseTimer) -> GpuResult<Option<CarriedValues<'v>>>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<(JoinSide, bool)> {
    let rows = keys.rows();
    if let Some(ids) = keys.row_ids {
        if ids.len() != rows {
            return Err(GpuError::Invalid(format!(
                "{} row ids for {rows} keys",
                ids.len(),
            )));
        }
    }
    // Keys (raw integers or packed codes) that fit 32 bits cross the bus
    // at 4 bytes; the transient narrow copy is freed before the
    // partitioning allocates its buffers.
    let device_keys = upload_words_narrowed(device, stream, keys.pieces, timer)?;
    let carried = carried(timer)?;
    partition_device_keys(
        device,
        stream,
        device_keys,
        keys.row_ids,
        keys.range,
        carried.as_ref(),
        plan,
        timer,
    )
}

/// The part of [`upload_and_partition`] after the keys' copy: `device_keys`
/// (one per row) partitioned by `plan`, with their `row_ids` (or their
/// places) or `carried`'s values.
#[allow(clippy::too_many_arguments)]
fn partition_device_keys(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    mut device_keys: DeviceVec<u64>,
    row_ids: Option<&[u64]>,
    range: KeyRange,
    carried: Option<&CarriedValues<'_>>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<(JoinSide, bool)> {
    let rows = device_keys.len();
    if let Some(carried) = carried {
        // Each key's row (its row id, or its place) must have a value.
        if row_ids.is_none() && rows > carried.rows {
            return Err(GpuError::Invalid(format!(
                "{rows} keys carrying the values of {} rows",
                carried.rows
            )));
        }
    }
    let one_word = range == KeyRange::Below32Bits
        && rows as u64 <= 1 << 32
        && carried.is_none_or(|c| c.low.1 == ValueWidth::Four && c.high.is_none());
    // Dropped (stream-ordered) once the words are packed, before the
    // partitioning allocates its buffers.
    let uploaded_ids = match (one_word || carried.is_some(), row_ids) {
        (true, Some(ids)) => Some(upload_words_narrowed(device, stream, &[ids], timer)?),
        _ => None,
    };
    if one_word {
        let values = carried.map(|c| (c.low.0, c.rows));
        timer.time(Phase::Kernel, || {
            launch::pack_key_words(
                &device.launcher(stream),
                &mut device_keys,
                uploaded_ids.as_ref(),
                values)
        })?;
        drop(uploaded_ids);
        let side = timer.time(Phase::Kernel, || {
            radix_partition_one_word(device, stream, device_keys, plan)
        })?;
        return Ok((side.into(), carried.is_some()));
    }
    let device_ids = match (row_ids, carried) {
        (_, Some(carried)) => {
            // pack_carried_words writes every element.
            let mut words =
                alloc_uninit::<u64>(stream, rows, "allocating carried words")?;
            timer.time(Phase::Kernel, || {
                launch::pack_carried_words(
                    &device.launcher(stream),
                    &mut words,
                    uploaded_ids.as_ref(),
                    carried.rows,
                    carried.low,
                    carried.high)
            })?;
            drop(uploaded_ids);
            words
        }
        (Some(ids), None) => upload_words_narrowed(device, stream, &[ids], timer)?,
        (None, None) => {
            // iota writes every element.
            let mut ids = alloc_uninit::<u64>(stream, rows, "allocating row ids")?;
            timer.time(Phase::Kernel, || {
                launch::iota(&device.launcher(stream), &mut ids, 0)
            })?;
            ids
        }
    };
    let side = timer.time(Phase::Kernel, || {
        radix_partition(device, stream, device_keys, device_ids, plan)
    })?;
    Ok((side.into(), carried.is_some()))
}

/// Device bytes one probe chunk of `rows` rows needs beside the build table,
/// with at most `max_pairs` output pairs on the device at a time.
pub fn probe_device_bytes(rows: usize, plan: &RadixPlan, max_pairs: usize, sm_count: u32) -> usize {
    // Match counts and offsets per join task, and the task list where a
    // heavy partition is split (see [`JoinTaskList`]): at most
    // `MAX_TASKS_PER_PARTITION_OR_SLICE` tasks per partition and per
    // `PROBE_TASK_ROWS` rows; and the pieces of one task too large for an
    // output range, split [`MAX_PIECES`] at a time, a few levels deep.
    let tasks = MAX_TASKS_PER_PARTITION_OR_SLICE
        * (plan.partitions() + rows.div_ceil(PROBE_TASK_ROWS as usize));
    let pieces = 4 * MAX_PIECES;
    plan.device_bytes(rows, sm_count) + 8 * 6 * (tasks + pieces + 1) + 16 * max_pairs
}

/// One range of a probe chunk's matching pairs, on the device.
#[derive(Debug)]
pub struct DeviceJoinPairs<'a> {
    /// The build row of each pair (at least `len` elements: the range's
    /// pairs are the first `len`).
    pub build_ids: &'a DeviceVec<u64>,
    /// The probe row of each pair (as `build_ids`).
    pub probe_ids: &'a DeviceVec<u64>,
    /// Pairs in the range.
    pub len: usize,
    /// Pairs the device wrote for the range: `len`, or more where a pair
    /// limit cut it short.
    pub written: usize,
    /// Whether this range holds every pair of the chunk.
    pub whole_chunk: bool,
}

impl DeviceJoinPairs<'_> {
    /// The pairs on the host: (build row ids, probe row ids).
    pub fn download(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<(Vec<u64>, Vec<u64>)> {
        let mut build_ids = Vec::with_capacity(self.len);
        let mut probe_ids = Vec::with_capacity(self.len);
        download_u64(
            device,
            stream,
            &self.build_ids.slice(0..self.len),
            &mut build_ids,
            timer,
        )?;
        download_u64(
            device,
            stream,
            &self.probe_ids.slice(0..self.len),
            &mut probe_ids,
            timer,
        )?;
        Ok((build_ids, probe_ids))
    }
}

#[cfg(any(test, feature = "test-support"))]
/// Joins one chunk of probe keys (`keys`: pieces copied to the device one
/// after the other) against `table`. For each range of
/// partitions whose output fits `max_pairs` (or a single larger partition),
/// calls `emit` with the matching pairs on the device. Returns the number
/// of pairs. [`partition_probe`] then [`probe_partitioned`].
#[allow(clippy::too_many_arguments)]
pub fn probe(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    table: &DeviceBuildTable,
    keys: HostKeys<'_>,
    max_pairs: usize,
    timer: &mut PhaseTimer,
    emit: impl FnMut(DeviceJoinPairs<'_>, &mut PhaseTimer) -> GpuResult<()>,
) -> GpuResult<u64> {
    if table.rows() == 0 {
        return Ok(0);
    }
    match partition_probe(device, stream, keys, table.plan(), timer)? {
        Some(probe) => {
            probe_partitioned(device, stream, table, &probe, max_pairs, None, timer, emit)
        }
        None => Ok(0),
    }
}

/// A probe chunk's keys on the device, partitioned by the build side's
/// plan: made before the build table exists, so that the chunk's copy and
/// partitioning overlap with the build side's.
#[derive(Debug)]
pub struct PartitionedProbe {
    plan: RadixPlan,
    keys: JoinSide,
    /// Whether the keys carry values in place of row ids (see
    /// [`partition_probe_carrying`]).
    carries_values: bool,
}

impl PartitionedProbe {
    #[cfg(any(test, feature = "test-support"))]
    /// Whether the keys carry values in place of row ids: such a chunk is
    /// only folded ([`fold_partitioned`]), its pairs never written.
    pub fn carries_values(&self) -> bool {
        self.carries_values
    }

    /// Whether the rows are one word each (see [`KeyRange`]).
    pub fn one_word(&self) -> bool {
        self.keys.one_word()
    }
}

/// The values a side carries through its partitioning in place of
/// row ids (seed 002's GFTR), so that the folds of [`fold_partitioned`]
/// read them where the keys are, not at random rows: one 8-byte column
/// (`low`, [`CarriedSlot::Whole`](launch::CarriedSlot)), or one or two
/// 4-byte columns (`low` and `high`, in each word's low and high half).
/// Each column holds the side's `rows` values, indexed by row id. A side
/// of one-word rows (see [`KeyRange`]) carries a lone 4-byte `low` column
/// in its key words' high halves, the row's word: a fold finds it in the
/// same [`CarriedSlot::Low`](launch::CarriedSlot) slot.
#[derive(Debug, Clone, Copy)]
pub struct CarriedValues<'a> {
    pub low: (&'a DeviceVec<u64>, ValueWidth),
    pub high: Option<&'a DeviceVec<u64>>,
    pub rows: usize,
}

/// Copies a chunk of probe keys to the device and partitions them by
/// `plan`, the build side's (see [`probe`]); `None` without keys.
pub fn partition_probe(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: HostKeys<'_>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<PartitionedProbe>> {
    partition_probe_moving(device, stream, keys, None, plan, timer)
}

/// [`partition_probe`] of keys already on the device: the first `rows`
/// words of `keys` (a probe chunk's 8-byte key column, handed on by the GPU
/// node below), copied on the device and partitioned with their places as
/// row ids; `keys` is left as it was.
pub fn partition_probe_on_device(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: &DeviceVec<u64>,
    rows: usize,
    range: KeyRange,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<PartitionedProbe>> {
    if rows == 0 {
        return Ok(None);
    }
    if keys.len() < rows {
        return Err(GpuError::Invalid(format!(
            "{rows} probe keys asked of {} on the device",
            keys.len()
        )));
    }
    let copied = timer.time(Phase::Kernel, || {
        stream
            .clone_dtod(&keys.slice(..rows))
            .during("copying probe keys on the device")
    })?;
    let (keys, carries_values) =
        partition_device_keys(device, stream, copied, None, range, None, plan, timer)?;
    Ok(Some(PartitionedProbe {
        plan: plan.clone(),
        keys,
        carries_values,
    }))
}

/// [`partition_probe`] carrying `carried`'s values in place of row ids:
/// the chunk can then only be folded, by folds that find each probe-side
/// value in its [`CarriedSlot`](launch::CarriedSlot) of the word. The
/// caller keeps which column went to which slot.
pub fn partition_probe_carrying(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: HostKeys<'_>,
    carried: &CarriedValues<'_>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<PartitionedProbe>> {
    partition_probe_moving(device, stream, keys, Some(carried), plan, timer)
}

/// [`partition_probe`] moving row ids, or `carried`'s values where given.
fn partition_probe_moving(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    keys: HostKeys<'_>,
    carried: Option<&CarriedValues<'_>>,
    plan: &RadixPlan,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<PartitionedProbe>> {
    if keys.rows() == 0 {
        return Ok(None);
    }
    let (keys, carries_values) =
        upload_and_partition(device, stream, keys, |_| Ok(carried.copied()), plan, timer)?;
    Ok(Some(PartitionedProbe {
        plan: plan.clone(),
        keys,
        carries_values,
    }))
}

/// The part of [`probe`] after [`partition_probe`]; `probe` must have been
/// partitioned by `table`'s plan. Every range handed to `emit` holds at
/// most `max_pairs` pairs: a join task with more is split until its pieces
/// fit (see [`super::join_tasks::split_task`]). With `pair_limit`, ranges
/// stop once that many pairs were handed on, the last one cut short (for a
/// join whose every pair is an output row, under a fetch: the rest would
/// not be read).
/// Returns the chunk's pairs, as counted.
#[allow(clippy::too_many_arguments)]
pub fn probe_partitioned(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    table: &DeviceBuildTable,
    probe: &PartitionedProbe,
    max_pairs: usize,
    pair_limit: Option<u64>,
    timer: &mut PhaseTimer,
    mut emit: impl FnMut(DeviceJoinPairs<'_>, &mut PhaseTimer) -> GpuResult<()>,
) -> GpuResult<u64> {
    if table.rows() == 0 {
        return Ok(0);
    }
    if probe.plan != table.plan {
        return Err(GpuError::Invalid(
            "probe keys partitioned by another plan than the build table's".into(),
        ));
    }
    if probe.carries_values || table.carries_values {
        return Err(GpuError::Invalid(format!(
            "pairs written from {} keys that carry values, not row ids",
            if probe.carries_values {
                "probe"
            } else {
                "build"
            }
        )));
    }
    let probe = &probe.keys;
    let mut task_list = JoinTaskList::new(device, stream, table, probe, timer)?;
    let max_pairs = max_pairs.max(1) as u64;
    let offsets = count_pairs(
        device,
        stream,
        table,
        probe,
        task_list.tasks(),
        task_list.count,
        max_pairs,
        timer,
    )?;
    let total = offsets.total;
    if total == 0 {
        return Ok(0);
    }
    let mut writer = RangeWriter {
        device,
        stream,
        table,
        probe,
        max_pairs,
        left: pair_limit.unwrap_or(u64::MAX),
        emit: &mut emit,
    };
    writer.write(&mut task_list, &offsets, true, timer)?;
    Ok(total)
}

/// What [`fold_partitioned`] computed over a probe chunk's pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoldedPairs {
    /// The matching pairs.
    pub pairs: u64,
    /// Each fold's word (its identity when there is no pair).
    pub words: Vec<u64>,
}

/// Folds the pairs of `probe` (partitioned by `table`'s plan) against
/// `table` by `folds` (at most [`launch::MAX_JOIN_FOLDS`]) as the device
/// finds them, without writing them out: an aggregation without `GROUP BY`
/// over an inner join. Each fold reads its column at the row id its side's
/// partitioning carried, or, where a side's keys carry values
/// ([`partition_probe_carrying`], [`DeviceBuildTable::build_carrying`]),
/// finds its value in its slot of that side's word: then every fold of
/// that side must, and only they may. One launch over every task, whatever the pair count, so no
/// output buffer and no count beforehand.
pub fn fold_partitioned(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    table: &DeviceBuildTable,
    probe: &PartitionedProbe,
    folds: &[launch::JoinFold<'_>],
    timer: &mut PhaseTimer,
) -> GpuResult<FoldedPairs> {
    let identities: Vec<u64> = folds.iter().map(|fold| fold.op.identity()).collect();
    if table.rows() == 0 {
        return Ok(FoldedPairs {
            pairs: 0,
            words: identities,
        });
    }
    if probe.plan != table.plan {
        return Err(GpuError::Invalid(
            "probe keys partitioned by another plan than the build table's".into(),
        ));
    }
    for fold in folds {
        let carried = fold.carried.is_some();
        let side_carries = match fold.side {
            launch::PairSide::Build => table.carries_values,
            launch::PairSide::Probe => probe.carries_values,
        };
        if carried != side_carries {
            return Err(GpuError::Invalid(format!(
                "a {:?}-side fold {} a carried value where its side carries {}",
                fold.side,
                if carried { "reads" } else { "does not read" },
                if side_carries { "values" } else { "row ids" },
            )));
        }
    }
    let plan = table.plan();
    let probe = &probe.keys;
    let task_list = JoinTaskList::new(device, stream, table, probe, timer)?;
    let specs = upload_u64(device, stream, &launch::JoinFold::specs(folds), timer)?;
    let initial: Vec<u64> = std::iter::once(0).chain(identities).collect();
    let mut out = upload_u64(device, stream, &initial, timer)?;
    timer.time(Phase::Kernel, || {
        launch::hash_join_fold(
            &device.launcher(stream),
            table.build.side(),
            probe.side(),
            task_list.tasks(),
            plan.partition_bits(),
            0..task_list.count as u64,
            folds,
            &specs,
            &mut out)
    })?;
    let mut words = Vec::with_capacity(initial.len());
    download_u64(device, stream, &out.as_view(), &mut words, timer)?;
    let pairs = words.remove(0);
    Ok(FoldedPairs { pairs, words })
}

/// Probe rows one join task takes at most: a probe partition holding more
/// is split into slices of this many rows, each joined by a block of its
/// own that loads the same build partition. A skewed probe side (Zipf 1.5)
/// puts about a third of its rows in one partition, and one block joining
/// all of them would take most of the join's kernel time while the others
/// idle.
pub const PROBE_TASK_ROWS: u64 = 1 << 15;

/// Bits that hold every value below `n` (at least 1).
pub fn bits_below(n: u64) -> u32 {
    (u64::BITS - n.saturating_sub(1).leading_zeros()).max(1)
}

/// CPU references.
#[cfg(any(test, feature = "test-support"))]
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
    fn bits_below_cover_every_value() {
        assert_eq!(bits_below(0), 1);
        assert_eq!(bits_below(1), 1);
        assert_eq!(bits_below(2), 1);
        assert_eq!(bits_below(3), 2);
        assert_eq!(bits_below(4), 2);
        assert_eq!(bits_below(5), 3);
        assert_eq!(bits_below(1 << 40), 40);
        assert_eq!(bits_below(u64::MAX), 64);
    }

    #[test]
    fn reference_join_handles_duplicates_on_both_sides() {
        let pairs = reference::hash_join(&[1, 1, 2], &[10, 11, 12], &[1, 3, 1], &[0, 1, 2]);
        assert_eq!(pairs, vec![(10, 0), (10, 2), (11, 0), (11, 2)]);
    }
}
