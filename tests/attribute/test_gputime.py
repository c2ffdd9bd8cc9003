"""GPU time per workload: the shares, the sums that always hold, and the two signals."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from otel_gpu.attribute import gputime
from otel_gpu.attribute.gputime import (
    HOST,
    OTHER_WORKLOAD,
    UNALLOCATED_DEVICE,
    GpuTimeLedger,
    GpuTimeStage,
    gpu_slices,
)
from otel_gpu.sample.sources import GPM_GRAPHICS, GPM_SM_ACTIVE, UTIL_GPU
from otel_gpu.snapshot import (
    FAILED,
    Attribution,
    Containers,
    GpuTime,
    Pods,
    PodUsage,
    ProcessUsage,
)
from otel_gpu.workload import ContainerRef, Holder, JobRef, PodRef
from tests.support.snapshots import (
    GPU0,
    GPU1,
    MIG_A,
    MIG_B,
    MIG_C,
    gpu_device,
    mig_device,
    sample,
)
from tests.support.snapshots import snapshot as make_snapshot

A = PodRef("train-a", "ml", "main")
B = PodRef("train-b", "ml", "main")
C = PodRef("notebook-c", "lab", "nb")
S = 1_000_000
G0 = gpu_device(GPU0, 0)
G1 = gpu_device(GPU1, 1)
MA = mig_device(MIG_A, G1, gi=1, profile="3g.20gb")
MB = mig_device(MIG_B, G1, gi=2, profile="1g.5gb")


def _held(uuid: str, *refs: PodRef, shared: bool = False) -> dict[str, tuple[Holder, ...]]:
    return {uuid: tuple(Holder(r, i if shared else None, "nvidia.com/gpu", shared)
                        for i, r in enumerate(refs))}


def _pods(holders: dict | None = None, usage: tuple[PodUsage, ...] = (),
          replicas: dict[str, int] | None = None) -> Pods:
    return Pods(Attribution(holders or {}, replicas=replicas or {}), usage=usage)


def _gpu(util: float | None = None, device=G0, gpm: float | None = None, **fields):
    values = {}
    if util is not None:
        values[UTIL_GPU.key] = util
    if gpm is not None:
        values[GPM_GRAPHICS.key] = gpm
    return sample(device, values=values, **fields)


def _at(ledger: GpuTimeLedger, t: float, *samples, seq: int | None = None, **fields) -> GpuTime:
    snap = make_snapshot(*samples, seq=int(t) if seq is None else seq, taken_monotonic=t,
                         **fields)
    return ledger.update(snap)


def _holders(result: GpuTime) -> dict[tuple[str, object], tuple[int, int]]:
    return {(h.uuid, h.holder): (h.allocated, h.active) for h in result.holders}


def _device(result: GpuTime, uuid: str = GPU0):
    return next(d for d in result.devices if d.uuid == uuid)


# --- the shares --------------------------------------------------------------------------


def test_a_whole_gpu_holder_gets_the_interval_and_its_activity_from_gpm_before_utilization():
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(GPU0, A))
    first = _at(ledger, 100, _gpu(40, gpm=25), pods=pods)
    assert _holders(first) == {(GPU0, A): (0, 0)}  # exists at 0 from its first sample
    result = _at(ledger, 110, _gpu(40, gpm=25), pods=pods)
    assert _holders(result) == {(GPU0, A): (10 * S, int(2.5 * S))}
    result = _at(ledger, 120, _gpu(40), pods=pods)  # no GPM on this GPU: utilization
    assert _holders(result) == {(GPU0, A): (20 * S, int(6.5 * S))}
    assert _device(result).unallocated == 0
    assert _device(result).counted == 20 * S


def test_a_time_sliced_gpu_gives_each_holder_its_replicas_over_those_advertised():
    ledger = GpuTimeLedger(pods=True)
    usage = (PodUsage(GPU0, A, 1, sm=0.5), PodUsage(GPU0, B, 1, sm=0.1))
    pods = _pods(_held(GPU0, A, B, shared=True), usage, replicas={GPU0: 4})
    _at(ledger, 0, _gpu(60), pods=pods)
    result = _at(ledger, 10, _gpu(60), pods=pods)
    # A used more than its quarter: its active time stops at its allocated time.
    assert _holders(result) == {(GPU0, A): (int(2.5 * S), int(2.5 * S)),
                                (GPU0, B): (int(2.5 * S), 1 * S)}
    assert _device(result).unallocated == 5 * S


def test_a_time_sliced_gpu_without_advertised_replicas_is_split_over_the_replicas_held():
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(GPU0, A, B, shared=True))
    _at(ledger, 0, _gpu(0), pods=pods)
    result = _at(ledger, 10, _gpu(0), pods=pods)
    assert _holders(result) == {(GPU0, A): (5 * S, 0), (GPU0, B): (5 * S, 0)}


def test_a_mig_instance_is_its_compute_slices_of_the_gpu_and_its_own_activity():
    assert gpu_slices("NVIDIA A30", ()) == 4
    assert gpu_slices("NVIDIA H100 80GB HBM3", ()) == 7
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(MIG_A, A))
    devices = (_gpu(device=G1), sample(MA, values={GPM_SM_ACTIVE.key: 50.0}), sample(MB))
    _at(ledger, 0, *devices, pods=pods)
    result = _at(ledger, 7, *devices, pods=pods)
    assert _holders(result) == {(MIG_A, A): (3 * S, int(1.5 * S))}
    assert _device(result, MIG_B).unallocated == 1 * S
    assert _device(result, GPU1).unallocated == 3 * S  # slices no instance takes
    assert sum(d.counted for d in result.devices) == 7 * S


# --- what an interval is counted by ------------------------------------------------------


def test_a_sample_without_pods_leaves_its_interval_to_the_next_one_with_pods():
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(GPU0, A))
    _at(ledger, 0, _gpu(100), pods=pods)
    held = _at(ledger, 10, _gpu(100))  # the pod stage held: no pods on this sample
    assert _holders(held) == {(GPU0, A): (0, 0)}
    result = _at(ledger, 20, _gpu(100), pods=pods)
    assert _holders(result) == {(GPU0, A): (20 * S, 20 * S)}


def test_a_republication_counts_nothing_again_and_gives_a_new_holder_its_row_at_zero():
    ledger = GpuTimeLedger(pods=True)
    _at(ledger, 0, _gpu(10), pods=_pods())
    once = _at(ledger, 10, _gpu(10), pods=_pods(), seq=2)
    again = _at(ledger, 10, _gpu(10), pods=_pods(_held(GPU0, A)), seq=2)
    assert _device(again).unallocated == _device(once).unallocated == 10 * S
    assert _holders(again) == {(GPU0, A): (0, 0)}


def test_a_lost_gpu_stays_allocated_with_no_activity_and_a_gpu_gone_from_nvml_counts_no_gap():
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(GPU0, A))
    _at(ledger, 0, _gpu(50), pods=pods)
    lost = _at(ledger, 10, _gpu(50, state=FAILED), pods=pods)
    assert _holders(lost) == {(GPU0, A): (10 * S, 0)}
    assert lost.holders[0].idle_s is None  # a lost GPU is its own event, not an idle one
    _at(ledger, 20, pods=pods)  # gone from NVML's list
    _at(ledger, 50, _gpu(50), pods=pods)  # back: the 30 s away are not counted
    result = _at(ledger, 60, _gpu(50), pods=pods)
    assert _holders(result) == {(GPU0, A): (20 * S, 5 * S)}


def test_a_finished_holder_keeps_its_totals_for_the_retention_and_continues_if_it_returns():
    ledger = GpuTimeLedger(pods=True, retain=100.0)
    _at(ledger, 0, _gpu(0), pods=_pods(_held(GPU0, A)))
    _at(ledger, 10, _gpu(0), pods=_pods(_held(GPU0, A)))
    gone = _at(ledger, 20, _gpu(0), pods=_pods())
    assert _holders(gone) == {(GPU0, A): (10 * S, 0)}
    back = _at(ledger, 30, _gpu(0), pods=_pods(_held(GPU0, A)))
    assert _holders(back) == {(GPU0, A): (20 * S, 0)}
    _at(ledger, 40, _gpu(0), pods=_pods())
    assert _holders(_at(ledger, 150, _gpu(0), pods=_pods())) == {}


def test_shares_are_worked_out_again_only_when_the_allocation_changes(monkeypatch):
    """At hundreds of pods a sample only adds to the rows: a kubelet answer equal to the
    last (a new object each poll) keeps the shares; a new holder makes them again."""
    made = []

    def counted(*source):
        made.append(source)
        return shares(*source)

    shares = gputime._shares
    monkeypatch.setattr(gputime, "_shares", counted)
    ledger = GpuTimeLedger(pods=True)
    for t in (0, 10, 20):  # a fresh, equal answer each sample
        result = _at(ledger, t, _gpu(0), pods=_pods(_held(GPU0, A, B, shared=True)))
    assert len(made) == 1
    assert _holders(result) == {(GPU0, A): (10 * S, 0), (GPU0, B): (10 * S, 0)}
    result = _at(ledger, 30, _gpu(0), pods=_pods(_held(GPU0, A, B, C, shared=True)))
    assert len(made) == 2
    assert _now(result)[(GPU0, C)] == (round(1 / 3, 6), 0.0, True)  # no process of its own


def test_a_gpu_back_after_its_holders_rows_expired_starts_them_afresh():
    """The same kubelet answer throughout: what was kept for the device while it was in
    the sample is not reused for rows dropped while it was away."""
    ledger = GpuTimeLedger(pods=True, retain=100.0)
    pods = _pods(_held(GPU0, A))
    _at(ledger, 0, _gpu(0), pods=pods)
    _at(ledger, 10, _gpu(0), pods=pods)
    _at(ledger, 20, pods=pods)  # gone from NVML's list
    assert _holders(_at(ledger, 200, pods=pods)) == {}  # its row expired
    assert _holders(_at(ledger, 300, _gpu(0), pods=pods)) == {(GPU0, A): (0, 0)}
    result = _at(ledger, 310, _gpu(0), pods=pods)
    assert _holders(result) == {(GPU0, A): (10 * S, 0)}
    assert (_device(result).counted, _device(result).unallocated) == (10 * S, 0)  # the sums hold


def _random_snapshot(rng: random.Random, t: float, seq: int):
    refs = [A, B, C]
    devices = []
    holders: dict[str, tuple[Holder, ...]] = {}
    usage: list[PodUsage] = []
    if rng.random() < 0.9:
        devices.append(_gpu(rng.choice([None, 0, 30, 100]),
                            state=FAILED if rng.random() < 0.1 else "ok",
                            gpm=rng.choice([None, 70])))
        shared = rng.random() < 0.5
        chosen = rng.sample(refs, rng.randint(0, 3 if shared else 1))
        holders.update(_held(GPU0, *chosen, shared=shared))
        usage += [PodUsage(GPU0, rng.choice([*refs, None]), 1, sm=rng.random())
                  for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.9:
        devices += [_gpu(device=G1), sample(MA, values={GPM_SM_ACTIVE.key: rng.random() * 100}),
                    sample(MB)]
        for uuid in (MIG_A, MIG_B):
            holders.update(_held(uuid, *rng.sample(refs, rng.randint(0, 1))))
    replicas = {GPU0: rng.choice([0, 2, 4])}
    pods = None if rng.random() < 0.15 else _pods(holders, tuple(usage), replicas)
    return make_snapshot(*devices, seq=seq, taken_monotonic=t, pods=pods)


@pytest.mark.parametrize("seed", range(8))
def test_through_churn_outages_losses_mig_and_time_slicing_the_sums_hold(seed):
    """Holders come and go, the pod stage misses samples, GPUs are lost or leave NVML's
    list, shares change: per device the holders' time plus the unallocated time is the
    device time counted, active never passes allocated, nothing goes back, and a GPU never
    counts more than the wall time."""
    rng = random.Random(seed)
    ledger = GpuTimeLedger(pods=True, retain=1e9, max_gone=10_000)
    t, first = 0.0, None
    before: dict = {}
    for seq in range(1, 301):
        t += rng.choice([0.5, 10.0, 10.0, 37.0, 700.0])
        snap = _random_snapshot(rng, t, seq)
        result = ledger.update(snap)
        first = t if first is None else first
        if rng.random() < 0.2:  # a re-publication with other pods
            result = ledger.update(_random_snapshot(rng, t, seq))
        rows = _holders(result)
        for key, (allocated, active) in rows.items():
            assert 0 <= active <= allocated, key
            assert allocated >= before.get(key, (0, 0))[0]
            assert active >= before.get(key, (0, 0))[1]
        before = rows
        for device in result.devices:
            held = sum(a for (uuid, _), (a, _) in rows.items() if uuid == device.uuid)
            assert held + device.unallocated == device.counted, device.uuid
            assert device.outside <= device.counted
        for root, parts in ((GPU0, (GPU0,)), (GPU1, (GPU1, MIG_A, MIG_B))):
            counted = sum(d.counted for d in result.devices if d.uuid in parts)
            assert counted <= round((t - first) * S), root


# --- the signals ---------------------------------------------------------------------------


def test_a_pod_holding_a_gpu_with_no_process_is_idle_until_one_runs():
    ledger = GpuTimeLedger(pods=True, idle_threshold=30.0)
    pods = _pods(_held(GPU0, A), (PodUsage(GPU0, A, 0),))
    assert _at(ledger, 0, _gpu(0, processes=()), pods=pods).holders[0].idle_s == 0.0
    assert _at(ledger, 10, _gpu(0, processes=()), pods=pods).holders[0].idle_s == 10.0
    assert _at(ledger, 50, _gpu(0, processes=()), pods=pods).holders[0].idle_s == 50.0
    busy = _pods(_held(GPU0, A), (PodUsage(GPU0, A, 1, sm=0.4),))
    result = _at(ledger, 60, _gpu(40, processes=(ProcessUsage(7, sm=0.4),)), pods=busy)
    assert result.holders[0].idle_s == 0.0
    assert result.idle_threshold_s == 30.0


def test_a_holder_the_kubelet_names_after_the_sample_is_idle_from_that_sample_as_held():
    """At start-up the kubelet's answer re-publishes the first sample: its holders are
    judged in it, so idle time starts where their allocated time does, not a sample later."""
    ledger = GpuTimeLedger(pods=True)
    _at(ledger, 0, _gpu(0, processes=()), pods=_pods())
    (row,) = _at(ledger, 0, _gpu(0, processes=()), pods=_pods(_held(GPU0, A)), seq=0).holders
    assert (row.idle, row.idle_s) == (True, 0.0)
    (row,) = _at(ledger, 10, _gpu(0, processes=()), pods=_pods(_held(GPU0, A))).holders
    assert (row.allocated, row.idle_s) == (10 * S, 10.0)


def test_a_docker_container_whose_process_does_nothing_is_idle():
    ledger = GpuTimeLedger()
    box = ContainerRef("a" * 64, "trainer")
    containers = Containers(MappingProxyType({GPU0: (box,)}), (PodUsage(GPU0, box, 1, sm=0.0),))
    procs = (ProcessUsage(7, sm=0.0),)
    _at(ledger, 0, _gpu(0, processes=procs), containers=containers)
    _at(ledger, 10, _gpu(0, processes=procs), containers=containers)
    result = _at(ledger, 20, _gpu(0, processes=procs), containers=containers)
    assert _holders(result) == {(GPU0, box): (20 * S, 0)}
    assert result.holders[0].idle_s == 10.0


def test_a_slurm_job_whose_gpu_has_no_process_is_idle_and_its_time_allocated():
    ledger = GpuTimeLedger()
    jobs = MappingProxyType({GPU0: (JobRef("1234"),)})
    _at(ledger, 0, _gpu(0, processes=()), jobs=jobs)
    result = _at(ledger, 600, _gpu(0, processes=()), jobs=jobs)
    assert _holders(result) == {(GPU0, JobRef("1234")): (600 * S, 0)}
    assert result.holders[0].idle_s == 600.0


def test_use_outside_any_allocation_is_told_apart():
    ledger = GpuTimeLedger(pods=True)
    procs = (ProcessUsage(7, sm=0.5),)
    free = _at(ledger, 0, _gpu(50, processes=procs),
               pods=_pods(usage=(PodUsage(GPU0, None, 1, sm=0.5),)))
    assert _device(free).outside_now == (UNALLOCATED_DEVICE,)
    other = _pods(_held(GPU0, A), (PodUsage(GPU0, A, 0), PodUsage(GPU0, B, 1, sm=0.3),
                                   PodUsage(GPU0, None, 1, sm=0.2)))
    both = _at(ledger, 10, _gpu(50, processes=procs * 2), pods=other)
    assert _device(both).outside_now == (OTHER_WORKLOAD, HOST)
    assert _device(both).outside == 5 * S  # the interval's use of a GPU nobody held
    again = _at(ledger, 20, _gpu(50, processes=procs * 2), pods=other)
    assert _device(again).outside == 5 * S + 5 * S  # B's 0.3 and the host's 0.2
    mine = _pods(_held(GPU0, A), (PodUsage(GPU0, A, 1, sm=0.5),))
    assert _device(_at(ledger, 30, _gpu(50, processes=procs), pods=mine)).outside_now == ()


def test_a_host_process_on_a_slurm_jobs_gpu_is_told_from_the_jobs_own_by_their_cgroups():
    """Jobs have no usage rows: their processes are the ones Slurm's cgroups place in a job.
    Where a container runtime answers too, its row of processes in no container holds the
    jobs' as well, which are not outside use; without cgroups read nothing is."""
    ledger = GpuTimeLedger()
    jobs = MappingProxyType({GPU0: (JobRef("1234"),)})
    procs = (ProcessUsage(7, sm=0.5), ProcessUsage(8, sm=0.2))
    _at(ledger, 0, _gpu(70, processes=procs), jobs=jobs, job_pids=frozenset({7, 8}))
    alone = _at(ledger, 10, _gpu(70, processes=procs), jobs=jobs, job_pids=frozenset({7, 8}))
    assert _device(alone).outside_now == () and _device(alone).outside == 0
    assert _holders(alone) == {(GPU0, JobRef("1234")): (10 * S, 7 * S)}  # alone: the GPU's 70 %
    beside = _at(ledger, 20, _gpu(70, processes=procs), jobs=jobs, job_pids=frozenset({7}))
    assert _device(beside).outside_now == (HOST,)
    assert _device(beside).outside == 2 * S  # the host process's own 20 %
    docker = Containers(usage=(PodUsage(GPU0, None, 2, sm=0.7),))  # both in no container
    mixed = _at(ledger, 30, _gpu(70, processes=procs), jobs=jobs, job_pids=frozenset({7, 8}),
                containers=docker)
    assert _device(mixed).outside_now == () and _device(mixed).outside == 2 * S
    unread = _at(ledger, 40, _gpu(70, processes=procs), jobs=jobs, containers=docker)
    assert _device(unread).outside_now == ()  # another scheduler's mapping files


