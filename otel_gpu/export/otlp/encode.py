"""OTLP encoding with each series encoded once, not once per push.

The SDK's OTLP exporters build a protobuf ``KeyValue`` for every attribute of
every data point on every export: a GPU's twelve attributes, on each of its
hundred series, each push, which costs more CPU than the collection itself.
:class:`Encoder` writes the same ``ExportMetricsServiceRequest`` as the SDK's
encoder for gauges and sums. Every field of a point but its time and value is
the same push after push: for a collection with series ids
(:class:`~otel_gpu.instrument.series.SeriesData`) each series' point up to its
time is kept by its id, and while the layout stays the whole request is the
last one with only times and values written anew (their sizes are fixed).
Other collections have their attribute sets encoded once by content (bounded).
A collection holding anything else (histograms, exemplars) goes to the SDK's
encoder whole. The exporter (:mod:`otel_gpu.export.otlp.client`) sends
:meth:`Encoder.serialize`'s bytes as they are. ``tests/export/otlp/test_encode.py``
holds it to the SDK's encoder.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.sdk.metrics.export import Gauge, MetricsData, Sum

from otel_gpu._log import LogLimiter
from otel_gpu.instrument.series import SeriesColumns, SeriesData

log = logging.getLogger(__name__)

MAX_ATTRIBUTE_SETS = 100_000
"""Attribute sets of collections without series ids remembered by content at most; past
this, the memory starts over. It also starts over when it holds well over the points of
the last push (finished pods' sets)."""
_PLAIN = (str, int, float, bool, type(None))


def any_value(value: Any) -> AnyValue:
    """An attribute value as OTLP's ``AnyValue`` (ValueError for a type OTLP has not)."""
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(
            values=[KeyValue(key=str(k), value=any_value(v)) for k, v in value.items()]))
    raise ValueError(f"no OTLP type for a {type(value).__name__}")


class _Unsupported(Exception):
    """The collection holds what only the SDK's encoder writes."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


# Tags (field number << 3 | wire type) of the OTLP messages written by hand here.
_DATA_POINTS = b"\x0a"       # Gauge/Sum.data_points = 1, message
_TEMPORALITY = b"\x10"       # Sum.aggregation_temporality = 2, varint
_MONOTONIC = b"\x18\x01"     # Sum.is_monotonic = 3, true
_GAUGE, _SUM = b"\x2a", b"\x3a"  # Metric.gauge = 5, Metric.sum = 7
_START, _TIME = b"\x11", b"\x19"  # NumberDataPoint start/time_unix_nano = 2, 3, fixed64
_DOUBLE, _INT = b"\x21", b"\x31"  # NumberDataPoint.as_double = 4, as_int = 6 (sfixed64)
_SCOPE, _METRICS = b"\x0a", b"\x12"        # ScopeMetrics.scope = 1, metrics = 2
_RESOURCE, _SCOPE_METRICS = b"\x0a", b"\x12"  # ResourceMetrics.resource = 1, scope_metrics = 2
_RESOURCE_METRICS = b"\x0a"   # ExportMetricsServiceRequest.resource_metrics = 1
_U64, _I64, _F64 = struct.Struct("<Q"), struct.Struct("<q"), struct.Struct("<d")


_TIME_SIZE = 9   # the time field: its tag and 8 bytes
_VALUE_SIZE = 9  # either value field: its tag and 8 bytes


class _Template:
    """A request cut at its points' times and values: ``pieces[i]`` comes before the
    i-th point's time and value (18 bytes, whatever they are); the last piece ends it."""

    __slots__ = ("layout", "pieces")

    def __init__(self, layout: object, pieces: list[bytes]) -> None:
        self.layout = layout
        self.pieces = pieces

    def fill(self, points: Sequence[Any]) -> bytes:
        out: list[bytes] = [b""] * (2 * len(points) + 1)
        out[0::2] = self.pieces
        out[1::2] = [_time_and_value(p) for p in points]
        return b"".join(out)


def _time_and_value(point: Any, u64: Any = _U64.pack, i64: Any = _I64.pack,
                    f64: Any = _F64.pack) -> bytes:
    value = point.value
    return (_TIME + u64(point.time_unix_nano)
            + (_INT + i64(value) if isinstance(value, int) else _DOUBLE + f64(value)))


