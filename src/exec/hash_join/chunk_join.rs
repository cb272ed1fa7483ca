//! One probe chunk joined: its keys coded on the runtime's thread, then,
//! in a blocking task, its pairs found on the device, checked and turned
//! into output rows (or folded into the partial aggregation).

use super::*;
use crate::exec::check_device_ids;
use datafusion::arrow::array::ArrayRef;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::joins::utils::JoinKeyComparator;

/// Joins one probe chunk: its keys coded here, the device part off the
/// async runtime.
pub(super) async fn join_chunk(
    cx: ChunkContext,
    build: Arc<BuildSide>,
    chunk: ProbeChunk,
) -> Result<Vec<JoinedRows>> {
    let chunk = match chunk {
        ProbeChunk::Host(chunk) => chunk,
        ProbeChunk::Device(rows) => return join_device_chunk(cx, build, rows).await,
    };
    let Some((probe_key_columns, probe_keys)) = code_probe_keys(&cx, &build, &chunk)? else {
        return Ok(vec![]);
    };
    let task = SpawnedTask::spawn_blocking(move || -> Result<Vec<JoinedRows>> {
        let _timer = cx.metrics.baseline.elapsed_compute().timer();
        let batches = join_coded_chunk(&cx, &build, &chunk, &probe_keys, &probe_key_columns)?;
        // The chunk's batches and keys are dropped while the join goes on
        // (see `release`).
        release_in_background((chunk, probe_keys, probe_key_columns));
        Ok(batches)
    });
    task.join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU join task failed: {e}")))?
}

/// Joins probe rows the GPU join below handed on on the device: probed
/// where they lie where the device can read their key in place (see
/// [`probe_rows_on_device`]), else copied down and joined as a host chunk.
async fn join_device_chunk(
    cx: ChunkContext,
    build: Arc<BuildSide>,
    rows: DeviceRows,
) -> Result<Vec<JoinedRows>> {
    let task = SpawnedTask::spawn_blocking(move || -> Result<Vec<JoinedRows>> {
        let batch = {
            let _timer = cx.metrics.baseline.elapsed_compute().timer();
            match probe_rows_on_device(&cx, &build, rows)? {
                DeviceProbe::Joined(output) => return Ok(output),
                DeviceProbe::OnTheHost(batch) => batch,
            }
        };
        cx.metrics.probe_rows_copied_down.add(batch.num_rows());
        let chunk = ArrivedBatches::new(batch.schema(), vec![batch]);
        let Some((probe_key_columns, probe_keys)) = code_probe_keys(&cx, &build, &chunk)? else {
            return Ok(vec![]);
        };
        let _timer = cx.metrics.baseline.elapsed_compute().timer();
        join_coded_chunk(&cx, &build, &chunk, &probe_keys, &probe_key_columns)
    });
    task.join()
        .await
        .map_err(|e| DataFusionError::Execution(format!("GPU join task failed: {e}")))?
}

/// What [`probe_rows_on_device`] did with rows on the device.
enum DeviceProbe {
    /// Joined where they lay: the output.
    Joined(Vec<JoinedRows>),
    /// Not joined: the rows copied down, to join as a host chunk.
    OnTheHost(RecordBatch),
}

/// The probe key column whose words the device reads as this join's keys
/// in place: a single key that is a plain column, coded raw (an 8-byte
/// integer key without NULLs), of the type the build side's keys have.
fn raw_key_column(cx: &ChunkContext, build: &BuildSide, shape: &RowsShape) -> Option<usize> {
    let [key] = cx.probe_on.as_slice() else {
        return None;
    };
    let column = key.downcast_ref::<Column>()?.index();
    let data_type = shape.schema.fields().get(column)?.data_type();
    build.encoder.reads_in_place(data_type).then_some(column)
}

