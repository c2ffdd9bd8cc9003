"""The fake driver at the library boundary: symbols, handles, readings and time."""

from __future__ import annotations

import ctypes
import threading

import pynvml
import pytest

from otel_gpu.sim import (
    DEVICE_SYMBOLS,
    FakeNvml,
    ScenarioError,
    load_scenario,
)
from tests.sim.helpers import FAULTS, field, handles, next_sample, write
from tests.support.drivers import WithBoardId

# --- the library boundary ----------------------------------------------------------


def test_calls_are_counted_per_symbol(nvml):
    fake = nvml("t4")
    assert fake.calls["nvmlInitWithFlags"] == 1
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    for _ in range(3):
        pynvml.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex_v2"] == 1
    assert fake.total_calls == 6


def test_call_counting_is_thread_safe(nvml):
    fake = nvml("h100x8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)

    def work() -> None:
        for _ in range(500):
            pynvml.nvmlDeviceGetIndex(h)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls["nvmlDeviceGetIndex"] == 4000


def test_unimplemented_symbol_is_function_not_found(nvml):
    nvml("t4")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBAR1MemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_calls_need_init_and_fail_after_shutdown(nvml):
    nvml("t4", init=False)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetHandleByIndex(0)


def test_bad_handles_and_indexes_are_invalid_arguments(nvml):
    nvml("t4")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(pynvml.c_nvmlDevice_t())
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_error_strings_come_from_the_fake(nvml):
    nvml("t4")
    # pynvml asks the library for codes it has no text of its own for
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)) == "In use"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "Gpu is lost"


# --- readings and time -------------------------------------------------------------


def test_sample_counts_device_count_calls(nvml):
    fake = nvml(FAULTS)
    assert fake.sample == 0
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceGetName(h)
    assert fake.sample == 0
    next_sample()
    next_sample()
    assert fake.sample == 2


def test_values_follow_step_and_cycle(nvml):
    nvml(FAULTS, sleep=lambda seconds: None)  # temperature is slow from sample 2 on
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    temps, utils = [], []
    for _ in range(4):
        next_sample()
        temps.append(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
        utils.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
    assert temps == [40, 41, 42, 43]
    assert utils == [10, 50, 90, 10]


def test_memory_v1_counts_reserved_as_used(nvml):
    nvml(FAULTS)
    next_sample()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.used, v2.reserved) == (1073741824, 371195904)
    assert v1.used == v2.used + v2.reserved
    assert v1.free == v2.free == v2.total - v2.used - v2.reserved


def test_non_integer_field_is_a_double(nvml):
    nvml(FAULTS)
    next_sample()
    entry = field(pynvml.nvmlDeviceGetHandleByIndex(1), "MEMORY_TEMP")
    assert entry.valueType == pynvml.NVML_VALUE_TYPE_DOUBLE
    assert entry.value.dVal == 51.5


def test_identity_from_scenario(nvml):
    nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetUUID(h) == "GPU-0f0f0f0f-0000-4000-8000-000000000000"
    assert pynvml.nvmlDeviceGetSerial(h) == "1320000000000"
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    assert (pci.busId, pci.bus, pci.domain) == ("00000000:3B:00.0", 0x3B, 0)
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"


def test_processes_two_call_protocol(nvml):
    fake = nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    next_sample()
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(100, 1048576)]
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # size, then fill
    next_sample()
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(100, 1048576), (101, None)]
    # a buffer one short is refused with the size it needs
    count = ctypes.c_uint(1)
    infos = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    assert fn(h, ctypes.byref(count), infos) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    next_sample()
    next_sample()  # sample 4: pid 101 is gone (until_sample: 3)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [100]


def test_no_processes_is_a_single_successful_call(nvml):
    fake = nvml("t4")
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1


# --- adding a symbol ------------------------------------------------------------------


def test_the_built_in_device_symbols_are_the_drivers():
    assert WithBoardId.device_symbols() == DEVICE_SYMBOLS | {"nvmlDeviceGetBoardId"}
    assert "nvmlDeviceGetCount_v2" in FakeNvml.system_symbols() - DEVICE_SYMBOLS
    assert "nvmlDeviceGetPowerUsage" in DEVICE_SYMBOLS - FakeNvml.mig_symbols()
    assert FakeNvml.mig_symbols() < DEVICE_SYMBOLS


def test_a_scenario_may_fault_what_the_driver_marks(tmp_path):
    """The symbols each level's faults may name are the driver's, by its c_symbol marks."""
    system, mig = sorted(FakeNvml.system_symbols()), sorted(FakeNvml.mig_symbols())
    errors = ", ".join(f"{name}: UNKNOWN" for name in system)
    path = write(tmp_path, f"""
errors: {{{errors}}}
devices:
  - name: NVIDIA A30
    unsupported: [{", ".join(sorted(DEVICE_SYMBOLS))}]
    mig: [{{profile: 1g.6gb, gpu_instance_id: 3, unsupported: [{", ".join(mig)}]}}]
""")
    scenario = load_scenario(path)
    assert sorted(scenario.faults.calls) == system
    assert set(scenario.devices[0].faults.calls) == DEVICE_SYMBOLS
    assert sorted(scenario.devices[0].mig[0].faults.calls) == mig
    unmarked = write(tmp_path, "devices:\n  - name: NVIDIA A30\n    mig: [{profile: 1g.6gb, "
                               "gpu_instance_id: 3, unsupported: [nvmlDeviceGetPowerUsage]}]\n",
                     "unmarked.yaml")
    with pytest.raises(ScenarioError, match="unknown NVML function 'nvmlDeviceGetPowerUsage'"):
        load_scenario(unmarked)


def test_a_subclass_adds_a_symbol_with_one_method(nvml):
    nvml("t4")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):  # the built-in driver lacks it
        pynvml.nvmlDeviceGetBoardId(h)
    fake = nvml("t4", driver=WithBoardId)
    assert [pynvml.nvmlDeviceGetBoardId(h) for h in handles()] == [0, 8]
    assert fake.calls["nvmlDeviceGetBoardId"] == 2
    assert pynvml.nvmlDeviceGetName(h) == "Tesla T4"  # the rest still answers


def test_device_faults_apply_to_an_added_symbol(nvml, tmp_path):
    path = write(tmp_path, """
devices:
  - name: NVIDIA L4
    unsupported: [nvmlDeviceGetBoardId]
  - name: NVIDIA L4
    errors: {nvmlDeviceGetBoardId: UNKNOWN}
  - name: NVIDIA L4
    slow: [{function: nvmlDeviceGetBoardId, seconds: 1.5}]
    lost_after: 1
  - name: NVIDIA A30
    mig: [{profile: 1g.6gb, gpu_instance_id: 3}]
""", "board.yaml")
    with pytest.raises(ScenarioError, match=r"unknown NVML function or field "
                                            r"'nvmlDeviceGetBoardId'"):
        load_scenario(path)  # the built-in driver's symbols only
    slept: list[float] = []
    nvml(load_scenario(path, device_symbols=WithBoardId.device_symbols()), driver=WithBoardId,
         sleep=slept.append)
    hs = handles()
    next_sample()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetBoardId(hs[0])
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetBoardId(hs[1])
    assert pynvml.nvmlDeviceGetBoardId(hs[2]) == 8
    assert slept == [1.5]
    assert pynvml.nvmlDeviceGetBoardId(hs[3]) == 8
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(hs[3], 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # not a MIG symbol
        pynvml.nvmlDeviceGetBoardId(mig)
    next_sample()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetBoardId(hs[2])
