"""NVLink fabric: a GPU's registration in its NVLink domain, and the domain's health.

``nvmlDeviceGetGpuFabricInfoV`` fills the versioned structure (v2: with the health
mask; v3: with the health summary too) up to the scenario's ``fabric.version``, and
answers ARGUMENT_VERSION_MISMATCH for a newer one, as an older driver does;
``nvmlDeviceGetGpuFabricInfo`` fills the first, unversioned form. Both write at
``nvml.h``'s offsets (:mod:`otel_gpu.nvml_structs`), as the driver does, so a caller
passing a structure laid out otherwise reads what it would read from a real driver.
A GPU without ``fabric`` answers NOT_SUPPORTED to both, as a GPU outside any NVLink
domain does on drivers that refuse the call; ``state: not_supported`` is the other
answer such a GPU gets (SUCCESS, state NOT_SUPPORTED).
"""

from __future__ import annotations

import ctypes
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu import nvml_structs as structs
from otel_gpu.sim.driver._core import DriverCore, Fail, Target, c_symbol, deref
from otel_gpu.sim.scenario import U32_MAX, Fabric, clamp


def _spec(target: Target) -> Fabric:
    fabric = target.gpu.fabric
    if fabric is None:
        raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
    return fabric


class FabricSymbols(DriverCore):
    @staticmethod
    def _fabric_info(given: Any, layout: type[ctypes.Structure], fabric: Fabric, sample: int,
                     k: int) -> None:
        # written at nvml.h's offsets, as the driver does, whatever type the caller passed
        info: Any = layout.from_buffer(given)
        state = fabric.state_at(sample)
        info.state = state
        completed = state == abi.NVML_GPU_FABRIC_STATE_COMPLETED
        # Before completion the driver has no clique, cluster or status to give.
        info.status = fabric.status if completed else abi.NVML_SUCCESS
        info.cliqueId = fabric.clique_id if completed else 0
        ctypes.memmove(info.clusterUuid, fabric.cluster_uuid if completed else bytes(16), 16)
        if layout is not structs.GpuFabricInfo:
            info.healthMask = clamp(fabric.health_mask.at(sample, k), U32_MAX)
        if layout is structs.GpuFabricInfoV3:
            info.healthSummary = fabric.health_summary

    @c_symbol
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetGpuFabricInfoV", handle)
        fabric = _spec(target)
        info = deref(info_ref)
        # nvml.h's version words (size and number) name the layout, as for the driver
        version = ctypes.c_uint.from_buffer(info).value
        layout = structs.GPU_FABRIC_INFO_VERSIONS.get(version)
        if layout is None or version >> 24 > fabric.version:
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fabric_info(info, layout, fabric, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetGpuFabricInfo", handle)
        self._fabric_info(deref(info_ref), structs.GpuFabricInfo, _spec(target), sample,
                          target.gpu.position)
