"""GPU events: what changed between two published samples, as records for the logs pipeline.

A counter that moved says *that* something happened; an operator paged at
night wants *when*, *what* and *which workload was hit*. :class:`EventDetector`
compares each newly published snapshot with what it saw before and yields
:class:`Event` s: every XID NVML delivered, and the start and end of each
condition worth a page (state changes, a hung or lost GPU, row remapping,
uncorrectable ECC errors, a degraded PCIe or NVLink link, sustained
throttling). Conditions go through hysteresis (:class:`Hysteresis`): one must
hold for some consecutive samples to start and be gone for some to end, so a
flapping value is one episode, not one record per sample. A sample yields at
most ``max_events`` events; the rest are counted in :attr:`EventDetector.dropped`.

Nothing here exports: the records go out through :mod:`otel_gpu.export.otlp.logs`.
:class:`EventSubscriber` runs the detector on the publishing thread, as a
subscriber of the publish loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType

from otel_gpu.export.naming import xid as xids
from otel_gpu.instrument.attributes import (
    GPU_INDEX,
    HW_ID,
    HW_STATE,
    MIG_CI,
    MIG_GI,
    device_attributes,
    kubelet_numa_node,
)
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
    THROTTLE_REASONS,
    UTIL_GPU,
)
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    DeviceSample,
    Snapshot,
    XidEvent,
)

# Severities, as OpenTelemetry's severity text spells them.
FATAL, ERROR, WARN, INFO = "FATAL", "ERROR", "WARN", "INFO"

# XID classes: what the operator has to do.
XID_FATAL = "fatal"
"""The GPU is gone or stopped: drain the node; a reboot or a GPU reset brings it back."""
XID_RESET = "needs_reset"
"""The GPU keeps running but needs a reset (after its work is moved) to be healthy again."""
XID_INFO = "informational"
"""An application fault or a recovered error: the GPU itself is fine."""
XID_UNKNOWN = "unknown"
"""A code not in the catalogue."""

XID_CLASSES: Mapping[int, str] = MappingProxyType({
    **dict.fromkeys((8, 62, 79, 119, 120, 143), XID_FATAL),
    **dict.fromkeys((38, 48, 54, 57, 58, 63, 64, 74, 95, 121, 140, 154), XID_RESET),
    **dict.fromkeys((13, 31, 32, 43, 45, 56, 61, 68, 69, 92, 94, 109), XID_INFO),
})
"""XID code -> class, for every code :data:`otel_gpu.export.naming.xid.MESSAGES` names (but 0)."""
XID_SEVERITY: Mapping[str, str] = MappingProxyType({
    XID_FATAL: FATAL, XID_RESET: ERROR, XID_INFO: WARN, XID_UNKNOWN: WARN,
})

# Attribute names of the records (besides the device's and the pod's).
EVENT_PHASE = "nvidia.gpu.event.phase"
EVENT_DURATION = "nvidia.gpu.event.duration"
XID = "nvidia.gpu.xid"
XID_CLASS = "nvidia.gpu.xid.class"
PREVIOUS_STATE = "nvidia.gpu.previous_state"
HOLDERS = "nvidia.gpu.k8s.holders"
NVLINK_LINK = "nvidia.gpu.nvlink.link"
THROTTLE_KIND = "nvidia.gpu.throttle.kind"
ECC_ERRORS = "nvidia.gpu.ecc.uncorrected.errors"
FABRIC_STATE_ATTR = "nvidia.gpu.fabric.state"
FABRIC_STATUS_ATTR = "nvidia.gpu.fabric.status"
"""The NVML return code a completed fabric registration failed with."""
FABRIC_CONDITION = "nvidia.gpu.fabric.health.condition"
START, END = "start", "end"
MAX_HOLDERS = 32
"""Holders of a shared device named on one record, at most."""


def xid_class(code: int) -> str:
    """The class of ``code``: :data:`XID_FATAL`, :data:`XID_RESET`, :data:`XID_INFO` or unknown."""
    return XID_CLASSES.get(code, XID_UNKNOWN)


@dataclass(frozen=True)
class Event:
    """One record to send: ``name`` is the OpenTelemetry event name."""

    name: str
    severity: str
    body: str
    time: float
    """Wall-clock time (epoch seconds) of the event."""
    attributes: Mapping[str, object]
    """The device's, the event's, and the holding pod's (``k8s.*``) attributes."""


