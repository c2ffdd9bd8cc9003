"""The fake kubelet run as a script, as a developer runs it by hand."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
from testkit.process import ROOT, wait_until
from tests.support.snapshots import GPU0


def test_runs_as_a_script_serving_a_scenario_file(tmp_path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        "pods:\n"
        "  - name: train\n"
        "    namespace: ml\n"
        "    containers:\n"
        "      - name: main\n"
        "        cpu_ids: [0, 1]\n"
        f"        devices: [{{resource: nvidia.com/gpu, ids: [{GPU0}], numa: [0]}}]\n"
        "        claims:\n"
        "          - name: c\n"
        "            devices: [{device: gpu-0}]\n"
        "allocatable:\n"
        f"  - {{resource: nvidia.com/gpu, ids: [{GPU0}]}}\n"
    )
    sock_dir = tempfile.mkdtemp(dir="/tmp", prefix="kl")
    sock = os.path.join(sock_dir, "kubelet.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "testkit.kubelet",
         "--socket", sock, "--scenario", str(scenario)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: os.path.exists(sock) or proc.poll() is not None, 30)
        w = PodResourcesWatcher(sock)
        assert wait_until(w.poll_once, 10)
        state = w.state
        assert {(a.namespace, a.pod, a.device_id) for a in state.allocations} == {
            ("ml", "train", GPU0),
            ("ml", "train", "gpu-0"),
        }
        assert len(state.allocatable) == 1
        w.stop()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
            shutil.rmtree(sock_dir, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout.read() if proc.stdout else ""
