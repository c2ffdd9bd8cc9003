"""The pipeline: publishing from two threads, readiness, and the sampler loop."""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import replace
from pathlib import Path

from otel_gpu.publish.pipeline import (
    CHURNED,
    GROWN,
    Pipeline,
    PodChurn,
    SnapshotStore,
    readiness,
    room_for,
)
from otel_gpu.snapshot import (
    FAILED,
    Attribution,
    Device,
    DeviceSample,
    Holder,
    Pods,
    Snapshot,
)
from tests.support.process import wait_until
from tests.support.snapshots import snapshot

_LOCKISH = re.compile(r"(^|_)(r?lock|cond|mutex)s?($|_)", re.IGNORECASE)
GPU = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")


def _snap(seq: int, taken: float | None = None, devices=()) -> Snapshot:
    return snapshot(*devices, seq=seq, taken_monotonic=taken)


def _held_by(*pods: str) -> Attribution:
    return Attribution({GPU.uuid: tuple(Holder(p, "ns", "main", None, "nvidia.com/gpu")
                                        for p in pods)})


def _sliced(holders: int) -> Attribution:
    """GPU shared by ``holders`` pods, one time-slicing replica each."""
    return Attribution({GPU.uuid: tuple(Holder(f"s{i}", "ns", "main", i, "nvidia.com/gpu", True)
                                        for i in range(holders))})


def _never() -> Snapshot:
    raise AssertionError("the sampler thread is not started in this test")


def test_new_pods_republish_the_latest_sample():
    pods = {"now": _held_by("a")}
    pipeline = Pipeline(_never, interval=10.0,
                        enrich=lambda s: replace(s, pods=Pods(pods["now"])))
    store = pipeline.store
    pipeline.pods_changed()  # nothing sampled yet: nothing to publish
    assert store.latest is None and store.version == 0
    pipeline.publish_sample(_snap(1))
    assert store.latest.series_pods(GPU.uuid) == (("a", "ns", "main"),)
    pods["now"] = _held_by("b")
    pipeline.pods_changed()
    assert store.latest.seq == 1 and store.latest.series_pods(GPU.uuid)[0].pod == "b"
    assert store.version == 2
    pipeline.publish_sample(_snap(2))
    assert store.latest.seq == 2 and store.latest.series_pods(GPU.uuid)[0].pod == "b"


def test_attribution_failure_keeps_the_sample():
    def broken(_):
        raise RuntimeError("bug")

    pipeline = Pipeline(_never, interval=10.0, enrich=broken)
    pipeline.publish_sample(_snap(7))
    assert pipeline.store.latest.seq == 7 and pipeline.store.latest.pods is None


def test_readiness_is_a_function_of_the_latest_sample_and_the_clock():
    assert readiness(None, 100.0, 10.0) == (False, "not ready: no NVML sample has finished yet")
    good = _snap(1, taken=100.0, devices=(DeviceSample(GPU),))
    ready, reason = readiness(good, 100.0, 10.0)
    assert ready and reason.startswith("ready: 1 of 1 device(s) readable")
    ready, reason = readiness(good, 131.0, 10.0)  # max(3 x 10 s, 30 s) later
    assert not ready and "the driver may be hung" in reason
    assert readiness(good, 129.0, 10.0)[0]
    assert not readiness(good, 100.0 + 61.0, 20.0)[0] and readiness(good, 159.0, 20.0)[0]
    lost = DeviceSample(GPU, FAILED, error="GPU is lost (GPU_IS_LOST) in power")
    assert readiness(replace(good, devices=(lost,)), 100.0, 10.0) == (
        False, "not ready: no readable GPU: GPU is lost (GPU_IS_LOST) in power")


def test_pipeline_readiness_reads_its_store_and_clock():
    clock = {"now": 100.0}
    pipeline = Pipeline(_never, interval=10.0, clock=lambda: clock["now"])
    assert not pipeline.readiness()[0]
    pipeline.publish_sample(_snap(1, taken=100.0, devices=(DeviceSample(GPU),)))
    assert pipeline.readiness()[0]
    clock["now"] = 131.0
    assert "hung" in pipeline.readiness()[1]


def test_sampler_thread_survives_a_bug():
    calls = {"n": 0}

    def flaky() -> Snapshot:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return _snap(calls["n"] - 1)

    pipeline = Pipeline(flaky, interval=0.01, max_backoff=0.05)
    pipeline.start()
    try:
        snap = pipeline.store.wait_for(1, timeout=10)
        assert snap is not None and snap.seq >= 1 and calls["n"] >= 2
    finally:
        assert pipeline.stop()


def test_churn_counts_gone_pods_and_resets():
    churn = PodChurn(limit=3)
    for i in range(4):
        assert not churn.needs_rebuild(replace(_snap(i), pods=Pods(_held_by(f"p{i}"))))
    assert churn.needs_rebuild(replace(_snap(5), pods=Pods(_held_by("p5")))) == CHURNED
    assert not churn.needs_rebuild(replace(_snap(6), pods=Pods(_held_by("p6"))))
    assert not churn.needs_rebuild(_snap(7))  # no attribution: nothing to count


