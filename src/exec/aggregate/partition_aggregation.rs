//! [`DeviceAggregation::aggregate`]: one partition's input aggregated on
//! the device, or handed to DataFusion's operator where a sample of its
//! keys, their type or the device's memory says so.

use super::*;

/// Rows sampled from the group keys and distinct keys among them (see
/// [`sampled_distinct_keys`]).
type KeySample = (usize, usize);

/// Keys the first, quick sample reads: it tells up to 512 groups, each seen
/// eight times on average.
const QUICK_SAMPLE_ROWS: usize = 4096;

/// Batches the quick sample reads at most, spread over the input.
const QUICK_SAMPLE_BATCHES: usize = 256;

/// Where the device reads an aggregation's input from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InputSource {
    /// The partition's batches, sent up.
    Host,
    /// The table's columns in the device column cache: nothing sent up.
    ColumnCache,
}

impl DeviceAggregation {
    pub(super) fn aggregate(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
        reservation: &mut MemoryReservation,
    ) -> Result<Outcome> {
        trace::event(|| "aggregation: blocking part started".into());
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let prepare = self.metrics.prepare_time.timer();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        // A few thousand keys of a few hundred batches tell few groups
        // before every batch's keys are evaluated and the full sample's
        // scattered reads, which only the device's work needs.
        if let Some((sampled, distinct)) = self.quick_sample(batches, inputs)? {
            trace::event(|| format!("aggregation: quick sample ({sampled}, {distinct})"));
            if self.sample_favours_cpu(InputSource::Host, rows, sampled, distinct) {
                self.metrics.few_groups_partitions.add(1);
                return Ok(Outcome::OnCpu);
            }
        }
        // Floats as DataFusion stores group values, `-0.0` folded into `+0.0`.
        let key_columns = fold_negative_zeros(evaluate_pieces(&inputs.group_exprs, batches)?)?;
        trace::event(|| "aggregation: group keys evaluated".into());
        let (sample, own_keys) = self.sample_keys(&key_columns)?;
        trace::event(|| format!("aggregation: keys sampled ({sample:?})"));
        if let Some((sampled, distinct)) = sample {
            // Statistics rarely know the groups (the rule takes unknown as
            // many): a sample of the keys decides again before they are
            // encoded or copied, where one CPU pass over host memory would
            // be faster.
            if self.sample_favours_cpu(InputSource::Host, rows, sampled, distinct) {
                self.metrics.few_groups_partitions.add(1);
                return Ok(Outcome::OnCpu);
            }
        }
        let key_words = match own_keys {
            Some(keys) => KeyWordsMade::Unordered(keys),
            None => self.key_words(&key_columns, batches.len())?,
        };
        trace::event(|| "aggregation: key words made".into());
        let Some((keys, ids)) = self.group_ids(key_words, sample, rows) else {
            return Ok(Outcome::OnCpu);
        };
        let hashed = keys.as_ref().is_some_and(|k| k.hashed());
        // Each row's group comes back to the host for the key check; where
        // the memory pool cannot hold them, DataFusion's operator (which
        // spills) aggregates the input.
        if hashed && reservation.try_grow(8 * rows).is_err() {
            return Ok(Outcome::PoolRefused);
        }
        // The keys' copy is left to the device, and the host free, only
        // where their words lie in pinned memory: staged, the host copies
        // them itself, and the inputs, ready, should follow at once.
        let keys_copied_by_device = keys.as_ref().is_some_and(|k| {
            let pieces = k.words.pieces();
            let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
            in_pinned_memory(&bytes)
        });
        let work = self.work_to_do(batches, inputs, keys_copied_by_device)?;
        prepare.done();
        trace::event(|| format!("aggregation: {rows} rows prepared"));
        let device_wall = self.metrics.device_wall_time.timer();
        let back = match hashed {
            true => GroupsBack::RowsAndRowGroups,
            false => GroupsBack::KeyWords,
        };
        let mut prepared = None;
        // Output memory mapped by the host's idle cores once the inputs are
        // prepared, where the device reads the input from pinned memory (a
        // staging host has no idle cores).
        let mapped = std::cell::OnceCell::new();
        let map_output = || {
            if keys_copied_by_device {
                mapped.get_or_init(|| self.map_output_ahead(sample, rows, reservation));
            }
        };
        let no_mapping = MappedAhead::none();
        let emitted = self.on_device(
            keys.as_ref().map(|k| &k.words),
            ids,
            rows,
            work,
            map_output,
            &mut prepared,
            back,
            |grouped, work, keys_stream, timer| {
                let reduced = || {
                    device_wall.done();
                    trace::event(|| "aggregation: groups reduced on the device".into());
                    self.count_grouping(ids, grouped);
                };
                let sources = KeySources {
                    keys: keys.as_ref(),
                    key_columns: &key_columns,
                    batches,
                };
                let memory = mapped.get().unwrap_or(&no_mapping);
                let output = self.emit(grouped, sources, work, keys_stream, memory, timer, reduced);
                trace::event(|| match &output {
                    Ok(Emitted::Batches(groups, _)) => {
                        format!("aggregation: output made ({groups} groups)")
                    }
                    Ok(Emitted::Collided) => "aggregation: hashed keys collided".into(),
                    Ok(Emitted::DeviceFailed(e)) => format!("aggregation: device failed: {e}"),
                    Ok(Emitted::OutOfMemory) => "aggregation: no pinned memory for results".into(),
                    Err(e) => format!("aggregation: output failed: {e}"),
                });
                output
            },
        );
        // What was read of the input's batches (a reference to each piece
        // of each column), and the output buffers mapped but not needed
        // (with their reservation), are dropped off the query's path, as
        // the input is (see `release`).
        let unused = mapped.into_inner().and_then(|memory| {
            self.metrics.output_buffers_mapped_ahead.add(memory.taken());
            memory.finish()
        });
        release_in_background((key_columns, keys, prepared, unused));
        self.outcome_of(emitted)
    }

