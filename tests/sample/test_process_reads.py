"""The sampler's per-process reads (process usage on), against the fake driver."""

from __future__ import annotations

import logging

import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sim.driver.shapes import Signature, parse_shape
from otel_gpu.snapshot import OK, ProcessUsage
from tests.support.nvml import SOURCES
from tests.support.omitted import reasons

SHARED = """\
devices:
  - name: NVIDIA A10
    utilization: {gpu: 80}
    processes:
      - {pid: 101, used_memory: 1000, sm: [20, 40], memory_util: 10}
      - {pid: 102, used_memory: 2000, sm: 30, encoder: 7, decoder: 3}
      - {pid: 103, used_memory: 3000}
      - {pid: 104}
"""


@pytest.fixture
def sampler(fake_nvml):
    """sampler(spec, **kw) -> (FakeNvml, Sampler with process usage on unless told)."""
    made: list[Sampler] = []

    def make(spec: str, process_usage: bool = True, **kw):
        lib = fake_nvml(spec)
        nvml = Nvml()
        nvml.init()
        made.append(Sampler(nvml, SOURCES, process_usage=process_usage, **kw))
        return lib, made[-1]

    yield make
    for s in made:
        s.close()


def _by_uuid(snap):
    return {s.device.uuid: s for s in snap.devices}


def test_each_process_with_its_memory_and_shares(sampler):
    lib, s = sampler(SHARED)
    (gpu,) = s.sample().devices
    assert gpu.state == OK and gpu.process_utilization
    assert gpu.processes == (
        ProcessUsage(101, 1000, 0.2, 0.1, 0.0, 0.0),
        ProcessUsage(102, 2000, 0.3, 0.0, 0.07, 0.03),
        ProcessUsage(103, 3000, 0.0, 0.0, 0.0, 0.0),  # listed, never busy
        ProcessUsage(104, None, 0.0, 0.0, 0.0, 0.0),  # NVML does not say its memory
    )
    assert gpu.values["processes"] == 4
    # the next sample reads only what is newer than the last timestamp seen
    (gpu,) = s.sample().devices
    assert [p.sm for p in gpu.processes] == [0.4, 0.3, 0.0, 0.0]
    assert lib.calls["nvmlDeviceGetProcessesUtilizationInfo"] == 4  # size + fill, twice


def test_the_process_list_is_read_once_per_device_either_way(sampler):
    on, s = sampler("h100x8")
    s.sample()
    with_usage = on.calls["nvmlDeviceGetComputeRunningProcesses_v3"]
    off, plain = sampler("h100x8", process_usage=False)
    snap = plain.sample()
    assert off.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == with_usage
    assert all(d.processes is None and not d.process_utilization for d in snap.devices)
    assert off.calls["nvmlDeviceGetProcessesUtilizationInfo"] == 0
    assert snap.devices[0].values["processes"] == 2


def test_no_busy_process_is_no_error(sampler, caplog):
    lib, s = sampler("""\
devices:
  - name: NVIDIA T4
    processes: [{pid: 1, used_memory: 10}]
""")
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            (gpu,) = s.sample().devices
    assert gpu.state == OK and gpu.processes == (ProcessUsage(1, 10, 0.0, 0.0, 0.0, 0.0),)
    assert "Utilization" not in caplog.text  # neither "retrying" nor "not available"
    assert lib.calls["nvmlDeviceGetProcessesUtilizationInfo"] == 3  # NOT_FOUND: asked again


def test_mig_instances_have_memory_only_and_the_parent_leaves_them_alone(sampler, caplog):
    lib, s = sampler("a100-mig")
    with caplog.at_level(logging.INFO):
        snap = s.sample()
        s.sample()
    devices = _by_uuid(snap)
    parent = next(d for d in snap.devices if d.device.index == 0 and not d.device.is_mig)
    migs = [d for d in snap.devices if d.device.parent_uuid == parent.device.uuid]
    assert parent.processes == () and parent.values["processes"] == 3  # the count as before
    by_pid = {p.pid: (d.device.uuid, p) for d in migs for p in d.processes}
    assert sorted(by_pid) == [7001, 7002, 7003]
    uuid, proc = by_pid[7001]
    assert devices[uuid].device.mig_profile == "3g.20gb"
    assert proc == ProcessUsage(7001, 2013265920, None, None, None, None)
    assert not any(d.process_utilization for d in migs)
    whole = [d for d in snap.devices if d.device.index > 0]
    assert all(d.process_utilization and [p.pid for p in d.processes] == [8101] for d in whole)
    assert all(d.state == OK for d in snap.devices)
    assert not any("process" in e.lower() for e in snap.errors)
    # NOT_SUPPORTED there: said once for the node, naming the devices, then not asked again
    said = [reasons(r.getMessage()) for r in caplog.records
            if "not available" in r.getMessage()]
    found = [s["nvmlDeviceGetProcessUtilization"] for s in said
             if "nvmlDeviceGetProcessUtilization" in s]
    assert len(found) == 1 and found[0][0] == "NOT_SUPPORTED"
    assert found[0][1].startswith("5 devices (")
    assert lib.calls["nvmlDeviceGetProcessUtilization"] == 5


