"""The sampler against the fake driver, through the real pynvml functions."""

from __future__ import annotations

import logging
import threading

import pytest

from otel_gpu import sim as fake
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import COMMON_XIDS, Sampler, mig_profile, unknown_uuid
from otel_gpu.snapshot import FAILED, OK, PREDICTED_FAILURE
from testkit.process import wait_until
from tests.support.nvml import SOURCES
from tests.support.omitted import reasons


@pytest.fixture
def driver(fake_nvml):
    """driver(profile_or_yaml) -> (FakeNvml, Sampler); slow calls are recorded, not slept."""
    sleeps: list[float] = []

    def make(spec: str, **sampler_kw):
        lib = fake_nvml(spec, sleep=sleeps.append)
        nvml = Nvml()
        nvml.init()
        return lib, Sampler(nvml, SOURCES, **sampler_kw)

    make.sleeps = sleeps
    return make


def test_discovers_h100x8(driver):
    lib, sampler = driver("h100x8")
    snap = sampler.sample()
    assert snap.seq == 1 and not snap.errors
    devices = [s.device for s in snap.devices]
    assert [d.index for d in devices] == list(range(8))
    assert len({d.uuid for d in devices}) == 8
    assert all(d.uuid.startswith("GPU-") and d.model == "NVIDIA H100 80GB HBM3" for d in devices)
    assert len({d.pci_bus_id for d in devices}) == 8
    assert {d.numa_node for d in devices} == {0, 1}
    assert snap.driver_version == "550.90.07"
    assert all(s.state == OK for s in snap.devices)
    assert snap.devices[0].values["memory.total"] == 85520809984


def test_discovers_mig_instances_with_their_parent(driver):
    lib, sampler = driver("a100-mig")
    snap = sampler.sample()
    migs = [s.device for s in snap.devices if s.device.is_mig]
    gpus = {s.device.uuid: s.device for s in snap.devices if not s.device.is_mig}
    assert len(gpus) == 3 and len(migs) == 4
    assert {m.mig_profile for m in migs} == {"3g.20gb", "2g.10gb", "1g.5gb"}
    assert sorted(m.gpu_instance_id for m in migs) == [1, 5, 13, 14]
    for mig in migs:
        assert mig.uuid.startswith("MIG-")
        assert gpus[mig.parent_uuid].index == mig.index == 0
        assert mig.compute_instance_id == 0
    by_uuid = {s.device.uuid: s for s in snap.devices}
    assert by_uuid[migs[0].uuid].values["memory.total"] > 0


def test_fields_are_read_in_one_batched_call_per_device(driver):
    lib, sampler = driver("h100x8")
    sampler.sample()
    assert lib.calls["nvmlDeviceGetFieldValues"] == 8
    sampler.sample()
    assert lib.calls["nvmlDeviceGetFieldValues"] == 16
    snap = sampler.sample()
    values = snap.devices[0].values
    for key in ("energy", "temp.memory", "pcie.tx", "pcie.rx", "pcie.replay", "nvlink.tx"):
        assert key in values, key


def test_counters_rise(driver):
    lib, sampler = driver("h100x8")
    first = sampler.sample().devices[0].values["energy"]
    second = sampler.sample().devices[0].values["energy"]
    assert second > first


def test_unsupported_values_are_omitted_logged_once_and_not_asked_again(driver, caplog):
    lib, sampler = driver("t4")
    caplog.set_level(logging.INFO, logger="otel_gpu")
    for _ in range(3):
        snap = sampler.sample()
    values = snap.devices[0].values
    assert "temp.memory" not in values and "fan" not in values
    assert "temp.gpu" in values and "energy" in values
    lines = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()
             and reasons(r.getMessage()).get("temp.memory", ("",))[0] == "NOT_SUPPORTED"]
    assert len(lines) == 1
    assert lib.calls["nvmlDeviceGetFanSpeed"] == 2  # once per GPU, then never again


