#!/usr/bin/env python3
"""Soak: the real collector scraped without pause for a while, and what it costs over time.

Starts ``otel-gpu --simulate PROFILE`` with a short interval, scrapes
``/metrics`` continuously from a few client threads for ``--duration``
seconds, and prints the collector's resident memory (VmRSS) and thread count
(from /proc/PID/status) at start and end, the scrape count, errors, and
latency percentiles. Exits 1 if a scrape failed or the collector died.

    python scripts/soak.py [--duration 60] [--clients 4] [--interval 0.5] [--profile h100x8]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SERVING = re.compile(r"serving metrics on https?://[^:]+:(\d+)/metrics")


def proc_status(pid: int) -> tuple[float, int]:
    """(VmRSS in MiB, thread count) of a running process."""
    rss, threads = float("nan"), -1
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Collector:
    """The collector process; its output is read on a thread so that it never blocks."""

    def __init__(self, profile: str, interval: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", "--simulate", profile, "--listen",
             "127.0.0.1:0", "--interval", interval, "--log-level", "info"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        self.port: int | None = None
        self.lines = 0
        self.problems = 0
        self.first_problems: list[str] = []
        self.tail: deque[str] = deque(maxlen=20)
        self._started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines += 1
            self.tail.append(line.rstrip("\n"))
            if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                self.problems += 1
                if len(self.first_problems) < 5:
                    self.first_problems.append(line.rstrip("\n"))
            match = _SERVING.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._started.set()
        self._started.set()

    def wait_serving(self, timeout: float) -> int | None:
        self._started.wait(timeout)
        return self.port

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--clients", type=int, default=4, help="scraping threads (default 4)")
    parser.add_argument("--interval", default="0.5", help="sampling interval (default 0.5)")
    parser.add_argument("--profile", default="h100x8")
    args = parser.parse_args()

    collector = Collector(args.profile, args.interval)
    try:
        port = collector.wait_serving(30)
        if port is None:
            print("the collector did not start:\n" + "\n".join(collector.tail), file=sys.stderr)
            return 1
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while b"otel_gpu_samples_total" not in urllib.request.urlopen(url, timeout=10).read():
            if time.monotonic() > deadline:
                print("no sample within 30 s", file=sys.stderr)
                return 1
            time.sleep(0.05)  # polling step
        pid = collector.proc.pid
        rss_start, threads_start = proc_status(pid)

        latencies: list[list[float]] = [[] for _ in range(args.clients)]
        errors = [0] * args.clients
        end = time.monotonic() + args.duration

        def client(i: int) -> None:
            while time.monotonic() < end:
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        resp.read()
                        ok = resp.status == 200
                except OSError:
                    ok = False
                if ok:
                    latencies[i].append(time.perf_counter() - started)
                else:
                    errors[i] += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        alive = collector.proc.poll() is None
        rss_end, threads_end = proc_status(pid) if alive else (float("nan"), -1)
        body = urllib.request.urlopen(url, timeout=10).read().decode() if alive else ""
        samples = re.search(r"^otel_gpu_samples_total (\S+)$", body, re.M)
    finally:
        code = collector.stop()

    done = sorted(x for per_client in latencies for x in per_client)
    failed = sum(errors)
    print(f"soak: profile {args.profile}, interval {args.interval} s, {args.clients} clients, "
          f"{args.duration:g} s")
    p50, p99 = percentile(done, 0.5) * 1000, percentile(done, 0.99) * 1000
    worst = (done[-1] if done else 0.0) * 1000
    print(f"scrapes: {len(done)} ok, {failed} errors ({len(done) / args.duration:.0f}/s); "
          f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms")
    print(f"samples taken: {samples.group(1) if samples else 'unknown'}")
    print(f"RSS: {rss_start:.1f} MiB at start, {rss_end:.1f} MiB at end")
    print(f"threads: {threads_start} at start, {threads_end} at end")
    print(f"collector: {'alive' if alive else 'DIED'} until the end; exit status {code} "
          f"after SIGTERM; {collector.lines} log lines, {collector.problems} warnings or errors")
    for line in collector.first_problems:
        print(f"  {line}")
    return 0 if alive and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
