"""Where each raw value comes from in NVML: the sources the catalog's metrics read.

A :class:`Source` is one raw value, keyed by a short string in
:attr:`otel_gpu.snapshot.DeviceSample.values`. It is read either as one
entry of the batched ``nvmlDeviceGetFieldValues`` call (``field_id``), by a
:class:`Reader`: one plain NVML call returning one or more keys, or computed
by GPM profiling from two samples (``gpm``, see :mod:`otel_gpu.sample.gpm`). The catalog
refers to sources (and through them to readers) by object, so a new metric
is one catalog entry plus, where NVML needs a new call, one reader here.

Every value NVML also offers as a field id is read in the batched call: it costs
no call of its own. Such a field keeps the plain call it replaced as its
``fallback``, read instead on a device whose driver does not answer the field
(older drivers lack the newer ids), so no value is lost on them.

This is the only module besides :mod:`otel_gpu.sample.sampler` and
:mod:`otel_gpu.sample.library` that knows pynvml; the catalog and the stages
above it stay free of the driver binding.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from otel_gpu import nvml_abi as abi
from otel_gpu.sample.readers import (
    CLOCK_EVENT_REASONS,
    CLOCK_GRAPHICS_INFO,
    CLOCK_MAX_GRAPHICS_INFO,
    CLOCK_MAX_MEM_INFO,
    CLOCK_MAX_SM_INFO,
    CLOCK_MAX_VIDEO_INFO,
    CLOCK_MEM_INFO,
    CLOCK_SM_INFO,
    CLOCK_VIDEO_INFO,
    COMPUTE_PROCESSES,
    DECODER,
    DEFAULT_POWER_LIMIT_INFO,
    ENCODER,
    ENFORCED_POWER_LIMIT_INFO,
    FABRIC_HEALTH,
    FABRIC_STATES,
    FAN_SPEED,
    GPU_FABRIC,
    MEMORY,
    NVLINK_STATES,
    PCIE_GEN_INFO,
    PCIE_GEN_MAX_INFO,
    PCIE_WIDTH_INFO,
    PCIE_WIDTH_MAX_INFO,
    PERFORMANCE_STATE,
    POWER_LIMIT_CONSTRAINTS,
    POWER_LIMIT_INFO,
    POWER_USAGE,
    ROW_REMAP_AVAILABILITY,
    ROW_REMAP_HISTOGRAM,
    TEMPERATURE,
    UTILIZATION,
    Reader,
    pcie_throughput,
    violation,
)

ALL_ONES_32 = 0xFFFFFFFF
"""NVML's "not available" answer in a 32-bit value (``NVML_VALUE_NOT_AVAILABLE``)."""
SATURATED_64 = 0x7FFFFFFFFFFFFFFF
"""A 64-bit value at or past this is all ones (signed or not), or saturated: never a count."""
BOUNDS: Mapping[str, tuple[float, float]] = {"%": (0.0, 100.0)}
"""The range of a raw value by NVML unit (inclusive) where the unit alone fixes it; every
other bound is on the source's definition, from what hardware does (docs/bounds.md)."""

