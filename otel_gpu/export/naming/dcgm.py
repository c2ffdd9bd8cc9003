"""The ``dcgm`` naming profile: dcgm-exporter's field names, units and labels.

Every field is read from the catalog's NVML sources (no extra NVML reads),
converted to dcgm-exporter's unit. The field set is NVIDIA's default counters
file, or the one a dcgm-exporter counters CSV file names (``-f``/``--collectors``):
``DCGM_FI_*`` fields, the 1.x-compatibility file's lower-case ``dcgm_*`` names,
``label`` rows (a label on every series) and the ``DCGM_EXP_*`` values
dcgm-exporter computes itself. As dcgm-exporter's default does, a GPU in MIG
mode is reported through its GPU instances, not as a whole (``devices``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from otel_gpu._files import FileError, read_text
from otel_gpu.errors import SetupError
from otel_gpu.export.naming import xid
from otel_gpu.export.naming.exposition import Family
from otel_gpu.sample import sources as c
from otel_gpu.snapshot import (
    DEGRADED,
    FAILED,
    OK,
    PREDICTED_FAILURE,
    Device,
    DeviceSample,
    Snapshot,
)

log = logging.getLogger(__name__)

MIB = 1.0 / (1024 * 1024)


@dataclass(frozen=True)
class DcgmField:
    """A dcgm-exporter field as the sum of catalog sources, times ``factor``."""

    name: str
    type: str
    help: str
    sources: tuple[c.Source, ...] = ()
    factor: float = 1.0
    derive: Callable[[DeviceSample], float | None] | None = None
    unit_note: str = ""
    """How the value relates to NVML's, for the migration guide."""
    promql: str = ""
    """The same value from the OpenTelemetry names, for the migration guide."""
    rewrite_note: str = ""
    """Why there is no one-to-one rewrite, when there is none."""
    extra_labels: Callable[[float], Mapping[str, str]] | None = None
    """Labels that follow from the value (the XID code's ``err_code`` and ``err_msg``)."""
    dcgm_name: str = ""
    """The DCGM field, when ``name`` is another name for it (a 1.x-compatibility name)."""

    def value(self, sample: DeviceSample) -> float | None:
        if self.derive is not None:
            return self.derive(sample)
        total = 0.0
        for src in self.sources:
            raw = sample.values.get(src.key)
            if raw is None:
                return None
            total += raw
        return total * self.factor


def _last_xid(sample: DeviceSample) -> float | None:
    # dcgm-exporter reports the last XID seen, 0 before any; only GPUs have events.
    if sample.device.is_mig:
        return None
    return float(sample.last_xid or 0)


def _xid_labels(value: float) -> dict[str, str]:
    # dcgm-exporter (3.3.5 and later) names the code; the phrase is otel-gpu's own
    return {"err_code": str(int(value)), "err_msg": xid.message(int(value))}


def _f(name: str, type_: str, help_: str, *sources: c.Source, factor: float = 1.0,
       note: str = "", promql: str = "", rewrite_note: str = "") -> DcgmField:
    return DcgmField(name, type_, help_, sources, factor, unit_note=note, promql=promql,
                     rewrite_note=rewrite_note)


_GPU_TASK = 'hw_gpu_utilization{hw_gpu_task="%s"}'
_CLOCK = 'nvidia_gpu_clock_frequency_hertz{nvidia_gpu_clock_domain="%s"} / 1e6'
_TEMP = 'hw_temperature_celsius{hw_sensor_location="%s"}'
_IO = 'hw_gpu_io_bytes_total{network_io_direction="%s"} / 1024'
_ROWS = 'nvidia_gpu_memory_remapped_rows_total{error_type="%s"}'
_ECC = 'hw_errors_total{error_type="%s"}'
_MIB = "MiB (NVML bytes / 2^20)"
_RATIO = "ratio 0..1 (NVML GPM % / 100)"
_BYTES_S = "bytes/s (NVML GPM MiB/s * 2^20)"
_MIB_S = 1024.0 * 1024.0
_TENSOR = 'nvidia_gpu_tensor_activity{nvidia_gpu_tensor_type="%s"}'
_PIPE = 'nvidia_gpu_pipe_activity{nvidia_gpu_pipe="%s"}'
_PCIE = 'nvidia_gpu_pcie_throughput_bytes_per_second{network_io_direction="%s"}'
_NVLINK = 'nvidia_gpu_nvlink_throughput_bytes_per_second{network_io_direction="%s"}'
_KIB = "KiB (NVML bytes / 1024)"
_MAX_CLOCK = 'nvidia_gpu_clock_max_frequency_hertz{nvidia_gpu_clock_domain="%s"} / 1e6'
_POWER_LIMIT = 'nvidia_gpu_power_limit_watts{nvidia_gpu_power_limit_type="%s"}'
_THROTTLE = 'nvidia_gpu_clock_throttle_time_seconds_total{nvidia_gpu_throttle_reason="%s"}'
_ECC_AGG = 'nvidia_gpu_ecc_errors_total{error_type="%s",nvidia_gpu_ecc_counter_type="aggregate"}'
_RETIRED = 'nvidia_gpu_memory_retired_pages_total{nvidia_gpu_page_retirement_cause="%s"}'
_VIOLATIONS = dict(c.VIOLATIONS)


