"""What every fake C symbol stands on: the symbol wrapper, handles and the shared checks.

pynvml finds each C function with ``getattr(nvmlLib, name)`` and calls it with
ctypes arguments. :class:`DriverCore` turns each method marked with
:func:`c_symbol` into such an attribute (a :class:`Symbol`, which counts the
call and turns :class:`Fail` into the return code), hands out handles as
opaque integer tokens, and owns the checks every call goes through first
(:meth:`DriverCore.check_system`, :meth:`DriverCore.check_device`), so each
NVML area's module only has to fill in the answer.
"""

from __future__ import annotations

import collections
import ctypes
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.scenario import (
    NOT_AVAILABLE,
    U32_MAX,
    Faults,
    GpuSpec,
    MigSpec,
    Scenario,
    Value,
    clamp,
)

if TYPE_CHECKING:
    from otel_gpu.sim.driver.events import EventSet


class Fail(Exception):
    """Raised inside a symbol to make it return the NVML error ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_F = TypeVar("_F", bound=Callable[..., Any])


@overload
def c_symbol(func: _F, /) -> _F: ...
@overload
def c_symbol(*, mig: bool = False, system: bool = False) -> Callable[[_F], _F]: ...


def c_symbol(func: Any = None, /, *, mig: bool = False, system: bool = False) -> Any:
    """Mark a method of a :class:`DriverCore` subclass as the C symbol of the same name.

    The method receives the ctypes arguments pynvml passes and returns None
    (``NVML_SUCCESS``), a value (what the C function returns, for the few that
    return no code), or raises :class:`Fail`. An override of a symbol must be
    marked too: an unmarked one is called bare, uncounted, its Fail escaping.

    ``@c_symbol(mig=True)``: a device symbol that answers on a MIG handle too
    (the others answer NOT_SUPPORTED there), so a MIG instance's faults may
    name it. ``@c_symbol(system=True)``: a system-level symbol the scenario's
    top-level ``errors`` may name.
    """
    def mark(f: _F) -> _F:
        f._c_symbol = True  # type: ignore[attr-defined]
        f._c_mig = mig  # type: ignore[attr-defined]
        f._c_system = system  # type: ignore[attr-defined]
        return f

    return mark if func is None else mark(func)


class Symbol:
    """What ``getattr(nvmlLib, name)`` gives pynvml: a callable that also takes attributes.

    pynvml sets ``restype`` on some function pointers (``nvmlErrorString``); a
    bound method would refuse that with AttributeError.
    """

    def __init__(self, fake: DriverCore, name: str, impl: Callable[..., Any]) -> None:
        self._fake = fake
        self.__name__ = name
        self._impl = impl
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        fake = self._fake
        fake._count(self.__name__)
        if fake.record_signatures is not None and self.__name__ not in fake.record_signatures:
            fake.record_signatures[self.__name__] = args
        shape = fake.shape_for(self.__name__, args)
        if shape is not None:
            return shape.answer(self, args)
        return self.answer(*args)

    @property
    def sample(self) -> int:
        return self._fake.sample

    def answer(self, *args: Any) -> Any:
        """What the symbol answers from its scenario (an answer shape may call it too)."""
        try:
            result = self._impl(*args)
        except Fail as fail:
            return fail.code
        if result is None and args and self._fake.not_available(self.__name__, args[0]):
            for arg in args[1:]:  # every output of the call: all ones in its C width
                out = getattr(arg, "_obj", None)
                if out is not None:
                    ctypes.memset(ctypes.addressof(out), 0xFF, ctypes.sizeof(out))
        return abi.NVML_SUCCESS if result is None else result

    def __repr__(self) -> str:
        return f"<fake NVML symbol {self.__name__}>"


class Shape(Protocol):
    """An answer shape (see ``shapes``): answers one call of ``symbol`` with ``args``."""

    def answer(self, symbol: Symbol, args: tuple[Any, ...]) -> Any: ...


@dataclass(frozen=True)
class Target:
    """What a handle token designates: a GPU, or one of its MIG instances."""

    gpu: GpuSpec
    mig: MigSpec | None = None

    @property
    def faults(self) -> Faults:
        return self.mig.faults if self.mig is not None else self.gpu.faults


def deref(ref: Any) -> Any:
    """The ctypes object behind a ``byref()`` (or ``pointer()``) argument, to write into."""
    obj = getattr(ref, "_obj", None)
    return obj if obj is not None else ref.contents


def arg_int(arg: Any) -> int:
    """A by-value integer argument, whether pynvml wrapped it in a ctypes type or not."""
    return int(getattr(arg, "value", arg))


def write_handle(ref: Any, token: int) -> None:
    ctypes.c_void_p.from_buffer(deref(ref)).value = token


def token_of(handle: Any) -> int | None:
    if handle is None:
        return None
    if isinstance(handle, int):
        return handle
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def write_text(buf: Any, length: Any, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > arg_int(length):
        raise Fail(abi.NVML_ERROR_INSUFFICIENT_SIZE)
    buf.value = data


def gpu_token(index: int) -> int:
    return (index + 1) << 8


def mig_token(index: int, slot: int) -> int:
    return ((index + 1) << 8) | (slot + 1)


class DriverCore:
    """Bookkeeping and checks shared by every NVML area of :class:`~otel_gpu.sim.FakeNvml`.

    ``sleep`` is what ``slow`` faults and event-set waits block through; tests
    pass a recorder so nothing really sleeps.
    """

    def __init__(self, scenario: Scenario, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.scenario = scenario
        self.calls: collections.Counter[str] = collections.Counter()
        self._sleep = sleep
        self._lock = threading.Lock()
        self._sample = 0
        self._init_depth = 0
        self._event_sets: dict[int, EventSet] = {}
        self._next_event_set = 0
        self._targets: dict[int, Target] = {}
        self._by_uuid: dict[str, int] = {}
        for gpu in scenario.devices:
            self._targets[gpu_token(gpu.index)] = Target(gpu)
            self._by_uuid[gpu.uuid] = gpu_token(gpu.index)
            for m in gpu.mig:
                self._targets[mig_token(gpu.index, m.slot)] = Target(gpu, m)
                self._by_uuid[m.uuid] = mig_token(gpu.index, m.slot)
        self._shapes: dict[str, list[tuple[int | None, int, Shape]]] = {}
        self.record_signatures: dict[str, tuple[Any, ...]] | None = None
        """Set to a dict to record the arguments of each symbol's first call, by symbol
        (``shapes.Signature.of`` tells what they hold)."""
        self._mig_symbols = self.mig_symbols()
        for name in self.c_symbols():
            setattr(self, name, Symbol(self, name, getattr(self, name)))

    @classmethod
    def c_symbols(cls, mark: str = "_c_symbol") -> frozenset[str]:
        """The C symbols this class implements (its methods marked with :func:`c_symbol`),
        or those of them with ``mark`` set (``_c_mig``, ``_c_system``)."""
        return frozenset(
            name for name in dir(cls) if getattr(getattr(cls, name), mark, False)
        )

    @classmethod
    def system_symbols(cls) -> frozenset[str]:
        """The symbols a scenario's top-level ``errors`` may name: ``c_symbol(system=True)``."""
        return cls.c_symbols("_c_system")

    @classmethod
    def mig_symbols(cls) -> frozenset[str]:
        """The device symbols that answer on a MIG handle: ``c_symbol(mig=True)``."""
        return cls.c_symbols("_c_mig")

    @classmethod
    def device_symbols(cls) -> frozenset[str]:
        """The symbols a scenario device's faults may name: every ``nvmlDevice*`` one but
        the device count. Pass it to ``load_scenario`` for a subclass that adds some."""
        system = cls.system_symbols()
        return frozenset(
            name for name in cls.c_symbols() if name.startswith("nvmlDevice") and name not in system
        )

    # --- bookkeeping --------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1
            if name == "nvmlDeviceGetCount_v2":
                self._sample += 1

    # --- answer shapes ------------------------------------------------------------------

    def answer_shape(self, symbol: str, shape: Shape, *, gpu: int | None = None,
                     after: int = 0) -> None:
        """Make ``symbol`` answer ``shape`` from sample ``after`` + 1 on: on GPU ``gpu``
        and its MIG instances (the calls :meth:`gpu_of` places there), or every call."""
        if symbol not in self.c_symbols():
            raise ValueError(f"unknown NVML function {symbol!r}")
        self._shapes.setdefault(symbol, []).append((gpu, after, shape))

    def clear_shapes(self) -> None:
        self._shapes.clear()

    def shape_for(self, symbol: str, args: tuple[Any, ...]) -> Shape | None:
        """The answer shape this call of ``symbol`` gets, if any."""
        entries = self._shapes.get(symbol)
        if not entries:
            return None
        sample, gpu = self.sample, None
        if any(g is not None for g, _, _ in entries):
            gpu = self.gpu_of(symbol, args)
        for want, after, shape in entries:
            if (want is None or want == gpu) and sample > after:
                return shape
        return None

    def gpu_of(self, symbol: str, args: tuple[Any, ...]) -> int | None:
        """The index of the GPU a call is about, where the call says (None: no GPU's)."""
        if not args:
            return None
        if symbol == "nvmlDeviceGetHandleByIndex_v2":
            return arg_int(args[0])
        if symbol == "nvmlDeviceGetHandleByUUID":
            raw = getattr(args[0], "value", args[0])
            token = self._by_uuid.get(raw.decode() if isinstance(raw, bytes) else str(raw))
        else:
            token = token_of(args[0]) if not hasattr(args[0], "_obj") else None
        target = self._targets.get(token or 0)
        if target is not None:
            return target.gpu.index
        index = ((token or 0) >> 8) - 1  # a GPU instance handle (see ``mig``)
        if token and 0 <= index < len(self.scenario.devices):
            return index
        return None

    def not_available(self, symbol: str, handle: Any) -> bool:
        """Whether the scenario makes ``symbol`` answer NVML's "not available" value on the
        device of ``handle``."""
        target = self._targets.get(token_of(handle) or 0)
        return target is not None and target.faults.calls.get(symbol) == NOT_AVAILABLE

    @property
    def total_calls(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    @property
    def sample(self) -> int:
        with self._lock:
            return self._sample

    # --- checks -------------------------------------------------------------------------

    def check_system(self, symbol: str | None, *, need_init: bool = True) -> int:
        """Checks shared by system-level symbols; returns the current sample."""
        with self._lock:
            sample, initialised = self._sample, self._init_depth > 0
        if need_init and not initialised:
            raise Fail(abi.NVML_ERROR_UNINITIALIZED)
        code = self.scenario.faults.calls.get(symbol) if symbol else None
        if code:
            raise Fail(code)
        return sample

    def check_device(self, symbol: str, handle: Any) -> tuple[Target, int]:
        """Checks shared by device-level symbols, in the order a driver would hit them.

        Initialised, a known handle, then the scenario's faults for ``symbol``
        on that GPU: ``lost_after``, ``slow``, ``unsupported`` /
        ``no_permission`` / ``errors``, and NOT_SUPPORTED on a MIG handle for
        a symbol not marked ``c_symbol(mig=True)``. Returns what the handle designates
        and the current sample.
        """
        sample = self.check_system(None)
        target = self._targets.get(token_of(handle) or 0)
        if target is None:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        self._check(symbol, target, sample)
        return target, sample

    def _check(self, symbol: str, target: Target, sample: int) -> None:
        gpu = target.gpu
        if gpu.lost_at(sample):
            raise Fail(abi.NVML_ERROR_GPU_IS_LOST)
        if target.mig is not None and not target.mig.exists_at(sample):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)  # a handle from before a re-layout
        self.delay((symbol,), gpu, sample)
        code = target.faults.calls.get(symbol)
        if code and code != NOT_AVAILABLE:
            raise Fail(code)
        if target.mig is not None and symbol not in self._mig_symbols:
            if symbol == "nvmlDeviceGetMigDeviceHandleByIndex":
                raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)

    def delay(self, symbols: Iterable[str], gpu: GpuSpec, sample: int) -> None:
        """Sleep through the scenario's ``slow`` entries for ``symbols`` on this GPU."""
        wanted = set(symbols)
        delay = sum(s.seconds for s in gpu.slow if s.function in wanted and sample > s.after)
        if delay > 0:
            self._sleep(delay)

    @staticmethod
    def _uint(value: Value | None, sample: int, k: int, maximum: int = U32_MAX) -> int:
        """A scenario reading as an unsigned integer; NOT_SUPPORTED when it is absent."""
        if value is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        return clamp(value.at(sample, k), maximum)
