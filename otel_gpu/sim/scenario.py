"""What a simulated machine looks like: the scenario model, its YAML format and its checks.

A scenario lists the GPUs the fake driver (:mod:`otel_gpu.sim.driver`)
pretends to have, what each one reads at every sample, and which calls fail
and how. It is plain frozen data, validated in full when loaded, so the
driver never meets a malformed value halfway through a run: every problem is
a :class:`ScenarioError` at start-up naming the file and the key path.

Time is counted in *samples*, not seconds: the collector calls
``nvmlDeviceGetCount_v2`` once at the start of every sample, and
``FakeNvml.sample`` is the number of such calls so far (0 before the
first). Every time-varying value and every fault is a function of it, so
tests are deterministic without clocks.

Scenario YAML
-------------
::

    name: h100x8                 # optional; default: the file stem
    driver_version: "550.90.07"  # optional (quote it: YAML reads 550.90 as a float)
    nvml_version: "12.550.90.07" # optional; default "12." + driver_version
    errors: {nvmlInitWithFlags: DRIVER_NOT_LOADED}   # optional; system-level symbols
    devices:                     # NVML indexes are assigned in order, after `count`
      - name: NVIDIA H100 80GB HBM3       # required
        count: 8                 # default 1: this entry stands for N identical GPUs
        uuid: GPU-...            # default: derived from scenario name + index
        pci_bus_id: "00000000:18:00.0"    # default: generated, unique
        pci_device_id: 0x233010DE         # default 0
        minor_number: 0          # default: the NVML index
        serial: "1654922000001"  # default: derived from the index
        numa_node: 0             # absent: nvmlDeviceGetNumaNodeId is NOT_SUPPORTED
        memory: {total: 85520809984, used: VALUE, reserved: VALUE}   # bytes
        utilization: {gpu: VALUE, memory: VALUE, encoder: VALUE, decoder: VALUE}  # %
        temperature: VALUE       # Celsius
        power: VALUE             # milliwatts
        clocks: {graphics: VALUE, sm: VALUE, memory: VALUE, video: VALUE}       # MHz
        clock_event_reasons: VALUE        # bitmask
        fan_speed: VALUE         # percent
        fields: {TOTAL_ENERGY_CONSUMPTION: VALUE, 82: VALUE}
        processes: [{pid: 4242, used_memory: VALUE, sm: VALUE, memory_util: VALUE}]
        unsupported: [nvmlDeviceGetFanSpeed, MEMORY_TEMP]
        no_permission: [nvmlDeviceGetComputeRunningProcesses_v3]
        errors: {nvmlDeviceGetPowerUsage: UNKNOWN}
        lost_after: 3
        slow: [{function: nvmlDeviceGetPowerUsage, seconds: 2.5, after: 1}]
        xid: [{sample: 2, code: 79}]
        mig_capable: true
        mig: [{profile: 1g.10gb, gpu_instance_id: 9, compute_instance_id: 0}]
        gpm: {SM_UTIL: VALUE, ANY_TENSOR_UTIL: VALUE, PCIE_TX_PER_SEC: VALUE, busy: true}
        power_limits: {current: VALUE, enforced: VALUE, default: VALUE, min: VALUE, max: VALUE}
        performance_state: VALUE # P-state: 0..15, 32 unknown
        max_clocks: {graphics: VALUE, sm: VALUE, memory: VALUE, video: VALUE}   # MHz
        pcie: {generation: VALUE, max_generation: VALUE, width: VALUE, max_width: VALUE,
               tx_throughput: VALUE, rx_throughput: VALUE}              # KB/s
        violations: {power: VALUE, thermal: VALUE, sync_boost: VALUE, board_limit: VALUE,
                     low_utilization: VALUE, reliability: VALUE}        # ns, cumulative
        row_remap_histogram: {max: VALUE, high: VALUE, partial: VALUE, low: VALUE, none: VALUE}
        nvlink:
          all_links_scope: true  # default true
          links: [{state: active, tx: VALUE, rx: VALUE, crc_flit: VALUE, crc_data: VALUE,
                   replay: VALUE, recovery: VALUE, down_after: 5}, {state: inactive}]
    node:                        # optional: the node's /proc and kubelet log trees
      cgroup: v2                 # v1 | v2 (default v2)
      driver: systemd            # systemd | cgroupfs (default systemd)
      runtime: containerd        # containerd | crio | docker (default containerd)
      host_pids: [1200]          # processes outside any pod
      pods:
        - namespace: ml          # required
          name: train-0          # required
          uid: 2f6a3c1e-...      # default: derived from scenario name, namespace, name
          qos: burstable         # guaranteed | burstable | besteffort (default burstable)
          containers:
            - {name: main, id: <64 hex digits>, pids: [4242], cgroup: v1}

Meaning of each key:

* A metric key that is absent makes its call answer ``NVML_ERROR_NOT_SUPPORTED``
  (``utilization.gpu`` gates ``nvmlDeviceGetUtilizationRates``, whose memory
  part defaults to 0; each ``clocks`` key gates its own clock type).
* ``memory``: ``total`` is a plain integer, ``used`` and ``reserved`` default
  to 0; free = total - used - reserved (clamped at 0). The v1 struct reports
  ``used`` + ``reserved`` as used, as the real driver does.
* ``fields``: keys are pynvml ``NVML_FI_DEV_<NAME>`` names without the prefix
  (``NVML_FI_<NAME>`` names such as ``PWR_SMOOTHING_ENABLED`` work too) or
  integer ids. A requested field not listed gets a per-entry
  ``NOT_SUPPORTED`` while the call itself succeeds. Integer values are
  reported as ``NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`` (negative: signed),
  others as ``NVML_VALUE_TYPE_DOUBLE``. The scope id of a request is ignored
  (but see ``nvlink`` for the NVLink fields). Not listed, POWER_AVERAGE, the
  POWER_*_LIMIT fields and PERF_POLICY_* answer what ``power``,
  ``power_limits`` and ``violations`` make their calls answer, and
  NVLINK_GET_STATE (at a link's scope) what ``nvmlDeviceGetNvLinkState``
  answers, faults and ``slow`` of those calls included
  (:mod:`otel_gpu.sim.driver.fields`).
* ``processes``: ``pid`` is required; ``used_memory`` absent reports
  ``NVML_VALUE_NOT_AVAILABLE`` (pynvml turns it into None). Optional
  ``from_sample`` / ``until_sample`` (inclusive) bound when the process is
  listed, and ``positions: [0, 2]`` limits it to those GPUs of a ``count``
  entry. The parent GPU of MIG instances also lists the instances' processes,
  with their GPU/compute instance ids; its own have ``0xFFFFFFFF`` there.
  ``sm``, ``memory_util``, ``encoder``, ``decoder`` (percent) are the process's
  utilization samples: a process with any of them has one sample per sample
  (the others 0) in ``nvmlDeviceGetProcessUtilization`` and
  ``nvmlDeviceGetProcessesUtilizationInfo``, stamped ``sample`` seconds after a
  fixed epoch, returned when newer than the caller's last-seen timestamp;
  with no sample to return they answer ``NOT_FOUND``, as the driver does when
  no process was busy. Both answer ``NOT_SUPPORTED`` on MIG handles and on a
  GPU with MIG instances (NVML has no per-process utilization in MIG mode), so
  MIG instance processes take none of these keys.
* ``unsupported`` / ``no_permission`` / ``errors``: C symbol names (those in
  :data:`DEVICE_SYMBOLS`, or the ``device_symbols`` given to
  :func:`load_scenario`) make that call fail on this device with
  ``NOT_SUPPORTED`` / ``NO_PERMISSION`` / the named error (``NVML_ERROR_``
  name without the prefix); field names make only that field entry fail.
  The top-level ``errors`` takes the system-level symbols (init, shutdown,
  driver/NVML version, device count, event sets).
* ``not_available``: C symbol and field names, as ``unsupported``: the call
  answers SUCCESS with every output set to all ones in its C width
  (``0xFFFFFFFF``, ``0xFFFFFFFFFFFFFFFF``: NVML's "not available" value), the
  field entry SUCCESS with its value so (GPUs only; not the process lists).
* ``lost_after: N``: from sample N+1 on, every call on this GPU's handle or its
  MIG handles (and looking it up by index or UUID) answers
  ``NVML_ERROR_GPU_IS_LOST``; the device count does not change.
* ``slow``: from sample ``after`` + 1 on (``after`` defaults to 0), calls to
  ``function`` on this GPU or its MIG instances first sleep ``seconds``
  through the injected ``sleep``.
* ``xid``: an ``nvmlEventTypeXidCriticalError`` event with ``eventData`` =
  ``code``, delivered once to each event set that registered this GPU for
  XID events no later than sample ``sample``, once the sample count reaches
  it. ``gpu_instance_id`` / ``compute_instance_id`` default to 0xFFFFFFFF.
* ``mig``: MIG mode enabled with these instances in slots 0..n-1 (at most 7;
  ``nvmlDeviceGetMaxMigDeviceCount`` answers 7, empty slots ``NOT_FOUND``).
  Instance keys: ``profile`` and ``gpu_instance_id`` (required),
  ``compute_instance_id`` (default 0), ``uuid``, ``memory``, ``processes``,
  ``gpm``, ``unsupported``, ``no_permission``, ``errors``, and ``from_sample`` /
  ``until_sample`` (inclusive) for an instance created or destroyed at run
  time: outside them its slot answers ``NOT_FOUND`` and calls on its handle
  ``INVALID_ARGUMENT``, as after a MIG re-layout. The instance's name is
  ``"<parent name> MIG <profile>"``. On a MIG handle only name, UUID, PCI info
  (the parent's), memory, processes, GPU/compute instance ids,
  ``nvmlDeviceIsMigDeviceHandle`` and the parent lookup work; the field call
  succeeds with every entry ``NOT_SUPPORTED``; the rest answer
  ``NOT_SUPPORTED``, as real NVML does. ``mig_capable: true`` without ``mig``
  reports MIG mode disabled; neither: ``nvmlDeviceGetMigMode`` is
  ``NOT_SUPPORTED``.
  ``gi_profile_id`` and ``placement_start`` are what ``nvmlGpuInstanceGetInfo``
  reports for the instance's GPU instance (found with
  ``nvmlDeviceGetGpuInstanceById`` on the parent). By default the profile id
  follows from the profile's slice count (1g: 19, 1g+me: 20, 2g: 14, 3g: 9,
  4g: 5, 7g: 0, as on A100 and H100; give it for others, e.g. 15 for an
  A100-80GB ``1g.20gb``) and the placement starts after the instances in the
  slots before it (placement sizes 1, 2, 4, 4 and 8 memory slices).
* ``gpm``: the GPU supports GPM profiling (Hopper and newer); absent,
  ``nvmlGpmQueryDeviceSupport`` reports it unsupported (``isSupportedDevice``
  0) and its sample calls answer ``NOT_SUPPORTED``, as before Hopper. Metric
  keys are pynvml ``NVML_GPM_METRIC_<NAME>`` names without the prefix (or
  integer ids), each a VALUE in NVML's unit (percent, or MiB/s for the
  ``*_PER_SEC`` ones): ``nvmlGpmMetricsGet`` answers it for two samples taken
  with ``nvmlGpmSampleGet``, valued at the collector sample of the later one;
  a metric not listed answers ``NOT_SUPPORTED`` in its entry. ``unsupported:
  true`` makes the support query say no; ``no_permission: true`` makes the
  sample calls answer ``NO_PERMISSION``; ``busy: true`` (or ``{from_sample: A,
  until_sample: B}``, inclusive, either optional) makes them answer
  ``IN_USE``, as when another profiler holds the counters. Under a MIG
  instance, ``gpm`` takes the same keys but ``unsupported`` and answers
  ``nvmlGpmMigSampleGet`` for its GPU instance id (the GPU must have ``gpm``;
  its ``busy`` / ``no_permission`` apply to its instances too); an instance
  without it gets ``NOT_SUPPORTED`` for every metric.
* ``power_limits`` (milliwatts) answer ``nvmlDeviceGetPowerManagementLimit``
  (``current``), ``nvmlDeviceGetEnforcedPowerLimit``,
  ``nvmlDeviceGetPowerManagementDefaultLimit`` and, when both ``min`` and
  ``max`` are given, ``nvmlDeviceGetPowerManagementLimitConstraints``;
  ``performance_state`` answers ``nvmlDeviceGetPerformanceState``;
  ``max_clocks`` answers ``nvmlDeviceGetMaxClockInfo`` per clock type, as
  ``clocks`` does ``nvmlDeviceGetClockInfo``.
* ``pcie``: ``generation`` / ``max_generation`` / ``width`` / ``max_width``
  answer ``nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}``, and
  ``tx_throughput`` / ``rx_throughput`` (KB/s) ``nvmlDeviceGetPcieThroughput``.
* ``violations``: ``nvmlDeviceGetViolationStatus`` for each
  ``NVML_PERF_POLICY_*`` (lower-case, ``low_utilization`` for LOW_UTILIZATION):
  ``violationTime`` in ns; ``referenceTime`` is a microsecond timestamp
  advancing ten seconds per sample.
* ``row_remap_histogram``: ``nvmlDeviceGetRowRemapperHistogram``, memory banks
  per spare-row availability; a bucket not listed is 0.
* ``nvlink``: the GPU's NVLink links, link id = position in ``links`` (at most
  ``NVML_NVLINK_MAX_LINKS``). ``nvmlDeviceGetNvLinkState`` answers 1 for an
  ``active`` link (the default) until its ``down_after`` sample, 0 after it or
  for ``state: inactive``, and ``INVALID_ARGUMENT`` past the last link; without
  ``nvlink`` it answers ``NOT_SUPPORTED``. Each link's counters (KiB for
  ``tx`` / ``rx``, absent: 0) answer the fields NVLINK_THROUGHPUT_DATA_TX / _RX
  at that link's scope, and their sum over every link at scope UINT_MAX (unless
  ``all_links_scope: false``: then ``INVALID_ARGUMENT``, as on drivers without
  it); a scope past the last link is ``INVALID_ARGUMENT``. The error counters
  answer NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL (all
  links summed, scope unused) and ``nvmlDeviceGetNvLinkErrorCounter`` per link.
  These fields cannot also be listed in ``fields``.
* ``uuid``, ``pci_bus_id``, ``serial`` and ``minor_number`` (and MIG
  ``uuid``) are not allowed with ``count`` > 1. UUIDs and bus ids must be
  unique.
* ``node``: what :mod:`otel_gpu.sim.node` writes under a directory for process
  usage: ``proc/<pid>/cgroup`` for every pid listed (a pod's containers, in the
  cgroup layout of ``cgroup`` / ``driver`` / ``runtime``, set for the node and
  overridable per container; ``host_pids`` under ``/system.slice``), and the
  kubelet's ``var/log/pods/<namespace>_<name>_<uid>/<container>/0.log`` and
  ``var/log/containers/<name>_<namespace>_<container>-<id>.log`` (a relative
  link to the former). Names are lowercase DNS names; ``uid`` is a UUID (or 32
  hex digits, as a static pod's); ``id`` is 64 lowercase hex digits (default:
  derived from the uid and container name). Pids, uids, container ids and
  (namespace, name) pairs must be unique. A device process whose pid the node
  does not list has no ``/proc`` entry, like one that exited.

VALUE is a number (constant); ``{start: S, step: D, per_device: P}`` (only
``start`` required), worth ``S + P*k + D*max(n-1, 0)`` at sample n for the
k-th GPU of its ``count`` entry; or a list, worth element ``max(n-1, 0) %
len``. Integers stay integers; where NVML reports an unsigned integer the
value is truncated and clamped to the type's range.

Any unknown key, wrong type, duplicate UUID or bus id, unknown error, field
or function name raises :class:`ScenarioError` naming the file and key path.
"""

