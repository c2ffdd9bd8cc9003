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
        "A failed device (lost, or NVML reports it broken) keeps `hw.status` (with",
        "`hw.state=\"failed\"` valued 1), its XID counts and its sample age; its other",
        "series are dropped until it recovers. A GPU NVML counts but cannot open is such",
        "a device too: it keeps the identity it was seen with, or, if it was never opened,",
        "`hw.id=\"GPU-unknown-index-N\"` and the PCI bus id sysfs gives for index N.",
        "",
        "A device whose driver call does not return within the read deadline (half the",
        "interval, between 1 and 10 s) is *hung*: its values are omitted,",
        "`otel_gpu.device.sample.age` grows, `hw.status` keeps the last state read,",
        "`/readyz` counts it as unreadable, and the other GPUs keep being read on time.",
        "",
    ]
    return "\n".join(out)


# dcgm-exporter label -> OpenTelemetry attribute (Prometheus label).
_DCGM_LABELS = (
    ("gpu", "nvidia_gpu_index"),
    ("UUID", "hw_id (for a MIG instance: hw_parent; hw_id is the instance's own MIG UUID)"),
    ("pci_bus_id", "nvidia_gpu_pci_bus_id"),
    ("device", "none: `nvidia` + the minor number; `hw_id` identifies the device"),
    ("modelName", "hw_model"),
    ("Hostname / hostname", "host_name in target_info, or k8s_node_name"),
    ("DCGM_FI_DRIVER_VERSION", "hw_driver_version"),
    ("pod, namespace, container", "k8s_pod_name, k8s_namespace_name, k8s_container_name"),
    ("GPU_I_PROFILE", "nvidia_gpu_mig_profile"),
    ("GPU_I_ID", "nvidia_gpu_mig_gpu_instance_id"),
)

_KUBELET = (
    ("container_accelerator_duty_cycle", "%", "hw.gpu.utilization (general), `1`",
     '100 * hw_gpu_utilization{hw_gpu_task="general"}'),
    ("container_accelerator_memory_used_bytes", "bytes", "hw.gpu.memory.usage, `By`",
     "hw_gpu_memory_usage_bytes"),
    ("container_accelerator_memory_total_bytes", "bytes",
     "hw.gpu.memory.usage + nvidia.gpu.memory.free, `By`",
     "hw_gpu_memory_usage_bytes + nvidia_gpu_memory_free_bytes"),
)


def migration() -> str:
    """docs/migration.md: from dcgm-exporter's and the kubelet's names to OpenTelemetry's."""
    from otel_gpu.naming.dcgm import DEFAULT_FIELDS, FIELDS, UNAVAILABLE

    out = [
        "# Migrating from dcgm-exporter and from the kubelet's accelerator metrics",
        "",
        "Generated from `otel_gpu/naming/dcgm.py` by `otel-gpu metrics --format migration`;",
        "do not edit by hand (a test fails when this file is out of date).",
        "",
        "Point Prometheus at otel-gpu with the naming profile your dashboards use, and",
        "move to the OpenTelemetry names at your own pace:",
        "",
        "```sh",
        "otel-gpu --naming dcgm                  # what dcgm-exporter served",
        "otel-gpu --naming otel,dcgm             # both, from the same sample",
        "otel-gpu --naming otel,dcgm,kubelet     # and the kubelet's old series",
        "otel-gpu --naming dcgm -f counters.csv  # your dcgm-exporter counters file",
        "```",
        "",
        "Profiles change the Prometheus endpoint only; OTLP always uses the",
        "OpenTelemetry names.",
        "",
        "## dcgm-exporter fields",
        "",
        "Each PromQL rewrite gives the dcgm-exporter value, in its unit, from the",
        "OpenTelemetry series. Default: in dcgm-exporter's default set.",
        "",
        "| dcgm-exporter field | type | unit | default | OpenTelemetry metric | PromQL rewrite |",
        "|---|---|---|---|---|---|",
    ]
    by_source = {}
    for metric in CATALOG:
        for point in metric.points:
            by_source.setdefault(point.source.key, metric)
    for name, field in FIELDS.items():
        if field.sources:
            otel = ", ".join(
                f"`{by_source[s.key].name}` (`{by_source[s.key].unit}`)" for s in field.sources
            )
        else:
            otel = "`nvidia.gpu.xid.errors` (`{error}`)"
        default = "yes" if name in DEFAULT_FIELDS else ""
        rewrite = f"`{field.promql}`" if field.promql else field.rewrite_note
        out.append(f"| `{name}` | {field.type} | {field.unit_note} | {default} | {otel} "
                   f"| {rewrite} |")
    out += [
        "",
        "Differences worth knowing:",
        "",
        "- `DCGM_FI_DEV_XID_ERRORS` holds the last XID code; `nvidia.gpu.xid.errors` counts",
        "  every XID, one series per code, so `increase(...[1h]) > 0` alerts on each kind.",
        "- On a GPU shared by several pods, dcgm-exporter copies the GPU's series once per",
        "  pod; otel-gpu does not (sums would count the GPU once per pod) unless",
        "  `dcgm_shared_gpu_copies` is on. Join `nvidia_gpu_k8s_allocation` instead",
        "  (docs/kubernetes.md).",
        "- promtool's linter flags dcgm-exporter's names (camelCase labels, counters",
        "  without `_total`): the `dcgm` profile keeps them, since dashboards depend on",
        "  them; the `otel` names pass it.",
        "",
        "## Labels",
        "",
        "| dcgm-exporter label | OpenTelemetry attribute (Prometheus label) |",
        "|---|---|",
    ]
    out += [f"| `{old}` | {new} |" for old, new in _DCGM_LABELS]
    out += [
        "",
        "## Kubelet accelerator metrics (Kubernetes before 1.20)",
        "",
        "Labels `container`, `namespace`, `pod`, `make` (`nvidia`), `model`, `acc_id` (the",
        "GPU or MIG UUID) become `k8s_container_name`, `k8s_namespace_name`,",
        "`k8s_pod_name`, `hw_vendor`, `hw_model` and `hw_id`.",
        "",
        "| kubelet metric | unit | OpenTelemetry metric, unit | PromQL rewrite |",
        "|---|---|---|---|",
    ]
    out += [f"| `{a}` | {b} | {c} | `{d}` |" for a, b, c, d in _KUBELET]
    out += [
        "",
        "## No equivalent",
        "",
        "These dcgm-exporter fields are accepted in a counters file but not exported;",
        "otel-gpu says so once at start-up, with the reason below.",
        "",
        "| field | why |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {why} |" for name, why in UNAVAILABLE.items()]
    out.append("")
    return "\n".join(out)
