"""The scenario parser's building blocks: one checked YAML value at a time.

Each method reads one value of the YAML tree at a key path and returns it
typed, or raises :class:`~otel_gpu.sim.scenario.model.ScenarioError` naming the
file and the path. :meth:`Checks.keys` and :meth:`Checks.read` take the keys a
spec class allows, and how each is read, from its fields (:func:`~.model.key`).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import uuid as uuidlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NoReturn

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.scenario.model import (
    NOT_AVAILABLE,
    PROCESS_SHARES,
    U64_MAX,
    Faults,
    Memory,
    Number,
    Process,
    ScenarioError,
    Value,
    key_of,
    required_keys,
    yaml_keys,
)

UUID_NAMESPACE = uuidlib.UUID("6f8c5b4e-2d1a-4e3b-9c7d-0a1b2c3d4e5f")
"""The namespace of every identity a scenario leaves to be generated (GPU, MIG, pod)."""


def uuid5(name: str, namespace: uuidlib.UUID = UUID_NAMESPACE) -> uuidlib.UUID:
    """``uuid.uuid5``, its SHA-1 from CPython's own ``_sha1`` where there is one: hashlib
    would load OpenSSL's hash binding (0.7 MiB) that a collector on a real driver never
    holds, so a simulated node would be measured with memory a real one does not use.
    ``_sha1`` is CPython's private module, crossed here alone:
    ``tests/test_memory.py::test_a_collector_loads_what_it_uses_only`` fails if it goes
    (hashlib loaded), and ``tests/sim/test_scenario.py`` holds the result to ``uuid5``."""
    try:
        sha1 = importlib.import_module("_sha1").sha1
    except ImportError:  # another Python: the same digest from hashlib
        sha1 = importlib.import_module("hashlib").sha1
    digest = sha1(namespace.bytes + name.encode("utf-8")).digest()
    return uuidlib.UUID(bytes=digest[:16], version=5)


_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{8})|([0-9A-Fa-f]{4})):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})"
                     r"\.([0-7])$")
_FAULT_CODES = {
    "unsupported": abi.NVML_ERROR_NOT_SUPPORTED,
    "no_permission": abi.NVML_ERROR_NO_PERMISSION,
    "not_available": NOT_AVAILABLE,
}
"""The fault keys that list targets, and the code each injects (``errors`` names its own)."""


def at(path: str, key: Any) -> str:
    """``devices[0].memory`` + ``total``; the top level has no prefix."""
    return f"{path}.{key}" if path else str(key)


def show(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def field_id(key: Any) -> int | None:
    """A field's id from its scenario spelling, or None when it names no field."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if not isinstance(key, str) or key == "MAX":
        return None
    for prefix in ("NVML_FI_DEV_", "NVML_FI_"):
        value = getattr(abi, prefix + key, None)
        if isinstance(value, int):
            return value
    return None


def _error_code(name: Any) -> int | None:
    if not isinstance(name, str):
        return None
    value = getattr(abi, "NVML_ERROR_" + name, None)
    return value if isinstance(value, int) else None


