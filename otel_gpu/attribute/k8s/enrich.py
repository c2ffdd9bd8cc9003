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

gRPC and the kubelet's API stubs cost memory and start-up time (about 12 MiB
and 90 ms), and a node that is not a Kubernetes node never needs them: the
collector's watcher is a :class:`KubeletWatch`, which looks for the socket on
the kubelet interval and imports gRPC and builds the
:class:`~otel_gpu.attribute.k8s.podresources.PodResourcesWatcher` only once something is
there. Until then each snapshot carries an empty attribution.
"""

from __future__ import annotations

import logging
import os
import random
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from otel_gpu._log import ChangeLimiter, LogLimiter
from otel_gpu.attribute.enrich import Watched
from otel_gpu.attribute.k8s.energy import EnergyLedger
from otel_gpu.attribute.k8s.kubelet_answer import PodResourcesState
from otel_gpu.attribute.k8s.processes import PodLogIndex, ProcessMapper, join_usage
from otel_gpu.attribute.k8s.source import DIRECTORY, LINES, STILL_ABSENT, PodSource
from otel_gpu.attribute.watch import Loop, backoff, span
from otel_gpu.snapshot import Attribution, KubeletStats, Pods, PodUsage, Snapshot, UnresolvedId
from otel_gpu.workload import PodRef

if TYPE_CHECKING:  # imports gRPC
    from otel_gpu.attribute.k8s.attribution import Attributor
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher

log = logging.getLogger(__name__)

EXAMPLES = 3
"""Unmatched ids quoted in the summary line."""
SUMMARY_EVERY_S = 60.0
BUILD_BACKOFF_CAP_S = 300.0
ABSENT_EVERY_S = 600.0
"""A kubelet socket still absent past the grace period is warned of at most this often."""
SOCKET_NAME = "kubelet.sock"
"""The longest wait between two tries at building a watcher that failed (a bug)."""
_ID_CHARS = 80


def _fingerprint(unresolved: Sequence[UnresolvedId]) -> tuple[int, int]:
    """Small, order-free identity of a set of unmatched ids."""
    return len(unresolved), hash(frozenset((u.resource_name, u.device_id) for u in unresolved))


_NONE = _fingerprint(())


def _example(u: UnresolvedId) -> str:
    device_id = u.device_id if len(u.device_id) <= _ID_CHARS else u.device_id[:_ID_CHARS] + "..."
    return f"{u.resource_name} {device_id!r} ({u.reason})"


class KubeletWatch:
    """The kubelet watcher, built (importing gRPC) once anything exists at the socket path:
    the collector's :class:`~otel_gpu.attribute.k8s.source.PodSource`.

    ``build`` makes the :class:`~otel_gpu.attribute.k8s.podresources.PodResourcesWatcher`.
    :meth:`start` builds it at once when the path exists, else starts the
    ``otel-gpu-kubelet-wait`` thread, which checks the path every ``interval``
    and builds and starts the watcher when it appears, then ends (a build that
    fails, a bug, is said and tried again after a backoff). Until then
    :attr:`state` is None and :attr:`stats` says the socket is absent. A path
    that exists but is not a socket is the watcher's to report. It says what the
    watcher would (:data:`~otel_gpu.attribute.k8s.source.LINES`), in the same words.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        build: Callable[[], PodResourcesWatcher],
        *,
        interval: float,
        grace_period: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        absent_every: float = ABSENT_EVERY_S,
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.interval = interval
        self.grace_period = grace_period
        self.clock = clock
        self._build = build
        self.watcher: PodResourcesWatcher | None = None
        """Set once, by :meth:`start`, the waiting thread or :meth:`poll_once`."""
        self._checks = 0
        self._said_absent = False
        self._missing_since: float | None = None
        """When the path was first found without a socket (monotonic); None until then."""
        self._directory = False
        self._build_failures = 0
        self._wait = Loop("otel-gpu-kubelet-wait", self._look, self._build_failed)
        self._limited = LogLimiter(log, 60.0)
        self._absent_log = LogLimiter(log, absent_every, clock=clock)

    def _ensure(self, *, late: bool = False) -> PodResourcesWatcher | None:
        if self.watcher is None:
            path = self.socket_path
            directory = os.path.isdir(path)
            if directory or not os.path.lexists(path):
                self._checks += 1
                now = self.clock()
                if self._missing_since is None:
                    self._missing_since = now
                if directory and not self._directory:
                    log.warning(DIRECTORY, {"path": path, "hint": self._hint(path)})
                elif not directory and not self._said_absent:
                    log.info(LINES.absent, {"path": path})
                elif not directory and now - self._missing_since >= self.grace_period:
                    self._absent_log.log("absent", logging.WARNING, STILL_ABSENT, {
                        "path": path, "interval": self.interval,
                        "elapsed": span(now - self._missing_since)})
                self._directory = directory
                self._said_absent = self._said_absent or not directory
                return None
            self.watcher = self._build()
            if late:
                log.info(LINES.back, {"path": path})
        return self.watcher

    @staticmethod
    def _hint(directory: str) -> str:
        """Where the socket is when the directory holds one by its usual name."""
        inside = os.path.join(directory, SOCKET_NAME)
        try:
            if stat.S_ISSOCK(os.stat(inside).st_mode):
                return f" ({inside} is there)"
        except OSError:
            pass
        return f" (the kubelet's is {SOCKET_NAME} in it; none there now)"

    def problem(self) -> str | None:
        """Why pods are not attributed, past a kubelet starting: the path names a directory,
        or no socket appeared within the grace period (then the watcher's own outage)."""
        watcher = self.watcher
        if watcher is not None:
            return watcher.problem()
        since = self._missing_since
        if since is None:
            return None
        if self._directory:
            return f"kubelet_socket {self.socket_path} is a directory, not the socket"
        elapsed = self.clock() - since
        if elapsed < self.grace_period:
            return None
        return f"no kubelet socket at {self.socket_path} for {span(elapsed)}"

    @property
    def state(self) -> PodResourcesState | None:
        watcher = self.watcher
        return None if watcher is None else watcher.state

    @property
    def stats(self) -> KubeletStats:
        watcher = self.watcher
        if watcher is not None:
            return watcher.stats
        return KubeletStats(requests=MappingProxyType({}), last_success_monotonic=None, pods=0,
                            devices=0, source=None, consecutive_failures=self._checks,
                            socket_present=False if self._checks else None)

    def start(self) -> None:
        watcher = self._ensure()
        if watcher is not None:
            watcher.start()
            return
        self._wait.start(first_wait=self.interval)

    def _look(self) -> float | None:
        """One look of the waiting thread: the wait before the next, or None once the
        watcher is built (and started, unless stopping)."""
        watcher = self._ensure(late=True)
        if watcher is None:
            return self.interval
        if not self._wait.stopping:
            watcher.start()
        return None

    def _build_failed(self) -> float:
        """A bug building the watcher: said (rate-limited), tried again after a backoff."""
        self._build_failures += 1
        self._limited.log("build", logging.ERROR,
                          "starting the kubelet pod-resources watcher failed", exc_info=True)
        cap = max(BUILD_BACKOFF_CAP_S, self.interval)
        return backoff(self._build_failures, self.interval, cap, random.random())

    def poll_once(self) -> bool:
        watcher = self._ensure()
        return watcher is not None and watcher.poll_once()

    def stop(self, timeout: float = 2.0) -> None:
        self._wait.stop(timeout)
        if self.watcher is not None:
            self.watcher.stop(timeout)


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
