"""The reader pool: one thread for the node while no GPU hangs, one more per hung GPU."""

from __future__ import annotations

import threading
import time

import pytest

from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.sample.workers import Pool, Workers
from testkit.process import wait_until
from testkit.scenarios import NODES, write_scenario
from tests.support.nvml import SOURCES


def _readers(before: set[threading.Thread] = frozenset()) -> set[threading.Thread]:
    """The reader threads alive now that were not in ``before`` (other tests' samplers
    may still hold readers of their own in this process)."""
    return {t for t in threading.enumerate()
            if t.name.startswith("otel-gpu-read") and t not in before}


def _job(result: str, release: threading.Event | None = None):
    def run(worker):
        if release is not None:
            with worker.doing("nvmlDeviceGetTemperature"):
                release.wait(30)
        return result
    return run


@pytest.fixture
def released():
    """An event every stuck job waits on, set when the test ends so no thread outlives it."""
    release = threading.Event()
    yield release
    release.set()


def test_a_hung_gpu_keeps_one_thread_and_the_others_are_read_in_time(released):
    before = set(threading.enumerate())
    workers = Workers(time.monotonic, size=1)
    try:
        jobs = {0: _job("gpu0", released), 1: _job("gpu1"), 2: _job("gpu2"), 3: _job("gpu3")}
        # one thread, GPU 0 first in its queue: the others are read only if it is replaced
        assert workers.run(jobs, timeout=1.0) == {1: "gpu1", 2: "gpu2", 3: "gpu3"}
        assert workers.busy(0) and not workers.busy(1)
        assert workers.get(0).current == "nvmlDeviceGetTemperature"
        grown = _readers(before)
        assert len(grown) == 2  # the held one and its replacement
        # the hung GPU gets no new job; the rest are read by the thread already there
        assert workers.run(jobs, timeout=1.0) == {1: "gpu1", 2: "gpu2", 3: "gpu3"}
        assert _readers(before) == grown
        released.set()
        # back from its call, the held thread leaves: the pool is one thread again
        wait_until(lambda: len(_readers(before)) == 1, 10, "the held thread to leave")
        assert workers.run(jobs, timeout=5.0) == {0: "gpu0", 1: "gpu1", 2: "gpu2", 3: "gpu3"}
        assert workers.threads == 1
    finally:
        workers.close()


def test_every_gpu_hung_in_one_round_still_ends_at_the_deadline(released):
    workers = Workers(time.monotonic, size=2)
    try:
        jobs = {i: _job(f"gpu{i}", released) for i in range(6)}
        assert workers.run(jobs, timeout=1.0) == {}
        assert all(workers.busy(i) for i in range(6))
        assert workers.threads <= 2
    finally:
        workers.close()


def test_a_bug_in_a_job_is_raised_to_the_sampler_thread():
    workers = Workers(time.monotonic)

    def broken(worker):
        raise KeyError("not the driver")

    try:
        with pytest.raises(KeyError, match="not the driver"):
            workers.run({0: broken, 1: _job("gpu1")}, timeout=5.0)
        assert workers.run({1: _job("gpu1")}, timeout=5.0) == {1: "gpu1"}
    finally:
        workers.close()


def test_a_job_past_its_deadline_hands_its_result_out_once_it_returns(released):
    workers = Workers(time.monotonic)
    try:
        assert workers.run({-3: _job("drained", released)}, timeout=0.2) == {}
        assert workers.late(-3) is None  # still running
        released.set()
        wait_until(lambda: not workers.busy(-3), 10, "the job to return")
        job = workers.late(-3)
        assert job is not None and job.result == "drained" and job.error is None
        assert workers.late(-3) is None  # once
        assert workers.run({-3: _job("on time")}, timeout=5.0) == {-3: "on time"}
        assert workers.late(-3) is None  # its round handed it out
    finally:
        workers.close()


def test_a_pool_needs_a_thread_and_a_closed_one_takes_no_jobs():
    with pytest.raises(ValueError, match="at least one thread"):
        Pool(0)
    workers = Workers(time.monotonic)
    workers.close()
    with pytest.raises(RuntimeError, match="closed"):
        workers.run({0: _job("gpu0")}, timeout=1.0)


def test_sixty_four_gpus_are_read_by_one_thread(fake_nvml, tmp_path):
    """Once one thread per GPU: 64 threads woken every sample, 259 at 256 GPUs."""
    before = set(threading.enumerate())
    fake_nvml(write_scenario(NODES["gpus-64"], tmp_path))
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES)
    try:
        snapshot = sampler.sample()
        assert len(snapshot.devices) == 64
        assert all(d.state == "ok" and d.values for d in snapshot.devices)
        assert len(_readers(before)) == 1
    finally:
        sampler.close()
