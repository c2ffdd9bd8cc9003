"""GPU time per workload: how long each holder held its devices, and how long it used them.

The question a platform team asks first is who holds the GPUs and how much of
that time they used. :class:`GpuTimeLedger` integrates it between samples, in
whole GPU-microseconds (one whole GPU for one microsecond is 1), for every
holder the attribution stages name:

holders of a device
    The containers the kubelet allocated it to; else the HPC jobs using it (the
    job mapping directory, the Slurm cgroups of its processes); else the
    containers outside Kubernetes whose processes run on it.
allocated
    The interval times the holder's share of the GPU: a whole GPU 1; a MIG
    instance its compute slices over the GPU's (7, 4 on an A30, from the
    profile: ``3g.40gb`` is 3/7); a time-sliced or MPS replica the holder's
    replicas over the replicas the kubelet advertises for that GPU
    (GetAllocatableResources), or over the replicas held where it does not say.
    Several whole holders of one device (HPC jobs, containers) split it evenly.
active
    The part of it the holder's work kept the device busy: the device's own
    activity where the holder is alone on it (GPM graphics engine activity,
    else NVML utilization; a MIG instance's GPM activity, which NVML gives per
    instance); the holder's own SM share from per-process utilization where it
    shares the device or others' processes run there (else the device's
    activity times its share). Never more than allocated.
unallocated, outside
    Per device: the time no holder held it, and the time processes no holder
    accounts for kept it busy: their own SM shares where it is held; all its
    activity where nobody holds it and a process runs there (or its processes
    are not read). A GPU in MIG mode is busy with its instances' work, so only
    processes it lists outside them count there: its free slices are
    unallocated, not used outside any allocation.

The interval between two samples of a GPU is accounted by the later sample's
holders and readings, as the energy ledger does
(:mod:`otel_gpu.attribute.k8s.energy`). A sample taken while pod attribution is
expected but missing (a held kubelet stage) leaves its interval to the next
sample with pods, for at most :data:`CARRY_MAX_S`. A GPU not in a sample (gone
from NVML's list) counts no time until it is back; a lost or hung GPU in it
counts allocated time but no activity. A holder that stops holding keeps its
row, at its final totals, for :data:`RETAIN_S` seconds (at most
:data:`MAX_GONE` rows), and continues from them if it comes back; a sample's
re-publication (new pods) counts nothing again but gives new holders rows at 0,
judged idle or not in it (their allocated time starts at that sample too).
So per device the holders' allocated time plus its unallocated time is the
device time counted, and active never exceeds allocated.

Two signals come from the same pass. A holder is *idle* while the device is
readable and it has no process there (where processes are read) or its active
time did not grow (where activity is known); ``idle_s`` says for how long.
Use *outside any allocation* is told apart as :data:`OUTSIDE_KINDS` says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from otel_gpu.attribute.k8s.energy import apportion, compute_slices
from otel_gpu.sample.sources import GPM_GRAPHICS, GPM_SM_ACTIVE, UTIL_GPU
from otel_gpu.snapshot import (
    DeviceSample,
    DeviceTime,
    GpuTime,
    HolderTime,
    PodUsage,
    Snapshot,
)
from otel_gpu.workload import Holder, JobRef, Workload

RETAIN_S = 900.0
"""Seconds a finished holder's row is kept at its final totals (as energy's rows)."""
MAX_GONE = 128
"""Finished rows kept at most; the oldest go first."""
CARRY_MAX_S = 600.0
"""Longest interval left to a later sample while pod attribution is missing."""
IDLE_THRESHOLD_S = 1800.0
"""Default of the ``idle_threshold`` setting: idle this long makes an idle allocation."""

UNALLOCATED_DEVICE = "unallocated_device"
"""A process on a device nobody holds."""
OTHER_WORKLOAD = "other_workload"
"""A workload's process on a device allocated to another workload."""
HOST = "host"
"""A process in no workload (a host process, or one whose cgroup names none) on a held device."""
OUTSIDE_KINDS = (UNALLOCATED_DEVICE, OTHER_WORKLOAD, HOST)

_US = 1_000_000


def gpu_slices(model: str, instances: Sequence[DeviceSample]) -> int:
    """A GPU's compute slices: 4 on an A30, 7 on the other MIG GPUs; never fewer than its
    instances take."""
    total = 4 if "A30" in model.upper() else 7
    return max(total, sum(compute_slices(s.device.mig_profile) for s in instances))


