"""Which container runs each GPU process, and what each container uses of each device.

NVML lists a device's compute processes by host PID. :class:`ProcessMapper`
finds each one's container from files on the node, read-only:

1. ``<proc_root>/<pid>/cgroup`` names the pod UID and the container id
   (:func:`parse_cgroup`: cgroup v1 and v2; systemd and cgroupfs drivers;
   containerd, CRI-O and Docker). Seeing other containers' processes there
   (and in NVML's list) takes the host's PID namespace (``hostPID: true``).
2. The kubelet's pod log directories ``<log_root>/<namespace>_<pod>_<uid>/``
   (:class:`PodLogIndex`) turn the UID into the pod's name and namespace (and
   the name into the UID, for ``k8s.pod.uid`` on the pods the kubelet lists); the links
   ``<log_root>/../containers/<pod>_<namespace>_<container>-<id>.log`` turn the
   container id into the container's name (:func:`parse_pod_dir`,
   :func:`parse_container_log`). Only the names are read, never the logs.

:func:`join_usage` then sums each device's processes per container, next to
a zero row for every container the kubelet says holds the device, so the
usage series exist wherever the allocation series do.

Processes that map to no pod (the host's, ones whose ``/proc`` entry is gone
or not visible, pods not found under ``log_root``) are summed in one row per
device with no pod. A PID reused between NVML's list and the ``cgroup`` read
can be counted for the new process's container for one sample.

Every file read is bounded (:data:`CGROUP_MAX_BYTES`), as are the directory
indexes (:data:`MAX_ENTRIES` entries each); the indexes are rebuilt when a
lookup misses, at most once per ``refresh_every`` seconds. The mapper is
called by the attribution stage only, one call at a time (under the
pipeline's lock), so it keeps no lock of its own.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_gpu._files import FileError, read_text
from otel_gpu._log import LogLimiter
from otel_gpu.snapshot import Attribution, DeviceSample, PodUsage, ProcessUsage
from otel_gpu.workload import Owner, PodRef

log = logging.getLogger(__name__)

CGROUP_MAX_BYTES = 16 * 1024
"""A v1 cgroup file has a dozen lines of at most a few hundred bytes."""
MAX_ENTRIES = 16384
"""Entries read from each kubelet log directory (pods; containers and their restarts)."""
MAX_PIDS = 4096
"""Processes mapped per sample; any beyond are left unattributed (and logged)."""

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_SEGMENT = re.compile(rf"(?:^|-)pod({_UID})(?:\.slice)?$")
_CONTAINER_SEGMENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:\.scope)?$")
_POD_UID = re.compile(rf"^(?:{_UID})$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class CgroupRef:
    """Where ``/proc/<pid>/cgroup`` places a process: its pod, and its container if named."""

    pod_uid: str
    """Lowercase, with ``-`` (systemd slice names write ``_``)."""
    container_id: str | None = None
    """64 hex digits, without the runtime's prefix."""


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod (and container) a ``/proc/<pid>/cgroup`` file places the process in.

    ``None`` when no line names a pod: a host process. Lines are
    ``hierarchy:controllers:path``; v2 has the one ``0::`` line, v1 one per
    hierarchy (which agree) and often an empty ``0::/``.
    """
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        segments = [s for s in path.strip().split("/") if s]
        for i, segment in enumerate(segments):
            match = _POD_SEGMENT.search(segment)
            if match is None:
                continue
            uid = match.group(1).replace("_", "-")
            for later in segments[i + 1:]:
                container = _CONTAINER_SEGMENT.match(later)
                if container is not None:
                    return CgroupRef(uid, container.group(1))
            return CgroupRef(uid)
    return None


def parse_pod_dir(name: str) -> tuple[str, str, str] | None:
    """``<namespace>_<pod>_<uid>`` (a kubelet pod log directory) -> (namespace, pod, uid)."""
    parts = name.split("_")
    if len(parts) != 3:
        return None
    namespace, pod, uid = parts
    if not (_NAME.match(namespace) and _NAME.match(pod) and _POD_UID.match(uid)):
        return None
    return namespace, pod, uid


def parse_container_log(name: str) -> tuple[str, str, str, str] | None:
    """``<pod>_<namespace>_<container>-<id>.log`` -> (pod, namespace, container, id)."""
    if not name.endswith(".log"):
        return None
    rest, _, container_id = name[:-4].rpartition("-")
    parts = rest.split("_")
    if len(parts) != 3 or not _CONTAINER_ID.match(container_id):
        return None
    pod, namespace, container = parts
    if not (_NAME.match(pod) and _NAME.match(namespace) and _NAME.match(container)):
        return None
    return pod, namespace, container, container_id


def _names(directory: Path, limit: int = MAX_ENTRIES) -> tuple[list[str], bool]:
    """Up to ``limit`` entry names of ``directory``; whether it could be listed."""
    names: list[str] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if len(names) >= limit:
                    break
                names.append(entry.name)
    except OSError:
        return [], False
    return names, True


class PodLogIndex:
    """The kubelet's pod log directories, indexed by name: pod UID <-> (namespace, pod), and
    container id -> container name.

    ``log_root`` is the kubelet's ``/var/log/pods``, whose sibling ``containers``
    (or ``containers_root``) holds the container links. The index is rebuilt
    when a lookup misses, at most once per ``refresh_every`` seconds; only
    names are read.
    """

    def __init__(
        self,
        log_root: Path = Path("/var/log/pods"),
        *,
        containers_root: Path | None = None,
        refresh_every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log_root = Path(log_root)
        self.containers_root = (Path(containers_root) if containers_root is not None
                                else self.log_root.parent / "containers")
        self._refresh_every = refresh_every
        self._clock = clock
        self._built: float | None = None
        self.listed: bool | None = None
        """Whether ``log_root`` could be listed the last time (None: not tried yet)."""
        self._pods: dict[str, tuple[str, str]] = {}
        """uid -> (namespace, pod)"""
        self._uids: dict[tuple[str, str], str | None] = {}
        """(namespace, pod) -> uid; None where two directories name the same pod"""
        self._containers: dict[str, tuple[str, str, str]] = {}
        """container id -> (pod, namespace, container)"""
        self._pod_containers: dict[str, tuple[str, ...]] = {}
        """uid -> the container directories of its log directory, listed when needed"""

    def pod(self, uid: str) -> tuple[str, str] | None:
        """(namespace, pod name) of the pod with ``uid``."""
        found = self._pods.get(uid)
        if found is None and self.refresh():
            found = self._pods.get(uid)
        return found

    def uid(self, namespace: str, pod: str) -> str | None:
        """The UID of the pod ``namespace/pod``; None when unknown or ambiguous."""
        key = (namespace, pod)
        if key not in self._uids:
            self.refresh()
        return self._uids.get(key)

    def container(self, container_id: str) -> tuple[str, str, str] | None:
        """(pod, namespace, container name) of the container with ``container_id``."""
        found = self._containers.get(container_id)
        if found is None and self.refresh():
            found = self._containers.get(container_id)
        return found

    def containers_of(self, uid: str, namespace: str, pod: str) -> tuple[str, ...]:
        """The container directories of the pod's log directory (read once per pod)."""
        names = self._pod_containers.get(uid)
        if names is None:
            listed, _ = _names(self.log_root / f"{namespace}_{pod}_{uid}", 64)
            names = tuple(n for n in listed if _NAME.match(n))
            if len(self._pod_containers) >= MAX_ENTRIES:
                self._pod_containers.clear()
            self._pod_containers[uid] = names
        return names

    def refresh(self) -> bool:
        """Re-read both directories, unless done less than ``refresh_every`` ago."""
        now = self._clock()
        if self._built is not None and now - self._built < self._refresh_every:
            return False
        self._built = now
        pods: dict[str, tuple[str, str]] = {}
        uids: dict[tuple[str, str], str | None] = {}
        names, self.listed = _names(self.log_root)
        for entry in names:
            parsed = parse_pod_dir(entry)
            if parsed is not None:
                namespace, pod, uid = parsed
                pods[uid] = (namespace, pod)
                uids[(namespace, pod)] = uid if (namespace, pod) not in uids else None
        containers: dict[str, tuple[str, str, str]] = {}
        names, _ = _names(self.containers_root)
        for entry in names:
            link = parse_container_log(entry)
            if link is not None:
                containers[link[3]] = link[:3]
        self._pods, self._uids, self._containers = pods, uids, containers
        self._pod_containers = {}
        return True


