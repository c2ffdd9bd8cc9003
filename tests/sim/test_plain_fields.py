"""The fields that give what a plain call gives: the same scenario data, units and faults."""

from __future__ import annotations

import pynvml

from otel_gpu.sim.driver.fields import PLAIN
from tests.sim.helpers import LIMITS, THREE_LINKS, handles, next_sample, write

POLICIES = ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION", "RELIABILITY")


def _fields(handle, ids: list[int]) -> dict[int, int | None]:
    """Field id -> value, or None where the entry failed."""
    out: dict[int, int | None] = {}
    for entry in pynvml.nvmlDeviceGetFieldValues(handle, ids):
        if entry.nvmlReturn != pynvml.NVML_SUCCESS:
            out[entry.fieldId] = None
        elif entry.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
            out[entry.fieldId] = entry.value.uiVal
        else:
            assert entry.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            out[entry.fieldId] = entry.value.ullVal
    return out


def _plain(handle) -> dict[int, int]:
    """What the plain calls answer, keyed by the field id that gives the same value."""
    low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    out = {
        pynvml.NVML_FI_DEV_POWER_AVERAGE: pynvml.nvmlDeviceGetPowerUsage(handle),
        pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT: pynvml.nvmlDeviceGetPowerManagementLimit(
            handle),
        pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle),
        pynvml.NVML_FI_DEV_POWER_DEFAULT_LIMIT: pynvml.nvmlDeviceGetPowerManagementDefaultLimit(
            handle),
        pynvml.NVML_FI_DEV_POWER_MIN_LIMIT: low,
        pynvml.NVML_FI_DEV_POWER_MAX_LIMIT: high,
    }
    for name in POLICIES:
        status = pynvml.nvmlDeviceGetViolationStatus(handle, getattr(pynvml,
                                                                     f"NVML_PERF_POLICY_{name}"))
        out[getattr(pynvml, f"NVML_FI_DEV_PERF_POLICY_{name}")] = status.violationTime
    return out


def test_every_plain_field_answers_what_its_call_answers(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS + "    power: {start: 250000, per_device: 7, step: 1000}\n"))
    hs = handles()
    assert set(PLAIN) == set(_plain(hs[0]))  # the table covers every call with a field
    for _ in range(3):
        next_sample()
        for h in hs:
            assert _fields(h, list(PLAIN)) == _plain(h)
    # spot checks, in the calls' own units: mW and ns
    assert _fields(hs[1], [pynvml.NVML_FI_DEV_POWER_AVERAGE]) == {
        pynvml.NVML_FI_DEV_POWER_AVERAGE: 252007}
    assert _fields(hs[1], [pynvml.NVML_FI_DEV_PERF_POLICY_POWER]) == {
        pynvml.NVML_FI_DEV_PERF_POLICY_POWER: 1_500_000_000 + 1000 + 2 * 250_000_000}


def test_a_plain_field_shares_its_calls_faults_and_a_field_fault_stays_its_own(nvml, tmp_path):
    nvml(write(tmp_path, LIMITS + """    power: 250000
    errors: {nvmlDeviceGetViolationStatus: NO_DATA, POWER_AVERAGE: INVALID_ARGUMENT}
    no_permission: [nvmlDeviceGetPowerManagementLimit]
"""))
    h = handles()[0]
    next_sample()
    got = pynvml.nvmlDeviceGetFieldValues(h, list(PLAIN))
    codes = {entry.fieldId: entry.nvmlReturn for entry in got}
    for name in POLICIES:
        assert codes[getattr(pynvml, f"NVML_FI_DEV_PERF_POLICY_{name}")] == (
            pynvml.NVML_ERROR_NO_DATA)
    assert codes[pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT] == pynvml.NVML_ERROR_NO_PERMISSION
    # as on a driver older than the field id: the entry fails, the call still answers
    assert codes[pynvml.NVML_FI_DEV_POWER_AVERAGE] == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 250000
    assert codes[pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT] == pynvml.NVML_SUCCESS


def test_missing_data_is_not_supported_and_the_range_needs_both_ends(nvml, tmp_path):
    nvml(write(tmp_path, "devices:\n  - name: G\n    power_limits: {current: 5, min: 1}\n"))
    h = handles()[0]
    got = _fields(h, list(PLAIN))
    assert got.pop(pynvml.NVML_FI_DEV_POWER_REQUESTED_LIMIT) == 5
    assert set(got.values()) == {None}  # min without max: as the constraints call, nothing


def test_a_slow_call_makes_the_field_call_standing_for_it_slow(fake_nvml, tmp_path):
    sleeps: list[float] = []
    fake_nvml(write(tmp_path, LIMITS + """    power: 250000
    slow: [{function: nvmlDeviceGetPowerUsage, seconds: 2.5, after: 1}]
"""), sleep=sleeps.append, init=True)
    h = handles()[0]
    next_sample()
    _fields(h, list(PLAIN))
    assert sleeps == []
    next_sample()
    _fields(h, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])  # does not stand for it
    assert sleeps == []
    _fields(h, list(PLAIN))
    assert sleeps == [2.5]


def test_a_mig_instance_answers_none_of_them(nvml):
    nvml("a100-mig")
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handles()[0], 0)
    assert set(_fields(mig, list(PLAIN)).values()) == {None}


def test_a_field_listed_in_the_scenario_wins(nvml, tmp_path):
    nvml(write(tmp_path, "devices:\n  - name: G\n    power: 1\n"
                         "    fields: {POWER_AVERAGE: 123456}\n"))
    h = handles()[0]
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 1
    entry = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_AVERAGE])[0]
    assert entry.value.ullVal == 123456


def _states(handle, links: int) -> list[tuple[int, int]]:
    got = pynvml.nvmlDeviceGetFieldValues(
        handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, link) for link in range(links)])
    return [(e.nvmlReturn, e.value.uiVal if e.nvmlReturn == pynvml.NVML_SUCCESS else -1)
            for e in got]


def test_the_link_state_field_answers_what_the_call_per_link_answers(nvml, tmp_path):
    nvml(write(tmp_path, THREE_LINKS + "  - name: Tesla T4\n"))
    h, _, t4 = handles()
    ok = pynvml.NVML_SUCCESS
    for _ in range(2):  # link 3 goes down after sample 1
        next_sample()
        calls = [pynvml.nvmlDeviceGetNvLinkState(h, link) for link in range(4)]
        assert _states(h, 4) == [(ok, state) for state in calls]
    assert _states(h, 5)[4] == (pynvml.NVML_ERROR_INVALID_ARGUMENT, -1)  # past the last link
    assert _states(t4, 1) == [(pynvml.NVML_ERROR_NOT_SUPPORTED, -1)]  # no NVLink


def test_the_link_state_field_shares_the_calls_faults(nvml, tmp_path):
    nvml(write(tmp_path, THREE_LINKS.replace("    count: 2\n", "    count: 2\n"
                                             "    errors: {nvmlDeviceGetNvLinkState: UNKNOWN}\n")))
    h = handles()[0]
    next_sample()
    assert _states(h, 2) == [(pynvml.NVML_ERROR_UNKNOWN, -1)] * 2
