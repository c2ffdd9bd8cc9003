"""The reference reader as a child process, and the check's side of it.

:func:`reader_main` answers JSON requests on stdin with pynvml's readings on stdout; in
simulation it installs the simulator's driver first, and each read is taken at the
simulator sample the request names (the collector's). :class:`Reader` asks it one
request at a time, each answer awaited with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.device_check.latency import latency
from benchmarks.device_check.reference import Gpm, nvml_error, read_gpu, text
from benchmarks.device_check.specs import sources

ROOT = Path(__file__).resolve().parents[2]


def reader_main(simulate: str | None) -> int:
    """Serve requests until stdin closes."""
    import pynvml as m

    fake = None
    if simulate:
        from otel_gpu import sim

        fake = sim.FakeNvml(sim.load_scenario(simulate))
        sim.install(fake)
    m.nvmlInit()
    handles = [m.nvmlDeviceGetHandleByIndex(i) for i in range(m.nvmlDeviceGetCount())]
    gpm = Gpm(m, sources())
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = _serve(m, fake, handles, gpm, req)
        except Exception as exc:  # noqa: BLE001 - the check reports it, the reader goes on
            answer = {"error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _at_sample(m: Any, fake: Any, sample: int | None) -> None:
    """Put the simulator at ``sample``: its readings are a function of the sample number,
    which advances at each device count (the collector counts once per sample)."""
    if fake is None or sample is None:
        return
    with fake._lock:
        fake._sample = sample - 1
    m.nvmlDeviceGetCount()
    if fake.sample != sample:
        raise RuntimeError(f"the simulator is at sample {fake.sample}, not {sample}")


def _read(m: Any, handles: list[Any], gpm: Gpm, window: float) -> dict[str, Any]:
    """Every GPU's readings, GPM over ``window`` seconds from the start of the read."""
    started = time.monotonic()
    firsts: dict[int, Any] = {}
    for i, h in enumerate(handles):
        why = gpm.supported(h)
        if why is None:
            try:
                firsts[i] = gpm.begin(h)
            except m.NVMLError as exc:
                why = nvml_error(exc)
        firsts.setdefault(i, why)
    wanted = sources()
    gpus = {i: read_gpu(m, h, wanted) for i, h in enumerate(handles)}
    rest = started + window - time.monotonic()
    if rest > 0:
        time.sleep(rest)  # GPM's measurement window, not a wait for an event
    for i, h in enumerate(handles):
        first = firsts[i]
        if isinstance(first, str):
            gpus[i].update(gpm.refused_all(first))
            continue
        try:
            gpus[i].update(gpm.end(h, first))
        except m.NVMLError as exc:
            gpus[i].update(gpm.refused_all(nvml_error(exc)))
    return {"gpus": {g["uuid"]: g for g in gpus.values()}, "read_s": time.monotonic() - started}


def _proc_util(m: Any, h: Any, seconds: float) -> dict[str, Any]:
    since = int((time.time() - seconds) * 1e6)
    try:
        samples = m.nvmlDeviceGetProcessUtilization(h, since)
    except m.NVMLError as exc:
        return {"error_code": nvml_error(exc)}
    shares: dict[int, list[tuple[float, ...]]] = {}
    for s in samples:
        shares.setdefault(int(s.pid), []).append((s.smUtil, s.memUtil, s.encUtil, s.decUtil))
    return {str(pid): [statistics.fmean(x[i] for x in v) / 100 for i in range(4)]
            for pid, v in shares.items()}


def _serve(m: Any, fake: Any, handles: list[Any], gpm: Gpm, req: dict[str, Any]) -> Any:
    op = req["op"]
    if op == "hello":
        return {"driver": text(m.nvmlSystemGetDriverVersion()),
                "nvml": text(m.nvmlSystemGetNVMLVersion()),
                "pynvml": _pynvml_version(),
                "gpus": [{"index": i, "uuid": text(m.nvmlDeviceGetUUID(h)),
                          "name": text(m.nvmlDeviceGetName(h))}
                         for i, h in enumerate(handles)]}
    if op == "read":
        _at_sample(m, fake, req.get("sample"))
        return _read(m, handles, gpm, float(req.get("gpm_window", 0.5)))
    if op == "procs":
        _at_sample(m, fake, req.get("sample"))
        out: dict[str, Any] = {}
        for h in handles:
            try:
                out[text(m.nvmlDeviceGetUUID(h))] = [
                    [p.pid, p.usedGpuMemory] for p in m.nvmlDeviceGetComputeRunningProcesses(h)]
            except m.NVMLError as exc:
                out[text(m.nvmlDeviceGetUUID(h))] = nvml_error(exc)
        return out
    if op == "proc_util":
        _at_sample(m, fake, req.get("sample"))
        return _proc_util(m, handles[int(req["index"])], float(req.get("seconds", 2.0)))
    if op == "latency":
        return latency(m, handles[0], int(req["calls"]), req.get("symbols") or [])
    raise ValueError(f"unknown op {op!r}")


def _pynvml_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return "unknown"


class Reader:
    """The main process's side of :func:`reader_main`: one request at a time, bounded."""

    def __init__(self, simulate: str | None) -> None:
        argv = [sys.executable, "-m", "benchmarks.device_check", "_reader"]
        if simulate:
            argv += ["--simulate", simulate]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err = (self._err + [line.rstrip()])[-30:]

    def ask(self, op: str, timeout: float = 60.0, **kw: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the pynvml reader did not answer {op} in {timeout:g} s") \
                from None
        if not line:
            raise RuntimeError("the pynvml reader exited:\n" + "\n".join(self._err))
        answer = json.loads(line)
        if isinstance(answer, dict) and "error" in answer and "traceback" in answer:
            raise RuntimeError(f"the pynvml reader failed in {op}: {answer['traceback']}")
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
