"""MIG through the fake: instance slots, parent lookups, and what a MIG handle answers."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.helpers import next_sample, token


def test_mig_enumeration_and_parent_lookup(nvml):
    nvml("a100-mig")
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot) for slot in range(4)]
    for slot in range(4, 7):
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
    assert [pynvml.nvmlDeviceGetName(m) for m in migs] == [
        f"NVIDIA A100-SXM4-40GB MIG {p}" for p in ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")
    ]
    assert [pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 5, 13, 14]
    assert [pynvml.nvmlDeviceGetComputeInstanceId(m) for m in migs] == [0, 0, 0, 0]
    assert [pynvml.nvmlDeviceIsMigDeviceHandle(m).value for m in migs] == [1, 1, 1, 1]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(gpu).value == 0
    uuids = [pynvml.nvmlDeviceGetUUID(m) for m in migs]
    assert len(set(uuids)) == 4 and all(u.startswith("MIG-") for u in uuids)
    tokens = {token(gpu)} | {token(m) for m in migs}
    assert len(tokens) == 5
    for m in migs:
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        assert token(parent) == token(gpu)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(uuids[2])) == uuids[2]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu)


def test_mig_instances_have_their_own_memory_and_little_else(nvml):
    nvml("a100-mig")
    next_sample()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot) for slot in range(4)]
    totals = [pynvml.nvmlDeviceGetMemoryInfo(m, version=pynvml.nvmlMemory_v2).total for m in migs]
    assert totals == [20937965568, 10468982784, 5100273664, 5100273664]
    m = migs[0]
    for call in (
        lambda: pynvml.nvmlDeviceGetUtilizationRates(m),
        lambda: pynvml.nvmlDeviceGetTemperature(m, pynvml.NVML_TEMPERATURE_GPU),
        lambda: pynvml.nvmlDeviceGetPowerUsage(m),
        lambda: pynvml.nvmlDeviceGetClockInfo(m, pynvml.NVML_CLOCK_SM),
        lambda: pynvml.nvmlDeviceGetSerial(m),
        lambda: pynvml.nvmlDeviceGetNumaNodeId(m),
        lambda: pynvml.nvmlDeviceGetEncoderUtilization(m),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    entries = pynvml.nvmlDeviceGetFieldValues(m, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert entries[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    # the parent in MIG mode has no utilization either, but its own power and temperature
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(gpu)
    assert pynvml.nvmlDeviceGetTemperature(gpu, pynvml.NVML_TEMPERATURE_GPU) == 34
    # MIG instances report their parent's PCI location
    assert pynvml.nvmlDeviceGetPciInfo(m).busId == "00000000:07:00.0"


def test_mig_processes_carry_instance_ids(nvml):
    nvml("a100-mig")
    next_sample()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    on_gpu = pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)
    assert [(p.pid, p.gpuInstanceId) for p in on_gpu] == [(7001, 1), (7002, 5), (7003, 13)]
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [7002]
    whole = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in whole] == [
        (8101, 0xFFFFFFFF, 0xFFFFFFFF)
    ]


def test_mig_capable_but_disabled(nvml):
    nvml("a100-mig")
    for index in (1, 2):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        next_sample()
        assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu in (60, 75)
