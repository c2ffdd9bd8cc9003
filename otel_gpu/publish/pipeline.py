"""The publish loop: sample -> attribute -> publish, its threads and its locks.

Everything slow (NVML, the kubelet) happens on two background threads; the
scrape and export paths only read the latest published snapshot.

Threads, and what each owns::

    otel-gpu-sampler       Pipeline._run: every `interval`, Sampler.sample() (all
                           NVML calls), then publish; then the follow-ups the
                           subscribers asked for (the cardinality guard's rebuild
                           of the MeterProvider when finished pods piled up or
                           pods outgrew the SDK's room), never on the kubelet
                           thread, which only wakes this one for an urgent one.
    otel-gpu-read-N        the reader pool (sample.workers): one thread takes
                           each GPU's job (its and its MIG instances' reads) in
                           turn, handed over by the sampler thread, which waits
                           for them up to a deadline; a job running past 0.25 s
                           keeps its thread and a new one reads on, so a hung
                           call keeps only that thread.
    otel-gpu-podresources  PodResourcesWatcher: looks for the kubelet's socket every
                           kubelet interval (importing gRPC only once one is
                           there; its start looks once itself, before the first
                           sample, so a socket there gives that sample the empty
                           answer) and polls the kubelet; on a changed
                           answer, after releasing its poll lock, calls
                           Pipeline.pods_changed(), which re-publishes the latest
                           sample with the new pods.
                           Both publishing threads hand each publication to the
                           subscribers, in order, still under Pipeline._lock: the
                           cardinality guard (instrument.cardinality), the render
                           subscriber (RenderCache.refresh: the Prometheus body is
                           rendered right after publishing while someone scrapes;
                           with no scrape for a while, the stale body is only
                           dropped), and the event
                           subscriber, which turns a sample published for the first
                           time into GPU events (export.events) and queues them
                           for the OTLP logs pipeline (no wait on the backend).
    otel-gpu-attribute-NAME  one per attribute stage (pod, HPC job, container):
                           attribute.enrich.Bounded runs the stage's calls there;
                           the publishing thread waits for each up to the read
                           deadline, and past it publishes without the stage's
                           attributes until the held call returns, so a file read
                           that never returns holds no GPU's sampling.
    otel-gpu-http          MetricsServer's accept loop; otel-gpu-http-conn, one per
                           connection (at most 64): /metrics -> RenderCache.get(),
                           which returns the body rendered on publishing; it renders
                           (Telemetry.render() -> one SDK collection through
                           CollectingReader -> instrument callbacks -> the pinned
                           snapshot -> TextWriter) only before the first publish,
                           when no publish came for the cache's max_age, or when
                           nobody scraped for its idle_after (the publications then
                           stopped rendering).
                           /readyz -> publish.readiness.Readiness (no lock).
    otel-gpu-otlp          export.push.OtlpPush: every otlp_interval, exports the
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

    1. Pipeline._lock        (sampler, podresources) enrich + publish + subscribers:
                             the store always ends with the newest sample joined with
                             the newest pods. Enrich reads a few small bounded files
                             (sysfs NUMA nodes; /proc/<pid>/cgroup and /var/log/pods
                             with process usage) on the stages' own threads, waited
                             for at most the read deadline.
    2. SnapshotStore._cond   inside 1 only; readers never take it.
    3. RenderCache._lock     inside 1 (the render subscriber), or alone (http, a
                             fallback render): one render at a time; a scrape
                             finding it held serves the previous body instead.
    4. Telemetry._lock       inside 3 (render), or alone (the rebuild's swap, an
                             OTLP push's own collection).
    5. the SDK's own locks   inside 4, and on the OTLP thread; inside 1 when an event
                             record is queued (a bounded deque's append).

OtlpPush's export lock, held by one push at a time (its loop, a flush, the final
one), is taken before 4 and held over the export; CollectingReader's lock, one
collection at a time, inside 4 and around 5. DirectCollection's lock, inside
CollectingReader's (the reader collecting through it, which then takes no lock of
the SDK's), is held over the instrument callbacks, which read the pinned snapshot
and take no lock.

Leaf locks, held for a few instructions and never while calling out: the
cardinality guard's (its pair count), the NVML call counter, the kubelet
watcher's poll and stats locks, LogLimiter, the HTTP server's connection table,
BasicAuth's credential cache. BasicAuth's bcrypt semaphore is held only around
one bcrypt check, before 3 is taken. A device's job shares no lock with the
sampler thread: whichever reader thread runs it owns the device's read state
while it runs (a GPU has one job at a time), and hands the result over through
the job's event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from otel_gpu._log import LogLimiter
from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

Stage = Callable[[Snapshot], Snapshot]
"""An attribute stage: a sample in, the same sample joined with something out."""


@dataclass(frozen=True)
class Followup:
    """Work a subscriber wants done on the sampler thread after a publication.

    The loop runs ``run`` after the current sample (never on the kubelet
    thread), then publishes the latest snapshot again, so that whatever the
    subscribers made from the old state (a cached body) is made again.
    ``urgent``: wake the sampler thread now rather than after the next sample,
    and hand this publication to no later subscriber (the re-publication
    reaches them all).
    """

    run: Callable[[], None]
    urgent: bool = field(default=False, compare=False)


class Subscriber(Protocol):
    """Something told of every publication, on the publishing thread, under its lock."""

    def published(self, snapshot: Snapshot) -> Followup | None:
        """Called once the store holds ``snapshot``; must be quick and never wait on I/O."""
        ...


class Pipeline:
    """Samples on an interval, joins each sample with the pods, publishes it to the store,
    and hands every publication to the subscribers.

    ``sample`` takes one sample (all NVML work); the attribute ``stages`` join
    it with pods and jobs, in order. A sample that raises (a bug: driver errors
    never raise) is logged at most once a minute and retried with exponential
    backoff capped at ``timings.max_backoff``; the thread never dies of it.
    """

    def __init__(
        self,
        store: SnapshotStore,
        sample: Callable[[], Snapshot],
        *,
        timings: Timings,
        subscribers: Sequence[Subscriber] = (),
        stages: Sequence[Stage] = (),
    ) -> None:
        self.store = store
        self.timings = timings
        self._sample = sample
        self._stages: list[Stage] = list(stages)
        self._subscribers = tuple(subscribers)
        self._lock = threading.Lock()
        self._due: list[Followup] = []
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: run an urgent follow-up now, or stop
        self._thread = threading.Thread(target=self._run, name="otel-gpu-sampler", daemon=True)
        self._limited = LogLimiter(log, 60.0)

    def add_stage(self, stage: Stage) -> None:
        """Appends an attribute stage built after the loop (the kubelet's, which tells the
        loop of new pods through :meth:`pods_changed`); only before :meth:`start`."""
        if self._thread.is_alive():
            raise RuntimeError("attribute stages are added before the loop starts")
        self._stages.append(stage)

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
        for subscriber in self._subscribers:
            followup = subscriber.published(snapshot)
            if followup is None:
                continue
            if followup not in self._due:
                self._due.append(followup)
            if followup.urgent:
                self._wake.set()
                return  # the re-publication after it reaches the later subscribers

    def _enriched(self, snapshot: Snapshot) -> Snapshot:
        for stage in self._stages:
            try:
                snapshot = stage(snapshot)
            except Exception:  # noqa: BLE001 - a sample already taken is never thrown away
                self._limited.log("enrich", logging.ERROR,
                                  "attribution failed; exporting without its attributes",
                                  exc_info=True)
        return snapshot

    def run_followups(self) -> bool:
        """Run the follow-ups asked for since the last call, on the calling thread, then
        publish the latest snapshot again; whether there were any."""
        with self._lock:
            due, self._due = self._due, []
        try:
            for followup in due:
                followup.run()
        finally:
            if due:
                with self._lock:
                    latest = self.store.latest
                    if latest is not None:
                        self._publish(latest)
        return bool(due)

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
        interval = self.timings.interval
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.publish_sample(self._sample())
                self.run_followups()
                failures = 0
                wait = interval - (time.monotonic() - started)
            except Exception:  # noqa: BLE001 - the loop must outlive any bug
                failures += 1
                wait = min(interval * 2 ** min(failures, 16), self.timings.max_backoff)
                self._limited.log("sample", logging.ERROR,
                                  "sampling failed (%d in a row); next try in %.0f s",
                                  failures, wait, exc_info=True)
            self._pause(max(0.0, wait))

    def _pause(self, seconds: float) -> None:
        """Wait for the next sample, running an urgent follow-up the kubelet thread asks
        for meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            if not self._wake.wait(max(0.0, deadline - time.monotonic())):
                return
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_followups()
            except Exception:  # noqa: BLE001 - the loop must outlive any bug
                self._limited.log("followup", logging.ERROR,
                                  "a follow-up of a publication failed (rebuilding the "
                                  "OpenTelemetry pipeline?)", exc_info=True)