def activity(sample: DeviceSample) -> float | None:
    """The fraction of the interval the device was busy, 0..1: GPM graphics engine
    activity, else NVML utilization (a MIG instance: its GPM SM activity); None unread."""
    if not sample.readable:
        return None
    keys = (GPM_GRAPHICS.key, GPM_SM_ACTIVE.key if sample.device.is_mig else UTIL_GPU.key)
    for key in keys:
        value = sample.values.get(key)
        if value is not None:
            return min(1.0, max(0.0, value / 100.0))
    return None


def holder_shares(snapshot: Snapshot, uuid: str) -> dict[Workload, float]:
    """Each holder of ``uuid`` and its share of it (see the module docstring)."""
    return _shares(*_holding(snapshot, uuid))


def _holding(snapshot: Snapshot, uuid: str
             ) -> tuple[tuple[Holder, ...], int, tuple[Workload, ...]]:
    """What ``uuid``'s holders and shares follow from: the pods holding it and the replicas
    advertised, else the jobs or containers using it. Equal while the allocation stays (the
    same objects while the kubelet's answer does), so the shares are kept by it."""
    pods: tuple[Holder, ...] = ()
    if snapshot.pods is not None:
        attribution = snapshot.pods.attribution
        pods = attribution.holders(uuid)
        if pods:
            return pods, attribution.advertised_replicas(uuid) or 0, ()
    others: tuple[Workload, ...] = snapshot.series_jobs(uuid)
    if not others and snapshot.containers is not None:
        others = snapshot.containers.devices.get(uuid, ())
    return pods, 0, others


def _shares(pods: tuple[Holder, ...], advertised: int, others: tuple[Workload, ...]
            ) -> dict[Workload, float]:
    """The shares :func:`_holding`'s answer gives (see the module docstring)."""
    if pods:
        if any(h.shared for h in pods):
            replicas: dict[Workload, set[object]] = {}
            for h in pods:
                replicas.setdefault(h.ref, set()).add((h.resource_name, h.replica))
            whole = max(sum(len(r) for r in replicas.values()), advertised)
            return {ref: len(r) / whole for ref, r in replicas.items()}
        refs = list(dict.fromkeys(h.ref for h in pods))
        return dict.fromkeys(refs, 1.0 / len(refs))
    return dict.fromkeys(others, 1.0 / len(others)) if others else {}


@dataclass
class _Row:
    allocated: int = 0
    active: int = 0
    gone_since: float | None = None
    idle_since: float | None = None
    idle: bool | None = None
    share: float = 0.0
    active_share: float | None = None

    def set_idle(self, idle: bool | None, now: float) -> None:
        """The holder's idle state at ``now``: an idle stretch runs on while it cannot be
        told (None)."""
        self.idle = idle
        if idle is True and self.idle_since is None:
            self.idle_since = now
        elif idle is False:
            self.idle_since = None


class _Plan:
    """One device's holders, their rows and the weights its interval is split by, kept
    while what they follow from (:func:`_holding`) stays: at hundreds of pods a sample then
    only adds to the rows."""

    __slots__ = ("held", "keys", "rows", "shares", "source", "weights", "whole")

    def __init__(self, source: tuple[object, ...], held: dict[Workload, float],
                 rows: dict[tuple[str, Workload], _Row], uuid: str) -> None:
        self.source = source
        self.held = held
        self.keys = tuple((uuid, holder) for holder in held)
        self.rows = tuple(rows[key] for key in self.keys)
        self.shares = tuple(held.values())
        self.whole = len(held) == 1 and sum(self.shares) >= 1.0
        """A single holder of all of it: the device's activity is its own."""
        free = max(0.0, 1.0 - sum(self.shares))
        self.weights = {i: share for i, share in enumerate((*self.shares, free))}
        """:func:`apportion`'s weights by position, the capacity nobody holds last."""

    def split(self, delta: int) -> dict[int, int]:
        """``delta`` by position, as ``apportion`` splits it among the holders and the rest."""
        return apportion(delta, self.weights, len(self.shares))


_EMPTY = _Plan(((), 0, ()), {}, {}, "")


@dataclass
class _Device:
    unallocated: int = 0
    outside: int = 0
    counted: int = 0
    outside_now: tuple[str, ...] = ()
    gone_since: float | None = None


