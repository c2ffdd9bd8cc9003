"""Telemetry: the node's Resource, the MeterProvider and its readers, and one collection.

The SDK folds a metric's attribute sets past its cardinality limit (2000 per
metric and reader by default) into one ``otel.metric.overflow`` series. A
node with 2,500 time-sliced pods has 2,500 allocation series, so the limit
is sized from the latest snapshot each time the MeterProvider is built
(:func:`otel_gpu.instrument.cardinality.cardinality`), through a view that applies to
every reader, and :class:`otel_gpu.instrument.cardinality.CardinalityGuard` has it
rebuilt when pods outgrow it. The instruments registered on it are
:class:`otel_gpu.instrument.instruments.Instruments`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from opentelemetry.sdk.metrics import Meter as SdkMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, MetricsData
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from otel_gpu import __version__
from otel_gpu.instrument.attributes import ALL, DeviceAttributes
from otel_gpu.instrument.cardinality import cardinality
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.direct import CollectsDirectly, DirectCollection
from otel_gpu.instrument.instruments import Instruments
from otel_gpu.instrument.schema import Metric
from otel_gpu.snapshot import Snapshot

log = logging.getLogger(__name__)

SCOPE = "otel_gpu"

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
    # shut down by the service within its deadline, never again at exit (the SDK would warn)
    provider = MeterProvider(metric_readers=list(readers), resource=resource, views=views,
                             shutdown_on_exit=False)
    meter = provider.get_meter(SCOPE, __version__)
    instruments = Instruments(meter, latest, catalog=catalog, clock=clock,
                              device_attributes=device_attributes)
    if isinstance(meter, SdkMeter):  # not the no-op one of OTEL_SDK_DISABLED
        for reader in readers:
            if isinstance(reader, CollectsDirectly):
                reader.collect_with(DirectCollection(resource, instruments.registered,
                                                     cardinality_limit).collect)
    return provider


Collect = Callable[[], MetricsData | None]

Readers = Callable[[], "tuple[list[MetricReader], Collect]"]
"""Makes a fresh set of readers, and the collection on demand of one of them (what
:meth:`Telemetry.collect` runs)."""


@runtime_checkable
class CollectsItself(Protocol):
    """A reader that sometimes collects on its own thread (the OTLP push when no scrape
    collected): :class:`Telemetry` wraps those collections so they read one snapshot too."""

    def pin_collections(self, pin: Callable[[Collect], Collect]) -> None: ...


class Telemetry:
    """The MeterProvider and its readers, replaceable while scrapes and exports run.

    :meth:`rebuild` swaps in a new provider (releasing every attribute set the
    SDK kept, see :mod:`otel_gpu.instrument.cardinality`) whose cardinality limit
    is sized from the latest snapshot; the swap and
    :meth:`collect` share a private lock, so no collection runs on a provider being
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

    def _build(self, limit: int) -> tuple[MeterProvider, Collect]:
        readers, collect = self._readers()
        for reader in readers:
            if isinstance(reader, CollectsItself):  # its own collections read one snapshot too
                reader.pin_collections(self._pinned)
        provider = build_meter_provider(self._resource, readers, self._snapshot,
                                        clock=self._clock, catalog=self._catalog,
                                        cardinality_limit=limit,
                                        device_attributes=self._device_attributes)
        return provider, collect

    def _pinned(self, collect: Callable[[], MetricsData | None]
                ) -> Callable[[], MetricsData | None]:
        """``collect`` run as :meth:`collect` runs: on the latest snapshot alone."""
        def run() -> MetricsData | None:
            with self._lock:
                self._pinned_snapshot = self._latest()
                try:
                    return collect()
                finally:
                    self._pinned_snapshot = None
        return run

    def _snapshot(self) -> Snapshot | None:
        """What the instrument callbacks read: during a collection, the one snapshot it began
        with, so that a publish in the middle cannot mix two samples (or a sample with and
        without its pods) in one body."""
        pinned = self._pinned_snapshot
        return pinned if pinned is not None else self._latest()

    def collect(self, snapshot: Snapshot | None = None) -> MetricsData | None:
        """One collection of every instrument, all reading ``snapshot`` (default: the latest);
        None while no instrument has a point."""
        with self._lock:
            _, collect = self._current
            self._pinned_snapshot = snapshot if snapshot is not None else self._latest()
            try:
                return collect()
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
