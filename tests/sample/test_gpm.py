"""GPM profiling in the sampler: two samples per value, unsupported and busy GPUs, MIG."""

from __future__ import annotations

import logging

import pytest

from otel_gpu import sim
from otel_gpu._clock import Clock
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from tests.support.drivers import FailsSampleTwo, TimedGpm, WithoutGpm
from tests.support.nvml import SOURCES
from tests.support.omitted import reasons

GPM_LOG = "otel_gpu.sample.gpm"


@pytest.fixture
def driver(fake_nvml):
    """driver(profile_or_yaml, fake=FakeNvml) -> (fake, Sampler), NVML initialised."""

    def make(spec: str, fake: type[sim.FakeNvml] = sim.FakeNvml):
        lib = fake_nvml(spec, driver=fake)
        nvml = Nvml()
        nvml.init()
        return lib, Sampler(nvml, SOURCES, gpm_window=0.0)

    return make


def gpm_values(sample) -> dict[str, float]:
    return {k: v for k, v in sample.values.items() if k.startswith("gpm.")}


def gpm_lines(caplog, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == GPM_LOG and r.levelno >= level]


def test_the_first_sample_has_the_scenarios_values_from_a_primed_window(driver):
    lib, _ = driver("h100x8")
    slept: list[float] = []
    now = [100.0]
    sampler = Sampler(Nvml(), SOURCES, clock=Clock(lambda: now[0], sleep=slept.append),
                      gpm_window=0.1)
    first = sampler.sample()
    # one window waited, once: the priming sample of each GPU, then the reads that pair it
    assert slept == [pytest.approx(0.1)]
    sm = [s.values["gpm.sm_active"] for s in first.devices]
    assert sm == [20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0]
    gpu3 = first.devices[3].values
    assert (gpu3["gpm.tensor_active"], gpu3["gpm.dram_active"], gpu3["gpm.pcie_tx"],
            gpu3["gpm.nvlink_rx"]) == (28.0, 39.0, 2750.0, 57000.0)
    assert gpu3["gpm.nvdec_active"] == 0.0  # seven NVDECs answer, the eighth is not there
    assert not first.errors
    second = sampler.sample()
    assert slept == [pytest.approx(0.1)]  # later samples wait for nothing
    assert [s.values["gpm.sm_active"] for s in second.devices] == sm
    # one support query per GPU, once; one sample per GPU per collector sample plus the primer
    sampler.sample()
    assert lib.calls["nvmlGpmQueryDeviceSupport"] == 8
    assert lib.calls["nvmlGpmSampleGet"] == 8 + 24
    assert lib.calls["nvmlGpmMetricsGet"] == 24
    assert lib.gpm_buffers == 16  # two per GPU, reused


def test_the_window_counts_from_the_priming_sample(driver):
    """Time the primer round itself took is not waited again; a GPU without GPM waits none."""
    lib, _ = driver("h100x8", TimedGpm)
    lib.step = 0.004
    slept: list[float] = []
    sampler = Sampler(Nvml(), SOURCES, clock=Clock(lambda: lib.clock[0], sleep=slept.append),
                      gpm_window=0.1)
    sampler.sample()
    assert slept == [pytest.approx(0.1 - 8 * 0.004)]
    driver("a100-mig")
    slept.clear()
    sampler = Sampler(Nvml(), SOURCES, clock=Clock(sleep=slept.append), gpm_window=0.1)
    sampler.sample()
    assert slept == []  # no device took a priming sample: nothing to wait for


