"""The Prometheus exporter: the ``/metrics`` body, its naming profiles and its render cache.

The body is the OpenTelemetry instruments written as Prometheus text (with
the ``otel`` names) followed by the other naming profiles' series, every part
from the same snapshot. The endpoint serving it (:mod:`otel_gpu.export.http.endpoint`)
belongs to the service, which answers health probes with or without this exporter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

from otel_gpu.config import Config
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.naming import Profile, ProfileOptions, build_profiles, profile
from otel_gpu.export.naming.exposition import Family, render
from otel_gpu.export.naming.exposition import format_value as profile_value
from otel_gpu.export.prometheus.cache import RenderCache
from otel_gpu.export.prometheus.formats import ALLOW_UTF8, Style, escape_name, legacy_label, quote
from otel_gpu.export.prometheus.process import ProcessScrape
from otel_gpu.export.prometheus.text import (
    PROMETHEUS,
    TextWriter,
    escape_help,
    escape_value,
    label_key,
    sample_line,
    written_name,
)
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
    utf8_names: bool = False

    @classmethod
    def from_config(cls, config: Config) -> PrometheusSettings:
        """Read from the typed config in this one place."""
        return cls(config.naming, ProfileOptions.from_config(config),
                   config.prometheus_utf8_names)


class Writers:
    """A text writer per style, made the first time the style is asked for; one set per
    MeterProvider (the label strings they remember are of its series)."""

    def __init__(self) -> None:
        self._by_style: dict[Style, TextWriter] = {}

    def __call__(self, style: Style) -> TextWriter:
        writer = self._by_style.get(style)
        if writer is None:
            writer = self._by_style[style] = TextWriter(scope_labels=False, target_info=True,
                                                        style=style)
        return writer


class Collection:
    """One publication: the instruments' collection and the profiles' families, both from
    the same snapshot, written in each style the cache asks for."""

    __slots__ = ("data", "families", "writers")

    def __init__(self, data: MetricsData | None, families: list[Family],
                 writers: Writers) -> None:
        self.data = data
        self.families = families
        self.writers = writers

    def write(self, style: Style) -> bytes:
        text = self.writers(style).write(self.data)
        if style == PROMETHEUS:  # today's bytes, by the profiles' own writer
            return text + render(self.families).encode()
        tail = "# EOF\n" if style.openmetrics else ""
        return text + (write_families(self.families, style) + tail).encode()


def collect_families(profiles: Sequence[Profile], snapshot: Snapshot | None) -> list[Family]:
    """The profiles' families for one snapshot (none before the first)."""
    families: list[Family] = []
    if snapshot is not None:
        for one in profiles:
            families.extend(one.families(snapshot))
    return families


def write_families(families: Iterable[Family], style: Style) -> str:
    """The naming profiles' families (``dcgm``, ``kubelet``, the collector's health) in
    ``style``, for any style but today's (written by the profiles' own writer).

    Their names are kept as they are, escaped as the scheme asks: a counter whose name ends
    in ``_total`` is an OpenMetrics counter, one that does not (dcgm-exporter's) is
    ``unknown`` there, so that its series keep their names in every format.
    """
    om = style.openmetrics
    key_of = label_key(style) if not style.legacy else (lambda key: key)
    quoted = style.escaping == ALLOW_UTF8
    out: list[str] = []
    for family in families:
        if not family.samples:
            continue
        name, kind, suffix = family.name, family.type, ""
        if kind not in ("counter", "gauge"):
            kind = "unknown" if om else "untyped"
        elif om and kind == "counter":
            if name.endswith("_total"):
                name, suffix = name[:-6], "_total"
            else:
                kind = "unknown"
        header = escape_name(name, style.escaping) if not style.legacy else name
        sample = written_name(header + suffix)
        header = written_name(header)
        out.append(f"# HELP {header} {escape_help(family.help, om)}\n# TYPE {header} {kind}\n")
        prefix = "{" + sample if quoted and sample[:1] == '"' else sample
        inline = prefix[:1] == "{"
        for labels, value in family.samples:
            keys = tuple(key_of(k) for k in labels)
            pairs = zip(keys, map(str, labels.values()), strict=True)
            braces = ("{" + ",".join(
                f'{k if legacy_label(k) or not quoted else quote(k)}="{escape_value(v)}"'
                for k, v in pairs) + "}") if labels else ""
            out.append(sample_line(prefix, inline, braces, profile_value(value)))
    return "".join(out)


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
        self._writers = Writers()

    def default_on(self) -> bool:
        return True

    def validate(self) -> None:
        """Each naming profile's check of its options (the dcgm profile reads its counters
        file here), so that a bad one stops ``serve`` and ``check`` before NVML opens; what
        cannot be served is said once the body is built."""
        for name in self.settings.naming:
            profile(name).validate(self.settings.profiles)

    def prepare(self, resource: Resource) -> Sequence[Metric]:
        return ()

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        """None of its own: the body is written from ``source``. A new provider gets a new
        writer, so that no label string of the retired one's series stays."""
        self._writers = Writers()
        return []

    def attach(self, published: Published) -> Sequence[Subscriber]:
        store, telemetry, timings = published.store, published.telemetry, published.timings
        profiles = build_profiles(self.settings.naming, self.settings.profiles)
        instruments = OTEL in self.settings.naming

        def body() -> Collection:
            """The whole exposition's collection, every part from the same snapshot."""
            snapshot = store.latest
            data = telemetry.collect(snapshot) if instruments else None
            return Collection(data, collect_families(profiles, snapshot), self._writers)

        # each answer starts with the process_* series, read at the scrape
        self.scrape = ProcessScrape(body, lambda: store.version, max_age=timings.render_max_age,
                                    clock=published.clock,
                                    published=lambda: store.latest is not None,
                                    idle_after=timings.render_idle_after,
                                    utf8_names=self.settings.utf8_names)
        return (RenderSubscriber(self.scrape),)

    def describe(self, served: Served) -> str:
        """Where scrapers pull the body (the line tests and scripts wait for names the URL)."""
        return (f"{self.name}: serving metrics on {served.url}/metrics (pulled by scrapers; "
                f"new values every {served.interval:g} s)")

    def stop(self, timeout_s: float) -> None:
        """The endpoint is stopped by the service."""
