"""A catalog row's points, generated over changing nodes, equal what the row says.

The instruments work out once per device layout where each point of a row comes
from and which attributes it carries, and read only the values per collection.
These tests hold that to the row read afresh (``device_observations`` and the
device's attributes, built here from their parts) on sequences of snapshots in
which devices come, go, fail, recover, change holders and lose values.
"""

from __future__ import annotations

import tracemalloc
from operator import is_
from types import MappingProxyType

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.instrument.attributes import (
    device_attributes,
    identity_attributes,
    kubelet_numa_node,
)
from otel_gpu.instrument.catalog import CATALOG, all_sources
from otel_gpu.instrument.instruments import Instruments
from otel_gpu.instrument.schema import Kind, Metric, device_observations
from otel_gpu.snapshot import FAILED, OK, Attribution, DeviceSample, Pods, Snapshot
from otel_gpu.workload import Holder, PodRef
from tests.support.providers import NoMeter
from tests.support.snapshots import ReadCounted, gpu_device, mig_device, snapshot

PARENT = gpu_device("GPU-0000", 0)
DEVICES = (PARENT, gpu_device("GPU-1111", 1), gpu_device("GPU-2222", 2),
           mig_device("MIG-3333", PARENT, 7))
HOLDERS = (Holder(PodRef("a", "ns", "c"), None, "nvidia.com/gpu"),
           Holder(PodRef("b", "ns", "c"), None, "nvidia.com/gpu"))
SOURCES = sorted({source.key for source in all_sources(CATALOG)})
ROWS = [m for m in CATALOG if m.per_node is None]
"""Every row read device by device: rows of points, and those with a function of their own."""


@st.composite
def _node(draw) -> dict:
    """Which devices, in which order, failed or not, held by whom, with which values."""
    devices = draw(st.lists(st.sampled_from(DEVICES), unique=True, max_size=len(DEVICES)))
    return {device: {"failed": draw(st.integers(0, 3)) == 0,
                     "holders": tuple(draw(st.lists(st.sampled_from(HOLDERS), unique=True,
                                                    max_size=2))),
                     "values": _values(draw)}
            for device in devices}


def _values(draw) -> dict[str, float]:
    keys = draw(st.lists(st.sampled_from(SOURCES), unique=True, max_size=12))
    return {key: float(draw(st.integers(0, 1000))) for key in keys}


@st.composite
def _nodes(draw) -> list[dict]:
    """A node, then one change at a time: most layouts repeat, as on a real node."""
    node = draw(_node())
    out = [node]
    for _ in range(draw(st.integers(0, 7))):
        node = {d: dict(c) for d, c in node.items()}
        change = draw(st.sampled_from(("fail", "hold", "values", "device", "nothing")))
        if change == "device" or not node:
            node = draw(_node())
        elif change != "nothing":
            device = draw(st.sampled_from(sorted(node, key=lambda d: d.uuid)))
            if change == "fail":
                node[device]["failed"] = not node[device]["failed"]
            elif change == "hold":
                node[device]["holders"] = tuple(draw(st.lists(
                    st.sampled_from(HOLDERS), unique=True, max_size=2)))
            else:
                node[device]["values"] = _values(draw)
        out.append(node)
    return out


def _snapshot(node: dict, seq: int) -> Snapshot:
    samples = [DeviceSample(device, FAILED if c["failed"] else OK,
                            MappingProxyType(c["values"]),
                            error="GPU is lost" if c["failed"] else None)
               for device, c in node.items()]
    held = {device.uuid: c["holders"] for device, c in node.items() if c["holders"]}
    return snapshot(*samples, seq=seq, pods=Pods(Attribution(held)) if held else None)


def _expected(metric: Metric, snap: Snapshot, everything: bool) -> list[tuple[float, dict]]:
    out = []
    for sample in snap.devices:
        info = device_attributes(sample.device, snap.driver_version,
                                 kubelet_numa_node(snap, sample.device))
        base = dict(info) if everything else identity_attributes(info)
        base.update(snap.workload_attributes(sample.device.uuid))
        for value, attrs in device_observations(metric, sample):
            out.append((value, {**(info if metric.describes_device else base), **attrs}))
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=_nodes(), everything=st.booleans())
def test_each_rows_points_are_the_rows_reading_of_each_snapshot(nodes, everything):
    state: dict[str, Snapshot | None] = {"snap": None}
    instruments = Instruments(NoMeter(), lambda: state["snap"],
                              device_attributes="all" if everything else "identity")
    for seq, node in enumerate(nodes, start=1):
        state["snap"] = snap = _snapshot(node, seq)
        for metric in ROWS:
            got = [(value, dict(attrs)) for value, attrs in instruments.pairs(metric)]
            assert got == _expected(metric, snap, everything), metric.name


