"""Which pods hold which GPU or MIG instance: a pure join of devices and state.

Rules, chosen so that sums over pods never count a GPU twice:

- A device held by exactly one container, not through a shared id, has an
  *exclusive owner*: its series may carry ``k8s.pod.name``,
  ``k8s.namespace.name`` and ``k8s.container.name``.
- A device reached through a shared id (time-slicing or MPS replicas
  ``::N``, GKE ``/vgpuK``, a DRA ``share_id``) or held by several containers
  has no owner; :meth:`Attribution.allocations` gives one row per holder
  instead, for an allocation metric valued 1. Exclusive holders get rows too.
- A MIG instance's holder does not make anyone the owner of its parent GPU;
  the parent only gets an owner when the whole GPU id is allocated.

:func:`attribute` reads two small sysfs files per GPU for NUMA information
(under ``sysfs_root`` so tests can supply a tree); :class:`Attributor` caches
the result per published state, so that cost is paid once per kubelet poll
rather than per scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from otel_gpu._files import FileError, read_attribute
from otel_gpu._log import LogLimiter
from otel_gpu.attribute.k8s.device_ids import (
    DeviceRef,
    DeviceResolver,
    parse_device_id,
    parse_dra_device,
)
from otel_gpu.attribute.k8s.kubelet_answer import Allocation, PodResourcesState
from otel_gpu.snapshot import Attribution, Device, ResourceSummary, UnresolvedId
from otel_gpu.workload import Holder, NumaAlignment, PodRef

log = logging.getLogger(__name__)

PodUids = Callable[[str, str], "str | None"]
"""(namespace, pod name) -> the pod's UID, where the node's files say it."""

__all__ = [
    "Attribution",
    "Attributor",
    "ResourceSummary",
    "UnresolvedId",
    "attribute",
    "parse_cpulist",
    "pci_bus_id_to_sysfs",
]

UNKNOWN_FORMAT = "unknown device id format"
NO_SUCH_DEVICE = "no matching device on this node"


def _holder_key(h: Holder) -> tuple[str, str, str, int, str]:
    replica = -1 if h.replica is None else h.replica
    return (h.namespace, h.pod, h.container, replica, h.resource_name)


# --------------------------------------------------------------------------- sysfs


def pci_bus_id_to_sysfs(bus_id: str) -> str | None:
    """NVML ``00000000:3B:00.0`` -> sysfs ``0000:3b:00.0``; ``None`` if malformed."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return None
    domain, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        return None


def parse_cpulist(text: str) -> frozenset[int] | None:
    """Kernel cpulist (``0-27,56-83``) -> CPU ids; ``None`` if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            return None
        if first < 0 or last < first or last - first > 1 << 16:
            return None
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


UNUSABLE_EVERY_S = 3600.0
"""A sysfs file that exists but cannot be read is named once an hour at most."""
_unusable = LogLimiter(log, UNUSABLE_EVERY_S)


def _read(path: Path, consequence: str) -> str | None:
    """The file's text; ``None`` when it is missing, or when it cannot be used (a FIFO, a
    device, too large, unreadable), which one warning line names with what it costs."""
    try:
        return read_attribute(path)
    except FileError as exc:
        _unusable.log(str(path), logging.WARNING, "%s; %s", exc, consequence)
        return None


class _Sysfs:
    """Per-call memo of the few sysfs files attribution reads, through the bounded,
    non-blocking reader: a FIFO or a device where an attribute should be never blocks."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        self._pci: dict[str, int | None] = {}
        self._nodes: dict[int, frozenset[int] | None] = {}

    def pci_numa_node(self, bus_id: str) -> int | None:
        bdf = pci_bus_id_to_sysfs(bus_id)
        if bdf is None:
            return None
        if bdf not in self._pci:
            text = _read(self._root / "sys" / "bus" / "pci" / "devices" / bdf / "numa_node",
                         f"the NUMA node of GPU {bus_id} is not known from sysfs")
            try:
                node = int(text.strip()) if text is not None else -1
            except ValueError:
                node = -1
            self._pci[bdf] = node if node >= 0 else None
        return self._pci[bdf]

    def node_cpus(self, node: int) -> frozenset[int] | None:
        if node not in self._nodes:
            node_dir = self._root / "sys" / "devices" / "system" / "node" / f"node{node}"
            text = _read(node_dir / "cpulist", f"the NUMA alignment of containers with GPUs "
                         f"on NUMA node {node} is not reported")
            self._nodes[node] = parse_cpulist(text) if text is not None else None
        return self._nodes[node]


# --------------------------------------------------------------------------- join


def _parse(allocation: Allocation) -> DeviceRef | None:
    if allocation.driver is not None:
        return parse_dra_device(allocation.device_id)
    return parse_device_id(allocation.device_id)


