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
        processes: [{pid: 4242, used_memory: VALUE}]
        unsupported: [nvmlDeviceGetFanSpeed, MEMORY_TEMP]
        no_permission: [nvmlDeviceGetComputeRunningProcesses_v3]
        errors: {nvmlDeviceGetPowerUsage: UNKNOWN}
        lost_after: 3
        slow: [{function: nvmlDeviceGetPowerUsage, seconds: 2.5, after: 1}]
        xid: [{sample: 2, code: 79}]
        mig_capable: true
        mig: [{profile: 1g.10gb, gpu_instance_id: 9, compute_instance_id: 0}]

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
  others as ``NVML_VALUE_TYPE_DOUBLE``. The scope id of a request is ignored.
* ``processes``: ``pid`` is required; ``used_memory`` absent reports
  ``NVML_VALUE_NOT_AVAILABLE`` (pynvml turns it into None). Optional
  ``from_sample`` / ``until_sample`` (inclusive) bound when the process is
  listed, and ``positions: [0, 2]`` limits it to those GPUs of a ``count``
  entry. The parent GPU of MIG instances also lists the instances' processes,
  with their GPU/compute instance ids; its own have ``0xFFFFFFFF`` there.
* ``unsupported`` / ``no_permission`` / ``errors``: C symbol names (those in
  :data:`DEVICE_SYMBOLS`, or the ``device_symbols`` given to
  :func:`load_scenario`) make that call fail on this device with
  ``NOT_SUPPORTED`` / ``NO_PERMISSION`` / the named error (``NVML_ERROR_``
  name without the prefix); field names make only that field entry fail.
  The top-level ``errors`` takes the system-level symbols (init, shutdown,
  driver/NVML version, device count, event sets).
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
  ``unsupported``, ``no_permission``, ``errors``, and ``from_sample`` /
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
* ``uuid``, ``pci_bus_id``, ``serial`` and ``minor_number`` (and MIG
  ``uuid``) are not allowed with ``count`` > 1. UUIDs and bus ids must be
  unique.

VALUE is a number (constant); ``{start: S, step: D, per_device: P}`` (only
``start`` required), worth ``S + P*k + D*max(n-1, 0)`` at sample n for the
k-th GPU of its ``count`` entry; or a list, worth element ``max(n-1, 0) %
len``. Integers stay integers; where NVML reports an unsigned integer the
value is truncated and clamped to the type's range.

Any unknown key, wrong type, duplicate UUID or bus id, unknown error, field
or function name raises :class:`ScenarioError` naming the file and key path.
"""

from __future__ import annotations

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
MAX_GPUS = 64
"""GPUs in one scenario, ``count`` included: more than any real node has."""
MAX_SLOW_SECONDS = 3600.0
NOT_AVAILABLE_ID = 0xFFFFFFFF
"""What NVML puts in a GPU/compute instance id that does not apply."""

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
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

    def exists_at(self, sample: int) -> bool:
        """Whether the instance exists during sample ``sample`` (a re-layout moves it)."""
        return sample >= self.from_sample and (
            self.until_sample is None or sample <= self.until_sample)


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

    def lost_at(self, sample: int) -> bool:
        return self.lost_after is not None and sample > self.lost_after


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


def _error_code(name: Any) -> int | None:
    if not isinstance(name, str):
        return None
    value = getattr(pynvml, "NVML_ERROR_" + name, None)
    return value if isinstance(value, int) else None


_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{8})|([0-9A-Fa-f]{4})):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})"
                     r"\.([0-7])$")


class _Parser:
    """Turns the YAML tree into a :class:`Scenario`, failing on the first problem."""

    _TOP = ("name", "driver_version", "nvml_version", "errors", "devices")
    _GPU = ("name", "count", "uuid", "pci_bus_id", "pci_device_id", "minor_number", "serial",
            "numa_node", "memory", "utilization", "temperature", "power", "clocks",
            "clock_event_reasons", "fan_speed", "fields", "processes", "unsupported",
            "no_permission", "errors", "lost_after", "slow", "xid", "mig_capable", "mig")
    _MIG = ("profile", "gpu_instance_id", "compute_instance_id", "uuid", "memory", "processes",
            "unsupported", "no_permission", "errors", "from_sample", "until_sample")
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

    def processes(self, path: str, raw: Any, count: int) -> list[tuple[Process, tuple | None]]:
        out = []
        for i, item in enumerate(self.sequence(path, raw)):
            p = f"{path}[{i}]"
            allowed = ("pid", "used_memory", "from_sample", "until_sample", "positions")
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
                          ("no_permission", pynvml.NVML_ERROR_NO_PERMISSION)):
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
        return Scenario(name=name, driver_version=driver, devices=devices, nvml_version=nvml,
                        faults=faults)

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
        )
        for k in range(count):
            gpu = replace(
                base,
                index=first_index + k,
                position=k,
                processes=tuple(p for p, pos in processes if pos is None or k in pos),
            )
            yield gpu, {**explicit, "mig": mig_raw}

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
            compute_instance_id=self.integer(f"{path}.compute_instance_id",
                                             raw.get("compute_instance_id", 0)),
            memory=self.memory(f"{path}.memory", raw["memory"]) if "memory" in raw else None,
            processes=tuple(p for p, _ in self.processes(f"{path}.processes",
                                                          raw.get("processes", []), 0)),
            faults=self.faults(path, raw, MIG_SYMBOLS, allow_fields=False),
            from_sample=self.integer(f"{path}.from_sample", raw.get("from_sample", 0)),
            until_sample=(self.integer(f"{path}.until_sample", raw["until_sample"])
                          if "until_sample" in raw else None),
        )


def _make_uuid(prefix: str, *parts: Any) -> str:
    return prefix + str(uuidlib.uuid5(_UUID_NAMESPACE, "/".join(map(str, parts))))


def clamp(value: Number, maximum: int) -> int:
    """``value`` as an unsigned integer no larger than ``maximum`` (what NVML can report)."""
    return min(max(int(value), 0), maximum)
