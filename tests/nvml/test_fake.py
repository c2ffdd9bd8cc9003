"""The fake NVML, exercised only through the real pynvml API above it."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from otel_gpu.nvml.fake import (
    FakeNvml,
    Scenario,
    ScenarioError,
    builtin_profiles,
    install,
    load_scenario,
    uninstall,
)

SCENARIOS = Path(__file__).with_name("scenarios")
FAULTS = str(SCENARIOS / "faults.yaml")


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"unexpected sleep({seconds})")


@pytest.fixture
def nvml() -> Iterator[Callable[..., FakeNvml]]:
    """Install a fake for one test: ``nvml("t4")`` or ``nvml(path, sleep=recorder)``."""

    def start(spec: str | Scenario, *, sleep: Callable[[float], None] = _no_sleep,
              init: bool = True) -> FakeNvml:
        scenario = spec if isinstance(spec, Scenario) else load_scenario(spec)
        fake = FakeNvml(scenario, sleep=sleep)
        install(fake)
        if init:
            pynvml.nvmlInit()
        return fake

    yield start
    uninstall()


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def next_sample() -> int:
    """What the collector's sampler does first in every sample."""
    return pynvml.nvmlDeviceGetCount()


def handles() -> list:
    """Every GPU handle, without calling nvmlDeviceGetCount (that would start a sample)."""
    out = []
    while True:
        try:
            out.append(pynvml.nvmlDeviceGetHandleByIndex(len(out)))
        except pynvml.NVMLError_InvalidArgument:
            return out


def field(handle, name: str):
    return pynvml.nvmlDeviceGetFieldValues(handle, [getattr(pynvml, f"NVML_FI_DEV_{name}")])[0]


def token(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value


# --- built-in profiles -----------------------------------------------------------------


def test_builtin_profiles_are_listed_sorted():
    assert builtin_profiles() == ["a100-mig", "h100x8", "t4"]


@pytest.mark.parametrize(("profile", "count", "model"), [
    ("h100x8", 8, "NVIDIA H100 80GB HBM3"),
    ("a100-mig", 3, "NVIDIA A100-SXM4-40GB"),
    ("t4", 2, "Tesla T4"),
])
def test_profile_loads_and_enumerates(nvml, profile, count, model):
    nvml(profile)
    assert pynvml.nvmlDeviceGetCount() == count
    hs = handles()
    assert [pynvml.nvmlDeviceGetName(h) for h in hs] == [model] * count
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in hs]
    assert len(set(uuids)) == count and all(u.startswith("GPU-") for u in uuids)
    bus_ids = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in hs]
    assert len(set(bus_ids)) == count
    assert [pynvml.nvmlDeviceGetIndex(h) for h in hs] == list(range(count))
    assert [pynvml.nvmlDeviceGetMinorNumber(h) for h in hs] == list(range(count))
    for i, uuid in enumerate(uuids):
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
    assert isinstance(pynvml.nvmlSystemGetDriverVersion(), str)
    assert len({token(h) for h in hs}) == count


def test_generated_identity_is_deterministic():
    first, second = load_scenario("h100x8"), load_scenario("h100x8")
    assert [d.uuid for d in first.devices] == [d.uuid for d in second.devices]
    assert first.name == "h100x8" and first.driver_version == "550.90.07"


def test_h100x8_has_distinct_readings_per_gpu(nvml):
    nvml("h100x8")
    next_sample()
    hs = handles()
    readings = {
        "temperature": [pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                        for h in hs],
        "power": [pynvml.nvmlDeviceGetPowerUsage(h) for h in hs],
        "memory.used": [pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
                        for h in hs],
        "util.gpu": [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in hs],
        "clock.sm": [pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) for h in hs],
        "clock.graphics": [pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS)
                           for h in hs],
        "memory_temp": [field(h, "MEMORY_TEMP").value.ullVal for h in hs],
    }
    for name, values in readings.items():
        assert len(set(values)) == 8, (name, values)
    assert readings["temperature"] == [31, 33, 35, 37, 39, 41, 43, 45]
    mem = pynvml.nvmlDeviceGetMemoryInfo(hs[0], version=pynvml.nvmlMemory_v2)
    assert mem.total == 85520809984
    assert mem.free == mem.total - mem.used - mem.reserved


