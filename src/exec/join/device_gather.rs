//! Output columns gathered on the device (seed 002's gather by row id).
//! Where every pair of a join is an output row (an inner join without a
//! residual filter), each fixed-width output column of 4, 8 or 16 bytes
//! without NULLs is copied to the device once, gathered there by the pairs'
//! row ids, and copied back whole, instead of being gathered row by row on
//! the host, where random reads from a large side cost about what the CPU
//! join itself does. Other columns (NULLs, booleans, other widths, variable
//! width) are taken on the host from the same pairs. A `Decimal128` column
//! whose values fit 64 bits (every decimal of up to 18 digits, TPC-H's
//! money) lies on the device as 8-byte words: narrowed on the host as it is
//! staged, gathered at 8 bytes, widened again as it comes down, so it
//! crosses the bus both ways and fills the device in half its bytes. An
//! 8-byte column (such a decimal too) whose values fit 32 bits goes up at
//! 4 bytes a value and is sign-extended on the device.
//!
//! Shared by the hash join and the sort-merge join; the two sides are called
//! build and probe as in [`OutputAssembler`] (the sort-merge join's left and
//! right).

use std::sync::Arc;

use crate::gpu::DeviceStream;
use datafusion::arrow::array::ArrayData;
use datafusion::arrow::array::{make_array, Array, ArrayRef, UInt64Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};

use crate::host::array_buffers::value_buffer;
use crate::exec::join::{compact_views, ColumnSource, OutputAssembler};
use crate::exec::join::pair_aggregate::PairReduction;
use crate::exec::join::row_source::RowSource;
use crate::gpu::launch::{
    CarriedSlot, FoldOp, GatheredValues, JoinFold, PairSide, ValueWidth, MAX_JOIN_FOLDS,
};
use crate::exec::join::device_rows::{DeviceRows, RowsShape};
use crate::gpu::{
    download_byte_pieces, download_u64, download_widened_pieces, download_word, in_pinned_memory,
    upload_byte_pieces, DeviceVec, DeviceView, DriverResultExt, GpuDevice, GpuError, GpuResult, Phase,
    PhaseTimer, StagingWindows,
};
use datafusion::arrow::array::RecordBatchOptions;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use crate::ops::gather;
use crate::ops::hash_join::{CarriedValues, FoldedPairs};

/// Whether a chunk's own columns are worth copying to the device to be
/// gathered there, given its first range of `pairs` pairs (`whole_chunk`:
/// all of them) out of `rows` rows. Copying costs the host a staging copy of
/// every row and the bus a copy of every row; gathering on the host costs a
/// take per pair, from a chunk read nearly in order. From about one pair per
/// two rows the copy is cheaper; below it (a selective join, such as
/// TPC-H's orders against a filtered lineitem, 1 % of whose rows match) the
/// host takes the few rows it needs. The build side's columns are on the
/// device already, for every chunk.
pub(crate) fn probe_side_pays(pairs: usize, whole_chunk: bool, rows: usize) -> bool {
    !whole_chunk || 2 * pairs >= rows
}

/// The width column `column` of `rows` is gathered on the device with, or
/// `None` where it is taken on the host: a fixed width a gather kernel
/// moves, and no NULLs in any piece. (A type with a primitive width is a
/// primitive array's, which holds its values in one buffer; asking each
/// piece for its `ArrayData` to check that clones its type and buffers, a
/// cost that adds up over the thousands of pieces of a large side.)
fn device_width(rows: &dyn RowSource, column: usize) -> Option<ValueWidth> {
    let width = ValueWidth::of_bytes(rows.data_type(column).primitive_width()?)?;
    rows.pieces(column)
        .iter()
        .all(|piece| piece.null_count() == 0)
        .then_some(width)
}

/// Whether column `column` of `rows` is tried at 8 bytes a value on the
/// device: a `Decimal128` one (16-byte integers, kept as 8-byte words where
/// every value fits; see [`StagingWindows::upload_decimals_narrowed`]).
fn narrowable(rows: &dyn RowSource, column: usize, width: ValueWidth) -> bool {
    width == ValueWidth::Sixteen && matches!(rows.data_type(column), DataType::Decimal128(..))
}

