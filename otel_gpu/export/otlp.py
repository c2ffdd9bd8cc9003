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
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import field, make_dataclass, replace
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
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu._files import FileError, read_bytes, read_text
from otel_gpu._log import LogLimiter
from otel_gpu.config import OPTIONS, parse_endpoint
from otel_gpu.errors import SetupError
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.push import OtlpPush, cumulative
from otel_gpu.instrument.catalog import WORKLOAD_ATTRIBUTES

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


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP field name (RFC 9110 token)."""
_ENV_ITEM = re.compile(r"^[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+[ \t]*=[ \t]*"
                       r"[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*$")
"""One ``key=value`` of an OTEL_EXPORTER_OTLP_*HEADERS variable, as the SDK reads it."""


def _value_problem(value: str) -> str | None:
    """What is wrong with a decoded header value, never quoting it (it may be a secret)."""
    if value != value.strip(" \t"):
        return "the value has leading or trailing spaces (after %-decoding)"
    if any(ch < " " or ch == "\x7f" for ch in value):
        return "the value contains a control character (after %-decoding)"
    if not value.isascii():
        return "the value is not ASCII (after %-decoding); %-encode it as UTF-8 bytes"
    return None


def read_headers_file(path: str) -> dict[str, str]:
    """``key=value`` per line or comma-separated, ``#`` comments; values may be %-encoded.

    Tokens can then come from a mounted Secret; they are never logged, nor
    quoted in an error: a bad header is named by its line (and its name, when
    that is a valid one).
    """
    try:
        text = read_text(path, "OTLP headers file")
    except FileError as exc:
        raise OtlpSetupError(str(exc)) from None
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for item in line.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            where = f"OTLP headers file {path}: line {number}"
            if not sep or not key:
                raise OtlpSetupError(f"{where}: expected key=value")
            if not _TOKEN.match(key):
                raise OtlpSetupError(f"{where}: the header name is not an HTTP token (letters, "
                                     "digits and !#$%&'*+-.^_`|~ only)")
            decoded = unquote(value.strip())
            problem = _value_problem(decoded)
            if problem:
                raise OtlpSetupError(f"{where}: header {key.lower()!r}: {problem}")
            headers[key.lower()] = decoded
    return headers


def _env_headers(environ: Mapping[str, str]) -> dict[str, str]:
    """The OTEL_EXPORTER_OTLP_[METRICS_]HEADERS headers, read as the SDK reads them.

    An entry the SDK would drop, logging it whole, is refused here instead, by
    its position, so that no token reaches a log line.
    """
    name = "OTEL_EXPORTER_OTLP_METRICS_HEADERS"
    if not environ.get(name):
        name = "OTEL_EXPORTER_OTLP_HEADERS"
    headers: dict[str, str] = {}
    for position, item in enumerate(re.split(r"[ \t]*,[ \t]*", environ.get(name, "")), 1):
        if not item:
            continue
        where = f"{name}: header {position}"
        if not _ENV_ITEM.match(item):
            raise OtlpSetupError(f"{where}: expected key=value with a valid HTTP header name "
                                 "and the value %-encoded")
        key, _, value = item.partition("=")
        key = unquote(key).strip().lower()
        if not _TOKEN.match(key):
            raise OtlpSetupError(f"{where}: the header name is not an HTTP token once "
                                 "%-decoded")
        decoded = unquote(value).strip()
        problem = _value_problem(decoded)
        if problem:
            raise OtlpSetupError(f"{where} ({key!r}): {problem}")
        headers[key] = decoded
    return headers


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


_TLS_FILES = (("certificate", "CERTIFICATE"), ("client_certificate", "CLIENT_CERTIFICATE"),
              ("client_key", "CLIENT_KEY"))


def _tls_files(settings: OtlpSettings, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Each TLS file in use: name -> (path, where it came from).

    The setting, else ``OTEL_EXPORTER_OTLP_METRICS_<NAME>``, else
    ``OTEL_EXPORTER_OTLP_<NAME>``: the files the SDK would otherwise open at
    the first export.
    """
    out: dict[str, tuple[str, str]] = {}
    for name, var in _TLS_FILES:
        value = getattr(settings, name)
        if value:
            out[name] = (value, _PREFIX + name)
            continue
        for env in (f"OTEL_EXPORTER_OTLP_METRICS_{var}", f"OTEL_EXPORTER_OTLP_{var}"):
            if environ.get(env, "").strip():
                out[name] = (environ[env].strip(), env)
                break
    return out


def _no_password() -> bytes:
    return b""  # never let OpenSSL prompt on a terminal for an encrypted key


