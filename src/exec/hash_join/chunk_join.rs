//! One probe chunk joined: its keys coded on the runtime's thread, then,
//! in a blocking task, its pairs found on the device, checked and turned
//! into output rows (or folded into the partial aggregation).

use super::*;
use crate::exec::check_device_ids;
use datafusion::arrow::array::ArrayRef;
use datafusion::physical_plan::joins::utils::JoinKeyComparator;

/// Joins one probe chunk: its keys coded here, the device part off the
/// async runtime.
pub(super) async fn join_chunk(
    cx: ChunkContext,
    build: Arc<BuildSide>,
    chunk: ProbeChunk,
) -> Result<Vec<RecordBatch>> {
    let ProbeChunk { rows: chunk } = chunk;
    let Some((probe_key_columns, probe_keys)) = code_probe_keys(&cx, &build, &chunk)? else {
        return Ok(vec![]);
    };
    let task = SpawnedTask::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
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
) -> Result<Vec<RecordBatch>> {
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
                probe_columns,
                output: &cx.output,
                ordered: cx.semantics.preserve_order,
                reductions: cx.aggregate.as_ref().map(|a| a.reductions()),
                fold_while_probing: cx.options.tuning.fold_while_probing,
                carry_folded_values: cx.options.tuning.carry_folded_values,
            });
        let limits = DeviceLimits {
            max_pairs: cx.options.max_output_pairs.max(1),
            memory_fraction: cx.options.memory_fraction,
            max_concurrent_tasks: cx.options.max_concurrent_tasks,
            host_threads: cx.host_threads,
            partition: cx.partition,
            device_errors: cx.device_errors,
            pair_limit: cx.pair_limit(build),
        };
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
        for batch in batches.drain(..) {
            partial.update(&batch)?;
        }
    }
    Ok(batches)
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
    batches: Vec<RecordBatch>,
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
                self.batches.extend(gathered);
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
            self.batches.extend(self.cx.output.assemble(
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
    fn finish(mut self) -> Result<Vec<RecordBatch>> {
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
            self.batches.extend(output.assemble(&build.rows, chunk, &rows)?);
        } else if let Some(matched) = probe_matched.as_ref().filter(|_| outer_probe) {
            let (ids, _) = rows_emitted_alone(join_type, matched);
            self.batches.extend(output.assemble(
                &build.rows,
                chunk,
                &OutputRows::probe_only(ids, None),
            )?);
        }
        if let Some(matched) = probe_matched.as_ref().filter(|_| !outer_probe) {
            // RightSemi, RightAnti, RightMark: probe rows, in order.
            let (ids, mark) = rows_emitted_alone(join_type, matched);
            self.batches.extend(output.assemble(
                &build.rows,
                chunk,
                &OutputRows::probe_only(ids, mark),
            )?);
        }
        Ok(self.batches)
    }
}

impl ChunkContext {
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
