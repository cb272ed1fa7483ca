//! The build side of a GPU hash join: collected once on the host (per
//! partition, or once for all partitions in `CollectLeft` mode), then copied
//! and partitioned once per device that probes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::JoinType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;

use super::host_fallback::HostBuildTable;
use super::probe_filter::{BuildKeySummary, MembershipLimits, ProbeFilterPublisher};
use crate::exec::join::matches::{tracks_build_matches, VisitedRows};
use super::order::ArrivalOrder;
use crate::exec::join::output::ColumnSource;
use crate::exec::collect::{collect_streams_into, WholeInput};
use crate::exec::join::device_gather::{ResidentColumns, SideCarry};
use crate::encode::keys::{JoinKeys, KeyEncoder, KeySpec};
use crate::exec::join::pair_aggregate::PairReduction;
use crate::exec::join::row_source::{ArrivedBatches, RowSource};
use crate::exec::GpuJoinMetrics;
use crate::gpu::launch::PairSide;
use crate::pinned_tables::{first_buffer_address, is_pinned};
use crate::gpu::{
    upload_u64, DeviceReservation, DeviceVec, GpuDevice, GpuError,
    GpuResult, PhaseTimer, ReservationKind,
};
use crate::ops::hash_join::{CarriedValues, DeviceBuildTable, HostKeys, KeyRange};
use crate::ops::radix::RadixPlan;

/// All build rows and their encoded keys, shared by the probing partitions,
/// with what those partitions learn together: which build rows matched,
/// how many partitions are still probing, and (for the null-aware anti
/// join) what the probe side held.
#[derive(Debug)]
pub(crate) struct BuildSide {
    /// Every build row, in the batches it arrived in, last batch first (or
    /// in memory order, see [`Self::collect`]): row ids count across them
    /// as over their concatenation.
    pub(crate) rows: ArrivedBatches,
    /// The arrival position of each row of `rows`.
    pub(crate) arrival: ArrivalOrder,
    /// The key columns evaluated on `rows`, each one contiguous array; none
    /// where `keys` are raw pieces or packed keys coded in place (which
    /// hold no NULL and need no check).
    pub(crate) key_columns: Vec<ArrayRef>,
    pub(crate) encoder: KeyEncoder,
    pub(crate) keys: JoinKeys,
    /// Matched build rows, for join types that emit build rows at the end.
    pub(crate) visited: Option<VisitedRows>,
    probes_running: AtomicUsize,
    /// Null-aware anti join: some probe key was NULL / some probe row came.
    pub(crate) probe_saw_null: AtomicBool,
    pub(crate) probe_saw_rows: AtomicBool,
    plan: RadixPlan,
    /// Probe rows joined per device launch sequence ([`probe_chunk_rows`]).
    pub(crate) probe_chunk_rows: usize,
    /// A chunk of the automatic size also ends once its batches hold this
    /// many bytes ([`probe_chunk_bytes`]).
    pub(crate) probe_chunk_bytes: usize,
    /// The output columns gathered on the device, if any.
    gather: Option<BuildGather>,
    /// Partition sides whose keys fit 32 bits as one word a row
    /// (`gpu.tuning.one_word_join_rows`, see [`Self::key_range`]).
    one_word_rows: bool,
    /// Built on the first chunk the device cannot take.
    host_table: OnceLock<HostBuildTable>,
    /// The table on each device that probes it, by [`GpuDevice::id`].
    device_tables: Mutex<HashMap<u64, Arc<ResidentTable>>>,
    _host_memory: MemoryReservation,
}

/// A build table on one device, with the device memory it holds.
#[derive(Debug)]
pub(crate) struct ResidentTable {
    /// The build rows partitioned by their keys, carrying `carry`'s values
    /// or their row ids.
    pub(crate) table: DeviceBuildTable,
    /// The build's output columns for gathers on the device.
    pub(crate) gather: Option<ResidentBuildColumns>,
    /// The build columns `table` carries in place of row ids, if any.
    pub(crate) carry: Option<SideCarry>,
    /// Where `table` carries values: the same rows partitioned by row id,
    /// made on first need (see [`BuildSide::table_by_row_id`]).
    by_row_id: Mutex<Option<Arc<RowIdTable>>>,
    _device_memory: DeviceReservation,
}

/// A build table whose rows hold their row ids, with its device memory.
#[derive(Debug)]
pub(crate) struct RowIdTable {
    pub(crate) table: DeviceBuildTable,
    _device_memory: DeviceReservation,
}

