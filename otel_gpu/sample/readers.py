"""The plain NVML calls a sample makes, one :class:`Reader` each (the batched field values
are :mod:`otel_gpu.sample.sources`' ``field_id``). Each returns its raw values by source key;
bounds and sentinels are the sources' business, not the readers'."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from ctypes import byref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu import nvml_structs as structs

ReadFunc = Callable[[ModuleType, Any], Mapping[str, float]]
"""``(pynvml module, device handle) -> {source key: raw value}``; may raise NVMLError."""


@dataclass(frozen=True, eq=False)
class Reader:
    """One NVML call per device per sample; every source naming it shares the call.

    ``name`` is what the logs say when the device cannot answer it (the sampler
    then stops asking). Readers compare by identity. ``static``: the answer cannot
    change while the driver is loaded (maximum clocks, the power limit range), so it
    is read once per device and reused. ``fallback_for``: source keys this reader
    stands in for; it is read only on a device that cannot give one of them (in the
    batch, or at all), and for one sample when the batch answered one with an error.
    ``changes_with``: batched field keys without whose change the answer cannot change;
    it is read again only when one of them moves or is missing (and at least once per
    rediscovery period), the last answer reused otherwise.
    """

    name: str
    read: ReadFunc
    static: bool = False
    fallback_for: tuple[str, ...] = ()
    changes_with: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Reader({self.name!r})"


# --- readers: one NVML call each ------------------------------------------------


def _older_driver(m: ModuleType, exc: Exception) -> bool:
    """Whether a newer NVML entry point is missing, so its older form should be used."""
    return getattr(exc, "value", None) in (
        abi.NVML_ERROR_FUNCTION_NOT_FOUND, abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
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
    versioned = getattr(m, "nvmlDeviceGetTemperatureV", None)  # not in nvidia-ml-py 12.560
    if versioned is not None:
        try:
            return {"temp.gpu": versioned(handle, abi.NVML_TEMPERATURE_GPU)}
        except m.NVMLError as exc:  # the versioned call arrived with R535
            if not _older_driver(m, exc):
                raise
    return {"temp.gpu": m.nvmlDeviceGetTemperature(handle, abi.NVML_TEMPERATURE_GPU)}


def _utilization(m: ModuleType, handle: Any) -> dict[str, float]:
    util = m.nvmlDeviceGetUtilizationRates(handle)
    return {"util.gpu": util.gpu, "util.memory": util.memory}


def _clock(domain: str, clock_type: str) -> Reader:
    def read(m: ModuleType, handle: Any) -> dict[str, float]:
        return {f"clock.{domain}": m.nvmlDeviceGetClockInfo(handle, getattr(abi, clock_type))}

    return Reader(f"clock.{domain}", read)


MEMORY = Reader("memory", _memory)
UTILIZATION = Reader("utilization", _utilization)
ENCODER = Reader("encoder", lambda m, h: {"util.encoder": m.nvmlDeviceGetEncoderUtilization(h)[0]})
DECODER = Reader("decoder", lambda m, h: {"util.decoder": m.nvmlDeviceGetDecoderUtilization(h)[0]})
TEMPERATURE = Reader("temperature", _temperature)
POWER_USAGE = Reader("power", lambda m, h: {"power": m.nvmlDeviceGetPowerUsage(h)},
                     fallback_for=("power",))
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


def _max_clock(domain: str, clock_type: str) -> Reader:
    def read(m: ModuleType, handle: Any) -> dict[str, float]:
        clock = getattr(abi, clock_type)
        return {f"clock.max.{domain}": m.nvmlDeviceGetMaxClockInfo(handle, clock)}

    return Reader(f"clock.max.{domain}", read, static=True)


def _call(name: str, key: str, function: str, *, static: bool = False,
          fallback: bool = False) -> Reader:
    """A reader of one NVML function taking only the handle and returning one number;
    ``fallback``: it stands in for the field giving ``key``."""
    return Reader(name, lambda m, h: {key: getattr(m, function)(h)}, static=static,
                  fallback_for=(key,) if fallback else ())


def _power_range(m: ModuleType, handle: Any) -> dict[str, float]:
    low, high = m.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    return {"power.limit.min": low, "power.limit.max": high}


def _performance_state(m: ModuleType, handle: Any) -> dict[str, float]:
    state = m.nvmlDeviceGetPerformanceState(handle)
    return {} if state == abi.NVML_PSTATE_UNKNOWN else {"pstate": state}


def violation(policy: str, constant: str) -> Reader:
    def read(m: ModuleType, handle: Any) -> dict[str, float]:
        status = m.nvmlDeviceGetViolationStatus(handle, getattr(abi, constant))
        return {f"violation.{policy}": status.violationTime}

    return Reader(f"violation.{policy}", read, fallback_for=(f"violation.{policy}",))


def pcie_throughput(m: ModuleType, handle: Any) -> dict[str, float]:
    return {
        "pcie.throughput.tx": m.nvmlDeviceGetPcieThroughput(handle, abi.NVML_PCIE_UTIL_TX_BYTES),
        "pcie.throughput.rx": m.nvmlDeviceGetPcieThroughput(handle, abi.NVML_PCIE_UTIL_RX_BYTES),
    }


ROW_REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")
"""The buckets of ``nvmlDeviceGetRowRemapperHistogram``: memory banks by spare rows left."""


def _row_remap_histogram(m: ModuleType, handle: Any) -> dict[str, float]:
    histogram = m.nvmlDeviceGetRowRemapperHistogram(handle)
    return {f"remap.banks.{name}": getattr(histogram, name) for name in ROW_REMAP_AVAILABILITY}


LINK_COUNT = "nvlink.count"
"""The link state reader's key for the number of links the GPU has (the sampler's own)."""


def _nvlink_states(m: ModuleType, handle: Any) -> dict[str, float]:
    """Links up, and which (nothing when no link is active: no NVLink series then), and
    how many links the GPU has (``LINK_COUNT``)."""
    active = count = 0
    for link in range(abi.NVML_NVLINK_MAX_LINKS):
        try:
            state = m.nvmlDeviceGetNvLinkState(handle, link)
        except m.NVMLError as exc:
            past_the_last = (abi.NVML_ERROR_INVALID_ARGUMENT, abi.NVML_ERROR_NOT_SUPPORTED)
            if link and getattr(exc, "value", None) in past_the_last:
                break
            raise  # on link 0: this GPU has no NVLink
        count = link + 1
        if state == abi.NVML_FEATURE_ENABLED:
            active |= 1 << link
    if not active:
        return {LINK_COUNT: count}
    return {LINK_COUNT: count, "nvlink.links": bin(active).count("1"), "nvlink.active": active}


CLOCK_VIDEO_INFO = _clock("video", "NVML_CLOCK_VIDEO")
CLOCK_MAX_GRAPHICS_INFO = _max_clock("graphics", "NVML_CLOCK_GRAPHICS")
CLOCK_MAX_SM_INFO = _max_clock("sm", "NVML_CLOCK_SM")
CLOCK_MAX_MEM_INFO = _max_clock("memory", "NVML_CLOCK_MEM")
CLOCK_MAX_VIDEO_INFO = _max_clock("video", "NVML_CLOCK_VIDEO")
POWER_LIMIT_INFO = _call("power_limit", "power.limit.current",
                         "nvmlDeviceGetPowerManagementLimit", fallback=True)
ENFORCED_POWER_LIMIT_INFO = _call("power_limit.enforced", "power.limit.enforced",
                                  "nvmlDeviceGetEnforcedPowerLimit", fallback=True)
DEFAULT_POWER_LIMIT_INFO = _call("power_limit.default", "power.limit.default",
                                 "nvmlDeviceGetPowerManagementDefaultLimit", static=True,
                                 fallback=True)
POWER_LIMIT_CONSTRAINTS = Reader("power_limit.range", _power_range, static=True,
                                 fallback_for=("power.limit.min", "power.limit.max"))
PERFORMANCE_STATE = Reader("pstate", _performance_state)
PCIE_GEN_INFO = _call("pcie.link.gen", "pcie.link.gen", "nvmlDeviceGetCurrPcieLinkGeneration")
PCIE_GEN_MAX_INFO = _call("pcie.link.gen.max", "pcie.link.gen.max",
                          "nvmlDeviceGetMaxPcieLinkGeneration", static=True)
PCIE_WIDTH_INFO = _call("pcie.link.width", "pcie.link.width", "nvmlDeviceGetCurrPcieLinkWidth")
PCIE_WIDTH_MAX_INFO = _call("pcie.link.width.max", "pcie.link.width.max",
                            "nvmlDeviceGetMaxPcieLinkWidth", static=True)
# A bank's spare rows are used up only by a row remapping, which moves the remapped-row
# counts, the pending flag (when the reset applies it) or the failure flag.
ROW_REMAP_HISTOGRAM = Reader("row_remap_histogram", _row_remap_histogram,
                             changes_with=("remap.corrected", "remap.uncorrected",
                                           "remap.pending", "remap.failure"))
NVLINK_STATES = Reader("nvlink", _nvlink_states)
"""Read before the batched fields: the NVLink fields need the active links. Where the
driver answers :data:`NVLINK_STATE` the same, the batch gives the states instead."""


# --- NVLink fabric (GB200, GB300 and other NVLink-domain systems) ------------------------

FABRIC_STATES = ("not_started", "in_progress", "completed")
"""The fabric registration states NVML names (``NVML_GPU_FABRIC_STATE_*``, 1 to 3), in order.
A GPU whose state is NOT_SUPPORTED (0) is in no NVLink domain: it has no fabric values."""
FABRIC_HEALTH: tuple[tuple[str, str, frozenset[int]], ...] = (
    ("degraded_bandwidth", "DEGRADED_BW", frozenset({1})),
    ("route_recovery", "ROUTE_RECOVERY", frozenset({1})),
    ("route_unhealthy", "ROUTE_UNHEALTHY", frozenset({1})),
    ("access_timeout_recovery", "ACCESS_TIMEOUT_RECOVERY", frozenset({1})),
    ("incorrect_configuration", "INCORRECT_CONFIGURATION", frozenset(range(2, 16))),
    ("partition_unassigned", "PARTITION_ASSIGNED", frozenset({2})),
    ("fabric_manager_disconnected", "GFM_STATE", frozenset({2})),
)
"""The health mask's conditions: (name, the ``NVML_GPU_FABRIC_HEALTH_MASK_*`` part, the
part's values that mean the condition holds). Each part reads 0 where the driver does not
report it; any other value not listed means the condition does not hold. Named so that 1 is
always the bad case: a partition assigned and a connected fabric manager read 0."""
FABRIC_CLUSTER_KEYS = tuple(f"fabric.cluster_uuid.{word}" for word in range(4))
"""The cluster UUID's 16 bytes as four 32-bit words, big-endian: values are numbers, and a
double holds 32 bits exactly."""
_ALL_ONES_32 = 0xFFFFFFFF


def fabric_health(m: ModuleType, mask: int) -> dict[str, float]:
    """``fabric.health.<name>`` 0 or 1 for each condition the mask reports."""
    out: dict[str, float] = {}
    for name, part, bad in FABRIC_HEALTH:
        shift = getattr(abi, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{part}")
        width = getattr(abi, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{part}")
        value = (mask >> shift) & width
        if value:
            out[f"fabric.health.{name}"] = 1.0 if value in bad else 0.0
    return out


def _fabric_info(m: ModuleType, handle: Any) -> Any:
    """The newest fabric structure the driver fills: v3 (health summary), v2 (health
    mask), or the first form without a version (R525 drivers). The structures are the
    collector's own (:mod:`otel_gpu.nvml_structs`): the binding forwards the pointer."""
    versioned = getattr(m, "nvmlDeviceGetGpuFabricInfoV", None)
    for struct in structs.GPU_FABRIC_INFO_VERSIONS.values():
        if versioned is None:
            break  # an nvidia-ml-py before the versioned call: the first form
        info = struct()
        try:
            versioned(handle, byref(info))
        except m.NVMLError as exc:
            if getattr(exc, "value", None) == abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                continue  # a driver that knows only an older version of the structure
            if _older_driver(m, exc):
                break
            raise
        return info
    first = structs.GpuFabricInfo()
    m.nvmlDeviceGetGpuFabricInfo(handle, byref(first))
    return first