def test_unsupported_values_are_one_line_for_the_node_naming_the_devices(driver, caplog):
    lib, sampler = driver("h100x8")
    caplog.set_level(logging.INFO, logger="otel_gpu")
    for _ in range(3):
        sampler.sample()
    lines = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(lines) == 1, lines  # not one per GPU, and not again on later samples
    assert reasons(lines[0])["fan"] == (
        "NOT_SUPPORTED", "8 devices (GPU 0, GPU 1, GPU 2, GPU 3, GPU 4, GPU 5, GPU 6, GPU 7)")


def test_values_missing_on_some_devices_name_only_those(driver, caplog):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 2
            memory: {total: 1000, used: 10}
            temperature: 40
            power: 100000
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            temperature: 40
            errors: {nvmlDeviceGetPowerUsage: NOT_SUPPORTED}
    """)
    caplog.set_level(logging.INFO, logger="otel_gpu")
    sampler.sample()
    sampler.sample()
    lines = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(lines) == 1, lines
    assert reasons(lines[0])["power"] == ("NOT_SUPPORTED", "GPU 2"), lines[0]


def test_a_value_missing_on_many_devices_is_one_short_line(driver, caplog):
    """At 40 GPUs the line names the first few and counts the rest, not all forty."""
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 40
            memory: {total: 1000, used: 10}
            temperature: 40
            errors: {nvmlDeviceGetTemperatureV: NOT_SUPPORTED}
    """)
    caplog.set_level(logging.INFO, logger="otel_gpu")
    sampler.sample()
    (line,) = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    named = ", ".join(f"GPU {i}" for i in range(8))
    assert line.endswith(f"on 40 devices ({named} and 32 more)"), line
    assert "GPU 39" not in line


def test_lost_gpu_is_failed_and_the_others_are_read(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 2
            memory: {total: 1000, used: 10}
            temperature: 40
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            temperature: 40
            lost_after: 2
    """)
    assert [s.state for s in sampler.sample().devices] == [OK, OK, OK]
    assert [s.state for s in sampler.sample().devices] == [OK, OK, OK]
    snap = sampler.sample()
    assert [s.state for s in snap.devices] == [OK, OK, FAILED]
    lost = snap.devices[2]
    assert lost.values == {} and "GPU is lost" in lost.error
    assert snap.devices[0].values["temp.gpu"] == 40
    calls = lib.total_calls
    sampler.sample()
    # a failed device costs one call per sample, not one per value
    assert lib.total_calls - calls < 30


def test_unknown_error_fails_the_device(driver):
    lib, sampler = driver("""
        devices:
          - name: Tesla T4
            memory: {total: 1000, used: 10}
            power: 70000
            errors: {nvmlDeviceGetPowerUsage: UNKNOWN}
    """)
    snap = sampler.sample()
    assert snap.devices[0].state == FAILED and "nvmlDeviceGetPowerUsage" not in snap.errors


def test_transient_error_is_retried(driver):
    lib, sampler = driver("""
        devices:
          - name: Tesla T4
            memory: {total: 1000, used: 10}
            power: 70000
            errors: {nvmlDeviceGetPowerUsage: NO_DATA}
    """)
    for _ in range(3):
        snap = sampler.sample()
    assert snap.devices[0].state == OK and "power" not in snap.devices[0].values
    assert lib.calls["nvmlDeviceGetPowerUsage"] == 3


def test_row_remap_failure_predicts_failure(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA A100-SXM4-80GB
            memory: {total: 1000, used: 10}
            fields: {REMAPPED_FAILURE: 1, REMAPPED_PENDING: 0}
    """)
    assert sampler.sample().devices[0].state == PREDICTED_FAILURE


def test_xid_events_are_counted_per_code(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 2
            memory: {total: 1000, used: 10}
            xid: [{sample: 2, code: 79}, {sample: 3, code: 79}, {sample: 3, code: 48}]
    """)
    first = dict(sampler.sample().devices[0].xid_counts)
    assert first == dict.fromkeys(COMMON_XIDS, 0)  # there at 0 before the first event
    sampler.sample()
    snap = sampler.sample()
    assert {k: v for k, v in snap.devices[0].xid_counts.items() if v} == {79: 2, 48: 1}
    assert set(snap.devices[0].xid_counts) == set(COMMON_XIDS)
    assert snap.devices[0].last_xid == 48 and snap.devices[1].last_xid == 48


def test_slow_call_is_slow_in_the_sampler_only(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: 100000
            slow: [{function: nvmlDeviceGetPowerUsage, seconds: 2.5, after: 1}]
    """)
    sampler.sample()
    assert driver.sleeps == []
    sampler.sample()
    assert driver.sleeps == [2.5]


