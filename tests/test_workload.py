"""One vocabulary of workload identity: each name is defined in otel_gpu.workload alone.

Read from the source (``ast``), so a second spelling of an attribute name, or an import of a
workload name through another module, is named by file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from otel_gpu import workload
from otel_gpu.workload import (
    WORKLOAD_ATTRIBUTES,
    ContainerRef,
    JobRef,
    PodRef,
    workload_attributes,
)

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "otel_gpu" / "workload.py"


def _defined(module: ast.Module) -> frozenset[str]:
    """The names a module's top level defines (constants, aliases, classes, functions)."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
    return frozenset(names)


NAMES = _defined(ast.parse(HOME.read_text()))
"""Every name otel_gpu.workload defines at its top level."""


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")
                  if "_proto" not in p.parts and p != HOME)


def test_the_names_are_read_from_the_module():
    assert {"K8S_POD_NAME", "HPC_JOB_ID", "WORKLOAD_ATTRIBUTES", "PodRef", "JobRef",
            "workload_attributes"} <= NAMES
    assert all(hasattr(workload, name) for name in NAMES)


def test_each_attribute_name_is_spelled_in_otel_gpu_workload_alone():
    """A workload attribute's name written anywhere else in the collector is a second
    vocabulary waiting to disagree: the rest use the constants."""
    found = [f"{path.relative_to(ROOT)}:{node.lineno} {node.value}"
             for path in _sources("otel_gpu")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in WORKLOAD_ATTRIBUTES]
    assert found == []


@pytest.mark.parametrize("folder", ["otel_gpu", "tests", "testkit", "benchmarks", "scripts"])
def test_workload_names_are_imported_from_otel_gpu_workload_only(folder):
    """No module hands a workload name on (no re-export keeping another path alive)."""
    found = []
    for path in _sources(folder):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module != "otel_gpu.workload"
                    and (node.module or "").startswith("otel_gpu")):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name} from {node.module}"
                          for a in node.names if a.name in NAMES]
    assert found == []


def test_every_workload_says_its_attributes_and_jobs_share_one_attribute():
    pod = PodRef("train-0", "ml", "main", uid="6f1d")
    box = ContainerRef("c" * 64, "trainer", "pytorch/pytorch")
    attrs = workload_attributes((pod, JobRef("1001"), JobRef("1002"), box))
    assert attrs == {**pod.attributes(), **box.attributes(), "nvidia.gpu.hpc.job.id": "1001,1002"}
    assert set(attrs) == set(WORKLOAD_ATTRIBUTES)
