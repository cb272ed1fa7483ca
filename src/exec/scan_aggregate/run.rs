//! One run of the node: each part's columns from the cache (read, coded,
//! copied and cached where missing), the group keys' dictionaries merged,
//! the program run over every part, and the partial states made. Anything
//! the device cannot do here comes back as a reason, and the node runs
//! DataFusion's plan instead.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use futures::StreamExt;

use crate::exec::GpuScanMetrics;
use super::shape::{ScanAggregateShape, TableSource};
use super::part_fill::{fill_apart, fill_as_made, groups_apart, ColumnBuilder, PartRead};
use super::row_groups::{batches_in_pieces, pieces_of, Slicing};
use super::shared_read::batches_read_in_turn;
use super::source::{is_uncodable, remember_uncodable, source_url, Part};
use crate::exec::runtime_workers;
use super::program::{code_test_table, CodeTest};
use super::states::{columns_read, compile, partial_states};
use crate::config::GpuOptions;
use crate::encode::string_bytes::StringBytesBuilder;
use crate::encode::string_codes::strings_array;
use crate::encode::table_words::{word_kind, HostWords, WordValues, WordsBuilder};
use crate::gpu::launch::{
    scan_aggregate, RemapTable, ScanChunk, ScanColumn, ScanProgram, SharedWords,
};
use crate::gpu::{
    upload_byte_pieces, upload_filled, upload_u64, CachedColumn, DriverResultExt, GpuDevice, GpuError, GpuResult, PhaseTimer,
    ReservationKind, WordKind,
};
use crate::trace;

/// What a run made: the partial states, or why DataFusion must.
pub(crate) enum Ran {
    Batch(RecordBatch),
    OnCpu(String),
}

type Reasoned<T> = std::result::Result<T, String>;

/// Runs `shape` on the device (see the module docs).
pub(crate) async fn run(
    shape: Arc<ScanAggregateShape>,
    context: Arc<TaskContext>,
    metrics: GpuScanMetrics,
) -> Result<Ran> {
    let options = GpuOptions::from_config(context.session_config().options());
    let fail_on_device_errors =
        crate::config::device_error_policy(context.session_config().options()).fail;
    let device = match crate::exec::partition_device(0, &options) {
        Ok(device) => device,
        Err(e) => return Ok(Ran::OnCpu(e.message().into_owned())),
    };
    metrics.device.ran_on(&device);
    let (columns, byte_columns) = match columns_read(&shape) {
        Ok(read) => read,
        Err(reason) => return Ok(Ran::OnCpu(reason)),
    };
    let byte_slots: Vec<usize> = (0..columns.len())
        .filter(|&slot| byte_columns.contains(&columns[slot]))
        .collect();
    trace::event(|| format!("scan aggregation: {} parts", shape.source.part_count()));
    let fields = shape.fields_of(&columns);
    let read = table_columns(&shape.source, fields, &byte_slots, &device, &context, &options, &metrics);
    let loaded = match read.await? {
        Ok(loaded) => loaded,
        Err(reason) => return Ok(Ran::OnCpu(reason)),
    };
    trace::event(|| "scan aggregation: columns resident".into());
    let schema = shape.output_schema.clone();
    let timer = metrics.baseline.elapsed_compute().clone();
    SpawnedTask::spawn_blocking(move || {
        let _timer = timer.timer();
        let read = (columns.as_slice(), byte_columns.as_slice());
        aggregate(&shape, &device, &loaded, read, &schema, &metrics, fail_on_device_errors)
    })
    .join()
    .await
    .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))?
}

