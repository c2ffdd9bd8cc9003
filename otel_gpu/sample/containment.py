"""One reader's surprise costs that reader's values on that device for that sample.

Real drivers answer what no scenario imagined (SUCCESS with a NULL buffer,
counts that change between calls), and a reader may have a bug. Either ends
in an exception somewhere in a device's read: :class:`ReaderFailures` is where
it stops. The reader's values on that device are left out of that sample, the
device's other values and every other device are published as usual, the
failure is counted by reader (``otel_gpu.reader.failures``), and one line per
device and reader says so at most every five minutes, its traceback at debug
level. The next sample tries the reader again.

Tests count the lines carrying :data:`MARK` and fail on one they did not ask
for, so a bug stays loud in CI while it stays quiet in production.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from otel_gpu._log import LogLimiter

log = logging.getLogger(__name__)

MARK = "reader_failure"
"""The attribute each failure's log record carries (the reader's name): what tests watch."""
WHAT_HAPPENED = "reader failed unexpectedly"
"""The words of each failure's log line, for whoever watches a collector's output."""
RECENT = 16
"""Failures a sample lists among its problems; the counter has them all."""
DEVICE = "device"
"""The reader name charged when a GPU's read job itself raised: all its values that
sample, none of the other GPUs'."""


class ReaderFailures:
    """Failures by reader since start, from any reader thread; each one logged (limited)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 every: float = 300.0) -> None:
        self._counts: dict[str, int] = {DEVICE: 0}
        self._recent: list[str] = []
        self._lock = threading.Lock()
        self._limited = LogLimiter(log, every, clock=clock)

    def expect(self, readers: Iterable[str]) -> None:
        """Count ``readers`` from 0, so that their first failure is an increase."""
        with self._lock:
            for name in readers:
                self._counts.setdefault(name, 0)

    def record(self, where: str, reader: str, why: str,
               error: BaseException | None = None) -> None:
        """``reader`` raised on the device ``where`` names (a label); its values are left out.

        ``why`` is one line (the exception's type and text); ``error`` gives the traceback
        at debug level.
        """
        with self._lock:
            self._counts[reader] = self._counts.get(reader, 0) + 1
            if len(self._recent) < RECENT:
                self._recent.append(f"{where}: the {reader} {WHAT_HAPPENED} ({why})")
        self._limited.log(
            (where, reader), logging.WARNING,
            "%s: the %s " + WHAT_HAPPENED + " (%s); its values are omitted this sample, "
            "the device's other values and the other devices are read as usual",
            where, reader, why, extra={MARK: reader})
        if error is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("%s: the %s reader's traceback", where, reader,
                      exc_info=(type(error), error, error.__traceback__))

    def take_recent(self) -> list[str]:
        """The failures since the last call, one line each (at most :data:`RECENT`): the
        sample's problems, for ``check`` and ``/readyz``."""
        with self._lock:
            recent, self._recent = self._recent, []
        return recent

    def counts(self) -> Mapping[str, int]:
        """A copy: failures by reader name since start."""
        with self._lock:
            return MappingProxyType(dict(self._counts))


def describe(error: BaseException) -> str:
    """``TypeError: 'NoneType' object is not iterable``: one line, bounded."""
    text = " ".join(str(error).split())
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
