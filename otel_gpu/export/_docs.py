"""Renders the catalog as text: the ``otel-gpu metrics`` listing and docs/metrics.md."""

from __future__ import annotations

import re
from collections.abc import Sequence

from otel_gpu.instrument.catalog import (
    CATALOG,
    DEVICE_ATTRIBUTES,
    IDENTITY_ATTRIBUTES,
    WORKLOAD_ATTRIBUTES,
    Kind,
    Metric,
)

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


def documented() -> tuple[Metric, ...]:
    """Every row the endpoint can serve: the catalog's and the GPU event detector's."""
    from otel_gpu.export.events import EventDetector  # after naming, which imports this

    return (*CATALOG, *EventDetector().metrics())


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

_KUBELET = (
    ("container_accelerator_duty_cycle", "%", "hw.gpu.utilization (general), `1`",
     '100 * hw_gpu_utilization{hw_gpu_task="general"}'),
    ("container_accelerator_memory_used_bytes", "bytes",
     "hw.gpu.memory.usage + nvidia.gpu.memory.reserved, `By`",
     "hw_gpu_memory_usage_bytes + nvidia_gpu_memory_reserved_bytes"),
    ("container_accelerator_memory_total_bytes", "bytes", "hw.gpu.memory.limit, `By`",
     "hw_gpu_memory_limit_bytes"),
)

# dcgm-exporter options and labels otel-gpu has no setting for, and what to do instead.
_DCGM_OPTIONS = (
    "- **Device selection (`-d`).** `dcgm_devices: auto` is dcgm-exporter's default (`-d f`):",
    "  a GPU in MIG mode has series for each of its GPU instances (labels `GPU_I_PROFILE`,",
    "  `GPU_I_ID`) and none as a whole, so `sum(DCGM_FI_DEV_FB_USED)` counts each byte",
    "  once. An instance's memory and profiling fields are its own; the fields DCGM reads",
    "  per GPU (temperature, clocks, power, energy, PCIe, XID, ...) carry its GPU's value",
    "  on each instance, as dcgm-exporter shows them, and GPU, memory-copy, encoder and",
    "  decoder utilization, which DCGM does not report per instance, are left out.",
    "  `gpus` (`-d g`), `instances` (`-d i`) and `both` (`-d g+i`) are its other choices;",
    "  id lists (`-d g:0,1`) are not supported.",
    "- **Host label.** dcgm-exporter's newest releases name it `hostname`, the default",
    "  here; earlier releases wrote `Hostname`: set `dcgm_hostname_label: Hostname` for",
    "  dashboards built on them.",
    "- **Old pod label names (`--use-old-namespace`).** `dcgm_pod_label_style: old` writes",
    "  `pod_name`, `pod_namespace`, `container_name` (and `uuid` for `UUID`).",
    "- **Pod UID (`uid`).** Not written: the kubelet's Pod Resources API, where otel-gpu",
    "  learns which pod holds a device, does not give pod UIDs. Join on namespace and pod",
    "  name (`kube_pod_info` from kube-state-metrics has the `uid`).",
    "- **Copying pod labels (`--kubernetes-enable-pod-labels`).** Needs the API server, which",
    "  otel-gpu does not call. Push over OTLP through an OpenTelemetry Collector and let its",
    "  `k8sattributes` processor add them: each pod's GPU series arrive under a Resource",
    "  naming the pod (`k8s.pod.name`, `k8s.namespace.name`): associate on those",
    "  (`pod_association` `from: resource_attribute`) and list the labels under",
    "  `extract.labels`, as",
    "  [examples/collector/node-agent.yaml](../examples/collector/node-agent.yaml) does.",
    "- **XID labels.** `DCGM_FI_DEV_XID_ERRORS` carries `err_code` and `err_msg`, as",
    "  dcgm-exporter 3.3.5 and later write them. `err_code` is the same; `err_msg` is a",
    "  short phrase of otel-gpu's own (`otel_gpu/export/naming/xid.py`), not dcgm-exporter's text,",
    "  so match on `err_code`.",
)


