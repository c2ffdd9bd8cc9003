"""Discovery: which GPUs and MIG instances there are, and what each is.

Each GPU is looked up (handle, UUID, description, MIG walk) by
:meth:`Discovery.open`, a job for that GPU's worker thread: a GPU whose
driver call hangs there stalls only itself, as in sampling. The job returns
a :class:`Found` record and touches no tracked state; the sampler thread
turns the records into :class:`~otel_gpu.sample.device.Tracked` devices
(:meth:`Discovery.assemble`), keeping the identity of every device seen before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu._files import read_sysfs
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Nvml, Result
from otel_gpu.sample.workers import DeviceWorker
from otel_gpu.snapshot import Device


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def mig_profile(name: str) -> str | None:
    """``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``1g.5gb``."""
    _, sep, profile = name.partition(" MIG ")
    if not sep:
        return None
    return profile.strip() or None


def unknown_uuid(index: int) -> str:
    """The ``hw.id`` of a GPU NVML counts but has never let us open: its index stands in."""
    return f"GPU-unknown-index-{index}"


@dataclass(frozen=True)
class Found:
    """What one GPU's discovery job found."""

    index: int
    handle: Any = None
    uuid: str | None = None
    why: str = ""
    """Why it could not be opened (``uuid`` is then None)."""
    device: Device | None = None
    """Its description, when it was not known before."""
    mig: tuple[tuple[Device, Any], ...] = ()
    mig_note: str | None = None
    """Why a GPU in MIG mode shows no MIG instance (none exists, or NVML refused them)."""
    """Its MIG instances and their handles."""
    registration: Result | None = None
    """The answer of its XID event registration, when one was made."""


MAX_ID = 64
"""More MIG slots, GPU instances or compute instances than a GPU has (seven on A100 and
H100, ids below 15): an id or count past it (NVML's all-ones, say) is no answer."""


def _small(value: Any) -> int | None:
    """A MIG slot count or instance id NVML answered, or None where it cannot be one."""
    return value if isinstance(value, int) and 0 <= value < MAX_ID else None


def _distinct_ids(found: list[tuple[Device, Any]]) -> tuple[tuple[Device, Any], ...]:
    """Two instances of one GPU never share a GPU and compute instance id: where NVML says
    they do, neither id is believed (their GPM, read by the id, is left out rather than
    one instance's given as the other's)."""
    pairs: Counter[tuple[int | None, int | None]] = Counter(
        (d.gpu_instance_id, d.compute_instance_id) for d, _ in found
        if d.gpu_instance_id is not None)
    return tuple(
        (replace(d, gpu_instance_id=None, compute_instance_id=None,
                 gpu_instance_profile_id=None, placement_start=None)
         if pairs[(d.gpu_instance_id, d.compute_instance_id)] > 1 else d, handle)
        for d, handle in found)


