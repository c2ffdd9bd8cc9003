"""The dependency ranges CI proves: the constraints are pyproject's, and the report can fail."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "dependency_bounds.py"
sys.path.insert(0, str(SCRIPT.parent))
import dependency_bounds  # noqa: E402

PYTEST = importlib.metadata.version("pytest")


def _pyproject(tmp_path: Path, *deps: str) -> Path:
    path = tmp_path / "pyproject.toml"
    listed = ", ".join(f'"{dep}"' for dep in deps)
    path.write_text(f'[project]\nname = "x"\ndependencies = [{listed}]\n'
                    '[project.optional-dependencies]\nproto = ["grpcio-tools==1.85.1"]\n')
    return path


def test_the_lowest_constraints_are_each_declared_lower_bound() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = dependency_bounds.lowest_constraints().splitlines()
    assert len(lines) == len(declared)
    for line, dep in zip(lines, declared, strict=True):
        requirement = Requirement(dep)
        lows = [s.version for s in requirement.specifier if s.operator == ">="]
        assert len(lows) == 1 and any(s.operator == "<" for s in requirement.specifier), dep
        assert line == f"{requirement.name}=={lows[0]}"
        # a release, not a prefix: pip's == would match 12.535 to no release at all
        assert len(Version(lows[0]).release) >= 3, dep


def test_a_range_without_both_ends_is_named(tmp_path: Path) -> None:
    path = _pyproject(tmp_path, "requests>=2.31.0")
    with pytest.raises(dependency_bounds.BoundsError, match="'requests>=2.31.0' is not"):
        dependency_bounds.runtime_ranges(path)
    out = subprocess.run([sys.executable, str(SCRIPT), "lowest"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.count("==") >= 5


def test_the_report_fails_when_a_version_is_not_the_promised_end(tmp_path: Path, capsys) -> None:
    at_bound = _pyproject(tmp_path, f"pytest>={PYTEST},<999")
    assert dependency_bounds.report("lowest", at_bound) == 0
    below = Version(PYTEST).release[0] - 1
    loose = _pyproject(tmp_path, f"pytest>={below}.0.0,<999")
    assert dependency_bounds.report("lowest", loose) == 1
    assert f"NOT the lower bound {below}.0.0" in capsys.readouterr().out
    outside = _pyproject(tmp_path, f"pytest>=0.1.0,<{below}")
    assert dependency_bounds.report("any", outside) == 1
    assert "OUTSIDE the declared range" in capsys.readouterr().out
    missing = _pyproject(tmp_path, "no-such-distribution-here>=1.0.0,<2")
    assert dependency_bounds.report("any", missing) == 1


def test_an_extra_is_read_from_pyproject(tmp_path: Path) -> None:
    assert dependency_bounds.extra("proto", _pyproject(tmp_path)) == "grpcio-tools==1.85.1\n"
    with pytest.raises(dependency_bounds.BoundsError, match="no extra 'nope'"):
        dependency_bounds.extra("nope", _pyproject(tmp_path))