class _Message:
    """A message being written: bytes, and holes for points' times and values."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes | None] = []  # None: a point's time and value
        self.size = 0

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)

    def hole(self) -> None:
        self.parts.append(None)
        self.size += _TIME_SIZE + _VALUE_SIZE

    def field(self, tag: bytes, inner: _Message) -> None:
        self.add(tag + _varint(inner.size))
        self.parts.extend(inner.parts)
        self.size += inner.size


def _pieces(message: _Message) -> list[bytes]:
    """The bytes between the holes (one more than the holes)."""
    pieces: list[bytes] = []
    run: list[bytes] = []
    for part in message.parts:
        if part is None:
            pieces.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        else:
            run.append(part)
    pieces.append(b"".join(run))
    return pieces


class Encoder:
    """Gauges and sums to an ``ExportMetricsServiceRequest``, each series encoded once.

    A collection with series ids keeps each series' point up to its time by its id,
    and the request cut at its times and values by its layout. Any other collection's
    attribute sets are remembered by their content, types included; the request is
    written in protobuf's wire format.
    """

    def __init__(self, max_sets: int = MAX_ATTRIBUTE_SETS) -> None:
        self._max = max_sets
        self._by_content: dict[tuple, bytes] = {}
        self._heads = SeriesColumns()
        """Each series' point up to its time (tag, length, attributes, start), by id, with
        the attributes object it was written from."""
        self._template: _Template | None = None
        self._points = 0
        self._limited = LogLimiter(log, 300.0)

    def encode(self, data: MetricsData) -> ExportMetricsServiceRequest:
        """The request, as a message."""
        return ExportMetricsServiceRequest.FromString(self.serialize(data))

    def serialize(self, data: MetricsData) -> bytes:
        """The request in protobuf's wire format: what is sent (the same message as the SDK's
        encoder makes, its fields in the order written here)."""
        self._points = 0
        series = data if isinstance(data, SeriesData) and data.table is not None else None
        try:
            points = [p for m in _flat(data) for p in m.data.data_points]
            if not all(p.time_unix_nano for p in points):
                raise _Unsupported  # a point without a time has no time field: another size
            template = self._template
            if series is None or template is None or template.layout is not series.layout:
                self._template = None
                message = self._request(data, series)
                template = _Template(series.layout if series is not None else None,
                                     _pieces(message))
                if series is not None:
                    self._template = template
            return template.fill(points)
        except Exception:  # noqa: BLE001 - histograms, exemplars, odd values: the SDK's way
            self._template = None
            return encode_metrics(data).SerializeToString()
        finally:
            if len(self._by_content) > 2 * (2 * self._points + 64):
                self._by_content.clear()  # sets this push did not use (finished pods')

    def refill(self, layout: object, points: Sequence[Any]) -> bytes | None:
        """The request last written for ``layout`` (a :class:`SeriesData`'s) with the times
        and values of ``points``, which are its points in its order (whatever else they
        carry); None when that request is not the one kept, or the points do not fit it."""
        template = self._template
        if template is None or template.layout is not layout \
                or len(points) != len(template.pieces) - 1 \
                or not all(p.time_unix_nano for p in points):
            return None
        return template.fill(points)

    def attributes(self, attributes: Mapping[str, Any] | None) -> bytes:
        """The attributes as encoded fields of a data point (``attributes = 7``)."""
        if not attributes:
            return b""
        key = tuple(x for k, v in attributes.items() for x in (k, v.__class__, v))  # flat: small
        plain = all(c in _PLAIN for c in key[1::3])  # inside sequences, 1 == True
        encoded = self._by_content.get(key) if plain else None
        if encoded is None:
            encoded = pb.NumberDataPoint(attributes=self._key_values(attributes)
                                         ).SerializeToString()
            if plain:
                if len(self._by_content) >= self._max:
                    self._by_content.clear()
                self._by_content[key] = encoded
        return encoded

    def _key_values(self, attributes: Mapping[str, Any]) -> list[KeyValue]:
        out = []
        for key, value in attributes.items():
            try:
                out.append(KeyValue(key=key, value=any_value(value)))
            except ValueError as exc:  # the SDK's encoder leaves such a key out too
                self._limited.log(("value", key), logging.WARNING,
                                  "attribute %s left out of OTLP: %s", key, exc)
        return out

    def _request(self, data: MetricsData, series: SeriesData | None) -> _Message:
        heads = None if series is None else self._heads.of(series)
        ids = None if series is None else iter(series.ids)
        # as the SDK's encoder: one entry per distinct Resource, the later one winning
        by_resource: dict[Any, dict[Any, _Message]] = {}
        for rm in data.resource_metrics:
            scopes: dict[Any, _Message] = {}
            by_resource[rm.resource] = scopes
            for sm in rm.scope_metrics:
                scope = sm.scope
                message = _Message()
                message.add(pb.ScopeMetrics(
                    scope=InstrumentationScope() if scope is None else InstrumentationScope(
                        name=scope.name, version=scope.version or "",
                        attributes=self._key_values(scope.attributes or {})),
                    schema_url=scope.schema_url or "").SerializeToString())
                for metric in sm.metrics:
                    metric_ids = None if ids is None else next(ids)
                    message.field(_METRICS, self._metric(metric, metric_ids, heads))
                scopes[scope] = message
        request = _Message()
        for resource, scopes in by_resource.items():
            entry = _Message()
            entry.add(pb.ResourceMetrics(
                resource=Resource(attributes=self._key_values(resource.attributes)),
                schema_url=resource.schema_url).SerializeToString())
            for scope_message in scopes.values():
                entry.field(_SCOPE_METRICS, scope_message)
            request.field(_RESOURCE_METRICS, entry)
        return request

    def _metric(self, metric: Any, ids: tuple[int, ...] | None,
                heads: list[Any] | None) -> _Message:
        message = _Message()
        message.add(pb.Metric(name=metric.name, description=metric.description,
                              unit=metric.unit).SerializeToString())
        data = metric.data
        is_sum = isinstance(data, Sum)
        if not is_sum and not isinstance(data, Gauge):
            raise _Unsupported
        points = data.data_points
        self._points += len(points)
        if not points:  # a metric without points carries no data field, as the SDK writes it
            return message
        body = _Message()
        for index, point in enumerate(points):
            if point.exemplars:
                raise _Unsupported
            series = None if ids is None or heads is None else ids[index]
            known = None if series is None or heads is None else heads[series]
            if known is not None and known[0] is point.attributes \
                    and known[1] == point.start_time_unix_nano:
                head = known[2]
            else:
                head = self._head(point, is_sum)
                if series is not None and heads is not None:
                    heads[series] = (point.attributes, point.start_time_unix_nano, head)
            body.add(head)
            body.hole()
        if is_sum:
            tail = b""
            if data.aggregation_temporality:
                tail += _TEMPORALITY + _varint(int(data.aggregation_temporality))
            if data.is_monotonic:
                tail += _MONOTONIC
            body.add(tail)
            message.field(_SUM, body)
        else:
            message.field(_GAUGE, body)
        return message

    def _head(self, point: Any, is_sum: bool) -> bytes:
        """A point's field up to its time: the tag, the length, attributes and start."""
        head = self.attributes(point.attributes)
        if is_sum and point.start_time_unix_nano:
            head += _START + _U64.pack(point.start_time_unix_nano)
        return _DATA_POINTS + _varint(len(head) + _TIME_SIZE + _VALUE_SIZE) + head


def _flat(data: MetricsData) -> list[Any]:
    """Every metric in the order the request is written, but resources merged as the
    SDK merges them: one entry per distinct Resource, in its first place, the later
    entry's scopes and metrics replacing the earlier one's."""
    by_resource: dict[Any, dict[Any, list[Any]]] = {}
    for rm in data.resource_metrics:
        scopes: dict[Any, list[Any]] = {}
        by_resource[rm.resource] = scopes
        for sm in rm.scope_metrics:
            scopes[sm.scope] = list(sm.metrics)
    return [m for scopes in by_resource.values() for metrics in scopes.values() for m in metrics]
