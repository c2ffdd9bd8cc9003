"""A small threaded HTTP/1.1 server bounded against clients that misbehave.

One thread per connection, and:

- at most :data:`MAX_CONNECTIONS` connections are served at once. When all
  are taken, the next connection waits in the listen backlog (not accepted)
  for a slot, at most :data:`ADMIT_WAIT_S`; it may take the place of an idle
  keep-alive connection at once, or of one that has waited that long for its
  request head (a slow client), never of one whose request has arrived. Past
  that limit, with every slot busy answering, it gets a 503 with
  ``Retry-After``: every accepted request is answered;
- a request's head (and, with TLS, the handshake) must arrive within
  :data:`HEAD_TIMEOUT_S` in total, however slowly it trickles in, and a
  response must be written within :data:`RESPONSE_TIMEOUT_S`;
- every error a client causes (a reset, a TLS alert, a timeout) is one log
  line through the ``otel_gpu`` logger, at most once a minute per kind,
  never a traceback;
- responses leave in one write with TCP_NODELAY, so small answers on a
  kept-alive connection do not wait for a delayed ACK;
- the listen backlog is the system's maximum (``net.core.somaxconn``).

What is served is the subclass's: :class:`BoundedHandler` routes nothing;
:mod:`otel_gpu.export.prometheus.endpoint` adds ``/metrics`` and the health paths.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import selectors
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from otel_gpu._files import read_sysfs
from otel_gpu._log import LogLimiter

log = logging.getLogger(__name__)

_Selector = getattr(selectors, "PollSelector", selectors.SelectSelector)
"""The selector the accept loop waits in (socketserver's own choice)."""

MAX_CONNECTIONS = 64
"""Connections served at once (one thread each)."""
HEAD_TIMEOUT_S = 10.0
"""From accepting a connection (or finishing the previous response on it) to the
end of the next request's head, TLS handshake included."""
RESPONSE_TIMEOUT_S = 30.0
"""From the end of a request's head to the last byte of its response."""
ADMIT_WAIT_S = 0.5
"""How long a new connection waits for a slot when all are busy; also how long a connection
must have waited for its request head before it may be closed to make room."""
ARM_SLACK_S = 1.0
"""How far a read or write may run past the connection's deadline: the socket's timeout is
set again only when it would overrun by more (so a quick request sets it once, or not
at all on a kept-alive connection)."""
MAX_REQUEST_LINE = 8192
WRITE_BUFFER = 1 << 16
"""Responses up to this size (headers and body) leave in one write."""
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"


def listen_backlog(path: str = SOMAXCONN_PATH) -> int:
    """The system's largest listen backlog: ``net.core.somaxconn``, else ``socket.SOMAXCONN``."""
    try:  # a procfs file, read as every file is: bounded and non-blocking
        value = int(read_sysfs(path) or "")
    except ValueError:
        return socket.SOMAXCONN
    return value if value > 0 else socket.SOMAXCONN


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}"