# What hardware can do, with a margin: docs/bounds.md gives each figure, its board and where
# it comes from; tests/sample/test_bounds.py keeps that table and these equal.
CORE_CLOCK_MHZ = 6_000.0
"""Graphics, SM and video clocks: twice the fastest shipping GPU clock (about 3 GHz)."""
MEMORY_CLOCK_MHZ = 30_000.0
"""Memory clocks, which GDDR reports at half its data rate: twice a locked RTX 5090's
15,001 MHz, and above the 24,000 MHz that GDDR7 at 48 Gb/s per pin would read."""
TEMPERATURE_CEL = 150.0
"""Die and memory temperatures: GPUs shut down near 100 C; a sensor past 150 C is broken."""
POWER_MW = 10_000_000.0
"""Power and power limits (10 kW): 1.9 times a whole four-GPU GB200 NVL4 board (5.4 kW),
were a driver to report the module instead of the GPU; a GB300 GPU draws 1.4 kW."""
ENERGY_MJ = float(2**53)
"""The energy counter since the driver loaded: 10 kW for 28 years (and exact in a double)."""
MEMORY_BYTES = float(2**41)
"""Memory sizes (2 TiB): seven times a B300's 288 GB of HBM3e."""
FAN_PERCENT = 200.0
"""Fan speed: a percentage of the fan's rated speed that NVML says may exceed 100."""
PCIE_GENERATIONS = 8.0
"""PCIe generations: two past Gen6, the newest a GPU or NIC ships with (Gen7 is published)."""
PCIE_LANES = 32.0
"""PCIe lanes: x32, the widest link the specification defines (GPUs use x16)."""
PCIE_KB_PER_S = 500_000_000.0
"""PCIe throughput per direction (KB/s): twice Gen7 x16 (256 GB/s), four times Gen6 x16."""
GPM_PCIE_MIB_PER_S = 500_000.0
"""GPM's PCIe rate per direction (MiB/s): four times Gen6 x16 (122,070 MiB/s)."""
GPM_NVLINK_MIB_PER_S = 4_000_000.0
"""GPM's NVLink rate per direction (MiB/s): 4.7 times NVLink 5's 900 GB/s per GPU."""
PSTATES = 15.0
"""P-states run from P0 to P15 (NVML's 32, unknown, is omitted by the reader)."""
NVLINKS = float(abi.NVML_NVLINK_MAX_LINKS)
"""Links a GPU can have: as many as NVML can name (36 in NVML 13; H100 and B200 have 18)."""

WIDE_UNITS = frozenset({"By", "mJ", "ns", "{error}", "KiB", "bitmask", "MiB/s"})
"""Units NVML gives in 64-bit values; every other unit's value is 32 bits wide."""


@dataclass(frozen=True)
class Source:
    """One raw NVML value: a batched field (``field_id``), a key of ``reader``'s answer,
    or GPM metrics (``gpm``: their ids; several are averaged, e.g. one per NVDEC engine).

    Its bound (``minimum``, ``maximum``, ``width``: derived from ``unit`` unless given)
    says what can be a reading: :meth:`accepts`.
    """

    key: str
    nvml: str
    """Human-readable NVML origin, for the docs."""
    unit: str
    """NVML's own unit for the raw value."""
    field_id: int | None = None
    reader: Reader | None = None
    gpm: tuple[int, ...] = ()
    nvlink: NvLink | None = None
    """An NVLink field: read only on a GPU with an active NVLink link (see :class:`NvLink`)."""
    fallback: Reader | None = None
    """A field's plain call, read on a device whose driver does not answer the field."""
    minimum: float | None = None
    maximum: float | None = None
    """The physical range of the raw value (inclusive); None: from the unit (:data:`BOUNDS`),
    else at least 0 and below the width's "not available" value."""
    width: int = 0
    """The C width of the value, 32 or 64 bits; 0: from the unit (:data:`WIDE_UNITS`)."""

    @cached_property  # asked for every value of every sample: worked out once
    def bounds(self) -> tuple[float, float]:
        """The physical range (inclusive): the definition's, else the unit's."""
        low, high = BOUNDS.get(self.unit, (0.0, math.inf))
        return (low if self.minimum is None else self.minimum,
                high if self.maximum is None else self.maximum)

    @cached_property
    def sentinel(self) -> int:
        """The least value that is NVML's "not available" (all ones) or saturated, in the
        value's width: never a reading, whatever the bound."""
        wide = self.width == 64 or (self.width == 0 and self.unit in WIDE_UNITS)
        return SATURATED_64 if wide else ALL_ONES_32

    def accepts(self, value: float) -> bool:
        """Whether ``value`` can be a reading: finite, not NVML's "not available" (all ones
        or saturated in the value's width), and within the physical range."""
        low, high = self.bounds
        return math.isfinite(value) and low <= value <= high and value < self.sentinel

    def __post_init__(self) -> None:
        if (self.field_id is not None) + (self.reader is not None) + bool(self.gpm) != 1:
            raise ValueError(f"source {self.key!r} needs exactly one of field_id, reader and gpm")
        if self.nvlink is not None and self.field_id is None:
            raise ValueError(f"source {self.key!r}: only a field can be an NVLink field")
        if self.fallback is not None and (
                self.field_id is None or self.key not in self.fallback.fallback_for):
            raise ValueError(f"source {self.key!r}: a fallback is a field's, and stands in "
                             "for its key")


