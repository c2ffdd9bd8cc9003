"""The collector's own NVML structures (:mod:`otel_gpu.nvml_structs`) have nvml.h's layout,
whichever nvidia-ml-py is installed, and the simulator writes at those offsets."""

from __future__ import annotations

import ctypes
import struct

import pynvml
import pytest

from otel_gpu import nvml_abi as abi
from otel_gpu import nvml_structs as structs
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.readers import GPU_FABRIC

UUID = "4c1d6a52-9b3e-4f0a-8c21-7e5d3b2a1f60"
TRAY = f"""
devices:
  - name: NVIDIA GB200
    fabric: {{state: completed, version: 3, clique_id: 7, cluster_uuid: {UUID},
              health_mask: 0x51A9, health_summary: limited_capacity, status: TIMEOUT}}
"""


def _offsets(layout: type[ctypes.Structure]) -> dict[str, tuple[int, int]]:
    """Each field's (offset, size)."""
    return {name: (getattr(layout, name).offset, getattr(layout, name).size)
            for name, *_ in layout._fields_}


@pytest.mark.parametrize(("layout", "size", "offsets"), [
    (structs.GpuFabricInfo, 28,
     {"clusterUuid": (0, 16), "status": (16, 4), "cliqueId": (20, 4), "state": (24, 1)}),
    (structs.GpuFabricInfoV2, 36,
     {"version": (0, 4), "clusterUuid": (4, 16), "status": (20, 4), "cliqueId": (24, 4),
      "state": (28, 1), "healthMask": (32, 4)}),
    (structs.Temperature, 12,
     {"version": (0, 4), "sensorType": (4, 4), "temperature": (8, 4)}),
    (structs.GpuFabricInfoV3, 40,
     {"version": (0, 4), "clusterUuid": (4, 16), "status": (20, 4), "cliqueId": (24, 4),
      "state": (28, 1), "healthMask": (32, 4), "healthSummary": (36, 1)}),
])
def test_the_structures_have_nvml_h_layout(layout, size, offsets):
    """A 16-byte cluster UUID and a one-byte state, as nvml.h declares them; a signed
    temperature."""
    assert ctypes.sizeof(layout) == size
    assert _offsets(layout) == offsets


def test_the_version_words_are_nvml_h_and_the_bindings_where_it_has_them():
    assert structs.NVML_GPU_FABRIC_INFO_V2 == 0x02000024
    assert structs.NVML_GPU_FABRIC_INFO_V3 == 0x03000028
    assert structs.GpuFabricInfoV2().version == 0x02000024
    assert structs.GpuFabricInfoV3().version == 0x03000028
    assert structs.NVML_TEMPERATURE_V1 == structs.Temperature().version == 0x0100000C
    ours = {"nvmlGpuFabricInfo_v2": structs.NVML_GPU_FABRIC_INFO_V2,
            "nvmlGpuFabricInfo_v3": structs.NVML_GPU_FABRIC_INFO_V3,
            "nvmlTemperature_v1": structs.NVML_TEMPERATURE_V1}
    theirs = {name: getattr(pynvml, name) for name in ours if hasattr(pynvml, name)}
    assert theirs == {name: ours[name] for name in theirs}


@pytest.mark.parametrize(("symbol", "version", "size"), [
    ("nvmlDeviceGetGpuFabricInfo", 0, 28),
    ("nvmlDeviceGetGpuFabricInfoV", 0x02000024, 36),
    ("nvmlDeviceGetGpuFabricInfoV", 0x03000028, 40),
])
def test_the_simulator_writes_at_nvml_h_offsets(fake_nvml, symbol, version, size):
    """Raw bytes in, decoded by hand: a caller with another layout reads what a driver
    would give it, so the simulator cannot hide a layout mistake."""
    lib = fake_nvml(TRAY, init=True)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    buf = ctypes.create_string_buffer(b"\xaa" * size, size)  # padding shows if written
    start = 0 if version == 0 else 4
    if version:
        struct.pack_into("<I", buf, 0, version)
    assert getattr(lib, symbol)(handle, ctypes.byref(buf)) == abi.NVML_SUCCESS
    raw = buf.raw
    assert raw[start:start + 16].hex() == UUID.replace("-", "")
    status, clique, state = struct.unpack_from("<IIB", raw, start + 16)
    assert (status, clique, state) == (abi.NVML_ERROR_TIMEOUT, 7,
                                       abi.NVML_GPU_FABRIC_STATE_COMPLETED)
    assert raw[start + 25:start + 28] == b"\xaa" * 3  # the state is one byte
    if version:
        assert struct.unpack_from("<I", raw, 32)[0] == 0x51A9
    if version >> 24 == 3:
        assert raw[36] == abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
        assert raw[37:] == b"\xaa" * 3


def test_the_reader_reads_every_field_through_the_installed_binding(fake_nvml):
    """The binding only forwards the pointer: the collector's structure comes back filled."""
    fake_nvml(TRAY)
    nvml = Nvml()
    nvml.init()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = nvml.call(GPU_FABRIC.read, pynvml, handle).value
    finally:
        nvml.shutdown()
    words = [int(UUID.replace("-", "")[8 * n:8 * n + 8], 16) for n in range(4)]
    assert values["fabric.state"] == abi.NVML_GPU_FABRIC_STATE_COMPLETED
    assert values["fabric.status"] == abi.NVML_ERROR_TIMEOUT
    assert values["fabric.clique_id"] == 7
    assert [values[f"fabric.cluster_uuid.{n}"] for n in range(4)] == words
    assert values["fabric.health_mask"] == 0x51A9
    assert values["fabric.health_summary"] == abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
