"""Meter and meter-provider doubles: a meter that registers nothing, a provider that
records its rebuilds."""

from __future__ import annotations

import threading
from typing import Any


class RebuildingProvider:
    """Records the thread of each rebuild and answers ``room`` series of room."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.rebuilt: list[str] = []

    def rebuild(self) -> int:
        self.rebuilt.append(threading.current_thread().name)
        return self.room


class NoMeter:
    """A meter that registers nothing: the callbacks are called by hand."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
