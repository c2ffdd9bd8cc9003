"""The metric catalog: the one table every output of the metrics is built from.

Each :class:`Metric` row says what the metric is called, which OpenTelemetry
instrument carries it, its unit, where NVML provides the value and how the
raw NVML value is converted. Instrument registration, ``otel-gpu metrics``
and ``docs/metrics.md`` are all generated from :data:`CATALOG`, so a metric
cannot be added in one place and forgotten in another.

Names follow the OpenTelemetry hardware semantic conventions (``hw.*``)
where one exists. Values with no convention live in the documented vendor
namespace ``nvidia.gpu.*``; the collector's own health is ``otel_gpu.*``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from otel_gpu.nvml.sources import (
    CLOCK_GRAPHICS,
    CLOCK_MEM,
    CLOCK_REASONS,
    CLOCK_SM,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ENERGY,
    FAN,
    MEM_FREE,
    MEM_RESERVED,
    MEM_TOTAL,
    MEM_USED,
    NVLINK_RX,
    NVLINK_TX,
    PCIE_REPLAY,
    PCIE_RX,
    PCIE_TX,
    POWER,
    PROCESSES,
    REMAP_COR,
    REMAP_FAILURE,
    REMAP_PENDING,
    REMAP_UNC,
    TEMP_GPU,
    TEMP_MEM,
    THROTTLE_REASONS,
    UTIL_DEC,
    UTIL_ENC,
    UTIL_GPU,
    UTIL_MEM,
    Source,
)
from otel_gpu.snapshot import FAILED, STATES, DeviceSample, PodRef, Snapshot


class Kind(str, enum.Enum):
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


# Attribute names. The hw.* ones are OpenTelemetry's; the others are ours.
HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_VENDOR = "hw.vendor"
HW_MODEL = "hw.model"
HW_PARENT = "hw.parent"
HW_TYPE = "hw.type"
HW_DRIVER_VERSION = "hw.driver_version"
HW_SERIAL = "hw.serial_number"
HW_STATE = "hw.state"
GPU_INDEX = "nvidia.gpu.index"
PCI_BUS_ID = "nvidia.gpu.pci_bus_id"
MIG_PROFILE = "nvidia.gpu.mig.profile"
MIG_GI = "nvidia.gpu.mig.gpu_instance_id"
MIG_CI = "nvidia.gpu.mig.compute_instance_id"
NUMA_NODE = "nvidia.gpu.numa_node"
K8S_POD = "k8s.pod.name"
K8S_NAMESPACE = "k8s.namespace.name"
K8S_CONTAINER = "k8s.container.name"
K8S_RESOURCE = "nvidia.gpu.k8s.resource"
REPLICA = "nvidia.gpu.k8s.replica"
POD_ATTRIBUTES = (K8S_POD, K8S_NAMESPACE, K8S_CONTAINER)

DEVICE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    (HW_ID, "GPU UUID (`GPU-...`) or MIG instance UUID (`MIG-...`)"),
    (HW_TYPE, "always `gpu`"),
    (HW_VENDOR, "always `NVIDIA`"),
    (HW_MODEL, "product name of the physical GPU, e.g. `NVIDIA H100 80GB HBM3`"),
    (HW_NAME, "NVML name of this device; a MIG instance's names its profile"),
    (HW_PARENT, "MIG instances only: the UUID of the GPU they are carved from"),
    (HW_DRIVER_VERSION, "NVIDIA driver version"),
    (HW_SERIAL, "board serial number, when NVML reports one (GPUs only)"),
    (GPU_INDEX, "NVML index of the GPU (of the parent GPU for a MIG instance)"),
    (PCI_BUS_ID, "PCI bus id as NVML writes it, e.g. `00000000:18:00.0`"),
    (MIG_PROFILE, "MIG instances only: profile, e.g. `1g.10gb`"),
    (MIG_GI, "MIG instances only: GPU instance id"),
    (MIG_CI, "MIG instances only: compute instance id"),
    (NUMA_NODE, "NUMA node of the GPU (kubelet topology, else NVML, else sysfs), when known"),
    (K8S_POD, "pod holding the device whole (Kubernetes attribution on; absent on shared "
              "or free devices)"),
    (K8S_NAMESPACE, "namespace of that pod"),
    (K8S_CONTAINER, "container of that pod holding the device"),
)


# --- rows that are not one reading --------------------------------------------


def _status(sample: DeviceSample) -> Iterable[Observation]:
    for state in STATES:
        yield (1.0 if sample.state == state else 0.0), {HW_STATE: state}


def _xid(sample: DeviceSample) -> Iterable[Observation]:
    for code, count in sorted(sample.xid_counts.items()):
        yield float(count), {"nvidia.gpu.xid": str(code)}


def _device_age(sample: DeviceSample) -> Iterable[Observation]:
    yield sample.age, {}


def _sample_age(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield max(0.0, now - snapshot.taken_monotonic), {}


def _sample_duration(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield snapshot.duration, {}


def _samples(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield float(snapshot.seq), {}


def _nvml_requests(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    yield float(snapshot.nvml_calls), {}


def _devices(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    counts = dict.fromkeys(STATES, 0)
    for sample in snapshot.devices:
        counts[sample.state] += 1
    for state, count in counts.items():
        yield float(count), {HW_STATE: state}


def pod_labels(ref: PodRef) -> dict[str, str]:
    """A container's attributes under the OpenTelemetry Kubernetes conventions."""
    return {K8S_POD: ref.pod, K8S_NAMESPACE: ref.namespace, K8S_CONTAINER: ref.container}


