"""OTLP metrics: the SDK's exporters, with pod identity moved into the Resource.

The OpenTelemetry SDK gives one MeterProvider one Resource. To make each
pod's GPU series arrive as *that pod's* telemetry, :class:`PodResourceExporter`
regroups every export: data points carrying ``k8s.pod.name`` (and namespace
and container) travel in a ``ResourceMetrics`` of their own whose Resource is
the node's plus the pod's attributes (:mod:`otel_gpu.export.otlp.resources`), with
those attributes taken off the points. Everything else stays under the node's
Resource.

Endpoint, headers, TLS and compression are :mod:`otel_gpu.export.otlp.transport`'s,
shared with the logs; retries and every standard ``OTEL_EXPORTER_OTLP_*``
variable not set by otel-gpu are the SDK exporters' own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otel_gpu._log import LogLimiter
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.push import OtlpPush, cumulative
from otel_gpu.export.otlp.resources import CACHE, Key, WorkloadResources
from otel_gpu.export.otlp.transport import (
    GRPC,
    RESOURCE,
    OtlpSettings,
    OtlpSetupError,
    Transport,
    resolve,
)
from otel_gpu.workload import WORKLOAD_ATTRIBUTES

log = logging.getLogger(__name__)


def _temporality(name: str | None) -> dict[type, AggregationTemporality] | None:
    if name is None:
        return None  # the SDK reads OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
    if name == "delta":
        delta = AggregationTemporality.DELTA
        cumulative = AggregationTemporality.CUMULATIVE
        return {
            Counter: delta, ObservableCounter: delta, Histogram: delta,
            UpDownCounter: cumulative, ObservableUpDownCounter: cumulative,
            ObservableGauge: cumulative,
        }
    return dict.fromkeys(
        (Counter, ObservableCounter, Histogram, UpDownCounter, ObservableUpDownCounter,
         ObservableGauge),
        AggregationTemporality.CUMULATIVE,
    )


def validate(settings: OtlpSettings, environ: Mapping[str, str]) -> None:
    """Everything :func:`build_exporter` checks, without building it (for ``check``)."""
    resolve(settings, environ)


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> MetricExporter:
    """The SDK exporter for the chosen protocol, with partial-success reporting."""
    transport = resolve(settings, environ)
    try:
        exporter = _sdk_exporter(transport)
    except Exception as exc:  # noqa: BLE001 - the SDK reads OTEL_* variables here, may refuse
        raise OtlpSetupError(
            f"OTLP exporter: {' '.join(str(exc).split()) or exc.__class__.__name__}"
        ) from None
    report_partial_success(exporter)
    return exporter


def _sdk_exporter(transport: Transport) -> MetricExporter:
    temporality = _temporality(transport.settings.temporality)
    if transport.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        return GrpcExporter(**transport.grpc_arguments(), preferred_temporality=temporality)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpExporter,
    )

    return HttpExporter(**transport.http_arguments(), preferred_temporality=temporality)


def build_reader(
    settings: OtlpSettings, node: Resource, environ: Mapping[str, str],
    source: CollectingReader | None = None,
) -> MetricReader:
    """The reader pushing over OTLP (interval: setting, else OTEL_METRIC_EXPORT_INTERVAL).

    With a ``source`` and a cumulative exporter, it pushes the source's
    collections (:class:`~otel_gpu.export.otlp.push.OtlpPush`: one SDK collection
    per cycle for Prometheus and OTLP); otherwise, for delta temporality, it is
    the SDK's periodic reader, collecting by itself.
    """
    exporter = build_exporter(settings, environ)
    shared = source if source is not None and cumulative(exporter) else None
    if shared is not None:  # the same series each push: their attributes encoded once
        from otel_gpu.export.otlp.encode import use_cached_encoding  # protobuf: OTLP only

        use_cached_encoding(exporter)
    if settings.pod_identity == RESOURCE:
        exporter = PodResourceExporter(exporter, node)
    if shared is not None:
        return OtlpPush(exporter, shared, interval_s=settings.interval,
                        timeout_s=settings.timeout, environ=environ)
    interval_ms = settings.interval * 1000 if settings.interval is not None else None
    timeout_ms = settings.timeout * 1000 if settings.timeout is not None else None
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=timeout_ms
    )


_NO_ATTRIBUTES: Mapping[str, AttributeValue] = {}


class PodResourceExporter(MetricExporter):
    """Sends each pod's (and each HPC job's) data points under a Resource naming it."""

    def __init__(
        self, inner: MetricExporter, node: Resource, keys: Sequence[str] = WORKLOAD_ATTRIBUTES,
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._node = node
        self._workloads = WorkloadResources(keys)
        # The same series push after push: each one's attributes without the pod are made
        # once. Bounded; only the exporting thread uses it.
        self._stripped: dict[int, tuple[object, Key, dict[str, AttributeValue]]] = {}

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self._inner.export(self.regroup(metrics_data), timeout_millis=timeout_millis)

    def _split(self, attrs: Mapping[str, AttributeValue]
               ) -> tuple[Key, dict[str, AttributeValue] | None]:
        """The point's workload key, and its attributes without it (None: no workload)."""
        known = self._stripped.get(id(attrs))
        if known is not None and known[0] is attrs:
            return known[1], known[2]
        key = self._workloads.key(attrs)
        if not key:
            return (), None
        stripped = self._workloads.strip(attrs)
        if len(self._stripped) >= CACHE:
            self._stripped.clear()
        self._stripped[id(attrs)] = (attrs, key, stripped)  # holding attrs keeps its id
        return key, stripped

    def regroup(self, data: MetricsData) -> MetricsData:
        out: list[ResourceMetrics] = []
        for rm in data.resource_metrics:
            # pod key -> scope -> metric name -> (metric, points)
            groups: dict[Key, dict[Any, dict[str, tuple[Any, list[Any]]]]] = {}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        key, stripped = self._split(point.attributes or _NO_ATTRIBUTES)
                        if stripped is not None:
                            point = replace(point, attributes=stripped)
                        scopes = groups.setdefault(key, {})
                        metrics = scopes.setdefault((sm.scope, sm.schema_url), {})
                        metrics.setdefault(metric.name, (metric, []))[1].append(point)
            for key, scopes in groups.items():
                resource = self._workloads.resource(rm.resource, key)
                scope_metrics = [
                    ScopeMetrics(
                        scope=scope,
                        metrics=[
                            replace(metric, data=replace(metric.data, data_points=points))
                            for metric, points in metrics.values()
                        ],
                        schema_url=schema_url,
                    )
                    for (scope, schema_url), metrics in scopes.items()
                ]
                out.append(ResourceMetrics(resource, scope_metrics, rm.schema_url))
        # node first, then pods in a stable order
        keys = self._workloads.keys
        out.sort(key=lambda r: tuple(str(r.resource.attributes.get(k, "")) for k in keys))
        return MetricsData(resource_metrics=out)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis)