class Discovery:
    """Looks GPUs up on their worker threads; ``sysfs_root`` gives a lost GPU its bus id."""

    def __init__(self, nvml: Nvml, *, sysfs_root: Path | None = None) -> None:
        self._nvml = nvml
        self._m = nvml.module
        self._sysfs_root = sysfs_root
        self._gone_codes = frozenset(getattr(abi, n) for n in (
            "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"))

    def _get(self, worker: DeviceWorker, name: str, *args: Any) -> Any:
        """A discovery read (the pynvml function ``name``) whose failure just leaves the
        attribute unknown, as does a function the installed nvidia-ml-py lacks."""
        with worker.doing(name):
            res = self._nvml.call(lambda: getattr(self._m, name)(*args))
        return res.value if res.ok else None

    def driver_version(self) -> str | None:
        version = self._nvml.call(self._m.nvmlSystemGetDriverVersion)
        return text(version.value) if version.ok else None

    # --- on the GPU's worker thread -----------------------------------------------------

    def open(self, index: int, known: Collection[str],
             register: Callable[[str, Any], Result | None], worker: DeviceWorker) -> Found:
        """GPU ``index``: a GPU seen before (its UUID in ``known``) keeps its identity, only a
        new one is described; ``register(uuid, handle)`` makes its XID registration if due."""
        m = self._m
        with worker.doing("nvmlDeviceGetHandleByIndex"):
            res = self._nvml.call(m.nvmlDeviceGetHandleByIndex, index)
        uuid = self._get(worker, "nvmlDeviceGetUUID", res.value) if res.ok else None
        if uuid is None:
            return Found(index, why=res.message or "no UUID")
        if not text(uuid).startswith("GPU-"):  # SUCCESS with nothing written reads ""
            return Found(index, why=f"its UUID answer {text(uuid)[:64]!r} is no GPU UUID")
        handle, uuid = res.value, text(uuid)
        device = None if uuid in known else self._describe(index, handle, uuid, worker)
        name = device.name if device is not None else ""
        mig, mig_note = self._mig(handle, name, worker)
        with worker.doing("nvmlDeviceRegisterEvents"):
            registration = register(uuid, handle)
        return Found(index, handle, uuid, device=device, mig=mig, mig_note=mig_note,
                     registration=registration)

    def reopenable(self, index: int, worker: DeviceWorker) -> bool:
        """Whether a GPU that could not be opened now can: two calls."""
        m = self._m
        with worker.doing("nvmlDeviceGetHandleByIndex"):
            res = self._nvml.call(m.nvmlDeviceGetHandleByIndex, index)
        ok = res.ok and self._get(worker, "nvmlDeviceGetUUID", res.value) is not None
        return ok

    def _describe(self, index: int, handle: Any, uuid: str, worker: DeviceWorker) -> Device:
        get = self._get
        name = text(get(worker, "nvmlDeviceGetName", handle) or "NVIDIA GPU")
        pci = get(worker, "nvmlDeviceGetPciInfo", handle)
        numa = get(worker, "nvmlDeviceGetNumaNodeId", handle)
        serial = get(worker, "nvmlDeviceGetSerial", handle)
        vbios = get(worker, "nvmlDeviceGetVbiosVersion", handle)
        return Device(
            uuid=uuid,
            index=index,
            name=name,
            model=name,
            pci_bus_id=text(pci.busId) if pci is not None else "",
            minor_number=get(worker, "nvmlDeviceGetMinorNumber", handle),
            numa_node=numa if isinstance(numa, int) and numa >= 0 else None,
            serial=text(serial) if serial else None,
            vbios_version=text(vbios) if vbios else None,
        )

    def _mig(self, handle: Any, gpu_name: str, worker: DeviceWorker
             ) -> tuple[tuple[tuple[Device, Any], ...], str | None]:
        """The GPU's MIG instances, described as far as the parent's identity is not needed
        (``assemble`` fills that in): a placeholder parent of the right name; and, in MIG
        mode without one, why."""
        m = self._m
        get = self._get
        with worker.doing("nvmlDeviceGetMigMode"):
            mode = self._nvml.call(m.nvmlDeviceGetMigMode, handle)
        if not mode.ok or mode.value[0] != abi.NVML_DEVICE_MIG_ENABLE:
            return (), None
        told = _small(get(worker, "nvmlDeviceGetMaxMigDeviceCount", handle))
        # The slot past the count is asked too: where it answers, the count was wrong and
        # every slot an id can have is asked (so is each where the count gave no answer).
        limit = told + 1 if told else MAX_ID
        out = []
        refused: set[str] = set()
        slot = 0
        while slot < limit:
            with worker.doing("nvmlDeviceGetMigDeviceHandleByIndex"):
                res = self._nvml.call(m.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            slot += 1
            if not res.ok:
                if res.code not in self._gone_codes:  # not an empty slot
                    refused.add(res.message)
                continue
            if slot == limit and limit < MAX_ID:
                limit = MAX_ID
            uuid = get(worker, "nvmlDeviceGetUUID", res.value)
            if uuid is None:
                continue
            name = get(worker, "nvmlDeviceGetName", res.value)
            gi_id = _small(get(worker, "nvmlDeviceGetGpuInstanceId", res.value))
            # The GPU instance's profile id and placement, as NVIDIA's DRA driver names it.
            gi = None
            if gi_id is not None:
                with worker.doing("nvmlDeviceGetGpuInstanceById"):
                    found = self._nvml.call(m.nvmlDeviceGetGpuInstanceById, handle, gi_id)
                gi = found.value if found.ok else None
                if found.code in self._gone_codes:
                    gi_id = None  # the GPU has no instance of that id: the answer was wrong
            info = get(worker, "nvmlGpuInstanceGetInfo", gi) if gi is not None else None
            name_text = text(name) if name else ""
            device = Device(
                uuid=text(uuid),
                index=-1,
                name=name_text,
                model="",
                pci_bus_id="",
                gpu_instance_id=gi_id,
                compute_instance_id=_small(
                    get(worker, "nvmlDeviceGetComputeInstanceId", res.value)),
                mig_profile=mig_profile(name_text),
                gpu_instance_profile_id=int(info.profileId) if info is not None else None,
                placement_start=int(info.placement.start) if info is not None else None,
            )
            out.append((device, res.value))
        note = None
        if not out:
            note = ("in MIG mode, but NVML lists no MIG instance: "
                    + ("; ".join(sorted(refused)) if refused else "none is created"))
        return _distinct_ids(out), note

    # --- on the sampler thread ----------------------------------------------------------

    @staticmethod
    def assemble(found: Found, previous: Mapping[str, Tracked]) -> list[Tracked]:
        """The tracked GPU and MIG instances of an opened GPU, reusing those seen before."""
        assert found.uuid is not None
        gpu = previous.get(found.uuid)
        if gpu is None:
            assert found.device is not None
            gpu = Tracked(found.device, found.handle)
        gpu.handle = found.handle
        gpu.open_failure = None
        gpu.mig_note = found.mig_note
        out = [gpu]
        for partial, handle in found.mig:
            device = replace(
                gpu.device,
                uuid=partial.uuid,
                name=partial.name or gpu.device.name,
                parent_uuid=gpu.device.uuid,
                gpu_instance_id=partial.gpu_instance_id,
                compute_instance_id=partial.compute_instance_id,
                mig_profile=mig_profile(partial.name or gpu.device.name),
                serial=None,
                vbios_version=None,
                gpu_instance_profile_id=partial.gpu_instance_profile_id,
                placement_start=partial.placement_start,
            )
            tracked = previous.get(device.uuid) or Tracked(device, handle)
            tracked.handle = handle
            tracked.parent = gpu
            out.append(tracked)
        return out

    def unopened(self, index: int, count: int, why: str) -> Tracked:
        """A GPU lost since start: its index and, where sysfs tells, its PCI bus id."""
        device = Device(
            uuid=unknown_uuid(index), index=index, name="NVIDIA GPU", model="NVIDIA GPU",
            pci_bus_id=self._sysfs_bus_id(index, count) or "",
        )
        return Tracked(device, None, open_failure=why)

    def _sysfs_bus_id(self, index: int, count: int) -> str | None:
        """NVML numbers GPUs in PCI bus order: the index-th NVIDIA display device in sysfs."""
        if self._sysfs_root is None:
            return None
        driver = self._sysfs_root / "sys" / "bus" / "pci" / "drivers" / "nvidia"
        try:
            gpus = sorted(
                entry.name for entry in driver.iterdir()
                if ":" in entry.name and (read_sysfs(entry / "class") or "").startswith("0x03")
            )
        except OSError:
            return None
        if len(gpus) != count or index >= len(gpus):
            return None  # some GPUs are hidden from this container: the order would lie
        domain, bus, devfn = gpus[index].split(":")
        return f"{int(domain, 16):08X}:{bus.upper()}:{devfn.upper()}"
