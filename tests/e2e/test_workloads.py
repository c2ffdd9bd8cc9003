"""Usage per workload: the real otel-gpu process, a fake kubelet and a fake node's files.

Three pods time-slice one GPU, a fourth holds another whole (next to a host
process), and two pods hold one MIG instance each. Every process's memory and
shares are known from the scenario, so each pod's numbers are exact, and the
pods' sums come back to the device's own readings.
"""

from __future__ import annotations

import os

import pytest

from testkit.exposition import parse_samples, series
from testkit.kubelet import container, devices, pod
from testkit.otlp_receiver import resource_groups
from testkit.process import start_on_node, wait_until

SHARED = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"
WHOLE = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
GIB = 1 << 30

TIME_SLICED = f"""\
name: time-sliced
devices:
  - name: NVIDIA A10
    uuid: {SHARED}
    memory: {{total: {24 * GIB}, used: {5 * GIB}}}
    utilization: {{gpu: 85, memory: 40, encoder: 6, decoder: 0}}
    processes:
      - {{pid: 101, used_memory: {1 * GIB}, sm: 20, memory_util: 10}}
      - {{pid: 102, used_memory: {2 * GIB}, sm: 30, memory_util: 10}}
      - {{pid: 103, used_memory: {3 * GIB // 2}, sm: 25, memory_util: 15, encoder: 6}}
      - {{pid: 104, used_memory: {GIB // 2}, sm: 10, memory_util: 5}}
  - name: NVIDIA A10
    uuid: {WHOLE}
    memory: {{total: {24 * GIB}, used: {3 * GIB}}}
    utilization: {{gpu: 70, memory: 20}}
    processes:
      - {{pid: 201, used_memory: {2 * GIB}, sm: 60, memory_util: 15}}
      - {{pid: 900, used_memory: {1 * GIB}, sm: 10, memory_util: 5}}
node:
  host_pids: [900]
  pods:
    - {{namespace: ml, name: train-a, containers: [{{name: main, pids: [101]}}]}}
    - namespace: ml
      name: train-b
      qos: guaranteed
      containers: [{{name: main, pids: [102], cgroup: v1, driver: cgroupfs, runtime: crio}}]
    - namespace: media
      name: encode-c
      qos: besteffort
      containers: [{{name: enc, pids: [103, 104]}}, {{name: sidecar}}]
    - {{namespace: ml, name: solo-d, containers: [{{name: main, pids: [201]}}]}}
"""
# (pod, namespace, container) -> what its processes use on the shared GPU
SHARERS = {
    ("train-a", "ml", "main"): (1 * GIB, 0.20, 0.10, 1),
    ("train-b", "ml", "main"): (2 * GIB, 0.30, 0.10, 1),
    ("encode-c", "media", "enc"): (2 * GIB, 0.35, 0.20, 2),
}

MIG_A = "MIG-42f0f413-f7b0-58cc-aced-c1d1fb54db26"
MIG_B = "MIG-7d4e1a2b-0000-5555-aaaa-bbbbccccdddd"
MIG_NODE = f"""\
name: mig
devices:
  - name: NVIDIA A100-SXM4-40GB
    uuid: {SHARED}
    memory: {{total: {40 * GIB}, used: {6 * GIB}}}
    mig:
      - profile: 3g.20gb
        gpu_instance_id: 1
        uuid: {MIG_A}
        memory: {{total: {20 * GIB}, used: {4 * GIB}}}
        processes: [{{pid: 301, used_memory: {3 * GIB}}}, {{pid: 302, used_memory: {GIB}}}]
      - profile: 2g.10gb
        gpu_instance_id: 5
        uuid: {MIG_B}
        memory: {{total: {10 * GIB}, used: {2 * GIB}}}
        processes: [{{pid: 401, used_memory: {2 * GIB}}}]
node:
  cgroup: v1
  driver: cgroupfs
  pods:
    - {{namespace: ml, name: big, containers: [{{name: main, pids: [301, 302]}}]}}
    - {{namespace: ml, name: small, containers: [{{name: main, pids: [401]}}]}}
"""


POD_USAGE_FAMILIES = tuple(f"nvidia_gpu_k8s_{name}" for name in (
    "memory_usage", "sm_utilization", "memory_controller_utilization", "encoder_utilization",
    "decoder_utilization", "processes"))
