"""The NVML simulator slipped under pynvml for in-process tests, and what its profiles say.

Tests get it through the ``fake_nvml`` fixture (``tests/conftest.py``)::

    lib = fake_nvml("h100x8")              # a built-in profile, a path, a Scenario,
    lib = fake_nvml('''devices: ...''')    # or YAML text (written to the test's tmp_path)

Every driver installed in a test is taken away when the test ends.
"""

from __future__ import annotations

import textwrap
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from otel_gpu import sim
from otel_gpu.instrument.catalog import all_sources

SOURCES = all_sources()
"""Every source the catalog reads: what the service hands its sampler."""

CALLS_PER_GPU_PER_SAMPLE = {False: 17.5, True: 18.5}
"""NVML calls per GPU per sample on h100x8, counted at the library, process usage off and
on (it adds the per-process utilization call): the batched field call, the 14 calls NVML
has no field id for (memory, utilization, encoder, decoder, temperature, four clocks,
clock event reasons, P-state, PCIe generation and width, processes: asked for its size,
then filled, on the two GPUs running processes), GPM's two, and the node's two (device
count, XID event wait) shared by the 8 GPUs. It was 28.25 with power, two power
limits, six violation times, the row remap histogram and the NVLink link states (19 calls
counted as one) read on their own every sample."""

LINKS = """
devices:
  - name: NVIDIA A100-SXM4-80GB
    nvlink:
      all_links_scope: {all_links_scope}
      links:
        - {{tx: {{start: 1000, step: 10}}, rx: 7, crc_flit: 2, replay: 1}}
        - {{tx: 20000, rx: 70, crc_flit: 3, recovery: 4}}
        - {{state: inactive, tx: 300000, rx: 700, crc_data: 5}}
        - {{tx: 4000000, rx: 7000, down_after: 2}}
"""
"""An A100 with four NVLinks, one inactive, one going down; ``{all_links_scope}``: whether
the driver answers the all-links total."""


def load(
    spec: str | Path | sim.Scenario, directory: Path, driver: type[sim.FakeNvml] = sim.FakeNvml
) -> sim.Scenario:
    """A scenario from a built-in profile name, a file, YAML text (written under
    ``directory``), or as it is; its faults may name any device symbol of ``driver``.
    """
    if isinstance(spec, sim.Scenario):
        return spec
    if isinstance(spec, str) and "\n" in spec:
        path = directory / "scenario.yaml"
        path.write_text(textwrap.dedent(spec))
        spec = path
    return sim.load_scenario(str(spec), device_symbols=driver.device_symbols())


class FakeNvmlInstaller:
    """Call it to put a simulated driver under pynvml; :meth:`close` takes it away."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def __call__(
        self,
        spec: str | Path | sim.Scenario,
        *,
        sleep: Callable[[float], None] = time.sleep,
        init: bool = False,
        driver: type[sim.FakeNvml] = sim.FakeNvml,
    ) -> sim.FakeNvml:
        """Install a ``driver`` playing ``spec``; ``sleep`` is what slow calls block
        through (pass a recorder to keep a test fast); ``init`` calls ``nvmlInit``.
        """
        lib = driver(load(spec, self._directory, driver), sleep=sleep)
        sim.install(lib)
        if init:
            pynvml.nvmlInit()
        return lib

    def close(self) -> None:
        sim.uninstall()


def profile_uuids(profile: str) -> list[str]:
    """The uuids of a profile's GPUs, in NVML index order (MIG instances not included)."""
    return [d.uuid for d in sim.load_scenario(profile).devices]


def first_sample_values(profile: str = "h100x8") -> dict[str, dict[str, float]]:
    """What a profile's GPUs read in the collector's first sample, through the real pynvml
    API: by uuid, ``used`` (bytes), ``power_w``, ``temp``, ``sm_mhz`` and ``util``.
    """
    sim.install(sim.FakeNvml(sim.load_scenario(profile)))
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()  # sample 1, as the collector's first sample sees it
        out = {}
        for i in range(count):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out[pynvml.nvmlDeviceGetUUID(h)] = {
                "used": pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temp": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
            }
        return out
    finally:
        sim.uninstall()


class RefusingNvml:
    """An NVML handle whose ``init`` raises ``error``: start-up failing the way it can."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def init(self) -> None:
        raise self.error


def sample_within(sampler: Any, seconds: float, hung: str) -> Any:
    """One ``sampler.sample()``, which must finish within ``seconds`` whatever hangs
    (``hung`` names it in the failure)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(sampler.sample()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"a sample waited on {hung}"
    return out[0]


class OlderBinding(types.ModuleType):
    """pynvml as an older release has it: without the names in ``lacks``."""

    def __init__(self, lacks: set[str]) -> None:
        super().__init__("pynvml")
        self._lacks = lacks

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("_lacks", ()):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}", name=name,
                                 obj=self)
        return getattr(pynvml, name)
