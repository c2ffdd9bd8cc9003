"""Readiness: what /readyz answers, from the latest snapshot and the clock alone."""

from __future__ import annotations

from dataclasses import replace

from otel_gpu.publish.readiness import readiness
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import FAILED, Device, DeviceSample
from tests.support.snapshots import snapshot

GPU = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
TEN, TWENTY = Timings.from_interval(10.0), Timings.from_interval(20.0)


def test_readiness_is_a_function_of_the_latest_sample_and_the_clock():
    assert readiness(None, 100.0, TEN) == (False, "not ready: no NVML sample has finished yet")
    good = snapshot(DeviceSample(GPU), seq=1, taken_monotonic=100.0)
    ready, reason = readiness(good, 100.0, TEN)
    assert ready and reason.startswith("ready: 1 of 1 device(s) readable")
    ready, reason = readiness(good, 131.0, TEN)  # max(3 x 10 s, 30 s) later
    assert not ready and "the driver may be hung" in reason
    assert readiness(good, 129.0, TEN)[0]
    assert not readiness(good, 100.0 + 61.0, TWENTY)[0] and readiness(good, 159.0, TWENTY)[0]
    lost = DeviceSample(GPU, FAILED, error="GPU is lost (GPU_IS_LOST) in power")
    assert readiness(replace(good, devices=(lost,)), 100.0, TEN) == (
        False, "not ready: no readable GPU: GPU is lost (GPU_IS_LOST) in power")
