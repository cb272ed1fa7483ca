//! Device algorithms against their CPU references, exactly (the partitioner
//! is stable, so even the order within partitions must match).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayData, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, ToByteSlice};
use datafusion_gpu::gpu::launch::{self, ValueWidth};
use datafusion_gpu::gpu::{
    download_byte_pieces, download_u64, download_widened_pieces, download_word, enqueue_download,
    upload_byte_pieces, upload_byte_pieces_in_windows, upload_u64, upload_u64_pieces, DeviceStream,
    DeviceVec, GpuDevice, PhaseTimer, StagingWindows,
};
use datafusion_gpu::ops::hash_join::{self, DeviceBuildTable, HostKeys, KeyRange};
use datafusion_gpu::ops::radix::{self, RadixPlan};
use datafusion_gpu::ops::scan;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::support::{require_gpu, sanitizing};

fn random_keys(rows: usize, domain: u64, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..rows)
        .map(|_| rng.random_range(0..domain.max(1)))
        .collect()
}

fn device(test: &str) -> Option<Arc<GpuDevice>> {
    require_gpu(test).map(|runtime| Arc::clone(&runtime.devices()[0]))
}

#[test]
fn exclusive_scan_matches_the_reference_across_tile_boundaries() {
    let Some(device) = device("exclusive_scan_matches_the_reference_across_tile_boundaries") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // One tile is 1024 values; 1024 * 1024 + 1 needs three levels.
    for n in [1usize, 2, 1023, 1024, 1025, 4096, 100_003, 1024 * 1024 + 1] {
        let values = random_keys(n, 1000, n as u64);
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let mut device_values = upload_u64(&device, stream, &values, &mut timer).unwrap();
        scan::exclusive_scan(&device, stream, &mut device_values, n).unwrap();
        let mut result = vec![u64::MAX; 3];
        download_u64(
            &device,
            stream,
            &device_values.as_view(),
            &mut result,
            &mut timer,
        )
        .unwrap();
        timer.finish().unwrap();
        assert_eq!(result, scan::reference::exclusive_scan(&values), "n = {n}");
    }
}

#[test]
fn radix_partition_matches_the_stable_reference() {
    let Some(device) = device("radix_partition_matches_the_stable_reference") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let cases = [
        (1usize, 0u32),
        (1, 5),
        (255, 3),
        (1024, 8),
        (1025, 9),
        (100_000, 14),
        (300_000, 18),
        (1 << 20, 12),
        (5_000, 16),
        // Blocks of several scatter tiles of 2,048 rows, the last one partial.
        (3_000_001, 7),
        (2_500_000, 16),
    ];
    for (rows, bits) in cases {
        for domain in [rows as u64 * 4, 3] {
            let keys = random_keys(rows, domain, rows as u64 + u64::from(bits));
            let ids: Vec<u64> = (0..rows as u64).map(|i| i * 3 + 1).collect();
            let plan = RadixPlan::new(bits);
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let dk = upload_u64(&device, stream, &keys, &mut timer).unwrap();
            let di = upload_u64(&device, stream, &ids, &mut timer).unwrap();
            let part = radix::radix_partition(&device, stream, dk, di, &plan).unwrap();
            let (mut pk, mut pi, mut ps) = (Vec::new(), Vec::new(), Vec::new());
            download_u64(&device, stream, &part.keys.as_view(), &mut pk, &mut timer).unwrap();
            download_u64(
                &device,
                stream,
                &part.row_ids.as_view(),
                &mut pi,
                &mut timer,
            )
            .unwrap();
            download_u64(&device, stream, &part.starts.as_view(), &mut ps, &mut timer).unwrap();
            let (rk, ri, rs) = radix::reference::radix_partition(&keys, &ids, &plan);
            assert_eq!(ps, rs, "starts, rows {rows}, bits {bits}, domain {domain}");
            assert_eq!(pk, rk, "keys, rows {rows}, bits {bits}, domain {domain}");
            assert_eq!(pi, ri, "row ids, rows {rows}, bits {bits}, domain {domain}");

            // The same keys (all below 2^32) as one-word rows, the row ids
            // packed in the high halves on the device: the same order.
            assert!(domain <= 1 << 32);
            let mut words = upload_u64(&device, stream, &keys, &mut timer).unwrap();
            let di = upload_u64(&device, stream, &ids, &mut timer).unwrap();
            launch::pack_key_words(&device.launcher(stream), &mut words, Some(&di), None).unwrap();
            let part = radix::radix_partition_one_word(&device, stream, words, &plan).unwrap();
            let (mut pw, mut ps) = (Vec::new(), Vec::new());
            download_u64(&device, stream, &part.keys.as_view(), &mut pw, &mut timer).unwrap();
            download_u64(&device, stream, &part.starts.as_view(), &mut ps, &mut timer).unwrap();
            timer.finish().unwrap();
            let what = format!("one-word rows {rows}, bits {bits}, domain {domain}");
            assert_eq!(ps, rs, "starts, {what}");
            let keys_of: Vec<u64> = pw.iter().map(|w| w & u64::from(u32::MAX)).collect();
            let ids_of: Vec<u64> = pw.iter().map(|w| w >> 32).collect();
            assert_eq!(keys_of, rk, "keys, {what}");
            assert_eq!(ids_of, ri, "row ids, {what}");
        }
    }
}

#[test]
fn keys_aimed_at_one_partition_are_spread_by_the_device_hash_seed() {
    let Some(device) = device("keys_aimed_at_one_partition_are_spread_by_the_device_hash_seed")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // 2^20 keys whose unseeded hashes all end in 20 zero bits: without the
    // seed every one of them falls into partition 0 of any plan.
    let rows = 1usize << 20;
    let keys: Vec<u64> = (0..rows as u64)
        .map(|i| datafusion_gpu::ops::murmur3_finalizer_inverse(i << 20))
        .collect();
    let ids: Vec<u64> = (0..rows as u64).collect();
    let plan = RadixPlan::new(12);
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let dk = upload_u64(&device, stream, &keys, &mut timer).unwrap();
    let di = upload_u64(&device, stream, &ids, &mut timer).unwrap();
    let part = radix::radix_partition(&device, stream, dk, di, &plan).unwrap();
    let mut starts = Vec::new();
    download_u64(
        &device,
        stream,
        &part.starts.as_view(),
        &mut starts,
        &mut timer,
    )
    .unwrap();
    timer.finish().unwrap();
    // The device hashes with the seed the host knows: the reference's
    // partitions, every one within twice its share.
    let (_, _, reference) = radix::reference::radix_partition(&keys, &ids, &plan);
    assert_eq!(starts, reference);
    let share = rows / plan.partitions();
    let largest = starts
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .max()
        .unwrap();
    assert!(
        largest <= 2 * share,
        "seed {:#x}: a partition of {largest} keys, {share} expected",
        launch::hash_seed()
    );
}

