"""The Prometheus scrape endpoint: ``/metrics``, ``/healthz`` and ``/readyz``.

The exposition is rendered on the publishing path while someone scrapes: the
pipeline calls :meth:`RenderCache.refresh` after each new sample and each pod
change, so a scrape finds a body already rendered (and gzipped) and only
writes it out. While a newer body is being rendered, scrapes are served the
previous one instead of waiting. A scrape renders by itself only when no
render is running and no body exists yet, or the body's snapshot changed (a
cache nobody refreshes), or the body is older than ``max_age``: no publish
for that long means the sampler is stuck, and rendering again is what keeps
``otel_gpu_sample_age_seconds`` growing. The age in a body is the age when
it was rendered, so between two samples it stays what it was just after the
last one (about 0), and while the sampler is stuck it grows in steps of
``max_age`` at most.

A render is one SDK collection of every series (most of a cycle's CPU), so
it is made for a reader: when no scrape came for ``idle_after`` (nobody
scrapes, or none has yet), a publication does not render; it drops the body
it made stale, and the next scrape renders the new one (paying one render,
as a prometheus_client exporter pays on every scrape), after which the
publications render again. No scrape is served a body more than one
publication behind.

The server is :mod:`otel_gpu.export.prometheus.http_server`'s, with its bounds against
clients that misbehave.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from otel_gpu._log import LogLimiter
from otel_gpu.export.prometheus.basic_auth import AuthBusy, BasicAuth
from otel_gpu.export.prometheus.http_server import (
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS,
    RESPONSE_TIMEOUT_S,
    BoundedHandler,
    BoundedServer,
    describe,
    where,
)
from otel_gpu.export.prometheus.webconfig import WebConfig
from otel_gpu.export.seam import Scrape

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], "tuple[bool, str]"]
"""Whether the collector is ready, and why (what /readyz answers)."""

# The classic text format, which every Prometheus version and promtool read.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"



@dataclass(frozen=True)
class _Rendered:
    key: object
    at: float
    body: bytes
    gzipped: bytes


class RenderCache:
    """The rendered body: refreshed by the publisher, rendered by a scrape only as a fallback.

    ``render`` produces the whole exposition (the OpenTelemetry registry and
    any naming profiles); ``snapshot_key`` names what the latest body should
    show (the store's version). See the module docstring for when :meth:`get`
    renders.
    """

    def __init__(
        self,
        render: Callable[[], bytes],
        snapshot_key: Callable[[], object],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        published: Callable[[], bool] | None = None,
        idle_after: float | None = None,
    ) -> None:
        self._render = render
        self.published = published
        """Whether the first sample is out (None: always); until then a scrape is answered
        503, not an empty body that a scraper would take for a target without series."""
        self._key = snapshot_key
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: _Rendered | None = None
        self._idle_after = idle_after
        """No scrape for this long: publications stop rendering (None: they always render)."""
        self._asked: float | None = None  # when a scrape last asked (None: none yet)
        self.renders = 0
        self.skipped = 0
        """Publications left unrendered because nobody was scraping."""
        self._limited = LogLimiter(log, 60.0)

    def get(self) -> _Rendered:
        self._asked = self._clock()  # one store of a float: no lock needed
        cached = self._cached
        if cached is not None and (self._lock.locked() or (
                cached.key == self._key() and self._clock() - cached.at < self._max_age)):
            return cached  # current, or a newer one is being rendered: serve this meanwhile
        with self._lock:  # one render at a time; waiters reuse its result
            key = self._key()
            now = self._clock()
            cached = self._cached
            if cached is None or cached.key != key or now - cached.at >= self._max_age:
                cached = self._render_now(key, now)
            return cached

    def refresh(self) -> None:
        """Render the latest snapshot now (on the publishing thread), unless already done or
        nobody is scraping; then the stale body is dropped, for the next scrape to render.

        A failure is logged (at most once a minute), never raised into the publisher:
        the next scrape then tries again and answers 500 if it fails too.
        """
        try:
            with self._lock:
                key = self._key()
                now = self._clock()
                cached = self._cached
                if cached is not None and cached.key == key:
                    return
                if self._idle(now):
                    self._cached = None  # a scrape renders the new one; none gets the old
                    self.skipped += 1
                    return
                self._render_now(key, now)
        except Exception as exc:  # noqa: BLE001 - the publisher must outlive a render bug
            self._limited.log("refresh", logging.ERROR, "rendering /metrics failed: %s at %s",
                              describe(exc), where(exc))

    def _idle(self, now: float) -> bool:
        """Whether no scrape came for ``idle_after`` (or none at all yet)."""
        if self._idle_after is None:
            return False
        asked = self._asked
        return asked is None or now - asked >= self._idle_after

    def _render_now(self, key: object, now: float) -> _Rendered:
        body = self._render()
        cached = self._cached = _Rendered(key, now, body, gzip.compress(body, 5))
        self.renders += 1
        return cached


class _Handler(BoundedHandler):
    """``/metrics``, ``/healthz``, ``/readyz`` and ``/``."""

    server: MetricsServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
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

    def _metrics(self) -> None:
        server = self.server
        if server.auth:
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
            rendered = server.cache.get()
        except Exception as exc:  # noqa: BLE001 - a bug in rendering must not kill the server
            server.limited.log("render", logging.ERROR, "rendering /metrics failed: %s at %s",
                               describe(exc), where(exc))
            self._text(500, "rendering metrics failed; see the collector's log\n")
            return
        accepts_gzip = "gzip" in (self.headers.get("Accept-Encoding") or "")
        extra = (("Content-Encoding", "gzip"),) if accepts_gzip else ()
        self._send(200, rendered.gzipped if accepts_gzip else rendered.body, CONTENT_TYPE, extra)


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
        self.auth = BasicAuth(web.users if web is not None else {})
        super().__init__(address, _Handler, tls=web.tls if web is not None else None,
                         extra_headers=web.headers if web is not None else (),
                         max_connections=max_connections, head_timeout=head_timeout,
                         response_timeout=response_timeout)
