use std::time::Duration;

use datafusion::arrow::array::{AsArray, Int64Array, StringArray};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::JoinType;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::filter::FilterExec;

use super::*;

const WIDE: MembershipLimits = MembershipLimits {
    max_values: 150,
    max_bytes: 128 * 1024,
};
const NO_VALUES: MembershipLimits = MembershipLimits {
    max_values: 0,
    max_bytes: 0,
};

fn pieces(batches: &[&[Option<i64>]]) -> Vec<ArrayRef> {
    batches
        .iter()
        .map(|keys| Arc::new(Int64Array::from(keys.to_vec())) as ArrayRef)
        .collect()
}

fn probe_schema(keys: usize) -> SchemaRef {
    Arc::new(Schema::new(
        (0..keys)
            .map(|i| Field::new(format!("k{i}"), DataType::Int64, true))
            .collect::<Vec<_>>(),
    ))
}

fn probe_keys(keys: usize) -> Vec<PhysicalExprRef> {
    (0..keys)
        .map(|i| Arc::new(Column::new(&format!("k{i}"), i)) as PhysicalExprRef)
        .collect()
}

/// The probe rows (each key column's values) `predicate` keeps.
fn kept(predicate: &Arc<dyn PhysicalExpr>, columns: &[Vec<Option<i64>>]) -> Vec<usize> {
    let schema = probe_schema(columns.len());
    let arrays = columns
        .iter()
        .map(|values| Arc::new(Int64Array::from(values.clone())) as ArrayRef)
        .collect();
    kept_rows(predicate, &RecordBatch::try_new(schema, arrays).unwrap())
}

