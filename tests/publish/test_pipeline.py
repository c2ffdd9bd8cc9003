"""The publish loop: publishing from two threads, subscribers, and the sampler loop."""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import replace
from pathlib import Path

from otel_gpu.publish.pipeline import Followup, Pipeline
from otel_gpu.publish.readiness import Readiness
from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import Attribution, Device, DeviceSample, Pods, Snapshot
from otel_gpu.workload import Holder, JobRef, PodRef
from testkit.process import wait_until
from tests.support.snapshots import snapshot
from tests.support.subscribers import RecordingSubscriber

_LOCKISH = re.compile(r"(^|_)(r?lock|cond|mutex)s?($|_)", re.IGNORECASE)
GPU = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")


def _snap(seq: int, taken: float | None = None, devices=()) -> Snapshot:
    return snapshot(*devices, seq=seq, taken_monotonic=taken)


def _held_by(*pods: str) -> Attribution:
    return Attribution({GPU.uuid: tuple(Holder(PodRef(p, "ns", "main"), None, "nvidia.com/gpu")
                                        for p in pods)})


def _sliced(holders: int) -> Attribution:
    """GPU shared by ``holders`` pods, one time-slicing replica each."""
    return Attribution({GPU.uuid: tuple(Holder(PodRef(f"s{i}", "ns", "main"), i,
                                               "nvidia.com/gpu", True)
                                        for i in range(holders))})


def _never() -> Snapshot:
    raise AssertionError("the sampler thread is not started in this test")


def _pipeline(sample=_never, interval=10.0, *, enrich=None, subscribers=(), **timings):
    stages = (enrich,) if enrich is not None else ()
    return Pipeline(SnapshotStore(), sample,
                    timings=replace(Timings.from_interval(interval), **timings),
                    subscribers=subscribers, stages=stages)


def test_new_pods_republish_the_latest_sample():
    pods = {"now": _held_by("a")}
    pipeline = _pipeline(enrich=lambda s: replace(s, pods=Pods(pods["now"])))
    store = pipeline.store
    pipeline.pods_changed()  # nothing sampled yet: nothing to publish
    assert store.latest is None and store.version == 0
    pipeline.publish_sample(_snap(1))
    assert store.latest.series_pods(GPU.uuid) == (PodRef("a", "ns", "main"),)
    pods["now"] = _held_by("b")
    pipeline.pods_changed()
    assert store.latest.seq == 1 and store.latest.series_pods(GPU.uuid)[0].pod == "b"
    assert store.version == 2
    pipeline.publish_sample(_snap(2))
    assert store.latest.seq == 2 and store.latest.series_pods(GPU.uuid)[0].pod == "b"


def test_attribution_failure_keeps_the_sample():
    def broken(_):
        raise RuntimeError("bug")

    def jobs(snapshot):
        return replace(snapshot, jobs={GPU.uuid: (JobRef("42"),)})

    pipeline = Pipeline(SnapshotStore(), _never, timings=Timings.from_interval(10.0),
                        stages=(broken, jobs))
    pipeline.publish_sample(_snap(7))
    latest = pipeline.store.latest
    # the failing stage's part is left out; the sample and the next stage's part are kept
    assert latest.seq == 7 and latest.pods is None and latest.jobs == {GPU.uuid: (JobRef("42"),)}



def test_readiness_reads_the_store_and_the_clock():
    clock = {"now": 100.0}
    pipeline = _pipeline()
    ready = Readiness(pipeline.store, pipeline.timings, lambda: clock["now"])
    assert not ready()[0]
    pipeline.publish_sample(_snap(1, taken=100.0, devices=(DeviceSample(GPU),)))
    assert ready()[0]
    clock["now"] = 131.0
    assert "hung" in ready()[1]


def test_sampler_thread_survives_a_bug():
    calls = {"n": 0}

    def flaky() -> Snapshot:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return _snap(calls["n"] - 1)

    pipeline = _pipeline(flaky, interval=0.01, max_backoff=0.05)
    pipeline.start()
    try:
        snap = pipeline.store.wait_for(1, timeout=10)
        assert snap is not None and snap.seq >= 1 and calls["n"] >= 2
    finally:
        assert pipeline.stop()






