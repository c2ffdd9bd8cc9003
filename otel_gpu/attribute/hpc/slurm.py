"""Slurm job ids from GPU processes' cgroups: job attribution without a prolog script.

slurmstepd puts every process of a job step in a cgroup of its own, named
after the job, and ``/proc/<pid>/cgroup`` shows that path:

* cgroup v2 (Slurm's ``cgroup/v2`` plugin), under slurmstepd's systemd scope
  (``<node>_slurmstepd.scope`` when several slurmd run on one host)::

      0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0

* cgroup v1 (``cgroup/v1``), one line per controller, under ``slurm`` (or
  ``slurm_<node>``) and the job owner's ``uid_<uid>``::

      4:devices:/slurm/uid_1000/job_1234/step_batch/task_0

Steps are numbers or ``batch``, ``extern``, ``interactive``; every step of
job 1234 gives ``1234``. Array and heterogeneous jobs have a job id of their
own, which is the one in the path. A process in no Slurm job (a host daemon,
slurmstepd itself under ``slurmstepd.scope/system``) gives none.

:class:`SlurmJobs` reads the file of each PID NVML lists, bounded like
:mod:`otel_gpu.attribute.k8s.processes` (whose size bound it shares).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from otel_gpu._files import FileError, read_text
from otel_gpu._log import LogLimiter
from otel_gpu.attribute.k8s.processes import CGROUP_MAX_BYTES, MAX_PIDS

log = logging.getLogger(__name__)

_V2_SCOPE = re.compile(r"^(?:.+_)?slurmstepd\.scope$")
_V1_ROOT = re.compile(r"^slurm(?:_.+)?$")
_UID = re.compile(r"^uid_[0-9]+$")
_JOB = re.compile(r"^job_([0-9]{1,12})$")


def _job_in(segments: list[str]) -> str | None:
    for i, segment in enumerate(segments):
        if _V2_SCOPE.match(segment):
            after = segments[i + 1:i + 2]
        elif _V1_ROOT.match(segment) and _UID.match(segments[i + 1] if i + 1 < len(segments)
                                                    else ""):
            after = segments[i + 2:i + 3]
        else:
            continue
        match = _JOB.match(after[0]) if after else None
        if match is not None:
            return str(int(match.group(1)))
    return None


def parse_slurm_cgroup(text: str) -> str | None:
    """The Slurm job id a ``/proc/<pid>/cgroup`` file places the process in, or None."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        job = _job_in([s for s in path.strip().split("/") if s])
        if job is not None:
            return job
    return None


class SlurmJobs:
    """PID -> Slurm job id, from ``<proc_root>/<pid>/cgroup``.

    Called by the job stage only, one call at a time, so it keeps no lock.
    """

    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        max_pids: int = MAX_PIDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = Path(proc_root)
        self._max_pids = max_pids
        self._limited = LogLimiter(log, 3600.0, clock=clock)

    def jobs(self, pids: Iterable[int]) -> dict[int, str]:
        """The job of each PID that is in one; PIDs in none (or gone) are left out."""
        out: dict[int, str] = {}
        looked = missing = 0
        for pid in sorted(set(pids)):
            if looked >= self._max_pids:
                self._limited.log("pids", logging.WARNING,
                                  "more than %d GPU processes: the rest are not looked up "
                                  "for their Slurm job", self._max_pids)
                break
            looked += 1
            try:
                text = read_text(str(self.proc_root / str(pid) / "cgroup"), "cgroup",
                                 max_bytes=CGROUP_MAX_BYTES)
            except FileError:
                missing += 1  # exited since NVML listed it, or not in our PID namespace
                continue
            job = parse_slurm_cgroup(text)
            if job is not None:
                out[pid] = job
        if looked and missing == looked:
            self._limited.log(
                "no-proc", logging.WARNING,
                "none of the %d GPU process(es) NVML lists has a cgroup file under %s: "
                "NVML reports host PIDs, so Slurm job ids need the host's /proc (proc_root)",
                looked, self.proc_root)
        return out
