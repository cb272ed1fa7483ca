//! A kernel fault breaks the CUDA context it happens in for good (the
//! driver's "sticky" errors). The query that holds the broken device
//! answers on the CPU. Later queries run on the device opened again where
//! the driver allows a new context (again after a second fault); where it
//! refuses (CUDA 13.0 does), they are planned on the CPU and say why.
//!
//! Breaking the context disturbs every other test using the device, so this
//! runs only where it has the device to itself
//! (`DATAFUSION_GPU_TEST_ALONE=1`, as the bundle's run script runs it) and
//! prints a SKIPPED line otherwise.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::physical_plan::{common::collect, execute_stream};
use datafusion::prelude::SessionContext;

use datafusion_gpu::gpu_decisions;

use crate::support::*;

/// Set where nothing else uses the device while this test runs.
const ALONE_VAR: &str = "DATAFUSION_GPU_TEST_ALONE";

const SQL: &str = "SELECT r.k, r.v, s.v FROM r JOIN s ON r.k = s.k";

/// Past this, a query has hung.
const LIMIT: Duration = Duration::from_secs(120);

/// Both sides' keys: 2^14 and 2^16 rows over 2^12 values with NULLs, so the
/// join has duplicates on both sides and NULLs that match nothing.
fn register(ctx: &SessionContext) {
    let r = key_value_table(
        &gen_keys(1 << 14, Keys::Uniform { domain: 1 << 12 }, 0.05, 1),
        7,
        1,
        4096,
    );
    let s = key_value_table(
        &gen_keys(1 << 16, Keys::Uniform { domain: 1 << 12 }, 0.05, 2),
        9,
        1,
        4096,
    );
    ctx.register_table("r", r).unwrap();
    ctx.register_table("s", s).unwrap();
}

/// Device errors fall back to the CPU here, as under the defaults (the
/// other tests make them fail the query). The GPU session uses the device
/// numbered `ordinal` alone (`gpu.devices`), so that on a machine with more
/// than one the test breaks the device its queries run on.
async fn contexts(ordinal: usize) -> (SessionContext, SessionContext) {
    let one_device = format!("SET gpu.devices = '{ordinal}'");
    let fall_back = [
        "SET gpu_test.device_errors_fail = false",
        one_device.as_str(),
    ];
    let gpu = gpu_context(JoinMode::CollectLeft, 1, &fall_back).await;
    let cpu = cpu_context(JoinMode::CollectLeft, 1, &[]).await;
    register(&gpu);
    register(&cpu);
    (gpu, cpu)
}

/// Device errors a plan's GPU nodes met and answered on the CPU instead.
fn device_error_fallbacks(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> usize {
    plan_metric(plan, "device_error_fallback_chunks")
        + plan_metric(plan, "device_error_fallback_partitions")
}

/// Runs the query on the GPU, checks its answer against `expected`, and
/// returns how many device errors it answered on the CPU.
async fn gpu_answer(gpu: &SessionContext, expected: &[Vec<Option<i64>>], when: &str) -> usize {
    let (batches, gpu_joins, plan) = tokio::time::timeout(LIMIT, run(gpu, SQL))
        .await
        .unwrap_or_else(|_| panic!("the join hung {when}"));
    assert!(gpu_joins > 0, "no join ran on the GPU {when}");
    assert!(
        int64_rows(&batches) == expected,
        "the join's answer differs {when}"
    );
    device_error_fallbacks(&plan)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kernel_fault_ends_on_the_cpu_and_keeps_new_work_off_the_broken_device() {
    let test =
        "device_fault::a_kernel_fault_ends_on_the_cpu_and_keeps_new_work_off_the_broken_device";
    let Some(runtime) = require_gpu(test) else {
        return;
    };
    if !std::env::var(ALONE_VAR).is_ok_and(|v| v == "1") {
        eprintln!(
            "SKIPPED {test}: it breaks the device's context, so it runs only alone ({ALONE_VAR}=1)"
        );
        return;
    }
    let broken = runtime.devices()[0].clone();
    let (gpu, cpu) = contexts(broken.ordinal()).await;
    let expected = int64_rows(&run(&cpu, SQL).await.0);
    assert!(!expected.is_empty());
    assert_eq!(gpu_answer(&gpu, &expected, "before any fault").await, 0);
    let resets = runtime.context_resets();

    // A fault while a query holds the device: that query answers on the CPU.
    let plan = physical_plan(&gpu, SQL).await;
    let stream = execute_stream(Arc::clone(&plan), gpu.task_ctx()).unwrap();
    let fault = broken.break_context_for_test();
    assert!(
        fault.breaks_context(),
        "not a context-breaking error: {fault}"
    );
    let batches: Vec<RecordBatch> = tokio::time::timeout(LIMIT, collect(stream))
        .await
        .expect("the query holding the broken device hung")
        .expect("the query holding the broken device failed");
    assert!(
        int64_rows(&batches) == expected,
        "the answer beside the fault differs"
    );
    assert!(
        device_error_fallbacks(&plan) > 0,
        "the query holding the broken device did not meet its error"
    );

    drop(plan);

    let (batches, gpu_joins, plan) = tokio::time::timeout(LIMIT, run(&gpu, SQL))
        .await
        .expect("the join after the fault hung");
    assert!(
        int64_rows(&batches) == expected,
        "the answer after the fault differs"
    );
    if runtime.context_resets() == resets {
        // The driver refuses a new context after the fault (CUDA 13.0
        // does): later queries are planned on the CPU, and say why.
        assert_eq!(gpu_joins, 0, "a join was planned on the broken device");
        let reason = datafusion_gpu::gpu::gpu_availability(
            &datafusion_gpu::DeviceSelection::Ordinals(vec![broken.ordinal()]),
        )
        .unwrap_err();
        assert!(reason.contains("kernel fault broke GPU"), "{reason}");
        assert!(reason.contains("ILLEGAL_ADDRESS"), "{reason}");
        let decisions = gpu_decisions(&plan, gpu.state().config_options());
        let join = decisions
            .iter()
            .find(|d| d.operator == "HashJoinExec")
            .expect("the join's decision");
        assert!(
            join.to_string().contains("kernel fault broke GPU"),
            "{join}"
        );
        return;
    }

    // The device was opened again: later queries run on it without meeting
    // an error, and again after a second fault.
    assert!(gpu_joins > 0, "no join ran on the device opened again");
    assert_eq!(
        device_error_fallbacks(&plan),
        0,
        "the device opened again met errors"
    );
    let reopened = runtime.devices()[0].clone();
    assert!(
        !Arc::ptr_eq(&reopened, &broken),
        "the broken device is still handed out"
    );
    drop(broken);
    assert!(reopened.break_context_for_test().breaks_context());
    drop(reopened);
    assert_eq!(
        gpu_answer(&gpu, &expected, "after the second fault").await,
        0
    );
    assert_eq!(runtime.context_resets(), resets + 2);
    assert_eq!(
        runtime.devices()[0].budget().in_use(),
        0,
        "device memory still reserved"
    );
}