class NvLink(enum.Enum):
    """How an NVLink field's scope is used. Either is read only while the GPU has an
    active link (``nvmlDeviceGetNvLinkState``), so a GPU without NVLink has no series."""

    GPU = "gpu"
    """A total the driver keeps for the whole GPU; the scope is not used."""
    LINKS = "links"
    """The scope is a link id: asked for every link at once (scope ``UINT_MAX``) and,
    where the driver does not answer that, summed over the active links."""


ALL_LINKS = 0xFFFFFFFF
"""The field scope asking for the total over every link (``UINT_MAX`` in nvml.h)."""


def _field(key: str, name: str, unit: str, nvlink: NvLink | None = None, *,
           fallback: Reader | None = None, plain: str = "", minimum: float | None = None,
           maximum: float | None = None) -> Source:
    """A batched field; ``fallback`` / ``plain``: the call (and its doc) giving the same
    value, in the same unit, on a driver that does not answer the field."""
    field_id = getattr(abi, "NVML_FI_DEV_" + name)
    doc = f"field NVML_FI_DEV_{name}"
    if nvlink is NvLink.LINKS:
        doc += " at scope UINT_MAX (all links), else summed over the active links"
    if fallback is not None:
        doc += f" (older drivers: {plain})"
    return Source(key, doc, unit, field_id=field_id, nvlink=nvlink, fallback=fallback,
                  minimum=minimum, maximum=maximum)


# --- sources ------------------------------------------------------------------------

NVLINK_STATE = Source("nvlink.state", "field NVML_FI_DEV_NVLINK_GET_STATE at scope LINK", "1",
                      field_id=abi.NVML_FI_DEV_NVLINK_GET_STATE)
"""A link's state in the batch (``NVML_NVLINK_STATE_ACTIVE``: up), one entry per link: the
sampler's stand-in for :data:`NVLINK_STATES`' one call per link, not a catalog source."""

MEM_TOTAL = Source("memory.total", "nvmlDeviceGetMemoryInfo_v2 .total", "By", reader=MEMORY,
                   maximum=MEMORY_BYTES)
MEM_USED = Source("memory.used", "nvmlDeviceGetMemoryInfo_v2 .used", "By", reader=MEMORY,
                   maximum=MEMORY_BYTES)
MEM_FREE = Source("memory.free", "nvmlDeviceGetMemoryInfo_v2 .free", "By", reader=MEMORY,
                   maximum=MEMORY_BYTES)
MEM_RESERVED = Source(
    "memory.reserved", "nvmlDeviceGetMemoryInfo_v2 .reserved", "By", reader=MEMORY,
    maximum=MEMORY_BYTES,
)
UTIL_GPU = Source("util.gpu", "nvmlDeviceGetUtilizationRates .gpu", "%", reader=UTILIZATION)
UTIL_MEM = Source(
    "util.memory", "nvmlDeviceGetUtilizationRates .memory", "%", reader=UTILIZATION
)
UTIL_ENC = Source("util.encoder", "nvmlDeviceGetEncoderUtilization", "%", reader=ENCODER)
UTIL_DEC = Source("util.decoder", "nvmlDeviceGetDecoderUtilization", "%", reader=DECODER)
TEMP_GPU = Source("temp.gpu", "nvmlDeviceGetTemperatureV(GPU)", "Cel", reader=TEMPERATURE,
                  maximum=TEMPERATURE_CEL)
# nvmlDeviceGetPowerUsage gives the 1 s average where the driver has one (Ampere but GA100,
# and newer), which is exactly what this field gives; elsewhere the field is missing and the
# call (then instantaneous) is read, as before. Both in mW, scope 0: the GPU alone.
POWER = _field("power", "POWER_AVERAGE", "mW", fallback=POWER_USAGE,
               plain="nvmlDeviceGetPowerUsage", maximum=POWER_MW)
CLOCK_GRAPHICS = Source(
    "clock.graphics", "nvmlDeviceGetClockInfo(GRAPHICS)", "MHz", reader=CLOCK_GRAPHICS_INFO,
    maximum=CORE_CLOCK_MHZ,
)
CLOCK_SM = Source("clock.sm", "nvmlDeviceGetClockInfo(SM)", "MHz", reader=CLOCK_SM_INFO,
                  maximum=CORE_CLOCK_MHZ)
CLOCK_MEM = Source("clock.memory", "nvmlDeviceGetClockInfo(MEM)", "MHz", reader=CLOCK_MEM_INFO,
                   maximum=MEMORY_CLOCK_MHZ)
