"""Device -> pod attribution for every sharing and naming scheme."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s.attribution import (
    NO_SUCH_DEVICE,
    UNKNOWN_FORMAT,
    Attributor,
    ResourceSummary,
    UnresolvedId,
    attribute,
    parse_cpulist,
    pci_bus_id_to_sysfs,
)
from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.attribute.k8s.kubelet_answer import (
    AllocatableDevice,
    PodResourcesState,
    allocatable_from_v1,
    allocations_from_v1,
)
from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
from otel_gpu.workload import AllocationRow, Holder, PodRef
from testkit.kubelet import (
    FakeKubelet,
    claim,
    claim_device,
    container,
    devices,
    pod,
)
from testkit.process import wait_until
from tests.support.snapshots import GPU0, GPU1, GPU2, MIG_A, MIG_B, MIG_C, gpu_device

GPU = "nvidia.com/gpu"


def state_of(
    *pods: v1_pb2.PodResources, allocatable: list[v1_pb2.ContainerDevices] | None = None
) -> PodResourcesState:
    """The state a watcher would publish for this List (and allocatable) reply."""
    accept = ResourceFilter()
    msg = v1_pb2.ListPodResourcesResponse(pod_resources=list(pods))
    msg = v1_pb2.ListPodResourcesResponse.FromString(msg.SerializeToString())
    alloc = None
    if allocatable is not None:
        reply = v1_pb2.AllocatableResourcesResponse(devices=allocatable)
        alloc = allocatable_from_v1(reply, accept)
    return PodResourcesState(allocations_from_v1(msg, accept), alloc, 1.0, "v1")


def h(pod: str, container: str = "main", replica: int | None = None, resource: str = GPU,
      namespace: str = "default", shared: bool = False) -> Holder:  # fmt: skip
    return Holder(PodRef(pod, namespace, container), replica, resource, shared)


# --------------------------------------------------------------------------- scenarios


def test_exclusive_gpus(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices(GPU, GPU0))),
        pod("b", container("main", devices(GPU, GPU2)), namespace="ml"),
        pod("idle", container("main")),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) == h("a")
    assert att.exclusive_owner(GPU2) == h("b", namespace="ml")
    assert att.exclusive_owner(GPU1) is None
    assert att.holders(GPU1) == ()
    assert set(att.allocations()) == {
        AllocationRow(GPU0, PodRef("a", "default", "main"), None, GPU),
        AllocationRow(GPU2, PodRef("b", "ml", "main"), None, GPU),
    }
    assert att.unresolved == ()


def test_mig_mixed_strategy(node_devices) -> None:
    st = state_of(
        pod("small", container("main", devices("nvidia.com/mig-1g.5gb", MIG_A))),
        pod("small2", container("main", devices("nvidia.com/mig-1g.5gb", MIG_B))),
        pod("big", container("main", devices("nvidia.com/mig-3g.20gb", MIG_C))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(MIG_A) == h("small", resource="nvidia.com/mig-1g.5gb")
    assert att.exclusive_owner(MIG_B) == h("small2", resource="nvidia.com/mig-1g.5gb")
    assert att.exclusive_owner(MIG_C) == h("big", resource="nvidia.com/mig-3g.20gb")
    # The parent GPU is not owned by anyone: only its instances are.
    assert att.exclusive_owner(GPU1) is None
    assert att.holders(GPU1) == ()
    assert {r.uuid for r in att.allocations()} == {MIG_A, MIG_B, MIG_C}


def test_mig_single_strategy_and_time_sliced_mig(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices(GPU, MIG_A))),
        pod("b", container("main", devices("nvidia.com/mig-3g.20gb", f"{MIG_C}::0"))),
        pod("c", container("main", devices("nvidia.com/mig-3g.20gb", f"{MIG_C}::1"))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(MIG_A) == h("a")
    assert att.exclusive_owner(MIG_C) is None
    assert [(r.pod, r.replica) for r in att.allocations() if r.uuid == MIG_C] == [
        ("b", 0),
        ("c", 1),
    ]


def test_time_slicing_three_pods_one_gpu(node_devices) -> None:
    st = state_of(
        *(pod(f"p{i}", container("main", devices(GPU, f"{GPU0}::{i}"))) for i in range(3)),
        allocatable=[devices(GPU, *(f"{GPU0}::{i}" for i in range(4)))],
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) is None
    assert att.holders(GPU0) == tuple(h(f"p{i}", replica=i, shared=True) for i in range(3))
    assert att.allocations() == tuple(
        AllocationRow(GPU0, PodRef(f"p{i}", "default", "main"), i, GPU) for i in range(3)
    )
    assert att.summary() == (ResourceSummary(GPU, 3, 4),)


def test_one_replica_holder_is_still_not_an_owner(node_devices) -> None:
    att = attribute(node_devices, state_of(pod("a", container("main", devices(GPU, f"{GPU0}::0")))))
    assert att.exclusive_owner(GPU0) is None
    assert len(att.allocations()) == 1


def test_shared_gpu_resource_and_two_replicas_in_one_container(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices("nvidia.com/gpu.shared", f"{GPU2}::0", f"{GPU2}::5")))
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU2) is None
    assert [r.replica for r in att.allocations()] == [0, 5]


def test_two_containers_one_whole_gpu_id_has_no_owner(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices(GPU, GPU0))),
        pod("b", container("main", devices(GPU, GPU0))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) is None
    assert len(att.holders(GPU0)) == 2


def test_gke_ids_resolved_by_minor_number(node_devices) -> None:
    # sample node: GPU0 index 0 minor 2, GPU1 index 1 minor 0 (MIG), GPU2 index 2 minor 1.
    st = state_of(
        pod("whole", container("main", devices(GPU, "nvidia2"))),
        pod("mig", container("main", devices(GPU, "nvidia0/gi1"))),
        pod("s0", container("main", devices(GPU, "nvidia1/vgpu0"))),
        pod("s1", container("main", devices(GPU, "nvidia1/vgpu1"))),
        pod("migshare", container("main", devices(GPU, "nvidia0/gi3/vgpu0"))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) == h("whole")  # nvidia2: minor 2 is GPU0 (index 0)
    assert att.exclusive_owner(MIG_A) == h("mig")
    assert att.exclusive_owner(GPU1) is None
    assert att.exclusive_owner(GPU2) is None
    assert att.holders(GPU2) == (h("s0", replica=0, shared=True), h("s1", replica=1, shared=True))
    assert att.exclusive_owner(MIG_C) is None
    assert att.holders(MIG_C) == (h("migshare", replica=0, shared=True),)


def test_gke_minor_is_not_the_index() -> None:
    devices_ = [gpu_device(GPU0, 0, minor=1), gpu_device(GPU1, 1, minor=0)]
    att = attribute(devices_, state_of(pod("a", container("main", devices(GPU, "nvidia0")))))
    assert att.exclusive_owner(GPU1) == h("a")
    assert att.exclusive_owner(GPU0) is None


def test_old_driver_mig_ids(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices("nvidia.com/mig-1g.5gb", f"MIG-{GPU1}/1/0"))),
        pod("b", container("main", devices("nvidia.com/mig-3g.20gb", f"MIG-{GPU1}/3/0"))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(MIG_A) == h("a", resource="nvidia.com/mig-1g.5gb")
    assert att.exclusive_owner(MIG_C) == h("b", resource="nvidia.com/mig-3g.20gb")
    assert att.exclusive_owner(GPU1) is None


def test_dra_claims(node_devices) -> None:
    shared_claim = claim("shared", claim_device("gpu-1"), namespace="ml")
    st = state_of(
        pod("solo", container("main", claims=[claim("c1", claim_device("gpu-2"))])),
        pod("x", container("a", claims=[shared_claim]), container("b", claims=[shared_claim]),
            namespace="ml"),
        pod("mig", container("main", claims=[claim("c3", claim_device("gpu-0-mig-3g20gb-9-0"))])),
        pod("cap", container("main", claims=[claim("c4", claim_device("gpu-0-mig-1g5gb-19-0"))])),
    )  # fmt: skip
    att = attribute(node_devices, st)
    dra = "gpu.nvidia.com"
    assert att.exclusive_owner(GPU0) == h("solo", resource=dra)  # gpu-2: minor 2
    assert att.exclusive_owner(GPU2) is None  # one claim, two containers
    assert att.holders(GPU2) == (
        h("x", "a", resource=dra, namespace="ml"),
        h("x", "b", resource=dra, namespace="ml"),
    )
    assert att.exclusive_owner(MIG_C) == h("mig", resource=dra)
    # Two 1g.5gb instances on that GPU: the name does not say which one.
    assert att.unresolved == (UnresolvedId(dra, "gpu-0-mig-1g5gb-19-0", NO_SUCH_DEVICE),)
    assert ResourceSummary(dra, 4, None) in att.summary()


def test_dra_share_id_is_shared(node_devices) -> None:
    st = state_of(
        pod("a", container("main", claims=[claim("c", claim_device("gpu-2", share_id="u1"))]))
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) is None
    assert att.holders(GPU0)[0].shared


def test_unknown_and_unresolvable_ids_are_skipped(node_devices) -> None:
    missing = "GPU-00000000-0000-0000-0000-000000000000"
    st = state_of(
        pod("a", container("main", devices(GPU, "weird-id", missing, GPU0, "nvidia9", "weird-id"))),
        pod("b", container("main", devices("nvidia.com/mig-1g.5gb", "MIG-garbage"))),
    )
    att = attribute(node_devices, st)
    assert att.exclusive_owner(GPU0) == h("a")
    assert set(att.unresolved) == {
        UnresolvedId(GPU, "weird-id", UNKNOWN_FORMAT),
        UnresolvedId(GPU, missing, NO_SUCH_DEVICE),
        UnresolvedId(GPU, "nvidia9", NO_SUCH_DEVICE),
        UnresolvedId("nvidia.com/mig-1g.5gb", "MIG-garbage", UNKNOWN_FORMAT),
    }
    assert len(att.allocations()) == 1


def test_summary_allocated_vs_allocatable(node_devices) -> None:
    st = state_of(
        pod("a", container("main", devices(GPU, GPU0))),
        pod("b", container("main", devices("nvidia.com/mig-1g.5gb", MIG_A))),
        allocatable=[
            devices(GPU, GPU0, GPU2, numa=0),
            devices(GPU, GPU2, numa=1),
            devices("nvidia.com/mig-1g.5gb", MIG_A, MIG_B),
            devices("nvidia.com/mig-3g.20gb", MIG_C),
        ],
    )
    assert attribute(node_devices, st).summary() == (
        ResourceSummary(GPU, 1, 2),
        ResourceSummary("nvidia.com/mig-1g.5gb", 1, 2),
        ResourceSummary("nvidia.com/mig-3g.20gb", 0, 1),
    )
    unknown = PodResourcesState(st.allocations, None, 1.0, "v1alpha1")
    assert attribute(node_devices, unknown).summary() == (
        ResourceSummary(GPU, 1, None),
        ResourceSummary("nvidia.com/mig-1g.5gb", 1, None),
    )


def test_empty_state(node_devices) -> None:
    att = attribute(node_devices, PodResourcesState())
    assert att.allocations() == () and att.summary() == () and att.unresolved == ()
    assert all(att.exclusive_owner(d.uuid) is None for d in node_devices)


# --------------------------------------------------------------------------- NUMA


def test_pci_bus_id_to_sysfs() -> None:
    assert pci_bus_id_to_sysfs("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_bus_id_to_sysfs("00000001:AF:1F.7") == "0001:af:1f.7"
    assert pci_bus_id_to_sysfs("0000:3b:00.0") == "0000:3b:00.0"
    assert pci_bus_id_to_sysfs("3b:00.0") == "0000:3b:00.0"
    assert pci_bus_id_to_sysfs("garbage") is None
    assert pci_bus_id_to_sysfs("zz:yy:xx.w") is None


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpulist("") == frozenset()
    assert parse_cpulist("0-27,56-83") == frozenset([*range(28), *range(56, 84)])
    assert parse_cpulist("3-1") is None
    assert parse_cpulist("a-b") is None


def fake_sysfs(root: Path, pci: dict[str, str], nodes: dict[int, str]) -> Path:
    for bdf, node in pci.items():
        d = root / "sys" / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    for n, cpulist in nodes.items():
        d = root / "sys" / "devices" / "system" / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    return root


def test_numa_sources_in_order(tmp_path) -> None:
    g_api = gpu_device(GPU0, 0, numa_node=0)  # API says 1: API wins
    g_nvml = gpu_device(GPU1, 1, numa_node=1)  # sysfs says 0: NVML wins
    g_sysfs = gpu_device(GPU2, 2)  # only sysfs knows
    g_none = gpu_device("GPU-11111111-2222-3333-4444-555555555555", 3)  # sysfs: -1
    root = fake_sysfs(
        tmp_path,
        {"0000:3c:00.0": "0", "0000:3d:00.0": "1", "0000:3e:00.0": "-1"},
        {0: "0-3", 1: "4-7"},
    )
    st = state_of(
        pod("a", container("main", devices(GPU, GPU0, numa=1))),
        allocatable=[devices(GPU, GPU0, GPU1, GPU2)],
    )
    att = attribute([g_api, g_nvml, g_sysfs, g_none], st, root)
    assert att.numa_node(GPU0) == 1
    assert att.numa_node(GPU1) == 1
    assert att.numa_node(GPU2) == 1
    assert att.numa_node(g_none.uuid) is None
    assert att.numa_nodes(g_none.uuid) == ()


def test_numa_from_allocatable_topology(tmp_path) -> None:
    g = gpu_device(GPU0, 0)
    st = state_of(allocatable=[devices(GPU, GPU0, numa=0)])  # node 0: an empty message
    assert attribute([g], st, tmp_path).numa_node(GPU0) == 0


def test_numa_alignment(tmp_path, node_devices) -> None:
    # GPU0 at 0000:3b:00.0 on node 0, GPU2 at 0000:3d:00.0 on node 1, GPU1 (MIG) on node 1.
    root = fake_sysfs(
        tmp_path,
        {"0000:3b:00.0": "0", "0000:3c:00.0": "1", "0000:3d:00.0": "1"},
        {0: "0-3,8-11", 1: "4-7,12-15"},
    )
    st = state_of(
        pod("aligned", container("main", devices(GPU, GPU0), cpu_ids=[0, 1, 8, 9])),
        pod("half", container("main", devices(GPU, GPU2), cpu_ids=[2, 3, 4, 5])),
        pod("mig", container("main", devices("nvidia.com/mig-1g.5gb", MIG_A), cpu_ids=[0])),
        pod("shared-cpus", container("main", devices(GPU, f"{GPU0}::1"))),  # no exclusive CPUs
    )
    att = attribute(node_devices, st, root)
    rows = {(a.pod, a.uuid): (a.numa_nodes, a.fraction) for a in att.numa_alignment()}
    assert rows == {
        ("aligned", GPU0): ((0,), 1.0),
        ("half", GPU2): ((1,), 0.5),
        ("mig", MIG_A): ((1,), 0.0),  # a MIG instance sits on its parent's node
    }


def test_numa_alignment_skipped_without_sysfs(tmp_path, node_devices) -> None:
    st = state_of(pod("a", container("main", devices(GPU, GPU0), cpu_ids=[0, 1])))
    assert attribute(node_devices, st, tmp_path).numa_alignment() == ()


def _within(seconds: float, call, *, unblock: Path):
    """``call()`` on a daemon thread, failing after ``seconds``; a reader still blocked on the
    FIFO ``unblock`` is then let go (a writer opens and closes it), so a failure never hangs."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(unblock, os.O_RDWR | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"still reading {unblock} after {seconds} s")
    return done[0]