/// Every part's columns `fields` of `source` on `device` ([`part_columns`],
/// those at `byte_slots` as their bytes), in the parts' order: a task a
/// part, as many at once as the runtime has threads, the next part taken
/// as one ends (parts of unequal rows: a byte range of a file holds whole
/// row groups).
/// `Err` names why a part's columns cannot all be on the device.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn table_columns(
    source: &TableSource,
    fields: Vec<(usize, Field)>,
    byte_slots: &[usize],
    device: &Arc<GpuDevice>,
    context: &Arc<TaskContext>,
    options: &GpuOptions,
    metrics: &GpuScanMetrics,
) -> Result<Reasoned<Vec<Vec<Arc<CachedColumn>>>>> {
    let parts: Vec<Part> = source.part_groups().into_iter().flatten().collect();
    let tasks = runtime_workers();
    trace::event(|| format!("scan: {} parts read by {tasks} tasks at most", parts.len()));
    let count = parts.len();
    let reads = futures::stream::iter(parts.into_iter().map(|part| {
        let (source, fields, byte_slots) = (source.clone(), fields.clone(), byte_slots.to_vec());
        let (device, context) = (Arc::clone(device), Arc::clone(context));
        let (options, metrics) = (options.clone(), metrics.clone());
        let task = SpawnedTask::spawn(async move {
            let reading = Reading::WithItsTable;
            part_columns(&source, fields, &byte_slots, &device, part, reading, context, &options, &metrics).await
        });
        task.join()
    }))
    .buffered(tasks);
    futures::pin_mut!(reads);
    let mut loaded = Vec::with_capacity(count);
    while let Some(read) = reads.next().await {
        let read = read.map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))?;
        match read? {
            Loaded::Device(columns) => loaded.push(columns),
            Loaded::Host(reason) => return Ok(Err(reason)),
        }
    }
    Ok(Ok(loaded))
}

/// A part's columns, as [`part_columns`] found them.
pub(crate) enum Loaded {
    /// Every column on the device.
    Device(Vec<Arc<CachedColumn>>),
    /// Not every one, and why (the caller reads the part again if it
    /// wants the rows on the host: the cache fill keeps no batch it has
    /// coded).
    Host(String),
}

/// The cache key of a string column kept as its bytes: another entry than
/// its codes'.
fn bytes_key(key: String) -> String {
    key + "|bytes"
}

