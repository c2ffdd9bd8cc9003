"""The collector the benchmarks measure is the one an install ships: no module more."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import launch, peer
from benchmarks.run import ROOT
from testkit.scenarios import NODES, write_scenario

LOCK = ROOT / "deploy/image/requirements.lock"


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _shipped() -> set[str]:
    """The distributions the image installs: its lock's, and otel-gpu itself."""
    pinned = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", LOCK.read_text(), re.MULTILINE)
    return {_name(d) for d in pinned} | {"otel-gpu"}


def _modules_of_a_run(tmp_path: Path) -> list[str]:
    scenario = write_scenario(NODES["gpus-1"], tmp_path)
    counts = tmp_path / "counts"
    proc = subprocess.Popen(peer.otel_gpu_command(counts, [
        "--simulate", str(scenario), "--listen", "127.0.0.1:0", "--interval", "0.1",
        "--kubelet-socket", str(tmp_path / "no-kubelet.sock"), "--log-level", "warning"]),
        cwd=ROOT)
    try:
        port = peer.counts_port(counts, lambda: proc.poll() is None)
        deadline = time.monotonic() + 60
        while (seen := peer.read_counts(port))["samples"] < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "no three samples"
            time.sleep(0.05)
        return seen["modules"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _at_start() -> set[str]:
    """What this environment's interpreter imports before any program (its ``.pth`` hooks,
    such as setuptools' ``_distutils_hack``): every system measured starts with them."""
    out = subprocess.run([sys.executable, "-c", "import sys; print(*sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    return {name.partition(".")[0] for name in out.split()}


def test_the_measured_collector_imports_nothing_an_install_lacks(tmp_path):
    modules = sorted(set(_modules_of_a_run(tmp_path)) - _at_start())
    assert "otel_gpu" in modules and "pynvml" in modules  # the run is the collector's
    owners = importlib.metadata.packages_distributions()
    shipped = _shipped()
    unshipped = {m: owners[m] for m in modules
                 if m in owners and not {_name(d) for d in owners[m]} & shipped}
    assert unshipped == {}, f"imported by the measured collector, in no install: {unshipped}"
    assert not set(launch.NOT_SHIPPED) & set(modules)


def test_what_the_launcher_keeps_out_is_in_no_install():
    """Kept out because the benchmark's environment has it and an install does not: were it
    a dependency one day, keeping it out would understate the collector's memory."""
    shipped = _shipped()
    owners = importlib.metadata.packages_distributions()
    for module in launch.NOT_SHIPPED:
        assert not {_name(d) for d in owners.get(module, [module])} & shipped, module
