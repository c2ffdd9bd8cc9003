"""A fake container runtime: the Docker Engine API's container list on a unix socket.

A scenario's containers outside Kubernetes that Docker runs (``runtime: docker``
under ``node.containers``) are named by the runtime, not by the kubelet: the
collector asks ``GET /containers/json`` on the runtime's unix socket for each
container's name and image. :class:`RuntimeServer` answers that one request
(with or without an API version prefix, ``/v1.47/containers/json``) with the
documented fields of each container, and 404 for anything else, so
``--simulate`` shows such a container by name, as on a Docker host.

The tests' fake runtime (``tests/support/container_runtime.py``) is this
server scripted by the test: it sets the entries (states, labels), answers the
next calls with raw bytes and a status (:meth:`RuntimeServer.answer_next`),
trickles its answer slowly (:attr:`RuntimeServer.trickle`) and reads the calls
it counted and the paths they asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socketserver
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Self

from otel_gpu.sim.scenario import ContainerSpec

_LIST = re.compile(r"^(?:/v[0-9]{1,2}\.[0-9]{1,3})?/containers/json(?:\?.*)?$")
CREATED = 1764547200
"""When every simulated container was created (seconds since the epoch)."""
KEPT_PATHS = 100
"""Paths of the latest calls kept for a test to read (a demo runs for hours)."""
_STATUS = {"running": "Up 2 hours", "paused": "Up 2 hours (Paused)",
           "restarting": "Restarting (1) 5 seconds ago", "exited": "Exited (0) 2 hours ago",
           "created": "Created", "dead": "Dead"}


def docker_entry(cid: str, name: str, image: str, *, image_id: str, command: str = "",
                 state: str = "running", labels: Mapping[str, str] | None = None
                 ) -> dict[str, Any]:
    """One entry of ``GET /containers/json`` as the Docker Engine API documents it (Podman
    answers the same shape); ``Status`` is the human text Docker gives for ``state``."""
    return {
        "Id": cid,
        "Names": [f"/{name}"],
        "Image": image,
        "ImageID": image_id,
        "Command": command,
        "Created": CREATED,
        "Ports": [],
        "Labels": dict(labels or {}),
        "State": state,
        "Status": _STATUS.get(state, ""),
        "HostConfig": {"NetworkMode": "default"},
        "NetworkSettings": {"Networks": {}},
        "Mounts": [],
    }


def container_entry(container: ContainerSpec) -> dict[str, Any]:
    """A scenario's container as the runtime lists it; one without an image reference
    shows its image id, as one whose tag was removed does."""
    import hashlib  # (0.7 MiB with its C parts) only for a node with containers

    image_id = "sha256:" + hashlib.sha256(f"image/{container.image}/{container.id}"
                                          .encode()).hexdigest()
    return docker_entry(container.id, container.name, container.image or image_id,
                        image_id=image_id)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    runtime: RuntimeServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        status, body, trickle = self.server.runtime._answer(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.47")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # the collector may give up on the answer (too big, too slow): what it should do
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if not trickle:
                self.wfile.write(body)
                return
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(trickle)  # a slow runtime, as the test asked

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the collector's own log says what it got


class RuntimeServer:
    """The runtime API on a unix socket, listing ``containers`` (or what
    :meth:`set_containers` says later), until :meth:`close`. Setters are thread-safe."""

    def __init__(self, socket_path: str | os.PathLike[str],
                 containers: Iterable[ContainerSpec] = ()) -> None:
        self.socket_path = os.fspath(socket_path)
        self._lock = threading.Lock()
        self._body = b"[]"
        self._next: list[tuple[int, bytes]] = []
        self._calls = 0
        self._paths: deque[str] = deque(maxlen=KEPT_PATHS)
        self.trickle = 0.0
        """Seconds between the answer's bytes (to test a whole-exchange deadline)."""
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.set_containers(container_entry(c) for c in containers)

    def set_containers(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """What the list answers from now on: entries as :func:`docker_entry` makes them."""
        body = json.dumps(list(entries)).encode()
        with self._lock:
            self._body = body

    def answer_next(self, n: int, body: bytes, status: int = 200) -> None:
        """Answer the next ``n`` list calls with ``body`` (raw bytes) and ``status``."""
        with self._lock:
            self._next.extend([(status, body)] * n)

    @property
    def calls(self) -> int:
        """Requests received, on any path."""
        with self._lock:
            return self._calls

    @property
    def paths(self) -> list[str]:
        """The paths the latest requests asked, oldest first (:data:`KEPT_PATHS` at most)."""
        with self._lock:
            return list(self._paths)

    def _answer(self, path: str) -> tuple[int, bytes, float]:
        """Status, body and trickle for one request: counted, then the scripted answer."""
        with self._lock:
            self._calls += 1
            self._paths.append(path)
            if _LIST.match(path) is None:
                return 404, b'{"message":"page not found"}', 0.0
            status, body = self._next.pop(0) if self._next else (200, self._body)
            return status, body, self.trickle

    def start(self) -> Self:
        if self._server is not None:
            return self
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket from a runtime that went away
        server = _Server(self.socket_path, _Handler)
        server.runtime = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="sim-runtime",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket, as a runtime going down does."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
