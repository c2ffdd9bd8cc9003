#!/usr/bin/env python3
"""Benchmark: what a sample, a render and a scrape cost, in simulation.

Starts the real collector process (``--simulate PROFILE``), lets it sample,
then scrapes it from several threads and prints latency percentiles, the
sample duration the collector reports about itself, and its resident memory.
Timing goals live here, not in the tests.

    python scripts/bench.py [--profile h100x8] [--scrapers 20] [--scrapes 500]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _value(body: str, name: str) -> float:
    match = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M)
    return float(match.group(1)) if match else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100x8")
    parser.add_argument("--interval", default="1")
    parser.add_argument("--scrapers", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=500)
    args = parser.parse_args()

    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_gpu", "--simulate", args.profile, "--listen",
         "127.0.0.1:0", "--interval", args.interval, "--log-level", "info"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while port is None and time.monotonic() < deadline:
            match = re.search(r"serving metrics on https?://[^:]+:(\d+)/", proc.stdout.readline())
            port = int(match.group(1)) if match else None
        if port is None:
            print("the collector did not start", file=sys.stderr)
            return 1
        url = f"http://127.0.0.1:{port}/metrics"
        while "otel_gpu_samples_total" not in urllib.request.urlopen(url).read().decode():
            time.sleep(0.05)

        def scrape(_: int) -> float:
            started = time.perf_counter()
            with urllib.request.urlopen(url) as resp:
                resp.read()
            return time.perf_counter() - started

        started = time.perf_counter()
        with ThreadPoolExecutor(args.scrapers) as pool:
            latencies = sorted(pool.map(scrape, range(args.scrapes)))
        wall = time.perf_counter() - started
        body = urllib.request.urlopen(url).read().decode()
        pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
        print(f"profile {args.profile}: {len(body)} bytes, "
              f"{sum(1 for ln in body.splitlines() if ln and not ln.startswith('#'))} series")
        print(f"scrapes: {args.scrapes} from {args.scrapers} threads in {wall:.2f} s "
              f"({args.scrapes / wall:.0f}/s); latency ms p50 {pct(0.5):.1f} "
              f"p90 {pct(0.9):.1f} p99 {pct(0.99):.1f} mean {statistics.mean(latencies)*1000:.1f}")
        print(f"sample duration {_value(body, 'otel_gpu_sample_duration_seconds') * 1000:.1f} ms; "
              f"NVML requests so far {_value(body, 'otel_gpu_nvml_requests_total'):.0f} "
              f"over {_value(body, 'otel_gpu_samples_total'):.0f} samples")
        print(f"resident memory {_rss_mib(proc.pid):.1f} MiB")
        return 0
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