/// One side's keys in `pieces`, row ids `0..n`.
fn host_keys<'a>(pieces: &'a [&'a [u64]], range: KeyRange) -> HostKeys<'a> {
    HostKeys {
        pieces,
        row_ids: None,
        range,
    }
}

/// Joins on the device and returns the sorted pairs and the output ranges.
/// Where every key lies below 2^32, each side is joined both as (key, row
/// id) pairs and as one-word rows, in all four combinations, which must
/// give the same pairs in the same ranges.
fn device_join(
    device: &Arc<GpuDevice>,
    build: &[u64],
    probe: &[u64],
    plan: RadixPlan,
    max_pairs: usize,
) -> (Vec<(u64, u64)>, u64) {
    let narrow = build.iter().chain(probe).all(|&key| key < 1 << 32);
    let ranges = [KeyRange::Full, KeyRange::Below32Bits];
    let mut joined = None;
    for build_range in ranges {
        for probe_range in ranges {
            if !narrow && (build_range, probe_range) != (KeyRange::Full, KeyRange::Full) {
                continue;
            }
            let result = device_join_as(
                device,
                build,
                probe,
                plan.clone(),
                max_pairs,
                (build_range, probe_range),
            );
            match &joined {
                None => joined = Some(result),
                Some(first) => assert_eq!(
                    &result, first,
                    "build {build_range:?}, probe {probe_range:?}"
                ),
            }
        }
    }
    joined.unwrap()
}

/// [`device_join`] with each side's key range as given.
fn device_join_as(
    device: &Arc<GpuDevice>,
    build: &[u64],
    probe: &[u64],
    plan: RadixPlan,
    max_pairs: usize,
    (build_range, probe_range): (KeyRange, KeyRange),
) -> (Vec<(u64, u64)>, u64) {
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    // The build keys in two pieces, the probe keys in three (below).
    let halves: Vec<&[u64]> = build.chunks(build.len() / 2 + 1).collect();
    let table = DeviceBuildTable::build(
        device,
        stream,
        host_keys(&halves, build_range),
        plan,
        &mut timer,
    )
    .unwrap();
    assert_eq!(table.one_word(), build_range == KeyRange::Below32Bits);
    let mut pairs = Vec::new();
    let mut emitted_batches = 0;
    // Build rows arrived last to first: rank = build rows - 1 - row.
    let ranks: Vec<u64> = (0..build.len() as u64).rev().collect();
    let device_ranks = upload_u64(device, stream, &ranks, &mut timer).unwrap();
    // The probe keys in uneven pieces, as a chunk's batches hand them over.
    let pieces: Vec<&[u64]> = probe.chunks(probe.len() / 3 + 1).collect();
    let total = hash_join::probe(
        device,
        stream,
        &table,
        host_keys(&pieces, probe_range),
        max_pairs,
        &mut timer,
        |range, timer| {
            let (b, p) = range.download(device, stream, timer)?;
            assert_eq!(b.len(), p.len());
            assert_eq!(b.len(), range.len);
            assert_eq!(range.written, range.len);
            assert!(range.len <= max_pairs, "a range of {} pairs", range.len);
            if range.whole_chunk {
                // HashJoinExec's order, with and without arrival ranks,
                // against a sort on the host.
                for ranked in [false, true] {
                    let rank = |b: u64| if ranked { ranks[b as usize] } else { b };
                    let mut expected: Vec<(u64, u64)> =
                        b.iter().copied().zip(p.iter().copied()).collect();
                    expected.sort_unstable_by_key(|&(b, p)| (p, rank(b)));
                    let (ob, op) = hash_join::order_by_probe_row(
                        device,
                        stream,
                        &range,
                        ranked.then_some(&device_ranks),
                        (build.len() as u64, probe.len() as u64),
                        timer,
                    )?;
                    let (mut hb, mut hp) = (Vec::new(), Vec::new());
                    download_u64(device, stream, &ob.as_view(), &mut hb, timer)?;
                    download_u64(device, stream, &op.as_view(), &mut hp, timer)?;
                    let ordered: Vec<(u64, u64)> = hb.into_iter().zip(hp).collect();
                    assert_eq!(ordered, expected, "ranked {ranked}");
                }
            }
            emitted_batches += 1;
            pairs.extend(b.into_iter().zip(p));
            Ok(())
        },
    )
    .unwrap();
    timer.finish().unwrap();
    assert_eq!(total as usize, pairs.len());
    pairs.sort_unstable();
    (pairs, emitted_batches)
}

fn reference_join(build: &[u64], probe: &[u64]) -> Vec<(u64, u64)> {
    let build_ids: Vec<u64> = (0..build.len() as u64).collect();
    let probe_ids: Vec<u64> = (0..probe.len() as u64).collect();
    hash_join::reference::hash_join(build, &build_ids, probe, &probe_ids)
}

#[test]
fn hash_join_matches_the_reference_on_uniform_keys_of_every_size() {
    let Some(device) = device("hash_join_matches_the_reference_on_uniform_keys_of_every_size")
    else {
        return;
    };
    for (build_rows, probe_rows) in [
        (1, 1),
        (1, 1000),
        (1000, 1),
        (1023, 5000),
        (2049, 2049),
        (100_000, 300_000),
        (1 << 20, 1 << 20),
    ] {
        let build = random_keys(build_rows, build_rows as u64 * 2, 7);
        let probe = random_keys(probe_rows, build_rows as u64 * 2, 8);
        let plan = RadixPlan::for_join(build_rows as u64, probe_rows as u64);
        let (pairs, _) = device_join(&device, &build, &probe, plan, 1 << 20);
        assert_eq!(
            pairs,
            reference_join(&build, &probe),
            "build {build_rows}, probe {probe_rows}"
        );
    }
}

#[test]
fn hash_join_handles_duplicates_larger_than_a_shared_memory_table() {
    let Some(device) = device("hash_join_handles_duplicates_larger_than_a_shared_memory_table")
    else {
        return;
    };
    // 5000 equal build keys fill one partition beyond the 2048-row table, so
    // the kernel must loop over chunks; the output is 5000 * 300 pairs. The
    // other keys are 64-bit, then below 2^32 (each side also one word a row).
    for domain in [1 << 40, 1 << 32] {
        let mut build = vec![42u64; 5000];
        build.extend(random_keys(3000, domain, 1));
        let mut probe = vec![42u64; 300];
        probe.extend(random_keys(3000, domain, 2));
        let (pairs, _) = device_join(
            &device,
            &build,
            &probe,
            RadixPlan::for_join(8000, 3300),
            1 << 22,
        );
        assert_eq!(pairs, reference_join(&build, &probe), "domain {domain}");
        assert!(pairs.len() >= 1_500_000);
    }
}

#[test]
fn a_heavy_probe_partition_is_joined_in_slices_with_the_same_pairs() {
    let Some(device) = device("a_heavy_probe_partition_is_joined_in_slices_with_the_same_pairs")
    else {
        return;
    };
    // 200,000 probe rows of one key fill one partition far beyond
    // PROBE_TASK_ROWS, so it is joined in slices (3 build rows match each);
    // the other keys are uniform. Once with the output in one range, once
    // in ranges smaller than one slice's pairs.
    let mut build = vec![42u64; 3];
    build.extend(random_keys(20_000, 1 << 20, 5));
    let mut probe = vec![42u64; 200_000];
    probe.extend(random_keys(50_000, 1 << 20, 6));
    assert!(200_000 > 2 * hash_join::PROBE_TASK_ROWS as usize);
    let plan = RadixPlan::for_join(build.len() as u64, probe.len() as u64);
    let expected = reference_join(&build, &probe);
    assert!(expected.len() >= 600_000);
    for max_pairs in [1 << 22, 40_000] {
        let (pairs, ranges) = device_join(&device, &build, &probe, plan.clone(), max_pairs);
        assert_eq!(pairs, expected, "max_pairs {max_pairs}");
        if max_pairs < 1 << 22 {
            // Each slice's pairs (about 98,000) exceed the bound, so each
            // is a range of its own; the unsplit partition was one range.
            let slices = 200_000u64.div_ceil(hash_join::PROBE_TASK_ROWS);
            assert!(ranges >= slices, "{ranges} ranges");
        }
    }
}

#[test]
fn a_key_matching_many_rows_on_both_sides_is_written_in_bounded_ranges() {
    let Some(device) =
        device("a_key_matching_many_rows_on_both_sides_is_written_in_bounded_ranges")
    else {
        return;
    };
    // One key on 2,500 build rows (beyond a shared-memory table, so its
    // partition is split by build rows too) and 1,200 probe rows: 3,000,000
    // pairs in one partition, written in ranges of at most 65,536 (the
    // partition's tasks split until they fit); one probe row against 3,000
    // build rows of its key in ranges of 100 (the build rows split); and 40
    // by 30 rows in ranges of 7. Other keys uniform around them.
    let heavy = |build: usize, probe: usize, seed: u64| {
        let mut b = vec![42u64; build];
        b.extend(random_keys(2_000, 1 << 20, seed));
        let mut p = vec![42u64; probe];
        p.extend(random_keys(2_000, 1 << 20, seed + 1));
        (b, p)
    };
    for ((build, probe), max_pairs) in [
        (heavy(2_500, 1_200, 1), 1 << 16),
        (heavy(3_000, 1, 3), 100),
        (heavy(40, 30, 5), 7),
    ] {
        let expected = reference_join(&build, &probe);
        let plan = RadixPlan::for_join(build.len() as u64, probe.len() as u64);
        let (pairs, ranges) = device_join(&device, &build, &probe, plan, max_pairs);
        assert_eq!(pairs, expected, "max_pairs {max_pairs}");
        let of_42 = |keys: &[u64]| keys.iter().filter(|&&k| k == 42).count() as u64;
        let heavy_pairs = of_42(&build) * of_42(&probe);
        assert!(
            ranges >= heavy_pairs.div_ceil(max_pairs as u64),
            "{ranges} ranges"
        );
    }
}

/// A named join of (build keys, probe keys).
type FoldJoinCase = (&'static str, (Vec<u64>, Vec<u64>));

/// The (build keys, probe keys) the fold tests join, named: uniform keys,
/// a build key repeated beyond a shared-memory table, a heavy probe
/// partition joined in slices, no match, and uniform keys of 64 bits;
/// random keys from `seed` on, all below 2^32 but the last case's (so that
/// either side may be one word a row).
fn fold_join_cases(seed: u64) -> [FoldJoinCase; 5] {
    let uniform = (
        random_keys(100_000, 150_000, seed),
        random_keys(300_000, 150_000, seed + 1),
    );
    let widen = |keys: &[u64]| -> Vec<u64> { keys.iter().map(|k| (k << 28) | 7).collect() };
    let wide = (widen(&uniform.0), widen(&uniform.1));
    let mut repeated = (vec![42u64; 5000], vec![42u64; 300]);
    repeated.0.extend(random_keys(3000, 1 << 32, seed + 2));
    repeated.1.extend(random_keys(3000, 1 << 32, seed + 3));
    let mut heavy = (vec![42u64; 3], vec![42u64; 200_000]);
    heavy.0.extend(random_keys(20_000, 1 << 20, seed + 4));
    heavy.1.extend(random_keys(50_000, 1 << 20, seed + 5));
    let no_match = (
        random_keys(10_000, 1 << 20, seed + 6),
        vec![u64::from(u32::MAX); 5000],
    );
    [
        ("uniform", uniform),
        ("repeated", repeated),
        ("heavy", heavy),
        ("no match", no_match),
        ("wide keys", wide),
    ]
}

/// The key ranges the sides of a join of `build` and `probe` may be given:
/// both where every key lies below 2^32.
fn key_ranges(build: &[u64], probe: &[u64]) -> Vec<KeyRange> {
    match build.iter().chain(probe).all(|&key| key < 1 << 32) {
        true => vec![KeyRange::Full, KeyRange::Below32Bits],
        false => vec![KeyRange::Full],
    }
}

/// `fold_partitioned` against folds computed on the host from the
/// reference join's pairs: an 8-byte wrapping sum and a float sum by the
/// build row, a signed 4-byte minimum (sign bit flipped) and an unsigned
/// 4-byte maximum by the probe row; with uniform keys, with a build key
/// repeated beyond a shared-memory table, with a heavy probe partition
/// joined in slices, with no match, and with the pairs counted alone; both
/// sides as (key, row id) pairs and as one-word rows.
#[test]
fn pairs_folded_while_probing_match_folds_of_the_reference_pairs() {
    use launch::{AggregateOp, FoldOp, GatheredValues, JoinFold, PairSide};
    let Some(device) = device("pairs_folded_while_probing_match_folds_of_the_reference_pairs")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    for (name, (build, probe)) in fold_join_cases(31) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        // Build values: 8-byte words, and small integral doubles (their sums
        // are exact in any order).
        let build_words = random_keys(build.len(), u64::MAX, 41);
        let build_doubles: Vec<u64> = random_keys(build.len(), 2001, 42)
            .iter()
            .map(|&v| (v as f64 - 1000.0).to_bits())
            .collect();
        // Probe values: 4-byte, read signed and unsigned.
        let probe_raw: Vec<u32> = random_keys(probe.len(), 1 << 32, 43)
            .iter()
            .map(|&v| v as u32)
            .collect();
        let probe_bytes: Vec<u8> = probe_raw.iter().flat_map(|v| v.to_le_bytes()).collect();
        let up = |words: &[u64], timer: &mut PhaseTimer| {
            upload_u64(&device, stream, words, timer).unwrap()
        };
        let device_words = up(&build_words, &mut timer);
        let device_doubles = up(&build_doubles, &mut timer);
        let device_probe =
            upload_byte_pieces(&device, stream, &[&probe_bytes], &mut timer).unwrap();
        let sign = 1u64 << 63;
        let folds = [
            JoinFold {
                side: PairSide::Build,
                values: &device_words,
                rows: build.len(),
                read: GatheredValues::Eight,
                op: FoldOp::Words(AggregateOp::Sum),
                flip: 0,
                carried: None,
            },
            JoinFold {
                side: PairSide::Probe,
                values: &device_probe,
                rows: probe.len(),
                read: GatheredValues::FourSigned,
                op: FoldOp::Words(AggregateOp::Min),
                flip: sign,
                carried: None,
            },
            JoinFold {
                side: PairSide::Probe,
                values: &device_probe,
                rows: probe.len(),
                read: GatheredValues::FourUnsigned,
                op: FoldOp::Words(AggregateOp::Max),
                flip: 0,
                carried: None,
            },
            JoinFold {
                side: PairSide::Build,
                values: &device_doubles,
                rows: build.len(),
                read: GatheredValues::Eight,
                op: FoldOp::SumF64,
                flip: 0,
                carried: None,
            },
        ];
        let pairs = reference_join(&build, &probe);
        let (mut sum, mut min, mut max, mut float_sum) = (0u64, u64::MAX, 0u64, 0f64);
        for &(b, p) in &pairs {
            sum = sum.wrapping_add(build_words[b as usize]);
            let raw = probe_raw[p as usize];
            min = min.min((raw as i32 as i64 as u64) ^ sign);
            max = max.max(raw as u64);
            float_sum += f64::from_bits(build_doubles[b as usize]);
        }
        let expected_words = if pairs.is_empty() {
            folds.iter().map(|fold| fold.op.identity()).collect()
        } else {
            vec![sum, min, max, float_sum.to_bits()]
        };

        let halves: Vec<&[u64]> = build.chunks(build.len() / 2 + 1).collect();
        let pieces: Vec<&[u64]> = probe.chunks(probe.len() / 3 + 1).collect();
        // Each side as (key, row id) pairs and as one-word rows, in every
        // combination.
        let ranges = key_ranges(&build, &probe);
        let layouts = ranges.iter().flat_map(|&build_range| {
            ranges
                .iter()
                .map(move |&probe_range| (build_range, probe_range))
        });
        for (build_range, probe_range) in layouts {
            let plan = RadixPlan::for_join(build.len() as u64, probe.len() as u64);
            let table = DeviceBuildTable::build(
                &device,
                stream,
                host_keys(&halves, build_range),
                plan,
                &mut timer,
            )
            .unwrap();
            assert_eq!(table.one_word(), build_range == KeyRange::Below32Bits);
            let partitioned = hash_join::partition_probe(
                &device,
                stream,
                host_keys(&pieces, probe_range),
                table.plan(),
                &mut timer,
            )
            .unwrap()
            .unwrap();
            assert_eq!(partitioned.one_word(), probe_range == KeyRange::Below32Bits);
            let what = format!("{name}, build {build_range:?}, probe {probe_range:?}");
            for folds in [&folds[..], &[]] {
                let folded = hash_join::fold_partitioned(
                    &device,
                    stream,
                    &table,
                    &partitioned,
                    folds,
                    &mut timer,
                )
                .unwrap();
                assert_eq!(folded.pairs, pairs.len() as u64, "{what}: pairs");
                assert_eq!(folded.words, expected_words[..folds.len()], "{what}: words");
            }
            // More folds than one launch computes are refused, not truncated.
            let five: Vec<JoinFold<'_>> = folds.iter().chain(&folds[..1]).copied().collect();
            assert!(hash_join::fold_partitioned(
                &device,
                stream,
                &table,
                &partitioned,
                &five,
                &mut timer
            )
            .is_err());
        }
        if name != "no match" {
            assert!(pairs.len() >= 100_000, "{name}: {} pairs", pairs.len());
        }
    }
}

/// Whether writing the pairs of `probe` against `table` is refused (a side
/// that carries values holds no row ids to write).
fn pairs_refused(
    device: &GpuDevice,
    stream: &Arc<datafusion_gpu::gpu::DeviceStream>,
    table: &DeviceBuildTable,
    probe: &hash_join::PartitionedProbe,
    timer: &mut PhaseTimer,
) -> bool {
    hash_join::probe_partitioned(
        device,
        stream,
        table,
        probe,
        1 << 20,
        None,
        timer,
        |_, _| Ok(()),
    )
    .is_err()
}

/// Probe keys partitioned carrying values in place of row ids (seed 002's
/// GFTR): folds that find their probe values in the carried words match
/// folds of the reference pairs, for two 4-byte columns in the two halves
/// of a word, for one 8-byte column in the whole word, and for one 4-byte
/// column (in the key word's high half where the sides are one-word rows),
/// with the keys of every row and with the keys of every third row only
/// (row ids given), both sides as pairs and as one-word rows; a fold that
/// reads the wrong way, and pairs written from carried words, are refused.
#[test]
fn probe_keys_carrying_values_fold_as_the_reference_pairs() {
    use launch::{AggregateOp, CarriedSlot, FoldOp, GatheredValues, JoinFold, PairSide};
    let Some(device) = device("probe_keys_carrying_values_fold_as_the_reference_pairs") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let sign = 1u64 << 63;
    for (name, (build, probe)) in fold_join_cases(51) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let build_words = random_keys(build.len(), u64::MAX, 61);
        // Probe values by row: two 4-byte columns and an 8-byte one.
        let low_raw: Vec<u32> = random_keys(probe.len(), 1 << 32, 62)
            .iter()
            .map(|&v| v as u32)
            .collect();
        let high_raw: Vec<u32> = random_keys(probe.len(), 1 << 32, 63)
            .iter()
            .map(|&v| v as u32)
            .collect();
        let probe_words = random_keys(probe.len(), u64::MAX, 64);
        let bytes =
            |values: &[u32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let device_build = upload_u64(&device, stream, &build_words, &mut timer).unwrap();
        let device_low =
            upload_byte_pieces(&device, stream, &[&bytes(&low_raw)], &mut timer).unwrap();
        let device_high =
            upload_byte_pieces(&device, stream, &[&bytes(&high_raw)], &mut timer).unwrap();
        let device_words = upload_u64(&device, stream, &probe_words, &mut timer).unwrap();
        let fold = |side, values, rows, read, op, flip, carried| JoinFold {
            side,
            values,
            rows,
            read,
            op,
            flip,
            carried,
        };
        let halves = [
            fold(
                PairSide::Build,
                &device_build,
                build.len(),
                GatheredValues::Eight,
                FoldOp::Words(AggregateOp::Sum),
                0,
                None,
            ),
            fold(
                PairSide::Probe,
                &device_low,
                probe.len(),
                GatheredValues::FourSigned,
                FoldOp::Words(AggregateOp::Min),
                sign,
                Some(CarriedSlot::Low),
            ),
            fold(
                PairSide::Probe,
                &device_high,
                probe.len(),
                GatheredValues::FourUnsigned,
                FoldOp::Words(AggregateOp::Max),
                0,
                Some(CarriedSlot::High),
            ),
            fold(
                PairSide::Probe,
                &device_low,
                probe.len(),
                GatheredValues::FourUnsigned,
                FoldOp::Words(AggregateOp::Sum),
                0,
                Some(CarriedSlot::Low),
            ),
        ];
        let whole = [
            fold(
                PairSide::Probe,
                &device_words,
                probe.len(),
                GatheredValues::Eight,
                FoldOp::Words(AggregateOp::Sum),
                0,
                Some(CarriedSlot::Whole),
            ),
            fold(
                PairSide::Probe,
                &device_words,
                probe.len(),
                GatheredValues::Eight,
                FoldOp::Words(AggregateOp::Min),
                0,
                Some(CarriedSlot::Whole),
            ),
        ];
        // A lone 4-byte probe column, which one-word rows carry beside the key.
        let single = [halves[0], halves[1], halves[3]];
        // Every row's key, then every third row's key with its row id; both
        // sides as pairs, then as one-word rows.
        let every_third: Vec<u64> = (0..probe.len() as u64).step_by(3).collect();
        let third_keys: Vec<u64> = every_third.iter().map(|&i| probe[i as usize]).collect();
        let cases = key_ranges(&build, &probe).into_iter().flat_map(|range| {
            [
                ("every row", probe.clone(), None, range),
                (
                    "every third row",
                    third_keys.clone(),
                    Some(&every_third[..]),
                    range,
                ),
            ]
        });
        for (rows_name, keys, row_ids, range) in cases {
            let plan = RadixPlan::for_join(build.len() as u64, probe.len() as u64);
            let table = DeviceBuildTable::build(
                &device,
                stream,
                host_keys(&[&build], range),
                plan,
                &mut timer,
            )
            .unwrap();
            let one_word = range == KeyRange::Below32Bits;
            assert_eq!(table.one_word(), one_word);
            let probe_keys = HostKeys {
                pieces: &[&keys],
                row_ids,
                range,
            };
            let ids: Vec<u64> = match row_ids {
                Some(ids) => ids.to_vec(),
                None => (0..keys.len() as u64).collect(),
            };
            let build_ids: Vec<u64> = (0..build.len() as u64).collect();
            let pairs = hash_join::reference::hash_join(&build, &build_ids, &keys, &ids);
            let what = format!("{name}, {rows_name}, {range:?}");
            let (mut sum, mut min, mut max, mut low_sum) = (0u64, u64::MAX, 0u64, 0u64);
            let (mut words_sum, mut words_min) = (0u64, u64::MAX);
            for &(b, p) in &pairs {
                let p = p as usize;
                sum = sum.wrapping_add(build_words[b as usize]);
                min = min.min((low_raw[p] as i32 as i64 as u64) ^ sign);
                max = max.max(high_raw[p] as u64);
                low_sum = low_sum.wrapping_add(low_raw[p] as u64);
                words_sum = words_sum.wrapping_add(probe_words[p]);
                words_min = words_min.min(probe_words[p]);
            }
            let identities = |folds: &[JoinFold<'_>]| -> Vec<u64> {
                folds.iter().map(|fold| fold.op.identity()).collect()
            };
            let (expected_halves, expected_whole, expected_single) = match pairs.is_empty() {
                true => (identities(&halves), identities(&whole), identities(&single)),
                false => (
                    vec![sum, min, max, low_sum],
                    vec![words_sum, words_min],
                    vec![sum, min, low_sum],
                ),
            };
            // The folds, their carried columns and results, and whether the
            // probe keys are then one word a row.
            for (folds, carried, expected, probe_one_word) in [
                (
                    &halves[..],
                    hash_join::CarriedValues {
                        low: (&device_low, ValueWidth::Four),
                        high: Some(&device_high),
                        rows: probe.len(),
                    },
                    &expected_halves,
                    false,
                ),
                (
                    &whole[..],
                    hash_join::CarriedValues {
                        low: (&device_words, ValueWidth::Eight),
                        high: None,
                        rows: probe.len(),
                    },
                    &expected_whole,
                    false,
                ),
                (
                    &single[..],
                    hash_join::CarriedValues {
                        low: (&device_low, ValueWidth::Four),
                        high: None,
                        rows: probe.len(),
                    },
                    &expected_single,
                    one_word,
                ),
            ] {
                let partitioned = hash_join::partition_probe_carrying(
                    &device,
                    stream,
                    probe_keys,
                    &carried,
                    table.plan(),
                    &mut timer,
                )
                .unwrap()
                .unwrap();
                assert!(partitioned.carries_values());
                assert_eq!(partitioned.one_word(), probe_one_word, "{what}");
                let folded = hash_join::fold_partitioned(
                    &device,
                    stream,
                    &table,
                    &partitioned,
                    folds,
                    &mut timer,
                )
                .unwrap();
                assert_eq!(folded.pairs, pairs.len() as u64, "{what}: pairs");
                assert_eq!(&folded.words, expected, "{what}: words");
                // A probe fold that reads by row id finds no row id there.
                let by_row: Vec<JoinFold<'_>> = folds
                    .iter()
                    .map(|fold| JoinFold {
                        carried: None,
                        ..*fold
                    })
                    .collect();
                assert!(hash_join::fold_partitioned(
                    &device,
                    stream,
                    &table,
                    &partitioned,
                    &by_row,
                    &mut timer
                )
                .is_err());
                // Nor may its pairs be written: they would name no rows.
                assert!(pairs_refused(
                    &device,
                    stream,
                    &table,
                    &partitioned,
                    &mut timer
                ));
                // The same folds by row id over keys that carry row ids.
                let by_id = hash_join::partition_probe(
                    &device,
                    stream,
                    probe_keys,
                    table.plan(),
                    &mut timer,
                )
                .unwrap()
                .unwrap();
                assert_eq!(by_id.one_word(), one_word, "{what}");
                let folded_by_id = hash_join::fold_partitioned(
                    &device, stream, &table, &by_id, &by_row, &mut timer,
                )
                .unwrap();
                assert_eq!(folded_by_id, folded, "{what}: by row id");
                assert!(hash_join::fold_partitioned(
                    &device, stream, &table, &by_id, folds, &mut timer
                )
                .is_err());
            }
            if name != "no match" {
                assert!(pairs.len() >= 30_000, "{what}: {} pairs", pairs.len());
            }
        }
        timer.finish().unwrap();
    }
}

/// Build keys partitioned carrying values in place of row ids (seed 002's
/// GFTR on the build side): folds that find their build values in the
/// table's words match folds of the reference pairs and the same folds by
/// row id, for two 4-byte columns in the halves of a word, one 8-byte
/// column, and one 4-byte column (in the key word's high half where the
/// keys allow one-word rows), with every build row's key and with every
/// third row's (row ids given), the probe side by row id and carrying its
/// own 4-byte column; a build fold that reads by row id, and pairs written
/// from such a table, are refused.
#[test]
fn build_keys_carrying_values_fold_as_the_reference_pairs() {
    use launch::{AggregateOp, CarriedSlot, FoldOp, GatheredValues, JoinFold, PairSide};
    let Some(device) = device("build_keys_carrying_values_fold_as_the_reference_pairs") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let sign = 1u64 << 63;
    let four = |rows: usize, seed: u64| -> Vec<u32> {
        random_keys(rows, 1 << 32, seed)
            .iter()
            .map(|&v| v as u32)
            .collect()
    };
    let bytes =
        |values: &[u32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    for (name, (build, probe)) in fold_join_cases(71) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        // Build values by row: two 4-byte columns and an 8-byte one; one
        // 4-byte probe column.
        let (low_raw, high_raw) = (four(build.len(), 72), four(build.len(), 73));
        let build_words = random_keys(build.len(), u64::MAX, 74);
        let probe_raw = four(probe.len(), 75);
        let upload_four = |values: &[u32], timer: &mut PhaseTimer| {
            upload_byte_pieces(&device, stream, &[&bytes(values)], timer).unwrap()
        };
        let device_low = upload_four(&low_raw, &mut timer);
        let device_high = upload_four(&high_raw, &mut timer);
        let device_probe = upload_four(&probe_raw, &mut timer);
        let device_words = upload_u64(&device, stream, &build_words, &mut timer).unwrap();
        let fold = |values, read, op, flip, carried| JoinFold {
            side: PairSide::Build,
            values,
            rows: build.len(),
            read,
            op,
            flip,
            carried,
        };
        let (sum, min, max) = (
            FoldOp::Words(AggregateOp::Sum),
            FoldOp::Words(AggregateOp::Min),
            FoldOp::Words(AggregateOp::Max),
        );
        let probe_sum = JoinFold {
            side: PairSide::Probe,
            values: &device_probe,
            rows: probe.len(),
            read: GatheredValues::FourSigned,
            op: sum,
            flip: 0,
            carried: None,
        };
        let low = Some(CarriedSlot::Low);
        let halves = [
            fold(&device_low, GatheredValues::FourSigned, min, sign, low),
            fold(
                &device_high,
                GatheredValues::FourUnsigned,
                max,
                0,
                Some(CarriedSlot::High),
            ),
            fold(&device_low, GatheredValues::FourUnsigned, sum, 0, low),
            probe_sum,
        ];
        let whole = Some(CarriedSlot::Whole);
        let words = [
            fold(&device_words, GatheredValues::Eight, sum, 0, whole),
            fold(&device_words, GatheredValues::Eight, max, 0, whole),
            probe_sum,
        ];
        let single = [halves[0], halves[2], probe_sum];
        let carried_halves = hash_join::CarriedValues {
            low: (&device_low, ValueWidth::Four),
            high: Some(&device_high),
            rows: build.len(),
        };
        let carried_words = hash_join::CarriedValues {
            low: (&device_words, ValueWidth::Eight),
            high: None,
            rows: build.len(),
        };
        let carried_single = hash_join::CarriedValues {
            high: None,
            ..carried_halves
        };
        let every_third: Vec<u64> = (0..build.len() as u64).step_by(3).collect();
        let third_keys: Vec<u64> = every_third.iter().map(|&i| build[i as usize]).collect();
        let probe_ids: Vec<u64> = (0..probe.len() as u64).collect();
        for range in key_ranges(&build, &probe) {
            let one_word = range == KeyRange::Below32Bits;
            for (rows_name, keys, row_ids) in [
                ("every row", build.clone(), None),
                (
                    "every third row",
                    third_keys.clone(),
                    Some(&every_third[..]),
                ),
            ] {
                let what = format!("{name}, {rows_name}, {range:?}");
                let ids: Vec<u64> = match row_ids {
                    Some(ids) => ids.to_vec(),
                    None => (0..keys.len() as u64).collect(),
                };
                let pairs = hash_join::reference::hash_join(&keys, &ids, &probe, &probe_ids);
                let (mut min_low, mut max_high, mut low_sum) = (u64::MAX, 0u64, 0u64);
                let (mut words_sum, mut words_max, mut probe_total) = (0u64, 0u64, 0u64);
                for &(b, p) in &pairs {
                    let b = b as usize;
                    min_low = min_low.min((low_raw[b] as i32 as i64 as u64) ^ sign);
                    max_high = max_high.max(high_raw[b] as u64);
                    low_sum = low_sum.wrapping_add(low_raw[b] as u64);
                    words_sum = words_sum.wrapping_add(build_words[b]);
                    words_max = words_max.max(build_words[b]);
                    probe_total =
                        probe_total.wrapping_add(probe_raw[p as usize] as i32 as i64 as u64);
                }
                let expected = |folds: &[JoinFold<'_>], values: Vec<u64>| match pairs.is_empty() {
                    true => folds.iter().map(|fold| fold.op.identity()).collect(),
                    false => values,
                };
                let build_keys = HostKeys {
                    pieces: &[&keys],
                    row_ids,
                    range,
                };
                let probe_pieces = [&probe[..]];
                let probe_keys = host_keys(&probe_pieces, range);
                let plan = RadixPlan::for_join(keys.len() as u64, probe.len() as u64);
                let by_id_table =
                    DeviceBuildTable::build(&device, stream, build_keys, plan.clone(), &mut timer)
                        .unwrap();
                let by_id =
                    hash_join::partition_probe(&device, stream, probe_keys, &plan, &mut timer)
                        .unwrap()
                        .unwrap();
                // (folds, carried columns, expected words, whether the build
                // rows are then one word each)
                for (folds, carried, expected, build_one_word) in [
                    (
                        &halves[..],
                        &carried_halves,
                        expected(&halves, vec![min_low, max_high, low_sum, probe_total]),
                        false,
                    ),
                    (
                        &words[..],
                        &carried_words,
                        expected(&words, vec![words_sum, words_max, probe_total]),
                        false,
                    ),
                    (
                        &single[..],
                        &carried_single,
                        expected(&single, vec![min_low, low_sum, probe_total]),
                        one_word,
                    ),
                ] {
                    let table = DeviceBuildTable::build_carrying(
                        &device,
                        stream,
                        build_keys,
                        |_| Ok(Some(*carried)),
                        plan.clone(),
                        &mut timer,
                    )
                    .unwrap();
                    assert!(table.carries_values(), "{what}");
                    assert_eq!(table.one_word(), build_one_word, "{what}");
                    let folded = hash_join::fold_partitioned(
                        &device, stream, &table, &by_id, folds, &mut timer,
                    )
                    .unwrap();
                    assert_eq!(folded.pairs, pairs.len() as u64, "{what}: pairs");
                    assert_eq!(folded.words, expected, "{what}: words");
                    // The same folds by row id against a table of row ids.
                    let by_row: Vec<JoinFold<'_>> = folds
                        .iter()
                        .map(|fold| JoinFold {
                            carried: None,
                            ..*fold
                        })
                        .collect();
                    let folded_by_id = hash_join::fold_partitioned(
                        &device,
                        stream,
                        &by_id_table,
                        &by_id,
                        &by_row,
                        &mut timer,
                    )
                    .unwrap();
                    assert_eq!(folded_by_id, folded, "{what}: by row id");
                    // A build fold that reads by row id finds none in the
                    // carrying table, nor may its pairs be written.
                    assert!(hash_join::fold_partitioned(
                        &device, stream, &table, &by_id, &by_row, &mut timer
                    )
                    .is_err());
                    assert!(pairs_refused(&device, stream, &table, &by_id, &mut timer));
                }
                // Both sides carrying a lone 4-byte column each.
                let table = DeviceBuildTable::build_carrying(
                    &device,
                    stream,
                    build_keys,
                    |_| Ok(Some(carried_single)),
                    plan.clone(),
                    &mut timer,
                )
                .unwrap();
                let probe_carrying = hash_join::partition_probe_carrying(
                    &device,
                    stream,
                    probe_keys,
                    &hash_join::CarriedValues {
                        low: (&device_probe, ValueWidth::Four),
                        high: None,
                        rows: probe.len(),
                    },
                    &plan,
                    &mut timer,
                )
                .unwrap()
                .unwrap();
                assert_eq!(probe_carrying.one_word(), one_word, "{what}");
                let both = [
                    single[0],
                    single[1],
                    JoinFold {
                        carried: low,
                        ..probe_sum
                    },
                ];
                let folded = hash_join::fold_partitioned(
                    &device,
                    stream,
                    &table,
                    &probe_carrying,
                    &both,
                    &mut timer,
                )
                .unwrap();
                assert_eq!(folded.pairs, pairs.len() as u64, "{what}: both carrying");
                assert_eq!(
                    folded.words,
                    expected(&both, vec![min_low, low_sum, probe_total]),
                    "{what}: both carrying"
                );
                if name != "no match" {
                    assert!(pairs.len() >= 10_000, "{what}: {} pairs", pairs.len());
                }
            }
        }
        timer.finish().unwrap();
    }
}

#[test]
fn bounded_output_is_written_in_several_ranges_with_the_same_pairs() {
    let Some(device) = device("bounded_output_is_written_in_several_ranges_with_the_same_pairs")
    else {
        return;
    };
    let build = random_keys(50_000, 5_000, 3);
    let probe = random_keys(50_000, 5_000, 4);
    let plan = RadixPlan::for_join(50_000, 50_000);
    let (unbounded, one) = device_join(&device, &build, &probe, plan.clone(), usize::MAX >> 8);
    let (bounded, many) = device_join(&device, &build, &probe, plan, 10_000);
    assert_eq!(one, 1);
    assert!(many > 10, "{many} ranges");
    assert_eq!(unbounded, bounded);
    assert_eq!(bounded, reference_join(&build, &probe));
}

/// The most rows one partition holds, found on the device, against the
/// host over the same starts: no partition, empty ones, the largest first,
/// last and in between, counts beyond 32 bits, random starts of 2^20
/// partitions (more than one stride of the grid covers), and the starts of
/// a partitioning of skewed keys.
#[test]
fn the_largest_partition_found_on_the_device_matches_the_host() {
    let Some(device) = device("the_largest_partition_found_on_the_device_matches_the_host") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let host_largest = |starts: &[u64]| starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let mut skewed = vec![7u64; 300_000];
    skewed.extend(random_keys(700_000, 1 << 40, 11));
    let mut rng = StdRng::seed_from_u64(12);
    let mut running = 0u64;
    let random_starts: Vec<u64> = (0..(1 << 20) + 1)
        .map(|_| {
            let start = running;
            running += rng.random_range(0..100u64);
            start
        })
        .collect();
    let mut cases: Vec<(String, Vec<u64>)> = vec![
        ("no partition".into(), vec![0]),
        ("empty partitions".into(), vec![5, 5, 5]),
        ("largest first".into(), vec![0, 90, 95, 99]),
        ("largest last".into(), vec![0, 1, 2, 300]),
        ("largest between".into(), vec![0, 10, 10, 4000, 4001, 4001]),
        (
            "beyond 32 bits".into(),
            vec![0, 3, 3 + (1 << 40), (1 << 41) + 3],
        ),
        ("random".into(), random_starts),
    ];
    // The starts of a partitioning of 300,000 equal keys among a million.
    let plan = RadixPlan::for_join(1 << 20, 1 << 20);
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let keys = upload_u64(&device, stream, &skewed, &mut timer).unwrap();
    let ids = upload_u64(
        &device,
        stream,
        &(0..skewed.len() as u64).collect::<Vec<_>>(),
        &mut timer,
    )
    .unwrap();
    let partitioned = radix::radix_partition(&device, stream, keys, ids, &plan).unwrap();
    let mut starts = Vec::new();
    download_u64(
        &device,
        stream,
        &partitioned.starts.as_view(),
        &mut starts,
        &mut timer,
    )
    .unwrap();
    assert_eq!(starts.len(), plan.partitions() + 1);
    assert!(host_largest(&starts) >= 300_000);
    cases.push(("skewed keys partitioned".into(), starts));
    for (name, starts) in cases {
        let partitions = starts.len() as u64 - 1;
        let device_starts = upload_u64(&device, stream, &starts, &mut timer).unwrap();
        let mut largest = upload_u64(&device, stream, &[0], &mut timer).unwrap();
        launch::largest_partition(
            &device.launcher(stream),
            &device_starts,
            partitions,
            &mut largest,
        )
        .unwrap();
        let mut found = Vec::new();
        download_u64(&device, stream, &largest.as_view(), &mut found, &mut timer).unwrap();
        assert_eq!(found, vec![host_largest(&starts)], "{name}");
        // Starts shorter than the partitions they are said to bound are refused.
        assert!(launch::largest_partition(
            &device.launcher(stream),
            &device_starts,
            partitions + 1,
            &mut largest,
        )
        .is_err());
    }
    timer.finish().unwrap();
}

/// A probe chunk larger than a slice, of uniform keys, whose pairs fit one
/// output range: its tasks are the partitions and its pairs one range, and
/// the host reads back three words of bookkeeping (the largest partition
/// of each side and the pairs' total), not a side's starts or the
/// partitions' counts, while the pairs match the reference.
#[test]
fn a_join_whose_pairs_fit_one_range_reads_back_no_per_partition_words() {
    let Some(device) = device("a_join_whose_pairs_fit_one_range_reads_back_no_per_partition_words")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let build = random_keys(100_000, 150_000, 21);
    let probe = random_keys(300_000, 150_000, 22);
    assert!(probe.len() as u64 > hash_join::PROBE_TASK_ROWS);
    let plan = RadixPlan::for_join(build.len() as u64, probe.len() as u64);
    assert!(plan.partitions() >= 64);
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let table = DeviceBuildTable::build(
        &device,
        stream,
        host_keys(&[&build], KeyRange::Full),
        plan,
        &mut timer,
    )
    .unwrap();
    let pieces: [&[u64]; 1] = [&probe];
    let mut ranges = Vec::new();
    let mut pairs = Vec::new();
    // The pairs are read back on a timer of their own: the join's counts
    // only what the join itself reads back.
    let mut pairs_timer = PhaseTimer::new(Arc::clone(stream));
    let total = hash_join::probe(
        &device,
        stream,
        &table,
        host_keys(&pieces, KeyRange::Full),
        1 << 22,
        &mut timer,
        |range, _| {
            ranges.push((range.len, range.whole_chunk));
            let (b, p) = range.download(&device, stream, &mut pairs_timer)?;
            pairs.extend(b.into_iter().zip(p));
            Ok(())
        },
    )
    .unwrap();
    let times = timer.finish().unwrap();
    pairs_timer.finish().unwrap();
    let expected = reference_join(&build, &probe);
    assert_eq!(total as usize, expected.len());
    assert_eq!(ranges, vec![(expected.len(), true)]);
    assert_eq!(times.device_to_host_bytes, 3 * 8, "{times:?}");
    pairs.sort_unstable();
    assert_eq!(pairs, expected);
}

#[test]
fn empty_sides_produce_no_pairs() {
    let Some(device) = device("empty_sides_produce_no_pairs") else {
        return;
    };
    let keys = random_keys(1000, 100, 5);
    assert!(
        device_join(&device, &[], &keys, RadixPlan::for_join(0, 1000), 1 << 20)
            .0
            .is_empty()
    );
    assert!(
        device_join(&device, &keys, &[], RadixPlan::for_join(1000, 0), 1 << 20)
            .0
            .is_empty()
    );
    let disjoint: Vec<u64> = keys.iter().map(|k| k + 1_000_000).collect();
    assert!(device_join(
        &device,
        &keys,
        &disjoint,
        RadixPlan::for_join(1000, 1000),
        1 << 20
    )
    .0
    .is_empty());
}

#[test]
fn the_device_budget_refuses_work_that_cannot_fit() {
    let Some(device) = device("the_device_budget_refuses_work_that_cannot_fit") else {
        return;
    };
    let budget = device.budget();
    let err = budget
        .reserve(
            budget.free_at_open(),
            0.01,
            datafusion_gpu::gpu::ReservationKind::Transient,
        )
        .unwrap_err();
    let message = datafusion::error::DataFusionError::from(err).to_string();
    assert!(message.contains("GPU memory budget exceeded"), "{message}");
}

#[test]
fn the_pinned_pool_keeps_at_most_its_limit_of_idle_buffers() {
    let Some(device) = device("the_pinned_pool_keeps_at_most_its_limit_of_idle_buffers") else {
        return;
    };
    device.bind_to_thread().unwrap();
    const MIB_WORDS: usize = (1 << 20) / 8;
    let pool = device.pinned().sibling_with_idle_limit(8 << 20);
    // Three 4 MiB buffers in use at once; two fit the limit once returned.
    let buffers: Vec<_> = (0..3).map(|_| pool.take(4 * MIB_WORDS).unwrap()).collect();
    assert_eq!(pool.idle_bytes(), 0);
    drop(buffers);
    assert_eq!(pool.idle_bytes(), 8 << 20);
    // Reused: taking one leaves the other idle.
    let mut reused = pool.take(3 * MIB_WORDS).unwrap();
    assert_eq!(pool.idle_bytes(), 4 << 20);
    reused.as_mut_slice().unwrap().fill(7);
    drop(reused);
    // A buffer larger than the limit is freed on return (the largest go
    // first); the smaller ones stay.
    let large = pool.take(16 * MIB_WORDS).unwrap();
    assert_eq!(large.len(), 16 * MIB_WORDS);
    drop(large);
    assert_eq!(pool.idle_bytes(), 8 << 20);
    // The device's own pool stays within its limit too.
    assert!(device.pinned().idle_bytes() <= datafusion_gpu::gpu::PINNED_IDLE_LIMIT_BYTES);
}

#[test]
fn pinned_buffers_of_both_kinds_carry_copies_and_are_counted() {
    let Some(device) = device("pinned_buffers_of_both_kinds_carry_copies_and_are_counted") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Where the kernel maps huge pages on request, the pool registers them.
    let huge_pages = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|mode| mode.contains("[always]") || mode.contains("[madvise]"));
    // Pools that keep nothing idle: every buffer is made and freed here.
    let registering = device.pinned().sibling_with_idle_limit(0);
    let allocated = device.pinned().sibling_allocated_by_driver(0);
    for (pool, registered) in [(registering, huge_pages), (allocated, false)] {
        // One word, a few MiB, and 70 MiB and a little (faulted in on
        // several threads when registered; not a whole number of pages).
        for len in [1usize, 3 << 17, (70 << 20) / 8 + 5] {
            let before = pool.stats();
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let mut buffer = pool.take_timed(len, &mut timer).unwrap();
            assert_eq!(buffer.is_registered(), registered, "{len} words");
            assert_eq!(buffer.len(), len);
            let after = pool.stats();
            assert_eq!(after.allocations, before.allocations + 1, "{len} words");
            let expected_bytes = 8 * len.max(1 << 16).next_power_of_two() as u64;
            assert_eq!(after.bytes - before.bytes, expected_bytes, "{len} words");
            // Device to pinned buffer, at an offset, then back out.
            let words = random_keys(len, u64::MAX, len as u64 + 11);
            let uploaded = upload_u64(&device, stream, &words, &mut timer).unwrap();
            buffer.as_mut_slice().unwrap().fill(u64::MAX);
            let tail = len / 2;
            enqueue_download(
                stream,
                &uploaded.slice(tail..),
                &mut buffer,
                tail,
                &mut timer,
            )
            .unwrap();
            enqueue_download(stream, &uploaded.slice(..tail), &mut buffer, 0, &mut timer).unwrap();
            assert!(buffer.as_slice().unwrap() == &words[..], "{len} words");
            // Host writes land on the device too (the device pool stages
            // this upload through buffers of its own kind).
            buffer.as_mut_slice().unwrap().reverse();
            let again =
                upload_u64(&device, stream, buffer.as_slice().unwrap(), &mut timer).unwrap();
            let mut back = Vec::new();
            download_u64(&device, stream, &again.as_view(), &mut back, &mut timer).unwrap();
            timer.finish().unwrap();
            assert!(back.iter().rev().eq(words.iter()), "{len} words");
            drop(buffer);
            assert_eq!(pool.idle_bytes(), 0);
        }
    }
    // A buffer kept idle is reused without another allocation.
    let keeping = device.pinned().sibling_allocated_by_driver(1 << 20);
    drop(keeping.take(100).unwrap());
    drop(keeping.take(200).unwrap());
    assert_eq!(keeping.stats().allocations, 1);
    assert_eq!(keeping.idle_bytes(), 512 << 10);
}

