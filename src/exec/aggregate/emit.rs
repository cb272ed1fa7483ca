//! A partition's results brought back from the device and built into output
//! batches: keys decoded, aggregates' columns made in windows that land while
//! the next ones cross the bus, early passes where the device makes the
//! reductions one after another.

use super::*;
use crate::exec::aggregate::group_filter::device_comparisons;
use crate::gpu::DeviceReservation;

impl DeviceAggregation {
    /// The output batches of the groups on the device, one per
    /// `batch_size` groups, with the group count. The groups' keys come
    /// back first, on `keys_stream`, and are made into columns on every
    /// core while the device still reduces (they are known once the groups
    /// are numbered); so do the columns of aggregates whose reductions are
    /// made before the last ones ([`result_passes`]), where the device
    /// makes them one after the other; once the device has made every
    /// result (`reduced` is then called), the other reductions' results
    /// come back and the batches are built, all in windows that land while
    /// the next ones cross the bus.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &self,
        grouped: &DeviceGrouped,
        sources: KeySources<'_>,
        work: &DeviceWork,
        keys_stream: &Arc<DeviceStream>,
        memory: &MappedAhead,
        timer: &mut PhaseTimer,
        reduced: impl FnOnce() + Send,
    ) -> Result<Emitted> {
        let emit_timer = self.metrics.emit_time.timer();
        let all_groups = grouped.groups;
        // Where the output filter drops groups on the device, the rest come
        // back as the groups; where that cannot be had, all of them do.
        let kept = match self.kept_on_device(grouped, work, timer) {
            Ok(kept) => kept,
            Err(e) if e.is_out_of_device_memory() => None,
            Err(e) => return Ok(Emitted::DeviceFailed(e)),
        };
        let grouped = kept.as_ref().map_or(grouped, |(kept, _memory)| kept);
        let hashed = sources.keys.is_some_and(|k| k.hashed());
        let key_chunks = self.keys_back(grouped, &sources, keys_stream, memory, timer);
        trace::event(|| "aggregation: group keys made".into());
        // The passes over the reductions' results: all in one but where
        // some can come back while the device still makes the others.
        let mut passes = self.result_passes(grouped, work);
        // The last pass waits for every result; the others come back now.
        let last_pass = passes.pop().filter(|_| !passes.is_empty());
        let early = match (passes.is_empty(), &key_chunks) {
            (false, Ok(_)) => std::thread::scope(|scope| {
                // The device's end is seen as it comes (the caller's
                // `device_wall_time` and trace say so), on a thread of its
                // own, while this one brings the first aggregates back.
                let device = scope.spawn(|| {
                    let made = grouped.wait_until_made();
                    if made.is_ok() {
                        reduced();
                    }
                    made
                });
                let early =
                    self.bring_back_early(grouped, &passes, work, keys_stream, memory, timer);
                let made = device.join().unwrap_or_else(|_| {
                    Err(GpuError::Invalid(
                        "a thread waiting for the device panicked".into(),
                    ))
                });
                made.map(|()| early)
            })?,
            _ => {
                // The device part ends once the results are made.
                grouped.wait_until_made()?;
                reduced();
                Ok(EarlyColumns::default())
            }
        };
        // The results now land: the cores build the batches.
        memory.stop_mapping();
        // Pinned memory for the windows could not be had: no batch has left
        // yet, so the CPU operator can still take over.
        let made = key_chunks.and_then(|keys| early.map(|early| (keys, early)));
        let (key_chunks, early) = match made {
            Ok(made) => made,
            Err(EmitError::Device(e)) if e.is_out_of_device_memory() => {
                return Ok(Emitted::OutOfMemory)
            }
            Err(EmitError::Device(e)) => return Ok(Emitted::DeviceFailed(e)),
            Err(EmitError::Host(e)) => return Err(e),
        };
        let parts = last_pass.map_or(ResultParts::Reductions, |(parts, _)| parts);
        let per_batch = self.per_output_batch(
            grouped,
            (grouped.stream(), parts),
            timer,
            |window, batch, groups| {
                let key_chunk = match self.spec.keys {
                    Some(_) => key_chunks.get(batch).cloned().ok_or_else(|| {
                        DataFusionError::Internal(format!("no keys for output batch {batch}"))
                    })?,
                    None => Vec::new(),
                };
                let made = early.of_batch(batch);
                let batch =
                    self.output_batch(key_chunk, work, &window.reduced, groups, memory, made)?;
                let batch = match &self.output_filter {
                    Some(filter) => batch_filter(&batch, filter.predicate())?,
                    None => batch,
                };
                // Counted here, on the thread that made the batch: counted
                // one by one on the query's thread, thousands of batches would
                // each cost a few cache misses after the last was made.
                let bytes = get_record_batch_memory_size(&batch);
                Ok((batch, bytes))
            },
        );
        let per_batch = match per_batch {
            Ok(per_batch) => per_batch,
            Err(EmitError::Device(e)) if e.is_out_of_device_memory() => {
                return Ok(Emitted::OutOfMemory)
            }
            Err(EmitError::Device(e)) => return Ok(Emitted::DeviceFailed(e)),
            Err(EmitError::Host(e)) => return Err(e),
        };
        emit_timer.done();
        trace::event(|| "aggregation: groups brought back".into());
        // Hashed keys are checked once every group's keys are known.
        if hashed {
            let _check = self.metrics.key_check_time.timer();
            let group_keys = concat_chunks(&key_chunks)?;
            if !groups_hold_one_key(sources.key_columns, &group_keys, &grouped.row_groups)? {
                return Ok(Emitted::Collided);
            }
        }
        let per_batch = match &self.output_filter {
            Some(_) => self.coalesced(per_batch)?,
            None => per_batch,
        };
        // The batches now leave (the CPU operator no longer takes over):
        // they count as output.
        let mut output = Vec::with_capacity(per_batch.len());
        for (batch, bytes) in per_batch {
            self.metrics.baseline.record_output(batch.num_rows());
            self.metrics.output_bytes.add(bytes);
            output.push(batch);
        }
        self.metrics.baseline.output_batches().add(output.len());
        self.metrics
            .aggregates_brought_back_early
            .add(early.aggregates);
        Ok(Emitted::Batches(all_groups, output))
    }

    /// The groups the output filter may keep, gathered on the device where
    /// it compares some aggregate with a constant there (see
    /// [`device_comparisons`]); `None` where it does not.
    fn kept_on_device(
        &self,
        grouped: &DeviceGrouped,
        work: &DeviceWork,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Option<(DeviceGrouped, DeviceReservation)>> {
        let Some(filter) = &self.output_filter else {
            return Ok(None);
        };
        if !self.final_output || self.spec.keys.is_none() {
            return Ok(None);
        }
        let comparisons = device_comparisons(
            filter.predicate(),
            &self.output_schema,
            &self.spec.aggregates,
            work,
        );
        if comparisons.is_empty() {
            return Ok(None);
        }
        // The kept groups' memory is held while they are; where it does not
        // fit the budget, every group comes back (the caller's fallback).
        let kept = grouped.keep_where(&self.device, &comparisons, self.options.memory_fraction, timer)?;
        let Some((kept, memory)) = kept else {
            return Ok(None);
        };
        let dropped = grouped.groups.saturating_sub(kept.groups);
        self.metrics.groups_dropped_on_device.add(dropped);
        trace::event(|| format!("aggregation: {dropped} groups dropped on the device"));
        Ok(Some((kept, memory)))
    }

    /// Filtered output batches (with their sizes) gathered into batches of
    /// about `batch_size` rows, as DataFusion's filter hands them on: a
    /// filter that keeps few groups leaves thousands of tiny batches, which
    /// every node above would pay for one by one. Empty batches go; a batch
    /// of at least half the size passes as it is.
    fn coalesced(&self, batches: Vec<(RecordBatch, usize)>) -> Result<Vec<(RecordBatch, usize)>> {
        let size = self.batch_size.max(1);
        let schema = match batches.first() {
            Some((batch, _)) => batch.schema(),
            None => return Ok(batches),
        };
        let mut coalescer = BatchCoalescer::new(schema, size)
            .with_biggest_coalesce_batch_size(Some((size / 2).max(1)));
        for (batch, _) in batches {
            coalescer.push_batch(batch)?;
        }
        coalescer.finish_buffered_batch()?;
        let mut output = Vec::new();
        while let Some(batch) = coalescer.next_completed_batch() {
            let bytes = get_record_batch_memory_size(&batch);
            output.push((batch, bytes));
        }
        Ok(output)
    }

    /// The key columns of every output batch (`batch_size` groups each),
    /// brought back on `stream` and made on every core: decoded from their
    /// words, or read from a row of each group (hashed keys). None without
    /// keys.
    pub(super) fn keys_back(
        &self,
        grouped: &DeviceGrouped,
        sources: &KeySources<'_>,
        stream: &Arc<DeviceStream>,
        memory: &MappedAhead,
        timer: &mut PhaseTimer,
    ) -> std::result::Result<Vec<Vec<ArrayRef>>, EmitError> {
        if self.spec.keys.is_none() || !grouped.has_identities() {
            return Ok(Vec::new());
        }
        let hashed = sources.keys.is_some_and(|k| k.hashed());
        // Where each batch begins among the rows (hashed keys are read from
        // a row of each group).
        let starts = match hashed {
            true => starts_of(sources.batches.iter().map(|b| b.num_rows())),
            false => Vec::new(),
        };
        self.per_output_batch(
            grouped,
            (stream, ResultParts::Identities),
            timer,
            |window, _, groups| {
                let identities = window.identities.get(groups).unwrap_or(&[]);
                Ok(match sources.keys {
                    Some(keys) if !hashed => keys.decode(identities, memory)?,
                    _ => self.keys_of_group_rows(sources.key_columns, &starts, identities)?,
                })
            },
        )
    }

    /// The key columns of the groups whose rows are `group_rows`, read
    /// from those rows (`starts`: where each input batch begins among the
    /// rows): hashed keys, whose words cannot be decoded. The
    /// rows are spread over the input at random, so each group costs a
    /// cache miss (the callers spread the groups over every core).
    pub(super) fn keys_of_group_rows(
        &self,
        key_columns: &[Vec<ArrayRef>],
        starts: &[usize],
        group_rows: &[u64],
    ) -> Result<Vec<ArrayRef>> {
        if self.spec.keys.is_none() {
            return Ok(Vec::new());
        }
        let rows = key_columns
            .first()
            .map_or(0, |pieces| pieces.iter().map(|p| p.len()).sum());
        crate::exec::check_device_ids(group_rows, rows, "the aggregation's input")?;
        // (batch, row in batch) of each group's row.
        let at: Vec<(usize, usize)> = group_rows
            .iter()
            .map(|&row| {
                let row = row as usize;
                let batch = starts.partition_point(|&s| s <= row) - 1;
                (batch, row - starts[batch])
            })
            .collect();
        key_columns
            .iter()
            .map(|pieces| {
                let sources: Vec<&dyn Array> = pieces.iter().map(|p| p.as_ref()).collect();
                Ok(interleave(&sources, &at)?)
            })
            .collect()
    }

    /// Brings `parts` of every group back on `stream` in windows that land
    /// while the next ones cross the bus, and runs `per_batch(window, batch,
    /// groups)` for each output batch (`batch_size` groups; its index among
    /// all, and its groups among the window's) on every core, in tasks of
    /// several batches. The results in batch order.
    pub(super) fn per_output_batch<R: Send>(
        &self,
        grouped: &DeviceGrouped,
        (stream, parts): (&Arc<DeviceStream>, ResultParts),
        timer: &mut PhaseTimer,
        per_batch: impl Fn(&GroupedWindow<'_>, usize, Range<usize>) -> std::result::Result<R, EmitError>
            + Sync,
    ) -> std::result::Result<Vec<R>, EmitError> {
        let size = self.batch_size.max(1);
        let window = window_groups(
            self.options.tuning.result_window_words,
            grouped.words_per_group(parts),
            size,
        );
        let threads = host_threads();
        let per_task = grouped.bring_back_in_parallel(
            &self.device,
            (stream, parts),
            window,
            task_groups(window, grouped.groups, size, threads),
            threads,
            timer,
            |window, groups| {
                batches_of(window, groups, size)
                    .map(|(batch, groups)| per_batch(window, batch, groups))
                    .collect::<std::result::Result<Vec<_>, _>>()
            },
        )?;
        Ok(per_task.into_iter().flatten().collect())
    }

    /// The passes over the reductions' results ([`result_passes`]) where
    /// the device makes them one after the other, the output holds more
    /// than one batch, and every pass's reductions can be named
    /// ([`ResultParts::some_reductions`]); otherwise none (one pass of
    /// all).
    pub(super) fn result_passes(
        &self,
        grouped: &DeviceGrouped,
        work: &DeviceWork,
    ) -> Vec<(ResultParts, ResultPass)> {
        if !self.options.tuning.results_back_early
            || !grouped.reductions_made_apart()
            || grouped.groups <= self.batch_size.max(1)
        {
            return Vec::new();
        }
        let reductions_of: Vec<Vec<usize>> = (0..self.spec.aggregates.len())
            .map(|i| work.reductions_of(i))
            .collect();
        // Each pass with what it brings back; none where one cannot be named.
        result_passes(&reductions_of, work.inputs.len())
            .into_iter()
            .map(|pass| Some((ResultParts::some_reductions(&pass.reductions)?, pass)))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default()
    }

    /// The output columns of the aggregates of `passes` (all but the last
    /// of [`result_passes`]), per output batch, each pass brought back on
    /// `stream` once the last reduction it reads is made, while the device
    /// still makes the others, and made into columns on every core.
    pub(super) fn bring_back_early(
        &self,
        grouped: &DeviceGrouped,
        passes: &[(ResultParts, ResultPass)],
        work: &DeviceWork,
        stream: &Arc<DeviceStream>,
        memory: &MappedAhead,
        timer: &mut PhaseTimer,
    ) -> std::result::Result<EarlyColumns, EmitError> {
        if passes.is_empty() {
            return Ok(EarlyColumns::default());
        }
        let size = self.batch_size.max(1);
        let aggregates = self.spec.aggregates.len();
        let mut early = EarlyColumns {
            by_batch: vec![vec![None; aggregates]; grouped.groups.div_ceil(size)],
            aggregates: 0,
        };
        for &(parts, ref pass) in passes {
            let per_batch =
                self.per_output_batch(grouped, (stream, parts), timer, |window, _, groups| {
                    pass.aggregates
                        .iter()
                        .map(|&i| {
                            let columns = self.aggregate_columns(
                                work,
                                i,
                                &window.reduced,
                                groups.clone(),
                                memory,
                            )?;
                            Ok((i, columns))
                        })
                        .collect::<std::result::Result<Vec<_>, EmitError>>()
                })?;
            for (batch, made) in early.by_batch.iter_mut().zip(per_batch) {
                for (i, columns) in made {
                    batch[i] = Some(columns);
                }
            }
            early.aggregates += pass.aggregates.len();
            trace::event(|| format!("aggregation: aggregates {:?} brought back", pass.aggregates));
        }
        Ok(early)
    }

    /// Aggregate `i`'s value or state columns over the groups `groups` of
    /// a window (their results in `reduced`).
    pub(super) fn aggregate_columns(
        &self,
        work: &DeviceWork,
        i: usize,
        reduced: &[ReducedWindow<'_>],
        groups: Range<usize>,
        memory: &MappedAhead,
    ) -> Result<Vec<ArrayRef>> {
        work.finish(
            i,
            &self.spec.aggregates[i],
            reduced,
            groups,
            self.final_output,
            memory,
        )
    }

    /// One output batch: the keys of the groups `groups` of a window (their
    /// results in `reduced`), then each aggregate's value or state columns,
    /// made already where `made` holds them.
    pub(super) fn output_batch(
        &self,
        mut columns: Vec<ArrayRef>,
        work: &DeviceWork,
        reduced: &[ReducedWindow<'_>],
        groups: Range<usize>,
        memory: &MappedAhead,
        made: &[Option<Vec<ArrayRef>>],
    ) -> Result<RecordBatch> {
        let rows = groups.len();
        for i in 0..self.spec.aggregates.len() {
            match made.get(i) {
                Some(Some(made)) => columns.extend(made.iter().cloned()),
                _ => columns.extend(self.aggregate_columns(
                    work,
                    i,
                    reduced,
                    groups.clone(),
                    memory,
                )?),
            }
        }
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.output_schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }
}
