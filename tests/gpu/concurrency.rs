//! Several sessions with different shares of device memory run GPU joins,
//! sort-merge joins and aggregations at once; half their streams are
//! dropped after one batch and one is left unpolled for a minute. The rest
//! must answer as DataFusion does, nothing may hang, a new query must run
//! after, and, where this test has the device to itself
//! (`DATAFUSION_GPU_TEST_ALONE=1`, as the bundle's run script runs it),
//! the device budget must be back to zero.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::physical_plan::execute_stream;
use datafusion::prelude::SessionContext;
use futures::StreamExt;

use crate::join_types::{shape, typed_table_in};
use crate::support::*;

/// Set where nothing else uses the device while this test runs.
const ALONE_VAR: &str = "DATAFUSION_GPU_TEST_ALONE";

/// How long the idle stream stays unpolled while the others run.
const IDLE: Duration = Duration::from_secs(60);

/// Past this, a query or the test has hung.
const LIMIT: Duration = Duration::from_secs(240);

/// The mix: joins of several types, a sort-merge join, aggregations, and a
/// join under an aggregation. `r` has 2^16 rows, `s` 2^18.
const QUERIES: &[&str] = &[
    "SELECT r.id, s.id FROM r JOIN s ON r.k64 = s.k64",
    "SELECT r.id, s.v FROM r LEFT JOIN s ON r.k32 = s.k32 AND r.kb = s.kb",
    "SELECT s.id FROM s LEFT ANTI JOIN r ON s.ks = r.ks",
    "SELECT k64, count(*), sum(v), min(id) FROM s GROUP BY k64",
    "SELECT r.k64, count(*), sum(s.v) FROM r JOIN s ON r.k64 = s.k64 GROUP BY r.k64",
    "SELECT r.id, s.id FROM r FULL JOIN s ON r.kd = s.kd",
];

/// The same queries through a sort-merge join where DataFusion plans one.
const SORT_MERGE: &str = "SET datafusion.optimizer.prefer_hash_join = false";

async fn session(
    r: &Arc<datafusion::datasource::MemTable>,
    s: &Arc<datafusion::datasource::MemTable>,
    gpu: bool,
    settings: &[&str],
) -> SessionContext {
    let ctx = match gpu {
        true => gpu_context(JoinMode::Partitioned, 4, settings).await,
        false => cpu_context(JoinMode::Partitioned, 4, settings).await,
    };
    ctx.register_table("r", Arc::clone(r) as _).unwrap();
    ctx.register_table("s", Arc::clone(s) as _).unwrap();
    ctx
}

/// Runs `sql` to the end, or reads one batch and drops the stream.
async fn run_or_drop(ctx: &SessionContext, sql: &str, drop_early: bool) -> Option<Vec<String>> {
    let plan = physical_plan(ctx, sql).await;
    let mut stream = execute_stream(plan, ctx.task_ctx()).unwrap();
    if drop_early {
        if let Some(batch) = stream.next().await {
            batch.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        return None;
    }
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        batches.push(batch.unwrap_or_else(|e| panic!("{sql}: {e}")));
    }
    Some(string_rows(&batches))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn sessions_dropping_and_idling_streams_leave_the_device_as_they_found_it() {
    let Some(runtime) = require_gpu(
        "concurrency::sessions_dropping_and_idling_streams_leave_the_device_as_they_found_it",
    ) else {
        return;
    };
    let r = typed_table_in(shape(1 << 16, 1 << 17, 20, 0), 5, 4);
    let s = typed_table_in(shape(1 << 18, 1 << 17, 20, 0), 6, 4);
    // Each query's answer on the CPU, with hash and with sort-merge joins.
    let mut expected = Vec::new();
    for settings in [&[][..], &[SORT_MERGE][..]] {
        let cpu = session(&r, &s, false, settings).await;
        for sql in QUERIES {
            expected.push(run_or_drop(&cpu, sql, false).await.unwrap());
        }
    }
    let expected = Arc::new(expected);

    // The idle stream: its first batch read, then left alone.
    let idle_ctx = session(&r, &s, true, &["SET gpu.memory_fraction = 0.05"]).await;
    let plan = physical_plan(&idle_ctx, QUERIES[0]).await;
    let mut idle = execute_stream(plan, idle_ctx.task_ctx()).unwrap();
    let first = idle.next().await.unwrap().unwrap().num_rows();
    let idle_since = Instant::now();

    let fractions = [0.001, 0.01, 0.05, 0.2, 0.5, 0.8];
    let mut sessions = tokio::task::JoinSet::new();
    for (i, fraction) in fractions.into_iter().enumerate() {
        let (r, s, expected) = (Arc::clone(&r), Arc::clone(&s), Arc::clone(&expected));
        sessions.spawn(async move {
            let memory = format!("SET gpu.memory_fraction = {fraction}");
            let sort_merge = i % 2 == 1;
            let mut settings = vec![memory.as_str()];
            if sort_merge {
                settings.push(SORT_MERGE);
            }
            let ctx = session(&r, &s, true, &settings).await;
            let mut answered = 0;
            for (q, sql) in QUERIES.iter().enumerate() {
                let drop_early = (i + q) % 2 == 0;
                let got = tokio::time::timeout(LIMIT, run_or_drop(&ctx, sql, drop_early))
                    .await
                    .unwrap_or_else(|_| panic!("{sql} at {fraction}: no answer in {LIMIT:?}"));
                if let Some(rows) = got {
                    let want = &expected[q + usize::from(sort_merge) * QUERIES.len()];
                    assert_eq!(rows.len(), want.len(), "{sql} at {fraction}: row counts");
                    assert!(rows == *want, "{sql} at {fraction}: answers differ");
                    answered += 1;
                }
            }
            answered
        });
    }
    let mut answered = 0;
    while let Some(done) = sessions.join_next().await {
        answered += done.unwrap_or_else(|e| panic!("a session failed: {e}"));
    }
    assert_eq!(answered, fractions.len() * QUERIES.len() / 2);

    // The idle stream, after its minute, still answers (the rest of it).
    tokio::time::sleep(IDLE.saturating_sub(idle_since.elapsed())).await;
    let mut rest = 0;
    while let Some(batch) = tokio::time::timeout(LIMIT, idle.next())
        .await
        .expect("the idle stream hung")
    {
        rest += batch.unwrap().num_rows();
    }
    assert_eq!(first + rest, expected[0].len(), "the idle stream's rows");
    drop(idle);

    // A new query runs, and answers.
    let after = session(&r, &s, true, &[]).await;
    let rows = tokio::time::timeout(LIMIT, run_or_drop(&after, QUERIES[4], false))
        .await
        .expect("a query after the others hung")
        .unwrap();
    assert!(rows == expected[4], "the query after the others differs");

    if std::env::var(ALONE_VAR).is_ok_and(|v| v == "1") {
        // Work of dropped streams may still finish off the runtime's threads.
        let budgets: Vec<_> = runtime
            .devices()
            .iter()
            .map(|d| Arc::clone(d.budget()))
            .collect();
        // The column cache keeps what the scans read, by design (the fill
        // ahead reads a key-only scan's table even where the scan then
        // leaves it to DataFusion): emptied, every byte must come back.
        // Emptied again while waiting, for a dropped query's last upload.
        let deadline = Instant::now() + Duration::from_secs(30);
        let in_use = || budgets.iter().map(|b| b.in_use()).sum::<usize>();
        datafusion_gpu::clear_gpu_cache();
        while in_use() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            datafusion_gpu::clear_gpu_cache();
        }
        assert_eq!(
            in_use(),
            0,
            "device memory still reserved after every query ended"
        );
    }
}
