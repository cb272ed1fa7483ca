//! The device part of one sort-merge join partition: both sides' keys
//! sorted on the device, merged, and the matches emitted range by range.

use super::*;
use crate::exec::check_device_ids;
use crate::gpu::{Admission, DeviceReservation};

/// The columns a merge join gathers on the device by pair: per column of
/// the left side and of the right side, whether it is gathered, and the
/// bytes they take there.
type GatheredColumns = (Vec<bool>, Vec<bool>, usize);

/// Where the matches' output goes, and what stopped it: a consumer that
/// has gone (`open` false) or a host error.
struct MatchEmitter<'a> {
    plan: &'a MergeJoinPlan,
    metrics: &'a GpuSortMergeJoinMetrics,
    sides: (&'a ArrivedBatches, &'a ArrivedBatches),
    sender: &'a mut Sender,
    open: bool,
    host_error: Option<DataFusionError>,
}

impl MatchEmitter<'_> {
    /// Assembles `rows` and hands them on; `false` once the consumer has gone.
    fn emit(&mut self, rows: OutputRows) -> Result<bool> {
        let batches = {
            let _timer = self.metrics.emit_time.timer();
            self.plan.output.assemble(self.sides.0, self.sides.1, &rows)?
        };
        self.sender.send(batches)
    }

    /// Takes the host's result of one range: whether the device goes on
    /// (not after a host failure or once the consumer has gone).
    fn took(&mut self, sent: Result<bool>) -> bool {
        match sent {
            Ok(still_open) => self.open = still_open,
            Err(e) => self.host_error = Some(e),
        }
        self.open && self.host_error.is_none()
    }

    /// After the last range: the host's failure, if any, else the rows
    /// the join type emits at the end (an inner join emits pairs only:
    /// nothing is left to settle).
    fn settle(
        mut self,
        mut walk: StreamedWalk,
        other_order: Option<&[u64]>,
    ) -> std::result::Result<(), DeviceFailure> {
        if let Some(e) = self.host_error.take() {
            return Err(DeviceFailure::Host(e));
        }
        if self.open && self.plan.join_type != JoinType::Inner {
            self.emit(walk.end(other_order)).map_err(DeviceFailure::Host)?;
        }
        Ok(())
    }
}

