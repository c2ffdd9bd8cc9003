"""The ``otel`` naming: the OpenTelemetry instruments, as the OpenTelemetry Prometheus
exporter names them (the exporter itself renders them; this module only says how)."""

from __future__ import annotations

import re

from otel_gpu.instrument.schema import Kind, Metric

# The OpenTelemetry Prometheus exporter's unit suffixes for the units we use.
_PROM_UNITS = {"By": "bytes", "W": "watts", "J": "joules", "Cel": "celsius", "Hz": "hertz",
               "s": "seconds", "1": "", "By/s": "bytes_per_second"}


def prometheus_name(metric: Metric) -> str:
    """The name the OpenTelemetry Prometheus exporter gives the metric."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", metric.name)
    unit = "" if metric.unit.startswith("{") else _PROM_UNITS.get(metric.unit, metric.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if metric.kind is Kind.COUNTER:
        name += "_total"
    return name


class _Otel:
    name = "otel"

    def validate(self, options: object) -> list[str]:
        return []

    def build(self, options: object) -> None:
        return None  # the OpenTelemetry Prometheus exporter renders the instruments


NAMING = _Otel()