/// What an inner join without a filter gathers from its build side on the
/// device (see [`crate::exec::join::device_gather`]).
#[derive(Debug, Clone)]
pub(crate) struct BuildGather {
    /// Per build column, whether the output uses it.
    pub(crate) columns: Vec<bool>,
    /// Whether pairs are put in `HashJoinExec`'s order on the device, which
    /// needs the build rows' arrival positions there.
    pub(crate) ordered: bool,
    /// The aggregation the probing chunks fold, where the build table
    /// should carry the values its build-side folds read
    /// (`gpu.tuning.carry_folded_values`).
    pub(crate) folds: Option<FoldedAggregation>,
}

/// An aggregation computed by folding the join's pairs as the device finds
/// them: its reductions, over the join's output columns.
#[derive(Debug, Clone)]
pub(crate) struct FoldedAggregation {
    pub(crate) reductions: Vec<PairReduction>,
    pub(crate) sources: Vec<ColumnSource>,
}

/// The build side's part of gathers on one device.
#[derive(Debug)]
pub(crate) struct ResidentBuildColumns {
    /// The output columns that can be gathered on the device.
    pub(crate) columns: ResidentColumns,
    /// The arrival position of each build row, where pairs are ordered on
    /// the device and the rows did not arrive in one batch.
    pub(crate) positions: Option<DeviceVec<u64>>,
}

/// The collected build rows, with their encoded keys.
struct PreparedBuild {
    arrival: ArrivalOrder,
    rows: ArrivedBatches,
    key_columns: Vec<ArrayRef>,
    encoder: KeyEncoder,
    keys: JoinKeys,
    /// What the probe side's dynamic filter needs of the keys, where asked.
    key_summary: Option<BuildKeySummary>,
}

impl PreparedBuild {
    /// Makes the key columns of `batches` contiguous and encodes them, both
    /// spread over the host's cores (raw keys without NULLs stay in their
    /// batches too): this runs once, before any probe partition can start.
    /// The other columns stay in their batches: output rows are taken from
    /// them by id, and the device gets them piece by piece, since
    /// concatenating them would be most of this step for a large build side
    /// (such as TPC-H q18's). Making only the columns taken on the host
    /// contiguous, on first use, costs more than taking rows from the
    /// batches: arrow concatenates strings value by value, on one thread,
    /// while every probe partition waits. With `filter_limits`, also
    /// summarises the keys for the probe side's dynamic filter.
    fn new(
        batches: Vec<RecordBatch>,
        schema: SchemaRef,
        on: &[PhysicalExprRef],
        spec: &KeySpec,
        in_memory_order: bool,
        filter_limits: Option<MembershipLimits>,
    ) -> Result<Self> {
        let threads = crate::host::copy::host_threads();
        // In reverse arrival order, as `HashJoinExec` concatenates its build
        // side: build row ids then order rows the way it does. With
        // `in_memory_order`, in the order the batches lie in memory.
        let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
        // Each batch with its arrival index, in the order it is held.
        let mut held: Vec<(usize, RecordBatch)> = batches.into_iter().enumerate().collect();
        match in_memory_order {
            true => held.sort_by_cached_key(|(_, batch)| first_buffer_address(batch)),
            false => held.reverse(),
        }
        let order: Vec<usize> = held.iter().map(|&(arrived, _)| arrived).collect();
        let arrival = ArrivalOrder::held_in(&sizes, &order);
        let rows = ArrivedBatches::new(schema, held.into_iter().map(|(_, b)| b).collect());
        let per_key = rows.key_pieces(on)?;
        let key_summary = filter_limits.map(|limits| BuildKeySummary::of(&per_key, limits));
        let by_batch: Vec<Vec<ArrayRef>> = (0..rows.batch_ends().len())
            .map(|batch| per_key.iter().map(|key| Arc::clone(&key[batch])).collect())
            .collect();
        let encoder = KeyEncoder::for_pieces(spec, &by_batch)?;
        let (key_columns, keys) = match encoder.raw_pieces(&per_key) {
            // Raw keys without NULLs: no check against the key columns, and
            // no NULL key for the null-aware anti join to look for.
            Some(raw) => (Vec::new(), JoinKeys::RawPieces(raw)),
            // Packed keys without NULLs: coded where they lie, and no key
            // columns kept (nothing checks them, and none is NULL).
            None if encoder.codes_pieces_in_place(&per_key) => {
                let keys = encoder.encode_pieces_parallel(&per_key, threads)?;
                (Vec::new(), JoinKeys::Encoded(keys))
            }
            None => {
                let key_columns = rows.concat_key_pieces(on, &per_key, threads)?;
                let keys = encoder.encode_parallel(&key_columns, threads)?;
                (key_columns, JoinKeys::Encoded(keys))
            }
        };
        Ok(Self {
            arrival,
            rows,
            key_columns,
            encoder,
            keys,
            key_summary,
        })
    }
}

