"""Energy per container: the split rules, the sum that always holds, and the bounds."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from otel_gpu.attribute.k8s import energy
from otel_gpu.attribute.k8s.energy import EnergyLedger, apportion, compute_slices
from otel_gpu.attribute.k8s.enrich import PodEnricher
from otel_gpu.attribute.k8s.kubelet_answer import Allocation, PodResourcesState
from otel_gpu.instrument.catalog import CATALOG
from otel_gpu.sample.sources import ENERGY, GPM_SM_ACTIVE
from otel_gpu.snapshot import Attribution, PodEnergy, Pods, PodUsage
from otel_gpu.workload import Holder, PodRef
from testkit.kubelet import FakePodSource
from tests.support.snapshots import GPU0, GPU1, MIG_A, MIG_B, gpu_device, mig_device, sample
from tests.support.snapshots import snapshot as make_snapshot

A = PodRef("train-a", "ml", "main")
B = PodRef("train-b", "ml", "main")
C = PodRef("encode-c", "media", "enc")
NOBODY = Attribution()


def _holders(uuid: str, *refs: PodRef, shared: bool = False) -> dict[str, tuple[Holder, ...]]:
    return {uuid: tuple(Holder(PodRef(r.pod, r.namespace, r.container), i if shared else None,
                               "nvidia.com/gpu", shared) for i, r in enumerate(refs))}


def _owned(uuid: str = GPU0, ref: PodRef = A) -> Attribution:
    return Attribution(_holders(uuid, ref))


def _gpu(mj: int | None, uuid: str = GPU0, index: int = 0):
    return sample(gpu_device(uuid, index), values={} if mj is None else {ENERGY.key: mj})


def _snap(seq: int, *samples, monotonic: float | None = None):
    return make_snapshot(*samples, seq=seq, taken_monotonic=monotonic)


def _rows(rows: tuple[PodEnergy, ...]) -> dict[tuple[str, PodRef | None], int]:
    return {(r.uuid, r.pod): r.millijoules for r in rows}


def _rules(rows: tuple[PodEnergy, ...]) -> dict[str, str]:
    return {r.uuid: r.rule for r in rows}


def _never_back(before: dict, after: dict) -> None:
    for key, value in before.items():
        if key in after:
            assert after[key] >= value, key


# --- the rules ------------------------------------------------------------------------


def test_an_exclusive_holder_gets_every_increase_and_the_past_is_unattributed():
    ledger = EnergyLedger()
    first = _rows(ledger.update(_snap(1, _gpu(1_000_000)), _owned()))
    assert first == {(GPU0, A): 0, (GPU0, None): 1_000_000}
    rows = ledger.update(_snap(2, _gpu(1_000_600)), _owned())
    assert _rows(rows) == {(GPU0, A): 600, (GPU0, None): 1_000_000}
    assert _rules(rows) == {GPU0: energy.EXCLUSIVE}


def _shares(uuid: str, **by: float | None) -> tuple[PodUsage, ...]:
    refs = {"a": A, "b": B, "c": C, "none": None}
    return tuple(PodUsage(uuid, refs[k], 1, sm=v) for k, v in by.items())


def test_a_time_sliced_gpu_is_split_by_sm_share_with_idle_time_unattributed():
    ledger = EnergyLedger()
    sliced = Attribution(_holders(GPU0, A, B, C, shared=True))
    usage = _shares(GPU0, a=0.2, b=0.3, c=0.35, none=0.1)
    ledger.update(_snap(1, _gpu(5000)), sliced, usage)
    rows = ledger.update(_snap(2, _gpu(6000)), sliced, usage)
    # 20 %, 30 %, 35 %; the host process's 10 % and the idle 5 % are nobody's
    assert _rows(rows) == {(GPU0, A): 200, (GPU0, B): 300, (GPU0, C): 350, (GPU0, None): 5150}
    assert _rules(rows) == {GPU0: energy.SM_SHARE}


def test_shares_above_one_are_scaled_and_the_split_is_exact_in_millijoules():
    ledger = EnergyLedger()
    sliced = Attribution(_holders(GPU0, A, B, shared=True))
    usage = _shares(GPU0, a=0.8, b=0.6)  # MPS: processes ran at once
    ledger.update(_snap(1, _gpu(0)), sliced, usage)
    rows = _rows(ledger.update(_snap(2, _gpu(1001)), sliced, usage))
    assert rows[(GPU0, A)] in (571, 572) and rows[(GPU0, B)] in (428, 429)
    assert sum(rows.values()) == 1001


def test_a_shared_gpu_without_shares_is_all_unattributed():
    ledger = EnergyLedger()
    sliced = Attribution(_holders(GPU0, A, B, shared=True))
    ledger.update(_snap(1, _gpu(100)), sliced)
    rows = ledger.update(_snap(2, _gpu(900)), sliced)
    # the holders have series (at 0) wherever the allocation series are
    assert _rows(rows) == {(GPU0, A): 0, (GPU0, B): 0, (GPU0, None): 900}
    assert _rules(rows) == {GPU0: energy.UNATTRIBUTED}


def _mig(mj: int | None, active: tuple[float | None, float | None]):
    parent = gpu_device(GPU1, 1)
    values = {} if mj is None else {ENERGY.key: mj}
    big = mig_device(MIG_A, parent, gi=1, profile="3g.20gb")
    small = mig_device(MIG_B, parent, gi=5, profile="1g.5gb")
    return (sample(parent, values=values),
            *(sample(d, values={} if a is None else {GPM_SM_ACTIVE.key: a})
              for d, a in ((big, active[0]), (small, active[1]))))


def test_mig_splits_by_instance_activity_then_by_the_rules_inside_each():
    ledger = EnergyLedger()
    held = _owned(MIG_A, A)
    ledger.update(_snap(1, *_mig(10_000, (50.0, 100.0))), held)
    rows = ledger.update(_snap(2, *_mig(11_000, (50.0, 100.0))), held)
    # 50 % of 3 slices against 100 % of 1: 1.5 to 1
    assert _rows(rows) == {(GPU1, None): 10_000, (MIG_A, A): 600, (MIG_B, None): 400,
                           (MIG_A, None): 0}  # every instance has its idle row, at 0 here
    assert _rules(rows) == {GPU1: energy.MIG_ACTIVITY, MIG_A: energy.EXCLUSIVE,
                            MIG_B: energy.UNATTRIBUTED}


@pytest.mark.parametrize("active", [(50.0, None), (0.0, 0.0)], ids=["no-gpm", "all-idle"])
def test_mig_without_activity_splits_by_compute_slices(active):
    ledger = EnergyLedger()
    held = _owned(MIG_A, A)
    ledger.update(_snap(1, *_mig(10_000, active)), held)
    rows = ledger.update(_snap(2, *_mig(12_000, active)), held)
    assert _rows(rows) == {(GPU1, None): 10_000, (MIG_A, A): 1500, (MIG_B, None): 500,
                           (MIG_A, None): 0}
    assert _rules(rows)[GPU1] == energy.MIG_SLICES


@pytest.mark.parametrize(("profile", "slices"), [
    ("3g.20gb", 3), ("1g.10gb+me", 1), ("7g.80gb", 7), ("1c.3g.20gb", 1), ("2c.4g.20gb", 2),
    (None, 1), ("odd", 1),
])
def test_compute_slices_come_from_the_profile(profile, slices):
    assert compute_slices(profile) == slices


def test_apportion_adds_up_exactly():
    parts = apportion(10, {"x": 1.0, "y": 1.0, "z": 1.0}, "rest")
    assert sorted(parts.values()) == [3, 3, 4] and sum(parts.values()) == 10
    assert apportion(7, {"x": 0.0}, "rest") == {"rest": 7}


def test_a_gpu_without_an_energy_counter_has_no_rows_rather_than_zeros():
    ledger = EnergyLedger()
    sliced = Attribution(_holders(GPU0, A, B, shared=True))
    assert ledger.update(_snap(1, _gpu(None)), sliced, _shares(GPU0, a=0.5)) == ()
    rows = ledger.update(_snap(2, _gpu(None), _gpu(10, GPU1, 1)), _owned(GPU1, C))
    assert _rows(rows) == {(GPU1, C): 0, (GPU1, None): 10}


# --- the counter's own accidents --------------------------------------------------------


@pytest.mark.parametrize("missing", [None, float("nan")], ids=["absent", "nan"])
def test_a_missing_reading_carries_its_increase_to_the_next_one(missing):
    ledger = EnergyLedger()
    ledger.update(_snap(1, _gpu(1000)), _owned())
    absent = sample(gpu_device(GPU0, 0), values={} if missing is None else {ENERGY.key: missing})
    assert _rows(ledger.update(_snap(2, absent), _owned()))[(GPU0, A)] == 0
    assert _rows(ledger.update(_snap(3, _gpu(1900)), _owned()))[(GPU0, A)] == 900


def test_a_counter_that_goes_back_counts_as_restarted_and_nothing_goes_back(caplog):
    caplog.set_level(logging.INFO, "otel_gpu.attribute.k8s.energy")
    ledger = EnergyLedger()
    ledger.update(_snap(1, _gpu(5000)), _owned())
    before = _rows(ledger.update(_snap(2, _gpu(7000)), _owned()))
    after = _rows(ledger.update(_snap(3, _gpu(300)), _owned()))  # driver reloaded
    _never_back(before, after)
    assert after == {(GPU0, A): 2300, (GPU0, None): 5000}
    assert _rows(ledger.update(_snap(4, _gpu(400)), _owned()))[(GPU0, A)] == 2400
    (line,) = [r for r in caplog.records if r.name == "otel_gpu.attribute.k8s.energy"]
    assert "went back from 7000 to 300" in line.getMessage()


# --- pods coming and going --------------------------------------------------------------


def test_a_pod_that_ends_keeps_its_total_returns_to_it_and_is_released_later():
    ledger = EnergyLedger(retain=100.0)
    ledger.update(_snap(1, _gpu(0), monotonic=0.0), _owned())
    ledger.update(_snap(2, _gpu(500), monotonic=10.0), _owned())
    gone = _rows(ledger.update(_snap(3, _gpu(800), monotonic=20.0), NOBODY))
    assert gone == {(GPU0, A): 500, (GPU0, None): 300}  # final total kept, the rest idle
    back = _rows(ledger.update(_snap(4, _gpu(1000), monotonic=30.0), _owned()))
    assert back == {(GPU0, A): 700, (GPU0, None): 300}  # continues, never below
    ledger.update(_snap(5, _gpu(1100), monotonic=40.0), NOBODY)
    kept = _rows(ledger.update(_snap(6, _gpu(1200), monotonic=139.0), NOBODY))
    assert kept[(GPU0, A)] == 700
    released = _rows(ledger.update(_snap(7, _gpu(1300), monotonic=140.0), NOBODY))
    # released after `retain`: its total moves into the unattributed row, the sum holds
    assert released == {(GPU0, None): 1300}


def test_finished_rows_are_bounded_and_the_sum_still_holds():
    ledger = EnergyLedger(max_gone=5)
    reading = 0
    for seq in range(1, 40):
        reading += 1000
        ref = PodRef(f"job-{seq}", "batch", "main")
        rows = ledger.update(_snap(seq, _gpu(reading)), _owned(GPU0, ref))
        assert len(rows) <= 1 + 1 + 5  # the live pod, the unattributed row, 5 finished
        assert sum(r.millijoules for r in rows) == reading


def test_a_mig_instance_destroyed_is_released_into_its_gpus_row():
    ledger = EnergyLedger(retain=5.0)
    held = _owned(MIG_A, A)
    ledger.update(_snap(1, *_mig(1000, (None, None)), monotonic=0.0), held)
    ledger.update(_snap(2, *_mig(1400, (None, None)), monotonic=1.0), held)
    parent, big, _ = _mig(1800, (None, None))
    rows = _rows(ledger.update(_snap(3, parent, big, monotonic=2.0), held))
    assert rows[(MIG_B, None)] == 100 and sum(rows.values()) == 1800  # kept for now
    rows = _rows(ledger.update(_snap(4, parent, big, monotonic=10.0), held))
    assert (MIG_B, None) not in rows and sum(rows.values()) == 1800


# --- once per sample -------------------------------------------------------------------


def test_a_republication_of_the_same_sample_counts_nothing_again():
    ledger = EnergyLedger()
    ledger.update(_snap(1, _gpu(1000)), _owned())
    once = ledger.update(_snap(2, _gpu(2000)), _owned())
    again = ledger.update(_snap(2, _gpu(2000)), _owned(GPU0, B))  # only the pods changed
    # nothing counted twice; the new holder's counter exists at 0 from now on
    assert _rows(again) == {**_rows(once), (GPU0, B): 0}
    assert ledger.update(_snap(2, _gpu(2000)), _owned(GPU0, B)) == again
    assert _rows(ledger.update(_snap(3, _gpu(2500)), _owned(GPU0, B))) == {
        (GPU0, A): 1000, (GPU0, B): 500, (GPU0, None): 1000}


def test_pods_seen_between_two_samples_get_their_row_and_rule_at_once():
    """The kubelet answers after the first sample: the holder's counter exists at 0 and
    the rule in force is said now, not an interval later; nothing is counted twice."""
    ledger = EnergyLedger()
    first = ledger.update(_snap(1, _gpu(5000)), NOBODY)
    assert _rows(first) == {(GPU0, None): 5000} and _rules(first) == {GPU0: energy.UNATTRIBUTED}
    again = ledger.update(_snap(1, _gpu(5000)), _owned())
    assert _rows(again) == {(GPU0, None): 5000, (GPU0, A): 0}
    assert _rules(again) == {GPU0: energy.EXCLUSIVE}
    later = ledger.update(_snap(2, _gpu(5400)), _owned())
    assert _rows(later) == {(GPU0, None): 5000, (GPU0, A): 400}


def test_the_attribution_stage_attaches_energy_once_per_sample(tmp_path):
    held = PodResourcesState((Allocation(PodRef("train-a", "ml", "main"), "nvidia.com/gpu", GPU0),),
                             None, 1.0, "v1")
    watcher = FakePodSource(state=held)
    enrich = PodEnricher(watcher, tmp_path)
    enrich.process(_snap(1, _gpu(4000)))
    sample_two = _snap(2, _gpu(4500))
    first = enrich.process(sample_two).pods.energy
    watcher.state = PodResourcesState(held.allocations, None, 2.0, "v1")  # a new answer
    assert enrich.process(sample_two).pods.energy == first  # Pipeline.pods_changed re-publishes
    assert _rows(first) == {(GPU0, A): 500, (GPU0, None): 4000}


def test_the_catalog_publishes_joules_per_container_and_the_rule_per_device():
    ledger = EnergyLedger()
    ledger.update(_snap(1, _gpu(1000)), _owned())
    rows = ledger.update(_snap(2, _gpu(3500)), _owned())
    snap = replace(_snap(2, _gpu(3500)), pods=Pods(_owned(), energy=rows))
    by_name = {m.name: m for m in CATALOG}
    points = list(by_name["nvidia.gpu.k8s.energy"].per_node(snap, 0.0))
    assert sorted((v, tuple(sorted(a.items()))) for v, a in points) == [
        (1.0, (("hw.id", GPU0), ("nvidia.gpu.process.owner", "unattributed"))),
        (2.5, (("hw.id", GPU0), ("k8s.container.name", "main"),
               ("k8s.namespace.name", "ml"), ("k8s.pod.name", "train-a"))),
    ]
    rules = list(by_name["nvidia.gpu.k8s.energy.rule"].per_node(snap, 0.0))
    assert rules == [(1.0, {"hw.id": GPU0, "nvidia.gpu.energy.rule": "exclusive"})]
