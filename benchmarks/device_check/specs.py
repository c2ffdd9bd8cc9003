"""What the check compares: one :class:`Spec` per exported series of a GPU, derived from the
catalog, each with the tolerance its value is held to.

A series is a catalog point (its metric's Prometheus family, its attributes as labels) and
the reference reading of its source (:mod:`benchmarks.device_check.reference`), converted as
the point converts. Its tolerance is the default for its metric's kind and unit
(:data:`DEFAULTS`; the GPM sources, read over another window, by their own unit:
:data:`GPM_DEFAULTS`), unless :data:`OVERRIDES` names the metric. So a new catalog metric is
compared without an edit here; an override is needed only where the default is wrong for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from otel_gpu.export.naming.otel import prometheus_name
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.schema import Kind, Metric
from otel_gpu.sample.sources import Source

MIB = 1 << 20


@dataclass(frozen=True)
class Tol:
    """How an exported value is compared with the reference.

    ``exact``: equal (to 1e-9 relative, for float formatting). ``gauge``: within
    ``abs`` or ``rel`` times the reference, whichever is larger. ``counter``: the
    reference, read after the collector's read, is not below it and above it by at most
    ``rate`` per second of the time between the two reads (``abs`` either way: two calls
    for the same counter may be refreshed at different moments).
    """

    kind: str
    abs: float = 0.0
    rel: float = 0.0
    rate: float = 0.0
    text: str = ""

    @property
    def moving(self) -> bool:
        return self.kind != "exact"

    def ok(self, exported: float, reference: float, age: float) -> bool:
        slack = 1e-9 * max(abs(exported), abs(reference), 1.0)
        if self.kind == "exact":
            return abs(exported - reference) <= slack
        if self.kind == "gauge":
            return abs(exported - reference) <= max(self.abs, self.rel * abs(reference)) + slack
        return -self.abs - slack <= reference - exported <= self.rate * age + self.abs + slack

    def describe(self) -> str:
        return self.text or self.kind


EXACT = Tol("exact", text="exact")
UTIL = Tol("gauge", abs=0.25, text="±0.25 (NVML's own sampling period)")
TEMP = Tol("gauge", abs=5.0, text="±5 C")
POWER = Tol("gauge", abs=30.0, rel=0.15, text="±max(30 W, 15 %)")
CLOCK = Tol("gauge", abs=200e6, rel=0.20, text="±max(200 MHz, 20 %)")
MEMORY = Tol("gauge", abs=256 * MIB, text="±256 MiB")
MEMORY_FRACTION = Tol("gauge", abs=0.01, text="±0.01")
PSTATE = Tol("gauge", abs=2.0, text="±2")
FLAG = Tol("gauge", abs=0.0, text="equal (moves with load: second try)")
LINK = Tol("gauge", abs=0.0, text="equal (can change with load: second try)")
FAN = Tol("gauge", abs=0.10, text="±0.10")
GPM_ACTIVITY = Tol("gauge", abs=0.10, text="±0.10 over another window of the same load")
GPM_RATE = Tol("gauge", abs=512 * MIB, rel=0.5, text="±max(512 MiB/s, 50 %)")
PCIE_RATE = Tol("gauge", abs=256 * MIB, rel=0.5, text="±max(256 MiB/s, 50 %)")
ENERGY = Tol("counter", rate=2000.0, abs=2.0,
             text="grown by 0..2 kW x the reads' gap, ±2 J")
THROTTLE_TIME = Tol("counter", rate=1.0, abs=1e-6, text="grown by 0..1 s/s x the reads' gap")
PCIE_BYTES = Tol("counter", rate=128e9, text="grown by 0..128 GB/s x the reads' gap")
NVLINK_BYTES = Tol("counter", rate=2e12, text="grown by 0..2 TB/s x the reads' gap")
GAP_SLACK = 0.25
"""Seconds added to the measured gap between the collector's read and the check's."""
FLAGS_UNDER_LOAD = Tol("gauge", abs=1.0, text="0 or 1 (the reason moves under load)")
THROTTLE_FAMILY = "nvidia_gpu_clock_throttle"
"""The family whose flags move under load (held to :data:`FLAGS_UNDER_LOAD` then)."""

DEFAULTS: dict[tuple[Kind, str], Tol] = {
    (Kind.GAUGE, "W"): POWER,
    (Kind.GAUGE, "Cel"): TEMP,
    (Kind.GAUGE, "Hz"): CLOCK,
    (Kind.GAUGE, "By/s"): PCIE_RATE,
    (Kind.GAUGE, "{lane}"): LINK,
    (Kind.COUNTER, "J"): ENERGY,
    (Kind.COUNTER, "By"): PCIE_BYTES,
    (Kind.COUNTER, "s"): THROTTLE_TIME,
    (Kind.UPDOWNCOUNTER, "By"): MEMORY,
}
"""The tolerance of a metric by its kind and unit; any other kind and unit: exact (a count,
a flag, a state, a limit), which a value that moves fails, asking for an override."""
GPM_DEFAULTS: dict[str, Tol] = {"%": GPM_ACTIVITY, "MiB/s": GPM_RATE}
"""A GPM source's tolerance by its NVML unit: the reference measures over its own window."""
OVERRIDES: dict[str, Tol] = {
    "hw.gpu.utilization": UTIL,
    "nvidia.gpu.memory_controller.utilization": UTIL,
    "hw.gpu.memory.limit": EXACT,
    "nvidia.gpu.memory.reserved": EXACT,
    "hw.gpu.memory.utilization": MEMORY_FRACTION,
    "nvidia.gpu.performance_state": PSTATE,
    "nvidia.gpu.pcie.link.generation": LINK,
    "nvidia.gpu.pcie.link.max_width": EXACT,
    "nvidia.gpu.nvlink.io": NVLINK_BYTES,
    "nvidia.gpu.nvlink.links": LINK,
    "nvidia.gpu.fan.speed": FAN,
    "nvidia.gpu.clock.max_frequency": EXACT,
    "nvidia.gpu.power.limit": EXACT,
    "nvidia.gpu.clock.throttle": FLAG,
}
"""Metrics (by catalog name) whose default tolerance does not fit them."""


