//! Waiting for join keys before a scan reads: a scan whose rows are tested
//! against the keys of a build side that DataFusion reads in one partition
//! starts once that side was read, so that the test drops rows from the
//! first batch on. DataFusion may start such a scan early: a merge of
//! partitions, as on the build side of another join below, starts reading
//! its input when it is executed, before the join above it reads anything.

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::statistics::ChildStats;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
    Statistics, StatisticsArgs,
};
use futures::TryStreamExt;

use super::expr::JoinKeyFilterExpr;
use super::set::{JoinKeySet, MAX_KEY_WAIT};

/// The sets of the join key tests in `predicates`.
pub(crate) fn key_sets_in<'a>(
    predicates: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
) -> Vec<Arc<JoinKeySet>> {
    let mut sets: Vec<Arc<JoinKeySet>> = Vec::new();
    for predicate in predicates {
        let _ = predicate.apply(|expr| {
            if let Some(test) = expr.downcast_ref::<JoinKeyFilterExpr>() {
                if !sets.iter().any(|set| Arc::ptr_eq(set, test.keys())) {
                    sets.push(Arc::clone(test.keys()));
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
    sets
}

/// What a scan executed now waits for before it reads: the latest round
/// of each of `sets` whose build side is read in one partition, taken now
/// (to be called when the scan is executed, after the joins' build sides
/// were), and, when first polled, the latest round of each other set read
/// ahead of its join ([`JoinKeySet::reads_ahead`]), a set of a probe side
/// among them whatever its partitions. See [`JoinKeySet::settled`].
pub(crate) fn waits_for(sets: &[Arc<JoinKeySet>]) -> impl std::future::Future<Output = ()> + Send {
    let (single, others): (Vec<_>, Vec<_>) =
        sets.iter().cloned().partition(|set| set.partitions() == 1 && !set.is_of_probe_side());
    let waits: Vec<_> = single
        .iter()
        .map(|set| set.settled(set.round(), MAX_KEY_WAIT))
        .collect();
    async move {
        let read_ahead = others
            .iter()
            .filter(|set| set.reads_ahead())
            .map(|set| set.settled(set.round(), MAX_KEY_WAIT));
        futures::future::join_all(read_ahead).await;
        futures::future::join_all(waits).await;
    }
}

/// Passes a table scan through once the join keys that a host test above
/// it reads are there (see the module docs): placed between the scan and
/// the `FilterExec` that tests them, for sets whose build side has one
/// partition.
pub struct JoinKeyWaitExec {
    input: Arc<dyn ExecutionPlan>,
    sets: Vec<Arc<JoinKeySet>>,
}

impl JoinKeyWaitExec {
    /// `input`, read once the keys of `sets` are there.
    pub fn new(input: Arc<dyn ExecutionPlan>, sets: Vec<Arc<JoinKeySet>>) -> Self {
        Self { input, sets }
    }

    /// This node waiting for `set` too.
    pub fn with_set(&self, set: Arc<JoinKeySet>) -> Self {
        let mut sets = self.sets.clone();
        if !sets.iter().any(|s| Arc::ptr_eq(s, &set)) {
            sets.push(set);
        }
        Self::new(Arc::clone(&self.input), sets)
    }

    /// The scan.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl fmt::Debug for JoinKeyWaitExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<usize> = self.sets.iter().map(|set| set.id()).collect();
        f.debug_struct("JoinKeyWaitExec").field("sets", &ids).finish()
    }
}

impl DisplayAs for JoinKeyWaitExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let ids: Vec<String> = self.sets.iter().map(|set| format!("#{}", set.id())).collect();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "JoinKeyWaitExec: keys={} (the scan waits for them)",
                ids.join(", ")
            ),
            DisplayFormatType::TreeRender => write!(f, "keys={}", ids.join(", ")),
        }
    }
}

