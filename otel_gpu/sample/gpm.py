"""Profiling metrics through NVML GPM (GPU Performance Monitoring), without DCGM.

GPM (Hopper and newer) measures what DCGM's profiling module does (SM
activity and occupancy, tensor and FP pipes, DRAM bandwidth, PCIe and NVLink
throughput, video engines) from the driver alone: ``nvmlGpmSampleGet`` fills a
sample buffer with the GPU's counters (``nvmlGpmMigSampleGet``: one MIG GPU
instance's), and ``nvmlGpmMetricsGet`` turns two buffers into rates over the
time between them. Each device keeps two allocated buffers and takes one
sample per collector sample, alternating between them, so the values of
sample n cover the interval since sample n-1. A device seen for the first
time is primed: the sampler takes its first GPM sample a short window
(:data:`WINDOW`) before its first read, so the first collector sample already
carries profiling values instead of the one an interval later. After a
failure the next sample yields none, never a 0. MIG devices that share a GPU
instance (several compute instances) report the same values.

Whether a GPU has GPM is asked once (``nvmlGpmQueryDeviceSupport``); its MIG
instances follow it. A device without GPM (before Hopper, no permission, a
driver without the calls) has its profiling values omitted: :meth:`summary`,
on the sampler thread, logs the node's such devices once, in one line, and
returns them as problems (what ``otel-gpu check`` prints). A device whose
counters another profiler holds (``NVML_ERROR_IN_USE``) is omitted the same
way, logged when that starts and when it ends, and asked again only every
``retry_every`` samples.

Threads: a device's :class:`GpmState` is written by the reader thread running
its GPU's job, while that job runs (a GPU has one job at a time). The sampler
thread reads it between jobs (plain attributes only) and frees the buffers of
a device that is gone or at close, when no job of that GPU runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from otel_gpu import nvml_abi as abi
from otel_gpu._clock import SYSTEM, Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.containment import ReaderFailures
from otel_gpu.sample.library import Nvml, Outcome, Result, classify, error_name
from otel_gpu.sample.sources import Source
from otel_gpu.sample.workers import DeviceWorker
from otel_gpu.snapshot import Device

log = logging.getLogger(__name__)

RETRY_EVERY = 60
"""Samples between two tries on a device whose profiling counters are in use elsewhere."""
PRE_HOPPER = "the GPU does not support it (GPM needs Hopper or newer)"
WINDOW = 0.1
"""Seconds between a new device's priming GPM sample and its first read: long enough for
rates (DCGM's own shortest profiling interval), short enough to stay unnoticed at start."""


@dataclass(eq=False)
class GpmState:
    """One device's GPM state across samples: a GPU's, or a MIG instance's."""

    supported: bool | None = None
    """The support query's answer (GPUs only; None: not answered yet)."""
    unavailable: str | None = None
    """Why this device has no GPM values, for good."""
    busy: str | None = None
    """Set while another profiler holds the counters: what answered what."""
    wait: int = 0
    """Samples still to let pass before a busy device is asked again."""
    buffers: list[Any] = field(default_factory=list)
    """The device's two sample buffers, once allocated."""
    previous: Any = None
    """The buffer holding the last sample: the start of the next interval."""
    skipped: set[int] = field(default_factory=set)
    """Metric ids the device cannot give: not asked for again."""
    primed: bool = False
    """Whether the device's first GPM sample was taken ahead of its first read."""
    refused: str | None = None
    """Set while a MIG instance's GPM sample is refused as if the instance were gone, and
    rediscovery finds it still there: what answered what."""

    def restart(self) -> None:
        """Forget the last sample (the device failed): the next one starts a new interval."""
        self.previous = None


class Tracked(Protocol):
    """What the collector needs of a device the sampler tracks."""

    @property
    def device(self) -> Device: ...

    @property
    def handle(self) -> Any: ...

    @property
    def parent(self) -> Tracked | None: ...

    @property
    def gpm(self) -> GpmState: ...

    def label(self) -> str: ...


class GpmCollector:
    """Reads the GPM sources of the catalog, one device at a time, on its reader thread."""

    def __init__(
        self,
        nvml: Nvml,
        sources: Iterable[Source],
        *,
        retry_every: int = RETRY_EVERY,
        clock: Clock = SYSTEM,
        failures: ReaderFailures | None = None,
    ) -> None:
        self._nvml = nvml
        self._failures = ReaderFailures(clock) if failures is None else failures
        self._m = nvml.module
        self._sources = tuple(s for s in sources if s.gpm)
        self._ids = tuple(dict.fromkeys(i for s in self._sources for i in s.gpm))
        self._retry_every = max(1, retry_every)
        self._busy_codes = frozenset({abi.NVML_ERROR_IN_USE})
        self._gone_codes = frozenset({abi.NVML_ERROR_INVALID_ARGUMENT, abi.NVML_ERROR_NOT_FOUND})
        self._limited = LogLimiter(log, 300.0, clock=clock)
        self._logged: dict[str, tuple[str, str]] = {}
        """Sampler thread only: uuid -> (kind, reason) the log last said about the device."""

    # --- on the device's reader thread ----------------------------------------------------

    def wants_primer(self, t: Tracked) -> bool:
        """Whether ``t`` is new to GPM: its first sample is then taken a window ahead."""
        state = t.gpm
        return (bool(self._ids) and not state.primed and state.unavailable is None
                and (t.parent or t).gpm.supported is not False)

    def prime(self, t: Tracked, worker: DeviceWorker) -> bool:
        """Take ``t``'s first GPM sample (asking for support first), for the next read to pair:
        whether one was taken."""
        t.gpm.primed = True
        self.read(t, {}, [], worker)
        return t.gpm.previous is not None

    def read(self, t: Tracked, values: dict[str, float], unsupported: list[str],
             worker: DeviceWorker) -> None:
        """One GPM sample of ``t`` and, with the previous one, its metrics into ``values``.

        ``unsupported`` gets ``key (ERROR)`` for each source the device turned out
        not to give (the sampler logs those per device, once).
        """
        if not self._ids:
            return
        state = t.gpm
        gpu = t.parent or t
        if t.parent is None and state.supported is None:
            self._query(t, worker)
        if gpu.gpm.supported is not True or state.unavailable is not None:
            return
        if state.busy is not None and state.wait > 0:
            state.wait -= 1
            return
        buffer = self._buffer(t)
        if buffer is None:
            return
        m = self._m
        if t.device.is_mig:
            if t.device.gpu_instance_id is None:
                self._unavailable(state, "its GPU instance id is unknown")
                return
            what = "nvmlGpmMigSampleGet"
            with worker.doing(what):
                res = self._nvml.call(m.nvmlGpmMigSampleGet, gpu.handle,
                                      t.device.gpu_instance_id, buffer)
        else:
            what = "nvmlGpmSampleGet"
            with worker.doing(what):
                res = self._nvml.call(m.nvmlGpmSampleGet, t.handle, buffer)
        if not res.ok:
            self._failed(t, what, res)
            return
        state.busy = state.refused = None
        previous, state.previous = state.previous, buffer
        if previous is not None:
            self._metrics(t, previous, buffer, values, unsupported, worker)

    def _query(self, t: Tracked, worker: DeviceWorker) -> None:
        with worker.doing("nvmlGpmQueryDeviceSupport"):
            res = self._nvml.call(self._m.nvmlGpmQueryDeviceSupport, t.handle)
        if res.ok:
            t.gpm.supported = bool(res.value.isSupportedDevice)
            if not t.gpm.supported:
                self._unavailable(t.gpm, PRE_HOPPER)
        elif res.outcome in (Outcome.UNSUPPORTED, Outcome.MISSING):
            t.gpm.supported = False
            self._unavailable(t.gpm, self._why("nvmlGpmQueryDeviceSupport", res))
        elif res.outcome is Outcome.BROKEN:
            self._failures.record(t.label(), "nvmlGpmQueryDeviceSupport", res.message,
                                  res.error)
        else:  # asked again next sample
            self._limited.log((t.device.uuid, "gpm"), logging.WARNING,
                              "%s: asking whether it supports GPM failed (%s); retrying next "
                              "sample", t.label(), res.message)

    def _buffer(self, t: Tracked) -> Any:
        """The buffer the next sample goes into: the one not holding the previous sample."""
        state = t.gpm
        while len(state.buffers) < 2:
            res = self._nvml.call(self._m.nvmlGpmSampleAlloc)
            if not res.ok:
                self._failed(t, "nvmlGpmSampleAlloc", res)
                return None
            state.buffers.append(res.value)
        return state.buffers[1] if state.previous is state.buffers[0] else state.buffers[0]

    def _metrics(self, t: Tracked, first: Any, second: Any, values: dict[str, float],
                 unsupported: list[str], worker: DeviceWorker) -> None:
        m = self._m
        state = t.gpm
        wanted = [i for i in self._ids if i not in state.skipped]
        if not wanted:
            return
        request = m.c_nvmlGpmMetricsGet_t()
        request.version = abi.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = first
        request.sample2 = second
        entries = request.metrics  # one Python-level lookup, not one per metric
        for i, metric in enumerate(wanted):
            entries[i].metricId = metric
        with worker.doing("nvmlGpmMetricsGet"):
            res = self._nvml.call(m.nvmlGpmMetricsGet, request)
        if not res.ok:
            self._failed(t, "nvmlGpmMetricsGet", res)
            return
        answers: dict[int, float] = {}
        refused: dict[int, int] = {}
        for metric, entry in zip(wanted, entries, strict=False):
            code = int(entry.nvmlReturn)
            if code == abi.NVML_SUCCESS:
                value = float(entry.value)
                if math.isfinite(value):
                    answers[metric] = value
            elif classify(code, m) is Outcome.UNSUPPORTED:
                refused[metric] = code
        state.skipped.update(refused)
        for src in self._sources:
            got = [answers[i] for i in src.gpm if i in answers]
            if got:
                values[src.key] = sum(got) / len(got)
            elif all(i in state.skipped for i in src.gpm):
                codes = [refused[i] for i in src.gpm if i in refused]
                if codes:  # its last id was refused just now
                    unsupported.append(f"{src.key} ({error_name(codes[0], m)})")

    def _failed(self, t: Tracked, what: str, res: Result) -> None:
        state = t.gpm
        if res.code in self._busy_codes:
            state.busy = f"{what} answered {error_name(res.code, self._m)}"
            state.wait = self._retry_every - 1
            state.restart()  # the counters were not ours in between
        elif t.device.is_mig and res.code in self._gone_codes:
            # the instance is gone (the sampler's own reads rediscover), or its GPU instance
            # id is not the driver's: said as a problem until a sample is taken again
            state.restart()
            state.refused = f"{what} answered {error_name(res.code, self._m)}"
        elif res.outcome in (Outcome.UNSUPPORTED, Outcome.MISSING):
            self._unavailable(state, self._why(what, res))
        elif res.outcome is Outcome.DEVICE_FAILED:
            state.restart()  # the device's other reads report it
        elif res.outcome is Outcome.BROKEN:
            state.restart()  # nothing this sample can be paired with the next
            self._failures.record(t.label(), what, res.message, res.error)
        else:
            self._limited.log((t.device.uuid, "gpm"), logging.WARNING,
                              "%s: reading GPM profiling metrics failed in %s (%s); retrying "
                              "next sample", t.label(), what, res.message)

    def _why(self, what: str, res: Result) -> str:
        if res.outcome is Outcome.MISSING:
            return f"{what}: {res.message}"
        name = error_name(res.code, self._m)
        if name == "FUNCTION_NOT_FOUND":
            return f"the driver has no {what} (GPM needs driver R520 or newer)"
        return f"{what} answered {name}"

    def _unavailable(self, state: GpmState, why: str) -> None:
        state.unavailable = why
        self.release(state)

    # --- on the sampler thread, between jobs -------------------------------------------

    def release(self, state: GpmState) -> None:
        """Free the device's sample buffers (it is gone, has no GPM, or the collector stops)."""
        for buffer in state.buffers:
            self._nvml.call(self._m.nvmlGpmSampleFree, buffer)
        state.buffers.clear()
        state.previous = None

    def summary(self, devices: Iterable[Tracked]) -> tuple[list[str], list[str]]:
        """One line per reason the node's devices lack GPM values now: the notes (the GPU or
        driver has no GPM, another profiler holds the counters: expected, nothing to fix)
        and the problems (anything else, a refused permission say).

        Logs each change once: devices newly without GPM (one line per reason,
        naming them all), newly busy, and busy no longer.
        """
        if not self._ids:
            return [], []
        now: dict[str, tuple[str, str]] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        fresh: dict[tuple[str, str], list[str]] = {}
        freed: list[str] = []
        absent: set[str] = set()  # the reasons that say the GPU or its driver has no GPM
        for t in devices:
            state = t.gpm
            if state.unavailable is not None:
                key = ("off", state.unavailable)
                if state.supported is False:
                    absent.add(state.unavailable)
            elif state.busy is not None:
                key = ("busy", state.busy)
            elif state.refused is not None:
                key = ("refused", state.refused)
            else:
                if self._logged.get(t.device.uuid, ("",))[0] == "busy":
                    freed.append(t.label())
                continue
            now[t.device.uuid] = key
            groups.setdefault(key, []).append(t.label())
            if self._logged.get(t.device.uuid) != key:
                fresh.setdefault(key, []).append(t.label())
        self._logged = now
        for (kind, why), labels in fresh.items():
            if kind == "off":
                log.info("profiling metrics (NVML GPM) are omitted for %s: %s",
                         ", ".join(labels), why)
            elif kind == "refused":
                log.warning("profiling metrics (NVML GPM) are refused for %s (%s): omitted, "
                            "asked again every sample", ", ".join(labels), why)
            else:
                log.warning("profiling metrics (NVML GPM) are paused for %s: the counters are "
                            "in use by another profiler (%s); asking again every %d samples",
                            ", ".join(labels), why, self._retry_every)
        if freed:
            log.info("profiling counters free again for %s: GPM values resume after the next "
                     "sample", ", ".join(freed))
        notes: list[str] = []
        problems: list[str] = []
        for (kind, why), labels in groups.items():
            if kind == "off":
                line = f"no profiling metrics (NVML GPM) for {', '.join(labels)}: {why}"
                (notes if why in absent else problems).append(line)
            elif kind == "refused":
                problems.append(f"profiling metrics (NVML GPM) refused for "
                                f"{', '.join(labels)}: {why}")
            else:
                notes.append(f"profiling metrics (NVML GPM) paused for {', '.join(labels)}: "
                             f"counters in use by another profiler ({why})")
        return notes, problems