/// An array of `data_type`, without NULLs, whose values are `buffer`'s
/// bytes, `width` bytes each.
fn values_array(data_type: &DataType, buffer: Buffer, width: ValueWidth) -> Result<ArrayRef> {
    let data = ArrayData::builder(data_type.clone())
        .len(buffer.len() / width.bytes())
        .add_buffer(buffer)
        .build()?;
    Ok(make_array(data))
}

/// The bytes of the values of a column of `width`, read in place from its
/// Arrow buffer.
fn value_bytes(column: &ArrayRef, width: ValueWidth) -> Buffer {
    value_buffer(column.as_ref(), width.bytes())
}

/// One column resident on the device: its values packed into words.
#[derive(Debug)]
struct ResidentColumn {
    words: DeviceVec<u64>,
    /// The width of the values on the device.
    width: ValueWidth,
    /// 16-byte integers held as the 8-byte words they fit (`width` is
    /// `Eight`): gathered as such, widened as they come down, and never
    /// read as the column's own values (keys, folds, carried words).
    narrowed: bool,
}

impl ResidentColumn {
    /// The column, where its words are its values at their own width (not
    /// narrowed): what reads the values themselves on the device asks for.
    fn own_values(&self) -> Option<&Self> {
        (!self.narrowed).then_some(self)
    }

    /// The first `len` values of `words` (this column's, or gathered from
    /// it) copied down as arrays of `data_type` of `piece_len` values each
    /// (the last may be shorter). Device failures are the outer error, host
    /// ones the inner.
    #[allow(clippy::too_many_arguments)]
    fn download(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        words: &DeviceView<'_, u64>,
        len: usize,
        piece_len: usize,
        data_type: &DataType,
        host_threads: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Result<Vec<ArrayRef>>> {
        let (buffers, width) = match self.narrowed {
            true => (
                download_widened_pieces(device, stream, words, len, piece_len, host_threads, timer)?,
                ValueWidth::Sixteen,
            ),
            false => {
                let bytes = self.width.bytes();
                let buffers = download_byte_pieces(
                    device,
                    stream,
                    words,
                    len * bytes,
                    piece_len * bytes,
                    host_threads,
                    timer,
                )?;
                (buffers, self.width)
            }
        };
        Ok(buffers
            .into_iter()
            .map(|buffer| values_array(data_type, buffer, width))
            .collect())
    }
}

/// The columns of one side's batch that are gathered on the device,
/// resident there.
#[derive(Debug)]
pub(crate) struct ResidentColumns {
    /// Per column of the batch, its copy on the device, or `None` (host).
    columns: Vec<Option<ResidentColumn>>,
}

impl ResidentColumns {
    /// The width of each column of `batch` that `wanted` names and that is
    /// gathered on the device.
    fn chosen<'a>(
        batch: &'a dyn RowSource,
        wanted: &'a [bool],
    ) -> impl Iterator<Item = (usize, Option<ValueWidth>)> + 'a {
        let rows = batch.num_rows();
        (0..batch.num_columns()).map(move |i| {
            let wanted = wanted.get(i).copied().unwrap_or(false) && rows > 0;
            (i, wanted.then(|| device_width(batch, i)).flatten())
        })
    }

    /// Device bytes of the columns of `batch` that [`Self::upload`] copies.
    pub(crate) fn device_bytes(batch: &dyn RowSource, wanted: &[bool]) -> usize {
        Self::chosen(batch, wanted)
            .filter_map(|(_, width)| width)
            .map(|width| 8 * width.words(batch.num_rows()))
            .sum()
    }

    /// Bytes per row of the widest column of `batch` that [`Self::upload`]
    /// copies (0 when none): what [`gather_batches`] needs per pair.
    pub(crate) fn widest(batch: &dyn RowSource, wanted: &[bool]) -> usize {
        Self::chosen(batch, wanted)
            .filter_map(|(_, width)| width)
            .map(ValueWidth::bytes)
            .max()
            .unwrap_or(0)
    }

    /// No column on the device: every column is taken on the host.
    pub(crate) fn none() -> Self {
        Self {
            columns: Vec::new(),
        }
    }

    /// Copies the columns of `batch` that `wanted[i]` asks for and that can
    /// be gathered on the device, each piece of a column straight into its
    /// place (a chunk's batches are not concatenated first).
    pub(crate) fn upload(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        batch: &dyn RowSource,
        wanted: &[bool],
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        Self::upload_bytes(device, stream, &ColumnBytes::of(batch, wanted), timer)
    }

    /// [`Self::upload`] of bytes already taken from their batch.
    pub(crate) fn upload_bytes(
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        bytes: &ColumnBytes,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Self> {
        let mut columns = Vec::with_capacity(bytes.columns.len());
        for column in &bytes.columns {
            columns.push(match column {
                Some(column) => Some(column.upload(device, stream, timer)?),
                None => None,
            });
        }
        Ok(Self { columns })
    }

    /// Whether any column is on the device.
    pub(crate) fn any(&self) -> bool {
        self.columns.iter().any(Option::is_some)
    }

    fn get(&self, column: usize) -> Option<&ResidentColumn> {
        self.columns.get(column).and_then(Option::as_ref)
    }

    /// The words of column `column` where it is on the device at 8 bytes a
    /// value: the keys themselves, where it is a raw probe key.
    pub(crate) fn words_of(&self, column: usize) -> Option<&DeviceVec<u64>> {
        self.get(column)
            .and_then(ResidentColumn::own_values)
            .filter(|values| values.width == ValueWidth::Eight)
            .map(|values| &values.words)
    }

    /// The columns copied down as one record batch of `shape`; every
    /// column must be on the device. Device failures are the outer error,
    /// host ones the inner.
    pub(crate) fn download_batch(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        shape: &RowsShape,
        host_threads: usize,
        timer: &mut PhaseTimer,
    ) -> GpuResult<Result<RecordBatch>> {
        let rows = shape.rows;
        if rows == 0 {
            return Ok(Ok(RecordBatch::new_empty(Arc::clone(&shape.schema))));
        }
        let mut arrays = Vec::with_capacity(shape.schema.fields().len());
        for (i, field) in shape.schema.fields().iter().enumerate() {
            let Some(values) = self.get(i) else {
                return Ok(Err(DataFusionError::Internal(format!(
                    "column {i} of rows on the device is not there"
                ))));
            };
            let words = values.words.as_view();
            let downloaded = values.download(
                device,
                stream,
                &words,
                rows,
                rows,
                field.data_type(),
                host_threads,
                timer,
            )?;
            let mut pieces = match downloaded {
                Ok(pieces) => pieces,
                Err(e) => return Ok(Err(e)),
            };
            let (Some(array), true) = (pieces.pop(), pieces.is_empty()) else {
                return Ok(Err(DataFusionError::Internal(format!(
                    "column {i} of rows on the device came down in pieces"
                ))));
            };
            arrays.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(Arc::clone(&shape.schema), arrays, &options)
            .map_err(Into::into))
    }
}

