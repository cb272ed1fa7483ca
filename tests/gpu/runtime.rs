//! Detection, fallback and the rule's decisions, on machines with and
//! without a GPU.

use datafusion::prelude::SessionConfig;
use datafusion_gpu::{gpu_decisions, gpu_session_context, gpu_status, Placement};

use crate::support::*;

#[test]
fn detection_never_panics_and_reports_a_reason() {
    match gpu_status() {
        Ok(description) => assert!(description.contains("GPU 0"), "{description}"),
        Err(reason) => assert!(!reason.0.is_empty()),
    }
}

#[tokio::test]
async fn without_a_gpu_joins_and_aggregations_stay_on_the_cpu_with_the_reason() {
    if gpu_status().is_ok() {
        return; // covered by the differential tests on GPU machines
    }
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(2));
    ctx.sql("SET gpu.placement = 'always'").await.unwrap();
    let r = gen_keys(1000, Keys::Permutation, 0.0, 1);
    ctx.register_table("r", key_value_table(&r, 1, 2, 100))
        .unwrap();
    ctx.register_table("s", key_value_table(&r, 2, 2, 100))
        .unwrap();
    let (batches, gpu_nodes, plan) = run(&ctx, "SELECT count(*) FROM r JOIN s ON r.k = s.k").await;
    assert_eq!(gpu_nodes, 0);
    assert_eq!(int64_rows(&batches), vec![vec![Some(1000)]]);
    let decisions = gpu_decisions(&plan, ctx.state().config_options());
    // The join, and the two phases of the aggregation above it.
    let operators: Vec<&str> = decisions.iter().map(|d| d.operator.as_str()).collect();
    assert_eq!(
        operators,
        ["AggregateExec", "AggregateExec", "HashJoinExec"],
        "{decisions:?}"
    );
    for decision in &decisions {
        match &decision.placement {
            Placement::Cpu { reason } => assert!(reason.starts_with("no GPU: "), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn unsupported_joins_stay_on_the_cpu_with_their_reason() {
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(2));
    ctx.sql("SET gpu.placement = 'always'").await.unwrap();
    let r = gen_keys(100, Keys::Permutation, 0.0, 1);
    ctx.register_table("r", key_value_table(&r, 1, 1, 100))
        .unwrap();
    ctx.register_table("s", key_value_table(&r, 2, 1, 100))
        .unwrap();
    let gpu = gpu_status().is_ok();
    let cases = [(
        "SELECT * FROM r JOIN s ON named_struct('a', r.k) = named_struct('a', s.k)",
        "key type Struct",
    )];
    for (sql, expected) in cases {
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let decisions = gpu_decisions(&plan, ctx.state().config_options());
        assert_eq!(decisions.len(), 1, "{sql}");
        match &decisions[0].placement {
            Placement::Cpu { reason } if gpu => {
                assert!(reason.contains(expected), "{sql}: {reason}")
            }
            Placement::Cpu { reason } => assert!(reason.starts_with("no GPU"), "{sql}: {reason}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn small_inputs_stay_on_the_cpu_by_their_estimates() {
    let Some(runtime) = require_gpu("small_inputs_stay_on_the_cpu_by_their_estimates") else {
        return;
    };
    // The device's constants, measured once at first use: plausible for
    // any GPU on PCIe 3 or newer, and measured in well under a second.
    let constants = runtime.devices()[0].constants().unwrap();
    let gb = 1e9;
    assert!(
        constants.pinned_to_device > gb && constants.pinned_from_device > gb,
        "{constants:?}"
    );
    assert!(constants.staged_to_device > 0.5 * gb, "{constants:?}");
    assert!(constants.staged_from_device > 0.5 * gb, "{constants:?}");
    assert!(constants.device_memory > 100.0 * gb, "{constants:?}");
    assert!(constants.launch.as_micros() < 1_000, "{constants:?}");
    assert!(constants.measured_in.as_secs_f64() < 1.0, "{constants:?}");
    assert_eq!(
        runtime.devices()[0].constants().unwrap(),
        constants,
        "measured once"
    );
    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(2));
    let r = gen_keys(100, Keys::Permutation, 0.0, 1);
    ctx.register_table("r", key_value_table(&r, 1, 1, 100))
        .unwrap();
    ctx.register_table("s", key_value_table(&r, 2, 1, 100))
        .unwrap();
    let plan = ctx
        .sql("SELECT * FROM r JOIN s ON r.k = s.k")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let decisions = gpu_decisions(&plan, ctx.state().config_options());
    match &decisions[0].placement {
        Placement::Cpu { reason } => {
            assert!(reason.starts_with("estimated GPU "), "{reason}");
            assert!(reason.contains(" against CPU "), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// `gpu.devices` chooses the devices a session's GPU nodes run on
/// (`partitions_on_gpu<N>` counts a node's partitions on device N), spreads
/// partitions over all of them by default, and keeps the plan on the CPU,
/// saying why, where it names no device of the process.
#[tokio::test]
async fn gpu_devices_chooses_the_devices_that_run_a_query() {
    let Some(runtime) = require_gpu("gpu_devices_chooses_the_devices_that_run_a_query") else {
        return;
    };
    let ordinals: Vec<usize> = runtime.devices().iter().map(|d| d.ordinal()).collect();
    let r = gen_keys(20_000, Keys::Uniform { domain: 5_000 }, 0.1, 11);
    let s = gen_keys(
        30_000,
        Keys::Zipf {
            domain: 5_000,
            s: 1.1,
        },
        0.1,
        12,
    );
    let sql = "SELECT r.k, count(*), sum(s.v) FROM r JOIN s ON r.k = s.k GROUP BY r.k";
    let partitions = 4;
    let register = |ctx: &datafusion::prelude::SessionContext| {
        ctx.register_table("r", key_value_table(&r, 1, partitions, 1_000))
            .unwrap();
        ctx.register_table("s", key_value_table(&s, 2, partitions, 1_000))
            .unwrap();
    };
    let cpu = cpu_context(JoinMode::PartitionedKept, partitions, &[]).await;
    register(&cpu);
    let ran_on = |plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
                  ordinal: usize| {
        plan_metric(plan, &format!("partitions_on_gpu{ordinal}"))
    };

    for &ordinal in &ordinals {
        let setting = format!("SET gpu.devices = '{ordinal}'");
        let gpu = gpu_context(JoinMode::PartitionedKept, partitions, &[&setting]).await;
        register(&gpu);
        let plan = physical_plan(&gpu, sql).await;
        same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
        assert!(
            ran_on(&plan, ordinal) > 0,
            "{setting}: nothing ran on GPU {ordinal}"
        );
        for &other in ordinals.iter().filter(|&&other| other != ordinal) {
            assert_eq!(
                ran_on(&plan, other),
                0,
                "{setting}: GPU {other} ran partitions"
            );
        }
    }

    // By default the join's partitions go round robin over every device.
    let gpu = gpu_context(JoinMode::PartitionedKept, partitions, &[]).await;
    register(&gpu);
    let plan = physical_plan(&gpu, sql).await;
    same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
    for &ordinal in ordinals.iter().take(partitions) {
        assert!(
            ran_on(&plan, ordinal) > 0,
            "all devices: nothing ran on GPU {ordinal}"
        );
    }

    // A device the process does not have: the CPU, with the reason.
    let missing = ordinals.iter().max().map_or(0, |last| last + 1);
    let setting = format!("SET gpu.devices = '{missing}'");
    let gpu = gpu_context(JoinMode::PartitionedKept, partitions, &[&setting]).await;
    register(&gpu);
    let plan = physical_plan(&gpu, sql).await;
    same_rows_as_datafusion(&gpu, &cpu, sql, &plan).await;
    let decisions = gpu_decisions(&plan, gpu.state().config_options());
    assert!(!decisions.is_empty());
    for decision in &decisions {
        match &decision.placement {
            Placement::Cpu { reason } => {
                assert!(reason.contains("names no device"), "{setting}: {reason}")
            }
            other => panic!("{setting}: {other:?}"),
        }
    }
    assert_eq!(ran_on(&plan, missing), 0);
    assert!(gpu.sql("SET gpu.devices = 'first'").await.is_err());
}