class _Connection:
    """One accepted connection: its socket and the deadline of what it is doing now.

    ``waiting_since`` is set while the connection waits for a request head (or
    its TLS handshake): such a connection may be closed to make room for a new
    one. ``None`` while a request is being answered.
    """

    __slots__ = ("armed", "deadline", "eof", "kicked", "received", "served", "sock",
                 "waiting_since")

    def __init__(self, sock: socket.socket, now: float, head_timeout: float) -> None:
        self.sock = sock
        self.waiting_since: float | None = now
        self.deadline = now + head_timeout
        self.kicked = False
        self.received = 0
        self.eof = False
        self.served = 0
        """Requests answered on it: a waiting connection that has answered one is an idle
        keep-alive."""
        self.armed: float | None = None
        """The socket's timeout as last set (None: not set by us)."""

    def pending(self) -> bool:
        """Whether bytes (or the client's end of file) wait unread in the socket: a request
        that arrived but that its thread has not read yet."""
        try:
            poller = select.poll()  # a zero wait: the socket's own timeout would block
            poller.register(self.sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):  # closed meanwhile
            return False

    def kick(self) -> None:
        """Wake the connection's thread with an end of file; it then closes the connection."""
        self.kicked = True
        with contextlib.suppress(OSError):
            # the plain socket's shutdown, also under TLS: no TLS state is touched here
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class _DeadlineIO(io.RawIOBase):
    """The connection's socket, where every read and write ends by the connection's deadline
    (a socket timeout alone applies to each call, which a trickling client renews forever)."""

    def __init__(self, conn: _Connection) -> None:
        super().__init__()
        self._conn = conn

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _arm(self) -> socket.socket:
        conn = self._conn
        left = conn.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the connection's deadline passed")
        sock = conn.sock
        if conn.armed is None or left < conn.armed - ARM_SLACK_S:
            sock.settimeout(left)  # each call then ends by the deadline (plus the slack)
            conn.armed = left
        return sock

    def readinto(self, buffer: Any) -> int:
        n = self._arm().recv_into(buffer)
        self._conn.received += n
        if n == 0 and len(buffer):
            self._conn.eof = True
        return n

    def write(self, data: Any) -> int:
        return self._arm().send(data)