/// The widths of the output columns of `assembler` that lie on the device
/// on their side.
fn gathered_widths<'a>(
    assembler: &'a OutputAssembler,
    build: &'a ResidentColumns,
    probe: &'a ResidentColumns,
) -> impl Iterator<Item = ValueWidth> + 'a {
    assembler.sources().iter().filter_map(|source| match *source {
        ColumnSource::Build(i) => build.get(i).map(|c| c.width),
        ColumnSource::Probe(i) => probe.get(i).map(|c| c.width),
        ColumnSource::Mark => None,
    })
}

/// Whether every output column of `assembler` can be gathered on the
/// device: a build column on the device there, a probe column of `probe`
/// that [`ResidentColumns::upload`] copies (a width the kernels move, no
/// NULLs), no mark.
pub(crate) fn can_gather_all(
    assembler: &OutputAssembler,
    build: &ResidentColumns,
    probe: &dyn RowSource,
) -> bool {
    assembler.sources().iter().all(|source| match *source {
        ColumnSource::Build(i) => build.get(i).is_some(),
        ColumnSource::Probe(i) => i < probe.num_columns() && device_width(probe, i).is_some(),
        ColumnSource::Mark => false,
    })
}

/// The output of `len` pairs gathered into columns of their own that stay
/// on the device (see [`crate::exec::join::device_rows`]), in pair order,
/// or `None` where an output column is not on the device on its side (a
/// column with NULLs, of another width, a mark) or the device's budget has
/// no room for them: the caller then makes host batches as
/// [`gather_batches`] does. Waits for the gathers, so that another stream
/// may read the columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_device_rows(
    device: &Arc<GpuDevice>,
    stream: &Arc<DeviceStream>,
    assembler: &OutputAssembler,
    schema: &SchemaRef,
    build: &GatherSide<'_>,
    probe: &GatherSide<'_>,
    len: usize,
    memory_fraction: f64,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<DeviceRows>> {
    let mut sources = Vec::with_capacity(assembler.sources().len());
    for source in assembler.sources() {
        let (side, column) = match *source {
            ColumnSource::Build(i) => (build, i),
            ColumnSource::Probe(i) => (probe, i),
            ColumnSource::Mark => return Ok(None),
        };
        let Some(values) = side.resident.get(column) else {
            return Ok(None);
        };
        sources.push((side, column, values));
    }
    if len == 0 || sources.len() != schema.fields().len() {
        return Ok(None);
    }
    let bytes = sources
        .iter()
        .map(|(_, _, values)| 8 * values.width.words(len))
        .sum();
    // As much again left free, for the join above to probe with them:
    // rows kept where that leaves no room would only be copied down there.
    let Some(memory) = device.budget().try_reserve(bytes, bytes, memory_fraction) else {
        return Ok(None);
    };
    let mut columns = Vec::with_capacity(sources.len());
    for (side, _, values) in sources {
        let mut gathered = None;
        timer.time(Phase::Kernel, || {
            gather::gather_into(
                device,
                stream,
                values.width,
                &values.words,
                side.batch.num_rows(),
                side.ids,
                len,
                values.width,
                &mut gathered,
            )
            .map(|_| ())
        })?;
        let Some(words) = gathered else {
            return Err(GpuError::Invalid("a gather made no column".into()));
        };
        columns.push(Some(ResidentColumn {
            words,
            width: values.width,
            narrowed: values.narrowed,
        }));
    }
    stream
        .synchronize()
        .during("waiting for output columns kept on the device")?;
    Ok(Some(DeviceRows {
        device: Arc::clone(device),
        columns: ResidentColumns { columns },
        shape: RowsShape {
            schema: Arc::clone(schema),
            rows: len,
        },
        memory,
    }))
}

