"""Renders the catalog as text: the ``otel-gpu metrics`` listing and docs/metrics.md."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

from otel_gpu.export.naming.otel import prometheus_name
from otel_gpu.instrument.attributes import DEVICE_ATTRIBUTES, IDENTITY_ATTRIBUTES
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.process import PROCESS_METRICS
from otel_gpu.instrument.schema import Metric
from otel_gpu.workload import WORKLOAD_ATTRIBUTES

__all__ = ["markdown", "migration", "prometheus_name", "text_table"]

def documented() -> tuple[Metric, ...]:
    """Every row the endpoint can serve: the catalog's, the GPU event detector's and the
    process's (these two with OTLP on)."""
    from otel_gpu.export.events.detector import EventDetector  # after naming, which imports this

    return (*CATALOG, *EventDetector().metrics(), *PROCESS_METRICS)


def text_table(catalog: Sequence[Metric] | None = None) -> str:
    catalog = documented() if catalog is None else catalog
    rows = [("NAME", "KIND", "UNIT", "PROMETHEUS", "DESCRIPTION")]
    rows += [(m.name, m.kind.value, m.unit, prometheus_name(m), m.description) for m in catalog]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def markdown(catalog: Sequence[Metric] | None = None) -> str:
    catalog = documented() if catalog is None else catalog
    out = [
        "# Metrics",
        "",
        "Generated from `otel_gpu/instrument/catalog.py` by `otel-gpu metrics --format markdown`;",
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
        "The series of a GPU or MIG instance carry these (Prometheus label: dots",
        "become underscores, e.g. `hw.id` -> `hw_id`). With `device_attributes: all`",
        "(the default) every series carries every attribute, and `nvidia.gpu.info` (one",
        "series per device, value 1) carries them too. With `device_attributes: identity`",
        "every series carries only what identifies the device and its workload, and",
        "`nvidia.gpu.info` alone what describes it: join on `hw_id`, e.g.",
        "`hw_power_watts * on (hw_id) group_left (hw_model) nvidia_gpu_info`.",
        "",
        "| Attribute | On | Meaning |",
        "|---|---|---|",
    ]
    for key, meaning in DEVICE_ATTRIBUTES:
        if key in IDENTITY_ATTRIBUTES:
            where = "every series, `nvidia.gpu.info` too"
        elif key in WORKLOAD_ATTRIBUTES:
            where = "every series but `nvidia.gpu.info`"
        else:
            where = "`nvidia.gpu.info` (every series with `device_attributes: all`)"
        out.append(f"| `{key}` | {where} | {meaning} |")
    out += [
        "",
        "A failed device (lost, or NVML reports it broken) keeps `hw.status` (with",
        "`hw.state=\"failed\"` valued 1), its XID counts, its sample age and its",
        "`nvidia.gpu.info`; its other",
        "series are dropped until it recovers. A GPU NVML counts but cannot open is such",
        "a device too: it keeps the identity it was seen with, or, if it was never opened,",
        "`hw.id=\"GPU-unknown-index-N\"` and the PCI bus id sysfs gives for index N.",
        "",
        "A device whose driver call does not return within the read deadline (half the",
        "interval, between 1 and 10 s) is *hung*: its values are omitted,",
        "`otel_gpu.device.sample.age` grows, `hw.status` keeps the last state read,",
        "`/readyz` counts it as unreadable, and the other GPUs keep being read on time.",
        "",
        "## The collector's own process",
        "",
        "Every `/metrics` answer, whatever the naming profiles, starts with the series every",
        "Prometheus exporter serves about itself, under prometheus_client's names:",
        "`process_cpu_seconds_total`, `process_resident_memory_bytes`,",
        "`process_virtual_memory_bytes`, `process_start_time_seconds`, `process_open_fds`",
        "and `process_max_fds`. They are read from `/proc/self` at each scrape (not per",
        "sample), so an alert such as",
        "`process_resident_memory_bytes{job=\"otel-gpu\"} > 400e6` works as it does for",
        "node_exporter or dcgm-exporter. Where `/proc` is missing (not Linux) they are left out.",
        "Over OTLP the same values are the `process.*` metrics of the table above (the",
        "semantic conventions name no maximum of descriptors, and give `process.uptime`",
        "instead of a start time), under the node's Resource; with OTLP on, the `otel`",
        "profile's body has them too.",
        "",
    ]
    return "\n".join(out)


# dcgm-exporter label -> OpenTelemetry attribute (Prometheus label).
_DCGM_LABELS = (
    ("gpu", "nvidia_gpu_index"),
    ("UUID", "hw_id (for a MIG instance: hw_parent; hw_id is the instance's own MIG UUID)"),
    ("pci_bus_id", "nvidia_gpu_pci_bus_id (on nvidia_gpu_info)"),
    ("device", "none: `nvidia` + the minor number; `hw_id` identifies the device"),
    ("modelName", "hw_model (on nvidia_gpu_info)"),
    ("GPU_I_PROFILE", "nvidia_gpu_mig_profile"),
    ("GPU_I_ID", "nvidia_gpu_mig_gpu_instance_id"),
    ("hostname (Hostname before)", "host_name in target_info, or k8s_node_name"),
    ("DCGM_FI_DRIVER_VERSION", "hw_driver_version (on nvidia_gpu_info)"),
    ("DCGM_FI_DEV_SERIAL", "hw_serial_number (on nvidia_gpu_info)"),
    ("container, namespace, pod", "k8s_container_name, k8s_namespace_name, k8s_pod_name"),
    ("err_code, err_msg", "the `xid` code of `nvidia_gpu_xid_errors_total`"),
)