/// One part's columns `fields` (table column index and field), from the
/// cache or read, coded and copied (and cached, with `gpu.cache`); those
/// at `byte_slots` (string columns) kept as their bytes rather than coded.
/// The missing columns are read a batch at a time, each batch coded while
/// it is fresh and then dropped, so a part is not held twice on the host
/// (but for pieces read ahead of their turn, see [`batches_in_pieces`]
/// and [`batches_read_in_turn`]).
/// A string column of more distinct values than the device codes is
/// remembered as such (see [`super::source::uncodable_columns`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn part_columns(
    source: &TableSource,
    fields: Vec<(usize, Field)>,
    byte_slots: &[usize],
    device: &Arc<GpuDevice>,
    part: Part,
    reading: Reading,
    context: Arc<TaskContext>,
    options: &GpuOptions,
    metrics: &GpuScanMetrics,
) -> Result<Loaded> {
    let url = source_url(source);
    let cache = device.column_cache();
    let keys: Vec<String> = fields
        .iter()
        .enumerate()
        .map(|(slot, (table_index, field))| {
            let key = part.column_key(&url, *table_index, field);
            match byte_slots.contains(&slot) {
                true => bytes_key(key),
                false => key,
            }
        })
        .collect();
    let cannot_be_words = |i: usize| {
        let field = &fields[i].1;
        format!("column {} ({}) cannot be kept on the device as words", field.name(), field.data_type())
    };
    // A string column this part was found to hold too many values of to
    // code: no need to wait for a fill of the part or to probe it again.
    let remembered = (0..fields.len()).find(|&i| {
        !byte_slots.contains(&i)
            && word_kind(fields[i].1.data_type()) == Some(WordKind::Code)
            && is_uncodable(&keys[i])
    });
    if let Some(i) = remembered {
        return Ok(Loaded::Host(cannot_be_words(i)));
    }
    let cached = |keys: &[String]| -> Vec<Option<Arc<CachedColumn>>> {
        keys.iter()
            .map(|key| options.cache.then(|| cache.get(key)).flatten())
            .collect()
    };
    let mut found = cached(&keys);
    trace::event(|| {
        let hits = found.iter().filter(|c| c.is_some()).count();
        format!("cache lookup of {}: {hits} of {} columns", part.describe(), keys.len())
    });
    // Where another task fills this part now (the fill ahead of the plan,
    // another scan or query), its columns are waited for and then found in
    // the cache.
    let _filling = match (options.cache, found.iter().any(Option::is_none)) {
        (true, true) => {
            let guard = super::fill_lock::fill_guard(&part.fill_key(&url), device.id()).await;
            found = cached(&keys);
            Some(guard)
        }
        _ => None,
    };
    let missing: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
    metrics.cache_hits.add(found.len() - missing.len());
    metrics.cache_misses.add(missing.len());
    if missing.is_empty() {
        return Ok(Loaded::Device(found.into_iter().flatten().collect()));
    }
    trace::event(|| format!("cache fill of {}: {} columns", part.describe(), missing.len()));
    // What each builder holds, known before it is made: a string column
    // kept as its bytes, a column of words, and whether those are codes of
    // strings.
    let as_bytes: Vec<bool> = missing.iter().map(|i| byte_slots.contains(i)).collect();
    let kinds: Vec<Option<WordKind>> = missing.iter().map(|&i| word_kind(fields[i].1.data_type())).collect();
    for (b, &i) in missing.iter().enumerate() {
        let refused = match as_bytes[b] {
            true => !StringBytesBuilder::accepts(fields[i].1.data_type()),
            false => kinds[b].is_none(),
        };
        if refused {
            return Ok(Loaded::Host(cannot_be_words(i)));
        }
    }
    let codes_strings: Vec<bool> = (0..missing.len())
        .map(|b| !as_bytes[b] && kinds[b] == Some(WordKind::Code))
        .collect();
    // Made by a blocking task, their time that of the pinned buffers they
    // take (see `fill_as_made`), while the part is probed and first read.
    let made = make_builders(
        missing.iter().map(|&i| fields[i].1.data_type().clone()).collect(),
        as_bytes.clone(),
        part.rows_hint(),
        device,
        metrics,
    );
    let coded: Vec<usize> = missing
        .iter()
        .copied()
        .filter(|i| !byte_slots.contains(i))
        .collect();
    if let Some(i) = too_varied_at_first(source, &part, &fields, &coded, &context, metrics).await? {
        remember_uncodable(&keys[i]);
        return Ok(Loaded::Host(cannot_be_words(i)));
    }
    let table_columns: Vec<usize> = missing.iter().map(|&i| fields[i].0).collect();
    trace::event(|| format!("cache fill of {}: probed", part.describe()));
    // The string columns coded (not kept as their bytes), read as
    // dictionaries where the file stores them as strings.
    let coded_strings: Vec<usize> = missing
        .iter()
        .zip(&codes_strings)
        .filter(|(_, &codes)| options.tuning.dictionary_reads && codes)
        .map(|(&i, _)| fields[i].0)
        .collect();
    let (min_rows, pieces_read) = (options.tuning.min_part_rows, &metrics.pieces_read);
    // Helpers are fill-ahead tasks: where none can run (the cache off, a
    // single-threaded runtime), a part read in turn is read whole.
    let in_turn_with_helpers =
        options.tuning.steal_pieces && options.cache && crate::exec::in_multi_threaded_runtime();
    let slicing = match reading {
        Reading::WithItsTable => Slicing::Every,
        Reading::InTurn if in_turn_with_helpers => Slicing::Alone,
        Reading::InTurn => Slicing::Never,
    };
    // A file part read whole by one task (no pieces of it to share out,
    // and `min_part_rows` not 0, which reads each part by one task) with
    // string columns: its columns read apart, side by side, where a
    // runtime of several threads runs the reads at once.
    let apart_allowed = options.tuning.read_columns_apart && min_rows > 0 && crate::exec::in_multi_threaded_runtime();
    // The part's pieces, asked of its footer once: here where the reads
    // apart hang on them, else below where the read does.
    let mut pieces_found = None;
    let apart = match (apart_allowed, &part) {
        (true, Part::File(..)) => match groups_apart(&holds_strings(&as_bytes, &codes_strings)) {
            Some(groups) => {
                let pieces = pieces_of(source, &part, &context, min_rows, slicing).await;
                let apart = pieces.is_none().then_some(groups);
                pieces_found = Some(pieces);
                apart
            }
            None => None,
        },
        _ => None,
    };
    let (builders, filled) = match apart {
        Some(groups) => {
            trace::event(|| format!("cache fill of {}: {} reads apart", part.describe(), groups.len()));
            let read = PartRead {
                source,
                part: &part,
                table_columns: &table_columns,
                coded_strings: &coded_strings,
                context: &context,
                metrics,
            };
            let (builders, filled) = fill_apart(read, made.await?, &groups).await?;
            if filled.refused.is_none() {
                metrics.parts_read_apart.add(1);
            }
            (builders, filled)
        }
        None => {
            let pieces = match (&reading, pieces_found) {
                (Reading::InTurn, _) if !in_turn_with_helpers => None,
                (_, Some(pieces)) => pieces,
                (_, None) => pieces_of(source, &part, &context, min_rows, slicing).await,
            };
            let batches = match reading {
                Reading::WithItsTable => {
                    batches_in_pieces(source, &part, pieces, &table_columns, &coded_strings, context, pieces_read)
                        .await?
                }
                Reading::InTurn if in_turn_with_helpers => {
                    batches_read_in_turn(source, &part, pieces, &table_columns, &coded_strings, context, pieces_read)
                        .await?
                }
                Reading::InTurn => part.batches(source, &table_columns, &coded_strings, context)?,
            };
            fill_as_made(batches, made, metrics).await?
        }
    };
    let (read_for, coded_for) = (filled.read, filled.coded);
    if let Some(b) = filled.refused {
        let i = missing[b];
        if codes_strings[b] {
            remember_uncodable(&keys[i]);
        }
        return Ok(Loaded::Host(cannot_be_words(i)));
    }
    trace::event(|| {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let (read, coded) = (ms(read_for), ms(coded_for));
        format!("cache fill of {}: read ({read:.1} ms) and coded ({coded:.1} ms)", part.describe())
    });
    let capacity = device.budget().limit_for(options.cache_memory_fraction);
    let (device, options, metrics) = (Arc::clone(device), options.clone(), metrics.clone());
    SpawnedTask::spawn_blocking(move || -> Loaded {
        let mut out = Vec::with_capacity(missing.len());
        for (i, builder) in missing.iter().copied().zip(builders) {
            let words = builder.finish();
            if out.is_empty() {
                metrics.rows_read.add(words.rows);
            }
            let keep_alive = part.keep_alive(fields[i].0);
            let uploading = std::time::Instant::now();
            let uploaded = upload(&device, words, keep_alive, options.memory_fraction, &metrics);
            metrics.upload_time.add_duration(uploading.elapsed());
            let column = match uploaded {
                Ok(column) => column,
                Err(e) => return Loaded::Host(e.to_string()),
            };
            let column = match options.cache {
                true => device.column_cache().insert(keys[i].clone(), column, capacity),
                false => Arc::new(column),
            };
            out.push((i, column));
        }
        trace::event(|| format!("cache fill of {}: copied", part.describe()));
        for (i, column) in out {
            found[i] = Some(column);
        }
        Loaded::Device(found.into_iter().flatten().collect())
    })
    .join()
    .await
    .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))
}

