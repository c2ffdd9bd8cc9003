"""The wiring: a Service built from a config, and sample_once for ``check``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from otel_gpu.attribute.k8s.attribution import attribute
from otel_gpu.attribute.k8s.kubelet_answer import Allocation, PodResourcesState
from otel_gpu.config import load
from otel_gpu.sample.library import Nvml
from otel_gpu.snapshot import Device, DeviceSample, Pods
from otel_gpu.wiring import Service, sample_once
from otel_gpu.workload import PodRef
from tests.support.omitted import reasons
from tests.support.snapshots import snapshot

T4_UUID = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"


@pytest.fixture
def t4(fake_nvml):
    return fake_nvml("t4")


@pytest.fixture
def build_service(t4):
    """service(**settings) -> a Service built but not started; closed after the test."""
    built: list[Service] = []

    def build(clock=None, **settings: str) -> Service:
        config = load({"listen": "127.0.0.1:0", "pod_attribution": "false", **settings},
                      environ={})
        kw = {"clock": clock} if clock is not None else {}
        built.append(Service(config, Nvml(), environ={}, **kw))
        return built[-1]

    yield build
    for one in built:
        one.server.server_close()
        one.telemetry.shutdown(0.5)


def test_readiness_is_served_from_the_pipeline(build_service):
    clock = {"now": 100.0}
    service = build_service(clock=lambda: clock["now"], interval="10s")
    assert service.server.readiness() == (
        False, "not ready: no NVML sample has finished yet")
    gpu = Device(T4_UUID, 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
    service.pipeline.publish_sample(snapshot(DeviceSample(gpu), taken_monotonic=100.0))
    assert service.server.readiness()[0]
    clock["now"] = 131.0
    assert "the driver may be hung" in service.server.readiness()[1]


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_pod_churn_rebuilds_the_pipeline_before_the_sdk_overflows(build_service):
    service = build_service()
    gpu = Device(T4_UUID, 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
    sample = DeviceSample(gpu, values={"power": 70000.0, "clock.reasons": 1.0})
    for i in range(400):  # a short job per sample, 400 of them
        state = PodResourcesState(
            (Allocation(PodRef(f"job-{i}", "ci", "main"), "nvidia.com/gpu", T4_UUID),), None,
            float(i), "v1")
        snap = snapshot(sample, seq=i + 1,
                        pods=Pods(attribute([gpu], state), None, float(i)))
        service.pipeline.publish_sample(snap)
        service.pipeline.run_followups()  # what the sampler thread does after publishing
        body = service.server.cache.get().body.decode()
        assert f'k8s_pod_name="job-{i}"' in body, i
        assert "otel_metric_overflow" not in body, i
    assert service.telemetry.rebuilds >= 2
    assert body.count("hw_power_watts{") == 1


def test_sample_once_reads_every_device_and_closes_nvml(t4):
    nvml = Nvml()
    nvml.init()
    config = load({"pod_attribution": "false"}, environ={})
    snap = sample_once(config, nvml)
    assert [s.device.model for s in snap.devices] == ["Tesla T4", "Tesla T4"]
    assert all(s.values["power"] > 0 for s in snap.devices)
    assert snap.pods is None
    assert not nvml._initialised  # NVML is closed before any kubelet call


def test_sample_once_without_a_kubelet_still_gives_the_sample(t4, tmp_path):
    nvml = Nvml()
    nvml.init()
    config = load({"kubelet_socket": str(tmp_path / "absent.sock"),
                   "kubelet_timeout": "0.5s"}, environ={})
    snap = sample_once(config, nvml)
    assert len(snap.devices) == 2 and snap.pods is None


def test_otlp_only_serves_no_prometheus_body(build_service):
    service = build_service(exporters="otlp", otlp_endpoint="http://127.0.0.1:9")
    assert service.server.cache is None


def test_a_rebuilt_pipeline_keeps_rendering(build_service):
    service = build_service()
    gpu = Device(T4_UUID, 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
    snap = snapshot(DeviceSample(gpu, values={"power": 70000.0}))
    service.pipeline.publish_sample(snap)
    before = service.server.cache.get().body
    service.telemetry.rebuild()
    service.pipeline.publish_sample(replace(snap, seq=2))
    after = service.server.cache.get().body
    assert b"hw_power_watts{" in before and b"hw_power_watts{" in after


def test_a_scrape_after_a_publish_never_renders(build_service):
    """Once a scrape came, every publication (a sample, new pods, a rebuild) renders the body
    on the publishing thread; the scrapes that follow only serve it. (The first scrape
    renders: no publication renders for a reader that never asked.)"""
    service = build_service(interval="10s")
    gpu = Device(T4_UUID, 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
    cache = service.server.cache
    for seq in (1, 2):
        service.pipeline.publish_sample(snapshot(DeviceSample(gpu, values={"power": 70000.0}),
                                                 seq=seq))
        assert cache.renders == {1: 0, 2: 2}[seq]  # the first, unasked, waits for its scrape
        for _ in range(3):
            assert cache.get().key == service.pipeline.store.version
        assert cache.renders == seq
        assert b"hw_power_watts{" in cache.get().body
    service.pipeline.pods_changed()  # no enricher here: the same sample published again
    assert cache.renders == 3
    cache.get()
    assert cache.renders == 3


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_every_series_of_256_gpus_is_present(fake_nvml, tmp_path):
    """Past the SDK's default cardinality limit (2,000 per metric): each GPU has the same
    series in every family as GPU 0, none folded into an overflow series."""
    import re
    from collections import Counter

    from testkit.scenarios import NODES, write_scenario

    fake_nvml(write_scenario(NODES["gpus-256"], tmp_path))
    # the longest read deadline (10 s): 256 reader threads on a busy machine are not a hang
    config = load({"listen": "127.0.0.1:0", "pod_attribution": "false", "interval": "20s"},
                  environ={})
    service = Service(config, Nvml(), environ={})
    try:
        service.nvml.init()
        service.pipeline.publish_sample(service.sampler.sample())
        body = service.server.cache.get().body.decode()
    finally:
        service.server.server_close()
        service.telemetry.shutdown(0.5)
        service.sampler.close()
    assert "otel_metric_overflow" not in body
    per_gpu: dict[str, Counter] = {}
    for line in body.splitlines():
        match = re.match(r'([a-z_]+)\{.*\bhw_id="(GPU-[^"]+)"', line)
        if match:
            per_gpu.setdefault(match.group(2), Counter())[match.group(1)] += 1
    assert len(per_gpu) == 256
    first = next(iter(per_gpu.values()))
    assert first["nvidia_gpu_clock_throttle"] * 256 > 2000  # one metric past the old limit
    assert all(counts == first for counts in per_gpu.values())


def test_grpc_is_imported_only_once_a_kubelet_socket_exists(tmp_path):
    """Pod attribution on (the default) on a node without a kubelet: no gRPC in memory
    until the socket appears; then the watcher is built and polls it."""
    import subprocess
    import sys

    socket_path = tmp_path / "kubelet.sock"
    script = f"""
