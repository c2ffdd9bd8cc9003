"""The cached OTLP encoder against the oracle: the SDK's own encoder, message for message."""

from __future__ import annotations

import math

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_gpu.export.otlp.encode import Encoder
from tests.support.metrics_data import DELTA, data, gauge, point, total
from tests.support.series_walk import series_walk


def assert_same_as_the_sdk(body: MetricsData, encoder: Encoder | None = None) -> None:
    mine = (encoder or Encoder()).encode(body)  # bytes: NaN is never == NaN in a message
    assert (mine.SerializeToString(deterministic=True)
            == encode_metrics(body).SerializeToString(deterministic=True))


def test_values_times_and_kinds_match_the_sdks_encoder():
    values = [0, -3, 2**62, 1, 0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, 1e-300]
    metrics = [
        gauge("g", [point(v, {"i": i}) for i, v in enumerate(values)], "W"),
        total("c", [point(v, {"i": i}) for i, v in enumerate(values[:6])], "J"),
        total("updown", [point(-2)], "By", monotonic=False),
        total("delta", [point(5)], "{x}", temporality=DELTA),
        gauge("empty", []),
        total("empty.sum", []),
        gauge("no.description", [point(1)], description=None),
        Metric("zero.times", "", "", gauge("x", [NumberDataPoint({}, 0, 0, 1.0)]).data),
    ]
    assert_same_as_the_sdk(data(*metrics))


def test_attribute_values_of_every_type_match():
    attrs = [
        {"s": "ü ✓", "i": 7, "f": 2.5, "b": True, "n": None, "bytes": b"\x00\xff"},
        {"seq": ("a", "b"), "ints": (1, 2), "mixed": (1, True, 1.0), "empty": ()},
        {"map": {"k": "v", "n": 1}},
        {"i": 1}, {"i": True}, {"i": 1.0},  # equal in Python, three encodings in OTLP
        {},
    ]
    encoder = Encoder()
    body = data(gauge("a", [point(n, a) for n, a in enumerate(attrs)]))
    for _ in range(2):  # the second from memory
        assert_same_as_the_sdk(body, encoder)


def test_resources_and_scopes_are_grouped_as_the_sdk_groups_them():
    scope = InstrumentationScope("s", "1", "https://schema", {"team": "ml", "n": 3})
    rm = [ResourceMetrics(Resource({"k8s.pod.name": f"p{i % 2}"}, "https://r"),
                          [ScopeMetrics(scope, [gauge("g", [point(i)])], "https://schema")],
                          "https://r") for i in range(3)]  # p0 twice: the later one wins
    assert_same_as_the_sdk(data(gauge("node", [point(1)]), more=rm))
    assert_same_as_the_sdk(MetricsData([]))


def test_what_only_the_sdk_writes_goes_to_the_sdk():
    hist = Metric("latency", "", "s", Histogram([HistogramDataPoint(
        {"a": "b"}, 1, 2, 3, 6.0, [1, 2], [1.0], 1.0, 3.0)], 2))
    assert_same_as_the_sdk(data(hist, gauge("g", [point(1)])))


def test_new_dicts_with_the_same_attributes_are_encoded_once():
    encoder = Encoder()
    first = encoder.attributes({"hw.id": "GPU-1", "k8s.pod.name": "a"})
    again = encoder.attributes({"hw.id": "GPU-1", "k8s.pod.name": "a"})
    assert first is again
    assert encoder.attributes({"x": 1}) != encoder.attributes({"x": True})


def test_memory_is_bounded_and_stays_right():
    encoder = Encoder(max_sets=5)
    body = data(gauge("g", [point(i, {"i": i}) for i in range(40)]))
    for _ in range(3):
        assert_same_as_the_sdk(body, encoder)
    assert len(encoder._by_content) <= 5


@pytest.mark.parametrize("seed", range(4))
def test_collections_with_series_ids_are_the_sdks_request_push_after_push(seed):
    """Each series' point is kept by its id and the request reused while the layout
    stays (values switching between int and float included): every push of a changing
    node is still the SDK encoder's request."""
    encoder = Encoder()
    reused = 0
    last = None
    for collected in series_walk(seed, 60):
        if collected is None:
            continue
        assert_same_as_the_sdk(collected, encoder)
        reused += last is not None and collected.layout is last.layout
        last = collected
    assert reused


def test_the_bytes_sent_are_the_sdks_message():
    """What the exporter sends is written by hand; parsed, it is the SDK encoder's request."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    hist = Metric("latency", "", "s", Histogram([HistogramDataPoint(
        {"a": "b"}, 1, 2, 3, 6.0, [1, 2], [1.0], 1.0, 3.0)], 2))
    for body in (data(gauge("g", [point(1.5, {"a": "b"})]), total("c", [point(3)])),
                 data(hist)):
        sent = Encoder().serialize(body)
        assert (ExportMetricsServiceRequest.FromString(sent).SerializeToString(deterministic=True)
                == encode_metrics(body).SerializeToString(deterministic=True))
