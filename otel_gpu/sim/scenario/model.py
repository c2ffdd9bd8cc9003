"""What a simulated machine looks like: the frozen scenario model the fake driver plays.

Time is counted in *samples*: ``FakeNvml.sample`` is the number of
``nvmlDeviceGetCount_v2`` calls so far, and every time-varying value and
every fault is a function of it, so tests are deterministic without clocks.

Each spec field read from a scenario key of its own name says so with
:func:`key`: which parser method reads it (:class:`Key`), so the YAML keys
allowed and how each is read follow from these classes. The format is
documented in ``docs/scenarios.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from otel_gpu import nvml_abi as abi
from otel_gpu.errors import SetupError

Number = int | float

MAX_MIG_DEVICES = 7
MAX_GPUS = 512
"""GPUs in one scenario, ``count`` included: more than any real node has (the
benchmark's largest node), and few enough to keep a scenario's memory small."""
MAX_SLOW_SECONDS = 3600.0
NOT_AVAILABLE_ID = 0xFFFFFFFF
"""What NVML puts in a GPU/compute instance id that does not apply."""

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
NOT_AVAILABLE = 0x7FFF0001
"""Not an NVML code: the fault a device's ``not_available`` injects (SUCCESS, all ones)."""

CLOCKS = {
    "graphics": abi.NVML_CLOCK_GRAPHICS,
    "sm": abi.NVML_CLOCK_SM,
    "memory": abi.NVML_CLOCK_MEM,
    "video": abi.NVML_CLOCK_VIDEO,
}
"""Scenario ``clocks`` keys and the NVML clock type each one answers for."""
UTILIZATION_KEYS = ("gpu", "memory", "encoder", "decoder")
"""Scenario ``utilization`` keys."""
POWER_LIMITS = ("current", "enforced", "default", "min", "max")
"""Scenario ``power_limits`` keys."""
PCIE_KEYS = ("generation", "max_generation", "width", "max_width", "tx_throughput",
             "rx_throughput")
"""Scenario ``pcie`` keys."""
VIOLATION_POLICIES = {
    "power": abi.NVML_PERF_POLICY_POWER,
    "thermal": abi.NVML_PERF_POLICY_THERMAL,
    "sync_boost": abi.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": abi.NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": abi.NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": abi.NVML_PERF_POLICY_RELIABILITY,
}
"""Scenario ``violations`` keys and the NVML policy each one answers for."""
ROW_REMAP_BUCKETS = ("max", "high", "partial", "low", "none")
"""Scenario ``row_remap_histogram`` keys (the struct's fields)."""
NVLINK_COUNTERS = ("tx", "rx", "crc_flit", "crc_data", "replay", "recovery")
"""An NVLink link's counters: data KiB sent and received, and its error counts."""
NVLINK_FIELDS = {
    abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx",
    abi.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx",
    abi.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    abi.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
    abi.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    abi.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
}
"""The fields ``nvlink`` answers: field id -> the link counter behind it."""
FAULT_KEYS = ("unsupported", "no_permission", "errors", "not_available")
"""A GPU's fault keys (a MIG instance takes all but ``not_available``)."""
PROCESS_SHARES = ("sm", "memory_util", "encoder", "decoder")
"""A process's utilization samples, in percent (none on MIG instances)."""
CGROUP_VERSIONS = ("v1", "v2")
CGROUP_DRIVERS = ("systemd", "cgroupfs")
RUNTIMES = ("containerd", "crio", "docker")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


class ScenarioError(SetupError):
    """A scenario that cannot be loaded; ``str()`` is one line naming the file and key."""


def clamp(value: Number, maximum: int) -> int:
    """``value`` as an unsigned integer no larger than ``maximum`` (what NVML can report)."""
    return min(max(int(value), 0), maximum)


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


# --- how a field is read ----------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """How a spec field comes from its scenario: the YAML keys it takes and who reads them.

    ``parse`` names the parser method (``otel_gpu.sim.scenario.parse``) that
    reads the key of the field's name, called with ``options``; ``None``: the
    parser reads it by hand (defaults or checks that span keys). ``names``:
    the YAML keys when they are not just the field's name.
    """

    parse: str | None = None
    required: bool = False
    names: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=_empty)


def key(parse: str | None = None, *, default: Any = dataclasses.MISSING,
        factory: Any = dataclasses.MISSING, required: bool = False,
        names: tuple[str, ...] = (), **options: Any) -> Any:
    """A dataclass field read from a scenario key (see :class:`Key`)."""
    meta = {"scenario": Key(parse, required, names, MappingProxyType(options))}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


_T = TypeVar("_T")

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Any:
        return lambda f: f


@dataclass_transform(frozen_default=True, field_specifiers=(field, key))
def spec(cls: type[_T]) -> type[_T]:
    """A frozen spec dataclass whose :func:`key` fields type checkers understand."""
    return dataclass(frozen=True)(cls)


def key_of(f: dataclasses.Field) -> Key | None:
    return f.metadata.get("scenario")


def yaml_keys(cls: type) -> tuple[str, ...]:
    """The scenario keys a spec class takes, in field order."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        k = key_of(f)
        if k is not None:
            out.extend(k.names or (f.name,))
    return tuple(out)


def required_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if (k := key_of(f)) and k.required)