class Checks:
    """Checked reads of single values; the tree's parser builds on them."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.uuids: dict[str, str] = {}
        self.bus_ids: dict[str, str] = {}

    def fail(self, path: str, message: str) -> NoReturn:
        raise ScenarioError(f"scenario {self.label}: {path}: {message}")

    # keys from the spec classes

    def keys(self, cls: type, path: str, raw: Any, *, extra: tuple[str, ...] = (),
             exclude: tuple[str, ...] = ()) -> dict:
        """``raw`` as a mapping holding only the keys ``cls`` takes (and ``extra``)."""
        allowed = tuple(k for k in yaml_keys(cls) if k not in exclude) + extra
        return self.mapping(path, raw, allowed, required=required_keys(cls))

    def read(self, cls: type, path: str, raw: Mapping) -> dict[str, Any]:
        """The fields of ``cls`` whose key ``raw`` has and a parser method reads, parsed."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            k = key_of(f)
            if k is None or k.parse is None or f.name not in raw:
                continue
            options = dict(k.options)
            if options.pop("null", False) and raw[f.name] is None:
                continue
            out[f.name] = getattr(self, k.parse)(at(path, f.name), raw[f.name], **options)
        return out

    # basic types

    def mapping(self, path: str, raw: Any, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict:
        if not isinstance(raw, dict):
            self.fail(path or "top level", f"expected a mapping, got {show(raw)}")
        for key in raw:
            if key not in allowed:
                self.fail(at(path, key), f"unknown key (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in raw:
                self.fail(path or "top level", f"missing required key {key!r}")
        return raw

    def sequence(self, path: str, raw: Any) -> list:
        if not isinstance(raw, list):
            self.fail(path, f"expected a list, got {show(raw)}")
        return raw

    def integer(self, path: str, raw: Any, minimum: int = 0, maximum: int | None = None) -> int:
        ok = isinstance(raw, int) and not isinstance(raw, bool) and raw >= minimum
        if ok and maximum is not None and raw > maximum:
            ok = False
        if not ok:
            what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
            if maximum is not None:
                what = f"an integer from {minimum} to {maximum}"
            self.fail(path, f"expected {what}, got {show(raw)}")
        if raw > U64_MAX:
            self.fail(path, f"expected an integer no larger than {U64_MAX}, got {show(raw)}")
        return raw

    def number(self, path: str, raw: Any, minimum: float | None = 0,
               maximum: float = U64_MAX) -> Number:
        if not _is_number(raw) or (minimum is not None and raw < minimum):
            what = "a number" if minimum is None else "a non-negative number"
            self.fail(path, f"expected {what}, got {show(raw)}")
        if not -U64_MAX <= raw <= maximum:  # also false for NaN
            limit = "2^64-1" if maximum == U64_MAX else f"{maximum:g}"
            self.fail(path, f"expected a finite number no larger than {limit} in size, "
                            f"got {show(raw)}")
        return raw

    def string(self, path: str, raw: Any, hint: str = "") -> str:
        if not isinstance(raw, str) or not raw:
            self.fail(path, f"expected a non-empty string{hint}, got {show(raw)}")
        return raw

    def boolean(self, path: str, raw: Any) -> bool:
        if not isinstance(raw, bool):
            self.fail(path, f"expected true or false, got {show(raw)}")
        return raw

    def choice(self, path: str, raw: Any, allowed: tuple[str, ...]) -> str:
        if raw not in allowed:
            self.fail(path, f"expected one of {', '.join(allowed)}, got {show(raw)}")
        return raw

    def value(self, path: str, raw: Any) -> Value:
        if _is_number(raw):
            return Value(start=self.number(path, raw))
        if isinstance(raw, list):
            if not raw:
                self.fail(path, "expected a non-empty list of numbers")
            return Value(cycle=tuple(self.number(f"{path}[{i}]", v) for i, v in enumerate(raw)))
        if isinstance(raw, dict):
            return Value(**self.read(Value, path, self.keys(Value, path, raw)))
        self.fail(path, "expected a number, a list of numbers or {start, step, per_device}, "
                        f"got {show(raw)}")

    def values(self, path: str, raw: Any, keys: tuple[str, ...]) -> Mapping[str, Value]:
        self.mapping(path, raw, keys)
        return MappingProxyType({k: self.value(f"{path}.{k}", v) for k, v in raw.items()})

    # composite parts

    def memory(self, path: str, raw: Any) -> Memory:
        return Memory(**self.read(Memory, path, self.keys(Memory, path, raw)))

    def fields(self, path: str, raw: Any) -> Mapping[int, Value]:
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping of field name to value, got {show(raw)}")
        out: dict[int, Value] = {}
        for key, value in raw.items():
            fid = field_id(key)
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
            if not utilization and isinstance(item, dict):
                for key in PROCESS_SHARES:
                    if key in item:
                        self.fail(f"{p}.{key}", "NVML has no per-process utilization on MIG "
                                                "instances (only used_memory)")
            self.keys(Process, p, item, extra=("positions",) if count else (),
                      exclude=() if utilization else PROCESS_SHARES)
            positions = None
            if "positions" in item:
                positions = tuple(
                    self.integer(f"{p}.positions[{j}]", v, 0, count - 1)
                    for j, v in enumerate(self.sequence(f"{p}.positions", item["positions"]))
                )
            out.append((Process(**self.read(Process, p, item)), positions))
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
                key = field_id(target) if allow_fields else None
                bucket = fields
                if key is None:
                    known = "NVML function or field" if allow_fields else "NVML function"
                    self.fail(p, f"unknown {known} {show(target)}")
            if key in where:
                self.fail(p, f"{show(target)} is also listed at {where[key]}")
            where[key] = p
            bucket[key] = code

        for key, code in _FAULT_CODES.items():
            for i, target in enumerate(self.sequence(at(path, key), raw.get(key, []))):
                add(f"{at(path, key)}[{i}]", target, code)
        errors = raw.get("errors", {})
        if not isinstance(errors, dict):
            self.fail(at(path, "errors"), f"expected a mapping of function to error name, "
                                          f"got {show(errors)}")
        for target, name in errors.items():
            p = at(at(path, "errors"), target)
            error = _error_code(name)
            if error is None:
                self.fail(p, f"unknown NVML error {show(name)} (expected an NVML_ERROR_ name "
                             "without the prefix, e.g. UNKNOWN, GPU_IS_LOST)")
            add(p, target, error)
        return Faults(MappingProxyType(calls), MappingProxyType(fields))

    def uuid(self, path: str, raw: Any, prefix: str) -> str:
        text = self.string(path, raw)
        if not text.startswith(prefix) or len(text) >= abi.NVML_DEVICE_UUID_V2_BUFFER_SIZE:
            self.fail(path, f"expected a UUID starting with {prefix!r}, got {show(raw)}")
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
            self.fail(path, f"expected a PCI bus id{hint}, got {show(raw)}")
        domain = match.group(1) or "0000" + match.group(2)
        text = f"{domain}:{match.group(3)}:{match.group(4)}.{match.group(5)}".upper()
        if text in self.bus_ids:
            self.fail(path, f"duplicate PCI bus id {text!r} (also used by {self.bus_ids[text]})")
        self.bus_ids[text] = path
        return text

    def free_bus_id(self, owner: str) -> str:
        for n in range(1, 0x10000 * 0x100):
            text = f"{n // 0x100:08X}:{n % 0x100:02X}:00.0"
            if text not in self.bus_ids:
                self.bus_ids[text] = owner
                return text
        raise AssertionError("no free PCI bus id")  # pragma: no cover

