"""A fake kubelet Pod Resources server for tests: real gRPC on a real unix socket.

The server is the simulator's (:mod:`otel_gpu.sim.kubelet`, which ``--simulate``
runs for a scenario with pods); here it is fed the API's generated messages. It
serves the project's own schema (``v1`` List, GetAllocatableResources and
Get; ``v1alpha1`` List) from data a test can change at any time (setters are
thread-safe), counts calls per RPC, and can misbehave on request: answer v1
with UNIMPLEMENTED (a pre-1.20 kubelet), fail the next N calls with a given
status, answer the next N calls with bytes that are not the reply's protobuf
(:meth:`FakeKubelet.corrupt_next`), or stop (removing the socket) and start
again on the same path like a restarting kubelet.

Library use::

    from testkit.kubelet import FakeKubelet, pod, container, devices

    with FakeKubelet() as kubelet:
        kubelet.set_pods([pod("train", container("main", devices("nvidia.com/gpu", "GPU-...")))])
        watcher = PodResourcesWatcher(kubelet.socket_path)

Manual use (reload the scenario with SIGHUP, stop with SIGINT/SIGTERM)::

    python -m testkit.kubelet --socket /tmp/kl/kubelet.sock --scenario pods.yaml

(from the repository root).

Scenario YAML::

    v1_unimplemented: false           # optional
    pods:
      - name: train
        namespace: default            # optional
        containers:
          - name: main
            cpu_ids: [0, 1]           # optional
            devices:
              - {resource: nvidia.com/gpu, ids: [GPU-...], numa: [0]}
            claims:                   # optional, DRA
              - name: gpu-claim
                namespace: default
                devices: [{driver: gpu.nvidia.com, pool: node-1, device: gpu-0}]
    allocatable:
      - {resource: nvidia.com/gpu, ids: [GPU-...], numa: [0]}
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.attribute.k8s.kubelet_answer import Allocation, PodResourcesState
from otel_gpu.sim.kubelet import (
    RPCS,
    V1_ALLOCATABLE,
    V1_GET,
    V1_LIST,
    V1ALPHA1_LIST,
    KubeletServer,
)
from otel_gpu.snapshot import KubeletStats
from testkit.process import wait_until

__all__ = [
    "RPCS",
    "V1_ALLOCATABLE",
    "V1_GET",
    "V1_LIST",
    "V1ALPHA1_LIST",
    "FakeKubelet",
    "FakePodSource",
    "claim",
    "claim_device",
    "container",
    "devices",
    "pod",
    "pods_from_scenario",
]

RATE_LIMITED = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
CORRUPT = b"\x0a\xff\xff\xff\xff\x0f\x01"
"""Field 1 (pod_resources), length-delimited, with a length far past the message's end:
no protobuf parser accepts it."""

# --------------------------------------------------------------------------- builders


def devices(
    resource_name: str, *device_ids: str, numa: int | Sequence[int] | None = None
) -> v1_pb2.ContainerDevices:
    """A ``ContainerDevices`` entry; ``numa`` unset means no topology at all."""
    msg = v1_pb2.ContainerDevices(resource_name=resource_name, device_ids=list(device_ids))
    if numa is not None:
        nodes = [numa] if isinstance(numa, int) else list(numa)
        msg.topology.SetInParent()  # present even with no nodes
        msg.topology.nodes.extend(v1_pb2.NUMANode(ID=n) for n in nodes)
    return msg


def claim_device(
    device_name: str,
    *,
    driver: str = "gpu.nvidia.com",
    pool: str = "node-1",
    cdi: Iterable[str] = (),
    share_id: str | None = None,
) -> v1_pb2.ClaimResource:
    msg = v1_pb2.ClaimResource(
        driver_name=driver,
        pool_name=pool,
        device_name=device_name,
        cdi_devices=[v1_pb2.CDIDevice(name=n) for n in cdi],
    )
    if share_id is not None:
        msg.share_id = share_id
    return msg


def claim(
    claim_name: str, *resources: v1_pb2.ClaimResource, namespace: str = "default"
) -> v1_pb2.DynamicResource:
    return v1_pb2.DynamicResource(
        claim_name=claim_name, claim_namespace=namespace, claim_resources=list(resources)
    )


def container(
    name: str,
    *devs: v1_pb2.ContainerDevices,
    cpu_ids: Iterable[int] = (),
    claims: Iterable[v1_pb2.DynamicResource] = (),
) -> v1_pb2.ContainerResources:
    return v1_pb2.ContainerResources(
        name=name, devices=list(devs), cpu_ids=list(cpu_ids), dynamic_resources=list(claims)
    )


def pod(
    name: str, *containers: v1_pb2.ContainerResources, namespace: str = "default"
) -> v1_pb2.PodResources:
    return v1_pb2.PodResources(name=name, namespace=namespace, containers=list(containers))


def _to_v1alpha1(pods: Sequence[v1_pb2.PodResources]) -> v1alpha1_pb2.ListPodResourcesResponse:
    """What an old kubelet would say: devices only."""
    out = v1alpha1_pb2.ListPodResourcesResponse()
    for p in pods:
        ap = out.pod_resources.add(name=p.name, namespace=p.namespace)
        for c in p.containers:
            ac = ap.containers.add(name=c.name)
            for d in c.devices:
                ac.devices.add(resource_name=d.resource_name, device_ids=list(d.device_ids))
    return out


# --------------------------------------------------------------------------- pod source


class FakePodSource:
    """A :class:`~otel_gpu.attribute.k8s.source.PodSource` answering what the test says,
    for the pod stage's tests that need no gRPC: ``FakePodSource(allocation, ...)``, then
    :meth:`answer` for the kubelet's next answer (a new state object, as the poller makes)."""

    def __init__(self, *allocations: Allocation, state: PodResourcesState | None = None,
                 stats: KubeletStats | None = None) -> None:
        self._state = state if state is not None else self._new(allocations)
        self.stats = stats if stats is not None else KubeletStats()
        self.polls = 0
        self.started = False

    @staticmethod
    def _new(allocations: Iterable[Allocation], taken: float = 1.0) -> PodResourcesState:
        return PodResourcesState(tuple(allocations), None, taken, "v1")

    @property
    def state(self) -> PodResourcesState | None:
        return self._state

    @state.setter
    def state(self, state: PodResourcesState | None) -> None:
        self._state = state

    def answer(self, *allocations: Allocation, taken: float = 2.0) -> PodResourcesState:
        self._state = self._new(allocations, taken)
        return self._state

    def poll_once(self) -> bool:
        self.polls += 1
        return self._state is not None

    def start(self) -> None:
        self.started = True

    def stop(self, timeout: float = 2.0) -> None:
        self.started = False

    def problem(self) -> str | None:
        return None


