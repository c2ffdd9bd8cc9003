"""Power limits, the performance state and the time each policy held the clocks down.

The limits answer the scenario's ``power_limits`` (milliwatts);
``nvmlDeviceGetPowerManagementLimitConstraints`` needs both ``min`` and
``max``. ``nvmlDeviceGetViolationStatus`` answers ``violations`` (ns) with a
``referenceTime`` in microseconds that advances ten seconds per sample, as the
field timestamps do. An absent key answers NOT_SUPPORTED.
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim.driver._core import DriverCore, Fail, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import U64_MAX, VIOLATION_POLICIES

_TIMESTAMP_BASE_US = 1_700_000_000_000_000
_SAMPLE_PERIOD_US = 10_000_000


class PowerSymbols(DriverCore):
    def _limit(self, symbol: str, key: str, handle: Any, out: Any) -> None:
        target, sample = self.check_device(symbol, handle)
        value = target.gpu.power_limits.get(key)
        deref(out).value = self._uint(value, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> None:
        self._limit("nvmlDeviceGetPowerManagementLimit", "current", handle, out)

    @c_symbol
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> None:
        self._limit("nvmlDeviceGetEnforcedPowerLimit", "enforced", handle, out)

    @c_symbol
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, out: Any) -> None:
        self._limit("nvmlDeviceGetPowerManagementDefaultLimit", "default", handle, out)

    @c_symbol
    def nvmlDeviceGetPowerManagementLimitConstraints(
        self, handle: Any, min_out: Any, max_out: Any
    ) -> None:
        target, sample = self.check_device("nvmlDeviceGetPowerManagementLimitConstraints",
                                           handle)
        limits, k = target.gpu.power_limits, target.gpu.position
        if "min" not in limits or "max" not in limits:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        deref(min_out).value = self._uint(limits["min"], sample, k)
        deref(max_out).value = self._uint(limits["max"], sample, k)

    @c_symbol
    def nvmlDeviceGetPerformanceState(self, handle: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetPerformanceState", handle)
        deref(out).value = self._uint(target.gpu.performance_state, sample,
                                      target.gpu.position)

    @c_symbol
    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetViolationStatus", handle)
        names = [name for name, value in VIOLATION_POLICIES.items() if value == arg_int(policy)]
        if not names:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)  # the policies NVML has but we don't
        value = target.gpu.violations.get(names[0])
        time = deref(out)
        time.violationTime = self._uint(value, sample, target.gpu.position, U64_MAX)
        time.referenceTime = _TIMESTAMP_BASE_US + sample * _SAMPLE_PERIOD_US