CLOCK_REASONS = Source(
    "clock.reasons", "nvmlDeviceGetCurrentClocksEventReasons", "bitmask",
    reader=CLOCK_EVENT_REASONS,
)
FAN = Source("fan", "nvmlDeviceGetFanSpeed", "%", reader=FAN_SPEED, maximum=FAN_PERCENT)
PROCESSES = Source(
    "processes", "nvmlDeviceGetComputeRunningProcesses (count)", "{process}",
    reader=COMPUTE_PROCESSES,
)
ENERGY = _field("energy", "TOTAL_ENERGY_CONSUMPTION", "mJ", maximum=ENERGY_MJ)
TEMP_MEM = _field("temp.memory", "MEMORY_TEMP", "Cel", maximum=TEMPERATURE_CEL)
PCIE_TX = _field("pcie.tx", "PCIE_COUNT_TX_BYTES", "By")
PCIE_RX = _field("pcie.rx", "PCIE_COUNT_RX_BYTES", "By")
PCIE_REPLAY = _field("pcie.replay", "PCIE_REPLAY_COUNTER", "{replay}")
# The scope of these fields is a link id (scope 0 is link 0 only, not the total): the
# GPU's total is asked for with scope UINT_MAX, or summed over its active links.
NVLINK_TX = _field("nvlink.tx", "NVLINK_THROUGHPUT_DATA_TX", "KiB", NvLink.LINKS)
NVLINK_RX = _field("nvlink.rx", "NVLINK_THROUGHPUT_DATA_RX", "KiB", NvLink.LINKS)
ECC_CORRECTED = _field("ecc.corrected", "ECC_SBE_VOL_TOTAL", "{error}")
ECC_UNCORRECTED = _field("ecc.uncorrected", "ECC_DBE_VOL_TOTAL", "{error}")
REMAP_COR = _field("remap.corrected", "REMAPPED_COR", "{row}")
REMAP_UNC = _field("remap.uncorrected", "REMAPPED_UNC", "{row}")
REMAP_PENDING = _field("remap.pending", "REMAPPED_PENDING", "1", maximum=1)
REMAP_FAILURE = _field("remap.failure", "REMAPPED_FAILURE", "1", maximum=1)
ECC_CORRECTED_AGGREGATE = _field("ecc.corrected.aggregate", "ECC_SBE_AGG_TOTAL", "{error}")
ECC_UNCORRECTED_AGGREGATE = _field("ecc.uncorrected.aggregate", "ECC_DBE_AGG_TOTAL", "{error}")
RETIRED_SBE = _field("retired.sbe", "RETIRED_SBE", "{page}")
RETIRED_DBE = _field("retired.dbe", "RETIRED_DBE", "{page}")
RETIRED_PENDING = _field("retired.pending", "RETIRED_PENDING", "1", maximum=1)
_STATES_DOC = ("nvmlDeviceGetNvLinkState per link, or field NVML_FI_DEV_NVLINK_GET_STATE per "
               "link where the driver answers it the same")
NVLINK_LINKS = Source("nvlink.links", f"{_STATES_DOC} (links active)", "{link}",
                      reader=NVLINK_STATES, maximum=NVLINKS)
NVLINK_ACTIVE = Source("nvlink.active", f"{_STATES_DOC} (bitmask of active links)",
                       "bitmask", reader=NVLINK_STATES)
NVLINK_ERRORS: tuple[tuple[str, Source], ...] = tuple(
    (kind, _field(f"nvlink.errors.{kind}", f"NVLINK_{name}_ERROR_COUNT_TOTAL", "{error}",
                  NvLink.GPU))
    for kind, name in (("crc_flit", "CRC_FLIT"), ("crc_data", "CRC_DATA"), ("replay", "REPLAY"),
                       ("recovery", "RECOVERY"))
)
"""``error.type`` value -> the GPU's total of that NVLink error counter over its links."""
CLOCK_VIDEO = Source("clock.video", "nvmlDeviceGetClockInfo(VIDEO)", "MHz",
                     reader=CLOCK_VIDEO_INFO, maximum=CORE_CLOCK_MHZ)