# --------------------------------------------------------------------------- server


class FakeKubelet(KubeletServer):
    """The simulator's Pod Resources server (:class:`otel_gpu.sim.kubelet.KubeletServer`),
    scripted by the test with the API's own messages: :meth:`set_pods` and
    :meth:`set_allocatable` take the generated stubs' messages (claims, CPUs, topology)."""

    def set_pods(self, pods: Iterable[v1_pb2.PodResources]) -> None:
        """Replace what List and Get answer (serialised once, here)."""
        pods = tuple(pods)
        v1 = v1_pb2.ListPodResourcesResponse(pod_resources=list(pods)).SerializeToString()
        alpha = _to_v1alpha1(pods).SerializeToString()
        self.set_replies(v1, alpha, {(p.namespace, p.name): p.SerializeToString() for p in pods})

    def set_allocatable(
        self, devs: Iterable[v1_pb2.ContainerDevices], cpu_ids: Iterable[int] = ()
    ) -> None:
        self.set_allocatable_reply(v1_pb2.AllocatableResourcesResponse(
            devices=list(devs), cpu_ids=list(cpu_ids)).SerializeToString())

    def corrupt_next(self, n: int, payload: bytes = CORRUPT, rpc: str | None = None) -> None:
        super().corrupt_next(n, payload, rpc)

    def wait_for_calls(self, rpc: str, at_least: int, timeout: float = 10.0) -> bool:
        """Wait until ``rpc`` has been called ``at_least`` times; fail at the deadline."""
        return bool(
            wait_until(lambda: self.calls[rpc] >= at_least, timeout, f"{at_least} {rpc} call(s)")
        )

    def restart(self, gap: float = 0.0) -> None:
        """Stop, stay down ``gap`` seconds, start again on the same path."""
        self.stop()
        if gap:
            time.sleep(gap)  # the kubelet's downtime, not a wait for an event
        self.start()

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self


# --------------------------------------------------------------------------- scenarios


def _devices_from(entries: Iterable[dict[str, Any]]) -> list[v1_pb2.ContainerDevices]:
    return [devices(e["resource"], *e.get("ids", ()), numa=e.get("numa")) for e in entries]


def pods_from_scenario(data: dict[str, Any]) -> list[v1_pb2.PodResources]:
    """Pods from a scenario mapping (see the module docstring for the layout)."""
    pods = []
    for p in data.get("pods") or ():
        containers = []
        for c in p.get("containers") or ():
            claims = [
                claim(
                    cl["name"],
                    *(
                        claim_device(
                            d["device"],
                            driver=d.get("driver", "gpu.nvidia.com"),
                            pool=d.get("pool", "node-1"),
                            share_id=d.get("share_id"),
                        )
                        for d in cl.get("devices") or ()
                    ),
                    namespace=cl.get("namespace", p.get("namespace", "default")),
                )
                for cl in c.get("claims") or ()
            ]
            containers.append(
                container(
                    c["name"],
                    *_devices_from(c.get("devices") or ()),
                    cpu_ids=c.get("cpu_ids") or (),
                    claims=claims,
                )
            )
        pods.append(pod(p["name"], *containers, namespace=p.get("namespace", "default")))
    return pods


def _load(kubelet: FakeKubelet, path: Path) -> None:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    kubelet.set_pods(pods_from_scenario(data))
    kubelet.set_allocatable(_devices_from(data.get("allocatable") or ()))
    kubelet.set_v1_unimplemented(bool(data.get("v1_unimplemented", False)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake kubelet Pod Resources API.")
    parser.add_argument("--socket", required=True, help="unix socket path (< 108 bytes)")
    parser.add_argument("--scenario", type=Path, help="YAML file; SIGHUP reloads it")
    args = parser.parse_args(argv)

    kubelet = FakeKubelet(args.socket)
    if args.scenario:
        _load(kubelet, args.scenario)
    done = threading.Event()
    reload = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: reload.set())
    kubelet.start()
    print(f"fake kubelet serving on {kubelet.socket_path}", flush=True)
    while not done.wait(0.2):
        if reload.is_set():
            reload.clear()
            if args.scenario:
                _load(kubelet, args.scenario)
                print(f"reloaded {args.scenario}", flush=True)
    kubelet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
