"""A reader's surprise costs that reader's values on that device for that sample, nothing else.

The first case is what NVIDIA's own mock driver does with process usage on: the size
query of the per-process utilization answers SUCCESS with a NULL buffer, pynvml raises
``NVMLError`` with code 0, and before containment every GPU of the node went unpublished.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from otel_gpu import sim
from otel_gpu.sample import containment
from otel_gpu.sample.library import Nvml, Outcome
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.workers import Workers
from tests.support.drivers import SuccessWithoutBuffer, TemperatureRaises
from tests.support.nvml import SOURCES

TWO_GPUS = """\
devices:
  - name: NVIDIA H100 80GB HBM3
    utilization: {gpu: 80}
    temperature: 51
    processes:
      - {pid: 101, used_memory: 1000, sm: 20}
  - name: NVIDIA H100 80GB HBM3
    utilization: {gpu: 30}
    temperature: 44
    processes:
      - {pid: 202, used_memory: 2000, sm: 40}
"""


@pytest.fixture
def sampler(fake_nvml):
    made: list[Sampler] = []

    def make(spec: str, driver: type[sim.FakeNvml], **kw: Any) -> Sampler:
        fake_nvml(spec, driver=driver)
        nvml = Nvml()
        nvml.init()
        made.append(Sampler(nvml, SOURCES, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_success_without_a_buffer_is_an_idle_gpu_not_a_failure(sampler, caplog):
    """NVIDIA's mock library answers the utilization size query with SUCCESS and a count
    of 0: NVML's "none", so the process is idle, and nothing failed."""
    s = sampler(TWO_GPUS, SuccessWithoutBuffer, process_usage=True)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            snap = s.sample()
    assert len(snap.devices) == 2
    for gpu, temp in zip(snap.devices, (51, 44), strict=True):
        assert gpu.readable
        assert gpu.values["temp.gpu"] == temp  # the device's other values are there
        assert gpu.processes is not None and len(gpu.processes) == 1
        assert gpu.process_utilization  # read: no sample, so idle
        assert all(p.sm == 0.0 for p in gpu.processes)
    assert not any(snap.reader_failures.values()), dict(snap.reader_failures)
    assert not snap.errors, snap.errors
    assert not [r for r in caplog.records if hasattr(r, containment.MARK)]


def test_an_nvml_error_of_code_zero_is_never_a_value(fake_nvml):
    fake_nvml(TWO_GPUS)
    nvml = Nvml()
    nvml.init()

    def odd() -> int:
        raise pynvml.NVMLError(pynvml.NVML_SUCCESS)

    res = nvml.call(odd)
    assert not res.ok and res.value is None and res.outcome is Outcome.BROKEN
    assert "SUCCESS" in res.message


def test_any_exception_from_a_call_is_broken_not_raised(fake_nvml):
    fake_nvml(TWO_GPUS)
    nvml = Nvml()

    def bad() -> None:
        raise ValueError("NULL pointer access")

    res = nvml.call(bad)
    assert res.outcome is Outcome.BROKEN and res.error is not None
    assert res.message == "ValueError: NULL pointer access"


@pytest.mark.reader_failures
def test_a_reader_that_raises_costs_its_values_on_that_device_only(sampler, caplog):
    s = sampler(TWO_GPUS, TemperatureRaises)
    s.sample()
    snap = s.sample()
    gpu0, gpu1 = snap.devices
    assert gpu0.values["temp.gpu"] == 51
    assert "temp.gpu" not in gpu1.values  # the value it did not give is absent
    assert gpu1.values["util.gpu"] == 30 and gpu1.readable  # its other values are there
    assert snap.reader_failures["temperature"] == 2  # one per sample
    assert snap.reader_failures["fields"] == 0  # the others from 0


def test_every_reader_is_counted_from_zero(sampler):
    s = sampler(TWO_GPUS, sim.FakeNvml, process_usage=True)
    snap = s.sample()
    counts = snap.reader_failures
    assert counts and not any(counts.values())
    for name in ("fields", "temperature", "memory", "gpm", "processes", "device", "discovery",
                 "nvmlDeviceGetProcessUtilization"):
        assert name in counts


@pytest.mark.reader_failures
def test_a_read_job_that_raises_costs_that_gpu_alone(sampler, monkeypatch):
    s = sampler(TWO_GPUS, sim.FakeNvml)
    s.sample()
    real = Sampler._read

    def read(self: Sampler, t: Any, worker: Any) -> None:
        if t.device.index == 1:
            raise LookupError("the bookkeeping itself")
        real(self, t, worker)

    monkeypatch.setattr(Sampler, "_read", read)
    snap = s.sample()
    gpu0, gpu1 = snap.devices
    assert gpu0.values["temp.gpu"] == 51 and gpu0.age < 5
    assert not gpu1.values  # nothing of it this sample, never the last sample's values
    assert snap.reader_failures[containment.DEVICE] == 1


def test_workers_raise_a_job_error_without_an_errors_mapping():
    workers = Workers(clock=lambda: 0.0)

    def job(worker: Any) -> None:
        raise LookupError("x")

    try:
        with pytest.raises(LookupError):
            workers.run({0: job}, 1.0)
        errors: dict[int, BaseException] = {}
        assert workers.run({0: job, 1: lambda w: 7}, 1.0, errors) == {1: 7}
        assert isinstance(errors[0], LookupError)
    finally:
        workers.close()
