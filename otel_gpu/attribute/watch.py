"""One watcher for the unix sockets attribution asks: the kubelet's and the container runtime's.

A source keeps only its protocol: a fetch function that asks once and returns
an immutable state, or raises :class:`Unanswered` saying why in one line. The
:class:`SocketWatch` does the rest, the same way for every source:

- asks on a daemon thread (:class:`~otel_gpu.attribute.loop.Loop`) every
  ``interval``, never on a scrape; readers only read :attr:`SocketWatch.state`,
  which is lock-free;
- looks at the socket first (:func:`look`): no socket, no call (so a source may
  connect, and import its client, only once there is one), and one line when it
  comes or goes (in the source's words, :class:`Lines`); a socket absent since
  the start is said again, rate-limited, once the grace period is over;
- publishes the source's empty state as soon as a look finds the socket (at
  :meth:`SocketWatch.start` too), before the first call returns, so that a
  stage reading it has a state from the first sample on;
- after a failed call waits an exponential backoff with full jitter
  (:func:`backoff`), with one line per kind of failure at most every
  ``log_interval``;
- keeps the last good state for ``grace_period`` after failures start (a
  restart of the kubelet or the runtime must not churn series), then
  publishes the source's empty state;
- counts the requests the source reports, the consecutive failures and the
  last success, for the self-metrics;
- stops promptly: the wait is an event, the source's ``close`` cancels a call
  in flight, and the join is bounded.

Every line goes to the source's own logger, so an operator's filters and the
names in the log stay the source's.
"""

from __future__ import annotations

import enum
import logging
import operator
import os
import random as _random
import stat
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from otel_gpu._log import LogLimiter
from otel_gpu.attribute.loop import Loop

S = TypeVar("S")
K = TypeVar("K", bound=Hashable)

MIN_DELAY_S = 0.01
"""The shortest wait after a failure, whatever the jitter draws: a loop never spins."""


class Presence(enum.Enum):
    """What is at a socket path."""

    ABSENT = "absent"
    PRESENT = "present"
    NOT_SOCKET = "not a socket"


def look(path: str) -> Presence:
    """What is at ``path``. A path that cannot be looked at (no permission to stat) counts
    as present, so that the call fails and says why instead of the source staying quiet."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return Presence.ABSENT
    except OSError:
        return Presence.PRESENT
    return Presence.PRESENT if stat.S_ISSOCK(mode) else Presence.NOT_SOCKET


def backoff(failures: int, base: float, cap: float, draw: float) -> float:
    """Full jitter: ``draw`` (uniform in [0, 1)) times ``min(cap, base * 2**(failures-1))``,
    never under :data:`MIN_DELAY_S`; spread retries of many nodes apart."""
    ceiling = min(cap, base * 2.0 ** max(0, min(failures - 1, 30)))
    return max(MIN_DELAY_S, ceiling * draw)


def span(seconds: float) -> str:
    """A duration as an operator reads it in a reason: ``0.4 s``, ``45 s``, ``5 min``,
    ``3 h``."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


class Unanswered(Exception):
    """The source gave no usable answer: ``str()`` says why in one line; ``key`` groups the
    repeats of one kind of failure for the rate limit of its log line."""

    def __init__(self, reason: str, key: Hashable = None) -> None:
        super().__init__(reason)
        self.key = key