import sys, time
from otel_gpu import sim
from otel_gpu.wiring import Service
from otel_gpu.config import load
from otel_gpu.sample.library import Nvml
sim.install(sim.FakeNvml(sim.load_scenario("t4")))
config = load({{"listen": "127.0.0.1:0", "kubelet_socket": {str(socket_path)!r},
               "kubelet_interval": "0.1s"}}, environ={{}})
service = Service(config, Nvml(), environ={{}})
service.start()
time.sleep(0.5)
print("before", "grpc" in sys.modules, service.enricher.watcher.stats.socket_present)
import socket
sock = socket.socket(socket.AF_UNIX)
sock.bind({str(socket_path)!r})  # a socket at the path: the watcher connects
deadline = time.monotonic() + 10
while service.enricher.watcher.client is None and time.monotonic() < deadline:
    time.sleep(0.05)
print("after", "grpc" in sys.modules, service.enricher.watcher.client is not None)
service.stop(0.5)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["before False False", "after True True"], done.stdout


def test_the_start_up_absence_line_on_a_mig_node_is_short_and_the_list_is_on_debug(
        fake_nvml, caplog):
    """On a MIG node most values are missing on the instances by design: the INFO line
    names what whole GPUs lack, and only counts (naming a few) what the instances alone
    lack; that list is at debug level."""
    import logging

    fake_nvml("a100-mig")
    nvml = Nvml()
    nvml.init()
    config = load({"pod_attribution": "false"}, environ={})
    with caplog.at_level(logging.DEBUG, logger="otel_gpu.sample"):
        sample_once(config, nvml)
    info = [r.getMessage() for r in caplog.records
            if r.levelno == logging.INFO and "not available" in r.getMessage()]
    debug = [r.getMessage() for r in caplog.records
             if r.levelno == logging.DEBUG and "not available" in r.getMessage()]
    assert len(info) == 1 and len(info[0]) <= 600, info  # was 1,946 characters
    (instances,) = [c for c in info[0].split("; ") if "value(s) on" in c]
    assert instances.startswith("39 value(s) on 4 MIG instances") and len(instances) <= 200
    assert "GI 14" not in info[0] and "row_remap_histogram" not in info[0]
    # what GPUs lack: in full, their instances counted
    reason, where = reasons(info[0])["fan"]
    assert reason == "NOT_SUPPORTED"
    assert where.startswith("7 devices (GPU 0, GPU 0's 4 MIG instances, GPU 1")
    assert debug and any(reasons(d).get("row_remap_histogram", ("",))[0] == "NOT_SUPPORTED"
                         for d in debug)
    assert "GPU 0 MIG 1g.5gb GI 14" in " ".join(debug)


