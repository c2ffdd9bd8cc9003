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
            collector.telemetry.shutdown(1.0)
    finally:
        fake.uninstall()


def test_pod_churn_rebuilds_the_pipeline_before_the_sdk_overflows():
    from otel_gpu.app import Collector
    from otel_gpu.config import load
    from otel_gpu.k8s.attribution import attribute
    from otel_gpu.k8s.podresources import Allocation, PodResourcesState
    from otel_gpu.nvml import fake
    from otel_gpu.nvml.library import Nvml
    from otel_gpu.snapshot import Device, DeviceSample

    config = load({"listen": "127.0.0.1:0", "pod_attribution": "false"}, environ={})
    fake.install(fake.FakeNvml(fake.load_scenario("t4")))
    try:
        collector = Collector(config, Nvml(), environ={})
        try:
            uuid = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"
            gpu = Device(uuid, 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
            sample = DeviceSample(gpu, values={"power": 70000.0, "clock.reasons": 1.0})
            for i in range(400):  # a short job per sample, 400 of them
                state = PodResourcesState(
                    (Allocation(f"job-{i}", "ci", "main", "nvidia.com/gpu", uuid),), None,
                    float(i), "v1")
                snap = replace(_snap(i + 1), devices=(sample,),
                               pods=PodView(attribute([gpu], state), None, float(i)))
                collector.publisher.sample(snap)
                body = collector.cache.get().body.decode()
                assert f'k8s_pod_name="job-{i}"' in body, i
                assert "otel_metric_overflow" not in body, i
            assert collector.rebuilds >= 2
            assert body.count("hw_power_watts{") == 1
        finally:
            collector.server.server_close()
            collector.telemetry.shutdown(1.0)
    finally:
        fake.uninstall()
