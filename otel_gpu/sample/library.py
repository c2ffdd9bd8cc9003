"""The single wrapper every NVML call goes through.

pynvml raises an ``NVMLError`` subclass for every non-zero return code. What
the collector should do about one depends only on the code: a value the
device cannot give is omitted, a device that is gone is marked failed, and
anything else is retried on the next sample. :func:`classify` is that
decision, and :class:`Nvml` applies it so no caller ever sees an exception
from the driver.

A function, structure or constant the installed nvidia-ml-py lacks (an older release)
is :attr:`Outcome.MISSING`: that read is not available with this binding, said once,
and the other reads go on.

Anything else the binding raises is never a success either: an ``NVMLError``
whose code is ``NVML_SUCCESS`` (pynvml's answer to a driver that returns
SUCCESS to a size query with a NULL buffer; for a list, :meth:`Nvml.call_list`
reads that as NVML means it: an empty list), a ``TypeError`` or ``ValueError``
from a malformed answer. Such a call is :attr:`Outcome.BROKEN`: its value is
absent, and the reader's failure is counted (:mod:`~otel_gpu.sample.containment`).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.metadata
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pynvml

from otel_gpu import nvml_abi as abi


class Outcome(enum.StrEnum):
    OK = "ok"
    UNSUPPORTED = "unsupported"
    """The device cannot give this value: omit it, log once, stop asking."""
    DEVICE_FAILED = "device_failed"
    """The device is lost or broken: mark it failed, drop its other series."""
    TRANSIENT = "transient"
    """Try again next sample."""
    BROKEN = "broken"
    """The call raised something no return code explains: no value, counted as the
    reader's failure, tried again next sample."""
    MISSING = "missing"
    """The installed nvidia-ml-py lacks a function, structure or version it needs: not
    available with this binding. Omitted, said once, never counted as a failure."""


_UNSUPPORTED = {
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
    "NVML_ERROR_INVALID_ARGUMENT",
}
_DEVICE_FAILED = {
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_UNKNOWN",
    "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_GPU_NOT_FOUND",
    "NVML_ERROR_IRQ_ISSUE",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_INSUFFICIENT_POWER",
}


@functools.lru_cache(maxsize=8)
def _tables(module: ModuleType) -> tuple[frozenset[int], frozenset[int], dict[int, str]]:
    """The unsupported and device-failed codes, and each error code's short name.

    The codes are nvml.h's (:mod:`otel_gpu.nvml_abi`), whichever binding is installed; a
    code only a newer ``module`` names is named too. Built once per module: every value a
    device lacks is an error each sample (dozens per MIG instance on some drivers), and
    scanning the module each time cost more than the read itself.
    """
    def codes(names: set[str]) -> frozenset[int]:
        return frozenset(getattr(abi, n) for n in names)

    prefix = "NVML_ERROR_"
    names: dict[int, str] = {}
    for source in (abi, module):
        for name in sorted(dir(source)):
            value = getattr(source, name, None) if name.startswith(prefix) else None
            if isinstance(value, int):
                names.setdefault(value, name[len(prefix):])
    return codes(_UNSUPPORTED), codes(_DEVICE_FAILED), names


def classify(code: int, module: ModuleType = pynvml) -> Outcome:
    """Map an NVML return code to what the collector does about it."""
    if code == abi.NVML_SUCCESS:
        return Outcome.OK
    unsupported, failed, _ = _tables(module)
    if code in unsupported:
        return Outcome.UNSUPPORTED
    if code in failed:
        return Outcome.DEVICE_FAILED
    return Outcome.TRANSIENT


def error_name(code: int, module: ModuleType = pynvml) -> str:
    """``NOT_SUPPORTED`` for 3: the short name operators can search for."""
    return _tables(module)[2].get(code, f"code {code}")


@dataclass(frozen=True)
class Result:
    """What one NVML call gave: a value, or an outcome with the driver's reason."""

    value: Any = None
    outcome: Outcome = Outcome.OK
    code: int = 0
    message: str = ""
    error: BaseException | None = None
    """What a :attr:`Outcome.BROKEN` call raised, for the debug-level traceback."""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


_active = threading.local()
"""The :class:`Nvml` whose :meth:`Nvml.call` runs on this thread, if any: it is charged
with every C function the call reaches."""


