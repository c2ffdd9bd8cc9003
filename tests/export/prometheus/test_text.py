"""The /metrics writer against the oracle: the OpenTelemetry Prometheus exporter itself.

Every test feeds the same ``MetricsData`` to :class:`TextWriter` and to
``PrometheusMetricReader`` (rendered by prometheus_client) and wants the same bytes,
once the exporter's empty labels are dropped (the writer leaves them out: Prometheus
stores an empty label as none).
"""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.prometheus import formats
from otel_gpu.export.prometheus.formats import ESCAPINGS, Style
from otel_gpu.export.prometheus.text import TextWriter
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.snapshot import FAILED, OK, Attribution, Device, DeviceSample, Pods
from otel_gpu.workload import Holder, PodRef
from testkit.exposition import new_reader, without_empty_labels
from tests.support.metrics_data import CUMULATIVE, DELTA, data, gauge, point, total
from tests.support.series_walk import series_walk
from tests.support.snapshots import snapshot


def oracle(data: MetricsData | None, *, scope_labels: bool = False,
           target_info: bool = True) -> bytes:
    """What the OpenTelemetry Prometheus exporter writes for ``data``, empty labels dropped."""
    return without_empty_labels(exporter_text(data, scope_labels=scope_labels,
                                              target_info=target_info))


def exporter_text(data: MetricsData | None, *, scope_labels: bool = False,
                  target_info: bool = True) -> bytes:
    """What the OpenTelemetry Prometheus exporter writes for ``data``, as it writes it."""
    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=scope_labels,
                                    disable_target_info=not target_info)
    reader._collector._callback = None  # fed by hand below, not by a MeterProvider
    if data is not None:
        reader._receive_metrics(data)
    return generate_latest(registry)


ODD_VALUES = [
    'back\\slash', 'quo"te', "new\nline", "tab\tand space", "", "ünïcødé ✓ 𝔊PU", "{}=,",
    "trailing\\", "\\n literally",
]


def test_every_kind_of_metric_and_value_matches_the_exporter():
    odd = [point(i + 0.5, {"hw.id": f"GPU-{i}", "odd.value": v}) for i, v in enumerate(ODD_VALUES)]
    numbers = [math.nan, math.inf, -math.inf, 0, -0.0, 1, -3, 0.1, 1e-7, 123456.0, 1234567.0,
               1e22, 2**53 + 1, 3.14159265358979, -1e300, True]
    metrics = [
        gauge("hw.temperature", odd, "Cel"),
        gauge("values", [point(v, {"i": i}) for i, v in enumerate(numbers)]),
        total("hw.energy", [point(9000, {"hw.id": "GPU-0"})], "J"),
        total("requests_total", [point(3)], "1"),
        total("bytes_total", [point(3)], "By"),
        total("hw.gpu.memory.usage", [point(2**31, {"hw.id": "GPU-0"})], "By", monotonic=False),
        total("delta.updown", [point(-2)], "s", monotonic=False, temporality=DELTA),
        total("delta.counter", [point(5)], "ms", temporality=DELTA),
        gauge("rate", [point(1.5)], "m/s"),
        gauge("per.packet", [point(1)], "{packets}/s"),
        gauge("annotated", [point(1)], "{packets}"),
        gauge("ratio", [point(0.25)], "1"),
        gauge("pct", [point(50)], "%"),
        gauge("odd unit", [point(1)], "weird unit!"),
        gauge("already_seconds", [point(1)], "s"),
        gauge("9starts.with-digit/and:colon", [point(1)]),
        gauge("help.escaping", [point(1)], description='back\\slash "and"\nnewline ü'),
        gauge("no.description", [point(1)], description=None),
        gauge("no.points", []),
        total("no.points.counter", [], "By"),
    ]
    body = data(*metrics)
    assert TextWriter().write(body) == oracle(body)


def test_odd_attribute_keys_and_values_match_the_exporter():
    attrs = [
        {"a.b": "dot", "a_b": "underscore wins as the later one"},  # both become a_b
        {"1digit": 1, "ключ": "cyrillic key", "a/b-c": True, "x": 2.5},
        {"list": ("a", "b"), "ints": (1, 2, 3), "non.ascii.list": ("ü", "✓"), "none": None},
        {"hw.id": "GPU-0", "float.as.key.value": 1e22, "neg": -0.0},
        {},
    ]
    body = data(gauge("odd.keys", [point(i, a) for i, a in enumerate(attrs)]))
    assert TextWriter().write(body) == oracle(body)


