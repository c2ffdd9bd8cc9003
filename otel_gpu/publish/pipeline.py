"""The running pipeline: sample -> attribute -> publish, its threads and its locks.

Everything slow (NVML, the kubelet) happens on two background threads; the
scrape and export paths only read the latest published snapshot.

Threads, and what each owns::

    otel-gpu-sampler       Pipeline._run: every `interval`, Sampler.sample() (all
                           NVML calls), then publish; then, when finished pods piled
                           up or pods outgrew the SDK's room, the `release` hook
                           rebuilds the MeterProvider (never on the kubelet thread,
                           which only wakes this one when pods outgrew the room).
    otel-gpu-read-N        one per GPU (nvml.workers): that GPU's and its MIG
                           instances' reads, handed over by the sampler thread,
                           which waits for them up to a deadline; a hung call
                           keeps only its own thread.
    otel-gpu-podresources  PodResourcesWatcher: polls the kubelet; on a changed
                           answer, after releasing its poll lock, calls
                           Pipeline.pods_changed(), which re-publishes the latest
                           sample with the new pods.
                           Both publishing threads render the Prometheus body right
                           after they publish (the ``on_publish`` hook:
                           RenderCache.refresh), still under Pipeline._lock; then
                           the hook turns a sample published for the first time
                           into GPU events (events.EventDetector) and queues them
                           for the OTLP logs pipeline (no wait on the backend).
    otel-gpu-kubelet-wait  k8s.enrich.KubeletWatch, only while no kubelet socket
                           exists: checks the path every kubelet interval; when it
                           appears, imports gRPC, builds and starts the watcher
                           above, and ends. Takes no lock.
    otel-gpu-http          MetricsServer's accept loop; otel-gpu-http-conn, one per
                           connection (at most 64): /metrics -> RenderCache.get(),
                           which returns the body rendered on publishing; it renders
                           (Telemetry.render() -> one SDK collection through
                           CollectingReader -> instrument callbacks -> the pinned
                           snapshot -> TextWriter) only before the first publish or
                           when no publish came for the cache's max_age.
    otel-gpu-otlp          exporters.push.OtlpPush: every otlp_interval, exports the
                           collection the last render made (no callbacks run); when
                           none was made since its last push, collects one itself
                           under Telemetry._lock, pinned to the latest snapshot.
                           The export (network, retries) holds no lock of ours.
                           With delta temporality, the SDK's
                           PeriodicExportingMetricReader thread instead: the same
                           callbacks, every otlp_interval, unpinned.
    otel-gpu-retire        short-lived: shuts a replaced MeterProvider down (its
                           final OTLP export) without holding anything of ours.
    OtelBatchLogRecordProcessor  the SDK's thread exporting queued GPU event
                           records (OTLP logs, with OTLP on); otel-gpu-logs-stop,
                           at stop, its final export. Neither takes a lock of ours.

Locks, each private to its class. A thread holding one may take only those
listed after it, so no cycle can form:

    1. Pipeline._lock        (sampler, podresources) enrich + publish: the store always
                             ends with the newest sample joined with the newest pods.
                             Enrich reads a few small bounded files (sysfs NUMA nodes;
                             /proc/<pid>/cgroup and /var/log/pods with process usage).
    2. SnapshotStore._cond   inside 1 only; readers never take it.
    3. RenderCache._lock     inside 1 (the on_publish render), or alone (http, a
                             fallback render): one render at a time; a scrape
                             finding it held serves the previous body instead.
    4. Telemetry._lock       inside 3 (render), or alone (the rebuild's swap, an
                             OTLP push's own collection).
    5. the SDK's own locks   inside 4, and on the OTLP thread; inside 1 when an event
                             record is queued (a bounded deque's append).

OtlpPush's export lock, held by one push at a time (its loop, a flush, the final
one), is taken before 4 and held over the export; CollectingReader's lock, one
collection at a time, inside 4 and around 5.

Leaf locks, held for a few instructions and never while calling out: the
NVML call counter, the kubelet watcher's poll and stats locks, LogLimiter,
the HTTP server's connection table, BasicAuth's credential cache. BasicAuth's
bcrypt semaphore is held only around one bcrypt check, before 3 is taken.
A device's reader thread shares no lock with the sampler thread: it owns the
device's read state while its job runs, and hands the result over through the
job's event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from otel_gpu._log import LogLimiter
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)


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


def stale_after(interval: float) -> float:
    """How old the latest sample may be before the collector stops being ready."""
    return max(3 * interval, 30.0)


def readiness(snapshot: Snapshot | None, now: float, interval: float) -> tuple[bool, str]:
    """Whether ``/readyz`` should pass, and the one-line reason either way."""
    if snapshot is None:
        return False, "not ready: no NVML sample has finished yet"
    age = now - snapshot.taken_monotonic
    if age > stale_after(interval):
        return False, (
            f"not ready: the last NVML sample finished {age:.0f} s ago "
            f"(interval {interval:g} s); the driver may be hung"
        )
    healthy = snapshot.healthy_devices()
    if healthy == 0:
        reasons = list(snapshot.errors) + [d.error for d in snapshot.devices if d.error]
        return False, "not ready: no readable GPU: " + ("; ".join(reasons) or "none found")
    hung = [d.hung for d in snapshot.devices if d.hung and not d.device.is_mig]
    return True, (
        f"ready: {healthy} of {len(snapshot.devices)} device(s) readable, "
        f"sample {snapshot.seq} finished {age:.1f} s ago"
        + (f"; hung: {'; '.join(hung[:3])}" + (f" and {len(hung) - 3} more" if len(hung) > 3
                                               else "") if hung else "")
    )


CHURN_LIMIT = 128
"""Finished (device, pod) pairs that may pile up before a rebuild, when fewer are live."""
CHURNED, GROWN = "churned", "grown"


def room_for(pairs: int) -> int:
    """The (device, pod) pairs a MeterProvider built while ``pairs`` are live is sized for:
    the live ones, and as many finished ones again before :class:`PodChurn` releases them."""
    return 2 * max(pairs, CHURN_LIMIT)


class PodChurn:
    """Says when finished pods' series should be released from the SDK, or pods outgrew it.

    The OpenTelemetry SDK keeps every attribute set an instrument ever saw and,
    past its cardinality limit (2000 per metric unless told otherwise), folds
    new ones into one overflow series: on a node where pods come and go, the
    live pods' series would vanish within hours, and on a node with more
    holders than the limit (time-sliced GPUs) some would never appear.
    Rebuilding the MeterProvider releases every set, and sizes the new limit
    from the pods live then (:func:`otel_gpu.instrument.telemetry.cardinality`). HPC jobs
    churn the same way (a device's series carry its jobs). This counts the
    (device, pod) and (device, jobs) pairs seen since the last rebuild and asks for one
    when finished ones pile up (:data:`CHURNED`) or when more have been seen
    than the provider has ``room`` for (:data:`GROWN`).
    """

    def __init__(self, limit: int = CHURN_LIMIT, room: int | None = None) -> None:
        self.limit = limit
        self.room = room_for(0) if room is None else room
        """Pairs the current MeterProvider is sized for."""
        self._seen: set[tuple] = set()

    def needs_rebuild(self, snapshot: Snapshot) -> str | None:
        """Why the MeterProvider should be rebuilt after ``snapshot`` (None: it need not)."""
        if snapshot.pods is None and snapshot.jobs is None and snapshot.containers is None:
            return None
        current: set[tuple] = {(r.uuid, r.namespace, r.pod, r.container, r.replica)
                               for r in snapshot.allocations()}
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


class Pipeline:
    """Samples on an interval, joins each sample with the pods, publishes it to the store.

    ``sample`` takes one sample (all NVML work); ``enrich`` attaches the pods
    (None without Kubernetes attribution); ``release`` is called on the
    sampler thread when finished pods' series should be dropped from the
    SDK, or when pods outgrew its cardinality limit (then at once, not at the
    next sample), and may return the (device, pod) pairs the rebuilt SDK has
    room for. ``on_publish`` is called after every publication, under the
    pipeline's lock (the Prometheus body is rendered there), except one whose
    pods outgrew the SDK: the release publishes it again at once. A sample that
    raises (a bug: driver errors never raise) is logged at most once a minute
    and retried with exponential backoff capped at ``max_backoff``; the thread
    never dies of it.
    """

    def __init__(
        self,
        sample: Callable[[], Snapshot],
        *,
        interval: float,
        enrich: Callable[[Snapshot], Snapshot] | None = None,
        release: Callable[[], object] | None = None,
        on_publish: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_backoff: float = 300.0,
    ) -> None:
        self.store = SnapshotStore()
        self.interval = interval
        self._sample = sample
        self._enrich = enrich
        self._release = release
        self._on_publish = on_publish
        self._clock = clock
        self._max_backoff = max(max_backoff, interval)
        self._lock = threading.Lock()
        self._churn = PodChurn()
        self._release_due = False
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: run a release now, or stop
        self._thread = threading.Thread(target=self._run, name="otel-gpu-sampler", daemon=True)
        self._limited = LogLimiter(log, 60.0)

    # --- publishing (sampler and kubelet threads) ----------------------------------------

    def publish_sample(self, snapshot: Snapshot) -> None:
        """Publish a new sample, joined with the current pods."""
        with self._lock:
            self._publish(self._enriched(snapshot))

    def pods_changed(self, _state: object = None) -> None:
        """Re-publish the latest sample with the kubelet's new answer."""
        with self._lock:
            latest = self.store.latest
            if latest is not None:
                self._publish(self._enriched(latest))

    def _publish(self, snapshot: Snapshot) -> None:
        self.store.publish(snapshot)
        reason = self._churn.needs_rebuild(snapshot)
        if reason is not None:
            self._release_due = True
        if reason == GROWN:
            self._limited.log("grown", logging.INFO,
                              "%d pod allocation(s) outgrew the OpenTelemetry SDK's room; "
                              "rebuilding it with a larger cardinality limit",
                              len(snapshot.allocations()))
            self._wake.set()
            return  # not rendered by an SDK without room: the release publishes it again
        self._published()

    def _enriched(self, snapshot: Snapshot) -> Snapshot:
        if self._enrich is None:
            return snapshot
        try:
            return self._enrich(snapshot)
        except Exception:  # noqa: BLE001 - a sample already taken is never thrown away
            self._limited.log("enrich", logging.ERROR,
                              "pod attribution failed; exporting without pod attributes",
                              exc_info=True)
            return snapshot

    def release_if_due(self) -> bool:
        """Run ``release`` if pods churned or grew since the last one; on the calling thread.

        The latest snapshot is then published again, so that a body rendered by
        the replaced SDK (perhaps with an overflow series) is not served from a cache.
        """
        with self._lock:
            due, self._release_due = self._release_due, False
        if due and self._release is not None:
            room = self._release()
            with self._lock:
                if isinstance(room, int):
                    self._churn.room = room
                latest = self.store.latest
                if latest is not None:
                    self.store.publish(latest)
                    self._published()
        return due

    def _published(self) -> None:
        if self._on_publish is not None:
            self._on_publish()

    # --- state ---------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        return readiness(self.store.latest, self._clock(), self.interval)

    # --- the sampler thread --------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Whether the thread has ended (False: still inside an NVML call)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.publish_sample(self._sample())
                self.release_if_due()
                failures = 0
                wait = self.interval - (time.monotonic() - started)
            except Exception:  # noqa: BLE001 - the loop must outlive any bug
                failures += 1
                wait = min(self.interval * 2 ** min(failures, 16), self._max_backoff)
                self._limited.log("sample", logging.ERROR,
                                  "sampling failed (%d in a row); next try in %.0f s",
                                  failures, wait, exc_info=True)
            self._pause(max(0.0, wait))

    def _pause(self, seconds: float) -> None:
        """Wait for the next sample, running a release the kubelet thread asks for meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            if not self._wake.wait(max(0.0, deadline - time.monotonic())):
                return
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.release_if_due()
            except Exception:  # noqa: BLE001 - the loop must outlive any bug
                self._limited.log("release", logging.ERROR,
                                  "rebuilding the OpenTelemetry pipeline failed", exc_info=True)