def test_no_gpu_and_a_failing_count_are_reported_not_raised(driver):
    lib, sampler = driver("""
        devices: []
    """)
    assert sampler.sample().errors == ("NVML reports no GPU",)
    fake.uninstall()
    lib, sampler = driver("""
        errors: {nvmlDeviceGetCount_v2: DRIVER_NOT_LOADED}
        devices:
          - name: Tesla T4
            memory: {total: 1000, used: 10}
    """)
    snap = sampler.sample()
    assert snap.devices == () and "nvmlDeviceGetCount failed" in snap.errors[0]


def test_mig_profile_parsing():
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert mig_profile("NVIDIA H100 80GB HBM3") is None


def test_older_drivers_fall_back_to_the_older_calls(driver):
    lib, sampler = driver("""
        devices:
          - name: Tesla V100-SXM2-16GB
            memory: {total: 1000, used: 10, reserved: 5}
            temperature: 44
            errors: {nvmlDeviceGetMemoryInfo_v2: FUNCTION_NOT_FOUND,
                     nvmlDeviceGetTemperatureV: FUNCTION_NOT_FOUND}
    """)
    values = sampler.sample().devices[0].values
    assert values["temp.gpu"] == 44
    assert values["memory.total"] == 1000 and values["memory.used"] == 15  # v1: used + reserved
    assert "memory.reserved" not in values


def test_periodic_rediscovery_keeps_devices_and_counts(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA A100-SXM4-40GB
            memory: {total: 1000, used: 10}
            mig_capable: true
            mig: [{profile: 1g.5gb, gpu_instance_id: 7, compute_instance_id: 0,
                   memory: {total: 100, used: 1}}]
            xid: [{sample: 2, code: 31}]
    """, rediscover_every=2)
    for _ in range(5):
        snap = sampler.sample()
    assert lib.calls["nvmlDeviceGetHandleByIndex_v2"] == 3  # samples 1, 3 and 5
    assert lib.calls["nvmlDeviceRegisterEvents"] == 1
    assert [s.device.is_mig for s in snap.devices] == [False, True]
    assert {k: v for k, v in snap.devices[0].xid_counts.items() if v} == {31: 1}


# --- failures an operator alerts on ------------------------------------------------------

LOST_SECOND = """
    devices:
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 1000, used: 10}
        power: 100000
      - name: NVIDIA H100 80GB HBM3
        uuid: GPU-11111111-2222-3333-4444-555555555555
        memory: {total: 1000, used: 10}
        power: 100000
        lost_after: %d
