"""The scrape endpoint: render cache, concurrency, health and readiness answers, and the
bounds that keep misbehaving clients from holding it (over real sockets)."""

from __future__ import annotations

import base64
import gzip
import http.client
import logging
import socket
import ssl
import statistics
import struct
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from otel_gpu.export.http import server as http_server
from otel_gpu.export.http.basic_auth import BasicAuth
from otel_gpu.export.http.endpoint import MetricsServer
from otel_gpu.export.http.server import listen_backlog
from otel_gpu.export.http.webconfig import WebConfig
from otel_gpu.export.prometheus.cache import RenderCache
from testkit.process import connections_left_waiting, http_get, wait_until
from tests.support.certs import make_certs
from tests.support.exporters import WrittenBody


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


def test_a_render_failure_is_a_500_not_a_crash(registry, caplog):
    class Broken:
        def collect(self):
            raise RuntimeError("bug")

    registry.register(Broken())
    srv = MetricsServer(("127.0.0.1", 0), RenderCache(_render(registry), lambda: 1, max_age=1.0),
                        lambda: (True, "ready"))
    srv.start()
    try:
        with caplog.at_level(logging.ERROR, logger="otel_gpu"):
            status, _, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        assert status == 500 and b"see the collector's log" in body
        assert http_get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 200
    finally:
        srv.stop()
    (record,) = caplog.records
    assert record.getMessage().startswith("rendering /metrics failed: RuntimeError: bug at ")
    assert not record.exc_info  # one line, no traceback


def _serve(registry, **kw) -> MetricsServer:
    web = kw.pop("web", None)
    readiness = kw.pop("readiness", lambda: (True, "ready\n"))
    srv = MetricsServer(("127.0.0.1", 0), RenderCache(_render(registry), lambda: 1, max_age=60.0),
                        readiness, web, **kw)
    srv.start()
    return srv


@pytest.fixture
def serve(registry):
    servers: list[MetricsServer] = []

    def start(**kw) -> MetricsServer:
        servers.append(_serve(registry, **kw))
        return servers[-1]

    yield start
    for srv in servers:
        srv.stop()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes ``sock`` (an end of file or a reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_small_responses_on_a_kept_alive_connection_leave_at_once(serve):
    """Headers and body in one write with TCP_NODELAY: no 40 ms delayed-ACK stall."""
    srv = serve()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    times = []
    for _ in range(15):
        started = time.perf_counter()
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"ok\n"
        times.append(time.perf_counter() - started)
    conn.close()
    assert statistics.median(times[1:]) < 0.02, times  # 44 ms each with two writes


def test_the_listen_backlog_is_the_systems_maximum(tmp_path, registry):
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("4096\n")
    assert listen_backlog(str(somaxconn)) == 4096
    somaxconn.write_text("many\n")
    assert listen_backlog(str(somaxconn)) == socket.SOMAXCONN
    assert listen_backlog(str(tmp_path / "missing")) == socket.SOMAXCONN
    srv = MetricsServer(("127.0.0.1", 0), None, lambda: (True, "ready"))
    try:
        assert srv.request_queue_size == listen_backlog() >= socket.SOMAXCONN
    finally:
        srv.server_close()


def test_a_burst_of_200_connections_fits_the_backlog(registry):
    """Not accepting yet (as when every core is busy): 200 handshakes still complete."""
    if listen_backlog() < 201:
        pytest.skip("net.core.somaxconn is below 201 on this machine")
    srv = MetricsServer(("127.0.0.1", 0), None, lambda: (True, "ready"))
    try:
        waiting = connections_left_waiting(srv.port, 200)
        assert waiting == 0, f"{waiting} of 200 connections waited for a SYN retry"
    finally:
        srv.server_close()


def _trickle(sock: socket.socket, data: bytes) -> float | None:
    """Send ``data`` a byte at a time, about 20 a second; the seconds until the server
    closed the connection, or None if it never did."""
    sock.settimeout(0.05)
    started = time.monotonic()
    try:
        for byte in data:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1024) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                continue  # the recv timeout paces the trickle
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
        return None
    finally:
        sock.close()


def test_a_trickling_request_is_cut_at_the_head_deadline(serve):
    """The head deadline is total: a byte now and then does not renew it (slowloris)."""
    srv = serve(head_timeout=0.5)
    closed = _trickle(_connect(srv.port), b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200)
    assert closed is not None and closed < 3.0, closed
    wait_until(lambda: srv.connections == 0, 5, "the slow connection to be forgotten")
    assert http_get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 200


