"""A Docker host for the documentation's container queries: the real otel-gpu, a
fake Docker-compatible runtime API on a unix socket, no kubelet, and a real
Prometheus scraping it.

GPU 0 is used alone by one Docker container (systemd driver, cgroup v2), GPU 1
is shared by a Docker container (cgroupfs, cgroup v1), a rootless Podman
container and a host process of no container, and GPU 2 is free. Process usage
is on, so the per-container usage series exist too.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testkit.process import CollectorProcess, serve_args
from tests.support.container_runtime import FakeRuntime, docker_container
from tests.support.prometheus_server import PrometheusServer, Sample

GIB = 1 << 30
ALONE = "GPU-7d1c0f4e-2b55-4c0e-9a61-3d2f00000000"
SHARED = "GPU-7d1c0f4e-2b55-4c0e-9a61-3d2f00000001"
FREE = "GPU-7d1c0f4e-2b55-4c0e-9a61-3d2f00000002"
TRAINER = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
LLM = "c0ffee" + "0" * 58
EMBED = "e" * 64

# (id, name, image) as the runtime lists them
CONTAINERS = [(TRAINER, "trainer", "pytorch/pytorch:2.3.1"),
              (LLM, "llm", "ollama/ollama:0.5.7"),
              (EMBED, "embed", "ghcr.io/example/embed@sha256:" + "1" * 64)]
# pid -> its /proc/<pid>/cgroup
CGROUPS = {
    501: f"0::/system.slice/docker-{TRAINER}.scope\n",
    601: f"12:memory:/docker/{LLM}\n1:name=systemd:/docker/{LLM}\n0::/\n",
    602: ("0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
          f"libpod-{EMBED}.scope/container\n"),
    900: "0::/system.slice/ollama.service\n",
}
# what each container's processes hold of GPU memory
MEMORY = {"trainer": 2 * GIB, "llm": 3 * GIB, "embed": 2 * GIB}


def scenario() -> dict:
    def gpu(uuid: str, used: int, util: dict[str, int], processes: list[dict]) -> dict:
        return {"name": "NVIDIA A10", "uuid": uuid,
                "memory": {"total": 24 * GIB, "used": used},
                "utilization": util, "processes": processes}

    return {"name": "docker-host", "devices": [
        gpu(ALONE, 2 * GIB, {"gpu": 60, "memory": 15},
            [{"pid": 501, "used_memory": 2 * GIB, "sm": 60, "memory_util": 15}]),
        gpu(SHARED, 6 * GIB, {"gpu": 55, "memory": 25}, [
            {"pid": 601, "used_memory": 3 * GIB, "sm": 30, "memory_util": 10},
            {"pid": 602, "used_memory": 2 * GIB, "sm": 20, "memory_util": 10},
            {"pid": 900, "used_memory": 1 * GIB, "sm": 5, "memory_util": 5},
        ]),
        gpu(FREE, 0, {"gpu": 0, "memory": 0}, []),
    ]}


def write_proc(root: Path) -> None:
    for pid, text in CGROUPS.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)


class DockerStack:
    """Start with :meth:`start`; :attr:`prometheus` answers queries; :meth:`close` stops all."""

    def __init__(self, workdir: Path, prometheus_binary: str) -> None:
        self.workdir = workdir
        self.binary = prometheus_binary
        self.runtime: FakeRuntime | None = None
        self.collector: CollectorProcess | None = None
        self.prometheus: PrometheusServer | None = None

    def start(self) -> DockerStack:
        path = self.workdir / "scenario.yaml"
        path.write_text(yaml.safe_dump(scenario(), sort_keys=False))
        proc_root = self.workdir / "proc"
        write_proc(proc_root)
        self.runtime = FakeRuntime()
        self.runtime.set_containers(docker_container(*c) for c in CONTAINERS)
        self.runtime.start()
        # no kubelet answers on this host: the socket path names nothing
        self.collector = CollectorProcess(serve_args(
            "--simulate", str(path), "--kubelet-socket", str(self.workdir / "no-kubelet.sock"),
            "--kubelet-interval", "0.2", "--process-usage", "true",
            "--proc-root", str(proc_root), "--container-socket", self.runtime.socket_path,
            interval="1",
        ))
        self.collector.wait_serving()
        self.prometheus = PrometheusServer(
            [f"127.0.0.1:{self.collector.port}"], binary=self.binary,
            workdir=self.workdir / "prometheus")
        self.prometheus.start()
        self.prometheus.wait_for_query("up == 1")
        return self

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.collector is not None:
            self.collector.stop()
        if self.runtime is not None:
            self.runtime.close()

    def wait_for_data(self, promql: str, timeout: float = 40.0) -> list[Sample]:
        """The query's result once it has at least one series (fails at the deadline)."""
        assert self.prometheus is not None
        return self.prometheus.wait_for_query(promql, bool, timeout=timeout)
