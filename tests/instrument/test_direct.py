"""The direct collection is the SDK's cumulative collection, point for point.

Both are made side by side from one MeterProvider: a CollectingReader (direct) and a
cumulative reader the SDK collects, on the same snapshots, through pods coming and going,
a metric appearing late, a failing callback, non-finite values and the overflow series.
"""

from __future__ import annotations

import logging

from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData

from otel_gpu.export.collected import CollectingReader
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.instrument.direct import DirectCollection
from otel_gpu.instrument.schema import Kind, Metric
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from testkit.scenarios import Node, gpu_uuids, time_sliced_pods, write_scenario


def _shape(data: MetricsData | None) -> list:
    """Everything a writer reads, in order; start times as whether they are set."""
    if data is None:
        return []
    out: list = []
    for rm in data.resource_metrics:
        out.append(("resource", dict(rm.resource.attributes), rm.schema_url))
        for sm in rm.scope_metrics:
            out.append(("scope", sm.scope, sm.schema_url))
            for m in sm.metrics:
                kind = type(m.data).__name__
                extra = (m.data.aggregation_temporality, m.data.is_monotonic) \
                    if kind == "Sum" else ()
                out.append((m.name, m.description, m.unit, kind, *extra, [
                    (list(p.attributes.items()), p.value, p.start_time_unix_nano is None,
                     p.exemplars) for p in m.data.data_points]))
    return out


def _pair(latest, catalog=CATALOG, limit=None):
    direct, sdk = CollectingReader(), InMemoryMetricReader()
    provider = build_meter_provider(build_resource(environ={}), [direct, sdk], latest,
                                    clock=lambda: 50.0, catalog=catalog,
                                    cardinality_limit=limit)
    return provider, direct, sdk


def test_the_catalog_on_a_simulated_node_with_pods_coming_and_going(fake_nvml, tmp_path):
    from otel_gpu.config import load
    from otel_gpu.sample.library import Nvml
    from otel_gpu.wiring import Service
    from testkit.kubelet import FakeKubelet

    scenario = write_scenario(Node("mixed", 4, mig=2), tmp_path)
    fake_nvml(scenario)

    kubelet = FakeKubelet(str(tmp_path / "kubelet.sock"))
    uuids = gpu_uuids(scenario)
    kubelet.set_pods(time_sliced_pods(uuids, 6))
    kubelet.start()
    config = load({"listen": "127.0.0.1:0", "kubelet_socket": str(kubelet.socket_path),
                   "kubelet_interval": "1h"}, environ={})
    service = Service(config, Nvml(), environ={})
    provider = None
    try:
        service.nvml.init()
        assert service.enricher is not None
        state = {"snap": None}
        provider, direct, sdk = _pair(lambda: state["snap"])
        assert direct.collect_now() is None and sdk.get_metrics_data() is None
        for pods in (6, 0, 3, 6):
            kubelet.set_pods(time_sliced_pods(uuids, pods))
            service.enricher.watcher.poll_once()
            service.pipeline.publish_sample(service.sampler.sample())
            state["snap"] = service.store.latest
            first, second = direct.collect_now(), sdk.get_metrics_data()
            assert _shape(first) == _shape(second)
            assert len(_shape(first)) > 50
            # the same attribute objects every collection, as the SDK hands back
            again = direct.collect_now()
            assert again is not None and first is not None
            assert [p.attributes for m in again.resource_metrics[0].scope_metrics[0].metrics
                    for p in m.data.data_points][:5] == [
                p.attributes for m in first.resource_metrics[0].scope_metrics[0].metrics
                for p in m.data.data_points][:5]
            sdk.get_metrics_data()
    finally:
        if provider is not None:
            provider.shutdown()
        service.server.server_close()
        service.telemetry.shutdown(0.5)
        service.sampler.close()
        kubelet.close()


def _rows(observe):
    return (Metric("demo.late", Kind.GAUGE, "1", "appears late", per_node=observe("late")),
            Metric("demo.sum", Kind.COUNTER, "By", "sums twice", per_node=observe("sum")),
            Metric("demo.updown", Kind.UPDOWNCOUNTER, "1", "up and down",
                   per_node=observe("updown")),
            Metric("demo.broken", Kind.GAUGE, "1", "raises halfway",
                   per_node=observe("broken")))