@dataclass(frozen=True)
class Hysteresis:
    """How long a condition must hold to start an episode, and be gone to end it (samples)."""

    start: int
    end: int


# Episodes: name, severity at start, hysteresis. Ends are INFO.
HUNG = ("nvidia.gpu.hung", ERROR, Hysteresis(1, 2))
REMAP_PENDING_EVENT = ("nvidia.gpu.row_remap.pending", WARN, Hysteresis(1, 2))
REMAP_FAILED_EVENT = ("nvidia.gpu.row_remap.failed", ERROR, Hysteresis(1, 2))
ECC_RISING = ("nvidia.gpu.ecc.uncorrected", ERROR, Hysteresis(1, 6))
PCIE_DEGRADED = ("nvidia.gpu.pcie.link.degraded", WARN, Hysteresis(3, 3))
NVLINK_DOWN = ("nvidia.gpu.nvlink.down", ERROR, Hysteresis(2, 2))
THROTTLE = ("nvidia.gpu.throttle", WARN, Hysteresis(3, 3))
FABRIC_REGISTRATION = ("nvidia.gpu.fabric.registration", ERROR, Hysteresis(1, 2))
FABRIC_HEALTH = ("nvidia.gpu.fabric.health", WARN, Hysteresis(2, 2))
FABRIC_HEALTH_SEVERITY: Mapping[str, str] = MappingProxyType({
    "route_unhealthy": ERROR, "incorrect_configuration": ERROR,
    "fabric_manager_disconnected": ERROR,
})
"""Health conditions that keep the GPU out of its NVLink domain's traffic; the others (a
recovery under way, degraded bandwidth, no partition yet) are warnings."""
_FABRIC_STATE_NAMES = {1: "not started", 2: "in progress", 3: "completed"}
STATE_CHANGE = "nvidia.gpu.state.change"
STATE_CLEAR = 3
"""Samples a better state must hold before the device is reported back in it."""
REMOVED = "nvidia.gpu.removed"
XID_EVENT = "nvidia.gpu.xid"

_BITS = dict(THROTTLE_REASONS)
THROTTLE_KINDS: tuple[tuple[str, int], ...] = (
    ("thermal", _BITS["sw_thermal_slowdown"] | _BITS["hw_thermal_slowdown"]),
    ("power", _BITS["sw_power_cap"] | _BITS["hw_power_brake_slowdown"] | _BITS["hw_slowdown"]),
)
"""Throttling kind -> the clock event reason bits that make it."""
_STATE_RANK = {OK: 0, DEGRADED: 1, PREDICTED_FAILURE: 2, FAILED: 3}
_STATE_SEVERITY = {OK: INFO, DEGRADED: WARN, PREDICTED_FAILURE: ERROR, FAILED: FATAL}

_UNKNOWN = object()
"""A condition that cannot be judged this sample (values missing): counts neither way."""


@dataclass
class _Episode:
    active: bool = False
    run: int = 0
    """Consecutive samples against the current phase."""
    since: float = 0.0
    detail: Mapping[str, object] = field(default_factory=dict)


