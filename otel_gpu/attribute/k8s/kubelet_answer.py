"""The kubelet's Pod Resources answer, typed: what one ``List`` says about GPUs.

The parsed protobuf is turned into :class:`Allocation` rows here, once per
answer, each carrying the container's :class:`~otel_gpu.workload.PodRef`
made from the pod's entry; that same reference is what the attribution's
holders, allocation rows and every output name the container with. Nothing
here imports gRPC or the protobuf runtime (the messages are only read), so
the attribution stage can name these types on a node without a kubelet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.workload import HeldByPod, PodRef

if TYPE_CHECKING:
    from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
    from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2

__all__ = [
    "EMPTY_STATE",
    "AllocatableDevice",
    "Allocation",
    "PodResourcesState",
    "allocatable_from_v1",
    "allocations_from_v1",
    "allocations_from_v1alpha1",
]


@dataclass(frozen=True)
class Allocation(HeldByPod):
    """One device held by one container.

    There is one per (pod, container, resource, device id): the API repeats a
    device once per NUMA node it reports, and those are merged here. For a
    DRA device ``resource_name`` and ``driver`` are the driver name and
    ``device_id`` the DRA device name.
    """

    ref: PodRef
    resource_name: str
    device_id: str
    numa_nodes: tuple[int, ...] = ()
    """Empty when the kubelet reported no topology."""
    cpu_ids: tuple[int, ...] = ()
    """The container's exclusive CPUs (static CPU manager only)."""
    claim_name: str | None = None
    claim_namespace: str | None = None
    driver: str | None = None
    pool: str | None = None
    share_id: str | None = None
    """Set when a DRA device is shared through consumable capacity."""


class AllocatableDevice(NamedTuple):
    """A device the kubelet could hand out, with its NUMA nodes (may be empty)."""

    resource_name: str
    device_id: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class PodResourcesState:
    """What the last successful poll saw. Never mutated; replaced whole.

    ``allocatable`` is ``None`` when unknown (v1alpha1 kubelet, the RPC not
    implemented, or not fetched yet), which is different from "nothing".
    """

    allocations: tuple[Allocation, ...] = ()
    allocatable: tuple[AllocatableDevice, ...] | None = None
    taken_monotonic: float | None = None
    source: str | None = None
    """``"v1"``, ``"v1alpha1"``, or ``None`` for the empty state."""
    pod_count: int = field(init=False, default=0)
    """Distinct pods holding at least one attributed device."""
    device_count: int = field(init=False, default=0)
    """Distinct (resource name, device id) pairs allocated."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "pod_count", len({(a.namespace, a.pod) for a in self.allocations})
        )
        object.__setattr__(
            self,
            "device_count",
            len({(a.resource_name, a.pool, a.device_id) for a in self.allocations}),
        )


EMPTY_STATE = PodResourcesState()


def _numa_nodes(message: v1_pb2.ContainerDevices) -> tuple[int, ...]:
    # NUMA node 0 is an empty NUMANode message: presence of the topology
    # field and of each list entry is what counts, never the ID's truthiness.
    if not message.HasField("topology"):
        return ()
    return tuple(node.ID for node in message.topology.nodes)


_Merged = dict[tuple[str | None, ...], tuple[Allocation, set[int]]]


def _build(merged: _Merged) -> tuple[Allocation, ...]:
    return tuple(
        replace(a, numa_nodes=tuple(sorted(numa))) if numa else a
        for a, numa in merged.values()
    )


def allocations_from_v1(
    response: v1_pb2.ListPodResourcesResponse, accept: ResourceFilter
) -> tuple[Allocation, ...]:
    """Flatten a v1 List reply into deduplicated GPU allocations.

    Containers without accepted devices (finished pods, CPU-only containers)
    contribute nothing.
    """
    merged: _Merged = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            if not c.devices and not c.dynamic_resources:
                continue
            ref = PodRef(pod.name, pod.namespace, c.name)
            cpu_ids = tuple(sorted(set(c.cpu_ids)))
            for dev in c.devices:
                rname = dev.resource_name
                if not dev.device_ids or not accept.accepts_resource(rname):
                    continue
                numa = _numa_nodes(dev)
                for device_id in dev.device_ids:
                    key = (pod.namespace, pod.name, c.name, rname, device_id)
                    entry = merged.get(key)
                    if entry is None:
                        merged[key] = (Allocation(ref, rname, device_id, cpu_ids=cpu_ids),
                                       set(numa))
                    else:
                        entry[1].update(numa)
            for dyn in c.dynamic_resources:
                for res in dyn.claim_resources:
                    driver = res.driver_name
                    if not res.device_name or not accept.accepts_driver(driver):
                        continue
                    share_id = res.share_id if res.HasField("share_id") else None
                    dra_key = (
                        pod.namespace, pod.name, c.name, driver, res.pool_name,
                        res.device_name, dyn.claim_namespace, dyn.claim_name, share_id,
                    )  # fmt: skip
                    if dra_key in merged:
                        continue
                    merged[dra_key] = (Allocation(
                        ref, driver, res.device_name, cpu_ids=cpu_ids,
                        claim_name=dyn.claim_name or None,
                        claim_namespace=dyn.claim_namespace or None,
                        driver=driver, pool=res.pool_name or None, share_id=share_id,
                    ), set())
    return _build(merged)


def allocations_from_v1alpha1(
    response: v1alpha1_pb2.ListPodResourcesResponse, accept: ResourceFilter
) -> tuple[Allocation, ...]:
    """Flatten a v1alpha1 List reply (devices only: no NUMA, CPUs or DRA)."""
    merged: _Merged = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            ref = PodRef(pod.name, pod.namespace, c.name)
            for dev in c.devices:
                rname = dev.resource_name
                if not accept.accepts_resource(rname):
                    continue
                for device_id in dev.device_ids:
                    key = (pod.namespace, pod.name, c.name, rname, device_id)
                    if key not in merged:
                        merged[key] = (Allocation(ref, rname, device_id), set())
    return _build(merged)


def allocatable_from_v1(
    response: v1_pb2.AllocatableResourcesResponse, accept: ResourceFilter
) -> tuple[AllocatableDevice, ...]:
    """Accepted allocatable devices, one per (resource, id), NUMA nodes merged."""
    merged: dict[tuple[str, str], set[int]] = {}
    for dev in response.devices:
        if not accept.accepts_resource(dev.resource_name):
            continue
        numa = _numa_nodes(dev)
        for device_id in dev.device_ids:
            merged.setdefault((dev.resource_name, device_id), set()).update(numa)
    return tuple(
        AllocatableDevice(rname, device_id, tuple(sorted(numa)))
        for (rname, device_id), numa in merged.items()
    )
