"""NVIDIA's default counters file, and the other names a counters file may use.

Tables only: the default field set, the fields otel-gpu cannot provide (with
why), dcgm-exporter 1.x's lower-case names, and DCGM's aliases.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_gpu.export.naming.dcgm.current import CURRENT_FIELDS, CURRENT_LABELS, RENAMES
from otel_gpu.export.naming.dcgm.fields import FIELDS

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

_NEW_NAME = {r.old: new for new, r in RENAMES.items() if r.since == "4.9"}
_NEW_LABEL = {old: new for new, old in CURRENT_LABELS.items()}


def _current_rows() -> tuple[tuple[str, str, str], ...]:
    rows: list[tuple[str, str, str]] = []
    for name, type_, help_ in DEFAULT_COUNTERS:
        if type_ == "label":
            rows.append((_NEW_LABEL.get(name, name), type_, help_))
            continue
        new = _NEW_NAME.get(name, name)
        field = CURRENT_FIELDS.get(new)
        rows.append((new, field.type if field else type_, field.help if field else help_))
        if name == "DCGM_FI_DEV_FB_RESERVED":  # collected by default from 4.9 on
            total = CURRENT_FIELDS["DCGM_FI_DEV_FB_CAPACITY_BYTES"]
            rows.append((total.name, total.type, total.help))
        if name.startswith("DCGM_FI_PROF_PCIE_"):  # and renamed again in 4.10
            rows.append((f"{name}_PER_SECOND", type_, help_))
    return tuple(rows)


DEFAULT_COUNTERS_CURRENT: tuple[tuple[str, str, str], ...] = _current_rows()
"""The default set from dcgm-exporter 4.9 on: the rows above under their new names,
the framebuffer capacity, and the PCIe byte rates under both 4.9's and 4.10's names
(a dashboard for either finds its series). NVIDIA's own 4.9 file was not available
to copy its order and HELP texts: they are otel-gpu's."""

DEFAULT_FIELDS_CURRENT: tuple[str, ...] = tuple(
    name for name, _, _ in DEFAULT_COUNTERS_CURRENT if name in CURRENT_FIELDS or name in FIELDS
) + ("DCGM_FI_DEV_FAN_SPEED_RATIO",)

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
    "DCGM_FI_DEV_FABRIC_CLUSTER_UUID": "a text, not a number: the cluster UUID is the "
    "nvidia.gpu.fabric.cluster_uuid attribute of nvidia.gpu.info",
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

