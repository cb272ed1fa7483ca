//! Which plans a [`super::GpuScanAggregateExec`] can take the place of: a
//! partial `AggregateExec` over filters, projections, batch coalescing and
//! repartitions of one table scan (Parquet files or a `MemTable`), with
//! every expression taken down to the scan's columns, so that the device
//! evaluates them over the table's cached columns.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource};
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
#[allow(deprecated)]
use datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, InputOrderMode};

use crate::exec::aggregate::{aggregate_kind, AggregateKind};

/// Where a scan's rows come from, in the parts the cache keeps.
#[derive(Debug, Clone)]
pub(crate) enum TableSource {
    /// Parquet files (or byte ranges of them) through an object store, in
    /// the scan's file groups (each about the same number of bytes).
    Parquet {
        url: ObjectStoreUrl,
        groups: Vec<Vec<PartitionedFile>>,
        /// The scan's source, without its projection or predicate, to read
        /// every row of the columns asked for.
        source: Arc<FileScanConfig>,
    },
    /// A `MemTable`'s partitions.
    Memory(MemoryPartitions),
}

/// A `MemTable` scan's partitions: read in place from the scan where only
/// counted (planning's checks), taken once and shared where first read as
/// parts (a task per partition clones the source). A large table has
/// thousands of batches at 8,192 rows a batch, so copying their lists for
/// every check cost planning more than the checks themselves.
#[derive(Debug, Clone)]
pub(crate) struct MemoryPartitions {
    /// The scan's `MemorySourceConfig`.
    scan: Arc<dyn DataSource>,
    taken: Arc<OnceLock<Vec<Arc<Vec<RecordBatch>>>>>,
}

impl MemoryPartitions {
    fn of(scan: &Arc<dyn DataSource>) -> Self {
        Self {
            scan: Arc::clone(scan),
            taken: Arc::default(),
        }
    }

    /// Each partition's batches, in place.
    pub fn batches(&self) -> &[Vec<RecordBatch>] {
        self.scan
            .downcast_ref::<MemorySourceConfig>()
            .map_or(&[], |memory| memory.partitions())
    }

    /// Each partition's batches, taken from the scan at the first call.
    pub fn shared(&self) -> &[Arc<Vec<RecordBatch>>] {
        self.taken
            .get_or_init(|| self.batches().iter().map(|p| Arc::new(p.clone())).collect())
    }
}

/// One column of the scan's output: the table column it is.
#[derive(Debug, Clone)]
pub(crate) struct ScanColumn {
    /// Index in the table's schema (the file schema for Parquet).
    pub table_index: usize,
}

/// One aggregate of the partial aggregation, its argument over the scan's
/// columns.
#[derive(Debug, Clone)]
pub(crate) struct ScanAggregate {
    pub kind: AggregateKind,
    /// `None` for `COUNT(*)`-like counts of rows.
    pub argument: Option<Arc<dyn PhysicalExpr>>,
}

/// A partial aggregation over one table scan, taken apart.
#[derive(Debug, Clone)]
pub(crate) struct ScanAggregateShape {
    pub source: TableSource,
    /// The scan's output schema, which every expression below reads.
    pub scan_schema: SchemaRef,
    /// The scan's output columns.
    pub scan_columns: Vec<ScanColumn>,
    /// Every filter above the scan, as one conjunction.
    pub predicate: Option<Arc<dyn PhysicalExpr>>,
    /// Group keys: scan columns.
    pub group_columns: Vec<usize>,
    pub aggregates: Vec<ScanAggregate>,
    /// Each aggregate's partial state types.
    pub state_types: Vec<Vec<DataType>>,
    /// The partial aggregation's output schema.
    pub output_schema: SchemaRef,
    /// Rows the scan reads, where known without reading the table
    /// ([`TableSource::rows`]).
    pub scan_rows: Option<usize>,
}

type Shaped<T> = std::result::Result<T, String>;