@dataclass(frozen=True)
class Lines:
    """What a watcher says, in its source's words.

    Each line is a %-template with named fields, of which it uses any: ``path``,
    ``interval``, ``grace`` (seconds), ``reason``, ``delay`` (seconds until the next
    try), ``failures``, ``elapsed`` (seconds since failures started; in
    :attr:`still_absent`, a :func:`span`) and, in :attr:`directory`, ``hint``.
    """

    what: str
    """The source in a few words (``pod-resources``), for the lines that name it."""
    absent: str
    """INFO, once: nothing at the path at the first look (most likely not that kind of node)."""
    back: str
    """INFO: the socket is there after the absence or loss was said."""
    gone: str
    """WARNING, rate-limited: the socket that was there is not."""
    failed: str
    """WARNING, rate-limited per kind of failure: a call failed or its answer was bad."""
    dropped: str
    """WARNING, once per outage: the grace period is over and the last state dropped."""
    not_socket: str | None = None
    """WARNING, once: something that is not a socket at the first look (None: said as absent)."""
    first: str | None = None
    """INFO: the socket is there at the first look (None: nothing said)."""
    directory: str | None = None
    """WARNING, once: a directory at the first look (None: said as :attr:`not_socket`), with
    ``hint`` (:meth:`SocketWatch.directory_hint`)."""
    still_absent: str | None = None
    """WARNING, rate-limited: no socket since the start, past the grace period (None: none)."""
    socket: str = "socket"
    """What the outage reasons call the socket (``kubelet socket``)."""
    started: str | None = None
    """INFO: the thread starts with the socket there (None: nothing said)."""


