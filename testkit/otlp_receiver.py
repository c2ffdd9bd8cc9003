"""A real OTLP metrics and logs receiver (gRPC and HTTP) for end-to-end tests.

Tests point the collector's ``OTEL_EXPORTER_OTLP_*`` settings at an
:class:`OtlpReceiver`, then assert on what was delivered.  The receiver decodes
the official ``opentelemetry-proto`` messages, records every export attempt
with its transport details, and can be told to fail, answer with partial
success, answer slowly, or go down and come back on the same ports, so that
retry and recovery behaviour can be tested against real sockets.

Logs (``LogsService`` over gRPC, ``POST /v1/logs`` over HTTP) are recorded on
their own (:attr:`OtlpReceiver.log_requests`, :meth:`OtlpReceiver.log_records`)
and always answered with success, so the metrics' recordings and programmed
answers stay as they were.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import ssl
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

ExportMetricsServiceRequest = metrics_service_pb2.ExportMetricsServiceRequest
ExportMetricsServiceResponse = metrics_service_pb2.ExportMetricsServiceResponse
ExportLogsServiceRequest = logs_service_pb2.ExportLogsServiceRequest
ExportLogsServiceResponse = logs_service_pb2.ExportLogsServiceResponse

__all__ = [
    "ExportLogsServiceRequest",
    "ExportMetricsServiceRequest",
    "LogRow",
    "OtlpReceiver",
    "ReceivedRequest",
    "Row",
    "attributes",
    "has_metric",
    "metric_names",
    "resource_groups",
    "rows",
]

# Full gRPC service name, taken from the official descriptor rather than spelled by hand.
_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name
_LOGS_SERVICE = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name
_MAX_MESSAGE = 64 * 1024 * 1024
_BIND_RETRY_S = 3.0

# Answers recorded in ReceivedRequest.answer for accepted requests.
OK = "OK"
PARTIAL_SUCCESS = "PARTIAL_SUCCESS"
ABORTED = "ABORTED"

_GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_HTTP_TO_GRPC: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


# --------------------------------------------------------------------------- decoding helpers


class Row(NamedTuple):
    """One data point, flattened so that tests can filter with plain comprehensions."""

    resource: dict[str, Any]
    scope: str
    metric: str
    unit: str
    kind: str  # "gauge" | "sum" | "histogram" | "exponential_histogram" | "summary"
    monotonic: bool
    temporality: str | None  # "CUMULATIVE" | "DELTA" | "UNSPECIFIED"; None for gauge/summary
    attributes: dict[str, Any]
    value: float  # gauge/sum: the value; histogram-like kinds: the sum


def any_value(value: AnyValue) -> Any:
    """Plain Python value of an OTLP ``AnyValue``."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, which)


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """``KeyValue`` list to a dict, the shape tests compare against."""
    return {kv.key: any_value(kv.value) for kv in kvs}


def _as_request(request: ExportMetricsServiceRequest | ReceivedRequest) -> Any:
    return request.request if isinstance(request, ReceivedRequest) else request


def resource_groups(request: ExportMetricsServiceRequest | ReceivedRequest) -> list[dict[str, Any]]:
    """Resource attributes of each ResourceMetrics, in order (one entry per resource)."""
    return [attributes(rm.resource.attributes) for rm in _as_request(request).resource_metrics]


def _temporality(value: int) -> str:
    name = metrics_pb2.AggregationTemporality.Name(value)
    return name.removeprefix("AGGREGATION_TEMPORALITY_")


def _number(point: metrics_pb2.NumberDataPoint) -> float:
    if point.WhichOneof("value") == "as_int":
        return float(point.as_int)
    return point.as_double


