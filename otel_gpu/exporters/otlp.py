"""OTLP push: the SDK's exporters, with pod identity moved into the Resource.

The OpenTelemetry SDK gives one MeterProvider one Resource. To make each
pod's GPU series arrive as *that pod's* telemetry, :class:`PodResourceExporter`
regroups every export: data points carrying ``k8s.pod.name`` (and namespace
and container) travel in a ``ResourceMetrics`` of their own whose Resource is
the node's plus the pod's attributes, with those attributes taken off the
points. Everything else stays under the node's Resource.

Transport, retries, TLS and every standard ``OTEL_EXPORTER_OTLP_*`` variable
are the SDK exporters' own; settings given to otel-gpu are passed to them as
arguments and win over the variables.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import field, make_dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

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
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu._log import LogLimiter
from otel_gpu.catalog import POD_ATTRIBUTES
from otel_gpu.config import OPTIONS
from otel_gpu.errors import SetupError

log = logging.getLogger(__name__)

GRPC = "grpc"
HTTP = "http/protobuf"
PROTOCOLS = (GRPC, HTTP)
RESOURCE, ATTRIBUTES = "resource", "attributes"


class OtlpSetupError(SetupError):
    """A bad OTLP setting found while building the exporter; one line."""


_PREFIX = "otlp_"
_ROWS = tuple(o for o in OPTIONS if o.key.startswith(_PREFIX) or o.key == "pod_identity")


def _from_config(cls: type, config: Any) -> Any:
    """The OTLP settings held by a :class:`~otel_gpu.config.Config`."""
    return cls(**{o.key.removeprefix(_PREFIX): getattr(config, o.key) for o in _ROWS})


OtlpSettings = make_dataclass(
    "OtlpSettings",
    [(o.key.removeprefix(_PREFIX), o.type, field(default=o.value)) for o in _ROWS],
    frozen=True,
    namespace={"from_config": classmethod(_from_config)},
)
OtlpSettings.__module__ = __name__
OtlpSettings.__doc__ = """otel-gpu's OTLP settings; ``None`` leaves one to the OTEL_* variables.

One field per ``otlp_*`` row of :data:`otel_gpu.config.OPTIONS` (named
without the prefix) plus ``pod_identity``, with the rows' defaults;
``OtlpSettings.from_config(config)`` picks them out of a ``Config``.
"""


def resolve_protocol(settings: OtlpSettings, environ: Mapping[str, str]) -> str:
    """Setting, else the metrics variable, else the generic one, else http/protobuf."""
    protocol = (
        settings.protocol
        or environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or HTTP
    ).strip().lower()
    if protocol not in PROTOCOLS:
        raise OtlpSetupError(
            f"OTLP protocol {protocol!r} is not supported; use grpc or http/protobuf"
        )
    return protocol


def endpoint_configured(settings: OtlpSettings, environ: Mapping[str, str]) -> bool:
    """Whether the user pointed OTLP somewhere (which turns the OTLP exporter on)."""
    return bool(
        settings.endpoint
        or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def read_headers_file(path: str) -> dict[str, str]:
    """``key=value`` per line or comma-separated, ``#`` comments; values may be %-encoded.

    Tokens can then come from a mounted Secret; they are never logged.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise OtlpSetupError(f"OTLP headers file {path}: cannot read it ({exc.strerror})") from None
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for item in line.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise OtlpSetupError(
                    f"OTLP headers file {path}: line {number}: expected key=value"
                )
            headers[key.strip().lower()] = unquote(value.strip())
    return headers