def _load_tls(settings: OtlpSettings, environ: Mapping[str, str],
              protocol: str) -> dict[str, bytes]:
    """The PEM files named by the settings or variables, read and checked to be loadable."""
    files = _tls_files(settings, environ)
    data: dict[str, bytes] = {}
    for name, (path, origin) in files.items():
        try:
            data[name] = read_bytes(path, origin)
        except FileError as exc:
            raise OtlpSetupError(str(exc)) from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if "certificate" in data:
        path, origin = files["certificate"]
        try:
            context.load_verify_locations(cadata=data["certificate"].decode("ascii"))
        except (ssl.SSLError, ValueError) as exc:
            raise OtlpSetupError(
                f"{origin} {path}: not a PEM CA certificate bundle ({_ssl_reason(exc)})"
            ) from None
    if "client_key" in data and "client_certificate" not in data:
        path, origin = files["client_key"]
        raise OtlpSetupError(f"{origin} {path}: a client key needs a client certificate "
                             "(otlp_client_certificate)")
    if protocol == GRPC and "client_certificate" in data and "client_key" not in data:
        path, origin = files["client_certificate"]
        raise OtlpSetupError(f"{origin} {path}: gRPC needs the client key in a file of its own "
                             "(otlp_client_key)")
    if "client_certificate" in data:
        cert, cert_origin = files["client_certificate"]
        key, key_origin = files.get("client_key", (None, None))
        try:
            context.load_cert_chain(cert, key, password=_no_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            also = f" with {key_origin} {key}" if key else " (no client key given)"
            raise OtlpSetupError(
                f"{cert_origin} {cert}{also}: not a usable PEM certificate and unencrypted "
                f"private key ({_ssl_reason(exc)})"
            ) from None
    return data


def _ssl_reason(exc: Exception) -> str:
    """OpenSSL's reason, without its source location."""
    if isinstance(exc, UnicodeDecodeError):
        return "not PEM text"
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.strerror:
        return exc.strerror
    text = str(exc.args[-1]) if exc.args else str(exc)
    text = re.sub(r"^\[[^]]*\]\s*|\s*\(_ssl\.c:\d+\)$", "", " ".join(text.split()))
    if text == "PEM lib":
        return "not PEM, or the key is encrypted"
    return text or exc.__class__.__name__


def _endpoint(settings: OtlpSettings, environ: Mapping[str, str], protocol: str) -> None:
    """The endpoint in use is a URL (or host:port for gRPC): refused here, not at each export."""
    if settings.endpoint:
        endpoint, origin = settings.endpoint, "otlp_endpoint"
    else:
        origin = next((v for v in ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                                   "OTEL_EXPORTER_OTLP_ENDPOINT") if environ.get(v, "").strip()),
                      None)
        if origin is None:
            return
        endpoint = environ[origin]
    try:
        parse_endpoint(endpoint)
    except ValueError as exc:
        raise OtlpSetupError(f"{origin}: {exc}") from None
    if protocol == HTTP and "://" not in endpoint:
        raise OtlpSetupError(f"{origin}: http/protobuf needs a URL such as "
                             f"http://collector:4318, got {endpoint.strip()!r}")


def validate(settings: OtlpSettings, environ: Mapping[str, str]) -> None:
    """Everything :func:`build_exporter` checks, without building it (for ``check``)."""
    protocol = resolve_protocol(settings, environ)
    _endpoint(settings, environ, protocol)
    _env_headers(environ)
    if settings.headers_file:
        read_headers_file(settings.headers_file)
    _load_tls(settings, environ, protocol)


def build_exporter(settings: OtlpSettings, environ: Mapping[str, str]) -> MetricExporter:
    """The SDK exporter for the chosen protocol, with partial-success reporting."""
    protocol = resolve_protocol(settings, environ)
    _endpoint(settings, environ, protocol)
    env_headers = _env_headers(environ)
    headers: dict[str, str] | None = None
    if settings.headers_file:
        headers = {**env_headers, **read_headers_file(settings.headers_file)}
    tls = _load_tls(settings, environ, protocol)
    try:
        exporter = _sdk_exporter(settings, protocol, headers, tls)
    except Exception as exc:  # the SDK reads OTEL_* variables of its own here, and may refuse
        raise OtlpSetupError(
            f"OTLP exporter: {' '.join(str(exc).split()) or exc.__class__.__name__}"
        ) from None
    report_partial_success(exporter)
    return exporter


