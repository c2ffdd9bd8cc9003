"""OTLP pushes the collection the Prometheus body was written from; delta keeps its own reader."""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from types import MappingProxyType

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricsData,
    PeriodicExportingMetricReader,
)

from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.client import temporality
from otel_gpu.export.otlp.metrics import build_reader
from otel_gpu.export.otlp.push import OtlpPush, cumulative
from otel_gpu.export.otlp.transport import OtlpSettings
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.snapshot import OK, Device, DeviceSample
from testkit.process import wait_until
from tests.support.exporters import RecordingExporter
from tests.support.snapshots import snapshot

GPU = Device("GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "00000000:18:00.0")


def _power(data: MetricsData) -> list[float]:
    return [p.value for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "hw.power" for p in m.data.data_points]


@pytest.fixture
def wired():
    state = {"snap": snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 100_000})))}
    source, exporter = CollectingReader(), RecordingExporter()
    push = OtlpPush(exporter, source, interval_s=math.inf, timeout_s=1.0, environ={})
    provider = build_meter_provider(build_resource(environ={}), [source, push],
                                    lambda: state["snap"])
    yield state, source, push, exporter, provider
    provider.shutdown()


def test_a_push_sends_the_publications_collection_without_collecting_again(wired):
    state, source, push, exporter, _ = wired
    collected = source.collect_now()  # what the publishing thread does for /metrics
    push.push()
    assert exporter.exported == [collected] and exporter.exported[0] is collected
    assert source.collections == 1 and push.collected == 0
    # no publication since: the next push collects by itself (a stuck sampler's age grows)
    state["snap"] = snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 250_000})), seq=2)
    push.push()
    assert source.collections == 2 and push.collected == 1
    assert _power(exporter.exported[1]) == [250.0]


def test_a_failing_export_is_logged_once_and_the_loop_goes_on(wired, caplog):
    _, source, push, exporter, _ = wired
    exporter.failing = True
    for _ in range(3):
        source.collect_now()
        push.push()
    lines = [r for r in caplog.records if "OTLP export failed" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].getMessage() == "OTLP export failed: ConnectionError: backend unreachable"
    exporter.failing = False
    push.push()
    assert len(exporter.exported) == 1


def test_shutting_the_provider_down_exports_a_fresh_collection_once(wired):
    state, source, push, exporter, provider = wired
    source.collect_now()
    state["snap"] = snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 300_000})), seq=2)
    provider.shutdown(timeout_millis=2000)
    assert [_power(d) for d in exporter.exported] == [[300.0]] and exporter.shut
    push.shutdown()  # a second time: nothing more
    assert len(exporter.exported) == 1


def test_the_loop_pushes_on_its_interval_and_stops():
    source, exporter = CollectingReader(), RecordingExporter()
    state = {"snap": snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 1_000})))}
    push = OtlpPush(exporter, source, interval_s=0.01, environ={})
    provider = build_meter_provider(build_resource(environ={}), [source, push],
                                    lambda: state["snap"])
    try:
        wait_until(lambda: len(exporter.exported) >= 3, timeout=10, what="three pushes")
    finally:
        provider.shutdown(timeout_millis=2000)
    assert exporter.shut and not push._thread.is_alive()


@contextmanager
def _registered_push(**settings):
    """A push whose source is registered on a provider, shut down in full before the test
    ends: its final export runs on a thread of its own, which must not outlive the test (a
    collection through an unregistered reader logs, later, into another test's output)."""
    before = set(threading.enumerate())
    source = CollectingReader()
    push = OtlpPush(RecordingExporter(), source, **settings)
    provider = MeterProvider(metric_readers=[source, push])
    try:
        yield push
    finally:
        provider.shutdown(timeout_millis=10_000)
        assert not [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


@pytest.mark.parametrize(("environ", "interval_ms", "timeout_ms"), [
    ({}, 60_000, 30_000),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "250", "OTEL_METRIC_EXPORT_TIMEOUT": "1500"}, 250, 1500),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, 60_000, 30_000),
])
def test_interval_and_timeout_come_from_the_sdks_variables(environ, interval_ms, timeout_ms):
    with _registered_push(environ=environ) as push:
        assert (push.interval_ms, push.timeout_ms) == (interval_ms, timeout_ms)


def test_settings_win_over_the_variables():
    with _registered_push(interval_s=5.0, timeout_s=2.0,
                          environ={"OTEL_METRIC_EXPORT_INTERVAL": "250"}) as push:
        assert (push.interval_ms, push.timeout_ms) == (5000.0, 2000.0)


VARIABLE = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"


def _reader(source, environ=None, **settings):
    return build_reader(OtlpSettings(endpoint="http://127.0.0.1:9", interval=3600.0, **settings),
                        build_resource(environ={}), environ or {}, source)


def test_cumulative_exporters_share_the_collection_and_delta_keeps_its_own_reader():
    source = CollectingReader()
    readers = [_reader(source), _reader(source, temporality="delta"), _reader(None),
               # the SDK's own variable asks for delta
               _reader(source, {VARIABLE: "delta"})]
    before = set(threading.enumerate())
    provider = MeterProvider(metric_readers=[source, *readers])  # no instrument: nothing sent
    try:
        shared, delta, alone, variable = readers
        assert isinstance(shared, OtlpPush) and shared.source is source
        assert cumulative(temporality(None, {})) and cumulative(temporality("cumulative", {}))
        assert not cumulative(temporality("delta", {}))
        assert not cumulative(temporality(None, {VARIABLE: "lowmemory"}))
        for reader in (delta, alone, variable):
            assert isinstance(reader, PeriodicExportingMetricReader)
    finally:
        provider.shutdown(timeout_millis=10_000)
    assert not [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


def test_without_a_push_a_collection_is_not_kept_after_it_is_written():
    source = CollectingReader()
    state = {"snap": snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 1_000})))}
    provider = build_meter_provider(build_resource(environ={}), [source], lambda: state["snap"])
    try:
        assert _power(source.collect_now()) == [1.0]
        assert source.latest is None and source.collections == 1
        OtlpPush(RecordingExporter(), source, interval_s=math.inf, environ={})  # a consumer: kept
        kept = source.collect_now()
        assert source.latest is kept
    finally:
        provider.shutdown()
