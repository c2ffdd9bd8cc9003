"""The real process's endpoint under clients that misbehave, over real sockets.

Resets, a TLS renegotiation attempt, slowloris, a burst of connections, small
answers on kept-alive connections and password guessing: each leaves the
endpoint answering, costs bounded threads and CPU, and is at most one log line.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import bcrypt
import pytest

from otel_gpu.export.http.server import MAX_CONNECTIONS, listen_backlog
from testkit.process import connections_left_waiting, http_get, wait_until
from tests.support.certs import make_certs


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _web_config(tmp_path, users: dict[str, str], tls: bool) -> str:
    text = "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items())
    if tls:
        certs = make_certs(tmp_path)
        text += textwrap.dedent(f"""\
            tls_server_config:
              cert_file: {certs.server_cert}
              key_file: {certs.server_key}
        """)
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _tls_client() -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    return client


def _one_json_line_each(proc, *needles: str) -> None:
    """Every line the process wrote is a JSON object, none holds a traceback, and each
    needle is in exactly one line."""
    assert "Traceback" not in proc.log, proc.log
    docs = [json.loads(line) for line in proc.lines if line.strip()]
    for needle in needles:
        hits = [d for d in docs if needle in d["message"]]
        assert len(hits) == 1, (needle, proc.log)
        assert hits[0]["logger"].startswith("otel_gpu") and "exception" not in hits[0]


def test_resets_and_long_passwords_are_one_log_line_never_a_traceback(collector, tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web = _web_config(tmp_path, {"prometheus": hashed}, tls=False)
    proc = collector("--simulate", "t4", "--web-config-file", web, "--log-format", "json")

    def get(password: str) -> int:
        return proc.get("/metrics", headers={"Authorization": _basic("prometheus", password)})[0]

    # /metrics is 503 until the first sample is published (samples_total needs the password)
    wait_until(lambda: get("s3cret") == 200, 20, "the first sample behind basic auth")
    # a password over 72 bytes (bcrypt 5 raises on it) is a wrong password, not an error
    assert get("s3cret" + "x" * 100) == 401
    assert get("s3cret") == 200
    # three resets in the middle of a request head
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        _reset(sock)
    wait_until(lambda: "ConnectionResetError" in proc.log, 10, "the reset's log line")
    assert get("s3cret") == 200  # still serving
    _one_json_line_each(proc, "connection from 127.0.0.1 failed: ConnectionResetError")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_tls_renegotiation_attempt_is_one_log_line(collector, tmp_path):
    """Python's ssl cannot renegotiate; openssl s_client's R command does."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web = _web_config(tmp_path, {"prometheus": hashed}, tls=True)
    proc = collector("--simulate", "t4", "--web-config-file", web, "--log-format", "json")
    client = subprocess.Popen(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{proc.port}", "-tls1_2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(iter(client.stdout.readline, b"")),
                              daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(b"Verify return code" in ln for ln in out), 10,
                   "the TLS 1.2 handshake")
        client.stdin.write(b"R\n")
        client.stdin.flush()
        wait_until(lambda: "SSLError" in proc.log, 10, "the renegotiation's log line")
    finally:
        client.kill()
        client.wait(10)
    _one_json_line_each(proc, "SSLError")
    conn = http.client.HTTPSConnection("127.0.0.1", proc.port, timeout=10, context=_tls_client())
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_slowloris_holds_at_most_the_connection_cap(collector):
    """150 connections that each sent one byte hold at most 64 threads, and a scraper
    still gets its answer at once (the longest-waiting connection makes room)."""
    proc = collector("--simulate", "t4")
    pid = proc.proc.pid
    before = _threads(pid)
    slow = [socket.create_connection(("127.0.0.1", proc.port), timeout=10) for _ in range(150)]
    for sock in slow:
        sock.sendall(b"G")
        sock.setblocking(False)

    def closed_by_server() -> int:
        count = 0
        for sock in slow:
            try:
                count += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionError:
                count += 1
        return count

    try:
        wait_until(lambda: closed_by_server() >= 150 - MAX_CONNECTIONS, 10,
                   "the server to close the connections above its cap")
        assert _threads(pid) <= before + MAX_CONNECTIONS + 8  # 150 before
        started = time.monotonic()
        status, _, body = proc.get("/healthz")
        assert (status, body) == (200, b"ok\n")
        assert time.monotonic() - started < 2.0
        assert proc.metrics()
    finally:
        for sock in slow:
            sock.close()


def test_small_answers_on_a_kept_alive_connection_are_fast(collector):
    """One write and TCP_NODELAY: /healthz and /readyz answer in well under the 40 ms of a
    delayed ACK."""
    proc = collector("--simulate", "t4")
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=10)
    times = []
    for path in ["/healthz", "/readyz"] * 8:
        started = time.perf_counter()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        times.append(time.perf_counter() - started)
    conn.close()
    assert statistics.median(times[1:]) < 0.02, times


