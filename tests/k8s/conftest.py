"""Fixtures for the pod-attribution tests: a fake kubelet, a fake clock, devices."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # fake_kubelet is imported by name, whatever the import mode
    sys.path.insert(0, str(_HERE))

from fake_kubelet import FakeKubelet, sample_node  # noqa: E402

from otel_gpu.snapshot import Device  # noqa: E402


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet()
    fake.start()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def node_devices() -> tuple[Device, ...]:
    """Three GPUs whose minor numbers differ from their NVML indexes; GPU1 in MIG mode."""
    return sample_node()
