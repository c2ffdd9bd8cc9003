"""Devices, device samples and snapshots built by hand, for in-process tests.

The uuids are in the formats real drivers use. :func:`sample_node` is a node
whose GPUs' minor numbers differ from their NVML indexes, one of them in MIG
mode, for the attribution tests; :func:`snapshot` and :func:`sample` wrap
them the way the sampler would.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from otel_gpu.snapshot import OK, Device, DeviceSample, Snapshot

GPU0 = "GPU-5a5a7118-e550-79a1-597e-7631e126c57a"
GPU1 = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"
GPU2 = "GPU-0c9d1a3e-1111-2222-3333-444455556666"
MIG_A = "MIG-42f0f413-f7b0-58cc-aced-c1d1fb54db26"
MIG_B = "MIG-7d4e1a2b-0000-5555-aaaa-bbbbccccdddd"
MIG_C = "MIG-90e5f1c3-1234-5678-9abc-def012345678"

A100 = "NVIDIA A100-SXM4-40GB"
DRIVER_VERSION = "550.90.07"


def gpu_device(
    uuid: str = GPU0, index: int = 0, minor: int | None = None, model: str = A100, **kw: Any
) -> Device:
    """A whole GPU as discovery describes it; ``minor`` defaults to ``index``."""
    kw.setdefault("pci_bus_id", f"00000000:{0x3B + index:02X}:00.0")
    return Device(
        uuid=uuid,
        index=index,
        name=model,
        model=model,
        minor_number=index if minor is None else minor,
        **kw,
    )


def mig_device(uuid: str, parent: Device, gi: int, ci: int = 0, profile: str = "1g.5gb") -> Device:
    """A MIG instance of ``parent`` (GPU instance ``gi``, compute instance ``ci``)."""
    return Device(
        uuid=uuid,
        index=parent.index,
        name=f"{parent.model} MIG {profile}",
        model=parent.model,
        pci_bus_id=parent.pci_bus_id,
        minor_number=parent.minor_number,
        parent_uuid=parent.uuid,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        mig_profile=profile,
    )


def sample_node() -> tuple[Device, ...]:
    """Three GPUs whose minor numbers differ from their NVML indexes; GPU1 in MIG
    mode with instances MIG_A (GI 1, 1g.5gb), MIG_B (GI 2, 1g.5gb), MIG_C (GI 3, 3g.20gb).
    """
    g0 = gpu_device(GPU0, 0, minor=2)
    g1 = gpu_device(GPU1, 1, minor=0)
    g2 = gpu_device(GPU2, 2, minor=1)
    return (
        g0,
        g1,
        g2,
        mig_device(MIG_A, g1, gi=1, profile="1g.5gb"),
        mig_device(MIG_B, g1, gi=2, profile="1g.5gb"),
        mig_device(MIG_C, g1, gi=3, profile="3g.20gb"),
    )


def sample(
    device: Device | None = None,
    state: str = OK,
    values: Mapping[str, float] | None = None,
    **fields: Any,
) -> DeviceSample:
    """One device's readings (catalog source keys such as ``"temp.gpu"``), read-only
    like the sampler's; ``fields`` sets the rest (``error``, ``xid_counts``, ``last_xid``).
    """
    return DeviceSample(
        device=device if device is not None else gpu_device(),
        state=state,
        values=MappingProxyType(dict(values or {})),
        **fields,
    )


def snapshot(
    *samples: DeviceSample,
    seq: int = 1,
    taken_monotonic: float | None = None,
    taken_at: float = 1.7e9,
    duration: float = 0.02,
    driver_version: str | None = DRIVER_VERSION,
    **fields: Any,
) -> Snapshot:
    """Sample number ``seq`` of these devices; ``taken_monotonic`` defaults to ``seq``.

    ``fields`` sets the rest (``nvml_calls``, ``errors``, ``pods``).
    """
    return Snapshot(
        seq=seq,
        taken_at=taken_at,
        taken_monotonic=float(seq) if taken_monotonic is None else taken_monotonic,
        duration=duration,
        driver_version=driver_version,
        devices=tuple(samples),
        **fields,
    )


class ReadCounted(dict):
    """Attributes that count how often their content is read (names, values or pairs)."""

    reads = 0

    def __iter__(self):
        ReadCounted.reads += 1
        return super().__iter__()

    def keys(self):
        ReadCounted.reads += 1
        return super().keys()

    def values(self):
        ReadCounted.reads += 1
        return super().values()

    def items(self):
        ReadCounted.reads += 1
        return super().items()
