"""Installing the fake under pynvml and putting back what was there."""

from __future__ import annotations

import pynvml

from otel_gpu.sim import FakeNvml, install, load_scenario, uninstall


def test_uninstall_restores_the_previous_library():
    sentinel = object()
    before = pynvml.nvmlLib
    pynvml.nvmlLib = sentinel
    try:
        install(FakeNvml(load_scenario("t4")))
        pynvml.nvmlInit()
        assert isinstance(pynvml.nvmlLib, FakeNvml)
        uninstall()
        assert pynvml.nvmlLib is sentinel
        assert "nvmlInitWithFlags" not in pynvml._nvmlGetFunctionPointer_cache
    finally:
        pynvml.nvmlLib = before


def test_installing_again_still_restores_the_first_library():
    before = pynvml.nvmlLib
    install(FakeNvml(load_scenario("t4")))
    second = FakeNvml(load_scenario("h100x8"))
    install(second)
    try:
        pynvml.nvmlInit()
        assert pynvml.nvmlLib is second
        assert pynvml.nvmlDeviceGetCount() == 8
    finally:
        uninstall()
    assert pynvml.nvmlLib is before