def test_a_burst_of_200_connections_fits_the_listen_backlog(collector):
    """With the process stopped (every core busy, say), 200 handshakes still complete: none
    waits for a SYN retry."""
    if listen_backlog() < 201:
        pytest.skip("net.core.somaxconn is below 201 on this machine")
    proc = collector("--simulate", "t4")
    os.kill(proc.proc.pid, signal.SIGSTOP)
    try:
        waiting = connections_left_waiting(proc.port, 200)
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
    assert waiting == 0, f"{waiting} of 200 connections waited for a SYN retry"
    assert proc.get("/healthz")[0] == 200


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_basic_auth_reveals_no_user_names_and_guessing_does_not_starve_scrapes(
        collector, tmp_path):
    """An unknown user costs a bcrypt check like a known one; six guessers in a loop keep
    at most the bcrypt slots busy, and remembered credentials are answered at once."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode()  # ~60 ms a check
    web = _web_config(tmp_path, {"prometheus": hashed}, tls=False)
    proc = collector("--simulate", "t4", "--web-config-file", web, interval="10")
    url = proc.url("/metrics")

    def timed(user: str, password: str) -> tuple[int, float]:
        started = time.perf_counter()
        status, _, _ = http_get(url, headers={"Authorization": _basic(user, password)})
        return status, time.perf_counter() - started

    unknown, known = [], []
    for _ in range(5):  # interleaved, so that both see the same machine
        unknown.append(timed("nobody", "guess"))
        known.append(timed("prometheus", "guess"))
    assert {s for s, _ in unknown + known} == {401}
    unknown_s = statistics.median(t for _, t in unknown)
    known_s = statistics.median(t for _, t in known)
    assert unknown_s > 0.3 * known_s, (unknown_s, known_s)  # 0.9 ms against 84 ms before

    assert timed("prometheus", "s3cret")[0] == 200  # remembered from now on
    stop = threading.Event()
    answers: list[int] = []

    def guess() -> None:
        while not stop.is_set():
            answers.append(timed("prometheus", "guess")[0])

    guessers = 6
    with ThreadPoolExecutor(guessers) as pool:
        try:
            for _ in range(guessers):
                pool.submit(guess)
            wait_until(lambda: len(answers) >= guessers, 10, "the guessing to be under way")
            cpu_before, started = _cpu_seconds(proc.proc.pid), time.monotonic()
            scrapes = []
            for _ in range(20):  # one scrape per answered guess
                answered = len(answers)
                scrapes.append(timed("prometheus", "s3cret"))
                wait_until(lambda: len(answers) > answered, 10, "the next guess")  # noqa: B023
            cores = (_cpu_seconds(proc.proc.pid) - cpu_before) / (time.monotonic() - started)
        finally:
            stop.set()
    assert {s for s, _ in scrapes} == {200}
    assert set(answers) <= {401, 503}
    # bcrypt runs on at most this many cores at once, however many guess (before: all of them)
    slots = max(1, min(2, (os.cpu_count() or 2) // 2))
    assert cores < slots + 0.5, (cores, slots)
    assert statistics.median(t for _, t in scrapes) < 0.02


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _burst(port: int, clients: int, deadline_s: float) -> dict[str, int]:
    """``clients`` connections at once, each sending a whole ``GET /metrics`` and reading
    until the server closes: how many got a 200, a 503 with Retry-After, or nothing."""
    import selectors

    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    selector = selectors.DefaultSelector()
    received: dict[socket.socket, bytearray] = {}
    for _ in range(clients):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE)
        received[sock] = bytearray()
    open_ = set(received)
    deadline = time.monotonic() + deadline_s
    while open_ and time.monotonic() < deadline:
        for key, events in selector.select(timeout=0.5):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                try:
                    sock.sendall(request)  # small: fits the socket buffer at once
                except OSError:
                    selector.unregister(sock)
                    open_.discard(sock)
                    continue
                selector.modify(sock, selectors.EVENT_READ)
                continue
            try:
                chunk = sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if chunk:
                received[sock] += chunk
                continue
            selector.unregister(sock)
            open_.discard(sock)
    outcome = {"200": 0, "503": 0, "nothing": 0, "unfinished": len(open_)}
    for sock, data in received.items():
        head = bytes(data).split(b"\r\n\r\n", 1)[0]
        if head.startswith(b"HTTP/1.1 200 "):
            outcome["200"] += 1
        elif head.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: " in head:
            outcome["503"] += 1
        elif sock not in open_:
            outcome["nothing"] += 1
        sock.close()
    return outcome


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_every_request_of_a_burst_of_1000_clients_is_answered(collector):
    """Once, a burst of 1,000 clients at the 64-connection cap saw 133 and 161 of them closed
    with no answer (a connection whose request had arrived was closed to make room)."""
    if listen_backlog() < 1001:
        pytest.skip("net.core.somaxconn is below 1001 on this machine")
    proc = collector("--simulate", "t4")
    proc.wait_sample(1)
    for _ in range(3):
        outcome = _burst(proc.port, 1000, deadline_s=60.0)
        assert outcome["nothing"] == 0 and outcome["unfinished"] == 0, outcome
        assert outcome["200"] + outcome["503"] == 1000, outcome
    assert proc.get("/healthz")[0] == 200
    assert "Traceback" not in proc.log
