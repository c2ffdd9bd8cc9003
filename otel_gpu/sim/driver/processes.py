"""The compute processes on a GPU, through NVML's two-call size-then-fill protocol.

A call with too small a buffer answers INSUFFICIENT_SIZE with the count it
needs, as the real driver does, so pynvml's retry runs for real. A whole GPU
in MIG mode lists its instances' processes too, with their instance ids.

Per-process utilization (``nvmlDeviceGetProcessUtilization`` and its
successor ``nvmlDeviceGetProcessesUtilizationInfo``) returns one sample per
busy process per sample, stamped :data:`EPOCH_US` + sample seconds, when
newer than the caller's last-seen timestamp; nothing newer is NOT_FOUND, as on
a real driver. Neither answers in MIG mode.
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, Target, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import NOT_AVAILABLE_ID, U32_MAX, U64_MAX, Process, clamp

EPOCH_US = 1_700_000_000_000_000
"""The timestamp (microseconds) of sample 0's utilization samples; each sample adds a second."""
SAMPLE_US = 1_000_000


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

    @c_symbol(mig=True)
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
            raise Fail(abi.NVML_ERROR_INSUFFICIENT_SIZE)
        k = target.gpu.position
        for i, (proc, gi, ci) in enumerate(rows):
            info = infos[i]
            info.pid = proc.pid
            info.usedGpuMemory = (U64_MAX if proc.used_memory is None
                                  else clamp(proc.used_memory.at(sample, k), U64_MAX - 1))
            info.gpuInstanceId = gi
            info.computeInstanceId = ci
        count.value = len(rows)

    def _utilization_rows(self, symbol: str, handle: Any,
                          last_seen: int) -> list[tuple[int, int, tuple[int, ...]]]:
        """``(timestamp, pid, (sm, mem, enc, dec))`` per busy process newer than ``last_seen``."""
        target, sample = self.check_device(symbol, handle)
        if target.gpu.mig:  # NVML has no per-process utilization in MIG mode
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        stamp = EPOCH_US + sample * SAMPLE_US
        k = target.gpu.position
        rows = [
            (stamp, proc.pid, tuple(0 if v is None else clamp(v.at(sample, k), U32_MAX)
                                    for v in proc.utilization))
            for proc in target.gpu.processes
            if proc.listed_at(sample) and any(v is not None for v in proc.utilization)
        ]
        if stamp <= last_seen or not rows:
            raise Fail(abi.NVML_ERROR_NOT_FOUND)
        return rows

    @c_symbol
    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count_ref: Any,
                                        last_seen: Any) -> None:
        rows = self._utilization_rows("nvmlDeviceGetProcessUtilization", handle,
                                      arg_int(last_seen))
        count = deref(count_ref)
        if samples is None or count.value < len(rows):
            count.value = len(rows)
            raise Fail(abi.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (stamp, pid, (sm, mem, enc, dec)) in enumerate(rows):
            out = samples[i]
            out.pid, out.timeStamp = pid, stamp
            out.smUtil, out.memUtil, out.encUtil, out.decUtil = sm, mem, enc, dec
        count.value = len(rows)

    @c_symbol
    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, info_ref: Any) -> None:
        info = deref(info_ref)
        if info.version != pynvml.ProcessesUtilizationInfo_v1:
            self.check_device("nvmlDeviceGetProcessesUtilizationInfo", handle)
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        rows = self._utilization_rows("nvmlDeviceGetProcessesUtilizationInfo", handle,
                                      int(info.lastSeenTimeStamp))
        if not info.procUtilArray or info.processSamplesCount < len(rows):
            info.processSamplesCount = len(rows)
            raise Fail(abi.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (stamp, pid, (sm, mem, enc, dec)) in enumerate(rows):
            out = info.procUtilArray[i]
            out.timeStamp, out.pid = stamp, pid
            out.smUtil, out.memUtil, out.encUtil, out.decUtil = sm, mem, enc, dec
            out.jpgUtil = out.ofaUtil = 0
        info.processSamplesCount = len(rows)
