"""The pods phase: the fake kubelet gives the GPU to one pod, then to two time-sliced pods;
a fake node's ``/proc`` and kubelet log directories place the GPU's processes in them."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.device_check.collector import Collector, index_of, one, parse
from benchmarks.device_check.compare import Snapshot, value_text
from benchmarks.device_check.load import Load, new_pid
from benchmarks.device_check.reader import Reader
from benchmarks.device_check.results import Options, Result, Row

NAMESPACE = "device-check"


@dataclass
class PodPlan:
    name: str
    uid: str
    container_id: str
    pids: tuple[int, ...]
    device_id: str


def write_tree(root: Path, plans: list[PodPlan]) -> None:
    """The fake node's /proc cgroup files and kubelet log directories for ``plans``."""
    from otel_gpu.sim.node import write_node
    from otel_gpu.sim.scenario.model import ContainerSpec, NodeSpec, PodSpec

    pods = tuple(PodSpec(namespace=NAMESPACE, name=p.name, uid=p.uid, qos="burstable",
                         containers=(ContainerSpec(name="main", id=p.container_id,
                                                   pids=p.pids),))
                 for p in plans)
    write_node(NodeSpec(pods=pods), root)


def plan(name: str, pids: tuple[int, ...], device_id: str) -> PodPlan:
    seed = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"otel-gpu-device-check/{name}")
    return PodPlan(name, str(seed), (seed.hex * 2)[:64], pids, device_id)


def pod_rows(phase: str, snap: Snapshot, plans: list[PodPlan], uuid: str,
             procs: dict[int, int], shares: dict[str, float] | None
             ) -> tuple[list[Row], set[tuple[str, tuple]]]:
    """Labels, allocations, per-pod memory and processes, energy rule and kubelet counts."""
    rows, used = [], set()
    index = index_of(snap.samples)
    gpu = str(snap.reference[uuid].get("index"))

    def mark(family: str, lab: dict[str, str]) -> None:
        used.add((family, tuple(sorted(lab.items()))))

    def key(lab: dict[str, str]) -> str | None:
        return lab.get("k8s_pod_name") or None

    exclusive = len(plans) == 1
    owner = [key(lab) for lab, _ in index.get("hw_gpu_memory_usage_bytes", [])
             if lab.get("hw_id") == uuid]
    want_owner = plans[0].name if exclusive else None
    rows.append(Row(phase, "hw_gpu_memory_usage_bytes", gpu, "k8s_pod_name label", owner,
                    [want_owner], "the pod holding it whole (none when shared)",
                    owner == [want_owner], source="kubelet"))
    if exclusive:
        uid = [lab.get("k8s_pod_uid") for lab, _ in index.get("hw_power_watts", [])
               if lab.get("hw_id") == uuid]
        rows.append(Row(phase, "hw_power_watts", gpu, "k8s_pod_uid label", uid, [plans[0].uid],
                        "the pod's UID from its log directory", uid == [plans[0].uid],
                        source="kubelet log directories"))
    allocs = {}
    for lab, value in index.get("nvidia_gpu_k8s_allocation", []):
        mark("nvidia_gpu_k8s_allocation", lab)
        if lab.get("hw_id") == uuid:
            allocs[key(lab)] = value
    rows.append(Row(phase, "nvidia_gpu_k8s_allocation", gpu, "pods", sorted(allocs),
                    sorted(p.name for p in plans), "one series at 1 per pod",
                    allocs == {p.name: 1.0 for p in plans}, source="kubelet"))
    memory, count, sm = {}, {}, {}
    for family, into in (("nvidia_gpu_k8s_memory_usage_bytes", memory),
                         ("nvidia_gpu_k8s_processes", count),
                         ("nvidia_gpu_k8s_sm_utilization", sm)):
        for lab, value in index.get(family, []):
            if lab.get("hw_id") == uuid:
                mark(family, lab)
                into[key(lab)] = value
    for p in plans:
        want = sum(procs.get(pid, 0) for pid in p.pids)
        rows.append(Row(phase, "nvidia_gpu_k8s_memory_usage_bytes", gpu, p.name,
                        memory.get(p.name), want, "exact: NVML's per-process memory, summed",
                        memory.get(p.name) == want))
        alive = sum(1 for pid in p.pids if pid in procs)
        rows.append(Row(phase, "nvidia_gpu_k8s_processes", gpu, p.name, count.get(p.name),
                        alive, "exact", count.get(p.name) == alive))
        if shares is not None:
            share = sum(shares.get(str(pid), [0.0])[0] for pid in p.pids)
            got = sm.get(p.name)
            rows.append(Row(phase, "nvidia_gpu_k8s_sm_utilization", gpu, p.name,
                            value_text(got), round(share, 3), "±0.3 (another window)",
                            got is not None and abs(got - share) <= 0.3))
    rules = [lab.get("nvidia_gpu_energy_rule") for lab, v in
             index.get("nvidia_gpu_k8s_energy_rule", []) if lab.get("hw_id") == uuid and v == 1]
    for lab, _ in index.get("nvidia_gpu_k8s_energy_rule", []):
        mark("nvidia_gpu_k8s_energy_rule", lab)
    if exclusive:
        want_rules = ["exclusive"]
    elif shares is not None:  # NVML answers per-process shares (none: nothing ran)
        want_rules = ["sm_share"]
    else:
        want_rules = ["unattributed"]  # shared, and NVML gives no per-process shares
    rows.append(Row(phase, "nvidia_gpu_k8s_energy_rule", gpu, "rule", rules, want_rules,
                    "the rule the allocation implies", rules == want_rules, source="kubelet"))
    for family, want in (("otel_gpu_kubelet_pods", len(plans)), ("otel_gpu_kubelet_devices", 1),
                         ("otel_gpu_kubelet_unresolved_ids", 0)):
        got = one(snap.samples, family)
        used.add((family, ()))
        rows.append(Row(phase, family, "-", "-", got, want, "exact", got == want,
                        source="kubelet"))
    allocated = {lab.get("nvidia_gpu_k8s_resource"): v
                 for lab, v in index.get("nvidia_gpu_k8s_allocated", [])}
    for lab, _ in index.get("nvidia_gpu_k8s_allocated", []):
        mark("nvidia_gpu_k8s_allocated", lab)
    rows.append(Row(phase, "nvidia_gpu_k8s_allocated", "-", "nvidia.com/gpu",
                    allocated.get("nvidia.com/gpu"), len(plans), "exact",
                    allocated.get("nvidia.com/gpu") == len(plans), source="kubelet"))
    return rows, used


