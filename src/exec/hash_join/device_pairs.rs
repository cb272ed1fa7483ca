//! A probe chunk's pairs found on the device: the keys partitioned, the
//! build side's table probed, the pairs written or folded into partial
//! aggregates while probing, within the device's limits.

use super::*;
use crate::exec::hash_join::build_side::ResidentBuildColumns;
use crate::ops::hash_join::{partition_probe_on_device, DeviceJoinPairs};
use crate::exec::join::device_gather::{can_gather_all, gather_device_rows};
use crate::exec::join::device_rows::DeviceRows;
use crate::gpu::DeviceReservation;

/// What a chunk hands on: matching pairs (build row ids, probe row ids),
/// the output batches of `len` rows gathered on the device, or the words
/// of the partial aggregation over `len` pairs reduced on the device.
pub(super) enum ChunkOutput {
    Pairs(Vec<u64>, Vec<u64>),
    Batches(Vec<RecordBatch>, usize),
    Reduced(Vec<u64>, usize),
    /// Output rows kept on the device for the GPU join above.
    Device(DeviceRows),
}

/// A probe chunk's keys: coded on the host, or the raw keys of rows whose
/// columns are on the device already: the words of their column `column`
/// (among the chunk's columns on the device), one per row.
#[derive(Clone, Copy)]
pub(super) enum ChunkKeys<'a> {
    Host(&'a JoinKeys),
    Device { column: usize, rows: usize },
}

impl ChunkKeys<'_> {
    /// Keys in all.
    fn len(&self) -> usize {
        match self {
            Self::Host(keys) => keys.len(),
            Self::Device { rows, .. } => *rows,
        }
    }
}

/// Output gathered on the device for one chunk (see
/// [`crate::exec::join::device_gather`]).
pub(super) struct ChunkGather<'a> {
    pub(super) chunk: &'a dyn RowSource,
    /// The chunk's columns are on the device already (rows handed on by
    /// the GPU join below): none is copied up, and none counts again
    /// against the chunk's device memory.
    pub(super) chunk_on_device: bool,
    /// Keep the output on the device for the GPU join above, where every
    /// output column is there (see [`gather_device_rows`]).
    pub(super) device_output: Option<&'a SchemaRef>,
    /// Per probe column, whether the output uses it.
    pub(super) probe_columns: &'a [bool],
    pub(super) output: &'a OutputAssembler,
    /// Emit in `HashJoinExec`'s order: ordered on the device when the
    /// chunk's pairs fit one output range, else handed on as pairs.
    pub(super) ordered: bool,
    /// The partial aggregation's reductions, computed from the pairs in
    /// place of output rows where their columns are on the device.
    pub(super) reductions: Option<&'a [PairReduction]>,
    /// Compute them as the device probes, where it can (see
    /// [`crate::ops::hash_join::fold_partitioned`]).
    pub(super) fold_while_probing: bool,
    /// And partition the probe keys with the values they fold (see
    /// [`SideCarry`]).
    pub(super) carry_folded_values: bool,
}

/// Limits on one chunk's device work, and its partition (for tracing).
#[derive(Clone, Copy)]
pub(super) struct DeviceLimits {
    pub(super) max_pairs: usize,
    pub(super) memory_fraction: f64,
    pub(super) max_concurrent_tasks: usize,
    /// Threads for the host's part (see [`ProbeSpec::host_threads`]).
    pub(super) host_threads: usize,
    pub(super) partition: usize,
    /// What a device error does.
    pub(super) device_errors: DeviceErrorPolicy,
    /// Pairs after which the chunk's output stops: the fetch, where every
    /// pair is an output row and any of them will do (see
    /// [`ChunkContext::pair_limit`]).
    pub(super) pair_limit: Option<u64>,
}