@pytest.mark.parametrize("where", ["cpulist", "numa_node"])
def test_a_fifo_in_sysfs_is_named_once_and_never_blocks(tmp_path, node_devices, caplog,
                                                       where) -> None:
    """A FIFO where an attribute should be (nobody ever writes to it) costs what that file
    says, once named, and never the attribution: a plain open() would block for ever."""
    root = fake_sysfs(tmp_path, {"0000:3b:00.0": "0"}, {0: "0-3"})
    fifo = (root / "sys" / "devices" / "system" / "node" / "node0" / "cpulist"
            if where == "cpulist" else root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
            / "numa_node")
    fifo.unlink()
    os.mkfifo(fifo)
    st = state_of(pod("a", container("main", devices(GPU, GPU0), cpu_ids=[0, 1])))
    for _ in range(3):  # one line, however often the kubelet answers
        att = _within(5.0, lambda: attribute(node_devices, st, root), unblock=fifo)
        assert att.exclusive_owner(GPU0) == h("a")
        assert att.numa_alignment() == ()
    named = [r for r in caplog.records if str(fifo) in r.getMessage()]
    assert len(named) == 1, caplog.text
    assert named[0].levelname == "WARNING"
    assert "not a regular file (a FIFO)" in named[0].getMessage()


# --------------------------------------------------------------------------- end to end


