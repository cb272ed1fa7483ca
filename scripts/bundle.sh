#!/usr/bin/env bash
# Builds the release GPU test binary (with the conformance runner), the
# benchmark and the examples, strips and xz-compresses them, packs
# DataFusion's sqllogictest files, and writes a run script, so that the GPU
# tests and benchmarks run on a GPU machine that has no Rust toolchain (it
# needs only the NVIDIA driver, glibc >= 2.35, tar and xz; `floor` also
# needs Nsight Compute's ncu and python3).
#
#   scripts/bundle.sh [OUT_DIR]          (default: bundle/)
#
# On the GPU machine:
#   cd OUT_DIR && ./run.sh tests         GPU tests and conformance, a missing GPU is a failure
#   ./run.sh conformance                 every sqllogictest file, with and without the rule
#   ./run.sh fuzz                        the differential fuzzer (FUZZ_CASES, e.g. 0..10000)
#   ./run.sh sanitize                    the device and SQL join tests under compute-sanitizer
#   ./run.sh bench                       the end-to-end benchmarks (BENCH_ARGS; --group-by, --sort-merge, --shapes)
#   ./run.sh seeds                       the seeds' workloads as criterion benchmarks
#                                        (SEEDS, e.g. "join" or "rt1,b10": the families to run)
#   ./run.sh tpch                        the TPC-H-derived example (TPCH_ARGS)
#   ./run.sh devices                     the same, also on the first GPU alone (TPCH_ARGS)
#   ./run.sh duckdb                      DuckDB on the example's Parquet files (DUCKDB_ARGS)
#   ./run.sh floor                       seed 002's PK-FK joins' kernels against their
#                                        bytes-moved floor (ncu, python3)
#   ./run.sh quickstart                  the example
#   ./run.sh ballista                    the Ballista crate's test (GPU required) and its
#                                        tpch_cluster example (BALLISTA_ARGS)
# Logs go to $OUT (if set) or ./logs. Each binary is its own file, so a
# machine that takes a limited upload can be sent only the ones it runs
# (plus run.sh and test_files.tar.xz).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/bundle}"
mkdir -p "$out"
cd "$root"

executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
        print(msg["target"]["name"], msg["executable"])
'
}

{
  cargo test --release --test gpu --no-run --message-format=json
  cargo bench --bench gpu_join --no-run --message-format=json
  cargo build --release --example quickstart --example tpch --message-format=json
  cargo test --release -p datafusion-gpu-ballista --test cluster --no-run --message-format=json
  cargo build --release -p datafusion-gpu-ballista --example tpch_cluster --message-format=json
} | executables | sort -u > "$out/.artifacts"

while read -r name path; do
  strip -o "$out/$name" "$path"
  xz -T0 -9 -f "$out/$name"
  echo "bundled $name: $(du -h "$out/$name.xz" | cut -f1)"
done < "$out/.artifacts"
rm -f "$out/.artifacts"

# DataFusion's own .slt files and TPC-H-derived queries, from the package
# the tests depend on.
test_files="$(cargo metadata --format-version 1 | python3 -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "datafusion-sqllogictest":
        print(os.path.join(os.path.dirname(p["manifest_path"]), "test_files"))
')"
tar -C "$(dirname "$test_files")" -cJf "$out/test_files.tar.xz" test_files data
echo "bundled test_files: $(du -h "$out/test_files.tar.xz" | cut -f1)"
cp scripts/ncu_floor.py scripts/duckdb_tpch.py "$out/"

cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled datafusion-gpu binaries on a GPU machine.
set -uo pipefail
cd "$(dirname "$0")"
logs="${OUT:-$PWD/logs}"
mkdir -p "$logs"
for f in *.xz; do
  [[ $f == *.tar.xz ]] && continue
  [[ -e "${f%.xz}" ]] || xz -dk "$f"