def tolerance(metric: Metric, source: Source) -> Tol:
    """The override for ``metric``, else the GPM default for ``source``, else its kind's and
    unit's default, else exact."""
    if metric.name in OVERRIDES:
        return OVERRIDES[metric.name]
    if source.gpm and source.unit in GPM_DEFAULTS:
        return GPM_DEFAULTS[source.unit]
    return DEFAULTS.get((metric.kind, metric.unit), EXACT)


@dataclass(frozen=True)
class Spec:
    """One exported series per GPU (``family`` with ``labels``) and the reference reading
    it must equal: the reading of source ``key``, over the reading of ``per`` when given,
    its ``bit`` when given, else times ``scale``."""

    family: str
    key: str
    tol: Tol
    labels: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    per: str | None = None
    bit: int | None = None

    def expected(self, reading: dict[str, object]) -> object:
        """The value the series must show, or the reference's ``ERR:`` text for a refusal."""
        raw = reading.get(self.key, "ERR:not read")
        if isinstance(raw, str):
            return raw
        assert isinstance(raw, int | float), raw
        if self.bit is not None:
            return int(bool(int(raw) & self.bit))
        if self.per is not None:
            total = reading.get(self.per, "ERR:not read")
            if isinstance(total, str):
                return total
            assert isinstance(total, int | float), total
            return raw / total if total else "ERR:total 0"
        return raw * self.scale


def label(attribute: str) -> str:
    """An attribute's Prometheus label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def specs(catalog: Iterable[Metric] = CATALOG) -> list[Spec]:
    """One spec per point of every catalog row read from NVML sources."""
    out = []
    for metric in catalog:
        family = prometheus_name(metric)
        for point in metric.points:
            labels = tuple(sorted((label(k), v) for k, v in point.attributes.items()))
            out.append(Spec(family, point.source.key, tolerance(metric, point.source), labels,
                            point.conversion.factor, point.per.key if point.per else None,
                            point.bit))
    return out


def sources(catalog: Iterable[Metric] = CATALOG) -> tuple[Source, ...]:
    """Every source a spec reads (a ratio's divisor included), once each, in catalog order."""
    found: dict[str, Source] = {}
    for metric in catalog:
        for src in metric.sources:
            found.setdefault(src.key, src)
    return tuple(found.values())


SPECS = specs()
CUSTOM = {
    "hw_status": "the device state from remapped rows and retired pages",
    "nvidia_gpu_info": "identity labels against NVML's name, serial, PCI bus id, index, driver",
    "otel_gpu_devices": "GPUs and MIG instances NVML counts",
    "otel_gpu_device_sample_age_seconds": "at most two intervals",
    "otel_gpu_sample_age_seconds": "at most two intervals",
    "otel_gpu_sample_duration_seconds": "at most one interval",
    "otel_gpu_samples_total": "at least 1, at most the collector's age over the interval, + 2",
    "nvidia_gpu_k8s_energy_joules_total": "per GPU, the rows sum to hw_energy (1 mJ)",
    "nvidia_gpu_k8s_energy_rule": "the rule the pods phase implies",
    "nvidia_gpu_k8s_allocation": "the fake kubelet's pods",
    "nvidia_gpu_k8s_allocated": "the fake kubelet's device ids",
    "nvidia_gpu_k8s_memory_usage_bytes": "NVML's per-process memory, summed per pod",
    "nvidia_gpu_k8s_processes": "NVML's processes, counted per pod",
    "nvidia_gpu_k8s_sm_utilization": "NVML's per-process SM shares (±0.3)",
    "otel_gpu_kubelet_pods": "the fake kubelet's pods",
    "otel_gpu_kubelet_devices": "devices the fake kubelet's pods hold",
    "otel_gpu_kubelet_unresolved_ids": "0",
}
"""The families compared by hand (:mod:`benchmarks.device_check.compare`), and how."""
