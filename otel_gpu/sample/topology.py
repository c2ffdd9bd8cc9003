"""The node's devices across discoveries: when to look again, and what each look keeps.

:meth:`Topology.discover` hands each GPU's look-up (:meth:`Discovery.open`) to
that GPU's worker and waits for all of them within one deadline, on the
sampler thread. A GPU that does not answer in time keeps what was known of it
(a placeholder named by its index at start-up) and is reported hung by the
sampler's reads; it is looked at again once its call returns, and so is one
whose look-up raised. A GPU that cannot be opened is kept and failed, never
dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from otel_gpu._clock import SYSTEM, Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.containment import ReaderFailures, describe
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.discovery import Discovery, Found
from otel_gpu.sample.library import Result
from otel_gpu.sample.workers import Workers
from otel_gpu.sample.xid import XidEvents, token

log = logging.getLogger(__name__)

NOT_FINISHED = "discovery has not finished"


class Topology:
    """The tracked devices, rediscovered by the sampler when :meth:`due`."""

    def __init__(self, discovery: Discovery, workers: Workers, xid: XidEvents, *,
                 timeout: float, release: Callable[[Tracked], None],
                 clock: Clock = SYSTEM,
                 failures: ReaderFailures | None = None) -> None:
        self.discovery = discovery
        """What looks GPUs up (the node's calls read the driver version through it too)."""
        self._failures = ReaderFailures(clock) if failures is None else failures
        self._workers = workers
        self._xid = xid
        self._timeout = timeout
        self._release = release
        self.devices: list[Tracked] = []
        self.count: int | None = None
        """The device count at the last discovery."""
        self.unopened: set[int] = set()
        self._undiscovered: set[int] = set()
        """GPUs whose look-up did not finish in time: looked at again once they answer."""
        self.driver_version: str | None = None
        self._limited = LogLimiter(log, 300.0, clock=clock)

    def due(self) -> bool:
        """Whether a GPU that could not be opened now can, or a hung look-up answered: two
        calls per such GPU, on its worker."""
        if any(not self._workers.busy(i) for i in self._undiscovered):
            return True
        if not self.unopened:
            return False
        errors: dict[int, BaseException] = {}
        done = self._workers.run({i: partial(self.discovery.reopenable, i)
                                  for i in sorted(self.unopened)}, self._timeout, errors)
        self._raised(errors)
        return any(done.values())

    def discover(self, count: int, problems: list[str]) -> None:
        previous = {t.device.uuid: t for t in self.devices}
        gpus = {t.device.index: t for t in self.devices if not t.device.is_mig}

        def register(uuid: str, handle: Any) -> Result | None:
            return self._xid.register(handle) if self._xid.wanted(previous.get(uuid)) else None

        errors: dict[int, BaseException] = {}
        done = self._workers.run(
            {i: partial(self.discovery.open, i, frozenset(previous), register)
             for i in range(count)}, self._timeout, errors)
        self._raised(errors)
        found: list[Tracked] = []
        self.unopened, self._undiscovered = set(), set()
        for index in range(count):
            old, result = gpus.get(index), done.get(index)
            if result is None:  # hung, or its look-up raised: keep what was known, if anything
                self._undiscovered.add(index)
                found.extend([old, *self._children(old)] if old is not None else [
                    self.discovery.unopened(index, count, NOT_FINISHED)])
            elif result.uuid is None:
                found.extend(self._unopenable(result, old, count, problems))
            else:
                found.extend(self._assemble(result, previous))
        kept = {t.device.uuid for t in found}
        added = [t.device.uuid for t in found if t.device.uuid not in previous]
        if previous and added:
            log.warning("new devices appeared: %s", ", ".join(added))
        gone = [uuid for uuid in previous if uuid not in kept]
        if gone:
            log.warning("devices no longer listed by NVML: %s", ", ".join(gone))
        for uuid in gone:
            self._release(previous[uuid])
        self._workers.close(keep=count)
        self.devices = found
        self._xid.track({key: t for t in found if not t.device.is_mig and t.open_failure is None
                         and (key := token(t.handle)) is not None})
        self.count = count
        log.log(
            logging.INFO if added or gone or not previous else logging.DEBUG,
            "discovered %d GPU(s) and %d MIG instance(s); driver %s",
            sum(1 for t in found if not t.device.is_mig),
            sum(1 for t in found if t.device.is_mig),
            self.driver_version or "unknown",
        )

    def _raised(self, errors: Mapping[int, BaseException]) -> None:
        """A GPU whose look-up raised is looked at again at the next sample, as a hung one."""
        for index, error in errors.items():
            self._failures.record(f"GPU {index}", "discovery", describe(error), error)

    def _assemble(self, result: Found, previous: Mapping[str, Tracked]) -> list[Tracked]:
        tracked = self.discovery.assemble(result, previous)
        if result.registration is not None:
            self._xid.registered(tracked[0], result.registration)
        return tracked

    def _children(self, gpu: Tracked) -> list[Tracked]:
        return [t for t in self.devices if t.parent is gpu]

    def _unopenable(self, result: Found, old: Tracked | None, count: int,
                    problems: list[str]) -> list[Tracked]:
        """A GPU NVML counts but cannot open: kept, and reported failed, never dropped.

        It keeps the identity it had (UUID, bus id, MIG instances) when it was
        seen before; a GPU lost since start gets its index and, where sysfs
        tells, its PCI bus id. Only its handle is asked for again each sample.
        """
        index, why = result.index, result.why
        problems.append(f"GPU {index} could not be opened: {why}")
        self._limited.log(("discover", index), logging.WARNING,
                          "GPU %d could not be opened (%s); reported as failed and retried "
                          "every sample", index, why)
        self.unopened.add(index)
        if old is not None:
            old.open_failure = f"could not be opened: {why}"
            return [old, *self._children(old)]
        return [self.discovery.unopened(index, count, f"could not be opened: {why}")]
