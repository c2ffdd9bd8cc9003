"""The harness's side of :mod:`benchmarks.launch`: commands, library counts, the peer's check.

nvitop-exporter is measured only once it serves, for every GPU of the
scenario (by the UUID the simulator gives it), a finite value in each of
:data:`GPU_FAMILIES`, and its memory total is the scenario's: a peer that
found no driver, or another one, fails the run instead of reporting a cheap
sample.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.launch import NVITOP_HOSTNAME

NVITOP = "nvitop-exporter"
GPU_FAMILIES = ("gpu_utilization_Percentage", "gpu_memory_utilization_Percentage",
                "gpu_memory_total_MiB", "gpu_memory_used_MiB")
"""nvitop-exporter's per-GPU families that must hold every simulated GPU."""
SAMPLE_MARKER = f'host_uptime_Second{{hostname="{NVITOP_HOSTNAME}"}}'
"""A series nvitop-exporter sets again at the start of every sample, to see samples move."""
_MAX_COUNTS = 1 << 20


class PeerError(RuntimeError):
    """The peer does not serve the simulated GPUs."""


def otel_gpu_command(counts_file: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "benchmarks.launch", "otel-gpu", "--counts-file",
            str(counts_file), "--", *args]


def nvitop_command(scenario: Path, port_file: Path, counts_file: Path,
                   interval: float) -> list[str]:
    return [sys.executable, "-m", "benchmarks.launch", NVITOP, "--scenario", str(scenario),
            "--port-file", str(port_file), "--counts-file", str(counts_file),
            "--interval", f"{interval:g}"]


def counts_port(counts_file: Path, alive: Callable[[], bool], timeout: float = 60.0) -> int:
    """The port the launcher wrote to ``counts_file``; ``alive()`` false ends the wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if counts_file.exists():
            return int(counts_file.read_text())
        if not alive():
            raise RuntimeError("the server exited before serving its NVML counts")
        time.sleep(0.005)
    raise RuntimeError(f"no NVML counts port in {counts_file} after {timeout:g} s")


def read_counts(port: int) -> dict:
    """One snapshot of a launcher's counts: samples, calls and missing symbols."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
            if len(data) > _MAX_COUNTS:
                raise RuntimeError(f"NVML counts over {_MAX_COUNTS} bytes")
    return json.loads(data)


def library_calls(first: dict, last: dict, gpus: int) -> dict | None:
    """Calls that reached the driver per GPU per sample between two snapshots, in all and
    per symbol, and the symbols asked for that the simulator lacks (None: no whole sample)."""
    samples = last["samples"] - first["samples"]
    if samples <= 0:
        return None
    per = samples * gpus
    by_symbol = {name: (n - first["calls"].get(name, 0)) / per
                 for name, n in sorted(last["calls"].items())
                 if n > first["calls"].get(name, 0)}
    missing = {name: (n - first["missing"].get(name, 0)) / per
               for name, n in sorted(last["missing"].items())
               if n > first["missing"].get(name, 0)}
    return {"per_gpu_per_sample": sum(by_symbol.values()), "by_symbol": by_symbol,
            "missing_per_gpu_per_sample": sum(missing.values()), "missing": missing,
            "samples": samples}


def gpu_series(body: bytes, scenario: Path) -> dict[str, int]:
    """Per family of :data:`GPU_FAMILIES`, the simulated GPUs it holds a finite value for."""
    from prometheus_client.parser import text_string_to_metric_families

    from otel_gpu.sim.scenario import load_scenario

    gpus = {gpu.uuid: gpu for gpu in load_scenario(str(scenario)).devices}
    found: dict[str, set[str]] = {name: set() for name in GPU_FAMILIES}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            uuid = s.labels.get("uuid", "")
            if s.name not in found or uuid not in gpus or not math.isfinite(s.value):
                continue
            memory = gpus[uuid].memory
            if s.name == "gpu_memory_total_MiB" and (
                    memory is None or s.value != memory.total / (1 << 20)):
                raise PeerError(f"{NVITOP} reports {s.value} MiB for {uuid}, not the "
                                "scenario's memory total: it is not reading the simulator")
            found[s.name].add(uuid)
    return {name: len(uuids) for name, uuids in found.items()}


def wait_for_gpus(fetch: Callable[[], bytes], scenario: Path, gpus: int,
                  alive: Callable[[], bool],
                  timeout: float = 120.0) -> dict[str, int]:
    """Poll the peer's body until every family holds all ``gpus`` simulated GPUs."""
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        if not alive():
            raise PeerError(f"{NVITOP} exited before serving the simulated GPUs")
        got = gpu_series(fetch(), scenario)
        if all(n == gpus for n in got.values()):
            return got
        time.sleep(0.02)
    raise PeerError(f"{NVITOP} never served all {gpus} simulated GPUs: {got}")


def handwritten_command(scenario: Path, port_file: Path, counts_file: Path,
                        interval: float, same: bool = False) -> list[str]:
    """``same``: the exporter reading what otel-gpu reads (``handwritten-same``)."""
    return [sys.executable, "-m", "benchmarks.launch",
            "handwritten-same" if same else "handwritten", "--scenario",
            str(scenario), "--port-file", str(port_file), "--counts-file", str(counts_file),
            "--interval", f"{interval:g}"]