def test_points_without_some_labels_leave_them_out_and_families_merge_as_the_exporter():
    mig = {"hw.id": "MIG-1", "hw.parent": "GPU-1", "k8s.pod.name": "train"}
    gpu = {"hw.id": "GPU-1"}
    other_scope = InstrumentationScope("other", "0.1", "https://schema", {"team": "ml"})
    merged = ScopeMetrics(other_scope, [
        gauge("hw.power", [point(7, {"hw.id": "GPU-9", "extra": "x"})], "W"),
        gauge("hw.power", [point(8, {"zzz": "late"})], "W"),
    ], "")
    body = data(gauge("hw.power", [point(300, mig), point(200, gpu)], "W"),
                more=[ResourceMetrics(Resource({"k8s.pod.name": "p"}), [merged], "")])
    for scope_labels in (False, True):
        for target_info in (True, False):
            writer = TextWriter(scope_labels=scope_labels, target_info=target_info)
            expected = oracle(body, scope_labels=scope_labels, target_info=target_info)
            assert writer.write(body) == expected, (scope_labels, target_info)
            assert writer.write(body) == expected, "a second write, from remembered labels"
    written = TextWriter().write(body).decode()
    assert 'hw_power_watts{hw_id="GPU-1"} 200.0\n' in written
    assert '=""' not in written
    assert b'hw_parent=""' in exporter_text(body), "the exporter writes it empty"


def test_target_info_is_the_first_collections_resource_as_the_exporter_keeps_it():
    resource = Resource({"service.name": "otel-gpu", "k8s.node.name": 'n"1\\', "port": 9400,
                         "ünï.code": "✓"})
    first = data(gauge("g", [point(1)]), resource=resource)
    second = data(gauge("g", [point(2)]), resource=Resource({"service.name": "changed"}))
    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    reader._collector._callback = None
    writer = TextWriter()
    for body in (first, second):
        reader._receive_metrics(body)
        assert writer.write(body) == without_empty_labels(generate_latest(registry))


def test_nothing_collected_is_an_empty_body_and_histograms_are_left_out(caplog):
    assert TextWriter().write(None) == oracle(None) == b""
    empty = MetricsData([])
    assert TextWriter().write(empty) == oracle(empty)
    hist = Metric("latency", "", "s", Histogram([HistogramDataPoint(
        {}, 1, 2, 3, 6.0, [1, 2], [1.0], 1.0, 3.0)], CUMULATIVE))
    body = TextWriter().write(data(hist, gauge("g", [point(1)])))
    assert b"latency" not in body and b"g 1.0" in body
    assert "latency: Histogram data is not written" in caplog.text


def test_a_series_whose_attributes_change_gets_its_new_label_block_not_the_remembered_one():
    """Label blocks are remembered per attributes object: a series of the same hw.id whose
    attributes change (new pods, a new driver) is a new object, written anew, every time;
    the old objects are let go so that their ids come back for the new ones."""
    writer = TextWriter()
    for n in range(40):
        attrs = {"hw.id": "GPU-0", "k8s.pod.name": f"pod-{n % 7}", "n": n % 3}
        body = data(gauge("g", [point(1.0, attrs)]), total("c", [point(2.0, dict(attrs))]))
        mine = writer.write(body)
        assert mine == oracle(body), n
        assert f'k8s_pod_name="pod-{n % 7}"'.encode() in mine
        del body, attrs


# --- the collector's own data, through a real MeterProvider ---------------------------

GPU = Device("GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3",
             "00000000:18:00.0", minor_number=0, serial="1654922000001", numa_node=0)
MIG = Device("MIG-bbbb", 1, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-40GB",
             "00000000:3B:00.0", parent_uuid="GPU-cccc", gpu_instance_id=13,
             compute_instance_id=0, mig_profile="1g.5gb")
LOST = Device("GPU-dddd", 2, 'Odd "name" \\ ü', "Odd", "00000000:5E:00.0")
VALUES = MappingProxyType({"util.gpu": 45, "memory.used": 2 * 2**30, "memory.total": 8 * 2**30,
                           "power": 312_500, "energy": 9_000_000, "temp.gpu": 61,
                           "clock.sm": 1980, "clock.reasons": 5.0})


def _snapshot(seq, pods=None, power=312_500):
    values = MappingProxyType({**VALUES, "power": power})
    return snapshot(DeviceSample(GPU, OK, values, xid_counts={79: 1, 13: 2}),
                    DeviceSample(MIG, OK, values),
                    DeviceSample(LOST, FAILED, error="lost"),
                    seq=seq, taken_monotonic=100.0, pods=pods, nvml_calls=42)


def _pods(*holders):
    return Pods(Attribution({"GPU-aaaa": holders}))


