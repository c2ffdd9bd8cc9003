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
otel-gpu reads each sample, the same NVML calls with the same arguments, each value one
series. Its reads derive from the catalog's sources (:func:`read_plan`): every field in
one batched call (the NVLink ones at the all-links scope, with the link states), every
GPM metric, each plain call through the collector's own reader function (the calls read
once, the stand-ins and those read only when another value moves left out, as the
collector leaves them out of its steady state), and what the GPU refuses dropped after
the first answer; then the XID event wait and the GPU count, the sampler's own calls. It
is the baseline for otel-gpu's fixed cost of a sample: with it, the difference is the
collector's own work, not what it reads. ``benchmarks/tests/test_benchmarks.py`` holds
its calls to the collector's, so a new catalog metric needs no edit here.
"""
from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_gpu import nvml_abi as abi

if TYPE_CHECKING:
    from otel_gpu.sample.readers import Reader
    from otel_gpu.sample.sources import Source

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


def _start() -> Any:
    """pynvml, initialised, and prometheus_client's registry emptied (no process or
    platform series, no ``_created``): the set-up both exporters share."""
    import prometheus_client
    import pynvml

    prometheus_client.disable_created_metrics()
    for collector in list(prometheus_client.REGISTRY._collector_to_names):
        prometheus_client.REGISTRY.unregister(collector)
    pynvml.nvmlInit()
    return pynvml


class _PerGpu:
    """What the usual exporter reads on every GPU besides memory, temperature and power:
    utilization (with the encoder and decoder), the four clocks, the P-state, the PCIe link,
    the clock event reasons and the compute processes."""

    def __init__(self) -> None:
        self.nvml = _start()
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


_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _series(key: str) -> str:
    return "gpu_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def read_plan() -> tuple[list[Source], list[int], list[Reader]]:
    """What otel-gpu reads of a GPU each sample in its steady state, from the catalog's
    sources: the batched fields, the GPM metric ids, and the readers of the plain calls
    (not the ones read once, the stand-ins for a refused field, those read again only when
    another value moves, nor the NVLink link states, which come in the batch)."""
    from otel_gpu.instrument.catalog import all_sources
    from otel_gpu.sample.readers import NVLINK_STATES

    sources = all_sources()
    fields = [s for s in sources if s.field_id is not None]
    gpm = list(dict.fromkeys(i for s in sources for i in s.gpm))
    readers = [r for r in dict.fromkeys(s.reader for s in sources if s.reader is not None)
               if r is not None and r is not NVLINK_STATES and not r.static
               and not r.fallback_for and not r.changes_with]
    return fields, gpm, readers


class _Gpu:
    """One GPU's handle and labels, and what is asked of it: the batch's (field id, scope)
    pairs, the GPM ids and the plain calls, each dropped once the GPU refuses it."""

    def __init__(self, m: Any, handle: Any, labels: tuple[str, ...],
                 plan: tuple[list[Source], list[int], list[Reader]]) -> None:
        from otel_gpu.sample.readers import LINK_COUNT, NVLINK_STATES
        from otel_gpu.sample.sources import ALL_LINKS, NVLINK_STATE, NvLink

        fields, self.gpm_ids, readers = plan
        self.handle, self.labels, self.readers = handle, labels, list(readers)
        links = _safe(lambda: NVLINK_STATES.read(m, handle)) or {}
        count, active = int(links.get(LINK_COUNT, 0)), bool(links.get("nvlink.active"))
        self.requests = [(s.field_id, ALL_LINKS if s.nvlink is NvLink.LINKS else 0)
                         for s in fields if s.nvlink is None or active]
        self.requests += [(NVLINK_STATE.field_id, link) for link in range(count)]
        self.names = [_series(s.key) for s in fields if s.nvlink is None or active]
        self.names += ["gpu_nvlink_state"] * count
        self.gpm = [m.nvmlGpmSampleAlloc(), m.nvmlGpmSampleAlloc()]
        self.previous: Any = None


class SameReads:
    """What otel-gpu reads from each GPU every sample, read by hand into prometheus_client.

    Values NVML refuses are skipped, as a hand-written exporter does; nothing is
    checked against bounds or sentinels (otel-gpu's work, not the baseline's).
    """

    def __init__(self) -> None:
        from prometheus_client import Gauge

        m = self.nvml = _start()
        self._refused = _refusal(m)
        self.events = m.nvmlEventSetCreate()
        plan = read_plan()
        self.gpus: list[_Gpu] = []
        for i in range(m.nvmlDeviceGetCount()):
            handle = m.nvmlDeviceGetHandleByIndex(i)
            labels = (str(i), m.nvmlDeviceGetUUID(handle), m.nvmlDeviceGetName(handle))
            _safe(lambda h=handle: m.nvmlDeviceRegisterEvents(
                h, m.nvmlEventTypeXidCriticalError, self.events))
            self.gpus.append(_Gpu(m, handle, labels, plan))
        self.families: dict[str, Any] = {}
        self.link_state = _gauge("gpu_nvlink_state", "NVLink link state", "link")
        self.gpm = _gauge("gpu_gpm", "GPM metrics", "metric")
        self.xid = _gauge("gpu_xid_last", "the last XID")
        self.count = Gauge("gpu_count", "GPUs NVML reports", ())

    def _set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _gauge(name, name)
        family.labels(*labels).set(value)

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
            for gpu in self.gpus:
                if ctypes.cast(gpu.handle, ctypes.c_void_p).value == where:
                    self.xid.labels(*gpu.labels).set(event.eventData)
        for gpu in self.gpus:
            self._fields(gpu)
            for reader in list(gpu.readers):
                try:
                    values = reader.read(m, gpu.handle)
                except m.NVMLError as exc:
                    if self._refused(exc.value):
                        gpu.readers.remove(reader)
                    continue
                for key, value in values.items():
                    self._set(_series(key), gpu.labels, value)
            self._gpm(gpu)

    def _fields(self, gpu: _Gpu) -> None:
        """The batch; a field the GPU refuses is not asked again."""
        m = self.nvml
        if not gpu.requests:
            return
        entries = _safe(lambda: m.nvmlDeviceGetFieldValues(gpu.handle, gpu.requests))
        kept: list[int] = []
        for i, ((_, scope), name, entry) in enumerate(zip(gpu.requests, gpu.names,
                                                           entries or (), strict=False)):
            if entry.nvmlReturn != abi.NVML_SUCCESS:
                if not self._refused(entry.nvmlReturn):
                    kept.append(i)
                continue
            kept.append(i)
            if entry.valueType < len(_VALUE_MEMBERS):
                value = getattr(entry.value, _VALUE_MEMBERS[entry.valueType])
                if name == "gpu_nvlink_state":
                    self.link_state.labels(*gpu.labels, str(scope)).set(value)
                else:
                    self._set(name, gpu.labels, value)
        if entries is not None and len(kept) < len(gpu.requests):
            gpu.requests = [gpu.requests[i] for i in kept]
            gpu.names = [gpu.names[i] for i in kept]

    def _gpm(self, gpu: _Gpu) -> None:
        """A GPM sample into the buffer not holding the last one; the metrics between them
        (a metric the GPU refuses is not asked again)."""
        m = self.nvml
        previous = gpu.previous
        current = gpu.gpm[1] if previous is gpu.gpm[0] else gpu.gpm[0]
        if not gpu.gpm_ids or _safe(lambda: m.nvmlGpmSampleGet(gpu.handle, current)) is None:
            gpu.previous = None
            return
        gpu.previous = current
        if previous is None:
            return
        request = m.c_nvmlGpmMetricsGet_t()
        request.version = abi.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(gpu.gpm_ids)
        request.sample1 = previous
        request.sample2 = current
        for i, metric in enumerate(gpu.gpm_ids):
            request.metrics[i].metricId = metric
        if _safe(lambda: m.nvmlGpmMetricsGet(request)) is None:
            return
        refused = set()
        for i, metric in enumerate(gpu.gpm_ids):
            entry = request.metrics[i]
            if entry.nvmlReturn == abi.NVML_SUCCESS:
                self.gpm.labels(*gpu.labels, str(metric)).set(entry.value)
            elif self._refused(entry.nvmlReturn):
                refused.add(metric)
        gpu.gpm_ids = [i for i in gpu.gpm_ids if i not in refused]


def _refusal(m: Any) -> Callable[[int], bool]:
    """Whether an NVML return code says the GPU does not give the value (the collector's
    own classification: it then stops asking)."""
    from otel_gpu.sample.library import Outcome, classify

    return lambda code: classify(int(code), m) is Outcome.UNSUPPORTED


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
