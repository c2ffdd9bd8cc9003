"""The GPU time ledger's metrics: each workload kind in its family, and at hundreds of pods
the same attribute objects every collection while the holders stay."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from otel_gpu.attribute.gputime import GpuTimeLedger
from otel_gpu.instrument.gputime import METRICS
from otel_gpu.sample.sources import UTIL_GPU
from otel_gpu.snapshot import Attribution, Containers, Pods, Snapshot
from otel_gpu.workload import ContainerRef, Holder, JobRef, PodRef
from tests.support.snapshots import GPU0, GPU1, gpu_device, sample
from tests.support.snapshots import snapshot as make_snapshot

BY_NAME = {m.name: m for m in METRICS}
BOX = ContainerRef("c" * 64, "trainer")
JOB = JobRef("4242")


def _pods(*refs: PodRef) -> Pods:
    return Pods(Attribution({GPU0: tuple(Holder(r, i, "nvidia.com/gpu", True)
                                         for i, r in enumerate(refs))}, replicas={GPU0: 4}))


def _samples(ledger: GpuTimeLedger, pods: Pods, *times: float, **fields) -> list[Snapshot]:
    out = []
    for t in times:
        snap = make_snapshot(sample(gpu_device(GPU0, 0), values={UTIL_GPU.key: 40.0}),
                             sample(gpu_device(GPU1, 1), values={UTIL_GPU.key: 40.0}),
                             seq=int(t), taken_monotonic=t, pods=pods, **fields)
        out.append(replace(snap, gpu_time=ledger.update(snap)))
    return out


def _observe(name: str, snap: Snapshot) -> list:
    per_node = BY_NAME[name].per_node
    assert per_node is not None
    return list(per_node(snap, 0.0))


def test_each_kind_of_holder_is_in_its_own_family_in_seconds():
    a, b = PodRef("a", "ml", "main", uid="u-1"), PodRef("b", "ml", "main")
    jobs = MappingProxyType({GPU1: (JOB,)})
    containers = Containers(MappingProxyType({GPU1: (BOX,)}))
    ledger = GpuTimeLedger(pods=True)
    _, snap = _samples(ledger, _pods(a, b), 0, 10, jobs=jobs, containers=containers)
    pods = {tuple(sorted(attrs.items())): value
            for value, attrs in _observe("nvidia.gpu.k8s.time.allocated", snap)}
    assert pods == {
        (("hw.id", GPU0), ("k8s.container.name", "main"), ("k8s.namespace.name", "ml"),
         ("k8s.pod.name", "a"), ("k8s.pod.uid", "u-1")): 2.5,
        (("hw.id", GPU0), ("k8s.container.name", "main"), ("k8s.namespace.name", "ml"),
         ("k8s.pod.name", "b")): 2.5}
    assert _observe("nvidia.gpu.hpc.time.allocated", snap) == [
        (10.0, {"hw.id": GPU1, "nvidia.gpu.hpc.job.id": "4242"})]
    assert _observe("nvidia.gpu.container.time.allocated", snap) == []  # the job holds GPU1
    assert _observe("nvidia.gpu.time.unallocated", snap) == [(5.0, {"hw.id": GPU0}),
                                                             (0.0, {"hw.id": GPU1})]


def test_while_the_pods_stay_each_series_gets_the_same_attribute_object_every_collection():
    """The series table knows a series at one comparison only by its object: 500 pods
    made afresh each collection would cost 1,500 dicts and a lookup by content each."""
    refs = [PodRef(f"p{i}", "bench", "srv") for i in range(4)]
    ledger = GpuTimeLedger(pods=True)
    _, first, second = _samples(ledger, _pods(*refs[:3]), 0, 10, 20)
    for name in ("nvidia.gpu.k8s.time.allocated", "nvidia.gpu.k8s.time.active",
                 "nvidia.gpu.k8s.idle.duration", "nvidia.gpu.time.unallocated"):
        before, after = _observe(name, first), _observe(name, second)
        assert len(before) == len(after) > 0
        assert all(x[1] is y[1] for x, y in zip(before, after, strict=True)), name
    (third,) = _samples(ledger, _pods(*refs), 30)  # a fourth pod: the others' sets stay
    kept = {attrs["k8s.pod.name"]: attrs
            for _, attrs in _observe("nvidia.gpu.k8s.time.allocated", second)}
    now = {attrs["k8s.pod.name"]: attrs
           for _, attrs in _observe("nvidia.gpu.k8s.time.allocated", third)}
    assert all(now[pod] is kept[pod] for pod in kept)
    assert now["p3"] == {"hw.id": GPU0, "k8s.pod.name": "p3", "k8s.namespace.name": "bench",
                         "k8s.container.name": "srv"}


def test_a_pod_back_under_a_new_identity_gets_its_own_attributes():
    """A row dropped and made again may hold an equal pod that names its UID now: its set
    is made from the new one, not the set kept for the equal old one."""
    old, new = PodRef("a", "ml", "main"), PodRef("a", "ml", "main", uid="u-9")
    ledger = GpuTimeLedger(pods=True, retain=5.0)
    (before,) = _samples(ledger, _pods(old), 0)
    assert "k8s.pod.uid" not in _observe("nvidia.gpu.k8s.time.allocated", before)[0][1]
    _samples(ledger, Pods(Attribution()), 10, 20)  # gone, its row dropped after 5 s
    (after,) = _samples(ledger, _pods(new), 30)
    assert _observe("nvidia.gpu.k8s.time.allocated", after)[0][1]["k8s.pod.uid"] == "u-9"
