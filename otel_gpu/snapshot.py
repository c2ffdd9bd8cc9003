"""The data the pipeline passes on: one immutable snapshot per sample.

The sampler thread builds a :class:`Snapshot`; everything downstream (the instrument callbacks, the
Prometheus render cache, attribution) only reads it. Nothing here talks to NVML or the kubelet, so
the scrape path can never block on either; the types here are the whole contract between the stages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from otel_gpu.workload import (
    AllocationRow,
    ContainerRef,
    Holder,
    JobRef,
    NumaAlignment,
    Owner,
    PodRef,
    Workload,
    workload_attributes,
)

# Device states, as the OpenTelemetry ``hw.state`` attribute spells them.
OK = "ok"
DEGRADED = "degraded"
FAILED = "failed"
PREDICTED_FAILURE = "predicted_failure"
STATES = (OK, DEGRADED, FAILED, PREDICTED_FAILURE)

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Device:
    """What is known about a GPU or MIG instance from discovery; never changes."""

    uuid: str
    """``GPU-...`` or ``MIG-...``: the ``hw.id`` of every series."""
    index: int
    """NVML index of the GPU (for a MIG instance: of its parent GPU)."""
    name: str
    """NVML product name of this entity (a MIG instance's includes its profile)."""
    model: str
    """Product name of the physical GPU."""
    pci_bus_id: str
    """NVML form ``00000000:3B:00.0`` (the parent's for a MIG instance)."""
    minor_number: int | None = None
    """``/dev/nvidiaN`` minor number: GKE's device plugin names GPUs by it."""
    parent_uuid: str | None = None
    """Set for MIG instances only."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None
    """``1g.10gb`` and the like, for MIG instances."""
    numa_node: int | None = None
    serial: str | None = None
    gpu_instance_profile_id: int | None = None
    """MIG: the GPU instance's profile id (``nvmlGpuInstanceGetInfo`` ``profileId``,
    e.g. 19 for ``1g.10gb`` on an H100), as NVIDIA's DRA driver names devices."""
    placement_start: int | None = None
    """MIG: the first memory slice of the GPU instance's placement on its GPU."""
    vbios_version: str | None = None
    """``nvmlDeviceGetVbiosVersion`` (whole GPUs only)."""

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


@dataclass(frozen=True)
class ProcessUsage:
    """One compute process on a device in one sample, as NVML reports it.

    The shares are fractions (0..1) of the window since the device's previous
    sample; ``None`` when NVML could not say (no per-process utilization on
    MIG, or the call failed). A process NVML sampled no activity for has 0.
    """

    pid: int
    """Host PID (NVML reports PIDs of the host's PID namespace)."""
    used_memory: int | None = None
    """Bytes of GPU memory the process holds; ``None`` when NVML does not say."""
    sm: float | None = None
    memory: float | None = None
    """Memory-controller (framebuffer bandwidth) share, not memory held."""
    encoder: float | None = None
    decoder: float | None = None


