"""The real ``otel-gpu`` process, HTTP reads, and polling with a deadline."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from testkit.exposition import series

ROOT = Path(__file__).resolve().parents[1]
_SERVING = re.compile(r"serving (?:metrics|probes) on https?://"
                      r"(?:\[[0-9A-Fa-f:.%]+\]|[^:/\[]+):(\d+)/(?:metrics|healthz)")
"""The start-up line naming the endpoint's port: the Prometheus exporter's, or the probes'
when no exporter serves /metrics."""


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, what: str = "") -> object:
    """Poll ``predicate`` until it returns something truthy (returned), or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)  # polling step, not a wait for an event


def http_get(url: str, timeout: float = 10.0, headers: dict | None = None):
    """(status, headers, body bytes); HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


class CollectorProcess:
    """The real ``otel-gpu`` process, started with ``python -m otel_gpu``."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_gpu", *args],
            cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port: int | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_serving(self, timeout: float = 20.0) -> int:
        def found():
            for line in self.lines:
                match = _SERVING.search(line)
                if match:
                    return int(match.group(1))
            if self.proc.poll() is not None:
                raise AssertionError(f"otel-gpu exited {self.proc.returncode}:\n{self.log}")
            return None

        self.port = wait_until(found, timeout, "the serving log line")
        return self.port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, **kw):
        return http_get(self.url(path), **kw)

    def metrics(self) -> str:
        """The /metrics body, once there is one (until the first sample it is a 503)."""
        def answered():
            status, _, body = self.get("/metrics")
            if status == 503 and body.startswith(b"no sample yet"):
                return None
            assert status == 200, body
            return body.decode()

        return wait_until(answered, 20.0, "the first sample")

    def wait_sample(self, seq: int, timeout: float = 20.0) -> str:
        """Wait until /metrics shows at least ``seq`` samples; return that body."""
        def ready():
            text = self.metrics()
            done = series(text, "otel_gpu_samples_total")
            return text if done and done[0][1] >= seq else None

        return wait_until(ready, timeout, f"sample {seq}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float]:
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(2)
        return code, time.monotonic() - started


def serve_args(*args: str, interval: str = "0.2") -> list[str]:
    """``serve`` on a free 127.0.0.1 port, sampling every ``interval`` seconds."""
    return ["serve", "--listen", "127.0.0.1:0", "--interval", interval, *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0):
    """Run ``python -m otel_gpu ARGS`` to completion: (exit code, stdout, stderr)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "otel_gpu", *args], cwd=ROOT, env=full_env,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr


def connections_left_waiting(port: int, count: int = 200, within: float = 0.8) -> int:
    """Open ``count`` connections at once: how many had no completed handshake ``within``
    seconds (a SYN the listen backlog dropped is retried only after 1 s)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
        deadline = time.monotonic() + within
        pending = set(socks)
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending), [], 0.05)
            pending -= {s for s in writable
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0}
        return len(pending)
    finally:
        for sock in socks:
            sock.close()


def start_on_node(collector, tmp_path: Path, kubelet, scenario: str, *args: str,
                  env: dict[str, str] | None = None):
    """The collector on a simulated node whose processes and pod logs the scenario
    describes (``/proc`` and ``/var/log/pods`` written under ``tmp_path``), with process
    usage on and the fake kubelet polled every 0.1 s."""
    from otel_gpu.sim import load_scenario
    from otel_gpu.sim.node import write_node

    path = tmp_path / "scenario.yaml"
    path.write_text(scenario)
    paths = write_node(load_scenario(str(path)).node, tmp_path / "node")
    return collector(
        "--simulate", str(path), "--kubelet-socket", kubelet.socket_path,
        "--kubelet-interval", "0.1", "--process-usage", "true",
        "--proc-root", str(paths.proc_root), "--pod-log-root", str(paths.pod_log_root),
        *args, env=env,
    )