def test_h100x8_topology_fan_and_processes(nvml):
    nvml("h100x8")
    next_sample()
    hs = handles()
    assert [pynvml.nvmlDeviceGetNumaNodeId(h) for h in hs] == [0] * 4 + [1] * 4
    for h in hs:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(h)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetMigMode(h)
    pids = [sorted(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)) for h in hs]
    assert pids == [[4242, 4243], [], [], [], [], [5151], [], []]


H100_COUNTERS = ("TOTAL_ENERGY_CONSUMPTION", "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES",
                 "NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX",
                 "PCIE_REPLAY_COUNTER", "ECC_SBE_VOL_TOTAL")


def test_h100x8_counters_rise_with_samples(nvml):
    nvml("h100x8")
    ids = [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in H100_COUNTERS]
    ids.append(pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL)
    series = []
    for _ in range(3):
        next_sample()
        entries = pynvml.nvmlDeviceGetFieldValues(pynvml.nvmlDeviceGetHandleByIndex(3), ids)
        assert all(e.nvmlReturn == pynvml.NVML_SUCCESS for e in entries)
        assert all(e.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG for e in entries)
        series.append([e.value.ullVal for e in entries])
    for i, name in enumerate(H100_COUNTERS):
        assert series[0][i] < series[1][i] < series[2][i], name
    assert [s[-1] for s in series] == [0, 0, 0]  # no double-bit errors, ever


def test_h100x8_remap_fields_supported(nvml):
    nvml("h100x8")
    next_sample()
    names = ["REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING", "REMAPPED_FAILURE"]
    entries = pynvml.nvmlDeviceGetFieldValues(
        pynvml.nvmlDeviceGetHandleByIndex(2), [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in names]
    )
    assert [e.nvmlReturn for e in entries] == [pynvml.NVML_SUCCESS] * 4
    assert [e.value.ullVal for e in entries] == [2, 0, 0, 0]


def test_t4_lacks_what_t4_lacks(nvml):
    nvml("t4")
    next_sample()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    missing = ["MEMORY_TEMP", "NVLINK_THROUGHPUT_DATA_TX", "NVLINK_THROUGHPUT_DATA_RX",
               "REMAPPED_COR", "REMAPPED_UNC", "REMAPPED_PENDING", "REMAPPED_FAILURE",
               "PCIE_COUNT_TX_BYTES", "PCIE_COUNT_RX_BYTES"]
    ids = [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    ids += [getattr(pynvml, f"NVML_FI_DEV_{n}") for n in missing]
    entries = pynvml.nvmlDeviceGetFieldValues(h, ids)
    assert entries[0].nvmlReturn == pynvml.NVML_SUCCESS and entries[0].value.ullVal > 0
    assert [e.nvmlReturn for e in entries[1:]] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * len(missing)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
    encoder, period = pynvml.nvmlDeviceGetEncoderUtilization(h)
    assert (encoder, period) == (5, 167000)
    assert pynvml.nvmlDeviceGetDecoderUtilization(pynvml.nvmlDeviceGetHandleByIndex(1))[0] == 32


# --- MIG --------------------------------------------------------------------------------


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


# --- readings and time ------------------------------------------------------------------


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


# --- faults -----------------------------------------------------------------------------


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


def test_xid_events_are_delivered_once_then_timeout(nvml):
    nvml(FAULTS)
    hs = handles()
    event_set = pynvml.nvmlEventSetCreate()
    for h in hs:
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
    next_sample()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    next_sample()
    next_sample()  # sample 3: GPU 0's sample-2 XID and GPU 1's sample-3 XID are due
    got = []
    for _ in range(2):
        data = pynvml.nvmlEventSetWait_v2(event_set, 0)
        assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
        # GPU 1 is lost by now (lost_after: 2), so match the handle, don't query it
        got.append((hs.index(next(h for h in hs if token(h) == token(data.device))),
                    data.eventData, data.gpuInstanceId))
    assert got == [(0, 79, 0xFFFFFFFF), (1, 79, 0xFFFFFFFF)]
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(event_set, 0).eventData == 48
    pynvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_events_need_registration_and_each_set_gets_its_own_copy(nvml):
    nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    unregistered, first, second = (pynvml.nvmlEventSetCreate() for _ in range(3))
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, first)
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, second)
    next_sample()
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(first, 0).eventData == 79
    assert pynvml.nvmlEventSetWait_v2(second, 0).eventData == 79
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(unregistered, 0)


