"""The table of dcgm-exporter's names from 4.9 on (DCGM 4.7's field naming standard).

DCGM 4.7 deprecates the older field names. Most of the new names are the same
field under a new name (DCGM's deprecated-alias table), and keep its unit;
others are new base-unit fields with their own ids (Hz, J, ratios, bytes,
bytes/s), whose value is the old one converted. dcgm-exporter 4.9 serves the
new names, and 4.10 renames the profiling PCIe and NVLink byte rates once
more. Each row below is one new name: the old field it replaces, the factor
from the old value to the new, and where the name comes from (``EVIDENCE``),
since not every one is established by NVIDIA's own sources here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

from otel_gpu.export.naming.dcgm.fields import FIELDS, DcgmField
from otel_gpu.sample import sources as c

# Where a new name comes from; docs/migration.md shows it, and "unverified" where
# the name or id is not established by NVIDIA's own sources.
ALIAS = "DCGM deprecated-alias table (same field)"
GO_DCGM = "go-dcgm base-unit field table, id {}"
ISSUE = "unverified: dcgm-exporter {} release notes as reported; not seen in NVIDIA's sources"
UNVERIFIED = "unverified: id {} from a secondary summary of NVIDIA's field reference"


class Rename(NamedTuple):
    old: str
    """The name up to dcgm-exporter 4.8."""
    scale: float
    """New value = old value x scale."""
    unit_note: str
    promql: str
    help: str
    since: str
    """The dcgm-exporter release that serves the new name."""
    evidence: str


_GPU_TASK = 'hw_gpu_utilization{hw_gpu_task="%s"}'
_CLOCK = 'nvidia_gpu_clock_frequency_hertz{nvidia_gpu_clock_domain="%s"}'
_MAX_CLOCK = 'nvidia_gpu_clock_max_frequency_hertz{nvidia_gpu_clock_domain="%s"}'
_HZ = "Hz (NVML MHz * 1e6)"
_UTIL = "ratio 0..1 (NVML % / 100)"
_BYTES = "bytes (NVML bytes)"
_SAME = "as before"

_CONVERTED: Mapping[str, Rename] = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_SM_CLOCK", 1e6, _HZ, _CLOCK % "sm", "SM clock frequency (in Hz).", "4.9",
        GO_DCGM.format(1603)),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_MEM_CLOCK", 1e6, _HZ, _CLOCK % "memory",
        "Memory clock frequency (in Hz).", "4.9", GO_DCGM.format(1604)),
    "DCGM_FI_DEV_VIDEO_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_VIDEO_CLOCK", 1e6, _HZ, _CLOCK % "video",
        "Video encoder/decoder clock frequency (in Hz).", "4.9", GO_DCGM.format(1605)),
    "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_MAX_SM_CLOCK", 1e6, _HZ, _MAX_CLOCK % "sm",
        "Maximum SM clock frequency (in Hz).", "4.9", GO_DCGM.format(1608)),
    "DCGM_FI_DEV_MEMORY_MAX_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_MAX_MEM_CLOCK", 1e6, _HZ, _MAX_CLOCK % "memory",
        "Maximum memory clock frequency (in Hz).", "4.9", GO_DCGM.format(1609)),
    "DCGM_FI_DEV_VIDEO_MAX_CLOCK_HERTZ": Rename(
        "DCGM_FI_DEV_MAX_VIDEO_CLOCK", 1e6, _HZ, _MAX_CLOCK % "video",
        "Maximum video clock frequency (in Hz).", "4.9", GO_DCGM.format(1610)),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": Rename(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3, "J (NVML mJ / 1000)",
        "hw_energy_joules_total", "Total energy consumption since boot (in J).", "4.9",
        GO_DCGM.format(1611)),
    "DCGM_FI_DEV_FAN_SPEED_RATIO": Rename(
        "DCGM_FI_DEV_FAN_SPEED", 0.01, _UTIL, "nvidia_gpu_fan_speed",
        "Fan speed (ratio of its maximum).", "4.9", GO_DCGM.format(1612)),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": Rename(
        "DCGM_FI_DEV_GPU_UTIL", 0.01, _UTIL, _GPU_TASK % "general",
        "GPU utilization (ratio 0..1).", "4.9",
        "unverified: id 1613 as reported; go-dcgm's table seen here ends at 1612, and "
        "DCGM's alias table gives this name to the percent field 203"),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": Rename(
        "DCGM_FI_DEV_MEM_COPY_UTIL", 0.01, _UTIL, "nvidia_gpu_memory_controller_utilization",
        "Memory utilization (ratio 0..1).", "4.9", UNVERIFIED.format(1614)),
    "DCGM_FI_DEV_ENC_UTIL_RATIO": Rename(
        "DCGM_FI_DEV_ENC_UTIL", 0.01, _UTIL, _GPU_TASK % "encoder",
        "Encoder utilization (ratio 0..1).", "4.9", UNVERIFIED.format(1615)),
    "DCGM_FI_DEV_DEC_UTIL_RATIO": Rename(
        "DCGM_FI_DEV_DEC_UTIL", 0.01, _UTIL, _GPU_TASK % "decoder",
        "Decoder utilization (ratio 0..1).", "4.9", UNVERIFIED.format(1616)),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": Rename(
        "DCGM_FI_DEV_FB_TOTAL", 2.0**20, _BYTES, "hw_gpu_memory_limit_bytes",
        "Framebuffer memory total (in bytes).", "4.9", UNVERIFIED.format(1625)),
    "DCGM_FI_DEV_FB_FREE_BYTES": Rename(
        "DCGM_FI_DEV_FB_FREE", 2.0**20, _BYTES, "nvidia_gpu_memory_free_bytes",
        "Framebuffer memory free (in bytes).", "4.9", UNVERIFIED.format(1626)),
    "DCGM_FI_DEV_FB_USED_BYTES": Rename(
        "DCGM_FI_DEV_FB_USED", 2.0**20, _BYTES, "hw_gpu_memory_usage_bytes",
        "Framebuffer memory used (in bytes).", "4.9", UNVERIFIED.format(1627)),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": Rename(
        "DCGM_FI_DEV_FB_RESERVED", 2.0**20, _BYTES, "nvidia_gpu_memory_reserved_bytes",
        "Framebuffer memory reserved (in bytes).", "4.9", UNVERIFIED.format(1628)),
    # The old field is DCGM's rate KiB/s / 1000 ("MB/s" of 1,024,000 bytes); the new one
    # the rate in bytes/s, KiB/s * 1024. otel-gpu serves the old one as the KiB count
    # (see fields.py), so the new one is that count's rate between two samples, * 1024.
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": Rename(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 1024.0,
        "bytes/s sent + received over all links (rate of NVML's KiB counters * 1024, "
        "between the last two samples)",
        "sum without (network_io_direction) "
        "(rate(nvidia_gpu_nvlink_io_bytes_total[5m]))",
        "NVLink throughput, all links (in bytes per second).", "4.9", UNVERIFIED.format(1648)),
}

# Same field, new name (DCGM's deprecated-alias table): value and unit as before.
_SAME_FIELD: Mapping[str, tuple[str, str]] = {
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("DCGM_FI_DEV_MEMORY_TEMP", "4.9"),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("DCGM_FI_DEV_GPU_TEMP", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("DCGM_FI_DEV_POWER_USAGE", "4.9"),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "4.9"),
    "DCGM_FI_DEV_XID_ERROR": ("DCGM_FI_DEV_XID_ERRORS", "4.9"),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "4.9"),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "4.9"),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "4.9"),
    "DCGM_FI_DEV_GPU_PSTATE": ("DCGM_FI_DEV_PSTATE", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_MIN_WATTS": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_MAX_WATTS": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS": ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "4.9"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS": ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "4.9"),
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": ("DCGM_FI_DEV_RETIRED_SBE", "4.9"),
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": ("DCGM_FI_DEV_RETIRED_DBE", "4.9"),
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": ("DCGM_FI_DEV_RETIRED_PENDING", "4.9"),
    **{f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_TOTAL": (f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL",
                                                  "4.9")
       for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")},
    **{f"DCGM_FI_DEV_BANK_REMAP_AVAIL_{name.upper()}": (
        f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{name.upper()}", "4.9")
       for name, _ in c.ROW_REMAP_BANKS},
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "4.9"),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("DCGM_FI_PROF_SM_ACTIVE", "4.9"),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": ("DCGM_FI_PROF_SM_OCCUPANCY", "4.9"),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "4.9"),
    "DCGM_FI_PROF_HMMA_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "4.9"),
    "DCGM_FI_PROF_IMMA_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "4.9"),
    "DCGM_FI_PROF_DFMA_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "4.9"),
    "DCGM_FI_PROF_FP64_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "4.9"),
    "DCGM_FI_PROF_FP32_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "4.9"),
    "DCGM_FI_PROF_FP16_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "4.9"),
    "DCGM_FI_PROF_INT_UTIL_RATIO": ("DCGM_FI_PROF_PIPE_INT_ACTIVE", "4.9"),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": ("DCGM_FI_PROF_DRAM_ACTIVE", "4.9"),
}

# dcgm-exporter 4.10: the profiling byte rates spell out their unit (already bytes/s).
_RENAMED_IN_4_10: Mapping[str, str] = {
    f"DCGM_FI_PROF_{bus}_{way}_BYTES_PER_SECOND": f"DCGM_FI_PROF_{bus}_{way}_BYTES"
    for bus in ("PCIE", "NVLINK") for way in ("TX", "RX")
}

RENAMES: Mapping[str, Rename] = {
    **_CONVERTED,
    **{new: Rename(old, 1.0, _SAME, FIELDS[old].promql, FIELDS[old].help, since, ALIAS)
       for new, (old, since) in _SAME_FIELD.items()},
    **{new: Rename(old, 1.0, _SAME, FIELDS[old].promql, FIELDS[old].help, "4.10",
                   ISSUE.format("4.10.0"))
       for new, old in _RENAMED_IN_4_10.items()},
}
"""New name -> what it replaces and how its value follows from the old one."""


def _field(new: str, rename: Rename) -> DcgmField:
    old = FIELDS[rename.old]
    unit_note = old.unit_note if rename.unit_note == _SAME else rename.unit_note
    return replace(old, name=new, help=rename.help, factor=old.factor * rename.scale,
                   unit_note=unit_note, promql=rename.promql, replaces=rename.old,
                   rate=new == "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
                   type="gauge" if new.endswith("_PER_SECOND") else old.type)


CURRENT_FIELDS: Mapping[str, DcgmField] = {new: _field(new, r) for new, r in RENAMES.items()}
"""The fields under dcgm-exporter 4.9's and 4.10's names, each with its own unit."""

CURRENT_LABELS: Mapping[str, str] = {
    "DCGM_FI_SYSTEM_DRIVER_VERSION": "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_DEV_GPU_NAME": "DCGM_FI_DEV_NAME",
    "DCGM_FI_DEV_BOARD_SERIAL": "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_GPU_UUID": "DCGM_FI_DEV_UUID",
    "DCGM_FI_DEV_GPU_MINOR_NUMBER": "DCGM_FI_DEV_MINOR_NUMBER",
    "DCGM_FI_DEV_PCI_BUS_ID": "DCGM_FI_DEV_PCI_BUSID",
}
"""Label rows under their new names (DCGM's alias table) -> the old name."""


def from_old(name: str) -> str:
    """PromQL giving a 4.9-and-later field from the series of the name it replaces."""
    rename = RENAMES[name]
    if CURRENT_FIELDS[name].rate:
        return f"rate({rename.old}[5m]) * {rename.scale:g}"
    if rename.scale == 1.0:
        return rename.old
    if rename.scale < 1:
        return f"{rename.old} / {1 / rename.scale:g}"
    factor = "2^20" if rename.scale == 2**20 else f"{rename.scale:.0e}".replace("e+0", "e")
    return f"{rename.old} * {factor}"
