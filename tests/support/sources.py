"""Attribution sources that answer a fixed state and run no thread."""

from __future__ import annotations

from collections.abc import Callable

from otel_gpu.attribute.container.runtime import RuntimeState
from otel_gpu.snapshot import ContainerStats


class StaticRuntime:
    """A container runtime source holding ``state`` (None: it never answered)."""

    def __init__(self, state: RuntimeState | None) -> None:
        self.state = state
        self.stats = ContainerStats(containers=0 if state is None else len(state.containers))

    def poll_once(self) -> bool:
        return self.state is not None

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 2.0) -> None:
        pass


class ScriptedFetch:
    """A socket watcher's fetch a test scripts: answers ``answer``, or raises what is queued."""

    def __init__(self) -> None:
        self.answer = "a"
        self.failures: list[BaseException] = []
        self.closed = 0
        self.count: Callable[[str], None] = lambda outcome: None

    def fetch(self) -> str:
        if self.failures:
            self.count("error")
            raise self.failures.pop(0)
        self.count("ok")
        return self.answer

    def close(self) -> None:
        self.closed += 1