class GpuTimeLedger:
    """Cumulative GPU time per (device, holder); see the module docstring. Calls come one
    at a time (the publish loop's lock), so it keeps no lock."""

    def __init__(self, *, idle_threshold: float = IDLE_THRESHOLD_S, pods: bool = False,
                 retain: float = RETAIN_S, max_gone: int = MAX_GONE) -> None:
        self.idle_threshold = idle_threshold
        self.pods = pods
        """Whether pod attribution is on: a sample without pods is then carried."""
        self.retain = retain
        self.max_gone = max_gone
        self._rows: dict[tuple[str, Workload], _Row] = {}
        self._devices: dict[str, _Device] = {}
        self._at: dict[str, float] = {}
        """GPU uuid -> the monotonic time its time was last counted to."""
        self._seq: int | None = None
        self._plans: dict[str, _Plan] = {}
        """The latest snapshot's devices' plans: one gone from it is planned afresh."""
        self._live: frozenset[tuple[str, Workload]] = frozenset()
        """The (device, holder) pairs of the latest plans (the same set while they stay)."""
        self._released: frozenset[tuple[str, Workload]] | None = None
        """The live set the rows' ``gone_since`` were last set by."""
        self._gone: dict[tuple[str, Workload], float] = {}
        """The rows no longer held, and since when."""
        self._sorted: list[tuple[tuple[str, Workload], _Row]] | None = None
        """The rows in their published order; None once a row is added or dropped."""

    def update(self, snapshot: Snapshot) -> GpuTime:
        """The ledger after ``snapshot``; its interval is counted on its first call only."""
        now = snapshot.taken_monotonic
        plans = {s.device.uuid: self._plan(snapshot, s.device.uuid) for s in snapshot.devices}
        if plans.keys() != self._plans.keys() or any(
                plan is not self._plans[uuid] for uuid, plan in plans.items()):
            self._live = frozenset(key for plan in plans.values() for key in plan.keys)
        self._plans = plans
        if snapshot.seq != self._seq:
            self._seq = snapshot.seq
            self._count(snapshot, plans, now)
            self._release(self._live, set(plans), now)
        else:
            self._judge(snapshot, plans, now)
        return self._publish(self._live, now)

    def _plan(self, snapshot: Snapshot, uuid: str) -> _Plan:
        source = _holding(snapshot, uuid)
        plan = self._plans.get(uuid)
        if plan is not None and plan.source == source:
            return plan
        held = _shares(*source)
        for holder in held:
            if (uuid, holder) not in self._rows:
                self._rows[(uuid, holder)] = _Row()
                self._sorted = None
        return _Plan(source, held, self._rows, uuid)

    # --- one sample ---------------------------------------------------------------------

    def _count(self, snapshot: Snapshot, plans: Mapping[str, _Plan], now: float) -> None:
        carry = self.pods and snapshot.pods is None
        usage = _usage_by_device(snapshot)
        in_jobs = snapshot.job_pids
        instances: dict[str, list[DeviceSample]] = {}
        for s in snapshot.devices:
            if s.device.parent_uuid is not None:
                instances.setdefault(s.device.parent_uuid, []).append(s)
        roots = {s.device.uuid for s in snapshot.devices if not s.device.is_mig}
        self._at = {root: at for root, at in self._at.items() if root in roots}
        for s in snapshot.devices:
            if s.device.is_mig:
                continue
            root = s.device.uuid
            last = self._at.get(root)
            if carry and last is not None and now - last < CARRY_MAX_S:
                continue  # the next sample with pods counts this interval too
            self._at[root] = now
            delta = 0 if last is None else max(0, round((now - last) * _US))
            parts = instances.get(root)
            if not parts:
                self._device(s, delta, plans[root], usage.get(root, ()), now, 1.0, in_jobs)
                continue
            total = gpu_slices(s.device.model, parts)
            weights = {p.device.uuid: float(compute_slices(p.device.mig_profile))
                       for p in parts}
            weights[root] = float(total) - sum(weights.values())
            split = apportion(delta, weights, root)
            self._device(s, split.get(root, 0), _EMPTY, usage.get(root, ()), now,
                         weights[root] / total, in_jobs, instances=True)
            for part in parts:
                uuid = part.device.uuid
                self._device(part, split.get(uuid, 0), plans[uuid], usage.get(uuid, ()),
                             now, weights[uuid] / total, in_jobs)

    def _device(self, sample: DeviceSample, delta: int, plan: _Plan,
                usage: Sequence[PodUsage], now: float, weight: float,
                in_jobs: frozenset[int] | None, *, instances: bool = False) -> None:
        """One device's part of the interval: each holder's, the rest, and what is used
        outside any allocation. ``weight``: the device's part of its GPU (a MIG instance's
        slices over the GPU's), by which each holder's shares of it become shares of the GPU.
        ``in_jobs``: the GPU processes in a Slurm job (:attr:`Snapshot.job_pids`).
        ``instances``: a GPU in MIG mode, whose activity is its instances' work."""
        uuid = sample.device.uuid
        dev = self._devices.get(uuid)
        if dev is None:
            dev = self._devices[uuid] = _Device()
        dev.counted += delta
        held = plan.held
        split = plan.split(delta)
        dev.unallocated += split.get(len(plan.shares), 0)
        busy = activity(sample)
        outside = _outside_rows(sample, usage, held, in_jobs)
        dev.outside_now = _outside_kinds(sample, held, usage, outside)
        dev.outside += _outside_time(sample, delta, None if instances else busy, held, outside)
        alone = busy is not None and plan.whole and not outside
        by_holder: dict[object, list[PodUsage]] = {}
        for r in usage:
            by_holder.setdefault(r.pod, []).append(r)
        for i, (holder, share, row) in enumerate(zip(held, plan.shares, plan.rows,
                                                      strict=True)):
            allocated = split.get(i, 0)
            mine = by_holder.get(holder, ()) if by_holder else ()
            sm = [r.sm for r in mine if r.sm is not None] if mine else ()
            if alone:
                fraction: float | None = busy
            elif sm:
                fraction = sum(sm)
            else:
                fraction = None if busy is None else busy * share
            if fraction is None:
                active = 0
                row.active_share = None
            else:
                active = min(allocated, round(delta * fraction))
                row.active_share = weight * (fraction if fraction < share else share)
            row.allocated += allocated
            row.active += active
            row.share = weight * share
            row.set_idle(_idle(sample, holder, mine, delta, fraction, active), now)

    def _judge(self, snapshot: Snapshot, plans: Mapping[str, _Plan], now: float) -> None:
        """A re-publication's holders not judged yet (the kubelet's answer came after the
        sample): idle or not in this sample, as a holder in its first sample is, since
        their allocated time starts here too. Nothing is counted."""
        usage = _usage_by_device(snapshot)
        for s in snapshot.devices:
            plan = plans[s.device.uuid]
            for holder, row in zip(plan.held, plan.rows, strict=True):
                if row.idle is None:
                    mine = [r for r in usage.get(s.device.uuid, ()) if r.pod == holder]
                    row.set_idle(_idle(s, holder, mine, 0, None, 0), now)

    # --- bounds -------------------------------------------------------------------------

    def _release(self, live: frozenset[tuple[str, Workload]], present: set[str],
                 now: float) -> None:
        if live is not self._released:  # holders came or went: mark who left, who is back
            self._released = live
            self._gone = {}  # in the rows' order, which breaks ties between equal ages
            for key, row in self._rows.items():
                if key in live:
                    row.gone_since = None
                    continue
                if row.gone_since is None:
                    row.gone_since = now
                    row.idle, row.idle_since = None, None
                    row.share, row.active_share = 0.0, None
                self._gone[key] = row.gone_since
        if self._gone:
            gone = sorted(self._gone.items(), key=lambda g: g[1])
            extra = len(gone) - self.max_gone
            for i, (key, since) in enumerate(gone):
                if i < extra or now - since >= self.retain:
                    del self._rows[key], self._gone[key]
                    self._sorted = None
        absent = [uuid for uuid in self._devices if uuid not in present]
        kept = {uuid for uuid, _ in self._rows} if absent else set()
        for uuid in absent:
            away = self._devices[uuid]
            away.gone_since = now if away.gone_since is None else away.gone_since
            if uuid not in kept and now - away.gone_since >= self.retain:
                del self._devices[uuid]  # kept with its holders' rows: the sums hold
        for uuid in present:
            dev = self._devices.get(uuid)
            if dev is not None:
                dev.gone_since = None

    def _publish(self, live: frozenset[tuple[str, Workload]], now: float) -> GpuTime:
        """The rows in their order, sorted again only when a row came or went."""
        if self._sorted is None:
            self._sorted = sorted(self._rows.items(), key=_order)
        marked = live is self._released  # each row's gone_since says whether it is live
        holders = []
        for key, row in self._sorted:
            held = row.gone_since is None if marked else key in live
            idle: float | None = None
            if held and row.idle is not None:
                idle = now - row.idle_since if row.idle_since is not None else 0.0
            holders.append(HolderTime(key[0], key[1], row.allocated, row.active, idle,
                                      row.idle if held else None, row.share,
                                      row.active_share))
        devices = tuple(DeviceTime(uuid, d.unallocated, d.outside, d.counted, d.outside_now)
                        for uuid, d in sorted(self._devices.items()))
        return GpuTime(tuple(holders), devices, self.idle_threshold)


