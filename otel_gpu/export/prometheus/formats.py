"""The exposition formats /metrics serves, and the choice among them from a scraper's Accept.

Prometheus says what it reads in its ``Accept`` header (the "Scrape protocol
content negotiation" page of its docs): OpenMetrics 1.0.0 and 0.0.1, the
Prometheus text format 1.0.0 and 0.0.4, each entry with a q-value and, for
all but 0.0.4, an ``escaping`` parameter saying how names outside the legacy
character set (``[a-zA-Z_:][a-zA-Z0-9_:]*``) are to be written (the "UTF-8
escaping schemes" page): ``underscores`` (the default), ``dots``, ``values``
or ``allow-utf-8`` (quoted UTF-8 names). :func:`negotiate` picks the entry
with the highest q that names a format served here, the earlier one on a
tie, and falls back to text 0.0.4, which every scraper reads. The protobuf
format is not served (docs/exposition.md says why), so an Accept asking for
it first gets its next choice.

A :class:`Format` is what one response is: the bytes depend only on its
:attr:`~Format.style` (OpenMetrics or not, and the escaping), so OpenMetrics
0.0.1 and 1.0.0 share a body, and so do text 0.0.4 and 1.0.0 with
``underscores``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

UNDERSCORES = "underscores"
DOTS = "dots"
VALUES = "values"
ALLOW_UTF8 = "allow-utf-8"
ESCAPINGS = (UNDERSCORES, DOTS, VALUES, ALLOW_UTF8)

OPENMETRICS = "application/openmetrics-text"
TEXT = "text/plain"


@dataclass(frozen=True)
class Style:
    """What the bytes of a body depend on: OpenMetrics or Prometheus text, and the escaping."""

    openmetrics: bool
    escaping: str

    @property
    def legacy(self) -> bool:
        """Whether names are today's translated ones (``hw_power_watts``, ``hw_id``)."""
        return self.escaping == UNDERSCORES


@dataclass(frozen=True)
class Format:
    """One response's format: media type, version and escaping."""

    media_type: str
    version: str
    escaping: str = UNDERSCORES

    @property
    def style(self) -> Style:
        return Style(self.media_type == OPENMETRICS, self.escaping)

    @property
    def content_type(self) -> str:
        """The Content-Type saying exactly what is served (0.0.4 as it always was)."""
        if self.media_type == TEXT and self.version == "0.0.4":
            return "text/plain; version=0.0.4; charset=utf-8"
        return f"{self.media_type}; version={self.version}; charset=utf-8; escaping={self.escaping}"


TEXT_0_0_4 = Format(TEXT, "0.0.4")
"""The classic text format: the default, for no Accept or one naming nothing served here."""

_ENTRY = re.compile(r"\s*,\s*")


def _parameters(entry: str) -> tuple[str, dict[str, str]]:
    media, *params = entry.split(";")
    found: dict[str, str] = {}
    for param in params:
        key, _, value = param.partition("=")
        found[key.strip().lower()] = value.strip().strip('"')
    return media.strip().lower(), found


def _format(media: str, params: dict[str, str], utf8_names: bool) -> Format | None:
    """The format an Accept entry names, or None when none served here matches it.

    ``allow-utf-8`` allows UTF-8 names, it does not ask for them: unless ``utf8_names``
    (the ``prometheus_utf8_names`` setting), such a scraper gets the underscore names the
    dashboards and alert rules use (Prometheus 3 allows UTF-8 by default)."""
    escaping = params.get("escaping", UNDERSCORES)
    if escaping not in ESCAPINGS or (escaping == ALLOW_UTF8 and not utf8_names):
        escaping = UNDERSCORES  # an unknown scheme: the default one, as the docs ask
    version = params.get("version", "")
    if media == OPENMETRICS:
        if version in ("", "1.0.0"):
            return Format(OPENMETRICS, "1.0.0", escaping)
        if version == "0.0.1":
            return Format(OPENMETRICS, "0.0.1", escaping)
        return None
    if media == TEXT:
        if version == "1.0.0":
            return Format(TEXT, "1.0.0", escaping)
        if version in ("", "0.0.4"):
            return TEXT_0_0_4
        return None
    if media in ("*/*", "text/*"):
        return TEXT_0_0_4
    return None


@functools.lru_cache(maxsize=64)
def negotiate(accept: str | None, utf8_names: bool = False) -> Format:
    """The format to serve for an ``Accept`` header: the acceptable entry with the highest q
    (the first on a tie) that names one served here; text 0.0.4 when none does.

    Remembered for the last 64 headers: a scraper sends the same one every time, so a
    scrape pays a look-up, not a parse."""
    if not accept:
        return TEXT_0_0_4
    best: Format | None = None
    best_q = 0.0
    for entry in _ENTRY.split(accept.strip()):
        if not entry:
            continue
        media, params = _parameters(entry)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            continue
        if not 0.0 < q <= 1.0 or q <= best_q:
            continue
        found = _format(media, params, utf8_names)
        if found is not None:
            best, best_q = found, q
    return best or TEXT_0_0_4


_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def legacy_name(name: str) -> bool:
    """Whether a metric name is in the legacy character set (written without quotes)."""
    return _LEGACY_NAME.match(name) is not None


def legacy_label(name: str) -> bool:
    """Whether a label name is in the legacy character set (written without quotes)."""
    return _LEGACY_LABEL.match(name) is not None


def _legacy_char(char: str, first: bool) -> bool:
    return char.isascii() and (char.isalpha() or char in "_:" or (char.isdigit() and not first))


def escape_name(name: str, escaping: str) -> str:
    """A UTF-8 name under an escaping scheme (``allow-utf-8``: as it is, quoted when written).

    ``underscores``: each character outside the legacy set to ``_``; ``dots``: ``.`` to
    ``_dot_``, ``_`` to ``__``, any other such character to ``__`` (legacy names too);
    ``values``: a name outside the legacy set as ``U__`` then ``_`` doubled and each other
    such character as ``_<hex code point>_``.
    """
    if escaping == ALLOW_UTF8 or not name:
        return name
    if escaping == DOTS:
        out = []
        for i, char in enumerate(name):
            if char == "_":
                out.append("__")
            elif char == ".":
                out.append("_dot_")
            else:
                out.append(char if _legacy_char(char, i == 0) else "__")
        return "".join(out)
    if legacy_name(name):
        return name
    if escaping == VALUES:
        out = ["U__"]
        for i, char in enumerate(name):
            if char == "_":
                out.append("__")
            elif _legacy_char(char, i == 0):
                out.append(char)
            else:
                out.append(f"_{ord(char):x}_")
        return "".join(out)
    return "".join(c if _legacy_char(c, i == 0) else "_" for i, c in enumerate(name))


def quote(name: str) -> str:
    """A name between double quotes, ``\\``, ``"`` and newlines escaped."""
    return '"' + name.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") + '"'
