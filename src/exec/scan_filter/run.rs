//! One partition of the node: each of its parts' columns from the cache
//! (read, coded, copied and cached where missing), the program run over
//! the part, and the rows kept made into Arrow batches. Where the device
//! cannot take a part (a string column of too many distinct values that
//! the program cannot read as bytes, a 64-bit overflow, no device memory;
//! one it can is read again as bytes) before any row was kept (the first
//! part, or after parts that kept none: an empty byte range of a file),
//! DataFusion's chain runs the whole partition, streaming; a part after
//! rows were kept is filtered on the host by DataFusion's own expressions,
//! from its columns read again.

use std::sync::Arc;

use datafusion::arrow::array::{
    new_empty_array, new_null_array, Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions,
};
use datafusion::arrow::compute::{concat, filter_record_batch, prep_null_mask_filter};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;

use super::program::{
    coded_column, compile, string_column, word_column, FilterProgram, OutputKind, PartStrings,
};
use super::shape::ScanFilterShape;
use crate::config::GpuOptions;
use crate::exec::scan_aggregate::{
    holds_no_row_group, learn_uncodable, part_columns, scan_chunk, test_tables, uncodable_columns, Loaded, Part, Reading,
    TableSource,
};
use crate::exec::join_keys::{kept_by_join_keys, MAX_KEPT_SHARE, MAX_KEPT_SHARE_OF_STRINGS};
use crate::exec::GpuScanMetrics;
use crate::gpu::launch::{FilterProgram as DeviceFilterProgram, RemapTable, RemapUploads, SharedWords};
use crate::gpu::{CachedColumn, GpuDevice, PhaseTimer};
use crate::ops::scan_filter::{filter_chunk, FilteredRows, OutputWords};
use crate::trace;

/// What a partition's run made: its batches, or why DataFusion must.
pub(crate) enum Ran {
    Batches(Vec<RecordBatch>),
    OnCpu(String),
}

type Reasoned<T> = std::result::Result<T, String>;

