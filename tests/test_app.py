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