def test_drivers_before_r550_use_the_older_call(sampler):
    lib, s = sampler("""\
devices:
  - name: NVIDIA T4
    processes: [{pid: 1, used_memory: 10, sm: 25}]
    unsupported: [nvmlDeviceGetProcessesUtilizationInfo]
""")
    for _ in range(2):
        (gpu,) = s.sample().devices
        assert gpu.processes == (ProcessUsage(1, 10, 0.25, 0.0, 0.0, 0.0),)
    assert lib.calls["nvmlDeviceGetProcessesUtilizationInfo"] == 1
    assert lib.calls["nvmlDeviceGetProcessUtilization"] == 4


def test_a_list_nvml_refuses_leaves_processes_unread(sampler, caplog):
    lib, s = sampler("""\
devices:
  - name: NVIDIA T4
    processes: [{pid: 1, used_memory: 10, sm: 25}]
    no_permission: [nvmlDeviceGetComputeRunningProcesses_v3]
    errors: {nvmlDeviceGetProcessesUtilizationInfo: UNKNOWN}
""")
    with caplog.at_level(logging.INFO):
        (gpu,) = s.sample().devices
    assert gpu.state == OK and gpu.processes is None and "processes" not in gpu.values
    assert "processes (NO_PERMISSION)" in caplog.text
    assert lib.calls["nvmlDeviceGetProcessesUtilizationInfo"] == 0


def test_a_device_that_fails_in_the_utilization_call_is_failed(sampler):
    lib, s = sampler("""\
devices:
  - name: NVIDIA T4
    processes: [{pid: 1, used_memory: 10, sm: 25}]
    errors: {nvmlDeviceGetProcessesUtilizationInfo: GPU_IS_LOST}
""")
    (gpu,) = s.sample().devices
    assert gpu.state == "failed" and gpu.processes is None
    assert "nvmlDeviceGetProcessesUtilizationInfo" in gpu.error


def _list_symbols(lib) -> list[str]:
    """The list calls (a count and a buffer) a sample with process usage on makes: found by
    the answer shapes' signatures, not written down."""
    return sorted(name for name, args in lib.record_signatures.items()
                  if Signature.of(args).is_list)


def test_an_idle_gpu_whose_driver_says_none_with_success_is_idle_not_broken(sampler, caplog):
    """NVIDIA's mock library answers the size query of a GPU without processes with SUCCESS
    and a count of 0; pynvml raises on it for some list calls: that is an empty list."""
    lib, s = sampler("devices:\n  - name: NVIDIA H100 80GB HBM3\n    processes: []\n")
    lib.record_signatures = {}
    s.sample()
    lists = _list_symbols(lib)
    assert {"nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetProcessesUtilizationInfo"} <= set(lists)
    for symbol in [*lists, "nvmlDeviceGetProcessUtilization"]:
        lib.answer_shape(symbol, parse_shape("entries:0"))
    with caplog.at_level(logging.INFO):
        snaps = [s.sample() for _ in range(3)]
    for snap in snaps:
        assert not any(snap.reader_failures.values()), dict(snap.reader_failures)
        assert not snap.errors, snap.errors
        (gpu,) = snap.devices
        assert gpu.state == OK and gpu.processes == () and gpu.process_utilization
    assert "failed" not in caplog.text


def test_the_older_utilization_call_saying_none_with_success_is_idle(sampler):
    lib, s = sampler("devices:\n  - name: NVIDIA T4\n    processes: [{pid: 7, used_memory: 5}]\n")
    lib.answer_shape("nvmlDeviceGetProcessesUtilizationInfo", parse_shape(
        "returns:FUNCTION_NOT_FOUND"))
    lib.answer_shape("nvmlDeviceGetProcessUtilization", parse_shape("entries:0"))
    for _ in range(2):
        snap = s.sample()
        assert not any(snap.reader_failures.values()), dict(snap.reader_failures)
        (gpu,) = snap.devices
        assert gpu.processes == (ProcessUsage(7, 5, 0.0, 0.0, 0.0, 0.0),)
    assert lib.calls["nvmlDeviceGetProcessUtilization"] >= 2


@pytest.mark.reader_failures
def test_a_list_answering_a_real_surprise_is_still_counted(sampler):
    lib, s = sampler("devices:\n  - name: NVIDIA T4\n    processes: [{pid: 7, used_memory: 5}]\n")
    lib.answer_shape("nvmlDeviceGetComputeRunningProcesses_v3", parse_shape("entries:over"))
    snap = s.sample()
    assert snap.reader_failures["processes"] == 1  # a count past the buffer: not "none"
