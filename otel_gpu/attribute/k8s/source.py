"""What the pod stage reads from the kubelet: the :class:`PodSource` Protocol.

The real source is :class:`~otel_gpu.attribute.k8s.enrich.KubeletWatch` (which
builds the gRPC poller, :class:`~otel_gpu.attribute.k8s.podresources.PodResourcesWatcher`,
once a socket exists); tests hand the stage a double with the same shape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from otel_gpu.attribute.k8s.kubelet_answer import PodResourcesState
from otel_gpu.snapshot import KubeletStats


@runtime_checkable
class PodSource(Protocol):
    """The kubelet's latest answer, polled in the background; reads are cheap and never
    call the kubelet."""

    @property
    def state(self) -> PodResourcesState | None:
        """The latest answer; None while there is no kubelet to ask."""
        ...

    @property
    def stats(self) -> KubeletStats: ...

    def poll_once(self) -> bool:
        """Ask once, now (``check``); whether the kubelet answered."""
        ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 2.0) -> None: ...
