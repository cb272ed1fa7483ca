//! The TPC-H-derived queries through a Ballista cluster of a GPU and a CPU
//! executor in this process, against DataFusion alone. Without a GPU the
//! GPU executor runs its stages as they came (the test says so); with one,
//! the stages run with every supported node forced onto the GPU and the
//! test fails where no stage had a GPU node.

#[path = "../examples/common/cluster.rs"]
mod cluster;
#[path = "../../tests/common/slt_files.rs"]
mod slt_files;
#[path = "../../examples/common/tpch.rs"]
mod tpch_data;

use std::time::Duration;

use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use indicatif::ProgressBar;

use cluster::Executor;
use tpch_data::{answers_agree, query_sql, write_parquet_tables, TABLES};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpch_queries_through_gpu_and_cpu_executors_answer_as_datafusion_does() {
    let test_files = slt_files::find_test_files().unwrap();
    let folder = std::env::temp_dir().join(format!(
        "datafusion-gpu-ballista-tpch-{}",
        std::process::id()
    ));
    let sf = 0.01;
    write_parquet_tables(&folder, sf, 2, &ProgressBar::hidden())
        .await
        .unwrap();
    let gpu = datafusion_gpu::gpu_status();
    let require_gpu = std::env::var_os("DATAFUSION_GPU_REQUIRE_GPU").is_some();
    if let Err(e) = &gpu {
        assert!(!require_gpu, "DATAFUSION_GPU_REQUIRE_GPU is set, but: {e}");
        println!("SKIPPED (GPU part): no GPU ({e}); the GPU executor runs its stages as they came");
    }
    let local = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    let cluster = cluster::start(&[Executor::Gpu, Executor::Cpu], 2, 4)
        .await
        .unwrap();
    cluster
        .ctx
        .sql("SET gpu.placement = 'always'")
        .await
        .unwrap();
    for name in TABLES {
        let path = folder.join(name);
        for ctx in [&local, &cluster.ctx] {
            ctx.register_parquet(name, path.to_str().unwrap(), ParquetReadOptions::default())
                .await
                .unwrap();
        }
    }
    for q in 1..=22 {
        let sql = query_sql(&test_files, q).unwrap();
        let expected = local.sql(&sql).await.unwrap().collect().await.unwrap();
        // A cluster that lost its executors waits minutes for them; the
        // executors catch the signals that would stop the test process.
        let answer = tokio::time::timeout(Duration::from_secs(120), async {
            cluster.ctx.sql(&sql).await?.collect().await
        })
        .await
        .unwrap_or_else(|_| panic!("q{q}: no answer from the cluster in 120 s"))
        .unwrap();
        if let Err(why) = answers_agree(&expected, &answer).unwrap() {
            panic!("q{q}: {why}");
        }
    }
    // The GPU executor took its share of the tasks.
    assert!(cluster.stages_made() > 0, "the GPU executor ran no task");
    if gpu.is_ok() {
        assert!(cluster.stages_on_gpu() > 0, "no stage ran a GPU node");
    } else {
        assert_eq!(cluster.stages_on_gpu(), 0);
    }
    let _ = std::fs::remove_dir_all(&folder);
}