/// The bytes of the columns of one batch that [`ResidentColumns::upload`]
/// copies, piece by piece, taken from the batch once: per column of the
/// batch, its pieces' value bytes, or `None` (left on the host).
pub(crate) struct ColumnBytes {
    columns: Vec<Option<PieceBytes>>,
}

/// One column's value bytes, piece by piece.
struct PieceBytes {
    buffers: Vec<Buffer>,
    width: ValueWidth,
    /// Tried at 8 bytes a value on the device ([`narrowable`]).
    narrowable: bool,
}

impl PieceBytes {
    /// The column on the device: a decimal narrowed to 8-byte words where
    /// every value fits 64 bits, and 8-byte values (decimals so narrowed
    /// among them) sent at 4 bytes where every one fits 32 bits, unless it
    /// lies in pinned memory (copied straight from there at the bus's full
    /// speed, without staging on the host).
    fn upload(
        &self,
        device: &GpuDevice,
        stream: &Arc<DeviceStream>,
        timer: &mut PhaseTimer,
    ) -> GpuResult<ResidentColumn> {
        let pieces: Vec<&[u8]> = self.buffers.iter().map(Buffer::as_slice).collect();
        if !in_pinned_memory(&pieces) {
            let mut windows = StagingWindows::standard(device);
            if self.narrowable {
                let values: Vec<&[[u8; 16]]> =
                    pieces.iter().map(|p| p.as_chunks::<16>().0).collect();
                if let Some(words) = windows.upload_decimals_narrowed(stream, &values, timer)? {
                    return Ok(ResidentColumn {
                        words,
                        width: ValueWidth::Eight,
                        narrowed: true,
                    });
                }
            } else if self.width == ValueWidth::Eight {
                // The same words on the device, sent at 4 bytes where every
                // value fits 32 bits: the column's own values still.
                return Ok(ResidentColumn {
                    words: windows.upload_words_narrowed(stream, &pieces, timer)?,
                    width: ValueWidth::Eight,
                    narrowed: false,
                });
            }
        }
        Ok(ResidentColumn {
            words: upload_byte_pieces(device, stream, &pieces, timer)?,
            width: self.width,
            narrowed: false,
        })
    }
}