/// Finds the candidate pairs of one probe chunk and hands them to
/// `on_pairs` in bounded batches: on the device, or on the host when the
/// device lacks the memory or fails, and nothing was handed on yet
/// (unless the session makes device errors fail). Blocking.
pub(super) fn find_pairs(
    device: &Arc<GpuDevice>,
    build: &BuildSide,
    probe_keys: &JoinKeys,
    limits: DeviceLimits,
    gather: Option<ChunkGather<'_>>,
    metrics: &GpuJoinMetrics,
    on_output: &mut dyn FnMut(ChunkOutput) -> Result<()>,
) -> Result<()> {
    let DeviceLimits {
        max_pairs,
        max_concurrent_tasks,
        ..
    } = limits;
    let mut handed_on = false;
    let mut host_error = None;
    // A chunk waits for one of `max_concurrent_tasks` slots before its
    // device work starts and gives the slot up when its first pairs reach
    // the host: the host work on them (key checks, filters, gathering output
    // columns) then runs on every core while other chunks use the device.
    // The chunk's further device work (more output ranges of a large join)
    // runs without a slot, so a chunk holding device memory never waits for
    // one while a slot holder waits for that memory.
    let waiting = std::time::Instant::now();
    let admission = RefCell::new(Some(device.admit(max_concurrent_tasks)));
    let partition = limits.partition;
    trace::event(|| format!("hash join p{partition}: admitted to the device"));
    metrics
        .device
        .device_admission_wait
        .add_duration(waiting.elapsed());
    let injected = limits
        .device_errors
        .inject
        .then(|| GpuError::Invalid("a device error injected by the test options".into()));
    let on_device = match injected {
        Some(error) => Err(error),
        None => pairs_on_device(
            device,
            build,
            ChunkKeys::Host(probe_keys),
            &limits,
            gather.as_ref(),
            metrics,
            &mut None,
            &mut |output| {
                handed_on = true;
                admission.borrow_mut().take();
                // A host-side failure stops further host work; the device
                // finishes its ranges and the error is returned after.
                if host_error.is_none() {
                    if let Err(e) = output.and_then(&mut *on_output) {
                        host_error = Some(e);
                    }
                }
            },
        ),
    };
    admission.borrow_mut().take();
    if let Some(e) = host_error {
        return Err(e);
    }
    match on_device {
        Ok(()) => Ok(()),
        Err(e) if !handed_on && (e.is_out_of_device_memory() || !limits.device_errors.fail) => {
            if !e.is_out_of_device_memory() {
                trace::event(|| format!("hash join p{partition}: device error, on the host: {e}"));
                metrics.device_error_fallback_chunks.add(1);
            }
            metrics.cpu_fallback_chunks.add(1);
            build.host_table().probe(
                &probe_keys.to_normalized(),
                max_pairs,
                &mut |build_ids, probe_ids| on_output(ChunkOutput::Pairs(build_ids, probe_ids)),
            )
        }
        Err(e) => Err(e.into()),
    }
}

/// The device part of [`find_pairs`]; `probe_columns` holds the chunk's
/// columns on the device, where they are there already, and those copied
/// up after.
#[allow(clippy::too_many_arguments)]
pub(super) fn pairs_on_device(
    device: &Arc<GpuDevice>,
    build: &BuildSide,
    probe_keys: ChunkKeys<'_>,
    limits: &DeviceLimits,
    gather: Option<&ChunkGather<'_>>,
    metrics: &GpuJoinMetrics,
    probe_columns: &mut Option<ResidentColumns>,
    on_output: &mut dyn FnMut(Result<ChunkOutput>),
) -> GpuResult<()> {
    device.bind_to_thread()?;
    let stream = device.stream()?;
    let work = ChunkOnDevice {
        device,
        stream: stream.stream(),
        build,
        probe_keys,
        limits,
        gather: gather.filter(|_| build.gathers_on_device()),
        metrics,
    };
    let mut timer = PhaseTimer::new(Arc::clone(work.stream));
    let ready = work.ready_table(probe_columns, &mut timer)?;
    let mut partitioned = match ready.partitioned {
        Some(partitioned) => partitioned,
        None => work.partition_keys(probe_columns, true, &mut timer)?,
    };
    if partitioned.is_some()
        && !work.fold(&ready.resident, &partitioned, probe_columns, &mut timer, on_output)?
    {
        work.write_pairs(&ready.resident, &mut partitioned, probe_columns, &mut timer, on_output)?;
    }
    metrics.device.record(&timer.finish()?);
    Ok(())
}

/// What every step of one chunk's device work reads.
struct ChunkOnDevice<'a, 'g> {
    device: &'a Arc<GpuDevice>,
    stream: &'a Arc<DeviceStream>,
    build: &'a BuildSide,
    probe_keys: ChunkKeys<'a>,
    limits: &'a DeviceLimits,
    /// Output gathered on the device, where the build side allows it.
    gather: Option<&'a ChunkGather<'g>>,
    metrics: &'a GpuJoinMetrics,
}