"""The pods' per-container usage families (the containers' are nvidia_gpu_container_*)."""


def _families(text: str) -> set[str]:
    return {name for name, _, _ in parse_samples(text)}


def _start(collector, tmp_path, kubelet, scenario: str, env: dict | None = None):
    return start_on_node(collector, tmp_path, kubelet, scenario, env=env)


def _time_sliced_pods(kubelet) -> None:
    replica = iter(range(3))
    kubelet.set_pods([
        *(pod(name, container(c, devices("nvidia.com/gpu", f"{SHARED}::{next(replica)}")),
              namespace=ns)
          for name, ns, c in SHARERS),
        pod("solo-d", container("main", devices("nvidia.com/gpu", WHOLE)), namespace="ml"),
    ])


def _key(labels: dict) -> tuple:
    """A series' container; Prometheus writes an absent label as empty."""
    return tuple(labels.get(k) or None
                 for k in ("k8s_pod_name", "k8s_namespace_name", "k8s_container_name"))


def _usage(text: str, metric: str, hw_id: str) -> dict[tuple, float]:
    return {_key(lab): value for lab, value in series(text, metric, hw_id=hw_id)}


def _device(text: str, metric: str, hw_id: str, **labels: str) -> float:
    (value,) = [v for _, v in series(text, metric, hw_id=hw_id, **labels)]
    return value


def test_three_pods_time_slicing_a_gpu_each_see_their_own_use(collector, kubelet, tmp_path):
    _time_sliced_pods(kubelet)
    proc = _start(collector, tmp_path, kubelet, TIME_SLICED)

    def usage_with_every_pod():
        """Usage rows come from the processes' cgroups, the allocations from the kubelet:
        wait for a body with both (the first sample can come before the kubelet's answer)."""
        text = proc.metrics()
        found = _usage(text, "nvidia_gpu_k8s_memory_usage_bytes", SHARED)
        joined = series(text, "otel_gpu_kubelet_pods") == [({}, float(len(SHARERS) + 1))]
        return text if set(SHARERS) <= set(found) and joined else None

    text = wait_until(usage_with_every_pod, 20, "usage series for the three sharers")
    memory = _usage(text, "nvidia_gpu_k8s_memory_usage_bytes", SHARED)
    assert not [f for f in _families(text) if f.startswith("nvidia_gpu_container_")]  # pods'
    sm = _usage(text, "nvidia_gpu_k8s_sm_utilization", SHARED)
    controller = _usage(text, "nvidia_gpu_k8s_memory_controller_utilization", SHARED)
    count = _usage(text, "nvidia_gpu_k8s_processes", SHARED)
    assert set(memory) == set(sm) == set(controller) == set(count) == set(SHARERS)
    for key, (mem, sm_share, mc_share, processes) in SHARERS.items():
        assert memory[key] == mem, key
        assert sm[key] == pytest.approx(sm_share), key
        assert controller[key] == pytest.approx(mc_share), key
        assert count[key] == processes, key
    assert _usage(text, "nvidia_gpu_k8s_encoder_utilization", SHARED)[
        ("encode-c", "media", "enc")] == pytest.approx(0.06)
    # the pods' sums are the device's own readings
    assert sum(memory.values()) == _device(text, "hw_gpu_memory_usage_bytes", SHARED)
    assert sum(sm.values()) == pytest.approx(
        _device(text, "hw_gpu_utilization", SHARED, hw_gpu_task="general"))
    assert sum(controller.values()) == pytest.approx(
        _device(text, "nvidia_gpu_memory_controller_utilization", SHARED))
    # the allocation series stay, and name the same containers
    allocated = {_key(lab) for lab, _ in series(text, "nvidia_gpu_k8s_allocation", hw_id=SHARED)}
    assert allocated == set(SHARERS)
    # by namespace, as docs/kubernetes.md queries it
    by_namespace: dict[str, float] = {}
    for (_, namespace, _), value in memory.items():
        by_namespace[namespace] = by_namespace.get(namespace, 0) + value
    assert by_namespace == {"ml": 3 * GIB, "media": 2 * GIB}

    # a GPU held whole has the same series, for its one pod; a host process is unattributed
    whole = _usage(text, "nvidia_gpu_k8s_memory_usage_bytes", WHOLE)
    assert whole == {("solo-d", "ml", "main"): 2 * GIB, (None, None, None): 1 * GIB}
    (host,) = [lab for lab, _ in series(text, "nvidia_gpu_k8s_sm_utilization", hw_id=WHOLE)
               if not lab.get("k8s_pod_name")]
    assert host["nvidia_gpu_process_owner"] == "unattributed"
    assert sum(whole.values()) == _device(text, "hw_gpu_memory_usage_bytes", WHOLE)
    assert _owner_labels(text, WHOLE) == ("solo-d", "ml", "main")


