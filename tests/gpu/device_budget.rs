//! The device budget under pressure: no share of device memory hangs a
//! join, alone or beside another one building its table at the same time.
//! (Other tests share the device's budget while these run, so what is in
//! use at the end is not asserted here.)

use std::sync::Arc;
use std::time::Duration;

use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use crate::join_types::{shape, typed_table_in};
use crate::support::*;

/// A left join whose build side (2^20 rows, `r`) is partitioned on the
/// device while its probe side (2^22 rows, `s`) waits, with an aggregate
/// above so that the answer is small.
const SQL: &str =
    "SELECT count(*), sum(r.id), sum(s.id), count(s.id) FROM r LEFT JOIN s ON r.k64 = s.k64";

/// Longer than any of these queries takes on the host; reached only by a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// The join's two tables, made once and shared by every session.
struct Tables {
    r: Arc<MemTable>,
    s: Arc<MemTable>,
}

impl Tables {
    fn new() -> Self {
        Self {
            r: typed_table_in(shape(1 << 20, 1 << 20, 0, 0), 1, 4),
            s: typed_table_in(shape(1 << 22, 1 << 20, 0, 0), 2, 4),
        }
    }

    /// A session over the tables: on the GPU with `fraction` of the
    /// device's memory, or on the CPU without one.
    async fn session(&self, fraction: Option<f64>) -> SessionContext {
        let settings: Vec<String> = fraction
            .map(|f| format!("SET gpu.memory_fraction = {f:.12}"))
            .into_iter()
            .collect();
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let ctx = match fraction {
            Some(_) => gpu_context(JoinMode::CollectLeft, 4, &settings).await,
            None => cpu_context(JoinMode::CollectLeft, 4, &[]).await,
        };
        ctx.register_table("r", Arc::clone(&self.r) as _).unwrap();
        ctx.register_table("s", Arc::clone(&self.s) as _).unwrap();
        ctx
    }
}

/// The query's rows, or a failure naming the budget where it hung.
async fn answer(ctx: &SessionContext, budget: &str) -> Vec<Vec<Option<i64>>> {
    let (batches, gpu_joins, _) = tokio::time::timeout(LIMIT, run(ctx, SQL))
        .await
        .unwrap_or_else(|_| panic!("the join did not finish in {LIMIT:?} at {budget}"));
    assert_eq!(
        gpu_joins, 1,
        "the join was not planned on the GPU at {budget}"
    );
    int64_rows(&batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn no_device_budget_hangs_a_join_alone_or_beside_another() {
    let Some(runtime) = require_gpu("no_device_budget_hangs_a_join_alone_or_beside_another") else {
        return;
    };
    let free = runtime.devices()[0].budget().free_at_open() as f64;
    let tables = Tables::new();
    let (expected, _, _) = run(&tables.session(None).await, SQL).await;
    let expected = int64_rows(&expected);
    // Budgets from 1 MiB to 512 MiB, 1.25x apart: below what the build
    // table needs (the chunks fall back to the host), across the band
    // where its scratch fits and the table beside it does not, and above.
    let mut bytes = (1u64 << 20) as f64;
    let mut budgets = Vec::new();
    while bytes <= (512u64 << 20) as f64 {
        budgets.push(bytes);
        bytes *= 1.25;
    }
    for &bytes in &budgets {
        let budget = format!("a budget of {:.1} MiB", bytes / (1u64 << 20) as f64);
        let ctx = tables.session(Some(bytes / free)).await;
        assert_eq!(answer(&ctx, &budget).await, expected, "{budget}");
    }
    // Two joins building their tables at once, each in its own session, at
    // every fourth budget: neither waits for the other's scratch forever.
    for &bytes in budgets.iter().step_by(4) {
        let budget = format!(
            "two joins at a budget of {:.1} MiB",
            bytes / (1u64 << 20) as f64
        );
        let (a, b) = (
            tables.session(Some(bytes / free)).await,
            tables.session(Some(bytes / free)).await,
        );
        let (first, second) = tokio::join!(answer(&a, &budget), answer(&b, &budget));
        assert_eq!(first, expected, "{budget}");
        assert_eq!(second, expected, "{budget}");
    }
}