def test_events_from_before_registration_are_not_delivered(nvml):
    nvml(FAULTS)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(3):
        next_sample()
    late = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, late)
    with pytest.raises(pynvml.NVMLError_Timeout):  # the sample-2 XID happened before
        pynvml.nvmlEventSetWait_v2(late, 0)
    next_sample()
    assert pynvml.nvmlEventSetWait_v2(late, 0).eventData == 48


def test_event_wait_blocks_through_the_injected_sleep(nvml):
    slept: list[float] = []
    nvml(FAULTS, sleep=slept.append)
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 250)
    assert slept == [0.25]


def test_events_on_a_mig_handle_are_not_supported(nvml):
    nvml("a100-mig")
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(mig, pynvml.nvmlEventTypeXidCriticalError,
                                        pynvml.nvmlEventSetCreate())


# --- the library boundary ---------------------------------------------------------------


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


def test_uninstall_restores_the_previous_library():
    sentinel = object()
    before = pynvml.nvmlLib
    pynvml.nvmlLib = sentinel
    try:
        install(FakeNvml(load_scenario("t4")))
        pynvml.nvmlInit()
        assert isinstance(pynvml.nvmlLib, FakeNvml)
        uninstall()
        assert pynvml.nvmlLib is sentinel
        assert "nvmlInitWithFlags" not in pynvml._nvmlGetFunctionPointer_cache
    finally:
        pynvml.nvmlLib = before


# --- scenario validation ----------------------------------------------------------------

GPU = "devices:\n  - name: NVIDIA L4\n"


@pytest.mark.parametrize(("text", "message"), [
    (GPU + "    memory: {total: x}\n",
     "devices[0].memory.total: expected a non-negative integer, got 'x'"),
    ("colour: blue\n" + GPU, "colour: unknown key (allowed: "),
    (GPU + "    colour: blue\n", "devices[0].colour: unknown key"),
    (GPU + "    memory: {total: 1, free: 2}\n", "devices[0].memory.free: unknown key"),
    (GPU + "    uuid: GPU-a\n  - name: NVIDIA L4\n    uuid: GPU-a\n",
     "devices[1].uuid: duplicate uuid 'GPU-a' (also used by devices[0].uuid)"),
    (GPU + "    uuid: MIG-a\n", "devices[0].uuid: expected a UUID starting with 'GPU-'"),
    (GPU + "    errors: {nvmlDeviceGetPowerUsage: BOGUS}\n",
     "devices[0].errors.nvmlDeviceGetPowerUsage: unknown NVML error 'BOGUS'"),
    (GPU + "    fields: {NOT_A_FIELD: 1}\n", "devices[0].fields.NOT_A_FIELD: unknown NVML field"),
    (GPU + "    unsupported: [nvmlDeviceGetBogus]\n",
     "devices[0].unsupported[0]: unknown NVML function or field 'nvmlDeviceGetBogus'"),
    (GPU + "    unsupported: [nvmlDeviceGetFanSpeed]\n    no_permission: [nvmlDeviceGetFanSpeed]\n",
     "devices[0].no_permission[0]: 'nvmlDeviceGetFanSpeed' is also listed at "
     "devices[0].unsupported[0]"),
    (GPU + "    count: 2\n    uuid: GPU-a\n", "devices[0].uuid: not allowed with count > 1"),
    (GPU + "    temperature: hot\n", "devices[0].temperature: expected a number"),
    (GPU + "    power: {step: 5}\n", "devices[0].power: missing required key 'start'"),
    (GPU + "    power: {start: 1, slope: 5}\n", "devices[0].power.slope: unknown key"),
    (GPU + "    utilization: {gpu: [1, x]}\n",
     "devices[0].utilization.gpu[1]: expected a non-negative number, got 'x'"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: -1}]\n",
     "devices[0].mig[0].gpu_instance_id: expected a non-negative integer, got -1"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: 1},\n"
           "          {profile: 1g.5gb, gpu_instance_id: 1}]\n",
     "devices[0].mig[1]: duplicate (gpu_instance_id, compute_instance_id) (1, 0)"),
    (GPU + "    mig: [{profile: 1g.5gb, gpu_instance_id: 1, unsupported: [MEMORY_TEMP]}]\n",
     "devices[0].mig[0].unsupported[0]: unknown NVML function 'MEMORY_TEMP'"),
    (GPU + "    mig_capable: false\n    mig: [{profile: 1g.5gb, gpu_instance_id: 1}]\n",
     "devices[0].mig: MIG instances on a GPU with mig_capable: false"),
    (GPU + "    pci_bus_id: 00000000:18:00.0\n",
     "devices[0].pci_bus_id: expected a PCI bus id like '00000000:18:00.0' (quote it in YAML)"),
    (GPU + "    pci_bus_id: '0000:18:00.0'\n"
           "  - name: NVIDIA L4\n    pci_bus_id: '00000000:18:00.0'\n",
     "devices[1].pci_bus_id: duplicate PCI bus id '00000000:18:00.0'"),
    (GPU + "    slow: [{function: nvmlDeviceGetBogus, seconds: 1}]\n",
     "devices[0].slow[0].function: unknown NVML device function 'nvmlDeviceGetBogus'"),
    (GPU + "    xid: [{sample: 2}]\n", "devices[0].xid[0]: missing required key 'code'"),
    (GPU + "    processes: [{pid: 0}]\n",
     "devices[0].processes[0].pid: expected an integer from 1"),
    (GPU + "    processes: [{pid: 5, positions: [1]}]\n",
     "devices[0].processes[0].positions[0]: expected an integer from 0 to 0, got 1"),
    (GPU + "    temperature: 1\n    temperature: 2\n", "invalid YAML at line 4, column 5: "
                                                       "duplicate key 'temperature'"),
    ("devices: [\n", "invalid YAML at line 2, column 1"),
    ("- 1\n", "top level: expected a mapping, got [1]"),
    ("name: x\n", "top level: missing required key 'devices'"),
    ("errors: {nvmlDeviceGetPowerUsage: UNKNOWN}\ndevices: []\n",
     "errors.nvmlDeviceGetPowerUsage: unknown NVML function 'nvmlDeviceGetPowerUsage'"),
    ("driver_version: 550.90\ndevices: []\n",
     "driver_version: expected a non-empty string (quote it in YAML), got 550.9"),
])
def test_scenario_errors_are_one_line_with_the_key_path(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"scenario {path}: ")
    assert message in text


