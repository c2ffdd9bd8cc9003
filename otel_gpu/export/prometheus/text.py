"""The Prometheus text of what the OpenTelemetry SDK collected, written without a detour.

The OpenTelemetry Prometheus exporter turns every collection into
prometheus_client families and then into text, cleaning, sanitising and
quoting every label of every series again on every scrape: most of a
render's CPU. :class:`TextWriter` writes the same text (version 0.0.4) from
the same ``MetricsData`` by the same translation rules, and remembers each
attribute set's finished label string, so that a series whose attributes did
not change (the SDK hands back the same attributes object for it each
collection) costs one dictionary look-up and its value.

The rules, as ``opentelemetry-exporter-prometheus`` applies them: metric
names sanitised (``[^a-zA-Z0-9:]`` runs to ``_``, a leading digit to ``_``)
and suffixed with the mapped unit; a monotonic sum is a counter with
``_total``; a non-monotonic cumulative sum, and a gauge, is a gauge; label
names likewise (``:`` replaced too), non-string values written as
JSON; labels sorted by name. One departure: the exporter gives every series of a
family the family's whole label set, ``""`` where a point lacks one; this writer
leaves an empty label out, which Prometheus stores the same way (an empty label is
no label) at a fraction of the bytes (``container_name=""`` on every GPU no
container holds); ``target_info`` holds the first
collection's Resource; scope labels (``otel_scope_*``) only when asked.
Values are written as the Prometheus Python client writes them. Histograms
and exponential histograms are not written (the collector has none); one is
logged and left out. Neither prometheus_client nor the exporter is imported
at run time; ``tests/export/prometheus/test_text.py`` holds the writer to
the real exporter's output, byte for byte once its empty labels are dropped.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_gpu._log import LogLimiter
from otel_gpu.export.prometheus.formats import (
    ALLOW_UTF8,
    UNDERSCORES,
    Style,
    escape_name,
    legacy_label,
    legacy_name,
    quote,
)
from otel_gpu.instrument.series import SeriesColumns, SeriesData, flat_metrics

log = logging.getLogger(__name__)

# The OpenTelemetry-to-Prometheus naming rules (the compatibility specification), written
# here so that the collector needs neither prometheus_client nor the exporter at run time.
_NAME_RUNS = re.compile(r"[^a-zA-Z0-9:]+")
_LABEL_RUNS = re.compile(r"[^a-zA-Z0-9]+")
_ANNOTATION = re.compile(r"{.*}")
UNIT_SUFFIXES = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes",
    "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes", "m": "meters", "V": "volts",
    "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz",
    "1": "", "%": "percent",
}
"""OpenTelemetry unit -> the suffix of a Prometheus metric name."""
PER_UNIT = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month",
            "y": "year"}
"""The denominator of a rate unit (``By/s``), in the singular."""


def metric_name(name: str) -> str:
    """A metric name: runs of anything but ``[a-zA-Z0-9:]`` to ``_``, a leading digit too."""
    if name[:1].isdigit():
        name = "_" + name[1:]
    return _NAME_RUNS.sub("_", name)


def label_name(key: str) -> str:
    """A label name: runs of anything but ``[a-zA-Z0-9]`` to ``_``, a leading digit too."""
    if key[:1].isdigit():
        key = "_" + key[1:]
    return _LABEL_RUNS.sub("_", key)


def unit_suffix(unit: str) -> str:
    """The name suffix for an OpenTelemetry unit (``{annotations}`` dropped, ``a/b`` as
    ``a_per_b``)."""
    unit = _ANNOTATION.sub("", unit)
    if unit in UNIT_SUFFIXES:
        return UNIT_SUFFIXES[unit]
    top, per, bottom = unit.partition("/")
    bottom = _NAME_RUNS.sub("_", bottom)
    if per and bottom:
        top = _NAME_RUNS.sub("_", top)
        top = UNIT_SUFFIXES.get(top, top)
        bottom = PER_UNIT.get(bottom, bottom)
        return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _NAME_RUNS.sub("_", unit).strip("_")


def format_value(value: float) -> str:
    """A sample value as the Prometheus Python client writes it: Python's shortest form,
    except positive values from a million up, in exponent form as Go writes them."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if value >= 1e6 and "e" not in text:
        whole, _, fraction = text.partition(".")
        mantissa = (whole[0] + "." + whole[1:] + fraction).rstrip("0").rstrip(".")
        return f"{mantissa}e+{len(whole) - 1:02d}"
    return text


