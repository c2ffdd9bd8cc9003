"""The attribution stage's seam: each source of workloads is an :class:`Enricher`.

An enricher takes the sampler's snapshot and hands on a copy with its
workloads attached (pods, HPC jobs, containers outside Kubernetes), as
dcgm-exporter's ``Transform`` does; the publish loop runs the configured ones
in order (pods, then jobs, then containers). :class:`Bounded` runs one on a
thread of its own, so that a read of its that never returns cannot hold the
sampling of any GPU. An enricher whose source is
asked in the background (the kubelet, the container runtime) is a
:class:`Watched` one: the service starts, stops and asks each alike.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol, runtime_checkable

from otel_gpu._log import LogLimiter
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

HELD_EVERY_S = 600.0
"""A stage held again and again is said at most once in ten minutes."""


@runtime_checkable
class Enricher(Protocol):
    """One attribution source. ``process`` runs on the sampler's and the kubelet's
    threads, one call at a time (under the pipeline's lock), never on a scrape; it
    must not raise for bad input from its source."""

    def process(self, snapshot: Snapshot) -> Snapshot: ...


class Polled(Protocol):
    """A source asked in the background (:class:`~otel_gpu.attribute.watch.SocketWatch`
    and what waits for one)."""

    def poll_once(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 2.0) -> None: ...


class Watched:
    """Base of the enrichers whose source (``watcher``) is asked on a thread of its own: the
    service starts and stops them, and ``check`` asks them once, all through these three."""

    watcher: Polled

    def start(self) -> None:
        """Start asking the source in the background."""
        self.watcher.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop asking; waits at most ``timeout`` for the thread."""
        self.watcher.stop(timeout)

    def refresh(self) -> bool:
        """Ask the source once, now (what ``check`` shows); whether it answered."""
        return self.watcher.poll_once()


class _Job:
    """One call of a :class:`Bounded` stage: its snapshot in, its result or error out."""

    __slots__ = ("snapshot", "done", "result", "error", "started")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.done = threading.Event()
        self.result: Snapshot | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()


class Bounded:
    """An enricher run on a thread of its own and waited for at most ``deadline`` seconds.

    A stage reads files and ``/proc`` on the sampler's (or the kubelet's) thread, under the
    pipeline's lock: one read that never returns (a network file system, a process stuck in
    the kernel) would hold every GPU's sampling with it. Here such a call costs the
    snapshots the stage's attributes, with one warning, until it returns; the samples are
    published on time meanwhile, and the stage's next call starts once the stuck one ended,
    so the stage still runs one call at a time.
    """

    def __init__(self, stage: Enricher, name: str, deadline: float) -> None:
        self.stage = stage
        self.name = name
        self.deadline = deadline
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._late: _Job | None = None
        self._limited = LogLimiter(log, HELD_EVERY_S)

    def process(self, snapshot: Snapshot) -> Snapshot:
        late = self._late
        if late is not None:
            if not late.done.is_set():
                return snapshot  # still held: said when it began
            self._late = None
            log.info("%s attribution is back: the held call returned after %.1f s",
                     self.name, time.monotonic() - late.started)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, daemon=True,
                                            name=f"otel-gpu-attribute-{self.name}")
            self._thread.start()
        job = _Job(snapshot)
        self._jobs.put(job)
        if not job.done.wait(self.deadline):
            self._late = job
            self._limited.log("held", logging.WARNING,
                              "%s attribution took longer than %g s (a file or /proc read "
                              "that does not return?); samples are published without it "
                              "until it returns", self.name, self.deadline)
            return snapshot
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        assert job.result is not None
        return job.result

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.result = self.stage.process(job.snapshot)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who logs it
                job.error = exc
            finally:
                job.done.set()

    def close(self) -> None:
        """Ends the stage's thread once its current call returns (a held one: when it does)."""
        self._jobs.put(None)
