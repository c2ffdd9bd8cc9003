"""The ledger's signals as records: an idle allocation and use outside any, start and end."""

from __future__ import annotations

from types import MappingProxyType

from otel_gpu.attribute.gputime import GpuTimeLedger, GpuTimeStage
from otel_gpu.export.events.detector import EventDetector
from otel_gpu.export.events.workloads import IDLE, OUTSIDE
from otel_gpu.instrument.gputime import OUTSIDE_KIND
from otel_gpu.sample.sources import UTIL_GPU
from otel_gpu.snapshot import Attribution, Containers, Pods, PodUsage, ProcessUsage
from otel_gpu.workload import ContainerRef, Holder, JobRef, PodRef
from tests.support.snapshots import GPU0, gpu_device, sample
from tests.support.snapshots import snapshot as make_snapshot

A = PodRef("train-a", "ml", "main")
B = PodRef("train-b", "ml", "main")
PROC = (ProcessUsage(7, sm=0.5),)


def _run(stage, detector, t, *, processes=(), util=0.0, **fields):
    snap = make_snapshot(sample(gpu_device(GPU0, 0), values={UTIL_GPU.key: util},
                                processes=processes),
                         seq=int(t) + 1, taken_monotonic=t, taken_at=1.7e9 + t, **fields)
    return [(e.name, e.attributes["nvidia.gpu.event.phase"], e)
            for e in detector.observe(stage.process(snap))]


def _pods(*usage: PodUsage, holders=(A,)) -> Pods:
    held = {GPU0: tuple(Holder(r, None, "nvidia.com/gpu") for r in holders)} if holders else {}
    return Pods(Attribution(held), usage=usage)


def test_a_pod_holding_a_gpu_idle_past_the_threshold_is_one_record_under_it_and_one_at_the_end():
    stage, detector = GpuTimeStage(GpuTimeLedger(idle_threshold=60.0, pods=True)), EventDetector()
    idle = _pods(PodUsage(GPU0, A, 0))
    assert _run(stage, detector, 0, pods=idle) == []
    assert _run(stage, detector, 30, pods=idle) == []
    [(name, phase, event)] = _run(stage, detector, 60, pods=idle)
    assert (name, phase) == (IDLE, "start")
    assert event.attributes["k8s.pod.name"] == "train-a"
    assert event.attributes["hw.id"] == GPU0
    assert _run(stage, detector, 90, pods=idle) == []  # once per episode
    busy = _pods(PodUsage(GPU0, A, 1, sm=0.5))
    [(name, phase, event)] = _run(stage, detector, 100, pods=busy, processes=PROC, util=50.0)
    assert (name, phase) == (IDLE, "end")
    assert event.attributes["nvidia.gpu.event.duration"] == 100.0


def test_a_docker_container_and_a_slurm_job_idle_past_the_threshold_start_an_episode():
    box = ContainerRef("b" * 64, "trainer")
    containers = Containers(MappingProxyType({GPU0: (box,)}), (PodUsage(GPU0, box, 1, sm=0.0),))
    stage, detector = GpuTimeStage(GpuTimeLedger(idle_threshold=60.0)), EventDetector()
    idle_proc = (ProcessUsage(7, sm=0.0),)
    _run(stage, detector, 0, processes=idle_proc, containers=containers)
    _run(stage, detector, 10, processes=idle_proc, containers=containers)
    [(name, phase, event)] = _run(stage, detector, 80, processes=idle_proc, containers=containers)
    assert (name, phase, event.attributes["container.name"]) == (IDLE, "start", "trainer")

    jobs = MappingProxyType({GPU0: (JobRef("1234"),)})
    stage, detector = GpuTimeStage(GpuTimeLedger(idle_threshold=60.0)), EventDetector()
    _run(stage, detector, 0, jobs=jobs)
    [(name, phase, event)] = _run(stage, detector, 61, jobs=jobs)
    assert (name, phase, event.attributes["nvidia.gpu.hpc.job.id"]) == (IDLE, "start", "1234")
    [(name, phase, _)] = _run(stage, detector, 70, jobs=MappingProxyType({}))  # epilog ran
    assert (name, phase) == (IDLE, "end")


def test_use_outside_any_allocation_starts_and_ends_one_episode_per_kind():
    stage, detector = GpuTimeStage(GpuTimeLedger(pods=True)), EventDetector()
    other = _pods(PodUsage(GPU0, A, 1, sm=0.1), PodUsage(GPU0, B, 1, sm=0.4))
    [(name, phase, event)] = _run(stage, detector, 0, pods=other, processes=PROC * 2, util=50.0)
    assert (name, phase, event.attributes[OUTSIDE_KIND]) == (OUTSIDE, "start", "other_workload")
    assert _run(stage, detector, 10, pods=other, processes=PROC * 2, util=50.0) == []
    mine = _pods(PodUsage(GPU0, A, 1, sm=0.5))
    [(name, phase, event)] = _run(stage, detector, 20, pods=mine, processes=PROC, util=50.0)
    assert (name, phase, event.attributes[OUTSIDE_KIND]) == (OUTSIDE, "end", "other_workload")
    free = _pods(PodUsage(GPU0, None, 1, sm=0.5), holders=())
    [(name, phase, event)] = _run(stage, detector, 30, pods=free, processes=PROC, util=50.0)
    assert (phase, event.attributes[OUTSIDE_KIND]) == ("start", "unallocated_device")


def test_the_records_count_against_the_detectors_cap_per_sample():
    stage, detector = GpuTimeStage(GpuTimeLedger(pods=True)), EventDetector(max_events=0)
    free = _pods(PodUsage(GPU0, None, 1, sm=0.5), holders=())
    assert _run(stage, detector, 0, pods=free, processes=PROC, util=50.0) == []
    assert detector.dropped == 1
