"""Sampling: the only place NVML is read, as one pass per :meth:`Sampler.sample`.

A pass runs discovery when due (:mod:`~otel_gpu.sample.discovery`), drains the
XID events (:mod:`~otel_gpu.sample.xid`), then reads each GPU with its MIG
instances as one job of the reader pool (:mod:`~otel_gpu.sample.workers`):
the batched field values (:mod:`~otel_gpu.sample.batch`), the plain calls
(:mod:`~otel_gpu.sample.calls`), the processes
(:mod:`~otel_gpu.sample.processes`) and GPM (:mod:`~otel_gpu.sample.gpm`).
Every call made for one GPU, discovery included, runs in that GPU's job under
a deadline, so a call that never returns stalls only its GPU; a reader that
raises costs its own values on its device that sample and nothing else
(:mod:`~otel_gpu.sample.containment`). The pass
returns an immutable :class:`~otel_gpu.snapshot.Snapshot`;
:mod:`otel_gpu.publish.pipeline` runs passes on an interval, and nothing on
the scrape path calls into here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import MappingProxyType

from otel_gpu._clock import SYSTEM, Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.batch import FieldReads
from otel_gpu.sample.calls import CallReads
from otel_gpu.sample.containment import DEVICE, ReaderFailures, describe
from otel_gpu.sample.device import Tracked, state_of
from otel_gpu.sample.discovery import Discovery, mig_profile, unknown_uuid
from otel_gpu.sample.gpm import WINDOW, GpmCollector
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.node import NodeCalls
from otel_gpu.sample.outcomes import Bounds, Outcomes, log_unsupported
from otel_gpu.sample.processes import ProcessReads
from otel_gpu.sample.sources import Source
from otel_gpu.sample.topology import Topology
from otel_gpu.sample.workers import DeviceWorker, Workers
from otel_gpu.sample.xid import COMMON_XIDS, XidEvents
from otel_gpu.snapshot import DeviceSample, Snapshot

__all__ = ["COMMON_XIDS", "Sampler", "mig_profile", "unknown_uuid"]

log = logging.getLogger(__name__)


class Sampler:
    """Reads every GPU and MIG instance once per :meth:`sample` call.

    ``clock`` is the one :class:`~otel_gpu._clock.Clock` every stage reads (a plain
    function: its monotonic time, the system's wall clock and sleep beside it).
    """

    def __init__(
        self,
        nvml: Nvml,
        sources: Iterable[Source],
        *,
        clock: Clock | Callable[[], float] = SYSTEM,
        max_events: int = 256,
        rediscover_every: int = 60,
        read_timeout: float = 5.0,
        sysfs_root: Path | None = None,
        process_usage: bool = False,
        gpm_window: float = WINDOW,
        workers: Workers | None = None,
    ) -> None:
        self._nvml = nvml
        self._m = nvml.module
        sources = tuple(sources)
        self._clock = clock = Clock.of(clock)
        self._rediscover_every = max(1, rediscover_every)
        self._read_timeout = read_timeout
        self._failures = ReaderFailures(clock)
        self._outcomes = Outcomes(self._m, clock=clock, failures=self._failures)
        self._fields = FieldReads(nvml, sources, self._outcomes)
        self._calls = CallReads(nvml, sources, self._outcomes, process_usage=process_usage,
                                refresh_every=self._rediscover_every)
        self._procs = ProcessReads(nvml, self._outcomes) if process_usage else None
        self._gpm = GpmCollector(nvml, sources, clock=clock, failures=self._failures)
        self._failures.expect(["fields", "calls", *self._calls.names, "gpm", "discovery"]
                              + (list(self._procs.names) if self._procs else []))
        self._gpm_window = min(max(0.0, gpm_window), 1.0)
        self._bounds = Bounds(sources)
        self._xid = XidEvents(nvml, max_events=max_events, clock=clock)
        self._workers = Workers(clock) if workers is None else workers
        self._topology = Topology(Discovery(nvml, sysfs_root=sysfs_root), self._workers,
                                  self._xid, timeout=read_timeout, release=self._release_gpm,
                                  clock=clock, failures=self._failures)
        self._node = NodeCalls(nvml, self._workers, self._topology, self._xid, self._failures,
                               timeout=read_timeout, clock=clock)
        self._seq = 0
        self._limited = LogLimiter(log, 300.0, clock=clock)

    # --- sampling --------------------------------------------------------------

    def sample(self) -> Snapshot:
        """Read everything once. Never raises for a driver error, never waits on a hung GPU."""
        started = self._clock()
        problems: list[str] = []
        count = self._node.count(problems)
        if count is None:
            pass  # hung or raised, said above: the GPUs known are read as before
        elif count.ok:
            # Periodic rediscovery catches GPUs back after a reset and anything the
            # cheaper triggers miss; a MIG re-layout is caught on its first failing call.
            periodic = self._seq > 0 and self._seq % self._rediscover_every == 0
            known = self._topology.count
            if (count.value != known or periodic or self._outcomes.topology_changed
                    or self._topology.due()):
                if known is not None and count.value != known:
                    log.warning("NVML now reports %d GPU(s), was %d", count.value, known)
                self._outcomes.topology_changed = False
                self._node.setup(problems)
                self._topology.discover(count.value, problems)
            else:
                problems.extend(f"GPU {i} could not be opened"
                                for i in sorted(self._topology.unopened))
        else:
            problems.append(f"nvmlDeviceGetCount failed: {count.message}")
            self._limited.log("count", logging.WARNING, "nvmlDeviceGetCount failed: %s",
                              count.message)
        if count is not None and count.ok and count.value == 0:
            problems.append("NVML reports no GPU")
        problems.extend(f"{t.label()}: {t.mig_note}" for t in self._topology.devices
                        if t.mig_note)
        self._node.events(problems)
        samples = self._read_all(problems)
        notes, gpm_problems = self._gpm.summary(self._topology.devices)
        notes = self._outcomes.binding_notes() + notes
        problems.extend(gpm_problems)
        problems.extend(self._failures.take_recent())
        self._seq += 1
        finished = self._clock()
        return Snapshot(
            seq=self._seq,
            taken_at=self._clock.wall(),
            taken_monotonic=finished,
            duration=finished - started,
            driver_version=self._topology.driver_version,
            devices=samples,
            nvml_calls=self._nvml.calls,
            reader_failures=self._failures.counts(),
            errors=tuple(problems),
            notes=tuple(notes),
        )

    def busy(self) -> bool:
        """Whether an NVML call made for a device is still running (then NVML must stay up)."""
        return self._workers.busy()

    def close(self) -> None:
        """Lets the reader threads end (a hung one ends when its call returns)."""
        for t in self._topology.devices:
            self._release_gpm(t)
        self._workers.close()

    def _release_gpm(self, t: Tracked) -> None:
        """Free a device's GPM buffers, unless a call on its GPU still runs (then they stay)."""
        if not self._workers.busy((t.parent or t).device.index):
            self._gpm.release(t.gpm)

    # --- reading, one job per GPU -----------------------------------------------------

    def _read_all(self, problems: list[str]) -> tuple[DeviceSample, ...]:
        """Each GPU (with its MIG instances) read as one job of the pool, under one deadline."""
        groups: dict[int, list[Tracked]] = {}
        for t in self._topology.devices:
            groups.setdefault((t.parent or t).device.index, []).append(t)
        self._prime(groups)
        errors: dict[int, BaseException] = {}
        done = self._workers.run(
            {index: partial(self._read_group, group) for index, group in groups.items()},
            self._read_timeout, errors)
        end = self._clock()
        out: list[DeviceSample] = []
        answered: list[Tracked] = []
        for index, group in groups.items():
            if index in done:
                self._answered(group[0], end)
                out.extend(t.sample(end) for t in group)
                answered.extend(group)
            elif index in errors:  # its job raised: no value of this GPU this sample
                self._failures.record(group[0].label(), DEVICE, describe(errors[index]),
                                      errors[index])
                out.extend(t.hung_sample(None, end, end) for t in group)
            else:
                out.extend(self._hung(t, self._workers.get(index), end, problems)
                           for t in group)
        log_unsupported(answered)
        return tuple(out)

    def _prime(self, groups: dict[int, list[Tracked]]) -> None:
        """New devices' first GPM samples, one window before the read that pairs them.

        Runs once per device (discovery, a GPU back, a new MIG layout), so only
        a sample that finds new devices waits; a GPU that hangs here is found
        busy by the read that follows and reported hung there.
        """
        jobs = {index: partial(self._prime_group, new)
                for index, group in groups.items()
                if (new := [t for t in group if self._gpm.wants_primer(t)])}
        if not jobs:
            return
        started = self._clock()
        errors: dict[int, BaseException] = {}
        taken = self._workers.run(jobs, self._read_timeout, errors)
        for index, error in errors.items():
            self._failures.record(groups[index][0].label(), "gpm", describe(error), error)
        left = self._gpm_window - (self._clock() - started)
        if any(taken.values()) and left > 0:
            self._clock.sleep(left)

    def _prime_group(self, group: list[Tracked], worker: DeviceWorker) -> bool:
        return any([self._gpm.prime(t, worker) for t in group])

    def _hung(self, t: Tracked, worker: DeviceWorker, now: float, problems: list[str]
              ) -> DeviceSample:
        since = worker.job.started if worker.job is not None else now
        what = (f"{t.label()}: reading {worker.current or 'the device'} has not returned "
                f"after {now - since:.1f} s")
        if t.parent is None:
            problems.append(what)
            if t.hung_since is None:
                log.error("%s; its values are omitted until it answers, the other GPUs are "
                          "read as usual", what)
            t.hung_since = since
        return t.hung_sample(what, since, now)

    @staticmethod
    def _answered(gpu: Tracked, now: float) -> None:
        if gpu.hung_since is not None:
            log.warning("%s answered again after %.0f s", gpu.label(), now - gpu.hung_since)
            gpu.hung_since = None

    def _stage(self, t: Tracked, name: str, read: Callable[..., str | None],
               values: dict[str, float], *args: object) -> str | None:
        """One stage of a device's reads, its values kept only if it finished: a stage that
        raises costs its own values on this device this sample (counted and logged)."""
        part: dict[str, float] = {}
        try:
            failure = read(t, part, *args)
        except Exception as exc:  # noqa: BLE001 - contained to this stage, reported
            self._failures.record(t.label(), name, describe(exc), exc)
            return None
        values.update(part)
        return failure

    def _read_group(self, group: list[Tracked], worker: DeviceWorker) -> None:
        for t in group:
            self._read(t, worker)

    def _read(self, t: Tracked, worker: DeviceWorker) -> None:
        """One device's reads, on its GPU's worker thread; the outcome is left on ``t``."""
        values: dict[str, float] = {}
        unsupported: list[str] = []
        reads = t.reads
        failure = t.parent.reads.failure if t.parent is not None else t.open_failure
        if failure is None:
            retry: set[str] = set()  # fields the batch failed this time: their call stands in
            failure = self._stage(t, "fields", self._fields.read, values, unsupported, worker,
                                  retry)
            if failure is None:
                try:  # each reader is contained in there; this is for the loop itself
                    failure = self._calls.read(t, values, unsupported, worker, retry, self._seq)
                except Exception as exc:  # noqa: BLE001 - the readers' answers so far stand
                    self._failures.record(t.label(), "calls", describe(exc), exc)
        if failure is None and self._procs is not None:
            failure = self._stage(t, "processes", self._procs.read, values, unsupported,
                                  worker)
        if failure is None:
            self._stage(t, "gpm", self._gpm.read, values, unsupported, worker)
            reads.dropped = self._bounds.drop(t, values)
        else:
            reads.dropped = 0
            t.gpm.restart()  # after a failure, a new interval starts
            reads.kept.clear()  # and nothing read before it is reused
        reads.newly_unsupported.extend(unsupported)  # logged for the node by the sampler
        if failure is not None and reads.failure is None:
            log.error("%s failed: %s; its series are dropped and hw.status reports failed",
                      t.label(), failure)
        elif failure is None and reads.failure is not None:
            log.warning("%s is readable again", t.label())
        reads.failure = failure
        reads.state = state_of(failure, values)
        reads.values = MappingProxyType(values)
        reads.read_at = self._clock()
