"""A fake node's filesystem for process usage: ``/proc/<pid>/cgroup`` and the kubelet's logs.

From a scenario's ``node`` section (see :mod:`otel_gpu.sim.scenario`),
:func:`write_node` writes under a directory what otel-gpu reads on a real
node to find which pod a GPU process belongs to:

* ``proc/<pid>/cgroup``, in the layout the container's ``cgroup`` version,
  cgroup ``driver`` and ``runtime`` give on a real node (systemd slices or
  cgroupfs directories; ``cri-containerd-``, ``crio-`` or ``docker-`` scopes),
  and ``/system.slice`` or ``/user.slice`` paths for the host's processes;
* ``var/log/pods/<namespace>_<name>_<uid>/<container>/0.log`` and
  ``var/log/containers/<name>_<namespace>_<container>-<id>.log`` (a relative
  link to the former), as the kubelet lays them out;
* ``proc/<pid>/cgroup`` of the containers outside Kubernetes, in their
  runtime's scope (``/system.slice/docker-<id>.scope``, or ``/docker/<id>``
  with the cgroupfs driver).

:func:`run_node` does that in a temporary directory and serves the pods'
allocations on a fake kubelet there (:mod:`otel_gpu.sim.kubelet`), and the
containers Docker runs outside Kubernetes on a fake Docker API
(:mod:`otel_gpu.sim.runtime`): what ``--simulate`` does with a scenario that has
pods.

Run against a scenario::

    python -m otel_gpu.sim.node SCENARIO DIR
    otel-gpu --simulate SCENARIO --process-usage true \\
        --proc-root DIR/proc --pod-log-root DIR/var/log/pods
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from otel_gpu.sim.scenario import (
    ContainerSpec,
    NodeSpec,
    PodSpec,
    Scenario,
    ScenarioError,
    load_scenario,
)

if TYPE_CHECKING:  # gRPC is imported only for a scenario with pods
    from otel_gpu.sim.kubelet import KubeletServer
    from otel_gpu.sim.runtime import RuntimeServer

_V1_CONTROLLERS = ("hugetlb", "memory", "cpu,cpuacct", "pids", "devices", "blkio", "cpuset",
                   "freezer", "net_cls,net_prio", "perf_event")
_SCOPE = {"containerd": "cri-containerd-", "crio": "crio-", "docker": "docker-"}
_OUTSIDE = {"containerd": "nerdctl-", "crio": "crio-", "docker": "docker-"}
"""The scope each runtime names a container outside Kubernetes by."""
_HOST_PATHS = ("/system.slice/nvidia-persistenced.service",
               "/user.slice/user-1000.slice/session-3.scope")


@dataclass(frozen=True)
class NodePaths:
    """Where :func:`write_node` put the trees: the ``proc_root`` and ``pod_log_root`` settings."""

    proc_root: Path
    pod_log_root: Path


def cgroup_path(pod: PodSpec, container: ContainerSpec) -> str:
    """The container's cgroup, as ``/proc/<pid>/cgroup`` shows it on a real node."""
    qos = [] if pod.qos == "guaranteed" else [pod.qos]
    if container.driver == "systemd":
        uid = pod.uid.replace("-", "_")
        slices = ["kubepods"] + [f"kubepods-{q}" for q in qos] + [
            "-".join(["kubepods", *qos, f"pod{uid}"])]
        parts = [f"{s}.slice" for s in slices]
        parts.append(f"{_SCOPE[container.runtime]}{container.id}.scope")
    else:
        prefix = "crio-" if container.runtime == "crio" else ""
        parts = ["kubepods", *qos, f"pod{pod.uid}", prefix + container.id]
    return "/" + "/".join(parts)


def outside_cgroup_path(container: ContainerSpec) -> str:
    """A container outside Kubernetes: its runtime's scope under ``system.slice``, or its
    runtime's directory with the cgroupfs driver."""
    if container.driver == "systemd":
        return f"/system.slice/{_OUTSIDE[container.runtime]}{container.id}.scope"
    return f"/{container.runtime}/{container.id}"


def cgroup_file(path: str, version: str) -> str:
    """The whole ``cgroup`` file of a process in ``path``: one unified line (v2), or one
    line per v1 controller plus the named systemd hierarchy and an empty unified one."""
    if version == "v2":
        return f"0::{path}\n"
    lines = [f"{n}:{c}:{path}" for n, c in zip(range(12, 1, -1), _V1_CONTROLLERS, strict=False)]
    return "\n".join([*lines, f"1:name=systemd:{path}", "0::/"]) + "\n"


