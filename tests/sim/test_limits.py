"""The fake's power limits, P-state, maximum clocks, throttle time, PCIe link and memory health."""

from __future__ import annotations

import pynvml
import pytest

from otel_gpu.sim import ScenarioError, load_scenario
from tests.sim.helpers import LIMITS, field, handles, next_sample, write


def test_power_limits(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS))
    h0, h1 = handles()
    next_sample()
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h0) == 300000
    assert [pynvml.nvmlDeviceGetEnforcedPowerLimit(h) for h in (h0, h1)] == [290000, 295000]
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h1) == 350000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h1) == [100000, 350000]


def test_a_limit_not_given_is_not_supported(nvml, tmp_path):
    nvml(write(tmp_path, "devices:\n  - name: G\n    power_limits: {current: 5, min: 1}\n"))
    h = handles()[0]
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 5
    for call in (pynvml.nvmlDeviceGetEnforcedPowerLimit,
                 pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
                 pynvml.nvmlDeviceGetPowerManagementLimitConstraints,  # needs min and max
                 pynvml.nvmlDeviceGetPerformanceState, pynvml.nvmlDeviceGetCurrPcieLinkWidth,
                 pynvml.nvmlDeviceGetRowRemapperHistogram):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)


def test_performance_state_and_clocks(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS))
    h0, h1 = handles()
    assert [pynvml.nvmlDeviceGetPerformanceState(h) for h in (h0, h1)] == [0, 8]
    assert pynvml.nvmlDeviceGetClockInfo(h0, pynvml.NVML_CLOCK_VIDEO) == 1500
    maxima = [pynvml.nvmlDeviceGetMaxClockInfo(h1, t) for t in (
        pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM,
        pynvml.NVML_CLOCK_VIDEO)]
    assert maxima == [2520, 2520, 9001, 1970]


def test_violation_status_is_nanoseconds_per_policy(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS))
    h0, h1 = handles()
    next_sample()
    policies = [pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL,
                pynvml.NVML_PERF_POLICY_SYNC_BOOST, pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
                pynvml.NVML_PERF_POLICY_LOW_UTILIZATION, pynvml.NVML_PERF_POLICY_RELIABILITY]
    first = [pynvml.nvmlDeviceGetViolationStatus(h1, p) for p in policies]
    assert [v.violationTime for v in first] == [1500001000, 7, 0, 1, 9000000000, 2]
    next_sample()
    later = pynvml.nvmlDeviceGetViolationStatus(h0, pynvml.NVML_PERF_POLICY_POWER)
    assert later.violationTime == 1750000000
    assert later.referenceTime - first[0].referenceTime == 10_000_000  # us, ten s a sample
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a policy the fake has no key for
        pynvml.nvmlDeviceGetViolationStatus(h0, pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS)


def test_pcie_link_and_throughput(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS))
    h0, h1 = handles()
    next_sample()
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h0) == 4
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h0) == 4
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h0) == 16
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h0) == 16
    assert pynvml.nvmlDeviceGetPcieThroughput(h1, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 2010
    assert pynvml.nvmlDeviceGetPcieThroughput(h1, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 64000
    next_sample()  # the link trains down to gen 1 while idle
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h0) == 1


def test_row_remapper_histogram(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS))
    hist = pynvml.nvmlDeviceGetRowRemapperHistogram(handles()[1])
    assert (hist.max, hist.high, hist.partial, hist.low, hist.none) == (700, 3, 0, 0, 1)


def test_new_symbols_take_faults_and_answer_not_supported_on_mig(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS + """    no_permission: [nvmlDeviceGetPowerManagementLimit]
    errors: {nvmlDeviceGetViolationStatus: UNKNOWN}
  - name: NVIDIA A30
    power_limits: {current: 165000}
    mig: [{profile: 1g.6gb, gpu_instance_id: 3}]
"""))
    h = handles()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetPowerManagementLimit(h[0])
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetViolationStatus(h[1], pynvml.NVML_PERF_POLICY_POWER)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h[2]) == 165000
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h[2], 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerManagementLimit(mig)


def test_profiles_t4_retires_pages_h100_remaps_rows(nvml):
    nvml("t4")
    next_sample()
    t4 = handles()
    names = ("RETIRED_SBE", "RETIRED_DBE", "RETIRED_PENDING", "ECC_SBE_AGG_TOTAL",
             "ECC_DBE_AGG_TOTAL")
    assert [[field(h, n).value.ullVal for n in names] for h in t4] == [
        [1, 0, 0, 5, 0], [2, 1, 0, 12, 1]]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRowRemapperHistogram(t4[0])
    assert pynvml.nvmlDeviceGetPcieThroughput(t4[1], pynvml.NVML_PCIE_UTIL_RX_BYTES) == 60500
    nvml("h100x8")
    next_sample()
    h100 = handles()
    assert field(h100[0], "RETIRED_SBE").nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    hist = pynvml.nvmlDeviceGetRowRemapperHistogram(h100[6])
    assert (hist.max, hist.high, hist.partial) == (2557, 2, 1)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h100[5]) == 650000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h100[5]) == 640000


def test_scenario_checks(tmp_path):
    base = "devices:\n  - name: G\n"
    bad = {
        "    power_limits: {peak: 1}\n": "unknown key",
        "    pcie: {lanes: 16}\n": "unknown key",
        "    violations: {low_util: 1}\n": "unknown key",
        "    row_remap_histogram: {some: 1}\n": "unknown key",
        "    max_clocks: {shader: 1}\n": "unknown key",
        "    performance_state: fast\n": "expected a number",
    }
    for text, message in bad.items():
        with pytest.raises(ScenarioError, match=message):
            load_scenario(write(tmp_path, base + text))
