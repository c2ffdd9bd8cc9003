"""NVLink fabric: a GPU's registration in its NVLink domain, and the domain's health.

``nvmlDeviceGetGpuFabricInfoV`` fills the versioned structure (v2: with the health
mask; v3: with the health summary too) up to the scenario's ``fabric.version``, and
answers ARGUMENT_VERSION_MISMATCH for a newer one, as an older driver does;
``nvmlDeviceGetGpuFabricInfo`` fills the first, unversioned form. A GPU without
``fabric`` answers NOT_SUPPORTED to both, as a GPU outside any NVLink domain does on
drivers that refuse the call; ``state: not_supported`` is the other answer such a GPU
gets (SUCCESS, state NOT_SUPPORTED).
"""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, Target, c_symbol, deref
from otel_gpu.sim.scenario import U32_MAX, Fabric, clamp


def _spec(target: Target) -> Fabric:
    fabric = target.gpu.fabric
    if fabric is None:
        raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
    return fabric


class FabricSymbols(DriverCore):
    @staticmethod
    def _fabric_info(info: Any, fabric: Fabric, sample: int, k: int) -> None:
        state = fabric.state_at(sample)
        info.state = state
        completed = state == abi.NVML_GPU_FABRIC_STATE_COMPLETED
        # Before completion the driver has no clique, cluster or status to give.
        info.status = fabric.status if completed else abi.NVML_SUCCESS
        info.cliqueId = fabric.clique_id if completed else 0
        ctypes.memmove(info.clusterUuid, fabric.cluster_uuid if completed else bytes(16), 16)
        if hasattr(info, "healthMask"):
            info.healthMask = clamp(fabric.health_mask.at(sample, k), U32_MAX)
        if hasattr(info, "healthSummary"):
            info.healthSummary = fabric.health_summary

    @c_symbol
    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetGpuFabricInfoV", handle)
        fabric = _spec(target)
        info = deref(info_ref)
        version = info.version >> 24
        # the versions the binding knows (an older one lacks v3): what a caller can pass
        known = {(getattr(pynvml, f"nvmlGpuFabricInfo_v{n}", None), n) for n in (2, 3)}
        if (info.version, version) not in known or version > fabric.version:
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._fabric_info(info, fabric, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetGpuFabricInfo", handle)
        self._fabric_info(deref(info_ref), _spec(target), sample, target.gpu.position)
