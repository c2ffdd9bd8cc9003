"""The test suite's own layout: doubles in ``tests/support``, no test importing another,
and every test able to fail; and every runtime module short enough to be read whole.

Read from the source (``ast``), so a break is named by file and line before any test of it
runs. A class that has to stay in a test module goes in :data:`ROWS`, with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

ROWS = {
    ("tests/e2e/test_bad_input.py", "Case"): "a frozen dataclass: one parametrisation row",
    ("tests/e2e/test_energy.py", "Scrapes"): "no double: the test's own checker, asserting on "
                                            "every body it scrapes of the real collector",
}
"""Classes a test module may define: (path, name) -> why it is no double."""

DOUBLE_BASES = {
    "FakeNvml", "MetricExporter", "LogRecordExporter", "ProcessMapper", "Config",
    "ProcessUsageSource", "PodSource",
}
"""Bases whose subclasses are doubles, even inside a test function: they go to tests/support."""

CHECKS = {"raises", "fail", "warns", "deprecated_call", "skip", "importorskip", "xfail"}
"""``pytest.<name>`` calls that make a test able to fail (or say why it did not run)."""

MAX_LINES = 500
"""The most lines a runtime module may have: past it, it holds more than one job."""
TABLES = {
    "otel_gpu/instrument/catalog.py": "the catalog: one row per metric, read as a table",
    "otel_gpu/nvml_abi.py": "nvml.h's numbers: one constant a line, read as a table",
}
"""Runtime modules allowed past :data:`MAX_LINES`, each with its reason."""


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if ".venv" not in p.parts)


def _test_modules() -> list[Path]:
    return [p for p in _modules() if p.name.startswith("test_")]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imported(path: Path, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import, relative ones resolved against ``path``."""
    package = _rel(path.parent).split("/")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            yield node.lineno, module
            for alias in node.names:  # ``from tests.sim import test_limits``
                yield node.lineno, f"{module}.{alias.name}"