def test_a_mig_gpus_spare_slice_is_unallocated_not_used_outside_while_its_instances_work():
    """The GPU's own activity is its instances': held and busy, it is their holders' time,
    and the slice no instance takes is capacity nobody held (the demo's GPU 2)."""
    mc = mig_device(MIG_C, G1, gi=2, profile="3g.20gb")
    pods = _pods({**_held(MIG_A, A), **_held(MIG_C, B)},
                 (PodUsage(MIG_A, A, 1), PodUsage(MIG_C, B, 1)))
    for procs in ((ProcessUsage(7),), None):  # the processes read, or not
        ledger = GpuTimeLedger(pods=True)
        devices = (_gpu(device=G1, gpm=55, processes=None if procs is None else ()),
                   sample(MA, values={GPM_SM_ACTIVE.key: 80.0}, processes=procs),
                   sample(mc, values={GPM_SM_ACTIVE.key: 30.0}, processes=procs))
        _at(ledger, 0, *devices, pods=pods)
        result = _at(ledger, 70, *devices, pods=pods)
        root = _device(result, GPU1)
        assert (root.outside, root.outside_now) == (0, ())
        assert root.unallocated == 10 * S  # the spare slice: 1/7 of 70 s
        assert _device(result, MIG_A).outside == _device(result, MIG_C).outside == 0
        assert _holders(result) == {(MIG_A, A): (30 * S, 24 * S), (MIG_C, B): (30 * S, 9 * S)}


