//! A GPU aggregation over a whole table scan reads the table's columns from
//! the device column cache where they lie ([`CachedInput`]): no rows are
//! decoded, made words or copied over the bus on a warm run, and a cold run
//! fills the cache as a GPU scan would. The group key and every argument
//! are laid out end to end on the device from the parts' cached words
//! ([`Words::on_device`]); a few thousand keys come back for the estimate
//! of the groups. Where a part's column cannot be read so (not in the
//! cache's words, NULLs, a device error), the node reads its input as
//! before, and `cached_input_refusals` says why.

use super::*;

use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::ExecutionPlanProperties;

use crate::encode::group_keys::GroupKeyKind;
use super::partition_aggregation::InputSource;
use super::super::spec::AggregateKind;
use crate::encode::table_words::word_kind;
use crate::encode::words::ValueKind;
use crate::exec::scan_aggregate::{
    coalesced_input, scan_fields, table_columns, table_scan_columns, table_source, ScanColumn,
    TableSource,
};
use crate::exec::GpuScanMetrics;
use crate::gpu::{CachedColumn, WordKind};
use crate::ops::group_by::{sample_device_words, DeviceWordPiece};

/// The table a GPU aggregation reads whole, and which of its columns the
/// aggregation reads: one integer group key and arguments that are columns
/// (integers, decimals, doubles) or literals.
#[derive(Debug, Clone)]
pub(crate) struct CachedInput {
    source: TableSource,
    scan_schema: SchemaRef,
    scan_columns: Vec<ScanColumn>,
    /// Scan columns read, each once; the group key's first.
    columns: Vec<usize>,
    key_type: DataType,
    /// Per aggregate, per argument: its slot in `columns` and value kind,
    /// `None` for a literal.
    args: Vec<Vec<Option<(usize, ValueKind)>>>,
    /// The table's rows, where known without reading it
    /// ([`TableSource::rows`]).
    rows: Option<usize>,
}

/// `agg` (of `spec`) reading its input from the column cache, or `None`
/// where it cannot: its input must be one partition of a table scan
/// (Parquet without a predicate, or a `MemTable`) through merges,
/// repartitions and batch coalescing, so that it reads every row of the
/// table once; one group key, a column of a signed integer-like type; no
/// FILTER, raw rows (not states), groups in no order; every argument a
/// column of a signed integer-like, decimal or `Float64` type (or an
/// integer column cast to `Int64`), or a literal (a count); `MIN` and `MAX`
/// of integer-like columns only.
pub(crate) fn cached_input(agg: &AggregateExec, spec: &AggregateSpec) -> Option<CachedInput> {
    let readable = readable_cached_input(agg, spec)?;
    let data_source = readable.scan.downcast_ref::<DataSourceExec>()?;
    let (source, scan_columns) = table_source(data_source).ok()??;
    let rows = source.rows(readable.scan.as_ref());
    Some(CachedInput {
        source,
        scan_schema: readable.scan.schema(),
        scan_columns,
        columns: readable.columns,
        key_type: readable.key_type,
        args: readable.args,
        rows,
    })
}

/// Whether `agg` (of `spec`) can read its input from the column cache
/// ([`cached_input`]), found without taking the table's source.
pub(crate) fn reads_cache_if_asked(agg: &AggregateExec, spec: &AggregateSpec) -> bool {
    readable_cached_input(agg, spec).is_some()
}

/// What [`cached_input`] finds of `agg` before it takes the table.
struct ReadableInput {
    scan: Arc<dyn ExecutionPlan>,
    columns: Vec<usize>,
    key_type: DataType,
    args: Vec<Vec<Option<(usize, ValueKind)>>>,
}

