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


MAX_LABEL_SETS = 200_000
"""Label strings remembered at most; past this, the memory starts over (one render refills
it). It also starts over when it holds more than twice the series of the last render, so
that series gone with their pods do not stay."""

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


def _shape_of(data: MetricsData) -> tuple[list[object], list[Any]]:
    """What a collection's text depends on besides its values (its Resources and scopes,
    every metric's identity and its points' attribute objects, in order), and its
    written points in that order. Objects count by identity (the shape holds the
    collection they came from, so that no id is reused meanwhile): an equal copy may
    differ in what its labels say (``1`` and ``True`` are equal values), and the direct
    collection hands back the same objects while devices and pods stay."""
    signature: list[object] = []
    points: list[Any] = []
    for rm in data.resource_metrics:
        signature.append(id(rm.resource))
        for sm in rm.scope_metrics:
            signature.append(id(sm.scope))
            for metric in sm.metrics:
                data_ = metric.data
                signature.append((metric.name, metric.unit, metric.description,
                                  type(data_), getattr(data_, "is_monotonic", None),
                                  getattr(data_, "aggregation_temporality", None)))
                if isinstance(data_, (Sum, Gauge)):
                    for point in data_.data_points:
                        signature.append(id(point.attributes))
                        points.append(point)
    return signature, points


class _Shape:
    """One collection's text cut at its values: ``pieces[i]`` comes before the value of
    ``points[order[i]]``; the last piece ends the text."""

    __slots__ = ("held", "order", "pieces", "signature")

    def __init__(self, signature: list[object], pieces: list[str], order: list[int],
                 held: MetricsData) -> None:
        self.signature = signature
        self.pieces = pieces
        self.order = order
        self.held = held
        """The collection the signature's ids are of, kept so that none is reused."""

    def fill(self, points: list[Any]) -> bytes:
        out = [""] * (2 * len(self.order) + 1)
        out[0::2] = self.pieces
        out[1::2] = [format_value(points[i].value) for i in self.order]
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
        """Each sample's text up to its value, and the index of its point in the
        collection (:func:`_shape_of`'s order)."""


class _Entry:
    """One attribute set: the attributes object it was made from (held, so that its id is
    not reused while remembered), its label names, and its label strings by family shape.

    Most sets are written under one shape only: that string has slots of its own.
    """

    __slots__ = ("attributes", "braces", "key", "more", "names", "scope")

    def __init__(self, attributes: Any, scope: tuple, names: frozenset[str]) -> None:
        self.attributes = attributes
        self.scope = scope
        self.names = names
        self.key: object = None
        self.braces = ""
        self.more: dict[object, str] | None = None

    def labels(self, key_of: Any) -> dict[str, str]:
        return _labels(self.scope + tuple((self.attributes or {}).items()), key_of)

    def get(self, key: object) -> str | None:
        if key == self.key:
            return self.braces
        return self.more.get(key) if self.more else None

    def put(self, key: object, braces: str) -> None:
        if self.key is None:
            self.key, self.braces = key, braces
        else:
            if self.more is None:
                self.more = {}
            self.more[key] = braces


