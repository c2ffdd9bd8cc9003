"""Readiness: what /readyz answers, from the latest snapshot and the clock alone."""

from __future__ import annotations

from dataclasses import replace

from otel_gpu.publish.readiness import readiness
from otel_gpu.publish.timings import Timings
from otel_gpu.snapshot import FAILED, Device, DeviceSample
from tests.support.snapshots import snapshot

GPU = Device("GPU-1", 0, "Tesla T4", "Tesla T4", "00000000:01:00.0")
TEN, TWENTY = Timings.from_interval(10.0), Timings.from_interval(20.0)


def test_readiness_is_a_function_of_the_latest_sample_and_the_clock():
    assert readiness(None, 100.0, TEN) == (False, "not ready: no NVML sample has finished yet")
    good = snapshot(DeviceSample(GPU), seq=1, taken_monotonic=100.0)
    ready, reason = readiness(good, 100.0, TEN)
    assert ready and reason.startswith("ready: 1 of 1 device(s) readable")
    ready, reason = readiness(good, 131.0, TEN)  # max(3 x 10 s, 30 s) later
    assert not ready and "the driver may be hung" in reason
    assert readiness(good, 129.0, TEN)[0]
    assert not readiness(good, 100.0 + 61.0, TWENTY)[0] and readiness(good, 159.0, TWENTY)[0]
    lost = DeviceSample(GPU, FAILED, error="GPU is lost (GPU_IS_LOST) in power")
    assert readiness(replace(good, devices=(lost,)), 100.0, TEN) == (
        False, "not ready: no readable GPU: GPU 0 (GPU-1) failed: GPU is lost (GPU_IS_LOST) "
               "in power")


def test_not_ready_gives_one_reason_per_gpu_naming_it_most_severe_first():
    """A lost GPU is named once (its MIG instances, failed with it, are not repeated), a
    hung one after the failed ones, and a note about a missing feature (no GPM) is no
    reason at all."""
    a = Device("GPU-a", 0, "NVIDIA H100", "NVIDIA H100", "00000000:01:00.0")
    b = Device("GPU-b", 1, "NVIDIA H100", "NVIDIA H100", "00000000:02:00.0")
    c = Device("GPU-c", 2, "NVIDIA A100", "NVIDIA A100", "00000000:03:00.0")
    mig = [Device(f"MIG-c{i}", 2, "NVIDIA A100 MIG 1g.5gb", "NVIDIA A100", c.pci_bus_id,
                  parent_uuid=c.uuid, gpu_instance_id=i, compute_instance_id=0,
                  mig_profile="1g.5gb") for i in (1, 2)]
    lost = "GPU is lost (GPU_IS_LOST) in fields"
    hung = "GPU 0 (GPU-a): reading field values has not returned after 5.0 s"
    snap = snapshot(
        DeviceSample(a, hung=hung),
        DeviceSample(b, FAILED, error=lost),
        DeviceSample(c, FAILED, error=lost),
        *(DeviceSample(m, FAILED, error=lost) for m in mig),
        seq=3, taken_monotonic=100.0,
        errors=("no profiling metrics (NVML GPM) for GPU 0 (GPU-a): the GPU does not "
                "support it (GPM needs Hopper or newer)", hung),
    )
    ready, reason = readiness(snap, 100.0, TEN)
    assert not ready
    assert reason == (
        "not ready: no readable GPU: "
        "GPU 1 (GPU-b) failed: GPU is lost (GPU_IS_LOST) in fields; "
        "GPU 2 (GPU-c) failed: GPU is lost (GPU_IS_LOST) in fields; "
        "GPU 0 (GPU-a) hangs: reading field values has not returned after 5.0 s")


def test_not_ready_without_any_device_says_what_nvml_said():
    snap = snapshot(seq=1, taken_monotonic=100.0,
                    errors=("nvmlDeviceGetCount failed: driver not loaded",))
    assert readiness(snap, 100.0, TEN) == (
        False, "not ready: no readable GPU: nvmlDeviceGetCount failed: driver not loaded")
    assert readiness(snapshot(seq=1, taken_monotonic=100.0), 100.0, TEN) == (
        False, "not ready: no readable GPU: none found")


def test_notes_are_added_to_the_reason_and_change_no_answer():
    good = snapshot(DeviceSample(GPU), seq=1, taken_monotonic=100.0)
    note = "pods not attributed: no kubelet socket at /x/kubelet.sock for 5 min"
    ready, reason = readiness(good, 100.0, TEN, (note,))
    assert ready and reason.startswith("ready: 1 of 1") and reason.endswith("; " + note)
    ready, reason = readiness(None, 100.0, TEN, (note,))
    assert not ready and reason == "not ready: no NVML sample has finished yet; " + note