impl DeviceMergeJoin {
    /// Sorts, merges and emits. `streamed` and `other` are each side's keys
    /// and whether the device sorts them; `coding` how their codes are made.
    pub(super) fn on_device(
        &self,
        left: &ArrivedBatches,
        right: &ArrivedBatches,
        coding: KeyCoding,
        (streamed_codes, sort_streamed): (SideKeys, bool),
        (other_codes, sort_other): (SideKeys, bool),
        sender: &mut Sender,
    ) -> std::result::Result<(), DeviceFailure> {
        let plan = &self.plan;
        let device = &self.device;
        let join_type = plan.join_type;
        let (streamed_rows, other_rows) = (streamed_codes.len(), other_codes.len());
        let mut admission = Some(self.admitted());
        device.bind_to_thread()?;
        let partition = self.partition;
        trace::event(|| format!("sort-merge join p{partition}: admitted to the device"));
        let (gathered_columns, gather_bytes) = self.gathered_columns(left, right);
        let _memory = self.reserve_device_memory(streamed_rows, other_rows, gather_bytes)?;
        let stream = device.stream()?;
        let stream = stream.stream();
        // The other side's keys and the gathered columns cross the bus on a
        // stream of their own, so that the host stages them and the bus
        // carries them while the device sorts what came before (every
        // kernel that reads them waits for its copy). Nothing below waits
        // for the device before the merge.
        let copy_stream = device.stream()?;
        let copy_stream = copy_stream.stream();
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let SortedSides {
            streamed,
            other,
            device_columns,
        } = self.sort_sides(
            (stream, copy_stream),
            (left, right),
            coding,
            (streamed_codes, sort_streamed),
            (other_codes, sort_other),
            gathered_columns,
            &mut timer,
        )?;
        let pairs = needs_pairs(join_type, plan.filter.is_some());
        let matches = MergeMatches::find(device, stream, &streamed, &other, !pairs, &mut timer)?;
        trace::event(|| {
            format!(
                "sort-merge join p{partition}: both sides sorted, {} matches counted",
                matches.total()
            )
        });
        let (streamed_order, other_order) = self.row_orders(
            stream,
            (&streamed, sort_streamed && device_columns.is_none()),
            (&other, sort_other && join_type == JoinType::Full),
            &mut timer,
        )?;
        let mut walk = StreamedWalk::new(join_type, streamed_rows, streamed_order, other_rows);
        let mut emitter = MatchEmitter {
            plan,
            metrics: &self.metrics,
            sides: (left, right),
            sender,
            open: true,
            host_error: None,
        };
        if let Some((left_columns, right_columns)) = &device_columns {
            // Every pair is an output row: gather whole columns on the device.
            matches.expand_on_device(
                device,
                stream,
                &other,
                self.max_output_pairs,
                &mut timer,
                |pairs, timer| {
                    admission.take();
                    let columns = (left_columns, right_columns);
                    let sent = self.send_gathered(
                        stream,
                        &streamed,
                        (left, right),
                        columns,
                        pairs,
                        timer,
                        emitter.sender,
                    )?;
                    Ok(emitter.took(sent))
                },
            )?;
        } else if pairs {
            matches.expand(
                device,
                stream,
                &other,
                self.max_output_pairs,
                &mut timer,
                |positions, other_ids| {
                    // The device's part of this partition is done once its
                    // first pairs arrive: let another partition start.
                    admission.take();
                    let sent = self
                        .pair_rows(&mut walk, (left, right), &positions, other_ids)
                        .and_then(|rows| emitter.emit(rows));
                    Ok(emitter.took(sent))
                },
            )?;
        } else if let Some(counts) = matches.counts() {
            admission.take();
            let rows = walk.counts(counts);
            emitter.open = emitter.emit(rows).map_err(DeviceFailure::Host)?;
        }
        drop(admission);
        self.metrics.device.record(&timer.finish()?);
        emitter.settle(walk, other_order.as_deref())
    }

