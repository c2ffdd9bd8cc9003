"""Energy per container: each GPU's energy counter split among the containers using it.

NVML's energy counter (``TOTAL_ENERGY_CONSUMPTION``, mJ) exists per physical
GPU. Each new sample, :class:`EnergyLedger` takes the counter's increase since
the previous reading and splits it, in whole millijoules, by the first rule
that applies to the device:

``exclusive``
    One container holds the device whole: it gets the whole increase.
``sm_share``
    Shared (time-slicing, MPS) with per-process utilization read (process
    usage on): each container gets the increase times its processes' share of
    the device's SM time in the interval (scaled down when the shares add up to
    more than 1); the rest (idle time, processes of no pod) is unattributed.
``unattributed``
    Neither: all of it is unattributed.

A GPU in MIG mode first splits its increase across its instances, by their
SM activity (GPM ``SM_UTIL`` of each instance times its compute slices:
``mig_activity``) when every instance has it and one was busy, else by their
compute slices alone (``mig_slices``, from the profile: ``3g.20gb`` is 3,
``1c.3g.20gb`` 1); then each instance splits its part by the rules above.

A GPU whose counter has not been read (NVML does not give it) has no rows.
Each device has one unattributed row besides its containers'. The rows of
one GPU (its instances' included) add up exactly to its counter: the energy
from before the collector started, or while nothing could be attributed, is
in the GPU's own unattributed row. Rows only grow:

* A reading missing from one sample leaves the increase to the next one
  (split by that sample's rule).
* A counter lower than the previous reading (a driver reload) counts as
  restarted from 0, as Prometheus reads a counter reset: the new reading is
  the interval's increase. From then on the rows add up to the counter plus
  what it had reached before the reload.
* A container that stops holding and using a device keeps its row, at its
  final total, for :data:`RETAIN_S` seconds (or until more than
  :data:`MAX_GONE` rows are waiting, oldest first), and continues from that
  total if it comes back meanwhile. Then the row is released and its total
  moves into the GPU's unattributed row, so the sum still holds; a device no
  longer in the snapshot (a MIG instance destroyed) is released the same way.

The attribution stage calls :meth:`EnergyLedger.update` for every new sample
and again when only the pods changed. An increase is taken against the
previous reading, so it cannot be counted twice; and a sample
(:attr:`~otel_gpu.snapshot.Snapshot.seq`) is accounted on its first call only,
so its re-publication gets the same rows. Calls come one at a time (under the
pipeline's lock), so the ledger keeps no lock.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from otel_gpu._log import LogLimiter
from otel_gpu.sample.sources import ENERGY, GPM_SM_ACTIVE
from otel_gpu.snapshot import Attribution, DeviceSample, PodEnergy, PodUsage, Snapshot
from otel_gpu.workload import Owner

log = logging.getLogger(__name__)

EXCLUSIVE = "exclusive"
SM_SHARE = "sm_share"
UNATTRIBUTED = "unattributed"
MIG_ACTIVITY = "mig_activity"
MIG_SLICES = "mig_slices"
RULES = (EXCLUSIVE, SM_SHARE, UNATTRIBUTED, MIG_ACTIVITY, MIG_SLICES)

RETAIN_S = 900.0
"""Seconds a finished container's row is kept at its final total: scrapes and
OTLP exports in that time see the final value before the series goes."""
MAX_GONE = 128
"""Finished rows kept at most; the oldest are released first. Together with the
live ones this stays within the room the SDK keeps for finished pods
(:func:`otel_gpu.instrument.cardinality.room_for`)."""

_SCALE = 1_000_000
"""Weights are turned into integers of this resolution, so each split is exact."""
_SLICES = re.compile(r"^(?:(\d+)c\.)?(\d+)g\b")

Key = tuple[str, Owner | None]
K = TypeVar("K")


def compute_slices(profile: str | None) -> int:
    """Compute slices of a MIG profile: ``3g.20gb`` -> 3, ``1c.3g.20gb`` -> 1; else 1."""
    match = _SLICES.match(profile or "")
    if match is None:
        return 1
    return max(1, int(match.group(1) or match.group(2)))


def apportion(total: int, weights: Mapping[K, float], rest: K) -> dict[K, int]:
    """``total`` split by ``weights`` in whole units that add up to it exactly.

    Largest remainders get the units left after rounding down; with no
    positive weight everything goes to ``rest``.
    """
    ints = {k: max(0, round(w * _SCALE)) for k, w in weights.items()}
    whole = sum(ints.values())
    if total <= 0 or whole == 0:
        return {rest: max(total, 0)}
    parts = {k: total * w // whole for k, w in ints.items()}
    left = total - sum(parts.values())
    by_remainder = sorted(ints, key=lambda k: (total * ints[k] % whole), reverse=True)
    for k in by_remainder[:left]:
        parts[k] += 1
    return parts


@dataclass
class _Row:
    millijoules: int
    root: str
    """The GPU whose counter the row is a part of."""
    gone_since: float | None = None


class EnergyLedger:
    """Cumulative energy per (device, container); see the module docstring."""

    def __init__(self, *, retain: float = RETAIN_S, max_gone: int = MAX_GONE) -> None:
        self.retain = retain
        self.max_gone = max_gone
        self._rows: dict[Key, _Row] = {}
        self._last: dict[str, int] = {}
        """GPU uuid -> its latest counter reading (mJ)."""
        self._rules: dict[str, str] = {}
        self._seq: int | None = None
        self._attribution: Attribution | None = None
        self._usage: Sequence[PodUsage] = ()
        self._result: tuple[PodEnergy, ...] = ()
        self._limited = LogLimiter(log, 3600.0)

    def update(
        self, snapshot: Snapshot, attribution: Attribution, usage: Sequence[PodUsage] = ()
    ) -> tuple[PodEnergy, ...]:
        """The rows after ``snapshot``; its increase is counted on its first call only.

        Called again for the same sample with new pods (the kubelet answered between two
        samples), it counts nothing but gives the new holders their rows at 0 at once, so
        a pod's counter exists from the moment its pod is seen, as its other series do.
        """
        if snapshot.seq == self._seq:
            if attribution is self._attribution and usage is self._usage:
                return self._result
            self._attribution, self._usage = attribution, usage
            held = {key for key, row in self._rows.items() if row.gone_since is None}
            self._hold(snapshot, attribution, usage, held)
            shares = _sm_shares(usage)
            for uuid, rule in list(self._rules.items()):
                if rule not in (MIG_ACTIVITY, MIG_SLICES):  # the rule now in force
                    self._rules[uuid] = _rule(uuid, attribution, shares)
            self._result = self._publish()
            return self._result
        self._seq = snapshot.seq
        self._attribution, self._usage = attribution, usage
        shares = _sm_shares(usage)
        instances: dict[str, list[DeviceSample]] = {}
        for s in snapshot.devices:
            if s.device.parent_uuid is not None:
                instances.setdefault(s.device.parent_uuid, []).append(s)
        live: set[Key] = set()
        for s in snapshot.devices:
            if s.device.is_mig:
                continue
            root = s.device.uuid
            delta = self._increase(root, s.values.get(ENERGY.key))
            if root not in self._last:
                continue  # no energy counter read yet: no rows, rather than rows of 0
            live.add((root, None))
            parts = instances.get(root)
            if not parts:
                self._split(root, root, delta, attribution, shares, live)
                continue
            rule, weights = _instance_weights(parts)
            self._rules[root] = rule
            split = apportion(delta, weights, root)
            self._add((root, None), root, split.pop(root, 0))
            for part in parts:
                uuid = part.device.uuid
                live.add((uuid, None))
                self._add((uuid, None), root, 0)  # each instance's idle row, at 0 from the start
                self._split(uuid, root, split.get(uuid, 0), attribution, shares, live)
        self._hold(snapshot, attribution, usage, live)
        self._release(live, snapshot.taken_monotonic)
        self._result = self._publish()
        return self._result

    def _publish(self) -> tuple[PodEnergy, ...]:
        return tuple(
            PodEnergy(uuid, pod, row.millijoules, self._rules.get(uuid, UNATTRIBUTED))
            for (uuid, pod), row in sorted(self._rows.items(), key=_order)
        )

    # --- one sample ---------------------------------------------------------------------

    def _increase(self, root: str, reading: float | None) -> int:
        """The counter's increase since its previous reading (0 when there is none)."""
        if reading is None or not math.isfinite(reading):
            return 0  # carried: the next reading's increase covers this interval too
        value = max(0, int(reading))
        last = self._last.get(root)
        self._last[root] = value
        if last is None:  # first reading: what came before is nobody's we know
            self._add((root, None), root, value)
            return 0
        if value < last:
            self._limited.log(("reset", root), logging.INFO,
                              "energy counter of %s went back from %d to %d mJ (driver "
                              "reload?): counted as restarted from 0", root, last, value)
            return value
        return value - last

    def _split(self, uuid: str, root: str, delta: int, attribution: Attribution,
               shares: Mapping[str, Mapping[Owner | None, float]], live: set[Key]) -> None:
        owner = attribution.exclusive_owner(uuid)
        device_shares = shares.get(uuid)
        self._rules[uuid] = _rule(uuid, attribution, shares)
        if owner is not None:
            live.add((uuid, owner.ref))
            self._add((uuid, owner.ref), root, delta)
            return
        if device_shares is None:
            self._add((uuid, None), root, delta)
            return
        pods: dict[Owner | None, float] = {
            ref: sm for ref, sm in device_shares.items() if ref is not None}
        busy = max(1.0, sum(device_shares.values()))
        weights = {**pods, None: busy - sum(pods.values())}
        for ref, part in apportion(delta, weights, None).items():
            self._add((uuid, ref), root, part)

    def _add(self, key: Key, root: str, millijoules: int) -> None:
        row = self._rows.get(key)
        if row is None:
            self._rows[key] = _Row(millijoules, root)
        else:
            row.millijoules += millijoules
            row.root = root

    def _hold(self, snapshot: Snapshot, attribution: Attribution,
              usage: Iterable[PodUsage], live: set[Key]) -> None:
        """A row for every container holding or using a device, at 0 until it uses some."""
        roots = {s.device.uuid: s.device.parent_uuid or s.device.uuid for s in snapshot.devices
                 if (s.device.parent_uuid or s.device.uuid) in self._last}
        found: list[Key] = [(uuid, h.ref) for uuid in roots for h in attribution.holders(uuid)]
        found += [(u.uuid, u.pod) for u in usage if u.pod is not None and u.uuid in roots]
        for key in found:
            live.add(key)
            self._add(key, roots[key[0]], 0)

    # --- bounds -------------------------------------------------------------------------

    def _release(self, live: set[Key], now: float) -> None:
        """Mark rows no longer live; release those gone too long, or too many."""
        roots = {key[0] for key in live if key[1] is None}
        gone: list[tuple[float, Key]] = []
        for key, row in self._rows.items():
            if key in live:
                row.gone_since = None
                continue
            if row.gone_since is None:
                row.gone_since = now
            gone.append((row.gone_since, key))
        gone.sort(key=lambda g: g[0])
        extra = len(gone) - self.max_gone
        for i, (since, key) in enumerate(gone):
            if i >= extra and now - since < self.retain:
                continue
            row = self._rows.pop(key)
            if row.root in roots and key != (row.root, None):
                self._add((row.root, None), row.root, row.millijoules)
        kept = {key[0] for key in self._rows}
        self._last = {r: v for r, v in self._last.items() if (r, None) in self._rows}
        self._rules = {u: rule for u, rule in self._rules.items() if u in kept}

