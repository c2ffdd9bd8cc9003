"""Device ids as the kubelet reports them, normalised and resolved to NVML uuids.

Device plugins and DRA drivers each name GPUs their own way; the Pod Resources
API passes those names through untouched. Everything here is a pure function
of its inputs: no I/O, no logging, never an exception for a malformed id (an
id this module does not understand parses to ``None``; the caller logs it once
and skips it).

Formats understood (``parse_device_id``):

=============================  ===========  ==========================================
id                             kind         meaning
=============================  ===========  ==========================================
``GPU-<uuid>``                 ``gpu``      whole GPU (NVIDIA device plugin)
``GPU-<uuid>::N``              ``gpu``      replica N of a time-sliced / MPS GPU
``MIG-<uuid>``                 ``mig``      MIG instance (R470+ drivers)
``MIG-<uuid>::N``              ``mig``      replica N of a time-sliced MIG instance
``MIG-GPU-<uuid>/<gi>/<ci>``   ``mig``      MIG instance, drivers before R470: the
                                            parent GPU uuid, GPU and compute instance
``nvidiaN``                    ``minor``    GKE plugin: N is the ``/dev/nvidiaN``
                                            minor number, *not* the NVML index
``nvidiaN/giG``                ``minor``    GKE MIG: GPU instance G of that GPU
``nvidiaN/vgpuK``              ``minor``    GKE sharing: share K of that GPU
``nvidiaN/giG/vgpuK``          ``minor``    GKE sharing of a MIG instance
=============================  ===========  ==========================================

DRA devices (``parse_dra_device``, driver ``gpu.nvidia.com``; the pool is the
node): ``gpu-N`` is a whole GPU and ``gpu-N-mig-...`` a MIG device on it. In
current releases of NVIDIA's DRA driver N is the ``/dev/nvidiaN`` minor number
(its earliest releases used the NVML index; the resolver falls back to the
index only when no device reports a minor number). The MIG suffix names the
GPU instance by its placement, not by its GPU-instance id:

==========================================  ==========================================
name                                        meaning
==========================================  ==========================================
``gpu-N-mig-<profile>-<P>-<S>``             current releases: profile without dots
                                            (``1g10gb``; ``+me`` becomes ``-me``),
                                            GPU-instance profile id P, placement start S
``gpu-N-mig-<P>-<S>-<size>``                earlier releases: profile id, placement
                                            start and size
==========================================  ==========================================

Discovery records each MIG instance's GPU-instance profile id and placement
start (``nvmlGpuInstanceGetInfo``), so such a name resolves to exactly one
instance, even with seven ``1g.10gb`` instances on one GPU. Where discovery
could not read them, a name resolves only when it is unambiguous: the one MIG
instance on that GPU with that profile (or the GPU's only MIG instance when
the name carries no profile).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_gpu.snapshot import Device

__all__ = [
    "DEFAULT_DRA_DRIVERS",
    "DEFAULT_RESOURCE_NAMES",
    "DeviceRef",
    "DeviceResolver",
    "ResourceFilter",
    "parse_device_id",
    "parse_dra_device",
]

GPU = "gpu"
MIG = "mig"
MINOR = "minor"
DRA_GPU = "dra-gpu"
DRA_MIG = "dra-mig"

DEFAULT_RESOURCE_NAMES: tuple[str, ...] = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
)
"""Device-plugin resource names attributed by default (``*`` is a wildcard)."""

DEFAULT_DRA_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)

_HEX_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
_REPLICA = r"(?:::(?P<replica>\d+))?"
_GPU_RE = re.compile(rf"(?P<uuid>GPU-{_HEX_UUID}){_REPLICA}")
_MIG_RE = re.compile(rf"(?P<uuid>MIG-{_HEX_UUID}){_REPLICA}")
_MIG_LEGACY_RE = re.compile(
    rf"MIG-(?P<uuid>GPU-{_HEX_UUID})/(?P<gi>\d+)/(?P<ci>\d+){_REPLICA}"
)
_GKE_RE = re.compile(r"nvidia(?P<minor>\d+)(?:/gi(?P<gi>\d+))?(?:/vgpu(?P<vgpu>\d+))?")
_DRA_GPU_RE = re.compile(r"gpu-(?P<n>\d+)")
_DRA_MIG_RE = re.compile(r"gpu-(?P<n>\d+)-mig-(?P<rest>[0-9a-z-]+)")
# A MIG profile as it appears in a DRA device name: dots dropped, e.g. 1g10gb,
# 1g10gbme, 1c3g20gb (compute-instance profiles).
_DRA_PROFILE_RE = re.compile(r"(?:\d+c)?\d+g\d+gb[a-z0-9]*")
# Current names: profile (a suffix such as +me became -me), profile id, placement start.
_DRA_PLACED_RE = re.compile(
    r"(?P<profile>(?:\d+c)?\d+g\d+gb[a-z0-9]*(?:-[a-z][a-z0-9]*)*)-(?P<pid>\d+)-(?P<start>\d+)"
)
# Earlier names: profile id, placement start, placement size.
_DRA_NUMERIC_RE = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)-(?P<size>\d+)")
_MAX_NUMBER = 1 << 31


@dataclass(frozen=True)
class DeviceRef:
    """A parsed device id. Only the fields its ``kind`` uses are set.

    ``uuid`` is the NVML uuid named by the id (for pre-R470 MIG ids: the
    parent GPU's); ``minor`` the ``/dev/nvidiaN`` number (GKE and DRA);
    ``replica`` / ``vgpu`` mark a shared device (time-slicing, MPS, GKE
    sharing). ``mig_profile`` is a DRA MIG profile with its dots removed;
    ``gi_profile_id`` and ``placement_start`` the GPU instance a DRA MIG name
    places.
    """

    kind: str
    uuid: str | None = None
    minor: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    replica: int | None = None
    vgpu: int | None = None
    dra_index: int | None = None
    mig_profile: str | None = None
    gi_profile_id: int | None = None
    placement_start: int | None = None

    @property
    def shared(self) -> bool:
        """The id names one share of a device that several holders may use."""
        return self.replica is not None or self.vgpu is not None

    @property
    def share(self) -> int | None:
        """Replica or GKE vgpu number: which share of the device this is."""
        return self.replica if self.replica is not None else self.vgpu


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text)
    if value >= _MAX_NUMBER:
        raise ValueError(text)
    return value


def parse_device_id(device_id: str) -> DeviceRef | None:
    """Parse a device-plugin id from ``device_ids``; ``None`` if not understood."""
    if not isinstance(device_id, str) or len(device_id) > 256:
        return None
    try:
        m = _GPU_RE.fullmatch(device_id)
        if m:
            return DeviceRef(GPU, uuid=m["uuid"], replica=_int(m["replica"]))
        m = _MIG_LEGACY_RE.fullmatch(device_id)
        if m:
            return DeviceRef(
                MIG,
                uuid=m["uuid"],
                gpu_instance_id=_int(m["gi"]),
                compute_instance_id=_int(m["ci"]),
                replica=_int(m["replica"]),
            )
        m = _MIG_RE.fullmatch(device_id)
        if m:
            return DeviceRef(MIG, uuid=m["uuid"], replica=_int(m["replica"]))
        m = _GKE_RE.fullmatch(device_id)
        if m:
            return DeviceRef(
                MINOR,
                minor=_int(m["minor"]),
                gpu_instance_id=_int(m["gi"]),
                vgpu=_int(m["vgpu"]),
            )
    except ValueError:
        return None
    return None


def parse_dra_device(device_name: str) -> DeviceRef | None:
    """Parse a DRA device name from driver ``gpu.nvidia.com``; ``None`` if not understood."""
    if not isinstance(device_name, str) or len(device_name) > 256:
        return None
    try:
        m = _DRA_GPU_RE.fullmatch(device_name)
        if m:
            n = _int(m["n"])
            return DeviceRef(DRA_GPU, minor=n, dra_index=n)
        m = _DRA_MIG_RE.fullmatch(device_name)
        if m:
            n = _int(m["n"])
            rest = m["rest"]
            placed = _DRA_PLACED_RE.fullmatch(rest) or _DRA_NUMERIC_RE.fullmatch(rest)
            if placed:
                groups = placed.groupdict()
                return DeviceRef(DRA_MIG, minor=n, dra_index=n, mig_profile=groups.get("profile"),
                                 gi_profile_id=_int(placed["pid"]),
                                 placement_start=_int(placed["start"]))
            first = rest.split("-", 1)[0]
            profile = first if _DRA_PROFILE_RE.fullmatch(first) else None
            return DeviceRef(DRA_MIG, minor=n, dra_index=n, mig_profile=profile)
    except ValueError:
        return None
    return None


class ResourceFilter:
    """Which device-plugin resource names and DRA drivers count as GPUs.

    Names may use shell wildcards (``nvidia.com/mig-*``). ``extra_*`` are
    added to the defaults, for plugins configured with renamed resources.
    """

    def __init__(
        self,
        extra_resource_names: Iterable[str] = (),
        extra_dra_drivers: Iterable[str] = (),
        *,
        resource_names: Iterable[str] = DEFAULT_RESOURCE_NAMES,
        dra_drivers: Iterable[str] = DEFAULT_DRA_DRIVERS,
    ) -> None:
        names = [*resource_names, *extra_resource_names]
        self._exact = frozenset(n for n in names if not _is_pattern(n))
        self._patterns = tuple(n for n in names if _is_pattern(n))
        self._drivers = frozenset([*dra_drivers, *extra_dra_drivers])
        self._cache: dict[str, bool] = {}

    def accepts_resource(self, name: str) -> bool:
        hit = self._cache.get(name)
        if hit is None:
            hit = name in self._exact or any(
                fnmatch.fnmatchcase(name, p) for p in self._patterns
            )
            if len(self._cache) < 4096:
                self._cache[name] = hit
        return hit

    def accepts_driver(self, driver: str) -> bool:
        return driver in self._drivers


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def _norm_profile(profile: str | None) -> str | None:
    """``1g.10gb+me`` (NVML) and ``1g10gb-me`` (DRA) -> ``1g10gbme``."""
    if profile is None:
        return None
    return "".join(ch for ch in profile.lower() if ch.isalnum())


class DeviceResolver:
    """Maps :class:`DeviceRef` to the uuid of one of the node's devices.

    Built once per device list (discovery does not change while running), so
    a lookup is a few dict reads.
    """

    def __init__(self, devices: Sequence[Device]) -> None:
        self._uuids: dict[str, str] = {}
        self._gpu_by_minor: dict[int, Device] = {}
        self._gpu_by_index: dict[int, Device] = {}
        self._mig_by_ids: dict[tuple[str, int, int], Device] = {}
        self._migs_by_gi: dict[tuple[str, int], list[Device]] = {}
        self._migs_by_parent: dict[str, list[Device]] = {}
        any_minor = False
        for d in devices:
            self._uuids[d.uuid.lower()] = d.uuid
            if d.is_mig:
                parent = d.parent_uuid.lower()  # type: ignore[union-attr]
                self._migs_by_parent.setdefault(parent, []).append(d)
                if d.gpu_instance_id is not None:
                    self._migs_by_gi.setdefault((parent, d.gpu_instance_id), []).append(d)
                    if d.compute_instance_id is not None:
                        key = (parent, d.gpu_instance_id, d.compute_instance_id)
                        self._mig_by_ids[key] = d
            else:
                if d.minor_number is not None:
                    any_minor = True
                    self._gpu_by_minor[d.minor_number] = d
                self._gpu_by_index[d.index] = d
        self._any_minor = any_minor

    def resolve(self, ref: DeviceRef) -> str | None:
        """The uuid (GPU or MIG) the reference names on this node, or ``None``."""
        if ref.kind in (GPU, MIG) and ref.uuid is not None:
            if ref.gpu_instance_id is not None and ref.compute_instance_id is not None:
                mig = self._mig_by_ids.get(
                    (ref.uuid.lower(), ref.gpu_instance_id, ref.compute_instance_id)
                )
                return mig.uuid if mig else None
            return self._uuids.get(ref.uuid.lower())
        if ref.kind == MINOR and ref.minor is not None:
            gpu = self._gpu_by_minor.get(ref.minor)
            if gpu is None:
                return None
            if ref.gpu_instance_id is None:
                return gpu.uuid
            return _pick_instance(self._migs_by_gi.get((gpu.uuid.lower(), ref.gpu_instance_id)))
        if ref.kind in (DRA_GPU, DRA_MIG) and ref.minor is not None:
            gpu = (
                self._gpu_by_minor.get(ref.minor)
                if self._any_minor
                else self._gpu_by_index.get(ref.minor)
            )
            if gpu is None:
                return None
            if ref.kind == DRA_GPU:
                return gpu.uuid
            return _dra_instance(self._migs_by_parent.get(gpu.uuid.lower(), []), ref)
        return None


def _placed(device: Device) -> bool:
    return device.gpu_instance_profile_id is not None and device.placement_start is not None


def _dra_instance(children: list[Device], ref: DeviceRef) -> str | None:
    """The MIG instance among one GPU's ``children`` that a DRA MIG name designates.

    By GPU-instance profile id and placement start where the name and discovery
    both have them; otherwise (older drivers, a failed read) by profile, when
    only one instance without a known placement has it.
    """
    if ref.gi_profile_id is not None and ref.placement_start is not None:
        exact = [c for c in children if c.gpu_instance_profile_id == ref.gi_profile_id
                 and c.placement_start == ref.placement_start]
        if exact:
            return _pick_instance(exact)
        children = [c for c in children if not _placed(c)]
    if ref.mig_profile is not None:
        want = _norm_profile(ref.mig_profile)
        children = [c for c in children if _norm_profile(c.mig_profile) == want]
    return children[0].uuid if len(children) == 1 else None


def _pick_instance(candidates: list[Device] | None) -> str | None:
    """The MIG device of one GPU instance: its only compute instance, else CI 0."""
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0].uuid
    for c in candidates:
        if c.compute_instance_id == 0:
            return c.uuid
    return None
