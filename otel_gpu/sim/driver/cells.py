"""A call's ctypes arguments, read by their types: the values it writes and its list parts.

pynvml passes each output as a ``byref`` target or an array; the answer shapes
(:mod:`.shapes`) find what to overwrite here without knowing the symbol.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from otel_gpu import nvml_abi as abi

PROTOCOL = frozenset({
    "version", "sensorType", "fieldId", "scopeId", "timestamp", "timeStamp", "latencyUsec",
    "valueType", "nvmlReturn", "metricId", "numMetrics", "sample1", "sample2",
    "procUtilArray", "processSamplesCount", "lastSeenTimeStamp", "metricInfo", "pid",
    "gpuInstanceId", "computeInstanceId",
})
"""Struct members that frame a value (versions, ids, types, codes, timestamps, counts), not
values: the value shapes leave them as the driver wrote them."""

_INTS = "bBhHiIlLqQ"
_FLOATS = "fd"


@dataclass(frozen=True)
class Cell:
    """One value a call writes: a simple ctypes output, a struct member, or a field value's
    union (``union``: the entry holding ``valueType`` and ``value``)."""

    owner: Any
    name: str | None
    ctype: Any
    union: bool = False

    @property
    def kind(self) -> str:
        """``int``, ``uint``, ``double``, ``union`` or ``pointer``."""
        if self.union:
            return "union"
        code = getattr(self.ctype, "_type_", None)
        if isinstance(code, str) and code in _INTS:
            return "uint" if code.isupper() else "int"
        if isinstance(code, str) and code in _FLOATS:
            return "double"
        return "pointer"

    def address(self) -> int:
        base = ctypes.addressof(self.owner)
        if self.name is None:
            return base
        return base + getattr(type(self.owner), self.name).offset

    def size(self) -> int:
        return ctypes.sizeof(self.ctype)


def _type_code(ctype: Any) -> str:
    """A simple ctypes type's struct code (``I`` for c_uint), empty for others."""
    code = getattr(ctype, "_type_", "")
    return code if isinstance(code, str) else ""


def _outputs(args: tuple[Any, ...]) -> Iterator[Any]:
    """The ctypes objects a call may write: ``byref`` targets and arrays passed as they are."""
    for arg in args:
        obj = getattr(arg, "_obj", None)
        if obj is not None:
            yield obj
        elif isinstance(arg, ctypes.Array):
            yield arg


def _is_struct(obj: Any) -> bool:
    return isinstance(obj, (ctypes.Structure, ctypes.Union))


def _walk(obj: Any, out: list[Cell], top: bool) -> None:
    if isinstance(obj, ctypes.Array):
        if len(obj) and _is_struct(obj[0]):
            for item in obj:
                _walk(item, out, False)
        return  # an array of plain values is text (a name, a UUID)
    if _is_struct(obj):
        fields = {f[0]: f[1] for f in getattr(type(obj), "_fields_", ())}
        if int(getattr(obj, "nvmlReturn", 0) or 0) != abi.NVML_SUCCESS:
            return  # an entry the driver failed holds no value
        counts = [name for name in fields if name.endswith("Count")]
        for name, ctype in fields.items():
            if name == "value" and "valueType" in fields and issubclass(ctype, ctypes.Union):
                out.append(Cell(obj, name, ctype, union=True))
            elif isinstance(ctype, type) and issubclass(ctype, ctypes._Pointer) and counts:
                rows = getattr(obj, name)
                if rows:  # a pointer to entries, as long as the count beside it says
                    for i in range(int(getattr(obj, counts[0]))):
                        _walk(rows[i], out, False)
            elif name in PROTOCOL:
                continue
            elif isinstance(ctype, type) and issubclass(ctype, (ctypes.Structure, ctypes.Union,
                                                                ctypes.Array)):
                _walk(getattr(obj, name), out, False)  # an array: of entries, or text
            elif (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)
                  and _type_code(ctype) in _INTS + _FLOATS):
                out.append(Cell(obj, name, ctype))
        return
    if isinstance(obj, ctypes._SimpleCData) and _type_code(type(obj)) in _INTS + _FLOATS:
        out.append(Cell(obj, None, type(obj)))
    elif top and isinstance(obj, (ctypes._Pointer, ctypes.c_void_p)):
        out.append(Cell(obj, None, type(obj)))  # a handle the call hands out


def cells(args: tuple[Any, ...]) -> list[Cell]:
    """Every value the call's outputs hold, for the value shapes to overwrite."""
    out: list[Cell] = []
    for obj in _outputs(args):
        _walk(obj, out, True)
    return out


def list_count(args: tuple[Any, ...]) -> tuple[Any, str | None] | None:
    """A list call's count: a ``byref`` unsigned int, or a struct's ``*Count`` member."""
    for obj in _outputs(args):
        if isinstance(obj, ctypes.c_uint):
            return obj, None
    for obj in _outputs(args):
        if isinstance(obj, ctypes.Structure):
            for name, *_ in obj._fields_:
                if name.endswith("Count"):
                    return obj, name
    return None


def list_buffer(args: tuple[Any, ...], count: int) -> tuple[Any, int] | None:
    """A list call's buffer and its capacity; None for the size query (a NULL buffer)."""
    for arg in args:
        if isinstance(arg, ctypes.Array):
            return arg, len(arg)
    for obj in _outputs(args):
        if isinstance(obj, ctypes.Structure):
            for name, ctype, *_ in obj._fields_:
                if issubclass(ctype, ctypes._Pointer) and getattr(obj, name):
                    return getattr(obj, name), count  # pynvml sized it by the count
    return None


def is_list(args: tuple[Any, ...]) -> bool:
    """Whether the call is a list's two-call protocol: a count and a buffer, maybe NULL."""
    if list_count(args) is None:
        return False
    if any(arg is None or isinstance(arg, ctypes.Array) for arg in args):
        return True
    return any(isinstance(obj, ctypes.Structure)
               and any(issubclass(c, ctypes._Pointer) for _, c, *_ in obj._fields_)
               for obj in _outputs(args))
