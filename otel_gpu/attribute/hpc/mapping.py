"""dcgm-exporter's HPC job mapping directory, read as it is, and watched for changes.

The scheduler's prolog writes one file per GPU the job was given, named by
the GPU's NVML index (``0``, ``1``, ...), or ``<index>.<gpu instance id>``
for a MIG instance (``0.1``); each line is a job id. The epilog removes the
file (or the job's line). dcgm-exporter reads this layout through
``--hpc-job-mapping-dir``; so does otel-gpu, through ``hpc_job_mapping_dir``.

:class:`MappingWatcher` is asked once per sample. It lists the directory
and looks at each file's status; only files whose modification time, size
or inode changed are read again, so an idle directory costs a few ``stat``
calls. Everything read is bounded: :data:`MAX_ENTRIES` entries,
:data:`MAX_FILE_BYTES` per file (regular files only: a FIFO or a device
is skipped, never opened blocking), :data:`MAX_JOBS_PER_FILE` job ids of at
most :data:`MAX_JOB_ID_CHARS` characters from a small alphabet, UTF-8. A bad
file or line is one rate-limited log line naming it; the other files' jobs
are kept. A missing directory is said once, and again once each time it
appears or disappears.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from otel_gpu._files import FileError, read_text
from otel_gpu._log import LogLimiter

log = logging.getLogger(__name__)

MAX_ENTRIES = 1024
"""Directory entries looked at per check; a node has a few dozen GPUs and MIG instances."""
MAX_FILE_BYTES = 16 * 1024
MAX_JOBS_PER_FILE = 32
"""Job ids taken from one file; each is a copy of the device's series in the dcgm naming."""
MAX_JOB_ID_CHARS = 128
LOG_EVERY_S = 300.0
"""At most one line per bad file (or directory state) this often."""

_NAME = re.compile(r"^([0-9]{1,6})(?:\.([0-9]{1,6}))?$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+@-]*$")

Jobs = Mapping["DeviceKey", tuple[str, ...]]


@dataclass(frozen=True)
class DeviceKey:
    """What a mapping file names: a GPU by NVML index, and a MIG GPU instance in it."""

    index: int
    gpu_instance_id: int | None = None

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.index, -1 if self.gpu_instance_id is None else self.gpu_instance_id)


def parse_name(name: str) -> DeviceKey | None:
    """``3`` -> GPU 3; ``3.1`` -> GPU instance 1 of GPU 3; anything else -> None (ignored)."""
    match = _NAME.match(name)
    if match is None:
        return None
    instance = match.group(2)
    return DeviceKey(int(match.group(1)), int(instance) if instance is not None else None)


def parse_jobs(text: str) -> tuple[tuple[str, ...], list[str]]:
    """The file's job ids in order, once each, and what was wrong with the lines skipped.

    Surrounding blanks and empty lines are ignored (shell prologs write them).
    """
    jobs: dict[str, None] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        job = raw.strip()
        if not job:
            continue
        if len(job) > MAX_JOB_ID_CHARS:
            problems.append(f"line {number}: a job id of {len(job)} characters "
                            f"(at most {MAX_JOB_ID_CHARS})")
        elif not _JOB_ID.match(job):
            problems.append(f"line {number}: {job[:40]!r} is not a job id (letters, digits "
                            f"and . _ : + @ -)")
        elif job not in jobs:
            if len(jobs) >= MAX_JOBS_PER_FILE:
                problems.append(f"more than {MAX_JOBS_PER_FILE} job ids; the rest are ignored")
                break
            jobs[job] = None
    return tuple(jobs), problems


class _File(NamedTuple):
    status: tuple[int, ...]
    key: DeviceKey
    jobs: tuple[str, ...]