# Where a label row's value comes from.
_LABEL_VALUES = {
    "DCGM_FI_DRIVER_VERSION": "`nvmlSystemGetDriverVersion`",
    "DCGM_FI_DEV_SERIAL": "`nvmlDeviceGetSerial`",
    "DCGM_FI_DEV_VBIOS_VERSION": "`nvmlDeviceGetVbiosVersion`",
    "DCGM_FI_DEV_UUID": "the GPU's UUID",
    "DCGM_FI_DEV_NAME": "the product name",
    "DCGM_FI_DEV_PCI_BUSID": "the PCI bus id",
    "DCGM_FI_DEV_MINOR_NUMBER": "the `/dev/nvidiaN` minor number",
}

_KUBELET = (
    ("container_accelerator_duty_cycle", "%", "hw.gpu.utilization (general), `1`",
     '100 * hw_gpu_utilization{hw_gpu_task="general"}'),
    ("container_accelerator_memory_used_bytes", "bytes",
     "hw.gpu.memory.usage + nvidia.gpu.memory.reserved, `By`",
     "hw_gpu_memory_usage_bytes + nvidia_gpu_memory_reserved_bytes"),
    ("container_accelerator_memory_total_bytes", "bytes", "hw.gpu.memory.limit, `By`",
     "hw_gpu_memory_limit_bytes"),
)

def _template() -> str:
    text = resources.files("otel_gpu.export.naming").joinpath("migration.md").read_text()
    return re.sub(r"\A<!--.*?-->\n", "", text, flags=re.S)


def migration() -> str:
    """docs/migration.md: the prose of ``naming/migration.md`` with the tables filled in."""
    tables = _migration_tables()
    out = []
    for line in _template().split("\n"):
        slot = re.fullmatch(r"\{\{(\w+)\}\}", line)
        if slot is None:
            out.append(line)
        else:
            out.extend(tables.pop(slot.group(1)))
    if tables:
        raise ValueError(f"migration template lacks {', '.join(tables)}")
    return "\n".join(out)


def _migration_tables() -> dict[str, list[str]]:
    """The body rows of each table of the migration guide, by the template's slot name."""
    from otel_gpu.export.naming.dcgm import (
        DEFAULT_COUNTERS,
        DEFAULT_FIELDS,
        EXPORTER_FIELDS,
        FIELDS,
        LABEL_FIELDS,
        LEGACY_NAMES,
        UNAVAILABLE,
    )
    from otel_gpu.export.naming.dcgm.counters import DEFAULT_FIELDS_CURRENT
    from otel_gpu.export.naming.dcgm.current import (
        CURRENT_FIELDS,
        CURRENT_LABELS,
        RENAMES,
        from_old,
    )

    by_source: dict[str, Metric] = {}
    for metric in CATALOG:
        for point in metric.points:
            by_source.setdefault(point.source.key, metric)
    fields = []
    for name, field in FIELDS.items():
        if field.sources:
            otel = ", ".join(
                f"`{by_source[s.key].name}` (`{by_source[s.key].unit}`)" for s in field.sources
            )
        else:
            otel = "`nvidia.gpu.xid.errors` (`{error}`)"
        default = "yes" if name in DEFAULT_FIELDS else ""
        type_ = next((t for n, t, _ in DEFAULT_COUNTERS if n == name), field.type)
        rewrite = f"`{field.promql}`" if field.promql else field.rewrite_note
        fields.append(f"| `{name}` | {type_} | {field.unit_note} | {default} | {otel} "
                      f"| {rewrite} |")
    legacy = dict(LEGACY_NAMES)
    legacy.update({n.lower(): n for n in FIELDS if n.startswith("DCGM_FI_PROF_")})
    current = []
    for name, rename in RENAMES.items():
        field = CURRENT_FIELDS[name]
        rewrite = f"`{field.promql}`" if field.promql else field.rewrite_note
        current.append(
            f"| `{name}` | {rename.since} | `{rename.old}` | {field.unit_note} "
            f"| {'yes' if name in DEFAULT_FIELDS_CURRENT else ''} | {rewrite} "
            f"| `{from_old(name)}` | {rename.evidence} |")
    return {
        "dcgm_fields": fields,
        "current_fields": current,
        "current_labels": [f"| `{new}` | `{old}` |" for new, old in CURRENT_LABELS.items()],
        "exporter_fields": [f"| `{f.name}` | {f.type} | {f.note} |"
                            for f in EXPORTER_FIELDS.values()],
        "label_rows": [f"| `{name}` | {_LABEL_VALUES.get(CURRENT_LABELS.get(name, name), '')} |"
                       for name in LABEL_FIELDS],
        "legacy_names": [f"| `{old}` | `{new}` | "
                         f"{'yes' if new in FIELDS else UNAVAILABLE.get(new, 'no')} |"
                         for old, new in legacy.items()],
        "labels": [f"| `{old}` | {new} |" for old, new in _DCGM_LABELS],
        "kubelet": [f"| `{a}` | {b} | {c} | `{d}` |" for a, b, c, d in _KUBELET],
        "unavailable": [f"| `{name}` | {why} |" for name, why in UNAVAILABLE.items()],
    }
