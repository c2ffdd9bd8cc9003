"""The ``dcgm`` naming profile: dcgm-exporter's field names, units and labels.

Every field is read from the catalog's NVML sources (no extra NVML reads),
converted to dcgm-exporter's unit. The field set is dcgm-exporter's default,
or the one a dcgm-exporter counters CSV file names (``-f``/``--collectors``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from otel_gpu._files import FileError, read_text
from otel_gpu.errors import SetupError
from otel_gpu.naming.exposition import Family
from otel_gpu.nvml import sources as c
from otel_gpu.snapshot import FAILED, DeviceSample, Snapshot

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
_KIB = "KiB (NVML bytes / 1024)"

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
              derive=_last_xid, unit_note="XID code",
              rewrite_note="none: `nvidia_gpu_xid_errors_total` counts each XID code"),
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (MiB).", c.MEM_FREE,
       factor=MIB, note=_MIB, promql="nvidia_gpu_memory_free_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (MiB).", c.MEM_USED,
       factor=MIB, note=_MIB, promql="hw_gpu_memory_usage_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (MiB).", c.MEM_RESERVED,
       factor=MIB, note=_MIB, promql="nvidia_gpu_memory_reserved_bytes / 2^20"),
    _f("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (MiB).", c.MEM_TOTAL,
       factor=MIB, note=_MIB, promql="hw_gpu_memory_limit_bytes / 2^20"),
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
       "NVLink data sent and received, all links (KiB).", c.NVLINK_TX, c.NVLINK_RX,
       note="KiB (NVML NVLink data TX + RX)",
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
)}

# dcgm-exporter's default field set.
DEFAULT_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)

_PROFILING = "needs DCGM's profiling module; NVML does not measure it"
_VIOLATION = "DCGM's throttle-duration accounting has no NVML equivalent"
# Known dcgm-exporter fields NVML cannot provide, with the reason.
UNAVAILABLE: Mapping[str, str] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "only meaningful inside a vGPU guest VM",
    **{f"DCGM_FI_PROF_{n}": _PROFILING for n in (
        "GR_ENGINE_ACTIVE", "SM_ACTIVE", "SM_OCCUPANCY", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE",
        "PIPE_FP64_ACTIVE", "PIPE_FP32_ACTIVE", "PIPE_FP16_ACTIVE", "PCIE_TX_BYTES",
        "PCIE_RX_BYTES", "NVLINK_TX_BYTES", "NVLINK_RX_BYTES",
    )},
    **{f"DCGM_FI_DEV_{n}_VIOLATION": _VIOLATION for n in (
        "POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY",
    )},
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "not read by otel-gpu (volatile counts are)",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "not read by otel-gpu (volatile counts are)",
    "DCGM_FI_DEV_RETIRED_SBE": "page retirement predates row remapping; not read",
    "DCGM_FI_DEV_RETIRED_DBE": "page retirement predates row remapping; not read",
    "DCGM_FI_DEV_RETIRED_PENDING": "page retirement predates row remapping; not read",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "NVLink error counters are not read yet",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "NVLink error counters are not read yet",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "NVLink error counters are not read yet",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "NVLink error counters are not read yet",
}

# Label fields dcgm-exporter's CSV files may list; these are always attached.
LABEL_FIELDS = frozenset({"DCGM_FI_DRIVER_VERSION"})
TYPES = ("gauge", "counter", "label", "histogram", "summary")


class CollectorsError(SetupError):
    """A malformed counters file; ``str()`` names the file and line."""


@dataclass(frozen=True)
class CsvEntry:
    name: str
    type: str
    help: str
    line: int


def parse_collectors(path: str) -> list[CsvEntry]:
    """Reads a dcgm-exporter counters file: ``DCGM_FI_NAME, type, help`` lines, ``#`` comments."""
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
        if not name.startswith("DCGM_FI_") or not name.replace("_", "").isalnum():
            raise CollectorsError(
                f"collectors file {path}: line {number}: {_shorten(name)} is not a DCGM_FI_ "
                "field name"
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


def select_fields(entries: Iterable[CsvEntry] | None) -> tuple[list[DcgmField], list[str]]:
    """The fields to export, and a line per requested field that cannot be (with why)."""
    if entries is None:
        return [FIELDS[n] for n in DEFAULT_FIELDS], []
    chosen: list[DcgmField] = []
    problems: list[str] = []
    for entry in entries:
        if entry.type == "label" and entry.name in LABEL_FIELDS:
            continue
        known = FIELDS.get(entry.name)
        if known is not None and entry.type in ("gauge", "counter"):
            chosen.append(replace(known, type=entry.type, help=entry.help or known.help))
        elif known is not None:
            problems.append(f"{entry.name} (line {entry.line}): type {entry.type} is not "
                            "supported for it; use gauge or counter")
        elif entry.name in UNAVAILABLE:
            problems.append(f"{entry.name} (line {entry.line}): {UNAVAILABLE[entry.name]}")
        else:
            problems.append(f"{entry.name} (line {entry.line}): not a field otel-gpu knows")
    return chosen, problems


class DcgmProfile:
    """Renders a snapshot under dcgm-exporter's names and labels."""

    def __init__(
        self,
        fields: Sequence[DcgmField],
        hostname: str,
        *,
        hostname_label: str = "Hostname",
        shared_gpu_copies: bool = False,
    ) -> None:
        self.fields = tuple(fields)
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.shared_gpu_copies = shared_gpu_copies

    def _labels(self, sample: DeviceSample, snapshot: Snapshot) -> dict[str, str]:
        dev = sample.device
        labels = {
            "gpu": str(dev.index),
            # a MIG instance is named by its parent GPU's UUID plus the instance labels
            "UUID": dev.parent_uuid or dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
            "device": f"nvidia{dev.minor_number if dev.minor_number is not None else dev.index}",
            "modelName": dev.model,
            self.hostname_label: self.hostname,
            "DCGM_FI_DRIVER_VERSION": snapshot.driver_version or "",
        }
        if dev.is_mig:
            labels["GPU_I_PROFILE"] = dev.mig_profile or ""
            labels["GPU_I_ID"] = str(dev.gpu_instance_id if dev.gpu_instance_id is not None
                                     else "")
        return labels

    def _copies(self, sample: DeviceSample, snapshot: Snapshot) -> list[dict[str, str]]:
        """Pod labels per copy of the device's series: one copy, or one per sharer."""
        refs = snapshot.series_pods(sample.device.uuid, per_sharer=self.shared_gpu_copies)
        return [{"pod": r.pod, "namespace": r.namespace, "container": r.container}
                for r in refs] or [{}]

    def families(self, snapshot: Snapshot) -> list[Family]:
        families = [Family(f.name, f.type, f.help) for f in self.fields]
        for sample in snapshot.devices:
            if sample.state == FAILED:
                continue
            base = self._labels(sample, snapshot)
            copies = self._copies(sample, snapshot)
            for field, family in zip(self.fields, families, strict=True):
                value = field.value(sample)
                if value is None:
                    continue
                for pods in copies:
                    family.add({**base, **pods}, value)
        return families
