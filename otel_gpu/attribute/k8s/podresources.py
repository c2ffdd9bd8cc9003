"""Kubelet Pod Resources client: the kubelet's protocol, polled by the shared socket watcher.

The kubelet rate-limits its pod-resources socket with one token bucket shared
by every agent on the node, and a List reply can be megabytes on a busy node.
So the collector never asks on a scrape: :class:`PodResourcesWatcher` is a
:class:`~otel_gpu.attribute.watch.SocketWatch` (its thread, grace period,
jittered backoff, socket lines and counters) whose fetch asks ``List`` on a
long-lived channel and converts the reply into an immutable
:class:`PodResourcesState`. Readers (scrapes, instrument callbacks) only read
:attr:`PodResourcesWatcher.state`.

The protocol's own failure handling: an old kubelet that answers v1 with
UNIMPLEMENTED is asked v1alpha1 from then on; ``GetAllocatableResources`` is
asked every few polls and its failure keeps the last value; UNAVAILABLE closes
the channel (a fresh one reconnects at once); a reply that does not parse is a
failed poll like any other. A missing socket is a failed poll too, neither
counted nor backed off: a kubelet restart removes its socket, and the last
state is kept for the grace period.

The answer's types and their conversion are in
:mod:`otel_gpu.attribute.k8s.kubelet_answer`, the channel and its calls in
:mod:`otel_gpu.attribute.k8s.kubelet_rpc`; both are re-exported here.
"""

from __future__ import annotations

import logging
import os
import random as _random
import time
from collections.abc import Callable, Iterable

import grpc

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
from otel_gpu.attribute.k8s.source import LINES
from otel_gpu.attribute.watch import SocketWatch, Unanswered
from otel_gpu.snapshot import KubeletStats

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""Receive limit; gRPC's own 4 MiB default is too small for busy nodes."""


def _new_answer(old: PodResourcesState, new: PodResourcesState) -> bool:
    """Whether the pipeline should hear of ``new``: its pods or devices differ."""
    return (old.allocations, old.allocatable) != (new.allocations, new.allocatable)


class PodResourcesWatcher(SocketWatch[PodResourcesState, tuple[str, str]]):
    """Polls the kubelet's Pod Resources API and publishes the result.

    The watcher (:class:`~otel_gpu.attribute.watch.SocketWatch`) asks every
    ``interval`` seconds after a success, after an exponential backoff with full
    jitter (``backoff_base`` doubling up to ``backoff_cap``) after a failure.
    ``GetAllocatableResources`` is asked every ``allocatable_every`` polls.
    Requests are counted by (rpc short name, gRPC status code name).
    ``on_update`` hears of each answer whose pods or devices changed.
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
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if max_message_bytes < 4 * 1024 * 1024:
            raise ValueError("max_message_bytes below gRPC's 4 MiB default makes no sense")
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.allocatable_every = max(1, int(allocatable_every))
        self.accept = ResourceFilter(resource_names, dra_drivers)
        # The protocol's state: the poll's own (one poll at a time).
        self._channel: KubeletChannel | None = None
        self._use_v1alpha1 = False
        self._allocatable_unimplemented = False
        self._allocatable: tuple[AllocatableDevice, ...] | None = None
        self._polls_until_allocatable = 0
        super().__init__(socket_path, self._ask, lines=LINES, log=log,
                         name="otel-gpu-podresources", initial=EMPTY_STATE, empty=EMPTY_STATE,
                         close=self._close_channel, interval=interval,
                         grace_period=grace_period, backoff_base=backoff_base,
                         backoff_cap=backoff_cap, clock=clock, random=random,
                         log_interval=log_interval, on_update=on_update, changed=_new_answer)

    @property
    def stats(self) -> KubeletStats:
        state = self.state
        return KubeletStats(
            requests=self.requests,
            last_success_monotonic=self.last_success,
            pods=state.pod_count,
            devices=state.device_count,
            source=state.source,
            consecutive_failures=self.failures,
            socket_present=self.socket_present,
        )

    def problem(self) -> str | None:
        """Why pods are not attributed, past a kubelet restart (the watcher's outage)."""
        return self.outage()

    # ------------------------------------------------------------------ the protocol

    def _ask(self) -> PodResourcesState:
        """``List`` (and now and then ``GetAllocatableResources``), once."""
        try:
            source, allocations = self._list()
            allocatable = self._maybe_allocatable() if source == "v1" else None
        except grpc.RpcError as error:
            raise self._unanswered(error) from None
        except CorruptReply as bad:
            raise Unanswered(str(bad), ("corrupt", bad.rpc)) from None
        return PodResourcesState(allocations, allocatable, self.clock(), source)

    def _unanswered(self, error: grpc.RpcError) -> Unanswered:
        code = code_of(error)
        details = details_of(error)
        if code == grpc.StatusCode.UNAVAILABLE:
            # A fresh channel reconnects at once; an old one may sit in its own
            # reconnect backoff (up to 2 minutes) after a kubelet restart.
            self._close_channel()
        rpc = V1ALPHA1_LIST if self._use_v1alpha1 else V1_LIST
        hint = ""
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" not in details:
            hint = f" (reply over max_message_bytes={self.max_message_bytes}? raise it)"
        return Unanswered(f"{rpc} failed: {code.name} {details}{hint}", ("rpc", rpc, code.name))

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
            self.count((rpc, code_of(error).name))
            raise
        except CorruptReply:
            self.count((rpc, CORRUPT.name))
            raise
        self.count((rpc, "OK"))
        return response

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