def _owner_labels(text: str, hw_id: str) -> tuple:
    (labels,) = [lab for lab, _ in series(text, "hw_gpu_memory_usage_bytes", hw_id=hw_id)]
    return _key(labels)


def test_per_pod_usage_travels_under_each_pods_resource(collector, kubelet, receiver, tmp_path):
    _time_sliced_pods(kubelet)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    _start(collector, tmp_path, kubelet, TIME_SLICED, env=env)

    def usage_per_pod(req) -> dict[tuple, dict[str, float]]:
        out: dict[tuple, dict[str, float]] = {}
        for row in req.rows():
            if row.metric.startswith("nvidia.gpu.k8s.") and row.metric != (
                    "nvidia.gpu.k8s.allocation") and row.attributes.get("hw.id") == SHARED:
                owner = (row.resource.get("k8s.pod.name"), row.resource.get("k8s.namespace.name"),
                         row.resource.get("k8s.container.name"))
                out.setdefault(owner, {})[row.metric] = row.value
        return out

    def every_pod(r) -> bool:
        pods = {g.get("k8s.pod.name") for g in resource_groups(r)}
        return set(SHARERS) <= set(usage_per_pod(r)) and "solo-d" in pods

    (req,) = receiver.wait_for(every_pod, timeout=30)
    usage = usage_per_pod(req)
    assert set(usage) == set(SHARERS)  # nothing left under the node's Resource
    for key, (mem, sm_share, _, processes) in SHARERS.items():
        assert usage[key]["nvidia.gpu.k8s.memory.usage"] == mem
        assert usage[key]["nvidia.gpu.k8s.sm.utilization"] == pytest.approx(sm_share)
        assert usage[key]["nvidia.gpu.k8s.processes"] == processes
    pods = {(g["k8s.pod.name"], g["k8s.namespace.name"], g["k8s.container.name"])
            for g in resource_groups(req) if "k8s.pod.name" in g}
    assert pods == {*SHARERS, ("solo-d", "ml", "main")}
    # each pod's Resource has its UID, as the kubelet's pod directories name it
    uids = {}  # <namespace>_<pod>_<uid>
    for name in os.listdir(tmp_path / "node" / "var" / "log" / "pods"):
        _, pod_name, uid = name.split("_")
        uids[pod_name] = uid
    assert {g["k8s.pod.name"]: g.get("k8s.pod.uid") for g in resource_groups(req)
            if "k8s.pod.name" in g} == {p: uids[p] for p in (*(k[0] for k in SHARERS), "solo-d")}
    rows = req.rows()
    for row in rows:  # pod identity is the Resource's, never the point's
        assert not {"k8s.pod.name", "k8s.namespace.name", "k8s.container.name"} & set(
            row.attributes), row
    (device_memory,) = [r.value for r in rows if r.metric == "hw.gpu.memory.usage"
                        and r.attributes["hw.id"] == SHARED]
    assert sum(u["nvidia.gpu.k8s.memory.usage"] for u in usage.values()) == device_memory
    (host,) = [r for r in rows if r.metric == "nvidia.gpu.k8s.memory.usage"
               and r.attributes.get("nvidia.gpu.process.owner") == "unattributed"]
    assert host.attributes["hw.id"] == WHOLE and "k8s.pod.name" not in host.resource
    assert host.value == 1 * GIB


