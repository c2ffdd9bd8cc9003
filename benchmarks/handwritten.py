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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

LABELS = ("gpu", "uuid", "name")


def _safe(call: Callable[[], Any]) -> Any:
    """A value, or None where the GPU refuses it (a hand-written exporter skips those)."""
    import pynvml

    try:
        return call()
    except pynvml.NVMLError:
        return None


class Exporter:
    """Every GPU's values, refreshed by :meth:`sample`."""

    def __init__(self) -> None:
        import prometheus_client
        import pynvml
        from prometheus_client import Counter, Gauge

        prometheus_client.disable_created_metrics()
        for collector in list(prometheus_client.REGISTRY._collector_to_names):
            prometheus_client.REGISTRY.unregister(collector)  # no process/platform series
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            labels = (str(i), pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle))
            self.gpus.append((handle, labels))

        def gauge(name: str, doc: str, *extra: str) -> Any:
            return Gauge(name, doc, (*LABELS, *extra))

        self.memory = gauge("gpu_memory_bytes", "framebuffer", "state")
        self.util = gauge("gpu_utilization_ratio", "busy fraction", "engine")
        self.temp = gauge("gpu_temperature_celsius", "die temperature")
        self.power = gauge("gpu_power_watts", "board power")
        self.energy = Counter("gpu_energy_joules", "energy since the driver loaded", LABELS)
        self.clock = gauge("gpu_clock_hertz", "clock", "domain")
        self.max_clock = gauge("gpu_clock_max_hertz", "highest clock", "domain")
        self.pstate = gauge("gpu_performance_state", "P-state")
        self.limit = gauge("gpu_power_limit_watts", "enforced power limit")
        self.pcie = gauge("gpu_pcie_link", "PCIe link", "what")
        self.procs = gauge("gpu_processes", "compute processes")
        self.throttle = gauge("gpu_clock_event_reasons", "clock event reasons bitmask")
        self.ecc = gauge("gpu_ecc_errors", "volatile ECC errors", "type")
        self.remap = gauge("gpu_remapped_rows", "remapped rows", "type")
        self.fan = gauge("gpu_fan_ratio", "fan speed")
        self._energy_seen: dict[str, float] = {}
        m = pynvml
        self.domains = {"sm": m.NVML_CLOCK_SM, "memory": m.NVML_CLOCK_MEM,
                        "graphics": m.NVML_CLOCK_GRAPHICS, "video": m.NVML_CLOCK_VIDEO}
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
            util = _safe(lambda h=handle: m.nvmlDeviceGetUtilizationRates(h))
            if util is not None:
                self.util.labels(*labels, "gpu").set(util.gpu / 100)
                self.util.labels(*labels, "memory").set(util.memory / 100)
            for engine, call in (("encoder", m.nvmlDeviceGetEncoderUtilization),
                                 ("decoder", m.nvmlDeviceGetDecoderUtilization)):
                got = _safe(lambda h=handle, c=call: c(h))
                if got is not None:
                    self.util.labels(*labels, engine).set(got[0] / 100)
            temp = _safe(lambda h=handle: m.nvmlDeviceGetTemperature(h, m.NVML_TEMPERATURE_GPU))
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
            for domain, clock in self.domains.items():
                mhz = _safe(lambda h=handle, c=clock: m.nvmlDeviceGetClockInfo(h, c))
                if mhz is not None:
                    self.clock.labels(*labels, domain).set(mhz * 1e6)
            pstate = _safe(lambda h=handle: m.nvmlDeviceGetPerformanceState(h))
            if pstate is not None and pstate < 32:
                self.pstate.labels(*labels).set(pstate)
            limit = _safe(lambda h=handle: m.nvmlDeviceGetEnforcedPowerLimit(h))
            if limit is not None:
                self.limit.labels(*labels).set(limit / 1000)
            for what, call in (("generation", m.nvmlDeviceGetCurrPcieLinkGeneration),
                               ("width", m.nvmlDeviceGetCurrPcieLinkWidth)):
                got = _safe(lambda h=handle, c=call: c(h))
                if got is not None:
                    self.pcie.labels(*labels, what).set(got)
            procs = _safe(lambda h=handle: m.nvmlDeviceGetComputeRunningProcesses(h))
            if procs is not None:
                self.procs.labels(*labels).set(len(procs))
            reasons = _safe(lambda h=handle: m.nvmlDeviceGetCurrentClocksEventReasons(h))
            if reasons is not None:
                self.throttle.labels(*labels).set(reasons)
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


def serve(interval: float, announce: Callable[[int], None]) -> int:
    """Sample every ``interval`` seconds on a thread; serve on a port the kernel picks,
    handed to ``announce`` once the first sample is in (the body is complete from then)."""
    from prometheus_client import start_http_server

    exporter = Exporter()
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