#[test]
fn pieces_upload_end_to_end_on_one_thread_and_on_many() {
    let Some(device) = device("pieces_upload_end_to_end_on_one_thread_and_on_many") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // 5 M words are staged by several threads, 10 000 by one; 20 M words
    // (160 MB) cross two boundaries of the 64 MiB staging windows.
    for total in [10_000usize, 5_000_000, 20_000_000] {
        let words = random_keys(total, u64::MAX, total as u64);
        let mut pieces = Vec::new();
        let (mut at, mut size) = (0, 1);
        while at < total {
            let end = (at + size).min(total);
            pieces.push(&words[at..end]);
            at = end;
            size = size * 13 % 1_000_003 + 1;
        }
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let uploaded = upload_u64_pieces(&device, stream, &pieces, &mut timer).unwrap();
        let mut back = Vec::new();
        download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
        timer.finish().unwrap();
        assert_eq!(back, words, "{total} words in {} pieces", pieces.len());
    }
}

#[test]
fn byte_pieces_upload_through_windows_of_any_size() {
    let Some(device) = device("byte_pieces_upload_through_windows_of_any_size") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Pieces of odd byte lengths (empty ones among them), so that windows
    // begin and end inside pieces and the last word is padded.
    // (Under the sanitizer, which checks every copy, a tenth.)
    let len = if sanitizing() { 10_003u32 } else { 100_003 };
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut pieces = Vec::new();
    let (mut at, mut size) = (0, 0);
    while at < bytes.len() {
        let end = (at + size).min(bytes.len());
        pieces.push(&bytes[at..end]);
        at = end;
        size = (size * 7 + 3) % 4_099;
    }
    let mut expected = bytes.clone();
    expected.resize(bytes.len().div_ceil(8) * 8, 0);
    for window in [1, 8, 24, 1_000, 65_536, 1 << 26] {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let uploaded =
            upload_byte_pieces_in_windows(&device, stream, &pieces, window, &mut timer).unwrap();
        let mut back = Vec::new();
        download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
        timer.finish().unwrap();
        let back: Vec<u8> = back.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert!(back == expected, "windows of {window} bytes");
    }
}