class GpuTimeStage:
    """The attribution stage that runs last (an :class:`~otel_gpu.attribute.enrich.Enricher`):
    sets :attr:`~otel_gpu.snapshot.Snapshot.gpu_time` from the workloads the others named.
    Pure arithmetic on the snapshot: no file or socket is read."""

    def __init__(self, ledger: GpuTimeLedger) -> None:
        self.ledger = ledger

    def process(self, snapshot: Snapshot) -> Snapshot:
        return replace(snapshot, gpu_time=self.ledger.update(snapshot))


def _usage_by_device(snapshot: Snapshot) -> dict[str, list[PodUsage]]:
    """The usage rows by device: the containers' outside Kubernetes on a device they hold
    (no pod does), else the pods' (else the containers'); jobs have none of their own."""
    out: dict[str, list[PodUsage]] = {}
    for row in snapshot.usage():
        out.setdefault(row.uuid, []).append(row)
    containers = snapshot.containers
    if containers is not None and containers.usage is not snapshot.usage():
        pods = snapshot.pods.attribution if snapshot.pods is not None else None
        mine: dict[str, list[PodUsage]] = {}
        for row in containers.usage:
            if row.uuid in containers.devices and (pods is None or not pods.holders(row.uuid)):
                mine.setdefault(row.uuid, []).append(row)
        out.update(mine)
    return out


