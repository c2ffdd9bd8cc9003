"""The container runtime's names for its containers, from its Docker-compatible API socket.

Docker and Podman (``podman system service``) answer ``GET /containers/json``
on a unix socket with the running containers: each one's ``Id``, ``Names``
(``/name``) and ``Image`` (the reference it was started from). That is all
otel-gpu asks, and never on a scrape: :class:`RuntimeWatch` asks on a daemon
thread every ``interval``, turns the answer into an immutable
:class:`RuntimeState` and swaps it in; readers only read
:attr:`RuntimeWatch.state`, as they do the kubelet's.

Everything read is bounded: the answer's size (:data:`MAX_REPLY_BYTES`),
its duration (``timeout``, for the whole exchange, however slowly the bytes
come), the containers taken (:data:`MAX_CONTAINERS`) and each name's length;
the reply must be UTF-8 JSON of the documented shape. A bad answer or a
failed call is one rate-limited line, retried with a backoff (full jitter),
and the last good state is kept for ``grace_period`` before it is dropped.
No socket at the path means the runtime is not there (or not mounted):
attribution stays off, said once, and the path is looked at again every
interval.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random as _random
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from otel_gpu._log import LogLimiter
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


class RuntimeWatch:
    """Polls the runtime's socket and publishes :attr:`state` (None while there is no socket).

    ``clock`` (monotonic seconds) and ``random`` (uniform in [0, 1)) are injectable so
    tests drive time and jitter.
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
        self.socket_path = os.fspath(socket_path)
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.grace_period = float(grace_period)
        self.backoff_cap = float(backoff_cap)
        self.max_bytes = max_bytes
        self._clock = clock
        self._random = random
        self._limited = LogLimiter(log, log_interval, clock=clock)
        # Published together: (state or None, monotonic time failures started or None).
        self._current: tuple[RuntimeState | None, float | None] = (None, None)
        self._present: bool | None = None
        self._failures = 0
        self._requests: dict[str, int] = {}
        self._stats_lock = threading.Lock()
        self.next_delay = self.interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> RuntimeState | None:
        """The containers the runtime named; None where there is no runtime socket.
        Lock-free: read on every sample."""
        state, failing_since = self._current
        if (state is not None and failing_since is not None
                and self._clock() - failing_since >= self.grace_period):
            return EMPTY
        return state

    @property
    def stats(self) -> ContainerStats:
        state = self.state
        with self._stats_lock:
            requests = dict(self._requests)
        return ContainerStats(MappingProxyType(requests),
                              len(state.containers) if state is not None else 0,
                              self._present)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="otel-gpu-containers",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - a bug, not the runtime's trouble: never die
                self._limited.log("bug", logging.ERROR, "container runtime poller error",
                                  exc_info=True)
                self.next_delay = self.backoff_cap
            self._stop.wait(self.next_delay)

    def poll_once(self) -> bool:
        """Ask the runtime once, now; whether it answered well."""
        if not self._socket_there():
            self._current = (None, None)
            self.next_delay = self.interval
            return False
        try:
            containers = parse_containers(fetch(self.socket_path, self.timeout, self.max_bytes))
        except RuntimeAnswerError as exc:
            self._failed(str(exc))
            return False
        self._count("ok")
        self._current = (RuntimeState(MappingProxyType({c.id: c for c in containers}),
                                      self._clock()), None)
        if self._failures:
            log.info("the container runtime at %s answers again", self.socket_path)
        self._failures = 0
        self.next_delay = self.interval
        return True

    def _count(self, outcome: str) -> None:
        with self._stats_lock:
            self._requests[outcome] = self._requests.get(outcome, 0) + 1

    def _failed(self, reason: str) -> None:
        self._count("error")
        self._failures += 1
        state, failing_since = self._current
        now = self._clock()
        self._current = (state if state is not None else EMPTY,
                         failing_since if failing_since is not None else now)
        ceiling = min(self.backoff_cap, self.interval * 2.0 ** min(self._failures - 1, 10))
        self.next_delay = max(0.01, ceiling * self._random())
        self._limited.log("failed", logging.WARNING,
                          "container runtime socket %s: %s; containers keep the names last "
                          "read for %.0fs; retrying in %.1fs", self.socket_path, reason,
                          self.grace_period, self.next_delay)

    def _socket_there(self) -> bool:
        """Whether a socket is at the path; one line each time that changes."""
        try:
            present = stat.S_ISSOCK(os.stat(self.socket_path).st_mode)
        except OSError:
            present = False
        before, self._present = self._present, present
        if present != before:
            if present:
                log.info("naming containers outside Kubernetes from the runtime socket %s",
                         self.socket_path)
            elif before is None:
                log.info("container attribution off: no container runtime socket at %s "
                         "(picked up if it appears; mount it read-only to name containers)",
                         self.socket_path)
            else:
                log.warning("container runtime socket %s is gone: container attribution is "
                            "off until it is back", self.socket_path)
        return present
