"""The node a scenario runs on: its pods and their containers, the devices the kubelet lists
for each, the containers outside Kubernetes, and the pids each holds.

What :mod:`otel_gpu.sim.node` builds the node's /proc and kubelet log trees
from, and :mod:`otel_gpu.sim.kubelet` answers the Pod Resources API with.
"""

from __future__ import annotations

import re
from typing import Any

from otel_gpu.config.settings import IDLE_THRESHOLD
from otel_gpu.sim.scenario._checks import Checks, show, uuid5
from otel_gpu.sim.scenario.model import (
    CGROUP_DRIVERS,
    CGROUP_VERSIONS,
    QOS_CLASSES,
    RUNTIMES,
    U32_MAX,
    ContainerSpec,
    GpuSpec,
    KubeletDevice,
    NodeSpec,
    PodSpec,
)

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_POD_UID = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                      r"|[0-9a-f]{32})$")
_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


class NodeChecks(Checks):
    """Reads the scenario's ``node``, checking names, ids and pids across all of it."""

    def k8s_name(self, path: str, raw: Any) -> str:
        text = self.string(path, raw)
        if len(text) > 253 or not _K8S_NAME.match(text):
            self.fail(path, f"expected a lowercase DNS name (a-z, 0-9, '-', '.'), "
                            f"got {show(raw)}")
        return text

    def image(self, path: str, raw: Any) -> str:
        """An image reference as ``docker run`` takes it (``registry/name:tag``)."""
        text = self.string(path, raw)
        if len(text) > 512 or not _IMAGE.match(text):
            self.fail(path, f"expected an image reference (e.g. pytorch/pytorch:2.3.1), "
                            f"got {show(raw)}")
        return text

    def kubelet_devices(self, path: str, raw: Any, gpus: tuple[GpuSpec, ...]
                        ) -> tuple[KubeletDevice, ...]:
        """A container's devices as the kubelet lists them: each a GPU index (held whole), or
        ``{gpu: N, replica: R}`` (a time-sliced share) or ``{gpu: N, mig: GI}`` (a MIG
        instance, by GPU instance id), with an optional ``resource`` name."""
        out = []
        for j, item in enumerate(self.sequence(path, raw)):
            p = f"{path}[{j}]"
            if not isinstance(item, dict):
                item = {"gpu": item}
            self.keys(KubeletDevice, p, item)
            index = self.integer(f"{p}.gpu", item["gpu"])
            if index >= len(gpus):
                self.fail(f"{p}.gpu", f"no GPU {index} (the scenario has {len(gpus)})")
            gpu = gpus[index]
            if "replica" in item and "mig" in item:
                self.fail(p, "a share of a MIG instance is not simulated: give replica or mig")
            replica = self.integer(f"{p}.replica", item["replica"]) if "replica" in item \
                else None
            if "mig" in item:
                gi = self.integer(f"{p}.mig", item["mig"])
                mig = next((m for m in gpu.mig if m.gpu_instance_id == gi), None)
                if mig is None:
                    self.fail(f"{p}.mig", f"GPU {index} has no MIG instance with "
                                          f"gpu_instance_id {gi}")
                resource, device_id = f"nvidia.com/mig-{mig.profile}", mig.uuid
            else:
                gi = None
                resource = "nvidia.com/gpu"
                device_id = gpu.uuid if replica is None else f"{gpu.uuid}::{replica}"
            if "resource" in item:
                resource = self.string(f"{p}.resource", item["resource"])
            out.append(KubeletDevice(index, replica, gi, resource, device_id, gpu.numa_node))
        return tuple(out)

    def node(self, path: str, raw: Any, scenario: str,
             gpus: tuple[GpuSpec, ...] = ()) -> NodeSpec:
        self.keys(NodeSpec, path, raw)
        layout = {
            "cgroup": self.choice(f"{path}.cgroup", raw.get("cgroup", "v2"), CGROUP_VERSIONS),
            "driver": self.choice(f"{path}.driver", raw.get("driver", "systemd"),
                                  CGROUP_DRIVERS),
            "runtime": self.choice(f"{path}.runtime", raw.get("runtime", "containerd"),
                                   RUNTIMES),
        }
        pids: dict[int, str] = {}

        def claim_pids(p: str, items: Any) -> tuple[int, ...]:
            out = []
            for j, v in enumerate(self.sequence(p, items)):
                pid = self.integer(f"{p}[{j}]", v, minimum=1, maximum=U32_MAX)
                if pid in pids:
                    self.fail(f"{p}[{j}]", f"pid {pid} is also listed at {pids[pid]}")
                pids[pid] = f"{p}[{j}]"
                out.append(pid)
            return tuple(out)

        host = claim_pids(f"{path}.host_pids", raw.get("host_pids", []))
        pods: list[PodSpec] = []
        seen: dict[Any, str] = {}

        def unique(p: str, key: Any, what: str) -> None:
            if key in seen:
                self.fail(p, f"duplicate {what} (also {seen[key]})")
            seen[key] = p

        def container(cp: str, c: Any, scope: tuple[str, ...], seed: str,
                      gpus: tuple[GpuSpec, ...] | None = None) -> ContainerSpec:
            """A pod's container (``gpus`` given: it may hold devices) or one outside
            Kubernetes (the runtime defaults to docker); ``seed`` makes its default id."""
            self.keys(ContainerSpec, cp, c,
                      exclude=("image",) if gpus is not None else ("devices",))
            cname = self.k8s_name(f"{cp}.name", c["name"])
            unique(cp, (*scope, cname), f"container {cname}")
            if "id" in c:
                cid = self.string(f"{cp}.id", c["id"])
                if not _CONTAINER_ID.match(cid):
                    self.fail(f"{cp}.id", f"expected 64 lowercase hex digits, got {show(cid)}")
            else:  # hashlib (0.7 MiB with its C parts) only for a node with containers
                import hashlib

                cid = hashlib.sha256(f"{seed}{cname}".encode()).hexdigest()
            unique(f"{cp}.id", ("id", cid), f"container id {cid}")
            runtime = c.get("runtime", layout["runtime"] if gpus is not None else "docker")
            return ContainerSpec(
                name=cname, id=cid, pids=claim_pids(f"{cp}.pids", c.get("pids", [])),
                cgroup=self.choice(f"{cp}.cgroup", c.get("cgroup", layout["cgroup"]),
                                   CGROUP_VERSIONS),
                driver=self.choice(f"{cp}.driver", c.get("driver", layout["driver"]),
                                   CGROUP_DRIVERS),
                runtime=self.choice(f"{cp}.runtime", runtime, RUNTIMES),
                devices=(self.kubelet_devices(f"{cp}.devices", c.get("devices", []), gpus)
                         if gpus is not None else ()),
                image=self.image(f"{cp}.image", c["image"]) if "image" in c else "")

        for i, item in enumerate(self.sequence(f"{path}.pods", raw.get("pods", []))):
            p = f"{path}.pods[{i}]"
            self.keys(PodSpec, p, item)
            namespace = self.k8s_name(f"{p}.namespace", item["namespace"])
            name = self.k8s_name(f"{p}.name", item["name"])
            unique(p, ("pod", namespace, name), f"pod {namespace}/{name}")
            if "uid" in item:
                uid = self.string(f"{p}.uid", item["uid"])
                if not _POD_UID.match(uid):
                    self.fail(f"{p}.uid", f"expected a pod UID (a lowercase UUID, or 32 hex "
                                          f"digits for a static pod), got {show(uid)}")
            else:
                uid = str(uuid5(f"{scenario}/{namespace}/{name}"))
            unique(f"{p}.uid", ("uid", uid), f"pod uid {uid}")
            containers = [
                container(f"{p}.containers[{j}]", c, ("container", uid), f"{uid}/",
                          gpus=gpus)
                for j, c in enumerate(self.sequence(f"{p}.containers", item.get("containers", [])))]
            pods.append(PodSpec(namespace, name, uid,
                                self.choice(f"{p}.qos", item.get("qos", "burstable"), QOS_CLASSES),
                                tuple(containers)))
        outside = [container(f"{path}.containers[{j}]", c, ("outside",), f"{scenario}/")
                   for j, c in enumerate(self.sequence(f"{path}.containers",
                                                       raw.get("containers", [])))]
        return NodeSpec(tuple(pods), host, containers=tuple(outside),
                        idle_threshold=(self.idle_threshold(f"{path}.idle_threshold",
                                                            raw["idle_threshold"])
                                        if "idle_threshold" in raw else None),
                        **layout)

    def idle_threshold(self, path: str, raw: Any) -> float:
        """A duration as the ``idle_threshold`` setting takes it (``30s``, ``2m``, seconds),
        in the setting's range."""
        try:
            return IDLE_THRESHOLD(raw)
        except ValueError as exc:
            self.fail(path, str(exc))
