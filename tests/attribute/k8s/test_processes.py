"""GPU processes to containers: cgroup lines, kubelet log names, the mapper, the join."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from otel_gpu.attribute.k8s import processes
from otel_gpu.attribute.k8s.enrich import PodEnricher
from otel_gpu.attribute.k8s.kubelet_answer import Allocation
from otel_gpu.attribute.k8s.processes import (
    CGROUP_MAX_BYTES,
    CgroupRef,
    ProcessMapper,
    join_usage,
    parse_cgroup,
    parse_container_log,
    parse_pod_dir,
)
from otel_gpu.sim.node import write_node
from otel_gpu.sim.scenario import ContainerSpec, NodeSpec, PodSpec
from otel_gpu.snapshot import Attribution, ProcessUsage
from otel_gpu.workload import Holder, PodRef
from testkit.kubelet import FakePodSource
from tests.support.clock import FakeClock
from tests.support.mappers import CountingMapper
from tests.support.snapshots import GPU0, GPU1, MIG_A, gpu_device, mig_device, sample, snapshot

UID = "6b1e1f0e-4d1c-4b7e-9d9a-2f8f1d2c3b4a"
UID_ = UID.replace("-", "_")
STATIC_UID = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
CID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
CID2 = "a" * 64


# --- /proc/<pid>/cgroup ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    # cgroup v2, systemd driver, containerd, burstable: the UID's dashes are underscores
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n", CgroupRef(UID, CID)),
    # guaranteed pods sit right under kubepods.slice
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     CgroupRef(UID, CID)),
    # CRI-O with systemd
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"crio-{CID}.scope\n", CgroupRef(UID, CID)),
    # cgroupfs driver: directories, the UID with dashes, a bare id (containerd) ...
    (f"0::/kubepods/burstable/pod{UID}/{CID}\n", CgroupRef(UID, CID)),
    # ... or crio-<id>
    (f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n", CgroupRef(UID, CID)),
    # Docker (dockershim, cri-dockerd) with systemd
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"docker-{CID}.scope\n", CgroupRef(UID, CID)),
    # a kind / nested kubelet node
    (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     CgroupRef(UID, CID)),
    # a static pod's UID is its config hash: 32 hex digits
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
     f"cri-containerd-{CID}.scope\n", CgroupRef(STATIC_UID, CID)),
    # CRI-O's conmon runs in the pod but is no container
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"crio-conmon-{CID}.scope\n", CgroupRef(UID, None)),
    # a process in the pod's slice itself
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice\n",
     CgroupRef(UID, None)),
])
def test_cgroup_v2_lines(text, expected):
    assert parse_cgroup(text) == expected


def test_cgroup_v1_file_with_an_empty_unified_line():
    path = f"/kubepods/burstable/pod{UID}/{CID}"
    text = "\n".join([
        f"12:hugetlb:{path}", f"11:memory:{path}", f"10:cpu,cpuacct:{path}",
        f"9:pids:{path}", f"8:devices:{path}", f"4:net_cls,net_prio:{path}",
        f"1:name=systemd:{path}", "0::/",
    ]) + "\n"
    assert parse_cgroup(text) == CgroupRef(UID, CID)
    # the unified line first, as some kernels order them, changes nothing
    assert parse_cgroup("0::/\n" + text) == CgroupRef(UID, CID)


def test_cgroup_v1_systemd_docker():
    path = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"docker-{CID}.scope")
    text = f"11:memory:{path}\n5:cpu,cpuacct:{path}\n1:name=systemd:{path}\n"
    assert parse_cgroup(text) == CgroupRef(UID, CID)


@pytest.mark.parametrize("text", [
    "0::/system.slice/nvidia-persistenced.service\n",
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "0::/init.scope\n",
    f"0::/system.slice/docker-{CID}.scope\n",  # a plain Docker container, no pod
    "12:memory:/\n1:name=systemd:/init.scope\n0::/\n",
    "",
    "garbage\n::\n:::\n",
    f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n",  # a UID one digit short
])
def test_host_processes_and_oddities_are_in_no_pod(text):
    assert parse_cgroup(text) is None


# --- the kubelet's log directory names -------------------------------------------------------


def test_pod_dir_names():
    assert parse_pod_dir(f"ml_train-0_{UID}") == ("ml", "train-0", UID)
    assert parse_pod_dir(f"kube-system_etcd-node-1_{STATIC_UID}") == (
        "kube-system", "etcd-node-1", STATIC_UID)
    for bad in (f"ml_train_0_{UID}", f"ml_{UID}", f"ml_train-0_{UID_}", f".._x_{UID}",
                f"ML_train_{UID}", "ml_train-0_not-a-uid", ""):
        assert parse_pod_dir(bad) is None, bad


def test_container_log_names():
    assert parse_container_log(f"train-0_ml_main-{CID}.log") == ("train-0", "ml", "main", CID)
    assert parse_container_log(f"web.v2_prod_side-car-{CID}.log") == (
        "web.v2", "prod", "side-car", CID)
    for bad in (f"train-0_ml_main-{CID}", f"train-0_ml-{CID}.log",
                f"train-0_ml_main-{CID[:-1]}.log", f"a_b_c_d-{CID}.log",
                f"train-0_ml_../x-{CID}.log", "x.log"):
        assert parse_container_log(bad) is None, bad


# --- the mapper, on a node tree written by the simulator --------------------------------------


def _node(*pods: PodSpec, host_pids: tuple[int, ...] = ()) -> NodeSpec:
    return NodeSpec(pods=pods, host_pids=host_pids)


def _pod(name: str, uid: str, *containers: ContainerSpec, namespace: str = "ml",
         qos: str = "burstable") -> PodSpec:
    return PodSpec(namespace, name, uid, qos, containers)


TWO_PODS = _node(
    _pod("a", UID, ContainerSpec("main", CID, (101,))),
    _pod("b", "11111111-2222-3333-4444-555555555555",
         ContainerSpec("main", CID2, (102,), cgroup="v1", driver="cgroupfs", runtime="crio"),
         ContainerSpec("side", "b" * 64, (103,), runtime="docker"), qos="guaranteed"),
    host_pids=(900,),
)


@pytest.fixture
def tree(tmp_path):
    paths = write_node(TWO_PODS, tmp_path)
    return tmp_path, paths


def test_maps_each_pid_to_its_container(tree):
    _, paths = tree
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root)
    assert mapper.owners([101, 102, 103, 900, 4242]) == {
        101: PodRef("a", "ml", "main"),
        102: PodRef("b", "ml", "main"),
        103: PodRef("b", "ml", "side"),
        900: None,   # a host process
        4242: None,  # no /proc entry: exited, or in another PID namespace
    }


def test_without_container_links_a_single_container_pod_still_names_it(tree):
    root, paths = tree
    shutil.rmtree(root / "var" / "log" / "containers")
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root)
    owners = mapper.owners([101, 102, 103])
    assert owners[101] == PodRef("a", "ml", "main")
    # two containers and no link: the pod is known, its container is not
    assert owners[102] == owners[103] == PodRef("b", "ml", "")


def test_a_pod_without_a_log_directory_is_unattributed(tree, caplog):
    root, paths = tree
    shutil.rmtree(root / "var" / "log" / "pods")
    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        owners = ProcessMapper(paths.proc_root, paths.pod_log_root).owners([101, 900])
    assert owners == {101: None, 900: None}
    assert "mount the kubelet's /var/log/pods" in caplog.text


def test_a_process_that_exits_or_changes_between_samples(tree):
    root, paths = tree
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root)
    assert mapper.owners([101])[101] == PodRef("a", "ml", "main")
    shutil.rmtree(paths.proc_root / "101")  # exited
    assert mapper.owners([101]) == {101: None}
    # the PID is reused by a host process: nothing stale is kept
    (paths.proc_root / "101").mkdir()
    (paths.proc_root / "101" / "cgroup").write_text("0::/system.slice/cron.service\n")
    assert mapper.owners([101]) == {101: None}


def test_new_pods_are_found_at_most_once_per_refresh_interval(tmp_path):
    clock = FakeClock()
    paths = write_node(TWO_PODS, tmp_path)
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root, refresh_every=5.0, clock=clock)
    assert mapper.owners([101])[101] is not None
    new_uid = "99999999-8888-7777-6666-555555555555"
    write_node(_node(_pod("c", new_uid, ContainerSpec("main", "c" * 64, (104,)))), tmp_path)
    assert mapper.owners([104]) == {104: None}  # listed 0 s ago: not listed again yet
    clock.advance(5.0)
    assert mapper.owners([104]) == {104: PodRef("c", "ml", "main")}


def test_reads_are_bounded(tree):
    _, paths = tree
    big = paths.proc_root / "5000"
    big.mkdir()
    (big / "cgroup").write_text(f"0::/kubepods/burstable/pod{UID}/{CID}\n"
                                + "x" * CGROUP_MAX_BYTES)
    fifo = paths.proc_root / "5001"
    fifo.mkdir()
    os.mkfifo(fifo / "cgroup")  # would block a plain open() for ever
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root)
    owners = mapper.owners([5000, 5001, 101, 102])
    assert owners == {101: PodRef("a", "ml", "main"), 102: PodRef("b", "ml", "main"),
                      5000: None, 5001: None}


def test_processes_past_the_limit_are_unattributed_and_logged(tree, caplog):
    _, paths = tree
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root, max_pids=2)
    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        owners = mapper.owners([103, 102, 101])
    assert owners == {101: PodRef("a", "ml", "main"), 102: PodRef("b", "ml", "main"), 103: None}
    assert "more than 2 GPU processes" in caplog.text


def test_no_visible_process_says_host_pid_is_needed(tmp_path, caplog):
    paths = write_node(TWO_PODS, tmp_path)
    mapper = ProcessMapper(paths.proc_root, paths.pod_log_root)
    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        assert mapper.owners([7001, 7002]) == {7001: None, 7002: None}
        mapper.owners([7001])
    assert caplog.text.count("hostPID: true") == 1  # once an hour at most
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=processes.__name__):
        mapper.owners([101, 7001])  # one process gone is an ordinary race
    assert "hostPID" not in caplog.text


# --- the join ------------------------------------------------------------------------------------


def _procs(*rows: tuple) -> tuple[ProcessUsage, ...]:
    return tuple(ProcessUsage(*row) for row in rows)


def _holder(pod: str, replica: int | None = None, container: str = "main") -> Holder:
    return Holder(PodRef(pod, "ml", container), replica, "nvidia.com/gpu",
                  shared=replica is not None)


def test_sums_per_container_with_zero_rows_for_idle_holders():
    gpu = gpu_device(GPU0)
    s = sample(gpu, processes=_procs((1, 100, 0.1, 0.05, 0.0, 0.0), (2, 200, 0.2, 0.1, 0.0, 0.5),
                                     (3, 50, 0.3, 0.0, 0.0, 0.0), (9, None, 0.05, 0.0, 0.0, 0.0)),
               process_utilization=True)
    owners = {1: PodRef("a", "ml", "main"), 2: PodRef("a", "ml", "main"),
              3: PodRef("b", "ml", "main"), 9: None}
    attribution = Attribution({GPU0: (_holder("a", 0), _holder("b", 1), _holder("c", 2))})
    rows = {r.pod: r for r in join_usage([s], owners, attribution)}
    assert set(rows) == {PodRef("a", "ml", "main"), PodRef("b", "ml", "main"),
                         PodRef("c", "ml", "main"), None}
    a = rows[PodRef("a", "ml", "main")]
    assert (a.processes, a.used_memory, a.decoder) == (2, 300, 0.5)
    assert a.sm == pytest.approx(0.3) and a.memory == pytest.approx(0.15)
    c = rows[PodRef("c", "ml", "main")]  # holds a replica, runs nothing
    assert (c.processes, c.used_memory, c.sm, c.memory) == (0, 0, 0.0, 0.0)
    unattributed = rows[None]
    assert (unattributed.processes, unattributed.used_memory, unattributed.sm) == (1, None, 0.05)
    assert sum(r.sm for r in rows.values()) == pytest.approx(0.65)


def test_no_shares_on_mig_and_no_rows_for_devices_not_read():
    gpu = gpu_device(GPU1, 1)
    mig = mig_device(MIG_A, gpu, gi=1)
    samples = [
        sample(gpu),  # processes not read
        sample(mig, processes=_procs((7, 1 << 30)), process_utilization=False),
    ]
    attribution = Attribution({MIG_A: (_holder("m"),)})
    (row,) = join_usage(samples, {7: PodRef("m", "ml", "main")}, attribution)
    assert (row.uuid, row.processes, row.used_memory) == (MIG_A, 1, 1 << 30)
    assert row.sm is row.memory is row.encoder is row.decoder is None


def test_a_pod_known_without_its_container_takes_the_one_holding_the_device():
    gpu = gpu_device(GPU0)
    s = sample(gpu, processes=_procs((1, 10), (2, 20)), process_utilization=True)
    owners = {1: PodRef("a", "ml", ""), 2: PodRef("b", "ml", "")}
    attribution = Attribution({GPU0: (_holder("a", 0, "trainer"), _holder("b", 1, "x"),
                                      _holder("b", 2, "y"))})
    rows = {r.pod: r.processes for r in join_usage([s], owners, attribution)}
    assert rows[PodRef("a", "ml", "trainer")] == 1
    assert rows[PodRef("b", "ml", "")] == 1  # two of its containers hold it: not guessed


# --- the attribution stage ----------------------------------------------------------------------


def test_the_enricher_attaches_usage_and_maps_once_per_sample(tree):
    _, paths = tree
    mapper = CountingMapper(paths.proc_root, paths.pod_log_root)
    watcher = FakePodSource(Allocation(PodRef("a", "ml", "main"), "nvidia.com/gpu", f"{GPU0}::0"),
                       Allocation(PodRef("idle", "ml", "main"), "nvidia.com/gpu", f"{GPU0}::1"))
    enrich = PodEnricher(watcher, paths.proc_root, processes=mapper)
    gpu = sample(gpu_device(GPU0), processes=_procs((101, 100, 0.5, 0.1, 0.0, 0.0),
                                                   (900, 10, 0.1, 0.0, 0.0, 0.0)),
                 process_utilization=True)
    joined = enrich.process(snapshot(gpu, seq=1))
    assert [(r.pod, r.used_memory, r.sm) for r in joined.pods.usage] == [
        (PodRef("a", "ml", "main"), 100, 0.5),
        (PodRef("idle", "ml", "main"), 0, 0.0),
        (None, 10, 0.1),
    ]
    # the kubelet's next answer re-publishes the same sample: no file is read again
    watcher.answer(*watcher.state.allocations[:1])
    again = enrich.process(joined)
    assert mapper.calls == 1
    assert [r.pod for r in again.pods.usage] == [PodRef("a", "ml", "main"), None]
    enrich.process(snapshot(gpu, seq=2))
    assert mapper.calls == 2
    # without process usage, no usage rows
    assert PodEnricher(watcher, paths.proc_root).process(snapshot(gpu)).pods.usage == ()


# --- the pod UID (k8s.pod.uid) -------------------------------------------------------------


def test_a_process_owner_carries_its_pods_uid_to_its_usage_row(tree):
    from otel_gpu.instrument.attributes import usage_labels

    _, paths = tree
    owners = ProcessMapper(paths.proc_root, paths.pod_log_root).owners([101, 102])
    assert owners[101].uid == UID
    assert owners[102].uid == "11111111-2222-3333-4444-555555555555"
    gpu = sample(gpu_device(GPU0), processes=_procs((101, 100, 0.5, 0.0, 0.0, 0.0)),
                 process_utilization=True)
    (row,) = join_usage([gpu], owners)
    assert usage_labels(row) == {"hw.id": GPU0, "k8s.pod.name": "a", "k8s.namespace.name": "ml",
                                 "k8s.container.name": "main", "k8s.pod.uid": UID}


def test_the_pods_the_kubelet_lists_get_their_uid_from_the_pod_log_directories(tree):
    from otel_gpu.attribute.k8s.processes import PodLogIndex

    _, paths = tree
    watcher = FakePodSource(Allocation(PodRef("a", "ml", "main"), "nvidia.com/gpu", GPU0),
                            Allocation(PodRef("gone", "ml", "main"), "nvidia.com/gpu", GPU1))
    enrich = PodEnricher(watcher, paths.proc_root, pod_dirs=PodLogIndex(paths.pod_log_root))
    joined = enrich.process(snapshot(sample(gpu_device(GPU0)), sample(gpu_device(GPU1))))
    (owner,) = joined.series_pods(GPU0)
    assert owner.uid == UID
    assert joined.workload_attributes(GPU0)["k8s.pod.uid"] == UID
    assert joined.allocations(GPU0)[0].ref.uid == UID
    (unknown,) = joined.series_pods(GPU1)  # no directory names it: no UID, still the pod
    assert unknown.uid is None and "k8s.pod.uid" not in joined.workload_attributes(GPU1)
