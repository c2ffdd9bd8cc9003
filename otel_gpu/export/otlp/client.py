"""OTLP metrics sent by otel-gpu itself: its encoder, over gRPC or HTTP, as the SDK sends them.

:class:`OtlpMetricExporter` is a public :class:`MetricExporter`: it encodes
each export with :class:`~otel_gpu.export.otlp.encode.Encoder` (each attribute
set once, the request's bytes sent as written) and calls the OTLP
``MetricsService/Export`` itself, so it reads the backend's reply (partial
success is logged) and needs no part of the SDK's exporters. It keeps their
rules: up to six attempts within the export's deadline, retrying what the
specification calls transient (gRPC ``UNAVAILABLE`` and kin, HTTP 429, 502,
503, 504, a refused connection) after the server's delay or an exponential
backoff with jitter, a reconnection after the first ``UNAVAILABLE``, and the
``OTEL_EXPORTER_OTLP_[METRICS_]*`` variables the SDK's exporters read
(:func:`target`). Its failure lines are limited to one per message and
window, as the library lines are (:func:`otel_gpu._log.library_window`).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import math
import random
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import urlparse

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from otel_gpu import __version__
from otel_gpu._log import LogLimiter, library_window
from otel_gpu.export.collected import CUMULATIVE
from otel_gpu.export.otlp.encode import Encoder
from otel_gpu.export.otlp.ports import mismatch
from otel_gpu.export.otlp.transport import (
    GRPC,
    METRICS,
    OtlpSettings,
    Transport,
    env_headers,
    tls_files,
    url,
    variable,
)

if TYPE_CHECKING:
    import grpc
    import requests

log = logging.getLogger(__name__)

USER_AGENT = f"otel-gpu/{__version__}"
MAX_ATTEMPTS = 6
DEFAULT_TIMEOUT_S = 10.0
EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
GRPC_RETRYABLE = ("CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED",
                  "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS")
HTTP_RETRYABLE = frozenset({429, 502, 503, 504})
RETRY_INFO = "google.rpc.retryinfo-bin"
COMPRESSIONS = ("gzip", "deflate", "none")


@dataclass(frozen=True)
class Target:
    """Everything one exporter needs to reach the backend, resolved once."""

    protocol: str
    url: str
    """The HTTP URL, or the gRPC endpoint as given (its host:port is :attr:`authority`)."""
    headers: Mapping[str, str]
    timeout_s: float
    compression: str
    """gzip, deflate or none."""
    insecure: bool = False
    """gRPC: plaintext instead of TLS."""
    tls: Mapping[str, bytes] = field(default_factory=dict)
    """The PEM files' contents (certificate, client_certificate, client_key)."""
    tls_paths: Mapping[str, str] = field(default_factory=dict)
    """The same files' paths (HTTP: requests reads them)."""
    retryable: frozenset[str] = frozenset(GRPC_RETRYABLE)
    """gRPC status code names retried."""

    @property
    def authority(self) -> str:
        """The gRPC channel's target: the URL's host:port, or the endpoint as given."""
        return urlparse(self.url).netloc or self.url


