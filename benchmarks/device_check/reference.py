"""The reference: every value otel-gpu exports for one GPU, read with plain pynvml calls.

Each catalog source (:func:`benchmarks.device_check.specs.sources`) is read alone, by the
first way that gives a value: the check's own plain call where :func:`plain_ways` has one
(the field value as a second way where the source is a field), else the source's field
read alone (the collector batches them), else GPM over the check's own window
(:class:`Gpm`), else the collector's own reader function for it: a source with a new plain
call is compared from the day it is in the catalog, through the collector's code until a
way of the check's own is added here (those rows say so in their source column).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sample.readers import NVLINK_STATES, Reader
from otel_gpu.sample.sources import ALL_LINKS, NvLink, Source

COLLECTORS_READER = "pynvml, the collector's reader"
"""The source column of a row read with the collector's own reader function."""


def nvml_error(exc: BaseException) -> str:
    return f"ERR:{exc}"


def refused(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("ERR:")


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def field_way(m: Any, handle: Any, field_id: int, scope: int = 0) -> Callable[[], Any]:
    """A way that reads one field value alone."""
    def read() -> Any:
        (value,) = m.nvmlDeviceGetFieldValues(handle, [(field_id, scope)])
        if value.nvmlReturn != abi.NVML_SUCCESS:
            raise m.NVMLError(value.nvmlReturn)
        union = value.value
        return {abi.NVML_VALUE_TYPE_DOUBLE: union.dVal,
                abi.NVML_VALUE_TYPE_UNSIGNED_INT: union.uiVal,
                abi.NVML_VALUE_TYPE_UNSIGNED_LONG: union.ulVal,
                abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: union.ullVal,
                abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG: union.sllVal}.get(value.valueType,
                                                                        union.ullVal)
    return read


def take(m: Any, *ways: Callable[[], Any]) -> Any:
    """The first way's value that NVML gives, else the most telling error as ``ERR:`` text."""
    first_error = None
    for way in ways:
        try:
            return way()
        except m.NVMLError as exc:
            if first_error is None or "Function Not Found" in first_error:
                first_error = nvml_error(exc)
    return first_error or "ERR:no way to read it"


def _clocks(m: Any, h: Any) -> dict[str, Callable[[], Any]]:
    out: dict[str, Callable[[], Any]] = {}
    for domain, clock in (("sm", abi.NVML_CLOCK_SM), ("memory", abi.NVML_CLOCK_MEM),
                          ("graphics", abi.NVML_CLOCK_GRAPHICS), ("video", abi.NVML_CLOCK_VIDEO)):
        out[f"clock.{domain}"] = lambda c=clock: m.nvmlDeviceGetClockInfo(h, c)
        out[f"clock.max.{domain}"] = lambda c=clock: m.nvmlDeviceGetMaxClockInfo(h, c)
    return out


def plain_ways(m: Any, h: Any) -> dict[str, Callable[[], Any]]:
    """The check's own plain call for a source key, where it has one: the call NVML's
    documentation gives for the value, not the collector's code."""
    def memory(attr: str) -> Callable[[], Any]:
        def read() -> Any:
            try:
                mem = m.nvmlDeviceGetMemoryInfo(h, version=m.nvmlMemory_v2)
            except m.NVMLError:
                mem = m.nvmlDeviceGetMemoryInfo(h)
            if not hasattr(mem, attr):
                raise m.NVMLError(abi.NVML_ERROR_NOT_SUPPORTED)  # v1 has no reserved
            return getattr(mem, attr)
        return read

    def remapped(i: int) -> Callable[[], Any]:
        return lambda: int(m.nvmlDeviceGetRemappedRows(h)[i])

    def ecc(error: int, counter: int) -> Callable[[], Any]:
        return lambda: m.nvmlDeviceGetTotalEccErrors(h, error, counter)

    ways: dict[str, Callable[[], Any]] = {
        "memory.total": memory("total"), "memory.used": memory("used"),
        "memory.free": memory("free"), "memory.reserved": memory("reserved"),
        "util.gpu": lambda: m.nvmlDeviceGetUtilizationRates(h).gpu,
        "util.memory": lambda: m.nvmlDeviceGetUtilizationRates(h).memory,
        "util.encoder": lambda: m.nvmlDeviceGetEncoderUtilization(h)[0],
        "util.decoder": lambda: m.nvmlDeviceGetDecoderUtilization(h)[0],
        "temp.gpu": lambda: m.nvmlDeviceGetTemperature(h, abi.NVML_TEMPERATURE_GPU),
        "power": lambda: m.nvmlDeviceGetPowerUsage(h),
        "energy": lambda: m.nvmlDeviceGetTotalEnergyConsumption(h),
        "pstate": lambda: m.nvmlDeviceGetPerformanceState(h),
        "power.limit.current": lambda: m.nvmlDeviceGetPowerManagementLimit(h),
        "power.limit.enforced": lambda: m.nvmlDeviceGetEnforcedPowerLimit(h),
        "power.limit.default": lambda: m.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "power.limit.min": lambda: m.nvmlDeviceGetPowerManagementLimitConstraints(h)[0],
        "power.limit.max": lambda: m.nvmlDeviceGetPowerManagementLimitConstraints(h)[1],
        "pcie.link.gen": lambda: m.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie.link.gen.max": lambda: m.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie.link.width": lambda: m.nvmlDeviceGetCurrPcieLinkWidth(h),
        "pcie.link.width.max": lambda: m.nvmlDeviceGetMaxPcieLinkWidth(h),
        "pcie.replay": lambda: m.nvmlDeviceGetPcieReplayCounter(h),
        "pcie.throughput.rx": lambda: m.nvmlDeviceGetPcieThroughput(
            h, abi.NVML_PCIE_UTIL_RX_BYTES),
        "pcie.throughput.tx": lambda: m.nvmlDeviceGetPcieThroughput(
            h, abi.NVML_PCIE_UTIL_TX_BYTES),
        "clock.reasons": lambda: _reasons(m, h),
        "fan": lambda: m.nvmlDeviceGetFanSpeed(h),
        "remap.corrected": remapped(0), "remap.uncorrected": remapped(1),
        "remap.pending": remapped(2), "remap.failure": remapped(3),
        "retired.sbe": lambda: len(m.nvmlDeviceGetRetiredPages(
            h, m.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
        "retired.dbe": lambda: len(m.nvmlDeviceGetRetiredPages(
            h, m.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
        "retired.pending": lambda: int(m.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        "ecc.corrected": ecc(m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_VOLATILE_ECC),
        "ecc.uncorrected": ecc(m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC),
        "ecc.corrected.aggregate": ecc(m.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                       m.NVML_AGGREGATE_ECC),
        "ecc.uncorrected.aggregate": ecc(m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                         m.NVML_AGGREGATE_ECC),
        "processes": lambda: len(m.nvmlDeviceGetComputeRunningProcesses(h)),
        **_clocks(m, h),
    }
    for name in ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
                 "reliability"):
        policy = getattr(abi, f"NVML_PERF_POLICY_{name.upper()}")
        ways[f"violation.{name}"] = (
            lambda p=policy: m.nvmlDeviceGetViolationStatus(h, p).violationTime)
    for bucket in ("max", "high", "partial", "low", "none"):
        ways[f"remap.banks.{bucket}"] = (
            lambda b=bucket: getattr(m.nvmlDeviceGetRowRemapperHistogram(h), b))
    return ways


def _reasons(m: Any, h: Any) -> Any:
    try:
        return m.nvmlDeviceGetCurrentClocksEventReasons(h)
    except m.NVMLError:
        return m.nvmlDeviceGetCurrentClocksThrottleReasons(h)


def not_available(value: Any) -> Any:
    """NVML's "not available" all-ones answered with SUCCESS: an absent series."""
    if isinstance(value, int) and value in ((1 << 32) - 1, (1 << 64) - 1):
        return "ERR:not available (all ones)"
    return value


def read_gpu(m: Any, handle: Any, sources: Iterable[Source]) -> dict[str, Any]:
    """Every non-GPM source of one GPU (GPM: :class:`Gpm`), and the GPU's identity; the
    keys read through the collector's reader listed under ``_collectors_reader``."""
    out: dict[str, Any] = {
        "uuid": take(m, lambda: text(m.nvmlDeviceGetUUID(handle))),
        "name": take(m, lambda: text(m.nvmlDeviceGetName(handle))),
        "index": take(m, lambda: m.nvmlDeviceGetIndex(handle)),
        "serial": take(m, lambda: text(m.nvmlDeviceGetSerial(handle))),
        "pci_bus_id": take(m, lambda: text(m.nvmlDeviceGetPciInfo(handle).busId)),
        "numa": take(m, lambda: m.nvmlDeviceGetNumaNodeId(handle)),
    }
    ways = plain_ways(m, handle)
    links = _nvlinks(m, handle)
    theirs: list[str] = []
    by_reader: dict[Reader, dict[str, Any] | str] = {}  # readers compare by identity
    wanted = [s for s in sources if not s.gpm]
    for src in wanted:
        if src.nvlink is not None and isinstance(links, str):
            out[src.key] = links
        elif src.field_id is not None:
            scope = ALL_LINKS if src.nvlink is NvLink.LINKS else 0
            field = field_way(m, handle, src.field_id, scope)
            own = ways.get(src.key)
            out[src.key] = take(m, own, field) if own else take(m, field)
        elif src.reader is NVLINK_STATES:
            out[src.key] = links
        elif src.key in ways:
            out[src.key] = take(m, ways[src.key])
        elif src.reader is not None:
            reader = src.reader
            if reader not in by_reader:
                try:
                    by_reader[reader] = dict(reader.read(m, handle))
                except m.NVMLError as exc:
                    by_reader[reader] = nvml_error(exc)
            answer = by_reader[reader]
            out[src.key] = (answer if isinstance(answer, str)
                            else answer.get(src.key, "ERR:the reader gives none"))
            theirs.append(src.key)
    for src in wanted:  # a call standing in for others: read only where they are refused
        stands_for = [k for k in getattr(src.reader, "fallback_for", ()) if k != src.key]
        if stands_for and not any(refused(out.get(k, "ERR:")) for k in stands_for):
            out[src.key] = f"ERR:{', '.join(stands_for)} read instead"
    if out.get("pstate") is not None and not refused(out["pstate"]) and out["pstate"] >= 16:
        out["pstate"] = "ERR:unknown P-state"
    for src in wanted:
        out[src.key] = not_available(out[src.key])
    out["_collectors_reader"] = theirs
    out["state"] = _state(out)
    return out


def _nvlinks(m: Any, handle: Any) -> int | str:
    """Active NVLink links, or why there is no NVLink series."""
    active = 0
    for link in range(abi.NVML_NVLINK_MAX_LINKS):
        try:
            active += int(m.nvmlDeviceGetNvLinkState(handle, link) == abi.NVML_FEATURE_ENABLED)
        except m.NVMLError as exc:
            if link == 0:
                return nvml_error(exc)
            break
    return active or "ERR:no active link"


def _state(out: dict[str, Any]) -> str:
    """The device state hw_status must show, from what the reference read."""
    def flag(key: str) -> bool:
        return out.get(key) == 1

    if flag("remap.failure"):
        return "predicted_failure"
    if flag("remap.pending") or flag("retired.pending"):
        return "degraded"
    return "ok"


class Gpm:
    """pynvml's own GPM for the catalog's GPM sources: two samples of a GPU and the metrics
    between them, a source's ids averaged over those that answer (one per engine)."""

    def __init__(self, m: Any, sources: Iterable[Source]) -> None:
        self.m = m
        self.sources = [s for s in sources if s.gpm]
        self.ids = list(dict.fromkeys(i for s in self.sources for i in s.gpm))

    def supported(self, handle: Any) -> str | None:
        """None when the GPU has GPM, else why not."""
        try:
            ok = self.m.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
        except self.m.NVMLError as exc:
            return nvml_error(exc)
        return None if ok else "ERR:no GPM (before Hopper)"

    def begin(self, handle: Any) -> Any:
        buf = self.m.nvmlGpmSampleAlloc()
        self.m.nvmlGpmSampleGet(handle, buf)
        return buf

    def end(self, handle: Any, first: Any) -> dict[str, Any]:
        m = self.m
        second = m.nvmlGpmSampleAlloc()
        try:
            m.nvmlGpmSampleGet(handle, second)
            answers: dict[int, Any] = {}
            for start in range(0, len(self.ids), 98):  # NVML_GPM_METRIC_MAX per request
                chunk = self.ids[start:start + 98]
                req = m.c_nvmlGpmMetricsGet_t()
                req.version = abi.NVML_GPM_METRICS_GET_VERSION
                req.numMetrics = len(chunk)
                req.sample1, req.sample2 = first, second
                for i, metric in enumerate(chunk):
                    req.metrics[i].metricId = metric
                m.nvmlGpmMetricsGet(req)
                for i, metric in enumerate(chunk):
                    entry = req.metrics[i]
                    answers[metric] = (entry.value if entry.nvmlReturn == abi.NVML_SUCCESS
                                       else f"ERR:{m.nvmlErrorString(entry.nvmlReturn)}")
            return self.keys(answers)
        finally:
            m.nvmlGpmSampleFree(second)
            m.nvmlGpmSampleFree(first)

    def keys(self, answers: dict[int, Any]) -> dict[str, Any]:
        """Per GPM source, the mean of its ids' answers, else the first refusal."""
        out = {}
        for src in self.sources:
            got = [answers[i] for i in src.gpm if not refused(answers.get(i, "ERR:"))]
            out[src.key] = (statistics.fmean(got) if got
                            else answers.get(src.gpm[0], "ERR:not asked"))
        return out

    def refused_all(self, why: str) -> dict[str, Any]:
        return self.keys(dict.fromkeys(self.ids, why))