@dataclass
class _DeviceState:
    reported: str | None = None
    """The hw.state last reported (None: not yet)."""
    better: int = 0
    """Consecutive samples in a better state than ``reported``."""
    ecc: float | None = None
    links_seen: int = 0
    episodes: dict[tuple, _Episode] = field(default_factory=dict)


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
            context = _Context(snapshot, sample, self._holders_limit)
            for xid in sample.xid_events:
                yield self._xid(context, xid)
            if sample.device.is_mig:
                continue  # its GPU's conditions are its own: reported once, on the GPU
            yield from self._state(context, state)
            yield from self._episodes(context, state)

    def _xid(self, ctx: _Context, event: XidEvent) -> Event:
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

    def _state(self, ctx: _Context, dev: _DeviceState) -> Iterator[Event]:
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

    def _episodes(self, ctx: _Context, dev: _DeviceState) -> Iterator[Event]:
        sample, values = ctx.sample, ctx.sample.values
        readable = sample.readable
        label = ctx.label()
        yield from self._step(ctx, dev, ("hung",), HUNG, sample.hung is not None,
                              lambda: f"{label} hangs: {sample.hung}",
                              lambda: f"{label} answers again")
        yield from self._step(ctx, dev, ("remap_pending",), REMAP_PENDING_EVENT,
                              _flag(values, REMAP_PENDING.key, readable),
                              lambda: f"{label} has a row remap pending: reset the GPU to apply "
                                      "it",
                              lambda: f"{label} has no row remap pending any more")
        yield from self._step(ctx, dev, ("remap_failed",), REMAP_FAILED_EVENT,
                              _flag(values, REMAP_FAILURE.key, readable),
                              lambda: f"{label} failed to remap a row: the GPU should be "
                                      "replaced",
                              lambda: f"{label} no longer reports a failed row remap")
        yield from self._ecc(ctx, dev, label)
        yield from self._pcie(ctx, dev, label)
        yield from self._nvlink(ctx, dev, label)
        yield from self._fabric(ctx, dev, label)
        reasons = values.get(CLOCK_REASONS.key) if readable else None
        for kind, bits in THROTTLE_KINDS:
            holds = _UNKNOWN if reasons is None else bool(int(reasons) & bits)
            name, severity, hyst = THROTTLE
            yield from self._step(
                ctx, dev, ("throttle", kind), (f"{name}.{kind}", severity, hyst), holds,
                partial("{} is throttled ({})".format, label, kind),
                partial("{} is no longer throttled ({})".format, label, kind),
                {THROTTLE_KIND: kind})

    def _ecc(self, ctx: _Context, dev: _DeviceState, label: str) -> Iterator[Event]:
        values = ctx.sample.values
        key = ECC_UNCORRECTED.key if ECC_UNCORRECTED.key in values else (
            ECC_UNCORRECTED_AGGREGATE.key)
        count = values.get(key) if ctx.sample.readable else None
        holds: object = _UNKNOWN
        rise = 0.0
        if count is not None:
            previous, dev.ecc = dev.ecc, count
            if previous is not None:
                rise = max(0.0, count - previous)
                holds = rise > 0
        episode = dev.episodes.setdefault(("ecc",), _Episode())
        if episode.active and rise:
            before = episode.detail.get(ECC_ERRORS, 0)
            episode.detail = {ECC_ERRORS: (before if isinstance(before, int) else 0) + int(rise)}
        yield from self._step(
            ctx, dev, ("ecc",), ECC_RISING, holds,
            lambda: f"{label}: {int(rise)} new uncorrectable ECC error(s), {int(count or 0)} "
                    "since the driver loaded",
            lambda: f"{label}: no new uncorrectable ECC error for a while",
            {ECC_ERRORS: int(rise)})

    def _pcie(self, ctx: _Context, dev: _DeviceState, label: str) -> Iterator[Event]:
        """Width below its maximum; generation below its maximum while busy (an idle GPU
        lowers its link generation on purpose, to save power)."""
        v = ctx.sample.values
        holds: object = _UNKNOWN
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
        yield from self._step(ctx, dev, ("pcie",), PCIE_DEGRADED, holds,
                              lambda: f"{label}: PCIe link runs below its maximum ({text})",
                              lambda: f"{label}: PCIe link back at its maximum")

    def _nvlink(self, ctx: _Context, dev: _DeviceState, label: str) -> Iterator[Event]:
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
                holds = _UNKNOWN if active is None else not active >> link & 1
                yield from self._step(ctx, dev, ("nvlink", link), NVLINK_DOWN, holds,
                                      partial("{}: NVLink {} is down".format, label, link),
                                      partial("{}: NVLink {} is up again".format, label, link),
                                      {NVLINK_LINK: link})
            link += 1

    def _fabric(self, ctx: _Context, dev: _DeviceState, label: str) -> Iterator[Event]:
        """A GPU in an NVLink domain whose registration is not complete, or completed with
        an error, is out of its domain; each health condition is an episode of its own."""
        v = ctx.sample.values if ctx.sample.readable else {}
        state, failed = v.get(FABRIC_STATE.key), v.get(FABRIC_FAILED.key)
        holds: object = _UNKNOWN
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
        yield from self._step(ctx, dev, ("fabric",), FABRIC_REGISTRATION, holds,
                              lambda: f"{label} is not in its NVLink domain: {why}",
                              lambda: f"{label} joined its NVLink domain{joined}", detail)
        for condition, src in FABRIC_HEALTH_FLAGS:
            name, severity, hyst = FABRIC_HEALTH
            text = condition.replace("_", " ")
            yield from self._step(
                ctx, dev, ("fabric", condition),
                (f"{name}.{condition}", FABRIC_HEALTH_SEVERITY.get(condition, severity), hyst),
                _flag(v, src.key, ctx.sample.readable),
                partial("{}: NVLink fabric health: {}".format, label, text),
                partial("{}: NVLink fabric health: no longer {}".format, label, text),
                {FABRIC_CONDITION: condition})

    def _step(
        self, ctx: _Context, dev: _DeviceState, key: tuple,
        kind: tuple[str, str, Hysteresis], holds: object,
        start_body: Callable[[], str], end_body: Callable[[], str],
        extra: Mapping[str, object] | None = None,
    ) -> Iterator[Event]:
        """One sample of one condition: an event when its episode starts or ends."""
        if holds is _UNKNOWN:
            return
        name, severity, hyst = kind
        episode = dev.episodes.setdefault(key, _Episode())
        if bool(holds) != episode.active:
            episode.run += 1
        else:
            episode.run = 0
        needed = hyst.end if episode.active else hyst.start
        if episode.run < needed:
            return
        now = ctx.snapshot.taken_at
        episode.active, episode.run = not episode.active, 0
        attrs = ctx.attributes()
        if episode.active:
            episode.since = now
            episode.detail = dict(extra or {})
            attrs.update(episode.detail)
            attrs[EVENT_PHASE] = START
            yield Event(name, severity, start_body(), now, attrs)
        else:
            attrs.update(episode.detail)
            attrs[EVENT_PHASE] = END
            attrs[EVENT_DURATION] = round(max(0.0, now - episode.since), 3)
            yield Event(name, INFO, end_body(), now, attrs)


