"""The attribution stage: joins each new snapshot with the kubelet's latest answer.

It runs when a sample is taken and when the kubelet's answer changes (on
those threads, never on a scrape), so instrument callbacks find the pods
already attached to the snapshot they read and never touch the kubelet,
sysfs, or the join itself.

Allocated ids that match no device (a device plugin naming devices in a way
otel-gpu does not know, or ids of another node's GPUs) are reported as one
summary line when their set changes, at most once a minute, and counted by
``otel_gpu.kubelet.unresolved_ids``: a node with thousands of such ids
writes a line a minute at most, and remembers nothing per id.

With process usage on, it also maps each device's processes to their
containers (:mod:`otel_gpu.attribute.k8s.processes`: once per sample, the answer kept
for the kubelet's re-publications of that sample) and attaches the usage per
(device, container) as :attr:`~otel_gpu.snapshot.Pods.usage`. Energy per
(device, container) (:mod:`otel_gpu.attribute.k8s.energy`) is accounted here too, once per
sample, as :attr:`~otel_gpu.snapshot.Pods.energy`.

The collector's watcher is a
:class:`~otel_gpu.attribute.k8s.podresources.PodResourcesWatcher` whose state is
None while no kubelet socket has been there (it imports gRPC only once one is):
each snapshot then carries an empty attribution, and no per-pod rows. From the
look that finds the socket (the watcher's start, or a later one) the state is
the empty answer until the kubelet's first: the per-pod families have each
GPU's unattributed rows from the first sample on, however slow that answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu._log import ChangeLimiter
from otel_gpu.attribute.enrich import Watched
from otel_gpu.attribute.k8s.energy import EnergyLedger
from otel_gpu.attribute.k8s.processes import PodLogIndex, ProcessMapper, join_usage
from otel_gpu.attribute.k8s.source import PodSource
from otel_gpu.snapshot import Attribution, Pods, PodUsage, Snapshot, UnresolvedId
from otel_gpu.workload import PodRef

if TYPE_CHECKING:
    from otel_gpu.attribute.k8s.attribution import Attributor

log = logging.getLogger(__name__)

EXAMPLES = 3
"""Unmatched ids quoted in the summary line."""
SUMMARY_EVERY_S = 60.0
_ID_CHARS = 80


def _fingerprint(unresolved: Sequence[UnresolvedId]) -> tuple[int, int]:
    """Small, order-free identity of a set of unmatched ids."""
    return len(unresolved), hash(frozenset((u.resource_name, u.device_id) for u in unresolved))


_NONE = _fingerprint(())


def _example(u: UnresolvedId) -> str:
    device_id = u.device_id if len(u.device_id) <= _ID_CHARS else u.device_id[:_ID_CHARS] + "..."
    return f"{u.resource_name} {device_id!r} ({u.reason})"


class PodEnricher(Watched):
    """The pod stage (an :class:`~otel_gpu.attribute.enrich.Enricher`, started and stopped as
    a :class:`~otel_gpu.attribute.enrich.Watched` one): attaches
    :class:`~otel_gpu.snapshot.Pods` to snapshots; cheap when nothing changed.

    ``pod_dirs`` (the kubelet's pod log directories; the process mapper's when
    it has one) gives each pod the kubelet lists its UID. Called under the
    pipeline's lock (or from ``check``, on one thread), so its state needs no
    lock of its own.
    """

    def __init__(
        self,
        watcher: PodSource,
        sysfs_root: Path = Path("/"),
        *,
        summary_every: float = SUMMARY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        processes: ProcessMapper | None = None,
        pod_dirs: PodLogIndex | None = None,
    ) -> None:
        self.watcher: PodSource = watcher
        self.processes = processes
        self.pod_dirs = pod_dirs if pod_dirs is not None or processes is None \
            else processes.index
        self._owners: tuple[int, dict[int, PodRef | None]] | None = None
        self.sysfs_root = Path(sysfs_root)
        self._attributor: Attributor | None = None
        self._unresolved_log = ChangeLimiter(summary_every, clock=clock, initial=_NONE)
        self._unresolved: tuple[UnresolvedId, ...] = ()
        self._unresolved_key = _NONE
        self._summary_every = summary_every
        self.energy = EnergyLedger()
        """Energy per (device, container): fed every snapshot, counts each sample once."""

    def problem(self) -> str | None:
        """Why pods are not attributed (for ``/readyz``), past a kubelet (re)starting."""
        return self.watcher.problem()

    def process(self, snapshot: Snapshot) -> Snapshot:
        state = self.watcher.state
        if state is None:  # no kubelet socket yet: nothing to join
            return replace(snapshot, pods=Pods(Attribution(), self.watcher.stats, None))
        devices = tuple(s.device for s in snapshot.devices)
        if self._attributor is None or self._attributor.devices != devices:
            from otel_gpu.attribute.k8s.attribution import Attributor

            self._attributor = Attributor(
                devices, self.sysfs_root, self.pod_dirs.uid if self.pod_dirs else None)
        attribution = self._attributor(state)
        self._report_unresolved(attribution.unresolved)
        usage: tuple[PodUsage, ...] = ()
        if self.processes is not None:
            usage = join_usage(snapshot.devices, self._process_owners(snapshot), attribution)
        energy = self.energy.update(snapshot, attribution, usage)  # once per sample
        pods = Pods(attribution, self.watcher.stats, state.taken_monotonic, usage, energy)
        return replace(snapshot, pods=pods)

    def _process_owners(self, snapshot: Snapshot) -> dict[int, PodRef | None]:
        """Each listed process's container, read once per sample."""
        assert self.processes is not None
        if self._owners is None or self._owners[0] != snapshot.seq:
            pids = {p.pid for s in snapshot.devices for p in s.processes or ()}
            self._owners = (snapshot.seq, self.processes.owners(pids))
        return self._owners[1]

    def _report_unresolved(self, unresolved: tuple[UnresolvedId, ...]) -> None:
        """One line for the set of unmatched ids when it changed (see the module docstring)."""
        if unresolved is not self._unresolved:  # a new kubelet answer (or new devices)
            self._unresolved, self._unresolved_key = unresolved, _fingerprint(unresolved)
        changes = self._unresolved_log.changes(self._unresolved_key)
        if not changes:
            return
        more = (f"; the set changed {changes} times since the last such line "
                f"(at most one every {self._summary_every:g} s)") if changes > 1 else ""
        if not unresolved:
            log.info("every device id the kubelet lists matches a device on this node again%s",
                     more)
            return
        log.warning(
            "the kubelet lists %d allocated device id(s) that match no GPU or MIG instance "
            "on this node, so their containers are not attributed (see "
            "otel_gpu_kubelet_unresolved_ids); for example %s%s",
            len(unresolved), ", ".join(_example(u) for u in unresolved[:EXAMPLES]), more,
        )
