"""The instruments: one observable instrument per catalog row, reading the store.

Every instrument is an observable one whose callback reads the latest
snapshot. A callback never calls NVML or the kubelet: each reader collection
(a Prometheus scrape, an OTLP export) runs every callback again, so anything
slow here would be paid once per reader per collection. A device's attribute
sets are made once per snapshot and reused while its pods do not change, and a
row of points is planned once per device layout (which device, which point,
which attributes): a collection then reads values alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import is_
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gpu.instrument.attributes import (
    ALL,
    IDENTITY,
    DeviceAttributes,
    device_attributes,
    identity_attributes,
    kubelet_numa_node,
)
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.schema import Kind, Metric, device_observations
from otel_gpu.snapshot import FAILED, Device, Snapshot

_Planned = tuple[int, Callable[[str, Mapping[str, Any]], Mapping[str, Any]],
                 "list[Mapping[str, Any] | None]"]
"""A device of a row's plan: its place in the snapshot, how a point's attributes are merged
into its own, and each point's merged attributes once it has had a value."""

MAX_PLANS = 4096
"""Rows planned at most (one per catalog row: this bounds a catalog that grows)."""


class Instruments:
    """Registers one observable instrument per catalog row on ``meter``.

    ``latest`` returns the newest snapshot (or None before the first).
    ``device_attributes``: :data:`IDENTITY` or :data:`ALL` (see those).
    """

    def __init__(
        self,
        meter: Meter,
        latest: Callable[[], Snapshot | None],
        *,
        catalog: Sequence[Metric] = CATALOG,
        clock: Callable[[], float] = time.monotonic,
        device_attributes: DeviceAttributes = ALL,
    ) -> None:
        if device_attributes not in (IDENTITY, ALL):
            raise ValueError(f"device_attributes: expected identity or all, "
                             f"got {device_attributes!r}")
        self._all = device_attributes == ALL
        self._latest = latest
        self._clock = clock
        self._attr_cache: dict[tuple[Device, str | None, int | None],
                               dict[str, str | int]] = {}
        self._sets: dict[tuple, _AttributeSets] = {}
        self._node_last: dict[str, list[Mapping[str, Any]]] = {}
        """A node-level row's sets of the last collection, in order (see
        :meth:`_node_points`)."""
        self._per_snapshot: tuple[Snapshot | None, dict[str, _AttributeSets]] = (None, {})
        self._last_layout: _Layout | None = None
        self._snapshot_layout: tuple[Snapshot | None, _Layout] = (None, _Layout([], []))
        self._plans: dict[str, tuple[_Layout, list[_Planned]]] = {}
        """Per row of points, where its points come from in a layout (see :meth:`_planned`)."""
        self.registered: list[tuple[Any, Kind,
                                    Callable[[], list[tuple[float, Mapping[str, Any]]]]]] = []
        """Each instrument as the meter made it, its kind and its callback, in the order
        registered (for :class:`otel_gpu.instrument.direct.DirectCollection`)."""
        for metric in catalog:
            self._register(meter, metric)

    def _register(self, meter: Meter, metric: Metric) -> None:
        create = {
            Kind.GAUGE: meter.create_observable_gauge,
            Kind.COUNTER: meter.create_observable_counter,
            Kind.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
        }[metric.kind]
        instrument = create(
            metric.name,
            callbacks=[partial(self.observe, metric)],
            unit=metric.unit,
            description=metric.description,
        )
        self.registered.append((instrument, metric.kind, partial(self.pairs, metric)))

    def _base_attributes(
        self, device: Device, driver: str | None, numa: int | None
    ) -> dict[str, str | int]:
        key = (device, driver, numa)
        attrs = self._attr_cache.get(key)
        if attrs is None:
            if len(self._attr_cache) > 4096:  # devices come and go only on hot-plug
                self._attr_cache.clear()
            attrs = self._attr_cache[key] = device_attributes(device, driver, numa)
        return attrs

    def observe(
        self, metric: Metric, options: CallbackOptions | None = None
    ) -> Iterable[Observation]:
        """The SDK's callback: :meth:`pairs` as Observations."""
        return [Observation(value, attrs) for value, attrs in self.pairs(metric)]

    def pairs(self, metric: Metric) -> list[tuple[float, Mapping[str, Any]]]:
        """The metric's points now, (value, attributes), each attributes object the same one
        every collection while devices and pods stay (the direct collection's callback)."""
        snapshot = self._latest()
        if snapshot is None:
            return []
        if metric.per_node is not None:
            return self._node_points(metric, snapshot)
        layout = self._layout(snapshot)
        if metric.per_device is None:
            return self._planned(metric, layout)
        out: list[tuple[float, Mapping[str, Any]]] = []
        name = metric.name
        for sample, sets in zip(snapshot.devices, layout.sets, strict=True):
            points = device_observations(metric, sample)
            if not points:
                continue
            merge = sets.with_info if metric.describes_device else sets.with_point
            # attributes made afresh: the merged set is one object per content
            out.extend([(value, merge(name, attrs)) for value, attrs in points])
        return out

    def _planned(self, metric: Metric, layout: _Layout) -> list[tuple[float, Mapping[str, Any]]]:
        """A row of points, device by device as :func:`~otel_gpu.instrument.schema.
        device_observations` reads it, with each point's attributes worked out once per
        layout, when the point first has a value (most of a MIG instance's never do)."""
        plan = self._plans.get(metric.name)
        if plan is None or plan[0] is not layout.base:
            if len(self._plans) > MAX_PLANS:
                self._plans.clear()
            unmerged: list[Mapping[str, Any] | None] = [None] * len(metric.points)
            devices: list[_Planned] = [
                (index, sets.with_info if metric.describes_device else sets.with_point,
                 unmerged.copy())
                for index, (sets, failed) in enumerate(zip(layout.sets, layout.failed,
                                                           strict=True))
                if not failed or metric.reported_when_failed]  # a failed device: its status
            plan = self._plans[metric.name] = (layout.base, devices)
        out: list[tuple[float, Mapping[str, Any]]] = []
        name, points, values = metric.name, metric.points, layout.values
        for index, merge, merged in plan[1]:
            readings = values[index]
            for place, point in enumerate(points):
                value = point.value(readings)
                if value is not None:
                    attrs = merged[place]
                    if attrs is None:
                        attrs = merged[place] = merge(name, point.attributes)
                    out.append((value, attrs))
        return out

    def _layout(self, snapshot: Snapshot) -> _Layout:
        """The devices of ``snapshot`` with their attribute sets: the last layout itself
        while every device keeps its sets and its failed state, so that what was worked
        out for it holds."""
        owner, layout = self._snapshot_layout
        if owner is snapshot:
            return layout
        sets = [self._device_sets(snapshot, sample.device) for sample in snapshot.devices]
        failed = [sample.state == FAILED for sample in snapshot.devices]
        last = self._last_layout
        if last is None or failed != last.failed or len(sets) != len(last.sets) \
                or not all(map(is_, sets, last.sets)):
            last = self._last_layout = _Layout(sets, failed)
        layout = _Layout.of(last, [sample.values for sample in snapshot.devices])
        self._snapshot_layout = (snapshot, layout)
        return layout

    def _node_points(self, metric: Metric, snapshot: Snapshot,
                     ) -> list[tuple[float, Mapping[str, Any]]]:
        """A node-level row's points, each set the last collection's at its place while
        equal to it: the same object every collection while the rows stay, as a device's
        sets are. A producer handing the same objects again (the GPU time rows, the
        allocations while the kubelet's answer stays) has them taken as they are; one
        making them afresh (the energy rows) has each compared with the one before it.
        Nothing is kept per set beyond the set (a key of its pairs, kept once, cost
        more than the set itself)."""
        assert metric.per_node is not None
        last = self._node_last.get(metric.name, ())
        count = len(last)
        out: list[tuple[float, Mapping[str, Any]]] = []
        for place, (value, attrs) in enumerate(metric.per_node(snapshot, self._clock())):
            if place < count:
                kept = last[place]
                if kept is attrs or kept == attrs:
                    out.append((value, kept))
                    continue
            # a producer never changes a set it handed out: the set itself is kept
            out.append((value, attrs if isinstance(attrs, dict) else dict(attrs)))
        self._node_last[metric.name] = [attrs for _, attrs in out]
        return out

    def _device_sets(self, snapshot: Snapshot, device: Device) -> _AttributeSets:
        """The device's attribute sets in ``snapshot``: made once per snapshot, and the same
        objects again while the device's pods (and its NUMA node) do not change."""
        owner, by_uuid = self._per_snapshot
        if owner is not snapshot:  # a local pair: another thread may be on another snapshot
            owner, by_uuid = self._per_snapshot = (snapshot, {})
        sets = by_uuid.get(device.uuid)
        if sets is None:
            pods = snapshot.workload_attributes(device.uuid)
            numa = kubelet_numa_node(snapshot, device)
            key = (device, snapshot.driver_version, numa, tuple(pods.items()))
            sets = self._sets.get(key)
            if sets is None:
                if len(self._sets) > 4096:  # devices and their pods seen since the last rebuild
                    self._sets.clear()
                info = self._base_attributes(device, snapshot.driver_version, numa)
                base = dict(info) if self._all else identity_attributes(info)
                base.update(pods)
                sets = self._sets[key] = _AttributeSets(base, info)
            by_uuid[device.uuid] = sets
        return sets


