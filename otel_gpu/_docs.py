"""Renders the catalog as text: the ``otel-gpu metrics`` listing and docs/metrics.md."""

from __future__ import annotations

import re
from collections.abc import Sequence

from otel_gpu.catalog import CATALOG, DEVICE_ATTRIBUTES, Kind, Metric

# The OpenTelemetry Prometheus exporter's unit suffixes for the units we use.
_PROM_UNITS = {"By": "bytes", "W": "watts", "J": "joules", "Cel": "celsius", "Hz": "hertz",
               "s": "seconds", "1": ""}


def prometheus_name(metric: Metric) -> str:
    """The name the OpenTelemetry Prometheus exporter gives the metric."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", metric.name)
    unit = "" if metric.unit.startswith("{") else _PROM_UNITS.get(metric.unit, metric.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if metric.kind is Kind.COUNTER:
        name += "_total"
    return name


def text_table(catalog: Sequence[Metric] = CATALOG) -> str:
    rows = [("NAME", "KIND", "UNIT", "PROMETHEUS", "DESCRIPTION")]
    rows += [(m.name, m.kind.value, m.unit, prometheus_name(m), m.description) for m in catalog]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def markdown(catalog: Sequence[Metric] = CATALOG) -> str:
    out = [
        "# Metrics",
        "",
        "Generated from `otel_gpu/catalog.py` by `otel-gpu metrics --format markdown`;",
        "do not edit by hand (a test fails when this file is out of date).",
        "",
        "Names follow the OpenTelemetry hardware semantic conventions (`hw.*`) where one",
        "exists. NVIDIA-specific values with no convention use the `nvidia.gpu.*`",
        "namespace; the collector's own health is `otel_gpu.*`. A value a device cannot",
        "provide is omitted for that device, never reported as 0 or NaN.",
        "",
        "| Metric | Instrument | Unit | Prometheus name | Attributes | NVML source | Description |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in catalog:
        attrs = ", ".join(f"`{a}`" for a in m.attribute_keys()) or "-"
        out.append(
            f"| `{m.name}` | {m.kind.value} | `{m.unit}` | `{prometheus_name(m)}` | {attrs} "
            f"| {m.describe_source()} | {m.description} |"
        )
    out += [
        "",
        "## Device attributes",
        "",
        "Every series of a GPU or MIG instance carries these (Prometheus label: dots",
        "become underscores, e.g. `hw.id` -> `hw_id`).",
        "",
        "| Attribute | Meaning |",
        "|---|---|",
    ]
    out += [f"| `{key}` | {meaning} |" for key, meaning in DEVICE_ATTRIBUTES]
    out += [
        "",
        "A failed device (lost, or NVML reports it broken) keeps only `hw.status`, with",
        "`hw.state=\"failed\"` valued 1; its other series are dropped until it recovers.",
        "",
    ]
    return "\n".join(out)
