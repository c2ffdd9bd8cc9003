"""The data the pipeline passes on: one immutable snapshot per sample.

The sampler thread builds a :class:`Snapshot`; everything downstream (the
instrument callbacks, the Prometheus render cache, attribution) only reads
it. Nothing here talks to NVML, so the scrape path can never block on the
driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Device states, as the OpenTelemetry ``hw.state`` attribute spells them.
OK = "ok"
DEGRADED = "degraded"
FAILED = "failed"
PREDICTED_FAILURE = "predicted_failure"
STATES = (OK, DEGRADED, FAILED, PREDICTED_FAILURE)

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Device:
    """What is known about a GPU or MIG instance from discovery; never changes."""

    uuid: str
    """``GPU-...`` or ``MIG-...``: the ``hw.id`` of every series."""
    index: int
    """NVML index of the GPU (for a MIG instance: of its parent GPU)."""
    name: str
    """NVML product name of this entity (a MIG instance's includes its profile)."""
    model: str
    """Product name of the physical GPU."""
    pci_bus_id: str
    """NVML form ``00000000:3B:00.0`` (the parent's for a MIG instance)."""
    minor_number: int | None = None
    """``/dev/nvidiaN`` minor number: GKE's device plugin names GPUs by it."""
    parent_uuid: str | None = None
    """Set for MIG instances only."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_profile: str | None = None
    """``1g.10gb`` and the like, for MIG instances."""
    numa_node: int | None = None
    serial: str | None = None

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


@dataclass(frozen=True)
class DeviceSample:
    """One device's readings in one sample, in NVML's own units.

    ``values`` is keyed by the catalog's source keys; a key is absent when the
    value could not be read (not supported, no permission, transient error),
    never zero or NaN in its place.
    """

    device: Device
    state: str = OK
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    xid_counts: Mapping[int, int] = field(default_factory=lambda: _EMPTY)
    """Cumulative XID events seen since start, by XID code."""
    last_xid: int | None = None
    """The most recent XID code (what dcgm-exporter's XID_ERRORS shows)."""
    error: str | None = None
    """Why the device is failed, when it is."""


@dataclass(frozen=True)
class PodView:
    """Kubernetes attribution joined to one snapshot's devices.

    Typed loosely so this module stays free of gRPC: ``attribution`` is an
    :class:`otel_gpu.k8s.attribution.Attribution`, ``stats`` a
    :class:`otel_gpu.k8s.podresources.WatcherStats`.
    """

    attribution: Any
    stats: Any
    mapping_taken_monotonic: float | None
    """When the kubelet answered the List this attribution comes from."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one sample read. ``seq`` increases by one per sample."""

    seq: int
    taken_at: float
    """Wall-clock time (epoch seconds) when the sample finished."""
    taken_monotonic: float
    """Monotonic time when the sample finished: ages are measured with it."""
    duration: float
    """Seconds the sample took."""
    driver_version: str | None
    devices: tuple[DeviceSample, ...] = ()
    nvml_calls: int = 0
    """NVML calls made since start, including this sample's."""
    errors: tuple[str, ...] = field(default=())
    """Problems worth showing in ``check`` and ``/readyz``."""
    pods: PodView | None = None
    """Set when Kubernetes pod attribution is on."""

    def healthy_devices(self) -> int:
        return sum(1 for d in self.devices if d.state != FAILED)
