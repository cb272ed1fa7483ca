//! Statistics of plan nodes, computed once per pass of the rule. Each
//! decision asks for the statistics of a node's input, and DataFusion
//! computes them bottom-up from the scan: over a table in memory, that reads
//! every batch (thousands of them, a few milliseconds on a many-core host
//! whose other cores last touched them). A pass asks several times for the
//! same subtree (an aggregation's rows and groups, then the aggregation
//! above it), so one [`StatisticsContext`], whose cache is keyed by node
//! addresses, serves the whole pass.

use std::cell::RefCell;
use std::sync::Arc;

use datafusion::common::Statistics;
use datafusion::error::Result;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::ExecutionPlan;

/// The statistics of one pass.
struct PassStatistics {
    context: StatisticsContext,
    /// Every node asked about, kept alive until the pass ends: the
    /// context's cache is keyed by node addresses, which a node made later
    /// in the pass could otherwise reuse. The nodes below them, whose
    /// statistics the cache holds too, are kept alive by them.
    asked: Vec<Arc<dyn ExecutionPlan>>,
}

thread_local! {
    /// The statistics of the pass running on this thread, if any.
    static PASS: RefCell<Option<PassStatistics>> = const { RefCell::new(None) };
}

/// Restores the pass that was running (if any) when dropped, a panic
/// included.
struct RestoreOnDrop(Option<PassStatistics>);

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        let outer = self.0.take();
        PASS.with(|pass| *pass.borrow_mut() = outer);
    }
}

/// Runs `pass` with the statistics it asks for ([`plan_statistics`])
/// computed once per node.
pub(super) fn with_statistics_of_one_pass<T>(pass: impl FnOnce() -> T) -> T {
    let fresh = PassStatistics {
        context: StatisticsContext::new(),
        asked: Vec::new(),
    };
    let _restore = RestoreOnDrop(PASS.with(|p| p.borrow_mut().replace(fresh)));
    pass()
}

/// The statistics of `plan` over all its partitions: from the pass's
/// cache inside [`with_statistics_of_one_pass`], computed afresh outside.
pub(super) fn plan_statistics(plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<Statistics>> {
    // Taken out while DataFusion computes, so that a node whose statistics
    // ask again (none of this crate's do) computes them afresh rather than
    // finding the cell borrowed.
    let Some(mut pass) = PASS.with(|p| p.borrow_mut().take()) else {
        return StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new());
    };
    let stats = pass.context.compute(plan.as_ref(), &StatisticsArgs::new());
    pass.asked.push(Arc::clone(plan));
    PASS.with(|p| *p.borrow_mut() = Some(pass));
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::stats::Precision;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;

    fn scan(rows: &[usize]) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batches: Vec<RecordBatch> = rows
            .iter()
            .map(|&n| {
                let column: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
                RecordBatch::try_new(Arc::clone(&schema), vec![column]).unwrap()
            })
            .collect();
        MemorySourceConfig::try_new_exec(&[batches], schema, None).unwrap()
    }

    #[test]
    fn a_pass_computes_each_node_s_statistics_once_and_outside_a_pass_afresh() {
        let small = scan(&[3, 4]);
        let large = scan(&[100]);
        let merged: Arc<dyn ExecutionPlan> =
            Arc::new(CoalescePartitionsExec::new(Arc::clone(&small)));
        let rows = |plan: &Arc<dyn ExecutionPlan>| plan_statistics(plan).unwrap().num_rows;
        let (first, again, other, above) = with_statistics_of_one_pass(|| {
            let first = plan_statistics(&small).unwrap();
            let again = plan_statistics(&small).unwrap();
            (first, again, rows(&large), rows(&merged))
        });
        // The second answer is the cached one itself.
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(first.num_rows, Precision::Exact(7));
        assert_eq!(other, Precision::Exact(100));
        assert_eq!(above, Precision::Exact(7));
        // Outside a pass, nothing is cached.
        let outside = plan_statistics(&small).unwrap();
        assert!(!Arc::ptr_eq(&first, &outside));
        assert_eq!(outside.num_rows, Precision::Exact(7));
        // Passes nest: the inner one has a cache of its own, and the outer
        // one finds its own again after it.
        with_statistics_of_one_pass(|| {
            let outer = plan_statistics(&small).unwrap();
            let inner = with_statistics_of_one_pass(|| plan_statistics(&small).unwrap());
            assert!(!Arc::ptr_eq(&outer, &inner));
            assert!(Arc::ptr_eq(&outer, &plan_statistics(&small).unwrap()));
        });
    }
}