/// Runs partition `partition` of `shape` on the device.
pub(crate) async fn run(
    shape: Arc<ScanFilterShape>,
    program: Arc<FilterProgram>,
    remaps: Arc<RemapUploads>,
    partition: usize,
    context: Arc<TaskContext>,
    metrics: GpuScanMetrics,
) -> Result<Ran> {
    let options = GpuOptions::from_config(context.session_config().options());
    let fail_on_device_errors =
        crate::config::device_error_policy(context.session_config().options()).fail;
    let device = match crate::exec::partition_device(partition, &options) {
        Ok(device) => device,
        Err(e) => return Ok(Ran::OnCpu(e.message().into_owned())),
    };
    metrics.device.ran_on(&device);
    let Some(parts) = shape.source.part_group(partition) else {
        return Err(DataFusionError::Internal(format!(
            "GpuScanFilterExec has no partition {partition}"
        )));
    };
    // Without a filter of its own, the node only pays where the join keys
    // drop most rows: with no set yet, or a set estimated to keep more
    // than the scan's limit of them (see `kept_limit`), DataFusion's scan
    // reads the partition.
    let mut program = program;
    if !shape.chain_filters {
        let kept = kept_by_join_keys(program.tests.iter().map(|test| &test.predicate));
        let Some(kept) = kept else {
            return Ok(Ran::OnCpu(
                "the join's build keys were not all read when the scan started".into(),
            ));
        };
        if kept > MAX_KEPT_SHARE && kept <= MAX_KEPT_SHARE_OF_STRINGS {
            // Where its string outputs turn out too varied to code (on the
            // partition's first part that holds rows: a byte range of a file
            // may hold no row group), they are kept as their bytes, and the
            // larger limit holds.
            let slots = string_output_slots(&program);
            let fields = shape.fields_of(&program.columns);
            for part in &parts {
                if learn_uncodable(&shape.source, part, &fields, &slots, &context, &metrics).await? {
                    break;
                }
            }
            if let Some(as_bytes) = with_uncodable_as_bytes(&shape, &program) {
                program = Arc::new(as_bytes);
            }
        }
        if kept > kept_limit(&shape, &program) {
            return Ok(Ran::OnCpu(format!(
                "the join's build keys would keep about {:.0} % of the rows",
                100.0 * kept
            )));
        }
    }
    let batch_size = context.session_config().batch_size().max(1);
    let mut batches = Vec::new();
    for part in parts {
        // A byte range of a file that no row group starts in: no row to
        // filter, so nothing to read, copy or launch for it, cached or not.
        if holds_no_row_group(&shape.source, &part, &context).await {
            trace::event(|| format!("scan filter of {}: no row group", part.describe()));
            continue;
        }
        trace::event(|| format!("scan filter of {}: partition {partition} reads it", part.describe()));
        let mut loaded = load_part(&shape, &program, &device, &part, &context, &options, &metrics).await?;
        trace::event(|| format!("scan filter of {}: its columns on the device", part.describe()));
        if let Loaded::Host(_) = &loaded {
            // A string column found too varied to code just now is kept as
            // its bytes from here on, where the program can read it so.
            if let Some(as_bytes) = with_uncodable_as_bytes(&shape, &program) {
                trace::event(|| format!("scan filter of {}: strings as bytes", part.describe()));
                program = Arc::new(as_bytes);
                loaded = load_part(&shape, &program, &device, &part, &context, &options, &metrics).await?;
            }
        }
        let reason = match loaded {
            // A part without rows (an empty partition of a table in
            // memory, a file of no row): no launch to set up and no task to
            // wait for.
            Loaded::Device(loaded) if holds_no_rows(&loaded) => {
                trace::event(|| format!("scan filter of {}: no rows", part.describe()));
                continue;
            }
            Loaded::Device(loaded) => {
                let (shape, device, program) = (Arc::clone(&shape), Arc::clone(&device), Arc::clone(&program));
                let remaps = Arc::clone(&remaps);
                let (metrics, memory_fraction) = (metrics.clone(), options.memory_fraction);
                let timer = metrics.baseline.elapsed_compute().clone();
                let filtered = SpawnedTask::spawn_blocking(move || {
                    let _timer = timer.timer();
                    filter_part(&shape, &device, &loaded, &program, &remaps, memory_fraction, &metrics)
                })
                .join()
                .await
                .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))?;
                trace::event(|| format!("scan filter of {}: filtered", part.describe()));
                match filtered {
                    Ok(Ok(batch)) => {
                        push_sliced(&mut batches, batch, batch_size);
                        continue;
                    }
                    Ok(Err(reason)) => reason,
                    Err(e) if fail_on_device_errors && !e.is_out_of_device_memory() => {
                        return Err(DataFusionError::Execution(e.to_string()))
                    }
                    Err(e) => format!("the device failed: {e}"),
                }
            }
            Loaded::Host(reason) => reason,
        };
        if batches.is_empty() {
            // No row kept yet: DataFusion's own chain takes the whole
            // partition, streaming, as it would have without this node (the
            // parts before this one kept nothing there either).
            return Ok(Ran::OnCpu(reason));
        }
        trace::event(|| format!("scan filter part on the host: {reason}"));
        metrics.fell_back(&reason);
        let batch = filter_on_host(&shape, &program, part, Arc::clone(&context), &metrics).await?;
        metrics.baseline.record_output(batch.num_rows());
        push_sliced(&mut batches, batch, batch_size);
    }
    Ok(Ran::Batches(batches))
}

/// Whether a part's resident columns are there and all hold no row.
fn holds_no_rows(loaded: &[Arc<CachedColumn>]) -> bool {
    !loaded.is_empty() && loaded.iter().all(|column| column.rows == 0)
}

