"""Every file the collector reads goes through ``otel_gpu._files``: bounded, non-blocking,
a FIFO or a device refused. Read from the source (``ast``), so a new ``open()`` elsewhere is
named by file and line before it can hold a thread on a FIFO."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "otel_gpu"
READER = "otel_gpu/_files.py"

OPENERS = {"open", "fdopen", "read_text", "read_bytes", "read", "readlines", "load", "loadtxt"}
"""Calls that open or read a file: ``open()``, ``os.open``, ``io.open``, ``Path.open``,
``Path.read_text``, ``os.read``, ``os.fdopen``, ``json.load``, ``numpy.loadtxt`` and their kin."""

RECEIVERS = {"os", "io", "codecs", "json", "yaml", "pickle", "numpy", "np", "tomllib",
             "pathlib", "Path"}
"""Modules whose ``read``/``load``/``readlines`` open or read a file; elsewhere those names are
other things' methods (a socket's, a queue's) and only ``open``-like names count."""

ALLOWED = {
    ("otel_gpu/cli.py", "_quiet_stdout"): "opens /dev/null to write to, reads nothing",
    ("otel_gpu/config/docs.py", "main"): "the tool that writes the README's settings table, "
                                         "run by a developer, not by the collector",
    ("otel_gpu/export/_docs.py", "_template"): "a document shipped inside the package, "
                                               "for `otel-gpu metrics --format migration`",
}
"""(module, enclosing function) -> why it may open a file itself."""


def _calls(tree: ast.Module) -> Iterator[tuple[str, ast.Call]]:
    """(enclosing function, call) for every call in the module."""
    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            name = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if isinstance(child, ast.Call):
                yield name, child
            yield from walk(child, name)

    yield from walk(tree, "<module>")


def _opens(call: ast.Call) -> str | None:
    """What the call names, when it opens or reads a file."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        return "open()"
    if not isinstance(func, ast.Attribute) or func.attr not in OPENERS:
        return None
    receiver = func.value.id if isinstance(func.value, ast.Name) else None
    if func.attr in {"open", "fdopen", "read_text", "read_bytes"} or receiver in RECEIVERS:
        return f"{receiver or '...'}.{func.attr}()"
    return None


def direct_reads(root: Path = PACKAGE) -> list[str]:
    """``path:line: call in function`` for each file opened outside the reader."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel == READER or "_proto" in path.parts:  # generated gRPC stubs read nothing
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for where, call in _calls(tree):
            what = _opens(call)
            if what and (rel, where) not in ALLOWED:
                found.append(f"{rel}:{call.lineno}: {what} in {where}")
    return found


def test_no_module_but_the_reader_opens_a_file():
    assert direct_reads() == [], (
        "read through otel_gpu._files (read_text, read_bytes, read_attribute, load_yaml):\n"
        + "\n".join(direct_reads()))


def test_the_check_sees_each_way_of_opening_a_file(tmp_path):
    """The check must be able to fail: each spelling it looks for is found."""
    module = tmp_path / "otel_gpu" / "reads.py"
    module.parent.mkdir()
    module.write_text(
        "import os, io, json\nfrom pathlib import Path\n"
        "def f(p):\n"
        "    open(p)\n    os.open(p, 0)\n    io.open(p)\n    Path(p).open()\n"
        "    Path(p).read_text()\n    p.read_bytes()\n    os.read(3, 1)\n    os.fdopen(3)\n"
        "    json.load(p)\n"
        "def g(sock, q):\n    sock.read(1)\n    q.load()\n"  # not files: not named
    )
    found = direct_reads(tmp_path / "otel_gpu")
    assert [row.split(":")[1] for row in found] == [str(line) for line in range(4, 13)], found
    assert found[0] == "otel_gpu/reads.py:4: open() in f"


def test_every_exception_is_still_needed():
    """A row nobody needs any more is dropped, so the list says only what is true."""
    used = set()
    for rel, where in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        if any(name == where and _opens(call) for name, call in _calls(tree)):
            used.add((rel, where))
    assert used == set(ALLOWED)
