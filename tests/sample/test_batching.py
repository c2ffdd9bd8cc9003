"""What a sample costs in NVML calls, and the batched fields' fallback to their own calls.

A value NVML also gives as a field id is read in the one ``nvmlDeviceGetFieldValues``
call per device; on a driver that does not answer that field (older drivers lack the
newer ids) the call it replaced gives it instead, with the same value.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sim import FakeNvml
from otel_gpu.sim.driver.fields import PLAIN
from tests.support.drivers import OlderDriver, RefusingDriver
from tests.support.nvml import CALLS_PER_GPU_PER_SAMPLE, SOURCES
from tests.support.omitted import reasons

PLAIN_KEYS = {"power", "power.limit.current", "power.limit.enforced", "power.limit.default",
              "power.limit.min", "power.limit.max", "violation.power", "violation.thermal",
              "violation.sync_boost", "violation.board_limit", "violation.low_utilization",
              "violation.reliability"}
"""The values read in the batch where the driver answers their field ids."""

LINK_STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE

PLAIN_CALLS = ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetPowerManagementLimit",
               "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementDefaultLimit",
               "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetViolationStatus")


def _sampler(fake_nvml, spec: str, driver: type[FakeNvml] = FakeNvml, **kw: Any):
    lib = fake_nvml(spec, driver=driver)
    nvml = Nvml()
    nvml.init()
    return lib, nvml, Sampler(nvml, SOURCES, **kw)


@pytest.mark.parametrize("process_usage", [False, True])
def test_a_sample_costs_one_batched_call_and_the_calls_without_a_field(
        fake_nvml, process_usage):
    lib, nvml, sampler = _sampler(fake_nvml, "h100x8", process_usage=process_usage)
    sampler.sample()  # discovery, the static reads and GPM's first sample
    sampler.sample()
    before, samples = nvml.calls, 5
    for _ in range(samples):
        snap = sampler.sample()
    per_gpu = (nvml.calls - before) / samples / len(snap.devices)
    assert per_gpu == CALLS_PER_GPU_PER_SAMPLE[process_usage]
    assert lib.calls["nvmlDeviceGetFieldValues"] == 8 * (samples + 2)
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 8 * 19  # 18 links and the end, once
    for symbol in PLAIN_CALLS:
        assert lib.calls[symbol] == 0, symbol
    assert all(set(d.values) >= PLAIN_KEYS for d in snap.devices)


@pytest.mark.parametrize("older", [OlderDriver, RefusingDriver])
def test_the_batch_and_an_older_drivers_own_calls_give_identical_snapshots(fake_nvml, older):
    snaps = {}
    for driver in (FakeNvml, older):
        lib, nvml, sampler = _sampler(fake_nvml, "h100x8", driver)
        snaps[driver] = [[(d.device.uuid, d.state, dict(d.values))
                          for d in sampler.sample().devices] for _ in range(4)]
        sampler.close()
        if driver is RefusingDriver:  # refused once per GPU, then asked without them
            assert lib.calls["nvmlDeviceGetFieldValues"] == 8 * (4 + 1)
        if driver is not FakeNvml:
            assert lib.calls["nvmlDeviceGetPowerUsage"] == 8 * 4
            assert lib.calls["nvmlDeviceGetNvLinkState"] == 8 * 19 * 4
            assert lib.calls["nvmlDeviceGetViolationStatus"] == 8 * 4 * 6
            # the static ones are read once per device, the others every sample
            assert lib.calls["nvmlDeviceGetPowerManagementDefaultLimit"] == 8
            assert lib.calls["nvmlDeviceGetPowerManagementLimitConstraints"] == 8
            assert lib.calls["nvmlDeviceGetEnforcedPowerLimit"] == 8 * 4
        fake_nvml.close()
    assert snaps[FakeNvml] == snaps[older]
    last = snaps[FakeNvml][-1]
    assert all(set(values) >= PLAIN_KEYS | {"energy", "nvlink.tx", "nvlink.links"}
               for _, _, values in last)
    gpu5 = last[5][2]  # of the second kind in the profile
    assert (gpu5["power.limit.current"], gpu5["power.limit.enforced"]) == (650000, 640000)


def test_an_older_driver_is_found_out_once_per_device_and_said_at_debug(fake_nvml, caplog):
    caplog.set_level(logging.DEBUG, logger="otel_gpu")
    lib, nvml, sampler = _sampler(fake_nvml, "h100x8", OlderDriver)
    for _ in range(3):
        snap = sampler.sample()
    first, later = lib.requested[:8], lib.requested[8:]
    assert all(set(PLAIN) <= asked for asked in first)
    assert later and not any(set(PLAIN) & asked for asked in later)  # not asked again
    said = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 8 and {r.levelno for r in said} == {logging.DEBUG}
    assert "power (NOT_SUPPORTED)" in said[0].getMessage()
    omitted = " ".join(r.getMessage() for r in caplog.records
                       if "not available" in r.getMessage())
    said_missing = reasons(omitted)
    assert said_missing["fan"][0] == "NOT_SUPPORTED"  # H100 SXM has no fan: that one is said
    assert not any(key in said_missing for key in PLAIN_KEYS)  # these are not lost
    assert all(set(d.values) >= PLAIN_KEYS for d in snap.devices)


def test_an_entry_failing_for_another_reason_is_read_with_its_call_that_sample(fake_nvml):
    lib, nvml, sampler = _sampler(fake_nvml, """
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            violations: {power: {start: 5000, step: 10}, thermal: 7, sync_boost: 0,
                         board_limit: 0, low_utilization: 0, reliability: 0}
            errors: {PERF_POLICY_THERMAL: NO_DATA}
    """)
    for n in range(3):
        values = sampler.sample().devices[0].values
        assert (values["violation.power"], values["violation.thermal"]) == (5000 + 10 * n, 7)
    # thermal only, once a sample: the batch keeps being asked for it (this error is not
    # the driver lacking the field), the other policies never leave the batch
    assert lib.calls["nvmlDeviceGetViolationStatus"] == 3
    assert lib.calls["nvmlDeviceGetFieldValues"] == 3


def test_a_value_neither_gives_is_omitted_and_said_once(fake_nvml, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    lib, nvml, sampler = _sampler(fake_nvml, """
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000, used: 10}
            power: 100000
            unsupported: [POWER_AVERAGE, nvmlDeviceGetPowerUsage]
    """)
    for _ in range(3):
        values = sampler.sample().devices[0].values
    assert "power" not in values and values["memory.total"] == 1000
    lines = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(lines) == 1 and reasons(lines[0])["power"][0] == "NOT_SUPPORTED"
    assert lib.calls["nvmlDeviceGetPowerUsage"] == 1


REMAPS = """
devices:
  - name: NVIDIA A100-SXM4-80GB
    memory: {total: 1000, used: 10}
    fields: {REMAPPED_COR: [0, 0, 1, 1, 1, 1, 1, 1], REMAPPED_UNC: 0, REMAPPED_PENDING: 0,
             REMAPPED_FAILURE: 0}
    row_remap_histogram: {max: [640, 640, 639, 639, 639, 639, 639, 639],
                          high: [0, 0, 1, 1, 1, 1, 1, 1]}
