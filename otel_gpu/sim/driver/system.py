"""Library-wide symbols: init and shutdown, versions, the device count, error strings.

They take no device handle, so only the scenario's top-level ``errors`` can
make them fail. ``nvmlDeviceGetCount_v2`` lives here because it is the
collector's sample clock (see :attr:`DriverCore.sample`), not a device query.
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, arg_int, c_symbol, deref, write_text


class SystemSymbols(DriverCore):
    @c_symbol(system=True)
    def nvmlInitWithFlags(self, flags: Any) -> None:
        self.check_system("nvmlInitWithFlags", need_init=False)
        with self._lock:
            self._init_depth += 1

    @c_symbol(system=True)
    def nvmlInit_v2(self) -> None:
        self.check_system("nvmlInit_v2", need_init=False)
        with self._lock:
            self._init_depth += 1

    @c_symbol(system=True)
    def nvmlShutdown(self) -> None:
        self.check_system("nvmlShutdown")
        with self._lock:
            self._init_depth -= 1

    @c_symbol
    def nvmlErrorString(self, code: Any) -> bytes:
        value = arg_int(code)
        for name in dir(abi):
            if name.startswith("NVML_ERROR_") and getattr(abi, name) == value:
                return name[len("NVML_ERROR_"):].replace("_", " ").capitalize().encode()
        return b"Unknown Error" if value else b"Success"

    @c_symbol(system=True)
    def nvmlSystemGetDriverVersion(self, buf: Any, length: Any) -> None:
        self.check_system("nvmlSystemGetDriverVersion")
        write_text(buf, length, self.scenario.driver_version)

    @c_symbol(system=True)
    def nvmlSystemGetNVMLVersion(self, buf: Any, length: Any) -> None:
        self.check_system("nvmlSystemGetNVMLVersion")
        write_text(buf, length, self.scenario.nvml_version)

    @c_symbol(system=True)
    def nvmlDeviceGetCount_v2(self, count_ref: Any) -> None:
        self.check_system("nvmlDeviceGetCount_v2")
        deref(count_ref).value = len(self.scenario.devices)
