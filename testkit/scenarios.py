"""The benchmark's nodes: scenario files for ``--simulate`` and the fake kubelet's pods.

Every node is built from the ``h100x8`` profile (eight H100s, two entries of
four), its entries' ``count`` scaled to the number of GPUs asked for.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from otel_gpu.sim.scenario import PROFILES_DIR

if TYPE_CHECKING:
    from otel_gpu.sample.library import Nvml

MIG_INSTANCES = 7
"""Instances per GPU on the MIG node: seven ``1g.10gb``, an H100's most."""
H100_1G_GI_IDS = (7, 8, 9, 10, 11, 12, 13)


@dataclass(frozen=True)
class Node:
    """One benchmark configuration: its name, GPUs, MIG instances per GPU and pods; the
    repetitions a default run gives it, its sample interval (None: the run's) and the
    systems it runs (None: every one of :data:`benchmarks.report.KINDS`)."""

    name: str
    gpus: int
    mig: int = 0
    pods: int = 0
    reps: int = 1
    interval: float | None = None
    kinds: tuple[str, ...] | None = None

    @property
    def devices(self) -> int:
        """Devices with their own series: the GPUs, and their MIG instances."""
        return self.gpus * (1 + self.mig)


SAMPLING = ("otel-gpu", "handwritten", "handwritten-same", "nvitop-exporter")
"""The systems that read NVML themselves."""

NODES = {
    # the fixed cost of a sample: the systems that read NVML, more repetitions
    # (handwritten-same is compared with otel-gpu at the same time: benchmarks.paired)
    "gpus-1": Node("gpus-1", 1, reps=3, kinds=("otel-gpu", "handwritten", "nvitop-exporter")),
    "gpus-8": Node("gpus-8", 8, reps=2),
    "gpus-64": Node("gpus-64", 64, reps=1),
    # a cycle takes about 1 s of CPU here: a 2 s interval leaves a quiet gap; the peer,
    # reading 256 GPUs in Python, is left out for time
    "gpus-256": Node("gpus-256", 256, reps=1, interval=2.0,
                     kinds=("otel-gpu", "handwritten", "promclient", "static")),
    "mig-8x7": Node("mig-8x7", 8, mig=MIG_INSTANCES, reps=1),
    "pods-500": Node("pods-500", 8, pods=500, reps=1),
}
"""The nodes of a default run, with the repetitions that keep it within 15 minutes on a
2-core machine (the larger nodes get fewer)."""


def scenario(node: Node) -> dict:
    """The scenario mapping for ``node``."""
    data = yaml.safe_load((PROFILES_DIR / "h100x8.yaml").read_text())
    data["name"] = f"bench-{node.name}"
    first, second = data["devices"][:2]
    first["count"] = (node.gpus + 1) // 2
    second["count"] = node.gpus // 2
    entries = [e for e in (first, second) if e["count"]]
    for entry in entries:
        # a process listed for GPUs past this entry's count is refused
        for proc in entry.get("processes") or ():
            proc["positions"] = [p for p in proc.get("positions", [0]) if p < entry["count"]]
        entry["processes"] = [p for p in entry.get("processes") or () if p["positions"]]
        if node.mig:
            entry["mig"] = [
                {"profile": "1g.10gb", "gpu_instance_id": gi, "compute_instance_id": 0,
                 "memory": {"total": 10200547328, "used": 536870912}}
                for gi in H100_1G_GI_IDS[:node.mig]
            ]
            entry.pop("processes", None)
        if entry["count"] > 4:
            _within_physics(entry)
    data["devices"] = [copy.deepcopy(e) for e in entries]
    return data


def _within_physics(entry: dict) -> None:
    """Past the profile's four GPUs per entry, its per-GPU steps would take percentages past
    100 and temperatures past 200 C, which the collector omits as impossible: the same
    reading on every GPU instead."""
    readings = [entry.get("utilization", {}), entry.get("fields", {}), entry.get("gpm", {})]
    for group in readings:
        for key, value in group.items():
            if isinstance(value, dict) and not key.endswith("_PER_SEC") and key not in (
                    "TOTAL_ENERGY_CONSUMPTION", "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES"):
                value.pop("per_device", None)
    if isinstance(entry.get("temperature"), dict):
        entry["temperature"].pop("per_device", None)


def write_scenario(node: Node, directory: Path) -> Path:
    path = directory / f"{node.name}.yaml"
    path.write_text(yaml.safe_dump(scenario(node), sort_keys=False))
    return path


def simulated_nvml(node_name: str) -> Nvml:
    """NVML opened on ``node_name``'s simulated driver, installed under pynvml: what the
    in-process benchmarks sample."""
    import tempfile

    from otel_gpu import sim
    from otel_gpu.sample.library import Nvml

    with tempfile.TemporaryDirectory(prefix="otel-gpu-bench-") as tmp:
        sim.install(sim.FakeNvml(sim.load_scenario(str(write_scenario(NODES[node_name],
                                                                        Path(tmp))))))
    nvml = Nvml()
    nvml.init()
    return nvml


def gpu_uuids(path: Path) -> list[str]:
    """The UUIDs the simulator gives the scenario's GPUs, in index order."""
    from otel_gpu.sim.scenario import load_scenario

    return [gpu.uuid for gpu in load_scenario(str(path)).devices]


def time_sliced_pods(uuids: list[str], pods: int) -> list:
    """``pods`` pods, each holding one time-slicing replica of a GPU, round robin."""
    from testkit.kubelet import container, devices, pod

    return [
        pod(f"slice-{i}", container("srv", devices("nvidia.com/gpu",
                                                   f"{uuids[i % len(uuids)]}::{i // len(uuids)}")),
            namespace="bench")
        for i in range(pods)
    ]


def node_list(text: str) -> list[str]:
    """``--configs``: comma-separated names of :data:`NODES` (argparse names a wrong one)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in NODES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown configuration(s): {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(NODES)}")
    return names
