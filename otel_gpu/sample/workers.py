"""A small pool of reader threads that a hung GPU cannot drain.

An NVML call cannot be cancelled: a GPU whose driver call hangs keeps the
thread that made it. The sampler hands each GPU's reads to the pool as one
:class:`Job` and waits for all of them up to a deadline. A job still running
after :data:`STALL` seconds is *held*: the pool starts a thread in its place,
so the GPUs queued behind it are read on time, and the held thread leaves the
pool once its call returns. A GPU still busy at the deadline is reported as
hung and is not given new work until its call returns, so the pool never has
more than ``size`` threads plus one for each GPU whose call has not returned.

A thread per GPU keeps that promise too, but every round then wakes as many
threads as GPUs (259 threads at 256 GPUs), and switching between them costs
more CPU than many of the reads.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

STALL = 0.25
"""Seconds a job may run before its thread is replaced in the pool. A healthy GPU's
job takes milliseconds, but tens of them while scrapes hold the interpreter (at
0.1 s, four clients scraping without pause made the pool replace threads); a
hung GPU delays the GPUs queued after it this long, once, in the round it hangs."""


HANDOFF = 0.0001
"""Seconds a reader pauses between two GPUs' jobs. Reading GPUs back to back holds
the interpreter in 5 ms slices, and a scrape thread waiting for it waits that long
each time; a blocking pause hands it over (``sleep(0)`` does not, in CPython 3.11).
In the 60 s soak (h100x8, 0.5 s interval, four clients without pause) it took the
pool from 56-58k scrapes and a 33 ms p99 to 69-79k and 20-25 ms; a thread per GPU did
68-71k and 27 ms. It costs wall time, not CPU: about 0.1 ms a GPU."""

READERS = 1
"""Threads that read the GPUs while none hangs. One: against a thread per GPU it costs
0.92x the CPU per sample at 8 GPUs and 0.89x at 64 (``python -m benchmarks.readers``),
and a slow GPU is read around after STALL anyway."""


class Job:
    """One GPU's round of reads; ``done`` is set when it finished."""

    def __init__(self, run: Callable[[], Any], started: float) -> None:
        self.run = run
        self.started = started
        self.begun: float | None = None  # the monotonic time a thread took it
        self.held = False
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.taken = False  # its result handed out, by its round or later (Workers.late)


class DeviceWorker:
    """One GPU's place in the pool: its latest job, and the NVML call the job is in
    (``current``, named by the job with :meth:`doing`, so a hung GPU is reported with
    its call)."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.current: str = ""

    @contextlib.contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """``current`` is ``what`` for the block: a call that never returns keeps it so."""
        self.current = what
        try:
            yield
        finally:
            self.current = ""

    @property
    def busy(self) -> bool:
        job = self.job
        return job is not None and not job.done.is_set()


class Pool:
    """``size`` threads taking jobs in order, each held thread replaced by a new one."""

    def __init__(self, size: int, name: str = "otel-gpu-read") -> None:
        if size < 1:
            raise ValueError(f"a reader pool needs at least one thread, not {size}")
        self._size = size
        self._name = name
        self._serial = itertools.count()
        self._tasks: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._active = 0  # threads that are not held
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads taking new jobs (held ones not counted)."""
        return self._active

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the reader pool is closed")
            start = self._active < self._size
            if start:
                self._active += 1
        if start:
            self._start()
        self._tasks.put(job)

    def hold(self, job: Job, stall: float = STALL) -> None:
        """Where ``job`` has run for ``stall`` or more, the pool goes on without its thread."""
        with self._lock:
            if (job.held or job.begun is None or job.done.is_set() or self._closed
                    or time.monotonic() - job.begun < stall):
                return
            job.held = True
            self._active -= 1
            start = self._active < self._size
            if start:
                self._active += 1
        if start:
            self._start()

    def close(self) -> None:
        """Ends every thread once its current job (if any) returns."""
        with self._lock:
            self._closed = True
            idle = self._active
        for _ in range(idle):
            self._tasks.put(None)

    def _start(self) -> None:
        threading.Thread(target=self._run, name=f"{self._name}-{next(self._serial)}",
                         daemon=True).start()

    def _run(self) -> None:
        while True:
            job = self._tasks.get()
            if job is None:
                return
            job.begun = time.monotonic()
            try:
                job.result = job.run()
            except BaseException as exc:  # noqa: BLE001 - handed back to the sampler thread
                job.error = exc
            finally:
                job.done.set()
            if not self._tasks.empty():
                time.sleep(HANDOFF)  # let a waiting scrape have the interpreter
            with self._lock:
                if not job.held:
                    continue
                if self._closed or self._active >= self._size:
                    return  # replaced while it was stuck: the pool is full without it
                self._active += 1  # the pool is short of a thread: take the place back


