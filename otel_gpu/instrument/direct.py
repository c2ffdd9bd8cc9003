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
from operator import is_
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

from otel_gpu._sdk import number_point
from otel_gpu.instrument.schema import Kind

log = logging.getLogger(__name__)

DEFAULT_CARDINALITY_LIMIT = 2000
"""The SDK's limit of attribute sets per metric and reader when no view sets one."""
OVERFLOW: dict[str, Any] = {"otel.metric.overflow": True}
"""The attributes of the series the SDK folds sets past the limit into."""
_OVERFLOW_KEY = (("otel.metric.overflow", True),)

Observe = Callable[[], Iterable[tuple[float, Any]]]
"""One instrument's callback: its points now, (value, attributes)."""


@runtime_checkable
class CollectsDirectly(Protocol):
    """A reader that collects through a :class:`DirectCollection` once it is handed one."""

    def collect_with(self, collect: Callable[[], MetricsData | None]) -> None: ...


_point = number_point


def _key(attrs: Any) -> tuple:
    """A series' key: its attributes sorted, a list value as a tuple (as the SDK keeps
    it), so that the key can be hashed."""
    key = tuple(sorted(attrs.items()))
    try:
        hash(key)
    except TypeError:
        key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in key)
    return key


def _kept(attrs: Any) -> dict[str, Any]:
    """A series' attributes as kept: a copy, in their own order, list values as tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}


class _Stream:
    """One instrument's series, in the order they were first seen."""

    __slots__ = ("instrument", "kind", "last", "observe", "series")

    def __init__(self, instrument: Any, kind: Kind, observe: Observe) -> None:
        self.instrument = instrument
        self.kind = kind
        self.observe = observe
        self.series: dict[tuple, tuple[dict[str, Any], int, tuple]] = {}
        """key -> (the series' attributes, its start time, the key itself), first seen first:
        an equal key made anew is swapped for the kept one, so that the last keys (below)
        hold no second copy of them."""
        self.last: tuple[list[Any], list[tuple]] | None = None
        """The attribute objects the last collection kept, in order, and their series keys
        (all distinct): a collection of the same objects in the same order, all its values
        finite, has the same keys, and is zipped with them."""


class DirectCollection:
    """The cumulative collection of ``instruments`` (each an SDK instrument, the kind of its
    catalog row, and its callback), as the SDK makes it for a cumulative reader."""

    def __init__(self, resource: Resource, instruments: Sequence[tuple[Any, Kind, Observe]],
                 cardinality_limit: int | None = None) -> None:
        self._resource = resource
        self._streams = [_Stream(i, kind, observe) for i, kind, observe in instruments]
        self._limit = DEFAULT_CARDINALITY_LIMIT if cardinality_limit is None \
            else cardinality_limit
        self._seen: dict[int, _Stream] = {}
        """The streams that observed something, in the order of their first observation (the
        SDK's order of metrics)."""
        self._lock = threading.Lock()

    def collect(self) -> MetricsData | None:
        """Every instrument's callback once; None while none has a point."""
        with self._lock:
            now = time_ns()
            values: dict[int, dict[tuple, float]] = {}
            for index, stream in enumerate(self._streams):
                observed = self._observe(stream, now)
                if observed is not None:
                    values[index] = observed
                    self._seen.setdefault(index, stream)
            collected = time_ns()
            scopes: dict[Any, list[Metric]] = {}
            for index, stream in self._seen.items():
                got = values.get(index)
                if not got:
                    continue
                gauge = stream.kind is Kind.GAUGE
                points = [_point(attrs, None if gauge else start, collected, got[key])
                          for key, (attrs, start, _) in stream.series.items() if key in got]
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
            if not scopes:
                return None
            return MetricsData(resource_metrics=[ResourceMetrics(
                resource=self._resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics,
                                            schema_url=scope.schema_url)
                               for scope, metrics in scopes.items()],
                schema_url=self._resource.schema_url)])

    def _observe(self, stream: _Stream, now: int) -> dict[tuple, float] | None:
        """This collection's value per series key (None: no observation); a callback that
        raises is logged and counts as none, as the SDK does. Every instrument is enabled:
        the MeterProvider is built without a meter configurator."""
        got: dict[tuple, float] = {}
        series, adds = stream.series, stream.kind is not Kind.GAUGE
        seen: list[Any] = []
        found: list[tuple] = []
        try:
            pairs = stream.observe()
            if not isinstance(pairs, list):
                pairs = list(pairs)
            last = stream.last
            if last is not None and pairs and len(pairs) == len(last[0]):
                values = [value for value, _ in pairs]
                if all(map(is_, [attrs for _, attrs in pairs], last[0])) \
                        and all(map(math.isfinite, values)):
                    return dict(zip(last[1], values, strict=True))
            for value, attrs in pairs:
                if not math.isfinite(value):
                    log.warning("Callback returned a non-finite value %s for instrument %s, "
                                "ignoring measurement.", value, stream.instrument.name)
                    continue
                seen.append(attrs)
                attrs = attrs or {}
                key = _key(attrs)
                kept = series.get(key)
                if kept is None:
                    if len(series) >= self._limit:
                        key = _OVERFLOW_KEY
                        kept = series.get(key)
                        if kept is None:
                            kept = series[key] = (dict(OVERFLOW), now, key)
                    else:
                        kept = series[key] = (_kept(attrs), now, key)
                key = kept[2]
                found.append(key)
                got[key] = got.get(key, 0) + value if adds else value
        except Exception:
            log.exception("Callback failed for instrument %s.", stream.instrument.name)
        # what was kept, in order: the same objects next time have the same keys (a pair
        # left out or raising makes the list shorter, which the next one will not match
        # unless it lacks that pair too); a key twice (a counter's points summed) is not
        # a zip
        stream.last = (seen, found) if len(got) == len(found) else None
        return got or None