CLOCK_MAX_GRAPHICS = Source("clock.max.graphics", "nvmlDeviceGetMaxClockInfo(GRAPHICS)", "MHz",
                            reader=CLOCK_MAX_GRAPHICS_INFO, maximum=CORE_CLOCK_MHZ)
CLOCK_MAX_SM = Source("clock.max.sm", "nvmlDeviceGetMaxClockInfo(SM)", "MHz",
                      reader=CLOCK_MAX_SM_INFO, maximum=CORE_CLOCK_MHZ)
CLOCK_MAX_MEM = Source("clock.max.memory", "nvmlDeviceGetMaxClockInfo(MEM)", "MHz",
                       reader=CLOCK_MAX_MEM_INFO, maximum=MEMORY_CLOCK_MHZ)
CLOCK_MAX_VIDEO = Source("clock.max.video", "nvmlDeviceGetMaxClockInfo(VIDEO)", "MHz",
                         reader=CLOCK_MAX_VIDEO_INFO, maximum=CORE_CLOCK_MHZ)
# The power limit fields are in mW, as the calls are. The limit set through NVML (or any
# other client) is the requested one; the enforced one is what the driver calls current.
POWER_LIMIT = _field("power.limit.current", "POWER_REQUESTED_LIMIT", "mW",
                     fallback=POWER_LIMIT_INFO, plain="nvmlDeviceGetPowerManagementLimit",
                     maximum=POWER_MW)
POWER_LIMIT_ENFORCED = _field("power.limit.enforced", "POWER_CURRENT_LIMIT", "mW",
                              fallback=ENFORCED_POWER_LIMIT_INFO,
                              plain="nvmlDeviceGetEnforcedPowerLimit", maximum=POWER_MW)
POWER_LIMIT_DEFAULT = _field("power.limit.default", "POWER_DEFAULT_LIMIT", "mW",
                             fallback=DEFAULT_POWER_LIMIT_INFO,
                             plain="nvmlDeviceGetPowerManagementDefaultLimit", maximum=POWER_MW)
POWER_LIMIT_MIN = _field("power.limit.min", "POWER_MIN_LIMIT", "mW",
                         fallback=POWER_LIMIT_CONSTRAINTS,
                         plain="nvmlDeviceGetPowerManagementLimitConstraints .min",
                         maximum=POWER_MW)
POWER_LIMIT_MAX = _field("power.limit.max", "POWER_MAX_LIMIT", "mW",
                         fallback=POWER_LIMIT_CONSTRAINTS,
                         plain="nvmlDeviceGetPowerManagementLimitConstraints .max",
                         maximum=POWER_MW)
PSTATE = Source("pstate", "nvmlDeviceGetPerformanceState (omitted when unknown)", "1",
                reader=PERFORMANCE_STATE, maximum=PSTATES)
PCIE_GEN = Source("pcie.link.gen", "nvmlDeviceGetCurrPcieLinkGeneration", "1",
                  reader=PCIE_GEN_INFO, minimum=1, maximum=PCIE_GENERATIONS)
PCIE_GEN_MAX = Source("pcie.link.gen.max", "nvmlDeviceGetMaxPcieLinkGeneration", "1",
                      reader=PCIE_GEN_MAX_INFO, minimum=1, maximum=PCIE_GENERATIONS)
PCIE_WIDTH = Source("pcie.link.width", "nvmlDeviceGetCurrPcieLinkWidth", "{lane}",
                    reader=PCIE_WIDTH_INFO, minimum=1, maximum=PCIE_LANES)
PCIE_WIDTH_MAX = Source("pcie.link.width.max", "nvmlDeviceGetMaxPcieLinkWidth", "{lane}",
                        reader=PCIE_WIDTH_MAX_INFO, minimum=1, maximum=PCIE_LANES)
# nvmlDeviceGetPcieThroughput samples a byte counter for 20 ms per call: read only where the
# batched PCIe byte counters are missing.
PCIE_THROUGHPUT = Reader("pcie_throughput", pcie_throughput,
                         fallback_for=(PCIE_TX.key, PCIE_RX.key))
PCIE_THROUGHPUT_TX = Source("pcie.throughput.tx", "nvmlDeviceGetPcieThroughput(TX_BYTES)", "KB/s",
                            reader=PCIE_THROUGHPUT, maximum=PCIE_KB_PER_S)
