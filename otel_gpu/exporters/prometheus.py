"""The Prometheus scrape endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

The exposition is rendered once per new snapshot and served from a cache,
so any number of concurrent scrapers cost one render. The cache also
expires after ``max_age`` seconds even without a new snapshot, so that
``otel_gpu_sample_age_seconds`` keeps growing while the driver is stuck.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from otel_gpu._log import LogLimiter
from otel_gpu.exporters.webconfig import BasicAuth, WebConfig

log = logging.getLogger(__name__)

Readiness = Callable[[], "tuple[bool, str]"]

# The classic text format, which every Prometheus version and promtool read.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def new_reader() -> tuple[PrometheusMetricReader, Callable[[], bytes]]:
    """A Prometheus reader on a private registry, and the function rendering it."""
    registry = CollectorRegistry(auto_describe=False)
    # Scope labels (otel_scope_name=...) would repeat one constant on every series.
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    return reader, lambda: generate_latest(registry)


@dataclass(frozen=True)
class _Rendered:
    key: object
    at: float
    body: bytes
    gzipped: bytes


class RenderCache:
    """Renders the body when the snapshot changed or the cache is older than ``max_age``.

    ``render`` produces the whole exposition (the OpenTelemetry registry and
    any naming profiles).
    """

    def __init__(
        self,
        render: Callable[[], bytes],
        snapshot_key: Callable[[], object],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._render = render
        self._key = snapshot_key
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: _Rendered | None = None
        self.renders = 0

    def get(self) -> _Rendered:
        with self._lock:  # one render at a time; waiters reuse its result
            key = self._key()
            now = self._clock()
            cached = self._cached
            if cached is None or cached.key != key or now - cached.at >= self._max_age:
                body = self._render()
                cached = self._cached = _Rendered(key, now, body, gzip.compress(body, 5))
                self.renders += 1
            return cached


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops talking does not hold a thread forever

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._metrics()
            elif path == "/healthz":
                self._text(200, "ok\n")
            elif path == "/readyz":
                ready, reason = self.server.readiness()
                self._text(200 if ready else 503, reason.rstrip("\n") + "\n")
            elif path == "/":
                self._text(200, "otel-gpu: see /metrics, /healthz, /readyz\n")
            else:
                self._text(404, "not found: try /metrics, /healthz or /readyz\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper went away; nothing to answer

    def _metrics(self) -> None:
        auth = self.server.auth
        if auth and not auth.check(self.headers.get("Authorization")):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="otel-gpu"')
            body = b"unauthorized\n"
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.server.cache is None:
            self._text(404, "the prometheus exporter is off (see the exporters setting)\n")
            return
        try:
            rendered = self.server.cache.get()
        except Exception:  # noqa: BLE001 - a bug in rendering must not kill the server
            self.server.limited.log("render", logging.ERROR, "rendering /metrics failed",
                                exc_info=True)
            self._text(500, "rendering metrics failed; see the collector's log\n")
            return
        accepts_gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
        body = rendered.gzipped if accepts_gzip else rendered.body
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        if accepts_gzip:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _text(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer(ThreadingHTTPServer):
    """A small threaded HTTP server; each request is a read of memory only."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # many scrapers at once must not overflow the listen backlog

    def __init__(
        self,
        address: tuple[str, int],
        cache: RenderCache | None,
        readiness: Readiness,
        web: WebConfig | None = None,
    ) -> None:
        self.cache = cache
        self.readiness = readiness
        self.tls = web.tls if web is not None else None
        self.auth = BasicAuth(web.users if web is not None else {})
        self.limited = LogLimiter(log, 60.0)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """With TLS, the handshake runs here, on the request's own thread."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(_Handler.timeout)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.limited.log("tls", logging.WARNING, "TLS handshake with %s failed: %s",
                             client_address[0], exc)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, name="otel-gpu-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(2.0)
        self.server_close()