    /// A sample of [`QUICK_SAMPLE_ROWS`] keys (sampled rows, distinct among
    /// them) spread over at most [`QUICK_SAMPLE_BATCHES`] batches spread
    /// over the input, whose keys alone are evaluated, where the cost model
    /// may send the partition back to the CPU.
    fn quick_sample(
        &self,
        batches: &[RecordBatch],
        inputs: &AggregateInputs,
    ) -> Result<Option<KeySample>> {
        if self.spec.keys.is_none() || self.options.placement.always() || batches.is_empty() {
            return Ok(None);
        }
        let picked: Vec<RecordBatch> = match batches.len() <= QUICK_SAMPLE_BATCHES {
            true => batches.to_vec(),
            false => (0..QUICK_SAMPLE_BATCHES)
                .map(|i| batches[i * batches.len() / QUICK_SAMPLE_BATCHES].clone())
                .collect(),
        };
        let key_columns = fold_negative_zeros(evaluate_pieces(&inputs.group_exprs, &picked)?)?;
        sampled_distinct_keys(&key_columns, QUICK_SAMPLE_ROWS).map(Some)
    }

    /// Whether a sample of the keys (`sampled` of `rows` rows, `distinct`
    /// keys among them) says DataFusion's operator aggregates them faster:
    /// the sample saw few groups, each many times (so that their number is
    /// known), and given them the cost model estimates the CPU faster, the
    /// device reading its input from `source`. Never under
    /// `gpu.placement = 'always'`.
    pub(super) fn sample_favours_cpu(
        &self,
        source: InputSource,
        rows: usize,
        sampled: usize,
        distinct: usize,
    ) -> bool {
        if self.options.placement.always() || !sample_shows_few_groups(sampled, distinct) {
            return false;
        }
        let keys = self.spec.keys.as_ref().map_or(0, |keys| keys.types().len()) as u64;
        let aggregates = self.spec.aggregates.len() as u64;
        let shape = AggregateShape {
            rows: rows as u64,
            groups: estimated_groups(sampled, distinct, rows) as u64,
            keys,
            value_bytes: 8 * aggregates,
            aggregates,
            group_bytes: 8 * (keys + aggregates),
            threads: host_threads(),
            hashed_keys: self.spec.keys_need_hashing,
        };
        let device = self.device.constants().unwrap_or(DeviceConstants::TYPICAL);
        let estimate = match source {
            InputSource::Host => cost::aggregate(&shape, &device),
            InputSource::ColumnCache => cost::cached_aggregate(&shape, &device),
        };
        !estimate.gpu_faster()
    }

    /// A sample of the keys' distinct values (sampled rows, distinct among
    /// them), where a choice depends on the groups, and the keys' words
    /// where they are their column's own, read in place. The sample
    /// (thousands of scattered reads) is taken on threads of its own while
    /// this one looks at the keys: nothing is made that the CPU operator,
    /// should the sample send the input there, would not need. Keys to pack
    /// or hash (a pass over every row) wait for the sample.
    fn sample_keys(
        &self,
        key_columns: &[Vec<ArrayRef>],
    ) -> Result<(Option<KeySample>, Option<GroupKeyWords>)> {
        let sampling = self.spec.keys.is_some()
            && (!self.options.placement.always()
                || self.group_order.is_some()
                || self.options.tuning.min_groups_to_partition < usize::MAX);
        std::thread::scope(|scope| -> Result<_> {
            let sampler = sampling
                .then(|| scope.spawn(|| sampled_distinct_keys(key_columns, GROUP_SAMPLE_ROWS)));
            let own_keys = match (&self.spec.keys, &self.group_order) {
                (Some(key_spec), None) => own_group_key_words(key_spec, key_columns),
                _ => Ok(None),
            };
            let sample = match sampler {
                Some(sampler) => Some(sampler.join().map_err(|_| {
                    DataFusionError::Internal("sampling the group keys panicked".into())
                })??),
                None => None,
            };
            Ok((sample, own_keys?))
        })
    }

