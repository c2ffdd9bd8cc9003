"""The kubelet's Pod Resources RPCs on one long-lived channel, replies decoded by us.

gRPC hands each reply over as the bytes the kubelet sent; they are parsed
here, so a reply that is not the protobuf it should be (a corrupt kubelet,
something else answering on the socket) is a :class:`CorruptReply` naming
the RPC, which the poller treats as any failed call, instead of a traceback
from gRPC's own deserializer and an opaque ``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from otel_gpu.attribute.k8s._proto.podresources.v1 import api_pb2 as v1_pb2
from otel_gpu.attribute.k8s._proto.podresources.v1alpha1 import api_pb2 as v1alpha1_pb2

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
