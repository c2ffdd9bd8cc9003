"""A fake container runtime for a simulated node: the Docker Engine API's container list.

A scenario's containers outside Kubernetes that Docker runs (``runtime: docker``
under ``node.containers``) are named by the runtime, not by the kubelet: the
collector asks ``GET /containers/json`` on the runtime's unix socket for each
container's name and image. :class:`RuntimeServer` answers that one request
(with or without an API version prefix, ``/v1.47/containers/json``) with the
documented fields of each container, and 404 for anything else, so
``--simulate`` shows such a container by name, as on a Docker host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socketserver
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from otel_gpu.sim.scenario import ContainerSpec

_LIST = re.compile(r"^(?:/v[0-9]{1,2}\.[0-9]{1,3})?/containers/json(?:\?.*)?$")
CREATED = 1764547200
"""When every simulated container was created (seconds since the epoch)."""


def container_entry(container: ContainerSpec) -> dict[str, Any]:
    """One container as ``GET /containers/json`` lists it; a container without an image
    reference shows its image id, as one whose tag was removed does."""
    image_id = "sha256:" + hashlib.sha256(f"image/{container.image}/{container.id}"
                                          .encode()).hexdigest()
    return {
        "Id": container.id,
        "Names": [f"/{container.name}"],
        "Image": container.image or image_id,
        "ImageID": image_id,
        "Command": "",
        "Created": CREATED,
        "Ports": [],
        "Labels": {},
        "State": "running",
        "Status": "Up 2 hours",
        "HostConfig": {"NetworkMode": "default"},
        "NetworkSettings": {"Networks": {}},
        "Mounts": [],
    }


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    body: bytes = b"[]"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        found = _LIST.match(self.path) is not None
        body = self.server.body if found else b'{"message":"page not found"}'
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.47")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the collector's own log says what it got


class RuntimeServer:
    """The runtime API on a unix socket, listing ``containers``, until :meth:`close`."""

    def __init__(self, socket_path: str | os.PathLike[str],
                 containers: Iterable[ContainerSpec]) -> None:
        self.socket_path = os.fspath(socket_path)
        self.body = json.dumps([container_entry(c) for c in containers]).encode()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> RuntimeServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = _Server(self.socket_path, _Handler)
        server.body = self.body
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="sim-runtime",
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