def test_a_device_that_fails_and_recovers_keeps_its_rows_in_step():
    """The same devices and holders throughout: only the failed state changes the layout."""
    values = MappingProxyType({"temp.gpu": 50.0, "power": 200_000.0})
    state: dict[str, Snapshot | None] = {"snap": None}
    instruments = Instruments(NoMeter(), lambda: state["snap"])
    temperature = next(m for m in CATALOG if m.name == "hw.temperature")
    seen = []
    for seq, failed in enumerate((False, True, False), start=1):
        samples = [DeviceSample(DEVICES[0], OK, values),
                   DeviceSample(DEVICES[1], FAILED if failed else OK, values,
                                error="GPU is lost" if failed else None)]
        state["snap"] = snapshot(*samples, seq=seq)
        seen.append(sorted(a["hw.id"] for _, a in instruments.pairs(temperature)))
    assert seen == [["GPU-0000", "GPU-1111"], ["GPU-0000"], ["GPU-0000", "GPU-1111"]]


def test_a_point_without_a_value_costs_its_plan_no_attributes():
    """A MIG instance has a value for few of the catalog's points: merging the attributes of
    every point it might have (a dict of the device's attributes each) would cost megabytes
    on a node of MIG instances."""
    devices = [mig_device(f"MIG-{i:04d}", PARENT, i) for i in range(64)]
    state = {"snap": snapshot(*(DeviceSample(d, OK, MappingProxyType({})) for d in devices))}
    instruments = Instruments(NoMeter(), lambda: state["snap"])
    rows = [m for m in ROWS if m.per_device is None]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(instruments.pairs(metric) == [] for metric in rows)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1 << 20, f"{held / 2**20:.1f} MiB planned for {len(devices)} devices"


def _pods_snapshot(count: int, seq: int = 1) -> Snapshot:
    holders = tuple(Holder(PodRef(f"pod-{i}", "bench", "srv"), i, "nvidia.com/gpu", True)
                    for i in range(count))
    return snapshot(DeviceSample(DEVICES[1], OK, MappingProxyType({})), seq=seq,
                    pods=Pods(Attribution({DEVICES[1].uuid: holders})))


def test_a_node_row_handed_its_last_sets_again_reads_none_of_their_contents():
    """A key of every pair was built for each set of every collection (a tenth of a
    collection's CPU at 500 pods); a producer handing the same objects again (the GPU time
    rows, the allocations while the kubelet's answer stays) now has them taken as they are."""
    sets = [ReadCounted({"k8s.pod.name": f"p{i}", "hw.id": "GPU-1111"}) for i in range(50)]
    row = Metric("test.node.row", Kind.GAUGE, "1", "stable sets",
                 per_node=lambda snap, now: [(1.0, s) for s in sets])
    state = {"snap": snapshot(seq=1)}
    instruments = Instruments(NoMeter(), lambda: state["snap"], catalog=(row,))
    first = instruments.pairs(row)
    ReadCounted.reads = 0
    state["snap"] = snapshot(seq=2)
    again = instruments.pairs(row)
    assert ReadCounted.reads == 0
    assert [a for _, a in again] == [a for _, a in first] and all(map(is_, [a for _, a in again],
                                                                      [a for _, a in first]))
    sets[3] = ReadCounted({"k8s.pod.name": "p3", "hw.id": "GPU-1111"})  # a new object, same
    third = instruments.pairs(row)
    assert third[3][1] is first[3][1]  # equal to the set before it at its place


def test_the_allocation_rows_are_the_same_sets_while_the_kubelets_answer_stays():
    allocation = next(m for m in CATALOG if m.name == "nvidia.gpu.k8s.allocation")
    state = {"snap": _pods_snapshot(20)}
    instruments = Instruments(NoMeter(), lambda: state["snap"])
    first = [a for _, a in instruments.pairs(allocation)]
    pods = state["snap"].pods
    state["snap"] = snapshot(DeviceSample(DEVICES[1], OK, MappingProxyType({})), seq=2,
                             pods=pods)
    assert all(map(is_, [a for _, a in instruments.pairs(allocation)], first))
    assert allocation.per_node is not None
    made = [a for _, a in allocation.per_node(state["snap"], 0.0)]
    assert all(map(is_, made, first)), "the producer made its sets anew"


def test_a_pods_node_level_sets_hold_no_pair_per_attribute():
    """Each node-level set was kept under a key of its (name, value) pairs beside a copy of
    itself: 764 bytes a series at 500 pods (the set, its replica string and its pair
    with the value: 408)."""
    allocation = next(m for m in CATALOG if m.name == "nvidia.gpu.k8s.allocation")
    state = {"snap": _pods_snapshot(500)}
    instruments = Instruments(NoMeter(), lambda: state["snap"])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        pairs = instruments.pairs(allocation)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    per_series = held / len(pairs)
    assert len(pairs) == 500 and per_series < 500, f"{per_series:.0f} bytes a series"
