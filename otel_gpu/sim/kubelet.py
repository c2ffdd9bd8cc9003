"""A fake kubelet: the Pod Resources API served over real gRPC on a unix socket.

``--simulate`` with a scenario that has pods serves their allocations here
(:func:`scenario_pods`, :func:`~otel_gpu.sim.node.run_node`), and the tests'
fake kubelet (``tests/support/kubelet.py``) is this server scripted by the
test: it sets the replies, injects failures (a status for the next calls, bytes
that are not the reply's protobuf, UNIMPLEMENTED for v1 like a kubelet before
1.20, a slow List) and counts the calls.

The simulator stands on the shared modules only, so it cannot use the API's
generated stubs (they belong to the attribution stage): the few messages a
kubelet answers are written here in protobuf's wire format, field numbers as
in ``proto/kubelet/podresources``, and the server hands back the bytes as
they are (a test's stubs may make them instead).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from otel_gpu.sim.scenario import GpuSpec, KubeletDevice, NodeSpec

V1_LIST = "v1/List"
V1_ALLOCATABLE = "v1/GetAllocatableResources"
V1_GET = "v1/Get"
V1ALPHA1_LIST = "v1alpha1/List"
RPCS = (V1_LIST, V1_ALLOCATABLE, V1_GET, V1ALPHA1_LIST)
MAX_SOCKET_PATH = 107
"""Bytes in a unix socket path, at most (108 with the terminating NUL)."""

# --------------------------------------------------------------------------- wire format


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields: negative numbers as ten bytes, as protobuf does
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes, message)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode()) if value else b""


def _strings(data: bytes) -> dict[int, str]:
    """The string fields of a small message (a Get request), by number; others skipped."""
    out: dict[int, str] = {}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            _, i = _read_varint(data, i)
        elif kind == 2:
            size, i = _read_varint(data, i)
            out[number] = data[i:i + size].decode("utf-8", "replace")
            i += size
        elif kind in (1, 5):
            i += 8 if kind == 1 else 4
        else:
            break
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while i < len(data):
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return value, i


@dataclass(frozen=True)
class Devices:
    """``ContainerDevices``: one resource's device ids, with their NUMA nodes (None: no
    topology at all)."""

    resource: str
    ids: tuple[str, ...]
    numa: tuple[int, ...] | None = None

    def encode(self, *, topology: bool = True) -> bytes:
        out = _text(1, self.resource) + b"".join(_text(2, i) for i in self.ids)
        if topology and self.numa is not None:
            nodes = b"".join(_field(1, _varint(1 << 3 | 0) + _varint(n)) for n in self.numa)
            out += _field(3, nodes)
        return out


@dataclass(frozen=True)
class Container:
    name: str
    devices: tuple[Devices, ...] = ()

    def encode(self, *, topology: bool = True) -> bytes:
        return _text(1, self.name) + b"".join(
            _field(2, d.encode(topology=topology)) for d in self.devices)


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    containers: tuple[Container, ...] = ()

    def encode(self, *, topology: bool = True) -> bytes:
        return _text(1, self.name) + _text(2, self.namespace) + b"".join(
            _field(3, c.encode(topology=topology)) for c in self.containers)


def list_reply(pods: Iterable[Pod], *, v1alpha1: bool = False) -> bytes:
    """``ListPodResourcesResponse`` (v1alpha1's has no topology)."""
    return b"".join(_field(1, p.encode(topology=not v1alpha1)) for p in pods)


def allocatable_reply(devices: Iterable[Devices]) -> bytes:
    """``AllocatableResourcesResponse`` with devices only."""
    return b"".join(_field(1, d.encode()) for d in devices)


# --------------------------------------------------------------------------- from a scenario


def _grouped(devices: Sequence[KubeletDevice]) -> tuple[Devices, ...]:
    """One ``ContainerDevices`` per resource name, in the order they first appear."""
    by_resource: dict[str, list[KubeletDevice]] = {}
    for d in devices:
        by_resource.setdefault(d.resource, []).append(d)
    out = []
    for resource, items in by_resource.items():
        numa = sorted({d.numa for d in items if d.numa is not None})
        out.append(Devices(resource, tuple(d.id for d in items),
                           tuple(numa) if numa else None))
    return tuple(out)


def scenario_pods(node: NodeSpec) -> tuple[Pod, ...]:
    """The pods of a scenario's ``node`` as the kubelet lists them."""
    return tuple(Pod(p.name, p.namespace,
                     tuple(Container(c.name, _grouped(c.devices)) for c in p.containers))
                 for p in node.pods)


def scenario_allocatable(node: NodeSpec, gpus: Sequence[GpuSpec]) -> tuple[Devices, ...]:
    """What the device plugin advertises: each MIG instance, each time-sliced GPU's
    replicas (as many as the pods use, at least one), each other GPU whole."""
    replicas: dict[int, int] = {}
    for pod in node.pods:
        for container in pod.containers:
            for d in container.devices:
                if d.replica is not None:
                    replicas[d.gpu] = max(replicas.get(d.gpu, 0), d.replica + 1)
    out: list[KubeletDevice] = []
    for k, gpu in enumerate(gpus):
        if gpu.mig:
            out += [KubeletDevice(k, None, m.gpu_instance_id, f"nvidia.com/mig-{m.profile}",
                                  m.uuid, gpu.numa_node) for m in gpu.mig]
        elif k in replicas:
            out += [KubeletDevice(k, r, None, "nvidia.com/gpu", f"{gpu.uuid}::{r}",
                                  gpu.numa_node) for r in range(replicas[k])]
        else:
            out.append(KubeletDevice(k, None, None, "nvidia.com/gpu", gpu.uuid, gpu.numa_node))
    return tuple(Devices(d.resource, (d.id,), None if d.numa is None else (d.numa,))
                 for d in out)  # one entry per device, with its own NUMA node


# --------------------------------------------------------------------------- server


class KubeletServer:
    """A Pod Resources server on a unix socket, answering the replies it is given.

    Without ``socket_path`` it makes a short directory under the temporary
    directory (unix socket paths are limited to 108 bytes) and removes it on
    :meth:`close`.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, workers: int = 8,
                 *, temp_dir: str | None = None) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(dir=temp_dir or _short_temp(), prefix="kl")
            socket_path = os.path.join(self._own_dir, "kubelet.sock")
        self.socket_path = os.fspath(socket_path)
        if len(self.socket_path.encode()) > MAX_SOCKET_PATH:
            raise ValueError(f"unix socket path too long: {self.socket_path}")
        self._workers = workers
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._v1_reply = b""
        self._v1alpha1_reply = b""
        self._allocatable_reply = b""
        self._get_replies: Mapping[tuple[str, str], bytes] = {}
        self._calls: dict[str, int] = dict.fromkeys(RPCS, 0)
        self._failures: list[tuple[str | None, grpc.StatusCode, str]] = []
        self._corrupt: list[tuple[str | None, bytes]] = []
        self.v1_unimplemented = False
        self.allocatable_unimplemented = False
        self.get_enabled = True
        self.list_delay = 0.0
        """Seconds each List waits before answering (to test deadlines)."""

    # ------------------------------------------------------------------ data

    def set_replies(self, v1_list: bytes, v1alpha1_list: bytes,
                    pods: Mapping[tuple[str, str], bytes]) -> None:
        """What List (v1, v1alpha1) answers, and each pod's ``PodResources`` by (namespace,
        name) for Get."""
        with self._lock:
            self._v1_reply, self._v1alpha1_reply = v1_list, v1alpha1_list
            self._get_replies = dict(pods)

    def serve_pods(self, pods: Iterable[Pod]) -> None:
        """Answer List and Get with ``pods``."""
        pods = tuple(pods)
        self.set_replies(list_reply(pods), list_reply(pods, v1alpha1=True),
                         {(p.namespace, p.name): p.encode() for p in pods})

    def set_allocatable_reply(self, reply: bytes) -> None:
        with self._lock:
            self._allocatable_reply = reply

    def set_v1_unimplemented(self, value: bool = True) -> None:
        """Answer every v1 RPC with UNIMPLEMENTED, like a kubelet before 1.20."""
        with self._lock:
            self.v1_unimplemented = value

    def fail_next(self, n: int, code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED,
                  details: str = "rejected by rate limit", rpc: str | None = None) -> None:
        """Fail the next ``n`` calls (of ``rpc``, or any) with ``code``."""
        with self._lock:
            self._failures.extend([(rpc, code, details)] * n)

    def corrupt_next(self, n: int, payload: bytes, rpc: str | None = None) -> None:
        """Answer the next ``n`` calls (of ``rpc``, or any) with ``payload`` as the reply's
        bytes, sent as they are: a kubelet (or something in between) that speaks garbage."""
        with self._lock:
            self._corrupt.extend([(rpc, payload)] * n)

    def pending_failures(self) -> int:
        with self._lock:
            return len(self._failures)

    # ------------------------------------------------------------------ counters

    @property
    def calls(self) -> dict[str, int]:
        """Calls received per RPC (``v1/List`` ...), failed ones included."""
        with self._lock:
            return dict(self._calls)

    def total_calls(self) -> int:
        with self._lock:
            return sum(self._calls.values())

    def reset_calls(self) -> None:
        with self._lock:
            self._calls = dict.fromkeys(RPCS, 0)

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> KubeletServer:
        if self._server is not None:
            return self
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket from a "crashed" kubelet
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers),
                             options=[("grpc.max_send_message_length", -1)])

        def unary(handler: Callable[[bytes, grpc.ServicerContext], bytes]) -> Any:
            return grpc.unary_unary_rpc_method_handler(handler)  # bytes in, bytes out

        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
                "List": unary(self._v1_list),
                "GetAllocatableResources": unary(self._v1_allocatable),
                "Get": unary(self._v1_get),
            }),
            grpc.method_handlers_generic_handler("v1alpha1.PodResourcesLister", {
                "List": unary(self._v1alpha1_list),
            }),
        ))
        server.add_insecure_port("unix:" + self.socket_path)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket, as a kubelet going down does."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def close(self) -> None:
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> KubeletServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ handlers

    def _enter(self, rpc: str, context: grpc.ServicerContext) -> None:
        """Count the call, then apply injected failures (abort raises)."""
        with self._lock:
            self._calls[rpc] += 1
            failure = None
            for i, (target, code, details) in enumerate(self._failures):
                if target is None or target == rpc:
                    failure = (code, details)
                    del self._failures[i]
                    break
            unimplemented = self.v1_unimplemented and rpc.startswith("v1/")
        if unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown service {rpc}")
        if failure is not None:
            context.abort(*failure)

    def _reply(self, rpc: str, reply: bytes) -> bytes:
        with self._lock:
            for i, (target, payload) in enumerate(self._corrupt):
                if target is None or target == rpc:
                    del self._corrupt[i]
                    return payload
        return reply

    def _listed(self, rpc: str, context: grpc.ServicerContext, v1alpha1: bool) -> bytes:
        self._enter(rpc, context)
        if self.list_delay:
            time.sleep(self.list_delay)  # a slow kubelet, as the test asked
        with self._lock:
            reply = self._v1alpha1_reply if v1alpha1 else self._v1_reply
        return self._reply(rpc, reply)

    def _v1_list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._listed(V1_LIST, context, v1alpha1=False)

    def _v1alpha1_list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._listed(V1ALPHA1_LIST, context, v1alpha1=True)

    def _v1_allocatable(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._enter(V1_ALLOCATABLE, context)
        if self.allocatable_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetAllocatableResources disabled")
        with self._lock:
            reply = self._allocatable_reply
        return self._reply(V1_ALLOCATABLE, reply)

    def _v1_get(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._enter(V1_GET, context)
        if not self.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        asked = _strings(request)
        name, namespace = asked.get(1, ""), asked.get(2, "")
        with self._lock:
            found = self._get_replies.get((namespace, name))
        if found is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {namespace}/{name} not found")
        return _field(1, found or b"")


def _short_temp() -> str:
    """``/tmp`` where it exists (the system's temporary directory may be long on macOS)."""
    return "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