class _Layout:
    """The devices of a snapshot as the rows' plans see them: each device's attribute
    sets and whether it failed (shared by every snapshot in which they stay the same),
    and this snapshot's values, device by device."""

    __slots__ = ("failed", "sets", "values", "base")

    def __init__(self, sets: list[_AttributeSets], failed: list[bool]) -> None:
        self.sets = sets
        self.failed = failed
        self.values: list[Mapping[str, float]] = []
        self.base = self
        """The layout the plans are kept for (itself, or the one this snapshot shares)."""

    @classmethod
    def of(cls, base: _Layout, values: list[Mapping[str, float]]) -> _Layout:
        """``base``'s devices with this snapshot's values."""
        layout = cls.__new__(cls)
        layout.sets, layout.failed, layout.values, layout.base = (base.sets, base.failed,
                                                                  values, base)
        return layout


class _AttributeSets:
    """One device's attributes in one snapshot, made once for every metric; the same
    objects again while its pods do not change. Never changed after they are made: the
    SDK copies what it is given.

    ``base``: what each of its series carries (its identity, or every attribute, and its
    pods and jobs); ``info``: every attribute of the device, for ``nvidia.gpu.info``.
    A point's own attributes (a catalog row's fixed ``hw.gpu.task``, say) are merged
    into either once per metric and content, and the merged object is handed out again:
    the series table (:mod:`otel_gpu.instrument.series`) recognises a series by that
    identity, so a series whose attributes did not change costs one comparison.
    """

    __slots__ = ("base", "info", "_merged")

    MAX_MERGED = 512
    """Merged sets remembered per device (a catalog holds a few dozen point attribute
    sets; a reader making new ones each sample only refills this)."""

    def __init__(self, base: dict[str, str | int], info: dict[str, str | int]) -> None:
        self.base = base
        self.info = info
        self._merged: dict[tuple[bool, str, tuple], dict[str, str | int]] = {}

    def with_point(self, name: str, attrs: Mapping[str, Any]) -> dict[str, str | int]:
        return self._merge(False, name, attrs) if attrs else self.base

    def with_info(self, name: str, attrs: Mapping[str, Any]) -> dict[str, str | int]:
        return self._merge(True, name, attrs) if attrs else self.info

    def _merge(self, info: bool, name: str, attrs: Mapping[str, Any]) -> dict[str, str | int]:
        """The set with ``attrs`` merged in, one object per metric and content (within a
        metric, as the SDK keeps a series' first attributes, equal content is one set)."""
        try:
            key = (info, name, tuple(attrs.items()))
            found = self._merged.get(key)
        except TypeError:  # a value that cannot be hashed: a set of its own
            return {**(self.info if info else self.base), **attrs}
        if found is None:
            if len(self._merged) >= self.MAX_MERGED:
                self._merged.clear()
            found = self._merged[key] = {**(self.info if info else self.base), **attrs}
        return found