def _is_test_or_conftest(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return module.split(".", 1)[0] == "tests" and (
        last.startswith("test_") or last == "conftest")


def import_breaks(path: Path) -> list[str]:
    """Imports of a test module or a conftest: what they hold belongs in a helper module."""
    return [f"{_rel(path)}:{line}: imports {module}"
            for line, module in _imported(path, _tree(path)) if _is_test_or_conftest(module)]


def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        while isinstance(base, ast.Attribute | ast.Subscript):
            base = base.value if isinstance(base, ast.Subscript) else base
            if isinstance(base, ast.Attribute):
                names.add(base.attr)
                break
        if isinstance(base, ast.Name):
            names.add(base.id)
    return names


def class_breaks(path: Path) -> list[str]:
    """Classes at module level (rows aside), and doubles of the known bases anywhere."""
    tree = _tree(path)
    rel = _rel(path)
    out = [f"{rel}:{node.lineno}: class {node.name} at module level"
           for node in tree.body
           if isinstance(node, ast.ClassDef) and (rel, node.name) not in ROWS]
    top = {id(node) for node in tree.body}
    out += [f"{rel}:{node.lineno}: class {node.name} subclasses {sorted(bases)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and id(node) not in top
            and (bases := _base_names(node) & DOUBLE_BASES)]
    return out


def _checks(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Call):
            name = (node.func.attr if isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node.func, ast.Name) else "")
            if name.lstrip("_").startswith(("assert_", "expect_")):
                return True
            if (isinstance(node.func, ast.Attribute) and name in CHECKS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"):
                return True
    return False


def _tests(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body
                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def toothless(path: Path) -> list[str]:
    """Tests with no assert, no ``pytest.raises``/``fail``/``warns``, no ``assert_*`` call."""
    return [f"{_rel(path)}:{func.lineno}: {func.name} checks nothing"
            for func in _tests(_tree(path))
            if func.name.startswith("test_") and not _checks(func)]


@pytest.mark.parametrize("check", [import_breaks, class_breaks, toothless],
                         ids=lambda f: f.__name__)
def test_the_suite_keeps_its_layout(check):
    breaks = [line for path in _test_modules() for line in check(path)]
    assert breaks == [], "\n".join(breaks)


def test_helper_modules_import_no_test_module_either():
    """A conftest or helper importing a test module would run its tests' imports twice."""
    breaks = [line for path in _modules() if not path.name.startswith("test_")
              for line in import_breaks(path)]
    assert breaks == [], "\n".join(breaks)


def test_every_row_exemption_is_still_needed():
    """An exemption for a class that has gone is dead weight: the list stays short."""
    for rel, name in ROWS:
        tree = _tree(ROOT / rel)
        assert any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body), (rel, name)


@pytest.mark.parametrize(("source", "check", "breaks"), [
    ("from tests.sample.test_coverage import LINKS\n", import_breaks, True),
    ("from tests.deploy.conftest import DEPLOY\n", import_breaks, True),
    ("from . import test_limits\n", import_breaks, True),
    ("import tests.sim.conftest\n", import_breaks, True),
    ("from tests.sim.kit import write\n", import_breaks, False),
    ("class Recording(sim.FakeNvml):\n    pass\n", class_breaks, True),
    ("def test_x():\n    class D(FakeNvml):\n        pass\n    assert D\n", class_breaks, True),
    ("def test_x():\n    class Local:\n        pass\n    assert Local\n", class_breaks, False),
    ("def test_x():\n    value = 1\n", toothless, True),
    ("def test_x():\n    assert_equal(1)\n", toothless, False),
    ("def test_x():\n    _expect_one_line(1)\n", toothless, False),
    ("def test_x():\n    with pytest.raises(KeyError):\n        {}[1]\n", toothless, False),
])
def test_the_checker_catches_what_it_is_for(tmp_path, monkeypatch, source, check, breaks):
    """Each check on a module with and without the break it is for: it can fail."""
    folder = tmp_path / "tests" / "sim"
    folder.mkdir(parents=True)
    path = folder / "test_probe.py"
    path.write_text(source)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert bool(check(path)) is breaks, (source, check(path))


def _slow_places() -> tuple[str, ...]:
    """``SLOW`` of tests/conftest.py, read from its source (a conftest is not imported)."""
    for node in _tree(TESTS / "conftest.py").body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "SLOW"):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("tests/conftest.py has no SLOW")


def test_the_slow_marker_covers_every_long_run_and_names_real_places():
    """The quick loop skips by place: a renamed file would silently join it."""
    slow = _slow_places()
    assert [place for place in slow if not (ROOT / place).exists()] == []
    long_runs = [_rel(p) for p in _test_modules()
                 if any(word in p.name for word in ("benchmark", "soak", "scale"))]
    assert long_runs and [rel for rel in long_runs if not rel.startswith(slow)] == []


def oversized(package: Path) -> list[str]:
    """The modules under ``package`` (tables aside) longer than :data:`MAX_LINES`."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = _rel(path)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if rel not in TABLES and lines > MAX_LINES:
            out.append(f"{rel}: {lines} lines (at most {MAX_LINES}: split it by job)")
    return out


def test_no_runtime_module_outgrows_the_limit():
    """A module past the limit is named, with its length; the others are not listed."""
    breaks = oversized(ROOT / "otel_gpu")
    assert breaks == [], "\n".join(breaks)


def test_every_table_exemption_is_still_needed():
    tables = [ROOT / rel for rel in TABLES]
    assert [p for p in tables if len(p.read_text(encoding="utf-8").splitlines()) <= MAX_LINES] \
        == []


def test_the_size_check_names_only_the_long_modules(tmp_path, monkeypatch):
    package = tmp_path / "otel_gpu"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "nvml_abi.py").write_text("x = 1\n" * (MAX_LINES + 1))
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert oversized(package) == [
        f"otel_gpu/sub/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES}: split it by job)"]