def test_missing_scenario_names_the_path_and_the_builtins(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    text = str(info.value)
    assert "\n" not in text
    assert missing in text
    assert "a100-mig, h100x8, t4" in text


def test_builtin_errors_name_the_profile_file(monkeypatch, tmp_path):
    (tmp_path / "broken.yaml").write_text(GPU + "    memory: {total: x}\n")
    monkeypatch.setattr("otel_gpu.nvml.fake.PROFILES_DIR", tmp_path)
    with pytest.raises(ScenarioError, match=r"^scenario broken\.yaml: devices\[0\]\.memory"):
        load_scenario("broken")


def test_scenario_name_defaults_to_file_stem(tmp_path):
    assert load_scenario(write(tmp_path, GPU, "my-rig.yaml")).name == "my-rig"
    assert load_scenario(write(tmp_path, "name: other\n" + GPU, "x.yaml")).name == "other"


def test_count_expands_with_per_device_values(nvml, tmp_path):
    path = write(tmp_path, """
devices:
  - name: NVIDIA L4
    count: 3
    temperature: {start: 40, per_device: 1, step: 2}
    mig_capable: true
    mig: [{profile: 1g.6gb, gpu_instance_id: 3}]
  - name: NVIDIA L40S
    temperature: 70
""", "rig.yaml")
    scenario = load_scenario(path)
    assert [d.index for d in scenario.devices] == [0, 1, 2, 3]
    assert [d.position for d in scenario.devices] == [0, 1, 2, 0]
    mig_uuids = {d.mig[0].uuid for d in scenario.devices[:3]}
    assert len(mig_uuids) == 3
    nvml(scenario)
    temps = []
    for _ in range(2):
        next_sample()
        temps.append([pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                      for h in handles()])
    assert temps == [[40, 41, 42, 70], [42, 43, 44, 70]]
