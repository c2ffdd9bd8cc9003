"""A real Prometheus server for end-to-end naming tests.

Dashboards query what Prometheus stored, not what the collector exposed, so the
naming tests scrape the collector with the real server and ask it PromQL over
its HTTP API.  :class:`PrometheusServer` writes a minimal configuration (one
job, static targets only, nothing that reaches the network), runs the binary on
a free 127.0.0.1 port with its TSDB under a test directory, and offers
``query`` / ``wait_for_query`` that fail with Prometheus' own error message or
with the targets' scrape health, so a failing test says why.

Timing note: ``/-/ready`` answers within a fraction of a second, but Prometheus
2.x hands static targets to the scrape manager on a fixed 5 s tick, so the first
samples appear about 5-6 s after start.  Wait for data with ``wait_for_query``.
"""

from __future__ import annotations

import atexit
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pytest
import yaml

__all__ = [
    "PrometheusServer",
    "Sample",
    "parse_duration",
    "skip_unless_available",
]

Sample = tuple[dict[str, str], float]
"""One element of an instant-vector result: (labels including ``__name__``, value)."""

_POLL_STEP = 0.05  # polling step of the deadline loops, not a wait for an event
_HTTP_TIMEOUT = 10.0
_UNITS_MS = {
    "y": 365 * 86_400_000,
    "w": 7 * 86_400_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1000,
    "ms": 1,
}
_DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")

# Plain urllib would honour *_proxy variables; Prometheus on 127.0.0.1 must be reached directly.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_duration(text: str) -> int:
    """Milliseconds of a Prometheus duration such as ``1s``, ``500ms`` or ``1m30s``.

    Needed to derive a ``scrape_timeout`` below ``scrape_interval``; Prometheus
    refuses a configuration where the timeout exceeds the interval.
    """
    pos, total = 0, 0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(f"not a positive Prometheus duration: {text!r}")
    return total


