use super::*;

const THREADS: usize = 16;

fn pk_fk_join(rows: u64) -> JoinShape {
    JoinShape {
        algorithm: JoinAlgorithm::Hash,
        build_rows: rows,
        probe_rows: rows,
        keys: 1,
        output_rows: rows,
        output_row_bytes: 16,
        gathered_on_device: true,
        output_folded: false,
        threads: THREADS,
        build_on_one_thread: false,
        repartitioned: true,
        sorted_for_join: [false, false],
        probe_skipped: false,
        build_matches_tracked: false,
        output_reads_build: true,
    }
}

fn group_by(rows: u64, groups: u64) -> AggregateShape {
    AggregateShape {
        rows,
        groups,
        keys: 1,
        value_bytes: 16,
        aggregates: 2,
        group_bytes: 24,
        threads: THREADS,
        hashed_keys: false,
    }
}

fn ratio(estimate: &Estimate) -> f64 {
    estimate.cpu.as_secs_f64() / estimate.gpu.as_secs_f64()
}

#[test]
fn a_large_join_whose_pairs_are_aggregated_on_the_device_goes_to_the_gpu_and_a_small_one_does_not()
{
    let device = DeviceConstants::TYPICAL;
    let folded = |rows| JoinShape {
        output_folded: true,
        ..pk_fk_join(rows)
    };
    assert!(join(&folded(1 << 26), &device).gpu_faster());
    assert!(join(&folded(1 << 24), &device).gpu_faster());
    let small = join(&folded(1 << 14), &device);
    assert!(!small.gpu_faster(), "{small}");
    // Nothing comes back from a folded join.
    assert_eq!(join(&folded(1 << 26), &device).from_device, 0);
}

#[test]
fn more_output_to_bring_back_makes_the_gpu_less_worth_it() {
    let device = DeviceConstants::TYPICAL;
    let rows = 1 << 24;
    let narrow = join(&pk_fk_join(rows), &device);
    let wide = join(
        &JoinShape {
            output_rows: 4 * rows,
            output_row_bytes: 64,
            gathered_on_device: false,
            ..pk_fk_join(rows)
        },
        &device,
    );
    assert!(ratio(&wide) < ratio(&narrow), "{wide} / {narrow}");
    assert!(wide.from_device > narrow.from_device);
}

#[test]
fn an_empty_build_side_that_ends_the_join_keeps_it_on_the_cpu_at_any_probe_size() {
    let device = DeviceConstants::TYPICAL;
    for probe_rows in [1 << 20, 1 << 26, 1 << 30] {
        let estimate = join(
            &JoinShape {
                build_rows: 0,
                probe_rows,
                output_rows: 0,
                probe_skipped: true,
                ..pk_fk_join(0)
            },
            &device,
        );
        assert!(!estimate.gpu_faster(), "{estimate}");
        assert!(estimate.cpu < estimate.gpu);
    }
}

#[test]
fn a_collect_left_build_on_one_thread_costs_the_cpu_more() {
    let device = DeviceConstants::TYPICAL;
    let partitioned = join(&pk_fk_join(1 << 24), &device);
    let one_thread = join(
        &JoinShape {
            build_on_one_thread: true,
            repartitioned: false,
            ..pk_fk_join(1 << 24)
        },
        &device,
    );
    // Repartitioning both sides costs less than building on one thread.
    assert!(one_thread.cpu > partitioned.cpu, "{one_thread} / {partitioned}");
}

