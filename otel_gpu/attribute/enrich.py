"""The attribution stage's seam: each source of workloads is an :class:`Enricher`.

An enricher takes the sampler's snapshot and hands on a copy with its
workloads attached (pods, HPC jobs, containers outside Kubernetes), as
dcgm-exporter's ``Transform`` does. :class:`Enrichers` runs the configured
ones in order; the publish loop sees one of them and nothing else.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from otel_gpu.snapshot import Snapshot


@runtime_checkable
class Enricher(Protocol):
    """One attribution source. ``process`` runs on the sampler's and the kubelet's
    threads, one call at a time (under the pipeline's lock), never on a scrape; it
    must not raise for bad input from its source."""

    def process(self, snapshot: Snapshot) -> Snapshot: ...


class Enrichers:
    """The enrichers present, applied in order (pods, then jobs, then containers)."""

    def __init__(self, *stages: Enricher | None) -> None:
        self.stages: tuple[Enricher, ...] = tuple(s for s in stages if s is not None)

    def __bool__(self) -> bool:
        return bool(self.stages)

    def process(self, snapshot: Snapshot) -> Snapshot:
        for stage in self.stages:
            snapshot = stage.process(snapshot)
        return snapshot