/// The rows of `batch` that `predicate` keeps.
fn kept_rows(predicate: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<usize> {
    let keep = predicate
        .evaluate(batch)
        .unwrap()
        .into_array(batch.num_rows())
        .unwrap();
    let keep = keep.as_boolean();
    (0..batch.num_rows())
        .filter(|&row| keep.is_valid(row) && keep.value(row))
        .collect()
}

fn probe() -> Vec<Option<i64>> {
    vec![
        Some(0),
        Some(1),
        Some(2),
        Some(3),
        Some(4),
        Some(5),
        Some(9),
        Some(10),
        None,
    ]
}

#[test]
fn a_small_build_side_lists_its_values_within_their_range() {
    let build = [pieces(&[&[Some(1), Some(5), None], &[Some(3), Some(9)]])];
    let summary = BuildKeySummary::of(&build, WIDE);
    let predicate = summary
        .predicate(&probe_keys(1), &probe_schema(1), false)
        .unwrap()
        .expect("a filter");
    // 1, 3, 5 and 9: the listed values, not 2 or 4 between them, nor NULL.
    assert_eq!(kept(&predicate, &[probe()]), vec![1, 3, 5, 6]);

    let summary = BuildKeySummary::of(&build, NO_VALUES);
    let predicate = summary
        .predicate(&probe_keys(1), &probe_schema(1), false)
        .unwrap()
        .expect("a filter");
    // Too many values to list: the range 1..=9.
    assert_eq!(kept(&predicate, &[probe()]), vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn each_of_several_keys_keeps_to_its_own_range() {
    let build = [
        pieces(&[&[Some(1), Some(4)], &[Some(2)]]),
        pieces(&[&[Some(10), Some(30)], &[Some(20)]]),
    ];
    let summary = BuildKeySummary::of(&build, WIDE);
    assert!(summary.values.is_none(), "values are listed for one key only");
    let predicate = summary
        .predicate(&probe_keys(2), &probe_schema(2), false)
        .unwrap()
        .expect("a filter");
    let first = vec![Some(1), Some(4), Some(5), Some(2), None, Some(3)];
    let second = vec![Some(30), Some(10), Some(20), Some(31), Some(20), Some(15)];
    assert_eq!(kept(&predicate, &[first, second]), vec![0, 1, 5]);
}

#[test]
fn an_empty_or_all_null_build_side_keeps_no_probe_row_but_nulls_where_they_can_match() {
    for build in [
        vec![pieces(&[])],
        vec![pieces(&[&[]])],
        vec![pieces(&[&[None, None]])],
    ] {
        let summary = BuildKeySummary::of(&build, WIDE);
        let predicate = summary
            .predicate(&probe_keys(1), &probe_schema(1), false)
            .unwrap()
            .expect("a filter");
        assert_eq!(kept(&predicate, &[probe()]), Vec::<usize>::new(), "{build:?}");
        // `NOT IN` and NULL-equal joins keep the probe side's NULLs.
        let predicate = summary
            .predicate(&probe_keys(1), &probe_schema(1), true)
            .unwrap()
            .expect("a filter");
        assert_eq!(kept(&predicate, &[probe()]), vec![8], "{build:?}");
    }
}

#[test]
fn keys_of_a_type_the_probe_side_does_not_share_are_not_filtered() {
    let build = [pieces(&[&[Some(1), Some(5)]])];
    let summary = BuildKeySummary::of(&build, WIDE);
    let strings = Arc::new(Schema::new(vec![Field::new("k0", DataType::Utf8, true)]));
    assert!(summary
        .predicate(&probe_keys(1), &strings, false)
        .unwrap()
        .is_none());
}

#[test]
fn string_keys_are_bounded_and_listed() {
    let build = [vec![
        Arc::new(StringArray::from(vec![Some("kiwi"), None, Some("fig")])) as ArrayRef,
    ]];
    let summary = BuildKeySummary::of(&build, WIDE);
    let schema = Arc::new(Schema::new(vec![Field::new("k0", DataType::Utf8, true)]));
    let predicate = summary
        .predicate(&probe_keys(1), &schema, false)
        .unwrap()
        .expect("a filter");
    let probe = StringArray::from(vec![Some("fig"), Some("grape"), Some("kiwi"), Some("lime"), None]);
    let batch = RecordBatch::try_new(schema, vec![Arc::new(probe)]).unwrap();
    let keep = predicate.evaluate(&batch).unwrap().into_array(5).unwrap();
    let keep = keep.as_boolean();
    let kept: Vec<usize> = (0..5).filter(|&r| keep.is_valid(r) && keep.value(r)).collect();
    assert_eq!(kept, vec![0, 2]);
}

/// A hash join of `probe_rows` probe rows over a filter that reads its
/// dynamic filter (as a scan's predicate would), with `build_partitions`.
fn join_with_filter(
    mode: PartitionMode,
    build_partitions: usize,
    null_equality: NullEquality,
) -> (HashJoinExec, Arc<DynamicFilterPhysicalExpr>) {
    let schema = Arc::new(Schema::new(vec![Field::new("k0", DataType::Int64, true)]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(Int64Array::from(vec![Some(1), Some(2)]))],
    )
    .unwrap();
    let partitions = vec![vec![batch.clone()]; build_partitions];
    let build = MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
    let scan =
        MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).unwrap();
    let key: PhysicalExprRef = Arc::new(Column::new("k0", 0));
    let filter = Arc::new(DynamicFilterPhysicalExpr::new(vec![Arc::clone(&key)], lit(true)));
    let probe = Arc::new(
        FilterExec::try_new(Arc::clone(&filter) as Arc<dyn PhysicalExpr>, scan).unwrap(),
    );
    let join = HashJoinExec::try_new(
        build,
        probe,
        vec![(Arc::clone(&key), key)],
        None,
        &JoinType::Inner,
        None,
        mode,
        null_equality,
        false,
    )
    .unwrap()
    .with_dynamic_filter_expr(Arc::clone(&filter))
    .unwrap();
    (join, filter)
}

#[tokio::test]
async fn the_filter_is_published_once_every_build_side_has_reported() {
    let config = ConfigOptions::default();
    let (join, filter) = join_with_filter(PartitionMode::Partitioned, 3, NullEquality::NullEqualsNothing);
    let publisher = ProbeFilterPublisher::for_join(&join, &config).expect("a publisher");
    let reports = [
        pieces(&[&[Some(4), Some(6)]]),
        pieces(&[&[]]),
        pieces(&[&[Some(1)], &[Some(2), None]]),
    ];
    for (i, build) in reports.iter().enumerate() {
        let unchanged = filter.current().unwrap();
        assert_eq!(kept(&unchanged, &[probe()]).len(), probe().len(), "after {i} reports");
        let complete = tokio::time::timeout(Duration::from_millis(10), filter.wait_complete());
        assert!(complete.await.is_err(), "complete after {i} reports");
        publisher.report(BuildKeySummary::of(std::slice::from_ref(build), publisher.limits()));
    }
    // The union of the three: 1, 2, 4 and 6, listed.
    assert_eq!(kept(&filter.current().unwrap(), &[probe()]), vec![1, 2, 4]);
    let complete = tokio::time::timeout(Duration::from_secs(5), filter.wait_complete());
    assert!(complete.await.is_ok());
    // A report past the last changes nothing.
    publisher.report(BuildKeySummary::of(&[pieces(&[&[Some(0)]])], publisher.limits()));
    assert_eq!(kept(&filter.current().unwrap(), &[probe()]), vec![1, 2, 4]);
}

#[tokio::test]
async fn a_null_equal_join_lets_probe_nulls_through_only_to_a_build_side_with_nulls() {
    let config = ConfigOptions::default();
    for (build, expected) in [
        (pieces(&[&[Some(3), None]]), vec![3, 8]),
        (pieces(&[&[Some(3)]]), vec![3]),
    ] {
        let (join, filter) =
            join_with_filter(PartitionMode::CollectLeft, 1, NullEquality::NullEqualsNull);
        let publisher = ProbeFilterPublisher::for_join(&join, &config).expect("a publisher");
        publisher.report(BuildKeySummary::of(&[build], publisher.limits()));
        assert_eq!(kept(&filter.current().unwrap(), &[probe()]), expected);
    }
}

#[test]
fn no_publisher_without_a_filter_a_reader_or_the_session_option() {
    let (join, _) = join_with_filter(PartitionMode::CollectLeft, 1, NullEquality::NullEqualsNothing);
    let mut config = ConfigOptions::default();
    assert!(ProbeFilterPublisher::for_join(&join, &config).is_some());
    config.optimizer.enable_join_dynamic_filter_pushdown = false;
    assert!(ProbeFilterPublisher::for_join(&join, &config).is_none());

    let config = ConfigOptions::default();
    // DataFusion's builder drops the filter when it resets the join.
    let reset = join.builder().reset_state().build().unwrap();
    assert!(ProbeFilterPublisher::for_join(&reset, &config).is_none());
    let restored = with_filter_of(&join, reset).unwrap();
    assert_eq!(
        dynamic_filter_of(&restored).and_then(|f| f.expression_id()),
        dynamic_filter_of(&join).and_then(|f| f.expression_id())
    );
    assert!(ProbeFilterPublisher::for_join(&restored, &config).is_some());

    // A filter no node of the probe side reads.
    let unread = HashJoinExec::try_new(
        Arc::clone(join.left()),
        Arc::clone(join.left()),
        join.on().to_vec(),
        None,
        &JoinType::Inner,
        None,
        PartitionMode::CollectLeft,
        NullEquality::NullEqualsNothing,
        false,
    )
    .unwrap()
    .with_dynamic_filter_expr(dynamic_filter_of(&join).unwrap())
    .unwrap();
    assert!(ProbeFilterPublisher::for_join(&unread, &config).is_none());
}

/// A large build side's bounds, taken on several threads over runs of its
/// pieces, are those one pass over every piece takes: the least and
/// greatest value wherever they lie (NULLs and pieces of NULLs aside), or
/// none where every value is NULL.
#[test]
fn bounds_taken_on_several_threads_are_those_of_one_pass() {
    let rows_per_piece = 10_000;
    let piece_count = 3 * ROWS_PER_BOUNDS_TASK / rows_per_piece + 1;
    let pieces_of = |value: &dyn Fn(usize) -> Option<i64>| -> Vec<ArrayRef> {
        (0..piece_count)
            .map(|p| {
                let values = (0..rows_per_piece).map(|r| value(p * rows_per_piece + r));
                Arc::new(Int64Array::from_iter(values)) as ArrayRef
            })
            .collect()
    };
    // The least value in the last piece, the greatest in the first, NULLs
    // and a piece of NULLs between.
    let last = piece_count * rows_per_piece - 1;
    let spread = pieces_of(&|row| match row {
        0 => Some(1 << 40),
        row if row == last => Some(-(1 << 40)),
        row if row % 7 == 0 || (50_000..60_000).contains(&row) => None,
        row => Some((row as i64 * 7919) % 1_000_003),
    });
    let expected = KeyBounds::Range(
        ScalarValue::Int64(Some(-(1 << 40))),
        ScalarValue::Int64(Some(1 << 40)),
    );
    assert_eq!(KeyBounds::of_on_one_thread(&spread), expected);
    assert_eq!(KeyBounds::of(&spread), expected);
    let nulls = pieces_of(&|_| None);
    assert_eq!(KeyBounds::of(&nulls), KeyBounds::NoValue);
    assert_eq!(KeyBounds::of(&[]), KeyBounds::NoValue);
}

/// The probe rows of float keys `probe` that the filter of build keys
/// `build` keeps, with their values listed (`WIDE`) or not (`NO_VALUES`).
fn kept_floats(build: &[Vec<f64>], probe: &[f64], limits: MembershipLimits) -> Vec<usize> {
    use datafusion::arrow::array::Float64Array;
    let pieces = build
        .iter()
        .map(|values| Arc::new(Float64Array::from(values.clone())) as ArrayRef)
        .collect();
    let summary = BuildKeySummary::of(&[pieces], limits);
    let schema = Arc::new(Schema::new(vec![Field::new("k0", DataType::Float64, false)]));
    let predicate = summary
        .predicate(&probe_keys(1), &schema, false)
        .unwrap()
        .expect("a filter");
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(Float64Array::from(probe.to_vec())) as ArrayRef],
    )
    .unwrap();
    kept_rows(&predicate, &batch)
}

