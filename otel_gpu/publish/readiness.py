"""Readiness: whether ``/readyz`` passes, from the latest published snapshot alone."""

from __future__ import annotations

import time
from collections.abc import Callable

from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import Snapshot


def readiness(snapshot: Snapshot | None, now: float, timings: Timings) -> tuple[bool, str]:
    """Whether ``/readyz`` should pass, and the one-line reason either way."""
    if snapshot is None:
        return False, "not ready: no NVML sample has finished yet"
    age = now - snapshot.taken_monotonic
    if age > timings.stale_after:
        return False, (
            f"not ready: the last NVML sample finished {age:.0f} s ago "
            f"(interval {timings.interval:g} s); the driver may be hung"
        )
    healthy = snapshot.healthy_devices()
    if healthy == 0:
        reasons = list(snapshot.errors) + [d.error for d in snapshot.devices if d.error]
        return False, "not ready: no readable GPU: " + ("; ".join(reasons) or "none found")
    return True, (
        f"ready: {healthy} of {len(snapshot.devices)} device(s) readable, "
        f"sample {snapshot.seq} finished {age:.1f} s ago"
    )


class Readiness:
    """The ``/readyz`` check of a store: callable from any thread, takes no lock."""

    def __init__(
        self, store: SnapshotStore, timings: Timings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._timings = timings
        self._clock = clock

    def __call__(self) -> tuple[bool, str]:
        return readiness(self._store.latest, self._clock(), self._timings)
