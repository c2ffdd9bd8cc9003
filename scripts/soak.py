#!/usr/bin/env python3
"""Soak: the real collector scraped without pause for a while, and what it costs over time.

Starts ``otel-gpu --simulate PROFILE`` with a short interval, scrapes
``/metrics`` continuously from a few client threads for ``--duration``
seconds, and prints the collector's resident memory (VmRSS) and thread count
(from /proc/PID/status) at start and end, the scrape count, errors, and
latency percentiles. Exits 1 if a scrape failed or the collector died.

    python scripts/soak.py [--duration 60] [--clients 4] [--interval 0.5] [--profile h100x8]

With ``--churn N``, a fake kubelet (a real gRPC server on a unix socket)
replaces its N time-sliced pods with N new ones every ``--churn-every``
seconds, as a node running short jobs does, and the RSS is also taken after
the first tenth of the run (the warm-up) to report the growth after it.

    python scripts/soak.py --duration 600 --churn 200
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
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

    def __init__(self, profile: str, interval: str, extra: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", "--simulate", profile, "--listen",
             "127.0.0.1:0", "--interval", interval, "--log-level", "info", *extra],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        self.port: int | None = None
        self.lines = 0
        self.rebuilds = 0
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
            if "rebuilt the OpenTelemetry pipeline" in line:
                self.rebuilds += 1
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


class Churn:
    """A fake kubelet whose pods are all replaced by new ones every ``every`` seconds."""

    def __init__(self, profile: str, pods: int, every: float, directory: str) -> None:
        sys.path.insert(0, str(ROOT))
        from otel_gpu.sim.scenario import load_scenario
        from testkit.kubelet import FakeKubelet

        self.uuids = [gpu.uuid for gpu in load_scenario(profile).devices]
        self.pods, self.every, self.generation = pods, every, 0
        self.kubelet = FakeKubelet(f"{directory}/kubelet.sock")
        self._replace()
        self.kubelet.start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def socket(self) -> str:
        return str(self.kubelet.socket_path)

    def _replace(self) -> None:
        from testkit.kubelet import container, devices, pod

        self.generation += 1
        n = len(self.uuids)
        self.kubelet.set_pods([
            pod(f"job-{self.generation}-{i}", container("main", devices(
                "nvidia.com/gpu", f"{self.uuids[i % n]}::{i // n}")), namespace="batch")
            for i in range(self.pods)])

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._replace()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.kubelet.close()


def _body_or_empty(url: str) -> bytes:
    """The body, or nothing while the collector answers 503 before its first sample."""
    try:
        return urllib.request.urlopen(url, timeout=10).read()
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return b""
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument("--clients", type=int, default=4, help="scraping threads (default 4)")
    parser.add_argument("--interval", default="0.5", help="sampling interval (default 0.5)")
    parser.add_argument("--profile", default="h100x8")
    parser.add_argument("--churn", type=int, default=0, metavar="PODS",
                        help="time-sliced pods on a fake kubelet, all replaced every "
                             "--churn-every seconds (default 0: no kubelet)")
    parser.add_argument("--churn-every", type=float, default=2.0)
    args = parser.parse_args()

    workdir = tempfile.TemporaryDirectory(prefix="otel-gpu-soak-")
    churn = Churn(args.profile, args.churn, args.churn_every, workdir.name) \
        if args.churn else None
    extra = ("--kubelet-socket", churn.socket, "--kubelet-interval", "1s") if churn else (
        "--pod-attribution", "false")
    collector = Collector(args.profile, args.interval, extra)
    rss_warm = float("nan")
    try:
        port = collector.wait_serving(30)
        if port is None:
            print("the collector did not start:\n" + "\n".join(collector.tail), file=sys.stderr)
            return 1
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while b"otel_gpu_samples_total" not in _body_or_empty(url):
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
        if churn is not None:
            churn.start()
        for t in threads:
            t.start()
        # the warm-up: the SDK's attribute sets and the caches reach their working size
        warm = time.monotonic() + max(args.duration / 10, min(30.0, args.duration / 2))
        while time.monotonic() < min(warm, end) and collector.proc.poll() is None:
            time.sleep(0.2)  # polling step
        if collector.proc.poll() is None:
            rss_warm, _ = proc_status(pid)
        for t in threads:
            t.join()
        alive = collector.proc.poll() is None
        rss_end, threads_end = proc_status(pid) if alive else (float("nan"), -1)
        body = urllib.request.urlopen(url, timeout=10).read().decode() if alive else ""
        samples = re.search(r"^otel_gpu_samples_total (\S+)$", body, re.M)
    finally:
        code = collector.stop()
        if churn is not None:
            churn.stop()
        workdir.cleanup()

    done = sorted(x for per_client in latencies for x in per_client)
    failed = sum(errors)
    print(f"soak: profile {args.profile}, interval {args.interval} s, {args.clients} clients, "
          f"{args.duration:g} s")
    p50, p99 = percentile(done, 0.5) * 1000, percentile(done, 0.99) * 1000
    worst = (done[-1] if done else 0.0) * 1000
    print(f"scrapes: {len(done)} ok, {failed} errors ({len(done) / args.duration:.0f}/s); "
          f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {worst:.1f} ms")
    print(f"samples taken: {samples.group(1) if samples else 'unknown'}")
    print(f"RSS: {rss_start:.1f} MiB at start, {rss_warm:.1f} MiB after the warm-up, "
          f"{rss_end:.1f} MiB at end ({(rss_end / rss_warm - 1) * 100:+.1f} % after the warm-up)")
    if churn is not None:
        rows = body.count("nvidia_gpu_k8s_allocation{")
        print(f"pod churn: {args.churn} pods replaced every {args.churn_every:g} s, "
              f"{churn.generation} generations; {rows} allocation series at the end; "
              f"{collector.rebuilds} MeterProvider rebuilds releasing finished pods")
    print(f"threads: {threads_start} at start, {threads_end} at end")
    print(f"collector: {'alive' if alive else 'DIED'} until the end; exit status {code} "
          f"after SIGTERM; {collector.lines} log lines, {collector.problems} warnings or errors")
    for line in collector.first_problems:
        print(f"  {line}")
    return 0 if alive and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
