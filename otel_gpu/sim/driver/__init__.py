"""A fake NVML driver: scenario-driven, plugged in underneath the real pynvml.

:class:`FakeNvml` stands in for the ``ctypes.CDLL`` object pynvml keeps in
``pynvml.nvmlLib``. Every C symbol is a Python callable receiving exactly the
ctypes arguments pynvml passes (``byref`` structures, string buffers, arrays)
and returning an NVML return code, so pynvml's own struct decoding and
``NVMLError`` raising run unchanged: code tested against the fake is tested
against the pynvml it will meet in production. Symbols the fake lacks raise
``NVMLError_FunctionNotFound``, as an older driver would.

The symbols are grouped by NVML area, one mixin per module, all standing on
``_core.DriverCore``; what each answers comes from a
:class:`~otel_gpu.sim.scenario.Scenario`.

Adding a symbol
---------------
Subclass :class:`FakeNvml` with one method named after the C symbol and
marked with :func:`c_symbol`. Starting it with :meth:`~DriverCore.check_device`
gives it everything a built-in device symbol gets: the init check, the handle
lookup, ``lost_after``, and NOT_SUPPORTED on MIG handles::

    class WithBoardId(FakeNvml):
        @c_symbol
        def nvmlDeviceGetBoardId(self, handle, out):
            target, sample = self.check_device("nvmlDeviceGetBoardId", handle)
            deref(out).value = 0x4200 + target.gpu.index  # or raise Fail(pynvml.NVML_ERROR_...)

For a scenario's ``unsupported`` / ``no_permission`` / ``errors`` / ``slow`` to
be allowed to name the new symbol, load it with the subclass's symbols:
``load_scenario(spec, device_symbols=WithBoardId.device_symbols())``.
"""

from __future__ import annotations

from typing import Any

from otel_gpu.sim.driver._core import DriverCore, Fail, Shape, c_symbol, deref
from otel_gpu.sim.driver.ecc import EccSymbols
from otel_gpu.sim.driver.events import EventSymbols
from otel_gpu.sim.driver.fabric import FabricSymbols
from otel_gpu.sim.driver.fields import FieldSymbols
from otel_gpu.sim.driver.gpm import GpmSymbols
from otel_gpu.sim.driver.identity import IdentitySymbols
from otel_gpu.sim.driver.mig import MigSymbols
from otel_gpu.sim.driver.nvlink import NvLinkSymbols
from otel_gpu.sim.driver.pcie import PcieSymbols
from otel_gpu.sim.driver.power import PowerSymbols
from otel_gpu.sim.driver.processes import ProcessSymbols
from otel_gpu.sim.driver.readings import ReadingSymbols
from otel_gpu.sim.driver.shapes import Hang, parse_shape
from otel_gpu.sim.driver.system import SystemSymbols

__all__ = ["DriverCore", "Fail", "FakeNvml", "c_symbol", "deref"]


class FakeNvml(
    SystemSymbols,
    IdentitySymbols,
    MigSymbols,
    ReadingSymbols,
    FieldSymbols,
    ProcessSymbols,
    EventSymbols,
    GpmSymbols,
    PowerSymbols,
    PcieSymbols,
    NvLinkSymbols,
    FabricSymbols,
    EccSymbols,
):
    """Stands in for ``pynvml.nvmlLib``: one attribute per implemented C symbol.

    ``FakeNvml(scenario, sleep=...)``: ``sleep`` is what ``slow`` faults and
    event-set waits block through; tests pass a recorder so nothing really
    sleeps. ``calls`` counts calls per symbol, ``sample`` the samples so far. The
    scenario's answer shapes are in place from the start; :meth:`answer_shape` adds more.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._hangs: list[Hang] = []
        super().__init__(*args, **kwargs)
        for spec in self.scenario.shapes:
            self.answer_shape(spec.function, parse_shape(spec.shape), after=spec.after)
        for gpu in self.scenario.devices:
            for spec in gpu.shapes:
                self.answer_shape(spec.function, parse_shape(spec.shape), gpu=gpu.index,
                                  after=spec.after)

    def answer_shape(self, symbol: str, shape: Shape, *, gpu: int | None = None,
                     after: int = 0) -> None:
        super().answer_shape(symbol, shape, gpu=gpu, after=after)
        if isinstance(shape, Hang):
            self._hangs.append(shape)

    def release_hangs(self) -> None:
        """Let every call blocked in a ``hang`` shape return (and later ones not block)."""
        for hang in self._hangs:
            hang.release()