def test_a_trickling_tls_handshake_is_cut_at_the_head_deadline(serve, tmp_path):
    """The TLS handshake counts against the same total deadline as the request head."""
    certs = make_certs(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(certs.server_cert, certs.server_key)
    srv = serve(web=WebConfig(tls=server_tls), head_timeout=0.5)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    hello_maker = client.wrap_bio(ssl.MemoryBIO(), outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        hello_maker.do_handshake()
    hello = outgoing.read()
    closed = _trickle(_connect(srv.port), hello)
    assert closed is not None and closed < 3.0, (closed, len(hello))


def test_an_idle_kept_alive_connection_ends_after_the_head_deadline(serve):
    srv = serve(head_timeout=0.3)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok\n"
    assert _closed_by_server(conn.sock, 5.0)
    conn.close()


def test_at_the_cap_a_new_connection_takes_the_longest_waiting_ones_place(serve):
    srv = serve(max_connections=4)
    idle = [_connect(srv.port) for _ in range(4)]
    wait_until(lambda: srv.connections == 4, 5, "four connections")
    status, _, body = http_get(f"http://127.0.0.1:{srv.port}/healthz")
    assert (status, body) == (200, b"ok\n")
    assert _closed_by_server(idle[0], 5.0)  # the oldest idle one made room
    assert srv.connections <= 4
    for sock in idle:
        sock.close()


def test_at_the_cap_with_every_connection_answering_a_new_one_gets_503(serve):
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow_readiness():
        entered.release()
        release.wait(10)
        return True, "ready"

    srv = serve(max_connections=3, readiness=slow_readiness)
    url = f"http://127.0.0.1:{srv.port}"
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(http_get, url + "/readyz") for _ in range(3)]
        for _ in range(3):
            assert entered.acquire(timeout=10)
        sock = _connect(srv.port)
        sock.settimeout(5)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        release.set()
        assert [f.result(10)[0] for f in busy] == [200, 200, 200]
    assert http_get(url + "/healthz")[0] == 200


def test_a_reset_mid_request_is_one_log_line(serve, caplog, capsys):
    srv = serve()
    with caplog.at_level(logging.DEBUG, logger="otel_gpu"):
        for _ in range(3):
            sock = _connect(srv.port)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            wait_until(lambda: srv.connections == 1, 5, "the connection to be served")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset, not a close
            wait_until(lambda: srv.connections == 0, 5, "the reset connection to end")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == ["connection from 127.0.0.1 failed: ConnectionResetError: [Errno 104] "
                     "Connection reset by peer"]  # the two repeats are held back
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in capsys.readouterr().err


def test_extra_headers_from_the_web_config_are_on_every_answer(serve):
    web = WebConfig(headers=(("X-Content-Type-Options", "nosniff"),))
    srv = serve(web=web)
    for path in ("/metrics", "/healthz", "/nope"):
        _, headers, _ = http_get(f"http://127.0.0.1:{srv.port}{path}")
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Server"] == "otel-gpu"


def test_too_many_password_checks_at_once_is_a_503(serve, monkeypatch):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4))
    srv = serve(web=WebConfig(users={"prometheus": hashed}))
    srv.auth = BasicAuth({"prometheus": hashed}, max_concurrent=1, wait=0.05)
    release = threading.Event()
    started = threading.Event()

    def stuck(_pw, _h):
        started.set()
        release.wait(10)
        return False

    monkeypatch.setattr(bcrypt, "checkpw", stuck)
    url = f"http://127.0.0.1:{srv.port}/metrics"

    def with_password(password: str):
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        return http_get(url, headers={"Authorization": f"Basic {token}"})

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(with_password, "guess")
        wait_until(started.is_set, 10, "the first password check")
        status, headers, _ = with_password("another guess")
        assert status == 503 and headers["Retry-After"] == "1"
        release.set()
        assert first.result(10)[0] == 401


def test_the_module_bounds(registry):
    assert http_server.MAX_CONNECTIONS == 64
    assert http_server.HEAD_TIMEOUT_S == 10.0
    srv = MetricsServer(("127.0.0.1", 0), None, lambda: (True, "ready"))
    try:
        assert (srv.max_connections, srv.head_timeout) == (64, 10.0)
    finally:
        srv.server_close()


def test_a_refresh_renders_before_the_scrape(registry, clock):
    key = {"seq": 1}
    cache = RenderCache(_render(registry), lambda: key["seq"], max_age=10.0, clock=clock)
    cache.refresh()
    assert cache.renders == 1
    cache.refresh()  # nothing new: not rendered again
    assert cache.get().key == 1 and cache.renders == 1
    key["seq"] = 2
    cache.refresh()
    assert cache.get().key == 2 and cache.renders == 2


