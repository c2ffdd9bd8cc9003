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
from collections.abc import Callable
from typing import Any


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
