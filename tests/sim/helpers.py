"""The simulator tests' helpers: scenario files, and pynvml calls made the collector's way.

Every test drives the fake through the real pynvml API above it, as the collector does;
the ``nvml`` fixture is in ``conftest.py``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml

SCENARIOS = Path(__file__).with_name("scenarios")
FAULTS = str(SCENARIOS / "faults.yaml")

LIMITS = """
devices:
  - name: NVIDIA L40S
    count: 2
    power_limits: {current: 300000, enforced: {start: 290000, per_device: 5000}, default: 350000,
                   min: 100000, max: 350000}
    performance_state: {start: 0, per_device: 8}
    clocks: {video: 1500}
    max_clocks: {graphics: 2520, sm: 2520, memory: 9001, video: {start: 1965, per_device: 5}}
    pcie: {generation: {start: 4, step: -3}, max_generation: 4, width: 16, max_width: 16,
           tx_throughput: {start: 2000, per_device: 10}, rx_throughput: 64000}
    violations: {power: {start: 1500000000, per_device: 1000, step: 250000000},
                 thermal: 7, sync_boost: 0, board_limit: 1, low_utilization: 9000000000,
                 reliability: 2}
    row_remap_histogram: {max: 700, high: 3, none: 1}
"""
"""Two L40S with every limit, clock, PCIe and violation value set."""

THREE_LINKS = """
devices:
  - name: NVIDIA A100-SXM4-80GB
    count: 2
    nvlink:
      links:
        - {tx: {start: 1000, per_device: 100, step: 10}, rx: 7, crc_flit: 2, replay: 1}
        - {tx: 20000, rx: 70, crc_flit: {start: 3, per_device: 1}, recovery: 4}
        - {state: inactive, tx: 300000, crc_data: 5}
        - {tx: 4000000, down_after: 1}
"""
"""Two A100s with four links: one inactive, one going down after the first sample."""


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