class _Counted:
    """A C function pointer of libnvidia-ml that charges each call to the running
    :meth:`Nvml.call`; attributes (pynvml sets ``restype``) go to the pointer."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any) -> Any:
        nvml: Nvml | None = getattr(_active, "nvml", None)
        if nvml is not None:
            nvml._count()
        return self._fn(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._fn, name, value)


def _count_library_calls(module: ModuleType) -> None:
    """Make every C function pynvml looks up count itself (once per module).

    A pynvml function may call the library more than once (a list is asked for its
    size first), and a reader may make several calls: counting at the library says
    what the driver is asked, not how often the collector called into Python.
    """
    lookup = getattr(module, "_nvmlGetFunctionPointer", None)
    if lookup is None or getattr(lookup, "_counted", False):
        return

    def counted(name: str) -> _Counted:
        return _Counted(lookup(name))

    counted._counted = True  # type: ignore[attr-defined]
    module._nvmlGetFunctionPointer = counted  # type: ignore[attr-defined]


@functools.cache
def binding_version() -> str:
    """The installed nvidia-ml-py's version, for "not available with this nvidia-ml-py X"."""
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def missing_from_binding(name: str) -> str:
    """What a read the binding cannot make is: ``not available with this nvidia-ml-py X``."""
    return f"not available with this nvidia-ml-py {binding_version()} (it has no {name})"


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised: no driver, or no library."""


class Nvml:
    """NVML behind one door: initialised once, every call counted and classified.

    ``module`` is the pynvml module (tests pass the real one with a fake
    library installed underneath it).
    """

    def __init__(self, module: ModuleType = pynvml) -> None:
        self.module = module
        self._calls = 0
        self._lock = threading.Lock()
        self._initialised = False
        _count_library_calls(module)

    @property
    def calls(self) -> int:
        """Calls into the library made by :meth:`call` since start, each C call counted."""
        return self._calls

    def _count(self) -> None:
        with self._lock:
            self._calls += 1

    def init(self) -> None:
        if self._initialised:
            return
        try:
            self.module.nvmlInit()
        except self.module.NVMLError as exc:
            raise NvmlUnavailable(f"{exc} ({error_name(exc.value, self.module)})") from None
        except OSError as exc:  # a broken libnvidia-ml.so can fail in the loader itself
            raise NvmlUnavailable(str(exc)) from None
        self._initialised = True

    def shutdown(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        with contextlib.suppress(self.module.NVMLError):
            self.module.nvmlShutdown()

    def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Result:
        """Run one pynvml function (or a reader making several); never raises ``Exception``.

        Every call it makes into the library is counted in :attr:`calls`. An exception
        is never a value: one no NVML error code explains is :attr:`Outcome.BROKEN`.
        """
        outer = getattr(_active, "nvml", None)
        _active.nvml = self
        try:
            return Result(func(*args, **kwargs))
        except self.module.NVMLError as exc:
            code = getattr(exc, "value", None)
            if not isinstance(code, int) or code == abi.NVML_SUCCESS:
                return Result(None, Outcome.BROKEN, 0,
                              f"the driver answered SUCCESS but gave no value ({exc})", exc)
            return Result(None, classify(code, self.module), code, str(exc))
        except AttributeError as exc:
            if exc.obj is self.module and isinstance(exc.name, str):  # an older binding
                return Result(None, Outcome.MISSING, 0, missing_from_binding(exc.name), exc)
            return Result(None, Outcome.BROKEN, 0, f"{type(exc).__name__}: {exc}", exc)
        except Exception as exc:  # noqa: BLE001 - a malformed answer or a reader's bug
            return Result(None, Outcome.BROKEN, 0, f"{type(exc).__name__}: {exc}", exc)
        finally:
            _active.nvml = outer

    def call_list(self, func: Callable[..., Any], *args: Any) -> Result:
        """:meth:`call` for a pynvml list function: an empty list where the driver said none.

        NVML answers a list's size query with SUCCESS and a count of 0 when there is
        nothing to list (NVIDIA's own mock library does so for a GPU without processes);
        some pynvml list functions raise ``NVMLError`` with code SUCCESS on that answer,
        which is no surprise but an empty list. Anything else stays as :meth:`call` says.
        """
        res = self.call(func, *args)
        if (res.outcome is Outcome.BROKEN and isinstance(res.error, self.module.NVMLError)
                and getattr(res.error, "value", None) == abi.NVML_SUCCESS):
            return Result([])
        return res
