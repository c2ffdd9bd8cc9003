"""The Prometheus exporter: the ``/metrics`` body, its naming profiles and its render cache.

The body is the OpenTelemetry instruments written as Prometheus text (with
the ``otel`` names) followed by the other naming profiles' series, every part
from the same snapshot. The endpoint serving it (:mod:`.endpoint`) belongs to
the service, which answers health probes with or without this exporter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.config import Config
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.naming import ProfileOptions, build_profiles, render_profiles
from otel_gpu.export.prometheus.endpoint import RenderCache
from otel_gpu.export.prometheus.text import TextWriter
from otel_gpu.instrument.schema import Metric
from otel_gpu.publish.pipeline import Subscriber
from otel_gpu.snapshot import Snapshot

if TYPE_CHECKING:
    from otel_gpu.export import sdk_env
    from otel_gpu.export.seam import Published, Served

OTEL = "otel"
"""The naming profile that is the OpenTelemetry instruments themselves."""


@dataclass(frozen=True)
class PrometheusSettings:
    """The settings the Prometheus body reads."""

    naming: tuple[str, ...]
    profiles: ProfileOptions

    @classmethod
    def from_config(cls, config: Config) -> PrometheusSettings:
        """Read from the typed config in this one place."""
        return cls(config.naming, ProfileOptions.from_config(config))


class RenderSubscriber:
    """A publish-loop subscriber: renders /metrics on the publishing thread while someone
    scrapes, so that no scrape waits for a render (see RenderCache.refresh)."""

    def __init__(self, cache: RenderCache) -> None:
        self._cache = cache

    def published(self, snapshot: Snapshot) -> None:
        self._cache.refresh()


class PrometheusExporter:
    """The scrape body, rendered on the publishing path while someone scrapes."""

    name = "prometheus"
    variables: tuple[sdk_env.Variable, ...] = ()

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        self.settings = PrometheusSettings.from_config(config)
        self.scrape: RenderCache | None = None
        """The body the endpoint serves, once attached."""
        self._writer = TextWriter(scope_labels=False, target_info=True)

    def default_on(self) -> bool:
        return True

    def validate(self) -> None:
        """Nothing beyond the collectors and web config files, which the CLI reads."""

    def prepare(self, resource: Resource) -> Sequence[Metric]:
        return ()

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        """None of its own: the body is written from ``source``. A new provider gets a new
        writer, so that no label string of the retired one's series stays."""
        self._writer = TextWriter(scope_labels=False, target_info=True)
        return []

    def attach(self, published: Published) -> Sequence[Subscriber]:
        store, telemetry, timings = published.store, published.telemetry, published.timings
        profiles = build_profiles(self.settings.naming, self.settings.profiles)
        instruments = OTEL in self.settings.naming

        def body() -> bytes:
            """The whole exposition, every part from the same snapshot."""
            snapshot = store.latest
            writer = self._writer
            text = writer.write(telemetry.collect(snapshot)) if instruments else b""
            return text + render_profiles(profiles, snapshot)

        self.scrape = RenderCache(body, lambda: store.version, max_age=timings.render_max_age,
                                  clock=published.clock,
                                  published=lambda: store.latest is not None,
                                  idle_after=timings.render_idle_after)
        return (RenderSubscriber(self.scrape),)

    def describe(self, served: Served) -> str:
        """Where scrapers pull the body (the line tests and scripts wait for names the URL)."""
        return (f"{self.name}: serving metrics on {served.url}/metrics (pulled by scrapers; "
                f"new values every {served.interval:g} s)")

    def stop(self, timeout_s: float) -> None:
        """The endpoint is stopped by the service."""
