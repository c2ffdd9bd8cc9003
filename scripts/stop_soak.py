"""Start and SIGTERM the real collector many times, under each hostile input the suite has,
and report the slowest exits: a DaemonSet pod that does not stop holds its node's rollout.

Each case starts ``python -m otel_gpu serve`` (as ``testkit.process`` does), waits
until it serves and has published a sample (polling, with a deadline), sends SIGTERM and
times the exit; a process still there after ``--kill-after`` seconds is killed and counted
as over the bound. Bounded as a whole by ``--budget`` seconds::

    timeout 360 .venv/bin/python scripts/stop_soak.py --runs 6 --budget 300

Prints one row per case: runs, median and max exit time, exit codes, runs over the bound.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.kubelet import FakeKubelet, container, devices, pod
from testkit.process import CollectorProcess, serve_args

BOUND_S = 5.0
"""The documented stop bound (README: SIGTERM stops it within 5 seconds)."""
H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class Result:
    times: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    unready: int = 0
    slowest_log: str = ""


@contextlib.contextmanager
def _blackhole(family: int = socket.AF_INET, path: str | None = None) -> Iterator[str]:
    """A listening socket that never accepts: a peer that connects and never answers."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_UNIX:
            assert path is not None
            sock.bind(path)
            sock.listen(1)
            yield path
        else:
            sock.bind(("127.0.0.1", 0))
            sock.listen(1)
            yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scenario(directory: Path, extra_gpu: str = "", top: str = "") -> str:
    path = directory / "scenario.yaml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        {top}
        devices:
          - name: {H100}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
          - name: {H100}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
            {extra_gpu}
    """))
    return str(path)


Case = Callable[[Path], contextlib.AbstractContextManager[tuple[list[str], dict[str, str]]]]


@contextlib.contextmanager
def plain(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    yield ["--simulate", "h100x8"], {}


@contextlib.contextmanager
def fifo_cpulist(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    node = tmp / "sys" / "devices" / "system" / "node" / "node0"
    node.mkdir(parents=True)
    os.mkfifo(node / "cpulist")
    with FakeKubelet() as kubelet:
        kubelet.set_pods([pod("train-0", container(
            "main", devices("nvidia.com/gpu", "GPU-00000000-0000-0000-0000-000000000000",
                            numa=0), cpu_ids=[0, 1]), namespace="ml")])
        yield ["--simulate", "h100x8", "--kubelet-socket", kubelet.socket_path,
               "--kubelet-interval", "0.1", "--sysfs-root", str(tmp)], {}


@contextlib.contextmanager
def kubelet_hung(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    with _blackhole(socket.AF_UNIX, str(tmp / "k.sock")) as path:
        yield ["--simulate", "h100x8", "--kubelet-socket", path,
               "--kubelet-interval", "0.1"], {}


def _nvml(extra_gpu: str = "", top: str = "") -> Case:
    @contextlib.contextmanager
    def case(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
        yield ["--simulate", _scenario(tmp, extra_gpu, top)], {}
    return case


def _otlp(protocol: str, down: str) -> Case:
    @contextlib.contextmanager
    def case(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
        env = {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_METRIC_EXPORT_INTERVAL": "300",
               "OTEL_EXPORTER_OTLP_TIMEOUT": "10"}
        if down == "refused":
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
            yield ["--simulate", "h100x8"], env
            return
        with _blackhole() as address:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{address}"
            yield ["--simulate", "h100x8"], env
    return case


CASES: dict[str, Case] = {
    "plain h100x8": plain,
    "FIFO at a node's cpulist": fifo_cpulist,
    "kubelet hung (never accepts)": kubelet_hung,
    "NVML read hung (GPU 1)": _nvml(
        "slow: [{function: nvmlDeviceGetMemoryInfo, seconds: 3600, after: 2}]"),
    "NVML event wait hung": _nvml(
        top="shapes: [{function: nvmlEventSetWait_v2, shape: hang, after: 2}]"),
    "NVML device count hung": _nvml(
        top="shapes: [{function: nvmlDeviceGetCount_v2, shape: hang, after: 2}]"),
    "OTLP/HTTP sink hung": _otlp("http/protobuf", "hung"),
    "OTLP/gRPC sink hung": _otlp("grpc", "hung"),
    "OTLP/HTTP sink refused": _otlp("http/protobuf", "refused"),
    "all at once (NVML, kubelet, OTLP hung)": lambda tmp: _all_hung(tmp),
}


@contextlib.contextmanager
def _all_hung(tmp: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    scenario = _scenario(
        tmp, "slow: [{function: nvmlDeviceGetMemoryInfo, seconds: 3600, after: 2}]",
        "shapes: [{function: nvmlEventSetWait_v2, shape: hang, after: 2}]")
    with _blackhole(socket.AF_UNIX, str(tmp / "k.sock")) as path, _blackhole() as address:
        yield (["--simulate", scenario, "--kubelet-socket", path, "--kubelet-interval", "0.1"],
               {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{address}",
                "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "10"})


def _ready(proc: CollectorProcess, deadline: float) -> bool:
    """Serving, one sample out, and for OTLP a first export under way: polled."""
    from testkit.process import http_get

    proc.wait_serving(max(1.0, deadline - time.monotonic()))
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            return False
        status, _, _ = http_get(proc.url("/readyz"), timeout=2.0)
        if status == 200:
            return True
        time.sleep(0.05)  # polling step
    return False


def run_once(case: Case, settle: float, kill_after: float) -> tuple[float, int, bool, str]:
    with tempfile.TemporaryDirectory(prefix="stop-soak-") as raw:
        tmp = Path(raw)
        with case(tmp) as (args, env):
            proc = CollectorProcess(serve_args(*args, interval="0.2"), env=env)
            try:
                ready = _ready(proc, time.monotonic() + 20.0)
                # let the hostile condition take hold (a hung call, an export in flight)
                end = time.monotonic() + settle
                while time.monotonic() < end and proc.proc.poll() is None:
                    time.sleep(0.05)  # polling step
                took_code = proc.stop(signal.SIGTERM, timeout=kill_after)
            finally:
                if proc.proc.poll() is None:
                    proc.proc.kill()
                    proc.proc.wait()
            code, took = took_code
            return took, code, ready, proc.log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for all cases")
    parser.add_argument("--settle", type=float, default=1.5,
                        help="seconds between readiness and the signal")
    parser.add_argument("--kill-after", type=float, default=15.0)
    parser.add_argument("--only", default="", help="cases whose name contains this")
    opts = parser.parse_args(argv)
    cases = {k: v for k, v in CASES.items() if opts.only.lower() in k.lower()}
    results = {name: Result() for name in cases}
    stop_at = time.monotonic() + opts.budget
    for n in range(opts.runs):  # round-robin: a short budget still covers every case
        for name, case in cases.items():
            if time.monotonic() > stop_at:
                break
            took, code, ready, log = run_once(case, opts.settle, opts.kill_after)
            res = results[name]
            if not res.times or took > max(res.times):
                res.slowest_log = log
            res.times.append(took)
            res.codes.append(code)
            res.unready += not ready
            print(f"run {n + 1} {name}: exit {code} after {took:.2f} s", flush=True)
    print(f"\n{'case':34} runs  median    max  codes        over {BOUND_S:g} s  unready")
    worst = 0.0
    for name, res in results.items():
        if not res.times:
            continue
        worst = max(worst, max(res.times))
        over = sum(t > BOUND_S for t in res.times)
        codes = ",".join(str(c) for c in sorted(set(res.codes)))
        print(f"{name:34} {len(res.times):4} {statistics.median(res.times):6.2f} "
              f"{max(res.times):6.2f}  {codes:12} {over:8}  {res.unready:7}")
    for name, res in results.items():
        if res.times and max(res.times) > BOUND_S:
            print(f"\n--- {name}: the slowest run's log (tail) ---")
            print("\n".join(res.slowest_log.splitlines()[-25:]))
    return 1 if worst > BOUND_S else 0


if __name__ == "__main__":
    raise SystemExit(main())
