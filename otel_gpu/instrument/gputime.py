"""The GPU time ledger's rows as catalog rows: time per pod, container and job, per device.

Each workload kind keeps its family (``nvidia.gpu.k8s.*``, ``nvidia.gpu.container.*``,
``nvidia.gpu.hpc.*``) with its own attributes, so with OTLP each row goes under its
workload's Resource, as energy does. The ledger counts GPU-microseconds (exact sums); the
instruments say seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import is_

from otel_gpu.instrument.attributes import HW_ID
from otel_gpu.instrument.schema import Kind, Metric, Observation
from otel_gpu.snapshot import DeviceTime, GpuTime, HolderTime, Snapshot
from otel_gpu.workload import (
    CONTAINER_ATTRIBUTES,
    HPC_JOB_ID,
    POD_ATTRIBUTES,
    ContainerRef,
    JobRef,
    PodRef,
    Workload,
)

OUTSIDE_KIND = "nvidia.gpu.outside.kind"
"""Who uses a device outside any allocation: unallocated_device, other_workload, host."""
_US = 1e6
_Attrs = Mapping[str, str]
_SOURCE = ("collector (GPU time ledger): the sample interval times the holder's share "
           "(whole GPU 1, MIG compute slices / the GPU's, replicas held / advertised)")
_ACTIVE = ("the same interval times its activity: GPM GRAPHICS_UTIL, else "
           "nvmlDeviceGetUtilizationRates .gpu (MIG: the instance's GPM GRAPHICS_UTIL, else "
           "SM_UTIL); shared: the holder's per-process smUtil, at most its allocated time")

_FAMILIES: tuple[tuple[str, type, tuple[str, ...], str], ...] = (
    ("nvidia.gpu.k8s.", PodRef, POD_ATTRIBUTES, "pod container the kubelet names"),
    ("nvidia.gpu.container.", ContainerRef, CONTAINER_ATTRIBUTES,
     "container outside Kubernetes with processes on it"),
    ("nvidia.gpu.hpc.", JobRef, (HPC_JOB_ID,), "HPC job (mapping directory, Slurm cgroups)"),
)


_MAX_DEVICES = 4096
"""Device sets kept at most (devices come and go only on hot-plug)."""


class _Sets:
    """The ledger's rows with their attribute sets, by workload kind: worked out once per
    ledger (nine metrics read each), and the same set objects again while the rows' holders
    stay (the ledger hands out the same holder objects while they do), so that 500 pods
    cost no new dicts. Only the latest ledger's sets are kept, each state replaced whole
    (never changed in place), as another thread may collect from another snapshot."""

    def __init__(self) -> None:
        self._last: tuple[GpuTime | None, dict[type, list[tuple[HolderTime, _Attrs]]]] = (
            None, {})
        self._holders: tuple[list[Workload], list[str], list[_Attrs]] = ([], [], [])
        """The last rows' holders and devices, and their sets, in order."""
        self._devices: dict[str, _Attrs] = {}

    def holders(self, ledger: GpuTime, kind: type) -> list[tuple[HolderTime, _Attrs]]:
        owner, by_kind = self._last
        if owner is not ledger:
            by_kind = {}
            for row, attrs in zip(ledger.holders, self._holder_sets(ledger.holders),
                                  strict=True):
                by_kind.setdefault(type(row.holder), []).append((row, attrs))
            self._last = (ledger, by_kind)
        return by_kind.get(kind, [])

    def _holder_sets(self, rows: tuple[HolderTime, ...]) -> list[_Attrs]:
        holders, uuids, sets = self._holders
        now = [row.holder for row in rows]
        devices = [row.uuid for row in rows]
        if len(now) == len(holders) and all(map(is_, now, holders)) \
                and all(map(is_, devices, uuids)):
            return sets
        known = {(u, h): (h, a) for h, u, a in zip(holders, uuids, sets, strict=True)}
        made = []
        for row in rows:
            found = known.get((row.uuid, row.holder))
            # by identity: an equal pod may name its UID where the kept one did not
            made.append(found[1] if found is not None and found[0] is row.holder
                        else {HW_ID: row.uuid, **row.holder.attributes()})
        self._holders = (now, devices, made)
        return made

    def device(self, uuid: str) -> _Attrs:
        found = self._devices.get(uuid)
        if found is None:
            if len(self._devices) >= _MAX_DEVICES:  # devices replaced again and again
                self._devices = {}
            found = self._devices[uuid] = {HW_ID: uuid}
        return found