def _rule(uuid: str, attribution: Attribution,
          shares: Mapping[str, Mapping[Owner | None, float]]) -> str:
    """How a device's (or MIG instance's) energy is split between its users."""
    if attribution.exclusive_owner(uuid) is not None:
        return EXCLUSIVE
    return SM_SHARE if uuid in shares else UNATTRIBUTED


def _sm_shares(usage: Iterable[PodUsage]) -> dict[str, dict[Owner | None, float]]:
    """Device uuid -> container (``None``: no pod) -> SM share, where NVML gave shares."""
    out: dict[str, dict[Owner | None, float]] = {}
    for row in usage:
        if row.sm is not None:
            device = out.setdefault(row.uuid, {})
            device[row.pod] = device.get(row.pod, 0.0) + max(0.0, row.sm)
    return out


def _instance_weights(parts: Sequence[DeviceSample]) -> tuple[str, dict[str, float]]:
    """How a MIG GPU's increase is split among its instances, and the rule's name."""
    slices = {p.device.uuid: compute_slices(p.device.mig_profile) for p in parts}
    active = {p.device.uuid: p.values.get(GPM_SM_ACTIVE.key) for p in parts}
    if all(a is not None for a in active.values()):
        weights: dict[str, float] = {
            uuid: max(0.0, float(a or 0.0)) / 100.0 * slices[uuid] for uuid, a in active.items()}
        if sum(weights.values()) > 0:
            return MIG_ACTIVITY, weights
    return MIG_SLICES, dict(slices)

def _order(item: tuple[Key, _Row]) -> tuple[str, bool, tuple[str, ...]]:
    (uuid, pod), _ = item
    return (uuid, pod is None, pod.sort_key if pod is not None else ())
