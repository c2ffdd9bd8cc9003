"""The container runtime's names for its containers, from its Docker-compatible API socket.

Docker and Podman (``podman system service``) answer ``GET /containers/json``
on a unix socket with the running containers: each one's ``Id``, ``Names``
(``/name``) and ``Image`` (the reference it was started from). That is all
otel-gpu asks, and never on a scrape: :class:`RuntimeWatch` is the socket
watcher the kubelet's is (:class:`~otel_gpu.attribute.watch.SocketWatch`)
with this module's protocol as its fetch: it asks every ``interval``, turns
the answer into an immutable :class:`RuntimeState` and swaps it in; readers
only read :attr:`RuntimeWatch.state`, as they do the kubelet's.

Everything read is bounded: the answer's size (:data:`MAX_REPLY_BYTES`),
its duration (``timeout``, for the whole exchange, however slowly the bytes
come), the containers taken (:data:`MAX_CONTAINERS`) and each name's length;
the reply must be UTF-8 JSON of the documented shape. A bad answer or a
failed call is one rate-limited line, retried with a backoff (full jitter),
and the last good state is kept for ``grace_period`` before it is dropped.
No socket at the path means the runtime is not there (or not mounted):
attribution is off at once (the state is None), said once, and the path is
looked at again every interval.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random as _random
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from otel_gpu.attribute.watch import Lines, SocketWatch, Unanswered
from otel_gpu.snapshot import ContainerStats
from otel_gpu.workload import ContainerRef

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/docker.sock"
PATH = "/containers/json"
MAX_REPLY_BYTES = 8 * 1024 * 1024
"""A container's entry is about 1-2 KiB: thousands of containers fit."""
MAX_CONTAINERS = 4096
MAX_NAME_CHARS = 256
MAX_IMAGE_CHARS = 512

_ID = re.compile(r"^[0-9a-f]{64}$")
_IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{64}$")


class RuntimeAnswerError(Exception):
    """The runtime's answer could not be had or used; the message says why, in one line."""


def image_name(reference: str) -> str | None:
    """``registry:5000/team/app:v1`` -> ``registry:5000/team/app``; ``app@sha256:...`` ->
    ``app``; an image id (``sha256:...``, what a container of a removed tag shows) -> None."""
    reference = reference.strip()
    if not reference or _IMAGE_ID.match(reference):
        return None
    name = reference.partition("@")[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    return name[:MAX_IMAGE_CHARS] or None


def parse_containers(data: bytes) -> tuple[ContainerRef, ...]:
    """The containers of a ``GET /containers/json`` answer; raises :class:`RuntimeAnswerError`."""
    try:
        listed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RuntimeAnswerError(f"the answer is not UTF-8 JSON ({str(exc)[:80]})") from None
    if not isinstance(listed, list):
        raise RuntimeAnswerError(f"the answer is a JSON {type(listed).__name__}, not a list")
    out: dict[str, ContainerRef] = {}
    for entry in listed[:MAX_CONTAINERS]:
        if not isinstance(entry, dict):
            continue
        cid = entry.get("Id")
        if not isinstance(cid, str) or not _ID.match(cid):
            continue
        names = entry.get("Names")
        name = None
        if isinstance(names, list) and names and isinstance(names[0], str):
            name = names[0].lstrip("/")[:MAX_NAME_CHARS] or None
        image = entry.get("Image")
        out[cid] = ContainerRef(cid, name, image_name(image) if isinstance(image, str) else None)
    if len(listed) > MAX_CONTAINERS:
        log.warning("the container runtime lists %d containers: only the first %d are named",
                    len(listed), MAX_CONTAINERS)
    return tuple(out.values())


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def fetch(path: str, timeout: float, max_bytes: int = MAX_REPLY_BYTES) -> bytes:
    """The body of ``GET /containers/json`` on the unix socket at ``path``, within
    ``timeout`` seconds in all and ``max_bytes``; raises :class:`RuntimeAnswerError`."""
    deadline = time.monotonic() + timeout
    conn = _UnixConnection(path, timeout)
    try:
        conn.request("GET", PATH, headers={"Host": "docker", "Accept": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeAnswerError(f"GET {PATH} answered HTTP {response.status}")
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise RuntimeAnswerError(f"the answer took longer than {timeout:g}s")
            chunk = response.read1(64 * 1024)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise RuntimeAnswerError(f"the answer is over {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except (OSError, http.client.HTTPException) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (
            getattr(exc, "strerror", None) or type(exc).__name__)
        raise RuntimeAnswerError(f"GET {PATH} failed: {reason}") from None
    finally:
        conn.close()


@dataclass(frozen=True)
class RuntimeState:
    """What the runtime's last good answer said. Never mutated; replaced whole."""

    containers: Mapping[str, ContainerRef] = field(
        default_factory=lambda: MappingProxyType({}))
    """By container id."""
    taken_monotonic: float | None = None


EMPTY = RuntimeState()


LINES = Lines(
    what="container runtime",
    absent="container attribution off: no container runtime socket at %(path)s (picked up if "
           "it appears; mount it read-only to name containers)",
    first="naming containers outside Kubernetes from the runtime socket %(path)s",
    back="naming containers outside Kubernetes from the runtime socket %(path)s",
    gone="container runtime socket %(path)s is gone: container attribution is off until it "
         "is back",
    failed="container runtime socket %(path)s: %(reason)s; containers keep the names last "
           "read for %(grace).0fs; retrying in %(delay).1fs",
    dropped="the container runtime at %(path)s has not answered for %(elapsed).0fs (the grace "
            "period): containers keep their ids only until it answers again",
)


class RuntimeWatch(SocketWatch[RuntimeState | None, str]):
    """Polls the runtime's socket (:class:`~otel_gpu.attribute.watch.SocketWatch`) and
    publishes :attr:`state`: None while there is no socket, :data:`EMPTY` once failures
    outlast the grace period. Its requests are counted by outcome (``ok``, ``error``).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET,
        *,
        interval: float = 10.0,
        timeout: float = 5.0,
        grace_period: float = 60.0,
        backoff_cap: float = 60.0,
        max_bytes: int = MAX_REPLY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        log_interval: float = 300.0,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError("interval and timeout must be positive")
        self.timeout = float(timeout)
        self.max_bytes = max_bytes
        # The first retry waits up to an interval: a failing runtime is asked no more often.
        super().__init__(socket_path, self._ask, lines=LINES, log=log,
                         name="otel-gpu-containers", initial=None, empty=EMPTY,
                         off_without_socket=True, interval=interval,
                         grace_period=grace_period, backoff_base=min(interval, backoff_cap),
                         backoff_cap=backoff_cap, clock=clock, random=random,
                         log_interval=log_interval)

    @property
    def stats(self) -> ContainerStats:
        state = self.state
        return ContainerStats(self.requests, len(state.containers) if state is not None else 0,
                              self.socket_present)

    def _ask(self) -> RuntimeState:
        """``GET /containers/json``, once."""
        try:
            containers = parse_containers(fetch(self.socket_path, self.timeout, self.max_bytes))
        except RuntimeAnswerError as exc:
            self.count("error")
            raise Unanswered(str(exc)) from None
        self.count("ok")
        return RuntimeState(MappingProxyType({c.id: c for c in containers}), self.clock())
