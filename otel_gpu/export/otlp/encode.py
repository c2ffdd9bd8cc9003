"""OTLP encoding with each attribute set encoded once, not once per push.

The SDK's OTLP exporters build a protobuf ``KeyValue`` for every attribute of
every data point on every export: a GPU's twelve attributes, on each of its
hundred series, each push, which costs more CPU than the collection itself.
:class:`Encoder` writes the same ``ExportMetricsServiceRequest`` as the SDK's
encoder for gauges and sums, remembering each attribute set's encoded
attributes (bounded); a collection holding anything else (histograms,
exemplars) goes to the SDK's encoder whole. The exporter
(:mod:`otel_gpu.export.otlp.client`) sends :meth:`Encoder.serialize`'s bytes as
they are. ``tests/export/otlp/test_encode.py`` holds it to the SDK's encoder.
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

log = logging.getLogger(__name__)

MAX_ATTRIBUTE_SETS = 100_000
"""Encoded attribute sets remembered at most; past this, the memory starts over. It also
starts over when it holds well over the points of the last push (finished pods' sets)."""
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


class Encoder:
    """Gauges and sums to an ``ExportMetricsServiceRequest``, attribute sets encoded once.

    Each point's encoded attributes are remembered by the attributes object
    (the SDK hands back the same one for a series each collection) and by
    their content, types included (the pod regrouping makes new ones); the
    request is written in protobuf's wire format and parsed once.
    """

    def __init__(self, max_sets: int = MAX_ATTRIBUTE_SETS) -> None:
        self._max = max_sets
        self._by_id: dict[int, tuple[Any, bytes]] = {}
        self._by_content: dict[tuple, bytes] = {}
        self._points = 0
        self._limited = LogLimiter(log, 300.0)

    def encode(self, data: MetricsData) -> ExportMetricsServiceRequest:
        """The request, as a message."""
        return ExportMetricsServiceRequest.FromString(self.serialize(data))

    def serialize(self, data: MetricsData) -> bytes:
        """The request in protobuf's wire format: what is sent (the same message as the SDK's
        encoder makes, its fields in the order written here)."""
        self._points = 0
        try:
            return self._request(data)
        except Exception:  # noqa: BLE001 - histograms, exemplars, odd values: the SDK's way
            return encode_metrics(data).SerializeToString()
        finally:
            # sets this push did not use (finished pods', dicts the regrouping made) go
            bound = 2 * self._points + 64
            if len(self._by_id) > bound:
                self._by_id.clear()
            if len(self._by_content) > 2 * bound:
                self._by_content.clear()

    def attributes(self, attributes: Mapping[str, Any] | None) -> bytes:
        """The attributes as encoded fields of a data point (``attributes = 7``)."""
        if not attributes:
            return b""
        found = self._by_id.get(id(attributes))
        if found is not None and found[0] is attributes:
            return found[1]
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
        if len(self._by_id) >= self._max:
            self._by_id.clear()
        self._by_id[id(attributes)] = (attributes, encoded)  # held: its id stays its own
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

    def _request(self, data: MetricsData) -> bytes:
        # as the SDK's encoder: one entry per distinct Resource, the later one winning
        by_resource: dict[Any, dict[Any, bytes]] = {}
        for rm in data.resource_metrics:
            scopes: dict[Any, bytes] = {}
            by_resource[rm.resource] = scopes
            for sm in rm.scope_metrics:
                scope = sm.scope
                head = pb.ScopeMetrics(
                    scope=InstrumentationScope() if scope is None else InstrumentationScope(
                        name=scope.name, version=scope.version or "",
                        attributes=self._key_values(scope.attributes or {})),
                    schema_url=scope.schema_url or "").SerializeToString()
                scopes[scope] = head + b"".join(
                    _field(_METRICS, self._metric(m)) for m in sm.metrics)
        out = []
        for resource, scopes in by_resource.items():
            head = pb.ResourceMetrics(
                resource=Resource(attributes=self._key_values(resource.attributes)),
                schema_url=resource.schema_url).SerializeToString()
            body = b"".join(_field(_SCOPE_METRICS, s) for s in scopes.values())
            out.append(_field(_RESOURCE_METRICS, head + body))
        return b"".join(out)

    def _metric(self, metric: Any) -> bytes:
        head = pb.Metric(name=metric.name, description=metric.description,
                         unit=metric.unit).SerializeToString()
        data = metric.data
        is_sum = isinstance(data, Sum)
        if not is_sum and not isinstance(data, Gauge):
            raise _Unsupported
        points = []
        attributes, u64, i64, f64 = self.attributes, _U64.pack, _I64.pack, _F64.pack
        self._points += len(data.data_points)
        for point in data.data_points:
            if point.exemplars:
                raise _Unsupported
            value = point.value
            parts = [attributes(point.attributes)]
            if is_sum and point.start_time_unix_nano:
                parts.append(_START + u64(point.start_time_unix_nano))
            if point.time_unix_nano:
                parts.append(_TIME + u64(point.time_unix_nano))
            parts.append(_INT + i64(value) if isinstance(value, int) else _DOUBLE + f64(value))
            points.append(_field(_DATA_POINTS, b"".join(parts)))
        if not points:  # a metric without points carries no data field, as the SDK writes it
            return head
        if is_sum:
            tail = b""
            if data.aggregation_temporality:
                tail += _TEMPORALITY + _varint(int(data.aggregation_temporality))
            if data.is_monotonic:
                tail += _MONOTONIC
            return head + _field(_SUM, b"".join(points) + tail)
        return head + _field(_GAUGE, b"".join(points))
