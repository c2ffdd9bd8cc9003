"""The ``h200`` profile against what a real H200 answered (``reference/h200-580-idle.json``,
driver 580.159.04): the collector reading the simulator exports the real GPU's values."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from otel_gpu._clock import Clock
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from tests.sim.helpers import handles, next_sample
from tests.support.nvml import SOURCES

REFERENCE = Path(__file__).with_name("reference") / "h200-580-idle.json"
UUID = "GPU-8e64e884-cfbc-e44a-112c-37b2b8e55785"

# Source key -> where the reference has the same value ("f_": the field, as the collector
# reads it; a list: an element of it).
EXPORTED = {
    "memory.total": ("mem_v2", "total"),
    "memory.used": ("mem_v2", "used"),
    "memory.free": ("mem_v2", "free"),
    "memory.reserved": ("mem_v2", "reserved"),
    "util.gpu": ("util", "gpu"),
    "util.memory": ("util", "memory"),
    "util.encoder": ("enc", 0),
    "util.decoder": ("dec", 0),
    "temp.gpu": ("temp_gpu",),
    "temp.memory": ("temp_mem_field",),
    "power": ("power_avg_field",),
    "energy": ("energy_field",),
    "clock.graphics": ("clock_graphics",),
    "clock.sm": ("clock_sm",),
    "clock.memory": ("clock_memory",),
    "clock.video": ("clock_video",),
    "clock.max.graphics": ("clock_max_graphics",),
    "clock.max.sm": ("clock_max_sm",),
    "clock.max.memory": ("clock_max_memory",),
    "clock.max.video": ("clock_max_video",),
    "clock.reasons": ("clock_reasons",),
    "pstate": ("pstate",),
    "power.limit.current": ("f_POWER_REQUESTED_LIMIT",),
    "power.limit.enforced": ("f_POWER_CURRENT_LIMIT",),
    "power.limit.default": ("f_POWER_DEFAULT_LIMIT",),
    "power.limit.min": ("f_POWER_MIN_LIMIT",),
    "power.limit.max": ("f_POWER_MAX_LIMIT",),
    "pcie.tx": ("f_PCIE_COUNT_TX_BYTES",),
    "pcie.rx": ("f_PCIE_COUNT_RX_BYTES",),
    "pcie.replay": ("f_PCIE_REPLAY_COUNTER",),
    "pcie.link.gen": ("pcie_gen",),
    "pcie.link.gen.max": ("pcie_gen_max",),
    "pcie.link.width": ("pcie_width",),
    "pcie.link.width.max": ("pcie_width_max",),
    "ecc.corrected": ("f_ECC_SBE_VOL_TOTAL",),
    "ecc.uncorrected": ("f_ECC_DBE_VOL_TOTAL",),
    "ecc.corrected.aggregate": ("f_ECC_SBE_AGG_TOTAL",),
    "ecc.uncorrected.aggregate": ("f_ECC_DBE_AGG_TOTAL",),
    "remap.corrected": ("f_REMAPPED_COR",),
    "remap.uncorrected": ("f_REMAPPED_UNC",),
    "remap.pending": ("f_REMAPPED_PENDING",),
    "remap.failure": ("f_REMAPPED_FAILURE",),
    **{f"violation.{p.lower()}": (f"f_PERF_POLICY_{p}",)
       for p in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION",
                 "RELIABILITY")},
    **{f"remap.banks.{b}": ("remap_hist", b) for b in ("max", "high", "partial", "low", "none")},
}
REFUSED = ("fan", "retired.sbe", "retired.dbe", "retired.pending", "nvlink.tx", "nvlink.rx",
           "nvlink.links", "nvlink.active")
"""What the real H200 answered NOT_SUPPORTED: absent, never 0."""


def _reference() -> dict:
    return json.loads(REFERENCE.read_text())[UUID]


def _at(ref: dict, path: tuple) -> float:
    value = ref
    for part in path:
        value = value[part]
    assert isinstance(value, (int, float)), (path, value)
    return value


@pytest.fixture
def h200(fake_nvml):
    """The collector's sampler on the h200 profile (its latency recorded, not slept)."""
    sleeps: list[float] = []
    fake_nvml("h200", sleep=sleeps.append)
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, gpm_window=0.0, clock=Clock(sleep=lambda _: None))
    yield sampler, sleeps
    sampler.close()


def test_the_first_sample_exports_what_the_real_h200_answered(h200):
    sampler, _ = h200
    snap = sampler.sample()
    ref = _reference()
    [gpu] = snap.devices
    assert (gpu.device.uuid, gpu.device.name, gpu.device.serial, gpu.device.pci_bus_id) == (
        UUID, ref["name"], ref["serial"], ref["pci_bus_id"])
    assert gpu.device.numa_node is None  # Not Supported in the VM
    assert snap.driver_version == json.loads(REFERENCE.read_text())["_driver"]
    got = {key: gpu.values.get(key) for key in EXPORTED}
    assert got == {key: _at(ref, path) for key, path in EXPORTED.items()}
    assert gpu.values["processes"] == len(ref["procs"]) == 0
    assert [key for key in REFUSED if key in gpu.values] == []


def test_counters_move_at_the_idle_rate(h200):
    sampler, _ = h200
    first = sampler.sample().devices[0].values
    second = sampler.sample().devices[0].values
    assert second["energy"] - first["energy"] == 792110  # 79.2 W for 10 s, in mJ
    assert second["violation.low_utilization"] - first["violation.low_utilization"] == 10**10
    assert second["temp.gpu"] == first["temp.gpu"] == 34


def test_the_slow_calls_take_their_measured_time(h200):
    sampler, sleeps = h200
    sampler.sample()
    assert 0.0047 in sleeps  # the field call, once per sample
    assert 0.0014 in sleeps  # a maximum clock, read once


def test_the_driver_answers_as_the_real_one_did(nvml):
    """Memory v1 counts the reserved bytes as used, v2 does not; the codec calls answer the
    sampling period; per-process utilization answers NOT_FOUND with nothing running."""
    nvml("h200", sleep=lambda _: None)
    ref = _reference()
    next_sample()
    [h] = handles()
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert (v1.total, v1.free, v1.used) == tuple(ref["mem_v1"][k]
                                                 for k in ("total", "free", "used"))
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.free, v2.used) == tuple(
        ref["mem_v2"][k] for k in ("total", "reserved", "free", "used"))
    assert pynvml.nvmlDeviceGetEncoderUtilization(h) == ref["enc"] == [0, 100000]
    assert pynvml.nvmlDeviceGetDecoderUtilization(h) == ref["dec"]
    assert pynvml.nvmlDeviceGetMigMode(h) == ref["mig_mode"]
    for call, args in ((pynvml.nvmlDeviceGetProcessUtilization, (0,)),
                       (pynvml.nvmlDeviceGetNumaNodeId, ()),
                       (pynvml.nvmlDeviceGetFanSpeed, ()),
                       (pynvml.nvmlDeviceGetNvLinkState, (0,))):
        with pytest.raises(pynvml.NVMLError) as caught:
            call(h, *args)
        expected = (pynvml.NVML_ERROR_NOT_FOUND if call is pynvml.nvmlDeviceGetProcessUtilization
                    else pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert caught.value.value == expected, call.__name__
    assert pynvml.nvmlSystemGetNVMLVersion() == json.loads(REFERENCE.read_text())["_nvml"]