def test_two_pods_on_two_mig_instances(collector, kubelet, tmp_path):
    kubelet.set_pods([
        pod("big", container("main", devices("nvidia.com/mig-3g.20gb", MIG_A)), namespace="ml"),
        pod("small", container("main", devices("nvidia.com/mig-2g.10gb", MIG_B)),
            namespace="ml"),
    ])
    proc = _start(collector, tmp_path, kubelet, MIG_NODE)

    def both():
        """Usage rows come from the processes' cgroups, the owners from the kubelet: wait
        for a body with both joined (the first sample can come before the kubelet's answer)."""
        text = proc.metrics()
        found = {lab["hw_id"]: _key(lab)
                 for lab, _ in series(text, "nvidia_gpu_k8s_memory_usage_bytes")}
        owned = all(_key(lab)[0] for uuid in (MIG_A, MIG_B)
                    for lab, _ in series(text, "hw_gpu_memory_usage_bytes", hw_id=uuid)) and all(
            series(text, "hw_gpu_memory_usage_bytes", hw_id=uuid) for uuid in (MIG_A, MIG_B))
        return text if found.get(MIG_A) and found.get(MIG_B) and owned else None

    text = wait_until(both, 20, "usage series and owners on both MIG instances")
    for uuid, pod_name, memory, processes in ((MIG_A, "big", 4 * GIB, 2),
                                              (MIG_B, "small", 2 * GIB, 1)):
        key = (pod_name, "ml", "main")
        assert _usage(text, "nvidia_gpu_k8s_memory_usage_bytes", uuid) == {key: memory}
        assert _usage(text, "nvidia_gpu_k8s_processes", uuid) == {key: processes}
        # the instance's own series name the same pod, and its memory is the pod's
        assert _owner_labels(text, uuid) == key
        assert _device(text, "hw_gpu_memory_usage_bytes", uuid) == memory
    # no per-process utilization in MIG mode, and nothing counted twice on the parent
    assert not series(text, "nvidia_gpu_k8s_sm_utilization")
    assert not _usage(text, "nvidia_gpu_k8s_memory_usage_bytes", SHARED)


# --- containers outside Kubernetes (Docker, Podman): no kubelet, a runtime socket ----------

TRAINER = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
LLM = "c0ffee" + "0" * 58
UNLISTED = "d" * 64
DOCKER_HOST = f"""\
name: docker-host
devices:
  - name: NVIDIA A10
    uuid: {WHOLE}
    memory: {{total: {24 * GIB}, used: {2 * GIB}}}
    utilization: {{gpu: 60, memory: 15}}
    processes:
      - {{pid: 501, used_memory: {2 * GIB}, sm: 60, memory_util: 15}}
  - name: NVIDIA A10
    uuid: {SHARED}
    memory: {{total: {24 * GIB}, used: {6 * GIB}}}
    utilization: {{gpu: 55, memory: 25}}
    processes:
      - {{pid: 601, used_memory: {3 * GIB}, sm: 30, memory_util: 10}}
      - {{pid: 602, used_memory: {2 * GIB}, sm: 20, memory_util: 10}}
      - {{pid: 900, used_memory: {1 * GIB}, sm: 5, memory_util: 5}}
"""
CGROUPS = {
    501: f"0::/system.slice/docker-{TRAINER}.scope\n",  # Docker, systemd, cgroup v2
    601: f"12:memory:/docker/{LLM}\n1:name=systemd:/docker/{LLM}\n0::/\n",  # cgroupfs, v1
    602: f"0::/machine.slice/libpod-{UNLISTED}.scope/container\n",  # Podman, not listed
    900: "0::/system.slice/ollama.service\n",  # a host process
}


def _start_on_docker_host(collector, tmp_path, runtime, env=None):
    from tests.support.container_runtime import docker_container

    runtime.set_containers([docker_container(TRAINER, "trainer", "pytorch/pytorch:2.3.1"),
                            docker_container(LLM, "llm", "ollama/ollama:0.5.7")])
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(DOCKER_HOST)
    proc_root = tmp_path / "proc"
    for pid, text in CGROUPS.items():
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(text)
    return collector(
        "--simulate", str(scenario), "--kubelet-socket", str(tmp_path / "no-kubelet.sock"),
        "--kubelet-interval", "0.1", "--process-usage", "true", "--proc-root", str(proc_root),
        "--container-socket", runtime.socket_path, env=env)


def _container_key(labels: dict) -> tuple:
    return tuple(labels.get(k) or None
                 for k in ("container_id", "container_name", "container_image_name"))