/// Whether each of a part's builders holds strings: kept as their bytes
/// (`as_bytes`) or coded (`codes_strings`).
fn holds_strings(as_bytes: &[bool], codes_strings: &[bool]) -> Vec<bool> {
    as_bytes.iter().zip(codes_strings).map(|(&bytes, &codes)| bytes || codes).collect()
}

/// The builders of a part's missing columns (of `data_types`, those
/// `as_bytes` marks kept as their bytes), made by a blocking task: a large
/// integer column's words go to page-locked memory the device's pool
/// lends, and locking new memory holds a thread for milliseconds a
/// buffer. The types were checked: a builder refused now is an error.
fn make_builders(
    data_types: Vec<DataType>,
    as_bytes: Vec<bool>,
    rows_hint: usize,
    device: &Arc<GpuDevice>,
    metrics: &GpuScanMetrics,
) -> impl std::future::Future<Output = Result<Vec<ColumnBuilder>>> {
    let (pool, taken) = (Arc::clone(device.pinned()), metrics.device.pinned_alloc_time.clone());
    let making = SpawnedTask::spawn_blocking(move || {
        let _taking = taken.timer();
        data_types
            .iter()
            .zip(as_bytes)
            .map(|(data_type, bytes)| match bytes {
                true => StringBytesBuilder::with_rows_hint(data_type, rows_hint).map(ColumnBuilder::Bytes),
                false => WordsBuilder::with_pinned_room(data_type, rows_hint, &pool).map(ColumnBuilder::Words),
            })
            .collect::<Option<Vec<ColumnBuilder>>>()
    });
    async move {
        making
            .join()
            .await
            .map_err(|e| DataFusionError::Execution(format!("a GPU scan task failed: {e}")))?
            .ok_or_else(|| DataFusionError::Internal("a part's column builder refused a checked type".into()))
    }
}