def label_value(value: Any) -> str:
    """An attribute value as a label value: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def escape_help(text: str, openmetrics: bool) -> str:
    """HELP text: OpenMetrics escapes double quotes too."""
    text = _escape_help(text)
    return text.replace('"', r'\"') if openmetrics else text


PROMETHEUS = Style(openmetrics=False, escaping=UNDERSCORES)
"""Today's text: translated names, the classic syntax (text 0.0.4, and 1.0.0 with
``underscores``)."""


def label_key(style: Style) -> Any:
    """The function from an attribute key to its label name under ``style``: the translated
    name under ``underscores``, else the key itself, escaped as the scheme asks."""
    if style.legacy:
        return label_name
    escaping = style.escaping
    return lambda key: escape_name(key, escaping)


def _labels(pairs: Iterable[tuple[str, Any]], key_of: Any = label_name) -> dict[str, str]:
    """Label name -> label value; a later attribute wins a name collision."""
    out: dict[str, str] = {}
    for key, value in pairs:
        out[key_of(key)] = label_value(value)
    return out


def written_name(name: str) -> str:
    """A metric or label name as it appears in the text: quoted unless a legacy one."""
    return name if legacy_name(name) else quote(name)


def _braces(names: tuple[str, ...], values: Iterable[str], quoted: bool = False) -> str:
    """``{a="1",b="2"}`` with the pairs sorted by name and empty values left out (``""``
    without labels); ``quoted``: label names outside the legacy set in double quotes
    (``allow-utf-8``)."""
    pairs = sorted(p for p in zip(names, values, strict=False) if p[1])
    if not pairs:
        return ""
    if quoted:
        return "{" + ",".join(f'{k if legacy_label(k) else quote(k)}="{escape_value(v)}"'
                              for k, v in pairs) + "}"
    return "{" + ",".join(f'{k}="{escape_value(v)}"' for k, v in pairs) + "}"


def sample_head(prefix: str, quoted: bool, braces: str) -> str:
    """A sample's text up to its value; a name outside the legacy set goes inside the
    braces, quoted."""
    if quoted:
        return f"{prefix},{braces[1:]} " if braces else f"{prefix}}} "
    return f"{prefix}{braces} "


def sample_line(prefix: str, quoted: bool, braces: str, value: str) -> str:
    """One sample."""
    return f"{sample_head(prefix, quoted, braces)}{value}\n"


class _Shape:
    """One collection's text cut at its values: ``pieces[i]`` comes before the value of
    the ``order[i]``-th point (metrics and points in collection order); the last piece
    ends the text. Between two families' pieces the one after carries the header; the
    others are the series' own heads, held once (in the writer's columns)."""

    __slots__ = ("layout", "order", "pieces")

    def __init__(self, layout: object, pieces: list[str], order: list[int]) -> None:
        self.layout = layout
        self.pieces = pieces
        self.order = order

    def fill(self, data: MetricsData) -> bytes:
        values = [format_value(p.value) for m in flat_metrics(data)
                  if isinstance(m.data, (Sum, Gauge)) for p in m.data.data_points]
        out = [""] * (2 * len(self.order) + 1)
        out[0::2] = self.pieces
        out[1::2] = [values[i] for i in self.order]
        return "".join(out).encode("utf-8")


class _Family:
    __slots__ = ("header", "labelnames", "lines", "name", "quoted")

    def __init__(self, name: str, header: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        """The samples' name as written before their labels (``{"a.b"`` when quoted)."""
        self.quoted = name.startswith("{")
        self.header = header
        self.labelnames = labelnames
        self.lines: list[tuple[str, int]] = []
        """Each sample's text up to its value, after a newline, and the index of its point
        in the collection."""