def test_a_gpu_nobody_holds_is_used_outside_only_while_a_process_runs_there():
    ledger = GpuTimeLedger(pods=True)
    _at(ledger, 0, _gpu(40, processes=()), pods=_pods())
    idle = _at(ledger, 10, _gpu(40, processes=()), pods=_pods())  # busy, but no process
    assert (_device(idle).outside, _device(idle).unallocated) == (0, 10 * S)
    used = _at(ledger, 20, _gpu(40, processes=(ProcessUsage(7),)),
               pods=_pods(usage=(PodUsage(GPU0, None, 1),)))
    assert _device(used).outside == 4 * S
    unread = _at(ledger, 30, _gpu(40), pods=_pods())  # processes not read: its activity
    assert _device(unread).outside == 8 * S


def test_a_time_sliced_gpus_replicas_nobody_holds_are_unallocated_not_used_outside():
    ledger = GpuTimeLedger(pods=True)
    usage = (PodUsage(GPU0, A, 1, sm=0.6),)
    pods = _pods(_held(GPU0, A, shared=True), usage, replicas={GPU0: 4})
    procs = (ProcessUsage(7, sm=0.6),)
    _at(ledger, 0, _gpu(60, processes=procs), pods=pods)
    result = _at(ledger, 10, _gpu(60, processes=procs), pods=pods)
    assert (_device(result).outside, _device(result).outside_now) == (0, ())
    assert _device(result).unallocated == int(7.5 * S)
    host = _pods(_held(GPU0, A, shared=True), (*usage, PodUsage(GPU0, None, 1, sm=0.2)),
                 replicas={GPU0: 4})
    result = _at(ledger, 20, _gpu(80, processes=(*procs, ProcessUsage(8, sm=0.2))), pods=host)
    assert (_device(result).outside, _device(result).outside_now) == (2 * S, (HOST,))
    assert _device(result).unallocated == 15 * S


