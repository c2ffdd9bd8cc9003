"""The collector's own NVML numbers (:mod:`otel_gpu.nvml_abi`) against the installed pynvml."""

from __future__ import annotations

import importlib.metadata

import pynvml
import pytest

from otel_gpu import nvml_abi


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


def _table() -> dict[str, int]:
    return {name: value for name, value in vars(nvml_abi).items()
            if name.startswith(("NVML_", "nvml")) and isinstance(value, int)}


def test_every_number_pynvml_also_names_is_the_same():
    """A typo in the table shows here. Held to the binding the table follows or a newer
    one: older releases gave a few numbers wrong (the fabric health mask widths, two
    swapped field ids), which is why the table is the collector's own."""
    version = importlib.metadata.version("nvidia-ml-py")
    follows = nvml_abi.NVML_HEADER.rpartition(" ")[2]
    if _release(version) < _release(follows):
        pytest.skip(f"nvidia-ml-py {version} is older than the {follows} the table follows")
    shared = {name: value for name, value in _table().items() if hasattr(pynvml, name)}
    wrong = {name: (value, getattr(pynvml, name)) for name, value in shared.items()
             if getattr(pynvml, name) != value}
    assert not wrong, f"table vs pynvml: {wrong}"
    assert len(shared) > 100  # the comparison compared something


def test_the_table_has_the_families_the_collector_reads():
    table = _table()
    assert table["NVML_SUCCESS"] == 0
    for family in ("NVML_ERROR_", "NVML_FI_DEV_", "NVML_GPM_METRIC_", "NVML_GPU_FABRIC_STATE_",
                   "NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_", "NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_",
                   "NVML_VALUE_TYPE_", "NVML_PERF_POLICY_", "nvmlClocksEventReason",
                   "nvmlEventType"):
        assert any(name.startswith(family) for name in table), family
