//! One GPU aggregation in place of DataFusion's two phases. DataFusion
//! aggregates each input partition (`Partial`), repartitions the partial
//! groups by key on the CPU, and merges them (`FinalPartitioned`, or
//! `Final` over one merged partition), so that N CPU threads can each
//! finish a slice. The GPU groups all rows itself, so where nothing above
//! depends on the final aggregation's partitioning, the pipeline becomes
//! one `Single` aggregation over the partial aggregation's input merged
//! into one partition: the partial groups never exist (seed 002 groups all
//! rows at once; at 2^24 groups DataFusion's two phases move 16 M partial
//! groups). Where the final aggregation had several partitions, the rule
//! repartitions the groups again (by hash where something above relies on
//! it), and the CPU fallback runs DataFusion's two phases over the collected
//! input ([`cpu_phases`]), on every core. On by default
//! (`gpu.tuning.aggregate_single_phase`; BENCHMARKS.md).

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::GpuAggregateExec;

/// `final_agg` (see [`single_phase`]) with DataFusion's own partial
/// aggregation below its exchange: what the one GPU aggregation falls back
/// to, over its collected input, so that a partition the device cannot or
/// should not take still aggregates on every core.
pub(super) fn cpu_phases(final_agg: &AggregateExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let exchange = Arc::clone(final_agg.input());
    let Some(below) = exchange.children().first().copied() else {
        return Ok(None);
    };
    let partial: Arc<dyn ExecutionPlan> = match below.downcast_ref::<GpuAggregateExec>() {
        Some(gpu) => Arc::new(gpu.aggregate().clone()),
        None => Arc::clone(below),
    };
    #[allow(deprecated)]
    let exchange = exchange.with_new_children(vec![partial])?;
    #[allow(deprecated)]
    let cpu = Arc::new(final_agg.clone()).with_new_children(vec![exchange])?;
    Ok(Some(cpu))
}

/// The `Single` aggregation computing what `final_agg` computes, when
/// `final_agg` is a `Final` or `FinalPartitioned` aggregation over a
/// repartition or merge of a `Partial` one (already on the GPU or not);
/// `None` otherwise. The caller must have checked that the final
/// aggregation's output partitioning is free: the result has one partition.
pub(super) fn single_phase(final_agg: &AggregateExec) -> Result<Option<AggregateExec>> {
    if !matches!(
        final_agg.mode(),
        AggregateMode::Final | AggregateMode::FinalPartitioned
    ) {
        return Ok(None);
    }
    let exchange = final_agg.input();
    if !(exchange.is::<RepartitionExec>() || exchange.is::<CoalescePartitionsExec>()) {
        return Ok(None);
    }
    let Some(below) = exchange.children().first().copied() else {
        return Ok(None);
    };
    let partial = match below.downcast_ref::<GpuAggregateExec>() {
        Some(gpu) => gpu.aggregate(),
        None => match below.downcast_ref::<AggregateExec>() {
            Some(cpu) => cpu,
            None => return Ok(None),
        },
    };
    if *partial.mode() != AggregateMode::Partial {
        return Ok(None);
    }
    let input = Arc::clone(partial.input());
    let input: Arc<dyn ExecutionPlan> =
        if input.properties().output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(input))
        } else {
            input
        };
    let single = AggregateExec::try_new(
        AggregateMode::Single,
        partial.group_expr().clone(),
        partial.aggr_expr().to_vec(),
        partial.filter_expr().to_vec(),
        input,
        partial.input_schema(),
    )?;
    // The same columns, names and types as the two phases produced.
    if single.schema().fields() != final_agg.schema().fields() {
        return Ok(None);
    }
    Ok(Some(single))
}