def test_order_duplicates_failures_non_finite_values_and_overflow(caplog):
    state = {"round": 0}

    def observe(name):
        def points(snapshot, now):
            r = state["round"]
            if name == "late":
                if r >= 1:
                    yield from ((float(r + i), {"i": str(i)}) for i in range(r + 2))
            elif name == "sum":
                yield 1.0, {"a": "x"}
                yield 2.5, {"a": "x"}  # the same series twice: a counter adds them
                yield float("nan"), {"a": "nan"}
                yield float(r), {"a": str(r % 2), "b": r}
            elif name == "updown":
                yield -float(r), {}
            else:
                yield 1.0, {"k": "v"}
                if r % 2:
                    raise RuntimeError("a bug")
                yield 2.0, {"k": "w"}
        return points

    provider, direct, sdk = _pair(lambda: object(), catalog=_rows(observe), limit=3)
    try:
        with caplog.at_level(logging.ERROR):
            for r in range(5):
                state["round"] = r
                assert _shape(direct.collect_now()) == _shape(sdk.get_metrics_data()), r
        shape = _shape(direct.collect_now())
        names = [row[0] for row in shape if row[0] not in ("resource", "scope")]
        assert names[-1] == "demo.late"  # first seen after the others, placed after them
        late = next(row for row in shape if row[0] == "demo.late")
        assert ([("otel.metric.overflow", True)], 8.0, False, []) not in late[-1]
        assert any(attrs == [("otel.metric.overflow", True)] for attrs, *_ in late[-1])
        assert "Callback failed for instrument demo.broken" in caplog.text
    finally:
        provider.shutdown()


def test_without_points_there_is_no_collection():
    collection = DirectCollection(build_resource(environ={}), [])
    assert collection.collect() is None


def test_a_disabled_sdk_leaves_the_reader_on_the_sdk(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    reader = CollectingReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: None)
    try:
        assert reader._direct is None
        assert reader.collect_now() is None
    finally:
        provider.shutdown()


def test_a_node_rows_attributes_are_one_object_while_their_content_stays():
    """The collection and the writers key their work on attribute objects: a node-level
    row that builds its attributes afresh each collection still hands out one object per
    content, a new one when the content changes, and a copy of its own where a value
    cannot be hashed."""
    state = {"pod": "a"}

    def observe(name):
        def points(snapshot, now):
            yield 1.0, {"k8s.pod.name": state["pod"], "n": 1}
            yield 2.0, {"ids": ["x", "y"]}
        return points

    rows = (Metric("demo.rows", Kind.GAUGE, "1", "fresh dicts", per_node=observe("rows")),)
    provider, direct, sdk = _pair(lambda: object(), catalog=rows)
    try:
        assert _shape(direct.collect_now()) == _shape(sdk.get_metrics_data())

        def attributes():
            (metric,) = direct.collect_now().resource_metrics[0].scope_metrics[0].metrics
            return [p.attributes for p in metric.data.data_points]

        first, again = attributes(), attributes()
        assert first[0] is again[0]
        assert first[0] == {"k8s.pod.name": "a", "n": 1}
        assert again[1] == {"ids": ("x", "y")}  # a sequence kept as the SDK keeps it
        state["pod"] = "b"
        changed = [a for a in attributes() if "k8s.pod.name" in a]
        assert changed == [{"k8s.pod.name": "b", "n": 1}]  # the cumulative series a is gone
        assert changed[0] is not first[0]
        assert _shape(direct.collect_now()) == _shape(sdk.get_metrics_data())
    finally:
        provider.shutdown()


def test_the_collections_points_are_the_sdks_own_points():
    """Made without the dataclass constructor's per-field path, a point must still be
    what the constructor makes: its type, its fields, its equality."""
    from opentelemetry.sdk.metrics.export import NumberDataPoint

    from otel_gpu._sdk import number_points

    (made,) = number_points([0], [{"a": 1}], None, 2, {0: 3.5})
    expected = NumberDataPoint(attributes={"a": 1}, start_time_unix_nano=None,
                               time_unix_nano=2, value=3.5, exemplars=[])
    assert type(made) is NumberDataPoint
    assert made == expected
    assert vars(made) == vars(expected)
    assert made.to_json() == expected.to_json()