/// The join takes -0.0 and 0.0 as one key; the filter's comparisons and
/// lists order floats totally (-0.0 below 0.0): a range that ends at a
/// zero, or a list that holds one, keeps both zeros, as the join would
/// match either (TPC-H-like data never has -0.0; the fuzzer's specials
/// found it: a build side of -0.0 pruned a probe row of 0.0).
#[test]
fn a_float_zero_among_the_build_keys_keeps_both_zeros_of_the_probe_side() {
    let nan = f64::NAN;
    let probe = [0.0, -0.0, 1.0, -1.0, 2.5, nan];
    for limits in [WIDE, NO_VALUES] {
        // A zero alone, either sign, and a zero at either end of a range.
        assert_eq!(kept_floats(&[vec![-0.0]], &probe, limits), vec![0, 1], "-0.0");
        assert_eq!(kept_floats(&[vec![0.0]], &probe, limits), vec![0, 1], "0.0");
        assert_eq!(kept_floats(&[vec![-0.0, 2.5]], &probe, limits).len(), match limits.max_values {
            0 => 4,    // 0.0, -0.0, 1.0, 2.5: the range
            _ => 3,    // 0.0, -0.0, 2.5: the list
        });
        assert_eq!(kept_floats(&[vec![-1.0], vec![0.0]], &probe, limits).len(), match limits.max_values {
            0 => 3,    // 0.0, -0.0, -1.0
            _ => 3,
        });
        // A NaN is the greatest float to the range and equal to itself in
        // the list and the join: the zeros come with -0.0 below it.
        assert_eq!(kept_floats(&[vec![nan, -0.0, nan]], &probe, limits), match limits.max_values {
            0 => vec![0, 1, 2, 4, 5],
            _ => vec![0, 1, 5],
        });
    }
    // Values without a zero are listed as they are.
    assert_eq!(kept_floats(&[vec![1.0, 2.5]], &probe, WIDE), vec![2, 4]);
}