def _first(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of the metrics' variable, else the generic one; None: neither set."""
    for var in (variable(METRICS, name), f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(var, "").strip()
        if value:
            return var, value
    return None


def target(transport: Transport, environ: Mapping[str, str]) -> Target:
    """The metrics' target: the transport's settings, else the variables the SDK's exporters
    read, else their defaults. A bad variable is a ValueError naming it."""
    settings: OtlpSettings = transport.settings
    where = url(transport, environ, METRICS)
    headers = transport.headers if transport.headers is not None else env_headers(environ)
    timeout = settings.timeout
    if timeout is None:
        found = _first(environ, "TIMEOUT")
        timeout = DEFAULT_TIMEOUT_S if found is None else _seconds(*found)
    compression = settings.compression
    if compression is None:
        found = _first(environ, "COMPRESSION")
        compression = "none" if found is None else found[1].lower()
        if compression not in COMPRESSIONS:
            raise ValueError(f"{found[0] if found else 'compression'}: unsupported compression "
                             f"{compression!r}; use gzip, deflate or none")
    paths = {name: path for name, (path, _) in tls_files(settings, environ).items()}
    if transport.protocol != GRPC:
        return Target(transport.protocol, where, headers, timeout, compression,
                      tls=transport.tls, tls_paths=paths)
    return Target(transport.protocol, where, headers, timeout, compression,
                  insecure=_insecure(settings.insecure, where, environ),
                  tls=transport.tls, tls_paths=paths, retryable=_retryable(environ))


def _seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive number of seconds, got {raw[:40]!r}")
    return value


def _insecure(setting: bool | None, where: str, environ: Mapping[str, str]) -> bool:
    """As the SDK's gRPC exporter decides: the setting, else the metrics' variable; an https
    URL is TLS whatever they say; else the generic variable, else plaintext for http://."""
    insecure = setting
    own = environ.get(variable(METRICS, "INSECURE"), "").strip()
    if insecure is None and own:
        insecure = own.lower() == "true"
    scheme = urlparse(where).scheme
    if scheme == "https":
        return False
    if insecure is None:
        generic = environ.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip()
        insecure = generic.lower() == "true" if generic else scheme == "http"
    return insecure


def _retryable(environ: Mapping[str, str]) -> frozenset[str]:
    name = "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"
    raw = environ.get(name, "").strip()
    if not raw:
        return frozenset(GRPC_RETRYABLE)
    import grpc

    codes = frozenset(c.strip().upper() for c in raw.split(",") if c.strip())
    unknown = sorted(codes - {code.name for code in grpc.StatusCode})
    if unknown:
        raise ValueError(f"{name}: unknown gRPC status code {unknown[0][:40]!r}")
    return codes


def temporality(name: str | None, environ: Mapping[str, str]
                ) -> dict[type, AggregationTemporality]:
    """Each instrument type's temporality: the setting (cumulative, delta), else
    ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` (lowmemory too), else cumulative."""
    from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter

    if name is None:
        name = environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "").strip()
    name = name.lower() or "cumulative"
    deltas: tuple[type, ...] = ()
    if name == "delta":
        deltas = (Counter, ObservableCounter, Histogram)
    elif name == "lowmemory":
        deltas = (Counter, Histogram)
    return {kind: AggregationTemporality.DELTA if kind in deltas else cumulative
            for kind, cumulative in CUMULATIVE.items()}


# --- one attempt ---------------------------------------------------------------------------

class Attempt(NamedTuple):
    """What one send came to."""

    ok: bool
    reason: str = ""
    retryable: bool = False
    delay: float | None = None
    """The server's retry delay, when it gave one."""
    reconnect: bool = False
    """The channel should be made anew before the next attempt (gRPC UNAVAILABLE)."""


class Sender(Protocol):
    """One transport's send of an encoded ``ExportMetricsServiceRequest``."""

    def prepare(self, body: bytes) -> bytes:
        """The request as sent (compressed, for HTTP), once for all the attempts."""
        ...

    def send(self, body: bytes, timeout_s: float) -> Attempt: ...
    def reconnect(self) -> None: ...
    def close(self) -> None: ...


class GrpcSender:
    """``MetricsService/Export`` on a gRPC channel, the request's bytes sent as they are."""

    def __init__(self, target: Target) -> None:
        import grpc

        self._grpc = grpc
        self._target = target
        self._metadata = tuple(target.headers.items())
        self._compression = {"gzip": grpc.Compression.Gzip,
                             "deflate": grpc.Compression.Deflate}.get(
            target.compression, grpc.Compression.NoCompression)
        self._credentials = None if target.insecure else grpc.ssl_channel_credentials(
            root_certificates=target.tls.get("certificate"),
            private_key=target.tls.get("client_key"),
            certificate_chain=target.tls.get("client_certificate"))
        self._channel: grpc.Channel | None = None
        self._call: Any = None
        self.reconnect()

    def prepare(self, body: bytes) -> bytes:
        """As it is: the channel compresses."""
        return body

    def reconnect(self) -> None:
        grpc = self._grpc
        self.close()
        options = (("grpc.primary_user_agent", USER_AGENT),)
        authority = self._target.authority
        if self._credentials is None:
            self._channel = grpc.insecure_channel(authority, options=options,
                                                  compression=self._compression)
        else:
            self._channel = grpc.secure_channel(authority, self._credentials, options=options,
                                                compression=self._compression)
        self._call = self._channel.unary_unary(
            EXPORT_METHOD, request_serializer=None,
            response_deserializer=ExportMetricsServiceResponse.FromString)

    def send(self, body: bytes, timeout_s: float) -> Attempt:
        try:
            response = self._call(body, metadata=self._metadata, timeout=timeout_s)
        except self._grpc.RpcError as error:
            code = error.code()
            name = getattr(code, "name", str(code))
            delay = _retry_info(dict(error.trailing_metadata() or ()).get(RETRY_INFO))
            return Attempt(False, f"{name}: {error.details()}", name in self._target.retryable,
                           delay, reconnect=name == "UNAVAILABLE")
        log_partial(response)
        return Attempt(True)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _retry_info(raw: Any) -> float | None:
    """The delay of a ``google.rpc.RetryInfo`` (its one field, a Duration); None: none."""
    if not isinstance(raw, bytes) or not raw or raw[0] != 0x0A:
        return None
    from google.protobuf.duration_pb2 import Duration

    length, at = 0, 1
    for shift in range(0, 64, 7):  # the field's length, a varint
        if at >= len(raw):
            return None
        length |= (raw[at] & 0x7F) << shift
        at += 1
        if raw[at - 1] < 0x80:
            break
    try:
        delay = Duration.FromString(raw[at:at + length])
    except Exception:  # noqa: BLE001 - an odd reply only loses the server's delay
        return None
    return max(0.0, delay.seconds + delay.nanos / 1e9)


class HttpSender:
    """``POST`` of the request to the OTLP/HTTP URL, on one session (a configured CA beats
    ``REQUESTS_CA_BUNDLE``: :func:`~otel_gpu.export.otlp.transport.explicit_ca_session`)."""

    def __init__(self, target: Target) -> None:
        from otel_gpu.export.otlp.transport import explicit_ca_session

        self._target = target
        self._session: requests.Session = explicit_ca_session()
        paths = target.tls_paths
        if paths.get("certificate"):
            self._session.verify = paths["certificate"]
        if paths.get("client_certificate"):
            key = paths.get("client_key")
            self._session.cert = (paths["client_certificate"], key) if key \
                else paths["client_certificate"]
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT,
                         **target.headers}
        if target.compression != "none" and not any(
                k.lower() == "content-encoding" for k in target.headers):
            self._headers["Content-Encoding"] = target.compression

    def prepare(self, body: bytes) -> bytes:
        if self._target.compression == "gzip":
            return gzip.compress(body, compresslevel=6)
        if self._target.compression == "deflate":
            return zlib.compress(body)
        return body

    def reconnect(self) -> None:
        """Requests makes a connection anew by itself."""

    def send(self, body: bytes, timeout_s: float) -> Attempt:
        import requests

        deadline = time.monotonic() + timeout_s
        for again in (True, False):
            try:
                reply = self._session.post(self._target.url, data=body, headers=self._headers,
                                           timeout=max(timeout_s, 0.001))
            except requests.ConnectionError as exc:
                timeout_s = deadline - time.monotonic()
                if again and timeout_s > 0:
                    continue  # a pooled connection the server had closed: once, at once
                return Attempt(False, " ".join(str(exc).split()), retryable=True)
            except requests.RequestException as exc:
                return Attempt(False, " ".join(str(exc).split()) or type(exc).__name__)
            break
        if 200 <= reply.status_code < 300:
            with contextlib.suppress(Exception):  # an odd body must not fail the export
                log_partial(ExportMetricsServiceResponse.FromString(reply.content))
            return Attempt(True)
        retryable = reply.status_code in HTTP_RETRYABLE
        return Attempt(False, f"HTTP {reply.status_code} {reply.reason or ''}".strip(),
                       retryable, _retry_after(reply.headers.get("Retry-After")) if retryable
                       else None)

    def close(self) -> None:
        self._session.close()


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``: seconds, or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(value.strip())
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return max(0.0, seconds) if math.isfinite(seconds) else None


