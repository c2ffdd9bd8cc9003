"""An XID storm is counted in full and logged at most once a minute per GPU and code."""

from __future__ import annotations

import logging

import pytest
import yaml

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from tests.support.nvml import SOURCES


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_an_xid_storm_is_counted_in_full_and_logged_a_few_times(fake_nvml, clock, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    storm = [{"sample": 1, "code": 79} for _ in range(5999)] + [{"sample": 1, "code": 48},
                                                  {"sample": 40, "code": 79}]
    def gpu() -> dict:
        return {"name": "NVIDIA H100 80GB HBM3", "memory": {"total": 1000, "used": 1}}

    fake_nvml(yaml.safe_dump({"devices": [{**gpu(), "xid": storm}, gpu()]}))
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, clock=clock)
    for seq in range(1, 41):
        if seq == 40:
            clock.advance(61.0)
        snap = sampler.sample()
    assert snap.devices[0].xid_counts[79] == 6000 and snap.devices[0].xid_counts[48] == 1
    lines = [r.getMessage() for r in caplog.records if "reported XID" in r.getMessage()]
    storm_lines = [line for line in lines if "XID 79" in line]
    assert len(storm_lines) == 2, lines
    assert "5998 similar messages suppressed" in storm_lines[1]
    assert len([line for line in lines if "XID 48" in line]) == 1
