"""The cardinality policy: when the MeterProvider is rebuilt, and what it is sized for."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import MappingProxyType

from otel_gpu.instrument.cardinality import (
    CHURNED,
    GROWN,
    SDK_CARDINALITY_LIMIT,
    CardinalityGuard,
    PodChurn,
    cardinality,
    room_for,
)
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.publish.pipeline import Pipeline
from otel_gpu.publish.store import SnapshotStore
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import OK, Attribution, Device, DeviceSample, Pods, Snapshot
from otel_gpu.workload import Holder, JobRef, PodRef
from testkit.process import wait_until
from tests.support.providers import RebuildingProvider
from tests.support.snapshots import snapshot

GPU = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")


def _snap(seq: int) -> Snapshot:
    return snapshot(seq=seq)


def _held_by(*pods: str) -> Attribution:
    return Attribution({GPU.uuid: tuple(Holder(PodRef(p, "ns", "main"), None, "nvidia.com/gpu")
                                        for p in pods)})


def _sliced(holders: int) -> Attribution:
    """GPU shared by ``holders`` pods, one time-slicing replica each."""
    return Attribution({GPU.uuid: tuple(Holder(PodRef(f"s{i}", "ns", "main"), i,
                                               "nvidia.com/gpu", True)
                                        for i in range(holders))})


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


def test_churn_counts_hpc_jobs_coming_and_going_without_pods():
    """Bare metal (no pod attribution): every new set of jobs on a device is a new set of
    series, so jobs finishing pile up like finished pods and are released the same way."""
    churn = PodChurn(limit=3)
    for i in range(4):
        jobs = MappingProxyType({"GPU-0": (JobRef(str(1000 + i)),)})
        assert not churn.needs_rebuild(replace(_snap(i), jobs=jobs))
    later = MappingProxyType({"GPU-0": (JobRef("1005"),)})
    assert churn.needs_rebuild(replace(_snap(5), jobs=later)) == CHURNED


def _time_sliced(holders: int) -> Snapshot:
    sample = DeviceSample(GPU, OK, MappingProxyType({"power": 300_000}))
    return snapshot(sample, pods=Pods(_sliced(holders)))


def test_cardinality_counts_devices_series_and_pods():
    assert cardinality(None, CATALOG) == (32 * (64 + room_for(0)), room_for(0))
    limit, room = cardinality(_time_sliced(2500), CATALOG)
    fanout = limit // (1 + room_for(2500))
    assert fanout >= 3  # hw.status: one series per state
    assert limit == fanout * (1 + room_for(2500)) and room == room_for(2500)
    plain = snapshot(DeviceSample(GPU, OK, MappingProxyType({"power": 300_000})))
    # never below the default
    assert cardinality(plain, ()) == (SDK_CARDINALITY_LIMIT, SDK_CARDINALITY_LIMIT - 1)


def test_pods_outgrowing_the_sdk_wake_the_sampler_for_a_rebuild():
    """Growth seen on the kubelet thread is rebuilt at once on the sampler thread, not at
    the next sample (an hour away here); the room the rebuild reports becomes the guard's,
    and the latest snapshot is published again so that caches drop the old render."""
    pods = {"now": _held_by("p0")}
    provider = RebuildingProvider(room=10_000)
    store = SnapshotStore()
    pipeline = Pipeline(store, lambda: _snap(1), timings=Timings.from_interval(3600.0),
                        subscribers=(CardinalityGuard(provider),),
                        stages=(lambda s: replace(s, pods=Pods(pods["now"])),))
    pipeline.start()
    try:
        assert store.wait_for(1, timeout=10) is not None
        version = store.version
        pods["now"] = _sliced(2500)
        t = threading.Thread(target=pipeline.pods_changed, name="otel-gpu-podresources")
        t.start()
        t.join(10)
        wait_until(lambda: provider.rebuilt, 10, "a rebuild on the sampler thread")
        assert provider.rebuilt == ["otel-gpu-sampler"]
        wait_until(lambda: store.version >= version + 2, 10, "the re-publication")
        pods["now"] = _sliced(5000)  # inside the room the rebuild reported: no rebuild
        pipeline.pods_changed()
        assert pipeline.run_followups() is False and provider.rebuilt == ["otel-gpu-sampler"]
    finally:
        assert pipeline.stop()


def test_finished_pods_piling_up_ask_for_one_rebuild_after_the_sample():
    provider = RebuildingProvider(room=room_for(1))
    guard = CardinalityGuard(provider, PodChurn(limit=3))
    followups = [guard.published(replace(_snap(i), pods=Pods(_held_by(f"p{i}"))))
                 for i in range(6)]
    asked = [f for f in followups if f is not None]
    assert len(asked) == 1 and not asked[0].urgent  # churn waits for the sample's end
    asked[0].run()
    assert provider.rebuilt == [threading.current_thread().name]
