"""A slow collection is written, not thrown away: the callbacks only read the snapshot."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from opentelemetry.sdk.metrics._internal import measurement_consumer

from otel_gpu.export.collected import COLLECT_TIMEOUT_MS, CollectingReader
from otel_gpu.instrument import direct
from otel_gpu.instrument.telemetry import build_meter_provider, build_resource
from otel_gpu.snapshot import OK, Device, DeviceSample
from tests.support.snapshots import snapshot

GPU = Device("GPU-aaaa", 0, "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "00000000:18:00.0")


@pytest.mark.parametrize("through", ["sdk", "direct"])
def test_a_collection_taking_20_s_of_a_starved_cpu_still_has_its_points(monkeypatch, through):
    """The SDK's own 10 s raised MetricsTimeoutError at 512 GPUs and 5,000 pods on a busy
    machine, and the body of that sample was lost. The direct collection (the reader's own
    path) has no deadline; the SDK's, where the reader collects through it, has ours."""
    snap = snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 100_000})))
    reader = CollectingReader()
    provider = build_meter_provider(build_resource(environ={}), [reader], lambda: snap)
    if through == "sdk":
        reader._direct = None
    try:
        reader.collect_now()  # instruments registered; now time the next collection
        instruments = len(provider._measurement_consumer._async_instruments)
        assert instruments > 10
        now = [0]
        # 20 s over a collection's clock reads: the SDK's two per instrument, the direct two
        step = 20e9 / (2 * instruments + 1) if through == "sdk" else 10e9 + 1

        def clock() -> int:
            now[0] += int(step)
            return now[0]

        monkeypatch.setattr(measurement_consumer, "time_ns", clock)
        monkeypatch.setattr(direct, "time_ns", clock)
        data = reader.collect_now()
        assert now[0] > 19e9 and COLLECT_TIMEOUT_MS > 20_000
        powers = [p.value for rm in data.resource_metrics for sm in rm.scope_metrics
                  for m in sm.metrics if m.name == "hw.power" for p in m.data.data_points]
        assert powers == [100.0]
    finally:
        provider.shutdown()