def test_the_stage_attaches_the_ledger_to_the_snapshot():
    stage = GpuTimeStage(GpuTimeLedger())
    snap = stage.process(make_snapshot(_gpu(10), seq=1))
    assert snap.gpu_time is not None and _device(snap.gpu_time).counted == 0


def _now(result: GpuTime) -> dict[tuple[str, object], tuple[float, float | None, bool | None]]:
    return {(h.uuid, h.holder): (round(h.share, 6), None if h.active_share is None
                                 else round(h.active_share, 6), h.idle)
            for h in result.holders}


def test_each_holder_says_its_share_of_the_gpu_and_its_activity_from_its_first_sample():
    """What ``check`` prints from its one sample: shares of the whole GPU, held and busy."""
    ledger = GpuTimeLedger(pods=True)
    usage = (PodUsage(GPU0, A, 1, sm=0.5), PodUsage(GPU0, B, 1, sm=0.1))
    pods = _pods({**_held(GPU0, A, B, shared=True), **_held(MIG_A, C)}, usage,
                 replicas={GPU0: 4})
    devices = (_gpu(60, processes=(ProcessUsage(7), ProcessUsage(8))), _gpu(device=G1),
               sample(MA, values={GPM_SM_ACTIVE.key: 70.0}), sample(MB))
    first = _at(ledger, 0, *devices, pods=pods)
    assert _now(first) == {(GPU0, A): (0.25, 0.25, False),  # 0.5 of the GPU, held 0.25
                           (GPU0, B): (0.25, 0.1, False),
                           (MIG_A, C): (round(3 / 7, 6), round(0.7 * 3 / 7, 6), None)}
    gone = _at(ledger, 10, *devices, pods=_pods(_held(GPU0, A, shared=True), usage[:1],
                                                 replicas={GPU0: 4}))
    now = _now(gone)
    assert now[(GPU0, B)] == now[(MIG_A, C)] == (0.0, None, None)  # no longer held
    assert now[(GPU0, A)] == (0.25, 0.25, False)


def test_an_idle_allocation_is_said_idle_in_its_first_sample():
    ledger = GpuTimeLedger(pods=True)
    pods = _pods(_held(GPU0, A), (PodUsage(GPU0, A, 0),))
    (row,) = _at(ledger, 0, _gpu(0, processes=()), pods=pods).holders
    assert (row.idle, row.idle_s, row.share, row.active_share) == (True, 0.0, 1.0, 0.0)
