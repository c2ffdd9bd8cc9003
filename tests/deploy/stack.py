"""A node for the dashboard and documentation queries: the real otel-gpu, a fake
kubelet, a fake node tree, and a real Prometheus scraping it.

The machine is the built-in h100x8 profile, reshaped so one node shows every
case a query may meet: GPU 0 held whole by one pod (with exclusive CPUs on its
NUMA node), GPU 1 time-sliced by two pods of one Deployment plus a replica,
GPU 2 held by a pod running nothing, GPU 7 split into two MIG instances,
each held by a pod, and GPUs 3-6 free (GPU 5 runs a process of no pod).
Process usage is on, so the per-pod usage series exist too; a stand-in for
kube-state-metrics gives each pod a team label (``kube_state.py``).
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path

import yaml

from otel_gpu.sim import load_scenario
from otel_gpu.sim.node import write_node
from testkit.kubelet import FakeKubelet, container, devices, pod
from testkit.process import CollectorProcess, serve_args
from tests.deploy.kube_state import KubeStateMetrics, WithKubeState
from tests.support.prometheus_server import PrometheusServer

MIG_A = "MIG-0d7a51c5-1f0e-5b1e-9c36-7a0000000001"
MIG_B = "MIG-0d7a51c5-1f0e-5b1e-9c36-7a0000000002"


def scenario() -> dict:
    text = resources.files("otel_gpu.sim").joinpath("profiles/h100x8.yaml").read_text()
    data = yaml.safe_load(text)
    data["name"] = "deploy-node"
    first, second = data["devices"]
    first["processes"] += [
        {"pid": 5101, "used_memory": 2 << 30, "sm": 20, "memory_util": 5, "positions": [1]},
        {"pid": 5102, "used_memory": 3 << 30, "sm": 15, "memory_util": 4, "positions": [1]},
        {"pid": 5103, "used_memory": 1 << 30, "sm": 5, "memory_util": 1, "positions": [1]},
    ]
    second["count"] = 3
    mig = copy.deepcopy(second)
    mig["count"] = 1
    mig.pop("processes", None)
    mig["mig_capable"] = True
    mig["mig"] = [
        {"profile": "3g.40gb", "gpu_instance_id": 1, "uuid": MIG_A,
         "memory": {"total": 40 << 30, "used": 6 << 30},
         "processes": [{"pid": 7101, "used_memory": 5 << 30}],
         "gpm": {"SM_UTIL": 55, "ANY_TENSOR_UTIL": 30, "DRAM_BW_UTIL": 40,
                 "GRAPHICS_UTIL": 60}},
        {"profile": "3g.40gb", "gpu_instance_id": 2, "uuid": MIG_B,
         "memory": {"total": 40 << 30, "used": 3 << 30},
         "processes": [{"pid": 7201, "used_memory": 2 << 30}],
         "gpm": {"SM_UTIL": 25, "ANY_TENSOR_UTIL": 10, "DRAM_BW_UTIL": 15,
                 "GRAPHICS_UTIL": 30}},
    ]
    data["devices"] = [first, second, mig]
    pods = [("ml", "train-0", "main", [4242, 4243]), ("serve", "api-a", "model", [5101]),
            ("serve", "api-b", "model", [5102, 5103]), ("ml", "mig-big", "main", [7101]),
            ("research", "mig-small", "main", [7201])]
    data["node"] = {"pods": [
        {"namespace": ns, "name": name, "containers": [{"name": c, "pids": pids}]}
        for ns, name, c, pids in pods
    ]}
    return data


def uuids(path: Path) -> list[str]:
    return [d.uuid for d in load_scenario(str(path)).devices]


def kubelet_pods(gpus: list[str]) -> list:
    gpu = "nvidia.com/gpu"
    return [
        pod("train-0", container("main", devices(gpu, gpus[0], numa=0), cpu_ids=[0, 1, 2, 3]),
            namespace="ml"),
        # api-b holds two replicas of the shared GPU: still one pod
        pod("api-a", container("model", devices(gpu, f"{gpus[1]}::0")), namespace="serve"),
        pod("api-b", container("model", devices(gpu, f"{gpus[1]}::1", f"{gpus[1]}::2")),
            namespace="serve"),
        pod("mig-big", container("main", devices("nvidia.com/mig-3g.40gb", MIG_A)),
            namespace="ml"),
        pod("mig-small", container("main", devices("nvidia.com/mig-3g.40gb", MIG_B)),
            namespace="research"),
        # holds GPU 2 and runs nothing on it
        pod("notebook", container("main", devices(gpu, gpus[2])), namespace="research"),
    ]


def write_sysfs(root: Path) -> None:
    for node, cpus in ((0, "0-15"), (1, "16-31")):
        path = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")


class Stack:
    """Start with :meth:`start`; :attr:`prometheus` answers queries; :meth:`close` stops all."""

    def __init__(self, workdir: Path, prometheus_binary: str) -> None:
        self.workdir = workdir
        self.binary = prometheus_binary
        self.kubelet: FakeKubelet | None = None
        self.collector: CollectorProcess | None = None
        self.prometheus: PrometheusServer | None = None
        self.kube_state: KubeStateMetrics | None = None

    def start(self) -> Stack:
        path = self.workdir / "scenario.yaml"
        data = scenario()
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        loaded = load_scenario(str(path))
        paths = write_node(loaded.node, self.workdir / "node")
        sysfs = self.workdir / "sysfs"
        write_sysfs(sysfs)
        self.kubelet = FakeKubelet()
        self.kubelet.set_pods(kubelet_pods([d.uuid for d in loaded.devices]))
        self.kubelet.start()
        self.collector = CollectorProcess(serve_args(
            "--simulate", str(path), "--kubelet-socket", self.kubelet.socket_path,
            "--kubelet-interval", "0.2", "--process-usage", "true",
            "--proc-root", str(paths.proc_root), "--pod-log-root", str(paths.pod_log_root),
            "--sysfs-root", str(sysfs), interval="1",
        ))
        self.collector.wait_serving()
        self.kube_state = KubeStateMetrics()
        self.prometheus = WithKubeState(
            [f"127.0.0.1:{self.collector.port}"], self.kube_state.target, binary=self.binary,
            workdir=self.workdir / "prometheus")
        self.prometheus.start()
        self.prometheus.wait_for_query("up == 1")
        return self

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.collector is not None:
            self.collector.stop()
        if self.kubelet is not None:
            self.kubelet.close()
        if self.kube_state is not None:
            self.kube_state.close()

    def wait_for_data(self, promql: str, timeout: float = 40.0):
        """The query's result once it has at least one series (fails at the deadline)."""
        assert self.prometheus is not None
        return self.prometheus.wait_for_query(promql, bool, timeout=timeout)


def grafana_to_promql(expr: str) -> str:
    """A dashboard query with its template variables replaced by match-alls."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    expr = expr.replace("${__rate_interval}", "1m").replace("$__range", "5m")
    return re.sub(r"\$\{?(\w+)(?::\w+)?\}?", ".*", expr)