# --- the exporter ----------------------------------------------------------------------------

_partial_log = LogLimiter(log, 60.0)


def log_partial(response: Any) -> None:
    """Log a reply's partial success (rejected points, or a message)."""
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


class OtlpMetricExporter(MetricExporter):
    """Sends each export to the target, retrying transient failures within its deadline."""

    def __init__(self, target: Target, preferred: Mapping[type, AggregationTemporality],
                 *, encoder: Encoder | None = None, sender: Sender | None = None) -> None:
        super().__init__(preferred_temporality=dict(preferred))
        self.target = target
        self.temporality = dict(preferred)
        """Each instrument type's temporality, as handed to the SDK."""
        self._encoder = encoder or Encoder()
        self._sender: Sender = sender or (
            GrpcSender(target) if target.protocol == GRPC else HttpSender(target))
        self._stopped = threading.Event()
        self._limited = LogLimiter(log, library_window())

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        if self._stopped.is_set():
            self._limited.log("stopped", logging.WARNING, "OTLP exporter already shut down; "
                              "export to %s dropped", self.target.url)
            return MetricExportResult.FAILURE
        body = self._sender.prepare(self._encoder.serialize(metrics_data))
        return self.send(body, min(self.target.timeout_s, timeout_millis / 1000))

    def export_again(self, layout: object, points: Sequence[Any],
                     timeout_millis: float = 10_000) -> MetricExportResult | None:
        """The request last exported for ``layout`` sent again with ``points``' times and
        values, in its points' order (no data objects made for it); None when that request
        is not kept: then :meth:`export` the data."""
        if self._stopped.is_set():
            return None
        body = self._encoder.refill(layout, points)
        if body is None:
            return None
        return self.send(self._sender.prepare(body), min(self.target.timeout_s,
                                                         timeout_millis / 1000))

    def send(self, body: bytes, timeout_s: float) -> MetricExportResult:
        """Up to :data:`MAX_ATTEMPTS` sends of one encoded request within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        where = self.target.url
        for attempt in range(MAX_ATTEMPTS):
            result = self._sender.send(body, max(deadline - time.monotonic(), 0.0))
            found = None if result.ok else mismatch(self.target.protocol, self.target.url,
                                                    result.reason)
            if found is not None:  # the other protocol's port: no retry can help, if proved
                result = Attempt(False, found.reason, result.retryable and not found.proved,
                                 result.delay, result.reconnect)
            if result.ok:
                return MetricExportResult.SUCCESS
            if result.reconnect and attempt == 0:
                self._sender.reconnect()
            backoff = result.delay if result.delay is not None \
                else 2 ** attempt * random.uniform(0.8, 1.2)
            if not result.retryable or attempt + 1 == MAX_ATTEMPTS or self._stopped.is_set() \
                    or backoff > deadline - time.monotonic():
                self._limited.log("failed", logging.ERROR, "Failed to export metrics to %s: %s%s",
                                  where, result.reason,
                                  " (retries and time spent)" if result.retryable else "")
                return MetricExportResult.FAILURE
            self._limited.log("transient", logging.WARNING,
                              "Transient error %s encountered while exporting metrics to %s, "
                              "retrying in %.2fs", result.reason, where, backoff)
            if self._stopped.wait(backoff):
                log.warning("OTLP exporter shutting down: export to %s abandoned", where)
                return MetricExportResult.FAILURE
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing is buffered."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Abandon a retry's wait, close the channel or session; later exports fail."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._sender.close()
