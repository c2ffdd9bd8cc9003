"""A hand-written exporter that reads NVML itself: the baseline for what NVML reads cost.

``benchmarks.baselines``' ``promclient`` replays the collector's captured series and
reads no NVML, so it cannot show what one sample of a real driver costs. This one
is what a careful hand-written exporter does: pynvml read every ``--interval`` on
one thread (the device values most dashboards need, about 20 calls per GPU; the
static ones, the GPUs' identity and maximum clocks, read once at start), set into
prometheus_client Gauges and Counters, the body rendered on every request by
prometheus_client's own server (gzip when asked). Run it under
:mod:`benchmarks.launch` (``handwritten``), which counts its calls at the library
and marks each :meth:`Exporter.sample`.

:class:`SameReads` (``handwritten-same``) is the same kind of exporter reading what
otel-gpu reads from an H100 each sample: the same NVML calls with the same arguments
(31 fields and 18 NVLink link states in one batched call, 32 GPM metrics, the XID
event wait, the GPU count), each value one series. It is the baseline for otel-gpu's
fixed cost of a sample: with it, the difference is the collector's own work, not
what it reads. ``benchmarks/tests/test_benchmarks.py`` holds its calls to the collector's.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_gpu import nvml_abi as abi

LABELS = ("gpu", "uuid", "name")


def _safe(call: Callable[[], Any]) -> Any:
    """A value, or None where the GPU refuses it (a hand-written exporter skips those)."""
    import pynvml

    try:
        return call()
    except pynvml.NVMLError:
        return None


def _gauge(name: str, doc: str, *extra: str) -> Any:
    """A Gauge with the GPU's labels and ``extra``."""
    from prometheus_client import Gauge

    return Gauge(name, doc, (*LABELS, *extra))