/// Probes with rows on the device without copying them down: their key
/// column's words are the keys (copied on the device to be partitioned),
/// their columns are gathered from where they lie. Only where every pair
/// is an output row gathered on the device (an inner join without a
/// filter, on exactly coded keys, in no particular order) and no
/// aggregation reads the pairs; otherwise, on another device, or where the
/// device fails or lacks memory before any output is handed on, the rows
/// come back copied down. Blocking.
fn probe_rows_on_device(
    cx: &ChunkContext,
    build: &BuildSide,
    rows: DeviceRows,
) -> Result<DeviceProbe> {
    let DeviceRows {
        device,
        columns,
        shape,
        memory,
    } = rows;
    let key_column = raw_key_column(cx, build, &shape);
    let probe_columns_wanted = cx.gather_probe_columns.as_deref();
    let semantics = &cx.semantics;
    let in_place = device.id() == cx.device.id()
        && probe_columns_wanted.is_some()
        && build.gathers_on_device()
        && !build.encoder.needs_verification()
        && !semantics.preserve_order
        && !semantics.null_aware
        && cx.aggregate.is_none()
        && cx.partial.is_none();
    let key_column = key_column.filter(|&c| in_place && columns.words_of(c).is_some());
    let (Some(key_column), Some(probe_columns_wanted)) = (key_column, probe_columns_wanted) else {
        return copied_down(cx, &device, &columns, &shape).map(DeviceProbe::OnTheHost);
    };
    if build.keys.is_empty() || shape.rows == 0 {
        // An inner join with no build row, or no probe row, has no output.
        return Ok(DeviceProbe::Joined(Vec::new()));
    }
    let gather = ChunkGather {
        chunk: &shape,
        chunk_on_device: true,
        device_output: cx.device_output.as_ref(),
        probe_columns: probe_columns_wanted,
        output: &cx.output,
        ordered: false,
        reductions: None,
        fold_while_probing: cx.options.tuning.fold_while_probing,
        carry_folded_values: cx.options.tuning.carry_folded_values,
    };
    let limits = cx.device_limits(build);
    let mut probe_columns = Some(columns);
    let mut output = Vec::new();
    let mut handed_on = false;
    let mut host_error = None;
    let device_wall = cx.metrics.device_wall_time.timer();
    let on_device = {
        let _admission = cx.device.admit(limits.max_concurrent_tasks);
        match limits.device_errors.inject {
            true => Err(GpuError::Invalid("a device error injected by the test options".into())),
            false => pairs_on_device(
                &cx.device,
                build,
                ChunkKeys::Device {
                    column: key_column,
                    rows: shape.rows,
                },
                &limits,
                Some(&gather),
                &cx.metrics,
                &mut probe_columns,
                &mut |part| {
                    handed_on = true;
                    let taken = part.and_then(|part| match part {
                        ChunkOutput::Batches(batches, len) => {
                            cx.metrics.rows_gathered_on_device.add(len);
                            output.extend(batches.into_iter().map(JoinedRows::Host));
                            Ok(())
                        }
                        ChunkOutput::Device(rows) => {
                            output.push(JoinedRows::Device(rows));
                            Ok(())
                        }
                        ChunkOutput::Pairs(..) | ChunkOutput::Reduced(..) => {
                            Err(DataFusionError::Internal(
                                "pairs of probe rows on the device reached the host".into(),
                            ))
                        }
                    });
                    if let Err(e) = taken {
                        host_error.get_or_insert(e);
                    }
                },
            ),
        }
    };
    device_wall.done();
    if let Some(e) = host_error {
        return Err(e);
    }
    match on_device {
        Ok(()) => {
            cx.metrics.probe_chunks.add(1);
            cx.metrics.probe_rows_from_device.add(shape.rows);
            drop(memory);
            Ok(DeviceProbe::Joined(output))
        }
        Err(e) if !handed_on && (e.is_out_of_device_memory() || !limits.device_errors.fail) => {
            let partition = cx.partition;
            trace::event(|| format!("hash join p{partition}: rows on the device copied down: {e}"));
            if !e.is_out_of_device_memory() {
                cx.metrics.device_error_fallback_chunks.add(1);
            }
            cx.metrics.cpu_fallback_chunks.add(1);
            let Some(columns) = probe_columns else {
                return Err(DataFusionError::Internal("rows on the device were lost".into()));
            };
            copied_down(cx, &device, &columns, &shape).map(DeviceProbe::OnTheHost)
        }
        Err(e) => Err(e.into()),
    }
}