PCIE_THROUGHPUT_RX = Source("pcie.throughput.rx", "nvmlDeviceGetPcieThroughput(RX_BYTES)", "KB/s",
                            reader=PCIE_THROUGHPUT, maximum=PCIE_KB_PER_S)
# The perf-policy counters are the same nanoseconds as the call's .violationTime (the
# clocks-event-reason counters, which NVML defines as aliases of two of them, are in ns).
VIOLATIONS: tuple[tuple[str, Source], ...] = tuple(
    (policy, _field(f"violation.{policy}", f"PERF_POLICY_{constant}", "ns",
                    fallback=violation(policy, f"NVML_PERF_POLICY_{constant}"),
                    plain=f"nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_{constant}) "
                          ".violationTime"))
    for policy, constant in (("power", "POWER"), ("thermal", "THERMAL"),
                             ("sync_boost", "SYNC_BOOST"), ("board_limit", "BOARD_LIMIT"),
                             ("low_utilization", "LOW_UTILIZATION"),
                             ("reliability", "RELIABILITY"))
)
"""``nvidia.gpu.throttle.reason`` value -> time the clocks were held down by that policy."""
ROW_REMAP_BANKS: tuple[tuple[str, Source], ...] = tuple(
    (name, Source(f"remap.banks.{name}", f"nvmlDeviceGetRowRemapperHistogram .{name}", "{bank}",
                  reader=ROW_REMAP_HISTOGRAM))
    for name in ROW_REMAP_AVAILABILITY
)
"""``nvidia.gpu.row_remap.availability`` value -> memory banks with that many spare rows."""


def _gpm(key: str, unit: str, dcgm: str, *names: str, maximum: float | None = None) -> Source:
    """A GPM metric computed from two samples; several names are averaged (one per engine)."""
    ids = tuple(getattr(abi, "NVML_GPM_METRIC_" + name) for name in names)
    what = names[0] if len(names) == 1 else f"mean of {names[0]} .. {names[-1]}"
    return Source(key, f"GPM {what} (DCGM: {dcgm})", unit, gpm=ids, maximum=maximum)


