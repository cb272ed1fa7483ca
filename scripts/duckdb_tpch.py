#!/usr/bin/env python3
"""DuckDB over the TPC-H-derived example's Parquet files.

Runs the same 22 queries (DataFusion's TPC-H-derived benchmark SQL, as the
`tpch` example reads it) on the same files the example writes, timed the same
way (a first, cold run, then the median of --runs warm runs), so that
BENCHMARKS.md shows DataFusion, the GPU path and DuckDB from one host.

    cargo run --release --example tpch -- --sf 10      # writes tpch-data/SF10 once
    python3 scripts/duckdb_tpch.py --data tpch-data/SF10 [--runs 3] [--queries 1,3]
                                   [--load] [--threads N] [--json FILE]

By default DuckDB reads the Parquet files through views, as the example's
listing tables do; --load copies them into DuckDB's own tables first (the
load is timed apart). Needs the `duckdb` Python package. The query text comes
from the `datafusion-sqllogictest` package's test_files folder:
$DATAFUSION_SLT_TEST_FILES, else the cargo registry. Numbers are derived from
TPC-H; they are not TPC-H results.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time

TABLES = ["nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
PACKAGE = "datafusion-sqllogictest-55.2.0"


def test_files():
    folder = os.environ.get("DATAFUSION_SLT_TEST_FILES")
    if folder:
        if not os.path.isdir(folder):
            sys.exit(f"DATAFUSION_SLT_TEST_FILES={folder} is not a folder")
        return folder
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    found = glob.glob(os.path.join(cargo_home, "registry", "src", "*", PACKAGE, "test_files"))
    if not found:
        sys.exit(f"DATAFUSION_SLT_TEST_FILES is not set and {PACKAGE} is not in the cargo registry")
    return found[0]


def query_sql(folder, n):
    """The first `query` record of q<n>'s answer file, as the example reads it."""
    path = os.path.join(folder, "tpch", "answers", f"q{n}.slt.part")
    with open(path) as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("query ")), None)
    if start is None:
        sys.exit(f"{path}: no query record")
    sql = []
    for line in lines[start + 1:]:
        if line.strip() == "----":
            break
        sql.append(line)
    # As in the example: the packaged q8 casts its sums to decimal(12,2),
    # which overflows above SF 0.1.
    return "\n".join(sql).replace("decimal(12,2)", "decimal(38,2)")


def query_numbers(text):
    numbers = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            n = 0
        if not 1 <= n <= 22:
            raise argparse.ArgumentTypeError(f"{part} is not a query number 1 to 22")
        numbers.append(n)
    return numbers


def positive(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True,
                        help="the example's folder of one scale factor, e.g. tpch-data/SF10")
    parser.add_argument("--runs", type=positive, default=3, help="warm runs per query (median)")
    parser.add_argument("--queries", type=query_numbers, default=list(range(1, 23)),
                        help="queries to run, e.g. 1,3,9")
    parser.add_argument("--load", action="store_true",
                        help="copy the files into DuckDB tables first instead of reading them")
    parser.add_argument("--threads", type=positive, help="DuckDB's threads (default: its own)")
    parser.add_argument("--json", help="writes the report as JSON to this file")
    args = parser.parse_args()

    try:
        import duckdb
    except ImportError:
        sys.exit("the duckdb Python package is not installed (pip install duckdb)")

    missing = [t for t in TABLES if not glob.glob(os.path.join(args.data, t, "*.parquet"))]
    if missing:
        sys.exit(f"{args.data}: no Parquet files for {', '.join(missing)} "
                 "(write them with the tpch example's --data)")
    sql = {n: query_sql(test_files(), n) for n in args.queries}

    con = duckdb.connect()
    if args.threads:
        con.sql(f"SET threads = {args.threads}")
    threads = con.sql("SELECT current_setting('threads')").fetchone()[0]
    started = time.time()
    for table in TABLES:
        files = os.path.join(args.data, table, "*.parquet").replace("'", "''")
        kind = "TABLE" if args.load else "VIEW"
        con.sql(f"CREATE {kind} {table} AS SELECT * FROM read_parquet('{files}')")
    load_s = time.time() - started
    source = "DuckDB tables" if args.load else "Parquet files through views"
    print(f"DuckDB {duckdb.__version__}, {threads} threads, {source} under {args.data}"
          + (f" (loaded in {load_s:.1f} s)" if args.load else ""))
    print(f"{'query':>5} {'cold ms':>10} {'warm ms':>10} {'rows':>8}")

    report = []
    for n in args.queries:
        times = []
        rows = None
        for _ in range(args.runs + 1):
            start = time.perf_counter()
            result = con.sql(sql[n]).fetchall()
            times.append(time.perf_counter() - start)
            rows = len(result)
        cold, warm = times[0] * 1e3, statistics.median(times[1:]) * 1e3
        report.append({"query": n, "cold_ms": round(cold, 3), "warm_ms": round(warm, 3), "rows": rows})
        print(f"{'q' + str(n):>5} {cold:>10.1f} {warm:>10.1f} {rows:>8}", flush=True)
    total_cold = sum(r["cold_ms"] for r in report)
    total_warm = sum(r["warm_ms"] for r in report)
    print(f"{'total':>5} {total_cold:>10.1f} {total_warm:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": "duckdb", "version": duckdb.__version__, "threads": threads,
                       "data": args.data, "loaded": args.load, "runs": args.runs,
                       "queries": report}, f)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
