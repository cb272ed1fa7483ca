//! Which plans a [`super::GpuScanFilterExec`] can take the place of:
//! filters, projections and batch coalescing over one table scan (Parquet
//! files or a `MemTable`), at least one filter among them (or a join key
//! filter above them), with every expression taken down to the scan's
//! columns.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::join_keys::{JoinKeyFilterExpr, JoinKeyWaitExec};
use crate::exec::scan_aggregate::{
    coalesced_input, filter_projection, scan_fields, substitute, table_source, ScanColumn,
    TableSource,
};

/// Filters and projections over one table scan, taken apart.
#[derive(Debug, Clone)]
pub(crate) struct ScanFilterShape {
    pub source: TableSource,
    /// The scan's output schema, which every expression below reads.
    pub scan_schema: SchemaRef,
    /// The scan's output columns.
    pub scan_columns: Vec<ScanColumn>,
    /// Every filter, as one conjunction over the scan's columns.
    pub predicate: Arc<dyn PhysicalExpr>,
    /// Each output column's expression over the scan's columns.
    pub outputs: Vec<Arc<dyn PhysicalExpr>>,
    /// The output schema (the replaced plan's).
    pub output_schema: SchemaRef,
    /// Rows the scan reads, where known without reading the table
    /// (`TableSource::rows`).
    pub scan_rows: Option<usize>,
    /// Whether the chain filters (not only the join key filters above it).
    pub chain_filters: bool,
}

type Shaped<T> = std::result::Result<T, String>;

impl ScanFilterShape {
    /// The plan `top` taken apart, `Ok(None)` where it is not of the shape,
    /// or the reason it cannot be; `join_filters` (predicates over `top`'s
    /// output, see [`crate::exec::join_keys`]) among its filters: a chain
    /// without a filter of its own then takes the node's place too.
    pub fn with_join_filters(
        top: &Arc<dyn ExecutionPlan>,
        join_filters: &[Arc<dyn PhysicalExpr>],
    ) -> Shaped<Option<Self>> {
        let output_schema = top.schema();
        let mut outputs: Vec<Arc<dyn PhysicalExpr>> = output_schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>)
            .collect();
        let mut predicates: Vec<Arc<dyn PhysicalExpr>> = join_filters.to_vec();
        let mut chain_filters = false;
        let mut node = Arc::clone(top);
        let scan = loop {
            if node.fetch().is_some() {
                return Ok(None);
            }
            if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
                let exprs: Vec<Arc<dyn PhysicalExpr>> =
                    projection.expr().iter().map(|p| Arc::clone(&p.expr)).collect();
                substitute_every(&mut outputs, &mut predicates, &exprs)?;
                node = Arc::clone(projection.input());
            } else if let Some(filter) = node.downcast_ref::<FilterExec>() {
                if let Some(exprs) = filter_projection(filter) {
                    substitute_every(&mut outputs, &mut predicates, &exprs)?;
                }
                // A host test of join keys is not a filter of the chain's own.
                if filter.predicate().downcast_ref::<JoinKeyFilterExpr>().is_none() {
                    chain_filters = true;
                }
                predicates.push(Arc::clone(filter.predicate()));
                node = Arc::clone(filter.input());
            } else if let Some(input) = coalesced_input(&node) {
                node = input;
            } else if let Some(wait) = node.downcast_ref::<JoinKeyWaitExec>() {
                // A host test's wait: this node waits for the keys itself.
                node = Arc::clone(wait.input());
            } else if node.downcast_ref::<DataSourceExec>().is_some() {
                break node;
            } else {
                return Ok(None);
            }
        };
        let Some(data_source) = scan.downcast_ref::<DataSourceExec>() else {
            return Ok(None);
        };
        let Some(predicate) = predicates
            .into_iter()
            .reduce(|a, b| Arc::new(BinaryExpr::new(a, Operator::And, b)) as Arc<dyn PhysicalExpr>)
        else {
            // A projection alone: nothing to filter, every row comes back.
            return Ok(None);
        };
        let (source, scan_columns) = match table_source(data_source)? {
            Some(found) => found,
            None => return Ok(None),
        };
        // Partition p of the plan is part group p of the table.
        let partitions = top.properties().output_partitioning().partition_count();
        if source.group_count() != partitions {
            return Ok(None);
        }
        let scan_rows = source.rows(scan.as_ref());
        Ok(Some(Self {
            source,
            scan_schema: scan.schema(),
            scan_columns,
            predicate,
            outputs,
            output_schema,
            scan_rows,
            chain_filters,
        }))
    }

    /// The table column index and field of each of `columns` (scan
    /// columns).
    pub fn fields_of(&self, columns: &[usize]) -> Vec<(usize, datafusion::arrow::datatypes::Field)> {
        scan_fields(&self.scan_columns, &self.scan_schema, columns)
    }
}

fn substitute_every(
    outputs: &mut [Arc<dyn PhysicalExpr>],
    predicates: &mut [Arc<dyn PhysicalExpr>],
    exprs: &[Arc<dyn PhysicalExpr>],
) -> Shaped<()> {
    outputs
        .iter_mut()
        .chain(predicates.iter_mut())
        .try_for_each(|e| substitute(e, exprs))
}