#[test]
fn uploads_sharing_staging_windows_each_arrive_whole() {
    let Some(device) = device("uploads_sharing_staging_windows_each_arrive_whole") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Uploads of many sizes through the same two buffers, each taken for
    // a first upload shorter than later windows (and so taken again),
    // every upload enqueued before any is read back: a buffer refilled
    // before its copy left would show in an earlier upload's words.
    for window in [8, 40, 4_096] {
        let mut staging = StagingWindows::new(&device, window);
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        // (Under the sanitizer, which checks every copy, the largest still
        // crosses the largest window, in fewer copies.)
        let largest = if sanitizing() { 5_000 } else { 40_000 };
        let sizes = [1usize, 3, 2_000, 0, 17, 5, largest, 2];
        let uploads: Vec<(Vec<u64>, _)> = sizes
            .iter()
            .enumerate()
            .map(|(u, &words)| {
                let host: Vec<u64> = random_keys(words, u64::MAX, (u * 31 + words) as u64);
                // In two pieces, the second empty where the upload is.
                let (first, second) = host.split_at(words / 2);
                let uploaded = staging
                    .upload_u64(stream, &[first, second], &mut timer)
                    .unwrap();
                (host, uploaded)
            })
            .collect();
        for (host, uploaded) in &uploads {
            let mut back = Vec::new();
            if !host.is_empty() {
                download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
            }
            assert_eq!(
                &back,
                host,
                "windows of {window} bytes, {} words",
                host.len()
            );
        }
        timer.finish().unwrap();
    }
}

#[test]
fn decimals_narrowed_on_the_way_up_come_back_whole() {
    let Some(device) = device("decimals_narrowed_on_the_way_up_come_back_whole") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // 16-byte values within 64 bits, the bounds among them, in pieces of
    // uneven sizes (one empty), through windows smaller and larger than a
    // piece: each comes back as its 8-byte word, and widened, as itself.
    let rows = if sanitizing() { 5_003 } else { 200_003 };
    let words = random_keys(rows, u64::MAX, 91);
    let mut values: Vec<i128> = words.iter().map(|&w| i128::from(w as i64)).collect();
    values[0] = i64::MIN.into();
    values[1] = i64::MAX.into();
    values[rows - 1] = (-1i64).into();
    let bytes: Vec<[u8; 16]> = values.iter().map(|v| v.to_le_bytes()).collect();
    let cut = rows / 3;
    let pieces: Vec<&[[u8; 16]]> = vec![
        &bytes[..cut],
        &[],
        &bytes[cut..rows - 5],
        &bytes[rows - 5..],
    ];
    // (Windows of one word each only over the first values: a copy per
    // word, queued behind every other test's copies.)
    let short = 2_003.min(cut);
    for (window, pieces, rows) in [
        (8, vec![&bytes[..short]], short),
        (4_096, pieces.clone(), rows),
        (1 << 26, pieces, rows),
    ] {
        let values = &values[..rows];
        let mut staging = StagingWindows::new(&device, window);
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let uploaded = staging
            .upload_narrowed(stream, &pieces, &mut timer)
            .unwrap()
            .expect("every value fits 64 bits");
        assert_eq!(uploaded.len(), rows, "one word a value");
        let mut back = Vec::new();
        download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
        let narrowed: Vec<u64> = values.iter().map(|&v| v as i64 as u64).collect();
        assert!(back == narrowed, "windows of {window} bytes");
        for piece_values in [1, 1_000, rows] {
            let widened = download_widened_pieces(
                &device,
                stream,
                &uploaded.as_view(),
                rows - 1,
                piece_values,
                4,
                &mut timer,
            )
            .unwrap();
            assert_eq!(widened.len(), (rows - 1).div_ceil(piece_values));
            let wide: Vec<i128> = widened
                .iter()
                .flat_map(|b| b.typed_data::<i128>().to_vec())
                .collect();
            assert!(
                wide == values[..rows - 1],
                "windows of {window}, pieces of {piece_values}"
            );
        }
        timer.finish().unwrap();
    }
    // One value past 64 bits, in the first window or the last: nothing is
    // kept, and the same windows then carry the next upload whole.
    for at in [0, rows / 2, rows - 1] {
        for outside in [i128::from(i64::MAX) + 1, i128::from(i64::MIN) - 1] {
            let mut with_outside = bytes.clone();
            with_outside[at] = outside.to_le_bytes();
            let mut staging = StagingWindows::new(&device, 4_096);
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let refused = staging
                .upload_narrowed(stream, &[&with_outside[..]], &mut timer)
                .unwrap();
            assert!(refused.is_none(), "{outside} at row {at}");
            let uploaded = staging
                .upload_narrowed(stream, &[&bytes[..]], &mut timer)
                .unwrap()
                .unwrap();
            let mut back = Vec::new();
            download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
            assert!(back
                .iter()
                .zip(&values)
                .all(|(&w, &v)| w as i64 as i128 == v));
            timer.finish().unwrap();
        }
    }
}