def pods_ready(plans: list[PodPlan], uuid: str) -> Callable[[str], bool]:
    """A body where the collector has joined every pod: allocations and usage rows."""
    def ready(body: str) -> bool:
        index = index_of(parse(body))
        allocs = {lab.get("k8s_pod_name") for lab, _ in index.get("nvidia_gpu_k8s_allocation", [])
                  if lab.get("hw_id") == uuid}
        # a pod the kubelet names has a zero row until its processes are mapped to it
        usage = {lab.get("k8s_pod_name") for lab, v in
                 index.get("nvidia_gpu_k8s_memory_usage_bytes", [])
                 if lab.get("hw_id") == uuid and v > 0}
        names = {p.name for p in plans}
        return names <= allocs and names <= usage and allocs <= names
    return ready


def run_pods(result: Result, opts: Options, collector: Collector, reader: Reader,
             kubelet: Any, node: Path, uuid: str, pids: list[int], loads: list[Load],
             phase: Callable[..., Snapshot]) -> None:
    """One pod holding the GPU whole, then two pods time-slicing it."""
    from testkit.kubelet import container, devices, pod

    sim = bool(opts.simulate)

    def apply(plans: list[PodPlan]) -> None:
        write_tree(node, plans)
        kubelet.set_pods([pod(p.name, container("main", devices("nvidia.com/gpu", p.device_id)),
                              namespace=NAMESPACE) for p in plans])

    def extra(plans: list[PodPlan], name: str) -> Callable[[Snapshot], tuple[list[Row], set]]:
        def rows(snap: Snapshot) -> tuple[list[Row], set]:
            at = int(snap.count) if sim else None
            procs = reader.ask("procs", sample=at).get(uuid)
            table = {int(pid): int(mem or 0) for pid, mem in procs} \
                if isinstance(procs, list) else {}
            shares = reader.ask("proc_util", sample=at, index=snap.reference[uuid]["index"],
                                seconds=max(2 * opts.interval, 1.0))
            if "error_code" in shares:  # NOT_FOUND: nothing ran since then, every share 0
                shares = {} if "Not Found" in shares["error_code"] else None
            return pod_rows(name, snap, plans, uuid, table, shares)
        return rows

    one = [plan("check-a", (pids[0],), uuid)]
    # a process never changes pods: every known one is placed in its final pod from the
    # start (the kubelet lists the second pod only in the time-sliced phase)
    write_tree(node, [*one, *([plan("check-b", (pids[1],), "")] if len(pids) > 1 else [])])
    kubelet.set_pods([pod(one[0].name, container("main", devices("nvidia.com/gpu", uuid)),
                          namespace=NAMESPACE)])
    moving = bool(loads)  # the throttle reasons move under load
    phase("pods-1", extra=extra(one, "pods-1"), until=pods_ready(one, uuid), held=uuid,
          flags_move=moving)
    if len(pids) < 2 and loads:
        known = set(pids)
        loads.append(Load(opts.load_seconds, opts.load_gib))
        loads[-1].wait_ready()
        pids.append(new_pid(reader, uuid, known))
    if len(pids) < 2:
        result.note("pods: one GPU process only: the time-sliced phase is skipped")
        return
    two = [plan("check-a", (pids[0],), f"{uuid}::0"), plan("check-b", (pids[1],), f"{uuid}::1")]
    apply(two)
    phase("pods-2", extra=extra(two, "pods-2"), until=pods_ready(two, uuid), held=uuid,
          flags_move=moving)