/// `columns` (rows of `shape` on `device`) copied down into one batch, the
/// bytes counted in the join's transfer metrics.
fn copied_down(
    cx: &ChunkContext,
    device: &Arc<GpuDevice>,
    columns: &ResidentColumns,
    shape: &RowsShape,
) -> Result<RecordBatch> {
    device.bind_to_thread()?;
    let stream = device.stream()?;
    let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
    let batch = columns.download_batch(device, stream.stream(), shape, cx.host_threads, &mut timer)??;
    cx.metrics.device.record(&timer.finish()?);
    Ok(batch)
}

/// The chunk's keys coded for the device, with the key columns where the
/// codes are checked against them on the host. `None` where a null-aware
/// anti join has seen a NULL probe key: nothing will be emitted, and the
/// rest of the probe side is read only to finish the input.
fn code_probe_keys(
    cx: &ChunkContext,
    build: &BuildSide,
    chunk: &ArrivedBatches,
) -> Result<Option<(Vec<ArrayRef>, JoinKeys)>> {
    let _timer = cx.metrics.baseline.elapsed_compute().timer();
    let _encode = cx.metrics.encode_time.timer();
    let pieces = chunk.key_pieces(&cx.probe_on)?;
    if cx.semantics.null_aware {
        build.probe_saw_rows.store(true, Ordering::Release);
        if pieces[0].iter().any(|piece| piece.null_count() > 0) {
            build.probe_saw_null.store(true, Ordering::Release);
        }
        if build.probe_saw_null.load(Ordering::Acquire) {
            return Ok(None);
        }
    }
    Ok(Some(match build.encoder.raw_pieces(&pieces) {
        // Raw keys need no check against the key columns.
        Some(raw) => (Vec::new(), JoinKeys::RawPieces(raw)),
        // Nor do packed keys without NULLs, coded where they lie.
        None if build.encoder.codes_pieces_in_place(&pieces) => {
            let keys = build.encoder.encode_pieces_parallel(&pieces, cx.host_threads)?;
            (Vec::new(), JoinKeys::Encoded(keys))
        }
        None => {
            let threads = cx.host_threads;
            let columns = chunk.concat_key_pieces(&cx.probe_on, &pieces, threads)?;
            let keys = build.encoder.encode_parallel(&columns, threads)?;
            (columns, JoinKeys::Encoded(keys))
        }
    }))
}

/// The chunk's output: its pairs found on the device (rows of either side
/// that no key can match never reach it), then the rows the join type
/// emits alone. Blocking.
fn join_coded_chunk(
    cx: &ChunkContext,
    build: &BuildSide,
    chunk: &ArrivedBatches,
    probe_keys: &JoinKeys,
    probe_key_columns: &[ArrayRef],
) -> Result<Vec<JoinedRows>> {
    let keys_equal = if build.encoder.needs_verification() {
        Some(key_comparator(
            &build.key_columns,
            probe_key_columns,
            build.encoder.null_equality(),
        )?)
    } else {
        None
    };
    let mut results = ChunkResults::new(cx, build, chunk, keys_equal.as_ref());
    if !probe_keys.is_empty() && !build.keys.is_empty() {
        // Hashed keys need a check of the key columns on the host, so only
        // exactly coded keys let the device make the output.
        let gather = cx
            .gather_probe_columns
            .as_deref()
            .filter(|_| !build.encoder.needs_verification())
            .map(|probe_columns| ChunkGather {
                chunk,
                chunk_on_device: false,
                device_output: cx
                    .device_output
                    .as_ref()
                    .filter(|_| !cx.semantics.preserve_order && cx.aggregate.is_none()),
                probe_columns,
                output: &cx.output,
                ordered: cx.semantics.preserve_order,
                reductions: cx.aggregate.as_ref().map(|a| a.reductions()),
                fold_while_probing: cx.options.tuning.fold_while_probing,
                carry_folded_values: cx.options.tuning.carry_folded_values,
            });
        let limits = cx.device_limits(build);
        let device_wall = cx.metrics.device_wall_time.timer();
        find_pairs(
            &cx.device,
            build,
            probe_keys,
            limits,
            gather,
            &cx.metrics,
            &mut |part| results.take(part),
        )?;
        device_wall.done();
    }
    let mut batches = results.finish()?;
    cx.metrics.probe_chunks.add(1);
    trace::event(|| format!("hash join p{}: chunk done", cx.partition));
    if let Some(partial) = &cx.partial {
        // Rows assembled on the host feed the same accumulators.
        let mut partial = lock(partial);
        for rows in batches.drain(..) {
            match rows {
                JoinedRows::Host(batch) => partial.update(&batch)?,
                JoinedRows::Device(_) => {
                    return Err(DataFusionError::Internal(
                        "rows kept on the device for an aggregation on the host".into(),
                    ))
                }
            }
        }
    }
    Ok(batches)
}