#[test]
fn join_keys_within_32_bits_cross_at_4_bytes_and_come_back_whole() {
    let Some(device) = device("join_keys_within_32_bits_cross_at_4_bytes_and_come_back_whole")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Uploads the words through windows of `window` bytes; returns them
    // as the device holds them and the bytes sent up.
    let upload = |pieces: &[&[u64]], window: usize| -> (Vec<u64>, usize) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let bytes: Vec<&[u8]> = pieces.iter().map(|p| p.to_byte_slice()).collect();
        let uploaded = StagingWindows::new(&device, window)
            .upload_words_narrowed(stream, &bytes, &mut timer)
            .unwrap();
        let mut back = Vec::new();
        download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
        (back, timer.finish().unwrap().host_to_device_bytes)
    };
    // Words within i32's range (the bounds and -1 among them), an odd
    // count, in pieces of uneven sizes (one empty), through windows
    // smaller and larger than a piece: each comes back as itself, sent at
    // 4 bytes.
    let rows = if sanitizing() { 5_003 } else { 200_003 };
    let mut words: Vec<u64> = random_keys(rows, 1 << 32, 93)
        .into_iter()
        .map(|w| w as u32 as i32 as i64 as u64)
        .collect();
    words[0] = i32::MIN as i64 as u64;
    words[1] = i32::MAX as u64;
    words[rows - 1] = u64::MAX;
    let cut = rows / 3;
    let pieces: Vec<&[u64]> = vec![
        &words[..cut],
        &[],
        &words[cut..rows - 5],
        &words[rows - 5..],
    ];
    // (Windows of one word each only over the first words: a copy per
    // word, queued behind every other test's copies.)
    let short = 2_003.min(cut);
    for (window, pieces, rows) in [
        (8, vec![&words[..short]], short),
        (4_096, pieces.clone(), rows),
        (1 << 26, pieces, rows),
    ] {
        let (back, up) = upload(&pieces, window);
        assert!(back == words[..rows], "windows of {window} bytes");
        assert_eq!(up, 8 * rows.div_ceil(2), "windows of {window} bytes");
    }
    let (back, up) = upload(&[&[], &[]], 4_096);
    assert!(back.is_empty() && up == 0, "{back:?}, {up} bytes");
    // One word past 32 bits, in the first window or a later one: the
    // words arrive whole, after the 4-byte windows sent before the one
    // that holds it (1,024 words a window of 4,096 bytes).
    for at in [0, rows / 2, rows - 1] {
        for outside in [i32::MAX as u64 + 1, (i32::MIN as i64 - 1) as u64, 1 << 40] {
            let mut with_outside = words.clone();
            with_outside[at] = outside;
            let (back, up) = upload(&[&with_outside], 4_096);
            assert!(back == with_outside, "{outside} at {at}");
            assert_eq!(up, 8 * rows + 4_096 * (at / 1_024), "{outside} at {at}");
        }
    }
    // Words in pinned memory go whole, straight from where they lie.
    let column: ArrayRef = Arc::new(datafusion::arrow::array::UInt64Array::from(words.clone()));
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::UInt64, false)]));
    let batch = RecordBatch::try_new(schema, vec![column]).unwrap();
    let pinned = datafusion_gpu::pin_batches(&[batch]).unwrap();
    let pinned_words = pinned[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::UInt64Array>()
        .unwrap()
        .values();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let uploaded = StagingWindows::new(&device, 4_096)
        .upload_words_narrowed(stream, &[pinned_words.to_byte_slice()], &mut timer)
        .unwrap();
    let mut back = Vec::new();
    download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
    let times = timer.finish().unwrap();
    assert!(back == words, "from pinned memory");
    assert_eq!(times.host_to_device_bytes, 8 * rows);
    assert_eq!(times.direct_host_to_device_bytes, 8 * rows);
    // A build table of keys within 32 bits sends 4 bytes a key fewer than
    // one of keys past them, and joins alike (see `device_join`).
    let keys = random_keys(10_000, 1 << 20, 95);
    let wide: Vec<u64> = keys.iter().map(|&k| k | 1 << 40).collect();
    let plan = RadixPlan::for_join(keys.len() as u64, keys.len() as u64);
    let sent: Vec<usize> = [&keys, &wide]
        .into_iter()
        .map(|keys| {
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let table = DeviceBuildTable::build(
                &device,
                stream,
                host_keys(&[keys], KeyRange::Full),
                plan.clone(),
                &mut timer,
            )
            .unwrap();
            assert_eq!(table.rows(), keys.len());
            timer.finish().unwrap().host_to_device_bytes
        })
        .collect();
    assert_eq!(sent[0] + 4 * keys.len(), sent[1], "bytes up: {sent:?}");
}

#[test]
fn decimals_within_32_bits_cross_at_4_bytes() {
    let Some(device) = device("decimals_within_32_bits_cross_at_4_bytes") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Uploads 16-byte values through windows of 4,096 bytes (512 words,
    // 1,024 values at 4 bytes); returns the words the device holds, or
    // `None`, and the bytes sent up.
    let upload = |values: &[[u8; 16]]| -> (Option<Vec<u64>>, usize) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let cut = values.len() / 3;
        let pieces: Vec<&[[u8; 16]]> = vec![&values[..cut], &[], &values[cut..]];
        let uploaded = StagingWindows::new(&device, 4_096)
            .upload_decimals_narrowed(stream, &pieces, &mut timer)
            .unwrap();
        let back = uploaded.map(|words| {
            let mut back = Vec::new();
            download_u64(&device, stream, &words.as_view(), &mut back, &mut timer).unwrap();
            back
        });
        (back, timer.finish().unwrap().host_to_device_bytes)
    };
    let rows = if sanitizing() { 5_001 } else { 100_001 };
    let mut values: Vec<i128> = random_keys(rows, 1 << 32, 97)
        .into_iter()
        .map(|w| i128::from(w as u32 as i32))
        .collect();
    values[0] = i32::MIN.into();
    values[1] = i32::MAX.into();
    values[rows - 1] = -1;
    let bytes =
        |values: &[i128]| -> Vec<[u8; 16]> { values.iter().map(|v| v.to_le_bytes()).collect() };
    let words = |values: &[i128]| -> Vec<u64> { values.iter().map(|&v| v as i64 as u64).collect() };
    // Every value within 32 bits: 4 bytes a value, the 8-byte words back.
    let (back, up) = upload(&bytes(&values));
    assert!(back == Some(words(&values)), "within 32 bits");
    assert_eq!(up, 8 * rows.div_ceil(2));
    // One past 32 bits but within 64: the 4-byte windows before it lost,
    // then 8 bytes a value.
    for at in [0, rows / 2, rows - 1] {
        for outside in [i128::from(i32::MAX) + 1, i128::from(i64::MIN)] {
            let mut with_outside = values.clone();
            with_outside[at] = outside;
            let (back, up) = upload(&bytes(&with_outside));
            assert!(back == Some(words(&with_outside)), "{outside} at {at}");
            assert_eq!(up, 4_096 * (at / 1_024) + 8 * rows, "{outside} at {at}");
        }
    }
    // One past 64 bits: nothing kept.
    let mut past = values.clone();
    past[rows / 2] = 1 << 64;
    assert_eq!(upload(&bytes(&past)).0, None);
    assert_eq!(upload(&[]), (Some(Vec::new()), 0));
}

#[test]
fn gathers_of_4_8_and_16_byte_values_match_the_host() {
    let Some(device) = device("gathers_of_4_8_and_16_byte_values_match_the_host") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    for width in [ValueWidth::Four, ValueWidth::Eight, ValueWidth::Sixteen] {
        let w = width.bytes();
        // Odd counts leave a 4-byte value alone in its last word.
        for (values, len) in [
            (1usize, 1usize),
            (7, 3),
            (1_001, 2_999),
            (3_000_001, 1_000_001),
        ] {
            let bytes: Vec<u8> = random_keys(values * w, 256, (values * w) as u64)
                .into_iter()
                .map(|b| b as u8)
                .collect();
            let ids = random_keys(len, values as u64, len as u64);
            // Uploaded in pieces that split values, as batches never do.
            let cut = (bytes.len() / 3) | 1;
            let pieces = [&bytes[..cut], &bytes[cut..]];
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let src = upload_byte_pieces(&device, stream, &pieces, &mut timer).unwrap();
            assert_eq!(src.len(), width.words(values));
            let device_ids = upload_u64(&device, stream, &ids, &mut timer).unwrap();
            // SAFETY: the gather writes what the download reads.
            let mut out = unsafe { stream.alloc::<u64>(width.words(len)) }.unwrap();
            launch::gather_values(
                &device.launcher(stream),
                width,
                &src,
                values,
                &device_ids,
                len,
                &mut out,
            )
            .unwrap();
            let piece_bytes = 1_000 * w;
            let back = download_byte_pieces(
                &device,
                stream,
                &out.as_view(),
                len * w,
                piece_bytes,
                // The largest case is copied out on several threads.
                4,
                &mut timer,
            )
            .unwrap();
            timer.finish().unwrap();
            assert_eq!(back.len(), (len * w).div_ceil(piece_bytes));
            assert!(back.iter().rev().skip(1).all(|b| b.len() == piece_bytes));
            let gathered: Vec<u8> = back.iter().flat_map(|b| b.as_slice().to_vec()).collect();
            let expected: Vec<u8> = ids
                .iter()
                .flat_map(|&id| bytes[id as usize * w..(id as usize + 1) * w].to_vec())
                .collect();
            assert_eq!(
                gathered, expected,
                "{w}-byte values: {values} gathered to {len}"
            );
        }
        // A source shorter than the values it claims is refused.
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let short = upload_u64(&device, stream, &[1, 2], &mut timer).unwrap();
        let ids = upload_u64(&device, stream, &[0], &mut timer).unwrap();
        // SAFETY: never read: the launch is refused.
        let mut out = unsafe { stream.alloc::<u64>(2) }.unwrap();
        timer.finish().unwrap();
        let too_many = 16 / w + 1;
        assert!(launch::gather_values(
            &device.launcher(stream),
            width,
            &short,
            too_many,
            &ids,
            1,
            &mut out
        )
        .is_err());
    }
}

/// Gathered-and-folded reductions (a join's SUM, MIN and MAX over its
/// pairs) against the host: 8-byte values, 4-byte values sign- and
/// zero-extended (extremes included, so a wrong extension changes the
/// answer), ids beyond the source skipped, sizes of one warp to many blocks.
#[test]
fn gathered_reductions_match_the_host_for_every_width_and_op() {
    use launch::{AggregateOp, GatheredValues};
    let Some(device) = device("gathered_reductions_match_the_host_for_every_width_and_op") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let widened = |read_as: GatheredValues, raw: u64| -> u64 {
        match read_as {
            GatheredValues::Eight => raw,
            GatheredValues::FourSigned => raw as u32 as i32 as i64 as u64,
            GatheredValues::FourUnsigned => raw as u32 as u64,
        }
    };
    for read_as in [
        GatheredValues::Eight,
        GatheredValues::FourSigned,
        GatheredValues::FourUnsigned,
    ] {
        let width = read_as.width();
        for (values, len) in [(1usize, 1usize), (33, 31), (5_001, 1_000_003)] {
            let mut raw = random_keys(values, u64::MAX, values as u64 + len as u64);
            // Each value's extremes: both sign bits, all ones, zero.
            for (slot, extreme) in raw.iter_mut().zip([1 << 63, 1 << 31, u64::MAX, 0]) {
                *slot = extreme;
            }
            let packed: Vec<u8> = raw
                .iter()
                .flat_map(|v| v.to_le_bytes()[..width.bytes()].to_vec())
                .collect();
            // Some ids lie beyond the source: the kernel skips them.
            let ids = random_keys(len, values as u64 + 3, len as u64);
            let mut timer = PhaseTimer::new(Arc::clone(stream));
            let src = upload_byte_pieces(&device, stream, &[&packed], &mut timer).unwrap();
            let device_ids = upload_u64(&device, stream, &ids, &mut timer).unwrap();
            for op in [AggregateOp::Sum, AggregateOp::Min, AggregateOp::Max] {
                for flip in [0, 1u64 << 63] {
                    let mut out =
                        upload_u64(&device, stream, &[op.identity()], &mut timer).unwrap();
                    launch::aggregate_gathered(
                        &device.launcher(stream),
                        &src,
                        values,
                        read_as,
                        &device_ids,
                        len,
                        op,
                        flip,
                        &mut out,
                    )
                    .unwrap();
                    let mut back = Vec::new();
                    download_u64(&device, stream, &out.as_view(), &mut back, &mut timer).unwrap();
                    let expected = ids
                        .iter()
                        .filter(|&&id| (id as usize) < values)
                        .map(|&id| widened(read_as, raw[id as usize]) ^ flip)
                        .fold(op.identity(), |acc, v| match op {
                            AggregateOp::Sum => acc.wrapping_add(v),
                            AggregateOp::Min => acc.min(v),
                            _ => acc.max(v),
                        });
                    assert_eq!(
                        back,
                        vec![expected],
                        "{read_as:?} {op:?} flip {flip:#x}: {values} values, {len} ids"
                    );
                }
            }
            timer.finish().unwrap();
        }
    }
    // A COUNT, and a source shorter than the values it claims, are refused.
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let short = upload_u64(&device, stream, &[1, 2], &mut timer).unwrap();
    let ids = upload_u64(&device, stream, &[0], &mut timer).unwrap();
    let mut out = upload_u64(&device, stream, &[0], &mut timer).unwrap();
    timer.finish().unwrap();
    let refused = |values, read_as, op, out: &mut _| {
        launch::aggregate_gathered(
            &device.launcher(stream),
            &short,
            values,
            read_as,
            &ids,
            1,
            op,
            0,
            out,
        )
        .is_err()
    };
    assert!(refused(
        5,
        GatheredValues::FourSigned,
        AggregateOp::Sum,
        &mut out
    ));
    assert!(refused(
        3,
        GatheredValues::Eight,
        AggregateOp::Max,
        &mut out
    ));
    assert!(refused(
        1,
        GatheredValues::Eight,
        AggregateOp::Count,
        &mut out
    ));
}

/// The merge-path kernel alone, on sorted keys that cross many of its
/// shared-memory tiles (2,048 merged keys each): every streamed key's match
/// count against a binary search of the other side. Small enough to run
/// under compute-sanitizer's racecheck in seconds.
#[test]
fn merge_path_match_counts_cross_tiles_like_a_binary_search() {
    use datafusion_gpu::ops::merge_join::{MergeMatches, SortedSide};
    let Some(device) = device("merge_path_match_counts_cross_tiles_like_a_binary_search") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // (streamed rows, other rows, distinct keys): one tile, a tile edge,
    // runs of equal keys longer than a tile, keys mostly without a match.
    let cases = [
        (1usize, 2047usize, 3u64),
        (2048, 1, 5),
        (5_000, 7_000, 1),
        (20_000, 30_000, 37),
        (30_000, 20_000, 1 << 40),
        (65_537, 4_099, 5_000),
    ];
    for (n, m, domain) in cases {
        let mut streamed = random_keys(n, domain, n as u64 + 3);
        let mut other = random_keys(m, domain, m as u64 + 5);
        streamed.sort_unstable();
        other.sort_unstable();
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let a =
            SortedSide::upload(&device, stream, &[&streamed], None, 64, true, &mut timer).unwrap();
        let b = SortedSide::upload(&device, stream, &[&other], None, 64, true, &mut timer).unwrap();
        let matches = MergeMatches::find(&device, stream, &a, &b, true, &mut timer).unwrap();
        timer.finish().unwrap();
        let expected: Vec<u64> = streamed
            .iter()
            .map(|k| (other.partition_point(|o| o <= k) - other.partition_point(|o| o < k)) as u64)
            .collect();
        assert_eq!(
            matches.counts().unwrap(),
            &expected[..],
            "{n} x {m}, {domain} keys"
        );
        assert_eq!(matches.total(), expected.iter().sum::<u64>(), "{n} x {m}");
    }
}