"""


def test_a_lost_gpu_stays_failed_through_rediscovery(driver):
    lib, sampler = driver(LOST_SECOND % 1, rediscover_every=3)
    sampler.sample()
    calls = []
    for _ in range(8):  # rediscovery at samples 3 and 6 cannot open the lost GPU
        before = lib.total_calls
        snap = sampler.sample()
        calls.append(lib.total_calls - before)
        lost = snap.devices[1]
        assert lost.device.uuid == "GPU-11111111-2222-3333-4444-555555555555"
        assert lost.state == FAILED and lost.values == {}
        assert snap.healthy_devices() == 1 and len(snap.devices) == 2
    assert "GPU 1 could not be opened" in " ".join(snap.errors)
    assert lost.device.pci_bus_id  # the identity seen before it was lost is kept
    steady = sorted(calls)[len(calls) // 2]
    assert max(calls) < 3 * steady, f"discovery must not rerun every sample: {calls}"


def test_a_gpu_lost_before_start_is_reported_failed_by_index(driver):
    lib, sampler = driver(LOST_SECOND % 0)
    snap = sampler.sample()
    assert [d.device.uuid for d in snap.devices][1] == unknown_uuid(1)
    assert snap.devices[1].state == FAILED
    assert "could not be opened" in snap.devices[1].error
    assert snap.healthy_devices() == 1


def test_a_lost_gpu_gets_its_bus_id_from_sysfs(fake_nvml, tmp_path):
    fake_nvml(LOST_SECOND % 0)
    driver_dir = tmp_path / "sys" / "bus" / "pci" / "drivers" / "nvidia"
    for bdf, cls in (("0000:18:00.0", "0x030200"), ("0000:2a:00.0", "0x030200"),
                     ("0000:c1:00.0", "0x068000")):  # the last one is an NVSwitch
        (driver_dir / bdf).mkdir(parents=True)
        (driver_dir / bdf / "class").write_text(cls + "\n")
    nvml = Nvml()
    nvml.init()
    snap = Sampler(nvml, SOURCES, sysfs_root=tmp_path).sample()
    assert snap.devices[1].device.pci_bus_id == "00000000:2A:00.0"


def test_mig_relayout_is_noticed_on_the_first_failing_call(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA A100-SXM4-40GB
            memory: {total: 1000, used: 10}
            mig_capable: true
            mig:
              - {profile: 3g.20gb, gpu_instance_id: 1, memory: {total: 100, used: 1},
                 until_sample: 2}
              - {profile: 1g.5gb, gpu_instance_id: 9, memory: {total: 50, used: 1},
                 from_sample: 3}
    """)
    profiles = [[d.device.mig_profile for d in sampler.sample().devices if d.device.is_mig]]
    for _ in range(3):
        snap = sampler.sample()
        profiles.append([d.device.mig_profile for d in snap.devices if d.device.is_mig])
    assert profiles[0] == ["3g.20gb"] and profiles[-1] == ["1g.5gb"]
    assert profiles[1] == ["3g.20gb"] or profiles[1] == []
    # values of the new instance are read, the old one never reported with stale ones
    assert snap.devices[-1].values["memory.total"] == 50


def test_one_hung_gpu_stalls_only_itself(fake_nvml, caplog):
    release = threading.Event()
    lib = fake_nvml("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 3
            memory: {total: 1000, used: 10}
            power: 100000
            slow: [{function: nvmlDeviceGetPowerUsage, seconds: 1, after: 1}]
    """, sleep=lambda _s: release.wait(30))
    del lib
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, read_timeout=0.2)
    sampler.sample()
    try:
        for _ in range(2):
            snap = sampler.sample()  # every GPU hangs in its power read: each alone
            assert [d.hung is not None for d in snap.devices] == [True, True, True]
        # power is read in the batched field call: that is the call that hangs
        assert "reading field values has not returned" in snap.devices[0].hung
        assert snap.healthy_devices() == 0 and all(d.values == {} for d in snap.devices)
        assert snap.devices[0].state == OK  # last known state, not made up
        assert sampler.busy()
        # once each GPU (the node's own calls, queued behind them on a slow machine, may
        # say so too: theirs are not the GPUs' lines)
        assert sum("has not returned" in r.message and r.message.startswith("GPU ")
                   for r in caplog.records) == 3
    finally:
        release.set()
    wait_until(lambda: not sampler.busy(), 10, "the hung calls to return")
    snap = sampler.sample()
    assert all(d.hung is None for d in snap.devices)


def test_the_other_gpus_stay_fresh_while_one_hangs(fake_nvml):
    release = threading.Event()
    fake_nvml("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: {start: 100000, step: 1000}
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: {start: 100000, step: 1000}
            slow: [{function: nvmlDeviceGetPowerUsage, seconds: 1, after: 1}]
    """, sleep=lambda _s: release.wait(30))
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, read_timeout=0.2)
    try:
        powers, ages = [], []
        for _ in range(4):
            snap = sampler.sample()
            powers.append(snap.devices[0].values["power"])
            ages.append(snap.devices[1].age)
            assert snap.devices[0].hung is None and snap.devices[0].age < 1.0
        assert powers == sorted(set(powers))  # fresh every sample
        assert snap.devices[1].hung is not None and ages[-1] >= 0.2
        assert ages == sorted(ages) and ages[-1] > ages[1]  # its age keeps growing
        assert snap.devices[1].age > snap.devices[0].age
        assert snap.healthy_devices() == 1
    finally:
        release.set()