done
[[ -d test_files || ! -e test_files.tar.xz ]] || tar -xJf test_files.tar.xz
export DATAFUSION_SLT_TEST_FILES="$PWD/test_files"
chmod +x gpu gpu_join quickstart tpch cluster tpch_cluster 2>/dev/null
status=0
for what in "$@"; do
  case "$what" in
    tests)
      # The concurrency test checks the device budget returns to zero, the
      # fault test breaks the device's context, the column cache tests count
      # what stayed cached between queries, and the out-of-core aggregation
      # test what a small share of the device made, so they run again after
      # the others, alone in their process, one after the other.
      DATAFUSION_GPU_CONFORMANCE_LOG="$logs/conformance.log" DATAFUSION_GPU_REQUIRE_GPU=1 \
        ./gpu --skip concurrency:: --skip device_fault:: 2>&1 | tee "$logs/tests.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      # (The cache tests first: after the fault test the device is gone.)
      DATAFUSION_GPU_TEST_ALONE=1 DATAFUSION_GPU_REQUIRE_GPU=1 \
        ./gpu scan_aggregate::the_column_cache scan_aggregate::a_small_cache \
        cached_input::aggregations_over_a_whole_table aggregate::inputs_larger_than_the_device_budget \
        --test-threads=1 2>&1 \
        | tee "$logs/alone-cache.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      DATAFUSION_GPU_TEST_ALONE=1 DATAFUSION_GPU_REQUIRE_GPU=1 \
        ./gpu concurrency:: device_fault:: --test-threads=1 2>&1 | tee "$logs/alone.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    fuzz)
      # FUZZ_CASES (default 0..10000) case seeds, FUZZ_PARALLEL at once.
      DATAFUSION_GPU_FUZZ_CASES="${FUZZ_CASES:-0..10000}" DATAFUSION_GPU_FUZZ_PARALLEL="${FUZZ_PARALLEL:-8}" \
        DATAFUSION_GPU_REQUIRE_GPU=1 ./gpu fuzz:: --nocapture 2>&1 | tee "$logs/fuzz.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    conformance)
      DATAFUSION_GPU_CONFORMANCE_LOG="$logs/conformance.log" DATAFUSION_GPU_REQUIRE_GPU=1 \
        ./gpu conformance:: 2>&1 | tee "$logs/conformance-tests.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    tpch)
      # TPCH_ARGS, e.g. "--sf 1 --runs 3", is passed through.
      ./tpch ${TPCH_ARGS:-} --json "$logs/tpch.json" --chart "$logs/tpch.svg" 2>&1 | tee "$logs/tpch.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    devices)
      # Every GPU against the first alone, in one run (--one-device): one
      # DataFusion column, both GPU sessions' answers checked against it.
      ./tpch ${TPCH_ARGS:-} --one-device --json "$logs/tpch-devices.json" 2>&1 \
        | tee "$logs/tpch-devices.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    sanitize)
      # memcheck: the device tests and two SQL join tests; racecheck: the
      # device tests, whose kernels share memory, but for the sort and merge
      # test, which racecheck takes many minutes over (its kernels' shared
      # memory is checked by the radix partitioning test, which runs the same
      # scatter, and the merge-path test). Each test runs in a process of its
      # own under the tool, SANITIZE_PARALLEL (default 12) at once, with
      # smaller inputs (DATAFUSION_GPU_SANITIZE) and a limit of
      # SANITIZE_LIMIT seconds (default 480) each; one log per tool.
      work="$(mktemp -d)"
      for tool in memcheck racecheck; do
        filters=(ops:: aggregate::device_)
        [[ $tool == memcheck ]] && filters+=(join_sql::small_chunks_ranges_and_batches join_sql::empty_sides_one_row_all_null_and_no_match)
        skip=()
        [[ $tool == racecheck ]] && skip=(--skip ops::radix_sort_and_merge_path_match_their_references --skip aggregate::device_table_folds_match_the_reference)
        ./gpu "${filters[@]}" "${skip[@]}" --list 2>/dev/null | sed -n "s/: test\$//p" \
          | sed "s/^/$tool /" >> "$work/cases"
      done
      export work
      xargs -P "${SANITIZE_PARALLEL:-12}" -L 1 sh -c '
        tool=$0; test=$1; log="$work/$tool-$(echo "$test" | tr ":" "_").log"
        start=$(date +%s)
        DATAFUSION_GPU_SANITIZE=1 DATAFUSION_GPU_REQUIRE_GPU=1 timeout "${SANITIZE_LIMIT:-480}" \
          compute-sanitizer --tool "$tool" --error-exitcode 3 ./gpu --exact "$test" --test-threads=1 \
          > "$log" 2>&1
        echo "$? $(( $(date +%s) - start ))s $test" > "$log.rc"' < "$work/cases"
      for tool in memcheck racecheck; do
        log="$logs/sanitize-$tool.log"; : > "$log"; failed=0; checked=0
        for rc in "$work/$tool"-*.log.rc; do
          read -r code took test < "$rc"
          checked=$((checked + 1))
          echo "== $test: exit $code in $took" >> "$log"
          grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|panicked|Error" "${rc%.rc}" >> "$log"
          [[ $code -eq 0 ]] || { failed=$((failed + 1)); tail -40 "${rc%.rc}" >> "$log"; }
        done
        echo "compute-sanitizer --tool $tool: $checked tests, $failed failed or timed out (124)"
        grep "^== " "$log" | sort -t" " -k6 -rn | head -5
        [[ $failed -eq 0 ]] || status=1
      done
      rm -rf "$work" ;;
    bench)
      # BENCH_ARGS, e.g. "--log2-rows 24 --runs 5", is passed through.
      ./gpu_join --bench ${BENCH_ARGS:-} 2>&1 | tee "$logs/bench.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    seeds)
      # SEEDS: workload families to run (default: all); criterion's files go to $logs/criterion.
      CRITERION_HOME="$logs/criterion" ./gpu_join --bench --seeds ${SEEDS:-} 2>&1 | tee "$logs/seeds.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    floor)
      # Each kernel's time against its bytes-moved floor (ncu_floor.py): one
      # checked run of each of FLOOR_SEEDS (default b2,b3: seed 002's narrow
      # and wide PK-FK joins) at |R| = 2^FLOOR_LOG2 (default 27), over pinned
      # tables, under Nsight Compute's ncu (the CUDA toolkit's, not the
      # driver's); each table also goes to $logs/floor-SEED.txt.
      metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
      seeds="${FLOOR_SEEDS:-b2,b3}"
      for seed in ${seeds//,/ }; do
        ncu --clock-control none --metrics "$metrics" --print-summary per-kernel \
          ./gpu_join --bench --seeds "$seed" --log2-rows "${FLOOR_LOG2:-27}" --check-only --pinned \
          > "$logs/ncu-$seed.txt" 2>&1 || status=1
        python3 ncu_floor.py "$logs/ncu-$seed.txt" | tee "$logs/floor-$seed.txt"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      done ;;
    duckdb)
      # DuckDB over the Parquet files `tpch` wrote (run it first), the same
      # queries; DUCKDB_ARGS, e.g. "--data tpch-data/SF10 --runs 3". Needs
      # the duckdb Python package.
      python3 duckdb_tpch.py ${DUCKDB_ARGS:-} --json "$logs/duckdb.json" 2>&1 | tee "$logs/duckdb.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    ballista)
      # A scheduler, a GPU and a CPU executor in one process: the test (SF
      # 0.01, GPU path forced, fails without GPU nodes), then the example.
      DATAFUSION_GPU_REQUIRE_GPU=1 ./cluster --nocapture 2>&1 | tee "$logs/ballista-test.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      ./tpch_cluster ${BALLISTA_ARGS:-} 2>&1 | tee "$logs/ballista.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    quickstart)
      ./quickstart 2>&1 | tee "$logs/quickstart.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      CUDA_VISIBLE_DEVICES= ./quickstart 100000 2>&1 | tee "$logs/quickstart-no-gpu.log"
      [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1 ;;
    *) echo "unknown: $what (tests | conformance | fuzz | sanitize | bench | seeds | floor | tpch | devices | duckdb | ballista | quickstart)"; status=2 ;;
  esac
done
exit $status
RUN
chmod +x "$out/run.sh"
du -ch "$out"/*.xz | tail -1