def _allocations(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    for row in snapshot.allocations():
        attrs = {HW_ID: row.uuid, **pod_labels(PodRef(row.pod, row.namespace, row.container)),
                 K8S_RESOURCE: row.resource_name}
        if row.replica is not None:
            attrs[REPLICA] = str(row.replica)
        yield 1.0, attrs


def _allocated(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for summary in snapshot.pods.attribution.summary():
        yield float(summary.allocated), {K8S_RESOURCE: summary.resource_name}


def _allocatable(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for summary in snapshot.pods.attribution.summary():
        if summary.allocatable is not None:
            yield float(summary.allocatable), {K8S_RESOURCE: summary.resource_name}


def _numa_alignment(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None:
        return
    for row in snapshot.pods.attribution.numa_alignment():
        ref = PodRef(row.pod, row.namespace, row.container)
        yield row.fraction, {HW_ID: row.uuid, **pod_labels(ref)}


def _kubelet_requests(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is None or snapshot.pods.kubelet is None:
        return
    for (rpc, code), count in sorted(snapshot.pods.kubelet.requests.items()):
        yield float(count), {"rpc.method": rpc, "rpc.grpc.status_code": code}


def _mapping_age(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None and snapshot.pods.mapping_taken_monotonic is not None:
        yield max(0.0, now - snapshot.pods.mapping_taken_monotonic), {}


def _attributed_pods(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        rows = snapshot.allocations()
        yield float(len({(r.namespace, r.pod) for r in rows})), {}


def _attributed_devices(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        yield float(len(snapshot.pods.attribution.attributed_uuids())), {}


def _unresolved_ids(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.pods is not None:
        yield float(len(snapshot.pods.attribution.unresolved)), {}


CATALOG: tuple[Metric, ...] = (
    # OpenTelemetry hardware semantic conventions
    Metric(
        "hw.gpu.utilization", Kind.GAUGE, "1",
        "Fraction of time the GPU's engines were busy over NVML's last sample period.",
        points=(
            Point(UTIL_GPU, {"hw.gpu.task": "general"}, PERCENT),
            Point(UTIL_ENC, {"hw.gpu.task": "encoder"}, PERCENT),
            Point(UTIL_DEC, {"hw.gpu.task": "decoder"}, PERCENT),
        ),
    ),
    Metric(
        "hw.gpu.memory.usage", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) in use.",
        points=(Point(MEM_USED),),
    ),
    Metric(
        "hw.gpu.memory.limit", Kind.UPDOWNCOUNTER, "By",
        "Total GPU memory (framebuffer).",
        points=(Point(MEM_TOTAL),),
    ),
    Metric(
        "hw.gpu.memory.utilization", Kind.GAUGE, "1",
        "Fraction of GPU memory in use (used / total); not memory-controller busy time.",
        points=(Point(MEM_USED, per=MEM_TOTAL),),
    ),
    Metric(
        "hw.gpu.io", Kind.COUNTER, "By",
        "Bytes moved over PCIe by the GPU.",
        points=(
            Point(PCIE_RX, {"network.io.direction": "receive"}),
            Point(PCIE_TX, {"network.io.direction": "transmit"}),
        ),
    ),
    Metric(
        "hw.power", Kind.GAUGE, "W",
        "Power drawn by the GPU board.",
        points=(Point(POWER, conversion=MILLI),),
    ),
    Metric(
        "hw.energy", Kind.COUNTER, "J",
        "Energy consumed by the GPU since the driver was loaded.",
        points=(Point(ENERGY, conversion=MILLI),),
    ),
    Metric(
        "hw.temperature", Kind.GAUGE, "Cel",
        "Temperature of the GPU die and of its memory.",
        points=(
            Point(TEMP_GPU, {"hw.sensor_location": "gpu"}),
            Point(TEMP_MEM, {"hw.sensor_location": "memory"}),
        ),
    ),
    Metric(
        "hw.errors", Kind.COUNTER, "{error}",
        "ECC memory errors since the driver was loaded (volatile counts).",
        points=(
            Point(ECC_CORRECTED, {"error.type": "corrected"}),
            Point(ECC_UNCORRECTED, {"error.type": "uncorrected"}),
        ),
    ),
    Metric(
        "hw.status", Kind.UPDOWNCOUNTER, "1",
        "Device state: one series per hw.state, 1 for the current state and 0 for the others "
        "(a hung device keeps its last state; see otel_gpu.device.sample.age).",
        per_device=_status,
        attributes=(HW_STATE,),
        reported_when_failed=True,
        source_doc=(
            "collector: `failed` when NVML reports the device lost or broken; "
            "`predicted_failure` when a row remapping failed; `degraded` when a row "
            "remapping is pending; `ok` otherwise"
        ),
    ),
    # NVIDIA-specific values with no OpenTelemetry convention
    Metric(
        "nvidia.gpu.clock.frequency", Kind.GAUGE, "Hz",
        "Current clock frequency of each clock domain.",
        points=(
            Point(CLOCK_SM, {"nvidia.gpu.clock.domain": "sm"}, MHZ),
            Point(CLOCK_MEM, {"nvidia.gpu.clock.domain": "memory"}, MHZ),
            Point(CLOCK_GRAPHICS, {"nvidia.gpu.clock.domain": "graphics"}, MHZ),
        ),
    ),
    Metric(
        "nvidia.gpu.memory.free", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) free for allocation.",
        points=(Point(MEM_FREE),),
    ),
    Metric(
        "nvidia.gpu.memory.reserved", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) reserved by the driver and firmware.",
        points=(Point(MEM_RESERVED),),
    ),
    Metric(
        "nvidia.gpu.memory_controller.utilization", Kind.GAUGE, "1",
        "Fraction of time the memory controller was busy reading or writing.",
        points=(Point(UTIL_MEM, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.pcie.replays", Kind.COUNTER, "{replay}",
        "PCIe link replays (retransmissions); a rising count points at a bad link.",
        points=(Point(PCIE_REPLAY),),
    ),
    Metric(
        "nvidia.gpu.nvlink.io", Kind.COUNTER, "By",
        "Data bytes moved over NVLink, summed over the GPU's links.",
        points=(
            Point(NVLINK_RX, {"network.io.direction": "receive"}, KIB),
            Point(NVLINK_TX, {"network.io.direction": "transmit"}, KIB),
        ),
    ),
    Metric(
        "nvidia.gpu.clock.throttle", Kind.GAUGE, "1",
        "1 while the given reason holds the clocks down, else 0.",
        points=tuple(
            Point(CLOCK_REASONS, {"nvidia.gpu.throttle.reason": name}, bit=bit)
            for name, bit in THROTTLE_REASONS
        ),
    ),
    Metric(
        "nvidia.gpu.fan.speed", Kind.GAUGE, "1",
        "Fan speed as a fraction of its maximum (absent on passively cooled boards).",
        points=(Point(FAN, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.memory.remapped_rows", Kind.COUNTER, "{row}",
        "Memory rows remapped after errors.",
        points=(
            Point(REMAP_COR, {"error.type": "corrected"}),
            Point(REMAP_UNC, {"error.type": "uncorrected"}),
        ),
    ),
    Metric(
        "nvidia.gpu.memory.row_remap.pending", Kind.GAUGE, "1",
        "1 when a row remapping waits for a GPU reset.",
        points=(Point(REMAP_PENDING),),
    ),
    Metric(
        "nvidia.gpu.memory.row_remap.failure", Kind.GAUGE, "1",
        "1 when a row remapping failed: the GPU should be replaced.",
        points=(Point(REMAP_FAILURE),),
    ),
    Metric(
        "nvidia.gpu.xid.errors", Kind.COUNTER, "{error}",
        "XID errors reported by the driver since the collector started, per XID code; the "
        "common codes are there at 0 from discovery on, so the first one is an increase.",
        per_device=_xid,
        attributes=("nvidia.gpu.xid",),
        reported_when_failed=True,
        source_doc="nvmlEventSetWait_v2 (XID critical error events), counted per `nvidia.gpu.xid`",
    ),
    Metric(
        "nvidia.gpu.processes", Kind.UPDOWNCOUNTER, "{process}",
        "Compute processes running on the device.",
        points=(Point(PROCESSES),),
    ),
    # Kubernetes attribution (present when the kubelet's Pod Resources API answers)
    Metric(
        "nvidia.gpu.k8s.allocation", Kind.GAUGE, "1",
        "1 for each container a device is allocated to (one series per replica on shared "
        "GPUs): join it with device metrics on hw.id to see every pod sharing a GPU.",
        per_node=_allocations,
        attributes=(HW_ID, *POD_ATTRIBUTES, K8S_RESOURCE, REPLICA),
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "nvidia.gpu.k8s.allocated", Kind.UPDOWNCOUNTER, "{device}",
        "Device ids of a resource allocated to containers on this node.",
        per_node=_allocated,
        attributes=(K8S_RESOURCE,),
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "nvidia.gpu.k8s.allocatable", Kind.UPDOWNCOUNTER, "{device}",
        "Device ids of a resource the kubelet can allocate on this node.",
        per_node=_allocatable,
        attributes=(K8S_RESOURCE,),
        source_doc="kubelet Pod Resources GetAllocatableResources",
    ),
    Metric(
        "nvidia.gpu.numa.alignment", Kind.GAUGE, "1",
        "Fraction of a container's exclusive CPUs on its GPU's NUMA node (1 = aligned).",
        per_node=_numa_alignment,
        attributes=(HW_ID, *POD_ATTRIBUTES),
        source_doc="kubelet cpu_ids and topology; sysfs node*/cpulist",
    ),
    # The collector's own health
    Metric(
        "otel_gpu.kubelet.requests", Kind.COUNTER, "{request}",
        "Requests to the kubelet Pod Resources API, by RPC and gRPC status.",
        per_node=_kubelet_requests,
        attributes=("rpc.method", "rpc.grpc.status_code"),
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.mapping.age", Kind.GAUGE, "s",
        "Seconds since the pod mapping in use was read from the kubelet.",
        per_node=_mapping_age,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.kubelet.pods", Kind.UPDOWNCOUNTER, "{pod}",
        "Pods holding at least one of this node's GPUs or MIG instances.",
        per_node=_attributed_pods,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.devices", Kind.UPDOWNCOUNTER, "{device}",
        "GPUs and MIG instances attributed to at least one pod.",
        per_node=_attributed_devices,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.unresolved_ids", Kind.GAUGE, "{id}",
        "Device ids allocated to containers that match no GPU or MIG instance on this node.",
        per_node=_unresolved_ids,
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "otel_gpu.device.sample.age", Kind.GAUGE, "s",
        "Seconds from a device's last finished read to the end of the latest sample: near 0, "
        "and growing while a driver call on that device hangs (its values are then omitted).",
        per_device=_device_age,
        reported_when_failed=True,
        source_doc="collector clock, per device",
    ),
    Metric(
        "otel_gpu.sample.age", Kind.GAUGE, "s",
        "Seconds since the latest sample finished; grows when the driver is stuck.",
        per_node=_sample_age,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.sample.duration", Kind.GAUGE, "s",
        "Seconds the latest sample took.",
        per_node=_sample_duration,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.samples", Kind.COUNTER, "{sample}",
        "Samples taken since start.",
        per_node=_samples,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.nvml.requests", Kind.COUNTER, "{request}",
        "NVML requests made since start; scrapes never add to it.",
        per_node=_nvml_requests,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.devices", Kind.UPDOWNCOUNTER, "{device}",
        "GPUs and MIG instances known to the collector, per hw.state.",
        per_node=_devices,
        attributes=(HW_STATE,),
        source_doc="collector",
    ),
)


def all_sources(catalog: Iterable[Metric] = CATALOG) -> tuple[Source, ...]:
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
