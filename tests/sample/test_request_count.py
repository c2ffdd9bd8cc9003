"""``otel_gpu.nvml.requests`` counts what reaches the library, not calls into pynvml."""

from __future__ import annotations

import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from tests.support.nvml import SOURCES


@pytest.mark.parametrize("profile", ["t4", "h100x8", "a100-mig"])
@pytest.mark.parametrize("process_usage", [False, True])
def test_the_request_count_is_the_librarys(fake_nvml, profile, process_usage):
    lib = fake_nvml(profile)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, process_usage=process_usage)
    ours, theirs = nvml.calls, lib.total_calls
    for _ in range(4):  # discovery, the static reads, GPM's first sample, then as usual
        snap = sampler.sample()
        assert snap.nvml_calls - ours == lib.total_calls - theirs
    sampler.close()


def test_a_reader_making_two_calls_counts_two(fake_nvml):
    # Without the batched PCIe byte counters, nvmlDeviceGetPcieThroughput is asked twice
    # (sent, received); a process list is asked for its size first, then filled.
    lib = fake_nvml("t4")
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    sampler.sample()
    before, calls = nvml.calls, dict(lib.calls)
    gpus = len(sampler.sample().devices)
    made = {k: v - calls.get(k, 0) for k, v in lib.calls.items() if v != calls.get(k, 0)}
    assert made["nvmlDeviceGetPcieThroughput"] == 2 * gpus
    assert nvml.calls - before == sum(made.values())