# --- the model --------------------------------------------------------------------------


@spec
class Value:
    """A number that may change from sample to sample and differ between GPUs."""

    start: Number = key("number", default=0, required=True)
    step: Number = key("number", default=0, minimum=None)
    per_device: Number = key("number", default=0)
    cycle: tuple[Number, ...] = ()

    def at(self, sample: int, k: int = 0) -> Number:
        """The value at ``sample`` for the ``k``-th GPU of its entry."""
        n = max(sample - 1, 0)
        if self.cycle:
            return self.cycle[n % len(self.cycle)]
        return self.start + self.per_device * k + self.step * n


@spec
class Memory:
    total: int = key("integer", required=True)
    used: Value = key("value", default=Value())
    reserved: Value = key("value", default=Value())

    def at(self, sample: int, k: int = 0) -> tuple[int, int, int, int]:
        """``(total, reserved, used, free)`` in bytes, consistent with each other."""
        used = min(clamp(self.used.at(sample, k), self.total), self.total)
        reserved = min(clamp(self.reserved.at(sample, k), self.total), self.total - used)
        return self.total, reserved, used, self.total - used - reserved


@spec
class Process:
    pid: int = key("integer", required=True, minimum=1, maximum=U32_MAX)
    used_memory: Value | None = key("value", default=None)
    from_sample: int = key("integer", default=0)
    until_sample: int | None = key("integer", default=None, null=True)
    sm: Value | None = key("value", default=None)
    memory_util: Value | None = key("value", default=None)
    encoder: Value | None = key("value", default=None)
    decoder: Value | None = key("value", default=None)

    @property
    def utilization(self) -> tuple[Value | None, Value | None, Value | None, Value | None]:
        """(sm, memory_util, encoder, decoder): all ``None`` for a process never busy."""
        return self.sm, self.memory_util, self.encoder, self.decoder

    def listed_at(self, sample: int) -> bool:
        return sample >= self.from_sample and (
            self.until_sample is None or sample <= self.until_sample
        )


@spec
class Faults:
    """Injected return codes: per C symbol (whole call) and per field id (one entry)."""

    calls: Mapping[str, int] = field(default_factory=_empty)
    fields: Mapping[int, int] = field(default_factory=_empty)


@spec
class Slow:
    function: str = key("device_function", required=True)
    seconds: float = key("seconds", required=True)
    after: int = key("integer", default=0)


@spec
class ShapeSpec:
    """An answer shape (``otel_gpu.sim.driver.shapes``) of ``function``, from sample
    ``after`` + 1 on."""

    function: str = key("any_function", required=True)
    shape: str = key("shape", required=True)
    after: int = key("integer", default=0)


@spec
class Xid:
    sample: int = key("integer", required=True)
    code: int = key("integer", required=True)
    gpu_instance_id: int = key("integer", default=NOT_AVAILABLE_ID, maximum=U32_MAX)
    compute_instance_id: int = key("integer", default=NOT_AVAILABLE_ID, maximum=U32_MAX)


@spec
class Gpm:
    """A device's GPM answers: metric id -> VALUE in NVML's unit (its other keys are GPM
    metric names), and its faults."""

    metrics: Mapping[int, Value] = field(default_factory=_empty)
    unsupported: bool = key("boolean", default=False)
    no_permission: bool = key("boolean", default=False)
    busy: tuple[int, int | None] | None = key("busy", default=None)
    """``(from_sample, until_sample)``, inclusive: sample calls answer IN_USE then."""

    def busy_at(self, sample: int) -> bool:
        if self.busy is None:
            return False
        start, end = self.busy
        return sample >= start and (end is None or sample <= end)


@spec
class MigSpec:
    slot: int
    profile: str = key(required=True)
    name: str
    uuid: str = key()
    gpu_instance_id: int = key("integer", required=True)
    compute_instance_id: int = key("integer", default=0)
    memory: Memory | None = key("memory", default=None)
    processes: tuple[Process, ...] = key(default=())
    faults: Faults = key(default=Faults(), names=FAULT_KEYS[:3])
    from_sample: int = key("integer", default=0)
    until_sample: int | None = key("integer", default=None)
    gpm: Gpm | None = key("gpm", default=None, mig=True)
    gi_profile_id: int | None = key("integer", default=None, maximum=U32_MAX)
    """``None``: derived from ``profile`` (see ``sim.driver.mig``)."""
    placement_start: int | None = key("integer", default=None, maximum=U32_MAX)
    """``None``: after the instances in the slots before it."""

    def exists_at(self, sample: int) -> bool:
        """Whether the instance exists during sample ``sample`` (a re-layout moves it)."""
        return sample >= self.from_sample and (
            self.until_sample is None or sample <= self.until_sample)


