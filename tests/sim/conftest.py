"""The simulator's test kit: a fixture installing a fake under pynvml, and small helpers.

Every test drives the fake through the real pynvml API above it, as the
collector does.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from otel_gpu.sim import FakeNvml

SCENARIOS = Path(__file__).with_name("scenarios")
FAULTS = str(SCENARIOS / "faults.yaml")


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"unexpected sleep({seconds})")


@pytest.fixture
def nvml(fake_nvml) -> Callable[..., FakeNvml]:
    """``fake_nvml`` with NVML initialised and no sleeping allowed: ``nvml("t4")``,
    ``nvml(path, sleep=recorder)`` or ``nvml(scenario, driver=SubclassOfFakeNvml)``."""
    return functools.partial(fake_nvml, sleep=_no_sleep, init=True)


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def next_sample() -> int:
    """What the collector's sampler does first in every sample."""
    return pynvml.nvmlDeviceGetCount()


def handles() -> list:
    """Every GPU handle, without calling nvmlDeviceGetCount (that would start a sample)."""
    out = []
    while True:
        try:
            out.append(pynvml.nvmlDeviceGetHandleByIndex(len(out)))
        except pynvml.NVMLError_InvalidArgument:
            return out


def field(handle, name: str):
    return pynvml.nvmlDeviceGetFieldValues(handle, [getattr(pynvml, f"NVML_FI_DEV_{name}")])[0]


def token(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value
