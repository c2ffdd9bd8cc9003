"""The latency of each NVML function the collector calls: p50/p90 over a number of calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from otel_gpu import nvml_abi as abi


def latency(m: Any, h: Any, calls: int, symbols: list[str]) -> dict[str, Any]:
    """p50/p90 in microseconds of ``calls`` calls of each function (the collector's, as
    counted at the library, when ``symbols`` names them)."""
    fields = [(fid, 0) for fid in (
        abi.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, abi.NVML_FI_DEV_POWER_AVERAGE,
        abi.NVML_FI_DEV_MEMORY_TEMP, abi.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        abi.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, abi.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        abi.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, abi.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        abi.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, abi.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        abi.NVML_FI_DEV_REMAPPED_COR, abi.NVML_FI_DEV_REMAPPED_UNC,
        abi.NVML_FI_DEV_REMAPPED_PENDING,
        abi.NVML_FI_DEV_REMAPPED_FAILURE, abi.NVML_FI_DEV_PERF_POLICY_POWER,
        abi.NVML_FI_DEV_PERF_POLICY_THERMAL, abi.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION,
        abi.NVML_FI_DEV_POWER_REQUESTED_LIMIT, abi.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        abi.NVML_FI_DEV_POWER_DEFAULT_LIMIT, abi.NVML_FI_DEV_POWER_MIN_LIMIT,
        abi.NVML_FI_DEV_POWER_MAX_LIMIT)]
    table: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetCount_v2": m.nvmlDeviceGetCount,
        "nvmlDeviceGetHandleByIndex_v2": lambda: m.nvmlDeviceGetHandleByIndex(0),
        "nvmlDeviceGetUUID": lambda: m.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetMemoryInfo_v2": lambda: m.nvmlDeviceGetMemoryInfo(h, m.nvmlMemory_v2),
        "nvmlDeviceGetMemoryInfo": lambda: m.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetUtilizationRates": lambda: m.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetEncoderUtilization": lambda: m.nvmlDeviceGetEncoderUtilization(h),
        "nvmlDeviceGetDecoderUtilization": lambda: m.nvmlDeviceGetDecoderUtilization(h),
        "nvmlDeviceGetTemperature": lambda: m.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetTemperatureV": lambda: m.nvmlDeviceGetTemperatureV(h, 0),
        "nvmlDeviceGetPowerUsage": lambda: m.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: m.nvmlDeviceGetTotalEnergyConsumption(h),
        "nvmlDeviceGetFieldValues": lambda: m.nvmlDeviceGetFieldValues(h, fields),
        "nvmlDeviceGetClockInfo": lambda: m.nvmlDeviceGetClockInfo(h, abi.NVML_CLOCK_SM),
        "nvmlDeviceGetMaxClockInfo": lambda: m.nvmlDeviceGetMaxClockInfo(h, abi.NVML_CLOCK_SM),
        "nvmlDeviceGetPerformanceState": lambda: m.nvmlDeviceGetPerformanceState(h),
        "nvmlDeviceGetCurrentClocksEventReasons":
            lambda: m.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetComputeRunningProcesses_v3":
            lambda: m.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda: m.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda: m.nvmlDeviceGetCurrPcieLinkWidth(h),
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda: m.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "nvmlDeviceGetMaxPcieLinkWidth": lambda: m.nvmlDeviceGetMaxPcieLinkWidth(h),
        "nvmlDeviceGetPcieThroughput":
            lambda: m.nvmlDeviceGetPcieThroughput(h, abi.NVML_PCIE_UTIL_TX_BYTES),
        "nvmlDeviceGetRowRemapperHistogram": lambda: m.nvmlDeviceGetRowRemapperHistogram(h),
        "nvmlDeviceGetViolationStatus": lambda: m.nvmlDeviceGetViolationStatus(h, 0),
        "nvmlDeviceGetFanSpeed": lambda: m.nvmlDeviceGetFanSpeed(h),
        "nvmlDeviceGetNvLinkState": lambda: m.nvmlDeviceGetNvLinkState(h, 0),
        "nvmlDeviceGetNumaNodeId": lambda: m.nvmlDeviceGetNumaNodeId(h),
        "nvmlDeviceGetMigMode": lambda: m.nvmlDeviceGetMigMode(h),
        "nvmlDeviceGetPowerManagementLimit": lambda: m.nvmlDeviceGetPowerManagementLimit(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: m.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetProcessUtilization":
            lambda: m.nvmlDeviceGetProcessUtilization(h, int((time.time() - 1) * 1e6)),
        "nvmlGpmQueryDeviceSupport": lambda: m.nvmlGpmQueryDeviceSupport(h),
    }
    wanted = [s for s in symbols if s in table] or list(table)
    out: dict[str, Any] = {"calls": calls, "field_values_fields": len(fields),
                           "not_timed": sorted(s for s in symbols if s not in table)}
    timings: dict[str, Any] = {}
    for name in wanted:
        took, error = [], None
        for _ in range(calls):
            start = time.perf_counter()
            try:
                table[name]()
            except m.NVMLError as exc:
                error = str(exc)
            except AttributeError as exc:  # a function the installed binding lacks
                error = f"not in this nvidia-ml-py ({exc})"
            took.append((time.perf_counter() - start) * 1e6)
        took.sort()
        timings[name] = {"p50_us": took[len(took) // 2],
                         "p90_us": took[min(len(took) - 1, int(0.9 * len(took)))],
                         "error": error}
    out["functions"] = timings
    return out
