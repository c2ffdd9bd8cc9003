"""MIG: the mode, walking a GPU's instance slots, and going from an instance to its parent.

The parent also hands out GPU instance handles by GPU-instance id
(``nvmlDeviceGetGpuInstanceById``), whose ``nvmlGpuInstanceGetInfo`` gives the
instance's profile id and placement: the scenario's ``gi_profile_id`` and
``placement_start``, or the defaults :func:`gi_profile_id` and
:func:`placement` derive from the profile and the slots before it.

A scenario's ``mig`` list fills slots 0..n-1 of at most
:data:`~otel_gpu.sim.scenario.MAX_MIG_DEVICES`; the rest answer NOT_FOUND, as
on a real GPU with fewer instances than slots. On a MIG handle the
slot walk is INVALID_ARGUMENT (see ``DriverCore._check``).
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import (
    DriverCore,
    Fail,
    arg_int,
    c_symbol,
    deref,
    gpu_token,
    mig_token,
    token_of,
    write_handle,
)
from otel_gpu.sim.scenario import MAX_MIG_DEVICES, GpuSpec, MigSpec

_GI_TOKEN = 0x40
"""GPU instance handles are ``gpu_token(index) | (_GI_TOKEN + slot)``: no device handle's."""
_SLICES = re.compile(r"(\d+)g\.")
_PROFILE_IDS = {1: 19, 2: 14, 3: 9, 4: 5, 7: 0}
_PLACEMENT_SIZES = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}


def _slices(profile: str) -> int:
    match = _SLICES.search(profile)
    return int(match.group(1)) if match else 1


def gi_profile_id(mig: MigSpec) -> int:
    """The GPU instance profile id: the scenario's, else the A100/H100 id of its slice count."""
    if mig.gi_profile_id is not None:
        return mig.gi_profile_id
    slices = _slices(mig.profile)
    if slices == 1 and "+me" in mig.profile:
        return 20
    return _PROFILE_IDS.get(slices, 19)


def placement(gpu: GpuSpec, mig: MigSpec) -> tuple[int, int]:
    """(start, size) of the instance's placement: the scenario's start, else after the
    instances in the slots before it."""
    size = _PLACEMENT_SIZES.get(_slices(mig.profile), 1)
    if mig.placement_start is not None:
        return mig.placement_start, size
    start = sum(_PLACEMENT_SIZES.get(_slices(m.profile), 1) for m in gpu.mig[:mig.slot])
    return start, size


class MigSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetMigMode", handle)
        if not target.gpu.mig_capable:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        mode = abi.NVML_DEVICE_MIG_ENABLE if target.gpu.mig else abi.NVML_DEVICE_MIG_DISABLE
        deref(current).value = mode
        deref(pending).value = mode

    @c_symbol
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetMaxMigDeviceCount", handle)
        if not target.gpu.mig_capable:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = MAX_MIG_DEVICES

    @c_symbol
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        gpu = target.gpu
        if not gpu.mig_capable:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        slot = arg_int(index)
        if not 0 <= slot < MAX_MIG_DEVICES:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(gpu.mig) or not gpu.mig[slot].exists_at(sample):
            raise Fail(abi.NVML_ERROR_NOT_FOUND)
        write_handle(out, mig_token(gpu.index, slot))

    @c_symbol(mig=True)
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceIsMigDeviceHandle", handle)
        deref(out).value = int(target.mig is not None)

    @c_symbol(mig=True)
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if target.mig is None:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        write_handle(out, gpu_token(target.gpu.index))

    @c_symbol(mig=True)
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetGpuInstanceId", handle)
        if target.mig is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = target.mig.gpu_instance_id

    @c_symbol(mig=True)
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetComputeInstanceId", handle)
        if target.mig is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = target.mig.compute_instance_id

    @c_symbol
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetGpuInstanceById", handle)
        gpu = target.gpu
        if not gpu.mig_capable or not gpu.mig:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        wanted = arg_int(gi_id)
        for m in gpu.mig:
            if m.gpu_instance_id == wanted and m.exists_at(sample):
                write_handle(out, gpu_token(gpu.index) | (_GI_TOKEN + m.slot))
                return
        raise Fail(abi.NVML_ERROR_NOT_FOUND)

    @c_symbol
    def nvmlGpuInstanceGetInfo(self, gi_handle: Any, info_ref: Any) -> None:
        sample = self.check_system(None)
        token = token_of(gi_handle) or 0
        index, slot = (token >> 8) - 1, (token & 0xFF) - _GI_TOKEN
        if not (0 <= index < len(self.scenario.devices) and 0 <= slot < MAX_MIG_DEVICES):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.scenario.devices[index]
        if gpu.lost_at(sample):
            raise Fail(abi.NVML_ERROR_GPU_IS_LOST)
        if slot >= len(gpu.mig) or not gpu.mig[slot].exists_at(sample):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)  # destroyed since the lookup
        mig = gpu.mig[slot]
        info = deref(info_ref)
        offset = type(info).device.offset
        ctypes.c_void_p.from_buffer(info, offset).value = gpu_token(gpu.index)
        info.id = mig.gpu_instance_id
        info.profileId = gi_profile_id(mig)
        info.placement.start, info.placement.size = placement(gpu, mig)