    /// The keys' words and how the device numbers their groups; `None`
    /// where the device cannot group the keys.
    fn group_ids(
        &self,
        key_words: KeyWordsMade,
        sample: Option<KeySample>,
        rows: usize,
    ) -> Option<(Option<GroupKeyWords>, GroupIds)> {
        Some(match key_words {
            KeyWordsMade::Ordered(ordered) => {
                let ids = ids_in_key_order(&ordered, sample.unwrap_or_default(), rows);
                (Some(ordered.keys), ids)
            }
            KeyWordsMade::Unordered(keys) => {
                let ids = unordered_ids(
                    sample.unwrap_or_default(),
                    rows,
                    self.options.tuning.min_groups_to_partition,
                );
                (Some(keys), ids)
            }
            KeyWordsMade::NoKeys => (
                None,
                GroupIds::Hashed {
                    expected_groups: None,
                },
            ),
            KeyWordsMade::OnCpu => return None,
        })
    }

    /// The aggregates' device work, prepared now, or, where the keys'
    /// copy is the device's and the work's shape is known without the
    /// data, prepared while the keys cross the bus.
    fn work_to_do<'a>(
        &'a self,
        batches: &'a [RecordBatch],
        inputs: &'a AggregateInputs,
        keys_copied_by_device: bool,
    ) -> Result<WorkToDo<'a>> {
        let shape = match keys_copied_by_device {
            true => self.work_shape(batches, inputs)?,
            false => None,
        };
        Ok(match shape {
            Some(shape) => WorkToDo::WhileKeysCross {
                shape,
                prepare: Box::new(move || self.device_work(batches, inputs)),
            },
            None => WorkToDo::Ready(self.device_work(batches, inputs)?),
        })
    }

    /// Counts how the device grouped the partition.
    pub(super) fn count_grouping(&self, ids: GroupIds, grouped: &DeviceGrouped) {
        let metrics = &self.metrics;
        match ids {
            GroupIds::Sorted { .. } => metrics.sorted_rows_partitions.add(1),
            GroupIds::Partitioned { .. } if grouped.numbered_in_partitions => {
                metrics.partitioned_groups_partitions.add(1)
            }
            GroupIds::Partitioned { .. } => metrics.partition_overflow_partitions.add(1),
            _ => {}
        }
        if grouped.table_overflowed {
            metrics.table_overflow_partitions.add(1);
        }
        if grouped.folded_in_table {
            metrics.table_fold_partitions.add(1);
        }
        if grouped.folding_table_grown {
            metrics.folding_table_grown_partitions.add(1);
        }
        metrics
            .inputs_reduced_as_they_landed
            .add(grouped.inputs_reduced_as_they_landed);
    }

    /// The partition's outcome: its batches, or DataFusion's operator where
    /// the device ran out of memory or failed (unless the session makes
    /// device errors fail), or two hashed keys collided.
    pub(super) fn outcome_of(&self, emitted: GpuResult<Result<Emitted>>) -> Result<Outcome> {
        let emitted = match emitted {
            Ok(_) if self.device_errors.inject => Err(GpuError::Invalid(
                "a device error injected by the test options".into(),
            )),
            Ok(Ok(Emitted::DeviceFailed(e))) => Err(e),
            emitted => emitted,
        };
        let output = match emitted {
            Ok(output) => output?,
            // More than the whole budget: never fits as one, but may in parts.
            Err(GpuError::OutOfDeviceMemory {
                requested, limit, ..
            }) if requested > limit => return Ok(Outcome::TooLarge { requested, limit }),
            Err(e) if e.is_out_of_device_memory() => return Ok(Outcome::OnCpu),
            Err(e) if self.device_errors.fail => return Err(e.into()),
            // Nothing has left the partition: DataFusion's operator
            // aggregates the input, and the error is traced and counted.
            Err(e) => {
                trace::event(|| format!("aggregation: device error, on the CPU: {e}"));
                self.metrics.device_error_fallback_partitions.add(1);
                return Ok(Outcome::OnCpu);
            }
        };
        match output {
            Emitted::DeviceFailed(e) => Err(e.into()),
            Emitted::Batches(groups, output) => {
                self.metrics.groups.add(groups);
                Ok(Outcome::Batches(output))
            }
            Emitted::Collided => {
                self.metrics.hashed_key_collisions.add(1);
                Ok(Outcome::OnCpu)
            }
            Emitted::OutOfMemory => Ok(Outcome::OnCpu),
        }
    }
}