def grpc_transport(settings: OtlpSettings, tls: Mapping[str, bytes]) -> tuple[Any, Any]:
    """The gRPC channel credentials (None: the SDK's default) and compression (None: the
    SDK reads its variables) for the settings; shared by the metrics and logs exporters."""
    import grpc

    credentials = None
    if settings.certificate or settings.client_certificate:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.get("certificate"),
            private_key=tls.get("client_key"),
            certificate_chain=tls.get("client_certificate"),
        )
    compression = None
    if settings.compression is not None:
        compression = (grpc.Compression.Gzip if settings.compression == "gzip"
                       else grpc.Compression.NoCompression)
    return credentials, compression


def _sdk_exporter(settings: OtlpSettings, protocol: str, headers: dict[str, str] | None,
                  tls: Mapping[str, bytes]) -> MetricExporter:
    compression = settings.compression
    temporality = _temporality(settings.temporality)
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        credentials, grpc_compression = grpc_transport(settings, tls)
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
    settings: OtlpSettings, node: Resource, environ: Mapping[str, str],
    source: CollectingReader | None = None,
) -> MetricReader:
    """The reader pushing over OTLP (interval: setting, else OTEL_METRIC_EXPORT_INTERVAL).

    With a ``source`` and a cumulative exporter, it pushes the source's
    collections (:class:`~otel_gpu.export.push.OtlpPush`: one SDK collection
    per cycle for Prometheus and OTLP); otherwise, for delta temporality, it is
    the SDK's periodic reader, collecting by itself.
    """
    exporter = build_exporter(settings, environ)
    shared = source is not None and cumulative(exporter)
    if shared:  # the same series each push: their attributes encoded once
        from otel_gpu.export.otlp_encode import use_cached_encoding  # protobuf: OTLP only

        use_cached_encoding(exporter)
    if settings.pod_identity == RESOURCE:
        exporter = PodResourceExporter(exporter, node)
    if shared:
        return OtlpPush(exporter, source, interval_s=settings.interval,
                        timeout_s=settings.timeout, environ=environ)
    interval_ms = settings.interval * 1000 if settings.interval is not None else None
    timeout_ms = settings.timeout * 1000 if settings.timeout is not None else None
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=interval_ms, export_timeout_millis=timeout_ms
    )


_REGROUP_CACHE = 65536
"""Resources and stripped attribute sets the regrouping keeps, at most (then starts over)."""
_NO_ATTRIBUTES: Mapping[str, Any] = {}


class PodResourceExporter(MetricExporter):
    """Sends each pod's (and each HPC job's) data points under a Resource naming it.

    A point carrying a pod and a job (Slurm inside Kubernetes) goes under one
    Resource naming both.
    """

    def __init__(
        self, inner: MetricExporter, node: Resource,
        keys: Sequence[str] = WORKLOAD_ATTRIBUTES,
    ) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner = inner
        self._node = node
        self._keys = tuple(keys)
        # The same pods, the same series, push after push: each pod's Resource and each
        # series' attributes without the pod are made once. Bounded; only the exporting
        # thread uses them.
        self._resources: dict[tuple, tuple[Resource, Resource]] = {}
        self._stripped: dict[int, tuple[Any, tuple, dict[str, Any]]] = {}

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return self._inner.export(self.regroup(metrics_data), timeout_millis=timeout_millis)

    def _split(self, attrs: Any) -> tuple[tuple, dict[str, Any] | None]:
        """The point's pod key, and its attributes without the pod (None: no pod)."""
        known = self._stripped.get(id(attrs))
        if known is not None and known[0] is attrs:
            return known[1], known[2]
        key = tuple(attrs.get(k) for k in self._keys)
        if not any(v is not None for v in key):
            return (), None
        stripped = {k: v for k, v in attrs.items() if k not in self._keys}
        if len(self._stripped) >= _REGROUP_CACHE:
            self._stripped.clear()
        self._stripped[id(attrs)] = (attrs, key, stripped)  # holding attrs keeps its id
        return key, stripped

    def _resource(self, base: Resource, key: tuple) -> Resource:
        """The node's Resource plus the pod's (or job's) attributes."""
        known = self._resources.get((id(base), key))
        if known is not None and known[0] is base:
            return known[1]
        if len(self._resources) >= _REGROUP_CACHE:
            self._resources.clear()
        pod = {k: v for k, v in zip(self._keys, key, strict=True) if v is not None}
        resource = Resource({**dict(base.attributes), **pod}, base.schema_url)
        self._resources[(id(base), key)] = (base, resource)  # holding base keeps its id
        return resource

    def regroup(self, data: MetricsData) -> MetricsData:
        out: list[ResourceMetrics] = []
        for rm in data.resource_metrics:
            # pod key -> scope -> metric name -> (metric, points)
            groups: dict[tuple, dict[Any, dict[str, tuple[Any, list]]]] = {}
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
                resource = self._resource(rm.resource, key) if key else rm.resource
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
