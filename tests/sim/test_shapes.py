"""Answer shapes: any symbol answering what real drivers answer and scenarios do not say,
seen through the real pynvml."""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import pynvml
import pytest

from otel_gpu import nvml_structs as structs
from otel_gpu.sim import ScenarioError, load_scenario
from otel_gpu.sim.driver.shapes import (
    ROW_PID,
    Entries,
    Filled,
    Hang,
    Resized,
    Returns,
    Signature,
    error_names,
    parse_shape,
)
from tests.sim.helpers import handles, next_sample, write

TWO = """
devices:
  - name: NVIDIA H100 80GB HBM3
    count: 2
    memory: {total: 1000, used: 100, reserved: 10}
    temperature: 40
    utilization: {gpu: 50, memory: 5}
    fields: {MEMORY_TEMP: 41, TOTAL_ENERGY_CONSUMPTION: 5000}
    processes: [{pid: 7, used_memory: 64, sm: 10}]
"""


@pytest.fixture
def two(nvml):
    lib = nvml(TWO)
    next_sample()
    return lib, handles()


def _temperature_v(lib: Any, handle: Any) -> int:
    """The versioned temperature call, a signed answer: through the binding where it has
    the call, else (nvidia-ml-py 12.x) made as nvml.h lays it out, to the simulated library."""
    if hasattr(pynvml, "nvmlDeviceGetTemperatureV"):
        return pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    reading = structs.Temperature(pynvml.NVML_TEMPERATURE_GPU)
    assert lib.nvmlDeviceGetTemperatureV(handle, ctypes.byref(reading)) == pynvml.NVML_SUCCESS
    return reading.temperature


def _code(call, *args) -> int:
    with pytest.raises(pynvml.NVMLError) as caught:
        call(*args)
    return caught.value.value


def test_every_return_code_pynvml_defines_is_a_shape():
    names = error_names()
    assert names[0] == "SUCCESS" and "NOT_FOUND" in names and "GPU_IS_LOST" in names
    assert len(names) == len(set(names)) > 25


def test_success_for_a_null_buffer_is_an_nvml_error_of_value_zero(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetProcessUtilization", Returns("SUCCESS"), gpu=0)
    assert _code(pynvml.nvmlDeviceGetProcessUtilization, h0, 0) == pynvml.NVML_SUCCESS
    lib.answer_shape("nvmlDeviceGetComputeRunningProcesses_v3", Returns("SUCCESS"))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h0) == []  # pynvml: nothing runs


def test_a_shape_on_one_gpu_leaves_the_other_alone(two):
    lib, (h0, h1) = two
    lib.answer_shape("nvmlDeviceGetTemperature", Returns("GPU_IS_LOST"), gpu=1)
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 40
    assert (_code(pynvml.nvmlDeviceGetTemperature, h1, pynvml.NVML_TEMPERATURE_GPU)
            == pynvml.NVML_ERROR_GPU_IS_LOST)


