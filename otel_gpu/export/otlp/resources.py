"""One workload's Resource: the node's, plus the pod (and HPC job) a point or record names.

Shared by the OTLP metrics (:class:`~otel_gpu.export.otlp.metrics.PodResourceExporter`)
and logs (:class:`~otel_gpu.export.otlp.logs.PodResourceLogExporter`), so that
an event arrives under exactly the Resource of its pod's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otel_gpu.workload import WORKLOAD_ATTRIBUTES

CACHE = 65536
"""Resources kept, at most (then the cache starts over)."""

Key = tuple[AttributeValue | None, ...]


class WorkloadResources:
    """Each workload's Resource, made once per workload of the base Resource; bounded.

    A point carrying a pod and a job (Slurm inside Kubernetes) goes under one
    Resource naming both. Used by one exporting thread at a time.
    """

    def __init__(self, keys: Sequence[str] = WORKLOAD_ATTRIBUTES, *, cache: int = CACHE) -> None:
        self.keys = tuple(keys)
        self._cache = cache
        self._base: Resource | None = None
        self._resources: dict[Key, Resource] = {}
        """The current base Resource's workload Resources (the node's: one base at a time;
        another base starts the memory over)."""

    def key(self, attrs: Mapping[str, AttributeValue]) -> Key:
        """The workload the attributes name; ``()`` when they name none."""
        key = tuple(attrs.get(k) for k in self.keys)
        return key if any(v is not None for v in key) else ()

    def strip(self, attrs: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
        """The attributes without the workload's (which the Resource carries)."""
        return {k: v for k, v in attrs.items() if k not in self.keys}

    def resource(self, base: Resource, key: Key) -> Resource:
        """``base`` plus the workload's attributes (``base`` itself for ``()``)."""
        if not key:
            return base
        if base is not self._base:
            self._base = base
            self._resources = {}
        known = self._resources.get(key)
        if known is not None:
            return known
        if len(self._resources) >= self._cache:
            self._resources.clear()
        named = {k: v for k, v in zip(self.keys, key, strict=True) if v is not None}
        resource = self._resources[key] = Resource({**dict(base.attributes), **named},
                                                   base.schema_url)
        return resource