def _ci_requires_binary() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_unless_available(binary: str = "prometheus") -> str:
    """Return the binary's path, or skip the test when it is not installed.

    Under CI (``CI`` set to a true value) a missing binary fails instead of
    skipping: CI installs Debian's ``prometheus`` package, so a skip there
    would silently hide the end-to-end naming tests.
    """
    path = shutil.which(binary)
    if path is None:
        message = f"{binary!r} not found on PATH (Debian: apt-get install prometheus)"
        if _ci_requires_binary():
            pytest.fail(f"{message}; CI must run the Prometheus tests")
        pytest.skip(message)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """A Prometheus subprocess scraping ``targets``; use as a context manager.

    One server per ``workdir``: the configuration, the TSDB and the log live there.
    """

    def __init__(
        self,
        targets: list[str],
        *,
        scrape_interval: str = "1s",
        workdir: Path,
        binary: str = "prometheus",
        scrape_timeout: str | None = None,
        job_name: str = "otel-gpu",
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        if not targets:
            raise ValueError("at least one scrape target is needed")
        interval_ms = parse_duration(scrape_interval)
        if scrape_timeout is None:
            # Comfortably below the interval, so a slow scrape shows as a timeout, not overlap.
            scrape_timeout = f"{max(1, interval_ms * 4 // 5)}ms"
        if parse_duration(scrape_timeout) > interval_ms:
            raise ValueError(f"scrape_timeout {scrape_timeout} exceeds {scrape_interval}")
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.scrape_timeout = scrape_timeout
        self.job_name = job_name
        self.binary = binary
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.workdir = Path(workdir)
        self.config_path = self.workdir / "prometheus.yml"
        self.data_path = self.workdir / "data"
        self.log_path = self.workdir / "prometheus.log"
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # ----------------------------------------------------------------- lifecycle

    def config(self) -> dict[str, Any]:
        """The configuration written to ``prometheus.yml``; a dict so tests can inspect it."""
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_timeout,
                "evaluation_interval": self.scrape_interval,
            },
            # No rule_files, alerting, remote_write or remote_read: nothing leaves the host.
            "scrape_configs": [
                {
                    "job_name": self.job_name,
                    "metrics_path": "/metrics",
                    "scheme": "http",
                    # Keep the exporter's pod/namespace/job labels as they are, as the
                    # documented scrape configs do, instead of exported_* renames.
                    "honor_labels": True,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }

    def _command(self) -> list[str]:
        assert self.port is not None
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.path={self.data_path}",
            "--log.level=info",
            *self.extra_args,
        ]

    @staticmethod
    def _env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS}
        env.setdefault("GOMAXPROCS", "2")  # a test helper need not take every core
        return env

    def start(self) -> PrometheusServer:
        """Run Prometheus and wait until ``/-/ready`` answers 200.

        Retries on a lost race for the free port; on any other failure the
        process is stopped and AssertionError carries the tail of its log.
        """
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("this PrometheusServer is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        for attempt in range(3):
            self.port = _free_port()
            self._spawn()
            try:
                self._wait_ready()
                break
            except AssertionError:
                self.stop()
                if attempt < 2 and "address already in use" in self.log_tail():
                    continue
                raise
        atexit.register(self.stop)  # last resort if a test run is interrupted
        return self

    def _spawn(self) -> None:
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"$ {' '.join(self._command())}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self._command(),
            cwd=self.workdir,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while True:
            code = self.proc.poll()
            if code is not None:
                raise AssertionError(
                    f"prometheus exited with code {code} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                status, body = self._get("/-/ready")
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as err:  # refused while the listener is not up yet
                last = repr(err)
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"prometheus not ready after {self.start_timeout} s (last: {last}); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(_POLL_STEP)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; reap the process. Safe to call twice."""
        atexit.unregister(self.stop)
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------- helpers

    @property
    def url(self) -> str:
        """Base URL of the HTTP API and UI."""
        if self.port is None:
            raise RuntimeError("PrometheusServer not started")
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        """Last ``lines`` of Prometheus' own log, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as err:
            return f"(no log: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def _get(self, path: str, params: dict[str, str] | None = None) -> tuple[int, bytes]:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=_HTTP_TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:  # API errors come with a JSON body
            with err:
                return err.code, err.read()

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        status, body = self._get(path, params)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            if isinstance(doc, dict) and "error" in doc:
                detail = f"{doc.get('errorType', 'error')}: {doc['error']}"
            else:
                detail = body[:500].decode(errors="replace")
            what = f"{path} {params}" if params else path
            raise AssertionError(f"prometheus rejected {what} (HTTP {status}): {detail}")
        return doc["data"]

    # ------------------------------------------------------------------- queries

    def query(self, promql: str) -> list[Sample]:
        """Evaluate ``promql`` now; (labels, value) per series of the instant vector.

        A scalar result comes back as one sample with empty labels. A query that
        Prometheus rejects raises AssertionError with its error message.
        """
        data = self._api("/api/v1/query", {"query": promql})
        kind = data.get("resultType")
        if kind == "vector":
            return [(dict(item["metric"]), float(item["value"][1])) for item in data["result"]]
        if kind == "scalar":
            return [({}, float(data["result"][1]))]
        raise AssertionError(f"{promql!r} gave a {kind} result, not an instant vector")

    def wait_for_query(
        self,
        promql: str,
        predicate: Callable[[list[Sample]], object] = bool,
        timeout: float = 30.0,
    ) -> list[Sample]:
        """Poll ``promql`` until ``predicate(result)`` holds; return that result.

        Scrapes land on Prometheus' schedule, so tests wait for data rather than
        sleep.  A rejected query fails at once; at the deadline the message shows
        the last result and every target's scrape health.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {timeout} s, {promql!r} still does not satisfy the predicate;\n"
                    f"last result: {result!r}\n"
                    f"targets: {self._describe_targets()}"
                )
            time.sleep(_POLL_STEP)

    def targets_health(self) -> list[dict[str, Any]]:
        """The active targets from ``/api/v1/targets`` (``health``, ``lastError``, ...)."""
        return list(self._api("/api/v1/targets", {"state": "active"})["activeTargets"])

    def _describe_targets(self) -> str:
        try:
            targets = self.targets_health()
        except (AssertionError, OSError) as err:
            return f"(could not read /api/v1/targets: {err})"
        if not targets:
            return "none active yet (Prometheus applies static targets on a 5 s tick)"
        return "; ".join(
            f"{t.get('scrapeUrl')} health={t.get('health')} "
            f"lastError={t.get('lastError')!r} lastScrape={t.get('lastScrape')}"
            for t in targets
        )

    @property
    def pid(self) -> int | None:
        """Process id while started, for tests that check nothing is left behind."""
        return None if self.proc is None else self.proc.pid


class AsText004Proxy(http.server.ThreadingHTTPServer):
    """A proxy that asks the collector for text 0.0.4 whatever Prometheus accepts."""

    def __init__(self, upstream: str) -> None:
        upstream_url = upstream

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                request = urllib.request.Request(upstream_url + self.path,
                                                 headers={"Accept": "text/plain;version=0.0.4"})
                with urllib.request.urlopen(request, timeout=10) as answer:
                    body, content_type = answer.read(), answer.headers["Content-Type"]
                self.server.asked.append(self.headers.get("Accept", ""))  # type: ignore[attr-defined]
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.asked: list[str] = []


class TwoJobs(PrometheusServer):
    """Scrapes the collector directly (job ``openmetrics``) and through the proxy (``text``)."""

    def __init__(self, direct: str, proxied: str, **kw) -> None:
        super().__init__([direct], **kw)
        self.proxied = proxied

    def config(self) -> dict:
        config = super().config()
        (job,) = config["scrape_configs"]
        job["job_name"] = "openmetrics"
        config["scrape_configs"].append({**job, "job_name": "text",
                                         "static_configs": [{"targets": [self.proxied]}]})
        return config