_SETS = _Sets()


def _holders(kind: type, value: Callable[[HolderTime], float | None],
             ) -> Callable[[Snapshot, float], Iterable[Observation]]:
    def observe(snapshot: Snapshot, now: float) -> Iterable[Observation]:
        if snapshot.gpu_time is None:
            return []
        rows = _SETS.holders(snapshot.gpu_time, kind)
        return [(got, attrs) for row, attrs in rows if (got := value(row)) is not None]

    return observe


def _devices(value: Callable[[DeviceTime], float]
             ) -> Callable[[Snapshot, float], Iterable[Observation]]:
    def observe(snapshot: Snapshot, now: float) -> Iterable[Observation]:
        if snapshot.gpu_time is None:
            return []
        return [(value(row), _SETS.device(row.uuid)) for row in snapshot.gpu_time.devices]

    return observe


def outside_use(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    if snapshot.gpu_time is not None:
        for row in snapshot.gpu_time.devices:
            for kind in row.outside_now:
                yield 1.0, {HW_ID: row.uuid, OUTSIDE_KIND: kind}


def _family(prefix: str, kind: type, attributes: tuple[str, ...], who: str
            ) -> tuple[Metric, ...]:
    attrs = (HW_ID, *attributes)
    return (
        Metric(
            prefix + "time.allocated", Kind.COUNTER, "s",
            f"GPU-seconds each {who} held a device since the collector started, weighted "
            "by its share of the GPU (one whole GPU for one second is 1).",
            per_node=_holders(kind, lambda r: r.allocated / _US),
            attributes=attrs, source_doc=_SOURCE,
        ),
        Metric(
            prefix + "time.active", Kind.COUNTER, "s",
            f"Of the GPU-seconds allocated to each {who}, those its work kept the device "
            "busy (never more than allocated).",
            per_node=_holders(kind, lambda r: r.active / _US),
            attributes=attrs, source_doc=_ACTIVE,
        ),
        Metric(
            prefix + "idle.duration", Kind.GAUGE, "s",
            f"How long each {who} has held a device with no process on it or no activity "
            "(0 while it uses it; absent where neither can be told).",
            per_node=_holders(kind, lambda r: r.idle_s),
            attributes=attrs,
            source_doc="collector (GPU time ledger): processes listed, activity as "
            "time.active",
        ),
    )


METRICS: tuple[Metric, ...] = (
    *(m for family in _FAMILIES for m in _family(*family)),
    Metric(
        "nvidia.gpu.time.unallocated", Kind.COUNTER, "s",
        "GPU-seconds of a device no pod, container or job held since the collector started "
        "(with the holders' nvidia.gpu.*.time.allocated, the device time counted).",
        per_node=_devices(lambda d: d.unallocated / _US),
        attributes=(HW_ID,), source_doc=_SOURCE,
    ),
    Metric(
        "nvidia.gpu.time.outside", Kind.COUNTER, "s",
        "GPU-seconds processes no holder accounts for kept a device busy (on a device "
        "nobody holds, all its activity while a process runs there).",
        per_node=_devices(lambda d: d.outside / _US),
        attributes=(HW_ID,),
        source_doc="collector (GPU time ledger): the device's activity while unheld and a "
        "process runs there or processes are not read (none from a GPU in MIG mode: its "
        "activity is its instances'), else the per-process smUtil of processes in no holder",
    ),
    Metric(
        "nvidia.gpu.outside.use", Kind.GAUGE, "1",
        "1 for each device used outside any allocation now, by nvidia.gpu.outside.kind: "
        "unallocated_device (a process on a device nobody holds), other_workload (a "
        "workload's process on a device allocated to another), host (a process in no "
        "workload on a held device).",
        per_node=outside_use,
        attributes=(HW_ID, OUTSIDE_KIND),
        source_doc="nvmlDeviceGetComputeRunningProcesses joined with the holders",
    ),
)
