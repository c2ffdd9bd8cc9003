"""The ``/metrics`` body cache: what a scrape is served, rendered before it asks.

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

The format of a response is the one the scraper's ``Accept`` asks for
(:mod:`.formats`). A publication is collected once; each format is written
from that collection the first time a scrape asks for it, and kept (with its
gzip) for the other scrapes of the publication. A publication renders, on the
publishing thread, only the formats scraped within ``idle_after``: a format
nobody asks for is never written.

The cache is the exporter's :class:`~otel_gpu.export.seam.Scrape`: the service's
endpoint (:mod:`otel_gpu.export.http.endpoint`) serves it knowing no more than that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from otel_gpu._log import LogLimiter, describe, where
from otel_gpu.export.prometheus.formats import TEXT_0_0_4, Format, Style, negotiate
from otel_gpu.export.prometheus.opengzip import OpenGzip

log = logging.getLogger(__name__)

GZIP_LEVEL = 1
EOF = b"# EOF\n"
"""OpenMetrics' last line."""
"""zlib's fastest level: on the collector's text it compresses about 9:1, against 10.6:1 at
level 5, in half the CPU (0.30 against 0.61 ms for one GPU's 56 kB body); one body is
compressed per publication, where a scraper pays the bytes once per scrape."""

# The classic text format, which every Prometheus version and promtool read.
CONTENT_TYPE = TEXT_0_0_4.content_type


class Exposition(Protocol):
    """One publication's collection, written in a style on demand."""

    def write(self, style: Style) -> bytes: ...


@dataclass(frozen=True)
class CachedBody:
    """A body as served: one publication in one format, plain and gzipped (the seam's
    :class:`~otel_gpu.export.seam.Body`)."""

    key: object
    at: float
    body: bytes
    gzipped: bytes
    content_type: str
    opened: OpenGzip | None = None
    """``gzipped`` open before the body's tail (``# EOF``), for lines added per scrape."""


class _Rendered:
    """One publication: its collection, and the bodies written from it so far, by style."""

    __slots__ = ("at", "bodies", "key", "served", "source")

    def __init__(self, key: object, at: float, source: bytes | Exposition | None) -> None:
        self.key = key
        self.at = at
        self.source = source
        """The collection; plain bytes where the render gives text 0.0.4 only; None once a
        newer render began (the bodies written stay)."""
        self.bodies: dict[Style, tuple[bytes, bytes, OpenGzip]] = {}
        self.served: dict[Format, CachedBody] = {}

    def resolve(self, fmt: Format) -> Format:
        return fmt if not isinstance(self.source, bytes) else TEXT_0_0_4

    def ready(self, fmt: Format) -> CachedBody | None:
        """The body in ``fmt`` if its style is written already (no writing here)."""
        served = self.served.get(fmt)
        if served is None:
            written = self.bodies.get(fmt.style)
            if written is not None:
                body, gzipped, opened = written
                served = self.served[fmt] = CachedBody(self.key, self.at, body, gzipped,
                                                       fmt.content_type, opened)
        return served

    def write(self, style: Style) -> bool:
        """Write ``style`` if not yet written (under the cache's lock); whether it wrote."""
        source = self.source
        if isinstance(source, bytes):
            style = TEXT_0_0_4.style  # the only one it has
        if style in self.bodies:
            return False
        if source is None:  # a newer render took over: the caller renders anew
            raise RuntimeError("the collection of a replaced body was asked for a new style")
        body = source if isinstance(source, bytes) else source.write(style)
        cut = len(body) - len(EOF) if style.openmetrics and body.endswith(EOF) else len(body)
        opened = OpenGzip(body, cut, GZIP_LEVEL)
        self.bodies[style] = (body, opened.with_lines(b""), opened)
        return True


class RenderCache:
    """The rendered body: refreshed by the publisher, rendered by a scrape only as a fallback.

    ``render`` produces the whole exposition (the OpenTelemetry registry and
    any naming profiles); ``snapshot_key`` names what the latest body should
    show (the store's version). See the module docstring for when :meth:`get`
    renders.
    """

    def __init__(
        self,
        render: Callable[[], bytes | Exposition],
        snapshot_key: Callable[[], object],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        published: Callable[[], bool] | None = None,
        idle_after: float | None = None,
        utf8_names: bool = False,
    ) -> None:
        self._render = render
        self._utf8_names = utf8_names
        """Whether a scraper allowing UTF-8 names gets the semantic-convention names."""
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
        self._wanted: dict[Style, float] = {}
        """When a scrape last asked for each style: a publication writes those asked lately."""
        self.renders = 0
        """Publications collected."""
        self.writes: dict[Style, int] = {}
        """Bodies written, by style (at most one per publication each)."""
        self.skipped = 0
        """Publications left unrendered because nobody was scraping."""
        self._limited = LogLimiter(log, 60.0)

    def get(self, accept: str | None = None) -> CachedBody:
        """The body for a scrape whose ``Accept`` header is ``accept`` (None: text 0.0.4)."""
        fmt = negotiate(accept, self._utf8_names)
        self._asked = asked = self._clock()  # one store of a float: no lock needed
        self._wanted[fmt.style] = asked
        cached = self._cached
        if cached is not None:
            fmt = cached.resolve(fmt)
            served = cached.ready(fmt)
            if served is not None and (self._lock.locked() or (
                    cached.key == self._key() and self._clock() - cached.at < self._max_age)):
                return served  # current, or a newer one is being rendered: serve this meanwhile
        with self._lock:  # one render at a time; waiters reuse its result
            key = self._key()
            now = self._clock()
            cached = self._cached
            if cached is None or cached.key != key or now - cached.at >= self._max_age \
                    or cached.source is None:  # (a render that let it go failed)
                cached = self._render_now(key, now, ())
            fmt = cached.resolve(fmt)
            self._write(cached, fmt.style)
            served = cached.ready(fmt)
            assert served is not None
            return served

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
                self._render_now(key, now, self._styles_wanted(now))
        except Exception as exc:  # noqa: BLE001 - the publisher must outlive a render bug
            self._limited.log("refresh", logging.ERROR, "rendering /metrics failed: %s at %s",
                              describe(exc), where(exc))

    def _idle(self, now: float) -> bool:
        """Whether no scrape came for ``idle_after`` (or none at all yet)."""
        if self._idle_after is None:
            return False
        asked = self._asked
        return asked is None or now - asked >= self._idle_after

    def _styles_wanted(self, now: float) -> tuple[Style, ...]:
        """The styles scraped within ``idle_after`` (all ever asked without it); today's
        text when none was asked yet."""
        if not self._wanted:
            return (TEXT_0_0_4.style,)
        limit = self._idle_after
        return tuple(style for style, asked in list(self._wanted.items())
                     if limit is None or now - asked < limit)

    def _render_now(self, key: object, now: float, styles: tuple[Style, ...]) -> _Rendered:
        """Collect a publication and write ``styles`` from it (under the lock).

        The body being replaced lets go of its collection first: its written bodies are
        still served meanwhile (outside the lock), and a style it never wrote is asked of
        this render (under the lock). So a node holds one collection at a time, not two
        while the new one is made (at 500 pods a collection's points are a mebibyte)."""
        old = self._cached
        if old is not None and not isinstance(old.source, bytes):
            old.source = None
        cached = _Rendered(key, now, self._render())
        self.renders += 1
        for style in styles:
            self._write(cached, style)
        self._cached = cached
        return cached

    def _write(self, cached: _Rendered, style: Style) -> None:
        if cached.write(style):
            self.writes[style] = self.writes.get(style, 0) + 1