def test_an_urgent_followup_wakes_the_sampler_and_holds_the_later_subscribers():
    """An urgent follow-up asked for on the kubelet thread runs at once on the sampler
    thread, not at the next sample (an hour away here); the later subscribers do not see
    the publication that asked for it, and the latest snapshot is published again after
    it, to every subscriber."""
    ran: list[str] = []
    urgent = Followup(lambda: ran.append(threading.current_thread().name), urgent=True)
    asking = {"now": False}

    def answer(snapshot):
        if asking["now"]:  # once: the re-publication finds nothing to do
            asking["now"] = False
            return urgent
        return None

    first = RecordingSubscriber(answer)
    later = RecordingSubscriber()
    pipeline = _pipeline(lambda: _snap(1), interval=3600.0, subscribers=(first, later))
    first.store = later.store = pipeline.store
    pipeline.start()
    try:
        assert pipeline.store.wait_for(1, timeout=10) is not None
        wait_until(lambda: len(later.seen) == 1, 10, "the first publication")
        asking["now"] = True
        t = threading.Thread(target=pipeline.pods_changed, name="otel-gpu-podresources")
        t.start()
        t.join(10)
        wait_until(lambda: ran, 10, "the follow-up on the sampler thread")
        assert ran == ["otel-gpu-sampler"]
        wait_until(lambda: len(later.seen) == 2, 10, "the re-publication")
        # the kubelet thread's publication (version 2) reached only the first subscriber
        assert [v for _, _, v in first.seen[:2]] == [1, 2]
        assert later.seen[1][1:] == ("otel-gpu-sampler", 3)
    finally:
        assert pipeline.stop()


def test_a_failing_followup_does_not_end_the_sampler_thread():
    calls: list[int] = []

    def run() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a bug")

    urgent = Followup(run, urgent=True)
    pipeline = _pipeline(lambda: _snap(1), interval=3600.0,
                         subscribers=(RecordingSubscriber(lambda s: urgent if s.pods else None),),
                         enrich=lambda s: replace(s, pods=Pods(_held_by("p0"))))
    pipeline.start()
    try:
        wait_until(lambda: len(calls) >= 1, 10, "the first follow-up")
        pipeline.pods_changed()
        wait_until(lambda: len(calls) >= 2, 10, "the second follow-up, after a failing one")
    finally:
        assert pipeline.stop()


def test_followups_run_on_the_sampler_thread_not_the_kubelet_thread():
    """Publications on the kubelet thread only mark a follow-up; the sampler thread runs it,
    once however many publications asked for it."""
    threads: list[str] = []
    followup = Followup(lambda: threads.append(threading.current_thread().name))
    pods = {"now": _held_by("p0")}
    pipeline = _pipeline(enrich=lambda s: replace(s, pods=Pods(pods["now"])),
                         subscribers=(RecordingSubscriber(lambda s: followup),))
    pipeline.publish_sample(_snap(1))

    def kubelet_thread() -> None:
        for i in range(1, 200):
            pods["now"] = _held_by(f"p{i}")
            pipeline.pods_changed()

    t = threading.Thread(target=kubelet_thread, name="otel-gpu-podresources")
    t.start()
    t.join(10)
    assert threads == []  # the kubelet thread never ran it
    assert pipeline.run_followups() is True
    assert threads == [threading.current_thread().name]


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


def test_every_publication_reaches_every_subscriber_after_the_store_has_it():
    followup = Followup(lambda: None)
    first = RecordingSubscriber(lambda s: followup if s.seq == 1 and len(first.seen) == 2 else None)
    second = RecordingSubscriber()
    pipeline = _pipeline(subscribers=(first, second))
    first.store = second.store = pipeline.store
    pipeline.pods_changed()  # nothing to publish yet
    assert first.seen == second.seen == []
    pipeline.publish_sample(_snap(1))
    pipeline.pods_changed()  # the first subscriber asks for a follow-up here
    assert pipeline.run_followups()  # ... which publishes the latest again
    assert not pipeline.run_followups()
    name = threading.current_thread().name
    assert first.seen == second.seen == [(1, name, 1), (1, name, 2), (1, name, 3)]
