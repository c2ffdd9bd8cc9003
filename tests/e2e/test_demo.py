"""The README's first command, `otel-gpu --simulate demo`: pods, per-pod usage and energy per
pod from a simulated node, an idle allocation and use outside any allocation, with nothing
else to set up."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from otel_gpu.sim import load_scenario
from testkit.exposition import series
from testkit.process import CollectorProcess, wait_until

PODS = {("train-llama-0", "ml"), ("notebook-alice", "research"), ("notebook-bob", "research"),
        ("transcode-7f9c", "media"), ("serve-embed-0", "ml"), ("serve-rerank-0", "ml"),
        ("notebook-carol", "research")}
IDLE_POD = ("notebook-carol", "research")
"""Holds GPU 4 whole and runs nothing on it."""


def _pods(text: str, metric: str) -> set[tuple[str, str]]:
    return {(lab["k8s_pod_name"], lab["k8s_namespace_name"])
            for lab, _ in series(text, metric) if lab.get("k8s_pod_name")}


def _idle_shown(text: str) -> str | None:
    """``text`` once only the idle pod's allocation is idle, for longer than 0 s."""
    idle = {(lab["k8s_pod_name"], lab["k8s_namespace_name"]) for lab, value
            in series(text, "nvidia_gpu_k8s_idle_duration_seconds") if value > 0}
    active = {(lab["k8s_pod_name"], lab["k8s_namespace_name"]) for lab, value
              in series(text, "nvidia_gpu_k8s_time_active_seconds_total") if value > 0}
    return text if idle == {IDLE_POD} and active == PODS - {IDLE_POD} else None


def test_the_demo_shows_gpus_by_pod_usage_energy_an_idle_allocation_and_outside_use():
    # As the README has it, on a free port (the default interval: 10 s).
    proc = CollectorProcess(["--simulate", "demo", "--listen", "127.0.0.1:0"])
    try:
        started = time.monotonic()
        proc.wait_serving()

        def every_pod():
            text = proc.metrics()
            usage = _pods(text, "nvidia_gpu_k8s_memory_usage_bytes")
            return text if usage == PODS and _pods(
                text, "nvidia_gpu_k8s_energy_joules_total") == PODS else None

        text = str(wait_until(every_pod, 10.0, "every pod's usage and energy series"))
        assert time.monotonic() - started < 10.0
        # GPUs by pod: the whole GPU and each MIG instance carry their pod
        assert _pods(text, "hw_gpu_memory_usage_bytes") == {
            ("train-llama-0", "ml"), ("serve-embed-0", "ml"), ("serve-rerank-0", "ml"),
            IDLE_POD}
        # the container outside Kubernetes and the host process: the GPU's unattributed row
        (idle,) = [lab for lab, _ in series(text, "nvidia_gpu_k8s_memory_usage_bytes")
                   if lab.get("nvidia_gpu_process_owner") == "unattributed"]
        assert not idle.get("k8s_pod_name")

        def energy_grows():
            body = proc.metrics()
            grown = {(lab["k8s_pod_name"], lab["k8s_namespace_name"])
                     for lab, value in series(body, "nvidia_gpu_k8s_energy_joules_total")
                     if lab.get("k8s_pod_name") and value > 0}
            return grown == PODS

        wait_until(energy_grows, 25.0, "energy per pod from the second sample on")
        body = str(wait_until(lambda: _idle_shown(proc.metrics()), 35.0,
                              "the idle pod's idle time growing"))
        assert time.monotonic() - started < 60.0  # in the newcomer's first minute
        # the container outside Kubernetes holds GPU 3, where a host process runs too
        (jupyter_gpu,) = {lab["hw_id"] for lab, _ in
                          series(body, "nvidia_gpu_container_time_allocated_seconds_total")}
        assert {(lab["hw_id"], lab["nvidia_gpu_outside_kind"], value) for lab, value
                in series(body, "nvidia_gpu_outside_use")} == {(jupyter_gpu, "host", 1.0)}
        line = next(ln for ln in proc.lines if "simulating a node with 7 pod(s)" in ln)
        directory = os.path.dirname(re.search(r"a kubelet on (\S+)", line).group(1))
        assert os.path.isdir(directory)
    finally:
        code, _ = proc.stop(signal.SIGTERM)
    assert code == 0, proc.log
    assert not os.path.exists(directory), "the simulated node's files are left behind"


@pytest.mark.slow  # seconds of real time and a real receiver: not in the quick loop
def test_the_demo_sends_a_record_for_its_idle_allocation_and_for_the_outside_use(
        collector, receiver):
    """Over OTLP, as docs/events.md says: the idle pod's record under the pod's Resource, and
    one for the host process on GPU 3. An idle_threshold given wins over the demo's 30 s."""
    demo = load_scenario("demo")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_METRIC_EXPORT_INTERVAL": "500"}
    proc = collector("--simulate", "demo", "--idle-threshold", "2s", env=env, interval="0.5")
    started = time.monotonic()
    (idle,) = receiver.wait_for_logs(lambda r: r.event_name == "nvidia.gpu.allocation.idle",
                                     timeout=20.0)
    assert time.monotonic() - started < 20.0  # the threshold given, not the demo's
    assert (idle.resource["k8s.pod.name"], idle.resource["k8s.namespace.name"]) == IDLE_POD
    assert idle.attributes["hw.id"] == demo.devices[4].uuid
    assert idle.attributes["nvidia.gpu.event.phase"] == "start"
    assert idle.severity_text == "WARN" and idle.attributes["nvidia.gpu.idle.duration"] >= 2.0
    (outside,) = receiver.wait_for_logs(
        lambda r: r.event_name == "nvidia.gpu.outside_allocation", timeout=10.0)
    assert outside.attributes["hw.id"] == demo.devices[3].uuid
    assert outside.attributes["nvidia.gpu.outside.kind"] == "host"
    assert outside.attributes["nvidia.gpu.event.phase"] == "start"
    assert "k8s.pod.name" not in outside.resource
    ((_, samples),) = series(proc.metrics(), "otel_gpu_samples_total")
    proc.wait_sample(int(samples) + 6)  # more samples: neither record repeats
    code, _ = proc.stop()
    assert code == 0
    names = [r.event_name for r in receiver.log_records()]
    assert names.count("nvidia.gpu.allocation.idle") == 1, names
    assert names.count("nvidia.gpu.outside_allocation") == 1, names