/// Appends host batches to a chunk's output.
fn extend_host(output: &mut Vec<JoinedRows>, batches: Vec<RecordBatch>) {
    output.extend(batches.into_iter().map(JoinedRows::Host));
}

/// What one chunk's device work has handed back so far.
struct ChunkResults<'a> {
    cx: &'a ChunkContext,
    build: &'a BuildSide,
    chunk: &'a ArrivedBatches,
    keys_equal: Option<&'a JoinKeyComparator>,
    /// Which probe rows matched, where the join type asks.
    probe_matched: Option<Vec<bool>>,
    /// With the order preserved, the chunk's pairs are gathered, sorted
    /// and emitted at the end; otherwise each range is emitted as it comes.
    ordered_pairs: Option<(Vec<u64>, Vec<u64>)>,
    batches: Vec<JoinedRows>,
}

impl<'a> ChunkResults<'a> {
    fn new(
        cx: &'a ChunkContext,
        build: &'a BuildSide,
        chunk: &'a ArrivedBatches,
        keys_equal: Option<&'a JoinKeyComparator>,
    ) -> Self {
        let join_type = cx.semantics.join_type;
        Self {
            cx,
            build,
            chunk,
            keys_equal,
            probe_matched: tracks_probe_matches(join_type).then(|| vec![false; chunk.num_rows()]),
            ordered_pairs: (cx.semantics.preserve_order && emits_pairs(join_type))
                .then(|| (Vec::new(), Vec::new())),
            batches: Vec::new(),
        }
    }

    /// Takes one part of the device's output: candidate pairs are checked
    /// (keys, residual filter), marked and emitted or kept in order;
    /// gathered batches and reduced words go on as they are.
    fn take(&mut self, part: ChunkOutput) -> Result<()> {
        let metrics = &self.cx.metrics;
        let _emit = metrics.emit_time.timer();
        let (build_ids, probe_ids) = match part {
            ChunkOutput::Pairs(build_ids, probe_ids) => (build_ids, probe_ids),
            ChunkOutput::Batches(gathered, len) => {
                // Every pair is an output row, in order already.
                metrics.rows_gathered_on_device.add(len);
                self.batches.extend(gathered.into_iter().map(JoinedRows::Host));
                return Ok(());
            }
            ChunkOutput::Device(rows) => {
                self.batches.push(JoinedRows::Device(rows));
                return Ok(());
            }
            ChunkOutput::Reduced(words, len) => {
                let partial = self.cx.partial.as_ref().ok_or_else(|| {
                    DataFusionError::Internal(
                        "pairs reduced on the device without an aggregation".into(),
                    )
                })?;
                metrics.rows_aggregated_on_device.add(len);
                return lock(partial).merge_device(&words, len);
            }
        };
        check_device_ids(&build_ids, self.build.rows.num_rows(), "the build side")?;
        check_device_ids(&probe_ids, self.chunk.num_rows(), "a probe chunk")?;
        let (build_ids, probe_ids) = confirm_pairs(
            self.keys_equal,
            self.cx.semantics.filter.as_deref(),
            &self.build.rows,
            self.chunk,
            UInt64Array::from(build_ids),
            UInt64Array::from(probe_ids),
        )?;
        if let Some(visited) = &self.build.visited {
            visited.mark(build_ids.values());
        }
        if let Some(matched) = self.probe_matched.as_mut() {
            for &i in probe_ids.values() {
                matched[i as usize] = true;
            }
        }
        if let Some((all_build, all_probe)) = self.ordered_pairs.as_mut() {
            all_build.extend_from_slice(build_ids.values());
            all_probe.extend_from_slice(probe_ids.values());
        } else if emits_pairs(self.cx.semantics.join_type) {
            extend_host(&mut self.batches, self.cx.output.assemble(
                &self.build.rows,
                self.chunk,
                &OutputRows::pairs(build_ids, probe_ids),
            )?);
        }
        Ok(())
    }

