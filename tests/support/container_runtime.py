"""A fake Docker-compatible container runtime API for tests: real HTTP on a real unix socket.

The server is the simulator's (:class:`otel_gpu.sim.runtime.RuntimeServer`, which
``--simulate`` runs for a node with Docker containers outside Kubernetes); here
it lives in a short directory of its own and is fed entries a test writes with
:func:`docker_container` (states, labels). The server counts the calls and the
paths they asked, and misbehaves on request: the next answers as raw bytes
with an HTTP status (``answer_next``) or trickled slowly (``trickle``).

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
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any

from otel_gpu.sim.runtime import RuntimeServer, docker_entry

__all__ = ["FakeRuntime", "docker_container"]


def docker_container(cid: str, name: str, image: str, *, state: str = "running",
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One entry of the runtime's list, as a test's training container would show."""
    return docker_entry(cid, name, image, image_id="sha256:" + "0" * 64,
                        command="python train.py", state=state, labels=labels)


class FakeRuntime(RuntimeServer):
    """The simulator's runtime API, scripted by the test.

    Without ``socket_path`` it makes a short directory under /tmp (unix socket paths
    are limited to 108 bytes) and removes it on :meth:`close`.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None) -> None:
        self._own_dir: str | None = None
        if socket_path is None:
            self._own_dir = tempfile.mkdtemp(dir="/tmp", prefix="rt")
            socket_path = os.path.join(self._own_dir, "docker.sock")
        super().__init__(socket_path)

    def close(self) -> None:
        super().close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None


def _container(text: str) -> dict[str, Any]:
    """``ID=NAME=IMAGE`` from the command line as an entry."""
    parts = text.split("=", 2)
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected ID=NAME=IMAGE, got {text[:200]!r}")
    return docker_container(*parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake container runtime API.")
    parser.add_argument("--socket", required=True, help="unix socket path (< 108 bytes)")
    parser.add_argument("--container", action="append", default=[], type=_container,
                        metavar="ID=NAME=IMAGE")
    args = parser.parse_args(argv)
    runtime = FakeRuntime(args.socket)
    runtime.set_containers(args.container)
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        runtime.start()
    except OSError as exc:
        print(f"cannot serve on {args.socket}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"fake container runtime serving on {runtime.socket_path}", flush=True)
    done.wait()
    runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