def test_watcher_to_attribution_end_to_end(kubelet: FakeKubelet, node_devices) -> None:
    kubelet.set_pods(
        [
            pod("train", container("main", devices(GPU, GPU0, numa=0))),
            *(pod(f"ts{i}", container("main", devices(GPU, f"{GPU2}::{i}"))) for i in range(3)),
            pod("mig", container("main", devices("nvidia.com/mig-1g.5gb", MIG_B))),
        ]
    )
    kubelet.set_allocatable([devices(GPU, GPU0, *(f"{GPU2}::{i}" for i in range(4)), numa=0)])
    w = PodResourcesWatcher(kubelet.socket_path, interval=0.05)
    attributor = Attributor(node_devices)
    w.start()
    try:
        assert wait_until(lambda: w.state.pod_count == 5)
        state = w.state
        att = attributor(state)
        assert attributor(state) is att  # cached per published state
        assert att.exclusive_owner(GPU0) == h("train")
        assert att.exclusive_owner(MIG_B) == h("mig", resource="nvidia.com/mig-1g.5gb")
        assert att.exclusive_owner(GPU2) is None
        assert len([r for r in att.allocations() if r.uuid == GPU2]) == 3
        assert ResourceSummary(GPU, 4, 5) in att.summary()

        kubelet.set_pods([pod("train", container("main", devices(GPU, GPU0)))])
        assert wait_until(lambda: w.state.pod_count == 1)
        assert attributor(w.state).exclusive_owner(GPU2) is None
        assert attributor(w.state).allocations() == (
            AllocationRow(GPU0, PodRef("train", "default", "main"), None, GPU),
        )
    finally:
        w.stop()


