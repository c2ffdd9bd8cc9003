"""The collector's own process, read from ``/proc/self`` when a scrape or an export asks.

Every exporter in the Prometheus world serves its CPU time, memory, file
descriptors and start time, so that the operator's standard alerts ("the
exporter uses too much memory", "it is running out of descriptors") find
this one too. They are read when asked, never per sample: one read of
``/proc/self/stat`` (CPU, memory, start), a listing of ``/proc/self/fd`` and
``/proc/self/limits``, tens of microseconds; the boot time the start is
counted from is read once. Where ``/proc`` is missing (not Linux) or a file
cannot be read, the values it gives are left out, never made up.

:data:`PROCESS_METRICS` are the same values as the OpenTelemetry semantic
conventions' ``process.*`` metrics, which the OTLP exporter adds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from otel_gpu._files import read_sysfs
from otel_gpu.instrument.schema import Kind, Metric, Observation
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

STAT_BYTES = 4096
"""``/proc/self/stat`` is one line of about 300 bytes (the command name is 16 at most)."""
LIMITS_BYTES = 8192
"""``/proc/self/limits``: 17 lines of about 80 bytes."""
BOOT_BYTES = 1 << 20
"""``/proc/stat``: its ``btime`` line follows one line per CPU and the interrupt counts."""

CPU_MODE = "cpu.mode"


@dataclass(frozen=True)
class ProcessStats:
    """One reading; a value ``/proc`` did not give is None."""

    cpu_user_s: float | None = None
    cpu_system_s: float | None = None
    resident_bytes: int | None = None
    virtual_bytes: int | None = None
    start_time_s: float | None = None
    """Seconds since the Unix epoch."""
    open_fds: int | None = None
    max_fds: int | None = None

    @property
    def cpu_s(self) -> float | None:
        if self.cpu_user_s is None or self.cpu_system_s is None:
            return None
        return round(self.cpu_user_s + self.cpu_system_s, 6)  # both whole clock ticks


def _read(path: str | Path, limit: int) -> bytes | None:
    """The file's bytes (stripped); None when it is missing, strange or over ``limit``."""
    text = read_sysfs(path, max_bytes=limit)
    return None if text is None else text.encode("ascii", "replace")


class ProcessReader:
    """Reads the process whose ``/proc`` entry is ``root``/self (``root`` is ``/proc``
    but in tests); safe to call from several scrapes at once."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self._root = Path(root)
        self._self = self._root / "self"
        self._stat = str(self._self / "stat")  # strings: a scrape pays no path objects
        self._fd = str(self._self / "fd")
        self._own = os.path.realpath(root) == "/proc"
        """This process's own entry: its limit is asked of the kernel, not parsed."""
        self._ticks = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._boot: float | None = None
        self._boot_read = False
        self._said = False

    def _boot_time(self) -> float | None:
        """The ``btime`` of ``/proc/stat``: constant, so read once."""
        if not self._boot_read:
            self._boot_read = True
            text = _read(self._root / "stat", BOOT_BYTES) or b""
            for line in text.split(b"\n"):
                if line.startswith(b"btime "):
                    with contextlib.suppress(IndexError, ValueError):
                        self._boot = float(line.split()[1])
                    break
        return self._boot

    def read(self) -> ProcessStats:
        """Whatever ``/proc`` gives now (everything None where it gives nothing)."""
        stat = self.stat()
        return ProcessStats(stat.cpu_user_s, stat.cpu_system_s, stat.resident_bytes,
                            stat.virtual_bytes, stat.start_time_s, self.open_fds(),
                            self.max_fds())

    def stat(self) -> ProcessStats:
        """CPU, memory and start time: one read of ``/proc/self/stat``."""
        stat = _read(self._stat, STAT_BYTES)
        if stat is None:
            if not self._said:
                self._said = True
                log.debug("no %s: the process metrics are left out", self._self / "stat")
            return ProcessStats()
        # The command name, in parentheses, may hold spaces and parentheses: the fields
        # counted from the state (field 3 in proc(5)) follow its last ')'.
        fields = stat[stat.rfind(b")") + 1:].split()
        try:
            user, system = int(fields[11]), int(fields[12])
            started, vsize, rss = int(fields[19]), int(fields[20]), int(fields[21])
        except (IndexError, ValueError):
            return ProcessStats()
        boot = self._boot_time()
        return ProcessStats(
            cpu_user_s=user / self._ticks,
            cpu_system_s=system / self._ticks,
            resident_bytes=rss * self._page,
            virtual_bytes=vsize,
            start_time_s=None if boot is None else boot + started / self._ticks,
        )

    def open_fds(self) -> int | None:
        try:
            return len(os.listdir(self._fd))
        except OSError:
            return None

    def max_fds(self) -> int | None:
        """The soft limit on open files (None: unlimited, or not said)."""
        if self._own:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # /proc/self/limits' value
            return None if limit == resource.RLIM_INFINITY else limit
        text = _read(self._self / "limits", LIMITS_BYTES) or b""
        for line in text.split(b"\n"):
            if line.startswith(b"Max open files"):
                soft = line[len(b"Max open files"):].split()[:1]
                return int(soft[0]) if soft and soft[0].isdigit() else None
        return None


READER = ProcessReader()
"""This process's, shared by every caller (it keeps only the boot time)."""


def _cpu(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    stats = READER.stat()
    if stats.cpu_user_s is not None and stats.cpu_system_s is not None:
        yield stats.cpu_user_s, {CPU_MODE: "user"}
        yield stats.cpu_system_s, {CPU_MODE: "system"}


def _resident(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    value = READER.stat().resident_bytes
    return [] if value is None else [(float(value), {})]


def _virtual(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    value = READER.stat().virtual_bytes
    return [] if value is None else [(float(value), {})]


def _descriptors(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    value = READER.open_fds()
    return [] if value is None else [(float(value), {})]


def _uptime(snapshot: Snapshot, now: float) -> Iterable[Observation]:
    start = READER.stat().start_time_s
    return [] if start is None else [(max(0.0, time.time() - start), {})]


_SOURCE = "/proc/self, read at each collection"

PROCESS_METRICS: tuple[Metric, ...] = (
    Metric("process.cpu.time", Kind.COUNTER, "s",
           "CPU seconds the collector's process has used, by cpu.mode (user, system; "
           "with OTLP on).",
           per_node=_cpu, attributes=(CPU_MODE,), source_doc=_SOURCE),
    Metric("process.memory.usage", Kind.UPDOWNCOUNTER, "By",
           "Physical memory the collector's process holds (its resident set; with OTLP on).",
           per_node=_resident, source_doc=_SOURCE),
    Metric("process.memory.virtual", Kind.UPDOWNCOUNTER, "By",
           "Virtual memory the collector's process has mapped (with OTLP on).",
           per_node=_virtual, source_doc=_SOURCE),
    Metric("process.unix.file_descriptor.count", Kind.UPDOWNCOUNTER, "{file_descriptor}",
           "File descriptors the collector's process has open (with OTLP on).",
           per_node=_descriptors, source_doc=_SOURCE),
    Metric("process.uptime", Kind.GAUGE, "s",
           "Seconds since the collector's process started (with OTLP on).",
           per_node=_uptime, source_doc=_SOURCE),
)
"""The semantic conventions' process metrics (sent over OTLP, under the node's Resource,
whose ``service.name`` is the collector's)."""