class ProcessMapper:
    """PID -> the container running it (:class:`~otel_gpu.workload.PodRef`), from files.

    ``proc_root`` is where the host's processes are visible (``/proc`` with
    ``hostPID: true``); ``log_root`` the kubelet's ``/var/log/pods``
    (:class:`PodLogIndex`, which ``index`` can give instead, to share it).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        log_root: Path = Path("/var/log/pods"),
        *,
        containers_root: Path | None = None,
        refresh_every: float = 5.0,
        max_pids: int = MAX_PIDS,
        clock: Callable[[], float] = time.monotonic,
        index: PodLogIndex | None = None,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.index = index if index is not None else PodLogIndex(
            log_root, containers_root=containers_root, refresh_every=refresh_every, clock=clock)
        self.log_root = self.index.log_root
        self._max_pids = max_pids
        self._limited = LogLimiter(log, 3600.0, clock=clock)

    def owners(self, pids: Iterable[int]) -> dict[int, PodRef | None]:
        """Each PID's container; ``None`` for a process in no pod this node's files name."""
        out: dict[int, PodRef | None] = {}
        missing = 0
        for pid in sorted(set(pids)):
            if len(out) >= self._max_pids:
                self._limited.log("pids", logging.WARNING,
                                  "more than %d GPU processes: the rest are reported as "
                                  "unattributed", self._max_pids)
                out[pid] = None
                continue
            try:
                text = read_text(str(self.proc_root / str(pid) / "cgroup"), "cgroup",
                                 max_bytes=CGROUP_MAX_BYTES)
            except FileError:
                missing += 1  # exited since NVML listed it, or not in our PID namespace
                out[pid] = None
                continue
            ref = parse_cgroup(text)
            out[pid] = self._container(ref) if ref is not None else None
        if out and missing == len(out):
            self._limited.log(
                "no-proc", logging.WARNING,
                "none of the %d GPU process(es) NVML lists has a cgroup file under %s: NVML "
                "reports host PIDs, so per-pod usage needs the host's PID namespace "
                "(hostPID: true); they are reported as unattributed", len(out), self.proc_root)
        return out

    def _container(self, ref: CgroupRef) -> PodRef | None:
        pod = self.index.pod(ref.pod_uid)
        if self.index.listed is False:
            self._limited.log("log-root", logging.WARNING,
                              "cannot list %s, so GPU processes in pods are reported as "
                              "unattributed: mount the kubelet's /var/log/pods (read-only) and "
                              "set pod_log_root", self.log_root)
        if pod is None:
            self._limited.log(("pod", ref.pod_uid), logging.INFO,
                              "GPU process in pod %s, which has no directory under %s: "
                              "reported as unattributed", ref.pod_uid, self.log_root)
            return None
        namespace, name = pod
        container = ""
        if ref.container_id is not None:
            entry = self.index.container(ref.container_id)
            if entry is not None and entry[:2] == (name, namespace):
                container = entry[2]
        if not container:  # no link for it: the pod's only container, if it has one
            names = self.index.containers_of(ref.pod_uid, namespace, name)
            if len(names) == 1:
                container = names[0]
        return PodRef(name, namespace, container, ref.pod_uid)


# --- the join: per (device, container) ------------------------------------------------------


def join_usage(
    samples: Sequence[DeviceSample],
    owners: Mapping[int, PodRef | None],
    attribution: Attribution | None = None,
) -> tuple[PodUsage, ...]:
    """Each device's processes summed per container, plus a zero row per holding container.

    Devices whose processes were not read get no rows. A process whose pod is
    known but not its container is given the pod's one container holding the
    device, when there is exactly one.
    """
    rows: list[PodUsage] = []
    for sample in samples:
        if sample.processes is None:
            continue
        uuid = sample.device.uuid
        holders = attribution.holders(uuid) if attribution is not None else ()
        groups: dict[PodRef | None, list[ProcessUsage]] = {}
        for proc in sample.processes:
            ref = owners.get(proc.pid)
            if ref is not None and not ref.container:
                mine = {h.container for h in holders
                        if (h.pod, h.namespace) == (ref.pod, ref.namespace)}
                if len(mine) == 1:
                    ref = ref.with_container(mine.pop())
            groups.setdefault(ref, []).append(proc)
        for holder in holders:
            groups.setdefault(holder.ref, [])
        rows.extend(usage_row(uuid, ref, procs, sample.process_utilization)
                    for ref, procs in groups.items())
    rows.sort(key=usage_order)
    return tuple(rows)


def usage_order(row: PodUsage) -> tuple[str, bool, tuple[str, ...]]:
    """Rows by device, then workload, the unattributed row last."""
    return (row.uuid, row.pod is None, row.pod.sort_key if row.pod is not None else ())


def usage_row(uuid: str, ref: Owner | None, procs: Sequence[ProcessUsage],
              shares: bool) -> PodUsage:
    """One workload's processes on one device, summed (``shares``: NVML gave them)."""
    known = [p.used_memory for p in procs if p.used_memory is not None]

    def total(values: list[float | None]) -> float | None:
        return sum(v for v in values if v is not None) if shares else None

    return PodUsage(
        uuid=uuid,
        pod=ref,
        processes=len(procs),
        used_memory=sum(known) if known or not procs else None,
        sm=total([p.sm for p in procs]),
        memory=total([p.memory for p in procs]),
        encoder=total([p.encoder for p in procs]),
        decoder=total([p.decoder for p in procs]),
    )