def test_a_series_observed_twice_is_summed_every_collection_not_only_the_first():
    """A collection whose attribute objects are the last one's, in order, reuses its keys;
    one where a counter's series comes twice (its points summed) must not."""
    state = {"round": 0}

    def observe(name):
        def points(snapshot, now):
            r = state["round"]
            yield float(r), {"a": "x"}
            yield 10.0 * r, {"a": "x"}  # the same content: one attributes object, twice
            yield 1.0, {"b": "y"}
        return points

    rows = (Metric("demo.twice", Kind.COUNTER, "1", "one series twice",
                   per_node=observe("twice")),
            Metric("demo.gauge", Kind.GAUGE, "1", "once each", per_node=observe("gauge")))
    provider, direct, sdk = _pair(lambda: object(), catalog=rows)
    try:
        for r in range(1, 5):
            state["round"] = r
            assert _shape(direct.collect_now()) == _shape(sdk.get_metrics_data()), r
        shape = _shape(direct.collect_now())
        twice = next(row for row in shape if row[0] == "demo.twice")
        assert ([("a", "x")], 44.0) in [(p[0], p[1]) for p in twice[-1]]  # 4 + 40
    finally:
        provider.shutdown()


def test_equal_values_of_other_types_stay_their_own_attributes_across_rows():
    """One row's ``{"code": True}`` must not become another row's ``{"code": 1}``: equal
    as keys, they are different labels ("true" against "1")."""
    def observe(name):
        def points(snapshot, now):
            yield 1.0, {"code": True if name == "first" else 1}
        return points

    rows = (Metric("demo.first", Kind.GAUGE, "1", "a bool", per_node=observe("first")),
            Metric("demo.second", Kind.GAUGE, "1", "an int", per_node=observe("second")))
    provider, direct, sdk = _pair(lambda: object(), catalog=rows)
    try:
        for _ in range(2):
            assert _shape(direct.collect_now()) == _shape(sdk.get_metrics_data())
        metrics = direct.collect_now().resource_metrics[0].scope_metrics[0].metrics
        (second,) = [m for m in metrics if m.name == "demo.second"]
        assert type(second.data.data_points[0].attributes["code"]) is int
    finally:
        provider.shutdown()


def test_fresh_attribute_objects_each_time_are_the_same_series_kept_once():
    """A collection that goes the full way (fresh attribute objects every time) finds its
    series by content: the table keeps one attributes object per series, the first seen,
    and the layout (what a writer reuses its text by) stays the same."""
    from types import SimpleNamespace

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    instrument = SimpleNamespace(name="demo", description="d", unit="1",
                                 instrumentation_scope=InstrumentationScope("t"))
    made: list[list[dict]] = []

    def fresh():
        made.append([{"gpu": str(i), "kind": "x"} for i in range(5)])
        return [(float(i), attrs) for i, attrs in enumerate(made[-1])]

    collection = DirectCollection(Resource.create({}), [(instrument, Kind.GAUGE, fresh)])
    collected = [collection.collect() for _ in range(3)]
    assert len(collection.table) == 5
    for data in collected:
        points = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
        assert all(p.attributes is first for p, first in zip(points, made[0], strict=True))
        assert list(data.ids[0]) == list(range(5))
    assert collected[0].layout is collected[1].layout is collected[2].layout


def test_an_attribute_of_no_usable_type_costs_its_instrument_alone(caplog):
    """A row whose attributes cannot be a series' (a dict value cannot be hashed) is
    logged and left out of this collection; the other instruments are collected."""
    from types import SimpleNamespace

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    def instrument(name):
        return SimpleNamespace(name=name, description="d", unit="1",
                               instrumentation_scope=InstrumentationScope("t"))

    collection = DirectCollection(Resource.create({}), [
        (instrument("odd"), Kind.GAUGE, lambda: [(1.0, {"nested": {"a": 1}})]),
        (instrument("fine"), Kind.GAUGE, lambda: [(2.0, {"gpu": "0"})])])
    with caplog.at_level(logging.ERROR):
        data = collection.collect()
    metrics = data.resource_metrics[0].scope_metrics[0].metrics
    assert [m.name for m in metrics] == ["fine"]
    assert "Callback failed for instrument odd" in caplog.text