impl ScanAggregateShape {
    /// `agg` taken apart, or why it cannot be. `Ok(None)` where it is not
    /// of the shape at all (not partial, or not over a scan).
    pub fn of(agg: &AggregateExec) -> Shaped<Option<Self>> {
        if *agg.mode() != AggregateMode::Partial {
            return Ok(None);
        }
        // Its one partition of groups in no order: not where the partial
        // aggregation streams over sorted input or orders its output.
        if *agg.input_order_mode() != InputOrderMode::Linear
            || agg.properties().output_ordering().is_some()
        {
            return Ok(None);
        }
        let mut group_exprs: Vec<Arc<dyn PhysicalExpr>> =
            agg.group_expr().expr().iter().map(|(e, _)| Arc::clone(e)).collect();
        let mut arguments: Vec<Vec<Arc<dyn PhysicalExpr>>> =
            agg.aggr_expr().iter().map(|a| a.expressions()).collect();
        let mut predicates: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        let mut node = Arc::clone(agg.input());
        let scan = loop {
            if node.fetch().is_some() {
                return Ok(None);
            }
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                let exprs: Vec<Arc<dyn PhysicalExpr>> =
                    projection.expr().iter().map(|p| Arc::clone(&p.expr)).collect();
                substitute_all(&mut group_exprs, &mut arguments, &mut predicates, &exprs)?;
                node = Arc::clone(projection.input());
            } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
                if let Some(exprs) = filter_projection(filter) {
                    substitute_all(&mut group_exprs, &mut arguments, &mut predicates, &exprs)?;
                }
                predicates.push(Arc::clone(filter.predicate()));
                node = Arc::clone(filter.input());
            } else if let Some(input) = coalesced_input(&node) {
                node = input;
            } else if let Some(repartition) = node.downcast_ref::<RepartitionExec>() {
                node = Arc::clone(repartition.input());
            } else if node.downcast_ref::<DataSourceExec>().is_some() {
                break node;
            } else {
                return Ok(None);
            }
        };
        let Some(data_source) = scan.downcast_ref::<DataSourceExec>() else {
            return Ok(None);
        };
        let scan_schema = scan.schema();
        let (source, scan_columns) = match table_source(data_source)? {
            Some(found) => found,
            None => return Ok(None),
        };
        let mut group_columns = Vec::with_capacity(group_exprs.len());
        for expr in &group_exprs {
            match expr.downcast_ref::<Column>() {
                Some(column) => group_columns.push(column.index()),
                None => return Err(format!("the group key {expr} is not a column")),
            }
        }
        if agg.group_expr().has_grouping_set() {
            return Err("grouping sets".into());
        }
        let mut aggregates = Vec::with_capacity(arguments.len());
        let mut state_types = Vec::with_capacity(arguments.len());
        for ((expr, filter), args) in agg.aggr_expr().iter().zip(agg.filter_expr()).zip(arguments) {
            let name = expr.fun().name();
            let kind = aggregate_kind(expr).ok_or_else(|| format!("the aggregate {name}"))?;
            if expr.is_distinct() || filter.is_some() || !expr.order_bys().is_empty() {
                return Err(format!("{name} with DISTINCT, FILTER or ORDER BY"));
            }
            let [argument] = <[_; 1]>::try_from(args).map_err(|_| format!("{name} of several arguments"))?;
            aggregates.push(ScanAggregate {
                kind,
                argument: Some(argument),
            });
            let states = expr.state_fields().map_err(|e| e.to_string())?;
            state_types.push(states.iter().map(|f| f.data_type().clone()).collect());
        }
        let predicate = predicates
            .into_iter()
            .reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)) as Arc<dyn PhysicalExpr>);
        let scan_rows = source.rows(scan.as_ref());
        let shape = Self {
            source,
            scan_schema,
            scan_columns,
            predicate,
            group_columns,
            aggregates,
            state_types,
            output_schema: agg.schema(),
            scan_rows,
        };
        Ok(Some(shape))
    }

    /// The table column index and field of each of `columns` (scan
    /// columns).
    pub fn fields_of(&self, columns: &[usize]) -> Vec<(usize, datafusion::arrow::datatypes::Field)> {
        scan_fields(&self.scan_columns, &self.scan_schema, columns)
    }

}

/// The table column index and field of each of `columns`, scan columns of
/// a scan with `scan_columns` and `scan_schema`.
pub(crate) fn scan_fields(
    scan_columns: &[ScanColumn],
    scan_schema: &SchemaRef,
    columns: &[usize],
) -> Vec<(usize, datafusion::arrow::datatypes::Field)> {
    columns
        .iter()
        .map(|&c| (scan_columns[c].table_index, scan_schema.field(c).clone()))
        .collect()
}

/// Replaces, in every expression, each column by the expression that
/// makes it below (`exprs`, by column index).
fn substitute_all(
    group_exprs: &mut [Arc<dyn PhysicalExpr>],
    arguments: &mut [Vec<Arc<dyn PhysicalExpr>>],
    predicates: &mut [Arc<dyn PhysicalExpr>],
    exprs: &[Arc<dyn PhysicalExpr>],
) -> Shaped<()> {
    let substitute = |expr: &mut Arc<dyn PhysicalExpr>| substitute(expr, exprs);
    group_exprs.iter_mut().try_for_each(substitute)?;
    arguments.iter_mut().flatten().try_for_each(substitute)?;
    predicates.iter_mut().try_for_each(substitute)
}

