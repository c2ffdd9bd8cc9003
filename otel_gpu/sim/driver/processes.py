"""The compute processes on a GPU, through NVML's two-call size-then-fill protocol.

A call with too small a buffer answers INSUFFICIENT_SIZE with the count it
needs, as the real driver does, so pynvml's retry runs for real. A whole GPU
in MIG mode lists its instances' processes too, with their instance ids.
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu.sim.driver._core import DriverCore, Fail, Target, c_symbol, deref
from otel_gpu.sim.scenario import NOT_AVAILABLE_ID, U64_MAX, Process, clamp


class ProcessSymbols(DriverCore):
    def _process_rows(self, target: Target, sample: int) -> list[tuple[Process, int, int]]:
        if target.mig is not None:
            instances = [target.mig]
            rows = []
        else:
            instances = list(target.gpu.mig)
            rows = [(p, NOT_AVAILABLE_ID, NOT_AVAILABLE_ID) for p in target.gpu.processes]
        for m in instances:
            rows.extend((p, m.gpu_instance_id, m.compute_instance_id) for p in m.processes)
        return [row for row in rows if row[0].listed_at(sample)]

    @c_symbol
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any,
                                                infos: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetComputeRunningProcesses_v3", handle)
        rows = self._process_rows(target, sample)
        count = deref(count_ref)
        if not rows:
            count.value = 0
            return
        if infos is None or count.value < len(rows):
            count.value = len(rows)
            raise Fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        k = target.gpu.position
        for i, (proc, gi, ci) in enumerate(rows):
            info = infos[i]
            info.pid = proc.pid
            info.usedGpuMemory = (U64_MAX if proc.used_memory is None
                                  else clamp(proc.used_memory.at(sample, k), U64_MAX - 1))
            info.gpuInstanceId = gi
            info.computeInstanceId = ci
        count.value = len(rows)
