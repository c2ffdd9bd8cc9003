"""The runtime dependencies pyproject.toml declares are exactly the distributions otel_gpu imports.

An import of an undeclared distribution works only while another package happens to bring
it (requests arrived through one OTLP exporter release, not the one before); a declared
one nothing imports makes every user install it for nothing.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "otel_gpu"
GENERATED = PACKAGE / "attribute" / "k8s" / "_proto"
_MODULE_STRING = re.compile(r"^opentelemetry(\.[A-Za-z_]\w*)+$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (imports there never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imported_modules(source: str) -> set[str]:
    """Absolute modules a source imports when it runs, by statement or by a module-path string."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_STRING.match(node.value)):
            found.add(node.value)  # importlib.import_module("opentelemetry....")
    return {m for m in found
            if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "otel_gpu"}


def _owners() -> dict[Path, str]:
    owners = {}
    for dist in importlib.metadata.distributions():
        for file in dist.files or ():
            if file.suffix == ".py":
                owners[Path(str(file.locate())).resolve()] = _normal(dist.metadata["Name"])
    return owners


def test_the_declared_runtime_dependencies_are_what_the_runtime_imports() -> None:
    owners = _owners()
    imported: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if GENERATED in path.parents:
            continue
        for module in imported_modules(path.read_text(encoding="utf-8")):
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, f"{path}: {module} cannot be found"
            owner = owners.get(Path(spec.origin).resolve())
            assert owner, f"{path}: no installed distribution holds {module}"
            imported.setdefault(owner, f"{path.relative_to(ROOT)} imports {module}")
    declared = {_normal(Requirement(dep).name) for dep in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    undeclared = {dist: why for dist, why in imported.items() if dist not in declared}
    assert not undeclared, f"imported but not declared: {undeclared}"
    assert declared <= set(imported), f"declared but never imported: {declared - set(imported)}"


def test_the_scan_sees_each_kind_of_import() -> None:
    source = '''
from typing import TYPE_CHECKING
import requests
from yaml import safe_load
from . import sibling
import json
if TYPE_CHECKING:
    import typing_extensions
LAZY = {"grpc": "opentelemetry.exporter.otlp.proto.grpc._log_exporter"}
'''
    assert imported_modules(source) == {
        "requests", "yaml", "opentelemetry.exporter.otlp.proto.grpc._log_exporter"}