def _microseconds(src: c.Source) -> Callable[[DeviceSample], float | None]:
    def derive(sample: DeviceSample) -> float | None:
        raw = sample.values.get(src.key)
        return None if raw is None else float(int(raw) // 1000)

    return derive


FIELDS: Mapping[str, DcgmField] = {f.name: f for f in (
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (MHz).", c.CLOCK_SM,
       note="MHz", promql=_CLOCK % "sm"),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (MHz).", c.CLOCK_MEM,
       note="MHz", promql=_CLOCK % "memory"),
    _f("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (C).", c.TEMP_MEM,
       note="C", promql=_TEMP % "memory"),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C).", c.TEMP_GPU,
       note="C", promql=_TEMP % "gpu"),
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "Board power draw (W).", c.POWER, factor=0.001,
       note="W (NVML mW / 1000)", promql="hw_power_watts"),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
       "Energy consumed since the driver was loaded (mJ).", c.ENERGY,
       note="mJ", promql="hw_energy_joules_total * 1000"),
    _f("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "Bytes sent over PCIe (KiB).", c.PCIE_TX,
       factor=1 / 1024, note=_KIB, promql=_IO % "transmit"),
    _f("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "Bytes received over PCIe (KiB).",
       c.PCIE_RX, factor=1 / 1024, note=_KIB, promql=_IO % "receive"),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL", "counter", "Bytes sent over PCIe.", c.PCIE_TX,
       note="bytes", promql='hw_gpu_io_bytes_total{network_io_direction="transmit"}'),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL", "counter", "Bytes received over PCIe.", c.PCIE_RX,
       note="bytes", promql='hw_gpu_io_bytes_total{network_io_direction="receive"}'),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe replays (retries).", c.PCIE_REPLAY,
       note="count", promql="nvidia_gpu_pcie_replays_total"),
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (%).", c.UTIL_GPU,
       note="%", promql="100 * " + _GPU_TASK % "general"),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory controller utilization (%).", c.UTIL_MEM,
       note="%", promql="100 * nvidia_gpu_memory_controller_utilization"),
    _f("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (%).", c.UTIL_ENC,
       note="%", promql="100 * " + _GPU_TASK % "encoder"),
    _f("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (%).", c.UTIL_DEC,
       note="%", promql="100 * " + _GPU_TASK % "decoder"),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "The most recent XID error code (0: none).",
              derive=_last_xid, unit_note="XID code", extra_labels=_xid_labels,
              rewrite_note="none: `nvidia_gpu_xid_errors_total` counts each XID code"),
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (MiB).", c.MEM_FREE,
       factor=MIB, note=_MIB, promql="nvidia_gpu_memory_free_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (MiB).", c.MEM_USED,
       factor=MIB, note=_MIB, promql="hw_gpu_memory_usage_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (MiB).", c.MEM_RESERVED,
       factor=MIB, note=_MIB, promql="nvidia_gpu_memory_reserved_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (MiB).", c.MEM_TOTAL,
       factor=MIB, note=_MIB, promql="hw_gpu_memory_limit_bytes / 2^20"),
    # DCGM reads NVML's NVLink data counters (KiB) at scope UINT_MAX, all links, and
    # publishes their rate, KiB/s / 1000 (DcgmCacheManager's ReadAndCacheNvLinkBandwidth):
    # otel-gpu serves the KiB count itself, whose rate() / 1000 is DCGM's value.
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
       "NVLink data sent and received, all links (KiB).", c.NVLINK_TX, c.NVLINK_RX,
       note="KiB sent + received over all links since the driver loaded (NVML scope "
            "UINT_MAX, as DCGM reads it; DCGM serves the rate, KiB/s / 1000, which "
            "`rate(...[1m]) / 1000` of this gives)",
       promql="sum without (network_io_direction) (nvidia_gpu_nvlink_io_bytes_total) / 1024"),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
       "Rows remapped after uncorrectable errors.", c.REMAP_UNC,
       note="count", promql=_ROWS % "uncorrected"),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
       "Rows remapped after correctable errors.", c.REMAP_COR,
       note="count", promql=_ROWS % "corrected"),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 when a row remapping failed.",
       c.REMAP_FAILURE, note="0/1", promql="nvidia_gpu_memory_row_remap_failure"),
    _f("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "1 when a row remapping waits for a reset.",
       c.REMAP_PENDING, note="0/1", promql="nvidia_gpu_memory_row_remap_pending"),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Single-bit ECC errors since driver load.",
       c.ECC_CORRECTED, note="count", promql=_ECC % "corrected"),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit ECC errors since driver load.",
       c.ECC_UNCORRECTED, note="count", promql=_ECC % "uncorrected"),
    _f("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (%).", c.FAN,
       note="%", promql="100 * nvidia_gpu_fan_speed"),
    _f("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Clock throttle reasons (bitmask).",
       c.CLOCK_REASONS, note="NVML bitmask",
       rewrite_note="none: `nvidia_gpu_clock_throttle` has one 0/1 series per reason"),
    _f("DCGM_FI_DEV_VIDEO_CLOCK", "gauge", "Video encoder/decoder clock frequency (MHz).",
       c.CLOCK_VIDEO, note="MHz", promql=_CLOCK % "video"),
    *(_f(f"DCGM_FI_DEV_MAX_{name}_CLOCK", "gauge", f"Maximum {what} clock frequency (MHz).",
         src, note="MHz", promql=_MAX_CLOCK % domain)
      for name, what, domain, src in (("SM", "SM", "sm", c.CLOCK_MAX_SM),
                                      ("MEM", "memory", "memory", c.CLOCK_MAX_MEM),
                                      ("VIDEO", "video", "video", c.CLOCK_MAX_VIDEO))),
    _f("DCGM_FI_DEV_PSTATE", "gauge", "Performance state (P-State) 0-15, 0 is the highest.",
       c.PSTATE, note="P-state number", promql="nvidia_gpu_performance_state"),
    *(_f(name, "gauge", help_, src, factor=0.001, note="W (NVML mW / 1000)",
         promql=_POWER_LIMIT % kind)
      for name, help_, kind, src in (
          ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Current power limit (W).", "current", c.POWER_LIMIT),
          ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "Minimum power management limit (W).", "min",
           c.POWER_LIMIT_MIN),
          ("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "Maximum power management limit (W).", "max",
           c.POWER_LIMIT_MAX),
          ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "Default power management limit (W).", "default",
           c.POWER_LIMIT_DEFAULT),
          ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
           "Power limit the driver enforces after every limiter (W).", "enforced",
           c.POWER_LIMIT_ENFORCED))),
    _f("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", c.PCIE_GEN,
       note="generation", promql="nvidia_gpu_pcie_link_generation"),
    _f("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe maximum link generation.",
       c.PCIE_GEN_MAX, note="generation", promql="nvidia_gpu_pcie_link_max_generation"),
    _f("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width (lanes).", c.PCIE_WIDTH,
       note="lanes", promql="nvidia_gpu_pcie_link_width"),
    _f("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe maximum link width (lanes).",
       c.PCIE_WIDTH_MAX, note="lanes", promql="nvidia_gpu_pcie_link_max_width"),
    # DCGM keeps NVML's violation times (ns) in whole microseconds: dcgm_fields.h ("Power
    # Violation time in usec"), and "(in us)" in dcgm-exporter's default-counters.csv.
    *(DcgmField(f"DCGM_FI_DEV_{name}_VIOLATION", "counter",
                f"Throttling duration due to {what} (in us).", (src,),
                derive=_microseconds(src), unit_note="us (NVML ns / 1000, rounded down)",
                promql=f"floor({_THROTTLE % policy} * 1e6)")
      for name, what, policy, src in (
          ("POWER", "power constraints", "power", _VIOLATIONS["power"]),
          ("THERMAL", "thermal constraints", "thermal", _VIOLATIONS["thermal"]),
          ("SYNC_BOOST", "sync-boost constraints", "sync_boost", _VIOLATIONS["sync_boost"]),
          ("BOARD_LIMIT", "board limit constraints", "board_limit", _VIOLATIONS["board_limit"]),
          ("LOW_UTIL", "low utilization", "low_utilization", _VIOLATIONS["low_utilization"]),
          ("RELIABILITY", "reliability constraints", "reliability",
           _VIOLATIONS["reliability"]))),
    _f("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
       "Total number of single-bit persistent ECC errors.", c.ECC_CORRECTED_AGGREGATE,
       note="count", promql=_ECC_AGG % "corrected"),
    _f("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
       "Total number of double-bit persistent ECC errors.", c.ECC_UNCORRECTED_AGGREGATE,
       note="count", promql=_ECC_AGG % "uncorrected"),
    _f("DCGM_FI_DEV_RETIRED_SBE", "counter",
       "Total number of retired pages due to single-bit errors.", c.RETIRED_SBE,
       note="pages", promql=_RETIRED % "multiple_single_bit_ecc"),
    _f("DCGM_FI_DEV_RETIRED_DBE", "counter",
       "Total number of retired pages due to double-bit errors.", c.RETIRED_DBE,
       note="pages", promql=_RETIRED % "double_bit_ecc"),
    _f("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement.",
       c.RETIRED_PENDING, note="0/1 (NVML says whether any page is pending, not how many)",
       promql="nvidia_gpu_memory_page_retirement_pending"),
    *(_f(f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", "counter", help_,
         dict(c.NVLINK_ERRORS)[kind], note="count, all links",
         promql=f'nvidia_gpu_nvlink_errors_total{{error_type="{kind}"}}')
      for name, kind, help_ in (
          ("CRC_FLIT", "crc_flit", "Total number of NVLink flow-control CRC errors."),
          ("CRC_DATA", "crc_data", "Total number of NVLink data CRC errors."),
          ("REPLAY", "replay", "Total number of NVLink retries."),
          ("RECOVERY", "recovery", "Total number of NVLink recovery errors."))),
    *(_f(f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{name.upper()}", "gauge",
         f"Memory banks with {name} spare rows left for remapping.", src, note="banks",
         promql=f'nvidia_gpu_memory_row_remap_banks{{nvidia_gpu_row_remap_availability="{name}"}}')
      for name, src in c.ROW_REMAP_BANKS),
    # Profiling, from NVML GPM (Hopper and newer), on GPUs and MIG GPU instances.
    _f("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
       c.GPM_GRAPHICS, factor=0.01, note=_RATIO, promql="nvidia_gpu_graphics_activity"),
    _f("DCGM_FI_PROF_SM_ACTIVE", "gauge",
       "Ratio of cycles an SM has at least one warp assigned.", c.GPM_SM_ACTIVE, factor=0.01,
       note=_RATIO, promql="nvidia_gpu_sm_activity"),
    _f("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "Ratio of warps resident on an SM to its maximum.",
       c.GPM_SM_OCCUPANCY, factor=0.01, note=_RATIO, promql="nvidia_gpu_sm_occupancy"),
    _f("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor pipe is active.",
       c.GPM_TENSOR, factor=0.01, note=_RATIO, promql=_TENSOR % "any"),
    _f("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "gauge",
       "Ratio of cycles the tensor (HMMA) pipe is active.", c.GPM_TENSOR_HMMA, factor=0.01,
       note=_RATIO, promql=_TENSOR % "hmma"),
    _f("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "gauge",
       "Ratio of cycles the tensor (IMMA) pipe is active.", c.GPM_TENSOR_IMMA, factor=0.01,
       note=_RATIO, promql=_TENSOR % "imma"),
    _f("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "gauge",
       "Ratio of cycles the tensor (DFMA) pipe is active.", c.GPM_TENSOR_DFMA, factor=0.01,
       note=_RATIO, promql=_TENSOR % "dfma"),
    _f("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the FP64 pipe is active.",
       c.GPM_FP64, factor=0.01, note=_RATIO, promql=_PIPE % "fp64"),
    _f("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the FP32 pipe is active.",
       c.GPM_FP32, factor=0.01, note=_RATIO, promql=_PIPE % "fp32"),
    _f("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the FP16 pipe is active.",
       c.GPM_FP16, factor=0.01, note=_RATIO, promql=_PIPE % "fp16"),
    _f("DCGM_FI_PROF_PIPE_INT_ACTIVE", "gauge", "Ratio of cycles the integer pipe is active.",
       c.GPM_INTEGER, factor=0.01, note=_RATIO, promql=_PIPE % "integer"),
    _f("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
       "Ratio of cycles the device memory interface is sending or receiving data.", c.GPM_DRAM,
       factor=0.01, note=_RATIO, promql="nvidia_gpu_dram_activity"),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe bytes transmitted per second.",
       c.GPM_PCIE_TX, factor=_MIB_S, note=_BYTES_S, promql=_PCIE % "transmit"),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe bytes received per second.",
       c.GPM_PCIE_RX, factor=_MIB_S, note=_BYTES_S, promql=_PCIE % "receive"),
    _f("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "NVLink bytes transmitted per second.",
       c.GPM_NVLINK_TX, factor=_MIB_S, note=_BYTES_S, promql=_NVLINK % "transmit"),
    _f("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "NVLink bytes received per second.",
       c.GPM_NVLINK_RX, factor=_MIB_S, note=_BYTES_S, promql=_NVLINK % "receive"),
)}

