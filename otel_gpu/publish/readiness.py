"""Readiness: whether ``/readyz`` passes, from the latest published snapshot alone."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import FAILED, DeviceSample, Snapshot


def readiness(snapshot: Snapshot | None, now: float, timings: Timings,
              notes: Sequence[str] = ()) -> tuple[bool, str]:
    """Whether ``/readyz`` should pass, and the one-line reason either way.

    ``notes`` (what an attribution stage lacks: no kubelet socket) are added to the
    reason and change nothing of the answer: the device metrics are right without them.
    """
    ready, reason = _readiness(snapshot, now, timings)
    return ready, "; ".join((reason, *notes))


def _readiness(snapshot: Snapshot | None, now: float, timings: Timings) -> tuple[bool, str]:
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
        reasons = unreadable_gpus(snapshot) or list(snapshot.errors)
        return False, "not ready: no readable GPU: " + ("; ".join(reasons) or "none found")
    hung = [d.hung for d in snapshot.devices if d.hung and not d.device.is_mig]
    more = f" and {len(hung) - 3} more" if len(hung) > 3 else ""
    return True, (
        f"ready: {healthy} of {len(snapshot.devices)} device(s) readable, "
        f"sample {snapshot.seq} finished {age:.1f} s ago"
        + (f"; hung: {'; '.join(hung[:3])}{more}" if hung else "")
    )


def unreadable_gpus(snapshot: Snapshot) -> list[str]:
    """One reason per GPU none of whose devices can be read, naming it by index and uuid:
    the failed ones first, then the hung ones, each in index order. A MIG instance is
    its GPU's; the sample's notes (a feature a GPU lacks) are no reason."""
    worst: dict[str, tuple[int, int, str]] = {}
    for sample in snapshot.devices:
        if sample.readable:
            continue
        device = sample.device
        gpu = device.parent_uuid or device.uuid
        label = f"GPU {device.index} ({gpu})"
        if sample.state == FAILED:
            rank, why = 0, f"{label} failed: {sample.error or 'no reason given'}"
        else:
            detail = sample.hung or ""
            for prefix in (f"{label}: ", f"{_label(sample)}: "):  # the sampler names it too
                detail = detail.removeprefix(prefix)
            rank, why = 1, f"{label} hangs: {detail or 'a driver call has not returned'}"
        key = (rank, device.index, why)
        if gpu not in worst or key < worst[gpu]:
            worst[gpu] = key
    return [why for _, _, why in sorted(worst.values())]


def _label(sample: DeviceSample) -> str:
    d = sample.device
    if d.is_mig:
        return f"GPU {d.index} MIG {d.mig_profile} ({d.uuid})"
    return f"GPU {d.index} ({d.uuid})"


class Readiness:
    """The ``/readyz`` check of a store: callable from any thread, takes no lock."""

    def __init__(
        self, store: SnapshotStore, timings: Timings,
        clock: Callable[[], float] = time.monotonic,
        notes: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self._store = store
        self._timings = timings
        self._clock = clock
        self._notes = notes
        """What the reason adds (see :func:`readiness`); cheap, read on each probe."""

    def __call__(self) -> tuple[bool, str]:
        return readiness(self._store.latest, self._clock(), self._timings, self._notes())