/// Probe chunks of the automatic size hold at least this many rows (and the
/// build side's row count up to [`AUTO_PROBE_CHUNK_MAX_ROWS`]).
const AUTO_PROBE_CHUNK_MIN_ROWS: usize = 1 << 22;
/// At most this many rows (4 GiB of device scratch to partition them).
const AUTO_PROBE_CHUNK_MAX_ROWS: usize = 1 << 27;
/// And batches of at most about this many bytes held on the host at once.
const AUTO_PROBE_CHUNK_MAX_BYTES: usize = 1 << 31;

/// Probe rows per chunk: `configured` (`gpu.tuning.probe_chunk_rows`), or where it
/// is 0, about as many as `build_rows`. Each chunk's kernels rebuild every
/// partition's shared-memory table from the whole build side, so chunks
/// smaller than the build side spend more on rebuilding than on probing;
/// the bounds keep small joins' chunks large enough to amortise launches
/// and large ones' scratch memory bounded.
pub(crate) fn probe_chunk_rows(configured: usize, build_rows: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    build_rows.clamp(AUTO_PROBE_CHUNK_MIN_ROWS, AUTO_PROBE_CHUNK_MAX_ROWS)
}

/// The bytes of probe batches after which a chunk ends early: none for a
/// `configured` size, [`AUTO_PROBE_CHUNK_MAX_BYTES`] for the automatic one,
/// so that a large build side's chunks of wide probe rows (strings, many
/// columns) do not hold many gigabytes of batches on the host.
pub(crate) fn probe_chunk_bytes(configured: usize) -> usize {
    if configured > 0 {
        usize::MAX
    } else {
        AUTO_PROBE_CHUNK_MAX_BYTES
    }
}

