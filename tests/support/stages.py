"""Attribute stages for the tests of how stages are run."""

from __future__ import annotations

import threading
from dataclasses import replace

from otel_gpu.snapshot import Snapshot


class GatedStage:
    """A stage that marks the snapshots it joins (``seq`` + 1000) and holds each call until
    released; it counts the calls running at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.running = 0
        self.most = 0
        self.calls = 0
        self._lock = threading.Lock()

    def process(self, snap: Snapshot) -> Snapshot:
        with self._lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        self.entered.set()
        try:
            if not self.open.wait(30):
                raise AssertionError("never released")
            return replace(snap, seq=snap.seq + 1000)
        finally:
            with self._lock:
                self.running -= 1
