"""One cumulative collection of the catalog's instruments, without the SDK's per-point path.

The SDK turns every observation into a Measurement whose attributes it cleans,
copies and hashes, then aggregates it, once per point and collection: at one
GPU that is most of a sample's CPU, and the attribute sets it works on change
only when devices or pods do. :class:`DirectCollection` makes what the SDK's
collection for a cumulative reader makes (the same metrics, in the same
order, with the same points, attribute objects, start times and overflow
series) from the same callbacks, keeping each series' attributes and start
time from the collection that first saw it. It serves the reader the
exposition and the OTLP push are written from
(:class:`otel_gpu.export.collected.CollectingReader`); any other reader (OTLP
with delta temporality) still collects through the SDK.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from time import time_ns
from typing import Any, Protocol, runtime_checkable

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu._sdk import number_points
from otel_gpu.instrument.schema import Kind
from otel_gpu.instrument.series import SeriesData, SeriesTable, Stream

log = logging.getLogger(__name__)

DEFAULT_CARDINALITY_LIMIT = 2000
"""The SDK's limit of attribute sets per metric and reader when no view sets one."""

Observe = Callable[[], Iterable[tuple[float, Any]]]
"""One instrument's callback: its points now, (value, attributes)."""


@runtime_checkable
class CollectsDirectly(Protocol):
    """A reader that collects through a :class:`DirectCollection` once it is handed one."""

    def collect_with(self, collect: Callable[[], MetricsData | None]) -> None: ...



class _Stream:
    """One instrument: the SDK's instrument, its kind, its callback and its series."""

    __slots__ = ("instrument", "kind", "observe", "series")

    def __init__(self, instrument: Any, kind: Kind, observe: Observe, series: Stream) -> None:
        self.instrument = instrument
        self.kind = kind
        self.observe = observe
        self.series = series


class DirectCollection:
    """The cumulative collection of ``instruments`` (each an SDK instrument, the kind of its
    catalog row, and its callback), as the SDK makes it for a cumulative reader, with its
    series ids (:class:`~otel_gpu.instrument.series.SeriesData`)."""

    def __init__(self, resource: Resource, instruments: Sequence[tuple[Any, Kind, Observe]],
                 cardinality_limit: int | None = None) -> None:
        self._resource = resource
        limit = DEFAULT_CARDINALITY_LIMIT if cardinality_limit is None else cardinality_limit
        self.table = SeriesTable()
        self._streams = [_Stream(i, kind, observe, self.table.stream(limit, kind is not Kind.GAUGE))
                         for i, kind, observe in instruments]
        self._seen: dict[int, _Stream] = {}
        """The streams that observed something, in the order of their first observation (the
        SDK's order of metrics)."""
        self._layout: tuple[object, tuple[int, ...]] = (object(), ())
        """The last collection's layout token and the streams it wrote."""
        self._lock = threading.Lock()

    def collect(self) -> SeriesData | None:
        """Every instrument's callback once; None while none has a point."""
        with self._lock:
            now = time_ns()
            values: dict[int, tuple[dict[int, float], bool]] = {}
            for index, stream in enumerate(self._streams):
                observed = self._observe(stream, now)
                if observed is not None:
                    values[index] = observed
                    self._seen.setdefault(index, stream)
            collected = time_ns()
            attributes, starts = self.table.attributes, self.table.starts
            scopes: dict[Any, list[Metric]] = {}
            ids: list[tuple[int, ...]] = []
            written: list[int] = []
            changed = False
            for index, stream in self._seen.items():
                observed = values.get(index)
                if not observed:
                    continue
                got, same = observed
                before = stream.series.ids
                order = stream.series.written(got, same)
                changed = changed or order is not before
                gauge = stream.kind is Kind.GAUGE
                points = number_points(order, attributes, None if gauge else starts, collected,
                                       got)
                instrument = stream.instrument
                data: Gauge | Sum
                if gauge:
                    data = Gauge(data_points=points)
                else:
                    data = Sum(data_points=points,
                               aggregation_temporality=AggregationTemporality.CUMULATIVE,
                               is_monotonic=stream.kind is Kind.COUNTER)
                metric = Metric(name=instrument.name, description=instrument.description,
                                unit=instrument.unit, data=data)
                scopes.setdefault(instrument.instrumentation_scope, []).append(metric)
                written.append(index)
            if not scopes:
                return None
            layout, last = self._layout
            if changed or tuple(written) != last:
                layout = object()
                self._layout = (layout, tuple(written))
            # ids in the order the metrics are written: grouped by scope, as below
            by_scope: dict[Any, list[tuple[int, ...]]] = {}
            for index in written:
                stream = self._streams[index]
                by_scope.setdefault(stream.instrument.instrumentation_scope, []).append(
                    stream.series.ids)
            for scope_ids in by_scope.values():
                ids.extend(scope_ids)
            return SeriesData(resource_metrics=[ResourceMetrics(
                resource=self._resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics,
                                            schema_url=scope.schema_url)
                               for scope, metrics in scopes.items()],
                schema_url=self._resource.schema_url)],
                ids=ids, layout=layout, table=self.table)

    def _observe(self, stream: _Stream, now: int) -> tuple[dict[int, float], bool] | None:
        """This collection's value per series id and whether its attribute objects were the
        last ones' (None: no observation); a callback that raises is logged and counts as
        none, as the SDK does. Every instrument is enabled: the MeterProvider is built
        without a meter configurator."""
        try:
            pairs = stream.observe()
            if not isinstance(pairs, list):
                pairs = list(pairs)
            if not all(math.isfinite(value) for value, _ in pairs):
                for value, _ in pairs:
                    if not math.isfinite(value):
                        log.warning("Callback returned a non-finite value %s for instrument "
                                    "%s, ignoring measurement.", value, stream.instrument.name)
                pairs = [pair for pair in pairs if math.isfinite(pair[0])]
            if pairs:
                return stream.series.values(pairs, now)
        except Exception:  # a callback's bug, or a value or attribute of no usable type
            log.exception("Callback failed for instrument %s.", stream.instrument.name)
        stream.series.forget_last()
        return None
