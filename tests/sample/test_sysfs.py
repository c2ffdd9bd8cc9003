"""sysfs is read with the checks a user's file gets: a FIFO or an endless file blocks nothing."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from otel_gpu._files import read_sysfs
from otel_gpu.attribute.k8s.attribution import attribute
from otel_gpu.attribute.k8s.kubelet_answer import PodResourcesState
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.snapshot import FAILED, Device
from tests.support.nvml import SOURCES

T = TypeVar("T")

LOST_SECOND = """
    devices:
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 1000, used: 10}
      - name: NVIDIA H100 80GB HBM3
        memory: {total: 1000, used: 10}
        lost_after: 0
"""


def _within(seconds: float, run: Callable[[], T]) -> T:
    """``run()``, which must return within ``seconds`` (a blocked read would not)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked reading sysfs"
    return out[0]


def test_read_sysfs_refuses_what_is_not_a_plain_file(tmp_path):
    (tmp_path / "numa_node").write_text("1\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"0" * 70_000)
    assert read_sysfs(tmp_path / "numa_node") == "1"
    assert _within(5, lambda: read_sysfs(tmp_path / "fifo")) is None
    assert read_sysfs(tmp_path / "big") is None
    assert read_sysfs(tmp_path / "missing") is None
    assert read_sysfs(tmp_path) is None  # a directory
    assert read_sysfs("/dev/zero") is None


def test_discovery_finishes_when_a_pci_class_file_is_a_fifo(fake_nvml, tmp_path):
    fake_nvml(LOST_SECOND)
    driver_dir = tmp_path / "sys" / "bus" / "pci" / "drivers" / "nvidia"
    for bdf in ("0000:18:00.0", "0000:2a:00.0"):
        (driver_dir / bdf).mkdir(parents=True)
    (driver_dir / "0000:18:00.0" / "class").write_text("0x030200\n")
    os.mkfifo(driver_dir / "0000:2a:00.0" / "class")
    nvml = Nvml()
    nvml.init()
    sampler = Sampler(nvml, SOURCES, sysfs_root=tmp_path)
    snap = _within(5, sampler.sample)
    assert snap.devices[1].state == FAILED
    assert snap.devices[1].device.pci_bus_id == ""  # the order could not be told: none
    assert snap.devices[0].values["memory.total"] == 1000


def test_attribution_finishes_when_numa_node_is_a_fifo(tmp_path: Path):
    pci = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    pci.mkdir(parents=True)
    os.mkfifo(pci / "numa_node")
    gpu = Device(uuid="GPU-00000000-0000-0000-0000-000000000001", index=0, name="GPU",
                 model="GPU", pci_bus_id="00000000:3B:00.0")
    result = _within(5, lambda: attribute([gpu], PodResourcesState(), tmp_path))
    assert result.numa_node(gpu.uuid) is None
