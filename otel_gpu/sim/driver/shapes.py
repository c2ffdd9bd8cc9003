"""Answer shapes: what a call answers in place of the scenario's reading, for any symbol.

A scenario says what a GPU reads; a real driver also answers what no scenario
said (SUCCESS with a NULL buffer, a list that grew between the size call and
the fill call, all ones, a value past physics, a call that never returns). A
:class:`Shape` is one such answer, generic over the symbols: it works on the
ctypes arguments pynvml passes, found by their types (:func:`.cells.cells`), so the
same shape can be put on any symbol that has that kind of output.

``FakeNvml.answer_shape(symbol, shape, gpu=..., after=...)`` puts one on a
symbol (for one GPU and its MIG instances, or every call), a scenario's
``shapes`` key does the same from YAML with the text form :func:`parse_shape`
reads. ``FakeNvml.record_signatures`` records what each symbol's arguments
hold (:class:`Signature`), so a test can tell which shapes apply to it.

Shapes and their text:

* ``returns:NAME``: the return code (``SUCCESS`` or an ``NVML_ERROR_`` name
  without the prefix), nothing written: SUCCESS leaves every output as pynvml
  allocated it (zeros, a NULL buffer's count at 0).
* ``value:N`` (``nan``, ``inf``, ``-inf`` too), ``all_ones``, ``saturated``: the
  symbol's own answer, then every value it wrote (not the ids, versions, types
  and return codes around them) replaced: ``N`` where the C type can hold it
  (clamped to its range; a negative N only in signed fields, a non-integer only in
  doubles, a field value switching its value type to hold it), all ones in each
  value's width, or the largest signed value of that width.
* ``entries:N``, ``entries:over``: a list (a call with a count and a buffer)
  answered with N generated entries: SUCCESS with a count of 0 to the size query
  for 0; ``over``: one entry written and a count one past the buffer given.
* ``resized:A:B``: the size query answers A; the fill call B: INSUFFICIENT_SIZE
  again when B does not fit the buffer, else B entries.
* ``hang``: the call blocks until :meth:`Hang.release` (``FakeNvml.release_hangs``),
  then answers as usual; ``slow:S``: it sleeps S seconds (real time) first.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import Fail
from otel_gpu.sim.driver.cells import Cell, cells, is_list, list_buffer, list_count

if TYPE_CHECKING:
    from otel_gpu.sim.driver._core import Symbol

_UNION_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
"""A field value's union member per ``NVML_VALUE_TYPE_*`` (their order in nvml.h)."""
_DOUBLE, _ULL, _SLL = (abi.NVML_VALUE_TYPE_DOUBLE, abi.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                       abi.NVML_VALUE_TYPE_SIGNED_LONG_LONG)
ROW_PID = 50_000
"""The first pid of generated entries (the others follow)."""
EPOCH_US = 1_700_000_000_000_000
"""Generated entries' timestamps: this plus a second per sample, as the scenario's own."""


class ShapeError(ValueError):
    """A shape's text that :func:`parse_shape` cannot read."""


@dataclass(frozen=True)
class Signature:
    """What a symbol's outputs hold, seen on one call: which shapes can apply to it."""

    kinds: frozenset[str]
    """The kinds of its value cells (:attr:`Cell.kind`)."""
    is_list: bool

    @classmethod
    def of(cls, args: tuple[Any, ...]) -> Signature:
        return cls(frozenset(c.kind for c in cells(args)), is_list(args))

    @property
    def numeric(self) -> bool:
        return bool(self.kinds - {"pointer"})

    @property
    def signed(self) -> bool:
        return bool(self.kinds & {"int", "double", "union"})

    @property
    def doubles(self) -> bool:
        return bool(self.kinds & {"double", "union"})


class Shape:
    """One way of answering a call; ``text`` is what :func:`parse_shape` reads back."""

    text = ""

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<answer shape {self.text}>"


def _code(name: str) -> int:
    if name == "SUCCESS":
        return abi.NVML_SUCCESS
    value = getattr(abi, "NVML_ERROR_" + name, None)
    if not isinstance(value, int):
        raise ShapeError(f"unknown NVML return code {name!r}")
    return value