def test_attribution_is_immutable(node_devices) -> None:
    att = attribute(node_devices, state_of(pod("a", container("main", devices(GPU, GPU0)))))
    with pytest.raises(TypeError):
        att._holders[GPU0] = ()  # type: ignore[index]
    assert isinstance(att.allocations(), tuple)
    assert AllocatableDevice(GPU, GPU0, ()) == (GPU, GPU0, ())


def test_dra_claims_on_seven_identical_mig_instances() -> None:
    """Seven 1g.10gb instances on one H100, each claimed through DRA by its own pod:
    the names differ only in placement, which discovery records for each instance."""
    from dataclasses import replace

    from tests.support.snapshots import mig_device

    gpu = gpu_device(GPU0, 0, model="NVIDIA H100 80GB HBM3")
    migs = [
        replace(mig_device(f"MIG-00000000-0000-0000-0000-{i:012d}", gpu, gi=7 + i,
                           profile="1g.10gb"),
                gpu_instance_profile_id=19, placement_start=6 - i)
        for i in range(7)
    ]
    st = state_of(*(
        pod(f"p{m.placement_start}",
            container("main", claims=[claim("c", claim_device(
                f"gpu-0-mig-1g10gb-19-{m.placement_start}"))]))
        for m in migs
    ))
    att = attribute([gpu, *migs], st)
    dra = "gpu.nvidia.com"
    assert att.unresolved == ()
    for m in migs:
        assert att.exclusive_owner(m.uuid) == h(f"p{m.placement_start}", resource=dra)
    assert att.exclusive_owner(GPU0) is None
