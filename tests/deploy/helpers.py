"""The deployment tests' paths, tools, and Kubernetes schema checks (their fixtures are in
``conftest.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "otel-gpu-rules.yaml"
CHART = DEPLOY / "helm" / "otel-gpu"
KUBERNETES_VERSION = "1.30.0"  # a version whose schemas kubernetes-validate ships

# The node selector terms (ORed) that keep the DaemonSet on GPU nodes, in the chart
# and the kustomize base: each a label only GPU nodes carry.
GPU_NODE_TERMS = [
    # NVIDIA GPU Feature Discovery (and the GPU operator)
    {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In",
                           "values": ["true"]}]},
    # Node Feature Discovery: a PCI device of NVIDIA's vendor id
    {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present",
                           "operator": "In", "values": ["true"]}]},
    {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "k8s.amazonaws.com/accelerator", "operator": "Exists"}]},
    {"matchExpressions": [{"key": "kubernetes.azure.com/accelerator", "operator": "Exists"}]},
    # Karpenter on EKS, and EKS Auto Mode: the instance's GPU manufacturer
    {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-manufacturer",
                           "operator": "In", "values": ["nvidia"]}]},
    {"matchExpressions": [{"key": "eks.amazonaws.com/instance-gpu-manufacturer",
                           "operator": "In", "values": ["nvidia"]}]},
]


def tool(name: str, hint: str) -> str:
    """The tool's path, or skip the test with a hint on how to get it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name!r} not found on PATH ({hint})")
    return path


def helm_binary() -> str:
    """helm from PATH, $HELM, or the cache scripts/get-helm.sh fills; else skip."""
    for candidate in (os.environ.get("HELM"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cached = Path(os.environ.get("HELM_CACHE_DIR") or cache / "otel-gpu" / "helm") / "helm"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    pytest.skip("helm not found (run scripts/get-helm.sh, or set HELM)")


def chart_with_notes(tmp_path: Path) -> Path:
    """A copy of the chart that also renders NOTES.txt (helm template leaves it out), as
    the ConfigMap ``rendered-notes``."""
    chart = tmp_path / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rendered-notes}\ndata:\n"
            '  NOTES.txt: {{ include (print $.Template.BasePath "/NOTES.txt") . | quote }}\n')
    return chart


def run(*args: str, cwd: Path = ROOT, timeout: float = 120) -> str:
    """Run a command; fail the test with its output when it exits non-zero."""
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def documents(text: str) -> list[dict]:
    """The non-empty YAML documents of a multi-document stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


# Prometheus Operator objects have no schema in kubernetes-validate: checked by hand.
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def assert_valid_objects(objects: list[dict]) -> None:
    """Validate every object against the Kubernetes OpenAPI schemas (offline)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    assert objects, "nothing rendered"
    for obj in objects:
        where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        if obj.get("kind") in CUSTOM_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", where
            assert obj["metadata"]["name"], where
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{where} does not validate: {err.message} at {list(err.path)}")