impl ColumnBytes {
    /// The bytes of the columns of `batch` that `wanted[i]` asks for and
    /// that can be gathered on the device.
    pub(crate) fn of(batch: &dyn RowSource, wanted: &[bool]) -> Self {
        let columns = ResidentColumns::chosen(batch, wanted)
            .map(|(i, width)| {
                width.map(|width| {
                    let pieces = batch.pieces(i);
                    let buffers = pieces.iter().map(|piece| value_bytes(piece, width));
                    PieceBytes {
                        buffers: buffers.collect(),
                        width,
                        narrowable: narrowable(batch, i, width),
                    }
                })
            })
            .collect();
        Self { columns }
    }

    /// Whether every column lies in pinned host memory: copied straight
    /// from it, then, without staging on the host.
    pub(crate) fn in_pinned_memory(&self) -> bool {
        self.columns.iter().flatten().all(|column| {
            let pieces: Vec<&[u8]> = column.buffers.iter().map(Buffer::as_slice).collect();
            in_pinned_memory(&pieces)
        })
    }
}

/// One side of the pairs being gathered.
pub(crate) struct GatherSide<'a> {
    /// The side's rows.
    pub(crate) batch: &'a dyn RowSource,
    /// Its columns on the device.
    pub(crate) resident: &'a ResidentColumns,
    /// The side's row of each pair (the first `len` elements).
    pub(crate) ids: &'a DeviceVec<u64>,
}

/// Which columns of each side the output of `assembler` uses; `None` when
/// it has a column that is not a side's (a mark).
pub(crate) fn output_columns(
    assembler: &OutputAssembler,
    build_columns: usize,
    probe_columns: usize,
) -> Option<(Vec<bool>, Vec<bool>)> {
    let mut build = vec![false; build_columns];
    let mut probe = vec![false; probe_columns];
    for source in assembler.sources() {
        match *source {
            ColumnSource::Build(i) => *build.get_mut(i)? = true,
            ColumnSource::Probe(i) => *probe.get_mut(i)? = true,
            ColumnSource::Mark => return None,
        }
    }
    Some((build, probe))
}

/// The output batches of `len` pairs, in pair order: resident columns
/// gathered on the device, the others taken on the host with the row ids
/// downloaded once. Each batch owns its columns' memory (no batch holds a
/// slice of a larger buffer), so memory accounting downstream sees each
/// batch's own rows. Device failures are returned as the outer error, host
/// ones as the inner. Gathered columns are copied out on up to
/// `host_threads` threads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_batches(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    assembler: &OutputAssembler,
    build: &GatherSide<'_>,
    probe: &GatherSide<'_>,
    len: usize,
    host_threads: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Result<Vec<RecordBatch>>> {
    let batch_size = assembler.batch_size();
    let batches = len.div_ceil(batch_size);
    // Per output column, its pieces of `batch_size` rows.
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); assembler.sources().len()];
    // Per side, the (output position, column) of columns taken on the host.
    let mut on_host: [Vec<(usize, usize)>; 2] = [Vec::new(), Vec::new()];
    // One buffer for every gathered column in turn, as wide as the widest.
    let mut gathered: Option<DeviceVec<u64>> = None;
    for (position, source) in assembler.sources().iter().enumerate() {
        let (which, side, column) = match *source {
            ColumnSource::Build(i) => (0, build, i),
            ColumnSource::Probe(i) => (1, probe, i),
            ColumnSource::Mark => {
                return Ok(Err(DataFusionError::Internal(
                    "a mark column cannot be gathered by pair".into(),
                )))
            }
        };
        let Some(values) = side.resident.get(column).filter(|_| len > 0) else {
            on_host[which].push((position, column));
            continue;
        };
        let width = values.width;
        // The widest column gathered here (not every column on the device:
        // rows handed on from the join below hold columns this output
        // does not read).
        let widest = gathered_widths(assembler, build.resident, probe.resident)
            .max()
            .unwrap_or(width);
        let target = timer.time(Phase::Kernel, || {
            gather::gather_into(
                device,
                stream,
                width,
                &values.words,
                side.batch.num_rows(),
                side.ids,
                len,
                widest,
                &mut gathered,
            )
            .map(|target| target.slice(..))
        })?;
        let data_type = side.batch.data_type(column);
        let downloaded = values.download(
            device,
            stream,
            &target,
            len,
            batch_size,
            data_type,
            host_threads,
            timer,
        )?;
        match downloaded {
            Ok(pieces) => columns[position].extend(pieces),
            Err(e) => return Ok(Err(e)),
        }
    }
    // The other columns are taken on the host, each side's together, with
    // the side's row ids downloaded once.
    for (side, wanted) in [build, probe].into_iter().zip(&on_host) {
        if wanted.is_empty() {
            continue;
        }
        let mut ids = Vec::new();
        if len > 0 {
            download_u64(device, stream, &side.ids.slice(..len), &mut ids, timer)?;
        }
        let ids = UInt64Array::from(ids);
        let wanted_columns: Vec<usize> = wanted.iter().map(|&(_, column)| column).collect();
        for start in (0..len).step_by(batch_size) {
            let rows = batch_size.min(len - start);
            let taken = match side
                .batch
                .take_columns(&wanted_columns, &ids.slice(start, rows))
            {
                Ok(taken) => taken,
                Err(e) => return Ok(Err(e)),
            };
            for (&(position, _), piece) in wanted.iter().zip(taken) {
                columns[position].push(compact_views(piece));
            }
        }
    }
    Ok((0..batches)
        .map(|b| {
            let rows = batch_size.min(len - b * batch_size);
            let batch_columns = columns
                .iter()
                .map(|pieces| Arc::clone(&pieces[b]))
                .collect();
            assembler.batch_from_columns(batch_columns, rows)
        })
        .collect())
}