def write_node(node: NodeSpec, root: Path) -> NodePaths:
    """Write the node's trees under ``root`` (created if needed); returns where they are."""
    root = Path(root)
    proc = root / "proc"
    pods_dir = root / "var" / "log" / "pods"
    links = root / "var" / "log" / "containers"
    for directory in (proc, pods_dir, links):
        directory.mkdir(parents=True, exist_ok=True)
    for pod in node.pods:
        pod_dir = f"{pod.namespace}_{pod.name}_{pod.uid}"
        for container in pod.containers:
            text = cgroup_file(cgroup_path(pod, container), container.cgroup)
            for pid in container.pids:
                _write(proc / str(pid) / "cgroup", text)
            log = pods_dir / pod_dir / container.name / "0.log"
            _write(log, "")
            link = links / f"{pod.name}_{pod.namespace}_{container.name}-{container.id}.log"
            if not link.is_symlink():
                os.symlink(Path("..") / "pods" / pod_dir / container.name / "0.log", link)
    for container in node.containers:
        text = cgroup_file(outside_cgroup_path(container), container.cgroup)
        for pid in container.pids:
            _write(proc / str(pid) / "cgroup", text)
    for i, pid in enumerate(node.host_pids):
        host_path = _HOST_PATHS[i % len(_HOST_PATHS)]
        _write(proc / str(pid) / "cgroup", cgroup_file(host_path, node.cgroup))
    return NodePaths(proc, pods_dir)


@dataclass
class RunningNode:
    """A simulated node's files and its kubelet, until :meth:`close`."""

    directory: Path
    paths: NodePaths
    kubelet: KubeletServer
    runtime: RuntimeServer | None = None
    """The fake Docker API, when the node has containers Docker runs outside Kubernetes."""

    @property
    def runtime_socket(self) -> str:
        """Where the node's Docker listens: served when the node has Docker containers
        outside Kubernetes, else nothing is there (the host's own runtime is never asked
        about simulated processes)."""
        return str(self.directory / "docker.sock")

    def close(self) -> None:
        """Stop the kubelet and the runtime, and remove the files."""
        self.kubelet.close()
        if self.runtime is not None:
            self.runtime.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def run_node(scenario: Scenario) -> RunningNode:
    """The scenario's node in a fresh temporary directory: its ``/proc`` and kubelet log
    trees written, its pods' allocations served by a fake kubelet on a socket there, and
    its Docker containers outside Kubernetes by a fake Docker API beside it."""
    from otel_gpu.sim.kubelet import (
        KubeletServer,
        allocatable_reply,
        scenario_allocatable,
        scenario_pods,
    )
    from otel_gpu.sim.runtime import RuntimeServer

    if scenario.node is None:
        raise ScenarioError(f"scenario {scenario.name} has no node section")
    directory = Path(tempfile.mkdtemp(prefix="otel-gpu-node-",
                                      dir="/tmp" if os.path.isdir("/tmp") else None))
    kubelet: KubeletServer | None = None
    try:
        paths = write_node(scenario.node, directory)
        kubelet = KubeletServer(directory / "kubelet.sock")
        kubelet.serve_pods(scenario_pods(scenario.node))
        kubelet.set_allocatable_reply(allocatable_reply(
            scenario_allocatable(scenario.node, scenario.devices)))
        kubelet.start()
        node = RunningNode(directory, paths, kubelet)
        docker = [c for c in scenario.node.containers if c.runtime == "docker"]
        if docker:
            node.runtime = RuntimeServer(node.runtime_socket, docker).start()
    except BaseException:
        if kubelet is not None:
            kubelet.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return node


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m otel_gpu.sim.node",
        description="Write a scenario's fake node filesystem (/proc cgroups, kubelet pod logs).")
    parser.add_argument("scenario", help="built-in profile or scenario YAML file with a node")
    parser.add_argument("directory", help="where to write proc/ and var/log/")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"otel-gpu: {exc}", file=sys.stderr)
        return 2
    if scenario.node is None:
        print(f"otel-gpu: scenario {args.scenario} has no node section", file=sys.stderr)
        return 2
    paths = write_node(scenario.node, Path(args.directory))
    print(f"--process-usage true --proc-root {paths.proc_root} "
          f"--pod-log-root {paths.pod_log_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
