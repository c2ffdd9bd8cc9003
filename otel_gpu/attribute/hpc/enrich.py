"""The job stage: attaches each device's HPC jobs to the snapshot, after the pod stage.

Two sources, merged: dcgm-exporter's job mapping directory
(:mod:`otel_gpu.attribute.hpc.mapping`: a GPU's file gives the GPU its jobs, a
``<index>.<gpu instance id>`` file its MIG instance), and, with process
usage on, Slurm's job id in the cgroup of each process NVML lists on a
device (:mod:`otel_gpu.attribute.hpc.slurm`). A device carries the union, sorted, one
of each: neither source wins over the other, so a job the prolog wrote and
the cgroup also shows appears once.

Both are read once per sample: the kubelet thread's re-publications of a
sample reuse its jobs. A MIG instance takes only its own file's jobs (as
dcgm-exporter does), not its GPU's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from otel_gpu._log import LogLimiter
from otel_gpu.attribute.hpc.mapping import DeviceKey, MappingWatcher
from otel_gpu.attribute.hpc.slurm import SlurmJobs
from otel_gpu.snapshot import Device, Snapshot
from otel_gpu.workload import JobRef

log = logging.getLogger(__name__)

MAX_JOBS_PER_DEVICE = 32
"""Jobs kept per device (the first, in order); each is a copy of its series in the dcgm naming."""


def job_order(job: str) -> tuple[int, int, str]:
    """Numeric ids by number (Slurm's 998 before 1001), then any other id by text."""
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def device_key(device: Device) -> DeviceKey | None:
    """The mapping file name for ``device``: its GPU index, and its GPU instance (None for
    a MIG instance whose GPU instance id NVML did not give: no file names it)."""
    if not device.is_mig:
        return DeviceKey(device.index)
    if device.gpu_instance_id is None:
        return None
    return DeviceKey(device.index, device.gpu_instance_id)


class JobEnricher:
    """The job stage (an :class:`~otel_gpu.attribute.enrich.Enricher`): sets
    :attr:`~otel_gpu.snapshot.Snapshot.jobs` (and, from Slurm's cgroups, ``job_pids``);
    either source may be absent."""

    def __init__(
        self,
        mapping: MappingWatcher | None = None,
        slurm: SlurmJobs | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mapping = mapping
        self.slurm = slurm
        self._last: tuple[int, Mapping[str, tuple[JobRef, ...]], frozenset[int] | None] \
            | None = None
        self._limited = LogLimiter(log, 3600.0, clock=clock)

    def process(self, snapshot: Snapshot) -> Snapshot:
        if self._last is None or self._last[0] != snapshot.seq:
            try:
                jobs, pids = self._read(snapshot)
            except Exception:  # noqa: BLE001 - a bug here must not cost the pods or the sample
                self._limited.log("bug", logging.ERROR, "reading HPC jobs failed; keeping the "
                                  "jobs last read", exc_info=True)
                jobs, pids = ((self._last[1], self._last[2]) if self._last is not None
                              else (MappingProxyType({}), None))
            self._last = (snapshot.seq, jobs, pids)
        return replace(snapshot, jobs=self._last[1], job_pids=self._last[2])

    def _read(self, snapshot: Snapshot
              ) -> tuple[Mapping[str, tuple[JobRef, ...]], frozenset[int] | None]:
        found: dict[str, set[str]] = {}
        in_jobs: frozenset[int] | None = None
        if self.mapping is not None:
            files = self.mapping.jobs()
            named: set[DeviceKey] = set()
            for sample in snapshot.devices:
                key = device_key(sample.device)
                listed = files.get(key) if key is not None else None
                if key is not None and listed:
                    named.add(key)
                    found.setdefault(sample.device.uuid, set()).update(listed)
            for key in sorted(set(files) - named, key=lambda k: k.sort_key):
                name = f"{key.index}" + (f".{key.gpu_instance_id}"
                                         if key.gpu_instance_id is not None else "")
                self._limited.log(("unmatched", key), logging.WARNING,
                                  "HPC job mapping file %s names no GPU or MIG GPU instance on "
                                  "this node: its jobs are not shown", name)
        if self.slurm is not None:
            pids = {p.pid for s in snapshot.devices for p in s.processes or ()}
            owners = self.slurm.jobs(pids) if pids else {}
            in_jobs = frozenset(owners)
            for sample in snapshot.devices:
                for proc in sample.processes or ():
                    job = owners.get(proc.pid)
                    if job is not None:
                        found.setdefault(sample.device.uuid, set()).add(job)
        out: dict[str, tuple[JobRef, ...]] = {}
        for uuid, jobs in found.items():
            ordered = sorted(jobs, key=job_order)
            if len(ordered) > MAX_JOBS_PER_DEVICE:
                self._limited.log(("many", uuid), logging.WARNING,
                                  "%d HPC jobs on %s: only the first %d are shown",
                                  len(ordered), uuid, MAX_JOBS_PER_DEVICE)
                ordered = ordered[:MAX_JOBS_PER_DEVICE]
            out[uuid] = tuple(JobRef(job) for job in ordered)
        return MappingProxyType(out), in_jobs


def job_enricher(
    mapping_dir: str | None, proc_root: str, *, processes: bool
) -> JobEnricher | None:
    """The job stage for these settings; None when neither source is on.

    ``processes``: NVML's per-process lists are read (``process_usage``), so each
    process's cgroup can name its Slurm job.
    """
    mapping = MappingWatcher(mapping_dir) if mapping_dir else None
    slurm = SlurmJobs(proc_root) if processes else None
    if mapping is None and slurm is None:
        return None
    return JobEnricher(mapping, slurm)