def _held_at_seq_2(key: dict, started: threading.Event, release: threading.Event):
    """A render of ``key``'s seq that, at seq 2, says it started and waits to be released."""
    def render():
        if key["seq"] == 2:
            started.set()
            release.wait(5)
        return f"demo_seq {key['seq']}\n".encode()
    return render


@pytest.mark.parametrize("age", [0.0, 11.0], ids=["fresh", "past-max-age"])
def test_a_scrape_during_a_refresh_is_served_the_previous_body(clock, age):
    """No scrape waits for a render in progress, even when the last body is past max_age
    (a slow node whose render outlasts it)."""
    key = {"seq": 1}
    started, release = threading.Event(), threading.Event()
    render = _held_at_seq_2(key, started, release)

    cache = RenderCache(render, lambda: key["seq"], max_age=10.0, clock=clock)
    cache.refresh()
    clock.advance(age)
    key["seq"] = 2
    publisher = threading.Thread(target=cache.refresh)
    publisher.start()
    assert started.wait(5)
    assert cache.get().body == b"demo_seq 1\n" and cache.renders == 1
    release.set()
    publisher.join(5)
    assert cache.get().body == b"demo_seq 2\n" and cache.renders == 2


def test_a_failed_refresh_is_logged_and_the_scrape_tries_again(clock, caplog):
    calls = {"n": 0}

    def render():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug")
        return b"demo_value 1\n"

    cache = RenderCache(render, lambda: 1, max_age=10.0, clock=clock)
    with caplog.at_level(logging.ERROR, logger="otel_gpu"):
        cache.refresh()  # never raises into the publisher
    assert "rendering /metrics failed: RuntimeError: bug" in caplog.text
    assert cache.get().body == b"demo_value 1\n" and cache.renders == 1


def test_a_body_past_max_age_is_rendered_by_the_scrape(clock):
    """No publish for max_age (a stuck sampler): the scrape renders, so the age grows."""
    ages = iter(range(100))
    cache = RenderCache(lambda: f"age {next(ages)}\n".encode(), lambda: 1, max_age=10.0,
                        clock=clock)
    cache.refresh()
    clock.advance(9.9)
    assert cache.get().body == b"age 0\n"
    clock.advance(0.2)
    assert cache.get().body == b"age 1\n" and cache.renders == 2


def test_a_kept_alive_scrape_sets_the_socket_timeout_once_per_request_at_most(
        serve, monkeypatch):
    """Once the timeout was set again before every read and write (six system calls a
    scrape where a static server makes two)."""
    srv = serve()
    calls: list[int] = []
    original = socket.socket.settimeout

    def counted(sock, value):
        with_port = sock.getsockname()[1] if sock.fileno() >= 0 else None
        if with_port == srv.port:  # the server's side of the connection
            calls.append(1)
        return original(sock, value)

    monkeypatch.setattr(socket.socket, "settimeout", counted)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        for _ in range(20):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and b"demo_value" in response.read()
    finally:
        conn.close()
    assert len(calls) <= 1, len(calls)


def test_metrics_answer_503_until_the_first_sample_is_published(registry):
    """Once 200 with an empty body: Prometheus recorded up=1 with no samples, and every
    series went stale once after each restart."""
    published = {"yet": False}
    cache = RenderCache(_render(registry), lambda: 0, max_age=60.0,
                        published=lambda: published["yet"])
    srv = MetricsServer(("127.0.0.1", 0), cache, lambda: (False, "no sample yet"))
    srv.start()
    try:
        status, headers, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        assert status == 503 and b"no sample" in body
        assert headers["Retry-After"] == "1"
        assert cache.renders == 0
        published["yet"] = True
        status, _, body = http_get(f"http://127.0.0.1:{srv.port}/metrics")
        assert status == 200 and b"demo_value 7.0" in body
    finally:
        srv.stop()


