"""The scrape endpoint: render cache, concurrency, health and readiness answers."""

from __future__ import annotations

import gzip
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from otel_gpu.exporters.prometheus import MetricsServer, RenderCache
from tests.support.process import http_get


def _render(registry):
    return lambda: generate_latest(registry)


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    Gauge("demo_value", "a value", registry=reg).set(7)
    return reg


def test_renders_once_per_snapshot(registry, clock):
    key = {"seq": 1}
    cache = RenderCache(_render(registry), lambda: key["seq"], max_age=10.0, clock=clock)
    first = cache.get()
    assert b"demo_value 7.0" in first.body
    assert gzip.decompress(first.gzipped) == first.body
    assert cache.get() is first and cache.renders == 1
    key["seq"] = 2
    assert cache.get() is not first and cache.renders == 2


def test_expires_without_a_new_snapshot(registry, clock):
    cache = RenderCache(_render(registry), lambda: 1, max_age=10.0, clock=clock)
    cache.get()
    clock.advance(9.9)
    cache.get()
    assert cache.renders == 1
    clock.advance(0.2)
    cache.get()
    assert cache.renders == 2


@pytest.fixture
def server(registry):
    state = {"ready": (False, "not ready: no NVML sample has finished yet")}
    cache = RenderCache(_render(registry), lambda: 1, max_age=60.0)
    srv = MetricsServer(("127.0.0.1", 0), cache, lambda: state["ready"])
    srv.start()
    yield srv, state
    srv.stop()


def test_endpoints(server):
    srv, state = server
    base = f"http://127.0.0.1:{srv.port}"
    status, headers, body = http_get(base + "/metrics")
    assert status == 200 and b"demo_value 7.0" in body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    status, headers, body = http_get(base + "/metrics", headers={"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and b"demo_value" in gzip.decompress(body)
    assert http_get(base + "/healthz")[0] == 200
    status, _, body = http_get(base + "/readyz")
    assert status == 503 and body == b"not ready: no NVML sample has finished yet\n"
    state["ready"] = (True, "ready: 8 of 8 device(s) readable")
    assert http_get(base + "/readyz")[:3:2] == (200, b"ready: 8 of 8 device(s) readable\n")
    assert http_get(base + "/nope")[0] == 404


def test_concurrent_scrapes_share_one_render(server):
    srv, _ = server
    url = f"http://127.0.0.1:{srv.port}/metrics"
    barrier = threading.Barrier(20)

    def scrape(_):
        barrier.wait()
        return http_get(url)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(scrape, range(20)))
    assert {status for status, _, _ in answers} == {200}
    assert len({body for _, _, body in answers}) == 1
    assert srv.cache.renders == 1


def test_a_render_failure_is_a_500_not_a_crash(registry):
    class Broken:
        def collect(self):
            raise RuntimeError("bug")

    registry.register(Broken())
    srv = MetricsServer(("127.0.0.1", 0), RenderCache(_render(registry), lambda: 1, max_age=1.0),
                        lambda: (True, "ready"))
    srv.start()
    try:
        status, _, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        assert status == 500 and b"see the collector's log" in body
        assert http_get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 200
    finally:
        srv.stop()