#[test]
fn few_groups_stay_on_the_cpu_and_many_go_to_the_gpu() {
    let device = DeviceConstants::TYPICAL;
    let rows = 1 << 26;
    for groups in [1, 16, 1 << 10] {
        let estimate = aggregate(&group_by(rows, groups), &device);
        assert!(!estimate.gpu_faster(), "{groups} groups: {estimate}");
    }
    for groups in [1 << 18, 1 << 22, 1 << 25] {
        let estimate = aggregate(&group_by(rows, groups), &device);
        assert!(estimate.gpu_faster(), "{groups} groups: {estimate}");
    }
    // Groups cost the CPU more the further they outgrow its cache.
    let times: Vec<Duration> = [1 << 10, 1 << 16, 1 << 20, 1 << 24]
        .map(|groups| aggregate(&group_by(rows, groups), &device).cpu)
        .to_vec();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn estimates_grow_with_the_rows_and_fall_with_the_threads() {
    let device = DeviceConstants::TYPICAL;
    let small = join(&pk_fk_join(1 << 22), &device);
    let large = join(&pk_fk_join(1 << 24), &device);
    assert!(large.cpu > 3 * small.cpu && large.gpu > 2 * small.gpu);
    let fewer_threads = join(
        &JoinShape {
            threads: 2,
            ..pk_fk_join(1 << 24)
        },
        &device,
    );
    assert!(fewer_threads.cpu > 6 * large.cpu);
    // A slower bus makes the GPU slower, never the CPU.
    let slow_bus = DeviceConstants {
        staged_to_device: device.staged_to_device / 4.0,
        staged_from_device: device.staged_from_device / 4.0,
        ..device
    };
    let on_slow_bus = join(&pk_fk_join(1 << 24), &slow_bus);
    assert_eq!(on_slow_bus.cpu, large.cpu);
    assert!(on_slow_bus.gpu > large.gpu);
}

#[test]
fn an_estimate_reads_as_both_times_and_the_bytes_each_way() {
    let estimate = Estimate {
        cpu: Duration::from_millis(120),
        gpu: Duration::from_micros(4_500),
        to_device: 3 << 29,
        from_device: 2 << 20,
    };
    assert_eq!(
        estimate.to_string(),
        "estimated GPU 4.50 ms (1.5 GiB up, 2.0 MiB down) against CPU 120 ms"
    );
    assert!(estimate.gpu_faster());
    let close = Estimate {
        gpu: Duration::from_millis(100),
        ..estimate
    };
    assert!(!close.gpu_faster(), "within the margin stays on the CPU");
}


#[test]
fn a_scan_aggregation_of_a_table_in_memory_goes_to_the_gpu_only_when_large() {
    let device = DeviceConstants::TYPICAL;
    let no_group_by = |rows| AggregateShape {
        groups: 1,
        keys: 0,
        value_bytes: 24,
        aggregates: 4,
        group_bytes: 32,
        ..group_by(rows, 1)
    };
    // The placement sweep's "no GROUP BY" on 16 threads: 0.66x and 0.96x
    // of DataFusion at 2^20 and 2^22 rows on the device, 1.9x and 1.8x at
    // 2^24 and 2^26.
    for (rows, faster) in [(1u64 << 20, false), (1 << 22, false), (1 << 24, true), (1 << 26, true)] {
        let estimate = memory_scan_aggregate(&no_group_by(rows), rows, &device);
        assert_eq!(estimate.gpu_faster(), faster, "2^{}: {estimate}", rows.ilog2());
        // Nothing crosses up: the cache holds the columns.
        assert_eq!(estimate.to_device, 0);
    }
    // A filter that keeps few rows leaves the device its whole scan.
    let kept = memory_scan_aggregate(&no_group_by(1 << 20), 1 << 26, &device);
    assert!(kept.gpu > memory_scan_aggregate(&no_group_by(1 << 26), 1 << 26, &device).gpu / 2);
}

#[test]
fn a_key_test_of_a_table_in_memory_pays_only_against_probes_that_miss_the_cache() {
    let device = DeviceConstants::TYPICAL;
    let test = |probe_rows, build_rows| KeyTestShape {
        probe_rows,
        build_rows,
        threads: THREADS,
    };
    // A small build side (its hash table in cache): DataFusion's probes
    // cost about what the device's scan does, at any size (the sweep's
    // tiny build side: 0.19x at 2^20, 0.86x at 2^24, 0.99x at 2^26).
    for rows in [1u64 << 20, 1 << 24, 1 << 26, 1 << 30] {
        let estimate = memory_key_test(&test(rows, Some(1000)), &device);
        assert!(!estimate.gpu_faster(), "2^{}: {estimate}", rows.ilog2());
    }
    // A build side whose table misses the cache on each probe: from some
    // millions of probe rows, the device's scan pays.
    assert!(memory_key_test(&test(1 << 26, Some(1 << 24)), &device).gpu_faster());
    assert!(!memory_key_test(&test(1 << 20, Some(1 << 24)), &device).gpu_faster());
}

#[test]
fn an_aggregation_of_cached_columns_sends_nothing_up_and_pays_with_few_groups_only_when_large() {
    let device = DeviceConstants::TYPICAL;
    // The placement sweep's 16 groups on 16 threads, the device reading the
    // table's cached columns: 0.46x and 0.67x of DataFusion at 2^20 and
    // 2^22 rows, 2.3x to 2.6x at 2^26.
    for (rows, faster) in [(1u64 << 20, false), (1 << 22, false), (1 << 26, true)] {
        let estimate = cached_aggregate(&group_by(rows, 16), &device);
        assert_eq!(estimate.gpu_faster(), faster, "2^{}: {estimate}", rows.ilog2());
        assert_eq!(estimate.to_device, 0);
        // DataFusion's side is the same either way.
        assert_eq!(estimate.cpu, aggregate(&group_by(rows, 16), &device).cpu);
    }
    // Sent up from the host, the same rows stay on the CPU.
    assert!(!aggregate(&group_by(1 << 26, 16), &device).gpu_faster());
    // The groups come back either way.
    let many = group_by(1 << 26, 1 << 24);
    assert_eq!(
        cached_aggregate(&many, &device).from_device,
        aggregate(&many, &device).from_device
    );
    assert!(cached_aggregate(&many, &device).gpu_faster());
}