from __future__ import annotations

import hashlib
import re
import uuid as uuidlib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import pynvml

from otel_gpu._files import FileError, parse_yaml, read_text
from otel_gpu.errors import SetupError

Number = int | float

PROFILES_DIR = Path(__file__).with_name("profiles")
MAX_MIG_DEVICES = 7
MAX_GPUS = 512
"""GPUs in one scenario, ``count`` included: more than any real node has (the
benchmark's largest node), and few enough to keep a scenario's memory small."""
MAX_SLOW_SECONDS = 3600.0
NOT_AVAILABLE_ID = 0xFFFFFFFF
"""What NVML puts in a GPU/compute instance id that does not apply."""

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
NOT_AVAILABLE = 0x7FFF0001
"""Not an NVML code: the fault a device's ``not_available`` injects (SUCCESS, all ones)."""
_UUID_NAMESPACE = uuidlib.UUID("6f8c5b4e-2d1a-4e3b-9c7d-0a1b2c3d4e5f")

SYSTEM_SYMBOLS = frozenset({
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlEventSetCreate",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
})
"""Symbols the top-level ``errors`` may name."""

MIG_SYMBOLS = frozenset({
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
})
"""Device symbols that answer on a MIG handle; the others are NOT_SUPPORTED there."""

DEVICE_SYMBOLS = MIG_SYMBOLS | frozenset({
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetRowRemapperHistogram",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
})
"""Symbols a device's ``unsupported`` / ``no_permission`` / ``errors`` / ``slow`` may name.

These are the built-in driver's; a ``FakeNvml`` subclass that adds device
symbols passes its own set to :func:`load_scenario` as ``device_symbols``.
"""