def test_the_collectors_catalog_writes_as_the_exporter_would_across_collections():
    state = {"snap": _snapshot(1)}
    registry = CollectorRegistry(auto_describe=False)
    exporter = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    ours, render = new_reader()
    assert isinstance(ours, CollectingReader)
    provider = build_meter_provider(build_resource(environ={}), [exporter, ours],
                                    lambda: state["snap"], clock=lambda: 105.0)
    try:
        train = _pods(Holder(PodRef("train-0", "ml", "main"), None, "nvidia.com/gpu"))
        odd = _pods(Holder(PodRef('odd "pod"', "ml", "ü"), None, "nvidia.com/gpu"))
        for seq, pods, power in ((1, None, 312_500), (2, None, 100_000), (3, train, 100_000),
                                 (4, odd, 250_000)):
            state["snap"] = _snapshot(seq, pods, power)
            mine = render()
            assert mine == without_empty_labels(generate_latest(registry)), f"collection {seq}"
            assert b"hw_power_watts{" in mine
        assert ours.collections == 4
    finally:
        provider.shutdown()
    names = {f.name for f in text_string_to_metric_families(mine.decode())}
    assert {"target_info", "hw_power_watts", "hw_status", "hw_energy_joules"} <= names


@pytest.mark.parametrize("key", ["", "1", "a" * 300])
def test_unusual_resource_keys_match(key):
    body = data(gauge("g", [point(1)]), resource=Resource({"service.name": "s", key: "v"}))
    assert TextWriter().write(body) == oracle(body)


def test_values_of_every_magnitude_are_written_as_the_exporter_writes_them():
    import random

    rng = random.Random(13)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(400)]
    values += [10.0 ** e for e in range(-8, 24)] + [999_999.9999999999, 1e6, 123_456_789, 2**63]
    body = data(gauge("g", [point(v, {"i": i}) for i, v in enumerate(values)]))
    assert TextWriter().write(body) == oracle(body)