    /// The chunk's batches: the pairs kept in order, sorted by probe row
    /// (with the unmatched probe rows of outer joins among them), and the
    /// probe rows the join type emits alone.
    fn finish(mut self) -> Result<Vec<JoinedRows>> {
        let _emit = self.cx.metrics.emit_time.timer();
        let join_type = self.cx.semantics.join_type;
        let (build, chunk, output) = (self.build, self.chunk, &self.cx.output);
        let probe_matched = self.probe_matched.take().map(BooleanBuffer::from);
        let outer_probe = matches!(join_type, JoinType::Right | JoinType::Full);
        if let Some((all_build, all_probe)) = self.ordered_pairs.take() {
            let (build_ids, probe_ids) =
                sort_by_probe_row(&all_build, &all_probe, chunk.num_rows(), &build.arrival);
            let rows = match &probe_matched {
                Some(matched) if outer_probe => {
                    let (build_ids, probe_ids) = with_unmatched_probe_rows(
                        &build_ids,
                        &probe_ids,
                        matched,
                        chunk.batch_ends(),
                        self.cx.semantics.probe_ordered,
                    );
                    OutputRows {
                        len: probe_ids.len(),
                        build: SideRows::Ids(build_ids),
                        probe: SideRows::Ids(probe_ids),
                        mark: None,
                    }
                }
                _ => OutputRows::pairs(UInt64Array::from(build_ids), UInt64Array::from(probe_ids)),
            };
            extend_host(&mut self.batches, output.assemble(&build.rows, chunk, &rows)?);
        } else if let Some(matched) = probe_matched.as_ref().filter(|_| outer_probe) {
            let (ids, _) = rows_emitted_alone(join_type, matched);
            extend_host(&mut self.batches, output.assemble(
                &build.rows,
                chunk,
                &OutputRows::probe_only(ids, None),
            )?);
        }
        if let Some(matched) = probe_matched.as_ref().filter(|_| !outer_probe) {
            // RightSemi, RightAnti, RightMark: probe rows, in order.
            let (ids, mark) = rows_emitted_alone(join_type, matched);
            extend_host(&mut self.batches, output.assemble(
                &build.rows,
                chunk,
                &OutputRows::probe_only(ids, mark),
            )?);
        }
        Ok(self.batches)
    }
}

impl ChunkContext {
    /// The limits on one chunk's device work.
    fn device_limits(&self, build: &BuildSide) -> DeviceLimits {
        DeviceLimits {
            max_pairs: self.options.max_output_pairs.max(1),
            memory_fraction: self.options.memory_fraction,
            max_concurrent_tasks: self.options.max_concurrent_tasks,
            host_threads: self.host_threads,
            partition: self.partition,
            device_errors: self.device_errors,
            pair_limit: self.pair_limit(build),
        }
    }

    /// Pairs after which a chunk's output may stop: the fetch pushed into
    /// the join, where each pair found is one output row (an inner join
    /// without a filter or an aggregation above it, on exactly coded keys,
    /// whose candidates need no check) and the rows' order is not kept, so
    /// any `fetch` of them will do. A LIMIT over a join with a key that
    /// matches many rows then writes and reads back one range of pairs, not
    /// all of them.
    fn pair_limit(&self, build: &BuildSide) -> Option<u64> {
        let semantics = &self.semantics;
        let every_pair_a_row = semantics.join_type == JoinType::Inner
            && semantics.filter.is_none()
            && self.aggregate.is_none()
            && self.partial.is_none()
            && !build.encoder.needs_verification();
        semantics
            .fetch
            .filter(|_| every_pair_a_row && !semantics.preserve_order)
            .map(|fetch| fetch as u64)
    }
}