# --- partial success -----------------------------------------------------------

_partial_log = LogLimiter(log, 60.0)


def _log_partial(response: Any) -> None:
    partial = getattr(response, "partial_success", None)
    if partial is None:
        return
    rejected = int(getattr(partial, "rejected_data_points", 0) or 0)
    message = getattr(partial, "error_message", "") or ""
    if rejected or message:
        _partial_log.log(
            "partial", logging.WARNING,
            "OTLP backend accepted the export only in part: %d data point(s) rejected: %s",
            rejected, message or "(no reason given)",
        )


def report_partial_success(exporter: MetricExporter) -> bool:
    """Make a SDK exporter log partial-success replies, which it otherwise drops.

    The SDK keeps the reply out of reach, so this wraps its client at the seam
    each transport exposes. Returns False when the SDK's shape is not the one
    known here (the export itself is unaffected).
    """
    if hasattr(exporter, "_initialize_channel_and_stub") and hasattr(exporter, "_client"):
        original = exporter._initialize_channel_and_stub

        def initialize() -> None:
            original()
            exporter._client = _StubWithReplies(exporter._client)

        exporter._initialize_channel_and_stub = initialize
        exporter._client = _StubWithReplies(exporter._client)
        return True
    client = getattr(exporter, "_client", None)
    transport = getattr(client, "_transport", None)
    if client is not None and transport is not None and hasattr(transport, "request"):
        client._transport = _TransportWithReplies(transport)
        return True
    log.debug("partial-success reporting unavailable with this OpenTelemetry SDK version")
    return False


class _StubWithReplies:
    """A gRPC MetricsService stub that reads the reply before handing it back."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def Export(self, *args: Any, **kwargs: Any) -> Any:
        response = self._stub.Export(*args, **kwargs)
        _log_partial(response)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)


class _TransportWithReplies:
    """An HTTP transport that decodes successful OTLP replies for partial success."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def request(self, *args: Any, **kwargs: Any) -> Any:
        result = self._transport.request(*args, **kwargs)
        if getattr(result, "status_code", None) == 200:
            from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
                ExportMetricsServiceResponse,
            )

            with contextlib.suppress(Exception):  # an odd body must not fail the export
                _log_partial(ExportMetricsServiceResponse.FromString(result.content()))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