CLOCKS = {
    "graphics": pynvml.NVML_CLOCK_GRAPHICS,
    "sm": pynvml.NVML_CLOCK_SM,
    "memory": pynvml.NVML_CLOCK_MEM,
    "video": pynvml.NVML_CLOCK_VIDEO,
}
"""Scenario ``clocks`` keys and the NVML clock type each one answers for."""


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


class ScenarioError(SetupError):
    """A scenario that cannot be loaded; ``str()`` is one line naming the file and key."""


# --- scenario model -------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """A number that may change from sample to sample and differ between GPUs."""

    start: Number = 0
    step: Number = 0
    per_device: Number = 0
    cycle: tuple[Number, ...] = ()

    def at(self, sample: int, k: int = 0) -> Number:
        """The value at ``sample`` for the ``k``-th GPU of its entry."""
        n = max(sample - 1, 0)
        if self.cycle:
            return self.cycle[n % len(self.cycle)]
        return self.start + self.per_device * k + self.step * n


@dataclass(frozen=True)
class Memory:
    total: int
    used: Value = Value()
    reserved: Value = Value()

    def at(self, sample: int, k: int = 0) -> tuple[int, int, int, int]:
        """``(total, reserved, used, free)`` in bytes, consistent with each other."""
        used = min(clamp(self.used.at(sample, k), self.total), self.total)
        reserved = min(clamp(self.reserved.at(sample, k), self.total), self.total - used)
        return self.total, reserved, used, self.total - used - reserved


@dataclass(frozen=True)
class Process:
    pid: int
    used_memory: Value | None = None
    from_sample: int = 0
    until_sample: int | None = None
    sm: Value | None = None
    memory_util: Value | None = None
    encoder: Value | None = None
    decoder: Value | None = None

    @property
    def utilization(self) -> tuple[Value | None, Value | None, Value | None, Value | None]:
        """(sm, memory_util, encoder, decoder): all ``None`` for a process never busy."""
        return self.sm, self.memory_util, self.encoder, self.decoder

    def listed_at(self, sample: int) -> bool:
        return sample >= self.from_sample and (
            self.until_sample is None or sample <= self.until_sample
        )


@dataclass(frozen=True)
class Faults:
    """Injected return codes: per C symbol (whole call) and per field id (one entry)."""

    calls: Mapping[str, int] = field(default_factory=_empty)
    fields: Mapping[int, int] = field(default_factory=_empty)


@dataclass(frozen=True)
class Slow:
    function: str
    seconds: float
    after: int = 0


@dataclass(frozen=True)
class Xid:
    sample: int
    code: int
    gpu_instance_id: int = NOT_AVAILABLE_ID
    compute_instance_id: int = NOT_AVAILABLE_ID


@dataclass(frozen=True)
class Gpm:
    """A device's GPM answers: metric id -> VALUE in NVML's unit, and its faults."""

    metrics: Mapping[int, Value] = field(default_factory=_empty)
    unsupported: bool = False
    no_permission: bool = False
    busy: tuple[int, int | None] | None = None
    """``(from_sample, until_sample)``, inclusive: sample calls answer IN_USE then."""

    def busy_at(self, sample: int) -> bool:
        if self.busy is None:
            return False
        start, end = self.busy
        return sample >= start and (end is None or sample <= end)


@dataclass(frozen=True)
class MigSpec:
    slot: int
    profile: str
    name: str
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    memory: Memory | None = None
    processes: tuple[Process, ...] = ()
    faults: Faults = Faults()
    from_sample: int = 0
    until_sample: int | None = None
    gpm: Gpm | None = None
    gi_profile_id: int | None = None
    """``None``: derived from ``profile`` (see ``sim.driver.mig``)."""
    placement_start: int | None = None
    """``None``: after the instances in the slots before it."""

    def exists_at(self, sample: int) -> bool:
        """Whether the instance exists during sample ``sample`` (a re-layout moves it)."""
        return sample >= self.from_sample and (
            self.until_sample is None or sample <= self.until_sample)


POWER_LIMITS = ("current", "enforced", "default", "min", "max")
"""Scenario ``power_limits`` keys."""
PCIE_KEYS = ("generation", "max_generation", "width", "max_width", "tx_throughput",
             "rx_throughput")