class SocketWatch(Generic[S, K]):
    """Asks a source on a unix socket in the background and publishes its state.

    ``fetch`` asks once (raising :class:`Unanswered` for the source's trouble);
    ``close``, where the source holds a connection, drops it (on stop, which cancels a
    call in flight, and when the socket goes). ``initial`` is the state before any
    answer and ``empty`` the one published once failures outlast ``grace_period``.
    With ``off_without_socket`` the state is ``initial`` whenever there is no socket
    (the source is not there: nothing to join); without, a missing socket is a failed
    poll that is neither counted nor backed off (a kubelet restart removes its
    socket; absent since the start, it is said again at most every ``absent_every``
    past the grace period). ``on_update`` is told of a new state where
    ``changed(old, new)``. The source reports its requests with :meth:`count`.
    ``clock`` and ``random`` (uniform in [0, 1)) are injectable for tests.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        fetch: Callable[[], S],
        *,
        lines: Lines,
        log: logging.Logger,
        name: str,
        initial: S,
        empty: S,
        off_without_socket: bool = False,
        close: Callable[[], None] | None = None,
        interval: float = 10.0,
        grace_period: float = 60.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        log_interval: float = 60.0,
        absent_every: float = 600.0,
        on_update: Callable[[S], None] | None = None,
        changed: Callable[[S, S], bool] = operator.ne,
    ) -> None:
        if interval <= 0 or backoff_base <= 0 or backoff_cap < backoff_base:
            raise ValueError("interval and backoff must be positive")
        self.socket_path = os.fspath(socket_path)
        self.interval = float(interval)
        self.grace_period = float(grace_period)
        self.backoff_base = float(backoff_base)
        self.backoff_cap = float(backoff_cap)
        self.clock = clock
        self.lines = lines
        self._fetch = fetch
        self._close = close
        self._initial = initial
        self._empty = empty
        self._off_without_socket = off_without_socket
        self._random = random
        self._log = log
        self._limiter = LogLimiter(log, log_interval, clock=clock)
        self._absent_log = LogLimiter(log, absent_every, clock=clock)
        self._on_update = on_update
        self._changed = changed
        # Published together: (state, monotonic time failures started or None).
        self._current: tuple[S, float | None] = (initial, None)
        self._next_delay = self.interval
        # The poll's own (one poll at a time, under _poll_lock).
        self._poll_lock = threading.Lock()
        self._presence: Presence | None = None
        self._seen = False  # the socket was there once: an absence is no longer said again
        self._away_said = False
        self._dropped_said = False
        # Self-metrics, copied out under _stats_lock.
        self._stats_lock = threading.Lock()
        self._requests: dict[K, int] = {}
        self._failures = 0
        self._last_success: float | None = None
        self._loop = Loop(name, self._step, self._bug)

    # ------------------------------------------------------------------ readers

    @property
    def state(self) -> S:
        """The last good state; ``empty`` once failures outlast the grace period.
        Lock-free and cheap: read on every sample."""
        state, failing_since = self._current
        if (failing_since is not None and state is not self._empty
                and state is not self._initial
                and self.clock() - failing_since >= self.grace_period):
            return self._empty
        return state

    @property
    def next_delay(self) -> float:
        """Seconds the thread waits after the last poll (the interval, or a backoff)."""
        return self._next_delay

    @property
    def requests(self) -> Mapping[K, int]:
        """Requests by the source's key (outcome, or rpc and outcome), since the start."""
        with self._stats_lock:
            return MappingProxyType(dict(self._requests))

    @property
    def failures(self) -> int:
        """Failed polls since the last good one (a missing socket is not counted)."""
        return self._failures

    @property
    def last_success(self) -> float | None:
        return self._last_success

    @property
    def presence(self) -> Presence | None:
        """What the last look found at the path; None until the first."""
        return self._presence

    @property
    def socket_present(self) -> bool | None:
        """None until the first look."""
        presence = self._presence
        return None if presence is None else presence is Presence.PRESENT

    @property
    def thread(self) -> threading.Thread | None:
        """The polling thread while started."""
        return self._loop.thread

    def outage(self) -> str | None:
        """Why the source's state is not used, in a few words, once that is more than a
        restart (``/readyz`` says it): something that is not a socket at the path, or
        failures (a missing socket among them) that outlast the grace period. None while
        it answers or the grace period runs."""
        state, failing_since = self._current
        presence = self._presence
        if presence is Presence.NOT_SOCKET:
            return f"{self.socket_path} is not a socket"
        if failing_since is None:
            return None
        elapsed = self.clock() - failing_since
        if elapsed < self.grace_period:
            return None
        if presence is Presence.ABSENT:
            return f"no {self.lines.socket} at {self.socket_path} for {span(elapsed)}"
        return f"{self.lines.what} at {self.socket_path} unanswered for {span(elapsed)}"

    def count(self, key: K) -> None:
        """One request made, by its outcome: for the source's fetch to call."""
        with self._stats_lock:
            self._requests[key] = self._requests.get(key, 0) + 1

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Look at the socket now, then start the polling thread (idempotent): a source
        there has its state (``empty`` until it answers) from the first sample on, however
        long the thread's first call takes."""
        with self._poll_lock:
            there = self._look() is Presence.PRESENT
            if there:
                self._there()
        if self._loop.start() and there and self.lines.started:
            self._log.info(self.lines.started, self._fields())

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread: closing the source's connection cancels a call in flight; the
        join waits at most ``timeout``."""
        self._loop.stop(timeout, self._close)
        if self._close is not None:  # a connection the thread opened as it was told to stop
            self._close()

    def __enter__(self) -> SocketWatch[S, K]:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> bool:
        """Ask once, now (``check`` does, and the thread); whether the source answered.

        Never raises for the source's trouble; a bug in the fetch is raised (the thread
        logs it and backs off). Sets :attr:`next_delay`.
        """
        with self._poll_lock:
            ok, update = self._poll()
        if update is not None and self._on_update is not None:
            # After the poll lock is released: the consumer may take locks of its own.
            try:
                self._on_update(update)
            except Exception:  # noqa: BLE001 - a consumer's bug must not stop polling
                self._limiter.log("on_update", logging.ERROR, "handling the new %s answer "
                                  "failed", self.lines.what, exc_info=True)
        return ok

    def _there(self) -> None:
        """The socket is there: ``initial`` (none seen yet) becomes ``empty`` at once, before
        the call (the source is there, its answer not yet known)."""
        state, failing_since = self._current
        if state is self._initial:
            self._current = (self._empty, failing_since)

    def _poll(self) -> tuple[bool, S | None]:
        if self._look() is not Presence.PRESENT:
            if self._close is not None:
                self._close()
            self._next_delay = self.interval
            if self._off_without_socket:
                self._current = (self._initial, None)
            else:
                self._failing(counted=False)
                self._still_absent()
            return False, None
        self._there()
        try:
            state = self._fetch()
        except Unanswered as exc:
            if self._loop.stopping:  # the stop's doing, not the source's
                self._next_delay = self.interval
                return False, None
            self._failing(counted=True)
            self._limiter.log(("failed", exc.key), logging.WARNING, self.lines.failed,
                              self._fields(reason=str(exc)))
            return False, None
        except Exception:
            if self._loop.stopping:  # e.g. a call on the connection stop() just closed
                self._next_delay = self.interval
                return False, None
            raise
        return True, self._succeeded(state)

    def _step(self) -> float:
        self.poll_once()
        return self._next_delay

    def _bug(self) -> float:
        """A fetch that raised what it should not: a failed poll, said with its traceback."""
        with self._poll_lock:
            self._failing(counted=True)
        self._limiter.log("bug", logging.ERROR, "%s poller error", self.lines.what,
                          exc_info=True)
        return self._next_delay

    def _succeeded(self, state: S) -> S | None:
        """Publish ``state``; it, where ``on_update`` is to hear of it."""
        previous = self._current[0]
        self._current = (state, None)
        with self._stats_lock:
            failures, self._failures = self._failures, 0
            self._last_success = self.clock()
        if failures:
            self._log.info("%s at %s answers again after %d failed attempts",
                           self.lines.what, self.socket_path, failures)
        self._dropped_said = False
        self._next_delay = self.interval
        return state if self._changed(previous, state) else None

    def _failing(self, *, counted: bool) -> None:
        """Start or continue the failure period; drop the state once it outlasts the grace."""
        now = self.clock()
        state, failing_since = self._current
        if failing_since is None:
            failing_since = now
        with self._stats_lock:
            if counted:
                self._failures += 1
            failures = self._failures
        if (state is not self._empty and state is not self._initial
                and now - failing_since >= self.grace_period):
            state = self._empty
            if not self._dropped_said:
                self._dropped_said = True
                self._log.warning(self.lines.dropped, self._fields(elapsed=now - failing_since))
        self._current = (state, failing_since)  # readers see a drop on time through ``state``
        if counted:
            self._next_delay = backoff(failures, self.backoff_base, self.backoff_cap,
                                       self._random())

    def _still_absent(self) -> None:
        """The rate-limited line for a socket absent since the start, past the grace period."""
        since = self._current[1]
        elapsed = -1.0 if since is None else self.clock() - since
        if (not self._seen and self._presence is Presence.ABSENT
                and self.lines.still_absent is not None and elapsed >= self.grace_period):
            self._absent_log.log("absent", logging.WARNING, self.lines.still_absent,
                                 self._fields(elapsed=span(elapsed)))

    def directory_hint(self) -> str:
        """What :attr:`Lines.directory` adds about the directory's content (a source's)."""
        return ""

    def _look(self) -> Presence:
        """What is at the path; one line when that changes (see :class:`Lines`)."""
        now = look(self.socket_path)
        before, self._presence = self._presence, now
        if now is before:
            return now
        lines, fields = self.lines, self._fields()
        if now is Presence.PRESENT:
            self._seen = True
            line = lines.first if before is None else lines.back if self._away_said else None
            self._away_said = False
            if line is not None:
                self._log.info(line, fields)
        elif before is None:
            self._away_said = True
            if (now is Presence.NOT_SOCKET and lines.directory is not None
                    and os.path.isdir(self.socket_path)):
                self._log.warning(lines.directory, self._fields(hint=self.directory_hint()))
            elif now is Presence.NOT_SOCKET and lines.not_socket is not None:
                self._log.warning(lines.not_socket, fields)
            else:
                self._log.info(lines.absent, fields)
        elif before is Presence.PRESENT:
            self._away_said = self._limiter.log("gone", logging.WARNING, lines.gone, fields)
        return now

    def _fields(self, **more: object) -> dict[str, object]:
        fields: dict[str, object] = {
            "path": self.socket_path, "interval": self.interval, "grace": self.grace_period,
            "delay": self._next_delay, "failures": self._failures, "reason": "", "elapsed": 0.0}
        fields.update(more)
        return fields