/// The device column each reduction reads (`None` for a count) and the
/// side it lies on, or `None` when a column is not on the device at the
/// width the plan expects (a side with NULLs, another width): the pairs
/// are then aggregated from rows made on the host.
fn reduction_columns<'a>(
    reductions: &[PairReduction],
    sources: &[ColumnSource],
    build: &'a ResidentColumns,
    probe: &'a ResidentColumns,
) -> Option<Vec<Option<(PairSide, &'a ResidentColumn)>>> {
    reductions
        .iter()
        .map(|reduction| {
            let Some((side, index)) = reduction_side(reduction, sources)? else {
                return Some(None);
            };
            let resident = match side {
                PairSide::Build => build,
                PairSide::Probe => probe,
            };
            let values = resident
                .get(index)
                .and_then(ResidentColumn::own_values)
                .filter(|v| v.width == reduction_width(reduction))?;
            Some(Some((side, values)))
        })
        .collect()
}

/// The side and column of that side a reduction reads: `Some(None)` for a
/// count of the pairs, `None` where its column is not a side's.
fn reduction_side(
    reduction: &PairReduction,
    sources: &[ColumnSource],
) -> Option<Option<(PairSide, usize)>> {
    let Some(column) = reduction.column() else {
        return Some(None);
    };
    match sources.get(column)? {
        ColumnSource::Build(i) => Some(Some((PairSide::Build, *i))),
        ColumnSource::Probe(i) => Some(Some((PairSide::Probe, *i))),
        _ => None,
    }
}

/// The width a reduction's column must have on the device.
fn reduction_width(reduction: &PairReduction) -> ValueWidth {
    match *reduction {
        PairReduction::Fold { values, .. } => values.width(),
        _ => ValueWidth::Eight,
    }
}

/// The columns of one side a join carries through its partitioning in
/// place of row ids where its aggregation is folded while the device
/// probes (seed 002's GFTR; see
/// [`crate::ops::hash_join::partition_probe_carrying`] and
/// [`crate::ops::hash_join::DeviceBuildTable::build_carrying`]): each fold
/// of such a column then reads its value where the keys are, not at a
/// random row. Each column has its slot in the carried word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SideCarry {
    side: PairSide,
    /// (column of the side, its slot), one entry per distinct column.
    slots: Vec<(usize, CarriedSlot)>,
}