fn readable_cached_input(agg: &AggregateExec, spec: &AggregateSpec) -> Option<ReadableInput> {
    if spec.merges_states || agg.filter_expr().iter().any(Option::is_some) {
        return None;
    }
    let input = agg.input();
    if input.output_partitioning().partition_count() != 1 {
        return None;
    }
    let scan = whole_table_scan(input)?;
    if scan.schema().fields() != input.schema().fields() {
        return None;
    }
    let data_source = scan.downcast_ref::<DataSourceExec>()?;
    table_scan_columns(data_source).ok()??;
    let [(key, _)] = agg.group_expr().expr() else {
        return None;
    };
    let key = key.downcast_ref::<Column>()?.index();
    let key_type = input.schema().field(key).data_type().clone();
    if ValueKind::of(&key_type) != Some(ValueKind::Signed) || !cached_as_words(&key_type) {
        return None;
    }
    let mut columns = vec![key];
    let mut args = Vec::with_capacity(spec.aggregates.len());
    let arguments = agg.aggr_expr().iter().map(|a| a.expressions());
    for (aggregate, exprs) in spec.aggregates.iter().zip(arguments) {
        let mut slots = Vec::with_capacity(exprs.len());
        for expr in exprs {
            if expr.downcast_ref::<Literal>().is_some_and(|l| !l.value().is_null())
                && aggregate.kind == AggregateKind::Count
            {
                slots.push(None);
                continue;
            }
            let index = read_column(&expr, &input.schema())?;
            let schema = input.schema();
            let data_type = schema.field(index).data_type();
            let kind = ValueKind::of(data_type).filter(|_| cached_as_words(data_type))?;
            let readable = match aggregate.kind {
                AggregateKind::Min | AggregateKind::Max => kind == ValueKind::Signed,
                _ => kind != ValueKind::Unsigned,
            };
            if !readable {
                return None;
            }
            let slot = match columns.iter().position(|&c| c == index) {
                Some(slot) => slot,
                None => {
                    columns.push(index);
                    columns.len() - 1
                }
            };
            slots.push(Some((slot, kind)));
        }
        args.push(slots);
    }
    Some(ReadableInput {
        scan,
        columns,
        key_type,
        args,
    })
}

/// Whether the column cache keeps a column of `data_type` as one plain
/// word a row (integers, dates, timestamps, decimals, doubles; not times
/// or durations, which it does not keep).
fn cached_as_words(data_type: &DataType) -> bool {
    matches!(word_kind(data_type), Some(WordKind::I64 | WordKind::F64))
}

/// The column `expr` reads as it is: the column itself, or a CAST of an
/// integer-like column to `Int64` (as `SUM` of a narrower integer is
/// planned), whose value the column's cached word already is.
fn read_column(expr: &Arc<dyn PhysicalExpr>, schema: &Schema) -> Option<usize> {
    if let Some(column) = expr.downcast_ref::<Column>() {
        return Some(column.index());
    }
    let cast = expr.downcast_ref::<CastExpr>()?;
    let column = cast.expr().downcast_ref::<Column>()?;
    let from = schema.field(column.index()).data_type();
    let widens = cast.cast_type() == &DataType::Int64
        && matches!(from, DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64);
    widens.then(|| column.index())
}

/// The table scan below `input` where `input` hands on its every row once:
/// merges, repartitions and batch coalescing over a scan of a `MemTable`
/// or of Parquet files without a predicate (a dynamic filter would prune
/// what the cache hands over whole).
fn whole_table_scan(input: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let mut node = Arc::clone(input);
    loop {
        if node.fetch().is_some() {
            return None;
        }
        if let Some(merge) = node.downcast_ref::<CoalescePartitionsExec>() {
            node = Arc::clone(merge.input());
        } else if let Some(below) = coalesced_input(&node) {
            node = below;
        } else if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
            node = Arc::clone(repartition.input());
        } else if let Some(scan) = node.downcast_ref::<DataSourceExec>() {
            let predicate = scan
                .data_source()
                .downcast_ref::<FileScanConfig>()
                .and_then(|config| config.file_source().downcast_ref::<ParquetSource>())
                .and_then(|parquet| parquet.filter());
            return predicate.is_none().then_some(node);
        } else {
            return None;
        }
    }
}

impl CachedInput {
    /// Every part's columns on `device`, from the cache or read into it;
    /// `Err` names why a part cannot be read so.
    pub(super) async fn load(
        &self,
        device: &Arc<GpuDevice>,
        context: &Arc<TaskContext>,
        options: &GpuOptions,
        metrics: &GpuScanMetrics,
    ) -> Result<std::result::Result<Vec<Vec<Arc<CachedColumn>>>, String>> {
        let fields = scan_fields(&self.scan_columns, &self.scan_schema, &self.columns);
        table_columns(&self.source, fields, &[], device, context, options, metrics).await
    }

