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
:mod:`.endpoint` adds the service's paths; one connection's deadlines are
:mod:`.connection`'s.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import sys
import threading
import time
from http.server import HTTPServer
from typing import Any

from otel_gpu._files import read_sysfs
from otel_gpu._log import LogLimiter, describe, where
from otel_gpu.export.http.connection import BoundedHandler, Connection

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
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"


def listen_backlog(path: str = SOMAXCONN_PATH) -> int:
    """The system's largest listen backlog: ``net.core.somaxconn``, else ``socket.SOMAXCONN``."""
    try:  # a procfs file, read as every file is: bounded and non-blocking
        value = int(read_sysfs(path) or "")
    except ValueError:
        return socket.SOMAXCONN
    return value if value > 0 else socket.SOMAXCONN


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
        self._conns: set[Connection] = set()
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

    def _replaceable(self, now: float) -> Connection | None:
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
        conn: Connection | None = Connection(request, time.monotonic(), self.head_timeout)
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

    def _serve(self, conn: Connection, client_address: Any) -> None:
        try:
            if self.tls is not None and not self._handshake(conn, client_address):
                return
            self._handler(conn, client_address, self)
        except Exception as exc:  # noqa: BLE001 - one line per failure, never a traceback
            self._failed(conn, client_address, exc)
        finally:
            self._forget(conn)
            self.shutdown_request(conn.sock)

    def _handshake(self, conn: Connection, client_address: Any) -> bool:
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

    def wait_for_request(self, conn: Connection) -> None:
        """The connection waits for its next request head, which must come within head time."""
        now = time.monotonic()
        with self._room:
            conn.waiting_since = now
            conn.deadline = now + self.head_timeout
            conn.served += 1
            self._room.notify()

    def start_answering(self, conn: Connection) -> bool:
        """A whole head arrived: the connection may no longer be closed to make room.
        False when it was closed for that already."""
        with self._conns_lock:
            if conn.kicked:
                return False
            conn.waiting_since = None
            conn.deadline = time.monotonic() + self.response_timeout
            return True

    def _forget(self, conn: Connection) -> None:
        with self._room:
            self._conns.discard(conn)
            self._room.notify()

    def _failed(self, conn: Connection, client_address: Any, exc: Exception) -> None:
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
