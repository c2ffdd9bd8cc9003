"""Injected faults: unsupported and failing calls and fields, lost GPUs, slow calls."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.helpers import FAULTS, next_sample, write


def test_unsupported_function_raises_not_supported(nvml):
    nvml(FAULTS)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_field_faults_are_per_entry_while_the_call_succeeds(nvml):
    nvml(FAULTS)
    next_sample()
    names = ["TOTAL_ENERGY_CONSUMPTION", "MEMORY_TEMP", "PCIE_REPLAY_COUNTER",
             "ECC_DBE_VOL_TOTAL", "NVLINK_THROUGHPUT_DATA_TX"]
    entries = pynvml.nvmlDeviceGetFieldValues(
        pynvml.nvmlDeviceGetHandleByIndex(0), [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in names]
    )
    assert [e.nvmlReturn for e in entries] == [
        pynvml.NVML_SUCCESS,
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # listed in fields, but `unsupported` wins
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_CORRUPTED_INFOROM,
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # not listed at all
    ]
    assert entries[0].value.ullVal == 1000
    assert [e.fieldId for e in entries] == [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in names]


def test_errors_inject_the_named_error_on_that_device_only(nvml):
    nvml(FAULTS)
    with pytest.raises(pynvml.NVMLError_NotReady):
        pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(1)) == 41000


def test_system_errors_fail_init(nvml, tmp_path):
    path = write(tmp_path, "errors: {nvmlInitWithFlags: DRIVER_NOT_LOADED}\ndevices: []\n")
    nvml(path, init=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_lost_after_fails_every_call_on_that_gpu_from_the_next_sample(nvml):
    fake = nvml(FAULTS)
    good, lost = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    for _ in range(2):
        next_sample()
        assert pynvml.nvmlDeviceGetTemperature(lost, pynvml.NVML_TEMPERATURE_GPU) == 50
    assert next_sample() == 2  # sample 3: the GPU is gone but still counted
    assert fake.sample == 3
    for call in (
        lambda: pynvml.nvmlDeviceGetTemperature(lost, pynvml.NVML_TEMPERATURE_GPU),
        lambda: pynvml.nvmlDeviceGetName(lost),
        lambda: pynvml.nvmlDeviceGetUUID(lost),
        lambda: pynvml.nvmlDeviceGetMemoryInfo(lost, version=pynvml.nvmlMemory_v2),
        lambda: pynvml.nvmlDeviceGetFieldValues(lost, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: pynvml.nvmlDeviceGetHandleByIndex(1),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetName(good) == "NVIDIA L4"


def test_lost_gpu_takes_its_mig_instances_along(nvml, tmp_path):
    path = write(tmp_path, """
devices:
  - name: NVIDIA A30
    lost_after: 0
    mig: [{profile: 1g.6gb, gpu_instance_id: 3, memory: {total: 6000000000}}]
""", "lost_mig.yaml")
    nvml(path)
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 6000000000
    next_sample()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(mig)


def test_slow_sleeps_through_the_injected_sleep(nvml):
    slept: list[float] = []
    nvml(FAULTS, sleep=slept.append)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    next_sample()  # sample 1: `after: 1` means not yet
    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    assert slept == []
    next_sample()
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 41
    pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(1),
                                    pynvml.NVML_TEMPERATURE_GPU)
    assert slept == [2.5]


def test_not_available_answers_success_with_all_ones_in_the_c_width(nvml):
    nvml("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: 100000
            power_limits: {current: 650000, enforced: 640000, default: 700000}
            fields: {TOTAL_ENERGY_CONSUMPTION: 5}
            not_available: [nvmlDeviceGetPowerUsage, nvmlDeviceGetMemoryInfo_v2,
                            TOTAL_ENERGY_CONSUMPTION, nvmlDeviceGetEnforcedPowerLimit]
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: 100000
    """)
    next_sample()
    gpu, other = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlDeviceGetPowerUsage(gpu) == 0xFFFFFFFF
    assert pynvml.nvmlDeviceGetPowerUsage(other) == 100000  # that device only
    memory = pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2)
    assert memory.total == memory.used == 2**64 - 1
    energy, enforced, current = pynvml.nvmlDeviceGetFieldValues(gpu, [
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT])
    assert energy.nvmlReturn == enforced.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert energy.value.ullVal == 2**64 - 1
    assert enforced.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT  # as its call: 32 bits
    assert enforced.value.uiVal == 0xFFFFFFFF
    assert current.value.uiVal == 650000
