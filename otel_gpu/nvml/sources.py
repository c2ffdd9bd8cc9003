"""Where each raw value comes from in NVML: the sources the catalog's metrics read.

A :class:`Source` is one raw value, keyed by a short string in
:attr:`otel_gpu.snapshot.DeviceSample.values`. It is read either as one
entry of the batched ``nvmlDeviceGetFieldValues`` call (``field_id``) or by a
:class:`Reader`: one plain NVML call returning one or more keys. The catalog
refers to sources (and through them to readers) by object, so a new metric
is one catalog entry plus, where NVML needs a new call, one reader here.

This is the only module besides :mod:`otel_gpu.nvml.sampler` and
:mod:`otel_gpu.nvml.library` that knows pynvml; the catalog and the stages
above it stay free of the driver binding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pynvml

ReadFunc = Callable[[ModuleType, Any], Mapping[str, float]]
"""``(pynvml module, device handle) -> {source key: raw value}``; may raise NVMLError."""


@dataclass(frozen=True, eq=False)
class Reader:
    """One NVML call per device per sample; every source naming it shares the call.

    ``name`` is what the logs say when the device cannot answer it (the sampler
    then stops asking). Readers compare by identity.
    """

    name: str
    read: ReadFunc

    def __repr__(self) -> str:
        return f"Reader({self.name!r})"


@dataclass(frozen=True)
class Source:
    """One raw NVML value: a batched field (``field_id``) or a key of ``reader``'s answer."""

    key: str
    nvml: str
    """Human-readable NVML origin, for the docs."""
    unit: str
    """NVML's own unit for the raw value."""
    field_id: int | None = None
    reader: Reader | None = None

    def __post_init__(self) -> None:
        if (self.field_id is None) == (self.reader is None):
            raise ValueError(f"source {self.key!r} needs exactly one of field_id and reader")


# --- readers: one NVML call each ------------------------------------------------


def _older_driver(m: ModuleType, exc: Exception) -> bool:
    """Whether a newer NVML entry point is missing, so its older form should be used."""
    return getattr(exc, "value", None) in (
        m.NVML_ERROR_FUNCTION_NOT_FOUND, m.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    )


def _memory(m: ModuleType, handle: Any) -> dict[str, float]:
    try:
        mem = m.nvmlDeviceGetMemoryInfo(handle, version=m.nvmlMemory_v2)
        reserved: float | None = mem.reserved
    except m.NVMLError as exc:  # drivers before R510 have only the v1 call
        if not _older_driver(m, exc):
            raise
        mem = m.nvmlDeviceGetMemoryInfo(handle)
        reserved = None
    out = {"memory.total": mem.total, "memory.used": mem.used, "memory.free": mem.free}
    if reserved is not None:
        out["memory.reserved"] = reserved
    return out


def _temperature(m: ModuleType, handle: Any) -> dict[str, float]:
    try:
        value = m.nvmlDeviceGetTemperatureV(handle, m.NVML_TEMPERATURE_GPU)
    except m.NVMLError as exc:  # the versioned call arrived with R535
        if not _older_driver(m, exc):
            raise
        value = m.nvmlDeviceGetTemperature(handle, m.NVML_TEMPERATURE_GPU)
    return {"temp.gpu": value}


def _utilization(m: ModuleType, handle: Any) -> dict[str, float]:
    util = m.nvmlDeviceGetUtilizationRates(handle)
    return {"util.gpu": util.gpu, "util.memory": util.memory}


def _clock(domain: str, clock_type: str) -> Reader:
    def read(m: ModuleType, handle: Any) -> dict[str, float]:
        return {f"clock.{domain}": m.nvmlDeviceGetClockInfo(handle, getattr(m, clock_type))}

    return Reader(f"clock.{domain}", read)


MEMORY = Reader("memory", _memory)
UTILIZATION = Reader("utilization", _utilization)
ENCODER = Reader("encoder", lambda m, h: {"util.encoder": m.nvmlDeviceGetEncoderUtilization(h)[0]})
DECODER = Reader("decoder", lambda m, h: {"util.decoder": m.nvmlDeviceGetDecoderUtilization(h)[0]})
TEMPERATURE = Reader("temperature", _temperature)
POWER_USAGE = Reader("power", lambda m, h: {"power": m.nvmlDeviceGetPowerUsage(h)})
CLOCK_GRAPHICS_INFO = _clock("graphics", "NVML_CLOCK_GRAPHICS")
CLOCK_SM_INFO = _clock("sm", "NVML_CLOCK_SM")
CLOCK_MEM_INFO = _clock("memory", "NVML_CLOCK_MEM")
CLOCK_EVENT_REASONS = Reader(
    "clock_reasons", lambda m, h: {"clock.reasons": m.nvmlDeviceGetCurrentClocksEventReasons(h)}
)
FAN_SPEED = Reader("fan", lambda m, h: {"fan": m.nvmlDeviceGetFanSpeed(h)})
COMPUTE_PROCESSES = Reader(
    "processes", lambda m, h: {"processes": len(m.nvmlDeviceGetComputeRunningProcesses(h))}
)