"""Scenario ``pcie`` keys."""
VIOLATION_POLICIES = {
    "power": pynvml.NVML_PERF_POLICY_POWER,
    "thermal": pynvml.NVML_PERF_POLICY_THERMAL,
    "sync_boost": pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    "board_limit": pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    "low_utilization": pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    "reliability": pynvml.NVML_PERF_POLICY_RELIABILITY,
}
"""Scenario ``violations`` keys and the NVML policy each one answers for."""
ROW_REMAP_BUCKETS = ("max", "high", "partial", "low", "none")
"""Scenario ``row_remap_histogram`` keys (the struct's fields)."""
NVLINK_COUNTERS = ("tx", "rx", "crc_flit", "crc_data", "replay", "recovery")
"""An NVLink link's counters: data KiB sent and received, and its error counts."""
NVLINK_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx",
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
}
"""The fields ``nvlink`` answers: field id -> the link counter behind it."""


@dataclass(frozen=True)
class NvLinkSpec:
    """One NVLink link: whether it is up, and its counters (absent: 0)."""

    active: bool = True
    down_after: int | None = None
    counters: Mapping[str, Value] = field(default_factory=_empty)

    def active_at(self, sample: int) -> bool:
        return self.active and (self.down_after is None or sample <= self.down_after)

    def counter(self, name: str, sample: int, k: int) -> int:
        value = self.counters.get(name)
        return 0 if value is None else clamp(value.at(sample, k), U64_MAX)


@dataclass(frozen=True)
class NvLinks:
    """A GPU's NVLink links, link id = position."""

    links: tuple[NvLinkSpec, ...] = ()
    all_links_scope: bool = True
    """Whether the field scope UINT_MAX answers the sum over every link."""

    def total(self, name: str, sample: int, k: int) -> int:
        return min(sum(link.counter(name, sample, k) for link in self.links), U64_MAX)


@dataclass(frozen=True)
class GpuSpec:
    """One physical GPU, after ``count`` expansion: ``position`` is its k."""

    index: int
    position: int
    name: str
    uuid: str
    pci_bus_id: str
    minor_number: int
    serial: str
    pci_device_id: int = 0
    numa_node: int | None = None
    memory: Memory | None = None
    utilization: Mapping[str, Value] = field(default_factory=_empty)
    temperature: Value | None = None
    power: Value | None = None
    clocks: Mapping[str, Value] = field(default_factory=_empty)
    clock_event_reasons: Value | None = None
    fan_speed: Value | None = None
    fields: Mapping[int, Value] = field(default_factory=_empty)
    processes: tuple[Process, ...] = ()
    faults: Faults = Faults()
    lost_after: int | None = None
    slow: tuple[Slow, ...] = ()
    xid: tuple[Xid, ...] = ()
    mig_capable: bool = False
    mig: tuple[MigSpec, ...] = ()
    gpm: Gpm | None = None
    power_limits: Mapping[str, Value] = field(default_factory=_empty)
    performance_state: Value | None = None
    max_clocks: Mapping[str, Value] = field(default_factory=_empty)
    pcie: Mapping[str, Value] = field(default_factory=_empty)
    violations: Mapping[str, Value] = field(default_factory=_empty)
    row_remap_histogram: Mapping[str, Value] = field(default_factory=_empty)
    nvlink: NvLinks | None = None

    def lost_at(self, sample: int) -> bool:
        return self.lost_after is not None and sample > self.lost_after


CGROUP_VERSIONS = ("v1", "v2")
CGROUP_DRIVERS = ("systemd", "cgroupfs")
RUNTIMES = ("containerd", "crio", "docker")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


@dataclass(frozen=True)
class ContainerSpec:
    """A container of a fake node's pod: its id, its processes and its cgroup layout."""

    name: str
    id: str
    pids: tuple[int, ...] = ()
    cgroup: str = "v2"
    driver: str = "systemd"
    runtime: str = "containerd"


@dataclass(frozen=True)
class PodSpec:
    namespace: str
    name: str
    uid: str
    qos: str = "burstable"
    containers: tuple[ContainerSpec, ...] = ()


@dataclass(frozen=True)
class NodeSpec:
    """The scenario's ``node``: what :mod:`otel_gpu.sim.node` writes."""

    pods: tuple[PodSpec, ...] = ()
    host_pids: tuple[int, ...] = ()
    cgroup: str = "v2"
    """The node's cgroup version (the host processes' layout)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    driver_version: str = "550.90.07"
    devices: tuple[GpuSpec, ...] = ()
    nvml_version: str = ""
    faults: Faults = Faults()
    """System-level injected errors (top-level ``errors``)."""
    source: str = ""
    """Where it was loaded from: a profile name or the path given."""
    node: NodeSpec | None = None
    """The scenario's ``node`` section, if any."""


# --- loading ----------------------------------------------------------------------------


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_scenario(spec: str, *, device_symbols: Collection[str] = DEVICE_SYMBOLS) -> Scenario:
    """Load a built-in profile by name, or a scenario file by path, validating all of it.

    ``device_symbols`` are the C symbols a device's ``unsupported`` /
    ``no_permission`` / ``errors`` / ``slow`` may name: those of the driver that
    will play the scenario (``MyFake.device_symbols()`` for a subclass).
    """
    spec = str(spec)
    if spec in builtin_profiles():
        path, label = PROFILES_DIR / f"{spec}.yaml", f"{spec}.yaml"
    else:
        path, label = Path(spec), spec
        if not _exists(path):
            raise ScenarioError(
                f"scenario {spec!r}: no such file or built-in profile "
                f"(built-in profiles: {', '.join(builtin_profiles())})"
            )
    # Bounded, regular files only, UTF-8, and YAML without aliases, duplicate keys or
    # deep nesting: a scenario is outside input like any other file.
    try:
        raw = parse_yaml(read_text(str(path), "scenario"), f"scenario {label}: invalid YAML")
    except FileError as exc:
        raise ScenarioError(str(exc)) from None
    scenario = _Parser(label, path.stem, frozenset(device_symbols)).scenario(raw)
    return replace(scenario, source=spec)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _at(path: str, key: Any) -> str:
    """``devices[0].memory`` + ``total``; the top level has no prefix."""
    return f"{path}.{key}" if path else str(key)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _show(value: Any) -> str:
    text = _one_line(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field_id(key: Any) -> int | None:
    """A field's id from its scenario spelling, or None when it names no field."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if not isinstance(key, str) or key == "MAX":
        return None
    for prefix in ("NVML_FI_DEV_", "NVML_FI_"):
        value = getattr(pynvml, prefix + key, None)
        if isinstance(value, int):
            return value
    return None


def _gpm_metric_id(key: Any) -> int | None:
    """A GPM metric's id from its scenario spelling, or None when it names no metric."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if 0 < key < pynvml.NVML_GPM_METRIC_MAX else None
    if not isinstance(key, str) or key == "MAX":
        return None
    value = getattr(pynvml, "NVML_GPM_METRIC_" + key, None)
    return value if isinstance(value, int) else None


def _error_code(name: Any) -> int | None:
    if not isinstance(name, str):
        return None
    value = getattr(pynvml, "NVML_ERROR_" + name, None)
    return value if isinstance(value, int) else None


_PROCESS_SHARES = ("sm", "memory_util", "encoder", "decoder")
"""Scenario keys of a process's utilization samples, in percent."""
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_POD_UID = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                      r"|[0-9a-f]{32})$")
_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")

_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{8})|([0-9A-Fa-f]{4})):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})"
                     r"\.([0-7])$")


