"""NVML's "not available" answers (SUCCESS with all ones) and impossible values are absent."""

from __future__ import annotations

import logging
import math

import yaml

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.sources import Source
from otel_gpu.sim import FakeNvml
from otel_gpu.sim.scenario import PROFILES_DIR
from tests.support.nvml import SOURCES

NOT_READINGS = {
    # identity, discovery, events and process lists: not readings (lists and text, not numbers)
    "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetGpuInstanceById",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetIndex", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMigMode", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetSerial", "nvmlDeviceGetUUID", "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceRegisterEvents", "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo",
    # the link states stay readable, so the NVLink fields are asked (and answer all ones)
    "nvmlDeviceGetNvLinkState",
}
READING_CALLS = sorted(FakeNvml.device_symbols() - NOT_READINGS)
FIELDS = sorted({s.nvml.split()[1].removeprefix("NVML_FI_DEV_")
                 for s in SOURCES if s.field_id is not None})
OURS = {"processes", "nvlink.links", "nvlink.active"}
"""Keys the collector makes itself: a list's length, and the links the (readable) link
states say are up."""


def _h100(**extra) -> dict:
    with open(PROFILES_DIR / "h100x8.yaml", encoding="utf-8") as f:
        gpu = yaml.safe_load(f)["devices"][0]
    gpu.update(count=1, **extra)
    return gpu


def _sampler(fake_nvml, *gpus: dict) -> Sampler:
    fake_nvml(yaml.safe_dump({"devices": list(gpus)}))
    nvml = Nvml()
    nvml.init()
    return Sampler(nvml, SOURCES)


def test_no_source_exports_nvmls_not_available_value(fake_nvml, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    sampler = _sampler(fake_nvml, _h100(),
                       _h100(not_available=READING_CALLS + FIELDS + ["NVLINK_GET_STATE"]))
    by_key = {s.key: s for s in SOURCES}
    for _ in range(3):
        healthy, sentinel = sampler.sample().devices
    assert len(healthy.values) > 60  # the twin shows every source is read
    leaked = {k: v for k, v in sentinel.values.items()
              if k not in OURS and not k.startswith("gpm.")}
    assert leaked == {}
    # GPM computes rates itself (and a NaN is never a rate): what it gives is in bounds
    assert all(by_key[k].accepts(v) for k, v in sentinel.values.items() if k in by_key)
    assert sentinel.state == "ok" and healthy.values["power"] > 0
    lines = [r.getMessage() for r in caplog.records if "cannot be readings" in r.getMessage()]
    assert len(lines) == 1 and "power (" in lines[0] and "GPU 1" in lines[0], lines


def test_values_outside_physics_are_absent_and_wide_counters_are_kept(fake_nvml):
    sampler = _sampler(fake_nvml, _h100(
        temperature=250, power=12_000_000, utilization={"gpu": 150, "memory": 5},
        clocks={"graphics": 12_000, "sm": 1755, "memory": 2619, "video": 1530},
        fan_speed=201,
        fields={"TOTAL_ENERGY_CONSUMPTION": 5_000_000_000_000, "MEMORY_TEMP": 36,
                "ECC_SBE_VOL_TOTAL": 2**40}))
    values = sampler.sample().devices[0].values
    for key in ("temp.gpu", "util.gpu", "clock.graphics", "fan"):
        assert key not in values, key
    assert values["util.memory"] == 5 and values["clock.sm"] == 1755
    assert values["energy"] == 5_000_000_000_000  # past 32 bits: a 64-bit counter
    assert values["ecc.corrected"] == 2**40


def test_the_bound_is_on_the_source():
    temp = Source("t", "doc", "Cel", field_id=1, maximum=150)
    assert temp.accepts(36) and not temp.accepts(200.5) and not temp.accepts(math.nan)
    counter = Source("c", "doc", "{replay}", field_id=1)
    assert counter.accepts(2**32 - 2) and not counter.accepts(2**32 - 1)
    wide = Source("e", "doc", "mJ", field_id=1)
    assert wide.accepts(2**40) and not wide.accepts(2**64 - 1) and not wide.accepts(2**63 - 1)
    assert not Source("f", "doc", "{row}", field_id=1, maximum=10).accepts(11)


def test_the_unsupported_self_metric_counts_what_each_device_omits(fake_nvml):
    # the temperature call, whichever the binding makes (nvidia-ml-py 12.x has no V call)
    calls = ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"]
    sampler = _sampler(fake_nvml, _h100(), _h100(not_available=calls),
                       _h100(unsupported=list(calls)))
    for _ in range(2):
        healthy, sentinel, refused = sampler.sample().devices
    assert (healthy.not_available, refused.not_available) == (0, 0)
    assert sentinel.not_available == 2
    assert sentinel.unsupported == healthy.unsupported
    assert refused.unsupported == healthy.unsupported + 2