def test_a_shape_starts_after_its_sample(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetPowerUsage", Returns("UNKNOWN"), after=1)
    assert _code(pynvml.nvmlDeviceGetPowerUsage, h0) == pynvml.NVML_ERROR_NOT_SUPPORTED
    next_sample()
    assert _code(pynvml.nvmlDeviceGetPowerUsage, h0) == pynvml.NVML_ERROR_UNKNOWN


@pytest.mark.parametrize(("n", "pids"), [(0, []), (1, [ROW_PID]), (300, list(
    range(ROW_PID, ROW_PID + 300)))])
def test_entries(two, n, pids):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetComputeRunningProcesses_v3", Entries(n))
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
    assert [p.pid for p in procs] == pids
    assert all(p.usedGpuMemory == (i + 1) << 20 for i, p in enumerate(procs))


def test_a_count_past_the_buffer_breaks_pynvml_itself(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetComputeRunningProcesses_v3", Entries(1, over=True))
    with pytest.raises(IndexError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h0)


def test_no_entries_for_process_utilization_is_an_nvml_error_of_value_zero(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetProcessesUtilizationInfo", Entries(0))
    assert _code(pynvml.nvmlDeviceGetProcessesUtilizationInfo, h0, 0) == pynvml.NVML_SUCCESS


def test_a_list_that_grows_between_the_calls(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetComputeRunningProcesses_v3", Resized(1, 1000))
    assert (_code(pynvml.nvmlDeviceGetComputeRunningProcesses, h0)
            == pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    lib.clear_shapes()
    lib.answer_shape("nvmlDeviceGetProcessUtilization", Resized(3, 1))
    [row] = pynvml.nvmlDeviceGetProcessUtilization(h0, 0)
    assert row.pid == ROW_PID


def test_values_are_replaced_where_their_type_holds_them(two):
    lib, (h0, _) = two
    assert _temperature_v(lib, h0) == 40
    lib.answer_shape("nvmlDeviceGetTemperatureV", Filled("value", -5))
    assert _temperature_v(lib, h0) == -5
    lib.answer_shape("nvmlDeviceGetUtilizationRates", Filled("value", -5))
    rates = pynvml.nvmlDeviceGetUtilizationRates(h0)
    assert (rates.gpu, rates.memory) == (50, 5)  # unsigned: left as answered
    lib.answer_shape("nvmlDeviceGetMemoryInfo_v2", Filled("value", 101))
    mem = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
    assert (mem.total, mem.used, mem.free, mem.reserved) == (101,) * 4
    assert mem.version == pynvml.nvmlMemory_v2  # the frame stays


def test_all_ones_and_saturated_in_each_width(two):
    lib, (h0, _) = two
    lib.answer_shape("nvmlDeviceGetMemoryInfo_v2", Filled("all_ones"))
    assert pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2).used == 2**64 - 1
    lib.answer_shape("nvmlDeviceGetUtilizationRates", Filled("saturated"))
    assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 2**31 - 1


def test_field_values_change_type_to_hold_nan_and_negatives(two):
    lib, (h0, _) = two
    ids = [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_RETIRED_SBE]
    lib.answer_shape("nvmlDeviceGetFieldValues", Filled("value", math.nan))
    temp, retired = pynvml.nvmlDeviceGetFieldValues(h0, ids)
    assert temp.valueType == pynvml.NVML_VALUE_TYPE_DOUBLE and math.isnan(temp.value.dVal)
    assert retired.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # a failed entry stays
    lib.clear_shapes()
    lib.answer_shape("nvmlDeviceGetFieldValues", Filled("value", -1))
    temp, _ = pynvml.nvmlDeviceGetFieldValues(h0, ids)
    assert (temp.valueType, temp.value.sllVal) == (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, -1)


def test_a_hung_call_returns_once_released(two):
    lib, (h0, _) = two
    hang = Hang()
    lib.answer_shape("nvmlDeviceGetPowerUsage", hang)
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(_code(pynvml.nvmlDeviceGetPowerUsage,
                                                              h0)))
    thread.start()
    assert hang.entered.wait(5)
    assert thread.is_alive() and not out
    lib.release_hangs()
    thread.join(5)
    assert out == [pynvml.NVML_ERROR_NOT_SUPPORTED]


def test_signatures_say_which_shapes_apply(two):
    lib, (h0, _) = two
    lib.record_signatures = {}
    _temperature_v(lib, h0)
    pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
    pynvml.nvmlDeviceGetFieldValues(h0, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    pynvml.nvmlDeviceGetUUID(h0)
    temp = Signature.of(lib.record_signatures["nvmlDeviceGetTemperatureV"])
    assert temp.signed and not temp.doubles and not temp.is_list
    assert Signature.of(lib.record_signatures["nvmlDeviceGetComputeRunningProcesses_v3"]).is_list
    assert Signature.of(lib.record_signatures["nvmlDeviceGetFieldValues"]).doubles
    assert not Signature.of(lib.record_signatures["nvmlDeviceGetUUID"]).numeric


def test_a_scenario_names_shapes_by_text(nvml, tmp_path):
    nvml(TWO.replace("    count: 2\n", "    count: 2\n    shapes: [{function: "
                     "nvmlDeviceGetTemperature, shape: 'value:300', after: 1}]\n"))
    next_sample()
    h0, _ = handles()
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 40
    next_sample()
    assert pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) == 300


@pytest.mark.parametrize("text", ["returns:NOPE", "value:x", "entries:-1", "resized:1",
                                  "slow:9999", "wobble"])
def test_an_unknown_shape_is_a_scenario_error(tmp_path, text):
    with pytest.raises(ScenarioError, match=r"devices\[0\]\.shapes\[0\]\.shape"):
        load_scenario(write(tmp_path, f"devices: [{{name: X, shapes: [{{function: "
                                      f"nvmlDeviceGetName, shape: '{text}'}}]}}]"))


@pytest.mark.parametrize("text", ["returns:SUCCESS", "value:nan", "value:-1", "all_ones",
                                  "saturated", "entries:0", "entries:over", "resized:3:1",
                                  "hang", "slow:0.5"])
def test_the_text_of_a_shape_reads_back(text):
    assert parse_shape(text).text == text