def error_names() -> tuple[str, ...]:
    """Every return code pynvml defines, by name without the prefix; SUCCESS first."""
    names = sorted(n[len("NVML_ERROR_"):] for n in dir(abi)
                   if n.startswith("NVML_ERROR_") and isinstance(getattr(abi, n), int))
    return ("SUCCESS", *names)


class Returns(Shape):
    """The return code alone; the outputs stay as the caller allocated them."""

    def __init__(self, name: str) -> None:
        self.code = _code(name)
        self.text = f"returns:{name}"

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        return self.code


class Filled(Shape):
    """The symbol's own answer with every value it wrote replaced (see the module doc)."""

    def __init__(self, how: str, number: float = 0) -> None:
        self.how = how
        self.number = number
        self.text = how if how != "value" else f"value:{_show(number)}"

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        code = symbol.answer(*args)
        if code == abi.NVML_SUCCESS:
            for cell in cells(args):
                self._write(cell)
        return code

    def _write(self, cell: Cell) -> None:
        kind = cell.kind
        if self.how == "all_ones":
            ctypes.memset(cell.address(), 0xFF, cell.size())
        elif kind == "union":
            self._union(cell.owner)
        elif kind == "pointer":
            return  # a handle is all ones or left alone
        elif kind == "double":
            value = (math.inf if self.how == "saturated" else float(self.number))
            _set(cell, min(value, 1.7976931348623157e308) if self.how == "saturated" else value)
        else:
            bits, signed = 8 * cell.size(), kind == "int"
            if self.how == "saturated":
                _set(cell, (1 << (bits - 1)) - 1)
                return
            number = self.number
            if not (math.isfinite(number) and float(number).is_integer()):
                return  # a non-integer only fits a double
            low, high = ((-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed
                         else (0, (1 << bits) - 1))
            if number < low:
                return
            _set(cell, min(int(number), high))

    def _union(self, entry: Any) -> None:
        kind = int(entry.valueType)
        member = _UNION_MEMBERS[kind] if 0 <= kind < len(_UNION_MEMBERS) else "ullVal"
        width = {"dVal": 64, "uiVal": 32, "ulVal": 64, "ullVal": 64, "sllVal": 64,
                 "siVal": 32, "usVal": 16}[member]
        if self.how == "saturated":
            if member == "dVal":
                entry.value.dVal = 1.7976931348623157e308
            else:
                setattr(entry.value, member, (1 << (width - 1)) - 1)
            return
        number = self.number
        if not (math.isfinite(number) and float(number).is_integer()):
            entry.valueType, entry.value.dVal = _DOUBLE, float(number)
        elif number < 0:
            entry.valueType, entry.value.sllVal = _SLL, max(int(number), -(1 << 63))
        elif member not in ("dVal", "sllVal", "siVal") and number < (1 << width):
            setattr(entry.value, member, int(number))
        else:
            entry.valueType, entry.value.ullVal = _ULL, min(int(number), (1 << 64) - 1)


def _set(cell: Cell, value: float) -> None:
    if cell.name is None:
        cell.owner.value = value
    else:
        setattr(cell.owner, cell.name, value)


def _show(number: float) -> str:
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return str(int(number)) if float(number).is_integer() else repr(number)


def _fill_row(row: Any, i: int, sample: int) -> None:
    """A generated list entry: a pid of its own, a MiB per entry, shares within 0..100."""
    for name, *_ in row._fields_:
        if name == "pid":
            row.pid = ROW_PID + i
        elif name in ("timeStamp", "timestamp"):
            setattr(row, name, EPOCH_US + sample * 1_000_000 + i)
        elif name == "usedGpuMemory":
            row.usedGpuMemory = (i + 1) << 20
        elif name in ("gpuInstanceId", "computeInstanceId"):
            setattr(row, name, 0xFFFFFFFF)
        elif name.endswith("Util"):
            setattr(row, name, (7 * i) % 101)


class _ListShape(Shape):
    def _count(self, args: tuple[Any, ...]) -> tuple[Any, str | None]:
        found = list_count(args)
        if found is None:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)  # not a list call
        return found

    @staticmethod
    def _get(found: tuple[Any, str | None]) -> int:
        owner, name = found
        return int(owner.value if name is None else getattr(owner, name))

    @staticmethod
    def _put(found: tuple[Any, str | None], value: int) -> None:
        owner, name = found
        if name is None:
            owner.value = value
        else:
            setattr(owner, name, value)

    def _fill(self, symbol: Symbol, rows: Any, n: int) -> None:
        sample = symbol.sample
        for i in range(n):
            _fill_row(rows[i], i, sample)

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        try:
            return self._answer(symbol, args)
        except Fail as fail:
            return fail.code

    def _answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError


