"""The README's first command, `otel-gpu --simulate demo`: pods, per-pod usage and energy per
pod from a simulated node, with nothing else to set up."""

from __future__ import annotations

import os
import re
import signal
import time

from testkit.exposition import series
from testkit.process import CollectorProcess, wait_until

PODS = {("train-llama-0", "ml"), ("notebook-alice", "research"), ("notebook-bob", "research"),
        ("transcode-7f9c", "media"), ("serve-embed-0", "ml"), ("serve-rerank-0", "ml")}


def _pods(text: str, metric: str) -> set[tuple[str, str]]:
    return {(lab["k8s_pod_name"], lab["k8s_namespace_name"])
            for lab, _ in series(text, metric) if lab.get("k8s_pod_name")}


def test_the_demo_shows_gpus_by_pod_per_pod_usage_and_energy_per_pod():
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
            ("train-llama-0", "ml"), ("serve-embed-0", "ml"), ("serve-rerank-0", "ml")}
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
        line = next(ln for ln in proc.lines if "simulating a node with 6 pod(s)" in ln)
        directory = os.path.dirname(re.search(r"a kubelet on (\S+)", line).group(1))
        assert os.path.isdir(directory)
    finally:
        code, _ = proc.stop(signal.SIGTERM)
    assert code == 0, proc.log
    assert not os.path.exists(directory), "the simulated node's files are left behind"