def attribute(
    devices: Sequence[Device],
    state: PodResourcesState,
    sysfs_root: Path = Path("/"),
    *,
    resolver: DeviceResolver | None = None,
    uids: PodUids | None = None,
) -> Attribution:
    """Join the node's devices with the kubelet's allocations.

    ``resolver`` may be passed to reuse one built from the same ``devices``;
    ``uids`` gives each pod its UID (the kubelet's answer has none).
    Never raises for odd ids or missing sysfs files: those are skipped (ids
    are listed in :attr:`Attribution.unresolved`).
    """
    resolver = resolver or DeviceResolver(devices)
    by_uuid = {d.uuid: d for d in devices}
    sysfs = _Sysfs(sysfs_root)

    holders: dict[str, set[Holder]] = {}
    unresolved: dict[tuple[str, str], UnresolvedId] = {}
    api_numa: dict[str, set[int]] = {}
    resolved: list[tuple[Allocation, str]] = []
    ref_cache: dict[tuple[str | None, str], str | None] = {}
    pods: dict[PodRef, PodRef] = {}

    def pod_ref(ref: PodRef) -> PodRef:
        known = pods.get(ref)
        if known is None:
            known = pods[ref] = ref.with_uid(uids(ref.namespace, ref.pod)) if uids else ref
        return known

    def resolve(
        resource_name: str, device_id: str, driver: str | None, ref: DeviceRef | None
    ) -> str | None:
        key = (driver, device_id)
        if key in ref_cache:
            uuid = ref_cache[key]
        else:
            uuid = resolver.resolve(ref) if ref is not None else None
            ref_cache[key] = uuid
        if uuid is None:
            reason = UNKNOWN_FORMAT if ref is None else NO_SUCH_DEVICE
            unresolved.setdefault(
                (resource_name, device_id), UnresolvedId(resource_name, device_id, reason)
            )
        return uuid

    for a in state.allocations:
        ref = _parse(a)
        uuid = resolve(a.resource_name, a.device_id, a.driver, ref)
        if uuid is None or ref is None:
            continue
        shared = ref.shared or a.share_id is not None
        holders.setdefault(uuid, set()).add(
            Holder(pod_ref(a.ref), ref.share, a.resource_name, shared)
        )
        if a.numa_nodes:
            api_numa.setdefault(uuid, set()).update(a.numa_nodes)
        resolved.append((a, uuid))

    replicas: dict[str, int] = {}  # shared ids allocatable per device: its advertised replicas
    for entry in state.allocatable or ():
        ref = parse_device_id(entry.device_id)
        if not entry.numa_nodes and (ref is None or not ref.shared):
            continue
        uuid = resolver.resolve(ref) if ref is not None else None
        if uuid is None or ref is None:
            continue
        if ref.shared:
            replicas[uuid] = replicas.get(uuid, 0) + 1
        if entry.numa_nodes:
            api_numa.setdefault(uuid, set()).update(entry.numa_nodes)

    numa: dict[str, tuple[int, ...]] = {}
    for d in devices:
        nodes = _numa_for(d, by_uuid, api_numa, sysfs)
        if nodes:
            numa[d.uuid] = nodes

    alignment: dict[tuple[str, str, str, str], NumaAlignment] = {}
    for a, uuid in resolved:
        if not a.cpu_ids:
            continue
        key = (a.namespace, a.pod, a.container, uuid)
        nodes = numa.get(uuid, ())
        if key in alignment or not nodes:
            continue
        node_cpus: set[int] = set()
        for node in nodes:
            cpus = sysfs.node_cpus(node)
            if cpus is None:
                node_cpus = set()
                break
            node_cpus |= cpus
        if not node_cpus:
            continue
        mine = set(a.cpu_ids)
        alignment[key] = NumaAlignment(
            pod_ref(a.ref), uuid, nodes, len(mine & node_cpus) / len(mine)
        )

    return Attribution(
        {uuid: tuple(sorted(hs, key=_holder_key)) for uuid, hs in holders.items()},
        _summary(state),
        numa,
        tuple(alignment[k] for k in sorted(alignment)),
        tuple(unresolved.values()),
        replicas,
    )


def _numa_for(
    device: Device,
    by_uuid: Mapping[str, Device],
    api_numa: Mapping[str, set[int]],
    sysfs: _Sysfs,
) -> tuple[int, ...]:
    parent = by_uuid.get(device.parent_uuid) if device.parent_uuid else None
    for uuid in (device.uuid, parent.uuid if parent else None):
        if uuid is not None and api_numa.get(uuid):
            return tuple(sorted(api_numa[uuid]))
    for d in (device, parent):
        if d is not None and d.numa_node is not None and d.numa_node >= 0:
            return (d.numa_node,)
    node = sysfs.pci_numa_node(device.pci_bus_id) if device.pci_bus_id else None
    return (node,) if node is not None else ()


def _summary(state: PodResourcesState) -> tuple[ResourceSummary, ...]:
    allocated: dict[str, set[tuple[str | None, str]]] = {}
    dra: set[str] = set()
    for a in state.allocations:
        allocated.setdefault(a.resource_name, set()).add((a.pool, a.device_id))
        if a.driver is not None:
            dra.add(a.resource_name)
    allocatable: dict[str, set[str]] | None = None
    if state.allocatable is not None:
        allocatable = {}
        for entry in state.allocatable:
            allocatable.setdefault(entry.resource_name, set()).add(entry.device_id)
    names = set(allocated) | set(allocatable or ())
    return tuple(
        ResourceSummary(
            name,
            len(allocated.get(name, ())),
            None
            if allocatable is None or name in dra
            else len(allocatable.get(name, ())),
        )
        for name in sorted(names)
    )


class Attributor:
    """Recomputes :func:`attribute` only when the watcher publishes a new state.

    The watcher replaces its state object on every successful poll, so the
    identity of the state is a complete cache key; scrapes in between reuse
    the last result.
    """

    def __init__(self, devices: Sequence[Device], sysfs_root: Path = Path("/"),
                 uids: PodUids | None = None) -> None:
        self.devices = tuple(devices)
        self.sysfs_root = Path(sysfs_root)
        self._uids = uids
        self._resolver = DeviceResolver(self.devices)
        self._last: tuple[PodResourcesState, Attribution] | None = None

    def __call__(self, state: PodResourcesState) -> Attribution:
        last = self._last
        if last is not None and last[0] is state:
            return last[1]
        result = attribute(self.devices, state, self.sysfs_root, resolver=self._resolver,
                           uids=self._uids)
        self._last = (state, result)
        return result