def test_unsupported_gpus_are_omitted_and_logged_once_per_node(driver, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    lib, sampler = driver("a100-mig")
    for _ in range(4):
        snap = sampler.sample()
        assert all(gpm_values(s) == {} for s in snap.devices)
        # what `otel-gpu check` prints, on every sample
        notes = [e for e in snap.notes if "GPM" in e]
        assert len(notes) == 1 and "GPU 0 (" in notes[0] and "GPU 2 (" in notes[0]
        assert "Hopper" in notes[0] and not snap.errors  # absent by design: no problem
    lines = gpm_lines(caplog)
    assert len(lines) == 1, lines
    gpus = [s.device for s in snap.devices if not s.device.is_mig]
    assert all(g.uuid in lines[0] for g in gpus) and "MIG" not in lines[0]
    assert lib.calls["nvmlGpmQueryDeviceSupport"] == 3  # asked once per GPU
    assert lib.calls["nvmlGpmSampleGet"] == lib.calls["nvmlGpmMigSampleGet"] == 0
    assert lib.calls["nvmlGpmSampleAlloc"] == 0


def test_a_driver_without_gpm_is_unsupported_too(driver, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    lib, sampler = driver("h100x8", WithoutGpm)
    sampler.sample()
    snap = sampler.sample()
    assert all(gpm_values(s) == {} for s in snap.devices)
    assert len(gpm_lines(caplog)) == 1
    assert "the driver has no nvmlGpmQueryDeviceSupport" in gpm_lines(caplog)[0]
    assert lib.calls["nvmlGpmSampleGet"] == 0


def test_no_permission_frees_the_buffers_and_is_logged_once(driver, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 2
            memory: {total: 1000}
            gpm: {SM_UTIL: 30, no_permission: true}
    """)
    for _ in range(3):
        snap = sampler.sample()
    assert all(gpm_values(s) == {} for s in snap.devices)
    assert snap.errors and "nvmlGpmSampleGet answered NO_PERMISSION" in snap.errors[0]
    assert not snap.notes  # a refused permission is a problem to fix, not a note
    assert len(gpm_lines(caplog)) == 1
    assert lib.calls["nvmlGpmSampleGet"] == 2  # once per GPU
    assert lib.gpm_buffers == 0


def test_busy_counters_degrade_quietly_and_are_asked_again_rarely(driver, caplog):
    caplog.set_level(logging.INFO, logger="otel_gpu")
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000}
            gpm: {SM_UTIL: {start: 10, step: 1}, busy: {from_sample: 2, until_sample: 30}}
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000}
            gpm: {SM_UTIL: 5}
    """)
    assert sampler.sample().devices[0].values["gpm.sm_active"] == 10  # sample 1, primed
    snap = sampler.sample()  # sample 2: another profiler holds the counters
    assert gpm_values(snap.devices[0]) == {} and snap.devices[1].values["gpm.sm_active"] == 5
    assert any("paused for GPU 0" in e for e in snap.notes) and not snap.errors
    for _ in range(59):  # samples 3-61: not asked
        snap = sampler.sample()
        assert gpm_values(snap.devices[0]) == {}
    # GPU 0: primer, sample 1 and sample 2 (refused); GPU 1: primer and every sample
    assert lib.calls["nvmlGpmSampleGet"] == 3 + 1 + 61
    snap = sampler.sample()  # sample 62: asked again, free: the first sample of a new interval
    assert gpm_values(snap.devices[0]) == {} and not snap.errors and not snap.notes
    snap = sampler.sample()  # sample 63
    assert snap.devices[0].values["gpm.sm_active"] == 10 + 62
    warnings = gpm_lines(caplog, logging.WARNING)
    assert len(warnings) == 1 and "GPU 0" in warnings[0] and "IN_USE" in warnings[0]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len([m for m in gpm_lines(caplog) if "free again for GPU 0" in m]) == 1
    assert snap.devices[0].state == "ok"


MIG_H100 = """
    devices:
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 85520809984}
        gpm: {SM_UTIL: 55, ANY_TENSOR_UTIL: 30}
        mig:
          - profile: 3g.40gb
            gpu_instance_id: 2
            memory: {total: 42949672960}
            gpm: {SM_UTIL: {start: 70, step: 1}, ANY_TENSOR_UTIL: 45, DRAM_BW_UTIL: 20}
          - profile: 1g.10gb
            gpu_instance_id: 9
            memory: {total: 10737418240}
            gpm: {SM_UTIL: 15}
          - profile: 1g.10gb
            gpu_instance_id: 10
            memory: {total: 10737418240}
            until_sample: 3
            gpm: {SM_UTIL: 5}
          - profile: 1g.10gb
            gpu_instance_id: 11
            memory: {total: 10737418240}
"""


def test_mig_instances_have_their_own_profiling_values(driver, caplog):
    caplog.set_level(logging.DEBUG, logger="otel_gpu")
    lib, sampler = driver(MIG_H100)
    snap = sampler.sample()  # primed: the first sample has them
    by_gi = {s.device.gpu_instance_id: gpm_values(s) for s in snap.devices if s.device.is_mig}
    assert by_gi[2] == {"gpm.sm_active": 70.0, "gpm.tensor_active": 45.0,
                        "gpm.dram_active": 20.0}
    assert by_gi[9] == {"gpm.sm_active": 15.0} and by_gi[10] == {"gpm.sm_active": 5.0}
    assert by_gi[11] == {}  # the GPU samples it, but it answers no metric
    assert gpm_values(snap.devices[0]) == {"gpm.sm_active": 55.0, "gpm.tensor_active": 30.0}
    assert lib.calls["nvmlGpmMigSampleGet"] == 8  # primer and read per instance, through
    # the parent handle
    # what an instance cannot give is said once, in the node's "not available" list
    # (at debug level: the start-up line counts the instances' missing values)
    mig11 = next(s.device for s in snap.devices if s.device.gpu_instance_id == 11)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
             and "not available" in r.getMessage() and "gpm.sm_active" in r.getMessage()]
    assert len(lines) == 1
    assert reasons(lines[0])["gpm.sm_active"] == (
        "NOT_SUPPORTED", f"GPU 0 MIG {mig11.mig_profile} GI 11"), lines[0]
    assert not snap.errors


def test_buffers_are_freed_when_a_device_goes_and_at_close(driver):
    lib, sampler = driver(MIG_H100)
    sampler.sample()
    sampler.sample()
    assert lib.gpm_buffers == 10  # two for the GPU and each of its four instances
    sampler.sample()
    sampler.sample()  # sample 4: instance 10 is gone
    snap = sampler.sample()  # sample 5: rediscovered without it
    assert 10 not in {s.device.gpu_instance_id for s in snap.devices}
    assert lib.gpm_buffers == 8
    sampler.close()
    assert lib.gpm_buffers == 0


def test_a_failed_gpu_starts_a_new_interval_when_it_answers_again(driver):
    lib, sampler = driver("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            memory: {total: 1000}
            fields: {TOTAL_ENERGY_CONSUMPTION: 1}
            gpm: {SM_UTIL: {start: 10, step: 1}}
    """, FailsSampleTwo)
    states = []
    for _ in range(4):
        s = sampler.sample().devices[0]
        states.append((s.state, s.values.get("gpm.sm_active")))
    # the first sample is primed; sample 3 would otherwise report the interval since
    # sample 1, across the failure, and is not primed again (no wait in a later sample)
    assert states == [("ok", 10.0), ("failed", None), ("ok", None), ("ok", 13.0)]
