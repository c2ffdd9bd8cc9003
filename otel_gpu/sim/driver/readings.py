"""The gauges a sample reads one call at a time: memory, utilization, temperature,
power, clocks (current and maximum), clock event reasons and fan speed.

Each answers the scenario's VALUE for the current sample and the GPU's
position in its ``count`` entry, clamped to the C type's range; an absent key
answers NOT_SUPPORTED. Only memory answers on a MIG handle (the instance's own). The
encoder and decoder calls answer the GPU's ``codec_sampling_period`` beside the value.
"""

from __future__ import annotations

from typing import Any

import pynvml

from otel_gpu import nvml_abi as abi
from otel_gpu import nvml_structs as structs
from otel_gpu.sim.driver._core import DriverCore, Fail, Target, arg_int, c_symbol, deref
from otel_gpu.sim.scenario import CLOCKS, U64_MAX, Value


class ReadingSymbols(DriverCore):
    # --- memory -------------------------------------------------------------------------

    @staticmethod
    def _memory(target: Target, sample: int) -> tuple[int, int, int, int]:
        memory = target.mig.memory if target.mig else target.gpu.memory
        if memory is None:
            raise Fail(abi.NVML_ERROR_NOT_SUPPORTED)
        return memory.at(sample, target.gpu.position)

    @c_symbol(mig=True)
    def nvmlDeviceGetMemoryInfo(self, handle: Any, mem_ref: Any) -> None:
        total, reserved, used, free = self._memory(*self.check_device("nvmlDeviceGetMemoryInfo",
                                                                      handle))
        mem = deref(mem_ref)
        # v1 has no "reserved": the driver counts it as used.
        mem.total, mem.used, mem.free = total, used + reserved, free

    @c_symbol(mig=True)
    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, mem_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetMemoryInfo_v2", handle)
        mem = deref(mem_ref)
        if mem.version != pynvml.nvmlMemory_v2:
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        mem.total, mem.reserved, mem.used, mem.free = self._memory(target, sample)

    # --- utilization --------------------------------------------------------------------

    @c_symbol
    def nvmlDeviceGetUtilizationRates(self, handle: Any, util_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetUtilizationRates", handle)
        k, util = target.gpu.position, target.gpu.utilization
        out = deref(util_ref)
        out.gpu = self._uint(util.get("gpu"), sample, k)
        out.memory = self._uint(util.get("memory", Value()), sample, k)

    def _codec(self, symbol: str, key: str, handle: Any, util: Any, period: Any) -> None:
        target, sample = self.check_device(symbol, handle)
        value = self._uint(target.gpu.utilization.get(key), sample, target.gpu.position)
        deref(util).value = value
        deref(period).value = target.gpu.codec_sampling_period

    @c_symbol
    def nvmlDeviceGetEncoderUtilization(self, handle: Any, util: Any, period: Any) -> None:
        self._codec("nvmlDeviceGetEncoderUtilization", "encoder", handle, util, period)

    @c_symbol
    def nvmlDeviceGetDecoderUtilization(self, handle: Any, util: Any, period: Any) -> None:
        self._codec("nvmlDeviceGetDecoderUtilization", "decoder", handle, util, period)

    # --- temperature and power ----------------------------------------------------------

    @c_symbol
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetTemperature", handle)
        if arg_int(sensor) != abi.NVML_TEMPERATURE_GPU:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        deref(out).value = self._uint(target.gpu.temperature, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetTemperatureV(self, handle: Any, temp_ref: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetTemperatureV", handle)
        temp = deref(temp_ref)
        if temp.version != structs.NVML_TEMPERATURE_V1:  # nvml.h's word, not the binding's
            raise Fail(abi.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if temp.sensorType != abi.NVML_TEMPERATURE_GPU:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        temp.temperature = self._uint(target.gpu.temperature, sample, target.gpu.position,
                                      2**31 - 1)

    @c_symbol
    def nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetPowerUsage", handle)
        deref(out).value = self._uint(target.gpu.power, sample, target.gpu.position)

    # --- clocks and fan -----------------------------------------------------------------

    @c_symbol
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetClockInfo", handle)
        kind = arg_int(clock_type)
        names = [name for name, value in CLOCKS.items() if value == kind]
        if not names:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        value = target.gpu.clocks.get(names[0])
        deref(out).value = self._uint(value, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetMaxClockInfo", handle)
        names = [name for name, value in CLOCKS.items() if value == arg_int(clock_type)]
        if not names:
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        value = target.gpu.max_clocks.get(names[0])
        deref(out).value = self._uint(value, sample, target.gpu.position)

    @c_symbol
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        deref(out).value = self._uint(target.gpu.clock_event_reasons, sample,
                                      target.gpu.position, U64_MAX)

    @c_symbol
    def nvmlDeviceGetFanSpeed(self, handle: Any, out: Any) -> None:
        target, sample = self.check_device("nvmlDeviceGetFanSpeed", handle)
        deref(out).value = self._uint(target.gpu.fan_speed, sample, target.gpu.position)