def _status(info: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is rewritten, in place or by rename."""
    return (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino, info.st_dev)


class MappingWatcher:
    """The jobs a mapping directory names, by :class:`DeviceKey`; re-read when it changes.

    Called by the job stage only, one call at a time (under the pipeline's
    lock, or from ``check``), so it keeps no lock of its own.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = os.fspath(directory)
        self._max_entries = max_entries
        self._files: dict[str, _File] = {}
        self._jobs: Jobs = MappingProxyType({})
        self._state: str | None = None
        self._limited = LogLimiter(log, LOG_EVERY_S, clock=clock)

    def jobs(self) -> Jobs:
        """Job ids per device the directory names now (empty while it is missing)."""
        problem = self._directory_problem()
        self._say(problem)
        if problem is not None:
            if self._files:
                self._files, self._jobs = {}, MappingProxyType({})
            return self._jobs
        files, changed = self._scan()
        if changed or files.keys() != self._files.keys():
            merged: dict[DeviceKey, dict[str, None]] = {}
            for name in sorted(files):
                entry = files[name]
                merged.setdefault(entry.key, {}).update(dict.fromkeys(entry.jobs))
            self._jobs = MappingProxyType(
                {key: tuple(jobs) for key, jobs in merged.items() if jobs})
        self._files = files
        return self._jobs

    # --- the directory ------------------------------------------------------------------

    def _directory_problem(self) -> str | None:
        try:
            info = os.stat(self.directory)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        if not stat.S_ISDIR(info.st_mode):
            return "not a directory"
        return None

    def _say(self, problem: str | None) -> None:
        """One line when the directory's state changes (at most one per state per window)."""
        state = problem or "ok"
        if state == self._state:
            return
        first, self._state = self._state is None, state
        if problem is None:
            self._limited.log(("dir", state), logging.INFO,
                              "reading HPC job mapping files from %s%s", self.directory,
                              "" if first else " (it exists again)")
        elif problem == "missing":
            self._limited.log(("dir", state), logging.WARNING,
                              "hpc_job_mapping_dir %s does not exist: no job labels from "
                              "mapping files until it appears (checked every sample)",
                              self.directory)
        else:
            self._limited.log(("dir", state), logging.WARNING,
                              "hpc_job_mapping_dir %s %s: no job labels from mapping files",
                              self.directory, problem)

    def _scan(self) -> tuple[dict[str, _File], bool]:
        """The mapping files now, each re-read only if its status changed; whether any was."""
        files: dict[str, _File] = {}
        changed = False
        seen = 0
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > self._max_entries:
                        self._limited.log(
                            "entries", logging.WARNING,
                            "hpc_job_mapping_dir %s has more than %d entries; the rest are "
                            "ignored", self.directory, self._max_entries)
                        break
                    key = parse_name(entry.name)
                    if key is None:
                        continue  # not a mapping file (a prolog's temporary file, say)
                    found = self._file(entry, key)
                    if found is not None:
                        files[entry.name] = found
                        changed |= self._files.get(entry.name) != found
        except OSError as exc:
            self._limited.log("list", logging.WARNING,
                              "cannot list hpc_job_mapping_dir %s (%s): keeping the jobs "
                              "last read", self.directory, exc.strerror or exc)
            return dict(self._files), False
        return files, changed

    def _file(self, entry: os.DirEntry, key: DeviceKey) -> _File | None:
        path = os.path.join(self.directory, entry.name)
        try:
            info = entry.stat()  # follows a link, so a link to a FIFO is seen as one
        except OSError:
            return None  # removed since it was listed: the epilog ran
        status = _status(info)
        old = self._files.get(entry.name)
        if old is not None and old.status == status:
            return old
        if not stat.S_ISREG(info.st_mode):
            self._limited.log(("bad", entry.name), logging.WARNING,
                              "HPC job mapping file %s is not a regular file: skipped", path)
            return _File(status, key, ())
        try:
            text = read_text(path, "HPC job mapping file", max_bytes=MAX_FILE_BYTES)
        except FileError as exc:
            if os.path.lexists(path):
                self._limited.log(("bad", entry.name), logging.WARNING,
                                  "%s; its device gets no job from it", exc)
            return _File(status, key, ())
        jobs, problems = parse_jobs(text)
        if problems:
            self._limited.log(("bad", entry.name), logging.WARNING,
                              "HPC job mapping file %s: %s (skipped)", path,
                              "; ".join(problems[:3]))
        return _File(status, key, jobs)