/// `part`'s columns that `program` reads (see [`part_columns`]).
async fn load_part(
    shape: &ScanFilterShape,
    program: &FilterProgram,
    device: &Arc<GpuDevice>,
    part: &Part,
    context: &Arc<TaskContext>,
    options: &GpuOptions,
    metrics: &GpuScanMetrics,
) -> Result<Loaded> {
    let fields = shape.fields_of(&program.columns);
    let byte_slots = program.byte_slots();
    part_columns(
        &shape.source,
        fields,
        &byte_slots,
        device,
        part.clone(),
        Reading::InTurn,
        Arc::clone(context),
        options,
        metrics,
    )
    .await
}

/// `program` recompiled with the string columns it reads that parts of the
/// table were found too varied to code kept as their bytes, where there
/// are such columns not kept so yet and the device can read them so.
pub(super) fn with_uncodable_as_bytes(shape: &ScanFilterShape, program: &FilterProgram) -> Option<FilterProgram> {
    let uncodable = uncodable_columns(&shape.source, &shape.fields_of(&program.columns));
    let mut byte_columns = program.byte_columns.clone();
    let before = byte_columns.len();
    for slot in uncodable {
        if !byte_columns.contains(&program.columns[slot]) {
            byte_columns.push(program.columns[slot]);
        }
    }
    (byte_columns.len() > before)
        .then(|| compile(shape, &byte_columns).ok())
        .flatten()
}

/// The largest share of its rows that a scan that only tests join keys
/// may keep to read the device: [`MAX_KEPT_SHARE`], or
/// [`MAX_KEPT_SHARE_OF_STRINGS`] for a scan of files that outputs strings
/// kept as their bytes.
pub(super) fn kept_limit(shape: &ScanFilterShape, program: &FilterProgram) -> f64 {
    let strings = program.outputs.iter().any(|(_, kind)| matches!(kind, OutputKind::Bytes { .. }));
    match strings && matches!(shape.source, TableSource::Parquet { .. }) {
        true => MAX_KEPT_SHARE_OF_STRINGS,
        false => MAX_KEPT_SHARE,
    }
}

/// The slots (in the program's columns) of the string columns it outputs
/// as codes, each once (a column may be output twice).
fn string_output_slots(program: &FilterProgram) -> Vec<usize> {
    let mut slots: Vec<usize> = program
        .outputs
        .iter()
        .filter_map(|(_, kind)| match kind {
            OutputKind::Code { column, .. } => program.columns.iter().position(|c| c == column),
            _ => None,
        })
        .collect();
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// `batch` in slices of at most `batch_size` rows, pushed to `batches`.
fn push_sliced(batches: &mut Vec<RecordBatch>, batch: RecordBatch, batch_size: usize) {
    let mut offset = 0;
    while offset < batch.num_rows() {
        let rows = batch_size.min(batch.num_rows() - offset);
        batches.push(batch.slice(offset, rows));
        offset += rows;
    }
}

/// One part's rows filtered and projected on the host by DataFusion's own
/// expressions, as DataFusion's filter and projections would: the
/// program's columns read again (the cache fill keeps none).
async fn filter_on_host(
    shape: &Arc<ScanFilterShape>,
    program: &FilterProgram,
    part: Part,
    context: Arc<TaskContext>,
    metrics: &GpuScanMetrics,
) -> Result<RecordBatch> {
    let table_columns: Vec<usize> = program
        .columns
        .iter()
        .map(|&column| shape.scan_columns[column].table_index)
        .collect();
    let reading = std::time::Instant::now();
    let by_slot: Vec<Vec<ArrayRef>> = part.read(&shape.source, &table_columns, context).await?;
    metrics.read_time.add_duration(reading.elapsed());
    let shape = Arc::clone(shape);
    let columns = program.columns.clone();
    let timer = metrics.baseline.elapsed_compute().clone();
    SpawnedTask::spawn_blocking(move || {
        let _timer = timer.timer();
        evaluate_on_host(&shape, &columns, by_slot)
    })
    .join()
    .await
    .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))?
}

