#!/usr/bin/env python3
"""Each kernel's time against its bytes-moved floor, from an ncu profile.

The performance method (README, BENCHMARKS.md) compares each kernel's time
with the bytes it moves over the device memory's measured copy bandwidth.
This script reads both from the output of one profiled run:

    ncu --clock-control none \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        --print-summary per-kernel \\
        ./gpu_join --bench --seeds b2 --log2-rows 27 --check-only --pinned > b2.txt
    scripts/ncu_floor.py b2.txt

Per kernel (summed over its invocations): its time, the DRAM bytes it read
and wrote, the floor (those bytes at the bandwidth) and time over floor; then
the sums. The bandwidth is the seeds bench's own line, "device memory: N GB/s
(a device-to-device copy, bytes read and written)"; `--bandwidth GBPS` gives
one for output without it.

The bytes are what the DRAM moved, as counted by the hardware. Where a kernel
moves more than its job needs (a partial sector, a row read twice past L2),
its floor here is that much higher: BENCHMARKS.md sets these counts beside the
bytes each kernel must move, worked out from its inputs and outputs.
"""

import argparse
import re
import sys

TIME_SCALE_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3,
                 "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
BYTE_SCALE_GB = {"byte": 1e-9, "B": 1e-9, "Kbyte": 1e-6, "KB": 1e-6,
                 "Mbyte": 1e-3, "MB": 1e-3, "Gbyte": 1.0, "GB": 1.0,
                 "Tbyte": 1e3, "TB": 1e3}

KERNEL_LINE = re.compile(r"\s+(\w+) \(.*Invocations ([\d,]+)")
METRIC_LINE = re.compile(
    r"\s+(gpu__time_duration\.sum|dram__bytes_read\.sum|dram__bytes_write\.sum)"
    r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")
BANDWIDTH_LINE = re.compile(r"device memory: ([\d.]+) GB/s")


def read_profile(path):
    """Per kernel: [milliseconds, GB]; and the bandwidth line's GB/s, if any."""
    kernels = {}
    bandwidth = None
    kernel = invocations = None
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            found = BANDWIDTH_LINE.search(line)
            if found:
                bandwidth = float(found.group(1))
                continue
            found = KERNEL_LINE.match(line)
            if found:
                kernel, invocations = found.group(1), int(found.group(2).replace(",", ""))
                kernels.setdefault(kernel, [0.0, 0.0])
                continue
            found = METRIC_LINE.match(line)
            if not (found and kernel):
                continue
            name, unit, _minimum, _maximum, average = found.groups()
            scales = TIME_SCALE_MS if name.startswith("gpu__time") else BYTE_SCALE_GB
            try:
                total = float(average.replace(",", "")) * invocations * scales[unit]
            except (KeyError, ValueError):
                raise ValueError(f"{path}: cannot read {name} of {kernel}: {average} {unit}")
            kernels[kernel][0 if scales is TIME_SCALE_MS else 1] += total
    return kernels, bandwidth


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", help="ncu --print-summary per-kernel output")
    parser.add_argument("--bandwidth", type=float, help="GB/s, where the output has none")
    args = parser.parse_args()
    status = 0
    for path in args.profiles:
        try:
            kernels, bandwidth = read_profile(path)
        except (OSError, ValueError) as error:
            print(error, file=sys.stderr)
            status = 1
            continue
        bandwidth = args.bandwidth or bandwidth
        if not kernels or not bandwidth:
            print(f"{path}: no per-kernel summary or no bandwidth (--bandwidth)", file=sys.stderr)
            status = 1
            continue
        print(f"{path}: device memory {bandwidth:.0f} GB/s")
        print(f"  {'kernel':<24} {'time ms':>9} {'DRAM GB':>9} {'floor ms':>9} {'/ floor':>8}")
        for name, (ms, gb) in sorted(kernels.items(), key=lambda item: -item[1][0]):
            floor = gb / bandwidth * 1e3
            ratio = f"{ms / floor:.2f}x" if floor > 0 else "-"
            print(f"  {name:<24} {ms:>9.2f} {gb:>9.2f} {floor:>9.2f} {ratio:>8}")
        ms = sum(time for time, _ in kernels.values())
        gb = sum(moved for _, moved in kernels.values())
        floor = gb / bandwidth * 1e3
        ratio = f"{ms / floor:.2f}x" if floor > 0 else "-"
        print(f"  {'all kernels':<24} {ms:>9.2f} {gb:>9.2f} {floor:>9.2f} {ratio:>8}")
    return status


if __name__ == "__main__":
    sys.exit(main())
