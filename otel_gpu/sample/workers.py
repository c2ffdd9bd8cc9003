"""One reader thread per GPU, so a driver call that never returns stalls only its own GPU.

An NVML call cannot be cancelled: a GPU whose driver call hangs keeps the
thread that made it. The sampler hands each GPU's reads to that GPU's
:class:`DeviceWorker` and waits for all of them up to a deadline; a worker
still busy at the deadline is reported as hung and is not given new work
until its call returns. The other GPUs keep being read on time.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")


class Job:
    """One round of reads handed to a worker; ``done`` is set when it finished."""

    def __init__(self, run: Callable[[], Any], started: float) -> None:
        self.run = run
        self.started = started
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class DeviceWorker:
    """A daemon thread running one :class:`Job` at a time for one GPU.

    ``current`` says what NVML call the job is in (set by the job itself), so a
    hung GPU can be reported with the call that hangs.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.job: Job | None = None
        self.current: str = ""
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        job = self.job
        return job is not None and not job.done.is_set()

    def submit(self, run: Callable[[], Any], now: float) -> Job:
        if self.busy:
            raise RuntimeError(f"{self.name} is still busy")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        job = self.job = Job(run, now)
        self._jobs.put(job)
        return job

    def close(self) -> None:
        """Ends the thread once its current job (if any) returns."""
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.result = job.run()
            except BaseException as exc:  # noqa: BLE001 - handed back to the sampler thread
                job.error = exc
            finally:
                job.done.set()


class Workers:
    """The node's workers, one per GPU index, and rounds of jobs under one deadline.

    A GPU keeps its worker across rediscoveries (the thread may be stuck in a call
    of an earlier round); a worker still busy is given no new job.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._workers: dict[int, DeviceWorker] = {}

    def get(self, index: int) -> DeviceWorker:
        worker = self._workers.get(index)
        if worker is None:
            worker = self._workers[index] = DeviceWorker(f"otel-gpu-read-{index}")
        return worker

    def busy(self, index: int | None = None) -> bool:
        """Whether a call on GPU ``index`` (any GPU, if None) is still running."""
        if index is None:
            return any(w.busy for w in self._workers.values())
        worker = self._workers.get(index)
        return worker is not None and worker.busy

    def run(self, jobs: Mapping[int, Callable[[DeviceWorker], T]], timeout: float
            ) -> dict[int, T]:
        """Each job on its GPU's worker (skipped where it is busy), all within ``timeout``:
        the results of those that finished in time. A job's exception is raised here."""
        now = self._clock()
        started: dict[int, Job] = {}
        for index, run in jobs.items():
            worker = self.get(index)
            if not worker.busy:
                started[index] = worker.submit(partial(run, worker), now)
        deadline = now + timeout
        for job in started.values():
            job.done.wait(max(0.0, deadline - self._clock()))
        out: dict[int, T] = {}
        for index, job in started.items():
            if job.done.is_set():
                if job.error is not None:
                    raise job.error  # a bug, not the driver: the pipeline logs and backs off
                out[index] = job.result
        return out

    def close(self, keep: int | None = None) -> None:
        """End the threads of GPU indexes from ``keep`` on (all, if None)."""
        for index in [i for i in self._workers if keep is None or i >= keep]:
            self._workers.pop(index).close()