class BoundedHandler(BaseHTTPRequestHandler):
    """Reads each request head within the connection's deadline; the ``do_*`` are the
    subclass's."""

    server: BoundedServer
    protocol_version = "HTTP/1.1"

    def __init__(self, conn: _Connection, client_address: Any, server: BoundedServer) -> None:
        self._conn = conn
        super().__init__(conn.sock, client_address, server)

    def version_string(self) -> str:
        return "otel-gpu"  # not the Python version

    def setup(self) -> None:
        self.connection = self.request
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = io.BufferedReader(_DeadlineIO(self._conn))
        self.wfile = io.BufferedWriter(_DeadlineIO(self._conn), WRITE_BUFFER)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.flush()
        for stream in (self.wfile, self.rfile):
            with contextlib.suppress(OSError):
                stream.close()

    def handle_one_request(self) -> None:
        conn, server = self._conn, self.server
        if conn.waiting_since is None:  # the next request on a kept-alive connection
            server.wait_for_request(conn)
        received = conn.received
        self.close_connection = True
        try:
            line = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if not line:
                return  # the client closed the connection (or it was closed to make room)
            self.raw_requestline = line
            if len(line) > MAX_REQUEST_LINE:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            if conn.eof:
                return  # the request line was cut short by the client's end of file
            if not self.parse_request():
                return  # parse_request answered 400 (or 505, 431) already
            if conn.eof:
                return  # so were the headers (a reset under TLS looks like that): no answer
        except TimeoutError:
            if conn.received > received:
                server.limited.log(
                    "slow-request", logging.WARNING,
                    "closed a connection from %s: its request took longer than %g s to arrive",
                    self.client_address[0], server.head_timeout)
            else:
                log.debug("closed an idle connection from %s", self.client_address[0])
            self.close_connection = True
            return
        if not server.start_answering(conn):
            self.close_connection = True
            return
        handler = getattr(self, f"do_{self.command}", None)
        if handler is None:
            self.send_error(501, f"method {self.command} is not supported")
        else:
            handler()
        self.wfile.flush()

    def _text(self, status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8", extra)

    def _send(self, status: int, body: bytes, content_type: str,
              extra: tuple[tuple[str, str], ...] = ()) -> None:
        """Headers and body go to the buffered writer and leave together at the flush."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer is the GET's headers alone
            self.wfile.write(body)

    def end_headers(self) -> None:
        for name, value in self.server.extra_headers:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class BoundedServer(HTTPServer):
    """The threaded server with the module's bounds; ``handler`` answers the requests.

    ``max_connections``, ``head_timeout`` and ``response_timeout`` default to
    the module's constants; ``tls`` wraps each connection (its handshake on the
    connection's thread); ``extra_headers`` go with every response.
    """

    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BoundedHandler],
        *,
        tls: ssl.SSLContext | None = None,
        extra_headers: tuple[tuple[str, str], ...] = (),
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT_S,
        response_timeout: float = RESPONSE_TIMEOUT_S,
    ) -> None:
        self.tls = tls
        self.extra_headers = extra_headers
        self.limited = LogLimiter(log, 60.0)
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.response_timeout = response_timeout
        self._conns: set[_Connection] = set()
        self._conns_lock = threading.Lock()
        self._room = threading.Condition(self._conns_lock)
        """Notified when a slot frees or a connection starts waiting for its next request."""
        self.admit_wait = ADMIT_WAIT_S
        self.request_queue_size = listen_backlog()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self._handler = handler
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        """A pair of sockets: a byte on the second wakes the accept loop to end."""

    @property
    def connections(self) -> int:
        """Connections being served now."""
        with self._conns_lock:
            return len(self._conns)

    def get_request(self) -> tuple[Any, Any]:
        """Accept, once a slot is free or can be made (or :data:`ADMIT_WAIT_S` passed): until
        then the connection waits in the listen backlog."""
        deadline = time.monotonic() + self.admit_wait
        with self._room:
            while (len(self._conns) >= self.max_connections
                   and self._replaceable(time.monotonic()) is None):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(min(left, 0.05))  # waits grow old: look again soon
        return super().get_request()

    def _replaceable(self, now: float) -> _Connection | None:
        """A connection that may be closed to make room: waiting for a request head with
        nothing of it unread, and either idle after a request or waiting for
        :data:`ADMIT_WAIT_S` at least; the longest waiting first. Under the lock."""
        waiting = sorted((c for c in self._conns if c.waiting_since is not None),
                         key=lambda c: c.waiting_since or 0.0)
        for conn in waiting:
            since = conn.waiting_since or now
            if (conn.served or now - since >= self.admit_wait) and not conn.pending():
                return conn
        return None

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: take a slot (or make room), then serve on a new thread."""
        conn: _Connection | None = _Connection(request, time.monotonic(), self.head_timeout)
        with self._room:
            if len(self._conns) >= self.max_connections:
                oldest = self._replaceable(time.monotonic())
                if oldest is None:
                    conn = None
                else:
                    self._conns.discard(oldest)
                    oldest.kick()
            if conn is not None:
                self._conns.add(conn)
        if conn is None:
            self._refuse(request, client_address)
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve, args=(conn, client_address),
                             name="otel-gpu-http-conn", daemon=True).start()
        except BaseException:
            self._forget(conn)
            raise

    def _refuse(self, request: socket.socket, client_address: Any) -> None:
        """A 503 the client can read: its request is drained first, so that closing the socket
        sends a FIN, not a reset that would discard the answer."""
        self.limited.log("busy", logging.WARNING,
                         "answered 503 to %s: all %d connections were busy answering for "
                         "%g s", client_address[0], self.max_connections, self.admit_wait)
        if self.tls is not None:
            return  # no handshake on the accepting thread: the client sees the close
        body = b"busy: too many connections; retry\n"
        head = [b"HTTP/1.1 503 Service Unavailable", b"Content-Type: text/plain; charset=utf-8",
                b"Content-Length: %d" % len(body), b"Retry-After: 1", b"Connection: close"]
        head += [f"{name}: {value}".encode() for name, value in self.extra_headers]
        with contextlib.suppress(OSError):
            request.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                for _ in range(16):  # what arrived of the request, bounded
                    if not request.recv(1 << 16):
                        break
            request.send(b"\r\n".join(head) + b"\r\n\r\n" + body)
            request.shutdown(socket.SHUT_WR)

    def _serve(self, conn: _Connection, client_address: Any) -> None:
        try:
            if self.tls is not None and not self._handshake(conn, client_address):
                return
            self._handler(conn, client_address, self)
        except Exception as exc:  # noqa: BLE001 - one line per failure, never a traceback
            self._failed(conn, client_address, exc)
        finally:
            self._forget(conn)
            self.shutdown_request(conn.sock)

    def _handshake(self, conn: _Connection, client_address: Any) -> bool:
        """With TLS, the handshake runs on the connection's own thread, within its head time."""
        assert self.tls is not None
        with self._conns_lock:  # the socket changes hands: a kick must see the new one
            raw = conn.sock
            conn.armed = max(0.001, conn.deadline - time.monotonic())
            raw.settimeout(conn.armed)  # the wrapped socket keeps it
            conn.sock = self.tls.wrap_socket(raw, server_side=True,
                                             do_handshake_on_connect=False)
            if conn.kicked:
                return False
        try:
            conn.sock.do_handshake()
        except (ssl.SSLError, OSError) as exc:
            if not conn.kicked:
                self.limited.log("tls", logging.WARNING, "TLS handshake with %s failed: %s",
                                 client_address[0], describe(exc))
            return False
        return True

    def wait_for_request(self, conn: _Connection) -> None:
        """The connection waits for its next request head, which must come within head time."""
        now = time.monotonic()
        with self._room:
            conn.waiting_since = now
            conn.deadline = now + self.head_timeout
            conn.served += 1
            self._room.notify()

    def start_answering(self, conn: _Connection) -> bool:
        """A whole head arrived: the connection may no longer be closed to make room.
        False when it was closed for that already."""
        with self._conns_lock:
            if conn.kicked:
                return False
            conn.waiting_since = None
            conn.deadline = time.monotonic() + self.response_timeout
            return True

    def _forget(self, conn: _Connection) -> None:
        with self._room:
            self._conns.discard(conn)
            self._room.notify()

    def _failed(self, conn: _Connection, client_address: Any, exc: Exception) -> None:
        if conn.kicked:
            log.debug("closed connection from %s ended with %s", client_address[0],
                      describe(exc))
        elif isinstance(exc, OSError):  # resets, TLS alerts, timeouts: the client's doing
            self.limited.log(("client", type(exc).__name__), logging.WARNING,
                             "connection from %s failed: %s", client_address[0], describe(exc))
        else:
            at = where(exc)
            self.limited.log(("bug", type(exc).__name__, at), logging.ERROR,
                             "error serving %s: %s at %s", client_address[0], describe(exc), at)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Errors on the accepting thread: one line, rate-limited, like every other."""
        exc = sys.exc_info()[1]
        if exc is None:
            return
        self.limited.log(("accept", type(exc).__name__), logging.ERROR,
                         "error accepting a connection from %s: %s", client_address[0],
                         describe(exc))

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        self._wake = socket.socketpair()
        self._thread = threading.Thread(target=self._accept_loop, name="otel-gpu-http",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        """Accept connections until :meth:`stop`, asleep in one ``select`` until a connection
        or the stop arrives. (``serve_forever`` wakes every poll interval to look for a
        stop: at 0.2 s, half a millisecond of CPU a second at one GPU, 7 % of the process.)"""
        assert self._wake is not None
        with _Selector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._wake[0], selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj is self._wake[0] for key, _ in ready):
                    return
                if ready:
                    self._accept_one()

    def _accept_one(self) -> None:
        """One waiting connection accepted and handed to its thread (socketserver's steps)."""
        try:
            request, client_address = self.get_request()
        except OSError:
            return
        if not self.verify_request(request, client_address):
            self.shutdown_request(request)
            return
        try:
            self.process_request(request, client_address)
        except Exception:  # noqa: BLE001 - said by handle_error, one rate-limited line
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def stop(self) -> None:
        if self._thread is not None and self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"\0")
            self._thread.join(2.0)
        self.server_close()
        for end in self._wake or ():
            end.close()
        with self._conns_lock:
            for conn in self._conns:
                conn.kick()