/// The shape's filter and outputs over the scan's columns `columns` (the
/// others are not read by them).
fn evaluate_on_host(
    shape: &ScanFilterShape,
    columns: &[usize],
    by_slot: Vec<Vec<ArrayRef>>,
) -> Result<RecordBatch> {
    let mut arrays: Vec<Option<ArrayRef>> = vec![None; shape.scan_schema.fields().len()];
    for (&column, pieces) in columns.iter().zip(by_slot) {
        let field = shape.scan_schema.field(column);
        let array = match pieces.len() {
            0 => new_empty_array(field.data_type()),
            1 => Arc::clone(&pieces[0]),
            _ => concat(&pieces.iter().map(|a| a.as_ref()).collect::<Vec<_>>())?,
        };
        arrays[column] = Some(array);
    }
    let rows = arrays.iter().flatten().map(|a| a.len()).next().unwrap_or(0);
    // Columns the expressions do not read are NULL: every field nullable.
    let fields: Vec<Field> = shape
        .scan_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let arrays: Vec<ArrayRef> = arrays
        .into_iter()
        .zip(&fields)
        .map(|(array, field)| array.unwrap_or_else(|| new_null_array(field.data_type(), rows)))
        .collect();
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    let batch = RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), arrays, &options)?;
    let mask = shape.predicate.evaluate(&batch)?.into_array(rows)?;
    let mask = mask
        .as_boolean_opt()
        .ok_or_else(|| DataFusionError::Internal("a filter that is not a boolean".into()))?;
    let mask = match mask.null_count() {
        0 => mask.clone(),
        _ => prep_null_mask_filter(mask),
    };
    let kept = filter_record_batch(&batch, &mask)?;
    let outputs = shape
        .outputs
        .iter()
        .map(|expr| expr.evaluate(&kept).and_then(|v| v.into_array(kept.num_rows())))
        .collect::<Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(kept.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(&shape.output_schema),
        outputs,
        &options,
    )?)
}

/// The program over one part's resident columns, and the rows kept as one
/// batch (a reason where they cannot be made; a device error as it is).
fn filter_part(
    shape: &ScanFilterShape,
    device: &Arc<GpuDevice>,
    loaded: &[Arc<CachedColumn>],
    program: &FilterProgram,
    remaps: &RemapUploads,
    memory_fraction: f64,
    metrics: &GpuScanMetrics,
) -> crate::gpu::GpuResult<Reasoned<RecordBatch>> {
    let rows = loaded.first().map_or(0, |c| c.rows);
    let started = std::time::Instant::now();
    if loaded.iter().any(|c| c.rows != rows) {
        return Ok(Err("a part's cached columns have different row counts".into()));
    }
    // Coded outputs first: each code to itself. Then the string predicates.
    let mut tables: Vec<SharedWords> =
        Vec::with_capacity(program.coded_outputs + program.tests.len());
    let mut dictionaries: Vec<Option<ArrayRef>> = Vec::with_capacity(program.outputs.len());
    for &(_, kind) in &program.outputs {
        let OutputKind::Code { column, .. } = kind else {
            dictionaries.push(None);
            continue;
        };
        let slot = program.columns.iter().position(|&c| c == column);
        let Some(dictionary) = slot.and_then(|slot| loaded[slot].dictionary.clone()) else {
            return Ok(Err("a coded output without its dictionary".into()));
        };
        tables.push(Arc::new((0..dictionary.len() as u32).collect::<Vec<u32>>()));
        dictionaries.push(Some(dictionary));
    }
    match test_tables(loaded, &program.columns, &program.tests, &shape.scan_schema) {
        Ok(tests) => tables.extend(tests),
        Err(reason) => return Ok(Err(reason)),
    }
    let remap = match shares_remap_tables(program) {
        true => RemapTable::new(tables),
        false => RemapTable::new(tables).with_tables_of_its_own(),
    };
    let chunk = scan_chunk(loaded, remap);
    let registers: Vec<u32> = program.outputs.iter().map(|&(r, _)| r).collect();
    let device_program = DeviceFilterProgram {
        instructions: &program.instructions,
        predicate: Some(program.predicate),
        outputs: &registers,
    };
    device.bind_to_thread()?;
    let stream = device.stream()?;
    let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
    // Strings kept as their bytes come back gathered for the kept rows,
    // from the chunk's column (the chunk's columns are the program's).
    let strings: Vec<Option<usize>> = program
        .outputs
        .iter()
        .map(|&(_, kind)| match kind {
            OutputKind::Bytes { column } => program.columns.iter().position(|&c| c == column),
            _ => None,
        })
        .collect();
    let filtered = filter_chunk(
        device,
        stream.stream(),
        &chunk,
        &device_program,
        &strings,
        Some(remaps),
        memory_fraction,
        &mut timer,
    )?;
    let filtered_at = started.elapsed();
    let times = timer.finish()?;
    metrics.device.record(&times);
    metrics.rows_scanned.add(rows);
    if filtered.overflowed {
        return Ok(Err("an integer or decimal value left 64 bits on the device".into()));
    }
    let batch = batch_of(shape, program, &filtered, &dictionaries);
    trace::event(|| {
        format!(
            "scan filter part of {rows} rows: {} kept, filtered in {:.2} ms (kernels {:.2} ms, copies down {:.2} ms), its batch made {:.2} ms in",
            filtered.rows,
            filtered_at.as_secs_f64() * 1e3,
            times.kernel.as_secs_f64() * 1e3,
            times.device_to_host.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3,
        )
    });
    if let Ok(batch) = &batch {
        metrics.baseline.record_output(batch.num_rows());
    }
    Ok(batch)
}

