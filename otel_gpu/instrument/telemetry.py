"""The instrument stage: the Resource, the MeterProvider, one instrument per catalog row.

Every instrument is an observable one whose callback reads the latest
snapshot from the store. A callback never calls NVML or the kubelet: each
reader collection (a Prometheus scrape, an OTLP export) runs every callback
again, so anything slow here would be paid once per reader per collection.

The SDK folds a metric's attribute sets past its cardinality limit (2000 per
metric and reader by default) into one ``otel.metric.overflow`` series. A
node with 2,500 time-sliced pods has 2,500 allocation series, so the limit
is sized from the latest snapshot each time the MeterProvider is built
(:func:`otel_gpu.instrument.cardinality.cardinality`), through a view that applies to
every reader, and :class:`otel_gpu.instrument.cardinality.CardinalityGuard` has it
rebuilt when pods outgrow it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, MetricsData
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from otel_gpu import __version__
from otel_gpu.instrument.cardinality import cardinality
from otel_gpu.instrument.catalog import (
    CATALOG,
    GPU_INDEX,
    HPC_JOB,
    HW_DRIVER_VERSION,
    HW_ID,
    HW_MODEL,
    HW_NAME,
    HW_PARENT,
    HW_SERIAL,
    HW_TYPE,
    HW_VENDOR,
    IDENTITY_ATTRIBUTES,
    MIG_CI,
    MIG_GI,
    MIG_PROFILE,
    NUMA_NODE,
    PCI_BUS_ID,
    Kind,
    Metric,
    device_observations,
    pod_labels,
)
from otel_gpu.snapshot import Device, Snapshot

log = logging.getLogger(__name__)

SCOPE = "otel_gpu"

DeviceAttributes = Literal["identity", "all"]
"""The ``device_attributes`` setting: which device attributes every series carries."""
IDENTITY: DeviceAttributes = "identity"
"""Only what identifies the device
(:data:`~otel_gpu.instrument.catalog.IDENTITY_ATTRIBUTES`) and its pods and jobs; the
descriptive attributes are on ``nvidia.gpu.info`` alone."""
ALL: DeviceAttributes = "all"
"""Every device attribute on every series (the default: what the hardware semantic
conventions recommend, and what a backend without joins can group by)."""


def build_resource(
    node_name: str | None = None, environ: Mapping[str, str] | None = None
) -> Resource:
    """The node's Resource: our defaults, overridden by ``OTEL_RESOURCE_ATTRIBUTES``.

    ``OTEL_SERVICE_NAME`` wins over both, as the specification asks.
    """
    env = os.environ if environ is None else environ
    attrs: dict[str, str] = {
        "service.name": "otel-gpu",
        "service.version": __version__,
        "host.name": socket.gethostname(),
    }
    node = node_name or env.get("NODE_NAME")
    if node:
        attrs["k8s.node.name"] = node
    resource = Resource.create(attrs)
    if environ is None:
        return resource.merge(OTELResourceDetector().detect())
    # An explicit mapping (tests): apply the same rules without touching os.environ.
    from_env: dict[str, str] = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            from_env[key.strip()] = value.strip()
    if env.get("OTEL_SERVICE_NAME"):
        from_env["service.name"] = env["OTEL_SERVICE_NAME"]
    return resource.merge(Resource(from_env))


def pod_attributes(snapshot: Snapshot, device: Device) -> dict[str, str | int]:
    """The pod holding the device whole and the HPC jobs using it (comma-separated: one
    series, however many jobs share it): on every series of the device, whatever
    ``device_attributes`` says, since OTLP's per-pod Resources and queries by pod need them."""
    attrs: dict[str, str | int] = {}
    jobs = snapshot.series_jobs(device.uuid)
    if jobs:
        attrs[HPC_JOB] = ",".join(jobs)
    if snapshot.pods is None:
        return attrs
    for ref in snapshot.series_pods(device.uuid):  # at most one: copies are a dcgm option
        attrs.update(pod_labels(ref))
    return attrs


def kubelet_numa_node(snapshot: Snapshot, device: Device) -> int | None:
    """The device's NUMA node as the kubelet's topology gives it, which beats NVML's and
    sysfs' (None when the kubelet does not say)."""
    if snapshot.pods is None:
        return None
    return snapshot.pods.attribution.numa_node(device.uuid)


def identity_attributes(attrs: Mapping[str, str | int]) -> dict[str, str | int]:
    """The part of a device's attributes that tells it from the others."""
    return {key: value for key, value in attrs.items() if key in IDENTITY_ATTRIBUTES}


