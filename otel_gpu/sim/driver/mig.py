"""MIG: the mode, walking a GPU's instance slots, and going from an instance to its parent.

A scenario's ``mig`` list fills slots 0..n-1 of at most
:data:`~otel_gpu.sim.scenario.MAX_MIG_DEVICES`; the rest answer NOT_FOUND, as
on a real GPU with fewer instances than slots. On a MIG handle the
slot walk is INVALID_ARGUMENT (see ``DriverCore._check``).
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu.sim.driver._core import (
    DriverCore,
    Fail,
    arg_int,
    c_symbol,
    deref,
    gpu_token,
    mig_token,
    write_handle,
)
from otel_gpu.sim.scenario import MAX_MIG_DEVICES


class MigSymbols(DriverCore):
    @c_symbol
    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetMigMode", handle)
        if not target.gpu.mig_capable:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if target.gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        deref(current).value = mode
        deref(pending).value = mode

    @c_symbol
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetMaxMigDeviceCount", handle)
        if not target.gpu.mig_capable:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = MAX_MIG_DEVICES

    @c_symbol
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        gpu = target.gpu
        if not gpu.mig_capable:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        slot = arg_int(index)
        if not 0 <= slot < MAX_MIG_DEVICES:
            raise Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slot >= len(gpu.mig) or not gpu.mig[slot].exists_at(sample):
            raise Fail(pynvml.NVML_ERROR_NOT_FOUND)
        write_handle(out, mig_token(gpu.index, slot))

    @c_symbol
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceIsMigDeviceHandle", handle)
        deref(out).value = int(target.mig is not None)

    @c_symbol
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if target.mig is None:
            raise Fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        write_handle(out, gpu_token(target.gpu.index))

    @c_symbol
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetGpuInstanceId", handle)
        if target.mig is None:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = target.mig.gpu_instance_id

    @c_symbol
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetComputeInstanceId", handle)
        if target.mig is None:
            raise Fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        deref(out).value = target.mig.compute_instance_id