/// Whether every part's remap table holds the same tables: join key sets
/// and `LIKE` patterns only, no coded output's or string predicate's table
/// (made from each part's own dictionary). Where it does not, the parts
/// still share their large join key sets' copies on the device.
fn shares_remap_tables(program: &FilterProgram) -> bool {
    program.coded_outputs == 0
        && program
            .tests
            .iter()
            .all(|test| test.join_keys.is_some() || test.pattern.is_some())
}

/// The rows kept as a batch of the node's schema.
fn batch_of(
    shape: &ScanFilterShape,
    program: &FilterProgram,
    filtered: &FilteredRows,
    dictionaries: &[Option<ArrayRef>],
) -> Reasoned<RecordBatch> {
    let schema = Arc::clone(&shape.output_schema);
    let mut columns = Vec::with_capacity(program.outputs.len());
    for (o, ((_, kind), field)) in program.outputs.iter().zip(schema.fields()).enumerate() {
        let Some(words) = filtered.words_of(o) else {
            match filtered.rows {
                0 => columns.push(new_empty_array(field.data_type())),
                _ => return Err("an output the device did not bring back".into()),
            }
            continue;
        };
        let valid = filtered.valid_of(o);
        let column = match (kind, &dictionaries[o]) {
            (OutputKind::Code { .. }, Some(dictionary)) => coded_column(field, words, dictionary)?,
            (OutputKind::Word, _) => word_column(field, words, valid)?,
            (OutputKind::Bytes { .. }, _) => match filtered.outputs.get(o).and_then(|o| o.strings.as_ref()) {
                Some(Ok(kept)) => {
                    // Row i's string is the i-th gathered.
                    let strings = PartStrings {
                        offsets: kept.offsets.to_vec(),
                        bytes: kept.bytes.clone(),
                    };
                    let rows = OutputWords::Narrow((0..words.rows() as i32).collect());
                    string_column(field, &rows, valid, &strings)?
                }
                Some(Err(reason)) => return Err(reason.clone()),
                None => return Err("a string output without its strings".into()),
            },
            (OutputKind::Code { .. }, None) => return Err("a coded output without its dictionary".into()),
        };
        columns.push(column);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(filtered.rows));
    RecordBatch::try_new_with_options(schema, columns, &options).map_err(|e| e.to_string())
}
