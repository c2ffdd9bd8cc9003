"""The thread of a socket watcher (:class:`~otel_gpu.attribute.watch.SocketWatch`): a step
called again after the wait it asks for, woken at once and joined briefly on stop."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Loop:
    """A daemon thread calling ``step`` until stopped.

    ``step`` returns the seconds to wait before its next call; an exception from it goes
    to ``on_error``, which logs it (rate-limited) and returns the wait. :meth:`start` is
    idempotent; :meth:`stop` wakes the wait at once and joins for at most its ``timeout``.
    """

    def __init__(self, name: str, step: Callable[[], float],
                 on_error: Callable[[], float]) -> None:
        self.name = name
        self._step = step
        self._on_error = on_error
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        """The running thread, until :meth:`stop`."""

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> bool:
        """Start the thread (its first step at once); whether one was started."""
        if self.thread is not None and self.thread.is_alive():
            return False
        # A fresh event: a thread a bounded stop left behind still sees its own, set.
        self._stop = stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(stop,), name=self.name,
                                       daemon=True)
        self.thread.start()
        return True

    def stop(self, timeout: float = 2.0, interrupt: Callable[[], None] | None = None) -> None:
        """Ask the thread to end, ``interrupt`` what it is doing, and wait at most
        ``timeout`` for it (never for itself)."""
        self._stop.set()
        if interrupt is not None:
            interrupt()
        thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, stop: threading.Event) -> None:
        wait = 0.0
        while not stop.wait(wait):
            try:
                wait = self._step()
            except Exception:  # noqa: BLE001 - a bug in a step must not end the loop
                wait = self._on_error()
