"""Kubelet Pod Resources client: one background poller, lock-free readers.

The kubelet rate-limits its pod-resources socket with one token bucket shared
by every agent on the node, and a List reply can be megabytes on a busy node.
So the collector never asks on a scrape: a daemon thread polls ``List`` on a
long-lived channel, converts the reply into an immutable
:class:`PodResourcesState` and swaps it in with one attribute assignment.
Readers (scrapes, instrument callbacks) only read :attr:`PodResourcesWatcher.state`.

Failure handling, in short: an absent socket is logged once and checked again
every interval; RPC failures back off exponentially with full jitter; the last
good state outlives failures for a grace period (a kubelet restart must not
churn series) and is then dropped; an old kubelet that answers v1 with
UNIMPLEMENTED is asked v1alpha1 from then on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random as _random
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import grpc

from otel_gpu._log import LogLimiter
from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.snapshot import KubeletStats

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "EMPTY_STATE",
    "RPC_METHODS",
    "AllocatableDevice",
    "Allocation",
    "PodResourcesState",
    "PodResourcesWatcher",
    "KubeletStats",
    "allocatable_from_v1",
    "allocations_from_v1",
    "allocations_from_v1alpha1",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""Receive limit; gRPC's own 4 MiB default is too small for busy nodes."""

V1_LIST = "v1/List"
V1_ALLOCATABLE = "v1/GetAllocatableResources"
V1ALPHA1_LIST = "v1alpha1/List"
RPC_METHODS: Mapping[str, str] = MappingProxyType(
    {
        V1_LIST: "/v1.PodResourcesLister/List",
        V1_ALLOCATABLE: "/v1.PodResourcesLister/GetAllocatableResources",
        V1ALPHA1_LIST: "/v1alpha1.PodResourcesLister/List",
    }
)
"""Short rpc names used in :class:`KubeletStats`, and the gRPC paths they call."""


@dataclass(frozen=True)
class Allocation:
    """One device held by one container.

    There is one per (pod, container, resource, device id): the API repeats a
    device once per NUMA node it reports, and those are merged here. For a
    DRA device ``resource_name`` and ``driver`` are the driver name and
    ``device_id`` the DRA device name.
    """

    pod: str
    namespace: str
    container: str
    resource_name: str
    device_id: str
    numa_nodes: tuple[int, ...] = ()
    """Empty when the kubelet reported no topology."""
    cpu_ids: tuple[int, ...] = ()
    """The container's exclusive CPUs (static CPU manager only)."""
    claim_name: str | None = None
    claim_namespace: str | None = None
    driver: str | None = None
    pool: str | None = None
    share_id: str | None = None
    """Set when a DRA device is shared through consumable capacity."""