class Workers:
    """The node's GPUs, one :class:`DeviceWorker` per index, read by one :class:`Pool`
    in rounds under one deadline.

    A GPU keeps its record across rediscoveries (its job may be stuck in a call of
    an earlier round); a GPU still busy is given no new job.
    """

    def __init__(self, clock: Callable[[], float], size: int = READERS) -> None:
        self._clock = clock
        self._workers: dict[int, DeviceWorker] = {}
        self._pool = Pool(size)

    @property
    def threads(self) -> int:
        """Reader threads taking new jobs (not those a hung call holds)."""
        return self._pool.threads

    def get(self, index: int) -> DeviceWorker:
        worker = self._workers.get(index)
        if worker is None:
            worker = self._workers[index] = DeviceWorker()
        return worker

    def busy(self, index: int | None = None) -> bool:
        """Whether a call on GPU ``index`` (any GPU, if None) is still running."""
        if index is None:
            return any(w.busy for w in self._workers.values())
        worker = self._workers.get(index)
        return worker is not None and worker.busy

    def run(self, jobs: Mapping[int, Callable[[DeviceWorker], T]], timeout: float,
            errors: dict[int, BaseException] | None = None) -> dict[int, T]:
        """Each job for its GPU (skipped where that GPU is busy), all within ``timeout``:
        the results of those that finished in time. A job's exception goes into ``errors``
        by GPU index, so it costs that GPU alone; without ``errors`` it is raised here."""
        now = self._clock()
        started: dict[int, Job] = {}
        for index, run in jobs.items():
            worker = self.get(index)
            if not worker.busy:
                job = worker.job = started[index] = Job(partial(run, worker), now)
                self._pool.submit(job)
        deadline = now + timeout
        stall = min(STALL, timeout / 4)  # a deadline shorter than STALL still reads around
        for job in started.values():
            # in slices of the stall, each counted even where the clock is a test's
            left = max(0.0, deadline - self._clock())
            while left > 0 and not job.done.wait(min(stall, left)):
                for other in started.values():
                    self._pool.hold(other, stall)  # stalled: read on without its thread
                left = min(left - stall, max(0.0, deadline - self._clock()))
        out: dict[int, T] = {}
        for index, job in started.items():
            if job.done.is_set():
                job.taken = True
                if job.error is None:
                    out[index] = job.result
                elif errors is not None:
                    errors[index] = job.error
                else:
                    raise job.error
        return out

    def late(self, index: int) -> Job | None:
        """The job of ``index`` that finished after its round's deadline, once: a job that
        takes something out of the driver (an event) must have its result read, late or not.
        None while it still runs, or when its round or an earlier call handed it out."""
        worker = self._workers.get(index)
        job = worker.job if worker is not None else None
        if job is None or job.taken or not job.done.is_set():
            return None
        job.taken = True
        return job

    def close(self, keep: int | None = None) -> None:
        """Forget GPU indexes from ``keep`` on; with None, end the pool's threads too."""
        for index in [i for i in self._workers if keep is None or i >= keep]:
            del self._workers[index]
        if keep is None:
            self._pool.close()
