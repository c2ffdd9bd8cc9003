"""The ``process_*`` series every Prometheus exporter serves, added to ``/metrics`` per scrape.

node_exporter, dcgm-exporter and every prometheus_client program serve their
own CPU seconds, resident and virtual memory, open and maximum file
descriptors and start time under these names; an operator's standard alerts
on exporters read them. They are read from ``/proc``
(:class:`~otel_gpu.instrument.process.ProcessReader`) at each scrape, whatever
the naming profiles, and written before the rendered body in the format and
escaping the scrape negotiated, at the body's end (before OpenMetrics'
``# EOF``); the body itself stays the one rendered per publication.

The gzipped answer is the rendered body's own compression, kept open before
its tail (:class:`~otel_gpu.export.prometheus.opengzip.OpenGzip`): a scrape
compresses these few lines and the tail alone, whatever the body's size. The
plain answer is put together only for a scraper that asks for it.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

from otel_gpu.export.prometheus.cache import EOF, GZIP_LEVEL, CachedBody, RenderCache
from otel_gpu.export.prometheus.formats import OPENMETRICS, UNDERSCORES, Style, escape_name
from otel_gpu.instrument.process import READER, ProcessReader, ProcessStats

_FAMILIES: tuple[tuple[str, str, str, str, Callable[[ProcessStats], float | None]], ...] = (
    ("process_cpu_seconds_total", "counter", "seconds",
     "CPU seconds the collector's process has used, user and system together.",
     lambda s: s.cpu_s),
    ("process_resident_memory_bytes", "gauge", "bytes",
     "Physical memory the collector's process holds (its resident set).",
     lambda s: s.resident_bytes),
    ("process_virtual_memory_bytes", "gauge", "bytes",
     "Virtual memory the collector's process has mapped.",
     lambda s: s.virtual_bytes),
    ("process_start_time_seconds", "gauge", "seconds",
     "When the collector's process started, in seconds since the Unix epoch.",
     lambda s: s.start_time_s),
    ("process_open_fds", "gauge", "",
     "File descriptors the collector's process has open.",
     lambda s: s.open_fds),
    ("process_max_fds", "gauge", "",
     "The most file descriptors the collector's process may open (its soft limit).",
     lambda s: s.max_fds),
)
"""Name, type, OpenMetrics unit, help, and the value, in prometheus_client's order."""

NAMES = tuple(name for name, *_ in _FAMILIES)


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def write(stats: ProcessStats, style: Style) -> bytes:
    """The families ``stats`` has values for, in ``style``; a counter's OpenMetrics family
    is named without ``_total``, as every other counter of the body is."""
    out: list[str] = []
    for name, kind, unit, help_text, value_of in _FAMILIES:
        value = value_of(stats)
        if value is None:
            continue
        base, suffix = name, ""
        if style.openmetrics and kind == "counter":
            base, suffix = name.removesuffix("_total"), "_total"
        header = base if style.legacy else escape_name(base, style.escaping)
        out.append(f"# HELP {header} {help_text}\n# TYPE {header} {kind}\n")
        if style.openmetrics and unit:
            out.append(f"# UNIT {header} {unit}\n")
        out.append(f"{header}{suffix} {_value(value)}\n")
    return "".join(out).encode()


def style_of(content_type: str) -> Style:
    """The style a served Content-Type says: OpenMetrics or text, and its escaping."""
    media, *params = (part.strip() for part in content_type.split(";"))
    escaping = next((p.partition("=")[2] for p in params if p.startswith("escaping=")),
                    UNDERSCORES)
    return Style(media == OPENMETRICS, escaping or UNDERSCORES)


class _Served:
    """A rendered body with the process lines at its cut; each form made when asked."""

    __slots__ = ("_lines", "_rendered", "at", "content_type", "key")

    def __init__(self, rendered: CachedBody, lines: bytes) -> None:
        self._rendered = rendered
        self._lines = lines
        self.content_type = rendered.content_type
        self.key = rendered.key
        self.at = rendered.at

    @property
    def body(self) -> bytes:
        body, lines = self._rendered.body, self._lines
        cut = len(body) - len(EOF) if body.endswith(EOF) and \
            self.content_type.startswith(OPENMETRICS) else len(body)
        return b"".join((body[:cut], lines, body[cut:]))

    @property
    def gzipped(self) -> bytes:
        opened = self._rendered.opened
        if opened is None:
            return gzip.compress(self.body, GZIP_LEVEL)
        return opened.with_lines(self._lines)


class ProcessScrape(RenderCache):
    """The render cache, whose answers end with the process series read now."""

    def __init__(self, *args: Any, reader: ProcessReader = READER, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reader = reader

    def get(  # type: ignore[override]  # a Body of the seam, as the endpoint takes it
            self, accept: str | None = None) -> CachedBody | _Served:
        rendered = super().get(accept)
        lines = write(self._reader.read(), style_of(rendered.content_type))
        return _Served(rendered, lines) if lines else rendered