/// How a part the cache misses is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// With the rest of its table at once (a scan aggregation, a GPU
    /// aggregation over cached columns, `cache_table`): in pieces of whole
    /// row groups or slices of a large one, each by a task of its own
    /// (`gpu.tuning.min_part_rows`, see [`batches_in_pieces`]), so that the
    /// table's reading ends when the host's cores together are through it.
    WithItsTable,
    /// In turn with its partition's other parts, as a scan filter and the
    /// fill ahead of its plan read them: one task, batch by batch, each
    /// batch coded while fresh in the CPU's caches, but for the part's last
    /// pieces (of whole row groups, or slices of its one row group) that an
    /// idle task reads for it
    /// (`gpu.tuning.steal_pieces`, see [`batches_read_in_turn`]). Read in
    /// pieces from the start, a partition's parts progress together and
    /// all end late, and pieces decoded ahead are coded after they left the
    /// caches (traced on SF 10's q14, `BENCHMARKS.md`).
    InTurn,
}

/// Rows of a file part's string columns read first, alone, to find a
/// column with more distinct values than the device codes before every
/// column's first batch is read (and coded) for nothing: most such columns
/// (names, comments) show it within their first thousand or so rows.
const PROBE_ROWS: usize = 1 << 13;

/// The first [`PROBE_ROWS`] rows (or fewer) of the columns `table_columns`
/// of `part`, one array a column; `None` where the part has none.
async fn first_rows(
    source: &TableSource,
    part: &Part,
    table_columns: &[usize],
    context: &Arc<TaskContext>,
    metrics: &GpuScanMetrics,
) -> Result<Option<Vec<ArrayRef>>> {
    let reading = std::time::Instant::now();
    let mut batches = part.batches_of(source, table_columns, Arc::clone(context), PROBE_ROWS)?;
    let first = batches.next().await.transpose()?;
    drop(batches);
    metrics.read_time.add_duration(reading.elapsed());
    Ok(first)
}

/// The first of `missing` (indices into `fields`) that is a string column
/// of a file part with more distinct values in its first [`PROBE_ROWS`]
/// rows than the device codes; `None` where none is (or the part is a
/// `MemTable` partition, whose batches cost nothing to read again).
async fn too_varied_at_first(
    source: &TableSource,
    part: &Part,
    fields: &[(usize, Field)],
    missing: &[usize],
    context: &Arc<TaskContext>,
    metrics: &GpuScanMetrics,
) -> Result<Option<usize>> {
    let coded: Vec<usize> = missing
        .iter()
        .copied()
        .filter(|&i| word_kind(fields[i].1.data_type()) == Some(WordKind::Code))
        .collect();
    if coded.is_empty() || matches!(part, Part::Memory(_)) {
        return Ok(None);
    }
    let table_columns: Vec<usize> = coded.iter().map(|&i| fields[i].0).collect();
    let Some(first) = first_rows(source, part, &table_columns, context, metrics).await? else {
        return Ok(None);
    };
    let encoding = std::time::Instant::now();
    let refused = coded.iter().zip(&first).find_map(|(&i, array)| {
        let mut builder = WordsBuilder::with_rows_hint(fields[i].1.data_type(), array.len())?;
        (!builder.push(array)).then_some(i)
    });
    metrics.encode_time.add_duration(encoding.elapsed());
    Ok(refused)
}