"""


def _banks(values) -> tuple[float, float]:
    return values["remap.banks.max"], values["remap.banks.high"]


def test_the_row_remap_histogram_is_read_again_only_when_a_remapping_moves(fake_nvml):
    lib, nvml, sampler = _sampler(fake_nvml, REMAPS)
    seen = [_banks(sampler.sample().devices[0].values) for _ in range(8)]
    assert seen == [(640, 0)] * 2 + [(639, 1)] * 6  # every sample, never stale
    assert lib.calls["nvmlDeviceGetRowRemapperHistogram"] == 2  # first, and when COR moved


def test_the_row_remap_histogram_is_read_again_every_rediscovery_period(fake_nvml):
    lib, nvml, sampler = _sampler(fake_nvml, REMAPS, rediscover_every=3)
    seen = [_banks(sampler.sample().devices[0].values) for _ in range(8)]
    assert seen == [(640, 0)] * 2 + [(639, 1)] * 6
    assert lib.calls["nvmlDeviceGetRowRemapperHistogram"] == 3  # samples 1, 3 and 6


def test_the_row_remap_histogram_is_read_every_sample_without_the_remap_fields(fake_nvml):
    lib, nvml, sampler = _sampler(fake_nvml, REMAPS.replace(
        "    fields:", "    unsupported: [REMAPPED_PENDING]\n    fields:"))
    seen = [_banks(sampler.sample().devices[0].values) for _ in range(4)]
    assert seen == [(640, 0)] * 2 + [(639, 1)] * 2
    assert lib.calls["nvmlDeviceGetRowRemapperHistogram"] == 4


def test_a_rediscovery_describes_only_the_gpus_it_has_not_seen(fake_nvml):
    lib, nvml, sampler = _sampler(fake_nvml, "h100x8", rediscover_every=2)
    for _ in range(6):
        snap = sampler.sample()
    assert lib.calls["nvmlDeviceGetHandleByIndex_v2"] == 8 * 3  # sample 1, then every 2nd
    for symbol in ("nvmlDeviceGetName", "nvmlDeviceGetSerial", "nvmlDeviceGetVbiosVersion",
                   "nvmlDeviceGetMinorNumber", "nvmlDeviceGetNumaNodeId"):
        assert lib.calls[symbol] == 8, symbol
    assert [d.device.serial for d in snap.devices] == [
        d.device.serial for d in sampler.sample().devices] and snap.devices[0].device.serial
