"""Per-process utilization in the fake driver and its scenario keys, through the real pynvml."""

from __future__ import annotations

import pynvml
import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from otel_gpu.sim.driver.processes import EPOCH_US, SAMPLE_US
from tests.sim.helpers import handles, next_sample, write

SHARED = """\
devices:
  - name: NVIDIA A10
    utilization: {gpu: 90}
    processes:
      - {pid: 101, used_memory: 1000, sm: 20, memory_util: 10}
      - {pid: 102, used_memory: 2000, sm: [30, 60], encoder: 7, decoder: 3}
      - {pid: 103, used_memory: 3000}             # never busy: no samples
      - {pid: 104, sm: 15, from_sample: 2}        # starts at sample 2
  - name: NVIDIA A100-SXM4-40GB
    mig:
      - {profile: 1g.5gb, gpu_instance_id: 1, processes: [{pid: 201, used_memory: 500}]}
"""


def _utilization(call, handle, since: int = 0) -> list[tuple]:
    return sorted((s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil)
                  for s in call(handle, since))


@pytest.mark.parametrize("call", [pynvml.nvmlDeviceGetProcessUtilization,
                                  pynvml.nvmlDeviceGetProcessesUtilizationInfo])
def test_one_sample_per_busy_process_per_sample(nvml, tmp_path, call):
    fake = nvml(write(tmp_path, SHARED, "shared.yaml"))
    next_sample()
    gpu, _ = handles()
    first = EPOCH_US + SAMPLE_US
    assert _utilization(call, gpu) == [(101, first, 20, 10, 0, 0), (102, first, 30, 0, 7, 3)]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than what was seen
        call(gpu, first)
    next_sample()
    second = first + SAMPLE_US
    assert _utilization(call, gpu, first) == [
        (101, second, 20, 10, 0, 0), (102, second, 60, 0, 7, 3), (104, second, 15, 0, 0, 0)]
    # the size query and the fill: two calls per read, as pynvml makes them
    name = call.__name__
    assert fake.calls[name] == 5


@pytest.mark.parametrize("call", [pynvml.nvmlDeviceGetProcessUtilization,
                                  pynvml.nvmlDeviceGetProcessesUtilizationInfo])
def test_none_in_mig_mode(nvml, tmp_path, call):
    nvml(write(tmp_path, SHARED, "shared.yaml"))
    next_sample()
    _, a100 = handles()
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0)
    for handle in (a100, mig):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(handle, 0)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [201]


def test_idle_gpu_answers_not_found_and_faults_apply(nvml, tmp_path):
    text = """\
devices:
  - name: NVIDIA T4
    processes: [{pid: 1, used_memory: 10}]
  - name: NVIDIA T4
    processes: [{pid: 2, sm: 5}]
    unsupported: [nvmlDeviceGetProcessesUtilizationInfo]
"""
    nvml(write(tmp_path, text, "t.yaml"))
    next_sample()
    idle, older = handles()
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(idle, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(older, 0)
    assert [s.smUtil for s in pynvml.nvmlDeviceGetProcessUtilization(older, 0)] == [5]


def test_the_info_call_checks_its_struct_version(nvml, tmp_path):
    import ctypes

    fake = nvml(write(tmp_path, SHARED, "shared.yaml"))
    next_sample()
    gpu, _ = handles()
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t(0)
    info.version = 0x02000018
    code = fake.nvmlDeviceGetProcessesUtilizationInfo(gpu, ctypes.byref(info))
    assert code == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@pytest.mark.parametrize(("text", "message"), [
    ("devices: [{name: X, processes: [{pid: 1, sm: -1}]}]",
     r"devices\[0\]\.processes\[0\]\.sm: expected a non-negative number"),
    ("devices: [{name: X, processes: [{pid: 1, gpu: 5}]}]",
     r"devices\[0\]\.processes\[0\]\.gpu: unknown key \(allowed: pid, used_memory, from_sample, "
     r"until_sample, sm, memory_util, encoder, decoder, positions\)"),
    ("devices: [{name: X, mig: [{profile: 1g.5gb, gpu_instance_id: 1, "
     "processes: [{pid: 1, sm: 5}]}]}]",
     r"devices\[0\]\.mig\[0\]\.processes\[0\]\.sm: NVML has no per-process utilization on MIG"),
])
def test_process_keys_are_checked(tmp_path, text, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write(tmp_path, text))


def test_process_shares_load(tmp_path):
    scenario = load_scenario(write(tmp_path, SHARED, "shared.yaml"))
    p101, p102, p103, _ = scenario.devices[0].processes
    assert p101.sm.at(1) == 20 and p101.memory_util.at(1) == 10 and p101.encoder is None
    assert p102.sm.at(2) == 60 and p102.decoder.at(1) == 3
    assert p103.utilization == (None, None, None, None)
