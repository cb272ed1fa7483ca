//! Quickstart: two generated tables, the GPU rule registered, a join +
//! aggregate in SQL. Prints the answer, the physical plan, and where each join
//! and aggregation ran and why. Runs on any machine: without a GPU they stay
//! on DataFusion's CPU operators and the reason is printed.
//!
//!     cargo run --release --example quickstart [ROWS]

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::physical_plan::displayable;
use datafusion::prelude::SessionConfig;
use datafusion_gpu::{gpu_decisions, gpu_session_context, gpu_status};

/// `rows` rows of (id, amount) split over `partitions` partitions; ids are
/// `id_of(i)`.
fn table(rows: usize, partitions: usize, id_of: impl Fn(usize) -> i64) -> Result<Arc<MemTable>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Int64, false),
    ]));
    let per_partition = rows.div_ceil(partitions);
    let mut parts = Vec::new();
    for p in 0..partitions {
        let range = (p * per_partition).min(rows)..((p + 1) * per_partition).min(rows);
        let ids = Int64Array::from_iter_values(range.clone().map(&id_of));
        let amounts = Int64Array::from_iter_values(range.map(|i| (i % 1000) as i64));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(ids) as ArrayRef, Arc::new(amounts)],
        )?;
        parts.push(vec![batch]);
    }
    Ok(Arc::new(MemTable::try_new(schema, parts)?))
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let partitions = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4);

    match gpu_status() {
        Ok(devices) => println!("{devices}"),
        Err(reason) => println!("{reason}; queries run on DataFusion's CPU operators"),
    }

    let ctx = gpu_session_context(SessionConfig::new().with_target_partitions(partitions));
    // customers: ids 0..rows; orders: rows orders, each for customer (7 * i) % rows.
    ctx.register_table("customers", table(rows, partitions, |i| i as i64)?)?;
    ctx.register_table(
        "orders",
        table(rows, partitions, |i| ((7 * i) % rows) as i64)?,
    )?;

    let sql =
        "SELECT count(*) AS orders, sum(o.amount) AS order_total, sum(c.amount) AS customer_total \
               FROM orders o JOIN customers c ON o.id = c.id";
    let df = ctx.sql(sql).await?;
    let plan = df.create_physical_plan().await?;
    let answer = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;

    println!("\n{sql}\n{}", pretty_format_batches(&answer)?);
    println!(
        "\nPhysical plan:\n{}",
        displayable(plan.as_ref()).indent(false)
    );
    println!("Joins:");
    for decision in gpu_decisions(&plan, ctx.state().config_options()) {
        println!("  {decision}");
    }
    Ok(())
}
