"""The exporter seam: what every exporter is to the service, and what the service offers it.

The registry of exporters is :mod:`otel_gpu.export.exporters`; this module
imports none of them, so each exporter's room can name the seam without
reaching the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.export import sdk_env
from otel_gpu.export.collected import CollectingReader
from otel_gpu.instrument.schema import Metric
from otel_gpu.instrument.telemetry import Telemetry
from otel_gpu.publish.pipeline import Subscriber
from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings


class Body(Protocol):
    """A rendered ``/metrics`` body, plain and gzipped, and the Content-Type it is served as."""

    @property
    def body(self) -> bytes: ...

    @property
    def gzipped(self) -> bytes: ...

    @property
    def content_type(self) -> str: ...


class Scrape(Protocol):
    """What the endpoint serves at ``/metrics``."""

    @property
    def published(self) -> Callable[[], bool] | None:
        """Whether the first sample is out (None: always); until then a scrape gets 503."""
        ...

    def get(self, accept: str | None = None) -> Body:
        """The body to serve now, in the format the scraper's ``Accept`` header asks for."""
        ...


@dataclass(frozen=True)
class Published:
    """What the running pipeline offers an exporter once it is built."""

    store: SnapshotStore
    telemetry: Telemetry
    timings: Timings
    clock: Callable[[], float] = field(default=time.monotonic)


@dataclass(frozen=True)
class Served:
    """Where the service's HTTP endpoint listens, and how often it publishes: what an
    exporter's start-up line (:meth:`Exporter.describe`) may need to say where it is."""

    url: str
    """The endpoint's base URL: ``http://0.0.0.0:9400``, ``https://[::1]:9400``."""
    interval: float
    """Seconds between two publications."""


class Exporter(Protocol):
    """One way the telemetry leaves the process, built from the typed config."""

    name: str
    """The ``exporters`` setting's choice that turns it on (several may share one)."""
    variables: tuple[sdk_env.Variable, ...]
    """The ``OTEL_*`` variables the SDK reads for it, checked before it starts."""

    @property
    def scrape(self) -> Scrape | None:
        """The body the endpoint serves at ``/metrics`` (None: it serves none)."""
        ...

    def default_on(self) -> bool:
        """Whether it runs when the ``exporters`` setting is not given."""
        ...

    def validate(self) -> None:
        """Every check ``serve`` makes before starting it; a :class:`SetupError` if one fails."""
        ...

    def prepare(self, resource: Resource) -> Sequence[Metric]:
        """Build what needs the node's Resource (a bad setting raises here); the metrics it
        adds to the catalog."""
        ...

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        """Fresh readers for a new MeterProvider; ``source`` is the collection made once per
        publication, which a reader may export instead of collecting itself."""
        ...

    def attach(self, published: Published) -> Sequence[Subscriber]:
        """Start on the built pipeline; the publish-loop subscribers it needs."""
        ...

    def describe(self, served: Served) -> str:
        """Its start-up line, once started: where it serves or pushes, the protocol, how
        often; so that an operator sees where the telemetry goes without knowing the
        exporter."""
        ...

    def stop(self, timeout_s: float) -> None:
        """Send what it holds beyond the MeterProvider's readers, within ``timeout_s``."""
        ...
