"""The snapshot store: the one place every reader takes the latest published snapshot from.

Built before anything else, so that the readers (instruments, the render
cache, readiness) can be handed it while the loop that fills it does not
exist yet.
"""

from __future__ import annotations

import threading

from otel_gpu.snapshot import Snapshot


class SnapshotStore:
    """Holds the latest snapshot; readers take it without waiting on the sampler."""

    def __init__(self) -> None:
        self._latest: Snapshot | None = None
        self._version = 0
        self._cond = threading.Condition()

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    @property
    def version(self) -> int:
        """Counts publications: changes when a new sample or new pods arrive."""
        return self._version

    def publish(self, snapshot: Snapshot) -> None:
        with self._cond:
            self._latest = snapshot
            self._version += 1
            self._cond.notify_all()

    def wait_for(self, seq: int, timeout: float) -> Snapshot | None:
        """Block until a snapshot numbered ``seq`` or later exists (for tests)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._latest is not None and self._latest.seq >= seq, timeout
            )
            return self._latest
