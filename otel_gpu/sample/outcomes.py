"""What a failed read means for its device, and the node's one line of missing values.

Every reader (batched fields, plain calls, process reads) hands a failed
:class:`~otel_gpu.sample.library.Result` to :meth:`Outcomes.act`: a lost
device is failed, a destroyed MIG instance asks for rediscovery, a value the
device cannot give is omitted from then on, a call that raised what no return
code explains is counted as its reader's failure, anything else is retried
(and logged at most every five minutes).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType

from otel_gpu._clock import SYSTEM, Clock
from otel_gpu._log import LogLimiter
from otel_gpu.sample.containment import ReaderFailures
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Outcome, Result, error_name
from otel_gpu.sample.sources import Source

log = logging.getLogger(__name__)

_NAMED = 8
"""Devices named in one "not available" line; the rest are counted (a node may have 512)."""


class Outcomes:
    """Acts on failed reads; ``topology_changed`` is raised from a worker thread and read
    (and lowered) by the sampler thread at its next discovery. ``failures`` counts the
    readers' unexpected failures (any thread)."""

    def __init__(self, module: ModuleType, *, clock: Clock = SYSTEM,
                 failures: ReaderFailures | None = None) -> None:
        self._m = module
        self.failures = ReaderFailures(clock) if failures is None else failures
        self._gone_codes = frozenset(
            getattr(module, name) for name in ("NVML_ERROR_INVALID_ARGUMENT",
                                               "NVML_ERROR_NOT_FOUND") if hasattr(module, name)
        )
        self._limited = LogLimiter(log, 300.0, clock=clock)
        self.topology_changed = False
        self._lock = threading.Lock()
        self._missing: dict[str, str] = {}
        """Reads the installed binding cannot make: what -> why (any thread)."""
        self._said: set[str] = set()

    def act(self, t: Tracked, what: str, res: Result, unsupported: list[str]) -> str | None:
        """Act on a failed read; returns the failure text when the device failed."""
        if res.outcome is Outcome.DEVICE_FAILED:
            return f"{res.message} ({error_name(res.code, self._m)}) in {what}"
        if res.outcome is Outcome.BROKEN:
            self.failures.record(t.label(), what, res.message, res.error)
            return None
        if res.outcome is Outcome.MISSING:
            t.reads.unsupported.add(what)  # on no device can this binding make it
            self.missing(what, res.message)
            return None
        if t.device.is_mig and res.code in self._gone_codes:
            # The instance was destroyed (a MIG re-layout): rediscover on the next sample.
            if not self.topology_changed:
                log.warning("%s is gone (%s): rediscovering", t.label(),
                            error_name(res.code, self._m))
            self.topology_changed = True
            return None
        if res.outcome is Outcome.UNSUPPORTED:
            t.reads.unsupported.add(what)
            unsupported.append(f"{what} ({error_name(res.code, self._m)})")
        else:
            self._limited.log((t.device.uuid, what), logging.WARNING,
                              "%s: reading %s failed (%s); retrying next sample",
                              t.label(), what, res.message)
        return None


    def missing(self, what: str, why: str) -> None:
        """``what`` is not available with the installed nvidia-ml-py (``why`` says so)."""
        with self._lock:
            self._missing.setdefault(what, why)

    def binding_notes(self) -> list[str]:
        """One note per read the binding cannot make, for every sample (``check`` shows
        them); the ones not said before are logged in one line."""
        with self._lock:
            notes = {what: why for what, why in sorted(self._missing.items())}
            new = [what for what in notes if what not in self._said]
            self._said.update(new)
        if new:
            log.warning("%s; their values are omitted, the other reads go on (a newer "
                        "nvidia-ml-py gives them)",
                        "; ".join(f"{what}: {notes[what]}" for what in new))
        return [f"{what}: {why}" for what, why in notes.items()]


class Bounds:
    """Drops the values that cannot be readings (:meth:`Source.accepts`): NVML's "not
    available" answers and values outside physics. Each is noted once per device."""

    def __init__(self, sources: Iterable[Source]) -> None:
        self._by_key = {s.key: s for s in sources}

    def drop(self, t: Tracked, values: dict[str, float]) -> int:
        """On the device's worker thread, before the values are used; returns how many
        values were dropped."""
        dropped = 0
        for key, value in list(values.items()):
            src = self._by_key.get(key)
            number = isinstance(value, (int, float))
            if number and (src is None or src.accepts(value)):
                continue
            del values[key]  # a value no source vouches for is absent, never a reading
            dropped += 1
            if key not in t.reads.not_available:
                t.reads.not_available.add(key)
                if not number:
                    shown = f"not a number: {type(value).__name__}"
                else:
                    shown = "not available" if math.isnan(value) else f"{value:g}"
                t.reads.newly_impossible.append(f"{key} ({shown})")
        return dropped