/// A probe side whose Parquet scan holds the join's dynamic filter is
/// pruned by it; the same scan below a GPU scan filter, which reads the
/// device column cache, is not (its input is read only where it falls
/// back), and reading it early loses nothing.
#[tokio::test]
async fn a_probe_side_is_pruned_by_the_filter_unless_a_gpu_scan_reads_it() {
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
    let dir = std::env::temp_dir().join(format!(
        "datafusion-gpu-probe-pruned-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..1000)),
            Arc::new(Int64Array::from_iter_values((0..1000).map(|r| r % 97))),
        ],
    )
    .unwrap();
    let file = std::fs::File::create(dir.join("t.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, Arc::clone(&schema), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
    ctx.register_parquet("t", dir.to_str().unwrap(), ParquetReadOptions::default())
        .await
        .unwrap();
    let sql = "SELECT a.v, b.v FROM t a JOIN t b ON a.k = b.k WHERE a.v = 3 AND b.v >= 5";
    let plan = ctx
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let mut joins = Vec::new();
    plan.apply(|node| {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            joins.push(join);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    let shown = datafusion::physical_plan::displayable(plan.as_ref()).indent(true).to_string();
    assert_eq!(joins.len(), 1, "{shown}");
    let join = &joins[0];
    let config = ConfigOptions::default();
    let publisher = ProbeFilterPublisher::for_join(join, &config).expect("a filter read");
    assert!(publisher.prunes_the_probe_side(join.right()), "{shown}");
    // The probe side's filter and scan read through a GPU scan filter.
    let scan = GpuScanFilterExec::try_new(Arc::clone(join.right()))
        .unwrap()
        .expect("a scan filter");
    let read_by_gpu_scan: Arc<dyn ExecutionPlan> = Arc::new(scan);
    assert!(plan_holds_expression(
        &read_by_gpu_scan,
        publisher.filter.expression_id().unwrap()
    ));
    assert!(!publisher.prunes_the_probe_side(&read_by_gpu_scan), "{shown}");
    // A scan of batches in memory takes no dynamic filter: none to lose.
    let memory = datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]]).unwrap();
    ctx.register_table("m", Arc::new(memory)).unwrap();
    let sql = "SELECT a.v, b.v FROM m a JOIN m b ON a.k = b.k WHERE a.v = 3";
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let mut publishers = Vec::new();
    plan.apply(|node| {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            publishers.push(ProbeFilterPublisher::for_join(join, &config).is_some());
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .unwrap();
    assert_eq!(publishers, vec![false]);
    let _ = std::fs::remove_dir_all(&dir);
}