/// Replaces, in `expr`, each column by the expression that makes it below
/// (`exprs`, by column index).
pub(crate) fn substitute(expr: &mut Arc<dyn PhysicalExpr>, exprs: &[Arc<dyn PhysicalExpr>]) -> Shaped<()> {
    let rewritten = Arc::clone(expr)
        .transform_up(|e| match e.downcast_ref::<Column>() {
            Some(column) => match exprs.get(column.index()) {
                Some(below) => Ok(Transformed::yes(Arc::clone(below))),
                None => datafusion::common::internal_err!("a column past its projection"),
            },
            None => Ok(Transformed::no(e)),
        })
        .map_err(|e| e.to_string())?;
    *expr = rewritten.data;
    Ok(())
}

/// The expressions a `FilterExec`'s own projection makes of its input's
/// columns, where it has one.
pub(crate) fn filter_projection(filter: &FilterExec) -> Option<Vec<Arc<dyn PhysicalExpr>>> {
    let input_schema = filter.input().schema();
    filter.projection().as_ref().map(|projection| {
        projection
            .iter()
            .map(|&i| Arc::new(Column::new(input_schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>)
            .collect()
    })
}

/// The table behind `scan` and its output columns, `Ok(None)` where the
/// scan is not one this node reads (another format, a limit, partition
/// columns, computed columns), `Err` where it reads what it must not drop.
pub(crate) fn table_source(scan: &DataSourceExec) -> Shaped<Option<(TableSource, Vec<ScanColumn>)>> {
    let Some(columns) = table_scan_columns(scan)? else {
        return Ok(None);
    };
    let data_source = scan.data_source();
    let source = match data_source.downcast_ref::<MemorySourceConfig>() {
        Some(_) => TableSource::Memory(MemoryPartitions::of(data_source)),
        None => {
            let config = data_source
                .downcast_ref::<FileScanConfig>()
                .ok_or("a scan checked to read Parquet files")?;
            TableSource::Parquet {
                url: config.object_store_url.clone(),
                groups: config.file_groups.iter().map(|group| group.files().to_vec()).collect(),
                source: Arc::new(config.clone()),
            }
        }
    };
    Ok(Some((source, columns)))
}

/// The output columns of `scan` where it is a scan of a table this node
/// reads, as [`table_source`] finds it, without making the table's source
/// (a `MemTable`'s thousands of batches taken): what a check needs.
pub(crate) fn table_scan_columns(scan: &DataSourceExec) -> Shaped<Option<Vec<ScanColumn>>> {
    let data_source = scan.data_source();
    if data_source.fetch().is_some() {
        return Ok(None);
    }
    if let Some(memory) = data_source.downcast_ref::<MemorySourceConfig>() {
        let width = memory.original_schema().fields().len();
        let columns: Vec<ScanColumn> = match memory.projection() {
            Some(projection) => projection.iter().map(|&i| ScanColumn { table_index: i }).collect(),
            None => (0..width).map(|i| ScanColumn { table_index: i }).collect(),
        };
        return Ok(Some(columns));
    }
    let Some(config) = data_source.downcast_ref::<FileScanConfig>() else {
        return Ok(None);
    };
    let Some(parquet) = config.file_source().downcast_ref::<ParquetSource>() else {
        return Ok(None);
    };
    if !config.table_partition_cols().is_empty() || config.limit.is_some() {
        return Ok(None);
    }
    // With filters pushed into the scan, it drops rows itself, and the
    // filter above may be gone.
    if parquet.table_parquet_options().global.pushdown_filters && parquet.filter().is_some() {
        return Err("the scan filters rows itself (datafusion.execution.parquet.pushdown_filters)".into());
    }
    let width = config.file_schema().fields().len();
    let columns = match config.file_source().projection() {
        Some(projection) => {
            let mut columns = Vec::new();
            for item in projection.iter() {
                match item.expr.downcast_ref::<Column>() {
                    Some(column) if column.index() < width => columns.push(ScanColumn {
                        table_index: column.index(),
                    }),
                    _ => return Ok(None),
                }
            }
            columns
        }
        None => (0..width).map(|i| ScanColumn { table_index: i }).collect(),
    };
    // A file read with extensions (an access plan, a row selection) reads
    // other rows than its key says.
    if config
        .file_groups
        .iter()
        .flat_map(|group| group.files())
        .any(|file| !file.extensions.is_empty())
    {
        return Ok(None);
    }
    Ok(Some(columns))
}

/// The input of `node` where it is a `CoalesceBatchesExec` (deprecated in
/// DataFusion 55, and still made by plans built before).
#[allow(deprecated)]
pub(crate) fn coalesced_input(node: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    node.downcast_ref::<CoalesceBatchesExec>()
        .map(|coalesce| Arc::clone(coalesce.input()))
}