/// Reads the first [`PROBE_ROWS`] rows of the string columns `slots` of
/// `fields` in file part `part`, those not known already to be too varied
/// to code, and remembers each one that is (see [`remember_uncodable`]).
/// Returns `false` where the part holds no rows to learn from (a byte
/// range of a file that holds no row group), `true` otherwise (learned, or
/// nothing to learn).
pub(crate) async fn learn_uncodable(
    source: &TableSource,
    part: &Part,
    fields: &[(usize, Field)],
    slots: &[usize],
    context: &Arc<TaskContext>,
    metrics: &GpuScanMetrics,
) -> Result<bool> {
    let url = source_url(source);
    let keys: Vec<(usize, String)> = slots
        .iter()
        .filter(|&&i| word_kind(fields[i].1.data_type()) == Some(WordKind::Code))
        .map(|&i| (i, part.column_key(&url, fields[i].0, &fields[i].1)))
        .filter(|(_, key)| !is_uncodable(key))
        .collect();
    if keys.is_empty() || matches!(part, Part::Memory(_)) {
        return Ok(true);
    }
    let table_columns: Vec<usize> = keys.iter().map(|&(i, _)| fields[i].0).collect();
    let Some(first) = first_rows(source, part, &table_columns, context, metrics).await? else {
        return Ok(false);
    };
    for ((i, key), array) in keys.iter().zip(&first) {
        let codes = WordsBuilder::with_rows_hint(fields[*i].1.data_type(), array.len())
            .is_some_and(|mut builder| builder.push(array));
        if !codes {
            remember_uncodable(key);
        }
    }
    Ok(true)
}

/// `words` copied to the device, its memory reserved in the budget, and
/// the copy finished (so that any stream may read it).
fn upload(
    device: &Arc<GpuDevice>,
    words: HostWords,
    keep_alive: Vec<ArrayRef>,
    memory_fraction: f64,
    metrics: &GpuScanMetrics,
) -> GpuResult<CachedColumn> {
    let HostWords {
        rows,
        kind,
        values,
        validity,
        dictionary,
        bytes: string_bytes,
    } = words;
    let narrow = values.narrow();
    let value_bytes = values.bytes().len();
    let string_bytes = string_bytes.as_deref();
    let bytes = value_bytes.div_ceil(8).max(1) * 8
        + 8 * validity.as_ref().map_or(0, Vec::len)
        + string_bytes.map_or(0, |b| b.len().div_ceil(8).max(1) * 8);
    let reservation = device
        .budget()
        .reserve(bytes, memory_fraction, ReservationKind::Resident)?;
    device.bind_to_thread()?;
    let stream = device.stream()?;
    let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
    let values = match values {
        // Made in page-locked memory: copied from there.
        WordValues::Pinned(pinned) if value_bytes > 0 => {
            let (buffer, bytes) = (*pinned).into_buffer();
            upload_filled(stream.stream(), buffer, bytes, &mut timer)?
        }
        // One word at least: a part without rows still has a column.
        values => {
            let values: &[u8] = match value_bytes {
                0 => &[0; 8],
                _ => values.bytes(),
            };
            upload_byte_pieces(device, stream.stream(), &[values], &mut timer)?
        }
    };
    let validity = validity
        .as_ref()
        .filter(|v| !v.is_empty())
        .map(|v| upload_u64(device, stream.stream(), v, &mut timer))
        .transpose()?;
    // One word at least here too: the kernels take an address.
    let string_bytes = string_bytes
        .map(|b| -> GpuResult<_> {
            let padded: &[u8] = if b.is_empty() { &[0; 8] } else { b };
            Ok((upload_byte_pieces(device, stream.stream(), &[padded], &mut timer)?, b.len()))
        })
        .transpose()?;
    stream
        .stream()
        .synchronize()
        .during("waiting for a table column's copy to the device")?;
    metrics.device.record(&timer.finish()?);
    Ok(CachedColumn {
        rows,
        kind,
        narrow,
        values,
        validity,
        dictionary,
        bytes: string_bytes,
        keep_alive,
        reservation,
    })
}

