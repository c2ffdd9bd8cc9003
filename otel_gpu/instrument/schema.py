"""The catalog's schema: what a row says (:class:`Metric`), and how a row's values are read
from one device sample.

A row names its OpenTelemetry instrument (:class:`Kind`), its unit, where NVML
provides each value (:class:`Point`, a :class:`~otel_gpu.sample.sources.Source`) and
how the raw NVML value is converted (:class:`Conversion`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from otel_gpu.sample.sources import Source
from otel_gpu.snapshot import FAILED, DeviceSample, Snapshot


class Kind(enum.StrEnum):
    """OpenTelemetry observable instrument kinds used by the catalog."""

    GAUGE = "gauge"
    COUNTER = "counter"
    UPDOWNCOUNTER = "updowncounter"


@dataclass(frozen=True)
class Conversion:
    """A linear conversion from NVML's unit to the metric's unit."""

    label: str
    factor: float


AS_IS = Conversion("as is", 1.0)
PERCENT = Conversion("percent / 100", 0.01)
MILLI = Conversion("/ 1000", 0.001)
MHZ = Conversion("MHz * 10^6", 1e6)
KIB = Conversion("KiB * 1024", 1024.0)
KB_PER_S = Conversion("KB/s * 1024", 1024.0)
NANO = Conversion("ns / 10^9", 1e-9)
MIB = Conversion("MiB * 2^20", 1048576.0)


@dataclass(frozen=True)
class Point:
    """One series of a metric per device: a source, fixed attributes, conversion.

    ``per`` makes the point a ratio of two sources (used / total); ``bit``
    turns a bitmask source into a 0/1 value.
    """

    source: Source
    attributes: Mapping[str, str] = field(default_factory=dict)
    conversion: Conversion = AS_IS
    per: Source | None = None
    bit: int | None = None

    def value(self, values: Mapping[str, float]) -> float | None:
        raw = values.get(self.source.key)
        if raw is None:
            return None
        if self.bit is not None:
            return 1.0 if int(raw) & self.bit else 0.0
        if self.per is not None:
            total = values.get(self.per.key)
            if not total:
                return None
            return raw / total
        return raw * self.conversion.factor


Observation = tuple[float, Mapping[str, str]]


@dataclass(frozen=True)
class Metric:
    """One catalog row.

    Most rows are declarative (``points``). A few values are not a reading of
    one NVML value: those rows name a function of the device sample
    (``per_device``) or of the whole snapshot (``per_node``).
    """

    name: str
    kind: Kind
    unit: str
    description: str
    points: tuple[Point, ...] = ()
    per_device: Callable[[DeviceSample], Iterable[Observation]] | None = None
    per_node: Callable[[Snapshot, float], Iterable[Observation]] | None = None
    source_doc: str = ""
    """How the value is obtained, for rows without points."""
    attributes: tuple[str, ...] = ()
    """Attribute keys a ``per_device``/``per_node`` row adds, for the docs."""
    reported_when_failed: bool = False
    """Whether a failed device keeps this series (its status, XID counts and sample age)."""
    describes_device: bool = False
    """Whether the series carry every attribute of the device, the descriptive ones too,
    and none of its pods' or jobs': the info metric, which holds what the other series
    leave out under ``device_attributes: identity`` and stays put while pods come and go."""

    def attribute_keys(self) -> list[str]:
        """Attribute keys this metric adds beyond the device's own."""
        keys = [k for p in self.points for k in p.attributes] + list(self.attributes)
        return list(dict.fromkeys(keys))

    @property
    def sources(self) -> tuple[Source, ...]:
        found: list[Source] = []
        for point in self.points:
            for src in (point.source, point.per):
                if src is not None and src not in found:
                    found.append(src)
        return tuple(found)

    def describe_source(self) -> str:
        if self.source_doc:
            return self.source_doc
        parts = []
        for point in self.points:
            text = point.source.nvml
            if point.per is not None:
                text += f" / {point.per.nvml}"
            elif point.bit is not None:
                text += f" & 0x{point.bit:x}"
            if point.conversion is not AS_IS:
                text += f" ({point.conversion.label})"
            if point.attributes:
                attrs = ", ".join(f"{k}={v}" for k, v in point.attributes.items())
                text += f" [{attrs}]"
            parts.append(text)
        return "; ".join(parts)


def all_sources(catalog: Iterable[Metric]) -> tuple[Source, ...]:
    """Every NVML source the catalog needs, in catalog order, once each."""
    found: dict[str, Source] = {}
    for metric in catalog:
        for src in metric.sources:
            found.setdefault(src.key, src)
    return tuple(found.values())


def device_observations(metric: Metric, sample: DeviceSample) -> list[Observation]:
    """The metric's values for one device, without the device's own attributes.

    A failed device yields only ``hw.status``: its other series are dropped
    rather than frozen at their last value.
    """
    if sample.state == FAILED and not metric.reported_when_failed:
        return []
    if metric.per_device is not None:
        return list(metric.per_device(sample))
    out: list[Observation] = []
    for point in metric.points:
        value = point.value(sample.values)
        if value is not None:
            out.append((value, point.attributes))
    return out