/// The build table on the device, the chunk's device memory reserved, and
/// its keys, where they were partitioned while the table was made.
struct ReadyTable {
    resident: Arc<ResidentTable>,
    /// Held until the chunk's device work is done.
    _memory: DeviceReservation,
    /// `Some` where the keys were partitioned early (`Some(None)`: the
    /// chunk has no rows).
    partitioned: Option<Option<KeysOnDevice>>,
}

impl ChunkOnDevice<'_, '_> {
    /// The device memory the chunk's work takes at most: its keys'
    /// partitioning and pairs, and where output is gathered on the device,
    /// its columns, the pairs' order and one buffer of the widest column's
    /// values per pair.
    fn device_bytes(&self) -> usize {
        let max_pairs = self.limits.max_pairs;
        let gather_bytes = self.gather.map_or(0, |gather| {
            let order = if gather.ordered {
                order_device_bytes(max_pairs)
            } else {
                0
            };
            let widest = ResidentColumns::widest(gather.chunk, gather.probe_columns)
                .max(self.build.widest_gathered_column());
            // Columns on the device already hold their memory; their keys
            // are copied to be partitioned.
            let columns = match gather.chunk_on_device {
                true => 8 * self.probe_keys.len(),
                false => ResidentColumns::device_bytes(gather.chunk, gather.probe_columns),
            };
            columns + order + widest * max_pairs
        });
        probe_device_bytes(
            self.probe_keys.len(),
            self.build.plan(),
            max_pairs,
            self.device.sm_count(),
        ) + gather_bytes
    }

