"""Snapshot subscribers for the publish loop's tests."""

from __future__ import annotations

import threading

from otel_gpu.publish.store import SnapshotStore


class RecordingSubscriber:
    """A subscriber recording what it was handed, answering with ``answer(snapshot)``."""

    def __init__(self, answer=lambda snapshot: None):
        self.seen: list[tuple[int, str, int]] = []
        self.answer = answer
        self.store: SnapshotStore | None = None

    def published(self, snapshot):
        version = self.store.version if self.store is not None else -1
        self.seen.append((snapshot.seq, threading.current_thread().name, version))
        return self.answer(snapshot)
