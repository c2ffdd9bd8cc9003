"""The series table: each (instrument, attributes) once, a dense id, one place of identity."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_gpu.instrument.direct import DirectCollection
from otel_gpu.instrument.schema import Kind
from otel_gpu.instrument.series import OVERFLOW, SeriesColumns, SeriesData, SeriesTable

ROOT = Path(__file__).resolve().parents[2] / "otel_gpu"


def _id_calls(root: Path = ROOT) -> list[str]:
    """Every call of the builtin ``id()`` in the collector."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "id":
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_module_keys_its_work_on_id():
    """Work kept per series lives in lists indexed by the table's ids: a cache keyed on
    ``id()`` is an unwritten contract with whoever makes the object (the old tree had 12)."""
    assert _id_calls() == []


def _instrument(name: str = "g") -> SimpleNamespace:
    return SimpleNamespace(name=name, description="d", unit="1",
                           instrumentation_scope=InstrumentationScope("otel_gpu"))


def test_ids_are_dense_first_seen_and_one_per_content_across_instruments():
    pods = [{"k8s.pod.name": f"p{i}"} for i in range(3)]
    collection = DirectCollection(Resource({}), [
        (_instrument("a"), Kind.GAUGE, lambda: [(1.0, p) for p in pods]),
        (_instrument("b"), Kind.COUNTER, lambda: [(2.0, p) for p in reversed(pods)])])
    first = collection.collect()
    assert isinstance(first, SeriesData)
    assert [list(ids) for ids in first.ids] == [[0, 1, 2], [3, 4, 5]]
    pods[1] = dict(pods[1])  # a new object of the same content: the same series
    again = collection.collect()
    assert again is not None and [list(ids) for ids in again.ids] == [[0, 1, 2], [3, 4, 5]]
    assert len(collection.table) == 6
    # found by content, written as the first seen: nothing a writer writes changed
    assert again.layout is first.layout
    points = again.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert points[1].attributes is not pods[1] and points[1].attributes == pods[1]
    pods.append({"k8s.pod.name": "p3"})
    assert collection.collect().layout is not first.layout


def test_an_instrument_holds_at_most_its_limit_of_series_then_the_overflow_series():
    """The table's bound: instruments x (cardinality limit + 1)."""
    n = {"next": 0}

    def fresh():
        n["next"] += 1
        return [(1.0, {"k8s.pod.name": f"p{n['next']}-{i}"}) for i in range(4)]

    collection = DirectCollection(Resource({}), [(_instrument(), Kind.GAUGE, fresh)],
                                  cardinality_limit=5)
    for _ in range(10):
        collection.collect()
    assert len(collection.table) == 6
    assert OVERFLOW in collection.table.attributes


def test_a_writers_columns_follow_the_table_they_were_made_for():
    table, other = SeriesTable(), SeriesTable()
    for attrs in ({"a": 1}, {"a": 2}):
        table.add(attrs, 0)
    columns = SeriesColumns()
    values = columns.of(SeriesData(resource_metrics=[], table=table))
    assert values == [None, None]
    values[1] = "kept"
    table.add({"a": 3}, 0)
    assert columns.of(SeriesData(resource_metrics=[], table=table)) == [None, "kept", None]
    other.add({"a": 1}, 0)
    assert columns.of(SeriesData(resource_metrics=[], table=other)) == [None]