class _Parser:
    """Turns the YAML tree into a :class:`Scenario`, failing on the first problem."""

    _TOP = ("name", "driver_version", "nvml_version", "errors", "devices", "node")
    _GPU = ("name", "count", "uuid", "pci_bus_id", "pci_device_id", "minor_number", "serial",
            "numa_node", "memory", "utilization", "temperature", "power", "clocks",
            "clock_event_reasons", "fan_speed", "fields", "processes", "unsupported",
            "no_permission", "errors", "lost_after", "slow", "xid", "mig_capable", "mig", "gpm",
            "power_limits", "performance_state", "max_clocks", "pcie", "violations",
            "row_remap_histogram", "nvlink", "not_available")
    _MIG = ("profile", "gpu_instance_id", "compute_instance_id", "uuid", "memory", "processes",
            "unsupported", "no_permission", "errors", "from_sample", "until_sample", "gpm",
            "gi_profile_id", "placement_start")
    _ONLY_SINGLE = ("uuid", "pci_bus_id", "serial", "minor_number")

    def __init__(self, label: str, default_name: str,
                 device_symbols: frozenset[str] = DEVICE_SYMBOLS) -> None:
        self.label = label
        self.default_name = default_name
        self.device_symbols = device_symbols
        self.uuids: dict[str, str] = {}
        self.bus_ids: dict[str, str] = {}

    def fail(self, path: str, message: str) -> NoReturn:
        raise ScenarioError(f"scenario {self.label}: {path}: {message}")

    # basic types

    def mapping(self, path: str, raw: Any, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict:
        if not isinstance(raw, dict):
            self.fail(path or "top level", f"expected a mapping, got {_show(raw)}")
        for key in raw:
            if key not in allowed:
                self.fail(_at(path, key), f"unknown key (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in raw:
                self.fail(path or "top level", f"missing required key {key!r}")
        return raw

    def sequence(self, path: str, raw: Any) -> list:
        if not isinstance(raw, list):
            self.fail(path, f"expected a list, got {_show(raw)}")
        return raw

    def integer(self, path: str, raw: Any, minimum: int = 0, maximum: int | None = None) -> int:
        ok = isinstance(raw, int) and not isinstance(raw, bool) and raw >= minimum
        if ok and maximum is not None and raw > maximum:
            ok = False
        if not ok:
            what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
            if maximum is not None:
                what = f"an integer from {minimum} to {maximum}"
            self.fail(path, f"expected {what}, got {_show(raw)}")
        if raw > U64_MAX:
            self.fail(path, f"expected an integer no larger than {U64_MAX}, got {_show(raw)}")
        return raw

    def number(self, path: str, raw: Any, minimum: float | None = 0,
               maximum: float = U64_MAX) -> Number:
        if not _is_number(raw) or (minimum is not None and raw < minimum):
            what = "a number" if minimum is None else "a non-negative number"
            self.fail(path, f"expected {what}, got {_show(raw)}")
        if not -U64_MAX <= raw <= maximum:  # also false for NaN
            limit = "2^64-1" if maximum == U64_MAX else f"{maximum:g}"
            self.fail(path, f"expected a finite number no larger than {limit} in size, "
                            f"got {_show(raw)}")
        return raw

    def string(self, path: str, raw: Any, hint: str = "") -> str:
        if not isinstance(raw, str) or not raw:
            self.fail(path, f"expected a non-empty string{hint}, got {_show(raw)}")
        return raw

    def boolean(self, path: str, raw: Any) -> bool:
        if not isinstance(raw, bool):
            self.fail(path, f"expected true or false, got {_show(raw)}")
        return raw

    def value(self, path: str, raw: Any) -> Value:
        if _is_number(raw):
            return Value(start=self.number(path, raw))
        if isinstance(raw, list):
            if not raw:
                self.fail(path, "expected a non-empty list of numbers")
            return Value(cycle=tuple(self.number(f"{path}[{i}]", v) for i, v in enumerate(raw)))
        if isinstance(raw, dict):
            self.mapping(path, raw, ("start", "step", "per_device"), required=("start",))
            return Value(
                start=self.number(f"{path}.start", raw["start"]),
                step=self.number(f"{path}.step", raw.get("step", 0), minimum=None),
                per_device=self.number(f"{path}.per_device", raw.get("per_device", 0)),
            )
        self.fail(path, "expected a number, a list of numbers or {start, step, per_device}, "
                        f"got {_show(raw)}")

    def opt_value(self, path: str, raw: Mapping, key: str) -> Value | None:
        return self.value(f"{path}.{key}", raw[key]) if key in raw else None

    def values(self, path: str, raw: Any, allowed: tuple[str, ...]) -> Mapping[str, Value]:
        self.mapping(path, raw, allowed)
        return MappingProxyType({k: self.value(f"{path}.{k}", v) for k, v in raw.items()})

    # composite parts

    def memory(self, path: str, raw: Any) -> Memory:
        self.mapping(path, raw, ("total", "used", "reserved"), required=("total",))
        return Memory(
            total=self.integer(f"{path}.total", raw["total"]),
            used=self.value(f"{path}.used", raw.get("used", 0)),
            reserved=self.value(f"{path}.reserved", raw.get("reserved", 0)),
        )

    def fields(self, path: str, raw: Any) -> Mapping[int, Value]:
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping of field name to value, got {_show(raw)}")
        out: dict[int, Value] = {}
        for key, value in raw.items():
            fid = _field_id(key)
            if fid is None:
                self.fail(f"{path}.{key}", "unknown NVML field (expected a pynvml "
                                           "NVML_FI_DEV_<NAME> without the prefix, or an id)")
            if fid in out:
                self.fail(f"{path}.{key}", f"field id {fid} is listed twice")
            out[fid] = self.value(f"{path}.{key}", value)
        return MappingProxyType(out)

    def processes(self, path: str, raw: Any, count: int,
                  utilization: bool = True) -> list[tuple[Process, tuple | None]]:
        out = []
        for i, item in enumerate(self.sequence(path, raw)):
            p = f"{path}[{i}]"
            shares = _PROCESS_SHARES if utilization else ()
            allowed = ("pid", "used_memory", "from_sample", "until_sample", *shares, "positions")
            if not utilization and isinstance(item, dict):
                for key in _PROCESS_SHARES:
                    if key in item:
                        self.fail(f"{p}.{key}", "NVML has no per-process utilization on MIG "
                                                "instances (only used_memory)")
            self.mapping(p, item, allowed if count else allowed[:-1], required=("pid",))
            positions = None
            if "positions" in item:
                positions = tuple(
                    self.integer(f"{p}.positions[{j}]", v, 0, count - 1)
                    for j, v in enumerate(self.sequence(f"{p}.positions", item["positions"]))
                )
            until = item.get("until_sample")
            proc = Process(
                pid=self.integer(f"{p}.pid", item["pid"], minimum=1, maximum=U32_MAX),
                used_memory=self.opt_value(p, item, "used_memory"),
                from_sample=self.integer(f"{p}.from_sample", item.get("from_sample", 0)),
                until_sample=None if until is None else self.integer(f"{p}.until_sample", until),
                **{key: self.opt_value(p, item, key) for key in shares},
            )
            out.append((proc, positions))
        return out

    def faults(self, path: str, raw: Mapping, symbols: frozenset[str],
               allow_fields: bool) -> Faults:
        calls: dict[str, int] = {}
        fields: dict[int, int] = {}
        where: dict[Any, str] = {}

        def add(p: str, target: Any, code: int) -> None:
            if isinstance(target, str) and target in symbols:
                key: Any = target
                bucket: dict = calls
            else:
                key = _field_id(target) if allow_fields else None
                bucket = fields
                if key is None:
                    known = "NVML function or field" if allow_fields else "NVML function"
                    self.fail(p, f"unknown {known} {_show(target)}")
            if key in where:
                self.fail(p, f"{_show(target)} is also listed at {where[key]}")
            where[key] = p
            bucket[key] = code

        for key, code in (("unsupported", pynvml.NVML_ERROR_NOT_SUPPORTED),
                          ("no_permission", pynvml.NVML_ERROR_NO_PERMISSION),
                          ("not_available", NOT_AVAILABLE)):
            for i, target in enumerate(self.sequence(_at(path, key), raw.get(key, []))):
                add(f"{_at(path, key)}[{i}]", target, code)
        errors = raw.get("errors", {})
        if not isinstance(errors, dict):
            self.fail(_at(path, "errors"), f"expected a mapping of function to error name, "
                                           f"got {_show(errors)}")
        for target, name in errors.items():
            p = _at(_at(path, "errors"), target)
            code = _error_code(name)
            if code is None:
                self.fail(p, f"unknown NVML error {_show(name)} (expected an NVML_ERROR_ name "
                             "without the prefix, e.g. UNKNOWN, GPU_IS_LOST)")
            add(p, target, code)
        return Faults(MappingProxyType(calls), MappingProxyType(fields))

    def uuid(self, path: str, raw: Any, prefix: str) -> str:
        text = self.string(path, raw)
        if not text.startswith(prefix) or len(text) >= pynvml.NVML_DEVICE_UUID_V2_BUFFER_SIZE:
            self.fail(path, f"expected a UUID starting with {prefix!r}, got {_show(raw)}")
        return self.claim_uuid(path, text)

    def claim_uuid(self, path: str, text: str) -> str:
        if text in self.uuids:
            self.fail(path, f"duplicate uuid {text!r} (also used by {self.uuids[text]})")
        self.uuids[text] = path
        return text

    def bus_id(self, path: str, raw: Any) -> str:
        hint = " like '00000000:18:00.0' (quote it in YAML)"
        match = _BUS_ID.match(raw) if isinstance(raw, str) else None
        if match is None:
            self.fail(path, f"expected a PCI bus id{hint}, got {_show(raw)}")
        domain = match.group(1) or "0000" + match.group(2)
        text = f"{domain}:{match.group(3)}:{match.group(4)}.{match.group(5)}".upper()
        if text in self.bus_ids:
            self.fail(path, f"duplicate PCI bus id {text!r} (also used by {self.bus_ids[text]})")
        self.bus_ids[text] = path
        return text

    # the tree

    def scenario(self, raw: Any) -> Scenario:
        top = self.mapping("", raw, self._TOP, required=("devices",))
        name = self.string("name", top["name"]) if "name" in top else self.default_name
        driver = self.string("driver_version", top.get("driver_version", "550.90.07"),
                             " (quote it in YAML)")
        nvml = self.string("nvml_version", top.get("nvml_version", f"12.{driver}"),
                           " (quote it in YAML)")
        faults = self.faults("", {"errors": top.get("errors", {})},
                             SYSTEM_SYMBOLS, allow_fields=False)
        entries = self.sequence("devices", top["devices"])
        pending: list[tuple[str, GpuSpec, dict]] = []
        index = 0
        for i, entry in enumerate(entries):
            for gpu, explicit in self.gpu_entry(f"devices[{i}]", entry, index):
                pending.append((f"devices[{i}]", gpu, explicit))
                index += 1
        devices = tuple(self.identify(name, path, gpu, explicit) for path, gpu, explicit in pending)
        node = self.node("node", top["node"], name) if "node" in top else None
        return Scenario(name=name, driver_version=driver, devices=devices, nvml_version=nvml,
                        faults=faults, node=node)

    def gpu_entry(self, path: str, raw: Any, first_index: int) -> Iterator[tuple[GpuSpec, dict]]:
        self.mapping(path, raw, self._GPU, required=("name",))
        count = self.integer(f"{path}.count", raw.get("count", 1), minimum=1)
        if first_index + count > MAX_GPUS:
            self.fail(f"{path}.count" if "count" in raw else path,
                      f"at most {MAX_GPUS} GPUs in a scenario ({first_index} before this entry, "
                      f"{count} in it)")
        if count > 1:
            for key in self._ONLY_SINGLE:
                if key in raw:
                    self.fail(f"{path}.{key}", "not allowed with count > 1 (each GPU needs "
                                               "its own: write separate entries)")
        name = self.string(f"{path}.name", raw["name"])
        explicit: dict[str, Any] = {}
        if "uuid" in raw:
            explicit["uuid"] = self.uuid(f"{path}.uuid", raw["uuid"], "GPU-")
        if "pci_bus_id" in raw:
            explicit["pci_bus_id"] = self.bus_id(f"{path}.pci_bus_id", raw["pci_bus_id"])
        if "serial" in raw:
            serial = raw["serial"]
            if isinstance(serial, int) and not isinstance(serial, bool) and serial >= 0:
                serial = str(serial)
            explicit["serial"] = self.string(f"{path}.serial", serial)
        if "minor_number" in raw:
            explicit["minor_number"] = self.integer(f"{path}.minor_number", raw["minor_number"])
        mig_capable = raw.get("mig_capable")
        if mig_capable is not None:
            self.boolean(f"{path}.mig_capable", mig_capable)
        mig_raw = self.sequence(f"{path}.mig", raw.get("mig", []))
        if mig_raw and mig_capable is False:
            self.fail(f"{path}.mig", "MIG instances on a GPU with mig_capable: false")
        if len(mig_raw) > MAX_MIG_DEVICES:
            self.fail(f"{path}.mig", f"at most {MAX_MIG_DEVICES} MIG instances per GPU")
        if count > 1:
            for j, item in enumerate(mig_raw):
                if isinstance(item, dict) and "uuid" in item:
                    self.fail(f"{path}.mig[{j}].uuid", "not allowed with count > 1")
        processes = self.processes(f"{path}.processes", raw.get("processes", []), count)
        base = GpuSpec(
            index=0, position=0, name=name, uuid="", pci_bus_id="", minor_number=0, serial="",
            pci_device_id=self.integer(f"{path}.pci_device_id", raw.get("pci_device_id", 0),
                                       maximum=U32_MAX),
            numa_node=(self.integer(f"{path}.numa_node", raw["numa_node"])
                       if "numa_node" in raw else None),
            memory=self.memory(f"{path}.memory", raw["memory"]) if "memory" in raw else None,
            utilization=self.values(f"{path}.utilization", raw.get("utilization", {}),
                                    ("gpu", "memory", "encoder", "decoder")),
            temperature=self.opt_value(path, raw, "temperature"),
            power=self.opt_value(path, raw, "power"),
            clocks=self.values(f"{path}.clocks", raw.get("clocks", {}), tuple(CLOCKS)),
            clock_event_reasons=self.opt_value(path, raw, "clock_event_reasons"),
            fan_speed=self.opt_value(path, raw, "fan_speed"),
            fields=self.fields(f"{path}.fields", raw.get("fields", {})),
            faults=self.faults(path, raw, self.device_symbols, allow_fields=True),
            lost_after=(self.integer(f"{path}.lost_after", raw["lost_after"])
                        if "lost_after" in raw else None),
            slow=self.slow(f"{path}.slow", raw.get("slow", [])),
            xid=self.xid(f"{path}.xid", raw.get("xid", [])),
            mig_capable=bool(mig_capable) or bool(mig_raw),
            gpm=self.gpm(f"{path}.gpm", raw["gpm"]) if "gpm" in raw else None,
            power_limits=self.values(f"{path}.power_limits", raw.get("power_limits", {}),
                                     POWER_LIMITS),
            performance_state=self.opt_value(path, raw, "performance_state"),
            max_clocks=self.values(f"{path}.max_clocks", raw.get("max_clocks", {}),
                                   tuple(CLOCKS)),
            pcie=self.values(f"{path}.pcie", raw.get("pcie", {}), PCIE_KEYS),
            violations=self.values(f"{path}.violations", raw.get("violations", {}),
                                   tuple(VIOLATION_POLICIES)),
            row_remap_histogram=self.values(f"{path}.row_remap_histogram",
                                            raw.get("row_remap_histogram", {}),
                                            ROW_REMAP_BUCKETS),
            nvlink=self.nvlink(f"{path}.nvlink", raw["nvlink"], raw.get("fields", {}))
            if "nvlink" in raw else None,
        )
        for k in range(count):
            gpu = replace(
                base,
                index=first_index + k,
                position=k,
                processes=tuple(p for p, pos in processes if pos is None or k in pos),
            )
            yield gpu, {**explicit, "mig": mig_raw}

    # the node's /proc and kubelet log trees

    def choice(self, path: str, raw: Any, allowed: tuple[str, ...]) -> str:
        if raw not in allowed:
            self.fail(path, f"expected one of {', '.join(allowed)}, got {_show(raw)}")
        return raw

    def k8s_name(self, path: str, raw: Any) -> str:
        text = self.string(path, raw)
        if len(text) > 253 or not _K8S_NAME.match(text):
            self.fail(path, f"expected a lowercase DNS name (a-z, 0-9, '-', '.'), "
                            f"got {_show(raw)}")
        return text

    def node(self, path: str, raw: Any, scenario: str) -> NodeSpec:
        self.mapping(path, raw, ("cgroup", "driver", "runtime", "host_pids", "pods"))
        layout = {
            "cgroup": self.choice(f"{path}.cgroup", raw.get("cgroup", "v2"), CGROUP_VERSIONS),
            "driver": self.choice(f"{path}.driver", raw.get("driver", "systemd"),
                                  CGROUP_DRIVERS),
            "runtime": self.choice(f"{path}.runtime", raw.get("runtime", "containerd"),
                                   RUNTIMES),
        }
        pids: dict[int, str] = {}

        def claim_pids(p: str, items: Any) -> tuple[int, ...]:
            out = []
            for j, v in enumerate(self.sequence(p, items)):
                pid = self.integer(f"{p}[{j}]", v, minimum=1, maximum=U32_MAX)
                if pid in pids:
                    self.fail(f"{p}[{j}]", f"pid {pid} is also listed at {pids[pid]}")
                pids[pid] = f"{p}[{j}]"
                out.append(pid)
            return tuple(out)

        host = claim_pids(f"{path}.host_pids", raw.get("host_pids", []))
        pods: list[PodSpec] = []
        seen: dict[Any, str] = {}

        def unique(p: str, key: Any, what: str) -> None:
            if key in seen:
                self.fail(p, f"duplicate {what} (also {seen[key]})")
            seen[key] = p

        for i, item in enumerate(self.sequence(f"{path}.pods", raw.get("pods", []))):
            p = f"{path}.pods[{i}]"
            self.mapping(p, item, ("namespace", "name", "uid", "qos", "containers"),
                         required=("namespace", "name"))
            namespace = self.k8s_name(f"{p}.namespace", item["namespace"])
            name = self.k8s_name(f"{p}.name", item["name"])
            unique(p, ("pod", namespace, name), f"pod {namespace}/{name}")
            if "uid" in item:
                uid = self.string(f"{p}.uid", item["uid"])
                if not _POD_UID.match(uid):
                    self.fail(f"{p}.uid", f"expected a pod UID (a lowercase UUID, or 32 hex "
                                          f"digits for a static pod), got {_show(uid)}")
            else:
                uid = str(uuidlib.uuid5(_UUID_NAMESPACE, f"{scenario}/{namespace}/{name}"))
            unique(f"{p}.uid", ("uid", uid), f"pod uid {uid}")
            containers = []
            for j, c in enumerate(self.sequence(f"{p}.containers", item.get("containers", []))):
                cp = f"{p}.containers[{j}]"
                self.mapping(cp, c, ("name", "id", "pids", *layout), required=("name",))
                cname = self.k8s_name(f"{cp}.name", c["name"])
                unique(cp, ("container", uid, cname), f"container {cname}")
                if "id" in c:
                    cid = self.string(f"{cp}.id", c["id"])
                    if not _CONTAINER_ID.match(cid):
                        self.fail(f"{cp}.id", f"expected 64 lowercase hex digits, got {_show(cid)}")
                else:
                    cid = hashlib.sha256(f"{uid}/{cname}".encode()).hexdigest()
                unique(f"{cp}.id", ("id", cid), f"container id {cid}")
                containers.append(ContainerSpec(
                    name=cname, id=cid, pids=claim_pids(f"{cp}.pids", c.get("pids", [])),
                    cgroup=self.choice(f"{cp}.cgroup", c.get("cgroup", layout["cgroup"]),
                                       CGROUP_VERSIONS),
                    driver=self.choice(f"{cp}.driver", c.get("driver", layout["driver"]),
                                       CGROUP_DRIVERS),
                    runtime=self.choice(f"{cp}.runtime", c.get("runtime", layout["runtime"]),
                                        RUNTIMES),
                ))
            pods.append(PodSpec(namespace, name, uid,
                                self.choice(f"{p}.qos", item.get("qos", "burstable"), QOS_CLASSES),
                                tuple(containers)))
        return NodeSpec(tuple(pods), host, layout["cgroup"])

    def nvlink(self, path: str, raw: Any, fields: Any) -> NvLinks:
        self.mapping(path, raw, ("links", "all_links_scope"), required=("links",))
        for key in fields if isinstance(fields, dict) else ():
            if _field_id(key) in NVLINK_FIELDS:
                self.fail(f"{path[:-len('.nvlink')]}.fields.{key}",
                          "an NVLink field is given per link, in nvlink.links")
        items = self.sequence(f"{path}.links", raw["links"])
        if len(items) > pynvml.NVML_NVLINK_MAX_LINKS:
            self.fail(f"{path}.links", f"at most {pynvml.NVML_NVLINK_MAX_LINKS} links")
        links = []
        for i, item in enumerate(items):
            p = f"{path}.links[{i}]"
            self.mapping(p, item, ("state", "down_after", *NVLINK_COUNTERS))
            state = item.get("state", "active")
            if state not in ("active", "inactive"):
                self.fail(f"{p}.state", f"expected active or inactive, got {_show(state)}")
            links.append(NvLinkSpec(
                active=state == "active",
                down_after=(self.integer(f"{p}.down_after", item["down_after"])
                            if "down_after" in item else None),
                counters=MappingProxyType({k: self.value(f"{p}.{k}", item[k])
                                           for k in NVLINK_COUNTERS if k in item}),
            ))
        return NvLinks(
            links=tuple(links),
            all_links_scope=self.boolean(f"{path}.all_links_scope",
                                         raw.get("all_links_scope", True)),
        )

    def gpm(self, path: str, raw: Any, mig: bool = False) -> Gpm:
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping of GPM metric name to value, got {_show(raw)}")
        flags = ("no_permission", "busy") if mig else ("unsupported", "no_permission", "busy")
        metrics: dict[int, Value] = {}
        for key, value in raw.items():
            p = f"{path}.{key}"
            if key in flags:
                continue
            metric = _gpm_metric_id(key)
            if metric is None:
                self.fail(p, "unknown key (expected a pynvml NVML_GPM_METRIC_<NAME> without the "
                             f"prefix, an id, or one of: {', '.join(flags)})")
            if metric in metrics:
                self.fail(p, f"GPM metric {metric} is listed twice")
            metrics[metric] = self.value(p, value)
        busy: tuple[int, int | None] | None = None
        raw_busy = raw.get("busy", False)
        if isinstance(raw_busy, dict):
            self.mapping(f"{path}.busy", raw_busy, ("from_sample", "until_sample"))
            until = raw_busy.get("until_sample")
            busy = (self.integer(f"{path}.busy.from_sample", raw_busy.get("from_sample", 0)),
                    None if until is None else self.integer(f"{path}.busy.until_sample", until))
        elif self.boolean(f"{path}.busy", raw_busy):
            busy = (0, None)
        return Gpm(
            metrics=MappingProxyType(metrics),
            unsupported=self.boolean(f"{path}.unsupported", raw.get("unsupported", False)),
            no_permission=self.boolean(f"{path}.no_permission", raw.get("no_permission", False)),
            busy=busy,
        )

    def slow(self, path: str, raw: Any) -> tuple[Slow, ...]:
        out = []
        for i, item in enumerate(self.sequence(path, raw)):
            p = f"{path}[{i}]"
            self.mapping(p, item, ("function", "seconds", "after"),
                         required=("function", "seconds"))
            function = item["function"]
            if function not in self.device_symbols:
                self.fail(f"{p}.function", f"unknown NVML device function {_show(function)}")
            seconds = self.number(f"{p}.seconds", item["seconds"], maximum=MAX_SLOW_SECONDS)
            out.append(Slow(function, float(seconds),
                            self.integer(f"{p}.after", item.get("after", 0))))
        return tuple(out)

    def xid(self, path: str, raw: Any) -> tuple[Xid, ...]:
        out = []
        for i, item in enumerate(self.sequence(path, raw)):
            p = f"{path}[{i}]"
            self.mapping(p, item, ("sample", "code", "gpu_instance_id", "compute_instance_id"),
                         required=("sample", "code"))
            out.append(Xid(
                sample=self.integer(f"{p}.sample", item["sample"]),
                code=self.integer(f"{p}.code", item["code"]),
                gpu_instance_id=self.integer(f"{p}.gpu_instance_id",
                                             item.get("gpu_instance_id", NOT_AVAILABLE_ID),
                                             maximum=U32_MAX),
                compute_instance_id=self.integer(f"{p}.compute_instance_id",
                                                 item.get("compute_instance_id", NOT_AVAILABLE_ID),
                                                 maximum=U32_MAX),
            ))
        return tuple(sorted(out, key=lambda x: x.sample))

    def identify(self, scenario: str, path: str, gpu: GpuSpec, explicit: dict) -> GpuSpec:
        """Give a GPU its identity, generating what the entry left out, and its MIG instances."""
        index = gpu.index
        uuid = explicit.get("uuid") or self.claim_uuid(
            f"{path} (generated for GPU {index})", _make_uuid("GPU-", scenario, index))
        bus = explicit.get("pci_bus_id") or self.free_bus_id(f"{path} (generated)")
        mig = tuple(
            self.mig(f"{path}.mig[{j}]", item, j, scenario, gpu, uuid)
            for j, item in enumerate(explicit["mig"])
        )
        seen: dict[tuple[int, int], int] = {}
        for m in mig:
            ids = (m.gpu_instance_id, m.compute_instance_id)
            if ids in seen:
                self.fail(f"{path}.mig[{m.slot}]", f"duplicate (gpu_instance_id, "
                                                    f"compute_instance_id) {ids} "
                                                    f"(also {path}.mig[{seen[ids]}])")
            seen[ids] = m.slot
        return replace(
            gpu,
            uuid=uuid,
            pci_bus_id=bus,
            minor_number=explicit.get("minor_number", index),
            serial=explicit.get("serial", str(1650000000000 + index)),
            mig=mig,
        )

    def free_bus_id(self, owner: str) -> str:
        for n in range(1, 0x10000 * 0x100):
            text = f"{n // 0x100:08X}:{n % 0x100:02X}:00.0"
            if text not in self.bus_ids:
                self.bus_ids[text] = owner
                return text
        raise AssertionError("no free PCI bus id")  # pragma: no cover

    def mig(self, path: str, raw: Any, slot: int, scenario: str, gpu: GpuSpec,
            parent_uuid: str) -> MigSpec:
        self.mapping(path, raw, self._MIG, required=("profile", "gpu_instance_id"))
        profile = self.string(f"{path}.profile", raw["profile"])
        if "uuid" in raw:
            uuid = self.uuid(f"{path}.uuid", raw["uuid"], "MIG-")
        else:
            uuid = self.claim_uuid(f"{path} (generated)",
                                   _make_uuid("MIG-", scenario, gpu.index, slot))
        return MigSpec(
            slot=slot,
            profile=profile,
            name=f"{gpu.name} MIG {profile}",
            uuid=uuid,
            gpu_instance_id=self.integer(f"{path}.gpu_instance_id", raw["gpu_instance_id"]),
            gi_profile_id=(self.integer(f"{path}.gi_profile_id", raw["gi_profile_id"],
                                        maximum=U32_MAX)
                           if "gi_profile_id" in raw else None),
            placement_start=(self.integer(f"{path}.placement_start",
                                          raw["placement_start"], maximum=U32_MAX)
                             if "placement_start" in raw else None),
            compute_instance_id=self.integer(f"{path}.compute_instance_id",
                                             raw.get("compute_instance_id", 0)),
            memory=self.memory(f"{path}.memory", raw["memory"]) if "memory" in raw else None,
            processes=tuple(p for p, _ in self.processes(f"{path}.processes",
                                                          raw.get("processes", []), 0,
                                                          utilization=False)),
            faults=self.faults(path, raw, MIG_SYMBOLS, allow_fields=False),
            from_sample=self.integer(f"{path}.from_sample", raw.get("from_sample", 0)),
            until_sample=(self.integer(f"{path}.until_sample", raw["until_sample"])
                          if "until_sample" in raw else None),
            gpm=self.gpm(f"{path}.gpm", raw["gpm"], mig=True) if "gpm" in raw else None,
        )


def _make_uuid(prefix: str, *parts: Any) -> str:
    return prefix + str(uuidlib.uuid5(_UUID_NAMESPACE, "/".join(map(str, parts))))


def clamp(value: Number, maximum: int) -> int:
    """``value`` as an unsigned integer no larger than ``maximum`` (what NVML can report)."""
    return min(max(int(value), 0), maximum)
