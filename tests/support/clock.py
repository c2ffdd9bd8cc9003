"""A monotonic clock the test moves by hand."""

from __future__ import annotations


class FakeClock:
    """Call it for the time; move it with :meth:`advance` (or by setting ``now``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
