"""An nvidia-ml-py older than the newest lacks some functions: those reads are "not available
with this nvidia-ml-py", said once, never raised and never counted as failures."""

from __future__ import annotations

import logging

import yaml

from otel_gpu.report import check_report
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sim.scenario import PROFILES_DIR
from tests.support.nvml import SOURCES, OlderBinding


def _sampler(fake_nvml, lacks: set[str]) -> Sampler:
    with open(PROFILES_DIR / "h100x8.yaml", encoding="utf-8") as f:
        gpu = yaml.safe_load(f)["devices"][0]
    gpu["count"] = 2
    fake_nvml(yaml.safe_dump({"devices": [gpu]}))
    nvml = Nvml(OlderBinding(lacks))
    nvml.init()
    return Sampler(nvml, SOURCES)


def test_a_reader_the_binding_cannot_make_is_not_available_not_a_failure(fake_nvml, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    sampler = _sampler(fake_nvml, {"nvmlDeviceGetFanSpeed"})
    snaps = [sampler.sample() for _ in range(3)]
    for snap in snaps:
        assert not any(snap.reader_failures.values()), dict(snap.reader_failures)
        assert not snap.errors, snap.errors
        for device in snap.devices:
            assert "fan" not in device.values
            assert {"temp.gpu", "power", "util.gpu", "memory.used"} <= set(device.values)
    notes = check_report(snaps[-1])["notes"]
    said = [n for n in notes if "not available with this nvidia-ml-py" in n]
    assert len(said) == 1 and said[0].startswith("fan: ") and "nvmlDeviceGetFanSpeed" in said[0]
    lines = [r.getMessage() for r in caplog.records
             if "not available with this nvidia-ml-py" in r.getMessage()]
    assert len(lines) == 1, lines  # once, for the node, not per GPU or per sample


def test_a_binding_without_the_versioned_temperature_call_reads_the_older_one(fake_nvml):
    sampler = _sampler(fake_nvml, {"nvmlDeviceGetTemperatureV"})
    snap = sampler.sample()
    assert not any(snap.reader_failures.values()), dict(snap.reader_failures)
    assert all(d.values["temp.gpu"] > 0 for d in snap.devices)
    assert not [n for n in snap.notes if "nvidia-ml-py" in n]
