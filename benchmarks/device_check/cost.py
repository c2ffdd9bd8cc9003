"""The cost phase: each system's CPU per sample and per gzip scrape, RSS and NVML calls per
GPU per sample, every one run under :mod:`benchmarks.launch`, which counts its calls at
the library."""

from __future__ import annotations

import gzip
import http.client
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.device_check.collector import POLL, parse
from benchmarks.device_check.results import Options, Result


def measure_cost(kind: str, simulate: str | None, gpus: int, interval: float,
                 quiet_s: float, scrape_s: float, workdir: Path) -> dict[str, Any]:
    """One system's CPU per sample, CPU per gzip scrape, RSS and NVML calls per sample."""
    from benchmarks import peer
    from benchmarks.run import Server, rss_mib, scrape_for, value, window_cpu, window_seconds

    stamp = time.monotonic_ns()
    counts = workdir / f"{kind}-{stamp}.counts"
    port_file = workdir / f"{kind}-{stamp}.port"
    where = ["--scenario", simulate] if simulate else ["--real"]
    launch = [sys.executable, "-m", "benchmarks.launch"]
    if kind == "otel-gpu":
        args = ["serve", "--listen", "127.0.0.1:0", "--interval", f"{interval:g}",
                "--kubelet-socket", str(workdir / "no-kubelet.sock"), "--log-level", "info"]
        if simulate:
            args = ["--simulate", simulate, *args]
        argv = [*launch, "otel-gpu", "--counts-file", str(counts),
                *([] if simulate else ["--real"]), "--", *args]
        server = Server(argv)
        server.wait_ready("/readyz", 60)
    else:
        argv = [*launch, kind, *where, "--port-file", str(port_file), "--counts-file",
                str(counts), "--interval", f"{interval:g}"]
        server = Server(argv, port_file)
        server.wait_ready("/metrics", 90)
    try:
        port = server.port
        assert port is not None
        if kind == peer.NVITOP:  # it answers before its first sample: wait for every GPU
            deadline = time.monotonic() + 60
            while _family_gpus(_fetch(port), "gpu_utilization_Percentage") < gpus:
                if time.monotonic() > deadline or not server.alive():
                    raise RuntimeError(f"{kind} never served the {gpus} GPU(s)")
                time.sleep(POLL)
        counts_port = peer.counts_port(counts, server.alive)
        _fetch(port, gzip_=True)
        c0, cpu0 = peer.read_counts(counts_port), window_cpu(server.proc.pid)
        time.sleep(quiet_s)  # the measurement window: nobody scraping
        cpu = window_seconds(server.proc.pid, cpu0)
        c1 = peer.read_counts(counts_port)
        calls = peer.library_calls(c0, c1, gpus)
        samples = calls["samples"] if calls else 0
        per_sample = cpu / samples if samples else float("nan")
        cpu0 = window_cpu(server.proc.pid)
        c2 = peer.read_counts(counts_port)
        clients = scrape_for(port, scrape_s, 1, 0.0, None)
        cpu = window_seconds(server.proc.pid, cpu0)
        c3 = peer.read_counts(counts_port)
        scrapes = sum(len(c.scrapes) for c in clients)
        during = c3["samples"] - c2["samples"]
        per_scrape = (cpu - during * (per_sample if samples else 0.0)) / max(scrapes, 1)
        out = {
            "cpu_per_sample_ms": 1000 * per_sample,
            "cpu_per_gzip_scrape_ms": 1000 * per_scrape,
            "scrapes": scrapes,
            "scrape_errors": sum(c.errors for c in clients),
            "rss_mib": rss_mib(server.proc.pid),
            "nvml_calls_per_gpu_per_sample": calls["per_gpu_per_sample"] if calls else None,
            "nvml_missing_per_gpu_per_sample":
                calls["missing_per_gpu_per_sample"] if calls else None,
            "nvml_calls_by_symbol": calls["by_symbol"] if calls else {},
            "samples_measured": samples,
            "gzip_kb": len(_fetch(port, gzip_=True)) / 1000,
        }
        if kind == "otel-gpu":
            body = _fetch(port)
            out["self_reported_nvml_requests"] = value(body, "otel_gpu_nvml_requests_total")
            out["self_reported_samples"] = value(body, "otel_gpu_samples_total")
        return out
    finally:
        server.stop()


def _fetch(port: int, gzip_: bool = False) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzip_ else {})
        resp = conn.getresponse()
        data = resp.read()
        return data if gzip_ or not resp.getheader("Content-Encoding") else gzip.decompress(data)
    finally:
        conn.close()


def _family_gpus(body: bytes, family: str) -> int:
    return len({lab.get("uuid") for name, lab, _ in parse(body.decode()) if name == family})


def run_cost(result: Result, opts: Options, gpus: int, tmp: Path) -> None:
    from benchmarks import peer

    for kind in opts.systems:
        if kind == peer.NVITOP and importlib.util.find_spec("nvitop_exporter") is None:
            result.note("cost: nvitop-exporter is not importable: skipped")
            continue
        try:
            result.cost[kind] = measure_cost(kind, opts.simulate, gpus, opts.interval,
                                             opts.quiet_seconds, opts.scrape_seconds, tmp)
        except Exception as exc:  # noqa: BLE001 - one system's failure is reported, not fatal
            result.cost[kind] = {"error": f"{type(exc).__name__}: {exc}"}
            result.note(f"cost: {kind} could not be measured: {exc}")