class _PerGpu:
    """What both exporters read alike on every GPU: utilization (with the encoder and
    decoder), the four clocks, the P-state, the PCIe link, the clock event reasons and the
    compute processes, into the same families; and the set-up they share."""

    def __init__(self) -> None:
        import prometheus_client
        import pynvml

        prometheus_client.disable_created_metrics()
        for collector in list(prometheus_client.REGISTRY._collector_to_names):
            prometheus_client.REGISTRY.unregister(collector)  # no process/platform series
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.util = _gauge("gpu_utilization_ratio", "busy fraction", "engine")
        self.clock = _gauge("gpu_clock_hertz", "clock", "domain")
        self.pstate = _gauge("gpu_performance_state", "P-state")
        self.pcie = _gauge("gpu_pcie_link", "PCIe link", "what")
        self.procs = _gauge("gpu_processes", "compute processes")
        self.throttle = _gauge("gpu_clock_event_reasons", "clock event reasons bitmask")
        self.domains = {"sm": abi.NVML_CLOCK_SM, "memory": abi.NVML_CLOCK_MEM,
                        "graphics": abi.NVML_CLOCK_GRAPHICS, "video": abi.NVML_CLOCK_VIDEO}

    def _read_common(self, handle: Any, labels: tuple[str, ...]) -> None:
        m = self.nvml
        util = _safe(lambda: m.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            self.util.labels(*labels, "gpu").set(util.gpu / 100)
            self.util.labels(*labels, "memory").set(util.memory / 100)
        for engine, call in (("encoder", m.nvmlDeviceGetEncoderUtilization),
                             ("decoder", m.nvmlDeviceGetDecoderUtilization)):
            got = _safe(lambda c=call: c(handle))
            if got is not None:
                self.util.labels(*labels, engine).set(got[0] / 100)
        for domain, clock in self.domains.items():
            mhz = _safe(lambda c=clock: m.nvmlDeviceGetClockInfo(handle, c))
            if mhz is not None:
                self.clock.labels(*labels, domain).set(mhz * 1e6)
        pstate = _safe(lambda: m.nvmlDeviceGetPerformanceState(handle))
        if pstate is not None and pstate < 32:
            self.pstate.labels(*labels).set(pstate)
        for what, call in (("generation", m.nvmlDeviceGetCurrPcieLinkGeneration),
                           ("width", m.nvmlDeviceGetCurrPcieLinkWidth)):
            got = _safe(lambda c=call: c(handle))
            if got is not None:
                self.pcie.labels(*labels, what).set(got)
        reasons = _safe(lambda: m.nvmlDeviceGetCurrentClocksEventReasons(handle))
        if reasons is not None:
            self.throttle.labels(*labels).set(reasons)
        procs = _safe(lambda: m.nvmlDeviceGetComputeRunningProcesses(handle))
        if procs is not None:
            self.procs.labels(*labels).set(len(procs))


class Exporter(_PerGpu):
    """Every GPU's values, refreshed by :meth:`sample`."""

    def __init__(self) -> None:
        from prometheus_client import Counter

        super().__init__()
        pynvml = self.nvml
        self.gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            labels = (str(i), pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle))
            self.gpus.append((handle, labels))

        self.memory = _gauge("gpu_memory_bytes", "framebuffer", "state")
        self.temp = _gauge("gpu_temperature_celsius", "die temperature")
        self.power = _gauge("gpu_power_watts", "board power")
        self.energy = Counter("gpu_energy_joules", "energy since the driver loaded", LABELS)
        self.max_clock = _gauge("gpu_clock_max_hertz", "highest clock", "domain")
        self.limit = _gauge("gpu_power_limit_watts", "enforced power limit")
        self.ecc = _gauge("gpu_ecc_errors", "volatile ECC errors", "type")
        self.remap = _gauge("gpu_remapped_rows", "remapped rows", "type")
        self.fan = _gauge("gpu_fan_ratio", "fan speed")
        self._energy_seen: dict[str, float] = {}
        m = pynvml
        for handle, labels in self.gpus:
            for domain, clock in self.domains.items():
                mhz = _safe(lambda h=handle, c=clock: m.nvmlDeviceGetMaxClockInfo(h, c))
                if mhz is not None:
                    self.max_clock.labels(*labels, domain).set(mhz * 1e6)

    def sample(self) -> None:
        """One pass over every GPU."""
        m = self.nvml
        for handle, labels in self.gpus:
            mem = _safe(lambda h=handle: m.nvmlDeviceGetMemoryInfo(h, version=m.nvmlMemory_v2))
            if mem is not None:
                self.memory.labels(*labels, "used").set(mem.used)
                self.memory.labels(*labels, "total").set(mem.total)
            self._read_common(handle, labels)
            temp = _safe(lambda h=handle: m.nvmlDeviceGetTemperature(h, abi.NVML_TEMPERATURE_GPU))
            if temp is not None:
                self.temp.labels(*labels).set(temp)
            power = _safe(lambda h=handle: m.nvmlDeviceGetPowerUsage(h))
            if power is not None:
                self.power.labels(*labels).set(power / 1000)
            energy = _safe(lambda h=handle: m.nvmlDeviceGetTotalEnergyConsumption(h))
            if energy is not None:
                before = self._energy_seen.get(labels[1])
                if before is not None and energy >= before:
                    self.energy.labels(*labels).inc((energy - before) / 1000)
                self._energy_seen[labels[1]] = energy
            limit = _safe(lambda h=handle: m.nvmlDeviceGetEnforcedPowerLimit(h))
            if limit is not None:
                self.limit.labels(*labels).set(limit / 1000)
            for kind, error_type in (("corrected", m.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                     ("uncorrected", m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                got = _safe(lambda h=handle, t=error_type: m.nvmlDeviceGetTotalEccErrors(
                    h, t, m.NVML_VOLATILE_ECC))
                if got is not None:
                    self.ecc.labels(*labels, kind).set(got)
            rows = _safe(lambda h=handle: m.nvmlDeviceGetRemappedRows(h))
            if rows is not None:
                self.remap.labels(*labels, "corrected").set(rows[0])
                self.remap.labels(*labels, "uncorrected").set(rows[1])
            fan = _safe(lambda h=handle: m.nvmlDeviceGetFanSpeed(h))
            if fan is not None:
                self.fan.labels(*labels).set(fan / 100)


FIELDS = (
    "TOTAL_ENERGY_CONSUMPTION", "POWER_AVERAGE", "POWER_CURRENT_LIMIT",
    "POWER_REQUESTED_LIMIT", "POWER_DEFAULT_LIMIT", "POWER_MIN_LIMIT", "POWER_MAX_LIMIT",
    "MEMORY_TEMP", "ECC_SBE_VOL_TOTAL", "ECC_DBE_VOL_TOTAL", "ECC_SBE_AGG_TOTAL",
    "ECC_DBE_AGG_TOTAL", "REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING",
    "REMAPPED_FAILURE", "PCIE_REPLAY_COUNTER", "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES",
    "PERF_POLICY_POWER", "PERF_POLICY_THERMAL", "PERF_POLICY_SYNC_BOOST",
    "PERF_POLICY_BOARD_LIMIT", "PERF_POLICY_LOW_UTILIZATION", "PERF_POLICY_RELIABILITY",
    "NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
)
"""The device fields read in the batch (``NVML_FI_DEV_`` + name), scope 0."""
NVLINK_FIELDS = ("NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX")
"""The NVLink fields asked for every link at once (scope all ones)."""
LINKS = 18
"""An H100's NVLink links: each one's state is a field of the same batch."""
GPM = (
    "GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "HMMA_TENSOR_UTIL",
    "IMMA_TENSOR_UTIL", "DFMA_TENSOR_UTIL", "DMMA_TENSOR_UTIL", "FP64_UTIL", "FP32_UTIL",
    "FP16_UTIL", "INTEGER_UTIL", "DRAM_BW_UTIL", "PCIE_RX_PER_SEC", "PCIE_TX_PER_SEC",
    "NVLINK_TOTAL_RX_PER_SEC", "NVLINK_TOTAL_TX_PER_SEC",
    *(f"NVDEC_{i}_UTIL" for i in range(7)), *(f"NVJPG_{i}_UTIL" for i in range(7)),
    "NVOFA_0_UTIL",
)
"""The GPM metrics asked for between two samples (``NVML_GPM_METRIC_`` + name)."""
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class SameReads(_PerGpu):
    """What otel-gpu reads from each GPU every sample, read by hand into prometheus_client.

    Values NVML refuses are skipped, as a hand-written exporter does; nothing is
    checked against bounds or sentinels (otel-gpu's work, not the baseline's).
    """

    def __init__(self) -> None:
        from prometheus_client import Gauge

        super().__init__()
        m = self.nvml
        self.events = m.nvmlEventSetCreate()
        self.gpus: list[tuple[Any, tuple[str, ...], list[Any]]] = []
        for i in range(m.nvmlDeviceGetCount()):
            handle = m.nvmlDeviceGetHandleByIndex(i)
            labels = (str(i), m.nvmlDeviceGetUUID(handle), m.nvmlDeviceGetName(handle))
            _safe(lambda h=handle: m.nvmlDeviceRegisterEvents(
                h, m.nvmlEventTypeXidCriticalError, self.events))
            gpm = [m.nvmlGpmSampleAlloc(), m.nvmlGpmSampleAlloc()]
            self.gpus.append((handle, labels, gpm))
        self.requests = (
            [(getattr(abi, f"NVML_FI_DEV_{name}"), 0) for name in FIELDS]
            + [(getattr(abi, f"NVML_FI_DEV_{name}"), 0xFFFFFFFF) for name in NVLINK_FIELDS]
            + [(abi.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(LINKS)])
        self.names = ([name.lower() for name in FIELDS + NVLINK_FIELDS]
                      + ["nvlink_state"] * LINKS)
        self.gpm_ids = [getattr(abi, f"NVML_GPM_METRIC_{name}") for name in GPM]
        self.gpm_names = [name.lower() for name in GPM]
        self.field = {name: Gauge(f"gpu_{name}", name,
                                  (*LABELS, "link") if name == "nvlink_state" else LABELS)
                      for name in dict.fromkeys(self.names)}
        self.gpm = _gauge("gpu_gpm", "GPM metrics", "metric")
        self.memory = _gauge("gpu_memory_bytes", "framebuffer", "state")
        self.temp = _gauge("gpu_temperature_celsius", "die temperature")
        self.xid = _gauge("gpu_xid_last", "the last XID")
        self.count = Gauge("gpu_count", "GPUs NVML reports", ())
        self.previous: dict[int, Any] = {}

    def sample(self) -> None:
        """One pass: the node's calls, then every GPU."""
        m = self.nvml
        self.count.set(m.nvmlDeviceGetCount())
        try:
            event = m.nvmlEventSetWait_v2(self.events, 0)
        except m.NVMLError:
            event = None  # the usual answer: no event waiting
        if event is not None:
            where = ctypes.cast(event.device, ctypes.c_void_p).value
            for handle, labels, _ in self.gpus:
                if ctypes.cast(handle, ctypes.c_void_p).value == where:
                    self.xid.labels(*labels).set(event.eventData)
        for n, (handle, labels, gpm) in enumerate(self.gpus):
            entries = _safe(lambda h=handle: m.nvmlDeviceGetFieldValues(h, self.requests))
            for (_, scope), name, entry in zip(self.requests, self.names, entries or (),
                                               strict=False):
                if entry.nvmlReturn == abi.NVML_SUCCESS and entry.valueType < len(_VALUE_MEMBERS):
                    value = getattr(entry.value, _VALUE_MEMBERS[entry.valueType])
                    series = (*labels, str(scope)) if name == "nvlink_state" else labels
                    self.field[name].labels(*series).set(value)
            mem = _safe(lambda h=handle: m.nvmlDeviceGetMemoryInfo(h, version=m.nvmlMemory_v2))
            if mem is not None:
                for state in ("total", "used", "free", "reserved"):
                    self.memory.labels(*labels, state).set(getattr(mem, state))
            # the versioned call where the binding has it (nvidia-ml-py 13), as the collector
            temperature = getattr(m, "nvmlDeviceGetTemperatureV", m.nvmlDeviceGetTemperature)
            temp = _safe(lambda h=handle, t=temperature: t(h, abi.NVML_TEMPERATURE_GPU))
            if temp is not None:
                self.temp.labels(*labels).set(temp)
            self._read_common(handle, labels)
            self._gpm(n, handle, labels, gpm)

    def _gpm(self, n: int, handle: Any, labels: tuple[str, ...], buffers: list[Any]) -> None:
        """A GPM sample into the buffer not holding the last one; the metrics between them."""
        m = self.nvml
        previous = self.previous.get(n)
        current = buffers[1] if previous is buffers[0] else buffers[0]
        if _safe(lambda: m.nvmlGpmSampleGet(handle, current)) is None:
            self.previous.pop(n, None)
            return
        self.previous[n] = current
        if previous is None:
            return
        request = m.c_nvmlGpmMetricsGet_t()
        request.version = abi.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.gpm_ids)
        request.sample1 = previous
        request.sample2 = current
        for i, metric in enumerate(self.gpm_ids):
            request.metrics[i].metricId = metric
        if _safe(lambda: m.nvmlGpmMetricsGet(request)) is None:
            return
        for i, name in enumerate(self.gpm_names):
            entry = request.metrics[i]
            if entry.nvmlReturn == abi.NVML_SUCCESS:
                self.gpm.labels(*labels, name).set(entry.value)


def serve(interval: float, announce: Callable[[int], None], same: bool = False) -> int:
    """Sample every ``interval`` seconds on a thread; serve on a port the kernel picks,
    handed to ``announce`` once the first sample is in (the body is complete from then).
    ``same``: :class:`SameReads`, else :class:`Exporter`."""
    from prometheus_client import start_http_server

    exporter = SameReads() if same else Exporter()
    exporter.sample()

    def loop() -> None:
        next_at = time.monotonic()
        while True:
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))  # the sampling period
            exporter.sample()

    threading.Thread(target=loop, daemon=True, name="handwritten-sampler").start()
    server, _ = start_http_server(0, addr="127.0.0.1")
    announce(server.server_port)
    threading.Event().wait()
    return 0