    /// Each read column's pieces, one per part; `Err` names a column the
    /// device cannot read as words here.
    fn pieces(
        &self,
        parts: &[Vec<Arc<CachedColumn>>],
    ) -> std::result::Result<Vec<Vec<DeviceWordPiece>>, String> {
        let mut pieces = vec![Vec::with_capacity(parts.len()); self.columns.len()];
        for part in parts {
            if part.len() != self.columns.len() {
                return Err("a part's cached columns differ from those asked for".into());
            }
            let rows = part.first().map_or(0, |column| column.rows);
            for (slot, column) in part.iter().enumerate() {
                let name = self.scan_schema.field(self.columns[slot]).name();
                let float = self.scan_schema.field(self.columns[slot]).data_type() == &DataType::Float64;
                let expected = if float { WordKind::F64 } else { WordKind::I64 };
                if column.kind != expected || column.bytes.is_some() || (float && column.narrow) {
                    return Err(format!("column {name} is not cached as plain words"));
                }
                if column.validity.is_some() {
                    return Err(format!("column {name} has NULLs"));
                }
                if column.rows != rows {
                    return Err("a part's cached columns differ in rows".into());
                }
                pieces[slot].push(DeviceWordPiece {
                    values: Arc::new(CachedValues(Arc::clone(column))),
                    rows,
                    narrow: column.narrow,
                    sign_only: false,
                });
            }
        }
        Ok(pieces)
    }
}

/// A cached column's words, held while the device reads them.
struct CachedValues(Arc<CachedColumn>);

impl AsRef<crate::gpu::DeviceVec<u64>> for CachedValues {
    fn as_ref(&self) -> &crate::gpu::DeviceVec<u64> {
        &self.0.values
    }
}

impl DeviceAggregation {
    /// The aggregation of the table's cached columns `parts` (per part, the
    /// columns `input` reads) on the device, its output batches: `Err` names
    /// why the rows must be read from the input instead (nothing has left
    /// the partition then).
    pub(super) fn aggregate_cached(
        &self,
        input: &CachedInput,
        parts: &[Vec<Arc<CachedColumn>>],
    ) -> Result<std::result::Result<Vec<RecordBatch>, String>> {
        let _timer = self.metrics.baseline.elapsed_compute().timer();
        let pieces = match input.pieces(parts) {
            Ok(pieces) => pieces,
            Err(reason) => return Ok(Err(reason)),
        };
        let keys = GroupKeyWords {
            words: Words::on_device(pieces[0].clone()),
            kind: GroupKeyKind::Own(input.key_type.clone()),
        };
        let rows = keys.words.len();
        if rows == 0 {
            return Ok(Err("the table has no rows".into()));
        }
        let mut work = DeviceWork::new(self.options.deterministic_float_sums);
        for (aggregate, args) in self.spec.aggregates.iter().zip(&input.args) {
            let args: Vec<_> = args
                .iter()
                .map(|arg| arg.map(|(slot, kind)| (pieces[slot].as_slice(), kind)))
                .collect();
            if let Err(reason) = work.add_on_device(aggregate, &args, true) {
                return Ok(Err(reason));
            }
        }
        let sample = match self.sample_cached_keys(&keys.words) {
            Ok(sample) => sample,
            Err(e) => return Ok(Err(format!("the device failed: {e}"))),
        };
        if self.sample_favours_cpu(InputSource::ColumnCache, rows, sample.0, sample.1) {
            return Ok(Err("a sample of the keys shows few groups".into()));
        }
        let ids = unordered_ids(sample, rows, self.options.tuning.min_groups_to_partition);
        let no_mapping = MappedAhead::none();
        let device_wall = self.metrics.device_wall_time.timer();
        let mut prepared = None;
        let emitted = self.on_device(
            Some(&keys.words),
            ids,
            rows,
            WorkToDo::Ready(work),
            || {},
            &mut prepared,
            GroupsBack::KeyWords,
            |grouped, work, keys_stream, timer| {
                let sources = KeySources {
                    keys: Some(&keys),
                    key_columns: &[],
                    batches: &[],
                };
                let reduced = || device_wall.done();
                let output =
                    self.emit(grouped, sources, work, keys_stream, &no_mapping, timer, reduced);
                // Counted once the output is made: a refused run's input is
                // aggregated again, and counted then.
                if matches!(output, Ok(Emitted::Batches(..))) {
                    self.count_grouping(ids, grouped);
                }
                output
            },
        );
        // As `outcome_of`, but a run that cannot finish here is a refusal,
        // not a fallback: the input is read and aggregated again.
        let emitted = match emitted {
            Ok(_) if self.device_errors.inject => Err(GpuError::Invalid(
                "a device error injected by the test options".into(),
            )),
            Ok(Ok(Emitted::DeviceFailed(e))) => Err(e),
            emitted => emitted,
        };
        Ok(match emitted {
            Ok(Ok(Emitted::Batches(groups, output))) => {
                self.metrics.groups.add(groups);
                self.metrics.input_rows.add(rows);
                Ok(output)
            }
            Ok(Ok(_)) => Err("the device could not bring the groups back".into()),
            Ok(Err(e)) => return Err(e),
            Err(GpuError::OutOfDeviceMemory { requested, limit, .. }) if requested > limit => {
                Err(format!("the device's work needs {requested} bytes, more than the budget's {limit}"))
            }
            Err(e) if self.device_errors.fail && !e.is_out_of_device_memory() => return Err(e.into()),
            Err(e) => Err(format!("the device failed: {e}")),
        })
    }

