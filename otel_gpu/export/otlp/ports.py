"""OTLP sent to the other protocol's port: gRPC to an OTLP/HTTP receiver (4318), or
OTLP/HTTP to a gRPC one (4317), said in one line naming the mismatch and the fix.

The raw answers are cryptic (gRPC: "Failed parsing HTTP/2", "Trying to connect an
http1.x server"; requests: a ``BadStatusLine`` of binary HTTP/2 frame bytes), and each
is retried as transient. Where the server's answer proves the mismatch, the export
fails at once with the line; where only the port says it (OTLP's default port for the
other protocol), the line is added to the failure as it comes.
"""

from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlparse

from otel_gpu.export.otlp.transport import GRPC

GRPC_PORT, HTTP_PORT = 4317, 4318
"""OTLP's default ports: gRPC, and HTTP."""
_HTTP1_ANSWER = ("http1.x server", "Failed parsing HTTP/2")
"""gRPC's words for a server that answered in HTTP/1 (an OTLP/HTTP receiver)."""
_HTTP2_ANSWER = "BadStatusLine('\\x00\\x00"
"""An HTTP/1 client's for one that began with an HTTP/2 frame (a gRPC server)."""


class Mismatch(NamedTuple):
    """The failure's reason, said anew; and whether the server's answer proved it."""

    reason: str
    proved: bool


def _port(url: str) -> int | None:
    try:
        return urlparse(url if "//" in url else f"//{url}").port
    except ValueError:
        return None


def _line(protocol: str, port: int | None, signal: str) -> str:
    if protocol == GRPC:
        at = "an OTLP/HTTP port (4318)" if port == HTTP_PORT else "an OTLP/HTTP endpoint"
        return (f"gRPC sent to {at}: send gRPC to port {GRPC_PORT}, or set otlp_protocol "
                "(OTEL_EXPORTER_OTLP_PROTOCOL) to http/protobuf")
    at = "an OTLP/gRPC port (4317)" if port == GRPC_PORT else "an OTLP/gRPC endpoint"
    return (f"OTLP/HTTP sent to {at}: send it to port {HTTP_PORT} (path /v1/{signal}), or "
            "set otlp_protocol (OTEL_EXPORTER_OTLP_PROTOCOL) to grpc")


def wrong_port(protocol: str, url: str | None, signal: str) -> str | None:
    """The line for an endpoint on OTLP's default port of the other protocol (said at
    start-up where no answer of ours can prove it: the logs go through the SDK's
    exporter, whose failures it words itself); None when it is not."""
    port = _port(url) if url else None
    if port != (HTTP_PORT if protocol == GRPC else GRPC_PORT):
        return None
    return _line(protocol, port, signal)


def mismatch(protocol: str, url: str, reason: str) -> Mismatch | None:
    """The failed send's reason when ``protocol`` met the other one at ``url`` (the raw
    answer kept in brackets); None when nothing points to it."""
    port = _port(url)
    if protocol == GRPC:
        proved = any(words in reason for words in _HTTP1_ANSWER)
        if not proved and port != HTTP_PORT:
            return None
    else:
        proved = _HTTP2_ANSWER in reason
        if not proved and port != GRPC_PORT:
            return None
    got = "an HTTP/2 frame for a status line" if _HTTP2_ANSWER in reason else reason[:300]
    return Mismatch(f"{_line(protocol, port, 'metrics')} (got {got})", proved)