#[test]
fn radix_sort_and_merge_path_match_their_references() {
    use datafusion_gpu::ops::merge_join::{self, MergeMatches, SortedSide};
    let Some(device) = device("radix_sort_and_merge_path_match_their_references") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let copy_stream = device.stream().unwrap();
    // (streamed rows, other rows, key bits, distinct keys): empty sides, one
    // row, tile edges, many duplicates, keys using all 64 bits.
    let cases = [
        (0usize, 10usize, 8u32, 5u64),
        (10, 0, 8, 5),
        (1, 1, 1, 2),
        (1025, 3000, 12, 4096),
        (100_000, 70_000, 20, 1 << 20),
        (50_000, 50_000, 17, 37),
        (300_000, 200_000, 64, u64::MAX),
        // One key: every merge tile lies inside one run of equal keys.
        (3_000, 2_000, 4, 1),
        // Sort blocks of several scatter tiles; many merge tiles.
        (3_000_001, 2_500_000, 22, 1 << 21),
    ];
    for (n, m, bits, domain) in cases {
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let streamed: Vec<u64> = random_keys(n, domain, n as u64 + 7)
            .into_iter()
            .map(|k| k & mask)
            .collect();
        let other: Vec<u64> = random_keys(m, domain, m as u64 + 11)
            .into_iter()
            .map(|k| k & mask)
            .collect();
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let a = SortedSide::upload(&device, stream, &[&streamed], None, bits, false, &mut timer)
            .unwrap();
        // The other side's keys copied on a stream of their own, as the
        // join does, while the first side is sorted.
        let b = SortedSide::upload_unsorted(
            &device,
            stream,
            copy_stream.stream(),
            &[&other],
            &mut timer,
        )
        .unwrap()
        .sort(&device, stream, None, bits, false, &mut timer)
        .unwrap();
        // The sort: stable, so ids equal the reference's exactly.
        let (a_sorted, a_ids) = merge_join::reference::sort(&streamed);
        let (b_sorted, b_ids) = merge_join::reference::sort(&other);
        assert_eq!(
            a.download_row_ids(&device, stream, &mut timer).unwrap(),
            a_ids,
            "{n} x {m}"
        );
        assert_eq!(
            b.download_row_ids(&device, stream, &mut timer).unwrap(),
            b_ids,
            "{n} x {m}"
        );
        // The merge, expanded in ranges of 1000 pairs, or of 2^20 where
        // there are millions (still several ranges, their edges inside runs
        // of equal keys): tens of thousands of small ranges add nothing but
        // minutes under a sanitizer.
        let matches = MergeMatches::find(&device, stream, &a, &b, true, &mut timer).unwrap();
        let range = if matches.total() > 100_000 {
            1 << 20
        } else {
            1000
        };
        let (positions, ids) = merge_join::reference::merge_pairs(&a_sorted, &b_sorted, &b_ids);
        assert_eq!(matches.total(), positions.len() as u64, "{n} x {m}");
        let counts = matches.counts().unwrap().to_vec();
        assert_eq!(counts.iter().sum::<u64>(), matches.total());
        let (mut got_positions, mut got_ids) = (Vec::new(), Vec::new());
        matches
            .expand(&device, stream, &b, range, &mut timer, |p, i| {
                assert!(p.len() <= range);
                got_positions.extend(p);
                got_ids.extend(i);
                Ok(true)
            })
            .unwrap();
        timer.finish().unwrap();
        assert_eq!(got_positions, positions, "{n} x {m}");
        assert_eq!(got_ids, ids, "{n} x {m}");
        // Presorted input is taken as it is.
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let presorted =
            SortedSide::upload(&device, stream, &[&a_sorted], None, bits, true, &mut timer)
                .unwrap();
        let identity: Vec<u64> = (0..n as u64).collect();
        assert_eq!(
            presorted
                .download_row_ids(&device, stream, &mut timer)
                .unwrap(),
            identity
        );
        timer.finish().unwrap();
    }
}

#[test]
fn key_ranges_found_on_the_device_match_the_host() {
    use datafusion_gpu::ops::merge_join::SortedSide;
    let Some(device) = device("key_ranges_found_on_the_device_match_the_host") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let copy_stream = device.stream().unwrap();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let mut words = random_keys(300_001, u64::MAX, 9);
    words.extend([u64::MAX, 0, 1 << 63, (1 << 63) - 1]);
    let small = [3u64, 1 << 63, 7];
    for keys in [&words[..], &small[..], &words[..1]] {
        // Copied on a stream of their own, reduced on the other.
        let side = SortedSide::upload_unsorted(
            &device,
            stream,
            copy_stream.stream(),
            &[&keys[..keys.len() / 2], &keys[keys.len() / 2..]],
            &mut timer,
        )
        .unwrap();
        // Unsigned words, and the same words as signed values.
        let unsigned = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
        let signed = (
            keys.iter().map(|&k| k as i64).min().unwrap() as u64,
            keys.iter().map(|&k| k as i64).max().unwrap() as u64,
        );
        for (flip, expected) in [(0, unsigned), (1 << 63, signed)] {
            let range = side.key_range(&device, stream, flip, &mut timer).unwrap();
            assert_eq!(range, Some(expected), "{} keys, flip {flip:x}", keys.len());
        }
    }
    let empty = SortedSide::upload_unsorted(&device, stream, stream, &[], &mut timer).unwrap();
    assert_eq!(
        empty.key_range(&device, stream, 0, &mut timer).unwrap(),
        None
    );
    timer.finish().unwrap();
}

#[test]
fn raw_keys_become_their_order_preserving_codes_on_the_device() {
    use datafusion_gpu::gpu::download_u64;
    use datafusion_gpu::gpu::launch::CodeTransform;
    use datafusion_gpu::ops::merge_join::SortedSide;
    let Some(device) = device("raw_keys_become_their_order_preserving_codes_on_the_device") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // Signed keys across the whole range, both extremes included.
    let mut keys: Vec<i64> = random_keys(100_003, u64::MAX, 5)
        .into_iter()
        .map(|k| k as i64)
        .collect();
    keys.extend([i64::MIN, i64::MAX, -1, 0]);
    let (min, max) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
    let raw: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
    for descending in [false, true] {
        let base = if descending { max } else { min } as u64;
        let transform = CodeTransform { base, descending };
        // The host's codes: the distance from the smallest (largest) key.
        let expected: Vec<u64> = keys
            .iter()
            .map(|&k| {
                let distance = if descending {
                    i128::from(max) - i128::from(k)
                } else {
                    i128::from(k) - i128::from(min)
                };
                distance as u64
            })
            .collect();
        assert_eq!(
            raw.iter().map(|&k| transform.code(k)).collect::<Vec<_>>(),
            expected
        );
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        // Taken as sorted: the codes in input order.
        let side = SortedSide::upload(
            &device,
            stream,
            &[&raw[..5], &raw[5..]],
            Some(transform),
            64,
            true,
            &mut timer,
        )
        .unwrap();
        let mut codes = Vec::new();
        download_u64(
            &device,
            stream,
            &side.keys.as_view(),
            &mut codes,
            &mut timer,
        )
        .unwrap();
        assert_eq!(codes, expected, "descending: {descending}");
        // Sorted: the codes ascend, each with its row.
        let side = SortedSide::upload(
            &device,
            stream,
            &[&raw],
            Some(transform),
            64,
            false,
            &mut timer,
        )
        .unwrap();
        let mut sorted = Vec::new();
        download_u64(
            &device,
            stream,
            &side.keys.as_view(),
            &mut sorted,
            &mut timer,
        )
        .unwrap();
        let ids = side.download_row_ids(&device, stream, &mut timer).unwrap();
        timer.finish().unwrap();
        let mut reference = expected.clone();
        reference.sort_unstable();
        assert_eq!(sorted, reference, "descending: {descending}");
        assert!(ids
            .iter()
            .zip(&sorted)
            .all(|(&id, &code)| expected[id as usize] == code));
    }
}

/// The bytes of each array's values.
fn value_bytes(arrays: &[ArrayData]) -> Vec<&[u8]> {
    arrays
        .iter()
        .map(|data| {
            let width = data.data_type().primitive_width().unwrap();
            &data.buffers()[0].as_slice()
                [width * data.offset()..width * (data.offset() + data.len())]
        })
        .collect()
}

/// Batches of an Int64 column (lengths that are and are not multiples of 8
/// rows, so some neighbours lie end to end in the region and some do not),
/// an Int32 column with NULLs and a Utf8 column.
fn mixed_batches() -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("n", DataType::Int32, true),
        Field::new("s", DataType::Utf8, false),
    ]));
    let mut next = 0i64;
    [8192usize, 8192, 1001, 0, 4096, 7]
        .iter()
        .map(|&rows| {
            let k: Vec<i64> = (0..rows as i64)
                .map(|i| (next + i).wrapping_mul(0x7F4A_7C15_9E37_79B9))
                .collect();
            next += rows as i64;
            let n: Vec<Option<i32>> = (0..rows as i32)
                .map(|i| (i % 3 != 0).then_some(i))
                .collect();
            let s: Vec<String> = (0..rows).map(|i| format!("s{i}")).collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(Int32Array::from(n)),
                Arc::new(StringArray::from(s)),
            ];
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect()
}

#[test]
fn pinned_tables_upload_straight_from_host_memory_and_match_staged_uploads() {
    let Some(device) =
        device("pinned_tables_upload_straight_from_host_memory_and_match_staged_uploads")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let batches = mixed_batches();
    let pinned = datafusion_gpu::pin_batches(&batches).unwrap();
    assert_eq!(pinned, batches, "pinned batches read like the originals");
    assert!(pinned.iter().all(datafusion_gpu::is_pinned));
    assert!(!batches.iter().any(datafusion_gpu::is_pinned));
    // Uploads the pieces, returns the bytes back (padded to whole words),
    // how many of them went straight from pinned memory and in how many
    // copies.
    let upload_counting = |pieces: &[&[u8]]| -> (Vec<u8>, usize, usize) {
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let uploaded = upload_byte_pieces(&device, stream, pieces, &mut timer).unwrap();
        let mut back = Vec::new();
        download_u64(&device, stream, &uploaded.as_view(), &mut back, &mut timer).unwrap();
        let times = timer.finish().unwrap();
        let back = back.iter().flat_map(|w| w.to_le_bytes()).collect();
        (
            back,
            times.direct_host_to_device_bytes,
            times.direct_host_to_device_copies,
        )
    };
    let upload = |pieces: &[&[u8]]| -> (Vec<u8>, usize) {
        let (back, direct, _) = upload_counting(pieces);
        (back, direct)
    };
    let expected = |pieces: &[&[u8]]| -> Vec<u8> {
        let mut bytes = pieces.concat();
        bytes.resize(bytes.len().div_ceil(8) * 8, 0);
        bytes
    };
    // Each batch's column `column` without its first `offset` rows.
    let sliced = |batches: &[RecordBatch], column: usize, offset: usize| -> Vec<ArrayData> {
        batches
            .iter()
            .map(|b| {
                let array = b.column(column);
                let skip = offset.min(array.len());
                array.slice(skip, array.len() - skip).to_data()
            })
            .collect()
    };
    // 8-byte and 4-byte values (an odd count: the last word is padded),
    // whole and sliced, from the pinned batches: straight from pinned
    // memory. The same values from pageable batches, or with one pageable
    // piece among pinned ones: staged, with the same bytes.
    for (column, offset) in [(0, 0), (0, 3), (1, 0), (1, 5)] {
        let pinned_arrays = sliced(&pinned, column, offset);
        let pinned_pieces = value_bytes(&pinned_arrays);
        let want = expected(&pinned_pieces);
        let (back, direct, copies) = upload_counting(&pinned_pieces);
        assert!(
            back == want,
            "column {column}, offset {offset}: pinned upload"
        );
        // One copy per run of pieces that lie end to end (buffers are
        // aligned, so a piece of an odd length, or a sliced one, ends a run).
        let pieces: Vec<&&[u8]> = pinned_pieces.iter().filter(|p| !p.is_empty()).collect();
        let runs = 1 + pieces
            .windows(2)
            .filter(|pair| pair[0].as_ptr_range().end != pair[1].as_ptr())
            .count();
        assert!(runs < pieces.len() || offset > 0, "whole columns join up");
        assert_eq!(copies, runs, "column {column}, offset {offset}: copies");
        assert_eq!(
            direct,
            pinned_pieces.iter().map(|p| p.len()).sum::<usize>(),
            "column {column}, offset {offset}: every byte straight from pinned memory"
        );
        let pageable_arrays = sliced(&batches, column, offset);
        let pageable = value_bytes(&pageable_arrays);
        assert_eq!(
            expected(&pageable),
            want,
            "the pinned values are the originals"
        );
        let (back, direct) = upload(&pageable);
        assert!(
            back == want && direct == 0,
            "column {column}: pageable upload"
        );
        let mut mixed = pinned_pieces.clone();
        mixed[1] = pageable[1];
        let (back, direct) = upload(&mixed);
        assert!(back == want && direct == 0, "column {column}: mixed upload");
    }
    // The region outlives the batches' owner only as long as a buffer does.
    let column = Arc::clone(pinned[0].column(0));
    drop(pinned);
    assert_eq!(column.as_ref(), batches[0].column(0).as_ref());
    drop(column);
    // A new region after the old one was freed.
    let again = datafusion_gpu::pin_batches(&batches).unwrap();
    assert_eq!(again, batches);
}