impl ExecutionPlan for JoinKeyWaitExec {
    fn name(&self) -> &str {
        "JoinKeyWaitExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Self::new(input, self.sets.clone()))),
            _ => Err(DataFusionError::Internal(
                "JoinKeyWaitExec has one child".into(),
            )),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(crate::exec::input_statistics(input_stats, &self.schema()))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        // The rounds are taken now, when the joins' build sides were
        // executed; the scan is executed once they are there.
        let waits = waits_for(&self.sets);
        let input = Arc::clone(&self.input);
        let stream = futures::stream::once(async move {
            waits.await;
            input.execute(partition, context)
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::filter::FilterExec;
    use std::time::Duration;

    #[test]
    fn a_host_test_reads_its_scan_once_a_one_partition_set_is_there() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let column = Arc::new(Int64Array::from((0..100).collect::<Vec<i64>>()));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column]).unwrap();
        let scan = MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap();
        let set = Arc::new(JoinKeySet::new(1));
        let test: Arc<dyn PhysicalExpr> = Arc::new(JoinKeyFilterExpr::new(
            Arc::new(Column::new("k", 0)),
            Arc::clone(&set),
            Some((0, 99)),
        ));
        assert_eq!(key_sets_in([&test]).len(), 1);
        let waiting = Arc::new(JoinKeyWaitExec::new(scan, key_sets_in([&test])));
        let plan = Arc::new(FilterExec::try_new(test, waiting).unwrap());
        // The build side is executed before the scan, and read after it:
        // the scan waits, and its rows are tested.
        let round = set.start(0);
        let context = Arc::new(TaskContext::default());
        let stream = plan.execute(0, context).unwrap();
        let maker = Arc::clone(&set);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            maker.finish(round, Some(vec![3, 50, 77, 500]));
        });
        let batches: Vec<RecordBatch> =
            futures::executor::block_on(stream.try_collect()).unwrap();
        let kept: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(kept, [3, 50, 77]);
    }

    /// Whether `wait` resolves within `within`, polled on another thread.
    fn resolves_within(wait: impl std::future::Future<Output = ()> + Send + 'static, within: Duration) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            futures::executor::block_on(wait);
            let _ = done.send(());
        });
        finished.recv_timeout(within).is_ok()
    }

    #[test]
    fn a_scan_waits_for_a_probe_sides_set_only_where_it_is_read_ahead() {
        let long = Duration::from_secs(60);
        // Its join reads a probe side after its build side: a set of one
        // probe partition not read ahead is not waited for (one of a build
        // side is, from the moment the scan is executed).
        let probe = Arc::new(JoinKeySet::of_probe_side(1));
        let build = Arc::new(JoinKeySet::new(1));
        assert!(probe.is_of_probe_side() && !build.is_of_probe_side());
        probe.start(0);
        build.start(0);
        assert!(resolves_within(waits_for(std::slice::from_ref(&probe)), long));
        assert!(!resolves_within(waits_for(&[build]), Duration::from_millis(50)));

        // Read ahead, it is waited for until its set is made.
        let round = probe.start(0);
        probe.read_ahead(round);
        let wait = waits_for(std::slice::from_ref(&probe));
        assert!(!resolves_within(wait, Duration::from_millis(50)), "no set yet");
        let wait = waits_for(std::slice::from_ref(&probe));
        probe.finish(round, Some(vec![4, 9]));
        assert!(resolves_within(wait, long), "the set made");
        assert!(probe.keys().is_some_and(|keys| keys.contains(9)));

        // A partition left to its join (too large to hold) ends the round
        // at once, with no set: the join reads it only after the scan.
        let round = probe.start(0);
        probe.read_ahead(round);
        let wait = waits_for(std::slice::from_ref(&probe));
        assert!(!resolves_within(wait, Duration::from_millis(50)), "no set yet");
        let wait = waits_for(std::slice::from_ref(&probe));
        probe.read_by_join(round);
        assert!(resolves_within(wait, Duration::from_secs(1)), "no set to come");
        probe.finish(round, Some(vec![1]));
        assert!(probe.keys().is_none());
    }
}