/// The group keys' dictionaries merged over the parts: each key's values
/// in global code order, and per part and key, the global code of each of
/// its codes.
struct MergedKeys {
    dictionaries: Vec<ArrayRef>,
    /// Per part and key: the global code of each of the part's codes.
    tables: Vec<Vec<Vec<u32>>>,
}

fn merge_keys(
    loaded: &[Vec<Arc<CachedColumn>>],
    key_slots: &[usize],
    key_types: &[DataType],
) -> Reasoned<MergedKeys> {
    let mut globals: Vec<(Vec<String>, HashMap<String, u32>)> =
        vec![(Vec::new(), HashMap::new()); key_slots.len()];
    let mut part_tables = Vec::with_capacity(loaded.len());
    for part in loaded {
        let mut tables: Vec<Vec<u32>> = Vec::with_capacity(key_slots.len());
        for (key, &slot) in key_slots.iter().enumerate() {
            let column = &part[slot];
            let dictionary = column
                .dictionary
                .as_ref()
                .ok_or("a group key column without its dictionary")?;
            let (values, by_value) = &mut globals[key];
            let mut table = Vec::with_capacity(dictionary.len());
            for value in string_values(dictionary)? {
                let next = values.len() as u32;
                let code = *by_value.entry(value.to_owned()).or_insert_with(|| {
                    values.push(value.to_owned());
                    next
                });
                table.push(code);
            }
            tables.push(table);
        }
        part_tables.push(tables);
    }
    let dictionaries = globals
        .iter()
        .zip(key_types)
        .map(|((values, _), data_type)| strings_array(values, data_type))
        .collect();
    Ok(MergedKeys {
        dictionaries,
        tables: part_tables,
    })
}

/// Each code test's table for one part (its loaded columns, by slot of
/// `columns`).
pub(crate) fn test_tables(
    part: &[Arc<CachedColumn>],
    columns: &[usize],
    tests: &[CodeTest],
    scan_schema: &Schema,
) -> Reasoned<Vec<SharedWords>> {
    tests
        .iter()
        .map(|test| -> Reasoned<SharedWords> {
            if let Some(pattern) = &test.pattern {
                return Ok(Arc::clone(pattern) as SharedWords);
            }
            if let Some(keys) = &test.join_keys {
                // The set's own words, shared by every part; no set yet: an
                // empty table, which every row passes.
                return Ok(match keys.keys() {
                    Some(bitmap) => bitmap,
                    None => Arc::new(Vec::<u32>::new()),
                });
            }
            let slot = columns
                .iter()
                .position(|&c| c == test.column)
                .ok_or("a string predicate's column the program does not read")?;
            let dictionary = part[slot]
                .dictionary
                .as_ref()
                .ok_or("a string predicate's column without its dictionary")?;
            Ok(Arc::new(code_test_table(test, scan_schema.field(test.column), dictionary)?))
        })
        .collect()
}

/// A part's resident columns as the kernels' chunk, with its remap table.
pub(crate) fn scan_chunk(part: &[Arc<CachedColumn>], remap: RemapTable) -> ScanChunk<'_> {
    ScanChunk {
        rows: part.first().map_or(0, |c| c.rows),
        columns: part
            .iter()
            .map(|c| ScanColumn {
                values: &c.values,
                validity: c.validity.as_ref(),
                narrow: c.narrow,
                bytes: c.bytes.as_ref().map(|(bytes, count)| (bytes, *count)),
            })
            .collect(),
        remap,
    }
}

fn string_values(array: &ArrayRef) -> Reasoned<Vec<&str>> {
    let values: Vec<Option<&str>> = match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().collect(),
        DataType::Utf8View => array.as_string_view().iter().collect(),
        other => return Err(format!("a dictionary of {other}")),
    };
    Ok(values.into_iter().map(Option::unwrap_or_default).collect())
}