def log_unsupported(devices: Iterable[Tracked]) -> None:
    """One line for the node per kind: each value newly found missing, or answered with
    what cannot be a reading, and on which devices.

    Each (device, value) pair is reported once; values missing on the same
    devices share a clause. Runs on the sampler thread, for devices whose
    worker is idle.
    """
    _log_missing(devices, "newly_unsupported", "not available, omitted from now on")
    _log_missing(devices, "newly_impossible",
                 "NVML answered values that cannot be readings (its \"not available\" "
                 "value, or out of range), omitted while they last")


def _log_missing(devices: Iterable[Tracked], attribute: str, what_happened: str) -> None:
    """What only MIG instances lack (dozens of values, by design: NVML answers most of them
    per GPU) is one clause, a count and the commonest few, with the full list at debug."""
    missing: dict[str, list[str]] = {}
    instances: set[str] = set()
    for t in devices:
        if t.device.is_mig:
            instances.add(t.short_label())
        noted: list[str] = getattr(t.reads, attribute)
        for what in noted:
            missing.setdefault(what, []).append(t.short_label())
        noted.clear()
    if not missing:
        return
    on_gpus = {w: labels for w, labels in missing.items() if not instances.issuperset(labels)}
    on_instances = {w: labels for w, labels in missing.items() if w not in on_gpus}
    clauses = _clauses(on_gpus, brief=True)
    if on_instances:
        clauses.append(_instances_clause(on_instances))
        log.debug("%s (each device): %s", what_happened, "; ".join(_clauses(missing)))
    log.info("%s: %s", what_happened, "; ".join(clauses))


_SHOWN = 3
"""Values named in the MIG instances' clause of the "not available" line."""


def _clauses(missing: Mapping[str, list[str]], *, brief: bool = False) -> list[str]:
    """``values on devices`` clauses, one per set of devices missing the same values;
    ``brief``: a GPU's MIG instances counted (``GPU 0's 4 MIG instances``), not named."""
    by_devices: dict[tuple[str, ...], list[str]] = {}
    for what, labels in missing.items():
        by_devices.setdefault(tuple(labels), []).append(what)
    clauses = []
    for group, whats in by_devices.items():
        names = _brief(group) if brief else list(group)
        shown = ", ".join(names[:_NAMED]) + (
            f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")
        where = group[0] if len(group) == 1 else f"{len(group)} devices ({shown})"
        clauses.append(f"{_by_reason(whats)} on {where}")
    return clauses


def _by_reason(whats: list[str]) -> str:
    """``a, b (NOT_SUPPORTED), c (NO_PERMISSION)`` for ``a (NOT_SUPPORTED)``, ``b
    (NOT_SUPPORTED)``, ``c (NO_PERMISSION)``: each reason said once, after its values."""
    groups: dict[str, list[str]] = {}
    for what in whats:
        name, _, reason = what.rpartition(" (")
        if not (name and reason[:-1].isupper() and reason.endswith(")")):
            name, reason = what, what  # a value shown, not an NVML reason: said alone
        groups.setdefault(reason, []).append(name)
    return ", ".join(", ".join(names) + ("" if names == [reason] else f" ({reason}")
                     for reason, names in groups.items())


def _brief(labels: tuple[str, ...]) -> list[str]:
    """Labels with each GPU's MIG instances folded into one count, in first-seen order."""
    counts: dict[str, int] = {}  # a label, or "GPU n MIG" for GPU n's instances
    for label in labels:
        gpu, mig, _ = label.partition(" MIG ")
        key = f"{gpu} MIG" if mig else label
        counts[key] = counts.get(key, 0) + 1
    return [f"{key.removesuffix(' MIG')}'s {n} MIG instance{'s' if n > 1 else ''}"
            if key.endswith(" MIG") else key for key, n in counts.items()]


def _instances_clause(missing: Mapping[str, list[str]]) -> str:
    """The MIG instances' part of the line: how many values on how many, the commonest few."""
    count = len({label for labels in missing.values() for label in labels})
    common = sorted(missing, key=lambda what: -len(missing[what]))
    shown = _by_reason(common[:_SHOWN])
    rest = len(common) - _SHOWN
    more = f" and {rest} more (the list at debug level)" if rest > 0 else ""
    noun = "instance" if count == 1 else "instances"
    return (f"{len(common)} value(s) on {count} MIG {noun}, most of them answered per GPU "
            f"only: {shown}{more}")