class Entries(_ListShape):
    """A list of ``n`` generated entries; ``over``: a count one past the buffer given."""

    def __init__(self, n: int, over: bool = False) -> None:
        self.n, self.over = (1, True) if over else (n, False)
        self.text = "entries:over" if over else f"entries:{n}"

    def _answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        count = self._count(args)
        buffer = list_buffer(args, self._get(count))
        if buffer is None:  # the size query
            self._put(count, self.n)
            return abi.NVML_SUCCESS if self.n == 0 else abi.NVML_ERROR_INSUFFICIENT_SIZE
        rows, capacity = buffer
        if capacity < self.n and not self.over:
            self._put(count, self.n)
            return abi.NVML_ERROR_INSUFFICIENT_SIZE
        written = min(self.n, capacity)
        self._fill(symbol, rows, written)
        self._put(count, capacity + 1 if self.over else written)
        return abi.NVML_SUCCESS


class Resized(_ListShape):
    """A list whose size changes between the size query (``first``) and the fill (``then``)."""

    def __init__(self, first: int, then: int) -> None:
        self.first, self.then = first, then
        self.text = f"resized:{first}:{then}"

    def _answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        count = self._count(args)
        buffer = list_buffer(args, self._get(count))
        if buffer is None:
            self._put(count, self.first)
            return (abi.NVML_SUCCESS if self.first == 0
                    else abi.NVML_ERROR_INSUFFICIENT_SIZE)
        rows, capacity = buffer
        self._put(count, self.then)
        if self.then > capacity:
            return abi.NVML_ERROR_INSUFFICIENT_SIZE
        self._fill(symbol, rows, self.then)
        return abi.NVML_SUCCESS


class Hang(Shape):
    """Blocks every call until :meth:`release`; then, and from then on, answers as usual."""

    text = "hang"

    def __init__(self) -> None:
        self._released = threading.Event()
        self.entered = threading.Event()
        """Set once a call is blocked here."""

    def release(self) -> None:
        self._released.set()

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        self.entered.set()
        self._released.wait()
        return symbol.answer(*args)


class Slow(Shape):
    """Sleeps ``seconds`` of real time before answering as usual."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.text = f"slow:{_show(seconds)}"

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any:
        time.sleep(self.seconds)
        return symbol.answer(*args)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ShapeError(f"expected a number, got {text!r}") from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise ShapeError(f"expected a count, got {text!r}")
    return int(text)


def parse_shape(text: str) -> Shape:
    """The shape a scenario's ``shape`` text names (see the module doc for the forms)."""
    kind, _, rest = text.partition(":")
    parts = rest.split(":") if rest else []
    if kind in ("all_ones", "saturated", "hang") and not parts:
        return Hang() if kind == "hang" else Filled(kind)
    if kind == "returns" and len(parts) == 1:
        return Returns(parts[0])
    if kind == "value" and len(parts) == 1:
        return Filled("value", _number(parts[0]))
    if kind == "entries" and len(parts) == 1:
        return Entries(1, over=True) if parts[0] == "over" else Entries(_count(parts[0]))
    if kind == "resized" and len(parts) == 2:
        return Resized(_count(parts[0]), _count(parts[1]))
    if kind == "slow" and len(parts) == 1:
        seconds = _number(parts[0])
        if not 0 <= seconds <= 3600:
            raise ShapeError(f"expected 0 to 3600 seconds, got {parts[0]!r}")
        return Slow(seconds)
    raise ShapeError(f"unknown answer shape {text!r} (expected returns:CODE, value:N, "
                     "all_ones, saturated, entries:N, entries:over, resized:A:B, hang or "
                     "slow:SECONDS)")