    /// The chunk's keys partitioned (see [`partition_chunk_keys`]). Where
    /// the chunk's aggregation is folded as the device probes, its keys
    /// carry the probe columns the folds read in place of row ids (see
    /// `SideCarry`), with `carry_values`: the chunk's columns go to the
    /// device first. Only where they all cross straight from pinned
    /// memory: staged through the host, they would hold back the keys'
    /// partitioning, which otherwise runs while they are staged, and the
    /// chunk would wait on the host, not on the device, so that carrying
    /// them would cost more than it saves.
    fn partition_keys(
        &self,
        probe_columns: &mut Option<ResidentColumns>,
        carry_values: bool,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<KeysOnDevice>> {
        let carrying = self.gather.filter(|gather| {
            carry_values
                && gather.fold_while_probing
                && gather.carry_folded_values
                && gather.reductions.is_some()
        });
        partition_chunk_keys(
            self.device,
            self.stream,
            self.build,
            self.probe_keys,
            carrying,
            probe_columns,
            timer,
        )
    }

    /// Waits for the build table and reserves the chunk's device memory.
    /// While the build side goes to the device (made by another partition,
    /// or, where nobody makes it yet, by a thread of this one), this
    /// chunk's keys (and an aggregation's columns) cross the bus beside it
    /// and are partitioned, where the memory they take leaves room for the
    /// table.
    fn ready_table(
        &self,
        probe_columns: &mut Option<ResidentColumns>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<ReadyTable> {
        let (device, build, metrics) = (self.device, self.build, self.metrics);
        let DeviceLimits {
            memory_fraction,
            partition,
            ..
        } = *self.limits;
        let bytes = self.device_bytes();
        let mut partitioned = None;
        let (resident, early) = std::thread::scope(|scope| {
            let table_maker = build.device_table_unstarted(device).then(|| {
                scope.spawn(|| {
                    device.bind_to_thread()?;
                    build.device_table(device, memory_fraction, metrics)
                })
            });
            let early = (table_maker.is_some() || build.device_table_in_progress())
                .then(|| {
                    device.budget().try_reserve(
                        bytes,
                        build.device_table_bytes(device),
                        memory_fraction,
                    )
                })
                .flatten();
            if early.is_some() {
                partitioned = Some(self.partition_keys(probe_columns, true, timer)?);
                let gather = self.gather.filter(|gather| gather.reductions.is_some());
                if let Some(gather) = gather.filter(|_| probe_columns.is_none()) {
                    *probe_columns = Some(ResidentColumns::upload(
                        device,
                        self.stream,
                        gather.chunk,
                        gather.probe_columns,
                        timer,
                    )?);
                }
                trace::event(|| {
                    format!("hash join p{partition}: keys partitioned before the table")
                });
            }
            let resident = match table_maker {
                Some(maker) => maker.join().map_err(|_| {
                    GpuError::Invalid("the thread making the build table panicked".into())
                })??,
                None => build.device_table(device, memory_fraction, metrics)?,
            };
            GpuResult::Ok((resident, early))
        })?;
        trace::event(|| format!("hash join p{partition}: build table ready"));
        let memory = match early {
            Some(memory) => memory,
            None => {
                let memory =
                    device
                        .budget()
                        .reserve(bytes, memory_fraction, ReservationKind::Transient)?;
                metrics
                    .device
                    .device_memory_wait
                    .add_duration(memory.waited());
                memory
            }
        };
        Ok(ReadyTable {
            resident,
            _memory: memory,
            partitioned,
        })
    }

    /// Folds the chunk's aggregation as the device probes, where it can
    /// (see [`fold_while_probing`]); whether it did.
    fn fold(
        &self,
        resident: &ResidentTable,
        partitioned: &Option<KeysOnDevice>,
        probe_columns: &mut Option<ResidentColumns>,
        timer: &mut PhaseTimer,
        on_output: &mut dyn FnMut(Result<ChunkOutput>),
    ) -> GpuResult<bool> {
        let gather = self.gather.zip(resident.gather.as_ref());
        let (Some(partitioned), Some((gather, build_columns))) = (
            partitioned.as_ref(),
            gather.filter(|(gather, _)| gather.fold_while_probing),
        ) else {
            return Ok(false);
        };
        let Some(folded) = fold_while_probing(
            self.device,
            self.stream,
            (resident, partitioned),
            gather,
            (&self.build.rows, &build_columns.columns),
            probe_columns,
            timer,
        )?
        else {
            return Ok(false);
        };
        let (metrics, partition) = (self.metrics, self.limits.partition);
        trace::event(|| format!("hash join p{partition}: {} pairs folded", folded.pairs));
        if partitioned.carry.is_some() {
            metrics.probe_rows_carrying_values.add(self.probe_keys.len());
        }
        if partitioned.keys.one_word() {
            metrics.rows_in_one_word.add(self.probe_keys.len());
        }
        if folded.pairs > 0 {
            // A fold over no pair holds its identity, not a value.
            metrics.pairs_folded_while_probing.add(folded.pairs);
            on_output(Ok(ChunkOutput::Reduced(folded.words, folded.pairs)));
        }
        Ok(true)
    }

    /// The chunk's pairs written out range by range, by row ids of both
    /// sides (the folds could not run: a column not on the device, say
    /// one with NULLs). Keys that carry values are partitioned again, with
    /// row ids.
    fn write_pairs(
        &self,
        resident: &ResidentTable,
        partitioned: &mut Option<KeysOnDevice>,
        probe_columns: &mut Option<ResidentColumns>,
        timer: &mut PhaseTimer,
        on_output: &mut dyn FnMut(Result<ChunkOutput>),
    ) -> GpuResult<()> {
        let (device, stream, build) = (self.device, self.stream, self.build);
        let (metrics, partition) = (self.metrics, self.limits.partition);
        let memory_fraction = self.limits.memory_fraction;
        let by_row_id = build.table_by_row_id(device, resident, memory_fraction, metrics)?;
        if by_row_id.is_some() {
            trace::event(|| format!("hash join p{partition}: build table by row id"));
        }
        let table = by_row_id
            .as_ref()
            .map_or(&resident.table, |by_row_id| &by_row_id.table);
        if partitioned.as_ref().is_some_and(|keys| keys.carry.is_some()) {
            trace::event(|| format!("hash join p{partition}: keys partitioned again, by row id"));
            // Freed before the keys are partitioned again.
            *partitioned = None;
            *partitioned = self.partition_keys(probe_columns, false, timer)?;
        }
        let Some(partitioned) = partitioned.as_ref().map(|keys| &keys.keys) else {
            return Ok(());
        };
        if partitioned.one_word() {
            metrics.rows_in_one_word.add(self.probe_keys.len());
        }
        let gather = self.gather.zip(resident.gather.as_ref());
        // The chunk's own columns go to the device once its pairs are
        // counted, and only where that pays (see `probe_side_pays`).
        probe_partitioned(
            device,
            stream,
            table,
            partitioned,
            self.limits.max_pairs,
            self.limits.pair_limit,
            timer,
            |pairs, timer| {
                let len = pairs.len;
                trace::event(|| format!("hash join p{partition}: {len} pairs found"));
                metrics.output_ranges.add(1);
                metrics.pairs_written.add(pairs.written);
                emit_range(
                    device,
                    stream,
                    build,
                    gather,
                    probe_columns,
                    pairs,
                    self.limits,
                    timer,
                    on_output,
                )
            },
        )?;
        Ok(())
    }
}

/// A chunk's keys partitioned on the device: carrying the probe columns
/// the folds read in place of row ids where `carrying` asks for it and the
/// columns lie in pinned memory (copied to the device first, into
/// `probe_columns`), else with row ids; `None` for a chunk without rows.
fn partition_chunk_keys(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    build: &BuildSide,
    probe_keys: ChunkKeys<'_>,
    carrying: Option<&ChunkGather<'_>>,
    probe_columns: &mut Option<ResidentColumns>,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<KeysOnDevice>> {
    let probe_keys = match probe_keys {
        ChunkKeys::Host(keys) => keys,
        ChunkKeys::Device { column, rows } => {
            let words = probe_columns
                .as_ref()
                .and_then(|columns| columns.words_of(column))
                .ok_or_else(|| GpuError::Invalid("probe keys not on the device".into()))?;
            let range = build.key_range_of(rows as u64);
            let partitioned =
                partition_probe_on_device(device, stream, words, rows, range, build.plan(), timer)?;
            return Ok(partitioned.map(|keys| KeysOnDevice { keys, carry: None }));
        }
    };
    let pieces = probe_keys.pieces();
    let host_keys = HostKeys {
        pieces: &pieces,
        row_ids: probe_keys.row_ids(),
        range: build.key_range(probe_keys),
    };
    let carrying = carrying.and_then(|gather| {
        let bytes = ColumnBytes::of(gather.chunk, gather.probe_columns);
        bytes.in_pinned_memory().then_some((gather, bytes))
    });
    if let Some((gather, bytes)) = carrying {
        let columns = match probe_columns {
            Some(columns) => columns,
            None => probe_columns.insert(ResidentColumns::upload_bytes(
                device, stream, &bytes, timer,
            )?),
        };
        let reductions = gather.reductions.unwrap_or_default();
        let carry = SideCarry::plan(
            PairSide::Probe,
            reductions,
            gather.output.sources(),
            columns,
        );
        let values = carry
            .as_ref()
            .and_then(|carry| carry.values(columns, gather.chunk.num_rows()));
        if let (Some(carry), Some(values)) = (carry, values) {
            let partitioned = partition_probe_carrying(
                device,
                stream,
                host_keys,
                &values,
                build.plan(),
                timer,
            )?;
            return Ok(partitioned.map(|keys| KeysOnDevice {
                keys,
                carry: Some(carry),
            }));
        }
    }
    let partitioned = partition_probe(device, stream, host_keys, build.plan(), timer)?;
    Ok(partitioned.map(|keys| KeysOnDevice { keys, carry: None }))
}

/// Hands on one range of a chunk's pairs: as pairs where nothing is
/// gathered on the device (or the range cannot be put in order there),
/// else with the chunk's columns copied to the device where that pays, the
/// pairs' columns gathered there, or an aggregation's reductions over them.
#[allow(clippy::too_many_arguments)]
fn emit_range(
    device: &Arc<GpuDevice>,
    stream: &Arc<DeviceStream>,
    build: &BuildSide,
    gather: Option<(&ChunkGather<'_>, &ResidentBuildColumns)>,
    probe_columns: &mut Option<ResidentColumns>,
    pairs: DeviceJoinPairs<'_>,
    limits: &DeviceLimits,
    timer: &mut PhaseTimer,
    on_output: &mut dyn FnMut(Result<ChunkOutput>),
) -> GpuResult<()> {
    let DeviceLimits {
        host_threads,
        partition,
        ..
    } = *limits;
    let on_device = gather.filter(|(gather, _)| !gather.ordered || pairs.whole_chunk);
    let Some((gather, build_columns)) = on_device else {
        let (build_ids, probe_ids) = pairs.download(device, stream, timer)?;
        on_output(Ok(ChunkOutput::Pairs(build_ids, probe_ids)));
        return Ok(());
    };
    let probe_columns = match &mut *probe_columns {
        Some(columns) => columns,
        // An aggregation's columns always pay: without them the
        // range's rows are made and aggregated on the host.
        None => probe_columns.insert(
            // Rows kept on the device for the join above need every
            // column there.
            if gather.reductions.is_some()
                || keeps_rows_on_device(gather, build_columns)
                || probe_side_pays(pairs.len, pairs.whole_chunk, gather.chunk.num_rows())
            {
                ResidentColumns::upload(
                    device,
                    stream,
                    gather.chunk,
                    gather.probe_columns,
                    timer,
                )?
            } else {
                ResidentColumns::none()
            },
        ),
    };
    let ordered = match gather.ordered {
        true => Some(order_by_probe_row(
            device,
            stream,
            &pairs,
            build_columns.positions.as_ref(),
            (build.rows.num_rows() as u64, gather.chunk.num_rows() as u64),
            timer,
        )?),
        false => None,
    };
    let (build_ids, probe_ids) = match &ordered {
        Some((build_ids, probe_ids)) => (build_ids, probe_ids),
        None => (pairs.build_ids, pairs.probe_ids),
    };
    let build_side = GatherSide {
        batch: &build.rows,
        resident: &build_columns.columns,
        ids: build_ids,
    };
    let probe_side = GatherSide {
        batch: gather.chunk,
        resident: probe_columns,
        ids: probe_ids,
    };
    if let Some(reductions) = gather.reductions {
        let reduced = reduce_pairs(
            device,
            stream,
            reductions,
            gather.output.sources(),
            &build_side,
            &probe_side,
            pairs.len,
            timer,
        )?;
        if let Some(words) = reduced {
            trace::event(|| format!("hash join p{partition}: pairs reduced"));
            on_output(Ok(ChunkOutput::Reduced(words, pairs.len)));
            return Ok(());
        }
    }
    if let Some(schema) = gather.device_output {
        let kept = gather_device_rows(
            device,
            stream,
            gather.output,
            schema,
            &build_side,
            &probe_side,
            pairs.len,
            limits.memory_fraction,
            timer,
        )?;
        if let Some(rows) = kept {
            trace::event(|| format!("hash join p{partition}: output kept on the device"));
            on_output(Ok(ChunkOutput::Device(rows)));
            return Ok(());
        }
    }
    let gathered = gather_batches(
        device,
        stream,
        gather.output,
        &build_side,
        &probe_side,
        pairs.len,
        host_threads,
        timer,
    )?;
    on_output(gathered.map(|batches| ChunkOutput::Batches(batches, pairs.len)));
    Ok(())
}

/// Whether a range's output can stay on the device for the join above:
/// asked for, and every output column on the device on its side once the
/// chunk's columns are copied up (see [`can_gather_all`]).
fn keeps_rows_on_device(gather: &ChunkGather<'_>, build_columns: &ResidentBuildColumns) -> bool {
    gather.device_output.is_some()
        && can_gather_all(gather.output, &build_columns.columns, gather.chunk)
}

/// A probe chunk's keys partitioned on the device, and the probe columns
/// they carry in place of row ids, if any.
pub(super) struct KeysOnDevice {
    pub(super) keys: PartitionedProbe,
    pub(super) carry: Option<SideCarry>,
}

/// A chunk's aggregation folded over its pairs as the device finds them
/// (see [`fold_partitioned`]): each reduction's word and the pairs, or
/// `None` where its columns are not all on the device, there are more
/// than one launch folds, or a probe fold's column was not carried beside
/// the keys (the pairs are then written out and reduced). Uploads the
/// chunk's columns into `probe_columns` when not there yet.
pub(super) fn fold_while_probing(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    (resident, partitioned): (&ResidentTable, &KeysOnDevice),
    gather: &ChunkGather<'_>,
    build: (&dyn RowSource, &ResidentColumns),
    probe_columns: &mut Option<ResidentColumns>,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<FoldedChunk>> {
    let Some(reductions) = gather.reductions else {
        return Ok(None);
    };
    let probe_columns = match probe_columns {
        Some(columns) => columns,
        // An aggregation's columns always go to the device.
        None => probe_columns.insert(ResidentColumns::upload(
            device,
            stream,
            gather.chunk,
            gather.probe_columns,
            timer,
        )?),
    };
    let carries: Vec<&SideCarry> = [resident.carry.as_ref(), partitioned.carry.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let Some(folds) = join_folds(
        reductions,
        gather.output.sources(),
        build,
        (gather.chunk, probe_columns),
        &carries,
    ) else {
        return Ok(None);
    };
    let device_folds: Vec<_> = folds.iter().flatten().copied().collect();
    let folded = fold_partitioned(
        device,
        stream,
        &resident.table,
        &partitioned.keys,
        &device_folds,
        timer,
    )?;
    Ok(Some(FoldedChunk {
        words: folded_words(&folds, &folded),
        pairs: folded.pairs as usize,
    }))
}

/// What [`fold_while_probing`] computed: a word per reduction over `pairs`
/// pairs.
pub(super) struct FoldedChunk {
    pub(super) words: Vec<u64>,
    pub(super) pairs: usize,
}