    /// Why the table's rows (as its statistics count them) are not read
    /// from the cache, where they are not: the device's work, however many
    /// groups there are and however they are numbered, could need more than
    /// the whole budget, so the cache is not filled for a run that would
    /// then read the input all the same (the node then aggregates its input
    /// in parts that fit, as any input too large for the device).
    pub(super) fn too_large_for_cached(&self, input: &CachedInput) -> Option<String> {
        let rows = input.rows?;
        let mut shape = DeviceWork::new(self.options.deterministic_float_sums);
        for (aggregate, args) in self.spec.aggregates.iter().zip(&input.args) {
            let args: Vec<_> = args.iter().map(|arg| arg.map(|(_, kind)| (&[][..], kind))).collect();
            shape.add_on_device(aggregate, &args, true).ok()?;
        }
        let bytes = |ids| group_by_device_bytes(rows, true, ids, &shape.inputs, 0, self.device.sm_count());
        let most = bytes(GroupIds::Hashed { expected_groups: None }).max(bytes(
            GroupIds::Partitioned { partition_bits: partition_bits_for_groups(rows) },
        ));
        let limit = self.device.budget().limit_for(self.options.memory_fraction);
        (most > limit).then(|| {
            format!("{rows} rows may need {most} bytes of device memory, more than the budget's {limit}")
        })
    }

    /// Sampled keys and the distinct keys among them.
    fn sample_cached_keys(&self, keys: &Words) -> GpuResult<(usize, usize)> {
        self.device.bind_to_thread()?;
        let stream = self.device.stream()?;
        let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
        let sampled = sample_device_words(&self.device, stream.stream(), keys, GROUP_SAMPLE_ROWS, &mut timer)?;
        self.metrics.device.record(&timer.finish()?);
        let distinct: std::collections::HashSet<u64> = sampled.iter().copied().collect();
        Ok((sampled.len(), distinct.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn only_columns_the_cache_keeps_as_plain_words_are_read_from_it() {
        for kept in [
            DataType::Int32,
            DataType::Int64,
            DataType::Date32,
            DataType::Timestamp(TimeUnit::Microsecond, None),
            DataType::Decimal128(15, 2),
            DataType::Float64,
        ] {
            assert!(cached_as_words(&kept), "{kept}");
        }
        // Signed integer-like to DataFusion, but not kept by the cache (a
        // node over them would be refused on every run), or kept as codes.
        for not_kept in [
            DataType::Time64(TimeUnit::Nanosecond),
            DataType::Duration(TimeUnit::Second),
            DataType::Utf8,
            DataType::Float32,
        ] {
            assert!(!cached_as_words(&not_kept), "{not_kept}");
        }
    }
}
