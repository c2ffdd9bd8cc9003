"""Process mappers that count their work: the real mapping, and how often it was asked."""

from __future__ import annotations

from typing import Any

from otel_gpu.attribute.k8s.processes import ProcessMapper


class CountingMapper(ProcessMapper):
    """The real mapper, counting its ``owners`` calls (one per sample is the contract)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls = 0

    def owners(self, pids: Any) -> Any:
        self.calls += 1
        return super().owners(pids)
