"""The benchmark: otel-gpu beside a hand-written pynvml exporter, nvitop-exporter, a
prometheus_client exporter replaying its series and a static body.

Each configuration (a node of :mod:`testkit.scenarios`) runs its servers (every
one, unless the node names some), one at a time, interleaved over its repetitions
(the node's own, or ``--reps``; the order rotates each repetition). A default run
(every node, each its repetitions) finishes within 15 minutes on a 2-core machine:

- ``handwritten``: a hand-written exporter reading NVML itself through pynvml
  on the same fake driver, rendering with prometheus_client per scrape
  (:mod:`benchmarks.handwritten` under :mod:`benchmarks.launch`, which counts
  its calls and samples): the values most dashboards need, 22 series a GPU;
- ``handwritten-same`` is started here for :mod:`benchmarks.paired`, which runs it
  beside otel-gpu at the same time (no node of this run has it): the same kind of
  exporter making otel-gpu's NVML calls with their arguments, each value a series;
- ``otel-gpu``: the real collector, ``otel_gpu.cli.main`` with ``--simulate
  FILE`` under :mod:`benchmarks.launch` (which counts its NVML calls at the
  fake library; pod attribution on, as installed by default; the pods node
  gets a fake kubelet on a unix socket, the others a socket path that does
  not exist);
- ``promclient``: a hand-written prometheus_client exporter holding the
  collector's series (:mod:`benchmarks.baselines`); it reads no NVML;
- ``nvitop-exporter``: the real peer, nvitop-exporter's own entry point run
  by :mod:`benchmarks.launch` on the same simulated driver and scenario; it
  is measured only once it serves every simulated GPU (:mod:`benchmarks.peer`);
- ``static``: the collector's body, pre-rendered, served from memory.

Each server is started once per phase, each repetition:

- *cached*: sampling once (``--interval 1h``); a few clients scrape one
  request at a time per connection, timing each request, for ``--seconds``:
  scrape latency, server CPU per scrape (from the process's POSIX CPU clock,
  in nanoseconds with ended threads included; ``/proc`` where it cannot be
  read), resident memory (VmRSS), time to ready (from the start of the process
  to ``/readyz`` 200, the first ``/metrics`` 200 for the baselines, the first
  body holding every GPU for nvitop-exporter), and the body's size, plain and
  as served with ``Accept-Encoding: gzip``;
- *cycle*: sampling every ``--interval`` seconds while the same clients scrape
  with a pause between requests: the latency of the first scrape after each
  new sample (the one that first sees ``otel_gpu_samples_total`` move, or
  nvitop-exporter's host uptime, which it sets first in each sample) and of
  every scrape in the phase; then as many intervals again with nobody
  scraping: server CPU per cycle (that window's CPU per sample, from the same
  clock: sampling and, for the collector, the render on
  publishing); NVML calls per GPU per sample counted at the library (otel-gpu
  and nvitop-exporter), over the samples begun in that quiet window (after
  the first sample, which also discovers the GPUs), and otel-gpu's own count
  (``otel_gpu_nvml_requests_total`` over ``otel_gpu_samples_total`` and GPUs,
  between the phase's first and last scrape);
- *cycle with OTLP* (otel-gpu only): the cycle again, with the collector also
  pushing OTLP over gRPC every ``--interval`` to a receiver in this process
  (``testkit.otlp_receiver``): what OTLP adds to the CPU per cycle;
- *paced* (the systems reading NVML): one client scrapes with gzip once per
  interval, as a Prometheus scraping at the sampling interval does; after a
  warm-up, the server's CPU per second over ``--paced-intervals`` intervals,
  times the interval: CPU per sample interval in that steady state.

It prints, per configuration, each figure's median with its spread (min-max
over the repetitions) and its ratio to the baselines, and can write every
measurement as JSON. Timing goals live here and in docs/performance.md, never
in the tests; ``--quick`` (one small run) is what the test suite runs.

    python -m benchmarks.run [--quick] [--configs gpus-1,gpus-8] [--reps 3] [--json FILE]
    python -m benchmarks.report FILE    # the tables again, from the JSON
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gzip
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import peer
from benchmarks.baselines import PROMCLIENT_KUBELET, series_file
from benchmarks.report import FIGURES, KINDS, spread, table
from testkit.scenarios import (
    NODES,
    SAMPLING,
    Node,
    gpu_uuids,
    node_list,
    time_sliced_pods,
    write_scenario,
)

__all__ = ["FIGURES", "KINDS", "spread", "table"]  # their home is benchmarks.report

ROOT = Path(__file__).resolve().parents[1]
_SERVING = re.compile(r"serving metrics on https?://[^:]+:(\d+)/metrics")
_TICK = os.sysconf("SC_CLK_TCK")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True) \
    if os.name == "posix" else None
SAMPLES = "otel_gpu_samples_total"
HANDWRITTEN = "handwritten"
HANDWRITTEN_SAME = "handwritten-same"


# --------------------------------------------------------------------------- /proc


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu(pid: int) -> tuple[frozenset[str], float] | None:
    """A process's live threads, and their CPU seconds from the nanosecond counters of
    ``/proc/PID/task/*/schedstat`` (``/proc/PID/stat`` counts 10 ms ticks); None if a
    thread vanished while being read."""
    total, tids = 0, []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
            tids.append(task.name)
    except (OSError, ValueError, IndexError):
        return None
    return frozenset(tids), total / 1e9


def process_cpu(pid: int) -> float | None:
    """The CPU seconds of a whole process from its POSIX CPU clock: nanoseconds, and the
    threads that ended included (``/proc`` has them only in 10 ms ticks); None where the
    clock cannot be read."""
    clock = ctypes.c_int()
    if _LIBC is None or _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return None
    try:
        return time.clock_gettime(clock.value)
    except OSError:
        return None


CpuMark = tuple[tuple[frozenset[str], float] | None, float, float | None]


def window_cpu(pid: int) -> CpuMark:
    """The CPU clocks of ``pid`` now, for :func:`window_seconds`."""
    return thread_cpu(pid), cpu_seconds(pid), process_cpu(pid)


def window_seconds(pid: int, start: CpuMark) -> float:
    """CPU seconds since ``start``: from the process's CPU clock where it can be read, else
    from the threads' counters when every thread there at the start is still there (an
    ended thread takes its time with it), else from the ticks."""
    fine, ticks, clock = window_cpu(pid)
    if clock is not None and start[2] is not None:
        return clock - start[2]
    if fine is not None and start[0] is not None and start[0][0] <= fine[0]:
        return fine[1] - start[0][1]
    return ticks - start[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def value(body: bytes, name: str) -> float | None:
    """The value of an unlabelled series in a Prometheus text body."""
    match = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", body, re.M)
    return float(match.group(1)) if match else None


def series_count(body: bytes, prefix: str = "") -> int:
    """Series (sample lines) in a body, of the families starting with ``prefix``."""
    start = prefix.encode()
    return sum(1 for line in body.splitlines()
               if line and not line.startswith(b"#") and line.startswith(start))


# --------------------------------------------------------------------------- servers


class Server:
    """One server process under test; its output is drained on a thread."""

    def __init__(self, argv: list[str], port_file: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        """``cwd``: the source tree it runs from (another checkout's collector)."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=None if env is None else {**os.environ, **env})
        self.port: int | None = None
        self.port_file = port_file
        self.counts_port: int | None = None  # where a launcher serves its NVML counts
        self.gpu_series: dict[str, int] = {}  # nvitop-exporter's check, once it passed
        self.tail: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail = (self.tail + [line.rstrip()])[-20:]
            match = _SERVING.search(line)
            if match:
                self.port = int(match.group(1))

    def wait_ready(self, path: str, timeout: float = 120.0) -> float:
        """Seconds from the start of the process to the first 200 on ``path``."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the server exited:\n" + "\n".join(self.tail))
            if self.port is None and self.port_file is not None and self.port_file.exists():
                self.port = int(self.port_file.read_text())
            if self.port is not None:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                    conn.request("GET", path)
                    if conn.getresponse().status == 200:
                        return time.monotonic() - self.started
                except OSError:
                    pass
            time.sleep(0.005)
        raise RuntimeError("the server was not ready in time:\n" + "\n".join(self.tail))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def counts(self) -> dict | None:
        """The NVML calls counted at the library, where the server runs under a launcher."""
        return None if self.counts_port is None else peer.read_counts(self.counts_port)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# --------------------------------------------------------------------------- the client


@dataclass
class Scrape:
    at: float
    latency: float
    samples: float | None


@dataclass
class Client:
    """Scrapes one request at a time on one kept-alive connection, timing each request."""

    port: int
    pause: float
    until: float
    marker: str | None  # the series that moves with each sample (None: do not decode)
    scrapes: list[Scrape] = field(default_factory=list)
    errors: int = 0
    last_body: bytes = b""

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Accept-Encoding": "gzip"}
        while time.monotonic() < self.until:
            started = time.perf_counter()
            try:
                conn.request("GET", "/metrics", headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                continue
            latency = time.perf_counter() - started
            if resp.status != 200:
                self.errors += 1
                continue
            samples = None
            if self.marker:
                body = gzip.decompress(data) if resp.getheader("Content-Encoding") else data
                samples = value(body, self.marker)
                self.last_body = body
            self.scrapes.append(Scrape(time.monotonic(), latency, samples))
            if self.pause:
                time.sleep(self.pause)
        conn.close()


@dataclass
class Paced:
    """One gzip scrape every ``interval`` on a kept-alive connection, as Prometheus scrapes."""

    port: int
    interval: float
    until: float
    scrapes: int = 0
    errors: int = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        due = time.monotonic()
        while due < self.until:
            try:
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                resp = conn.getresponse()
                resp.read()
                self.scrapes += resp.status == 200
                self.errors += resp.status != 200
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
            due += self.interval
            time.sleep(max(0.0, due - time.monotonic()))
        conn.close()


def scrape_for(port: int, seconds: float, clients: int, pause: float,
               marker: str | None) -> list[Client]:
    until = time.monotonic() + seconds
    out = [Client(port, pause, until, marker) for _ in range(clients)]
    threads = [threading.Thread(target=c.run) for c in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def fetch(port: int, headers: dict[str, str] | None = None) -> bytes:
    """A body as the server sends it (gzipped when ``headers`` ask for it and it obliges)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics", headers=headers or {})
    body = conn.getresponse().read()
    conn.close()
    return body


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --------------------------------------------------------------------------- one run


@dataclass
class Settings:
    seconds: float = 1.5
    interval: float = 1.0
    clients: int = 2
    pause: float = 0.02
    cycle_intervals: int = 3
    paced_intervals: int = 6
    otlp: bool = True


class Bench:
    def __init__(self, workdir: Path, settings: Settings) -> None:
        self.workdir = workdir
        self.settings = settings
        self.bodies: dict[str, Path] = {}
        self.series: dict[str, Path] = {}
        self.kubelets: dict[str, object] = {}
        self.receiver: object | None = None

    def close(self) -> None:
        for kubelet in self.kubelets.values():
            kubelet.close()  # type: ignore[attr-defined]
        if self.receiver is not None:
            self.receiver.stop()  # type: ignore[attr-defined]

    def otlp_env(self, interval: float) -> dict[str, str]:
        """Variables pointing the collector at this process's OTLP receiver, gRPC, every
        ``interval``."""
        if self.receiver is None:
            from testkit.otlp_receiver import OtlpReceiver

            self.receiver = OtlpReceiver(http=False).start()
        return {**self.receiver.env("grpc"),  # type: ignore[attr-defined]
                "OTEL_METRIC_EXPORT_INTERVAL": f"{interval * 1000:g}"}

    def _socket(self, node: Node) -> str:
        if not node.pods:
            return str(self.workdir / "no-kubelet.sock")
        if node.name not in self.kubelets:
            from testkit.kubelet import FakeKubelet

            scenario = write_scenario(node, self.workdir)
            kubelet = FakeKubelet(str(self.workdir / f"{node.name}.sock"))
            kubelet.set_pods(time_sliced_pods(gpu_uuids(scenario), node.pods))
            self.kubelets[node.name] = kubelet.start()
        return str(self.kubelets[node.name].socket_path)  # type: ignore[attr-defined]

    def start(self, kind: str, node: Node, interval: float,
              env: dict[str, str] | None = None, root: Path = ROOT) -> tuple[Server, float]:
        """``root``: the source tree the collector runs from (``otel-gpu`` only)."""
        counts = self.workdir / f"{kind}-{node.name}-{time.monotonic_ns()}.counts"
        if kind == "otel-gpu":
            scenario = write_scenario(node, self.workdir)
            server = Server(peer.otel_gpu_command(counts, [
                "--simulate", str(scenario), "--listen", "127.0.0.1:0",
                "--interval", f"{interval:g}", "--kubelet-socket", self._socket(node),
                "--kubelet-interval", "1s", "--log-level", "info"]), env=env, cwd=root)
            ready = server.wait_ready("/readyz")
            server.counts_port = peer.counts_port(counts, server.alive)
            if node.pods:  # every pod attributed before anything is measured
                deadline, port = time.monotonic() + 120, server.port or 0
                while series_count(fetch(port), "nvidia_gpu_k8s_allocation") < node.pods:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the pods never showed")
                    time.sleep(0.1)
            return server, ready
        port_file = self.workdir / f"{kind}-{node.name}-{time.monotonic_ns()}.port"
        if kind in (HANDWRITTEN, HANDWRITTEN_SAME):  # it announces its port once it sampled
            scenario = write_scenario(node, self.workdir)
            server = Server(peer.handwritten_command(scenario, port_file, counts, interval,
                                                     same=kind == HANDWRITTEN_SAME), port_file)
            ready = server.wait_ready("/metrics")
            server.counts_port = peer.counts_port(counts, server.alive)
            return server, ready
        if kind == peer.NVITOP:
            scenario = write_scenario(node, self.workdir)
            server = Server(peer.nvitop_command(scenario, port_file, counts, interval), port_file)
            server.wait_ready("/metrics")  # it answers before its first sample: wait for one
            peer_port = server.port
            assert peer_port is not None
            server.gpu_series = peer.wait_for_gpus(lambda: fetch(peer_port), scenario,
                                                   node.gpus, server.alive)
            ready = time.monotonic() - server.started
            server.counts_port = peer.counts_port(counts, server.alive)
            return server, ready
        asks = kind == PROMCLIENT_KUBELET
        if asks:
            kind = "promclient"
        source = self.series[node.name] if kind == "promclient" else self.bodies[node.name]
        server = Server([sys.executable, "-m", "benchmarks.baselines", kind, "--series",
                         str(source), "--port-file", str(port_file),
                         "--interval", f"{interval:g}",
                         *(["--kubelet", self._socket(node)] if asks else [])], port_file)
        return server, server.wait_ready("/metrics")

    def capture(self, node: Node) -> None:
        """The collector's body, for the baselines to hold the same series."""
        server, _ = self.start("otel-gpu", node, 3600)
        try:
            body = fetch(server.port)  # type: ignore[arg-type]
        finally:
            server.stop()
        self.bodies[node.name] = self.workdir / f"{node.name}.prom"
        self.bodies[node.name].write_bytes(body)
        self.series[node.name] = self.workdir / f"{node.name}.json"
        self.series[node.name].write_text(json.dumps(series_file(body.decode())))

    def cached(self, kind: str, node: Node) -> dict:
        s = self.settings
        server, ready = self.start(kind, node, 3600)
        try:
            port = server.port
            assert port is not None
            fetch(port)  # one render paid before the phase, where any server would
            cpu0 = window_cpu(server.proc.pid)
            clients = scrape_for(port, s.seconds, s.clients, 0.0, None)
            cpu = window_seconds(server.proc.pid, cpu0)
            latencies = [x.latency for c in clients for x in c.scrapes]
            body = fetch(port)
            served = fetch(port, {"Accept-Encoding": "gzip"})
            return {
                "ready_s": ready,
                "rss_mib": rss_mib(server.proc.pid),
                "scrapes": len(latencies),
                "errors": sum(c.errors for c in clients),
                "cpu_per_scrape_ms": 1000 * cpu / max(len(latencies), 1),
                "p50_ms": 1000 * pct(latencies, 0.5),
                "p99_ms": 1000 * pct(latencies, 0.99),
                "series": series_count(body),
                "bytes": len(body),
                "body_kb": len(body) / 1000,
                "gzip_kb": len(served) / 1000,
                **({"peer_gpu_series": server.gpu_series} if server.gpu_series else {}),
            }
        finally:
            server.stop()

    def interval(self, node: Node) -> float:
        return node.interval or self.settings.interval

    def paced(self, kind: str, node: Node) -> dict:
        """CPU per sample interval while one client scrapes with gzip once per interval: the
        steady state of a Prometheus scraping at the sampling interval. CPU per second of
        the window times the interval, so that a sample more or less in the window does
        not move it; the samples are counted by the launcher."""
        s, interval = self.settings, self.interval(node)
        server, _ = self.start(kind, node, interval)
        try:
            port = server.port
            assert port is not None
            warm = s.paced_intervals // 4 + 2  # the first samples, and rendering turned on
            until = time.monotonic() + interval * (warm + s.paced_intervals)
            client = Paced(port, interval, until)
            thread = threading.Thread(target=client.run)
            thread.start()
            time.sleep(interval * warm)
            counts0, cpu0, t0 = server.counts(), window_cpu(server.proc.pid), time.monotonic()
            time.sleep(interval * s.paced_intervals)
            cpu, t1, counts1 = window_seconds(server.proc.pid, cpu0), time.monotonic(), \
                server.counts()
            thread.join()
        finally:
            server.stop()
        samples = counts1["samples"] - counts0["samples"] if counts0 and counts1 else 0
        return {"cpu_per_interval_ms": 1000 * cpu / (t1 - t0) * interval,
                "cpu_per_second_ms": 1000 * cpu / (t1 - t0), "seconds": t1 - t0,
                "samples": samples, "scrapes": client.scrapes, "errors": client.errors}

    def cycle(self, kind: str, node: Node, otlp: bool = False) -> dict:
        s = self.settings
        interval = self.interval(node)
        env = self.otlp_env(interval) if otlp else None
        server, _ = self.start(kind, node, interval, env)
        try:
            port = server.port
            assert port is not None
            marker = {peer.NVITOP: peer.SAMPLE_MARKER, HANDWRITTEN: None}.get(kind, SAMPLES)
            first = fetch(port)
            clients = scrape_for(port, interval * s.cycle_intervals, s.clients, s.pause, marker)
            # then as many intervals with no scrape at all: the CPU of the cycles alone
            mid, counts_mid = fetch(port), server.counts()
            pushes0 = len(self.receiver.requests) if otlp else 0  # type: ignore[union-attr]
            cpu0 = window_cpu(server.proc.pid)
            time.sleep(interval * s.cycle_intervals)
            cpu = window_seconds(server.proc.pid, cpu0)
            pushes = len(self.receiver.requests) - pushes0 if otlp else 0  # type: ignore[union-attr]
            counts_last = server.counts()
            last = fetch(port)
        finally:
            server.stop()
        every = [x.latency for c in clients for x in c.scrapes]
        after = []
        for c in clients:
            for before, now in zip(c.scrapes, c.scrapes[1:], strict=False):
                if now.samples is not None and before.samples is not None \
                        and now.samples > before.samples:
                    after.append(now.latency)
        out: dict[str, object] = {
            "scrapes": len(every),
            "errors": sum(c.errors for c in clients),
            "p50_ms": 1000 * pct(every, 0.5),
            "p99_ms": 1000 * pct(every, 0.99),
            "after_sample_p50_ms": 1000 * pct(after, 0.5),
            "after_sample_p99_ms": 1000 * pct(after, 0.99),
            "after_sample_scrapes": len(after),
        }
        if kind in (peer.NVITOP, HANDWRITTEN):  # their bodies count no samples; launchers do
            quiet = [c["samples"] if c else None for c in (counts_mid, counts_last)]
        else:
            quiet = [value(b, SAMPLES) for b in (mid, last)]
        if kind != "static" and None not in quiet and quiet[1] > quiet[0]:  # type: ignore[operator]
            cycles = quiet[1] - quiet[0]  # type: ignore[operator]
            out["cpu_per_cycle_ms"] = 1000 * cpu / cycles
            if otlp:
                out["otlp_pushes_per_cycle"] = pushes / cycles
        if counts_mid and counts_last:  # after the first sample, which also discovers
            library = peer.library_calls(counts_mid, counts_last, node.gpus)
            if library is not None:
                out["nvml_library_calls_per_gpu_per_sample"] = library["per_gpu_per_sample"]
                out["nvml_missing_per_gpu_per_sample"] = library["missing_per_gpu_per_sample"]
                out["nvml_library_calls"] = library
        samples = [value(b, SAMPLES) for b in (first, last)]
        if kind == "otel-gpu":
            calls = [value(b, "otel_gpu_nvml_requests_total") for b in (first, last)]
            if None not in calls and None not in samples and samples[1] > samples[0]:  # type: ignore[operator]
                out["nvml_calls_per_gpu_per_sample"] = (
                    (calls[1] - calls[0]) / (samples[1] - samples[0]) / node.gpus)  # type: ignore[operator]
        return out


# --------------------------------------------------------------------------- report


def run(configs: list[str], reps: int | None, settings: Settings,
        log: Callable[[str], object] = print) -> dict:
    """Every measurement: results[config][kind] = list (one per repetition) of phases.
    ``reps`` None: each node's own (:data:`testkit.scenarios.NODES`)."""
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="otel-gpu-bench-") as tmp:
        bench = Bench(Path(tmp), settings)
        try:
            for name in configs:
                if needs_capture(NODES[name]):
                    bench.capture(NODES[name])
            most = max(reps or NODES[name].reps for name in configs)
            for rep in range(most):
                for name in configs:
                    node = NODES[name]
                    if rep >= (reps or node.reps):
                        continue
                    kinds = [k for k in KINDS if node.kinds is None or k in node.kinds]
                    turn = rep % len(kinds)
                    for kind in kinds[turn:] + kinds[:turn]:
                        started = time.monotonic()
                        cached = bench.cached(kind, node)
                        cycle = bench.cycle(kind, node)
                        phases = {"cached": cached, "cycle": cycle}
                        if kind == "otel-gpu" and settings.otlp:
                            phases["cycle_otlp"] = bench.cycle(kind, node, otlp=True)
                        if kind in SAMPLING and settings.paced_intervals:
                            phases["paced"] = bench.paced(kind, node)
                        results.setdefault(name, {}).setdefault(kind, []).append(phases)
                        paced = phases.get("paced", {}).get("cpu_per_interval_ms")
                        log(f"rep {rep + 1}/{reps or node.reps} {name:9} {kind:15} "
                            f"cached p50 {cached['p50_ms']:.2f} ms, "
                            f"cpu/scrape {cached['cpu_per_scrape_ms']:.2f} ms; "
                            f"after-sample p50 {cycle['after_sample_p50_ms']:.2f} ms"
                            + (f"; paced cpu/interval {paced:.2f} ms" if paced else "")
                            + f" ({time.monotonic() - started:.0f} s)")
        finally:
            bench.close()
    return results


def needs_capture(node: Node) -> bool:
    """Whether a system replaying the collector's body runs on ``node``."""
    return node.kinds is None or bool({"promclient", "static"} & set(node.kinds))


def machine() -> str:
    """The CPUs this run had: their count and model."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} x {model}"


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def bytecode() -> None:
    """Compile the collector's and the baselines' modules first, as installing a wheel
    does: a checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every
    module from source at each start and charge it to time to ready."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in ("otel_gpu", "benchmarks"):
        compileall.compile_dir(str(root / package), quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one short repetition at 8 GPUs (the test suite's smoke run)")
    parser.add_argument("--configs", type=node_list, default=",".join(NODES),
                        help=f"comma-separated, of {', '.join(NODES)}")
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions of every node (default: each node's own)")
    parser.add_argument("--seconds", type=float, default=Settings.seconds,
                        help="length of each cached phase")
    parser.add_argument("--interval", type=float, default=Settings.interval,
                        help="sample interval where the node sets none")
    parser.add_argument("--paced-intervals", type=int, default=Settings.paced_intervals,
                        help="intervals measured with one scrape per sample (0: no such phase)")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--no-otlp", action="store_true",
                        help="skip the cycle with OTLP (the collector's third phase)")
    args = parser.parse_args(argv)
    settings = Settings(seconds=args.seconds, interval=args.interval, otlp=not args.no_otlp,
                        paced_intervals=args.paced_intervals)
    configs, reps = args.configs, args.reps
    if args.quick:
        configs, reps = ["gpus-8"], 1
        settings = Settings(seconds=1.0, interval=0.5, cycle_intervals=4, paced_intervals=4,
                            otlp=not args.no_otlp)
    if not args.quick:
        bytecode()
    started, load_before = time.monotonic(), load()
    results = run(configs, reps, settings, log=lambda line: print(line, file=sys.stderr))
    meta = {
        "date": time.strftime("%Y-%m-%d"), "machine": machine(),
        "wall_s": round(time.monotonic() - started), "load_before": load_before,
        "load_after": load(),
        "settings": {"cached phase": f"{settings.seconds:g} s",
                     "interval": f"{settings.interval:g} s", "clients": settings.clients,
                     "cycle intervals": settings.cycle_intervals,
                     "paced intervals": settings.paced_intervals, "otlp": settings.otlp},
        "nodes": {name: {"reps": reps or NODES[name].reps,
                         "interval": NODES[name].interval or settings.interval}
                  for name in configs},
    }
    print(table(results, meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
