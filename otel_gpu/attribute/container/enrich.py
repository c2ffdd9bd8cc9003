"""The container stage: each device's GPU processes joined to their containers outside Kubernetes.

Once per sample (the kubelet thread's re-publications of a sample reuse
the answer) it reads the cgroup file of each process NVML lists
(:func:`~otel_gpu.attribute.container.cgroup.container_id`, bounded like the pod
stage's reads) and names each container from the runtime's last answer
(:class:`~otel_gpu.attribute.container.runtime.RuntimeWatch`; a container it did not
list yet has its id only). The snapshot then carries, per device, the
containers whose processes use it (a device used by one container alone gets
its ``container.*`` attributes on its series, as a device held whole gets its
pod's) and a usage row per (device, container) plus one for the processes in
no container, like the pods' rows. On a node where the kubelet answers, the
pods' usage rows stand (their unattributed row includes any container outside
Kubernetes).

Off (the snapshot unchanged) while there is no runtime socket.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from otel_gpu._files import FileError, read_text
from otel_gpu._log import LogLimiter
from otel_gpu.attribute.container.cgroup import container_id
from otel_gpu.attribute.container.runtime import RuntimeState
from otel_gpu.attribute.enrich import Watched
from otel_gpu.attribute.k8s.processes import CGROUP_MAX_BYTES, MAX_PIDS, usage_order, usage_row
from otel_gpu.snapshot import Containers, ContainerStats, PodUsage, ProcessUsage, Snapshot
from otel_gpu.workload import ContainerRef

log = logging.getLogger(__name__)


class ContainerSource(Protocol):
    """The runtime's latest answer (None: no runtime socket), polled in the background."""

    @property
    def state(self) -> RuntimeState | None: ...

    @property
    def stats(self) -> ContainerStats: ...

    def poll_once(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 2.0) -> None: ...


class ContainerEnricher(Watched):
    """Sets :attr:`~otel_gpu.snapshot.Snapshot.containers`
    (an :class:`~otel_gpu.attribute.enrich.Enricher`, started and stopped as a
    :class:`~otel_gpu.attribute.enrich.Watched` one)."""

    def __init__(
        self,
        watcher: ContainerSource,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        max_pids: int = MAX_PIDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watcher: ContainerSource = watcher
        self.proc_root = Path(proc_root)
        self._max_pids = max_pids
        self._last: tuple[int, Containers] | None = None
        self._limited = LogLimiter(log, 3600.0, clock=clock)

    def process(self, snapshot: Snapshot) -> Snapshot:
        state = self.watcher.state
        if state is None:
            return snapshot
        if self._last is None or self._last[0] != snapshot.seq:
            self._last = (snapshot.seq, self._join(snapshot, state))
        return replace(snapshot, containers=self._last[1])

    def _join(self, snapshot: Snapshot, state: RuntimeState) -> Containers:
        pids = {p.pid for s in snapshot.devices for p in s.processes or ()}
        ids = self._ids(pids)
        named = state.containers
        devices: dict[str, tuple[ContainerRef, ...]] = {}
        rows: list[PodUsage] = []
        for sample in snapshot.devices:
            if sample.processes is None:
                continue
            groups: dict[ContainerRef | None, list[ProcessUsage]] = {}
            for proc in sample.processes:
                cid = ids.get(proc.pid)
                ref = (named.get(cid) or ContainerRef(cid)) if cid is not None else None
                groups.setdefault(ref, []).append(proc)
            mine = sorted((r for r in groups if r is not None), key=lambda r: r.sort_key)
            if mine:
                devices[sample.device.uuid] = tuple(mine)
            rows.extend(usage_row(sample.device.uuid, ref, procs, sample.process_utilization)
                        for ref, procs in groups.items())
        rows.sort(key=usage_order)
        return Containers(MappingProxyType(devices), tuple(rows), self.watcher.stats)

    def _ids(self, pids: Iterable[int]) -> dict[int, str]:
        """The container id of each PID in one (read once per sample, bounded)."""
        out: dict[int, str] = {}
        for looked, pid in enumerate(sorted(set(pids))):
            if looked >= self._max_pids:
                self._limited.log("pids", logging.WARNING,
                                  "more than %d GPU processes: the rest are not looked up "
                                  "for their container", self._max_pids)
                break
            try:
                text = read_text(str(self.proc_root / str(pid) / "cgroup"), "cgroup",
                                 max_bytes=CGROUP_MAX_BYTES)
            except FileError:
                continue  # exited since NVML listed it, or not in our PID namespace
            cid = container_id(text)
            if cid is not None:
                out[pid] = cid
        return out


def container_enricher(socket_path: str, proc_root: str, *, interval: float,
                       processes: bool) -> ContainerEnricher | None:
    """The container stage for these settings; None without process usage (the processes'
    cgroups are what name a device's containers)."""
    if not processes:
        return None
    from otel_gpu.attribute.container.runtime import RuntimeWatch

    return ContainerEnricher(RuntimeWatch(socket_path, interval=interval), proc_root)