/// A column reduced span by span (the first spans not starting at a word
/// of the validity bitmap, each span's values alone on the device, as a
/// chunk that has landed) gives what one launch over every row gives, for
/// each op, with and without NULLs and privatized groups; a span past the
/// rows is refused.
#[test]
fn reductions_over_spans_of_rows_match_one_over_all() {
    let Some(device) = device("reductions_over_spans_of_rows_match_one_over_all") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let rows = 10_000;
    let mut rng = StdRng::seed_from_u64(17);
    let values: Vec<u64> = (0..rows).map(|_| rng.random()).collect();
    let high: Vec<u64> = (0..rows).map(|_| rng.random_range(0..3)).collect();
    let valid: Vec<u64> = datafusion_gpu::ops::group_by::validity_bitmap(rows, |i| i % 7 != 3);
    let spans = [0..37, 37..100, 100..4_096, 4_096..9_999, 9_999..10_000];
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let upload =
        |words: &[u64], timer: &mut PhaseTimer| upload_u64(&device, stream, words, timer).unwrap();
    let bits = upload(&valid, &mut timer);
    // Few groups (privatized in shared memory) and many.
    for groups in [5usize, 3_000] {
        let group_ids: Vec<u64> = (0..rows)
            .map(|_| rng.random_range(0..groups as u64))
            .collect();
        let ids = upload(&group_ids, &mut timer);
        for valid_bits in [None, Some(&bits)] {
            let all = launch::GroupRows {
                groups_of_rows: Some(&ids),
                rows,
                valid_bits,
                groups,
                span: None,
            };
            let fresh =
                |identity: u64, timer: &mut PhaseTimer| upload(&vec![identity; groups], timer);
            let download = |out: &datafusion_gpu::gpu::DeviceVec<u64>, timer: &mut PhaseTimer| {
                let mut host = Vec::new();
                download_u64(&device, stream, &out.as_view(), &mut host, timer).unwrap();
                host
            };
            for op in [
                launch::AggregateOp::Count,
                launch::AggregateOp::Sum,
                launch::AggregateOp::Min,
                launch::AggregateOp::Max,
            ] {
                let whole_values = upload(&values, &mut timer);
                let mut whole = fresh(op.identity(), &mut timer);
                launch::aggregate_u64(
                    &device.launcher(stream),
                    all,
                    Some(&whole_values),
                    None,
                    op,
                    1 << 63,
                    &mut whole,
                )
                .unwrap();
                let mut in_spans = fresh(op.identity(), &mut timer);
                for span in &spans {
                    let chunk = upload(&values[span.clone()], &mut timer);
                    launch::aggregate_u64(
                        &device.launcher(stream),
                        all.chunk(span.start, span.end),
                        Some(&chunk),
                        None,
                        op,
                        1 << 63,
                        &mut in_spans,
                    )
                    .unwrap();
                }
                assert_eq!(
                    download(&in_spans, &mut timer),
                    download(&whole, &mut timer),
                    "{op:?}, {groups} groups, bitmap {}",
                    valid_bits.is_some()
                );
                // A span's values must hold its rows, and the span lie
                // within the rows.
                let short = upload(&values[..10], &mut timer);
                for (span, values) in [((0, 11), &short), ((9_990, 10_001), &short)] {
                    assert!(launch::aggregate_u64(
                        &device.launcher(stream),
                        all.chunk(span.0, span.1),
                        Some(values),
                        None,
                        op,
                        0,
                        &mut in_spans
                    )
                    .is_err());
                }
            }
            // The 128-bit sum, and the float sum over quarters (exact in
            // any order).
            let (lo, hi) = (upload(&values, &mut timer), upload(&high, &mut timer));
            let (mut whole_lo, mut whole_hi) = (fresh(0, &mut timer), fresh(0, &mut timer));
            launch::aggregate_i128_sum(
                &device.launcher(stream),
                all,
                &lo,
                &hi,
                &mut whole_lo,
                &mut whole_hi,
            )
            .unwrap();
            let (mut span_lo, mut span_hi) = (fresh(0, &mut timer), fresh(0, &mut timer));
            let quarters: Vec<u64> = (0..rows)
                .map(|i| ((i as f64 - 5_000.0) / 4.0).to_bits())
                .collect();
            let whole_quarters = upload(&quarters, &mut timer);
            let mut whole_sum = fresh(0f64.to_bits(), &mut timer);
            launch::aggregate_f64_sum(
                &device.launcher(stream),
                all,
                &whole_quarters,
                &mut whole_sum,
            )
            .unwrap();
            let mut span_sum = fresh(0f64.to_bits(), &mut timer);
            for span in &spans {
                let (lo, hi) = (
                    upload(&values[span.clone()], &mut timer),
                    upload(&high[span.clone()], &mut timer),
                );
                let rows = all.chunk(span.start, span.end);
                launch::aggregate_i128_sum(
                    &device.launcher(stream),
                    rows,
                    &lo,
                    &hi,
                    &mut span_lo,
                    &mut span_hi,
                )
                .unwrap();
                let chunk = upload(&quarters[span.clone()], &mut timer);
                launch::aggregate_f64_sum(&device.launcher(stream), rows, &chunk, &mut span_sum)
                    .unwrap();
            }
            assert_eq!(
                download(&span_lo, &mut timer),
                download(&whole_lo, &mut timer)
            );
            assert_eq!(
                download(&span_hi, &mut timer),
                download(&whole_hi, &mut timer)
            );
            assert_eq!(
                download(&span_sum, &mut timer),
                download(&whole_sum, &mut timer)
            );
            // The deterministic float sum reads its rows twice: no span.
            let (mut top, mut specials) = (fresh(0, &mut timer), fresh(0, &mut timer));
            let chunk = upload(&quarters[0..37], &mut timer);
            assert!(launch::f64_sum_scale(
                &device.launcher(stream),
                all.chunk(0, 37),
                &chunk,
                &mut top,
                &mut specials
            )
            .is_err());
        }
    }
    timer.finish().unwrap();
}

/// Validity words of `rows` rows: bit `r % 64` of word `r / 64` set where
/// `valid(r)`.
fn validity_bits(rows: usize, valid: impl Fn(usize) -> bool) -> Vec<u64> {
    (0..rows.div_ceil(64))
        .map(|w| {
            (0..64)
                .filter(|&i| w * 64 + i < rows && valid(w * 64 + i))
                .fold(0, |m, i| m | 1 << i)
        })
        .collect()
}

/// `words` on the device as a filter's column, and one word more (an empty
/// column still has an address).
fn upload_column(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    words: &[u64],
    timer: &mut PhaseTimer,
) -> DeviceVec<u64> {
    let words: Vec<u64> = words.iter().copied().chain([0]).collect();
    upload_u64(device, stream, &words, timer).unwrap()
}

#[test]
fn the_filtering_scan_keeps_the_references_rows_in_order_across_tile_boundaries() {
    use datafusion_gpu::gpu::launch::{FilterProgram, ScanChunk, ScanColumn, ScanOp, FILTER_TILE};
    use datafusion_gpu::ops::scan_filter::{filter_chunk, reference};
    let Some(device) =
        device("the_filtering_scan_keeps_the_references_rows_in_order_across_tile_boundaries")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // r0 = a, r1 = b (NULL where bit r of b's validity is clear),
    // r2 = 500, r3 = a < 500, r4 = a + b: keep a < 500, output r0 and r4.
    let instructions = [
        [ScanOp::LoadI64 as i64, 0, 0, 0, 0],
        [ScanOp::LoadI64 as i64, 1, 1, 0, 0],
        [ScanOp::Const as i64, 2, 500, 0, 0],
        [ScanOp::LtI64 as i64, 3, 0, 2, 0],
        [ScanOp::AddI64 as i64, 4, 0, 1, 0],
    ];
    let outputs = [0u32, 4];
    let program = FilterProgram {
        instructions: &instructions,
        predicate: Some(3),
        outputs: &outputs,
    };
    for rows in [
        0,
        1,
        FILTER_TILE - 1,
        FILTER_TILE,
        FILTER_TILE + 1,
        3 * FILTER_TILE + 77,
        100_003,
    ] {
        let a = random_keys(rows, 1000, rows as u64);
        let b = random_keys(rows, 1 << 40, rows as u64 + 1);
        let valid = |r: usize| r % 7 != 3;
        let validity = validity_bits(rows, valid);
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let a_device = upload_column(&device, stream, &a, &mut timer);
        let b_device = upload_column(&device, stream, &b, &mut timer);
        let validity_device = upload_column(&device, stream, &validity, &mut timer);
        let chunk = ScanChunk {
            rows,
            columns: vec![
                ScanColumn {
                    values: &a_device,
                    validity: None,
                    narrow: false,
                    bytes: None,
                },
                ScanColumn {
                    values: &b_device,
                    validity: Some(&validity_device),
                    narrow: false,
                    bytes: None,
                },
            ],
            remap: Default::default(),
        };
        let got = filter_chunk(
            &device,
            stream,
            &chunk,
            &program,
            &[],
            None,
            0.5,
            &mut timer,
        )
        .unwrap();
        timer.finish().unwrap();
        let expected = reference::filter(
            rows,
            2,
            |r| a[r] < 500,
            |r| {
                vec![
                    (a[r], true),
                    (if valid(r) { a[r] + b[r] } else { 0 }, valid(r)),
                ]
            },
        );
        assert_eq!(got, expected, "{rows} rows");
        // Words come back 4 bytes a row where every one fits, validity
        // only where some row is NULL.
        if got.rows > 0 {
            use datafusion_gpu::ops::scan_filter::OutputWords;
            let narrow = |o: usize| matches!(got.words_of(o), Some(OutputWords::Narrow(_)));
            assert!(narrow(0) && got.valid_of(0).is_none(), "{rows} rows");
            let sums: Vec<(u64, bool)> = (0..rows)
                .filter(|&r| a[r] < 500)
                .map(|r| {
                    if valid(r) {
                        (a[r] + b[r], true)
                    } else {
                        (0, false)
                    }
                })
                .collect();
            let fits = sums
                .iter()
                .all(|&(v, _)| i64::from(v as i64 as i32) == v as i64);
            assert_eq!(narrow(1), fits, "{rows} rows");
            assert_eq!(
                got.valid_of(1).is_some(),
                sums.iter().any(|&(_, ok)| !ok),
                "{rows} rows"
            );
        }
    }
}

#[test]
fn chunks_sharing_their_tables_share_one_copy_and_keep_the_same_rows() {
    use datafusion_gpu::gpu::launch::{
        FilterProgram, RemapTable, RemapUploads, ScanChunk, ScanColumn, ScanOp, SharedWords,
    };
    use datafusion_gpu::ops::scan_filter::{filter_chunk, reference};
    let Some(device) = device("chunks_sharing_their_tables_share_one_copy_and_keep_the_same_rows")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // A join key set as the scan tests it: its smallest value (two words,
    // low first), then a bitmap from it. Keys 1000 + 3i for i < 20000.
    let (smallest, keys): (u64, Vec<u64>) = (1000, (0..20_000).map(|i| 1000 + 3 * i).collect());
    let span = (keys[keys.len() - 1] - smallest + 1) as usize;
    let mut set = vec![smallest as u32, (smallest >> 32) as u32];
    set.extend(std::iter::repeat_n(0u32, span.div_ceil(32)));
    for &key in &keys {
        let bit = (key - smallest) as usize;
        set[2 + bit / 32] |= 1 << (bit % 32);
    }
    let set: SharedWords = Arc::new(set);
    let table = RemapTable::new(vec![Arc::clone(&set)]);
    // r0 = a, r1 = a in key set 0: keep r1, output r0.
    let instructions = [
        [ScanOp::LoadI64 as i64, 0, 0, 0, 0],
        [ScanOp::KeyTest as i64, 1, 0, 0, 0],
    ];
    let program = FilterProgram {
        instructions: &instructions,
        predicate: Some(1),
        outputs: &[0],
    };
    let remaps = RemapUploads::default();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    for (part, rows) in [0usize, 1, 5_000, 100_003, 3].into_iter().enumerate() {
        let a = random_keys(rows, 80_000, part as u64 + 11);
        let a_device = upload_column(&device, stream, &a, &mut timer);
        // Each part's chunk holds the same tables, as a scan's parts do.
        let chunk = ScanChunk {
            rows,
            columns: vec![ScanColumn {
                values: &a_device,
                validity: None,
                narrow: false,
                bytes: None,
            }],
            remap: table.clone(),
        };
        let shared = filter_chunk(
            &device,
            stream,
            &chunk,
            &program,
            &[],
            Some(&remaps),
            0.5,
            &mut timer,
        )
        .unwrap();
        let own = filter_chunk(
            &device,
            stream,
            &chunk,
            &program,
            &[],
            None,
            0.5,
            &mut timer,
        )
        .unwrap();
        let expected = reference::filter(
            rows,
            1,
            |r| {
                a[r] >= smallest
                    && (a[r] - smallest).is_multiple_of(3)
                    && a[r] <= keys[keys.len() - 1]
            },
            |r| vec![(a[r], true)],
        );
        assert_eq!(shared, expected, "part {part}, {rows} rows");
        assert_eq!(own, expected, "part {part}, {rows} rows");
    }
    // One copy for every part: the same words on the device again, another
    // copy for equal words held apart or for another device's chunk.
    let first = remaps
        .on_device(&device, stream, &table, 1.0, &mut timer)
        .unwrap();
    let again = remaps
        .on_device(&device, stream, &table.clone(), 1.0, &mut timer)
        .unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    let equal = RemapTable::new(vec![Arc::new(set.words().to_vec()) as SharedWords]);
    let other = remaps
        .on_device(&device, stream, &equal, 1.0, &mut timer)
        .unwrap();
    assert!(!Arc::ptr_eq(&first, &other));
    // A table without words (a key set not read yet) is not kept.
    let unread = RemapTable::new(vec![Arc::new(Vec::<u32>::new()) as SharedWords]);
    let once = remaps
        .on_device(&device, stream, &unread, 1.0, &mut timer)
        .unwrap();
    let twice = remaps
        .on_device(&device, stream, &unread, 1.0, &mut timer)
        .unwrap();
    assert!(!Arc::ptr_eq(&once, &twice));
    timer.finish().unwrap();
}

