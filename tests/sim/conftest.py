"""The simulator tests' fixture: a fake under pynvml, initialised, that may not sleep
(the helpers are in ``helpers.py``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from otel_gpu.sim import FakeNvml


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"unexpected sleep({seconds})")


@pytest.fixture
def nvml(fake_nvml) -> Callable[..., FakeNvml]:
    """``fake_nvml`` with NVML initialised and no sleeping allowed: ``nvml("t4")``,
    ``nvml(path, sleep=recorder)`` or ``nvml(scenario, driver=SubclassOfFakeNvml)``."""
    return functools.partial(fake_nvml, sleep=_no_sleep, init=True)
