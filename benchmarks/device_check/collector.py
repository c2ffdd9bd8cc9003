"""The real ``otel-gpu`` process under check, and reading its exposition."""

from __future__ import annotations

import http.client
import sys
import time
from collections.abc import Callable

POLL = 0.02
"""Polling step of every wait on the collector (each wait has its own deadline)."""
Samples = list[tuple[str, dict[str, str], float]]


def parse(body: str) -> list[tuple[str, dict[str, str], float]]:
    from testkit.exposition import parse_samples

    return parse_samples(body)


class Collector:
    """The real ``otel-gpu`` process, its port from its log line, its /metrics polled."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        from benchmarks.run import Server

        self.started = time.monotonic()
        self.server = Server([sys.executable, "-m", "otel_gpu", *args],
                             env={"PYTHONUNBUFFERED": "1", **(env or {})})

    def scrape(self, timeout: float = 10.0) -> tuple[int, str]:
        port = self.server.port
        if port is None:
            return 0, ""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()

    def first_sample(self, deadline_s: float = 60.0) -> str:
        """Poll /metrics until it stops answering 503 ("no sample yet")."""
        deadline = time.monotonic() + deadline_s
        last = ""
        while time.monotonic() < deadline:
            if not self.server.alive():
                raise RuntimeError("otel-gpu exited:\n" + "\n".join(self.server.tail))
            try:
                status, body = self.scrape()
            except OSError as exc:
                status, body = 0, str(exc)
            if status == 200:
                return body
            last = f"{status} {body[:200]}"
            time.sleep(POLL)
        raise RuntimeError(f"no sample within {deadline_s:g} s (last answer: {last}):\n"
                           + "\n".join(self.server.tail))

    def fresh(self, after: float | None = None, deadline_s: float = 30.0,
              until: Callable[[str], bool] | None = None) -> tuple[str, float, float]:
        """The first body whose sample count moved past ``after`` (and meets ``until``):
        (body, its sample count, when it was scraped)."""
        deadline = time.monotonic() + deadline_s
        while True:
            status, body = self.scrape()
            samples = one(parse(body), "otel_gpu_samples_total") if status == 200 else None
            if samples is not None and (after is None or samples > after) and (
                    until is None or until(body)):
                return body, samples, time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no fresh sample past {after} within {deadline_s:g} s")
            if not self.server.alive():
                raise RuntimeError("otel-gpu exited:\n" + "\n".join(self.server.tail))
            time.sleep(POLL)

    def stop(self) -> None:
        self.server.stop()


def one(samples: list[tuple[str, dict[str, str], float]], name: str,
         **labels: str) -> float | None:
    found = [v for n, lab, v in samples
             if n == name and all(lab.get(k) == v for k, v in labels.items())]
    return found[0] if len(found) == 1 else None


def index_of(samples: Samples) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples by family."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, lab, value in samples:
        out.setdefault(name, []).append((lab, value))
    return out
