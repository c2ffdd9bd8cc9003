"""The two OTLP exporters the ``otlp`` choice turns on: metrics, and GPU events as logs.

Both read :class:`~otel_gpu.export.otlp.transport.OtlpSettings` and send to the
same place over the same transport. The exporters (and the SDK's logs module,
which reads variables at import time) are imported only once an exporter is
used, after :mod:`otel_gpu.export.sdk_env` has checked those variables; the
events' detector only once the logs pipeline is built (a third of a mebibyte that a
collector without OTLP never holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource

from otel_gpu.config import Config
from otel_gpu.export import sdk_env
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.transport import (
    LOGS,
    METRICS,
    OtlpSettings,
    endpoint_configured,
    resolve,
    url,
)
from otel_gpu.instrument.process import PROCESS_METRICS
from otel_gpu.instrument.schema import Metric
from otel_gpu.publish.pipeline import Subscriber

if TYPE_CHECKING:
    from otel_gpu.export.events.detector import EventDetector
    from otel_gpu.export.otlp.logs import EventLog
    from otel_gpu.export.seam import Published, Served

NAME = "otlp"
def destination(settings: OtlpSettings, environ: Mapping[str, str], signal: str
                ) -> tuple[str, str]:
    """(URL, protocol) the exporter of ``signal`` sends to (:func:`~otel_gpu.export.otlp.
    transport.url`)."""
    transport = resolve(settings, environ, signal)
    return url(transport, environ, signal), transport.protocol


class OtlpMetricsExporter:
    """OTLP push of the metrics."""

    name = NAME
    variables = sdk_env.OTLP
    scrape = None

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        self.settings = OtlpSettings.from_config(config)
        self._environ = environ

    def default_on(self) -> bool:
        return endpoint_configured(self.settings, self._environ)

    def validate(self) -> None:
        from otel_gpu.export.otlp import metrics

        sdk_env.check_otlp(self._environ)
        metrics.validate(self.settings, self._environ)

    def prepare(self, resource: Resource) -> Sequence[Metric]:
        """The collector's own ``process.*`` metrics, which a Prometheus scrape has under
        prometheus_client's names instead (:mod:`otel_gpu.export.prometheus.process`)."""
        return PROCESS_METRICS

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        from otel_gpu.export.otlp import metrics

        return [metrics.build_reader(self.settings, resource, self._environ, source)]

    def attach(self, published: Published) -> Sequence[Subscriber]:
        return ()

    def describe(self, served: Served) -> str:
        from otel_gpu.export.otlp.push import export_interval_ms

        url, protocol = destination(self.settings, self._environ, METRICS)
        every = export_interval_ms(self.settings.interval, self._environ) / 1000
        return f"{self.name} metrics: pushing to {url} ({protocol}) every {every:g} s"

    def stop(self, timeout_s: float) -> None:
        """The reader's final export is the MeterProvider's shutdown."""


class OtlpLogsExporter:
    """GPU events, read off each publication, sent as OTLP log records where the metrics go
    (none with ``OTEL_LOGS_EXPORTER=none``)."""

    name = NAME
    variables: tuple[sdk_env.Variable, ...] = ()  # the metrics' (the same transport)
    scrape = None

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        self.settings = OtlpSettings.from_config(config)
        self._environ = environ
        self._events: EventLog | None = None
        self._detector: EventDetector | None = None

    def default_on(self) -> bool:
        return endpoint_configured(self.settings, self._environ)

    def validate(self) -> None:
        from otel_gpu.export.otlp import logs

        logs.validate(self.settings, self._environ)

    def prepare(self, resource: Resource) -> Sequence[Metric]:
        """The logs pipeline, and the event counters while it sends."""
        from otel_gpu.export.events.detector import EventDetector
        from otel_gpu.export.otlp import logs

        self._events = logs.build_event_log(self.settings, resource, self._environ)
        if self._events is None:
            return ()
        self._detector = EventDetector()
        return self._detector.metrics()

    def readers(self, resource: Resource, source: CollectingReader) -> list[MetricReader]:
        return []

    def attach(self, published: Published) -> Sequence[Subscriber]:
        if self._events is None or self._detector is None:
            return ()
        from otel_gpu.export.events.detector import EventSubscriber

        return (EventSubscriber(self._detector, self._events.emit),)

    def describe(self, served: Served) -> str:
        if self._events is None:
            return f"{self.name} logs: off (OTEL_LOGS_EXPORTER=none): GPU events are not sent"
        url, protocol = destination(self.settings, self._environ, LOGS)
        return (f"{self.name} logs: pushing GPU events to {url} ({protocol}) as they happen "
                f"(batched within a second)")

    def stop(self, timeout_s: float) -> None:
        """The queued events go out, within ``timeout_s``."""
        if self._events is not None:
            self._events.shutdown(timeout_s)