def test_the_collector_no_longer_imports_the_prometheus_client():
    import subprocess
    import sys

    code = ("import sys, otel_gpu.wiring, otel_gpu.export.prometheus.text; "
            "print([m for m in sys.modules if m.startswith(('prometheus_client', "
            "'opentelemetry.exporter.prometheus'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


# --- one collection after another: the text of the last one, refilled ------------------

STEP_VALUES = [0.0, -0.0, 1.0, 0.5, 1234567.0, math.nan, math.inf, -math.inf, 2**53 + 1, True]


def _walk(seed: int, steps: int):
    """Collections in a row, each the last one changed in one way picked at random: new
    values only (the same attribute objects, as the collection hands back while devices
    and pods stay), an equal copy of an attribute set, a set whose values change, a
    series added, removed or moved, a metric added or dropped, a second metric merging
    into a family, a new scope."""
    import random

    rng = random.Random(seed)
    sets = [{"hw.id": f"GPU-{i}", "odd": 'q"\\' if i == 2 else ""} for i in range(4)]
    metrics = {"hw.power": ("W", list(sets)), "hw.energy": ("J", list(sets[:2]))}
    scope = None
    version = "1"
    for _ in range(steps):
        move = rng.randrange(10)
        name = rng.choice(sorted(metrics))
        unit, series = metrics[name]
        if move == 1 and series:
            i = rng.randrange(len(series))
            series[i] = dict(series[i])
        elif move == 2 and series:
            i = rng.randrange(len(series))
            series[i] = {**series[i], "k8s.pod.name": f"pod-{rng.randrange(3)}"}
        elif move == 3:
            series.insert(rng.randrange(len(series) + 1), rng.choice(sets))
        elif move == 4 and series:
            series.pop(rng.randrange(len(series)))
        elif move == 5 and len(series) > 1:
            series.insert(0, series.pop())
        elif move == 6:
            metrics[f"extra.{rng.randrange(3)}"] = ("1", [rng.choice(sets)])
        elif move == 7 and len(metrics) > 1:
            metrics.pop(name)
        elif move == 8:
            scope = None if scope else InstrumentationScope("other", "2")
        elif move == 9:  # the same metrics under another scope: other scope labels
            version = "2" if version == "1" else "1"
        built = []
        for name, (unit, series) in metrics.items():
            points = [point(rng.choice(STEP_VALUES), attrs) for attrs in series]
            built.append(total(name, points, unit) if name == "hw.energy"
                         else gauge(name, points, unit))
        # a gauge of the same family from another scope merges into the first's
        more = [] if scope is None else [ResourceMetrics(Resource({}), [ScopeMetrics(
            scope, [gauge("hw.power", [point(7.0, {"hw.id": "GPU-9"})], "W")], "")], "")]
        yield data(*built, more=more, scope=InstrumentationScope("otel_gpu", version))


@pytest.mark.parametrize("scope_labels", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_each_collection_is_written_as_the_exporter_writes_it_however_it_changed(
        seed, scope_labels):
    writer = TextWriter(scope_labels=scope_labels)
    for step, body in enumerate(_walk(seed, 60)):
        assert writer.write(body) == oracle(body, scope_labels=scope_labels), (seed, step)


@pytest.mark.parametrize("style", [Style(openmetrics=om, escaping=e)
                                   for om in (False, True) for e in ESCAPINGS])
def test_every_style_refilled_from_its_last_text_is_what_a_fresh_writer_writes(style):
    writer = TextWriter(style=style)
    for step, body in enumerate(_walk(7, 60)):
        assert writer.write(body) == TextWriter(style=style).write(body), (style, step)


def test_an_equal_attribute_set_of_other_types_is_written_with_its_own_labels():
    """``{"code": True}`` and ``{"code": 1}`` are equal dicts but other labels: the second
    collection's text is not the first one's refilled."""
    writer = TextWriter()
    scope, resource = InstrumentationScope("otel_gpu", "1"), Resource({"service.name": "s"})
    first = data(gauge("g", [point(1.0, {"code": True})]), scope=scope, resource=resource)
    second = data(gauge("g", [point(1.0, {"code": 1})]), scope=scope, resource=resource)
    assert b'code="true"' in writer.write(first)
    written = writer.write(second)
    assert written == oracle(second)
    assert b'code="1"' in written


def _stored(written: str, escaping: str) -> str:
    """The metric name Prometheus stores for a sample name as written under ``escaping``:
    the quotes taken off, or the scheme undone (an escaped name it cannot undo is kept
    as written, as Prometheus keeps it)."""
    if written.startswith('"'):
        return written[1:-1]
    if escaping == formats.DOTS:
        return written.replace("_dot_", ".").replace("__", "_")
    if escaping != formats.VALUES or not written.startswith("U__"):
        return written
    out, rest = [], written[3:]
    while rest:
        head, sep, rest = rest.partition("_")
        out.append(head)
        if not sep:
            break
        if rest.startswith("_"):
            out.append("_")
            rest = rest[1:]
            continue
        code, closed, rest = rest.partition("_")
        if not closed or not code or any(c not in "0123456789abcdef" for c in code.lower()):
            return written
        out.append(chr(int(code, 16)))
    return "".join(out)


@pytest.mark.parametrize("escaping", [formats.ALLOW_UTF8, formats.DOTS, formats.VALUES])
def test_a_counter_is_stored_under_one_name_whatever_the_format(escaping):
    """OpenMetrics writes a counter's samples with ``_total``, and Prometheus stores a
    sample's name as written in either format: text must write the same ``_total``."""
    body = data(total("hw.energy", [point(9000, {"hw.id": "GPU-0"})], "J"))
    stored = {}
    for om in (False, True):
        text = TextWriter(style=Style(openmetrics=om, escaping=escaping)).write(body).decode()
        (line,) = [ln for ln in text.splitlines() if ln.endswith(" 9000.0")]
        head = line.split("{", 1)[1].split(",", 1)[0] if line.startswith("{") else (
            line.split("{", 1)[0])
        stored[om] = _stored(head, escaping)
    assert stored == {False: "hw.energy_total", True: "hw.energy_total"}


# --- collections with series ids: each series' text kept by its id ------------------------

@pytest.mark.parametrize("seed", range(4))
def test_collections_with_series_ids_are_written_as_the_exporter_writes_them(seed):
    """The writer keeps each series' text by its id and reuses the last text while the
    layout stays: every collection of a changing node is still the exporter's text."""
    writer = TextWriter()
    laid_out = 0
    last = None
    for step, collected in enumerate(series_walk(seed, 60)):
        assert writer.write(collected) == oracle(collected), (seed, step)
        laid_out += collected is not None and last is not None \
            and collected.layout is last.layout
        last = collected
    assert laid_out  # some collections were refilled from the last text


@pytest.mark.parametrize("style", [Style(openmetrics=om, escaping=e)
                                   for om in (False, True) for e in ESCAPINGS])
def test_every_style_written_from_kept_series_text_is_what_a_fresh_writer_writes(style):
    writer = TextWriter(style=style)
    for step, collected in enumerate(series_walk(5, 40)):
        assert writer.write(collected) == TextWriter(style=style).write(collected), step


def test_a_new_table_drops_the_old_tables_series_text():
    """After a rebuild the same ids name other series: the writer must not write the old
    table's text for them."""
    from types import SimpleNamespace

    from otel_gpu.instrument.direct import DirectCollection
    from otel_gpu.instrument.schema import Kind

    instrument = SimpleNamespace(name="g", description="d", unit="1",
                                 instrumentation_scope=InstrumentationScope("otel_gpu"))
    writer = TextWriter()
    for pod in ("a", "b"):
        attrs = {"k8s.pod.name": pod}
        collection = DirectCollection(Resource({}), [
            (instrument, Kind.GAUGE, lambda attrs=attrs: [(1.0, attrs)])])
        collected = collection.collect()
        assert collected is not None and list(collected.ids[0]) == [0]
        assert f'k8s_pod_name="{pod}"'.encode() in writer.write(collected)