class XidEvent(NamedTuple):
    """One XID event as NVML delivered it: the code, when it was read, and the MIG
    GPU/compute instance ids NVML gave (``None`` where they do not apply)."""

    code: int
    time: float
    """Wall-clock time (epoch seconds) the event was read."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class DeviceSample:
    """One device's readings in one sample, in NVML's own units.

    ``values`` is keyed by the catalog's source keys; a key is absent when the
    value could not be read (not supported, no permission, transient error),
    never zero or NaN in its place.
    """

    device: Device
    state: str = OK
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _EMPTY)
    """Cumulative XID events seen since start, by XID code."""
    last_xid: int | None = None
    """The most recent XID code (what dcgm-exporter's XID_ERRORS shows)."""
    xid_events: tuple[XidEvent, ...] = ()
    """The XID events read in this sample (on a GPU, not its MIG instances), oldest first."""
    error: str | None = None
    """Why the device is failed, when it is."""
    hung: str | None = None
    """Set while a driver call on the device has not returned: what hangs, for how long.
    Its values are then omitted; ``state`` is the last one read."""
    age: float = 0.0
    """Seconds from this device's last finished read to the end of the sample."""
    processes: tuple[ProcessUsage, ...] | None = None
    """The device's compute processes, when process usage is on and NVML listed them
    (``None``: not read). A whole GPU in MIG mode lists only processes outside its
    instances; each instance lists its own."""
    process_utilization: bool = False
    """Whether the processes' shares were read this sample."""
    unsupported: int = 0
    """NVML reads (calls, fields, readers) the device refused as not supported: not asked
    again, their values omitted."""
    not_available: int = 0
    """Values this sample omitted because NVML answered its "not available" value or one
    outside physics."""

    @property
    def readable(self) -> bool:
        return self.state != FAILED and self.hung is None


# --- what the attribution stage hands on -------------------------------------------


@dataclass(frozen=True)
class ResourceSummary:
    """Allocated vs allocatable device ids of one resource name on this node.

    ``allocatable`` is ``None`` when the kubelet did not say (v1alpha1,
    GetAllocatableResources unavailable, or a DRA driver, which that RPC
    does not cover). Shared ids count one each, as the kubelet counts them.
    """

    resource_name: str
    allocated: int
    allocatable: int | None


@dataclass(frozen=True)
class UnresolvedId:
    """An allocated id that was skipped; the attribution stage logs each one once."""

    resource_name: str
    device_id: str
    reason: str


@dataclass(frozen=True)
class PodUsage:
    """What one container's processes use of one device in one sample (process usage).

    ``pod`` is the workload the processes run in: a pod's container, or a
    container outside Kubernetes. It is ``None`` for the processes that map to
    none (host processes, processes whose ``/proc`` entry is gone or not
    visible, pods whose name is not found): they are summed in one row per
    device. A pod's ``container`` is empty when the pod is known but not
    which of its containers runs the process. Sums and shares add up the
    container's processes; a share is ``None`` when NVML gave none for the
    device, the memory when it gave none
    for any of the processes.
    """

    uuid: str
    pod: Owner | None
    processes: int
    used_memory: int | None = None
    sm: float | None = None
    memory: float | None = None
    encoder: float | None = None
    decoder: float | None = None


@dataclass(frozen=True)
class PodEnergy:
    """Energy one container used on one device since the collector started, in mJ.

    ``pod`` is ``None`` for the device's unattributed energy: idle power,
    processes of no pod, and (on the GPU whose counter it is) the energy from
    before the collector started. ``rule`` names how the device's energy
    is split now (:mod:`otel_gpu.attribute.k8s.energy`).
    """

    uuid: str
    pod: Owner | None
    millijoules: int
    rule: str


_NO_HOLDERS: tuple[Holder, ...] = ()


class Attribution:
    """Which containers hold which device: the join's result, immutable and thread-safe.

    :meth:`series_pods` is the one rule for which pod labels a device's series
    carry; :meth:`allocations` the one list of allocation rows. Every output of
    the metrics (OpenTelemetry instruments, the dcgm and kubelet names, OTLP
    Resources through the instruments' attributes) asks these two.
    """

    def __init__(
        self,
        holders: Mapping[str, tuple[Holder, ...]] = _EMPTY,
        summary: tuple[ResourceSummary, ...] = (),
        numa: Mapping[str, tuple[int, ...]] = _EMPTY,
        alignment: tuple[NumaAlignment, ...] = (),
        unresolved: tuple[UnresolvedId, ...] = (),
        replicas: Mapping[str, int] = _EMPTY,
    ) -> None:
        self._holders = MappingProxyType(dict(holders))
        self._owners = MappingProxyType(
            {uuid: hs[0] for uuid, hs in holders.items() if len(hs) == 1 and not hs[0].shared}
        )
        rows = {
            AllocationRow(uuid, h.ref, h.replica, h.resource_name)
            for uuid, hs in holders.items()
            for h in hs
        }
        self._rows = tuple(sorted(rows, key=_row_key))
        self._summary = summary
        self._numa = MappingProxyType(dict(numa))
        self._alignment = alignment
        self.unresolved: tuple[UnresolvedId, ...] = unresolved
        """Allocated ids skipped (unknown format or no such device), distinct."""
        self._replicas = MappingProxyType(dict(replicas))

    def series_pods(self, uuid: str, *, per_sharer: bool = False) -> tuple[PodRef, ...]:
        """The containers whose labels go on ``uuid``'s series, one copy of the series each.

        A device held whole by one container gets that container. A shared or
        free device gets none (its holders are in :meth:`allocations`), unless
        ``per_sharer`` asks for one copy per distinct holding container, as
        dcgm-exporter and the kubelet did.
        """
        owner = self._owners.get(uuid)
        if owner is not None:
            return (owner.ref,)
        if not per_sharer:
            return ()
        return tuple(dict.fromkeys(h.ref for h in self._holders.get(uuid, _NO_HOLDERS)))

    def allocations(self, uuid: str | None = None) -> tuple[AllocationRow, ...]:
        """One row per (device uuid, pod, namespace, container, replica); all, or one device's."""
        if uuid is None:
            return self._rows
        return tuple(r for r in self._rows if r.uuid == uuid)

    def holders(self, uuid: str) -> tuple[Holder, ...]:
        """Every container holding ``uuid`` (GPU or MIG), sorted; empty if none."""
        return self._holders.get(uuid, _NO_HOLDERS)

    def exclusive_owner(self, uuid: str) -> Holder | None:
        """The one container holding ``uuid`` whole, or ``None``."""
        return self._owners.get(uuid)

    def advertised_replicas(self, uuid: str) -> int | None:
        """Shared ids (time-slicing or MPS replicas) the kubelet can allocate on ``uuid``;
        None where it did not say (no GetAllocatableResources, or not shared)."""
        return self._replicas.get(uuid)

    def attributed_uuids(self) -> frozenset[str]:
        return frozenset(self._holders)

    def summary(self) -> tuple[ResourceSummary, ...]:
        """Allocated vs allocatable per resource name, sorted by name."""
        return self._summary

    def numa_nodes(self, uuid: str) -> tuple[int, ...]:
        """NUMA node(s) of a device: API topology, else NVML, else sysfs."""
        return self._numa.get(uuid, ())

    def numa_node(self, uuid: str) -> int | None:
        nodes = self._numa.get(uuid)
        return nodes[0] if nodes else None

    def numa_alignment(self) -> tuple[NumaAlignment, ...]:
        """For containers with exclusive CPUs: how many sit on their GPU's node."""
        return self._alignment

    def __repr__(self) -> str:
        return (
            f"Attribution(devices={len(self._holders)}, rows={len(self._rows)}, "
            f"unresolved={len(self.unresolved)})"
        )


def _row_key(row: AllocationRow) -> tuple[str, str, str, str, int, str]:
    replica = -1 if row.replica is None else row.replica
    return (row.uuid, row.namespace, row.pod, row.container, replica, row.resource_name)


@dataclass(frozen=True)
class HolderTime:
    """GPU time one workload held and kept busy on one device (:mod:`otel_gpu.attribute.gputime`).

    ``allocated``/``active``: GPU-microseconds held (times its share of the GPU) and kept busy
    (at most ``allocated``). ``idle_s``: seconds held with no process or activity, now (0 while
    busy; None if unknown or not held); ``idle``: the latest sample found it so. ``share``,
    ``active_share``: of the GPU, held and kept busy in the latest sample (0, None if not held).
    """

    uuid: str
    holder: Workload
    allocated: int
    active: int
    idle_s: float | None = None
    idle: bool | None = None
    share: float = 0.0
    active_share: float | None = None


@dataclass(frozen=True)
class DeviceTime:
    """One device's GPU time no holder accounts for, in GPU-microseconds.

    ``unallocated``: device time no holder held (capacity left); ``outside``: time
    processes no holder accounts for kept the device busy; ``counted``: all the device
    time counted. ``outside_now``: who uses it outside any allocation now
    (:data:`otel_gpu.attribute.gputime.OUTSIDE_KINDS`).
    """

    uuid: str
    unallocated: int
    outside: int
    counted: int
    outside_now: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuTime:
    """The GPU time ledger after one sample (:mod:`otel_gpu.attribute.gputime`)."""

    holders: tuple[HolderTime, ...] = ()
    devices: tuple[DeviceTime, ...] = ()
    idle_threshold_s: float = 1800.0


@dataclass(frozen=True)
class KubeletStats:
    """Self-metrics of the kubelet poller, copied out under its short lock."""

    requests: Mapping[tuple[str, str], int] = field(default_factory=lambda: _EMPTY)
    """Calls made, by (rpc short name, gRPC status code name such as ``OK``)."""
    last_success_monotonic: float | None = None
    pods: int = 0
    devices: int = 0
    source: str | None = None
    consecutive_failures: int = 0
    socket_present: bool | None = None
    """``None`` until the first poll."""


@dataclass(frozen=True)
class Pods:
    """Kubernetes attribution joined to one snapshot's devices."""

    attribution: Attribution
    kubelet: KubeletStats | None = None
    mapping_taken_monotonic: float | None = None
    """When the kubelet answered the List this attribution comes from."""
    usage: tuple[PodUsage, ...] = ()
    """Per (device, container) usage, when process usage is on: a row for every
    container with processes on a device and every container holding one."""
    energy: tuple[PodEnergy, ...] = ()
    """Cumulative energy per (device, container), and per device for no pod
    (:mod:`otel_gpu.attribute.k8s.energy`): a GPU's rows, its MIG instances' included,
    sum to its energy counter."""


@dataclass(frozen=True)
class ContainerStats:
    """Self-metrics of the container runtime poller."""

    requests: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Calls made, by outcome (``ok``, or what went wrong)."""
    containers: int = 0
    """Containers the runtime listed in its last good answer."""
    socket_present: bool | None = None


@dataclass(frozen=True)
class Containers:
    """Containers outside Kubernetes joined to one snapshot's devices (process usage on)."""

    devices: Mapping[str, tuple[ContainerRef, ...]] = field(default_factory=lambda: _EMPTY)
    """Device uuid -> the containers with processes on it, sorted; devices without any
    are absent."""
    usage: tuple[PodUsage, ...] = ()
    """Per (device, container) usage, and one row per device for the processes in no
    container, where no kubelet answer gives the pods' rows."""
    stats: ContainerStats | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one sample read. ``seq`` increases by one per sample."""

    seq: int
    taken_at: float
    """Wall-clock time (epoch seconds) when the sample finished."""
    taken_monotonic: float
    """Monotonic time when the sample finished: ages are measured with it."""
    duration: float
    """Seconds the sample took."""
    driver_version: str | None
    devices: tuple[DeviceSample, ...] = ()
    nvml_calls: int = 0
    """NVML calls made since start, including this sample's."""
    reader_failures: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Unexpected failures by reader since start (each cost that reader's values on one
    device for one sample), every reader the sampler uses present from 0."""
    errors: tuple[str, ...] = field(default=())
    """Problems worth showing in ``check`` and ``/readyz``."""
    notes: tuple[str, ...] = field(default=())
    """What is absent by design (a GPU without profiling counters): ``check`` shows it as
    a note, not a problem."""
    pods: Pods | None = None
    """Set when Kubernetes pod attribution is on."""
    jobs: Mapping[str, tuple[JobRef, ...]] | None = None
    """HPC jobs per device uuid, sorted, immutable; None while off (otel_gpu.attribute.hpc)."""
    job_pids: frozenset[int] | None = None
    """The GPU processes a Slurm job's cgroup holds (None: not read): the jobs' own, told apart."""
    containers: Containers | None = None
    """Set when container attribution outside Kubernetes is on
    (:mod:`otel_gpu.attribute.container`)."""
    gpu_time: GpuTime | None = None
    """GPU time allocated and active per workload (:mod:`otel_gpu.attribute.gputime`)."""

    def healthy_devices(self) -> int:
        """Devices that answered this sample and are not failed."""
        return sum(1 for d in self.devices if d.readable)

    def series_pods(self, uuid: str, *, per_sharer: bool = False) -> tuple[PodRef, ...]:
        """See :meth:`Attribution.series_pods`; none without Kubernetes attribution."""
        if self.pods is None:
            return ()
        return self.pods.attribution.series_pods(uuid, per_sharer=per_sharer)

    def allocations(self, uuid: str | None = None) -> tuple[AllocationRow, ...]:
        """See :meth:`Attribution.allocations`; none without Kubernetes attribution."""
        if self.pods is None:
            return ()
        return self.pods.attribution.allocations(uuid)

    def series_jobs(self, uuid: str) -> tuple[JobRef, ...]:
        """The HPC jobs using ``uuid`` (GPU or MIG instance), sorted; none when off."""
        if self.jobs is None:
            return ()
        return self.jobs.get(uuid, ())

    def series_containers(self, uuid: str) -> tuple[ContainerRef, ...]:
        """The container outside Kubernetes using ``uuid`` alone (its processes are the
        only ones on it in a container); none when several share it, or when off."""
        if self.containers is None:
            return ()
        found = self.containers.devices.get(uuid, ())
        return found if len(found) == 1 else ()

    def series_workloads(self, uuid: str) -> tuple[Workload, ...]:
        """Every workload whose attributes go on ``uuid``'s series: the pod holding it
        whole, the HPC jobs using it, the one container outside Kubernetes using it."""
        return (*self.series_pods(uuid), *self.series_jobs(uuid), *self.series_containers(uuid))

    def workload_attributes(self, uuid: str) -> dict[str, str]:
        """The attributes of :meth:`series_workloads` on one series."""
        return workload_attributes(self.series_workloads(uuid))

    def usage(self) -> tuple[PodUsage, ...]:
        """Per (device, workload) usage rows: the pods', and the containers' outside
        Kubernetes where no kubelet answer gave the pods' rows."""
        pods = self.pods.usage if self.pods is not None else ()
        if pods or self.containers is None:
            return pods
        return self.containers.usage
