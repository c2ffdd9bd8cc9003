"""The node's own NVML calls, run as jobs of the reader pool like a GPU's reads.

The device count, the driver version, the XID event set and its events are
asked about no GPU; a driver call among them that never returns used to hold
the sampler thread and with it every GPU. Here each is a job under the read
deadline, on a worker of its own (a negative index: no GPU has one), so a hung
one costs what it gives (the count: the known GPUs are read as before; the
events: none this sample) and is named among the sample's problems, and in the
log once until it answers again.

A drain of the event set that outlasts the deadline has taken its events out of
the driver: they exist nowhere else. Its result is read by the first sample
after it returns (:meth:`Workers.late`), so every event drained is counted,
however late.

A count is also checked before it is believed: NVML's all-ones, a count past
any node, or one the handles contradict (a GPU still answers at an index the
count says is gone, or none at an index it says is new) keeps the GPUs known.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from otel_gpu._clock import Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.containment import ReaderFailures, describe
from otel_gpu.sample.library import Nvml, Outcome, Result
from otel_gpu.sample.topology import Topology
from otel_gpu.sample.workers import DeviceWorker, Workers
from otel_gpu.sample.xid import XidEvents

COUNT, SETUP, EVENTS = -1, -2, -3
"""The node's workers: the count, the driver version and event set, the XID events."""
log = logging.getLogger(__name__)

MAX_GPUS = 1024
"""More GPUs than one node holds (a 512-GPU node is the largest the tests run): a count
past it is no count."""


class NodeCalls:
    """The sampler's node-level calls, each under the read deadline."""

    def __init__(self, nvml: Nvml, workers: Workers, topology: Topology, xid: XidEvents,
                 failures: ReaderFailures, *, timeout: float,
                 clock: Clock) -> None:
        self._nvml = nvml
        self._m = nvml.module
        self._workers = workers
        self._topology = topology
        self._xid = xid
        self._failures = failures
        self._timeout = timeout
        self._clock = clock
        self._hung: dict[int, float] = {}
        """The node's workers whose call has not returned, since when: logged once each."""
        self._limited = LogLimiter(log, 300.0, clock=clock)
        """A drain slow for minutes on end hangs and answers by turns: a line each way per
        five minutes, with the count of those held back."""

    def count(self, problems: list[str]) -> Result | None:
        """The device count's answer; None where the call hung or raised (said among
        ``problems`` or counted). Anything but a believed count keeps the GPUs known."""
        res: Result | None = self._run(COUNT, self._count, "nvmlDeviceGetCount", problems)
        return res

    def setup(self, problems: list[str]) -> None:
        """The driver version (once) and the XID event set, before a discovery."""
        self._run(SETUP, self._setup, "the driver version and the XID event set", problems)

    def events(self, problems: list[str]) -> None:
        """The XID events waiting, applied to their GPUs on this (the sampler's) thread."""
        late = self._workers.late(EVENTS)
        if late is not None:  # a drain that returned after its deadline: its events first
            self._answered(EVENTS, "nvmlEventSetWait")
            if late.error is not None:
                self._failures.record("the node", "nvmlEventSetWait", describe(late.error),
                                      late.error)
            else:
                self._xid.apply(late.result)
        if not self._xid.is_ready:
            return
        found = self._run(EVENTS, self._xid.collect, "nvmlEventSetWait", problems,
                          then="the XID events it drains are counted once it returns")
        if found is not None:
            self._xid.apply(found)

    def _run(self, key: int, job: Callable[[DeviceWorker], Any], what: str,
             problems: list[str], then: str = "the GPUs are read as before") -> Any:
        errors: dict[int, BaseException] = {}
        started = self._clock()
        done = self._workers.run({key: job}, self._timeout, errors)
        if key in done or key in errors:
            self._answered(key, what)
        if key in done:
            return done[key]
        if key in errors:
            self._failures.record("the node", what, describe(errors[key]), errors[key])
            return None
        worker = self._workers.get(key)
        since = worker.job.started if worker.job is not None else started
        line = (f"the node: {worker.current or what} has not returned after "
                f"{self._clock() - since:.1f} s; {then}")
        problems.append(line)
        if key not in self._hung:
            self._limited.log((key, "hung"), logging.ERROR, "%s", line)
        self._hung[key] = since
        return None

    def _answered(self, key: int, what: str) -> None:
        """The log's word that a node call said hung has returned (once, like the hang's)."""
        since = self._hung.pop(key, None)
        if since is not None:
            self._limited.log((key, "answered"), logging.WARNING,
                              "the node: %s answered again after %.1f s", what,
                              self._clock() - since)

    # --- on the node's workers ----------------------------------------------------------

    def _count(self, worker: DeviceWorker) -> Result:
        m = self._m
        with worker.doing("nvmlDeviceGetCount"):
            res = self._nvml.call(m.nvmlDeviceGetCount)
        if not res.ok:
            return res
        value, known = res.value, self._topology.count
        if not isinstance(value, int) or not 0 <= value <= MAX_GPUS:
            return Result(None, Outcome.TRANSIENT, message=f"answered {value!r}, no GPU count")
        if known is None or value == known:
            return res
        # A GPU that goes away takes the last index with it; a new one brings the next.
        probe = value if value < known else value - 1
        with worker.doing("nvmlDeviceGetHandleByIndex"):
            there = self._nvml.call(m.nvmlDeviceGetHandleByIndex, probe).ok
        if there == (value > known):
            return res
        return Result(None, Outcome.TRANSIENT, message=(
            f"answered {value} (was {known}), but GPU {probe} "
            + ("still answers" if there else "does not answer")))

    def _setup(self, worker: DeviceWorker) -> None:
        if self._topology.driver_version is None:
            with worker.doing("nvmlSystemGetDriverVersion"):
                self._topology.driver_version = self._topology.discovery.driver_version()
        with worker.doing("nvmlEventSetCreate"):
            self._xid.ready()
