"""The publisher that joins samples and pods, from either thread."""

from __future__ import annotations

from dataclasses import replace

from otel_gpu.app import Publisher
from otel_gpu.nvml.sampler import SnapshotStore
from otel_gpu.snapshot import PodView, Snapshot


def _snap(seq: int) -> Snapshot:
    return Snapshot(seq=seq, taken_at=0.0, taken_monotonic=float(seq), duration=0.0,
                    driver_version=None)


def test_new_pods_republish_the_latest_sample():
    pods = {"now": "pods-1"}
    store = SnapshotStore()
    publisher = Publisher(store, lambda s: replace(s, pods=PodView(pods["now"], None, None)))
    publisher.pods_changed()  # nothing sampled yet: nothing to publish
    assert store.latest is None and store.version == 0
    publisher.sample(_snap(1))
    assert store.latest.pods.attribution == "pods-1"
    pods["now"] = "pods-2"
    publisher.pods_changed()
    assert store.latest.seq == 1 and store.latest.pods.attribution == "pods-2"
    assert store.version == 2
    publisher.sample(_snap(2))
    assert store.latest.seq == 2 and store.latest.pods.attribution == "pods-2"


def test_attribution_failure_keeps_the_sample():
    def broken(_):
        raise RuntimeError("bug")

    store = SnapshotStore()
    Publisher(store, broken).sample(_snap(7))
    assert store.latest.seq == 7 and store.latest.pods is None


def test_readiness_follows_the_latest_sample():
    from otel_gpu.app import Collector
    from otel_gpu.config import load
    from otel_gpu.nvml import fake
    from otel_gpu.nvml.library import Nvml
    from otel_gpu.snapshot import FAILED, Device, DeviceSample

    clock = {"now": 100.0}
    config = load({"listen": "127.0.0.1:0", "interval": "10s", "pod_attribution": "false"},
                  environ={})
    fake.install(fake.FakeNvml(fake.load_scenario("t4")))
    try:
        collector = Collector(config, Nvml(), clock=lambda: clock["now"], environ={})
        try:
            assert collector.readiness() == (
                False, "not ready: no NVML sample has finished yet")
            gpu = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
            good = replace(_snap(1), taken_monotonic=100.0,
                           devices=(DeviceSample(gpu),))
            collector.store.publish(good)
            ready, reason = collector.readiness()
            assert ready and reason.startswith("ready: 1 of 1 device(s) readable")
            clock["now"] = 100.0 + 31.0  # max(3 x 10 s, 30 s) later
            ready, reason = collector.readiness()
            assert not ready and "the driver may be hung" in reason
            lost = DeviceSample(gpu, FAILED, error="GPU is lost (GPU_IS_LOST) in power")
            collector.store.publish(replace(good, seq=2, taken_monotonic=131.0, devices=(lost,)))
            assert collector.readiness() == (
                False, "not ready: no readable GPU: GPU is lost (GPU_IS_LOST) in power")
        finally:
            collector.server.server_close()
            collector.provider.shutdown()
    finally:
        fake.uninstall()
