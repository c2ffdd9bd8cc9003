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
UNIMPLEMENTED is asked v1alpha1 from then on; a reply that does not parse is one
rate-limited line and a failed poll like any other.

The answer's types and their conversion are in
:mod:`otel_gpu.attribute.k8s.kubelet_answer`, the channel and its calls in
:mod:`otel_gpu.attribute.k8s.kubelet_rpc`; both are re-exported here.
"""

from __future__ import annotations

import logging
import os
import random as _random
import stat
import threading
import time
from collections.abc import Callable, Iterable
from types import MappingProxyType

import grpc

from otel_gpu._log import LogLimiter
from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.attribute.k8s.device_ids import ResourceFilter
from otel_gpu.attribute.k8s.kubelet_answer import (
    EMPTY_STATE,
    AllocatableDevice,
    Allocation,
    PodResourcesState,
    allocatable_from_v1,
    allocations_from_v1,
    allocations_from_v1alpha1,
)
from otel_gpu.attribute.k8s.kubelet_rpc import (
    CORRUPT,
    V1_ALLOCATABLE,
    V1_LIST,
    V1ALPHA1_LIST,
    CorruptReply,
    KubeletChannel,
    M,
    code_of,
    details_of,
)
from otel_gpu.snapshot import KubeletStats

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""Receive limit; gRPC's own 4 MiB default is too small for busy nodes."""


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
        self._channel: KubeletChannel | None = None
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
                except Exception:  # noqa: BLE001 - a bug, not kubelet trouble: back off, never die
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
        except CorruptReply as bad:
            self._on_corrupt(bad)
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

    def _close_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _call(self, rpc: str, reply_type: type[M]) -> M:
        if self._channel is None:
            self._channel = KubeletChannel(self.socket_path, self.max_message_bytes)
        try:
            response = self._channel.call(rpc, reply_type, self.timeout)
        except grpc.RpcError as error:
            self._count(rpc, code_of(error).name)
            raise
        except CorruptReply:
            self._count(rpc, CORRUPT.name)
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
                response = self._call(V1_LIST, v1_pb2.ListPodResourcesResponse)
            except grpc.RpcError as error:
                if code_of(error) != grpc.StatusCode.UNIMPLEMENTED:
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
            response = self._call(V1ALPHA1_LIST, v1alpha1_pb2.ListPodResourcesResponse)
        except grpc.RpcError as error:
            if code_of(error) == grpc.StatusCode.UNIMPLEMENTED:
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
            response = self._call(V1_ALLOCATABLE, v1_pb2.AllocatableResourcesResponse)
        except grpc.RpcError as error:
            code = code_of(error)
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
                details_of(error),
            )
            return self._allocatable
        except CorruptReply as bad:
            self._limiter.log(("corrupt", V1_ALLOCATABLE), logging.WARNING,
                              "pod-resources on %s: %s (keeping the last allocatable devices; "
                              "retrying next poll)", self.socket_path, bad)
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
        code = code_of(error)
        details = details_of(error)
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

    def _on_corrupt(self, bad: CorruptReply) -> None:
        if self._stop.is_set():
            self._next_delay = self.interval
            return
        self._note_failure(CORRUPT)
        self._limiter.log(
            ("corrupt", bad.rpc), logging.WARNING,
            "pod-resources on %s: %s; keeping the last pod attribution for the grace period "
            "(%.0fs); retrying in %.1fs",
            self.socket_path, bad, self.grace_period, self._next_delay,
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
        self._current = (state, failing_since)  # readers see a drop on time through ``state``
        if code is not None:
            self._next_delay = self._backoff_delay(failures)

    def _backoff_delay(self, n: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**(n-1))] after n failures."""
        ceiling = min(self.backoff_cap, self.backoff_base * (2.0 ** max(0, min(n - 1, 30))))
        return max(0.01, ceiling * self._random())