    /// One of the device's admissions, waited for.
    fn admitted(&self) -> Admission<'_> {
        let waiting = std::time::Instant::now();
        let admission = self.device.admit(self.max_concurrent_tasks);
        self.metrics
            .device
            .device_admission_wait
            .add_duration(waiting.elapsed());
        admission
    }

    /// The partition's device memory: both sides' keys sorted and merged,
    /// a range of pairs, and the columns gathered on the device.
    fn reserve_device_memory(
        &self,
        streamed_rows: usize,
        other_rows: usize,
        gather_bytes: usize,
    ) -> GpuResult<DeviceReservation> {
        let device = &self.device;
        let bytes = merge_join_device_bytes(
            streamed_rows,
            other_rows,
            self.max_output_pairs,
            device.sm_count(),
        ) + gather_bytes;
        let memory =
            device
                .budget()
                .reserve(bytes, self.memory_fraction, ReservationKind::Transient)?;
        self.metrics
            .device
            .device_memory_wait
            .add_duration(memory.waited());
        Ok(memory)
    }

    /// The sorted sides' row ids, each where the host needs it: it maps
    /// output positions to input rows by the sorted order, unless the
    /// device gathers every output row (it reads the sorted row ids
    /// there), and a full join's unmatched rows of the other side.
    #[allow(clippy::type_complexity)]
    fn row_orders(
        &self,
        stream: &Arc<DeviceStream>,
        (streamed, streamed_wanted): (&SortedSide, bool),
        (other, other_wanted): (&SortedSide, bool),
        timer: &mut PhaseTimer,
    ) -> std::result::Result<(Option<Vec<u64>>, Option<Vec<u64>>), DeviceFailure> {
        let device = &self.device;
        let order = |side: &SortedSide, timer: &mut PhaseTimer| {
            let ids = side.download_row_ids(device, stream, timer)?;
            check_device_ids(&ids, side.keys.len(), "a sorted side").map_err(DeviceFailure::Host)?;
            Ok::<_, DeviceFailure>(ids)
        };
        let streamed_order = streamed_wanted.then(|| order(streamed, timer)).transpose()?;
        let other_order = other_wanted.then(|| order(other, timer)).transpose()?;
        Ok((streamed_order, other_order))
    }

    /// One range of matching pairs (positions in the streamed side's
    /// sorted order, the other side's row ids) as output rows, with the
    /// join's filter applied.
    fn pair_rows(
        &self,
        walk: &mut StreamedWalk,
        (left, right): (&ArrivedBatches, &ArrivedBatches),
        positions: &[u64],
        other_ids: Vec<u64>,
    ) -> Result<OutputRows> {
        let _ordering = self.metrics.emit_time.timer();
        let (streamed_side, other_side) = match streams_left(self.plan.join_type) {
            true => (left, right),
            false => (right, left),
        };
        check_device_ids(positions, streamed_side.num_rows(), "the streamed side")?;
        check_device_ids(&other_ids, other_side.num_rows(), "the other side")?;
        let other_ids = UInt64Array::from(other_ids);
        let keep = match &self.plan.filter {
            Some(filter) => {
                let streamed_ids: UInt64Array = positions
                    .iter()
                    .map(|&p| walk.input_row(p as usize))
                    .collect();
                let (left_ids, right_ids) = match streams_left(self.plan.join_type) {
                    true => (&streamed_ids, &other_ids),
                    false => (&other_ids, &streamed_ids),
                };
                Some(evaluate_filter(filter, left, right, left_ids, right_ids)?)
            }
            None => None,
        };
        Ok(walk.pairs(positions, other_ids.values(), keep.as_ref()))
    }

    /// Both sides' keys copied to the device and sorted there, and the
    /// gathered columns copied behind them: the streamed side's keys first,
    /// the other side's and the columns on the copy stream, so that the
    /// host stages them and the bus carries them while the device sorts
    /// what came before.
    #[allow(clippy::too_many_arguments)]
    fn sort_sides(
        &self,
        (stream, copy_stream): (&Arc<DeviceStream>, &Arc<DeviceStream>),
        (left, right): (&ArrivedBatches, &ArrivedBatches),
        coding: KeyCoding,
        (streamed_codes, sort_streamed): (SideKeys, bool),
        (other_codes, sort_other): (SideKeys, bool),
        gathered_columns: Option<(Vec<bool>, Vec<bool>, usize)>,
        timer: &mut PhaseTimer,
    ) -> std::result::Result<SortedSides, DeviceFailure> {
        let device = &self.device;
        let aggregate = self.plan.aggregate.as_deref();
        let streamed = SortedSide::upload_unsorted(
            device,
            stream,
            stream,
            &streamed_codes.pieces(),
            timer,
        )?;
        drop(streamed_codes);
        // The other side's keys cross the bus behind the streamed side's
        // (which then arrive first, and their sort starts first), on the
        // copy stream. Keys in pinned memory are enqueued at once, and the
        // bus does not wait for the host to read the streamed side's range;
        // keys the host stages (which holds this thread) wait until the
        // streamed side's sort is enqueued, so that the device sorts while
        // the host stages them.
        let streamed_copied = stream
            .record_event(None)
            .during("recording the streamed keys' copy")?;
        copy_stream
            .wait(&streamed_copied)
            .during("ordering the other keys' copy after the streamed keys'")?;
        let upload_other = |timer: &mut PhaseTimer| -> GpuResult<(SortedSide, DeviceEvent)> {
            let other = SortedSide::upload_unsorted(
                device,
                stream,
                copy_stream,
                &other_codes.pieces(),
                timer,
            )?;
            let copied = copy_stream
                .record_event(None)
                .during("recording the other keys' copy")?;
            Ok((other, copied))
        };
        let early_other = match other_codes.in_pinned_memory() {
            true => Some(upload_other(timer)?),
            false => None,
        };
        // The gathered columns follow on the copy stream, under the same
        // rule: at once where they and the other keys are in pinned memory,
        // else once both sorts are enqueued.
        let column_bytes = gathered_columns
            .as_ref()
            .map(|(wanted_left, wanted_right, _)| {
                (
                    ColumnBytes::of(left, wanted_left),
                    ColumnBytes::of(right, wanted_right),
                )
            });
        let upload_columns = |timer: &mut PhaseTimer| -> GpuResult<_> {
            Ok(match &column_bytes {
                Some((left_bytes, right_bytes)) => Some((
                    ResidentColumns::upload_bytes(device, copy_stream, left_bytes, timer)?,
                    ResidentColumns::upload_bytes(device, copy_stream, right_bytes, timer)?,
                )),
                None => None,
            })
        };
        let columns_pinned = column_bytes
            .as_ref()
            .is_some_and(|(l, r)| l.in_pinned_memory() && r.in_pinned_memory());
        let early_columns = match early_other.is_some() && columns_pinned {
            true => Some(upload_columns(timer)?),
            false => None,
        };
        let (mut streamed, streamed_coding) =
            self.sort_streamed(stream, streamed, coding, sort_streamed, timer)?;
        let (other, other_copied) = match early_other {
            Some(uploaded) => uploaded,
            None => upload_other(timer)?,
        };
        drop(other_codes);
        let (bits, transform) = match (coding, streamed_coding) {
            (_, Some(streamed_coding)) => self.rebase_on_both_ranges(
                stream,
                (&mut streamed, streamed_coding),
                (&other, &other_copied),
                timer,
            )?,
            (KeyCoding::Known { bits, transform }, None) => (bits, transform),
            (KeyCoding::RangeOnDevice { .. }, None) => {
                return Err(DeviceFailure::Host(DataFusionError::Internal(
                    "a key range on the device without the streamed side's".into(),
                )))
            }
        };
        // The other side's sort goes onto the stream while the gathered
        // columns are copied on the other.
        let other = other.sort(device, stream, transform, bits, !sort_other, timer)?;
        let device_columns = match early_columns {
            Some(columns) => columns,
            None => upload_columns(timer)?,
        }
        .filter(|(l, r)| l.any() || r.any() || aggregate.is_some());
        Ok(SortedSides {
            streamed,
            other,
            device_columns,
        })
    }

    /// The streamed side sorted while the other side's keys cross the
    /// bus: with the coding known, or, where the device finds the range,
    /// with its own range's coding (returned: the flip, its range and its
    /// transform), rebased once the other side's is in.
    #[allow(clippy::type_complexity)]
    fn sort_streamed(
        &self,
        stream: &Arc<DeviceStream>,
        streamed: SortedSide,
        coding: KeyCoding,
        sort_streamed: bool,
        timer: &mut PhaseTimer,
    ) -> std::result::Result<(SortedSide, Option<StreamedCoding>), DeviceFailure> {
        let device = &self.device;
        let partition = self.partition;
        Ok(match coding {
            KeyCoding::Known { bits, transform } => (
                streamed.sort(device, stream, transform, bits, !sort_streamed, timer)?,
                None,
            ),
            KeyCoding::RangeOnDevice { flip } => {
                let range = device_key_range(device, &streamed, stream, flip, timer)?;
                trace::event(|| {
                    format!("sort-merge join p{partition}: streamed keys copied, their range found")
                });
                let (bits, transform) = self.coding_for_range(range)?;
                let sorted = streamed.sort(
                    device,
                    stream,
                    Some(transform),
                    bits,
                    !sort_streamed,
                    timer,
                )?;
                (
                    sorted,
                    Some(StreamedCoding {
                        flip,
                        range,
                        transform,
                    }),
                )
            }
        })
    }

    /// Both sides' coding from the union of their ranges, the other side's
    /// found on the stream once its keys' copy is done (the columns may
    /// follow them on the copy stream), behind the streamed side's sort;
    /// the streamed side's codes rebased onto it.
    fn rebase_on_both_ranges(
        &self,
        stream: &Arc<DeviceStream>,
        (streamed, streamed_coding): (&mut SortedSide, StreamedCoding),
        (other, other_copied): (&SortedSide, &DeviceEvent),
        timer: &mut PhaseTimer,
    ) -> std::result::Result<(u32, Option<CodeTransform>), DeviceFailure> {
        let device = &self.device;
        let partition = self.partition;
        stream
            .wait(other_copied)
            .during("ordering the other keys' range after their copy")?;
        let other_range = device_key_range(device, other, stream, streamed_coding.flip, timer)?;
        trace::event(|| {
            format!("sort-merge join p{partition}: other keys copied, their range found")
        });
        let (bits, transform) =
            self.coding_for_range(union_of_ranges(streamed_coding.range, other_range))?;
        streamed.rebase_codes(device, stream, streamed_coding.transform, transform, timer)?;
        self.metrics.key_ranges_on_device.add(1);
        Ok((bits, Some(transform)))
    }

    /// The columns the device gathers by pair, per side (with the bytes
    /// they take there), and the device memory the gathering needs beside
    /// the merge: only the columns the output uses go to the device (all
    /// of them unless a projection was absorbed; with an aggregation, those
    /// it reduces), and only where one of them can be gathered there:
    /// otherwise nothing is reserved for them. An aggregation's pairs stay
    /// on the device even so: a `COUNT(*)` reads no column.
    fn gathered_columns(
        &self,
        left: &ArrivedBatches,
        right: &ArrivedBatches,
    ) -> (Option<GatheredColumns>, usize) {
        let plan = &self.plan;
        let aggregate = plan.aggregate.as_deref();
        let gathered_columns = gathers_by_pair(plan.join_type, plan.filter.is_some())
            .then(|| output_columns(&plan.output, left.num_columns(), right.num_columns()))
            .flatten()
            .map(|(wanted_left, wanted_right)| match aggregate {
                Some(aggregate) => {
                    aggregate.columns_read(plan.output.sources(), wanted_left, wanted_right)
                }
                None => (wanted_left, wanted_right),
            })
            .map(|(wanted_left, wanted_right)| {
                let resident = ResidentColumns::device_bytes(left, &wanted_left)
                    + ResidentColumns::device_bytes(right, &wanted_right);
                (wanted_left, wanted_right, resident)
            })
            .filter(|&(_, _, resident)| resident > 0 || aggregate.is_some());
        let gather_bytes = match &gathered_columns {
            Some((wanted_left, wanted_right, resident)) => {
                // The columns, the left row ids and one buffer of the
                // widest column's values, per pair.
                resident
                    + (8 + ResidentColumns::widest(left, wanted_left)
                        .max(ResidentColumns::widest(right, wanted_right)))
                        * self.max_output_pairs
            }
            None => 0,
        };
        (gathered_columns, gather_bytes)
    }

    /// The bits and device transform of the codes of one raw key column
    /// whose values span `range` (`max < min`: none).
    fn coding_for_range(
        &self,
        range: (i128, i128),
    ) -> std::result::Result<(u32, CodeTransform), DeviceFailure> {
        let plan = &self.plan;
        OrderedKeyEncoder::for_value_range(
            &plan.key_types,
            &plan.sort_options,
            plan.null_equality,
            range,
        )
        .and_then(|encoder| Some((encoder.bits(), encoder.device_transform(&plan.key_types)?)))
        .ok_or_else(|| {
            DeviceFailure::Host(DataFusionError::Internal(format!(
                "no device coding for a {:?} key",
                plan.key_types
            )))
        })
    }
}

/// The streamed side's own coding, where the device found its range.
#[derive(Clone, Copy)]
struct StreamedCoding {
    /// Words XORed with it compare as the values do.
    flip: u64,
    range: (i128, i128),
    transform: CodeTransform,
}