impl SideCarry {
    /// What `side` of `reductions` carries: the columns of that side they
    /// fold, where these are one 8-byte column or one or two 4-byte ones,
    /// every column the reductions read on that side is on the device at
    /// its width (as [`join_folds`] needs), and one launch computes every
    /// fold. `None` otherwise, or where no reduction folds a column of the
    /// side: its keys then carry row ids.
    pub(crate) fn plan(
        side: PairSide,
        reductions: &[PairReduction],
        sources: &[ColumnSource],
        resident: &ResidentColumns,
    ) -> Option<Self> {
        let mut folds = 0;
        let mut columns: Vec<(usize, ValueWidth)> = Vec::new();
        for reduction in reductions {
            let Some((reduction_side, index)) = reduction_side(reduction, sources)? else {
                continue;
            };
            let counted = matches!(
                reduction,
                PairReduction::CountColumn(_) | PairReduction::CountPairs
            );
            folds += usize::from(!counted);
            if reduction_side != side {
                continue;
            }
            let width = reduction_width(reduction);
            resident
                .get(index)
                .and_then(ResidentColumn::own_values)
                .filter(|v| v.width == width)?;
            if !counted && !columns.contains(&(index, width)) {
                columns.push((index, width));
            }
        }
        if folds > MAX_JOIN_FOLDS {
            return None;
        }
        let slots = match columns[..] {
            [(column, ValueWidth::Eight)] => vec![(column, CarriedSlot::Whole)],
            [(column, ValueWidth::Four)] => vec![(column, CarriedSlot::Low)],
            [(low, ValueWidth::Four), (high, ValueWidth::Four)] => {
                vec![(low, CarriedSlot::Low), (high, CarriedSlot::High)]
            }
            _ => return None,
        };
        Some(Self { side, slots })
    }

    /// The slot of the side's column `column`, if carried.
    fn slot(&self, column: usize) -> Option<CarriedSlot> {
        self.slots
            .iter()
            .find(|&&(carried, _)| carried == column)
            .map(|&(_, slot)| slot)
    }

    /// The carried columns of `resident` (the side's, `rows` rows), as the
    /// partitioning packs them; `None` where one is not on the device.
    pub(crate) fn values<'a>(
        &self,
        resident: &'a ResidentColumns,
        rows: usize,
    ) -> Option<CarriedValues<'a>> {
        let column = |slot: CarriedSlot| {
            let &(index, _) = self.slots.iter().find(|&&(_, s)| s == slot)?;
            resident
                .get(index)
                .and_then(ResidentColumn::own_values)
                .filter(|v| v.width == slot.width())
        };
        let low = column(CarriedSlot::Whole).or_else(|| column(CarriedSlot::Low))?;
        let high = match self.slot_taken(CarriedSlot::High) {
            true => Some(&column(CarriedSlot::High)?.words),
            false => None,
        };
        Some(CarriedValues {
            low: (&low.words, low.width),
            high,
            rows,
        })
    }

    fn slot_taken(&self, slot: CarriedSlot) -> bool {
        self.slots.iter().any(|&(_, s)| s == slot)
    }
}

/// The folds that compute `reductions` while a hash join probes (see
/// [`crate::ops::hash_join::fold_partitioned`]): one per reduction that
/// reads a column (a count reads none: it is the pairs). A fold reads its
/// slot of the words a side's [`SideCarry`] in `carries` put beside its
/// keys, where that side carries. `None` where a column is not on the
/// device (as for [`reduce_pairs`]), there are more folds than one launch
/// computes, or a fold's column was not carried where its side carries;
/// the pairs are then written out and reduced by [`reduce_pairs`].
pub(crate) fn join_folds<'a>(
    reductions: &[PairReduction],
    sources: &[ColumnSource],
    build: (&dyn RowSource, &'a ResidentColumns),
    probe: (&dyn RowSource, &'a ResidentColumns),
    carries: &[&SideCarry],
) -> Option<Vec<Option<JoinFold<'a>>>> {
    let columns = reduction_columns(reductions, sources, build.1, probe.1)?;
    let mut uncarried = false;
    let folds: Vec<Option<JoinFold<'a>>> = reductions
        .iter()
        .zip(columns)
        .map(|(reduction, column)| {
            let (side, values) = column?;
            let rows = match side {
                PairSide::Build => build.0.num_rows(),
                PairSide::Probe => probe.0.num_rows(),
            };
            let (op, read, flip) = match *reduction {
                PairReduction::Fold {
                    op, flip, values, ..
                } => (FoldOp::Words(op), values, flip),
                PairReduction::SumF64(_) => (FoldOp::SumF64, GatheredValues::Eight, 0),
                // A column counted: columns on the device have no NULLs, so
                // every pair counts, and nothing is read (nor carried).
                PairReduction::CountColumn(_) | PairReduction::CountPairs => return None,
            };
            // Where the fold's side carries, its value is in its slot of the
            // carried word.
            let carried = match carries.iter().find(|carry| carry.side == side) {
                Some(carry) => {
                    let slot = reduction_side(reduction, sources)
                        .flatten()
                        .and_then(|(_, index)| carry.slot(index));
                    uncarried |= slot.is_none();
                    slot
                }
                None => None,
            };
            Some(JoinFold {
                side,
                values: &values.words,
                rows,
                read,
                op,
                flip,
                carried,
            })
        })
        .collect();
    // A counted column needs no fold: it only had to be on the device. A
    // fold whose column was not carried where its side carries cannot read
    // it.
    (folds.iter().flatten().count() <= MAX_JOIN_FOLDS && !uncarried).then_some(folds)
}

