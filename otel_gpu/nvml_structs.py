"""The NVML structures the collector lays out itself, as ``nvml.h`` declares them.

The binding's functions for these only forward the pointer they are given to the C
library, so the collector passes its own structure and the layout does not depend on
the nvidia-ml-py installed. Older releases declare the fabric info with the cluster
UUID as 80 characters where ``nvml.h`` has 16 bytes, which puts every later field at
the wrong offset against a real driver (and the first form keeps 80 bytes even in
13.x). ``tests/sample/test_nvml_structs.py`` checks the sizes, offsets and version
words against ``nvml.h``'s arithmetic and the binding's words where it defines them.
"""

from __future__ import annotations

import ctypes

from otel_gpu import nvml_abi as abi


def _version(struct: type[ctypes.Structure], number: int) -> int:
    """NVML's ``NVML_STRUCT_VERSION``: the structure's size with the version in the top byte."""
    return ctypes.sizeof(struct) | number << 24


class GpuFabricInfo(ctypes.Structure):
    """``nvmlGpuFabricInfo_t``: the first form, without a version (R525 and later)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * abi.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),  # nvmlReturn_t
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),  # nvmlGpuFabricState_t
    ]


class GpuFabricInfoV2(ctypes.Structure):
    """``nvmlGpuFabricInfo_v2_t``: the versioned form with the health mask (R550)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * abi.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint),
    ]

    def __init__(self) -> None:
        super().__init__(version=NVML_GPU_FABRIC_INFO_V2)


class GpuFabricInfoV3(ctypes.Structure):
    """``nvmlGpuFabricInfo_v3_t``: the health summary added (R570)."""

    _fields_ = [
        *GpuFabricInfoV2._fields_,
        ("healthSummary", ctypes.c_ubyte),  # nvmlGpuFabricHealthSummary_t
    ]

    def __init__(self) -> None:
        super().__init__(version=NVML_GPU_FABRIC_INFO_V3)


NVML_GPU_FABRIC_INFO_V2 = _version(GpuFabricInfoV2, 2)
"""``nvmlGpuFabricInfo_v2``: 0x02000024."""
NVML_GPU_FABRIC_INFO_V3 = _version(GpuFabricInfoV3, 3)
"""``nvmlGpuFabricInfo_v3``: 0x03000028."""

GPU_FABRIC_INFO_VERSIONS: dict[int, type[ctypes.Structure]] = {
    NVML_GPU_FABRIC_INFO_V3: GpuFabricInfoV3,
    NVML_GPU_FABRIC_INFO_V2: GpuFabricInfoV2,
}
"""The versioned fabric structures by version word, newest first."""


class Temperature(ctypes.Structure):
    """``nvmlTemperature_v1_t``: ``nvmlDeviceGetTemperatureV``'s signed reading (R535).
    nvidia-ml-py 12.x has no call for it; the simulator answers it as nvml.h lays it out."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("sensorType", ctypes.c_uint),  # nvmlTemperatureSensors_t
        ("temperature", ctypes.c_int),
    ]

    def __init__(self, sensor: int = 0) -> None:
        super().__init__(version=NVML_TEMPERATURE_V1, sensorType=sensor)


NVML_TEMPERATURE_V1 = _version(Temperature, 1)
"""``nvmlTemperature_v1``: 0x0100000C."""