# The rows of NVIDIA's current default counters file (dcgm-exporter's
# etc/default-counters.csv), in its order: field, type, HELP text. The HELP texts
# are dcgm-exporter's own, so the built-in set's # HELP lines are what it serves.
# It no longer lists DCGM_FI_DEV_PCIE_TX/RX_THROUGHPUT (DCGM deprecates them;
# they stay available by name in a counters file).
DEFAULT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "gauge",
     "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second."),
)

# dcgm-exporter's default field set: the rows above that otel-gpu can export, and the fan
# speed, which dashboards expect where a GPU has fans (omitted on passively cooled boards).
DEFAULT_FIELDS: tuple[str, ...] = tuple(
    name for name, _, _ in DEFAULT_COUNTERS if name in FIELDS
) + ("DCGM_FI_DEV_FAN_SPEED",)

# Known dcgm-exporter fields NVML cannot provide, with the reason.
UNAVAILABLE: Mapping[str, str] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "only meaningful inside a vGPU guest VM",
    "DCGM_EXP_P2P_STATUS": "needs nvmlDeviceGetP2PStatus for every GPU pair; not read",
    **{f"DCGM_FI_PROF_{n}_TOTAL": "DCGM's cumulative profiling cycle counters have no NVML "
       "counterpart: GPM gives the same activity as ratios (the DCGM_FI_PROF_*_ACTIVE fields)"
       for n in ("SM_CYCLES_ACTIVE", "SM_CYCLES_ELAPSED", "MMA_CYCLES_ACTIVE",
                 "HMMA_CYCLES_ACTIVE", "IMMA_CYCLES_ACTIVE", "DFMA_CYCLES_ACTIVE",
                 "DMMA_CYCLES_ACTIVE", "FP64_CYCLES_ACTIVE", "FP32_CYCLES_ACTIVE",
                 "FP16_CYCLES_ACTIVE", "INT_CYCLES_ACTIVE")},
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0": "NVLink traffic is summed over the GPU's links "
    "(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, nvidia.gpu.nvlink.io); one link alone is not kept",
    **{f"DCGM_FI_{n}": "not read by otel-gpu" for n in (
        "NVML_VERSION", "DEV_BRAND", "DEV_OEM_INFOROM_VER", "DEV_ECC_INFOROM_VER",
        "DEV_POWER_INFOROM_VER", "DEV_INFOROM_IMAGE_VER", "DEV_PCI_COMBINED_ID",
        "DEV_PCI_SUBSYS_ID",
    )},
}

