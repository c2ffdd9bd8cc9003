"""The service's endpoint: ``/metrics``, ``/healthz``, ``/readyz`` and ``/``.

It answers the health probes whatever the exporters (``/health`` as ``/healthz``: the
path dcgm-exporter serves, which probes copied from its chart ask); ``/metrics`` is the
:class:`~otel_gpu.export.seam.Scrape` of the exporter that has one (404
without), chosen by the scraper's ``Accept`` there and gzipped here when the
scraper's ``Accept-Encoding`` allows. The web config's TLS and basic auth
guard it; the server is :mod:`.server`'s, with its bounds against clients that
misbehave.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from otel_gpu import __version__
from otel_gpu._log import describe, where
from otel_gpu.config import Config
from otel_gpu.export.http.connection import BoundedHandler
from otel_gpu.export.http.server import (
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS,
    RESPONSE_TIMEOUT_S,
    BoundedServer,
)
from otel_gpu.export.http.webconfig import WebConfig, load_web_config
from otel_gpu.export.seam import Scrape

if TYPE_CHECKING:
    from otel_gpu.export.http.basic_auth import BasicAuth

ReadyCheck = Callable[[], "tuple[bool, str]"]
"""Whether the collector is ready, and why (what /readyz answers)."""


def web_config(config: Config) -> WebConfig | None:
    """The web config file the settings name, read and checked (None: none named)."""
    return load_web_config(config.web_config_file) if config.web_config_file else None


def validate(config: Config) -> None:
    """Every check of the endpoint's settings ``serve`` makes before it listens: the web
    config file (a :class:`~otel_gpu.export.http.webconfig.WebConfigError` names the key)."""
    web_config(config)

LIVENESS = ("/healthz", "/health")
"""The liveness paths: ours, and dcgm-exporter's."""

LANDING = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>otel-gpu</title></head>
<body>
<h1>otel-gpu</h1>
<p>OpenTelemetry-native NVIDIA GPU metrics collector, version {version}.</p>
<ul>
<li><a href="metrics">/metrics</a>: the metrics, in the format the scraper asks for</li>
<li><a href="healthz">/healthz</a>: liveness</li>
<li><a href="readyz">/readyz</a>: readiness, and why</li>
</ul>
</body>
</html>
"""
"""The page at ``/``: where the collector's paths are, and its version (relative links, so
that they hold behind a proxy's path prefix)."""


class _Handler(BoundedHandler):
    """``/metrics``, ``/healthz``, ``/readyz`` and ``/``; HEAD as GET without the body."""

    server: MetricsServer

    def do_HEAD(self) -> None:
        self.do_GET()  # _send leaves the body out of a HEAD answer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._metrics()
        elif path in LIVENESS:
            self._text(200, "ok\n")
        elif path == "/readyz":
            ready, reason = self.server.readiness()
            self._text(200 if ready else 503, reason.rstrip("\n") + "\n")
        elif path == "/":
            self._send(200, LANDING.format(version=__version__).encode(),
                       "text/html; charset=utf-8")
        else:
            self._text(404, "not found: try /metrics, /healthz or /readyz\n")

    def _metrics(self) -> None:
        server = self.server
        if server.auth:
            from otel_gpu.export.http.basic_auth import AuthBusy  # loaded with the users

            try:
                allowed = server.auth.check(self.headers.get("Authorization"))
            except AuthBusy:
                server.limited.log(
                    "auth-busy", logging.WARNING,
                    "answered 503 to %s: too many password checks at once (wrong passwords?)",
                    self.client_address[0])
                self._text(503, "too many password checks at once; retry\n",
                           (("Retry-After", "1"),))
                return
            if not allowed:
                self._text(401, "unauthorized\n",
                           (("WWW-Authenticate", 'Basic realm="otel-gpu"'),))
                return
        if server.cache is None:
            self._text(404, "no metrics on this listener: it is the health listener, or the "
                            "prometheus exporter is off (see the exporters setting)\n")
            return
        if server.cache.published is not None and not server.cache.published():
            self._text(503, "no sample yet: the first one is being taken; retry\n",
                       (("Retry-After", "1"),))
            return
        try:
            rendered = server.cache.get(self.headers.get("Accept"))
        except Exception as exc:  # noqa: BLE001 - a bug in rendering must not kill the server
            server.limited.log("render", logging.ERROR, "rendering /metrics failed: %s at %s",
                               describe(exc), where(exc))
            self._text(500, "rendering metrics failed; see the collector's log\n")
            return
        accepts_gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
        vary = ("Vary", "Accept, Accept-Encoding")
        extra = (("Content-Encoding", "gzip"), vary) if accepts_gzip else (vary,)
        self._send(200, rendered.gzipped if accepts_gzip else rendered.body,
                   rendered.content_type, extra)


class MetricsServer(BoundedServer):
    """The endpoint: a read of memory per request, behind the web config's TLS and auth.

    ``cache`` is None on the health listener (and with the Prometheus exporter
    off): ``/metrics`` then answers 404.
    """

    def __init__(
        self,
        address: tuple[str, int],
        cache: Scrape | None,
        readiness: ReadyCheck,
        web: WebConfig | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT_S,
        response_timeout: float = RESPONSE_TIMEOUT_S,
    ) -> None:
        self.cache = cache
        self.readiness = readiness
        self.auth: BasicAuth | None = None
        """None without users: bcrypt's checks and hashlib stay unloaded (0.7 MiB)."""
        if web is not None and web.users:
            from otel_gpu.export.http.basic_auth import BasicAuth

            self.auth = BasicAuth(web.users)
        super().__init__(address, _Handler, tls=web.tls if web is not None else None,
                         extra_headers=web.headers if web is not None else (),
                         max_connections=max_connections, head_timeout=head_timeout,
                         response_timeout=response_timeout)
