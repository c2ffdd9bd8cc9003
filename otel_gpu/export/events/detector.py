"""GPU events: what changed between two published samples, as records for the logs pipeline.

A counter that moved says *that* something happened; an operator paged at
night wants *when*, *what* and *which workload was hit*. :class:`EventDetector`
compares each newly published snapshot with what it saw before and yields
:class:`~otel_gpu.export.events.records.Event` s: every XID NVML delivered, and
the start and end of each condition worth a page (state changes, a hung or lost
GPU, row remapping, uncorrectable ECC errors, a degraded PCIe or NVLink link,
sustained throttling), each condition through hysteresis (:mod:`.episodes`). A
sample yields at most ``max_events`` events; the rest are counted in
:attr:`EventDetector.dropped`.

Nothing here exports: the records go out through :mod:`otel_gpu.export.otlp.logs`.
:class:`EventSubscriber` runs the detector on the publishing thread, as a
subscriber of the publish loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from otel_gpu.export.events.context import DeviceContext
from otel_gpu.export.events.episodes import (
    ECC_RISING,
    FABRIC_HEALTH,
    FABRIC_HEALTH_SEVERITY,
    FABRIC_REGISTRATION,
    HUNG,
    NVLINK_DOWN,
    PCIE_DEGRADED,
    REMAP_FAILED_EVENT,
    REMAP_PENDING_EVENT,
    THROTTLE,
    THROTTLE_KINDS,
    UNKNOWN,
    Episode,
    flag,
    step,
)
from otel_gpu.export.events.records import (
    ECC_ERRORS,
    ERROR,
    FABRIC_CONDITION,
    FABRIC_STATE_ATTR,
    FABRIC_STATUS_ATTR,
    FATAL,
    INFO,
    MAX_HOLDERS,
    NVLINK_LINK,
    PREVIOUS_STATE,
    REMOVED,
    STATE_CHANGE,
    THROTTLE_KIND,
    WARN,
    XID,
    XID_CLASS,
    XID_EVENT,
    XID_SEVERITY,
    Event,
    xid_class,
)
from otel_gpu.export.events.workloads import WorkloadEvents
from otel_gpu.export.naming import xid as xids
from otel_gpu.instrument.attributes import GPU_INDEX, HW_ID, HW_STATE, MIG_CI, MIG_GI
from otel_gpu.instrument.schema import Kind, Metric
from otel_gpu.sample.sources import (
    CLOCK_REASONS,
    ECC_UNCORRECTED,
    ECC_UNCORRECTED_AGGREGATE,
    FABRIC_CLIQUE_ID,
    FABRIC_FAILED,
    FABRIC_HEALTH_FLAGS,
    FABRIC_STATE,
    FABRIC_STATUS,
    NVLINK_ACTIVE,
    PCIE_GEN,
    PCIE_GEN_MAX,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    REMAP_FAILURE,
    REMAP_PENDING,
    UTIL_GPU,
)
from otel_gpu.snapshot import DEGRADED, FAILED, OK, PREDICTED_FAILURE, Snapshot, XidEvent

_FABRIC_STATE_NAMES = {1: "not started", 2: "in progress", 3: "completed"}
STATE_CLEAR = 3
"""Samples a better state must hold before the device is reported back in it."""
_STATE_RANK = {OK: 0, DEGRADED: 1, PREDICTED_FAILURE: 2, FAILED: 3}
_STATE_SEVERITY = {OK: INFO, DEGRADED: WARN, PREDICTED_FAILURE: ERROR, FAILED: FATAL}


@dataclass
class _DeviceState:
    reported: str | None = None
    """The hw.state last reported (None: not yet)."""
    better: int = 0
    """Consecutive samples in a better state than ``reported``."""
    ecc: float | None = None
    links_seen: int = 0
    episodes: dict[tuple, Episode] = field(default_factory=dict)


class EventDetector:
    """Turns a stream of published snapshots into events; not thread-safe (one publisher)."""

    def __init__(self, max_events: int = 1024, *, holders_limit: int = MAX_HOLDERS) -> None:
        self.max_events = max_events
        self.dropped = 0
        """Events not sent because a sample had more than ``max_events``; since start."""
        self.detected = 0
        """Events handed on; since start."""
        self._holders_limit = holders_limit
        self._seq: int | None = None
        self._devices: dict[str, _DeviceState] = {}
        self._index: dict[str, tuple[int, bool]] = {}
        """uuid -> (NVML index, whether a MIG instance), for the devices known."""
        self._workloads = WorkloadEvents()
        """Idle allocations and use outside any allocation (the GPU time ledger's)."""

    def observe(self, snapshot: Snapshot) -> list[Event]:
        """The events of ``snapshot``, once per sample: a re-publication (new pods) gives none."""
        if self._seq is not None and snapshot.seq <= self._seq:
            return []
        self._seq = snapshot.seq
        out: list[Event] = []
        for event in self._detect(snapshot):
            if len(out) < self.max_events:
                out.append(event)
            else:
                self.dropped += 1
        self.detected += len(out)
        return out

    def metrics(self) -> tuple[Metric, ...]:
        """The detector's own counters, as catalog rows (there at 0 from the start)."""
        return (
            Metric("otel_gpu.events", Kind.COUNTER, "{event}",
                   "GPU events detected and handed to the OTLP logs pipeline since start "
                   "(with OTLP on, where the events go).",
                   per_node=lambda snapshot, now: [(float(self.detected), {})],
                   source_doc="collector (event detector)"),
            Metric("otel_gpu.events.dropped", Kind.COUNTER, "{event}",
                   f"GPU events not sent because one sample had more than {self.max_events} "
                   "(with OTLP on).",
                   per_node=lambda snapshot, now: [(float(self.dropped), {})],
                   source_doc="collector (event detector)"),
        )

    # --- detection ----------------------------------------------------------------------

    def _detect(self, snapshot: Snapshot) -> Iterator[Event]:
        present = {s.device.uuid for s in snapshot.devices}
        for uuid in [u for u in self._devices if u not in present]:
            del self._devices[uuid]
            index, mig = self._index.pop(uuid)
            if not mig:  # a MIG instance goes away in a re-layout: no event
                yield Event(REMOVED, ERROR, f"GPU {index} ({uuid}) is no longer listed by NVML",
                            snapshot.taken_at, {HW_ID: uuid, GPU_INDEX: index})
        for sample in snapshot.devices:
            uuid = sample.device.uuid
            state = self._devices.get(uuid)
            if state is None:
                state = self._devices[uuid] = _DeviceState()
                self._index[uuid] = (sample.device.index, sample.device.is_mig)
            context = DeviceContext(snapshot, sample, self._holders_limit)
            for xid in sample.xid_events:
                yield self._xid(context, xid)
            if sample.device.is_mig:
                continue  # its GPU's conditions are its own: reported once, on the GPU
            yield from self._state(context, state)
            yield from self._episodes(context, state)
        yield from self._workloads.detect(snapshot)

    def _xid(self, ctx: DeviceContext, event: XidEvent) -> Event:
        """The MIG ids are the instance's, where the GPU has the one NVML named: a driver
        may put 0 where nvml.h says "none" (NVIDIA's mock does), and 0 is a real id on a
        GPU in MIG mode, so the ids alone cannot tell."""
        cls = xid_class(event.code)
        target = ctx.mig_instance(event.gpu_instance_id, event.compute_instance_id)
        attrs = ctx.attributes(target)
        attrs[XID] = event.code
        attrs[XID_CLASS] = cls
        if target is not None:
            attrs[MIG_GI] = event.gpu_instance_id
            if event.compute_instance_id is not None:
                attrs[MIG_CI] = event.compute_instance_id
        return Event(XID_EVENT, XID_SEVERITY[cls], xids.message(event.code), event.time, attrs)

    def _state(self, ctx: DeviceContext, dev: _DeviceState) -> Iterator[Event]:
        """Worse states are reported at once; a better one once it held :data:`STATE_CLEAR`."""
        now = ctx.sample.state
        before = dev.reported
        if before is None:
            dev.reported = now
            if now == OK:
                return
        elif now == before:
            dev.better = 0
            return
        elif _STATE_RANK[now] < _STATE_RANK[before]:
            dev.better += 1
            if dev.better < STATE_CLEAR:
                return
        dev.reported, dev.better = now, 0
        attrs = ctx.attributes()
        attrs[HW_STATE] = now
        if before is not None:
            attrs[PREVIOUS_STATE] = before
        label = ctx.label()
        if now == FAILED:
            body = f"{label} failed: {ctx.sample.error or 'no reason given'}"
        elif before is None:
            body = f"{label} is {now.replace('_', ' ')}"
        else:
            body = f"{label} went from {before.replace('_', ' ')} to {now.replace('_', ' ')}"
        yield Event(STATE_CHANGE, _STATE_SEVERITY[now], body, ctx.snapshot.taken_at, attrs)

    def _episodes(self, ctx: DeviceContext, dev: _DeviceState) -> Iterator[Event]:
        sample, values = ctx.sample, ctx.sample.values
        readable = sample.readable
        label = ctx.label()
        yield from step(ctx, dev.episodes, ("hung",), HUNG, sample.hung is not None,
                              lambda: f"{label} hangs: {sample.hung}",
                              lambda: f"{label} answers again")
        yield from step(ctx, dev.episodes, ("remap_pending",), REMAP_PENDING_EVENT,
                              flag(values, REMAP_PENDING.key, readable),
                              lambda: f"{label} has a row remap pending: reset the GPU to apply "
                                      "it",
                              lambda: f"{label} has no row remap pending any more")
        yield from step(ctx, dev.episodes, ("remap_failed",), REMAP_FAILED_EVENT,
                              flag(values, REMAP_FAILURE.key, readable),
                              lambda: f"{label} failed to remap a row: the GPU should be "
                                      "replaced",
                              lambda: f"{label} no longer reports a failed row remap")
        yield from self._ecc(ctx, dev, label)
        yield from self._pcie(ctx, dev, label)
        yield from self._nvlink(ctx, dev, label)
        yield from self._fabric(ctx, dev, label)
        reasons = values.get(CLOCK_REASONS.key) if readable else None
        for kind, bits in THROTTLE_KINDS:
            holds = UNKNOWN if reasons is None else bool(int(reasons) & bits)
            name, severity, hyst = THROTTLE
            yield from step(
                ctx, dev.episodes, ("throttle", kind), (f"{name}.{kind}", severity, hyst), holds,
                partial("{} is throttled ({})".format, label, kind),
                partial("{} is no longer throttled ({})".format, label, kind),
                {THROTTLE_KIND: kind})

    def _ecc(self, ctx: DeviceContext, dev: _DeviceState, label: str) -> Iterator[Event]:
        values = ctx.sample.values
        key = ECC_UNCORRECTED.key if ECC_UNCORRECTED.key in values else (
            ECC_UNCORRECTED_AGGREGATE.key)
        count = values.get(key) if ctx.sample.readable else None
        holds: object = UNKNOWN
        rise = 0.0
        if count is not None:
            previous, dev.ecc = dev.ecc, count
            if previous is not None:
                rise = max(0.0, count - previous)
                holds = rise > 0
        episode = dev.episodes.setdefault(("ecc",), Episode())
        if episode.active and rise:
            before = episode.detail.get(ECC_ERRORS, 0)
            episode.detail = {ECC_ERRORS: (before if isinstance(before, int) else 0) + int(rise)}
        yield from step(
            ctx, dev.episodes, ("ecc",), ECC_RISING, holds,
            lambda: f"{label}: {int(rise)} new uncorrectable ECC error(s), {int(count or 0)} "
                    "since the driver loaded",
            lambda: f"{label}: no new uncorrectable ECC error for a while",
            {ECC_ERRORS: int(rise)})

    def _pcie(self, ctx: DeviceContext, dev: _DeviceState, label: str) -> Iterator[Event]:
        """Width below its maximum; generation below its maximum while busy (an idle GPU
        lowers its link generation on purpose, to save power)."""
        v = ctx.sample.values
        holds: object = UNKNOWN
        text = ""
        if ctx.sample.readable:
            parts = []
            width, wmax = v.get(PCIE_WIDTH.key), v.get(PCIE_WIDTH_MAX.key)
            gen, gmax = v.get(PCIE_GEN.key), v.get(PCIE_GEN_MAX.key)
            if width is not None and wmax is not None and width < wmax:
                parts.append(f"x{int(width)} of x{int(wmax)}")
            if (gen is not None and gmax is not None and gen < gmax
                    and v.get(UTIL_GPU.key, 1) > 0):
                parts.append(f"gen {int(gen)} of {int(gmax)}")
            if (width, wmax) != (None, None) or (gen, gmax) != (None, None):
                holds = bool(parts)
                text = ", ".join(parts)
        yield from step(ctx, dev.episodes, ("pcie",), PCIE_DEGRADED, holds,
                              lambda: f"{label}: PCIe link runs below its maximum ({text})",
                              lambda: f"{label}: PCIe link back at its maximum")

    def _nvlink(self, ctx: DeviceContext, dev: _DeviceState, label: str) -> Iterator[Event]:
        """A link seen active before and not active now is down."""
        sample = ctx.sample
        if not sample.readable or not sample.values:
            active = None
        else:
            active = int(sample.values.get(NVLINK_ACTIVE.key, 0))
            dev.links_seen |= active
        seen = dev.links_seen
        link = 0
        while seen >> link:
            if seen >> link & 1:
                holds = UNKNOWN if active is None else not active >> link & 1
                yield from step(ctx, dev.episodes, ("nvlink", link), NVLINK_DOWN, holds,
                                      partial("{}: NVLink {} is down".format, label, link),
                                      partial("{}: NVLink {} is up again".format, label, link),
                                      {NVLINK_LINK: link})
            link += 1

    def _fabric(self, ctx: DeviceContext, dev: _DeviceState, label: str) -> Iterator[Event]:
        """A GPU in an NVLink domain whose registration is not complete, or completed with
        an error, is out of its domain; each health condition is an episode of its own."""
        v = ctx.sample.values if ctx.sample.readable else {}
        state, failed = v.get(FABRIC_STATE.key), v.get(FABRIC_FAILED.key)
        holds: object = UNKNOWN
        detail: dict[str, object] = {}
        why = ""
        if state is not None:
            done = state == 3  # NVML_GPU_FABRIC_STATE_COMPLETED
            holds = not done or bool(failed)
            name = _FABRIC_STATE_NAMES.get(int(state), f"unknown ({int(state)})")
            detail[FABRIC_STATE_ATTR] = name.replace(" ", "_")
            why = f"registration {name}"
            status = v.get(FABRIC_STATUS.key)
            if done and failed and status is not None:
                detail[FABRIC_STATUS_ATTR] = int(status)
                why = f"registration completed with NVML error {int(status)}"
        clique = v.get(FABRIC_CLIQUE_ID.key)
        joined = "" if clique is None else f" (clique {int(clique)})"
        yield from step(ctx, dev.episodes, ("fabric",), FABRIC_REGISTRATION, holds,
                              lambda: f"{label} is not in its NVLink domain: {why}",
                              lambda: f"{label} joined its NVLink domain{joined}", detail)
        for condition, src in FABRIC_HEALTH_FLAGS:
            name, severity, hyst = FABRIC_HEALTH
            text = condition.replace("_", " ")
            yield from step(
                ctx, dev.episodes, ("fabric", condition),
                (f"{name}.{condition}", FABRIC_HEALTH_SEVERITY.get(condition, severity), hyst),
                flag(v, src.key, ctx.sample.readable),
                partial("{}: NVLink fabric health: {}".format, label, text),
                partial("{}: NVLink fabric health: no longer {}".format, label, text),
                {FABRIC_CONDITION: condition})


class EventSubscriber:
    """A publish-loop subscriber: hands the events of each new sample to ``emit`` (which
    queues them for the OTLP logs pipeline and never waits on the backend)."""

    def __init__(self, detector: EventDetector, emit: Callable[[Event], None]) -> None:
        self.detector = detector
        self._emit = emit

    def published(self, snapshot: Snapshot) -> None:
        for event in self.detector.observe(snapshot):
            self._emit(event)