@spec
class NvLinkSpec:
    """One NVLink link: whether it is up, and its counters (absent: 0)."""

    active: bool = key(default=True, names=("state",))
    down_after: int | None = key("integer", default=None)
    counters: Mapping[str, Value] = key(factory=_empty, names=NVLINK_COUNTERS)

    def active_at(self, sample: int) -> bool:
        return self.active and (self.down_after is None or sample <= self.down_after)

    def counter(self, name: str, sample: int, k: int) -> int:
        value = self.counters.get(name)
        return 0 if value is None else clamp(value.at(sample, k), U64_MAX)


@spec
class NvLinks:
    """A GPU's NVLink links, link id = position."""

    links: tuple[NvLinkSpec, ...] = key(default=(), required=True)
    all_links_scope: bool = key("boolean", default=True)
    """Whether the field scope UINT_MAX answers the sum over every link."""

    def total(self, name: str, sample: int, k: int) -> int:
        return min(sum(link.counter(name, sample, k) for link in self.links), U64_MAX)


FABRIC_STATES = {
    "not_supported": abi.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
    "not_started": abi.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    "in_progress": abi.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    "completed": abi.NVML_GPU_FABRIC_STATE_COMPLETED,
}
"""Scenario ``fabric.state`` names and the NVML fabric state each one answers."""
FABRIC_HEALTH_SUMMARIES = {
    "not_supported": abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
    "healthy": abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
    "unhealthy": abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
    "limited_capacity": abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY,
}
"""Scenario ``fabric.health_summary`` names and the NVML summary each one answers."""
FABRIC_HEALTHY_MASK = 0x51AA
"""A health mask with every condition reported and none holding: bandwidth not degraded,
no route recovery, routes healthy, no access timeout recovery, configuration correct, a
partition assigned, the global fabric manager connected."""