def _fabric(m: ModuleType, handle: Any) -> dict[str, float]:
    """The GPU's fabric registration and health; nothing for a GPU in no NVLink domain."""
    info = _fabric_info(m, handle)
    state = int(info.state)
    if state in (abi.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0xFF):  # none, or no answer (a byte)
        return {}
    out: dict[str, float] = {"fabric.state": state}
    if 1 <= state <= len(FABRIC_STATES):  # an unknown state: only the raw value, dropped
        for number, name in enumerate(FABRIC_STATES, 1):
            out[f"fabric.state.{name}"] = 1.0 if state == number else 0.0
    if state == abi.NVML_GPU_FABRIC_STATE_COMPLETED:  # "checked only once complete"
        out["fabric.status"] = int(info.status)
        out["fabric.failed"] = 0.0 if info.status == abi.NVML_SUCCESS else 1.0
        out["fabric.clique_id"] = int(info.cliqueId)
        raw = bytes(info.clusterUuid)
        if any(raw) and any(b != 0xFF for b in raw):  # all zeros or all ones: no cluster
            for word, key in enumerate(FABRIC_CLUSTER_KEYS):
                out[key] = int.from_bytes(raw[4 * word:4 * word + 4], "big")
    mask = getattr(info, "healthMask", None)
    if mask is not None and mask != _ALL_ONES_32:  # all ones: NVML's "not available"
        out["fabric.health_mask"] = int(mask)
        out.update(fabric_health(m, int(mask)))
    summary = getattr(info, "healthSummary", None)
    if summary in (abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
                   abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
                   abi.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY):  # else none given
        out["fabric.health_summary"] = int(summary)
    return out


GPU_FABRIC = Reader("fabric", _fabric)


def fabric_cluster_uuid(values: Mapping[str, float]) -> str | None:
    """The cluster UUID a sample's values hold (``fabric.cluster_uuid.0`` to ``.3``) in the
    usual 8-4-4-4-12 form; None when the driver gave none or a word is missing."""
    words = [values.get(key) for key in FABRIC_CLUSTER_KEYS]
    if any(w is None or not 0 <= w < 2**32 or w != int(w) for w in words):
        return None
    text = "".join(f"{int(w or 0):08x}" for w in words)
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