class TextWriter:
    """Writes ``MetricsData`` as Prometheus text, as the OpenTelemetry Prometheus exporter would.

    One writer per MeterProvider and style (its label strings are dropped with it).
    ``scope_labels``/``target_info``: the exporter's ``scope_info_enabled`` and
    the opposite of its ``disable_target_info``. Not thread-safe: one render at a time.

    ``style`` other than today's (:data:`PROMETHEUS`): under ``underscores`` the same
    names in OpenMetrics (a counter's family without ``_total``, its samples with it, a
    ``# UNIT`` where the name has a unit suffix, ``target`` an info family); under the
    other escapings the OpenTelemetry names and attribute keys themselves, untranslated
    and without a unit suffix, a counter's samples with ``_total`` in both formats (the
    name Prometheus stores is the one whatever it negotiated), escaped as the scheme
    asks or quoted (``allow-utf-8``). ``# EOF`` is the caller's.
    """

    def __init__(self, *, scope_labels: bool = False, target_info: bool = True,
                 max_label_sets: int = MAX_LABEL_SETS, style: Style = PROMETHEUS) -> None:
        self._style = style
        self._key_of = label_key(style)
        self._quoted = style.escaping == ALLOW_UTF8
        self._scope_labels = scope_labels
        self._target_info = target_info
        self._max = max_label_sets
        self._target: str | None = None
        self._entries: dict[object, _Entry] = {}
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._keysets: dict[frozenset[str], frozenset[str]] = {}
        self._scopes: dict[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]] = {}
        self._metric_names: dict[tuple[str, str, str], tuple[str, str, str, str, str]] = {}
        self._shape: _Shape | None = None
        """The last collection's text with holes for its values, and what it was made of."""
        self._limited = LogLimiter(log, 300.0)

    def write(self, data: MetricsData | None) -> bytes:
        """The exposition of one collection (empty for none, as the exporter's).

        A collection of the same shape as the last one (the same metrics and scopes, each
        with points whose attributes are the same, in the same order: every collection
        while devices and pods do not change) is written from the last one's text with
        only the values formatted anew.
        """
        if data is None:
            return b""
        signature, points = _shape_of(data)
        shape = self._shape
        if shape is not None and shape.signature == signature:
            shape.held = data  # the same objects: the older points may go
            return shape.fill(points)
        self._shape = None
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
                    self._metric(metric, scope, families, counter)
        pieces: list[str] = []
        order: list[int] = []
        for family in families.values():
            out.append(family.header)
            for head, index in family.lines:
                out.append(head)
                pieces.append("".join(out))
                out = ["\n"]
                order.append(index)
        pieces.append("".join(out))
        if len(self._entries) > 2 * len(order) + 64:  # attribute sets no longer collected
            self._entries.clear()
            self._keysets.clear()
        self._shape = _Shape(signature, pieces, order, data)
        return self._shape.fill(points)

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
            self._entries.clear()  # keyed by the ids of these
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
                families: dict[tuple[str, ...], _Family], counter: Iterator[int]) -> None:
        if not isinstance(metric.data, (Sum, Gauge)):
            self._limited.log(("unsupported", metric.name), logging.WARNING,
                              "metric %s: %s data is not written to /metrics", metric.name,
                              type(metric.data).__name__)
            return
        raw, sample_name, kind, unit, header_name = self._names_of(metric)
        description = metric.description or ""
        points = metric.data.data_points
        entries = self._entries
        if len(entries) > self._max:
            entries.clear()
            self._keysets.clear()
        scope_id = id(scope) if scope else None
        found: list[_Entry] = []
        keysets: set[frozenset[str]] = set()
        for point in points:
            attributes = point.attributes
            key = id(attributes) if scope_id is None else (id(attributes), scope_id)
            entry = entries.get(key)
            if entry is None or entry.attributes is not attributes:
                names = frozenset(_labels(scope + tuple((attributes or {}).items()),
                                          self._key_of))
                names = self._keysets.setdefault(names, names)  # a few shapes, shared
                entry = entries[key] = _Entry(attributes, scope, names)
            found.append(entry)
            keysets.add(entry.names)
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
        # with this metric's values (the exporter's own behaviour)
        string_key: object = (id(labelnames) if family.labelnames is labelnames
                              else (id(family.labelnames), id(labelnames)))
        lines = family.lines
        quoted = family.quoted
        for entry in found:
            braces = entry.get(string_key)
            if braces is None:
                labels = entry.labels(self._key_of)
                braces = _braces(family.labelnames, [labels.get(k, "") for k in labelnames],
                                 self._quoted)
                entry.put(string_key, braces)
            lines.append((sample_head(prefix, quoted, braces), next(counter)))

    def _intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The same tuple object for the same names, so that its id can key the strings."""
        found = self._names.get(names)
        if found is None:
            if len(self._names) > 4096:
                self._names.clear()
                self._entries.clear()  # their strings are keyed by the ids of these
            found = self._names[names] = names
        return found

