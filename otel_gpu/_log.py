"""Logging set-up, and the guard every loop here uses: once, or at most once per interval.

A collector that logs the same NVML or kubelet failure every ten seconds on
every node buries the line that matters at 3 a.m.; these helpers make the
first occurrence loud and the repeats cheap.

Library messages (the OpenTelemetry SDK's, gRPC's) pass at most once a minute
per message template. The internal variable ``_OTEL_GPU_LIBRARY_LOG_WINDOW``
(seconds) shortens that window; it exists so that tests can cover many windows
in a few seconds, and is not a setting.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LIBRARY_WINDOW_S = 60.0
LIBRARY_WINDOW_ENV = "_OTEL_GPU_LIBRARY_LOG_WINDOW"


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines that parse fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class _LibraryRateLimit(logging.Filter):
    """Lets each library message template through once per window, with a count of repeats.

    The OpenTelemetry SDK logs every failed export; with the backend down that
    is a line per export interval forever.
    """

    def __init__(self, prefixes: tuple[str, ...], every: float = LIBRARY_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._prefixes = prefixes
        self._every = every
        self._clock = clock
        self._seen: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._prefixes):
            return True
        key, now = (record.name, str(record.msg)), self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self._every:
                entry[1] += 1
                return False
            held_back = int(entry[1]) if entry else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > 256:
                self._seen.popitem(last=False)
        if held_back:
            record.msg = f"{record.msg} ({held_back} similar messages suppressed)"
        return True


def library_window(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between two lines of one library message: ``$_OTEL_GPU_LIBRARY_LOG_WINDOW``
    when it is a positive number, else a minute."""
    raw = (os.environ if environ is None else environ).get(LIBRARY_WINDOW_ENV, "")
    try:
        seconds = float(raw)
    except ValueError:
        return LIBRARY_WINDOW_S
    return seconds if seconds > 0 else LIBRARY_WINDOW_S


def configure(
    level: str = "info", fmt: str = "text", stream: TextIO | None = None, *,
    library_every: float | None = None,
) -> None:
    """Route the ``otel_gpu`` loggers (and warnings from libraries) to stderr.

    Library messages are rate-limited per template, once per ``library_every``
    seconds (default: :func:`library_window`).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = _JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    every = library_window() if library_every is None else library_every
    handler.addFilter(_LibraryRateLimit(("opentelemetry", "grpc"), every))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("otel_gpu").setLevel(level.upper())


class LogLimiter:
    """Lets a recurring log line through at most once per ``interval`` seconds.

    Long-running loops hit the same failure every few seconds for hours; this
    keeps one line per key per interval and reports how many were dropped in
    between. Keys are bounded (least recently used dropped first) so a stream
    of distinct keys (say, unknown device ids) cannot grow memory.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 300.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._max_keys = max_keys
        # key -> [time of the last emitted line, suppressed count since]
        self._seen: OrderedDict[Hashable, list[float | int]] = OrderedDict()
        self._lock = threading.Lock()

    def log(
        self, key: Hashable, level: int, msg: str, *args: object, exc_info: bool = False,
        extra: Mapping[str, object] | None = None,
    ) -> bool:
        """Log ``msg % args`` unless ``key`` was logged less than ``interval`` ago.

        Returns whether the line was emitted. Keys are shared with :meth:`once`.
        """
        now = self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None:
                self._seen.move_to_end(key)
                last, suppressed = entry
                if now - last < self._interval:
                    entry[1] = int(suppressed) + 1
                    return False
                if suppressed:
                    msg = f"{msg} ({int(suppressed)} similar messages suppressed)"
                entry[0], entry[1] = now, 0
            else:
                self._remember(key, now)
        self._logger.log(level, msg, *args, exc_info=exc_info, extra=extra)
        return True

    def once(self, key: Hashable, level: int, msg: str, *args: object) -> bool:
        """Log ``msg`` the first time ``key`` is seen (within the key bound)."""
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._remember(key, self._clock())
        self._logger.log(level, msg, *args)
        return True

    def _remember(self, key: Hashable, now: float) -> None:
        self._seen[key] = [now, 0]
        while len(self._seen) > self._max_keys:
            self._seen.popitem(last=False)


class ChangeLimiter:
    """Says when to log a summary of state that changes: on a change, at most once per ``interval``.

    For state too large to log item by item (thousands of unmatched device
    ids, say): the caller passes a small fingerprint of the current state on
    every pass and writes one summary line when :meth:`changes` says so. A
    change within ``interval`` of the last line is held back, and the next
    pass after the interval reports the state as it is then, with the number
    of changes the line covers. Memory is one fingerprint and two numbers
    whatever the state's size. Not thread-safe: its owner calls it from one
    thread at a time.
    """

    def __init__(
        self,
        interval: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        initial: Hashable = None,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._key = initial
        self._pending = 0
        self._last_line: float | None = None

    def changes(self, key: Hashable) -> int:
        """Note the state's fingerprint; how many changes a line written now covers (0: none)."""
        if key != self._key:
            self._key = key
            self._pending += 1
        if not self._pending:
            return 0
        now = self._clock()
        if self._last_line is not None and now - self._last_line < self._interval:
            return 0
        changes, self._pending, self._last_line = self._pending, 0, now
        return changes


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def where(exc: BaseException) -> str:
    """The file and line an exception was raised at: where a one-line report points."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}"