def device_attributes(device: Device, driver_version: str | None) -> dict[str, str | int]:
    """Every attribute of one device: what ``nvidia.gpu.info`` carries, and what every
    series carries with ``device_attributes: all``."""
    attrs: dict[str, str | int] = {
        HW_ID: device.uuid,
        HW_TYPE: "gpu",
        HW_VENDOR: "NVIDIA",
        HW_MODEL: device.model,
        HW_NAME: device.name,
        GPU_INDEX: device.index,
        PCI_BUS_ID: device.pci_bus_id,
    }
    if driver_version:
        attrs[HW_DRIVER_VERSION] = driver_version
    if device.numa_node is not None:
        attrs[NUMA_NODE] = device.numa_node
    if device.serial:
        attrs[HW_SERIAL] = device.serial
    if device.is_mig:
        attrs[HW_PARENT] = device.parent_uuid or ""
        if device.mig_profile:
            attrs[MIG_PROFILE] = device.mig_profile
        if device.gpu_instance_id is not None:
            attrs[MIG_GI] = device.gpu_instance_id
        if device.compute_instance_id is not None:
            attrs[MIG_CI] = device.compute_instance_id
    return attrs


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
        self._attr_cache: dict[tuple[Device, str | None], dict[str, str | int]] = {}
        self._sets: dict[tuple, _AttributeSets] = {}
        self._per_snapshot: tuple[Snapshot | None, dict[str, _AttributeSets]] = (None, {})
        for metric in catalog:
            self._register(meter, metric)

    def _register(self, meter: Meter, metric: Metric) -> None:
        create = {
            Kind.GAUGE: meter.create_observable_gauge,
            Kind.COUNTER: meter.create_observable_counter,
            Kind.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
        }[metric.kind]
        create(
            metric.name,
            callbacks=[lambda options, m=metric: self.observe(m, options)],
            unit=metric.unit,
            description=metric.description,
        )

    def _base_attributes(self, device: Device, driver: str | None) -> dict[str, str | int]:
        key = (device, driver)
        attrs = self._attr_cache.get(key)
        if attrs is None:
            if len(self._attr_cache) > 4096:  # devices come and go only on hot-plug
                self._attr_cache.clear()
            attrs = self._attr_cache[key] = device_attributes(device, driver)
        return attrs

    def observe(
        self, metric: Metric, options: CallbackOptions | None = None
    ) -> Iterable[Observation]:
        snapshot = self._latest()
        if snapshot is None:
            return []
        if metric.per_node is not None:
            return [
                Observation(value, dict(attrs))
                for value, attrs in metric.per_node(snapshot, self._clock())
            ]
        out: list[Observation] = []
        for sample in snapshot.devices:
            points = device_observations(metric, sample)
            if not points:
                continue
            sets = self._device_sets(snapshot, sample.device)
            if metric.describes_device:
                out.extend(Observation(value, {**sets.info, **attrs} if attrs else sets.info)
                           for value, attrs in points)
                continue
            for value, attrs in points:
                out.append(Observation(value, sets.with_point(attrs)))
        return out

    def _device_sets(self, snapshot: Snapshot, device: Device) -> _AttributeSets:
        """The device's attribute sets in ``snapshot``: made once per snapshot, and the same
        objects again while the device's pods (and its NUMA node) do not change."""
        owner, by_uuid = self._per_snapshot
        if owner is not snapshot:  # a local pair: another thread may be on another snapshot
            owner, by_uuid = self._per_snapshot = (snapshot, {})
        sets = by_uuid.get(device.uuid)
        if sets is None:
            pods = pod_attributes(snapshot, device)
            numa = kubelet_numa_node(snapshot, device)
            key = (device, snapshot.driver_version, numa, tuple(pods.items()))
            sets = self._sets.get(key)
            if sets is None:
                if len(self._sets) > 4096:  # devices and their pods seen since the last rebuild
                    self._sets.clear()
                info = dict(self._base_attributes(device, snapshot.driver_version))
                if numa is not None:
                    info[NUMA_NODE] = numa
                base = dict(info) if self._all else identity_attributes(info)
                base.update(pods)
                sets = self._sets[key] = _AttributeSets(base, info)
            by_uuid[device.uuid] = sets
        return sets


class _AttributeSets:
    """One device's attributes in one snapshot, made once for every metric; the same
    objects again while its pods do not change. Never changed after they are made: the
    SDK copies what it is given.

    ``base``: what each of its series carries (its identity, or every attribute, and its
    pods and jobs); ``info``: every attribute of the device, for ``nvidia.gpu.info``.
    """

    __slots__ = ("base", "info")

    def __init__(self, base: dict[str, str | int], info: dict[str, str | int]) -> None:
        self.base = base
        self.info = info

    def with_point(self, attrs: Mapping[str, str]) -> dict[str, str | int]:
        return {**self.base, **attrs} if attrs else self.base