class AllocatableDevice(NamedTuple):
    """A device the kubelet could hand out, with its NUMA nodes (may be empty)."""

    resource_name: str
    device_id: str
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class PodResourcesState:
    """What the last successful poll saw. Never mutated; replaced whole.

    ``allocatable`` is ``None`` when unknown (v1alpha1 kubelet, the RPC not
    implemented, or not fetched yet), which is different from "nothing".
    """

    allocations: tuple[Allocation, ...] = ()
    allocatable: tuple[AllocatableDevice, ...] | None = None
    taken_monotonic: float | None = None
    source: str | None = None
    """``"v1"``, ``"v1alpha1"``, or ``None`` for the empty state."""
    pod_count: int = field(init=False, default=0)
    """Distinct pods holding at least one attributed device."""
    device_count: int = field(init=False, default=0)
    """Distinct (resource name, device id) pairs allocated."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "pod_count", len({(a.namespace, a.pod) for a in self.allocations})
        )
        object.__setattr__(
            self,
            "device_count",
            len({(a.resource_name, a.pool, a.device_id) for a in self.allocations}),
        )


EMPTY_STATE = PodResourcesState()


# --------------------------------------------------------------------------- conversion


def _numa_nodes(message: Any) -> tuple[int, ...]:
    # NUMA node 0 is an empty NUMANode message: presence of the topology
    # field and of each list entry is what counts, never the ID's truthiness.
    if not message.HasField("topology"):
        return ()
    return tuple(node.ID for node in message.topology.nodes)


def _build(merged: dict[tuple, tuple[dict[str, Any], set[int]]]) -> tuple[Allocation, ...]:
    return tuple(
        Allocation(numa_nodes=tuple(sorted(numa)), **fields) for fields, numa in merged.values()
    )


def allocations_from_v1(
    response: v1_pb2.ListPodResourcesResponse, accept: ResourceFilter
) -> tuple[Allocation, ...]:
    """Flatten a v1 List reply into deduplicated GPU allocations.

    Containers without accepted devices (finished pods, CPU-only containers)
    contribute nothing.
    """
    merged: dict[tuple, tuple[dict[str, Any], set[int]]] = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            if not c.devices and not c.dynamic_resources:
                continue
            cpu_ids = tuple(sorted(set(c.cpu_ids)))
            for dev in c.devices:
                rname = dev.resource_name
                if not dev.device_ids or not accept.accepts_resource(rname):
                    continue
                numa = _numa_nodes(dev)
                for device_id in dev.device_ids:
                    key = (pod.namespace, pod.name, c.name, rname, device_id)
                    entry = merged.get(key)
                    if entry is not None:
                        entry[1].update(numa)
                        continue
                    fields = {
                        "pod": pod.name,
                        "namespace": pod.namespace,
                        "container": c.name,
                        "resource_name": rname,
                        "device_id": device_id,
                        "cpu_ids": cpu_ids,
                    }
                    merged[key] = (fields, set(numa))
            for dyn in c.dynamic_resources:
                for res in dyn.claim_resources:
                    driver = res.driver_name
                    if not res.device_name or not accept.accepts_driver(driver):
                        continue
                    share_id = res.share_id if res.HasField("share_id") else None
                    key = (
                        pod.namespace, pod.name, c.name, driver, res.pool_name,
                        res.device_name, dyn.claim_namespace, dyn.claim_name, share_id,
                    )  # fmt: skip
                    if key in merged:
                        continue
                    fields = {
                        "pod": pod.name,
                        "namespace": pod.namespace,
                        "container": c.name,
                        "resource_name": driver,
                        "device_id": res.device_name,
                        "cpu_ids": cpu_ids,
                        "claim_name": dyn.claim_name or None,
                        "claim_namespace": dyn.claim_namespace or None,
                        "driver": driver,
                        "pool": res.pool_name or None,
                        "share_id": share_id,
                    }
                    merged[key] = (fields, set())
    return _build(merged)


def allocations_from_v1alpha1(
    response: v1alpha1_pb2.ListPodResourcesResponse, accept: ResourceFilter
) -> tuple[Allocation, ...]:
    """Flatten a v1alpha1 List reply (devices only: no NUMA, CPUs or DRA)."""
    merged: dict[tuple, tuple[dict[str, Any], set[int]]] = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                rname = dev.resource_name
                if not accept.accepts_resource(rname):
                    continue
                for device_id in dev.device_ids:
                    key = (pod.namespace, pod.name, c.name, rname, device_id)
                    if key not in merged:
                        fields = {
                            "pod": pod.name,
                            "namespace": pod.namespace,
                            "container": c.name,
                            "resource_name": rname,
                            "device_id": device_id,
                        }
                        merged[key] = (fields, set())
    return _build(merged)


def allocatable_from_v1(
    response: v1_pb2.AllocatableResourcesResponse, accept: ResourceFilter
) -> tuple[AllocatableDevice, ...]:
    """Accepted allocatable devices, one per (resource, id), NUMA nodes merged."""
    merged: dict[tuple[str, str], set[int]] = {}
    for dev in response.devices:
        if not accept.accepts_resource(dev.resource_name):
            continue
        numa = _numa_nodes(dev)
        for device_id in dev.device_ids:
            merged.setdefault((dev.resource_name, device_id), set()).update(numa)
    return tuple(
        AllocatableDevice(rname, device_id, tuple(sorted(numa)))
        for (rname, device_id), numa in merged.items()
    )


# --------------------------------------------------------------------------- watcher


def _code_of(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    try:
        value = code() if callable(code) else None
    except Exception:  # a bare RpcError carries nothing
        value = None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _details_of(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    try:
        text = details() if callable(details) else None
    except Exception:
        text = None
    return text or ""


class _Socket:
    ABSENT = "absent"
    PRESENT = "present"
    NOT_SOCKET = "not a socket"


class PodResourcesWatcher:
    """Polls the kubelet's Pod Resources API and publishes the result.

    ``start()`` runs :meth:`poll_once` on a daemon thread: every ``interval``
    seconds after a success, after an exponential backoff with full jitter
    (``backoff_base`` doubling up to ``backoff_cap``) after an RPC failure.
    ``GetAllocatableResources`` is asked every ``allocatable_every`` polls.
    ``clock`` (monotonic seconds) and ``random`` (uniform in [0, 1)) are
    injectable so tests can drive time and jitter.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        interval: float = 10.0,
        grace_period: float = 60.0,
        timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        allocatable_every: int = 6,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        resource_names: Iterable[str] = (),
        dra_drivers: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        log_interval: float = 60.0,
        on_update: Callable[[PodResourcesState], None] | None = None,
    ) -> None:
        if interval <= 0 or timeout <= 0 or backoff_base <= 0 or backoff_cap < backoff_base:
            raise ValueError("interval, timeout and backoff must be positive")
        if max_message_bytes < 4 * 1024 * 1024:
            raise ValueError("max_message_bytes below gRPC's 4 MiB default makes no sense")
        self.socket_path = os.fspath(socket_path)
        self.interval = float(interval)
        self.grace_period = float(grace_period)
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.allocatable_every = max(1, int(allocatable_every))
        self.backoff_base = float(backoff_base)
        self.backoff_cap = float(backoff_cap)
        self.accept = ResourceFilter(resource_names, dra_drivers)
        self._clock = clock
        self._random = random
        self._limiter = LogLimiter(log, log_interval, clock=clock)
        self._on_update = on_update

        # Published: (state, monotonic time failures started or None), one tuple
        # so a reader sees both from the same moment.
        self._current: tuple[PodResourcesState, float | None] = (EMPTY_STATE, None)
        # Poller-only state (guarded by _poll_lock).
        self._poll_lock = threading.Lock()
        self._changed: PodResourcesState | None = None
        self._channel: grpc.Channel | None = None
        self._calls: dict[str, Callable[..., Any]] = {}
        self._use_v1alpha1 = False
        self._allocatable_unimplemented = False
        self._allocatable: tuple[AllocatableDevice, ...] | None = None
        self._polls_until_allocatable = 0
        self._socket: str | None = None
        self._dropped_logged = False
        self._next_delay = 0.0
        # Self-metrics.
        self._stats_lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._failures = 0
        self._last_success: float | None = None
        # Thread.
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ readers

    @property
    def state(self) -> PodResourcesState:
        """The current state; empty once failures have outlasted the grace period.

        Lock-free and cheap: meant to be read on every scrape.
        """
        state, failing_since = self._current
        if (
            failing_since is not None
            and state is not EMPTY_STATE
            and self._clock() - failing_since >= self.grace_period
        ):
            return EMPTY_STATE
        return state

    @property
    def stats(self) -> KubeletStats:
        state = self.state
        with self._stats_lock:
            requests = dict(self._requests)
            failures = self._failures
            last = self._last_success
        return KubeletStats(
            requests=MappingProxyType(requests),
            last_success_monotonic=last,
            pods=state.pod_count,
            devices=state.device_count,
            source=state.source,
            consecutive_failures=failures,
            socket_present=None if self._socket is None else self._socket == _Socket.PRESENT,
        )

    @property
    def next_delay(self) -> float:
        """Seconds the thread waits after the last poll (interval or backoff)."""
        return self._next_delay

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the daemon polling thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        log.info(
            "polling the kubelet pod-resources API at %s every %g s for pod attribution",
            self.socket_path,
            self.interval,
        )
        self._thread = threading.Thread(
            target=self._run, name="otel-gpu-podresources", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread; closing the channel cancels an in-flight call at once."""
        self._stop.set()
        self._close_channel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        self._close_channel()

    def __enter__(self) -> PodResourcesWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.poll_once()
                except Exception:  # a bug, not kubelet trouble: back off, never die
                    self._note_failure(grpc.StatusCode.INTERNAL)
                    self._limiter.log(
                        "crash", logging.ERROR, "pod-resources poller error", exc_info=True
                    )
                self._stop.wait(self._next_delay)
        finally:
            self._close_channel()

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> bool:
        """Refresh the state from the kubelet once, synchronously.

        Returns whether the refresh succeeded. Never raises for kubelet or
        socket trouble; sets :attr:`next_delay` for the polling thread.
        """
        with self._poll_lock:
            ok = self._poll()
            changed, self._changed = self._changed, None
        if changed is not None and self._on_update is not None:
            # Called after the poll lock is released: the consumer may take its own locks.
            try:
                self._on_update(changed)
            except Exception:  # noqa: BLE001 - a consumer's bug must not stop polling
                self._limiter.log("on_update", logging.ERROR,
                                  "handling new pod-resources state failed", exc_info=True)
        return ok

    def _poll(self) -> bool:
        if not self._check_socket():
            self._close_channel()
            self._next_delay = self.interval
            self._note_failure(None)
            return False
        try:
            source, allocations = self._list()
            allocatable = self._maybe_allocatable() if source == "v1" else None
        except grpc.RpcError as error:
            self._on_rpc_error(error)
            return False
        except ValueError:  # "Cannot invoke RPC on closed channel" during stop()
            if self._stop.is_set():
                self._next_delay = self.interval
                return False
            raise
        self._on_success(source, allocations, allocatable)
        return True

    def _check_socket(self) -> bool:
        """Is the socket there? Logs absence once and appearance once."""
        try:
            mode = os.stat(self.socket_path).st_mode
            now = _Socket.PRESENT if stat.S_ISSOCK(mode) else _Socket.NOT_SOCKET
        except FileNotFoundError:
            now = _Socket.ABSENT
        except OSError:
            now = _Socket.PRESENT  # e.g. no permission to stat: let gRPC say why
        before, self._socket = self._socket, now
        if now == before:
            return now == _Socket.PRESENT
        if now == _Socket.PRESENT:
            if before is not None:
                log.info(
                    "kubelet pod-resources socket %s is available: pod attribution on",
                    self.socket_path,
                )
            return True
        if before is None and now == _Socket.ABSENT:  # not a Kubernetes node, most likely
            log.info(
                "pod attribution off: no kubelet socket at %s (picked up if it appears; "
                "in a container, mount its directory, not the socket file)",
                self.socket_path,
            )
        elif before is None:
            log.warning(
                "kubelet pod-resources socket %s is not a socket: pod attribution is off "
                "until it is (mount its directory into the container, not the socket file)",
                self.socket_path,
            )
        else:
            self._limiter.log(
                "socket-gone",
                logging.WARNING,
                "kubelet pod-resources socket %s disappeared (kubelet restart?); keeping "
                "the last pod attribution for %.0fs",
                self.socket_path,
                self.grace_period,
            )
        return False

    def _ensure_channel(self) -> None:
        if self._channel is not None:
            return
        options = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", 1024 * 1024),
            ("grpc.enable_http_proxy", 0),
            ("grpc.enable_retries", 0),
        ]
        channel = grpc.insecure_channel(
            "unix:" + os.path.abspath(self.socket_path), options=options
        )
        self._calls = {
            V1_LIST: channel.unary_unary(
                RPC_METHODS[V1_LIST],
                request_serializer=v1_pb2.ListPodResourcesRequest.SerializeToString,
                response_deserializer=v1_pb2.ListPodResourcesResponse.FromString,
            ),
            V1_ALLOCATABLE: channel.unary_unary(
                RPC_METHODS[V1_ALLOCATABLE],
                request_serializer=v1_pb2.AllocatableResourcesRequest.SerializeToString,
                response_deserializer=v1_pb2.AllocatableResourcesResponse.FromString,
            ),
            V1ALPHA1_LIST: channel.unary_unary(
                RPC_METHODS[V1ALPHA1_LIST],
                request_serializer=v1alpha1_pb2.ListPodResourcesRequest.SerializeToString,
                response_deserializer=v1alpha1_pb2.ListPodResourcesResponse.FromString,
            ),
        }
        self._channel = channel

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):  # closing twice or mid-call is fine
                channel.close()

    def _call(self, rpc: str, request: Any) -> Any:
        self._ensure_channel()
        try:
            response = self._calls[rpc](request, timeout=self.timeout)
        except grpc.RpcError as error:
            self._count(rpc, _code_of(error).name)
            raise
        self._count(rpc, "OK")
        return response

    def _count(self, rpc: str, outcome: str) -> None:
        with self._stats_lock:
            key = (rpc, outcome)
            self._requests[key] = self._requests.get(key, 0) + 1

    def _list(self) -> tuple[str, tuple[Allocation, ...]]:
        if not self._use_v1alpha1:
            try:
                response = self._call(V1_LIST, v1_pb2.ListPodResourcesRequest())
            except grpc.RpcError as error:
                if _code_of(error) != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                self._use_v1alpha1 = True
                self._limiter.once(
                    "fallback-v1alpha1",
                    logging.WARNING,
                    "kubelet at %s does not implement pod-resources v1 (kubelet older than "
                    "1.20?): using v1alpha1 from now on (no NUMA, CPU or DRA information)",
                    self.socket_path,
                )
            else:
                return "v1", allocations_from_v1(response, self.accept)
        try:
            response = self._call(V1ALPHA1_LIST, v1alpha1_pb2.ListPodResourcesRequest())
        except grpc.RpcError as error:
            if _code_of(error) == grpc.StatusCode.UNIMPLEMENTED:
                self._use_v1alpha1 = False  # neither works: try v1 first again next time
            raise
        return "v1alpha1", allocations_from_v1alpha1(response, self.accept)

    def _maybe_allocatable(self) -> tuple[AllocatableDevice, ...] | None:
        """Refresh allocatable devices every few polls; failures keep the old value."""
        if self._allocatable_unimplemented:
            return None
        if self._polls_until_allocatable > 0:
            self._polls_until_allocatable -= 1
            return self._allocatable
        try:
            response = self._call(V1_ALLOCATABLE, v1_pb2.AllocatableResourcesRequest())
        except grpc.RpcError as error:
            code = _code_of(error)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._allocatable_unimplemented = True
                self._allocatable = None
                log.info(
                    "kubelet does not implement GetAllocatableResources: allocatable "
                    "device counts are unknown"
                )
                return None
            if code == grpc.StatusCode.UNAVAILABLE:
                self._close_channel()
            self._limiter.log(
                ("rpc", V1_ALLOCATABLE, code.name),
                logging.WARNING,
                "pod-resources GetAllocatableResources failed: %s %s (retrying next poll)",
                code.name,
                _details_of(error),
            )
            return self._allocatable
        self._allocatable = allocatable_from_v1(response, self.accept)
        self._polls_until_allocatable = self.allocatable_every - 1
        return self._allocatable

    # ------------------------------------------------------------------ outcomes

    def _on_success(
        self,
        source: str,
        allocations: tuple[Allocation, ...],
        allocatable: tuple[AllocatableDevice, ...] | None,
    ) -> None:
        now = self._clock()
        state = PodResourcesState(allocations, allocatable, now, source)
        previous = self._current[0]
        self._current = (state, None)
        changed = (previous.allocations, previous.allocatable) != (allocations, allocatable)
        if changed:
            self._changed = state
        with self._stats_lock:
            failures, self._failures = self._failures, 0
            self._last_success = now
        if failures:
            log.info(
                "pod-resources %s List succeeded again after %d failed attempts",
                source,
                failures,
            )
        self._dropped_logged = False
        self._next_delay = self.interval

    def _on_rpc_error(self, error: grpc.RpcError) -> None:
        code = _code_of(error)
        details = _details_of(error)
        if self._stop.is_set():
            self._next_delay = self.interval
            return
        if code == grpc.StatusCode.UNAVAILABLE:
            # A fresh channel reconnects at once; an old one may sit in its own
            # reconnect backoff (up to 2 minutes) after a kubelet restart.
            self._close_channel()
        rpc = V1ALPHA1_LIST if self._use_v1alpha1 else V1_LIST
        hint = ""
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" not in details:
            hint = f" (reply over max_message_bytes={self.max_message_bytes}? raise it)"
        self._note_failure(code)
        self._limiter.log(
            ("rpc", rpc, code.name),
            logging.WARNING,
            "pod-resources %s on %s failed: %s %s%s; retrying in %.1fs",
            rpc,
            self.socket_path,
            code.name,
            details,
            hint,
            self._next_delay,
        )

    def _note_failure(self, code: grpc.StatusCode | None) -> None:
        """Start or continue the failure period; expire the state after grace."""
        now = self._clock()
        state, failing_since = self._current
        if failing_since is None:
            failing_since = now
        with self._stats_lock:
            if code is not None:
                self._failures += 1
            failures = self._failures
        if state is not EMPTY_STATE and now - failing_since >= self.grace_period:
            state = EMPTY_STATE
            if not self._dropped_logged:
                self._dropped_logged = True
                log.warning(
                    "pod-resources unavailable for %.0fs (grace period): dropping pod "
                    "attribution until the kubelet answers again",
                    now - failing_since,
                )
        self._current = (state, failing_since)
        if code is not None:
            self._next_delay = self._backoff_delay(failures)
        # Readers see the drop on time through the ``state`` property; the log
        # line waits for the next poll rather than spend a kubelet call on it.

    def _backoff_delay(self, n: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(n-1))] after n failures."""
        ceiling = min(self.backoff_cap, self.backoff_base * (2.0 ** max(0, min(n - 1, 30))))
        return max(0.01, ceiling * self._random())