def test_churn_asks_for_a_rebuild_when_pods_outgrow_the_room():
    churn = PodChurn()
    assert churn.room == room_for(0)
    assert churn.needs_rebuild(replace(_snap(1), pods=Pods(_sliced(room_for(0))))) is None
    assert churn.needs_rebuild(replace(_snap(2), pods=Pods(_sliced(2500)))) == GROWN
    assert churn.room == room_for(2500) == 5000
    assert churn.needs_rebuild(replace(_snap(3), pods=Pods(_sliced(2500)))) is None
    churn.room = 2600  # what the rebuilt SDK said it has room for
    assert churn.needs_rebuild(replace(_snap(4), pods=Pods(_sliced(2601)))) == GROWN


def test_pods_outgrowing_the_sdk_wake_the_sampler_for_a_release():
    """Growth seen on the kubelet thread is released at once on the sampler thread, not
    at the next sample (an hour away here); what ``release`` returns becomes the room,
    and the latest snapshot is published again so that caches drop the old render.
    """
    pods = {"now": _held_by("p0")}
    released: list[str] = []

    def release() -> int:
        released.append(threading.current_thread().name)
        return 10_000

    pipeline = Pipeline(lambda: _snap(1), interval=3600.0,
                        enrich=lambda s: replace(s, pods=Pods(pods["now"])), release=release)
    pipeline.start()
    try:
        assert pipeline.store.wait_for(1, timeout=10) is not None
        version = pipeline.store.version
        pods["now"] = _sliced(2500)
        t = threading.Thread(target=pipeline.pods_changed, name="otel-gpu-podresources")
        t.start()
        t.join(10)
        wait_until(lambda: released, 10, "a release on the sampler thread")
        assert released == ["otel-gpu-sampler"]
        wait_until(lambda: pipeline.store.version >= version + 2, 10, "the re-publication")
        pods["now"] = _sliced(5000)  # inside the room the release reported: no rebuild
        pipeline.pods_changed()
        assert pipeline.release_if_due() is False and released == ["otel-gpu-sampler"]
    finally:
        assert pipeline.stop()


def test_a_failing_release_does_not_end_the_sampler_thread():
    pods = {"now": _held_by("p0")}
    calls: list[int] = []

    def release() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a bug")

    pipeline = Pipeline(lambda: _snap(1), interval=3600.0,
                        enrich=lambda s: replace(s, pods=Pods(pods["now"])), release=release)
    pipeline.start()
    try:
        assert pipeline.store.wait_for(1, timeout=10) is not None
        for holders, released in ((300, 1), (2500, 2)):
            pods["now"] = _sliced(holders)
            pipeline.pods_changed()
            wait_until(lambda n=released: len(calls) == n, 10, f"release {released}")
    finally:
        assert pipeline.stop()


def test_release_runs_on_the_sampler_thread_not_the_kubelet_thread():
    """Pods churning through kubelet updates only mark a release; the sampler thread runs it."""
    threads: list[str] = []
    pods = {"now": _held_by("p0")}
    pipeline = Pipeline(_never, interval=10.0,
                        enrich=lambda s: replace(s, pods=Pods(pods["now"])),
                        release=lambda: threads.append(threading.current_thread().name))
    pipeline.publish_sample(_snap(1))

    def kubelet_thread() -> None:
        for i in range(1, 200):
            pods["now"] = _held_by(f"p{i}")
            pipeline.pods_changed()

    t = threading.Thread(target=kubelet_thread, name="otel-gpu-podresources")
    t.start()
    t.join(10)
    assert threads == []  # the kubelet thread never rebuilt anything
    assert pipeline.release_if_due() is True
    assert threads == [threading.current_thread().name]
    assert pipeline.release_if_due() is False  # once per pile-up


def test_no_module_exposes_a_lock():
    """Locks stay private: no public attribute or property hands one out."""
    root = Path(__file__).resolve().parents[2] / "otel_gpu"
    offenders = []
    for path in root.rglob("*.py"):
        if "_proto" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and not node.attr.startswith("_") and _LOCKISH.search(node.attr):
                offenders.append(f"{path.name}: self.{node.attr}")
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") \
                    and _LOCKISH.search(node.name):
                offenders.append(f"{path.name}: {node.name}()")
    assert offenders == []


def test_store_wait_for_returns_at_the_deadline_without_a_sample():
    assert SnapshotStore().wait_for(1, timeout=0.01) is None


def test_every_publication_calls_on_publish_after_the_store_has_it():
    seen: list[int] = []
    pipeline = Pipeline(_never, interval=10.0, release=lambda: None,
                        on_publish=lambda: seen.append(pipeline.store.version))
    pipeline.pods_changed()  # nothing to publish yet
    assert seen == []
    pipeline.publish_sample(_snap(1))
    pipeline.pods_changed()
    pipeline._release_due = True  # as after pods churned
    assert pipeline.release_if_due()
    assert seen == [1, 2, 3]


def test_churn_counts_hpc_jobs_coming_and_going_without_pods():
    """Bare metal (no pod attribution): every new set of jobs on a device is a new set of
    series, so jobs finishing pile up like finished pods and are released the same way."""
    from types import MappingProxyType

    churn = PodChurn(limit=3)
    for i in range(4):
        jobs = MappingProxyType({"GPU-0": (str(1000 + i),)})
        assert not churn.needs_rebuild(replace(_snap(i), jobs=jobs))
    assert churn.needs_rebuild(replace(_snap(5), jobs=MappingProxyType({"GPU-0": ("1005",)}))) \
        == CHURNED