def _outside_rows(sample: DeviceSample, usage: Sequence[PodUsage],
                  held: Mapping[Workload, float], in_jobs: frozenset[int] | None
                  ) -> list[PodUsage]:
    """The usage rows of processes no holder of the device accounts for. Jobs have none:
    on their devices, one row of the processes in no Slurm job (a job whose process runs
    there holds it) and in no pod's or container's row; none where no GPU process is in
    a job (other schedulers' mapping files), as the jobs' are not told from the host's."""
    if not held or not all(isinstance(h, JobRef) for h in held):
        return [r for r in usage if r.processes and r.pod not in held]
    rest = [p for p in sample.processes or () if p.pid not in (in_jobs or ())]
    theirs = [r for r in usage if r.processes and r.pod is not None]
    count = len(rest) - sum(r.processes for r in theirs)
    if not in_jobs or count <= 0:
        return []
    sm = sum(p.sm or 0.0 for p in rest) - sum(r.sm or 0.0 for r in theirs)
    return [PodUsage(sample.device.uuid, None, count, sm=max(0.0, sm))]


def _outside_time(sample: DeviceSample, delta: int, busy: float | None,
                  held: Mapping[Workload, float], outside: Sequence[PodUsage]) -> int:
    """The part of ``delta`` processes no holder accounts for kept the device busy.

    Where it is held, or its activity is not its own (``busy`` None: a GPU in MIG mode,
    busy with its instances' work), only those processes' own SM shares count: capacity
    nobody holds is unallocated, not used. On a device nobody holds, all its activity
    while a process runs there, or while its processes are not read."""
    if held or busy is None:
        return min(delta, round(delta * sum(r.sm or 0.0 for r in outside)))
    return 0 if sample.processes == () else round(delta * busy)


def _outside_kinds(sample: DeviceSample, held: Mapping[Workload, float],
                   usage: Sequence[PodUsage], outside: Sequence[PodUsage]) -> tuple[str, ...]:
    """Who uses the device outside any allocation now, as :data:`OUTSIDE_KINDS` names it."""
    if not sample.processes:
        return ()
    if not held:
        return (UNALLOCATED_DEVICE,)
    kinds = {HOST if r.pod is None else OTHER_WORKLOAD for r in outside}
    return tuple(k for k in OUTSIDE_KINDS if k in kinds)


def _idle(sample: DeviceSample, holder: Workload, mine: Sequence[PodUsage], delta: int,
          fraction: float | None, active: int) -> bool | None:
    """Whether ``holder`` left the device idle this interval; None where it cannot be told."""
    if not sample.readable:
        return None
    if sample.processes is not None:
        if isinstance(holder, JobRef):
            running = bool(sample.processes)  # a job's own processes are not told apart
        else:
            running = any(r.processes for r in mine)
        if not running:
            return True
    if fraction is None or delta == 0:
        return None if sample.processes is None else False
    return active == 0


def _order(item: tuple[tuple[str, Workload], _Row]) -> tuple[str, tuple[str, ...]]:
    (uuid, holder), _ = item
    return (uuid, holder.sort_key)
