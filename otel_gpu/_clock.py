"""The time the sampling stages read, as one object they share.

Each stage reads monotonic time (deadlines, log limits); the XID reader and the
snapshot stamp wall-clock time; the GPM window sleeps. Handing every stage the
same :class:`Clock` lets a test move all of them with one fake.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """Monotonic time when called, with the wall clock and a sleep beside it."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def __call__(self) -> float:
        """Monotonic seconds: a clock serves wherever a function of the time is asked for."""
        return self.monotonic()

    @classmethod
    def of(cls, clock: Clock | Callable[[], float]) -> Clock:
        """``clock`` itself, or a plain function of monotonic time with the system's wall
        clock and sleep beside it."""
        return clock if isinstance(clock, Clock) else cls(monotonic=clock)


SYSTEM = Clock()
"""The system's clocks: what every stage reads unless it is handed another."""
