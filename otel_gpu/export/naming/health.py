"""The collector's own health under its OpenTelemetry Prometheus names, for any naming.

With ``naming: dcgm`` (or ``kubelet``) alone there is no OpenTelemetry
Prometheus output, yet a stuck driver or a lost GPU must still be visible to
alerts on the scrape endpoint: this profile writes the node-level
``otel_gpu.*`` rows of the catalog (sample age, devices by state, NVML and
kubelet requests ...) exactly as the OpenTelemetry exporter names them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from otel_gpu.export.naming.exposition import Family
from otel_gpu.export.naming.otel import prometheus_name
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.schema import Kind, Metric
from otel_gpu.snapshot import Snapshot

_TYPES = {Kind.GAUGE: "gauge", Kind.COUNTER: "counter", Kind.UPDOWNCOUNTER: "gauge"}


def health_metrics() -> tuple[Metric, ...]:
    return tuple(m for m in CATALOG if m.name.startswith("otel_gpu.") and m.per_node)


class HealthProfile:
    """Renders the catalog's node-level ``otel_gpu.*`` rows from a snapshot."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._metrics = health_metrics()

    def families(self, snapshot: Snapshot) -> list[Family]:
        now = self._clock()
        out = []
        for metric in self._metrics:
            family = Family(prometheus_name(metric), _TYPES[metric.kind], metric.description)
            assert metric.per_node is not None  # health_metrics() keeps only per-node rows
            for value, attrs in metric.per_node(snapshot, now):
                family.add({k.replace(".", "_"): v for k, v in attrs.items()}, value)
            out.append(family)
        return out
