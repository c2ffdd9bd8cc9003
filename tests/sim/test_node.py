"""The fake node's filesystem: the scenario's node section, and the trees written from it."""

from __future__ import annotations

import os

import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from otel_gpu.sim.node import cgroup_path, main, write_node
from otel_gpu.sim.scenario import ContainerSpec, PodSpec
from tests.sim.helpers import write

UID = "6b1e1f0e-4d1c-4b7e-9d9a-2f8f1d2c3b4a"
CID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"

NODE = """\
name: shared
devices: [{name: NVIDIA A10}]
node:
  cgroup: v1
  runtime: crio
  host_pids: [900, 901]
  pods:
    - namespace: ml
      name: train-0
      uid: 6b1e1f0e-4d1c-4b7e-9d9a-2f8f1d2c3b4a
      qos: guaranteed
      containers:
        - {name: main, id: 3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899,
           pids: [101, 102]}
        - {name: side, pids: [103], cgroup: v2, driver: cgroupfs, runtime: containerd}
    - {namespace: web, name: enc, containers: [{name: main}]}
"""


@pytest.mark.parametrize(("qos", "driver", "runtime", "expected"), [
    ("burstable", "systemd", "containerd",
     "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
     "6b1e1f0e_4d1c_4b7e_9d9a_2f8f1d2c3b4a.slice/cri-containerd-" + CID + ".scope"),
    ("guaranteed", "systemd", "crio",
     "/kubepods.slice/kubepods-pod6b1e1f0e_4d1c_4b7e_9d9a_2f8f1d2c3b4a.slice/crio-" + CID
     + ".scope"),
    ("besteffort", "systemd", "docker",
     "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     "6b1e1f0e_4d1c_4b7e_9d9a_2f8f1d2c3b4a.slice/docker-" + CID + ".scope"),
    ("burstable", "cgroupfs", "containerd", f"/kubepods/burstable/pod{UID}/{CID}"),
    ("guaranteed", "cgroupfs", "crio", f"/kubepods/pod{UID}/crio-{CID}"),
])
def test_cgroup_paths_as_a_real_node_writes_them(qos, driver, runtime, expected):
    pod = PodSpec("ml", "train-0", UID, qos)
    assert cgroup_path(pod, ContainerSpec("main", CID, driver=driver, runtime=runtime)) == expected


def test_writes_proc_and_the_kubelet_log_trees(tmp_path):
    scenario = load_scenario(write(tmp_path, NODE, "shared.yaml"))
    paths = write_node(scenario.node, tmp_path / "root")
    assert paths.proc_root == tmp_path / "root" / "proc"
    assert paths.pod_log_root == tmp_path / "root" / "var" / "log" / "pods"
    v1 = (paths.proc_root / "101" / "cgroup").read_text().splitlines()
    uid = UID.replace("-", "_")
    assert v1[0] == f"12:hugetlb:/kubepods.slice/kubepods-pod{uid}.slice/crio-{CID}.scope"
    assert v1[-2].startswith("1:name=systemd:/kubepods.slice/") and v1[-1] == "0::/"
    assert (paths.proc_root / "102" / "cgroup").read_text() == (
        paths.proc_root / "101" / "cgroup").read_text()
    side = (paths.proc_root / "103" / "cgroup").read_text()
    assert side.startswith(f"0::/kubepods/pod{UID}/") and side.count("\n") == 1
    host = (paths.proc_root / "900" / "cgroup").read_text()
    assert "/system.slice/" in host and "kubepods" not in host
    assert sorted(os.listdir(paths.pod_log_root)) == [
        f"ml_train-0_{UID}", f"web_enc_{scenario.node.pods[1].uid}"]
    assert sorted(os.listdir(paths.pod_log_root / f"ml_train-0_{UID}")) == ["main", "side"]
    links = tmp_path / "root" / "var" / "log" / "containers"
    link = links / f"train-0_ml_main-{CID}.log"
    assert os.readlink(link) == f"../pods/ml_train-0_{UID}/main/0.log"
    assert link.resolve() == paths.pod_log_root / f"ml_train-0_{UID}" / "main" / "0.log"
    assert len(os.listdir(links)) == 3
    # written again (a pod added), nothing breaks
    write_node(scenario.node, tmp_path / "root")


def test_defaults_are_derived_and_stable(tmp_path):
    first = load_scenario(write(tmp_path, NODE, "shared.yaml")).node
    again = load_scenario(write(tmp_path, NODE, "shared.yaml")).node
    assert first == again
    web = first.pods[1]
    assert (web.qos, web.containers[0].cgroup, web.containers[0].runtime) == (
        "burstable", "v1", "crio")
    assert len(web.containers[0].id) == 64 and web.uid.count("-") == 4


@pytest.mark.parametrize(("node", "message"), [
    ("{pods: [{namespace: ml}]}", r"node\.pods\[0\]: missing required key 'name'"),
    ("{pods: [{namespace: ML, name: a}]}", r"node\.pods\[0\]\.namespace: expected a lowercase"),
    ("{pods: [{namespace: ml, name: ../etc}]}", r"node\.pods\[0\]\.name: expected a lowercase"),
    ("{pods: [{namespace: ml, name: a, uid: nope}]}", r"node\.pods\[0\]\.uid: expected a pod UID"),
    ("{pods: [{namespace: ml, name: a, containers: [{name: c, id: abc}]}]}",
     r"containers\[0\]\.id: expected 64 lowercase hex digits"),
    ("{host_pids: [5], pods: [{namespace: ml, name: a, containers: [{name: c, pids: [5]}]}]}",
     r"containers\[0\]\.pids\[0\]: pid 5 is also listed at node\.host_pids\[0\]"),
    ("{pods: [{namespace: ml, name: a}, {namespace: ml, name: a}]}",
     r"node\.pods\[1\]: duplicate pod ml/a"),
    ("{cgroup: v3}", r"node\.cgroup: expected one of v1, v2"),
    ("{pods: [{namespace: ml, name: a, containers: [{name: c, runtime: rkt}]}]}",
     r"containers\[0\]\.runtime: expected one of containerd, crio, docker"),
    ("{pods: [{namespace: ml, name: a, qos: gold}]}", r"node\.pods\[0\]\.qos: expected one of"),
    ("{nodes: []}", r"node\.nodes: unknown key"),
    ("{containers: [{name: c, image: 'a b'}]}",
     r"node\.containers\[0\]\.image: expected an image reference"),
    ("{pods: [{namespace: ml, name: a, containers: [{name: c, image: app}]}]}",
     r"containers\[0\]\.image: unknown key"),  # the kubelet names no image
    ("{idle_threshold: 0s}", r"node\.idle_threshold: must be greater than 0, got '0s'$"),
    ("{idle_threshold: 2d}", r"node\.idle_threshold: expected a duration like 10s"),
    ("{idle_threshold: 25h}", r"node\.idle_threshold: must be from 100ms to 24h"),
    ("{idle_threshold: null}", r"node\.idle_threshold: expected a duration"),
])
def test_node_keys_are_checked(tmp_path, node, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write(tmp_path, f"devices: [{{name: X}}]\nnode: {node}\n"))


def test_command_line(tmp_path, capsys):
    path = write(tmp_path, NODE, "shared.yaml")
    assert main([path, str(tmp_path / "root")]) == 0
    out = capsys.readouterr().out
    assert f"--proc-root {tmp_path / 'root' / 'proc'}" in out
    assert (tmp_path / "root" / "proc" / "101" / "cgroup").exists()
    assert main(["t4", str(tmp_path / "other")]) == 2
    assert "has no node section" in capsys.readouterr().err


def test_a_running_node_serves_its_docker_containers_on_a_fake_runtime_api(tmp_path):
    from otel_gpu.attribute.container.runtime import fetch, parse_containers
    from otel_gpu.sim.node import run_node

    scenario = load_scenario(write(tmp_path, """\
devices: [{name: NVIDIA A10}]
node:
  pods: [{namespace: ml, name: a, containers: [{name: c, pids: [101], devices: [0]}]}]
  containers:
    - {name: jupyter, pids: [201], runtime: docker, image: "quay.io/jupyter/base:2024-12"}
    - {name: untagged, pids: [202], runtime: docker}
    - {name: by-nerdctl, pids: [203], runtime: containerd}
"""))
    node = run_node(scenario)
    try:
        listed = parse_containers(fetch(node.runtime_socket, timeout=5.0))
    finally:
        node.close()
    ids = {c.name: c.id for c in scenario.node.containers}
    assert {(c.id, c.name, c.image) for c in listed} == {
        (ids["jupyter"], "jupyter", "quay.io/jupyter/base"),
        (ids["untagged"], "untagged", None)}  # an image id: no name; nerdctl's not Docker's
    assert not os.path.exists(node.runtime_socket)


def test_a_nodes_idle_threshold_is_the_collectors_unless_it_is_set(tmp_path):
    """The demo's idle pod is reported within a minute: its node's 30 s is the collector's
    idle_threshold while the setting is left at its default, and only then."""
    from dataclasses import replace

    from otel_gpu.config import Config
    from otel_gpu.wiring import simulated_node

    assert load_scenario("demo").node.idle_threshold == 30.0
    path = write(tmp_path, """\
devices: [{name: NVIDIA A10}]
node:
  idle_threshold: 45s
  pods: [{namespace: ml, name: a, containers: [{name: c, devices: [0]}]}]
""")
    default = Config().idle_threshold
    for given, expected in ((default, 45.0), (120.0, 120.0)):
        config, node = simulated_node(replace(Config(), simulate=path, idle_threshold=given))
        assert node is not None
        node.close()
        assert config.idle_threshold == expected
    assert load_scenario(write(tmp_path, NODE, "shared.yaml")).node.idle_threshold is None