@pytest.fixture
def runtime():
    from tests.support.container_runtime import FakeRuntime

    with FakeRuntime() as fake:
        yield fake


def test_a_container_outside_kubernetes_names_its_gpu_and_its_usage(collector, runtime, tmp_path):
    proc = _start_on_docker_host(collector, tmp_path, runtime)

    def named():
        text = proc.metrics()
        found = series(text, "hw_gpu_memory_usage_bytes", hw_id=WHOLE)
        return text if found and found[0][0].get("container_name") == "trainer" else None

    text = wait_until(named, 20, "the GPU's series named by its container")
    # the GPU one container uses alone carries the container on its series
    (labels,) = [lab for lab, _ in series(text, "hw_gpu_memory_usage_bytes", hw_id=WHOLE)]
    assert _container_key(labels) == (TRAINER, "trainer", "pytorch/pytorch")
    assert not labels.get("k8s_pod_name")
    (labels,) = [lab for lab, _ in series(text, "hw_gpu_utilization", hw_id=WHOLE,
                                          hw_gpu_task="general")]
    assert labels["container_name"] == "trainer"
    # a GPU two containers share names neither on its own series ...
    (labels,) = [lab for lab, _ in series(text, "hw_gpu_memory_usage_bytes", hw_id=SHARED)]
    assert _container_key(labels) == (None, None, None)
    # ... and its usage rows are per container, the host's process unattributed
    memory = {_container_key(lab): v
              for lab, v in series(text, "nvidia_gpu_container_memory_usage_bytes", hw_id=SHARED)}
    assert memory == {(LLM, "llm", "ollama/ollama"): 3 * GIB,
                      (UNLISTED, None, None): 2 * GIB,  # the runtime does not list it: id only
                      (None, None, None): 1 * GIB}
    assert sum(memory.values()) == _device(text, "hw_gpu_memory_usage_bytes", SHARED)
    sm = {_container_key(lab): v
          for lab, v in series(text, "nvidia_gpu_container_sm_utilization", hw_id=SHARED)}
    assert sm[(LLM, "llm", "ollama/ollama")] == pytest.approx(0.30)
    whole = {_container_key(lab): v
             for lab, v in series(text, "nvidia_gpu_container_processes", hw_id=WHOLE)}
    assert whole == {(TRAINER, "trainer", "pytorch/pytorch"): 1}
    assert runtime.calls >= 1
    # the usage names are the containers', not the pods': no pod is involved, and no label
    # of a pod, empty or not, is on them
    # (beside them, the GPU time ledger's families: allocated, active and idle time)
    families = [name for name in _families(text) if name.startswith("nvidia_gpu_container_")]
    ledger = ("nvidia_gpu_container_time_", "nvidia_gpu_container_idle_")
    usage = [name for name in families if not name.startswith(ledger)]
    assert len(usage) == 6, usage
    assert len(families) - len(usage) == 3, families
    assert not [name for name in _families(text) if name.startswith(POD_USAGE_FAMILIES)]
    for name in families:
        for lab, _ in series(text, name):
            assert not [k for k in lab if k.startswith("k8s_")], (name, lab)


def test_each_container_outside_kubernetes_travels_under_its_own_resource(
        collector, runtime, receiver, tmp_path):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    _start_on_docker_host(collector, tmp_path, runtime, env=env)

    def both(r) -> bool:
        names = {g.get("container.name") for g in resource_groups(r)}
        return {"trainer", "llm"} <= names

    (req,) = receiver.wait_for(both, timeout=30)
    rows = req.rows()
    for row in rows:  # the container is the Resource's, never the point's
        assert not {"container.id", "container.name", "container.image.name"} & set(
            row.attributes), row
    (gpu,) = [r for r in rows if r.metric == "hw.gpu.memory.usage"
              and r.attributes["hw.id"] == WHOLE]
    assert {k: gpu.resource.get(k) for k in ("container.id", "container.name",
                                             "container.image.name")} == {
        "container.id": TRAINER, "container.name": "trainer",
        "container.image.name": "pytorch/pytorch"}
    (llm,) = [r for r in rows if r.metric == "nvidia.gpu.container.memory.usage"
              and r.resource.get("container.name") == "llm"]
    assert llm.attributes["hw.id"] == SHARED and llm.value == 3 * GIB