def _env_headers(environ: Mapping[str, str]) -> dict[str, str]:
    from opentelemetry.util.re import parse_env_headers

    raw = environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS") or environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    return dict(parse_env_headers(raw, liberal=True))


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


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OtlpSetupError(f"OTLP {what} {path}: cannot read it ({exc.strerror})") from None


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> MetricExporter:
    """The SDK exporter for the chosen protocol, with partial-success reporting."""
    protocol = resolve_protocol(settings, environ)
    headers: dict[str, str] | None = None
    if settings.headers_file:
        headers = {**_env_headers(environ), **read_headers_file(settings.headers_file)}
    compression = settings.compression
    temporality = _temporality(settings.temporality)
    if protocol == GRPC:
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        credentials = None
        if settings.certificate or settings.client_certificate:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(settings.certificate, "certificate"),
                private_key=_read(settings.client_key, "client key"),
                certificate_chain=_read(settings.client_certificate, "client certificate"),
            )
        grpc_compression = None
        if compression is not None:
            grpc_compression = grpc.Compression.Gzip if compression == "gzip" else (
                grpc.Compression.NoCompression
            )
        exporter: MetricExporter = GrpcExporter(
            endpoint=settings.endpoint,
            insecure=settings.insecure,
            credentials=credentials,
            headers=headers,
            timeout=settings.timeout,
            compression=grpc_compression,
            preferred_temporality=temporality,
        )
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpExporter,
        )

        endpoint = settings.endpoint
        if endpoint and not urlparse(endpoint).path.rstrip("/").endswith("/v1/metrics"):
            endpoint = endpoint.rstrip("/") + "/v1/metrics"
        exporter = HttpExporter(
            endpoint=endpoint,
            session=_explicit_ca_session(),
            certificate_file=settings.certificate,
            client_key_file=settings.client_key,
            client_certificate_file=settings.client_certificate,
            headers=headers,
            timeout=settings.timeout,
            compression=Compression(compression) if compression else None,
            preferred_temporality=temporality,
        )
    report_partial_success(exporter)
    return exporter


def _explicit_ca_session() -> Any:
    """A requests session in which a configured CA beats REQUESTS_CA_BUNDLE.

    ``requests`` lets those variables override the session's CA, so an
    ``OTEL_EXPORTER_OTLP_CERTIFICATE`` or ``otlp_certificate`` would be ignored
    on any machine that sets them for other software.
    """
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            settings = super().merge_environment_settings(*args, **kwargs)
            if isinstance(self.verify, str):
                settings["verify"] = self.verify
            return settings

    return Session()


def build_reader(
    settings: OtlpSettings, node: Resource, environ: Mapping[str, str]
) -> PeriodicExportingMetricReader:
    """A periodic reader pushing over OTLP (interval: setting, else OTEL_METRIC_EXPORT_INTERVAL)."""
    exporter = build_exporter(settings, environ)
    if settings.pod_identity == RESOURCE:
        exporter = PodResourceExporter(exporter, node)
    interval_ms = settings.interval * 1000 if settings.interval is not None else None
    timeout_ms = settings.timeout * 1000 if settings.timeout is not None else None
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=timeout_ms
    )


class PodResourceExporter(MetricExporter):
    """Sends each pod's data points under a Resource naming the pod."""

    def __init__(
        self, inner: MetricExporter, node: Resource, keys: Sequence[str] = POD_ATTRIBUTES
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._node = node
        self._keys = tuple(keys)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self._inner.export(self.regroup(metrics_data), timeout_millis=timeout_millis)

    def regroup(self, data: MetricsData) -> MetricsData:
        out: list[ResourceMetrics] = []
        for rm in data.resource_metrics:
            # pod key -> scope -> metric name -> (metric, points)
            groups: dict[tuple, dict[Any, dict[str, tuple[Any, list]]]] = {}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        attrs = point.attributes or {}
                        key = tuple(attrs.get(k) for k in self._keys)
                        if any(v is not None for v in key):
                            point = replace(point, attributes={
                                k: v for k, v in attrs.items() if k not in self._keys
                            })
                        else:
                            key = ()
                        scopes = groups.setdefault(key, {})
                        metrics = scopes.setdefault((sm.scope, sm.schema_url), {})
                        metrics.setdefault(metric.name, (metric, []))[1].append(point)
            for key, scopes in groups.items():
                resource = rm.resource
                if key:
                    pod = {k: v for k, v in zip(self._keys, key, strict=True) if v is not None}
                    resource = Resource({**dict(rm.resource.attributes), **pod},
                                        rm.resource.schema_url)
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
        out.sort(key=lambda r: tuple(str(r.resource.attributes.get(k, "")) for k in self._keys))
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

        exporter._initialize_channel_and_stub = initialize  # type: ignore[method-assign]
        exporter._client = _StubWithReplies(exporter._client)
        return True
    client = getattr(exporter, "_client", None)
    transport = getattr(client, "_transport", None)
    if transport is not None and hasattr(transport, "request"):
        client._transport = _TransportWithReplies(transport)
        return True
    log.debug("partial-success reporting unavailable with this OpenTelemetry SDK version")
    return False


class _StubWithReplies:
    """A gRPC MetricsService stub that reads the reply before handing it back."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - gRPC's method name
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
