"""The exporters, behind one Protocol, and the one registry of them.

Settings parsing (the names ``exporters`` accepts), the CLI's checks
(:func:`validate`), the service (:func:`select`, then each exporter's
:meth:`~Exporter.readers`) and shutdown (:meth:`~Exporter.stop`) read
:data:`REGISTRY`: adding an exporter is its module, a class with this
Protocol's shape, and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.errors import SetupError
from otel_gpu.export import sdk_env
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.transport import OtlpRows, OtlpSettings, endpoint_configured

if TYPE_CHECKING:
    from otel_gpu.export.otlp.logs import EventLog


class Rows(OtlpRows, Protocol):
    """The settings the exporters read (a :class:`~otel_gpu.config.Config` has them)."""

    @property
    def exporters(self) -> tuple[str, ...] | None: ...


class Exporter(Protocol):
    """One way the metrics leave the process."""

    @property
    def name(self) -> str:
        """The name in the ``exporters`` setting."""
        ...

    def default_on(self) -> bool:
        """Whether it runs when the ``exporters`` setting is not given."""
        ...

    def validate(self) -> None:
        """Every check ``serve`` makes before starting it; a :class:`SetupError` if one fails."""
        ...

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        """Fresh readers for a new MeterProvider; ``source`` is the collection made once per
        publication, which a reader may export instead of collecting itself."""
        ...

    def stop(self, timeout_s: float) -> None:
        """Send what it holds beyond the MeterProvider's readers, within ``timeout_s``."""
        ...


class PrometheusExporter:
    """The scrape endpoint; its server and render cache are built by the service."""

    name = "prometheus"

    def __init__(self, config: Rows, environ: Mapping[str, str]) -> None:
        self._config = config

    def default_on(self) -> bool:
        return True

    def validate(self) -> None:
        """Nothing beyond the web config and collectors files, which the CLI checks."""

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        return []  # the body is written from ``source`` itself

    def stop(self, timeout_s: float) -> None:
        """The server is stopped by its owner."""


class OtlpExporter:
    """OTLP push of the metrics, and of the GPU events as log records, to one place."""

    name = "otlp"

    def __init__(self, config: Rows, environ: Mapping[str, str]) -> None:
        self.settings = OtlpSettings.from_config(config)
        self._environ = environ
        self._events: EventLog | None = None

    def default_on(self) -> bool:
        return endpoint_configured(self.settings, self._environ)

    def validate(self) -> None:
        from otel_gpu.export.otlp import logs, metrics

        sdk_env.check_otlp(self._environ)
        metrics.validate(self.settings, self._environ)
        logs.validate(self.settings, self._environ)  # GPU events go where metrics go

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        from otel_gpu.export.otlp import metrics

        return [metrics.build_reader(self.settings, resource, self._environ, source)]

    def event_log(self, resource: Resource) -> EventLog | None:
        """The GPU events' logs pipeline (made once; None with ``OTEL_LOGS_EXPORTER=none``)."""
        from otel_gpu.export.otlp import logs

        if self._events is None:
            self._events = logs.build_event_log(self.settings, resource, self._environ)
        return self._events

    def stop(self, timeout_s: float) -> None:
        if self._events is not None:
            self._events.shutdown(timeout_s)


REGISTRY: tuple[Callable[[Rows, Mapping[str, str]], Exporter], ...] = (
    PrometheusExporter,
    OtlpExporter,
)
"""Every exporter, in the order they are started."""
NAMES: tuple[str, ...] = tuple(str(getattr(make, "name")) for make in REGISTRY)  # noqa: B009


def select(config: Rows, environ: Mapping[str, str]) -> list[Exporter]:
    """The exporters to run: the ``exporters`` setting, else those on by default."""
    every = [make(config, environ) for make in REGISTRY]
    if not config.exporters:
        return [e for e in every if e.default_on()]
    unknown = [n for n in config.exporters if n not in NAMES]
    if unknown:
        raise SetupError(f"exporters: unknown exporter {unknown[0]!r} (known: "
                         f"{', '.join(NAMES)})")
    return [e for e in every if e.name in config.exporters]


def validate(config: Rows, environ: Mapping[str, str]) -> list[Exporter]:
    """The OpenTelemetry SDK's own variables, then each selected exporter's checks."""
    sdk_env.check(environ)
    chosen = select(config, environ)
    for exporter in chosen:
        exporter.validate()
    return chosen
