"""A driver call that hangs in discovery, rediscovery or XID registration stalls only its GPU."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler, unknown_uuid
from testkit.process import wait_until
from tests.support.nvml import SOURCES, sample_within

A_GPU = "a hung GPU"
"""What a sample must not wait on."""

HUNG = "GPU-00000000-0000-0000-0000-000000000002"


def _scenario(slow: str, mig: str = "") -> str:
    gpu = """
          - name: NVIDIA H100 80GB HBM3
            uuid: GPU-00000000-0000-0000-0000-00000000000{n}
            memory: {{total: 1000, used: 10}}
            power: {{start: 100000, step: 1000}}
            {extra}"""
    return "devices:" + "".join(
        gpu.format(n=n, extra=slow + mig if n == 2 else "") for n in (1, 2, 3)) + "\n"


@pytest.fixture
def hanging(fake_nvml) -> Iterator:
    """hanging(slow, **sampler_kw) -> Sampler over three GPUs, GPU 1 hanging as ``slow``
    says until the test ends (the slow call waits on an event, it does not sleep)."""
    release = threading.Event()
    samplers: list[Sampler] = []

    def make(slow: str, mig: str = "", **kw) -> Sampler:
        fake_nvml(_scenario(slow, mig), sleep=lambda _s: release.wait(30))
        nvml = Nvml()
        nvml.init()
        sampler = Sampler(nvml, SOURCES, read_timeout=0.2, **kw)
        samplers.append(sampler)
        return sampler

    make.release = release  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        release.set()
        for sampler in samplers:
            wait_until(lambda s=sampler: not s.busy(), 10, "the hung calls to return")
            sampler.close()



@pytest.mark.parametrize("function", ["nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUUID",
                                      "nvmlDeviceGetMigMode", "nvmlDeviceRegisterEvents"])
def test_a_gpu_hanging_at_start_up_is_reported_hung_by_index(hanging, function, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    sampler = hanging(f"slow: [{{function: {function}, seconds: 1}}]")
    snaps = [sample_within(sampler, 5.0, A_GPU) for _ in range(3)]
    for snap in snaps:
        assert [d.device.index for d in snap.devices] == [0, 1, 2]
        good = [snap.devices[0], snap.devices[2]]
        assert all(d.hung is None and d.values["memory.total"] == 1000 for d in good)
        hung = snap.devices[1]
        assert hung.hung is not None and hung.values == {}
        assert hung.hung.startswith("GPU 1 (") and "has not returned" in hung.hung
        assert function.removesuffix("_v2") in hung.hung  # the call that hangs
        assert any(e.startswith("GPU 1 (") and "has not returned" in e for e in snap.errors)
    assert snaps[0].devices[1].device.uuid in (HUNG, unknown_uuid(1))
    powers = [s.devices[0].values["power"] for s in snaps]
    assert powers == sorted(set(powers)), "the other GPUs keep being read"
    lines = [r.getMessage() for r in caplog.records if "has not returned" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("GPU 1 ("), lines


def test_a_gpu_hanging_at_start_up_is_discovered_once_it_answers(hanging):
    sampler = hanging("slow: [{function: nvmlDeviceGetUUID, seconds: 1}]")
    snap = sample_within(sampler, 5.0, A_GPU)
    assert snap.devices[1].device.uuid == unknown_uuid(1) and snap.devices[1].hung
    hanging.release.set()
    wait_until(lambda: not sampler.busy(), 10, "the hung call to return")
    snap = sample_within(sampler, 5.0, A_GPU)
    assert snap.devices[1].device.uuid == HUNG and snap.devices[1].hung is None
    assert snap.devices[1].values["memory.total"] == 1000
    assert 79 in snap.devices[1].xid_counts  # registered for XID events once discovered


def test_a_gpu_hanging_in_rediscovery_keeps_its_identity_and_stalls_only_itself(hanging):
    # Sample 3 is the first periodic rediscovery: GPU 1's MIG mode query hangs there.
    sampler = hanging("slow: [{function: nvmlDeviceGetMigMode, seconds: 1, after: 2}]",
                      rediscover_every=2)
    before = [sample_within(sampler, 5.0, A_GPU) for _ in range(2)]
    assert all(d.hung is None for s in before for d in s.devices)
    # rediscoveries at samples 3 and 5
    snaps = [sample_within(sampler, 5.0, A_GPU) for _ in range(4)]
    for snap in snaps:
        assert [d.device.uuid for d in snap.devices] == [d.device.uuid
                                                         for d in before[0].devices]
        assert snap.devices[1].hung is not None and "nvmlDeviceGetMigMode" in snap.devices[1].hung
        assert snap.devices[0].hung is None and snap.devices[2].hung is None
    powers = [s.devices[2].values["power"] for s in snaps]
    assert powers == sorted(set(powers)), "the other GPUs keep being read"
