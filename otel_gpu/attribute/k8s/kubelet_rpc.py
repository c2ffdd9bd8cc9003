"""The kubelet's Pod Resources RPCs on one long-lived channel, replies decoded by us, and
the protocol the watcher asks through them (:class:`PodResourcesClient`).

gRPC hands each reply over as the bytes the kubelet sent; they are parsed
here, so a reply that is not the protobuf it should be (a corrupt kubelet,
something else answering on the socket) is a :class:`CorruptReply` naming
the RPC, which the poller treats as any failed call, instead of a traceback
from gRPC's own deserializer and an opaque ``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2
from otel_gpu.attribute.k8s.kubelet_answer import (
    AllocatableDevice,
    Allocation,
    PodResourcesState,
    allocatable_from_v1,
    allocations_from_v1,
    allocations_from_v1alpha1,
)
from otel_gpu.attribute.watch import Unanswered

if TYPE_CHECKING:
    from otel_gpu._log import LogLimiter
    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher

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
"""Short rpc names used in :class:`~otel_gpu.snapshot.KubeletStats`, and the gRPC paths."""

_MESSAGES: Mapping[str, tuple[type[Message], type[Message]]] = MappingProxyType({
    V1_LIST: (v1_pb2.ListPodResourcesRequest, v1_pb2.ListPodResourcesResponse),
    V1_ALLOCATABLE: (v1_pb2.AllocatableResourcesRequest, v1_pb2.AllocatableResourcesResponse),
    V1ALPHA1_LIST: (v1alpha1_pb2.ListPodResourcesRequest, v1alpha1_pb2.ListPodResourcesResponse),
})

M = TypeVar("M", bound=Message)

CORRUPT = grpc.StatusCode.DATA_LOSS
"""The outcome a reply that does not parse is counted under."""


class CorruptReply(Exception):
    """A reply's bytes are not the message the RPC answers with."""

    def __init__(self, rpc: str, message: str, size: int, reason: str) -> None:
        super().__init__(f"{rpc} answered {size} bytes that are not a valid {message} "
                         f"({reason})")
        self.rpc = rpc


def code_of(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    try:
        value = code() if callable(code) else None
    except Exception:  # noqa: BLE001 - a bare RpcError carries nothing; any raise is no code
        value = None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def details_of(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    try:
        text = details() if callable(details) else None
    except Exception:  # noqa: BLE001 - the details of a broken error are no details
        text = None
    return text or ""


class KubeletChannel:
    """One insecure channel to the kubelet's unix socket, and its three calls."""

    def __init__(self, socket_path: str, max_message_bytes: int) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 1024 * 1024),
            ("grpc.enable_http_proxy", 0),
            ("grpc.enable_retries", 0),
        ]
        self._channel = grpc.insecure_channel("unix:" + os.path.abspath(socket_path),
                                              options=options)
        # No response deserializer: the reply's bytes come back as they are (see decode).
        self._calls: dict[str, Callable[..., bytes]] = {
            rpc: self._channel.unary_unary(
                path, request_serializer=_MESSAGES[rpc][0].SerializeToString)
            for rpc, path in RPC_METHODS.items()
        }

    def call(self, rpc: str, reply_type: type[M], timeout: float) -> M:
        """The decoded reply of ``rpc``; raises ``grpc.RpcError`` or :class:`CorruptReply`."""
        request_type, expected = _MESSAGES[rpc]
        if reply_type is not expected:
            raise TypeError(f"{rpc} answers {expected.__name__}, not {reply_type.__name__}")
        data = self._calls[rpc](request_type(), timeout=timeout)
        return decode(rpc, reply_type, data)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing twice or mid-call is fine
            self._channel.close()


def decode(rpc: str, reply_type: type[M], data: object) -> M:
    if not isinstance(data, bytes):
        raise CorruptReply(rpc, reply_type.__name__, 0, f"got {type(data).__name__}")
    try:
        return reply_type.FromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise CorruptReply(rpc, reply_type.__name__, len(data), str(exc)[:200]) from None


class PodResourcesClient:
    """The protocol, built by the watcher's first fetch once a socket is there (so gRPC is
    imported only then): ``List`` on one long-lived channel, asked v1alpha1 from then on by
    a kubelet that answers v1 with UNIMPLEMENTED; ``GetAllocatableResources`` every
    ``allocatable_every`` polls, its failure keeping the last value; UNAVAILABLE closes the
    channel (a fresh one reconnects at once). Settings, counts and lines are the watcher's.
    """

    def __init__(self, watch: PodResourcesWatcher, limiter: LogLimiter,
                 log: logging.Logger) -> None:
        self._watch = watch
        self._limiter = limiter
        self._log = log
        self._channel: KubeletChannel | None = None
        self._use_v1alpha1 = False
        self._allocatable_unimplemented = False
        self._allocatable: tuple[AllocatableDevice, ...] | None = None
        self._polls_until_allocatable = 0

    def ask(self) -> PodResourcesState:
        """``List`` (and now and then ``GetAllocatableResources``), once."""
        try:
            source, allocations = self._list()
            allocatable = self._maybe_allocatable() if source == "v1" else None
        except grpc.RpcError as error:
            raise self._unanswered(error) from None
        except CorruptReply as bad:
            raise Unanswered(str(bad), ("corrupt", bad.rpc)) from None
        return PodResourcesState(allocations, allocatable, self._watch.clock(), source)

    def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _unanswered(self, error: grpc.RpcError) -> Unanswered:
        code = code_of(error)
        details = details_of(error)
        if code == grpc.StatusCode.UNAVAILABLE:
            # A fresh channel reconnects at once; an old one may sit in its own
            # reconnect backoff (up to 2 minutes) after a kubelet restart.
            self.close()
        rpc = V1ALPHA1_LIST if self._use_v1alpha1 else V1_LIST
        hint = ""
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" not in details:
            hint = f" (reply over max_message_bytes={self._watch.max_message_bytes}? raise it)"
        return Unanswered(f"{rpc} failed: {code.name} {details}{hint}", ("rpc", rpc, code.name))

    def _call(self, rpc: str, reply_type: type[M]) -> M:
        watch = self._watch
        if self._channel is None:
            self._channel = KubeletChannel(watch.socket_path, watch.max_message_bytes)
        try:
            response = self._channel.call(rpc, reply_type, watch.timeout)
        except grpc.RpcError as error:
            watch.count((rpc, code_of(error).name))
            raise
        except CorruptReply:
            watch.count((rpc, CORRUPT.name))
            raise
        watch.count((rpc, "OK"))
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
                    self._watch.socket_path,
                )
            else:
                return "v1", allocations_from_v1(response, self._watch.accept)
        try:
            response = self._call(V1ALPHA1_LIST, v1alpha1_pb2.ListPodResourcesResponse)
        except grpc.RpcError as error:
            if code_of(error) == grpc.StatusCode.UNIMPLEMENTED:
                self._use_v1alpha1 = False  # neither works: try v1 first again next time
            raise
        return "v1alpha1", allocations_from_v1alpha1(response, self._watch.accept)

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
                self._log.info(
                    "kubelet does not implement GetAllocatableResources: allocatable "
                    "device counts are unknown"
                )
                return None
            if code == grpc.StatusCode.UNAVAILABLE:
                self.close()
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
                              "retrying next poll)", self._watch.socket_path, bad)
            return self._allocatable
        self._allocatable = allocatable_from_v1(response, self._watch.accept)
        self._polls_until_allocatable = self._watch.allocatable_every - 1
        return self._allocatable