# --- other names for the fields: dcgm-exporter 1.x and DCGM aliases -----------------

# The names of dcgm-exporter's 1.x-compatibility counters file (lower case), rendered
# under those names with the values of the DCGM field they stand for.
LEGACY_NAMES: Mapping[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_tx_throughput": "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "dcgm_pcie_rx_throughput": "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    # ``dcgm_fi_prof_*`` names stand for the upper-case DCGM_FI_PROF_* field (see _canonical)
}

# DCGM's current name for a field otel-gpu knows under its older name.
ALIASES: Mapping[str, str] = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
}


def _canonical(name: str) -> str:
    """The DCGM_FI_ field a counters-file name stands for (itself for most)."""
    if name in LEGACY_NAMES:
        return LEGACY_NAMES[name]
    if name.startswith("dcgm_fi_"):
        return name.upper()
    if name not in FIELDS and name in ALIASES:
        return ALIASES[name]
    return name


# --- label fields: attached to every series of the device, not series themselves ----


@dataclass(frozen=True)
class LabelField:
    """A ``label``-type counters-file row: a label named after the field on every series.

    ``get`` reads it from the whole GPU (for a MIG instance: its parent) and the
    snapshot; ``None`` leaves the label out for that device.
    """

    name: str
    get: Callable[[Device, Snapshot], str | None]
    type: str = "label"


