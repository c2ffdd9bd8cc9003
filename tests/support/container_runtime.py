"""A fake Docker-compatible container runtime API for tests: stdlib HTTP on a real unix socket.

It answers ``GET /containers/json`` (and ``/v<version>/containers/json``) with
the documented JSON of the containers a test sets, in the shape Docker and
Podman give it (``Id``, ``Names`` with their leading ``/``, ``Image``,
``ImageID``, ``Command``, ``Created``, ``State``, ``Status``, ``Labels``, ...),
counts the calls, and can misbehave on request: answer raw bytes, an HTTP
status, or trickle its answer slowly.

Library use::

    from tests.support.container_runtime import FakeRuntime, docker_container

    with FakeRuntime() as runtime:
        runtime.set_containers([docker_container("a" * 64, "trainer", "pytorch/pytorch:2.3")])
        ... RuntimeWatch(runtime.socket_path) ...

Manual use (stop with SIGINT/SIGTERM)::

    python -m tests.support.container_runtime --socket /tmp/rt/docker.sock \\
        --container <64 hex id>=<name>=<image> ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

__all__ = ["FakeRuntime", "docker_container"]

_PATH = re.compile(r"^(?:/v[0-9.]+)?/containers/json(?:\?.*)?$")


def docker_container(cid: str, name: str, image: str, *, state: str = "running",
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One entry of ``GET /containers/json`` as the Docker Engine API documents it."""
    return {
        "Id": cid,
        "Names": [f"/{name}"],
        "Image": image,
        "ImageID": "sha256:" + "0" * 64,
        "Command": "python train.py",
        "Created": 1764547200,
        "Ports": [],
        "Labels": labels or {},
        "State": state,
        "Status": "Up 2 hours",
        "HostConfig": {"NetworkMode": "default"},
        "NetworkSettings": {"Networks": {}},
        "Mounts": [],
    }


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    runtime: FakeRuntime


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        runtime = self.server.runtime
        status, body, trickle = runtime._answer(self.path)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.47")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if not trickle:
                self.wfile.write(body)
                return
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(trickle)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the collector gave up on the answer (too big, too slow): what it should do

    def address_string(self) -> str:  # a unix socket has no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


class FakeRuntime:
    """The runtime API on a unix socket, scripted by the test.

    Without ``socket_path`` it makes a short directory under /tmp (unix socket paths
    are limited to 108 bytes) and removes it on :meth:`close`.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(dir="/tmp", prefix="rt")
            socket_path = os.path.join(self._own_dir, "docker.sock")
        self.socket_path = os.fspath(socket_path)
        self._lock = threading.Lock()
        self._body = b"[]"
        self._next: list[tuple[int, bytes]] = []
        self.trickle = 0.0
        """Seconds between the answer's bytes (to test the whole-exchange deadline)."""
        self.calls = 0
        self.paths: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def set_containers(self, containers: Iterable[dict[str, Any]]) -> None:
        body = json.dumps(list(containers)).encode()
        with self._lock:
            self._body = body

    def answer_next(self, n: int, body: bytes, status: int = 200) -> None:
        """Answer the next ``n`` calls with ``body`` (raw bytes) and ``status``."""
        with self._lock:
            self._next.extend([(status, body)] * n)

    def _answer(self, path: str) -> tuple[int, bytes, float]:
        with self._lock:
            self.calls += 1
            self.paths.append(path)
            if not _PATH.match(path):
                return 404, b'{"message":"page not found"}', 0.0
            if self._next:
                status, body = self._next.pop(0)
                return status, body, self.trickle
            return 200, self._body, self.trickle

    def start(self) -> FakeRuntime:
        if self._server is not None:
            return self
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = _Server(self.socket_path, _Handler)
        server.runtime = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-runtime", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def close(self) -> None:
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> FakeRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake container runtime API.")
    parser.add_argument("--socket", required=True, help="unix socket path (< 108 bytes)")
    parser.add_argument("--container", action="append", default=[], metavar="ID=NAME=IMAGE")
    args = parser.parse_args(argv)
    runtime = FakeRuntime(args.socket)
    runtime.set_containers(docker_container(*c.split("=", 2)) for c in args.container)
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    runtime.start()
    print(f"fake container runtime serving on {runtime.socket_path}", flush=True)
    done.wait()
    runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