/// The program over every part's resident columns (`columns`, those of
/// `byte_columns` as string bytes), and the partial states.
fn aggregate(
    shape: &ScanAggregateShape,
    device: &Arc<GpuDevice>,
    loaded: &[Vec<Arc<CachedColumn>>],
    (columns, byte_columns): (&[usize], &[usize]),
    schema: &datafusion::arrow::datatypes::SchemaRef,
    metrics: &GpuScanMetrics,
    fail_on_device_errors: bool,
) -> Result<Ran> {
    let key_slots: Vec<usize> = shape
        .group_columns
        .iter()
        .map(|c| columns.iter().position(|x| x == c).unwrap_or(usize::MAX))
        .collect();
    if key_slots.contains(&usize::MAX) {
        return Ok(Ran::OnCpu("a group key the program does not read".into()));
    }
    let key_types: Vec<DataType> = shape
        .group_columns
        .iter()
        .map(|&c| shape.scan_schema.field(c).data_type().clone())
        .collect();
    let merged = match merge_keys(loaded, &key_slots, &key_types) {
        Ok(merged) => merged,
        Err(reason) => return Ok(Ran::OnCpu(reason)),
    };
    let cardinalities: Vec<usize> = merged.dictionaries.iter().map(|d| d.len()).collect();
    let program = match compile(shape, &cardinalities, byte_columns) {
        Ok(program) => program,
        Err(reason) => return Ok(Ran::OnCpu(reason)),
    };
    if program.columns != columns {
        return Err(DataFusionError::Internal(
            "the device program reads other columns than it was planned to".into(),
        ));
    }
    let mut remaps = Vec::with_capacity(loaded.len());
    for (part, merged_tables) in loaded.iter().zip(merged.tables) {
        let mut tables: Vec<SharedWords> = merged_tables
            .into_iter()
            .map(|table| -> SharedWords { Arc::new(table) })
            .collect();
        match test_tables(part, &program.columns, &program.tests, &shape.scan_schema) {
            Ok(tests) => tables.extend(tests),
            Err(reason) => return Ok(Ran::OnCpu(reason)),
        }
        remaps.push(RemapTable::new(tables));
    }
    let output = match run_program(device, loaded, &remaps, &program, metrics) {
        Ok(output) => output,
        Err(e) if fail_on_device_errors && !e.is_out_of_device_memory() => {
            return Err(DataFusionError::Execution(e.to_string()))
        }
        Err(e) => return Ok(Ran::OnCpu(format!("the device failed: {e}"))),
    };
    if output.overflowed {
        return Ok(Ran::OnCpu(
            "an integer or decimal value left 64 bits on the device".into(),
        ));
    }
    let states = partial_states(
        &program,
        &output.words,
        &cardinalities,
        &merged.dictionaries,
        schema,
    )?;
    Ok(match states {
        Ok(batch) => {
            metrics.baseline.record_output(batch.num_rows());
            Ran::Batch(batch)
        }
        Err(reason) => Ran::OnCpu(reason),
    })
}

fn run_program(
    device: &Arc<GpuDevice>,
    loaded: &[Vec<Arc<CachedColumn>>],
    remaps: &[RemapTable],
    program: &super::states::DeviceProgram,
    metrics: &GpuScanMetrics,
) -> GpuResult<crate::gpu::launch::ScanAggregateOutput> {
    device.bind_to_thread()?;
    let stream = device.stream()?;
    let mut timer = PhaseTimer::new(Arc::clone(stream.stream()));
    let chunks: Vec<ScanChunk<'_>> = loaded
        .iter()
        .zip(remaps)
        .map(|(part, remap)| scan_chunk(part, remap.clone()))
        .collect();
    if chunks
        .iter()
        .zip(loaded)
        .any(|(chunk, part)| part.iter().any(|c| c.rows != chunk.rows))
    {
        return Err(GpuError::Invalid(
            "a part's cached columns have different row counts".into(),
        ));
    }
    let scan_program = ScanProgram {
        instructions: &program.instructions,
        predicate: program.predicate,
        group: program.group,
        groups: program.groups,
        accumulators: &program.accumulators,
    };
    let output = scan_aggregate(device, &device.launcher(stream.stream()), &chunks, &scan_program, &mut timer)?;
    metrics.rows_scanned.add(chunks.iter().map(|c| c.rows).sum());
    metrics.device.record(&timer.finish()?);
    Ok(output)
}