def build_meter_provider(
    resource: Resource,
    readers: Sequence[MetricReader],
    latest: Callable[[], Snapshot | None],
    *,
    clock: Callable[[], float] = time.monotonic,
    catalog: Sequence[Metric] = CATALOG,
    cardinality_limit: int | None = None,
    device_attributes: DeviceAttributes = ALL,
) -> MeterProvider:
    """A MeterProvider with the catalog's instruments registered on it.

    ``cardinality_limit`` replaces the SDK's default for every instrument and reader;
    ``device_attributes`` says which device attributes each series carries (:data:`IDENTITY`
    or :data:`ALL`).
    """
    views = () if cardinality_limit is None else (
        View(instrument_name="*", aggregation_cardinality_limit=cardinality_limit),)
    provider = MeterProvider(metric_readers=list(readers), resource=resource, views=views)
    meter = provider.get_meter(SCOPE, __version__)
    Instruments(meter, latest, catalog=catalog, clock=clock, device_attributes=device_attributes)
    return provider


Readers = Callable[[], "tuple[list[MetricReader], Callable[[], bytes] | None]"]
"""Makes a fresh set of readers, and the Prometheus render function if one is among them."""


Collect = Callable[[], MetricsData | None]


@runtime_checkable
class CollectsItself(Protocol):
    """A reader that sometimes collects on its own thread (the OTLP push when no render
    came): :class:`Telemetry` wraps those collections so they read one snapshot too."""

    def pin_collections(self, pin: Callable[[Collect], Collect]) -> None: ...


class Telemetry:
    """The MeterProvider and its readers, replaceable while scrapes and exports run.

    :meth:`rebuild` swaps in a new provider (releasing every attribute set the
    SDK kept, see :mod:`otel_gpu.instrument.cardinality`) whose cardinality limit
    is sized from the latest snapshot; the swap and
    :meth:`render` share a private lock, so no render runs on a provider being
    retired, and the old one is shut down (its final OTLP export) on a
    short-lived thread of its own.
    """

    def __init__(
        self,
        resource: Resource,
        latest: Callable[[], Snapshot | None],
        readers: Readers,
        *,
        clock: Callable[[], float] = time.monotonic,
        catalog: Sequence[Metric] = CATALOG,
        device_attributes: DeviceAttributes = ALL,
    ) -> None:
        self._resource = resource
        self._latest = latest
        self._readers = readers
        self._clock = clock
        self._catalog = catalog
        self._device_attributes = device_attributes
        self._lock = threading.Lock()
        self._pinned_snapshot: Snapshot | None = None
        self.cardinality_limit, self.room = cardinality(self._latest(), catalog)
        """The current provider's limit, and the (device, pod) pairs it has room for."""
        self._current = self._build(self.cardinality_limit)
        self.rebuilds = 0

    def _build(self, limit: int) -> tuple[MeterProvider, Callable[[], bytes] | None]:
        readers, render = self._readers()
        for reader in readers:
            if isinstance(reader, CollectsItself):  # its own collections read one snapshot too
                reader.pin_collections(self._pinned)
        provider = build_meter_provider(self._resource, readers, self._snapshot,
                                        clock=self._clock, catalog=self._catalog,
                                        cardinality_limit=limit,
                                        device_attributes=self._device_attributes)
        return provider, render

    def _pinned(self, collect: Callable[[], MetricsData | None]
                ) -> Callable[[], MetricsData | None]:
        """``collect`` run as :meth:`render` runs: on the latest snapshot alone."""
        def run() -> MetricsData | None:
            with self._lock:
                self._pinned_snapshot = self._latest()
                try:
                    return collect()
                finally:
                    self._pinned_snapshot = None
        return run

    def _snapshot(self) -> Snapshot | None:
        """What the instrument callbacks read: during a render, the one snapshot it began
        with, so that a publish in the middle cannot mix two samples (or a sample with and
        without its pods) in one body."""
        pinned = self._pinned_snapshot
        return pinned if pinned is not None else self._latest()

    def render(self, snapshot: Snapshot | None = None) -> bytes:
        """The Prometheus text of the OpenTelemetry instruments (empty without that reader),
        from ``snapshot`` (default: the latest)."""
        with self._lock:
            _, render = self._current
            if render is None:
                return b""
            self._pinned_snapshot = snapshot if snapshot is not None else self._latest()
            try:
                return render()
            finally:
                self._pinned_snapshot = None

    def rebuild(self) -> int:
        """Swap in a new provider sized for the latest snapshot; the pairs it has room for."""
        limit, room = cardinality(self._latest(), self._catalog)
        new = self._build(limit)
        with self._lock:
            (old, _), self._current = self._current, new
            self.cardinality_limit, self.room = limit, room
        self.rebuilds += 1
        log.info("rebuilt the OpenTelemetry pipeline for the pods on this node (rebuild %d; "
                 "finished pods' series released; cardinality limit %d per metric, room for "
                 "%d pod allocations)", self.rebuilds, limit, room)
        threading.Thread(target=old.shutdown, kwargs={"timeout_millis": 2500},
                         name="otel-gpu-retire", daemon=True).start()
        return room

    def shutdown(self, timeout_s: float) -> None:
        """Shutting down makes the OTLP reader export once more: nothing is lost."""
        with self._lock:
            provider, _ = self._current
        provider.shutdown(timeout_millis=timeout_s * 1000)