def _minor(device: Device, _: Snapshot) -> str | None:
    return str(device.minor_number) if device.minor_number is not None else None


LABEL_FIELDS: Mapping[str, LabelField] = {f.name: f for f in (
    LabelField("DCGM_FI_DRIVER_VERSION", lambda d, s: s.driver_version),
    LabelField("DCGM_FI_DEV_SERIAL", lambda d, s: d.serial),
    LabelField("DCGM_FI_DEV_VBIOS_VERSION", lambda d, s: d.vbios_version),
    LabelField("DCGM_FI_DEV_UUID", lambda d, s: d.uuid),
    LabelField("DCGM_FI_DEV_NAME", lambda d, s: d.model),
    LabelField("DCGM_FI_DEV_PCI_BUSID", lambda d, s: d.pci_bus_id or None),
    LabelField("DCGM_FI_DEV_MINOR_NUMBER", _minor),
)}
DEFAULT_LABELS: tuple[str, ...] = tuple(
    name for name, type_, _ in DEFAULT_COUNTERS if type_ == "label"
)
"""The label rows of NVIDIA's default counters file."""


# --- exporter fields: DCGM_EXP_*, computed from several samples -----------------------

CLOCK_EVENTS: Mapping[int, str] = {
    0x1: "gpu_idle",
    0x2: "clocks_setting",
    0x4: "power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
"""Clock event (throttle) reason bits, NVML's and DCGM's alike, by dcgm-exporter's names."""

WINDOW_SECONDS = 300.0
"""dcgm-exporter's default window for the ``*_COUNT`` fields (5 minutes)."""

# DCGM health results (DCGM_HEALTH_RESULT_PASS, _WARN, _FAIL) by hw.state.
_HEALTH = {OK: 0.0, DEGRADED: 10.0, PREDICTED_FAILURE: 20.0, FAILED: 20.0}


@dataclass(frozen=True)
class ExporterField:
    """A ``DCGM_EXP_*`` row: a value dcgm-exporter computes rather than reads from DCGM."""

    name: str
    type: str
    help: str
    kind: str
    """``xid_count``, ``xid_total``, ``clock_count``, ``clock_total`` or ``health``."""
    note: str = ""
    """How otel-gpu computes it, for the migration guide."""


EXPORTER_FIELDS: Mapping[str, ExporterField] = {f.name: f for f in (
    ExporterField("DCGM_EXP_XID_ERRORS_COUNT", "gauge",
                  "XID errors seen in the last window, by XID code.", "xid_count",
                  "XID events of each code in the last 5 minutes (`xid`, `window_size_in_ms`)"),
    ExporterField("DCGM_EXP_XID_ERRORS_TOTAL", "counter",
                  "XID errors seen since otel-gpu started, by XID code.", "xid_total",
                  "`nvidia.gpu.xid.errors` by code (`xid`)"),
    ExporterField("DCGM_EXP_CLOCK_EVENTS_COUNT", "gauge",
                  "Samples in the last window with each clock event reason active.",
                  "clock_count",
                  "samples of the last 5 minutes with each throttle reason bit set "
                  "(`clock_event`, `window_size_in_ms`)"),
    ExporterField("DCGM_EXP_CLOCK_EVENTS_TOTAL", "counter",
                  "Clock event reasons that became active since otel-gpu started.",
                  "clock_total", "times each throttle reason bit turned on (`clock_event`)"),
    ExporterField("DCGM_EXP_GPU_HEALTH_STATUS", "gauge",
                  "GPU health: 0 pass, 10 warning, 20 failure.", "health",
                  "`hw.status` as DCGM's health result: ok 0, degraded 10, "
                  "predicted_failure and failed 20; one series per GPU, no `health_watch`"),
)}

Column = DcgmField | LabelField | ExporterField

TYPES = ("gauge", "counter", "label", "histogram", "summary")
_NAME = re.compile(r"(?:DCGM_FI_|DCGM_EXP_|dcgm_)[A-Za-z0-9_]+")


class CollectorsError(SetupError):
    """A malformed counters file; ``str()`` names the file and line."""


@dataclass(frozen=True)
class CsvEntry:
    name: str
    type: str
    help: str
    line: int


def parse_collectors(path: str) -> list[CsvEntry]:
    """Reads a dcgm-exporter counters file: ``NAME, type, help`` lines, ``#`` comments.

    NAME is a ``DCGM_FI_`` field, a ``DCGM_EXP_`` exporter field, or a lower-case
    ``dcgm_`` name of dcgm-exporter's 1.x-compatibility file.
    """
    try:
        text = read_text(path, "collectors file")
    except FileError as exc:
        raise CollectorsError(str(exc)) from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise CollectorsError(
                f"collectors file {path}: line {number}: expected 'DCGM_FI_NAME, type, help', "
                f"got {_shorten(raw.strip())}"
            )
        name, type_ = parts[0], parts[1].lower()
        if not _NAME.fullmatch(name):
            raise CollectorsError(
                f"collectors file {path}: line {number}: {_shorten(name)} is not a DCGM_FI_ "
                "field name (nor a DCGM_EXP_ or 1.x dcgm_ one)"
            )
        if type_ not in TYPES:
            raise CollectorsError(
                f"collectors file {path}: line {number}: type {_shorten(parts[1])} is not one of "
                f"{', '.join(TYPES)}"
            )
        entries.append(CsvEntry(name, type_, parts[2] if len(parts) > 2 else "", number))
    return entries


def _shorten(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def default_columns() -> list[Column]:
    """The built-in set: NVIDIA's default counters file, with its types and HELP texts."""
    columns: list[Column] = []
    for name, type_, help_ in DEFAULT_COUNTERS:
        if name in DEFAULT_LABELS:
            columns.append(LABEL_FIELDS[name])
        elif name in DEFAULT_FIELDS:
            columns.append(replace(FIELDS[name], type=type_, help=help_))
    listed = {name for name, _, _ in DEFAULT_COUNTERS}
    columns += [FIELDS[name] for name in DEFAULT_FIELDS if name not in listed]
    return columns


def _column(entry: CsvEntry) -> Column | str:
    """The column a counters-file row asks for, or why there is none."""
    name = _canonical(entry.name)
    if entry.type == "label":
        if name in LABEL_FIELDS:
            return replace(LABEL_FIELDS[name], name=entry.name)
        if name in FIELDS or name in EXPORTER_FIELDS:
            return "type label is not supported for it; use gauge or counter"
    elif name in FIELDS:
        if entry.type not in ("gauge", "counter"):
            return f"type {entry.type} is not supported for it; use gauge or counter"
        known = FIELDS[name]
        return replace(known, name=entry.name, dcgm_name=known.name if name != entry.name else "",
                       type=entry.type, help=entry.help or known.help)
    elif name in EXPORTER_FIELDS:
        known_exp = EXPORTER_FIELDS[name]
        if entry.type not in ("gauge", "counter"):
            return f"type {entry.type} is not supported for it; use gauge or counter"
        return replace(known_exp, type=entry.type, help=entry.help or known_exp.help)
    elif name in LABEL_FIELDS:
        return f"type {entry.type} is not supported for it; it is a label field"
    if name in UNAVAILABLE:
        return UNAVAILABLE[name]
    return "not a field otel-gpu knows"


def select_fields(entries: Iterable[CsvEntry] | None) -> tuple[list[Column], list[str]]:
    """The columns to export, and a line per requested field that cannot be (with why).

    ``None`` is the built-in set (:func:`default_columns`). A name listed twice is
    exported once, as its last line says.
    """
    if entries is None:
        return default_columns(), []
    chosen: dict[str, tuple[Column, int]] = {}
    problems: list[str] = []
    for entry in entries:
        column = _column(entry)
        if isinstance(column, str):
            problems.append(f"{entry.name} (line {entry.line}): {column}")
            continue
        if entry.name in chosen:
            problems.append(f"{entry.name} (line {chosen[entry.name][1]}): listed again on line "
                            f"{entry.line}, which is used")
            del chosen[entry.name]
        chosen[entry.name] = (column, entry.line)
    return [column for column, _ in chosen.values()], problems


# --- rendering -------------------------------------------------------------------------

DEVICE_SELECTIONS = ("auto", "gpus", "instances", "both")
"""dcgm-exporter's ``-d``: ``f`` (instances of a MIG GPU, else the GPU), ``g``, ``i``, ``g+i``."""
POD_LABEL_STYLES = ("current", "old")

_POD_LABELS = {
    "current": ("pod", "namespace", "container"),
    "old": ("pod_name", "pod_namespace", "container_name"),  # --use-old-namespace
}
HPC_JOB_LABEL = "hpc_job"
"""dcgm-exporter's job label (--hpc-job-mapping-dir): one copy of a series per job."""
# DCGM reports these per GPU only; on a GPU instance they have no value.
_NOT_ON_INSTANCES = frozenset({
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
})


def _instance_scoped(name: str) -> bool:
    """Fields a GPU instance has its own value of (memory, profiling); for the rest, a
    GPU instance carries its GPU's value, as DCGM reports them."""
    return name.startswith(("DCGM_FI_DEV_FB_", "DCGM_FI_PROF_"))


@dataclass
class _Seen:
    """What the profile remembers of one GPU across snapshots, for the DCGM_EXP fields."""

    history: deque = field(default_factory=deque)
    """(monotonic time, XID counts, clock reason bits or None), oldest first."""
    last_seq: int = -1
    reasons: int = 0
    clock_totals: dict[int, int] = field(default_factory=lambda: dict.fromkeys(CLOCK_EVENTS, 0))


class _Row(NamedTuple):
    sample: DeviceSample
    gpu: DeviceSample | None
    """The whole GPU's sample: the parent's for a MIG instance (``None`` if unknown)."""


class DcgmProfile:
    """Renders a snapshot under dcgm-exporter's names and labels."""

    def __init__(
        self,
        fields: Sequence[Column],
        hostname: str,
        *,
        hostname_label: str = "hostname",
        shared_gpu_copies: bool = False,
        devices: str = "auto",
        pod_label_style: str = "current",
        window: float = WINDOW_SECONDS,
    ) -> None:
        if devices not in DEVICE_SELECTIONS:
            raise ValueError(f"devices: expected one of {', '.join(DEVICE_SELECTIONS)}")
        if pod_label_style not in POD_LABEL_STYLES:
            raise ValueError(f"pod_label_style: expected one of {', '.join(POD_LABEL_STYLES)}")
        self.fields = tuple(fields)
        self.values = tuple(c for c in self.fields if not isinstance(c, LabelField))
        self.labels = tuple(c for c in self.fields if isinstance(c, LabelField))
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.shared_gpu_copies = shared_gpu_copies
        self.devices = devices
        self.pod_labels = _POD_LABELS[pod_label_style]
        self.uuid_label = "uuid" if pod_label_style == "old" else "UUID"
        self.window = window
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}

    # which devices, with which labels

    def _rows(self, snapshot: Snapshot) -> list[_Row]:
        gpus = {s.device.uuid: s for s in snapshot.devices if not s.device.is_mig}
        with_instances = {s.device.parent_uuid for s in snapshot.devices if s.device.is_mig}
        rows = []
        for s in snapshot.devices:
            if s.device.is_mig:
                if self.devices != "gpus":
                    rows.append(_Row(s, gpus.get(s.device.parent_uuid or "")))
            elif self.devices in ("gpus", "both") or (
                    self.devices == "auto" and s.device.uuid not in with_instances):
                rows.append(_Row(s, s))
        return rows

    def _labels(self, row: _Row, snapshot: Snapshot) -> dict[str, str]:
        dev = row.sample.device
        labels = {
            "gpu": str(dev.index),
            # a MIG instance is named by its parent GPU's UUID plus the instance labels
            self.uuid_label: dev.parent_uuid or dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
            "device": f"nvidia{dev.minor_number if dev.minor_number is not None else dev.index}",
            "modelName": dev.model,
        }
        if dev.is_mig:
            labels["GPU_I_PROFILE"] = dev.mig_profile or ""
            labels["GPU_I_ID"] = str(dev.gpu_instance_id if dev.gpu_instance_id is not None
                                     else "")
        labels[self.hostname_label] = self.hostname
        whole = row.gpu.device if row.gpu is not None else dev
        for label in self.labels:
            value = label.get(whole, snapshot)
            if value is not None:
                labels[label.name] = value
        return labels

    def _copies(self, sample: DeviceSample, snapshot: Snapshot) -> list[dict[str, str]]:
        """Pod and job labels per copy of the device's series: one copy, or one per sharer;
        and, as dcgm-exporter does, each of those once per HPC job using the device."""
        refs = snapshot.series_pods(sample.device.uuid, per_sharer=self.shared_gpu_copies)
        pod, namespace, container = self.pod_labels
        copies = [{pod: r.pod, namespace: r.namespace, container: r.container}
                  for r in refs] or [{}]
        jobs = snapshot.series_jobs(sample.device.uuid)
        if not jobs:
            return copies
        return [{**labels, HPC_JOB_LABEL: job} for labels in copies for job in jobs]

    # values

    def _value(self, field: DcgmField, row: _Row) -> float | None:
        sample = row.sample
        if not sample.device.is_mig:
            return field.value(sample)
        name = field.dcgm_name or field.name
        if name in _NOT_ON_INSTANCES:
            return None
        own = field.value(sample)
        if own is not None or _instance_scoped(name) or row.gpu is None or not row.gpu.readable:
            return own
        return field.value(row.gpu)

    def _exporter(self, field: ExporterField, row: _Row,
                  now: float) -> list[tuple[dict[str, str], float]]:
        gpu = row.gpu
        if gpu is None:
            return []
        window = {"window_size_in_ms": str(int(self.window * 1000))}
        seen = self._seen.get(gpu.device.uuid)
        if field.kind == "health":
            return [({}, _HEALTH.get(gpu.state, 0.0))]
        if field.kind == "xid_total":
            counts = gpu.xid_counts
            return [({"xid": str(code)}, float(n)) for code, n in sorted(counts.items())] or [
                ({}, 0.0)]
        if field.kind == "clock_total":
            totals = seen.clock_totals if seen else dict.fromkeys(CLOCK_EVENTS, 0)
            return [({"clock_event": CLOCK_EVENTS[bit]}, float(n)) for bit, n in totals.items()]
        if field.kind == "xid_count":
            counts = self._xid_in_window(seen, gpu, now)
            return [({"xid": str(code), **window}, float(n))
                    for code, n in sorted(counts.items()) if n > 0] or [(window, 0.0)]
        counts = self._clock_in_window(seen, now)
        return [({"clock_event": CLOCK_EVENTS[bit], **window}, float(n))
                for bit, n in counts.items() if n > 0] or [(window, 0.0)]

    def _observe(self, snapshot: Snapshot) -> None:
        """Remember this snapshot's XID counts and clock reasons, once per snapshot."""
        horizon = snapshot.taken_monotonic - self.window
        for sample in snapshot.devices:
            if sample.device.is_mig:
                continue
            seen = self._seen.setdefault(sample.device.uuid, _Seen())
            if snapshot.seq <= seen.last_seq:
                continue
            seen.last_seq = snapshot.seq
            raw = sample.values.get(c.CLOCK_REASONS.key) if sample.readable else None
            reasons = int(raw) if raw is not None else None
            if reasons is not None:
                for bit in CLOCK_EVENTS:
                    if reasons & bit and not seen.reasons & bit:
                        seen.clock_totals[bit] += 1
                seen.reasons = reasons
            seen.history.append((snapshot.taken_monotonic, dict(sample.xid_counts), reasons))
            # keep one entry at or before the window's start: the baseline of the XID counts
            while len(seen.history) > 1 and seen.history[1][0] <= horizon:
                seen.history.popleft()

    def _xid_in_window(self, seen: _Seen | None, gpu: DeviceSample,
                       now: float) -> dict[int, int]:
        base: Mapping[int, int] = {}
        if seen and seen.history and seen.history[0][0] <= now - self.window:
            base = seen.history[0][1]
        return {code: n - base.get(code, 0) for code, n in gpu.xid_counts.items()}

    def _clock_in_window(self, seen: _Seen | None, now: float) -> dict[int, int]:
        counts = dict.fromkeys(CLOCK_EVENTS, 0)
        for taken, _, reasons in seen.history if seen else ():
            if reasons is None or taken <= now - self.window:
                continue
            for bit in CLOCK_EVENTS:
                if reasons & bit:
                    counts[bit] += 1
        return counts

    def families(self, snapshot: Snapshot) -> list[Family]:
        with self._lock:
            if any(isinstance(col, ExporterField) for col in self.values):
                self._observe(snapshot)
            return self._families(snapshot)

    def _families(self, snapshot: Snapshot) -> list[Family]:
        families = [Family(col.name, col.type, col.help) for col in self.values]
        now = snapshot.taken_monotonic
        rows = self._rows(snapshot)
        # DCGM's health checks watch whole GPUs, whatever the device selection
        gpu_rows = [_Row(s, s) for s in snapshot.devices if not s.device.is_mig]
        labels: dict[str, tuple[dict[str, str], list[dict[str, str]]]] = {}
        for row in (*rows, *gpu_rows):
            if row.sample.device.uuid not in labels:
                labels[row.sample.device.uuid] = (self._labels(row, snapshot),
                                                  self._copies(row.sample, snapshot))
        for col, family in zip(self.values, families, strict=True):
            health = isinstance(col, ExporterField) and col.kind == "health"
            for row in gpu_rows if health else rows:
                if row.sample.state == FAILED and not health:
                    continue
                base, copies = labels[row.sample.device.uuid]
                for extra, value in self._points(col, row, now):
                    for pods in copies:
                        attributes = {**pods, **extra}
                        family.add({**base, **{k: attributes[k] for k in sorted(attributes)}},
                                   value)
        return families

    def _points(self, col: Column, row: _Row, now: float) -> list[tuple[dict[str, str], float]]:
        """(labels beyond the device's, value) of each series ``col`` has for ``row``."""
        if isinstance(col, ExporterField):
            return self._exporter(col, row, now)
        if not isinstance(col, DcgmField):
            return []
        value = self._value(col, row)
        if value is None:
            return []
        return [(dict(col.extra_labels(value)) if col.extra_labels else {}, value)]