def test_nobody_scraping_publications_render_nothing_and_serve_nothing_stale(clock):
    """A render is an SDK collection of every series: made for a reader. With no scrape for
    idle_after, a publication only drops the body it made stale; the next scrape renders
    the newest snapshot (never an old body), and the publications after it render again."""
    key = {"seq": 1}
    cache = RenderCache(lambda: f"demo_seq {key['seq']}\n".encode(), lambda: key["seq"],
                        max_age=100.0, clock=clock, idle_after=30.0)
    cache.refresh()  # no scrape yet: nothing rendered
    assert (cache.renders, cache.skipped) == (0, 1)
    assert cache.get().body == b"demo_seq 1\n" and cache.renders == 1
    key["seq"] = 2
    clock.advance(29.0)
    cache.refresh()  # a scrape 29 s ago: rendered for the next one
    assert cache.renders == 2
    assert cache.get().body == b"demo_seq 2\n" and cache.renders == 2
    clock.advance(30.0)
    key["seq"] = 3
    cache.refresh()  # nobody for 30 s: the seq 2 body is dropped, not rendered anew
    assert (cache.renders, cache.skipped) == (2, 2)
    assert cache.get().body == b"demo_seq 3\n" and cache.renders == 3
    key["seq"] = 4
    cache.refresh()
    assert cache.renders == 4 and cache.get().body == b"demo_seq 4\n"


def test_a_scrape_after_an_idle_spell_waits_for_the_render_rather_than_take_an_old_body(clock):
    """While the first scrape after an idle spell renders, another one waits for that body:
    the one before it was dropped, since it is some publications old."""
    key = {"seq": 1}
    started, release = threading.Event(), threading.Event()
    render = _held_at_seq_2(key, started, release)

    cache = RenderCache(render, lambda: key["seq"], max_age=100.0, clock=clock, idle_after=30.0)
    assert cache.get().body == b"demo_seq 1\n"
    clock.advance(31.0)
    key["seq"] = 2
    cache.refresh()
    assert cache.renders == 1
    bodies: list[bytes] = []
    first = threading.Thread(target=lambda: bodies.append(cache.get().body))
    first.start()
    assert started.wait(5)
    clock.advance(1.0)
    second = threading.Thread(target=lambda: bodies.append(cache.get().body))
    second.start()
    # once it has asked, the body it gets is settled: none exists until the render ends
    wait_until(lambda: cache._asked == clock(), timeout=5)
    assert bodies == []  # not served demo_seq 1 meanwhile
    release.set()
    first.join(5)
    second.join(5)
    assert bodies == [b"demo_seq 2\n", b"demo_seq 2\n"] and cache.renders == 2


def test_the_accept_loop_sleeps_until_a_connection_or_the_stop(registry, monkeypatch):
    """Waiting for a connection wakes for nothing else: no poll interval (five wake-ups a
    second cost 7 % of the collector's CPU at one GPU); stop still ends it at once."""
    import selectors
    import threading

    from otel_gpu.export.http.server import _Selector

    waits: list[object] = []
    real = _Selector.select

    def recorded(self, timeout=None):
        if threading.current_thread().name == "otel-gpu-http":
            waits.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(_Selector, "select", recorded)
    assert _Selector in (getattr(selectors, "PollSelector", None), selectors.SelectSelector)
    cache = RenderCache(_render(registry), lambda: 1, max_age=60.0)
    srv = MetricsServer(("127.0.0.1", 0), cache, lambda: (True, "ready"))
    srv.start()
    try:
        for _ in range(3):  # each on a new connection: three accepts
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", "/readyz")
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        srv.stop()
    assert srv._thread is not None and not srv._thread.is_alive()
    assert len(waits) >= 4 and set(waits) == {None}, waits


def test_a_new_render_starts_after_the_old_body_let_go_of_its_collection(clock):
    """Each body kept the collection it was written from until the next body replaced it,
    so that two collections were alive while a new one was made (a mebibyte each at 500
    pods). The old body is still served, in the formats it has written."""
    made: list[weakref.ref] = []
    alive_at_render: list[bool] = []

    def render():
        alive_at_render.append(any(ref() is not None for ref in made))
        source = WrittenBody(f"demo_seq {len(made)}\n".encode())
        made.append(weakref.ref(source))
        return source

    key = {"seq": 1}
    cache = RenderCache(render, lambda: key["seq"], max_age=100.0, clock=clock)
    first = cache.get()
    assert first.body == b"demo_seq 0\n"
    key["seq"] = 2
    cache.refresh()
    assert alive_at_render == [False, False]
    assert cache.get().body == b"demo_seq 1\n"


def test_a_render_that_fails_after_the_old_body_let_go_is_retried_by_the_next_scrape(clock):
    bodies = iter([b"one\n", RuntimeError("bug"), b"three\n"])

    def render():
        got = next(bodies)
        if isinstance(got, Exception):
            raise got
        return WrittenBody(got)

    key = {"seq": 1}
    cache = RenderCache(render, lambda: key["seq"], max_age=100.0, clock=clock)
    assert cache.get().body == b"one\n"
    key["seq"] = 2
    cache.refresh()  # fails, logged; the old body has let go of its collection
    assert cache.get().body == b"three\n" and cache.renders == 2
