"""Simulated drivers that differ from the built-in one in one way each: older, refusing,
recording, or with a call the simulator lacks.

Each is a :class:`otel_gpu.sim.FakeNvml` subclass, installed with
``fake_nvml(spec, driver=...)``; what it records lives on the instance.
"""

from __future__ import annotations

from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sim import Fail, FakeNvml, c_symbol, deref
from otel_gpu.sim.driver._core import arg_int
from otel_gpu.sim.driver.fields import PLAIN

LINK_STATE = abi.NVML_FI_DEV_NVLINK_GET_STATE


# --- field-value calls -----------------------------------------------------------------------


class Recording(FakeNvml):
    """Records the (field id, scope id) pairs of every field request, per call; the pairs in
    ``failing`` (set on the class, reset by the test) answer TIMEOUT."""

    failing: set[tuple[int, int]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.requests: list[list[tuple[int, int]]] = []
        super().__init__(*args, **kwargs)

    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        super().nvmlDeviceGetFieldValues(handle, count, values_ref)
        values = deref(values_ref)
        pairs = [(values[i].fieldId, values[i].scopeId) for i in range(arg_int(count))]
        self.requests.append(pairs)
        for i, pair in enumerate(pairs):
            if pair in self.failing:
                values[i].nvmlReturn = abi.NVML_ERROR_TIMEOUT


class OlderDriver(FakeNvml):
    """A driver that does not know the newer field ids (the values with a call of their own,
    the NVLink link states); it records each field request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requested: list[set[int]] = []

    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        super().nvmlDeviceGetFieldValues(handle, count, values_ref)
        values = deref(values_ref)
        asked = {values[i].fieldId for i in range(arg_int(count))}
        self.requested.append(asked)
        for i in range(arg_int(count)):
            if values[i].fieldId in PLAIN or values[i].fieldId == LINK_STATE:
                values[i].nvmlReturn = abi.NVML_ERROR_NOT_SUPPORTED


class RefusingDriver(FakeNvml):
    """A driver that refuses the whole field call when it holds an id it does not know."""

    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        values = deref(values_ref)
        if any(values[i].fieldId in PLAIN for i in range(arg_int(count))):
            raise Fail(abi.NVML_ERROR_INVALID_ARGUMENT)
        super().nvmlDeviceGetFieldValues(handle, count, values_ref)


class FailsSampleTwo(FakeNvml):
    """Every field call of the second sample fails UNKNOWN, as on a GPU that stops
    answering for a moment."""

    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        if self.sample == 2:
            raise Fail(abi.NVML_ERROR_UNKNOWN)
        super().nvmlDeviceGetFieldValues(handle, count, values_ref)


# --- NVLink link states ----------------------------------------------------------------------


class StateFields(Recording):
    """A driver whose batched link states differ from the simulator's: ``edit`` changes
    each state entry of a field-value call."""

    def edit(self, value: Any) -> None:
        raise NotImplementedError

    @c_symbol
    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values_ref: Any) -> None:
        super().nvmlDeviceGetFieldValues(handle, count, values_ref)
        values = deref(values_ref)
        for i in range(arg_int(count)):
            if values[i].fieldId == LINK_STATE:
                self.edit(values[i])


class LinkTwoComesUp(StateFields):
    """Link 2 (inactive in the scenario) is up from sample 3 on, in either answer."""

    @c_symbol
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, out: Any) -> None:
        super().nvmlDeviceGetNvLinkState(handle, link, out)
        if arg_int(link) == 2 and self.sample >= 3:
            deref(out).value = abi.NVML_FEATURE_ENABLED

    def edit(self, value: Any) -> None:
        if value.scopeId == 2 and self.sample >= 3:
            value.value.uiVal = abi.NVML_NVLINK_STATE_ACTIVE


class StatesSayInactive(StateFields):
    """A driver whose batched states disagree with its calls per link."""

    def edit(self, value: Any) -> None:
        value.value.uiVal = abi.NVML_NVLINK_STATE_INACTIVE


class NoStateField(StateFields):
    """A driver without the state field id."""

    def edit(self, value: Any) -> None:
        value.nvmlReturn = abi.NVML_ERROR_INVALID_ARGUMENT


# --- symbols the built-in driver has not, or lacks ------------------------------------------


class WithBoardId(FakeNvml):
    """The built-in driver plus one NVML call: board id 0 on GPU 0, 8 on the others."""

    @c_symbol
    def nvmlDeviceGetBoardId(self, handle: Any, out: Any) -> None:
        target, _ = self.check_device("nvmlDeviceGetBoardId", handle)
        deref(out).value = 0 if target.gpu.index == 0 else 8


class WithoutGpm(FakeNvml):
    """A driver before R520: no GPM symbols."""

    @property
    def nvmlGpmQueryDeviceSupport(self) -> Any:
        raise AttributeError("nvmlGpmQueryDeviceSupport")


class TimedGpm(FakeNvml):
    """Each GPM sample takes ``step`` seconds of ``clock`` (a one-element list the test
    reads as its clock), so a test sees how long a round of them took."""

    clock: list[float]
    step: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = [0.0]

    @c_symbol
    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> None:
        self.clock[0] += self.step
        super().nvmlGpmSampleGet(handle, sample)


# --- answers no return code explains ---------------------------------------------------------


class SuccessWithoutBuffer(FakeNvml):
    """Answers the per-process utilization size queries with SUCCESS and no count, as
    NVIDIA's mock libnvidia-ml does."""

    @c_symbol
    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any,
                                        stamp: Any) -> None:
        self.check_device("nvmlDeviceGetProcessUtilization", handle)

    @c_symbol
    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, info: Any) -> None:
        self.check_device("nvmlDeviceGetProcessesUtilizationInfo", handle)


class TemperatureRaises(FakeNvml):
    """The temperature call raises on GPU 1 what no return code explains (as a malformed
    answer makes pynvml or ctypes raise): the versioned call, and the older one that a
    binding without the versioned call makes."""

    @c_symbol
    def nvmlDeviceGetTemperatureV(self, handle: Any, reading: Any) -> Any:
        target, _ = self.check_device("nvmlDeviceGetTemperatureV", handle)
        if target.gpu.index == 1:
            raise ZeroDivisionError("what a malformed answer makes of a reader")
        return super().nvmlDeviceGetTemperatureV(handle, reading)

    @c_symbol
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> Any:
        target, _ = self.check_device("nvmlDeviceGetTemperature", handle)
        if target.gpu.index == 1:
            raise ZeroDivisionError("what a malformed answer makes of a reader")
        return super().nvmlDeviceGetTemperature(handle, sensor, out)