/// Each reduction's word from what [`join_folds`]'s folds computed: its
/// fold's word, or the pairs for a count.
pub(crate) fn folded_words(folds: &[Option<JoinFold<'_>>], folded: &FoldedPairs) -> Vec<u64> {
    let mut words = folded.words.iter();
    folds
        .iter()
        .map(|fold| match fold {
            Some(_) => words.next().copied().unwrap_or(0),
            None => folded.pairs,
        })
        .collect()
}

/// One word per reduction over the first `len` pairs (see
/// [`crate::exec::join::pair_aggregate`]): each column a reduction reads is
/// gathered by the pairs and reduced on the device, and only the words come
/// back. `sources` maps the join's output columns to the sides' columns.
/// `None` when a column a reduction reads is not on the device in this
/// range (a side with NULLs, another width): the caller then assembles the
/// output rows on the host.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_pairs(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    reductions: &[PairReduction],
    sources: &[ColumnSource],
    build: &GatherSide<'_>,
    probe: &GatherSide<'_>,
    len: usize,
    timer: &mut PhaseTimer,
) -> GpuResult<Option<Vec<u64>>> {
    // Every column first: a range either reduces whole on the device or
    // not at all.
    let Some(columns) = reduction_columns(reductions, sources, build.resident, probe.resident)
    else {
        return Ok(None);
    };
    let inputs = columns.into_iter().map(|column| {
        column.map(|(side, values)| match side {
            PairSide::Build => (build, values),
            PairSide::Probe => (probe, values),
        })
    });
    if len == 0 {
        return Ok(Some(vec![0; reductions.len()]));
    }
    let mut gathered: Option<DeviceVec<u64>> = None;
    // Each reduction's word stays on the device until every launch is
    // enqueued, so that the host waits for the device once.
    let mut outs: Vec<Option<DeviceVec<u64>>> = Vec::with_capacity(reductions.len());
    for (reduction, input) in reductions.iter().zip(inputs) {
        if matches!(
            reduction,
            PairReduction::CountPairs | PairReduction::CountColumn(_)
        ) {
            // Columns on the device have no NULLs: every pair counts.
            outs.push(None);
            continue;
        }
        let Some((side, values)) = input else {
            return Err(GpuError::Invalid(format!(
                "{reduction:?} without its column"
            )));
        };
        let out = timer.time(Phase::Kernel, || match *reduction {
            PairReduction::Fold {
                op,
                flip,
                values: read_as,
                ..
            } => {
                // Gathered and folded in one pass.
                gather::fold_gathered(
                    device,
                    stream,
                    &values.words,
                    side.batch.num_rows(),
                    read_as,
                    side.ids,
                    len,
                    op,
                    flip,
                )
            }
            PairReduction::SumF64(_) => {
                // A float sum: gathered, then added by the group-by's
                // kernel.
                gather::sum_gathered_f64(
                    device,
                    stream,
                    &values.words,
                    side.batch.num_rows(),
                    side.ids,
                    len,
                    &mut gathered,
                )
            }
            // Counted without the device, above.
            PairReduction::CountPairs | PairReduction::CountColumn(_) => Err(GpuError::Invalid(
                format!("{reduction:?} has no column to reduce"),
            )),
        })?;
        outs.push(Some(out));
    }
    let mut words = Vec::with_capacity(reductions.len());
    for out in outs {
        match out {
            Some(out) => words.push(download_word(device, stream, &out.as_view(), "a reduction", timer)?),
            None => words.push(len as u64),
        }
    }
    Ok(Some(words))
}

#[cfg(test)]
#[path = "device_gather_tests.rs"]
mod tests;