def _field(key: str, name: str, unit: str) -> Source:
    field_id = getattr(pynvml, "NVML_FI_DEV_" + name)
    return Source(key, f"field NVML_FI_DEV_{name}", unit, field_id=field_id)


# --- sources ------------------------------------------------------------------------

MEM_TOTAL = Source("memory.total", "nvmlDeviceGetMemoryInfo_v2 .total", "By", reader=MEMORY)
MEM_USED = Source("memory.used", "nvmlDeviceGetMemoryInfo_v2 .used", "By", reader=MEMORY)
MEM_FREE = Source("memory.free", "nvmlDeviceGetMemoryInfo_v2 .free", "By", reader=MEMORY)
MEM_RESERVED = Source(
    "memory.reserved", "nvmlDeviceGetMemoryInfo_v2 .reserved", "By", reader=MEMORY
)
UTIL_GPU = Source("util.gpu", "nvmlDeviceGetUtilizationRates .gpu", "%", reader=UTILIZATION)
UTIL_MEM = Source(
    "util.memory", "nvmlDeviceGetUtilizationRates .memory", "%", reader=UTILIZATION
)
UTIL_ENC = Source("util.encoder", "nvmlDeviceGetEncoderUtilization", "%", reader=ENCODER)
UTIL_DEC = Source("util.decoder", "nvmlDeviceGetDecoderUtilization", "%", reader=DECODER)
TEMP_GPU = Source("temp.gpu", "nvmlDeviceGetTemperatureV(GPU)", "Cel", reader=TEMPERATURE)
POWER = Source("power", "nvmlDeviceGetPowerUsage", "mW", reader=POWER_USAGE)
CLOCK_GRAPHICS = Source(
    "clock.graphics", "nvmlDeviceGetClockInfo(GRAPHICS)", "MHz", reader=CLOCK_GRAPHICS_INFO
)
CLOCK_SM = Source("clock.sm", "nvmlDeviceGetClockInfo(SM)", "MHz", reader=CLOCK_SM_INFO)
CLOCK_MEM = Source("clock.memory", "nvmlDeviceGetClockInfo(MEM)", "MHz", reader=CLOCK_MEM_INFO)
CLOCK_REASONS = Source(
    "clock.reasons", "nvmlDeviceGetCurrentClocksEventReasons", "bitmask",
    reader=CLOCK_EVENT_REASONS,
)
FAN = Source("fan", "nvmlDeviceGetFanSpeed", "%", reader=FAN_SPEED)
PROCESSES = Source(
    "processes", "nvmlDeviceGetComputeRunningProcesses (count)", "{process}",
    reader=COMPUTE_PROCESSES,
)
ENERGY = _field("energy", "TOTAL_ENERGY_CONSUMPTION", "mJ")
TEMP_MEM = _field("temp.memory", "MEMORY_TEMP", "Cel")
PCIE_TX = _field("pcie.tx", "PCIE_COUNT_TX_BYTES", "By")
PCIE_RX = _field("pcie.rx", "PCIE_COUNT_RX_BYTES", "By")
PCIE_REPLAY = _field("pcie.replay", "PCIE_REPLAY_COUNTER", "{replay}")
# Read with scope 0: link 0 only on multi-link GPUs (summing every link is a known gap).
NVLINK_TX = _field("nvlink.tx", "NVLINK_THROUGHPUT_DATA_TX", "KiB")
NVLINK_RX = _field("nvlink.rx", "NVLINK_THROUGHPUT_DATA_RX", "KiB")
ECC_CORRECTED = _field("ecc.corrected", "ECC_SBE_VOL_TOTAL", "{error}")
ECC_UNCORRECTED = _field("ecc.uncorrected", "ECC_DBE_VOL_TOTAL", "{error}")
REMAP_COR = _field("remap.corrected", "REMAPPED_COR", "{row}")
REMAP_UNC = _field("remap.uncorrected", "REMAPPED_UNC", "{row}")
REMAP_PENDING = _field("remap.pending", "REMAPPED_PENDING", "1")
REMAP_FAILURE = _field("remap.failure", "REMAPPED_FAILURE", "1")

THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
    ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting),
)
"""``nvidia.gpu.throttle.reason`` value -> bit of the clock event reasons mask."""