/// A remap table whose tables go to the device as their words and as the
/// positions of their set bits (sets of few values over wide spans, laid
/// out after the others, made on the device in zeroed words) holds there
/// the words it holds on the host: one sharing a `u64` with the words
/// copied before it, positions given twice, a table of no bit set, a
/// table of bits alone; and a scan testing two key sets, the sparse one
/// first or last, keeps the rows the host's sets keep.
#[test]
fn tables_sent_as_their_set_bits_are_the_same_words_on_the_device() {
    use datafusion_gpu::gpu::launch::{
        FilterProgram, RemapTable, RemapUploads, ScanChunk, ScanColumn, ScanOp, SharedWords,
        TableWords,
    };
    use datafusion_gpu::ops::scan_filter::{filter_chunk, reference};
    struct Bits(Vec<u32>, Vec<u32>);
    impl TableWords for Bits {
        fn words(&self) -> &[u32] {
            &self.0
        }
        fn set_bits(&self) -> Option<&[u32]> {
            Some(&self.1)
        }
    }
    let Some(device) = device("tables_sent_as_their_set_bits_are_the_same_words_on_the_device")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    // `count` positions at random among `len` words' bits, the first twice.
    let bits = |len: usize, count: usize, seed: u64| -> SharedWords {
        let mut positions: Vec<u32> = random_keys(count, 32 * len as u64, seed)
            .into_iter()
            .map(|p| p as u32)
            .collect();
        positions.extend(positions.first().copied());
        let mut words = vec![0u32; len];
        for &p in &positions {
            words[p as usize / 32] |= 1 << (p % 32);
        }
        Arc::new(Bits(words, positions))
    };
    let words = |w: &[u32]| -> SharedWords { Arc::new(w.to_vec()) };
    for (case, tables) in [
        vec![bits(1_000_003, 5_000, 1), words(&[1, 2, 3]), bits(5, 3, 2)],
        vec![bits(64, 10, 3)],
        vec![words(&[9]), bits(3, 0, 4), words(&[u32::MAX; 4])],
    ]
    .into_iter()
    .enumerate()
    {
        let table = RemapTable::new(tables);
        let uploads = RemapUploads::default();
        let on_device = uploads
            .on_device(&device, stream, &table, 1.0, &mut timer)
            .unwrap();
        let (got, expected) = remap_words(&device, stream, &on_device, &table, &mut timer);
        assert_eq!(got.len(), expected.len(), "case {case}");
        assert!(got == expected, "case {case}: the words differ");
    }
    // Rows filtered by two key sets, a sparse one before a dense one and
    // the other way round (a table's end is the next one's start): those
    // in both, as on the host.
    let key_set = |values: &[u64]| -> (SharedWords, Vec<u32>) {
        let smallest = *values.iter().min().unwrap();
        let span = (values.iter().max().unwrap() - smallest + 1) as usize;
        let mut words = vec![smallest as u32, (smallest >> 32) as u32];
        words.extend(std::iter::repeat_n(0u32, span.div_ceil(32)));
        let mut positions: Vec<u32> = (0..64).filter(|b| (smallest >> b) & 1 == 1).collect();
        for &v in values {
            let bit = (v - smallest) as usize;
            words[2 + bit / 32] |= 1 << (bit % 32);
            positions.push(64 + bit as u32);
        }
        (Arc::new(Bits(words.clone(), positions)), words)
    };
    let few: Vec<u64> = (0..40).map(|i| 7 + i * 1_999).collect();
    let many: Vec<u64> = (0..40_000).filter(|v| v % 2 == 1).collect();
    let (sparse, sparse_words) = key_set(&few);
    let dense: SharedWords = Arc::new(key_set(&many).1);
    let instructions = [
        [ScanOp::LoadI64 as i64, 0, 0, 0, 0],
        [ScanOp::KeyTest as i64, 1, 0, 0, 0],
        [ScanOp::KeyTest as i64, 2, 0, 1, 0],
        [ScanOp::And as i64, 3, 1, 2, 0],
    ];
    let program = FilterProgram {
        instructions: &instructions,
        predicate: Some(3),
        outputs: &[0],
    };
    let rows = 200_000;
    let a = random_keys(rows, 80_000, 29);
    let a_device = upload_column(&device, stream, &a, &mut timer);
    let in_few = |v: u64| v >= 7 && (v - 7).is_multiple_of(1_999) && v <= 7 + 39 * 1_999;
    let expected = reference::filter(
        rows,
        1,
        |r| in_few(a[r]) && a[r] % 2 == 1 && a[r] < 40_000,
        |r| vec![(a[r], true)],
    );
    for tables in [
        vec![Arc::clone(&sparse), Arc::clone(&dense)],
        vec![Arc::clone(&dense), Arc::clone(&sparse)],
        vec![
            Arc::clone(&dense),
            Arc::new(sparse_words.clone()) as SharedWords,
        ],
    ] {
        let swapped = Arc::ptr_eq(&tables[0], &dense);
        let instructions = match swapped {
            // Key 0 is the dense set now: test the sparse one as key 1.
            true => [
                instructions[0],
                [ScanOp::KeyTest as i64, 1, 0, 1, 0],
                [ScanOp::KeyTest as i64, 2, 0, 0, 0],
                instructions[3],
            ],
            false => instructions,
        };
        let program = FilterProgram {
            instructions: &instructions,
            ..program
        };
        let chunk = ScanChunk {
            rows,
            columns: vec![ScanColumn {
                values: &a_device,
                validity: None,
                narrow: false,
                bytes: None,
            }],
            remap: RemapTable::new(tables),
        };
        let remaps = RemapUploads::default();
        let got = filter_chunk(
            &device,
            stream,
            &chunk,
            &program,
            &[],
            Some(&remaps),
            0.5,
            &mut timer,
        )
        .unwrap();
        assert_eq!(
            got,
            expected,
            "the sparse set {}",
            if swapped { "last" } else { "first" }
        );
    }
    timer.finish().unwrap();
    shared_tables_cross_the_bus_once(&device, stream);
}

/// A remap table's words as the device holds them (`on_device`), and as
/// the host does.
fn remap_words(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    on_device: &DeviceVec<u64>,
    table: &datafusion_gpu::gpu::launch::RemapTable,
    timer: &mut PhaseTimer,
) -> (Vec<u32>, Vec<u32>) {
    let mut got = Vec::new();
    download_u64(device, stream, &on_device.as_view(), &mut got, timer).unwrap();
    let got: Vec<u32> = got
        .iter()
        .flat_map(|&w| [w as u32, (w >> 32) as u32])
        .take(table.len())
        .collect();
    let expected: Vec<u32> = (0..table.len()).map(|i| table.word(i).unwrap()).collect();
    (got, expected)
}

/// `table` on the device through `uploads` (a copy kept where it fits
/// within `memory_fraction`), asserted to hold the host's words; the bytes
/// sent to the device for it.
fn sent_for_table(
    device: &GpuDevice,
    stream: &Arc<DeviceStream>,
    uploads: &datafusion_gpu::gpu::launch::RemapUploads,
    table: &datafusion_gpu::gpu::launch::RemapTable,
    memory_fraction: f64,
    what: &str,
) -> usize {
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let on_device = uploads
        .on_device(device, stream, table, memory_fraction, &mut timer)
        .unwrap();
    let (got, expected) = remap_words(device, stream, &on_device, table, &mut timer);
    let up = timer.finish().unwrap().host_to_device_bytes;
    assert!(got == expected, "{what}: the words differ");
    up
}

/// Chunks sharing two large key sets (one sent as its words, one as its set
/// bits) beside tables of their own and a small shared one: the large sets
/// cross the bus once for all the chunks of one `RemapUploads`, and every
/// chunk's table on the device holds the words it holds on the host. The
/// copies kept hold their bytes in the device's budget; where the budget
/// has no room for them, none is kept and every chunk sends the sets again,
/// its words as right.
fn shared_tables_cross_the_bus_once(device: &GpuDevice, stream: &Arc<DeviceStream>) {
    use datafusion_gpu::gpu::launch::{
        RemapTable, RemapUploads, SharedWords, TableWords, SHARED_TABLE_MIN_WORDS,
    };
    struct Shared(Vec<u32>, Option<Vec<u32>>);
    impl TableWords for Shared {
        fn words(&self) -> &[u32] {
            &self.0
        }
        fn set_bits(&self) -> Option<&[u32]> {
            self.1.as_deref()
        }
        fn shared_by_chunks(&self) -> bool {
            true
        }
    }
    // An odd length: the table after each set starts inside a 64-bit word.
    let len = SHARED_TABLE_MIN_WORDS + 5;
    let dense_words: Vec<u32> = (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let positions: Vec<u32> = random_keys(300, 32 * len as u64, 31)
        .into_iter()
        .map(|p| p as u32)
        .collect();
    let mut sparse_words = vec![0u32; len];
    for &p in &positions {
        sparse_words[p as usize / 32] |= 1 << (p % 32);
    }
    let dense: SharedWords = Arc::new(Shared(dense_words, None));
    let sparse: SharedWords = Arc::new(Shared(sparse_words, Some(positions.clone())));
    let small: SharedWords = Arc::new(Shared(vec![5, 6, 7], None));
    let shared_bytes = 4 * (len + positions.len());
    // The whole budget, then none of it.
    for memory_fraction in [1.0, 0.0] {
        let uploads = RemapUploads::default();
        for chunk in 0..4u32 {
            let own: SharedWords = Arc::new(vec![chunk + 1; 1 + chunk as usize]);
            let table = RemapTable::new(vec![
                Arc::clone(&own),
                Arc::clone(&dense),
                Arc::new(vec![chunk]) as SharedWords,
                Arc::clone(&sparse),
                Arc::clone(&small),
                own,
            ])
            .with_tables_of_its_own();
            let what = format!("chunk {chunk} at {memory_fraction}");
            let up = sent_for_table(device, stream, &uploads, &table, memory_fraction, &what);
            match (chunk, memory_fraction > 0.0) {
                (_, false) | (0, true) => {
                    assert!(up >= shared_bytes, "chunk {chunk} sent {up} bytes")
                }
                _ => assert!(
                    up < 1024,
                    "chunk {chunk} sent {up} bytes: the shared sets again"
                ),
            }
        }
        // The two large sets, 8 bytes a pair of their words; none where no
        // byte of the budget is free.
        let kept = match memory_fraction > 0.0 {
            true => 2 * 8 * len.div_ceil(2),
            false => 0,
        };
        assert_eq!(uploads.reserved_bytes(), kept, "at {memory_fraction}");
    }
    // A table of shared tables alone is kept whole, its bytes reserved
    // beside its large set's, and a second chunk sends nothing.
    let uploads = RemapUploads::default();
    let table = RemapTable::new(vec![Arc::clone(&dense), Arc::clone(&small)]);
    for chunk in 0..2 {
        let what = format!("whole table, chunk {chunk}");
        let up = sent_for_table(device, stream, &uploads, &table, 1.0, &what);
        assert!(
            chunk == 0 || up == 0,
            "whole table, chunk {chunk} sent {up} bytes"
        );
    }
    let whole = 8 * (table.len() + 1).div_ceil(2);
    assert_eq!(uploads.reserved_bytes(), 8 * len.div_ceil(2) + whole);
}

#[test]
fn the_filtering_scan_gathers_the_kept_rows_strings_on_the_device() {
    use datafusion_gpu::gpu::launch::{FilterProgram, ScanChunk, ScanColumn, ScanOp, FILTER_TILE};
    use datafusion_gpu::ops::scan_filter::filter_chunk;
    let Some(device) = device("the_filtering_scan_gathers_the_kept_rows_strings_on_the_device")
    else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    // r0 = a, r1 = 500, r2 = a < 500, r3 = the row's place (valid where
    // the string is): keep a < 500, output r3 with the strings of column 1.
    let instructions = [
        [ScanOp::LoadI64 as i64, 0, 0, 0, 0],
        [ScanOp::Const as i64, 1, 500, 0, 0],
        [ScanOp::LtI64 as i64, 2, 0, 1, 0],
        [ScanOp::RowOf as i64, 3, 1, 0, 0],
    ];
    let outputs = [3u32];
    let program = FilterProgram {
        instructions: &instructions,
        predicate: Some(2),
        outputs: &outputs,
    };
    for (rows, null_every) in [
        (0, 0),
        (1, 0),
        (FILTER_TILE + 1, 5),
        (100_003, 0),
        (100_003, 3),
    ] {
        let a = random_keys(rows, 1000, rows as u64 + 7);
        let lengths = random_keys(rows, 41, rows as u64 + 8);
        // Strings of 0 to 40 bytes, some of two-byte characters; a NULL row
        // an empty string, as the cache keeps it.
        let valid = |r: usize| null_every == 0 || r % null_every != 1;
        let text = |r: usize| -> String {
            match valid(r) {
                true => (0..lengths[r] as usize)
                    .map(|i| {
                        if (r + i).is_multiple_of(7) {
                            'é'
                        } else {
                            char::from(b'a' + ((r + i) % 26) as u8)
                        }
                    })
                    .collect(),
                false => String::new(),
            }
        };
        let strings: Vec<String> = (0..rows).map(text).collect();
        let mut offsets = vec![0u32];
        let mut bytes = Vec::new();
        for string in &strings {
            bytes.extend_from_slice(string.as_bytes());
            offsets.push(bytes.len() as u32);
        }
        let offset_words: Vec<u64> = offsets
            .chunks(2)
            .map(|pair| u64::from(pair[0]) | pair.get(1).map_or(0, |&h| u64::from(h) << 32))
            .collect();
        let byte_words: Vec<u64> = bytes
            .chunks(8)
            .map(|chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                u64::from_le_bytes(word)
            })
            .chain([0])
            .collect();
        let validity = validity_bits(rows, valid);
        let mut timer = PhaseTimer::new(Arc::clone(stream));
        let upload =
            |words: &[u64], timer: &mut PhaseTimer| upload_column(&device, stream, words, timer);
        let a_device = upload(&a, &mut timer);
        let offsets_device = upload(&offset_words, &mut timer);
        let bytes_device = upload(&byte_words, &mut timer);
        let validity_device = upload(&validity, &mut timer);
        let chunk = ScanChunk {
            rows,
            columns: vec![
                ScanColumn {
                    values: &a_device,
                    validity: None,
                    narrow: false,
                    bytes: None,
                },
                ScanColumn {
                    values: &offsets_device,
                    validity: (null_every != 0).then_some(&validity_device),
                    narrow: true,
                    bytes: Some((&bytes_device, bytes.len())),
                },
            ],
            remap: Default::default(),
        };
        let got = filter_chunk(
            &device,
            stream,
            &chunk,
            &program,
            &[Some(1)],
            None,
            0.5,
            &mut timer,
        )
        .unwrap();
        timer.finish().unwrap();
        let kept: Vec<usize> = (0..rows).filter(|&r| a[r] < 500).collect();
        assert_eq!(got.rows, kept.len(), "{rows} rows");
        if kept.is_empty() {
            continue;
        }
        // The rows' places come back as before (0 where NULL, as every
        // NULL register), the strings gathered.
        let places: Vec<u64> = got.words_of(0).unwrap().words().collect();
        assert_eq!(
            places,
            kept.iter()
                .map(|&r| if valid(r) { r as u64 } else { 0 })
                .collect::<Vec<_>>(),
            "{rows} rows"
        );
        let kept_valid: Vec<u8> = kept.iter().map(|&r| u8::from(valid(r))).collect();
        match got.valid_of(0) {
            Some(valid) => assert_eq!(valid, kept_valid.as_slice(), "{rows} rows"),
            None => assert!(kept_valid.iter().all(|&v| v == 1), "{rows} rows"),
        }
        let gathered = got.outputs[0].strings.as_ref().unwrap().as_ref().unwrap();
        let mut expected_offsets = vec![0i32];
        let mut expected_bytes = Vec::new();
        for &r in &kept {
            expected_bytes.extend_from_slice(strings[r].as_bytes());
            expected_offsets.push(expected_bytes.len() as i32);
        }
        assert_eq!(gathered.offsets.to_vec(), expected_offsets, "{rows} rows");
        assert_eq!(
            gathered.bytes.as_slice(),
            expected_bytes.as_slice(),
            "{rows} rows"
        );
    }
}

#[test]
fn one_word_is_read_back_and_any_other_length_is_an_error() {
    let Some(device) = device("one_word_is_read_back_and_any_other_length_is_an_error") else {
        return;
    };
    device.bind_to_thread().unwrap();
    let stream = device.stream().unwrap();
    let stream = stream.stream();
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    let words: Vec<u64> = vec![3, u64::MAX, 1 << 40, 0];
    let on_device = upload_u64(&device, stream, &words, &mut timer).unwrap();
    for (i, &word) in words.iter().enumerate() {
        let read = download_word(
            &device,
            stream,
            &on_device.slice(i..i + 1),
            "a test word",
            &mut timer,
        );
        assert_eq!(read.unwrap(), word, "word {i}");
    }
    assert_eq!(
        timer.finish().unwrap().device_to_host_bytes,
        8 * words.len()
    );
    let mut timer = PhaseTimer::new(Arc::clone(stream));
    for range in [0..0, 0..2, 0..4] {
        let err = download_word(
            &device,
            stream,
            &on_device.slice(range.clone()),
            "a test word",
            &mut timer,
        )
        .expect_err("only one word is read back");
        assert!(
            err.to_string().contains(&format!(
                "a test word: one word to read back, {} on the device",
                range.len()
            )),
            "{err}"
        );
    }
    assert_eq!(timer.finish().unwrap().device_to_host_bytes, 0);
}