impl BuildSide {
    /// Collects `inputs` (one stream, or the partitions of a merge below
    /// the join, each read in a task of its own), encodes its keys and
    /// plans the partitioning for probe chunks of about `probe_chunk_rows`
    /// rows (0: automatic, see [`probe_chunk_rows`]); `probe_partitions`
    /// partitions will probe it. `one_word_rows` is `gpu.tuning.one_word_join_rows`.
    /// The keys' summary goes to `probe_filter`, where given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn collect(
        inputs: WholeInput,
        schema: SchemaRef,
        on: Vec<PhysicalExprRef>,
        spec: KeySpec,
        join_type: JoinType,
        probe_partitions: usize,
        probe_chunk_rows: usize,
        one_word_rows: bool,
        reservation: MemoryReservation,
        gather: Option<BuildGather>,
        probe_filter: Option<Arc<ProbeFilterPublisher>>,
        metrics: GpuJoinMetrics,
    ) -> Result<Self> {
        // One reservation holds the build side's memory, however it was read.
        let batches = collect_streams_into(inputs, &reservation, None).await?;
        crate::trace::event(|| format!("hash join build: {} batches collected", batches.len()));
        // Batches in pinned regions are held in the order they lie in
        // memory: a partition's batches can arrive interleaved with the
        // other partitions' (read at once through a merge the join does not
        // read through), and held as they arrived no two are adjacent, so
        // each column crosses the bus in one copy per batch (8,192 for a
        // 2^26-row side) instead of one per region.
        // Pairs still leave in `HashJoinExec`'s order (by arrival, see
        // `ArrivalOrder`); build rows emitted at the end would not, so a
        // join that emits them keeps the arrival order.
        let in_memory_order =
            !tracks_build_matches(join_type) && batches.len() > 1 && batches.iter().all(is_pinned);
        let filter_limits = probe_filter.as_ref().map(|filter| filter.limits());
        let prepared = {
            let metrics = metrics.clone();
            SpawnedTask::spawn_blocking(move || -> Result<PreparedBuild> {
                let _timer = metrics.baseline.elapsed_compute().timer();
                let _prepare = metrics.build_prepare_time.timer();
                PreparedBuild::new(batches, schema, &on, &spec, in_memory_order, filter_limits)
            })
            .join()
            .await
            .map_err(|e| DataFusionError::Execution(format!("GPU join build task failed: {e}")))??
        };
        let PreparedBuild {
            arrival,
            rows,
            key_columns,
            encoder,
            keys,
            key_summary,
        } = prepared;
        if let (Some(filter), Some(summary)) = (&probe_filter, key_summary) {
            filter.report(summary);
        }
        metrics.build_rows.add(rows.num_rows());
        // The arrived batches are reserved already; the contiguous key
        // columns and the encoded keys are counted as new (raw pieces are
        // the batches' own buffers). A single batch's key column may share
        // its buffer and is then counted twice, on the safe side.
        let key_bytes: usize = key_columns.iter().map(|c| c.get_array_memory_size()).sum();
        let encoded_bytes = match &keys {
            JoinKeys::Encoded(keys) => {
                8 * (keys.keys.len() + keys.row_ids.as_ref().map_or(0, Vec::len))
            }
            JoinKeys::RawPieces(_) => 0,
        };
        reservation.try_grow(key_bytes + encoded_bytes)?;
        let probe_chunk_bytes = self::probe_chunk_bytes(probe_chunk_rows);
        let probe_chunk_rows = self::probe_chunk_rows(probe_chunk_rows, keys.len());
        let plan = RadixPlan::for_join(keys.len() as u64, probe_chunk_rows as u64);
        let visited = tracks_build_matches(join_type).then(|| VisitedRows::new(rows.num_rows()));
        Ok(Self {
            rows,
            arrival,
            key_columns,
            encoder,
            keys,
            visited,
            probes_running: AtomicUsize::new(probe_partitions.max(1)),
            probe_saw_null: AtomicBool::new(false),
            probe_saw_rows: AtomicBool::new(false),
            plan,
            probe_chunk_rows,
            probe_chunk_bytes,
            gather,
            one_word_rows,
            host_table: OnceLock::new(),
            device_tables: Mutex::new(HashMap::new()),
            _host_memory: reservation,
        })
    }

    /// The build keys for joining on the host (see [`HostBuildTable`]).
    pub(crate) fn host_table(&self) -> &HostBuildTable {
        self.host_table
            .get_or_init(|| HostBuildTable::new(&self.keys.to_normalized()))
    }

    /// Records that one probe partition has finished; true for the last.
    pub(crate) fn probe_finished(&self) -> bool {
        // AcqRel: the last partition sees every other partition's marks.
        self.probes_running.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// What the device may assume of `keys` (the build side's, or a probe
    /// chunk's, encoded by this side's encoder): every key and row id
    /// below 2^32 where the encoding's keys take at most 32 bits, so that
    /// the side is partitioned as one word a row.
    pub(crate) fn key_range(&self, keys: &JoinKeys) -> KeyRange {
        self.key_range_of(keys.row_bound())
    }

    /// [`Self::key_range`] of keys whose rows lie below `row_bound`.
    pub(crate) fn key_range_of(&self, row_bound: u64) -> KeyRange {
        if self.one_word_rows && self.encoder.key_bits() <= 32 && row_bound <= 1 << 32 {
            KeyRange::Below32Bits
        } else {
            KeyRange::Full
        }
    }

    /// The radix plan both sides are partitioned by.
    pub(crate) fn plan(&self) -> &RadixPlan {
        &self.plan
    }

    /// Whether output columns are gathered on the device (the table then
    /// holds them beside the keys).
    pub(crate) fn gathers_on_device(&self) -> bool {
        self.gather.is_some()
    }

    /// Bytes per row of the widest build column gathered on the device
    /// (0 when none).
    pub(crate) fn widest_gathered_column(&self) -> usize {
        self.gather.as_ref().map_or(0, |gather| {
            ResidentColumns::widest(&self.rows, &gather.columns)
        })
    }

    /// Whether another partition is making the table on a device now, so
    /// that [`Self::device_table`] would wait for it. `false` where the
    /// table is ready, or where nobody makes it yet (the caller will: the
    /// sooner it starts, the sooner every partition's wait ends).
    pub(crate) fn device_table_in_progress(&self) -> bool {
        matches!(
            self.device_tables.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// Whether nobody has made the table on `device` or makes it now: the
    /// caller should start it (racy, and harmless when two do: the second
    /// waits for the first's table in [`Self::device_table`]).
    pub(crate) fn device_table_unstarted(&self, device: &GpuDevice) -> bool {
        !self.device_table_ready(device) && !self.device_table_in_progress()
    }

    /// Whether the table is on `device` already (not while another
    /// partition is making it).
    pub(crate) fn device_table_ready(&self, device: &GpuDevice) -> bool {
        self.device_tables
            .try_lock()
            .is_ok_and(|tables| tables.contains_key(&device.id()))
    }

    /// At most the device bytes [`Self::device_table`] reserves: the
    /// partitioning's scratch and the resident table with its columns
    /// (arrival positions counted for every row).
    pub(crate) fn device_table_bytes(&self, device: &GpuDevice) -> usize {
        let ordered = self.gather.as_ref().is_some_and(|gather| gather.ordered);
        let positions = if ordered { self.rows.num_rows() } else { 0 };
        let (resident, scratch) = self.table_bytes(positions, device);
        resident + scratch
    }

    /// The device bytes of the table with `positions` arrival positions
    /// (resident), and of the scratch its partitioning needs briefly.
    fn table_bytes(&self, positions: usize, device: &GpuDevice) -> (usize, usize) {
        let rows = self.keys.len();
        let gather_bytes = self.gather.as_ref().map_or(0, |gather| {
            ResidentColumns::device_bytes(&self.rows, &gather.columns) + 8 * positions
        });
        (
            DeviceBuildTable::resident_bytes(rows, &self.plan) + gather_bytes,
            self.plan.device_bytes(rows, device.sm_count()),
        )
    }

    /// The build table on `device`, copied and partitioned on first use.
    /// Blocking: call from a blocking task.
    pub(crate) fn device_table(
        &self,
        device: &Arc<GpuDevice>,
        memory_fraction: f64,
        metrics: &GpuJoinMetrics,
    ) -> GpuResult<Arc<ResidentTable>> {
        // Held while building, so a second partition on the same device
        // waits for the first one's table instead of building its own.
        let mut tables = self.device_tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(table) = tables.get(&device.id()) {
            return Ok(Arc::clone(table));
        }
        let rows = self.keys.len();
        crate::trace::event(|| format!("hash join build: table of {rows} keys started"));
        let positions = self
            .gather
            .as_ref()
            .filter(|gather| gather.ordered)
            .and_then(|_| self.arrival.positions(self.rows.num_rows() as u64));
        let (resident, scratch) = self.table_bytes(positions.as_ref().map_or(0, Vec::len), device);
        // Partitioning needs its scratch buffers only briefly; the table
        // itself stays resident while the join runs. Both are reserved
        // together: a thread holding one never waits for the other.
        let mut reserved = device.budget().reserve_together(
            &[
                (scratch, ReservationKind::Transient),
                (resident, ReservationKind::Resident),
            ],
            memory_fraction,
        )?;
        let (Some(device_memory), Some(scratch_memory)) = (reserved.pop(), reserved.pop()) else {
            return Err(GpuError::Invalid("the build table's reservations were not made".into()));
        };
        metrics
            .device
            .device_memory_wait
            .add_duration(scratch_memory.waited());
        let stream = device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        // Where the keys may carry some of the output columns, those cross
        // the bus behind the keys and before they are partitioned; otherwise
        // after, so that the partitioning runs while columns from pageable
        // memory are staged through the host.
        let mut columns: Option<ResidentColumns> = None;
        let mut carry: Option<SideCarry> = None;
        let table = self.partition_on_device(
            device,
            stream.stream(),
            |timer| {
                let Some((gather, folds)) = self.carrying_gather() else {
                    return Ok(None);
                };
                let columns = columns.insert(ResidentColumns::upload(
                    device,
                    stream.stream(),
                    &self.rows,
                    &gather.columns,
                    timer,
                )?);
                let carry = carry.insert(match Self::carry_plan(folds, columns) {
                    Some(carry) => carry,
                    None => return Ok(None),
                });
                Ok(carry.values(columns, self.rows.num_rows()))
            },
            &mut timer,
        )?;
        let gather = match &self.gather {
            Some(gather) => Some(ResidentBuildColumns {
                columns: match columns {
                    Some(columns) => columns,
                    None => ResidentColumns::upload(
                        device,
                        stream.stream(),
                        &self.rows,
                        &gather.columns,
                        &mut timer,
                    )?,
                },
                positions: positions
                    .map(|p| upload_u64(device, stream.stream(), &p, &mut timer))
                    .transpose()?,
            }),
            None => None,
        };
        if table.carries_values() {
            metrics.build_rows_carrying_values.add(table.rows());
        }
        if table.one_word() {
            metrics.rows_in_one_word.add(table.rows());
        }
        crate::trace::event(|| "hash join build: keys partitioned on the device".into());
        metrics.device.record(&timer.finish()?);
        drop(scratch_memory);
        let table = Arc::new(ResidentTable {
            carry: carry.filter(|_| table.carries_values()),
            table,
            gather,
            by_row_id: Mutex::new(None),
            _device_memory: device_memory,
        });
        tables.insert(device.id(), Arc::clone(&table));
        crate::trace::event(|| "hash join build: table on the device".into());
        Ok(table)
    }

    /// The build columns the table should carry in place of row ids (seed
    /// 002's GFTR): those its folds read, where the probing chunks fold
    /// the aggregation (exactly coded keys, see `join_chunk`). One 4-byte
    /// column rides beside keys of one-word rows; two, or an 8-byte one,
    /// make such rows two words, which costs the build side's radix passes
    /// less than reading them at random rows costs the fold (as in seed
    /// 002's wide PK-FK join, carrying both 4-byte columns in two words).
    fn carry_plan(folds: &FoldedAggregation, columns: &ResidentColumns) -> Option<SideCarry> {
        SideCarry::plan(PairSide::Build, &folds.reductions, &folds.sources, columns)
    }

    /// The output columns and the aggregation the probing chunks fold,
    /// where the table may carry values ([`Self::carry_plan`]): such chunks
    /// fold, over exactly coded keys.
    fn carrying_gather(&self) -> Option<(&BuildGather, &FoldedAggregation)> {
        let gather = self.gather.as_ref()?;
        let folds = gather.folds.as_ref()?;
        (!self.encoder.needs_verification()).then_some((gather, folds))
    }

    /// Copies the build keys to `device` and partitions them, carrying
    /// the values `carried` gives (see [`DeviceBuildTable::build_carrying`])
    /// or the rows' ids.
    fn partition_on_device<'v>(
        &self,
        device: &GpuDevice,
        stream: &Arc<crate::gpu::DeviceStream>,
        carried: impl FnOnce(&mut PhaseTimer) -> GpuResult<Option<CarriedValues<'v>>>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<DeviceBuildTable> {
        let pieces = self.keys.pieces();
        let keys = HostKeys {
            pieces: &pieces,
            row_ids: self.keys.row_ids(),
            range: self.key_range(&self.keys),
        };
        DeviceBuildTable::build_carrying(device, stream, keys, carried, self.plan.clone(), timer)
    }

    /// A build table on `device` whose rows hold their row ids, for a chunk
    /// whose pairs are written out (its folds could not run, say a probe
    /// column with NULLs): `None` where `resident`'s own table does, else
    /// the same rows partitioned again by row id, made on first need and
    /// kept beside it. Blocking: call from a blocking task.
    pub(crate) fn table_by_row_id(
        &self,
        device: &Arc<GpuDevice>,
        resident: &ResidentTable,
        memory_fraction: f64,
        metrics: &GpuJoinMetrics,
    ) -> GpuResult<Option<Arc<RowIdTable>>> {
        if !resident.table.carries_values() {
            return Ok(None);
        }
        let mut by_row_id = resident.by_row_id.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(table) = by_row_id.as_ref() {
            return Ok(Some(Arc::clone(table)));
        }
        let rows = self.keys.len();
        crate::trace::event(|| format!("hash join build: table of {rows} keys by row id"));
        // The caller holds its chunk's memory, so waiting here for memory
        // could wait for itself: where it does not fit now, the chunk is
        // joined on the host (see `find_pairs`).
        let budget = device.budget();
        let reserve_now = |bytes: usize| {
            budget
                .try_reserve(bytes, 0, memory_fraction)
                .ok_or_else(|| GpuError::OutOfDeviceMemory {
                    requested: bytes,
                    limit: budget.limit_for(memory_fraction),
                    in_use: budget.in_use(),
                })
        };
        let scratch_memory = reserve_now(self.plan.device_bytes(rows, device.sm_count()))?;
        let device_memory = reserve_now(DeviceBuildTable::resident_bytes(rows, &self.plan))?;
        let stream = device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        let table = self.partition_on_device(device, stream.stream(), |_| Ok(None), &mut timer)?;
        metrics.build_rows_by_row_id.add(table.rows());
        metrics.device.record(&timer.finish()?);
        drop(scratch_memory);
        let table = Arc::new(RowIdTable {
            table,
            _device_memory: device_memory,
        });
        *by_row_id = Some(Arc::clone(&table));
        Ok(Some(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::NullEquality;
    use datafusion::physical_expr::expressions::col;

    #[test]
    fn automatic_probe_chunks_follow_the_build_side_within_bounds() {
        // A size set by the user is kept, however small.
        assert_eq!(probe_chunk_rows(777, 1 << 26), 777);
        // Automatic: about the build side, within the bounds.
        assert_eq!(probe_chunk_rows(0, 10), AUTO_PROBE_CHUNK_MIN_ROWS);
        assert_eq!(probe_chunk_rows(0, 50_000_000), 50_000_000);
        assert_eq!(probe_chunk_rows(0, 1 << 30), AUTO_PROBE_CHUNK_MAX_ROWS);
        // Only the automatic size ends a chunk by its bytes.
        assert_eq!(probe_chunk_bytes(777), usize::MAX);
        assert_eq!(probe_chunk_bytes(0), AUTO_PROBE_CHUNK_MAX_BYTES);
    }

    fn prepared(batches: &[Vec<Option<i64>>]) -> PreparedBuild {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let batches = batches
            .iter()
            .map(|keys| {
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int64Array::from(keys.clone()))],
                )
                .unwrap()
            })
            .collect();
        let on = vec![col("k", &schema).unwrap()];
        let spec = KeySpec::try_new(&[DataType::Int64], NullEquality::NullEqualsNothing).unwrap();
        PreparedBuild::new(batches, schema, &on, &spec, false, None).unwrap()
    }

    #[test]
    fn raw_build_keys_stay_in_their_batches_last_batch_first() {
        let build = prepared(&[vec![Some(1), Some(2)], vec![], vec![Some(3)]]);
        assert!(
            build.key_columns.is_empty(),
            "raw pieces need no key columns"
        );
        let JoinKeys::RawPieces(pieces) = &build.keys else {
            panic!(
                "raw keys without NULLs are not concatenated: {:?}",
                build.keys
            );
        };
        // Row ids count over the batches last to first, as HashJoinExec's
        // concatenated build side does.
        assert_eq!(pieces.len(), 2, "the empty batch is dropped");
        assert_eq!(build.keys.pieces().concat(), vec![3, 1, 2]);
        assert_eq!(build.keys.row_ids(), None);
    }

    #[test]
    fn build_batches_held_in_memory_order_keep_their_arrival_positions() {
        // Four slices of one batch, arrived out of their memory order.
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let whole = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from_iter_values(0..8))],
        )
        .unwrap();
        let arrived: Vec<RecordBatch> = [3, 0, 2, 1]
            .iter()
            .map(|&i| whole.slice(2 * i, 2))
            .collect();
        let on = vec![col("k", &schema).unwrap()];
        let spec = KeySpec::try_new(&[DataType::Int64], NullEquality::NullEqualsNothing).unwrap();
        let build = PreparedBuild::new(arrived, schema, &on, &spec, true, None).unwrap();
        // Held as they lie in memory: one run of keys.
        assert_eq!(build.keys.pieces().concat(), (0..8).collect::<Vec<u64>>());
        // Keys 6 and 7 arrived first, 0 and 1 second, then 4, 5, 2, 3.
        let positions: Vec<u64> = (0..8).map(|row| build.arrival.position(row)).collect();
        assert_eq!(positions, vec![2, 3, 6, 7, 4, 5, 0, 1]);
    }

    #[test]
    fn build_keys_with_a_null_are_concatenated_and_encoded() {
        let build = prepared(&[vec![Some(1), None], vec![Some(3)]]);
        assert_eq!(build.key_columns.len(), 1);
        assert_eq!(build.key_columns[0].len(), 3);
        let JoinKeys::Encoded(keys) = &build.keys else {
            panic!("a NULL key makes the keys encoded: {:?}", build.keys);
        };
        // The NULL row (row 2 of [3, 1, NULL]) is dropped.
        assert_eq!(keys.keys.to_vec(), vec![3, 1]);
        assert_eq!(keys.row_ids, Some(vec![0, 1]));
    }
}
