"""Episodes: a condition worth a page, started and ended through hysteresis.

A condition must hold for some consecutive samples to start an episode and be
gone for some to end it (:class:`Hysteresis`), so a flapping value is one
episode, not one record per sample. :func:`step` takes one sample of one
condition and yields the record of a start or an end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from otel_gpu.export.events.context import DeviceContext
from otel_gpu.export.events.records import (
    END,
    ERROR,
    EVENT_DURATION,
    EVENT_PHASE,
    INFO,
    START,
    WARN,
    Event,
)
from otel_gpu.sample.sources import THROTTLE_REASONS


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

_BITS = dict(THROTTLE_REASONS)
THROTTLE_KINDS: tuple[tuple[str, int], ...] = (
    ("thermal", _BITS["sw_thermal_slowdown"] | _BITS["hw_thermal_slowdown"]),
    ("power", _BITS["sw_power_cap"] | _BITS["hw_power_brake_slowdown"] | _BITS["hw_slowdown"]),
)
"""Throttling kind -> the clock event reason bits that make it."""

UNKNOWN = object()
"""A condition that cannot be judged this sample (values missing): counts neither way."""


@dataclass
class Episode:
    """One condition on one device: its phase, and how long it has run against it."""

    active: bool = False
    run: int = 0
    """Consecutive samples against the current phase."""
    since: float = 0.0
    detail: Mapping[str, object] = field(default_factory=dict)


def flag(values: Mapping[str, float], key: str, readable: bool) -> object:
    """A condition that is one value above 0; :data:`UNKNOWN` where it was not read."""
    if not readable or key not in values:
        return UNKNOWN
    return values[key] > 0


def step(
    ctx: DeviceContext, episodes: dict[tuple, Episode], key: tuple,
    kind: tuple[str, str, Hysteresis], holds: object,
    start_body: Callable[[], str], end_body: Callable[[], str],
    extra: Mapping[str, object] | None = None,
) -> Iterator[Event]:
    """One sample of one condition: an event when its episode starts or ends."""
    if holds is UNKNOWN:
        return
    name, severity, hyst = kind
    episode = episodes.setdefault(key, Episode())
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