def rows(request: ExportMetricsServiceRequest | ReceivedRequest) -> list[Row]:
    """Every data point of a request as a :class:`Row`."""
    out: list[Row] = []
    for rm in _as_request(request).resource_metrics:
        resource = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                base = (resource, sm.scope.name, m.name, m.unit, kind or "")
                if kind == "gauge":
                    for p in m.gauge.data_points:
                        out.append(Row(*base, False, None, attributes(p.attributes), _number(p)))
                elif kind == "sum":
                    temp = _temporality(m.sum.aggregation_temporality)
                    for p in m.sum.data_points:
                        out.append(
                            Row(
                                *base,
                                m.sum.is_monotonic,
                                temp,
                                attributes(p.attributes),
                                _number(p),
                            )
                        )
                elif kind in ("histogram", "exponential_histogram"):
                    data = getattr(m, kind)
                    temp = _temporality(data.aggregation_temporality)
                    for p in data.data_points:
                        out.append(Row(*base, False, temp, attributes(p.attributes), float(p.sum)))
                elif kind == "summary":
                    for p in m.summary.data_points:
                        out.append(Row(*base, False, None, attributes(p.attributes), float(p.sum)))
    return out


def metric_names(request: ExportMetricsServiceRequest | ReceivedRequest) -> set[str]:
    """Names of all metrics in a request, for quick membership checks."""
    return {
        m.name
        for rm in _as_request(request).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def has_metric(name: str) -> Callable[[ReceivedRequest], bool]:
    """Predicate for :meth:`OtlpReceiver.wait_for`: the request carries metric ``name``."""
    return lambda received: name in metric_names(received)


class LogRow(NamedTuple):
    """One log record, flattened with its Resource and scope."""

    resource: dict[str, Any]
    scope: str
    event_name: str
    severity_number: int
    severity_text: str
    body: Any
    attributes: dict[str, Any]
    time_unix_nano: int


def log_rows(request: ExportLogsServiceRequest) -> list[LogRow]:
    """Every log record of a logs request as a :class:`LogRow`."""
    out: list[LogRow] = []
    for rl in request.resource_logs:
        resource = attributes(rl.resource.attributes)
        for sl in rl.scope_logs:
            for r in sl.log_records:
                out.append(LogRow(resource, sl.scope.name, r.event_name, r.severity_number,
                                  r.severity_text, any_value(r.body), attributes(r.attributes),
                                  r.time_unix_nano))
    return out


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ReceivedRequest:
    """One export attempt as the receiver saw it (accepted or not)."""

    transport: str  # "grpc" | "http"
    request: ExportMetricsServiceRequest
    headers: dict[str, Any]  # lower-cased keys; gRPC "-bin" metadata values stay bytes
    compression: str  # "none" | "gzip" | "deflate": how the payload arrived on the wire
    arrived: float  # time.monotonic() when the request reached the handler
    answer: str  # OK, PARTIAL_SUCCESS, ABORTED, a gRPC code name, or "HTTP <status>"
    client_cert_cn: str | None = None  # common name of a verified client certificate
    content_type: str = "application/x-protobuf"

    @property
    def accepted(self) -> bool:
        """Whether the receiver took the data (what a real backend would have stored)."""
        return self.answer in (OK, PARTIAL_SUCCESS)

    @property
    def gzipped(self) -> bool:
        return self.compression == "gzip"

    def rows(self) -> list[Row]:
        return rows(self.request)

    def metric_names(self) -> set[str]:
        return metric_names(self.request)


@dataclass(frozen=True)
class ReceivedLogs:
    """One logs export as the receiver saw it (always accepted)."""

    transport: str  # "grpc" | "http"
    request: ExportLogsServiceRequest
    headers: dict[str, Any]
    compression: str
    arrived: float

    def rows(self) -> list[LogRow]:
        return log_rows(self.request)


@dataclass(frozen=True)
class _Failure:
    grpc_code: grpc.StatusCode
    http_status: int
    retry_after: float | None
    message: str


@dataclass
class _Answers:
    failures: deque[_Failure] = field(default_factory=deque)
    partial: tuple[int, str] | None = None
    delay: float = 0.0


class _CertFiles(Protocol):
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


# --------------------------------------------------------------------------- HTTP side


class _HttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that can do TLS off the accept thread and drop live connections."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        receiver: OtlpReceiver,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.receiver = receiver
        self.ssl_context = ssl_context
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _HttpHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        if self.ssl_context is not None:
            # Handshake later, in the connection's own thread, so a bad client cannot stall accept.
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut keep-alive connections so that "down" really means down for pooled clients."""
        with self._connections_lock:
            live = list(self._connections)
        for conn in live:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn, socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        self.receiver._note_error(f"http {client_address}: {type(exc).__name__}: {exc}")


class _HttpHandler(BaseHTTPRequestHandler):
    """Answers ``POST /v1/metrics`` as an OTLP/HTTP receiver does."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's pooled session expects
    timeout = 30
    server: _HttpServer

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: the recorded requests are the log."""

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/plain",
        extra: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _reject(self, status: int, why: str) -> None:
        self.server.receiver._note_error(f"http {self.command} {self.path}: {status} {why}")
        self._reply(status, why.encode())

    def do_POST(self) -> None:
        arrived = time.monotonic()
        receiver = self.server.receiver
        path = urlsplit(self.path).path
        if path not in ("/v1/metrics", "/v1/logs"):
            self._reject(404, "only /v1/metrics and /v1/logs are served")
            return
        raw = self._read_body()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                payload = gzip.decompress(raw)
            elif encoding == "deflate":
                payload = _inflate(raw)
            elif encoding in ("identity", "none", ""):
                payload, encoding = raw, "none"
            else:
                self._reject(415, f"unsupported Content-Encoding {encoding}")
                return
        except (OSError, zlib.error, EOFError) as exc:
            self._reject(400, f"cannot decompress {encoding} body: {exc}")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if path == "/v1/logs":
            self._logs(payload, encoding, content_type, arrived)
            return
        try:
            if content_type == "application/x-protobuf":
                request = ExportMetricsServiceRequest.FromString(payload)
            elif content_type == "application/json":
                request = json_format.Parse(
                    payload, ExportMetricsServiceRequest(), ignore_unknown_fields=True
                )
            else:
                self._reject(415, f"unsupported Content-Type {content_type!r}")
                return
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as exc:
            self._reject(400, f"cannot decode ExportMetricsServiceRequest: {exc}")
            return

        peer = None
        if isinstance(self.connection, ssl.SSLSocket):
            peer = _common_name(self.connection.getpeercert())
        headers: dict[str, Any] = {}
        for key, value in self.headers.items():
            k = key.lower()
            headers[k] = f"{headers[k]}, {value}" if k in headers else value

        def record(answer: str) -> None:
            receiver._record(
                ReceivedRequest(
                    transport="http",
                    request=request,
                    headers=headers,
                    compression=encoding,
                    arrived=arrived,
                    answer=answer,
                    client_cert_cn=peer,
                    content_type=content_type,
                )
            )

        failure, partial, stopped = receiver._decide()
        if stopped:
            record(ABORTED)
            self.close_connection = True  # vanish without an answer, like a crashed backend
            return
        if failure is not None:
            record(f"HTTP {failure.http_status}")
            status = status_pb2.Status(code=failure.grpc_code.value[0], message=failure.message)
            extra = {}
            if failure.retry_after is not None:
                extra["Retry-After"] = _format_seconds(failure.retry_after)
            self._reply(
                failure.http_status,
                _encode(status, content_type),
                content_type,
                extra,
            )
            return
        response = ExportMetricsServiceResponse()
        if partial is not None:
            response.partial_success.rejected_data_points = partial[0]
            response.partial_success.error_message = partial[1]
        record(PARTIAL_SUCCESS if partial is not None else OK)
        self._reply(200, _encode(response, content_type), content_type)


    def _logs(self, payload: bytes, encoding: str, content_type: str, arrived: float) -> None:
        try:
            if content_type == "application/x-protobuf":
                request = ExportLogsServiceRequest.FromString(payload)
            elif content_type == "application/json":
                request = json_format.Parse(payload, ExportLogsServiceRequest(),
                                            ignore_unknown_fields=True)
            else:
                self._reject(415, f"unsupported Content-Type {content_type!r}")
                return
        except (DecodeError, json_format.ParseError, UnicodeDecodeError) as exc:
            self._reject(400, f"cannot decode ExportLogsServiceRequest: {exc}")
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        self.server.receiver._record_logs(
            ReceivedLogs("http", request, headers, encoding, arrived))
        self._reply(200, _encode(ExportLogsServiceResponse(), content_type), content_type)


def _encode(message: Any, content_type: str) -> bytes:
    if content_type == "application/json":
        return json_format.MessageToJson(message).encode()
    return message.SerializeToString()


def _inflate(raw: bytes) -> bytes:
    """HTTP "deflate" is zlib-wrapped by the spec, but raw deflate is seen in the wild."""
    try:
        return zlib.decompress(raw)
    except zlib.error:
        return zlib.decompress(raw, -zlib.MAX_WBITS)


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:.3f}"


def _common_name(cert: Mapping[str, Any] | None) -> str | None:
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# --------------------------------------------------------------------------- gRPC side


def _sniff_grpc_payload(raw: bytes) -> tuple[str, bytes]:
    """Undo per-message compression ourselves, so the wire encoding can be recorded.

    The server runs with ``grpc.per_message_decompression`` off: gRPC core then
    hands over the payload as sent and strips ``grpc-encoding`` from the
    metadata.  A serialized ExportMetricsServiceRequest starts with field 1's
    tag (0x0a) or is empty, so gzip's magic and a zlib header cannot be mistaken.
    """
    if raw[:2] == b"\x1f\x8b":
        return "gzip", gzip.decompress(raw)
    if len(raw) >= 2 and (raw[0] & 0x0F) == 8 and ((raw[0] << 8) | raw[1]) % 31 == 0:
        return "deflate", zlib.decompress(raw)
    return "none", raw


# --------------------------------------------------------------------------- the receiver


class OtlpReceiver:
    """OTLP metrics receiver on 127.0.0.1 that records what arrives and answers as told.

    Ports are chosen by the OS on the first :meth:`start` and kept for the
    receiver's lifetime, so :meth:`stop` then :meth:`start` brings it back where
    exporters expect it.  Use as a context manager, or call ``start()``/``stop()``.
    """

    def __init__(
        self,
        *,
        grpc: bool = True,
        http: bool = True,
        tls_cert_file: Path | str | None = None,
        tls_key_file: Path | str | None = None,
        client_ca_file: Path | str | None = None,
        require_client_cert: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        if not (grpc or http):
            raise ValueError("enable at least one of grpc/http")
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if require_client_cert and (client_ca_file is None or tls_cert_file is None):
            raise ValueError("require_client_cert needs TLS and a client_ca_file")
        self._want_grpc = grpc
        self._want_http = http
        self._cert = Path(tls_cert_file) if tls_cert_file else None
        self._key = Path(tls_key_file) if tls_key_file else None
        self._client_ca = Path(client_ca_file) if client_ca_file else None
        self._require_client_cert = require_client_cert
        self._host = host
        self._trust: _CertFiles | None = None  # set by with_tls(), feeds env()

        self._cond = threading.Condition()
        self._attempts: list[ReceivedRequest] = []
        self._logs: list[ReceivedLogs] = []
        self._errors: list[str] = []
        self._version = 0
        self._in_flight = 0
        self._answers = _Answers()

        self._lifecycle = threading.Lock()
        self._running = False
        self._stop_event = threading.Event()
        self._grpc_server: grpc.Server | None = None
        self._grpc_pool: futures.ThreadPoolExecutor | None = None
        self._grpc_port: int | None = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None
        self._http_port: int | None = None

    @classmethod
    def with_tls(cls, certs: _CertFiles, *, mtls: bool = False, **kwargs: Any) -> OtlpReceiver:
        """Receiver using a :class:`tests.support.certs.CertBundle` (mTLS: client certs needed)."""
        receiver = cls(
            tls_cert_file=certs.server_cert,
            tls_key_file=certs.server_key,
            client_ca_file=certs.ca_cert if mtls else None,
            require_client_cert=mtls,
            **kwargs,
        )
        receiver._trust = certs
        return receiver

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def tls(self) -> bool:
        return self._cert is not None

    def start(self) -> OtlpReceiver:
        """Serve (again), on the ports of the first start; no-op while running."""
        with self._lifecycle:
            if self._running:
                return self
            self._stop_event = threading.Event()
            try:
                if self._want_grpc:
                    self._grpc_server, self._grpc_port = self._start_grpc(self._grpc_port or 0)
                if self._want_http:
                    self._start_http(self._http_port or 0)
            except BaseException:
                self._shutdown_servers()
                raise
            self._running = True
        return self

    def stop(self) -> None:
        """Go down hard: close listeners and live connections, abort requests in flight."""
        with self._lifecycle:
            if not self._running:
                return
            self._running = False
            self._shutdown_servers()

    def _shutdown_servers(self) -> None:
        # Listeners close first, so a client retrying at once is refused rather than let in.
        grpc_stopped = self._grpc_server.stop(None) if self._grpc_server is not None else None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
        self._stop_event.set()  # held (delayed) requests now end without an answer
        if grpc_stopped is not None:
            grpc_stopped.wait(10)
        self._grpc_server = None
        if self._grpc_pool is not None:
            self._grpc_pool.shutdown(wait=False)
            self._grpc_pool = None
        if self._http_server is not None:
            self._http_server.drop_connections()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(10)
            self._http_thread = None

    def _start_grpc(self, port: int) -> tuple[grpc.Server, int]:
        self._grpc_pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-grpc")
        server = grpc.server(
            self._grpc_pool,
            options=[
                # Fail loudly instead of silently sharing a port with another listener.
                ("grpc.so_reuseport", 0),
                ("grpc.per_message_decompression", 0),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ],
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._grpc_export,
            request_deserializer=None,  # raw bytes: see _sniff_grpc_payload
            response_serializer=ExportMetricsServiceResponse.SerializeToString,
        )
        logs_handler = grpc.unary_unary_rpc_method_handler(
            self._grpc_export_logs,
            request_deserializer=None,
            response_serializer=ExportLogsServiceResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE, {"Export": handler}),
             grpc.method_handlers_generic_handler(_LOGS_SERVICE, {"Export": logs_handler}))
        )
        address = f"{self._host}:{port}"
        deadline = time.monotonic() + _BIND_RETRY_S
        while True:
            try:
                if self._cert is not None and self._key is not None:
                    creds = grpc.ssl_server_credentials(
                        [(self._key.read_bytes(), self._cert.read_bytes())],
                        root_certificates=self._client_ca.read_bytes() if self._client_ca else None,
                        require_client_auth=self._require_client_cert,
                    )
                    bound = server.add_secure_port(address, creds)
                else:
                    bound = server.add_insecure_port(address)
                if bound:
                    break
                error: Exception = RuntimeError(f"gRPC could not bind {address}")
            except RuntimeError as exc:
                error = exc
            if port == 0 or time.monotonic() > deadline:
                raise RuntimeError(f"OTLP receiver: gRPC bind {address} failed: {error}")
            time.sleep(0.05)  # port still held by someone else; retry until the deadline
        server.start()
        return server, bound

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self._cert is None or self._key is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self._cert, self._key)
        if self._client_ca is not None:
            ctx.load_verify_locations(self._client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED if self._require_client_cert else ssl.CERT_OPTIONAL
        return ctx

    def _start_http(self, port: int) -> None:
        deadline = time.monotonic() + _BIND_RETRY_S
        while True:
            try:
                server = _HttpServer((self._host, port), self, self._ssl_context())
                break
            except OSError as exc:
                if port == 0 or time.monotonic() > deadline:
                    raise RuntimeError(f"OTLP receiver: HTTP bind {port} failed: {exc}") from exc
                time.sleep(0.05)  # port still held by someone else; retry until the deadline
        self._http_server = server
        self._http_port = server.server_address[1]
        self._http_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="otlp-http",
            daemon=True,
        )
        self._http_thread.start()

    # ----------------------------------------------------------------- addresses

    def _port(self, port: int | None, what: str) -> int:
        if port is None:
            raise RuntimeError(f"{what} is not enabled or the receiver was never started")
        return port

    @property
    def grpc_port(self) -> int:
        return self._port(self._grpc_port, "gRPC")

    @property
    def http_port(self) -> int:
        return self._port(self._http_port, "HTTP")

    @property
    def _scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def grpc_target(self) -> str:
        """``host:port`` for a raw ``grpc`` channel."""
        return f"{self._host}:{self.grpc_port}"

    @property
    def grpc_endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT with protocol grpc; the scheme selects TLS."""
        return f"{self._scheme}://{self.grpc_target}"

    @property
    def http_endpoint(self) -> str:
        """Base URL for OTEL_EXPORTER_OTLP_ENDPOINT; the SDK appends ``/v1/metrics``."""
        return f"{self._scheme}://{self._host}:{self.http_port}"

    @property
    def http_metrics_url(self) -> str:
        """Full URL, for OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or the exporter's ``endpoint=``."""
        return f"{self.http_endpoint}/v1/metrics"

    def env(
        self,
        protocol: str = "grpc",
        *,
        metrics_specific: bool = False,
        client_cert: bool | None = None,
    ) -> dict[str, str]:
        """``OTEL_EXPORTER_OTLP_*`` variables that point an exporter at this receiver.

        ``protocol`` is ``grpc`` or ``http/protobuf``.  With a receiver from
        :meth:`with_tls`, the CA (and, for mTLS or ``client_cert=True``, the
        client certificate and key) are included too.
        """
        prefix = "OTEL_EXPORTER_OTLP_METRICS_" if metrics_specific else "OTEL_EXPORTER_OTLP_"
        if protocol == "grpc":
            endpoint = self.grpc_endpoint
        elif protocol == "http/protobuf":
            endpoint = self.http_metrics_url if metrics_specific else self.http_endpoint
        else:
            raise ValueError(f"unknown OTLP protocol {protocol!r}")
        env = {prefix + "PROTOCOL": protocol, prefix + "ENDPOINT": endpoint}
        if self._trust is not None:
            env[prefix + "CERTIFICATE"] = str(self._trust.ca_cert)
            if client_cert if client_cert is not None else self._require_client_cert:
                env[prefix + "CLIENT_CERTIFICATE"] = str(self._trust.client_cert)
                env[prefix + "CLIENT_KEY"] = str(self._trust.client_key)
        return env

    # ----------------------------------------------------------------- programmed answers

    def fail_next(
        self,
        n: int,
        status: grpc.StatusCode | int = grpc.StatusCode.UNAVAILABLE,
        *,
        retry_after: float | None = None,
        message: str = "failure injected by the test receiver",
    ) -> None:
        """Fail the next ``n`` requests (either transport), after any queued failures.

        ``status`` is a ``grpc.StatusCode`` or an HTTP status; the other
        transport gets the mapped equivalent (UNAVAILABLE <-> 503,
        RESOURCE_EXHAUSTED <-> 429, INVALID_ARGUMENT <-> 400, ...).
        ``retry_after`` adds gRPC RetryInfo / HTTP ``Retry-After``, which the
        SDK uses instead of its 1 s, 2 s, 4 s ... backoff.
        """
        if isinstance(status, grpc.StatusCode):
            code, http_status = status, _GRPC_TO_HTTP.get(status, 500)
        else:
            code, http_status = _HTTP_TO_GRPC.get(int(status), grpc.StatusCode.UNKNOWN), int(status)
        failure = _Failure(code, http_status, retry_after, message)
        with self._cond:
            self._answers.failures.extend([failure] * n)

    def partial_success(self, rejected_data_points: int, message: str = "") -> None:
        """Answer later requests with ``partial_success`` set; ``(0, "")`` turns it off."""
        with self._cond:
            self._answers.partial = (
                (rejected_data_points, message) if rejected_data_points or message else None
            )

    def delay(self, seconds: float) -> None:
        """Wait this long before answering later requests (cut short by :meth:`stop`)."""
        with self._cond:
            self._answers.delay = max(0.0, seconds)

    def reset_answers(self) -> None:
        """Back to answering every request at once with plain success."""
        with self._cond:
            self._answers = _Answers()

    @property
    def pending_failures(self) -> int:
        with self._cond:
            return len(self._answers.failures)

    @property
    def in_flight(self) -> int:
        """Requests decoded but not answered yet (e.g. held by :meth:`delay`)."""
        with self._cond:
            return self._in_flight

    def _decide(self) -> tuple[_Failure | None, tuple[int, str] | None, bool]:
        """(failure, partial, stopped) for one request; applies the programmed delay first.

        Every call must be followed by one :meth:`_record`, which ends the in-flight count.
        """
        stop_event = self._stop_event
        with self._cond:
            delay = self._answers.delay
            self._in_flight += 1
            self._version += 1
            self._cond.notify_all()
        if delay and stop_event.wait(delay):
            return None, None, True
        if stop_event.is_set():
            return None, None, True
        with self._cond:
            failure = self._answers.failures.popleft() if self._answers.failures else None
            return failure, self._answers.partial, False

    def _grpc_export(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        arrived = time.monotonic()
        try:
            compression, payload = _sniff_grpc_payload(raw)
            request = ExportMetricsServiceRequest.FromString(payload)
        except (DecodeError, OSError, zlib.error, EOFError) as exc:
            self._note_error(f"grpc: cannot decode ExportMetricsServiceRequest: {exc}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode request: {exc}")
        headers = {key.lower(): value for key, value in context.invocation_metadata()}
        names = context.auth_context().get("x509_common_name") or []
        peer = names[0].decode() if names else None

        def record(answer: str) -> None:
            self._record(
                ReceivedRequest(
                    transport="grpc",
                    request=request,
                    headers=headers,
                    compression=compression,
                    arrived=arrived,
                    answer=answer,
                    client_cert_cn=peer,
                )
            )

        failure, partial, stopped = self._decide()
        if stopped:
            record(ABORTED)
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver is stopping")
        if failure is not None:
            record(failure.grpc_code.name)
            if failure.retry_after is not None:
                info = error_details_pb2.RetryInfo()
                info.retry_delay.FromNanoseconds(int(failure.retry_after * 1e9))
                context.set_trailing_metadata(
                    (("google.rpc.retryinfo-bin", info.SerializeToString()),)
                )
            context.abort(failure.grpc_code, failure.message)
        response = ExportMetricsServiceResponse()
        if partial is not None:
            response.partial_success.rejected_data_points = partial[0]
            response.partial_success.error_message = partial[1]
        record(PARTIAL_SUCCESS if partial is not None else OK)
        return response

    def _grpc_export_logs(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        arrived = time.monotonic()
        try:
            compression, payload = _sniff_grpc_payload(raw)
            request = ExportLogsServiceRequest.FromString(payload)
        except (DecodeError, OSError, zlib.error, EOFError) as exc:
            self._note_error(f"grpc: cannot decode ExportLogsServiceRequest: {exc}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode request: {exc}")
        headers = {key.lower(): value for key, value in context.invocation_metadata()}
        self._record_logs(ReceivedLogs("grpc", request, headers, compression, arrived))
        return ExportLogsServiceResponse()

    # ----------------------------------------------------------------- recordings

    def _record_logs(self, received: ReceivedLogs) -> None:
        with self._cond:
            self._logs.append(received)
            self._version += 1
            self._cond.notify_all()

    @property
    def log_requests(self) -> list[ReceivedLogs]:
        """Logs exports received, oldest first; a copy."""
        with self._cond:
            return list(self._logs)

    def log_records(self) -> list[LogRow]:
        """Every log record received, in arrival order."""
        return [row for received in self.log_requests for row in received.rows()]

    def wait_for_logs(
        self, predicate: Callable[[LogRow], bool] | None = None, timeout: float = 10.0,
        *, count: int = 1,
    ) -> list[LogRow]:
        """Block until ``count`` received log records match; return all matches so far."""

        def matches() -> list[LogRow] | None:
            found = [r for r in self.log_records() if predicate is None or predicate(r)]
            return found if len(found) >= count else None

        return self.wait_until(matches, timeout, f"{count} matching log record(s)")

    def _record(self, received: ReceivedRequest) -> None:
        with self._cond:
            self._in_flight -= 1
            self._attempts.append(received)
            self._version += 1
            self._cond.notify_all()

    def _note_error(self, text: str) -> None:
        with self._cond:
            self._errors.append(text)
            self._version += 1
            self._cond.notify_all()

    @property
    def requests(self) -> list[ReceivedRequest]:
        """Accepted requests (OK or partial success), oldest first; a copy."""
        with self._cond:
            return [r for r in self._attempts if r.accepted]

    @property
    def attempts(self) -> list[ReceivedRequest]:
        """Every decoded request, including ones answered with a failure; a copy."""
        with self._cond:
            return list(self._attempts)

    @property
    def errors(self) -> list[str]:
        """Protocol-level problems (bad path, undecodable body, failed TLS handshake)."""
        with self._cond:
            return list(self._errors)

    def clear(self) -> None:
        """Forget recorded requests and errors (programmed answers stay)."""
        with self._cond:
            self._attempts.clear()
            self._logs.clear()
            self._errors.clear()
            self._version += 1

    def wait_for(
        self,
        predicate: Callable[[ReceivedRequest], bool] | None = None,
        timeout: float = 10.0,
        *,
        count: int = 1,
        accepted_only: bool = True,
    ) -> list[ReceivedRequest]:
        """Block until ``count`` recorded requests match; return all matches so far.

        Wakes on each new arrival (no fixed sleeps).  At the deadline, raises
        AssertionError describing everything that did arrive.
        """

        def matches() -> list[ReceivedRequest] | None:
            pool = self.attempts if not accepted_only else self.requests
            found = [r for r in pool if predicate is None or predicate(r)]
            return found if len(found) >= count else None

        return self.wait_until(matches, timeout, f"{count} matching request(s)")

    def wait_until(self, check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
        """Re-evaluate ``check`` on every receiver event until it is truthy; return its value.

        Events are arrivals, errors and requests entering a handler, so a check
        on ``in_flight``, ``errors`` or ``attempts`` needs no polling interval.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                version = self._version
            result = check()
            if result:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"OTLP receiver: timed out after {timeout} s waiting for "
                    f"{what or check}.\n{self.summary()}"
                )
            with self._cond:
                self._cond.wait_for(lambda seen=version: self._version != seen, remaining)

    def wait_for_error(self, contains: str = "", timeout: float = 10.0) -> str:
        """Block until a protocol error mentioning ``contains`` is noted; return it."""
        return self.wait_until(
            lambda: next((e for e in self.errors if contains in e), None),
            timeout,
            f"an error containing {contains!r}",
        )

    def summary(self) -> str:
        """Human-readable list of attempts and errors, for assertion messages."""
        with self._cond:
            attempts = list(self._attempts)
            errors = list(self._errors)
        if not attempts and not errors and not self.log_requests:
            return "nothing arrived"
        start = attempts[0].arrived if attempts else 0.0
        lines = [f"{len(attempts)} attempt(s):"]
        for i, r in enumerate(attempts):
            names = ", ".join(sorted(r.metric_names())) or "-"
            lines.append(
                f"  #{i} +{r.arrived - start:.3f}s {r.transport} {r.answer} "
                f"compression={r.compression} resources={len(r.request.resource_metrics)} "
                f"metrics=[{names}]"
            )
        logs = self.log_requests
        if logs:
            lines.append(f"{len(logs)} logs export(s), "
                         f"{sum(len(r.rows()) for r in logs)} record(s)")
        if errors:
            lines.append(f"{len(errors)} error(s):")
            lines += [f"  {e}" for e in errors[-20:]]
        return "\n".join(lines)
