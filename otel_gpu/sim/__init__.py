"""The NVML simulator behind ``--simulate``: a fake driver and the scenarios it plays.

What runs against a real driver lives in :mod:`otel_gpu.sample`; this package
only replaces what sits underneath it. :mod:`~otel_gpu.sim.scenario` loads and
validates a scenario (the YAML format is in ``docs/scenarios.md``; built-in
ones are in ``profiles/``), :mod:`~otel_gpu.sim.driver` answers NVML's C
symbols from it, and :mod:`~otel_gpu.sim.install` slips the driver under pynvml::

    install(FakeNvml(load_scenario("h100x8")))   # then pynvml.nvmlInit() as usual
"""

from __future__ import annotations

from otel_gpu.sim.driver import Fail, FakeNvml, c_symbol, deref
from otel_gpu.sim.install import install, uninstall
from otel_gpu.sim.scenario import (
    PROFILES_DIR,
    Scenario,
    ScenarioError,
    builtin_profiles,
    load_scenario,
)

DEVICE_SYMBOLS = FakeNvml.device_symbols()
"""What a scenario device's faults may name by default: the built-in driver's device symbols."""

__all__ = [
    "DEVICE_SYMBOLS",
    "PROFILES_DIR",
    "Fail",
    "FakeNvml",
    "Scenario",
    "ScenarioError",
    "builtin_profiles",
    "c_symbol",
    "deref",
    "install",
    "load_scenario",
    "uninstall",
]
