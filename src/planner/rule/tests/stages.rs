//! Plans whose output partitions are run apart, each by its own task (a
//! distributed query stage): the rewrite keeps each partition's rows.

use super::*;
use datafusion::physical_plan::empty::EmptyExec;

/// The stages a distributed engine cuts `plan` into: the plan and the
/// input of each exchange in it (a hash repartition or a merge of
/// partitions), each down to the exchanges below it, which become leaves
/// of the same partitions (the readers of the rows the stages below wrote).
/// Each stage runs one task a partition.
fn stages(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut roots = vec![Arc::clone(plan)];
    plan.apply(|node| {
        if is_exchange(node) {
            roots.push(Arc::clone(node.children()[0]));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    roots.into_iter().map(cut_at_exchanges).collect()
}

fn is_exchange(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.downcast_ref::<RepartitionExec>()
        .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..)))
        || node.is::<CoalescePartitionsExec>()
}

fn cut_at_exchanges(stage: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    if is_exchange(&stage) {
        let reader = EmptyExec::new(stage.schema()).with_partitions(partitions(&stage));
        return Arc::new(reader);
    }
    let children = stage
        .children()
        .into_iter()
        .map(|child| cut_at_exchanges(Arc::clone(child)))
        .collect();
    replace_children_if_necessary(stage, children).unwrap()
}

/// The nodes of `plan` that merge or deal out partitions.
fn exchanges(plan: &Arc<dyn ExecutionPlan>) -> usize {
    nodes_of::<RepartitionExec>(plan).len()
        + nodes_of::<CoalescePartitionsExec>(plan).len()
        + nodes_of::<SortPreservingMergeExec>(plan).len()
}

fn partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    plan.properties().output_partitioning().partition_count()
}

#[tokio::test]
async fn a_stage_keeps_its_output_partitions_and_sorts_and_merges_none_of_them() {
    // Joins in both modes: partitioned (both sides exchanged) and
    // collecting the build side whole (the probe side read in place).
    let mut contexts = Vec::new();
    for collect_left_bytes in [0, 1 << 30] {
        let ctx = SessionContext::new_with_config(collect_left_below(collect_left_bytes));
        ctx.register_table("r", table(4)).unwrap();
        ctx.register_table("s", table(3)).unwrap();
        ctx.register_table("t", table(1)).unwrap();
        contexts.push(ctx);
    }
    let options = GpuOptions {
        placement: PlacementPolicy::Always,
        ..GpuOptions::default()
    };
    // Shapes whose GPU nodes may run over all partitions where the caller
    // merges the plan's output (an aggregation above a join reading every
    // probe partition), a sort the GPU aggregation below it would take
    // over (TPC-H q8's final stage), and aggregations, stacked joins and
    // sorted joins in stages.
    let queries = [
        "SELECT count(*), sum(r.v), sum(s.v) FROM r JOIN s ON r.k = s.k",
        "SELECT r.v, sum(s.v) FROM r JOIN s ON r.k = s.k GROUP BY r.v",
        "SELECT k, count(*) FROM r GROUP BY k",
        "SELECT r.k, s.v, t.v FROM r JOIN s ON r.k = s.k JOIN t ON s.k = t.k",
        "SELECT count(*) FROM r JOIN t ON r.k = t.k",
        "SELECT s.k, sum(r.v) FROM r JOIN s ON r.k = s.k GROUP BY s.k",
        "SELECT r.k, s.v FROM r JOIN s ON r.k = s.k ORDER BY r.k",
        "SELECT k, count(*) FROM r GROUP BY k ORDER BY k",
        "SELECT r.k, x.c FROM r JOIN (SELECT k, count(*) AS c FROM s GROUP BY k) x ON r.k = x.k",
    ];
    let mut merged_rewrites_that_differ = 0;
    let mut gpu_nodes_apart = 0;
    for (sql, ctx) in queries
        .iter()
        .flat_map(|q| contexts.iter().map(move |c| (q, c)))
    {
        let plan = physical_plan_of(ctx, sql).await;
        for stage in stages(&plan) {
            let apart = rewrite_plan(
                Arc::clone(&stage),
                &options,
                Ok(()),
                RootPartitions::RunApart,
            )
            .unwrap();
            let context = || {
                format!(
                    "{sql}\nstage:\n{}\nrewritten:\n{}",
                    show(&stage),
                    show(&apart)
                )
            };
            assert_eq!(partitions(&apart), partitions(&stage), "{}", context());
            assert!(exchanges(&apart) <= exchanges(&stage), "{}", context());
            let sorts = |plan| nodes_of::<SortExec>(plan).len();
            assert_eq!(sorts(&apart), sorts(&stage), "{}", context());
            for join in gpu_joins(&apart) {
                assert!(!join.repartition_removed(), "{}", context());
            }
            apart
                .apply(|node| {
                    gpu_nodes_apart += usize::from(node.name().starts_with("Gpu"));
                    Ok(TreeNodeRecursion::Continue)
                })
                .unwrap();
            let merged =
                rewrite_plan(Arc::clone(&stage), &options, Ok(()), RootPartitions::Merged).unwrap();
            if partitions(&merged) != partitions(&stage)
                || exchanges(&merged) > exchanges(&stage)
                || sorts(&merged) != sorts(&stage)
            {
                merged_rewrites_that_differ += 1;
            }
        }
    }
    // The shapes are ones the rule rewrites over all partitions where it
    // may: a check that holds only because nothing changed proves nothing.
    assert!(
        merged_rewrites_that_differ >= 3,
        "{merged_rewrites_that_differ}"
    );
    // The stages still run on the GPU.
    assert!(gpu_nodes_apart >= queries.len(), "{gpu_nodes_apart}");
}
