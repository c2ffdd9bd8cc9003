"""Attribution sources that answer a fixed state and run no thread."""

from __future__ import annotations

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
