"""Where otel-gpu reaches past the OpenTelemetry SDK's public API: every such place is here.

Everything else extends the SDK through its public classes. What remains is
held by ``tests/instrument/test_sdk_crossing.py``, which fails (rather than a
fallback going quiet) when an SDK release changes the shape relied on, and
scans ``otel_gpu/`` so that no other module adds a crossing:

- :func:`number_point` and :func:`number_points`: the direct collection's
  points, filled in without the frozen dataclass's per-field ``__setattr__``
  (a third of the constructor's cost, on every point of every collection);
- the logs signal (:data:`LOG_NAMES`): this SDK line publishes it only under
  underscore modules (``opentelemetry._logs``, ``opentelemetry.sdk._logs``,
  the OTLP exporters' ``_log_exporter``), the names its own documentation
  uses; they are imported on first use, as the SDK's logs module reads
  variables at import time (after :mod:`otel_gpu.export.sdk_env` checks them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import NumberDataPoint

if TYPE_CHECKING:
    from opentelemetry._logs import SeverityNumber
    from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
    from opentelemetry.sdk._logs.export import (
        BatchLogRecordProcessor,
        LogRecordExporter,
        LogRecordExportResult,
    )

__all__ = [
    "FILLS_POINTS", "LOG_NAMES", "BatchLogRecordProcessor", "LogRecordExportResult",
    "LogRecordExporter", "LoggerProvider", "ReadableLogRecord", "SeverityNumber",
    "log_exporter_class", "number_point", "number_points",
]


# --- the direct collection's points ----------------------------------------------------------

def _made_point(attributes: Any, start: int | None, time: int, value: float) -> NumberDataPoint:
    return NumberDataPoint(attributes=attributes, exemplars=[],
                           start_time_unix_nano=start,  # type: ignore[arg-type]
                           time_unix_nano=time, value=value)


_new = object.__new__


def _filled_point(attributes: Any, start: int | None, time: int,
                  value: float) -> NumberDataPoint:
    """The point the constructor makes, its fields set in its ``__dict__``: the frozen
    dataclass's constructor sets each field through ``object.__setattr__``."""
    made = _new(NumberDataPoint)
    fields = made.__dict__
    fields["attributes"] = attributes
    fields["start_time_unix_nano"] = start
    fields["time_unix_nano"] = time
    fields["value"] = value
    fields["exemplars"] = []
    return made


def _made_points(ids: Iterable[int], attributes: Sequence[Any], starts: Sequence[int] | None,
                 time: int, values: Mapping[int, float]) -> list[NumberDataPoint]:
    return [_made_point(attributes[i], None if starts is None else starts[i], time, values[i])
            for i in ids]


def _filled_points(ids: Iterable[int], attributes: Sequence[Any], starts: Sequence[int] | None,
                   time: int, values: Mapping[int, float]) -> list[NumberDataPoint]:
    """:func:`_filled_point` for many series in one frame (a call per point is a fifth of
    the point's cost)."""
    out = []
    new, point = _new, NumberDataPoint
    for i in ids:
        made = new(point)
        fields = made.__dict__
        fields["attributes"] = attributes[i]
        fields["start_time_unix_nano"] = None if starts is None else starts[i]
        fields["time_unix_nano"] = time
        fields["value"] = values[i]
        fields["exemplars"] = []
        out.append(made)
    return out


def _fills_points() -> bool:
    """Whether a filled point is the constructor's (same type, fields and equality): false
    where the SDK's point gains a field, slots or a constructor that does more."""
    try:
        sample = ({"a": 1}, 1, 2, 3.0)
        filled, made = _filled_point(*sample), _made_point(*sample)
        (batch,) = _filled_points([0], [{"a": 1}], [1], 2, {0: 3.0})
        return filled == made == batch and vars(filled) == vars(made) == vars(batch)
    except (TypeError, AttributeError):
        return False


FILLS_POINTS = _fills_points()
"""With the installed SDK, the fast fill makes the constructor's points (a test holds it)."""
number_point: Callable[[Any, int | None, int, float], NumberDataPoint] = (
    _filled_point if FILLS_POINTS else _made_point)
"""A cumulative or gauge point: (attributes, start time or None, time, value)."""
number_points: Callable[[Iterable[int], Sequence[Any], Sequence[int] | None, int,
                         Mapping[int, float]], list[NumberDataPoint]] = (
    _filled_points if FILLS_POINTS else _made_points)
"""The points of series ``ids``: (ids, attributes by id, start times by id or None for a
gauge, time, values by id)."""


# --- the logs signal -------------------------------------------------------------------------

LOG_NAMES: dict[str, str] = {
    "SeverityNumber": "opentelemetry._logs",
    "LoggerProvider": "opentelemetry.sdk._logs",
    "ReadableLogRecord": "opentelemetry.sdk._logs",
    "BatchLogRecordProcessor": "opentelemetry.sdk._logs.export",
    "LogRecordExporter": "opentelemetry.sdk._logs.export",
    "LogRecordExportResult": "opentelemetry.sdk._logs.export",
}
"""Each logs name used, and the module the SDK publishes it in."""
_LOG_EXPORTERS = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
    "http": "opentelemetry.exporter.otlp.proto.http._log_exporter",
}


def __getattr__(name: str) -> Any:
    """The logs names, imported on first use."""
    module = LOG_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def log_exporter_class(transport: str) -> type[LogRecordExporter]:
    """The SDK's OTLP log exporter for ``grpc`` or ``http``."""
    exporter: type[LogRecordExporter] = importlib.import_module(
        _LOG_EXPORTERS[transport]).OTLPLogExporter
    return exporter