# Profiling (Hopper and newer), per GPU and per MIG GPU instance: see otel_gpu.sample.gpm.
GPM_GRAPHICS = _gpm("gpm.graphics_active", "%", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GRAPHICS_UTIL")
GPM_SM_ACTIVE = _gpm("gpm.sm_active", "%", "DCGM_FI_PROF_SM_ACTIVE", "SM_UTIL")
GPM_SM_OCCUPANCY = _gpm("gpm.sm_occupancy", "%", "DCGM_FI_PROF_SM_OCCUPANCY", "SM_OCCUPANCY")
GPM_TENSOR = _gpm("gpm.tensor_active", "%", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ANY_TENSOR_UTIL")
GPM_TENSOR_HMMA = _gpm("gpm.tensor_hmma_active", "%", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
                       "HMMA_TENSOR_UTIL")
GPM_TENSOR_IMMA = _gpm("gpm.tensor_imma_active", "%", "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
                       "IMMA_TENSOR_UTIL")
GPM_TENSOR_DFMA = _gpm("gpm.tensor_dfma_active", "%", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
                       "DFMA_TENSOR_UTIL")
GPM_TENSOR_DMMA = _gpm("gpm.tensor_dmma_active", "%", "none", "DMMA_TENSOR_UTIL")
GPM_FP64 = _gpm("gpm.fp64_active", "%", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "FP64_UTIL")
GPM_FP32 = _gpm("gpm.fp32_active", "%", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "FP32_UTIL")
GPM_FP16 = _gpm("gpm.fp16_active", "%", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "FP16_UTIL")
GPM_INTEGER = _gpm("gpm.integer_active", "%", "DCGM_FI_PROF_PIPE_INT_ACTIVE", "INTEGER_UTIL")
GPM_DRAM = _gpm("gpm.dram_active", "%", "DCGM_FI_PROF_DRAM_ACTIVE", "DRAM_BW_UTIL")
GPM_PCIE_TX = _gpm("gpm.pcie_tx", "MiB/s", "DCGM_FI_PROF_PCIE_TX_BYTES", "PCIE_TX_PER_SEC",
                   maximum=GPM_PCIE_MIB_PER_S)
GPM_PCIE_RX = _gpm("gpm.pcie_rx", "MiB/s", "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIE_RX_PER_SEC",
                   maximum=GPM_PCIE_MIB_PER_S)
GPM_NVLINK_TX = _gpm("gpm.nvlink_tx", "MiB/s", "DCGM_FI_PROF_NVLINK_TX_BYTES",
                     "NVLINK_TOTAL_TX_PER_SEC", maximum=GPM_NVLINK_MIB_PER_S)
GPM_NVLINK_RX = _gpm("gpm.nvlink_rx", "MiB/s", "DCGM_FI_PROF_NVLINK_RX_BYTES",
                     "NVLINK_TOTAL_RX_PER_SEC", maximum=GPM_NVLINK_MIB_PER_S)
GPM_NVDEC = _gpm("gpm.nvdec_active", "%", "mean of DCGM_FI_PROF_NVDEC0_ACTIVE .. 7",
                 *(f"NVDEC_{i}_UTIL" for i in range(8)))
GPM_NVJPG = _gpm("gpm.nvjpg_active", "%", "mean of DCGM_FI_PROF_NVJPG0_ACTIVE .. 7",
                 *(f"NVJPG_{i}_UTIL" for i in range(8)))
GPM_NVOFA = _gpm("gpm.nvofa_active", "%", "mean of DCGM_FI_PROF_NVOFA0_ACTIVE .. 1",
                 "NVOFA_0_UTIL", "NVOFA_1_UTIL")

THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", abi.nvmlClocksEventReasonGpuIdle),
    ("applications_clocks_setting", abi.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", abi.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", abi.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", abi.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", abi.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", abi.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", abi.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", abi.nvmlClocksEventReasonDisplayClockSetting),
)
"""``nvidia.gpu.throttle.reason`` value -> bit of the clock event reasons mask."""


# NVLink fabric registration and health (GB200, GB300 and other NVLink-domain systems): one
# call, nvmlDeviceGetGpuFabricInfoV. A GPU whose driver refuses it, or answers state
# NOT_SUPPORTED, has none of these; the values NVML says to read only once registration
# completed (status, clique id, cluster UUID) are absent before.
_FABRIC = "nvmlDeviceGetGpuFabricInfoV"
FABRIC_STATE_FLAGS: tuple[tuple[str, Source], ...] = tuple(
    (name, Source(f"fabric.state.{name}",
                  f"{_FABRIC} .state == NVML_GPU_FABRIC_STATE_{name.upper()}", "1",
                  reader=GPU_FABRIC, maximum=1))
    for name in FABRIC_STATES
)
"""``nvidia.gpu.fabric.state`` value -> 1 while the GPU's registration is in that state."""
FABRIC_FAILED = Source("fabric.failed",
                       f"{_FABRIC} .status != NVML_SUCCESS once .state is COMPLETED", "1",
                       reader=GPU_FABRIC, maximum=1)
FABRIC_HEALTH_FLAGS: tuple[tuple[str, Source], ...] = tuple(
    (name, Source(f"fabric.health.{name}",
                  f"{_FABRIC} .healthMask NVML_GPU_FABRIC_HEALTH_MASK_{part} "
                  f"(absent while NOT_SUPPORTED)", "1", reader=GPU_FABRIC, maximum=1))
    for name, part, _ in FABRIC_HEALTH
)
"""``nvidia.gpu.fabric.health.condition`` value -> 1 while the health mask says it holds."""
# The raw answer, for dcgm-exporter's fields and the events; no catalog row reads them, so
# they carry no bound: each reader of them says what it does with a value NVML never gives.
FABRIC_STATE = Source("fabric.state", f"{_FABRIC} .state (NVML_GPU_FABRIC_STATE_*)", "1",
                      reader=GPU_FABRIC)
FABRIC_STATUS = Source("fabric.status", f"{_FABRIC} .status (an NVML return code)", "1",
                       reader=GPU_FABRIC)
FABRIC_CLIQUE_ID = Source("fabric.clique_id", f"{_FABRIC} .cliqueId", "1", reader=GPU_FABRIC)
FABRIC_HEALTH_MASK = Source("fabric.health_mask", f"{_FABRIC} .healthMask", "bitmask",
                            reader=GPU_FABRIC, width=32)
FABRIC_HEALTH_SUMMARY = Source("fabric.health_summary",
                               f"{_FABRIC} .healthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*)",
                               "1", reader=GPU_FABRIC)