@spec
class Fabric:
    """A GPU's NVLink fabric registration, as ``nvmlDeviceGetGpuFabricInfoV`` answers it.

    ``state`` holds until sample ``completed_after``, then the registration is complete.
    ``status``, the clique and the cluster are what a completed registration answers.
    ``version``: the newest structure version the driver fills (1: only the unversioned
    call, without a health mask; 2: with it; 3: with the health summary too).
    """

    state: int = key(default=abi.NVML_GPU_FABRIC_STATE_COMPLETED)
    completed_after: int | None = key("integer", default=None)
    status: int = key(default=abi.NVML_SUCCESS)
    clique_id: int = key("integer", default=0, maximum=U32_MAX)
    cluster_uuid: bytes = key(default=bytes(16))
    health_mask: Value = key("value", default=Value(start=FABRIC_HEALTHY_MASK))
    health_summary: int = key(default=abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
    version: int = key("integer", default=3, minimum=1, maximum=3)

    def state_at(self, sample: int) -> int:
        if self.completed_after is not None and sample > self.completed_after:
            return abi.NVML_GPU_FABRIC_STATE_COMPLETED
        return self.state


def _reading(**options: Any) -> Any:
    """A reading: a VALUE, absent -> None (its call answers NOT_SUPPORTED)."""
    return key("value", default=None, **options)


def _readings(keys: Any) -> Any:
    """A mapping of named readings, each a VALUE; a key not listed is absent."""
    return key("values", factory=_empty, keys=tuple(keys))


@spec
class GpuSpec:
    """One physical GPU, after ``count`` expansion: ``position`` is its k.

    A reading the fake driver answers is one field here, read by the parser
    method its :func:`key` names, and the fake C symbol that answers it.
    """

    index: int
    position: int
    name: str = key(required=True)
    uuid: str = key()
    pci_bus_id: str = key()
    minor_number: int = key()
    serial: str = key()
    pci_device_id: int = key("integer", default=0, maximum=U32_MAX)
    numa_node: int | None = key("integer", default=None)
    memory: Memory | None = key("memory", default=None)
    utilization: Mapping[str, Value] = _readings(UTILIZATION_KEYS)
    temperature: Value | None = _reading()
    power: Value | None = _reading()
    clocks: Mapping[str, Value] = _readings(CLOCKS)
    clock_event_reasons: Value | None = _reading()
    fan_speed: Value | None = _reading()
    fields: Mapping[int, Value] = key("fields", factory=_empty)
    processes: tuple[Process, ...] = key(default=())
    faults: Faults = key(default=Faults(), names=FAULT_KEYS)
    lost_after: int | None = key("integer", default=None)
    slow: tuple[Slow, ...] = key("slow", default=())
    xid: tuple[Xid, ...] = key("xid", default=())
    mig_capable: bool = key(default=False)
    mig: tuple[MigSpec, ...] = key(default=())
    gpm: Gpm | None = key("gpm", default=None)
    power_limits: Mapping[str, Value] = _readings(POWER_LIMITS)
    performance_state: Value | None = _reading()
    max_clocks: Mapping[str, Value] = _readings(CLOCKS)
    pcie: Mapping[str, Value] = _readings(PCIE_KEYS)
    violations: Mapping[str, Value] = _readings(VIOLATION_POLICIES)
    row_remap_histogram: Mapping[str, Value] = _readings(ROW_REMAP_BUCKETS)
    nvlink: NvLinks | None = key("nvlink", default=None)
    fabric: Fabric | None = key("fabric", default=None)
    """Absent: the fabric call answers NOT_SUPPORTED (a GPU in no NVLink domain)."""
    codec_sampling_period: int = key("integer", default=167_000, maximum=U32_MAX)
    """Microseconds: what the encoder and decoder utilization calls answer beside the value."""
    shapes: tuple[ShapeSpec, ...] = key("shapes", default=())
    """Answer shapes of calls on this GPU and its MIG instances."""

    def lost_at(self, sample: int) -> bool:
        return self.lost_after is not None and sample > self.lost_after


@spec
class KubeletDevice:
    """A device the kubelet lists as allocated to a container, as a device plugin names it.

    From a scenario entry naming a GPU by NVML index (``gpu``), with ``replica`` for a
    time-sliced share or ``mig`` (a GPU instance id) for a MIG instance; the parser
    resolves it to the plugin's resource name and device id.
    """

    gpu: int = key(required=True)
    replica: int | None = key(default=None)
    mig: int | None = key(default=None)
    resource: str = key(default="")
    """Default: ``nvidia.com/gpu`` (time-sliced shares too), ``nvidia.com/mig-<profile>``."""
    id: str = ""
    """``GPU-<uuid>``, ``GPU-<uuid>::<replica>`` or ``MIG-<uuid>``."""
    numa: int | None = None
    """The GPU's NUMA node, as the kubelet's topology gives it."""


@spec
class ContainerSpec:
    """A pod's container (or one outside Kubernetes): its id, processes, cgroup layout,
    and the devices the kubelet lists as its (a pod's) or its image (outside)."""

    name: str = key(required=True)
    id: str = key()
    pids: tuple[int, ...] = key(default=())
    cgroup: str = key(default="v2")
    driver: str = key(default="systemd")
    runtime: str = key(default="containerd")
    devices: tuple[KubeletDevice, ...] = key(default=())
    image: str = key(default="")
    """What the runtime API names its image (outside Kubernetes only); empty: an image id."""


@spec
class PodSpec:
    namespace: str = key(required=True)
    name: str = key(required=True)
    uid: str = key()
    qos: str = key(default="burstable")
    containers: tuple[ContainerSpec, ...] = key(default=())


@spec
class NodeSpec:
    """The scenario's ``node``: what :mod:`otel_gpu.sim.node` writes."""

    pods: tuple[PodSpec, ...] = key(default=())
    host_pids: tuple[int, ...] = key(default=())
    containers: tuple[ContainerSpec, ...] = key(default=())
    """Containers outside Kubernetes (``docker run``): their processes' cgroups only."""
    cgroup: str = key(default="v2")
    """The node's cgroup version (the host processes' layout)."""
    driver: str = key(default="systemd")
    runtime: str = key(default="containerd")
    """The node's cgroup driver and runtime: its containers' unless they say otherwise."""
    idle_threshold: float | None = key(default=None)
    """Seconds: the collector's ``idle_threshold`` while it runs this node, unless set."""


@spec
class Scenario:
    name: str = key()
    driver_version: str = key(default="550.90.07")
    devices: tuple[GpuSpec, ...] = key(default=(), required=True)
    nvml_version: str = key(default="")
    faults: Faults = key(default=Faults(), names=("errors",))
    """System-level injected errors (top-level ``errors``)."""
    source: str = ""
    """Where it was loaded from: a profile name or the path given."""
    node: NodeSpec | None = key(default=None)
    """The scenario's ``node`` section, if any."""
    shapes: tuple[ShapeSpec, ...] = key("shapes", default=())
    """Answer shapes of calls on any GPU, or on none (system calls)."""
