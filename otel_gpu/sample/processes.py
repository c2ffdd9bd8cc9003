"""One device's compute processes and their utilization shares (process usage on).

Run on the device's worker thread; the outcome is left in the device's
:class:`~otel_gpu.sample.device.ProcessState`.
"""

from __future__ import annotations

from otel_gpu import nvml_abi as abi
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.outcomes import Outcomes
from otel_gpu.sample.readers import COMPUTE_PROCESSES
from otel_gpu.sample.sources import PROCESSES
from otel_gpu.sample.workers import DeviceWorker
from otel_gpu.snapshot import ProcessUsage

NO_INSTANCE = 0xFFFFFFFF
"""What NVML puts in a process's GPU instance id outside MIG mode."""
_SHARE_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
"""Per-process utilization, newest call first (the first arrived with R550)."""

Shares = dict[int, tuple[float, float, float, float]]


class ProcessReads:
    """Reads the compute processes of one device at a time."""

    def __init__(self, nvml: Nvml, outcomes: Outcomes) -> None:
        self._nvml = nvml
        self._m = nvml.module
        self._outcomes = outcomes

    @property
    def names(self) -> tuple[str, ...]:
        """What the process reads' failures are counted by."""
        return (COMPUTE_PROCESSES.name, *_SHARE_CALLS)

    def read(self, t: Tracked, values: dict[str, float], unsupported: list[str],
             worker: DeviceWorker) -> str | None:
        """The device's compute processes and their shares, left on ``t``; counts them too.

        A whole GPU in MIG mode lists its instances' processes as well, with their
        instance ids: those are left to the instances, so nothing is counted twice.
        """
        procs = t.procs
        procs.processes, procs.utilization = None, False
        if COMPUTE_PROCESSES.name in t.reads.unsupported:
            return None
        with worker.doing("compute processes"):
            res = self._nvml.call_list(self._m.nvmlDeviceGetComputeRunningProcesses, t.handle)
        if not res.ok:
            return self._outcomes.act(t, COMPUTE_PROCESSES.name, res, unsupported)
        values[PROCESSES.key] = len(res.value)
        memory: dict[int, int | None] = {}
        for info in res.value:
            instance = getattr(info, "gpuInstanceId", None)
            if not t.device.is_mig and instance is not None and instance != NO_INSTANCE:
                continue
            pid, used = int(info.pid), info.usedGpuMemory
            if pid not in memory:
                memory[pid] = None if used is None else int(used)
            elif used is not None:  # listed twice (several contexts): one process
                memory[pid] = (memory[pid] or 0) + int(used)
        shares, failure = self._shares(t, unsupported, worker)
        if failure is not None:
            return failure
        idle = (0.0, 0.0, 0.0, 0.0)
        procs.utilization = shares is not None
        procs.processes = tuple(
            ProcessUsage(pid, used, *(shares.get(pid, idle) if shares is not None
                                      else (None, None, None, None)))
            for pid, used in sorted(memory.items())
        )
        return None

    def _shares(self, t: Tracked, unsupported: list[str], worker: DeviceWorker,
                ) -> tuple[Shares | None, str | None]:
        """Per pid, (SM, memory controller, encoder, decoder) shares 0..1 since the last read.

        NVML returns a sample per busy process per driver sampling period newer than
        the timestamp passed; each process's samples are averaged, and a process
        without any was idle (0). ``None``: the device gives no per-process utilization.
        """
        m = self._m
        for what in _SHARE_CALLS:
            func = getattr(m, what, None)
            if func is None or what in t.reads.unsupported:
                continue
            with worker.doing(what):
                res = self._nvml.call_list(func, t.handle, t.procs.seen)
            if res.code == abi.NVML_ERROR_NOT_FOUND or (res.ok and not res.value):
                return {}, None  # no process was busy since the last read (or none runs)
            if not res.ok:
                failure = self._outcomes.act(t, what, res, unsupported)
                if failure is not None or what not in t.reads.unsupported:
                    return None, failure
                continue  # this driver lacks it: try the older call
            totals: dict[int, list[float]] = {}
            for row in res.value:
                shares = (row.smUtil, row.memUtil, row.encUtil, row.decUtil)
                if not all(0 <= share <= 100 for share in shares):
                    continue  # "not available" (all ones) or impossible: not a sample
                acc = totals.setdefault(int(row.pid), [0.0, 0.0, 0.0, 0.0, 0.0])
                for i, value in enumerate(shares):
                    acc[i] += float(value)
                acc[4] += 1
                t.procs.seen = max(t.procs.seen, int(row.timeStamp))
            return {pid: (acc[0] / acc[4] / 100, acc[1] / acc[4] / 100, acc[2] / acc[4] / 100,
                          acc[3] / acc[4] / 100) for pid, acc in totals.items()}, None
        return None, None