class EventSubscriber:
    """A publish-loop subscriber: hands the events of each new sample to ``emit`` (which
    queues them for the OTLP logs pipeline and never waits on the backend)."""

    def __init__(self, detector: EventDetector, emit: Callable[[Event], None]) -> None:
        self.detector = detector
        self._emit = emit

    def published(self, snapshot: Snapshot) -> None:
        for event in self.detector.observe(snapshot):
            self._emit(event)


def _flag(values: Mapping[str, float], key: str, readable: bool) -> object:
    if not readable or key not in values:
        return _UNKNOWN
    return values[key] > 0


class _Context:
    """One device in one snapshot: its attributes and the pods holding it."""

    def __init__(self, snapshot: Snapshot, sample: DeviceSample, limit: int) -> None:
        self.snapshot = snapshot
        self.sample = sample
        self._limit = limit

    def label(self) -> str:
        d = self.sample.device
        if d.is_mig:
            return f"GPU {d.index} MIG {d.mig_profile} ({d.uuid})"
        return f"GPU {d.index} ({d.uuid})"

    def mig_instance(self, gi: int | None, ci: int | None) -> DeviceSample | None:
        """The MIG instance of this GPU an XID names, when NVML named one that is known."""
        if gi is None:
            return None
        for s in self.snapshot.devices:
            d = s.device
            if (d.parent_uuid == self.sample.device.uuid and d.gpu_instance_id == gi
                    and (ci is None or d.compute_instance_id == ci)):
                return s
        return None

    def attributes(self, target: DeviceSample | None = None) -> dict[str, object]:
        """The device's attributes and its workload's, both the instruments' own
        (:func:`device_attributes`, :meth:`~otel_gpu.snapshot.Snapshot.workload_attributes`),
        so that the OTLP exporter puts a record under the Resource of its device's metrics;
        without a pod holding the device whole, every holder's name in one attribute."""
        device = (target or self.sample).device
        attrs: dict[str, object] = dict(device_attributes(
            device, self.snapshot.driver_version, kubelet_numa_node(self.snapshot, device)))
        attrs.update(self.snapshot.workload_attributes(device.uuid))
        if self.snapshot.series_pods(device.uuid):
            return attrs
        holders = self._holders(device.uuid)
        if holders:
            attrs[HOLDERS] = holders
        return attrs

    def _holders(self, uuid: str) -> tuple[str, ...]:
        """``namespace/pod/container`` of each container holding the device or, for a GPU
        in MIG mode, one of its instances; sorted, at most the limit."""
        pods = self.snapshot.pods
        if pods is None:
            return ()
        uuids = [uuid] + [s.device.uuid for s in self.snapshot.devices
                          if s.device.parent_uuid == uuid]
        names = sorted({f"{h.namespace}/{h.pod}/{h.container}"
                        for u in uuids for h in pods.attribution.holders(u)})
        return tuple(names[:self._limit])
