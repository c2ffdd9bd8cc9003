"""The real-GPU check: otel-gpu's every exported value against NVML itself, on one command.

The command line of :mod:`benchmarks.device_check` (``python -m benchmarks.device_check``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.device_check.reader import reader_main
from benchmarks.device_check.report import write
from benchmarks.device_check.results import Options
from benchmarks.device_check.run import run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_reader"]:
        sub = argparse.ArgumentParser()
        sub.add_argument("--simulate")
        return reader_main(sub.parse_args(argv[1:]).simulate)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="directory for device-check.json and device-check.md")
    parser.add_argument("--simulate", metavar="PROFILE|FILE",
                        help="run against the simulator (the check's pynvml reads it too)")
    parser.add_argument("--reference-scenario", metavar="PROFILE|FILE",
                        help="simulation only: what the check's own pynvml reads (default: "
                             "--simulate); a different one must fail the check")
    parser.add_argument("--interval", type=float, default=1.0, help="the collector's interval")
    parser.add_argument("--load-seconds", type=float, default=150.0,
                        help="most seconds each load process runs (stopped when done)")
    parser.add_argument("--load-gib", type=float, default=4.0, help="GiB each load holds")
    parser.add_argument("--latency-calls", type=int, default=50)
    parser.add_argument("--quiet-seconds", type=float, default=6.0,
                        help="cost: the window of samples with nobody scraping")
    parser.add_argument("--scrape-seconds", type=float, default=2.0,
                        help="cost: the window of back-to-back gzip scrapes")
    parser.add_argument("--systems",
                        default="otel-gpu,handwritten,handwritten-same,nvitop-exporter",
                        help="cost: which systems, comma-separated")
    parser.add_argument("--skip", default="", help="comma-separated: load, pods, cost, latency")
    args = parser.parse_args(argv)
    if args.reference_scenario and not args.simulate:
        parser.error("--reference-scenario needs --simulate")
    if not 0.1 <= args.interval <= 10 or not 1 <= args.latency_calls <= 10_000:
        parser.error("--interval must be 0.1 to 10 s and --latency-calls 1 to 10000")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = skip - {"load", "pods", "cost", "latency"}
    if unknown:
        parser.error(f"--skip: unknown {', '.join(sorted(unknown))}")
    opts = Options(args.out, args.simulate, args.reference_scenario, args.interval,
                   args.load_seconds, args.load_gib, args.latency_calls, args.quiet_seconds,
                   args.scrape_seconds, [s for s in args.systems.split(",") if s], skip)
    result = run(opts, argv)
    js, md = write(result, args.out)
    print(f"device-check: {'PASS' if result.passed else 'FAIL'}: "
          f"{len(result.rows) - len(result.failed)} of {len(result.rows)} comparisons passed, "
          f"{len(result.errors)} error(s), "
          f"{sum(sum(f.values()) for f in result.not_compared.values())} series not compared; "
          f"{result.seconds:.0f} s; wrote {js} and {md}")
    for row in result.failed[:40]:
        print(f"  FAIL {row.phase} {row.family} gpu {row.device} {row.what}: exported "
              f"{row.exported}, reference {row.reference} ({row.rule}) {row.note}")
    return 0 if result.passed else 1

