"""The series table: every (instrument, attributes) of one collection once, by a dense id.

The collector's speed rests on one fact: while devices and pods stay, a series'
attributes are the same object every collection. This module is the only place
that relies on it. :class:`SeriesTable` gives each series an id the first time
its content is seen and recognises it afterwards (by identity while the object
is the same, by content when a new object comes); the collection hands the
writers (id, value) columns in :class:`SeriesData`, and each writer keeps what
it derives from a series (its text, its encoded attributes, its workload) in a
list indexed by that id. Nothing else keys work on an object's ``id()``.

Invalidation is one place: the table belongs to one MeterProvider's direct
collection, and the pipeline's rebuild (:meth:`otel_gpu.instrument.telemetry.
Telemetry.rebuild`) makes a new provider, hence a new table; a writer seeing
another table drops its lists. The bound is written once too: an instrument
holds at most its cardinality limit of series (sized from the node by
:mod:`otel_gpu.instrument.cardinality`) plus the overflow series, so a table
holds at most ``instruments x (limit + 1)`` series, and so does every list
indexed by its ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import is_
from typing import Any

from opentelemetry.sdk.metrics.export import MetricsData

OVERFLOW: dict[str, Any] = {"otel.metric.overflow": True}
"""The attributes of the series the SDK folds sets past the limit into."""


class _Content:
    """A series' attributes as a key: equal when their contents are (as the SDK's
    ``frozenset`` of items, so ``1`` and ``True`` are one series), hashed once."""

    __slots__ = ("attributes", "hash")

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        self.attributes = attributes
        self.hash = hash(frozenset(attributes.items()))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Content) and self.attributes == other.attributes


def _kept(attributes: Mapping[str, Any]) -> Mapping[str, Any]:
    """The attributes as a series keeps them: the object itself (its maker never changes
    it), or a copy with list values as tuples, as the SDK keeps them."""
    if any(isinstance(v, list) for v in attributes.values()):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in attributes.items()}
    return attributes


class Stream:
    """One instrument's series in the table, in the order they were first seen."""

    __slots__ = ("_last", "_order", "adds", "by_content", "ids", "limit", "table")

    def __init__(self, table: SeriesTable, limit: int, adds: bool) -> None:
        self.table = table
        self.limit = limit
        self.adds = adds
        """Whether a series observed twice in one collection is summed (a sum's)."""
        self.by_content: dict[_Content, int] = {}
        self._order: list[int] = []
        """Every series id of this instrument, first seen first."""
        self._last: tuple[list[Any], list[int]] | None = None
        """The attribute objects of the last observation, in order, and their ids (all
        distinct): the same objects in the same order have the same ids."""
        self.ids: tuple[int, ...] = ()
        """The ids the last collection wrote, in the order written (the same object while
        they do not change)."""

    def values(self, pairs: list[tuple[float, Any]], now: int) -> tuple[dict[int, float], bool]:
        """Each series' value in ``pairs`` (summed where a series comes twice and the
        instrument adds), and whether the pairs were the last ones' objects in order.
        Non-finite values are the caller's to leave out first."""
        last = self._last
        if last is not None and len(pairs) == len(last[0]) \
                and all(map(is_, [a for _, a in pairs], last[0])):
            return dict(zip(last[1], [v for v, _ in pairs], strict=True)), True
        return self._slow(pairs, now), False

    def _slow(self, pairs: list[tuple[float, Any]], now: int) -> dict[int, float]:
        got: dict[int, float] = {}
        seen: list[Any] = []
        found: list[int] = []
        adds = self.adds
        for value, attrs in pairs:
            seen.append(attrs)
            series = self._id(attrs or {}, now)
            found.append(series)
            got[series] = got.get(series, 0) + value if adds else value
        # a series twice (a counter's points summed) is not a zip
        self._last = (seen, found) if len(got) == len(found) else None
        return got

    def forget_last(self) -> None:
        """The next observation is compared by content (a callback that raised)."""
        self._last = None

    def _id(self, attrs: Mapping[str, Any], now: int) -> int:
        kept = _kept(attrs)
        key = _Content(kept)
        found = self.by_content.get(key)
        if found is not None:
            return found
        if len(self.by_content) >= self.limit:
            key = _Content(OVERFLOW)
            found = self.by_content.get(key)
            if found is not None:
                return found
            kept = dict(OVERFLOW)
        found = self.by_content[key] = self.table.add(kept, now)
        self._order.append(found)
        return found

    def written(self, got: Mapping[int, float], same: bool) -> tuple[int, ...]:
        """The ids to write for ``got``, first seen first: the last tuple itself when
        ``same`` (the same objects as last time: the same ids)."""
        if not (same and self.ids):
            ids = tuple(i for i in self._order if i in got)
            if ids != self.ids:
                self.ids = ids
        return self.ids


class SeriesTable:
    """Every series of one collection: its attributes and start time, by id."""

    __slots__ = ("attributes", "starts")

    def __init__(self) -> None:
        self.attributes: list[Mapping[str, Any]] = []
        self.starts: list[int] = []

    def __len__(self) -> int:
        return len(self.attributes)

    def stream(self, limit: int, adds: bool) -> Stream:
        """A new instrument's series (``adds``: a point observed twice is summed)."""
        return Stream(self, limit, adds)

    def add(self, attributes: Mapping[str, Any], start: int) -> int:
        self.attributes.append(attributes)
        self.starts.append(start)
        return len(self.attributes) - 1


@dataclass(frozen=True)
class SeriesData(MetricsData):
    """A collection with its series ids: ``ids[i]`` are the ids of the points of the
    ``i``-th metric (resource, scope, metric order), ``layout`` the same object while
    every metric writes the same series in the same order, ``table`` the ids' table."""

    ids: Sequence[tuple[int, ...]] = ()
    layout: object = None
    table: SeriesTable | None = field(default=None, compare=False)


class SeriesColumns:
    """A writer's list of what it derives from each series, indexed by id, dropped when
    the table changes (a rebuild)."""

    __slots__ = ("_table", "values")

    def __init__(self) -> None:
        self._table: SeriesTable | None = None
        self.values: list[Any] = []

    def of(self, data: SeriesData) -> list[Any]:
        """The list for ``data``'s table, as long as the table (new ids as None)."""
        table = data.table
        if table is not self._table:
            self._table = table
            self.values = []
        values = self.values
        size = len(table) if table is not None else 0
        if len(values) < size:
            values.extend([None] * (size - len(values)))
        return values


def flat_metrics(data: MetricsData) -> Iterable[Any]:
    """Every metric of ``data`` in the order :attr:`SeriesData.ids` counts them."""
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            yield from sm.metrics
