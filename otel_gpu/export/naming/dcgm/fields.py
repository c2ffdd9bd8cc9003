"""The table of dcgm-exporter fields otel-gpu serves, under dcgm-exporter's names up to 4.8.

Each row is a DCGM field written from the catalog's NVML sources (no extra NVML
reads), converted to DCGM's unit, with how the value relates to NVML's and the
PromQL that gives it from the OpenTelemetry names (for the migration guide).
The names dcgm-exporter 4.9 and later use are in :mod:`.current`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_gpu.export.naming import xid
from otel_gpu.sample import sources as c
from otel_gpu.snapshot import DeviceSample

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
    replaces: str = ""
    """For a name of dcgm-exporter 4.9 and later, the name it replaces (see :mod:`.current`)."""
    rate: bool = False
    """The value is the per-second rate of the summed sources (a counter) between the last
    two samples the profile saw, times ``factor``; absent until there are two."""

    def total(self, sample: DeviceSample) -> float | None:
        """The summed sources, unscaled (``None`` when one is missing)."""
        total = 0.0
        for src in self.sources:
            raw = sample.values.get(src.key)
            if raw is None:
                return None
            total += raw
        return total

    def value(self, sample: DeviceSample) -> float | None:
        if self.derive is not None:
            return self.derive(sample)
        total = self.total(sample)
        return None if total is None else total * self.factor


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


# DCGM's dcgmFabricManagerStatus_t, which it derives from NVML's fabric state and status.
FM_NOT_STARTED, FM_IN_PROGRESS, FM_SUCCESS, FM_FAILURE, FM_UNRECOGNIZED = 1, 2, 3, 4, 5


_COMPLETED = dict(c.FABRIC_STATE_FLAGS)["completed"]
_HEALTH = dict(c.FABRIC_HEALTH_FLAGS)["degraded_bandwidth"]
"""The catalog sources the fabric fields' docs name: the raw answer they serve is in no
catalog row (its series are the state, failure and health flags derived from it)."""


def _raw(src: c.Source) -> Callable[[DeviceSample], float | None]:
    """The field is ``src``'s raw value, as NVML gave it."""
    def derive(sample: DeviceSample) -> float | None:
        raw = sample.values.get(src.key)
        return None if raw is None else float(raw)

    return derive


def _fabric_manager_status(sample: DeviceSample) -> float | None:
    """Not started and in progress as NVML says; completed is a success or a failure by
    its status; a state NVML does not define is unrecognized. Absent where the GPU is in
    no NVLink domain (DCGM's NotSupported, 0, is what otel-gpu leaves out)."""
    state = sample.values.get(c.FABRIC_STATE.key)
    if state is None:
        return None
    if state in (FM_NOT_STARTED, FM_IN_PROGRESS):
        return float(state)
    if state == 3:  # NVML_GPU_FABRIC_STATE_COMPLETED
        failed = sample.values.get(c.FABRIC_FAILED.key)
        return None if failed is None else float(FM_FAILURE if failed else FM_SUCCESS)
    return float(FM_UNRECOGNIZED)


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
    # NVLink fabric (GB200, GB300 and other NVLink-domain systems), from
    # nvmlDeviceGetGpuFabricInfoV; dcgm-exporter serves them only when a counters file lists
    # them, and so does otel-gpu. Absent on a GPU in no NVLink domain.
    DcgmField("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge",
              "Fabric registration of the GPU: 1 not started, 2 in progress, 3 success, "
              "4 failure, 5 unrecognized.", (_COMPLETED, c.FABRIC_FAILED),
              derive=_fabric_manager_status,
              unit_note="dcgmFabricManagerStatus_t (NVML state, completed split by status)",
              rewrite_note="none: `nvidia_gpu_fabric_state` has one 0/1 series per state, "
                           "and `nvidia_gpu_fabric_registration_failed` says whether a "
                           "completed registration failed"),
    DcgmField("DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE", "gauge",
              "NVML return code of the completed fabric registration (0: success).",
              (c.FABRIC_FAILED,), derive=_raw(c.FABRIC_STATUS),
              unit_note="NVML return code, once the registration completed",
              rewrite_note="none: `nvidia_gpu_fabric_registration_failed` says whether it "
                           "failed; the nvidia.gpu.fabric.registration event names the code"),
    DcgmField("DCGM_FI_DEV_FABRIC_CLIQUE_ID", "gauge",
              "Fabric clique the GPU belongs to, once its registration completed.",
              (_COMPLETED,), derive=_raw(c.FABRIC_CLIQUE_ID), unit_note="clique id",
              rewrite_note="none: the `nvidia_gpu_fabric_clique_id` label of "
                           "`nvidia_gpu_info`"),
    DcgmField("DCGM_FI_DEV_FABRIC_HEALTH_MASK", "gauge", "Fabric health mask of the GPU.",
              (_HEALTH,), derive=_raw(c.FABRIC_HEALTH_MASK),
              unit_note="NVML health mask (NVML_GPU_FABRIC_HEALTH_MASK_*)",
              rewrite_note="none: `nvidia_gpu_fabric_health` has one 0/1 series per "
                           "condition"),
    DcgmField("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "gauge",
              "Fabric health summary: 1 healthy, 2 unhealthy, 3 limited capacity.",
              (_HEALTH,), derive=_raw(c.FABRIC_HEALTH_SUMMARY),
              unit_note="NVML_GPU_FABRIC_HEALTH_SUMMARY_* (drivers filling the v3 structure)",
              rewrite_note="none: `nvidia_gpu_fabric_health` has one 0/1 series per "
                           "condition"),
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
