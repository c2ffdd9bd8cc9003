"""The load phase: a matmul child process on the GPU, and what must move under it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time

from benchmarks.device_check.collector import POLL, index_of
from benchmarks.device_check.compare import Snapshot
from benchmarks.device_check.reader import Reader
from benchmarks.device_check.reference import refused
from benchmarks.device_check.results import Result, Row

LOAD_SOURCE = r"""
import sys, time
seconds, gib = float(sys.argv[1]), float(sys.argv[2])
try:
    import torch
    dev = torch.device("cuda:0")
    hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=dev)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    step = lambda: torch.matmul(a, b)
    sync = torch.cuda.synchronize
    kind = "torch bf16"
except ImportError:
    import cupy
    hold = cupy.empty(int(gib * (1 << 30)), dtype=cupy.uint8)
    a = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32).astype(cupy.float16)
    step = lambda: cupy.matmul(a, b)
    sync = cupy.cuda.runtime.deviceSynchronize
    kind = "cupy fp16"
step(); sync()
start = time.perf_counter(); n = 0
print("ready", kind, flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        step()
    sync(); n += 20
took = time.perf_counter() - start
print("done", n, 2 * 8192 ** 3 * n / took / 1e12, flush=True)
"""


def load_available() -> str | None:
    """What the load phase can use: torch, else cupy, else None."""
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


class Load:
    """One matmul child process holding ``gib`` GiB, for at most ``seconds``."""

    def __init__(self, seconds: float, gib: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOAD_SOURCE, f"{seconds:g}",
                                      f"{gib:g}"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_ready(self, deadline_s: float = 90.0) -> str:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith("ready"):
                    return line[6:]
            if self.proc.poll() is not None:
                raise RuntimeError("the load exited:\n" + "\n".join(self.lines[-20:]))
            time.sleep(POLL)
        raise RuntimeError(f"the load was not running after {deadline_s:g} s")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        return "\n".join(self.lines[-3:])


def new_pid(reader: Reader, uuid: str, known: set[int], deadline_s: float = 30.0) -> int:
    """The pid NVML lists on ``uuid`` that is not in ``known`` (NVML's pid, whatever the
    check's namespace calls the process)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        procs = reader.ask("procs").get(uuid)
        if isinstance(procs, list):
            fresh = [pid for pid, _ in procs if pid not in known]
            if fresh:
                return int(fresh[0])
        time.sleep(POLL)
    raise RuntimeError(f"no new process on {uuid} within {deadline_s:g} s")


def load_rows(result: Result, idle: Snapshot, load: Snapshot, uuid: str) -> None:
    """Under load: utilisation, power and SM activity moved up from idle."""
    idle_ref, load_ref = idle.reference[uuid], load.reference[uuid]
    gpu = str(load_ref.get("index"))
    index_idle, index_load = index_of(idle.samples), index_of(load.samples)

    def exported(index: dict, family: str, **labels: str) -> float | None:
        found = [v for lab, v in index.get(family, []) if lab.get("hw_id") == uuid
                 and all(lab.get(k) == x for k, x in labels.items())]
        return found[0] if len(found) == 1 else None

    checks = [("hw_gpu_utilization", {"hw_gpu_task": "general"}, 0.5, "above 0.5 under load"),
              ("nvidia_gpu_sm_activity", {}, 0.5, "above 0.5 under load")]
    for family, labels, floor, rule in checks:
        got = exported(index_load, family, **labels)
        if got is None and family == "nvidia_gpu_sm_activity" and refused(
                load_ref.get("gpm.sm", "ERR:")):
            continue  # no GPM on this GPU: compared as absent above
        result.add(Row("load", family, gpu, "moved", got, floor, rule,
                       got is not None and got > floor, source="load"))
    before = exported(index_idle, "hw_power_watts")
    after = exported(index_load, "hw_power_watts")
    result.add(Row("load", "hw_power_watts", gpu, "moved", after, before,
                   "20 W above idle", None not in (before, after) and after > before + 20,
                   source="load"))
    result.load["gpm_pynvml"] = {k: v for k, v in load_ref.items() if k.startswith("gpm.")}
    result.load["gpm_exported"] = {
        f: exported(index_load, f, **dict(lab)) for f, lab in (
            ("nvidia_gpu_sm_activity", ()), ("nvidia_gpu_graphics_activity", ()),
            ("nvidia_gpu_sm_occupancy", ()), ("nvidia_gpu_dram_activity", ()),
            ("nvidia_gpu_tensor_activity", (("nvidia_gpu_tensor_type", "any"),)),
            ("nvidia_gpu_tensor_activity", (("nvidia_gpu_tensor_type", "hmma"),)))}
    result.load["power_w"] = {"idle": before, "load": after}
    result.load["utilization"] = {"idle": exported(index_idle, "hw_gpu_utilization",
                                                   hw_gpu_task="general"),
                                  "load": exported(index_load, "hw_gpu_utilization",
                                                   hw_gpu_task="general")}
    del idle_ref
