"""The cardinality policy: how many attribute sets a MeterProvider is sized for, and when
it is rebuilt to release the finished ones.

The OpenTelemetry SDK keeps every attribute set an instrument ever saw and,
past its cardinality limit (2000 per metric unless told otherwise), folds new
ones into one ``otel.metric.overflow`` series: on a node where pods come and
go, the live pods' series would vanish within hours, and on a node with more
holders than the limit (time-sliced GPUs) some would never appear.
Rebuilding the MeterProvider releases every set, and sizes the new limit from
the pods live then (:func:`cardinality`). :class:`CardinalityGuard` watches
the publications and asks the publish loop for a rebuild.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from otel_gpu._log import LogLimiter
from otel_gpu.instrument.schema import Metric, device_observations
from otel_gpu.publish.pipeline import Followup
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

CHURN_LIMIT = 128
"""Finished (device, pod) pairs that may pile up before a rebuild, when fewer are live."""
CHURNED, GROWN = "churned", "grown"
SDK_CARDINALITY_LIMIT = 2000
"""The SDK's default limit, and the floor of ours."""
_UNSAMPLED = (64, 32)
"""Before the first sample: devices (8 GPUs of 7 MIG instances each, and the
GPUs), and series one device may have in one metric."""


def room_for(pairs: int) -> int:
    """The (device, pod) pairs a MeterProvider built while ``pairs`` are live is sized for:
    the live ones, and as many finished ones again before :class:`PodChurn` releases them."""
    return 2 * max(pairs, CHURN_LIMIT)


def cardinality(snapshot: Snapshot | None, catalog: Sequence[Metric]) -> tuple[int, int]:
    """The cardinality limit for a MeterProvider built now, and the (device, pod)
    pairs it has room for.

    Between two rebuilds a metric collects at most (devices + pairs seen) x
    fan-out attribute sets, the fan-out being the most series one device has
    in any metric: a device's series take one set per exclusive owner it had,
    the allocation metric one per pair. The limit leaves room for
    :func:`room_for` the live pairs, and is never below the SDK's default; a
    high limit costs nothing until sets exist.
    """
    if snapshot is None:
        devices, fanout = _UNSAMPLED
        pairs = 0
    else:
        devices = len(snapshot.devices)
        fanout = max((len(device_observations(metric, sample))
                      for metric in catalog if metric.per_node is None
                      for sample in snapshot.devices), default=1)
        fanout = max(fanout, 1)
        pairs = len(snapshot.allocations()) + len(snapshot.jobs or ())
    limit = max(SDK_CARDINALITY_LIMIT, fanout * (devices + room_for(pairs)))
    return limit, limit // fanout - devices


class PodChurn:
    """Says when finished pods' series should be released from the SDK, or pods outgrew it.

    HPC jobs churn the same way as pods (a device's series carry its jobs).
    This counts the (device, pod) and (device, jobs) pairs seen since the last
    rebuild and asks for one when finished ones pile up (:data:`CHURNED`) or
    when more have been seen than the provider has ``room`` for (:data:`GROWN`).
    """

    def __init__(self, limit: int = CHURN_LIMIT, room: int | None = None) -> None:
        self.limit = limit
        self.room = room_for(0) if room is None else room
        """Pairs the current MeterProvider is sized for."""
        self._seen: set[tuple[object, ...]] = set()

    def needs_rebuild(self, snapshot: Snapshot) -> str | None:
        """Why the MeterProvider should be rebuilt after ``snapshot`` (None: it need not)."""
        if snapshot.pods is None and snapshot.jobs is None and snapshot.containers is None:
            return None
        current: set[tuple[object, ...]] = {
            (r.uuid, r.namespace, r.pod, r.container, r.replica) for r in snapshot.allocations()}
        # A device's series carry its HPC jobs: each new set of jobs is new series too.
        current.update((uuid, jobs) for uuid, jobs in (snapshot.jobs or {}).items())
        if snapshot.containers is not None:  # and containers outside Kubernetes, their usage
            current.update(snapshot.containers.devices.items())
        self._seen |= current
        if len(self._seen) > self.room:
            reason = GROWN
        elif len(self._seen) - len(current) > max(self.limit, len(current)):
            reason = CHURNED
        else:
            return None
        self._seen = current
        self.room = room_for(len(current))
        return reason


class Rebuilds(Protocol):
    """What the guard rebuilds: :class:`otel_gpu.instrument.telemetry.Telemetry`."""

    def rebuild(self) -> int:
        """Swap in a new MeterProvider; the (device, pod) pairs it has room for."""
        ...


class CardinalityGuard:
    """A publish-loop subscriber: asks for a rebuild of the MeterProvider when finished
    pods piled up (after the sample) or pods outgrew its room (at once, and before the
    publication is rendered by an SDK without room for it)."""

    def __init__(self, provider: Rebuilds, churn: PodChurn | None = None) -> None:
        self._provider = provider
        self._churn = PodChurn() if churn is None else churn
        self._lock = threading.Lock()  # leaf: the publishers' count vs the rebuild's room
        self._followup = Followup(self.rebuild)
        self._urgent = Followup(self.rebuild, urgent=True)
        self._limited = LogLimiter(log, 60.0)

    def published(self, snapshot: Snapshot) -> Followup | None:
        with self._lock:
            reason = self._churn.needs_rebuild(snapshot)
        if reason is None:
            return None
        if reason == GROWN:
            self._limited.log("grown", logging.INFO,
                              "%d pod allocation(s) outgrew the OpenTelemetry SDK's room; "
                              "rebuilding it with a larger cardinality limit",
                              len(snapshot.allocations()))
            return self._urgent
        return self._followup

    def rebuild(self) -> None:
        room = self._provider.rebuild()
        with self._lock:
            self._churn.room = room
