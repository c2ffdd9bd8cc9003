"""Basic auth for the endpoint: bcrypt checks that are bounded, remembered and timing-safe."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

MAX_PASSWORD_BYTES = 72
"""bcrypt reads no further: a longer password is refused before any check."""


class AuthBusy(Exception):
    """Too many password checks are running; the request should be answered 503."""


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes.

    bcrypt is slow on purpose (tens of milliseconds), so:

    - a successful check is remembered for ``cache_ttl`` seconds (as an HMAC
      of user and password under a key made at start-up, never the
      password), for at most ``cache_size`` pairs; a scraper sending the same
      credentials costs nothing after its first request;
    - at most ``max_concurrent`` bcrypt checks run at once; a check that
      cannot start within ``wait`` seconds raises :class:`AuthBusy` instead
      of queueing, so a flood of wrong passwords uses at most that many
      cores and cannot starve scrapes with remembered credentials;
    - a miss costs what a check against the costliest configured hash costs,
      whoever the user: an unknown user is checked against that hash, and a
      wrong password for a user with a cheaper hash waits out the rest of that
      time (measured on the costliest hash's own checks), so timing reveals
      neither which user names exist nor which users have cheap hashes; a
      password over 72 bytes is wrong for every user and refused before any
      check.
    """

    def __init__(
        self,
        users: Mapping[str, bytes],
        *,
        max_concurrent: int | None = None,
        wait: float = 2.0,
        cache_ttl: float = 300.0,
        cache_size: int = 256,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._users = dict(users)
        self._dummy = max(self._users.values(), key=_cost, default=None)
        self._max_cost = _cost(self._dummy) if self._dummy is not None else 0
        self._costliest_s: float | None = None
        """How long the last check against a hash of the costliest cost took."""
        self._sleep = sleep
        self._key = secrets.token_bytes(32)
        self._good: OrderedDict[bytes, float] = OrderedDict()  # digest -> expiry
        self._lock = threading.Lock()
        if max_concurrent is None:
            max_concurrent = max(1, min(2, (os.cpu_count() or 2) // 2))
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._wait = wait
        self._ttl = cache_ttl
        self._size = cache_size
        self._clock = clock

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(self, header: str | None) -> bool:
        """Whether ``header`` holds a configured user's password; :class:`AuthBusy` when
        the check could not start in time."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = (
                base64.b64decode(header[6:], validate=True).decode().partition(":"))
        except (ValueError, UnicodeDecodeError):
            return False
        secret = password.encode()
        if not sep or len(secret) > MAX_PASSWORD_BYTES:
            return False
        digest = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        now = self._clock()
        with self._lock:
            expiry = self._good.get(digest)
            if expiry is not None:
                if now < expiry:
                    return True
                del self._good[digest]
        hashed = self._users.get(user)
        target = hashed if hashed is not None else self._dummy
        if target is None:
            return False
        started = self._clock()
        matched = self._checkpw(secret, target)
        if not matched or hashed is None:
            self._pad_miss(secret, target, started)
            return False
        with self._lock:
            self._good[digest] = self._clock() + self._ttl
            self._good.move_to_end(digest)
            while len(self._good) > self._size:
                self._good.popitem(last=False)
        return True

    def _checkpw(self, secret: bytes, target: bytes) -> bool:
        """One bcrypt check in a slot (:class:`AuthBusy` when none frees in time); a check
        against the costliest cost is timed for :meth:`_pad_miss`."""
        if not self._slots.acquire(timeout=self._wait):
            raise AuthBusy
        started = self._clock()
        try:
            import bcrypt

            return bool(bcrypt.checkpw(secret, target))
        except ValueError:  # hashes are checked at start-up; never a 500 for a password
            return False
        finally:
            if _cost(target) >= self._max_cost:
                self._costliest_s = self._clock() - started
            self._slots.release()

    def _pad_miss(self, secret: bytes, target: bytes, started: float) -> None:
        """Make a miss against a cheaper hash last as long as one against the costliest."""
        if _cost(target) >= self._max_cost:
            return
        if self._costliest_s is None:  # not measured yet: pay it for real once
            assert self._dummy is not None
            self._checkpw(secret, self._dummy)
            return
        left = self._costliest_s - (self._clock() - started)
        if left > 0:
            self._sleep(left)  # out of the bcrypt slots: waiting costs no core


def _cost(hashed: bytes) -> int:
    try:
        return int(hashed[4:6])
    except ValueError:
        return 0
