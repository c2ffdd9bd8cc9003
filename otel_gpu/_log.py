"""Logging set-up and the two guards every loop here uses: once, and rate-limited.

A collector that logs the same NVML or kubelet failure every ten seconds on
every node buries the line that matters at 3 a.m.; these helpers make the
first occurrence loud and the repeats cheap.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


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


def configure(level: str = "info", fmt: str = "text", stream=None) -> None:
    """Route the ``otel_gpu`` loggers (and warnings from libraries) to stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = _JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("otel_gpu").setLevel(level.upper())


class LogOnce:
    """Logs a message the first time its key is seen, and never again."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, level: int, msg: str, *args: object) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(level, msg, *args)
        return True


class RateLimitedLog:
    """Logs a key at most once per ``every`` seconds, counting what it held back."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every = every
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def __call__(
        self, key: Hashable, level: int, msg: str, *args: object, exc_info: bool = False
    ) -> bool:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            held_back = self._suppressed.pop(key, 0)
        if held_back:
            msg += f" ({held_back} similar messages suppressed)"
        self._logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def reset(self, key: Hashable) -> None:
        """Forget a key, so the next failure after a recovery is logged at once."""
        with self._lock:
            self._last.pop(key, None)
            self._suppressed.pop(key, None)
