"""One connection of the bounded server: the deadlines its reads and writes keep, and the
handler reading each request head within them.

:class:`BoundedHandler` routes nothing: :mod:`.endpoint` adds the service's paths.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_gpu.export.http.server import BoundedServer

log = logging.getLogger(__name__)

ARM_SLACK_S = 1.0
"""How far a read or write may run past the connection's deadline: the socket's timeout is
set again only when it would overrun by more (so a quick request sets it once, or not
at all on a kept-alive connection)."""
MAX_REQUEST_LINE = 8192
WRITE_BUFFER = 1 << 16
"""Responses up to this size (headers and body) leave in one write."""


class Connection:
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

    def __init__(self, conn: Connection) -> None:
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

    def __init__(self, conn: Connection, client_address: Any, server: BoundedServer) -> None:
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