def migration() -> str:
    """docs/migration.md: from dcgm-exporter's and the kubelet's names to OpenTelemetry's."""
    from otel_gpu.export.naming.dcgm import (
        DEFAULT_COUNTERS,
        DEFAULT_FIELDS,
        EXPORTER_FIELDS,
        FIELDS,
        LABEL_FIELDS,
        LEGACY_NAMES,
        UNAVAILABLE,
    )

    out = [
        "# Migrating from dcgm-exporter and from the kubelet's accelerator metrics",
        "",
        "Generated from `otel_gpu/export/naming/dcgm.py` by `otel-gpu metrics --format migration`;",
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
        "Without `-f` the `dcgm` profile serves the fields of NVIDIA's current default",
        "counters file (dcgm-exporter's `etc/default-counters.csv`), with its types and",
        "HELP texts and its `DCGM_FI_DRIVER_VERSION` label. A counters file may also",
        "list the 1.x-compatibility names, `DCGM_EXP_*` fields and `label` rows (below).",
        "A field otel-gpu cannot provide is logged once at start-up and skipped; only a",
        "malformed line stops it.",
        "",
        "## dcgm-exporter fields",
        "",
        "Each PromQL rewrite gives the dcgm-exporter value, in its unit, from the",
        "OpenTelemetry series. Default: in NVIDIA's default counters file (its type there",
        "is the one shown).",
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
        type_ = next((t for n, t, _ in DEFAULT_COUNTERS if n == name), field.type)
        rewrite = f"`{field.promql}`" if field.promql else field.rewrite_note
        out.append(f"| `{name}` | {type_} | {field.unit_note} | {default} | {otel} "
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
        "## dcgm-exporter's own fields (`DCGM_EXP_*`)",
        "",
        "dcgm-exporter computes these itself; otel-gpu computes them from its samples. The",
        "`*_COUNT` windows are dcgm-exporter's default 5 minutes, counted over the samples",
        "the endpoint renders (one per interval while it is scraped at least that often).",
        "",
        "| field | type | how otel-gpu computes it |",
        "|---|---|---|",
    ]
    out += [f"| `{f.name}` | {f.type} | {f.note} |" for f in EXPORTER_FIELDS.values()]
    out += [
        "",
        "## Label rows",
        "",
        "A `label` row adds a label named after the field, with the GPU's value, to every",
        "series (a MIG instance's are its GPU's). Those otel-gpu knows:",
        "",
        "| field | value |",
        "|---|---|",
    ]
    label_values = {
        "DCGM_FI_DRIVER_VERSION": "`nvmlSystemGetDriverVersion`",
        "DCGM_FI_DEV_SERIAL": "`nvmlDeviceGetSerial`",
        "DCGM_FI_DEV_VBIOS_VERSION": "`nvmlDeviceGetVbiosVersion`",
        "DCGM_FI_DEV_UUID": "the GPU's UUID",
        "DCGM_FI_DEV_NAME": "the product name",
        "DCGM_FI_DEV_PCI_BUSID": "the PCI bus id",
        "DCGM_FI_DEV_MINOR_NUMBER": "the `/dev/nvidiaN` minor number",
    }
    out += [f"| `{name}` | {label_values.get(name, '')} |" for name in LABEL_FIELDS]
    out += [
        "",
        "## dcgm-exporter 1.x names",
        "",
        "dcgm-exporter's `1.x-compatibility-metrics.csv` names fields the way dcgm-exporter",
        "1.x did. Such a file works as it is: each series has the name the file gives and",
        "the value (and unit) of the DCGM field the name stands for; `dcgm_fi_prof_*` names",
        "stand for the upper-case `DCGM_FI_PROF_*` field. A name listed twice (that file",
        "lists the PCIe byte counters twice) is exported once, as its last line says.",
        "",
        "| 1.x name | DCGM field | exported |",
        "|---|---|---|",
    ]
    legacy = dict(LEGACY_NAMES)
    legacy.update({n.lower(): n for n in FIELDS if n.startswith("DCGM_FI_PROF_")})
    for old, new in legacy.items():
        status = "yes" if new in FIELDS else UNAVAILABLE.get(new, "no")
        out.append(f"| `{old}` | `{new}` | {status} |")
    out += [
        "",
        "## Labels",
        "",
        "| dcgm-exporter label | OpenTelemetry attribute (Prometheus label) |",
        "|---|---|",
    ]
    out += [f"| `{old}` | {new} |" for old, new in _DCGM_LABELS]
    out += [
        "",
        "The labels marked (on nvidia_gpu_info) describe the device. They are on every",
        "series by default; with `device_attributes: identity` they are written once per",
        "device, on `nvidia_gpu_info` alone, and a dashboard grouping by one joins it on",
        "`hw_id` (which works with either setting):",
        "",
        "```promql",
        "# DCGM_FI_DEV_GPU_TEMP by modelName",
        "avg by (hw_model) (",
        "  hw_temperature_celsius{hw_sensor_location=\"gpu\"}",
        "  * on (hw_id) group_left (hw_model) nvidia_gpu_info",
        ")",
        "```",
        "",
        "## dcgm-exporter options",
        "",
        *_DCGM_OPTIONS,
    ]
    out += [
        "",
        "## Kubelet accelerator metrics (Kubernetes before 1.20)",
        "",
        "Labels `container`, `namespace`, `pod`, `make` (`nvidia`), `model`, `acc_id` (the",
        "GPU or MIG UUID) become `k8s_container_name`, `k8s_namespace_name`,",
        "`k8s_pod_name`, `hw_vendor`, `hw_model` and `hw_id` (`hw_vendor` and `hw_model`",
        "on `nvidia_gpu_info`, joined on `hw_id`, with the default `device_attributes`).",
        "",
        "The values are the kubelet's (cAdvisor's), which read `nvmlDeviceGetMemoryInfo`",
        "version 1: memory used includes the memory the driver reserves (on an H100,",
        "541 MiB more than `hw.gpu.memory.usage`), and memory total is the physical total",
        "(`hw.gpu.memory.limit`), not used + free. cAdvisor's duty cycle was NVML's",
        "average over its last 10 s; otel-gpu's is `nvmlDeviceGetUtilizationRates`, NVML's",
        "utilization over the driver's own sample period (1/6 s to 1 s depending on the",
        "product), read once per interval.",
        "",
        "cAdvisor also labelled these series `id` (the container's cgroup path), `image`",
        "and `name` (the container runtime's name for the container). The Pod Resources",
        "API tells none of them, and otel-gpu does not ask the container runtime, so they",
        "are left out rather than made up.",
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