class TextWriter:
    """Writes ``MetricsData`` as Prometheus text, as the OpenTelemetry Prometheus exporter would.

    One writer per MeterProvider and style. ``scope_labels``/``target_info``: the
    exporter's ``scope_info_enabled`` and the opposite of its ``disable_target_info``.
    Not thread-safe: one render at a time.

    A collection with series ids (:class:`~otel_gpu.instrument.series.SeriesData`, the
    direct collection's) is written from each series' text, kept by its id; one of the
    same layout as the last (every collection while devices and pods do not change) is
    the last text with only the values formatted anew. Any other collection is written
    from scratch.

    ``style`` other than today's (:data:`PROMETHEUS`): under ``underscores`` the same
    names in OpenMetrics (a counter's family without ``_total``, its samples with it, a
    ``# UNIT`` where the name has a unit suffix, ``target`` an info family); under the
    other escapings the OpenTelemetry names and attribute keys themselves, untranslated
    and without a unit suffix, a counter's samples with ``_total`` in both formats (the
    name Prometheus stores is the one whatever it negotiated), escaped as the scheme
    asks or quoted (``allow-utf-8``). ``# EOF`` is the caller's.
    """

    def __init__(self, *, scope_labels: bool = False, target_info: bool = True,
                 style: Style = PROMETHEUS) -> None:
        self._style = style
        self._key_of = label_key(style)
        self._quoted = style.escaping == ALLOW_UTF8
        self._scope_labels = scope_labels
        self._target_info = target_info
        self._target: str | None = None
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._keysets: dict[frozenset[str], frozenset[str]] = {}
        self._scopes: dict[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]] = {}
        self._metric_names: dict[tuple[str, str, str], tuple[str, str, str, str, str]] = {}
        self._heads = SeriesColumns()
        """Each series' sample text up to its value (after a newline), by series id."""
        self._label_names = SeriesColumns()
        """Each series' label names, by series id."""
        self._shape: _Shape | None = None
        """The last collection's text with holes for its values, and its layout."""
        self._limited = LogLimiter(log, 300.0)

    def write(self, data: MetricsData | None) -> bytes:
        """The exposition of one collection (empty for none, as the exporter's)."""
        if data is None:
            return b""
        series = data if isinstance(data, SeriesData) and data.table is not None else None
        shape = self._shape
        if series is not None and shape is not None and shape.layout is series.layout:
            return shape.fill(data)
        self._shape = None
        columns = None if series is None else (
            self._heads.of(series), self._label_names.of(series))
        ids = None if series is None else iter(series.ids)
        families: dict[tuple[str, ...], _Family] = {}
        out: list[str] = []
        if self._target_info:
            if self._target is None:
                attributes: dict[str, Any] = {}
                for rm in data.resource_metrics:
                    attributes.update(rm.resource.attributes)
                labels = _labels(attributes.items(), self._key_of)
                braces = _braces(tuple(labels), labels.values(), self._quoted)
                self._target = (("# HELP target Target metadata\n# TYPE target info\n"
                                 if self._style.openmetrics else
                                 "# HELP target_info Target metadata\n"
                                 "# TYPE target_info gauge\n")
                                + f"target_info{braces} 1.0\n")
            out.append(self._target)
        counter = itertools.count()
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                scope = self._scope_pairs(sm.scope)
                for metric in sm.metrics:
                    metric_ids = None if ids is None else next(ids)
                    self._metric(metric, scope, families, counter, metric_ids, columns)
        pieces: list[str] = []
        order: list[int] = []
        for family in families.values():
            out.append(family.header)
            for head, index in family.lines:
                if out:  # a header stands between the last value and this head
                    out.append(head[1:])
                    pieces.append("".join(out))
                    out = []
                else:
                    pieces.append(head)
                order.append(index)
            if family.lines:
                out = ["\n"]
        pieces.append("".join(out))
        shape = _Shape(series.layout if series is not None else None, pieces, order)
        if series is not None:
            self._shape = shape
        return shape.fill(data)

    def _scope_pairs(self, scope: InstrumentationScope) -> tuple[tuple[str, Any], ...]:
        if not self._scope_labels:
            return ()
        pairs = [("otel_scope_" + k, v) for k, v in (scope.attributes or {}).items()]
        pairs += [("otel_scope_name", scope.name or ""),
                  ("otel_scope_version", scope.version or ""),
                  ("otel_scope_schema_url", scope.schema_url or "")]
        key = tuple(pairs)
        if len(self._scopes) > 256:
            self._scopes.clear()
        return self._scopes.setdefault(key, key)
    def _names_of(self, metric: Metric) -> tuple[str, str, str, str, str]:
        """(family identity name, samples' name as written, type, mapped unit, header
        lines' name as written) for a metric."""
        key = (metric.name, metric.unit or "", type(metric.data).__name__)
        found = self._metric_names.get(key)
        if found is not None:
            return found
        style = self._style
        counter = isinstance(metric.data, Sum) and not (
            not metric.data.is_monotonic
            and metric.data.aggregation_temporality == AggregationTemporality.CUMULATIVE)
        kind = "counter" if counter else "gauge"
        if style.legacy:
            name = raw = metric_name(metric.name)
            unit = unit_suffix(metric.unit or "")
            if counter and name.endswith("_total"):
                name = name[:-6]
            if unit and not name.endswith("_" + unit):
                name += "_" + unit
            sample = name + "_total" if counter else name
            header = name if style.openmetrics else sample
        else:  # the OpenTelemetry name itself, no unit suffix
            raw = metric.name
            unit = ""
            # A counter's samples end in _total in both formats, as OpenMetrics requires:
            # Prometheus stores a sample's name as written, so a scraper gets one name
            # whichever it negotiated. Escaped whole, so that ``values`` can be undone.
            family = escape_name(raw, style.escaping)
            sample = escape_name(raw + "_total", style.escaping) if counter else family
            header = family if style.openmetrics else sample
        found = (raw, written_name(sample), kind, unit, written_name(header))
        self._metric_names[key] = found
        return found

    def _metric(self, metric: Metric, scope: tuple[tuple[str, Any], ...],
                families: dict[tuple[str, ...], _Family], counter: Iterator[int],
                ids: tuple[int, ...] | None,
                columns: tuple[list[Any], list[Any]] | None) -> None:
        if not isinstance(metric.data, (Sum, Gauge)):
            self._limited.log(("unsupported", metric.name), logging.WARNING,
                              "metric %s: %s data is not written to /metrics", metric.name,
                              type(metric.data).__name__)
            return
        raw, sample_name, kind, unit, header_name = self._names_of(metric)
        description = metric.description or ""
        points = metric.data.data_points
        if ids is None or columns is None:  # a collection without ids: every head anew
            ids = tuple(range(len(points)))
            heads: list[Any] = [None] * len(points)
            names_of: list[Any] = [None] * len(points)
        else:
            heads, names_of = columns
        keysets: set[frozenset[str]] = set()
        for series, point in zip(ids, points, strict=True):
            names = names_of[series]
            if names is None:
                names = frozenset(_labels(scope + tuple((point.attributes or {}).items()),
                                          self._key_of))
                if len(self._keysets) > 4096:
                    self._keysets.clear()
                names = names_of[series] = self._keysets.setdefault(names, names)  # shared
            keysets.add(names)
        labelnames = self._intern(tuple(sorted(frozenset().union(*keysets))))
        family_id = (raw, description, unit, kind)  # the exporter's family identity
        family = families.get(family_id)
        if family is None:
            om = self._style.openmetrics
            header = (f"# HELP {header_name} {escape_help(description, om)}\n"
                      f"# TYPE {header_name} {kind}\n")
            if om and unit:
                header += f"# UNIT {header_name} {unit}\n"
            prefix = "{" + sample_name if self._quoted and sample_name[:1] == '"' else sample_name
            family = families[family_id] = _Family(prefix, header, labelnames)
        prefix = family.name
        # a family another metric created keeps that metric's label names, paired in order
        # with this metric's values (the exporter's own behaviour): such a head is not kept
        own = family.labelnames is labelnames
        lines = family.lines
        quoted = family.quoted
        for series, point in zip(ids, points, strict=True):
            head = heads[series] if own else None
            if head is None:
                labels = _labels(scope + tuple((point.attributes or {}).items()), self._key_of)
                braces = _braces(family.labelnames, [labels.get(k, "") for k in labelnames],
                                 self._quoted)
                head = "\n" + sample_head(prefix, quoted, braces)
                if own:
                    heads[series] = head
            lines.append((head, next(counter)))

    def _intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The same tuple object for the same names (a family's names compare by it)."""
        found = self._names.get(names)
        if found is None:
            if len(self._names) > 4096:
                self._names.clear()
            found = self._names[names] = names
        return found