def test_a_read_of_the_pod_stage_that_never_returns_holds_no_gpu(t4, kubelet, tmp_path,
                                                                 monkeypatch, caplog):
    """The pod stage runs where the samples are published (the sampler's and the kubelet's
    threads). A sysfs read there that never returns (a hung file system) costs the pods,
    never the sampling: the GPU keeps being sampled and published, and once the read
    returns the pods come back."""
    import logging
    import threading

    from otel_gpu.attribute.k8s import attribution
    from testkit.kubelet import container, devices, pod
    from testkit.process import wait_until
    from tests.support.nvml import profile_uuids

    gpus = profile_uuids("t4")

    entered, release = threading.Event(), threading.Event()

    def hung_read(path, *args, **kw):
        entered.set()
        release.wait(30)
        return "0-3"

    monkeypatch.setattr(attribution, "read_attribute", hung_read)
    kubelet.set_pods([pod("train", container("main", devices("nvidia.com/gpu", gpus[0],
                                                              numa=0), cpu_ids=[0, 1]))])
    config = load({"listen": "127.0.0.1:0", "interval": "100ms", "kubelet_interval": "100ms",
                   "kubelet_socket": kubelet.socket_path, "sysfs_root": str(tmp_path)},
                  environ={})
    nvml = Nvml()
    nvml.init()
    service = Service(config, nvml, environ={})
    store = service.pipeline.store
    service.start()
    try:
        with caplog.at_level(logging.INFO, logger="otel_gpu"):
            assert entered.wait(10), "the pod stage never read sysfs"
            held_at = store.latest.seq if store.latest else 0
            wait_until(lambda: store.latest and store.latest.seq >= held_at + 5, 10,
                       "samples published while the pod stage is held")
            latest = store.latest
            assert [s.device.uuid for s in latest.devices] == gpus
            assert all(s.values for s in latest.devices)  # sampled, not placeholders
            release.set()
            wait_until(lambda: (p := store.latest.pods) is not None
                       and p.attribution.exclusive_owner(gpus[0]) is not None, 10,
                       "the pods once the read returned")
        held = [r for r in caplog.records if "pod attribution took longer" in r.getMessage()]
        assert len(held) == 1 and held[0].levelname == "WARNING", caplog.text
    finally:
        release.set()
        service.stop(0.5)
