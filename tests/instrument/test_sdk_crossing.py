"""The one module that reaches past the OpenTelemetry SDK's public API, and no other.

``otel_gpu/_sdk.py`` holds every crossing; each test here fails when the
installed SDK no longer has the shape that crossing relies on (an SDK upgrade
then fails the suite instead of quietly costing speed), and the scan fails
when a crossing appears anywhere else in ``otel_gpu/``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import NumberDataPoint

from otel_gpu import _sdk
from otel_gpu.export.otlp.transport import OtlpSettings, resolve

ROOT = Path(__file__).resolve().parents[2] / "otel_gpu"
CROSSING = ROOT / "_sdk.py"


# --- each crossing, held to the installed SDK ----------------------------------------------

def test_points_are_filled_as_the_constructor_makes_them():
    """The direct collection's fast fill: NumberDataPoint a plain frozen dataclass of these
    five fields, without slots, whose constructor only sets them."""
    assert [f.name for f in dataclasses.fields(NumberDataPoint)] == [
        "attributes", "start_time_unix_nano", "time_unix_nano", "value", "exemplars"]
    assert not hasattr(NumberDataPoint, "__slots__")
    assert _sdk.FILLS_POINTS and _sdk.number_point is _sdk._filled_point
    made = _sdk.number_point({"a": 1}, 5, 7, 2.5)
    expected = NumberDataPoint(attributes={"a": 1}, start_time_unix_nano=5, time_unix_nano=7,
                               value=2.5, exemplars=[])
    assert type(made) is NumberDataPoint and made == expected and vars(made) == vars(expected)
    assert hash(_sdk.number_point({}, None, 1, 1.0).time_unix_nano) == 1
    assert _sdk.number_points is _sdk._filled_points
    gauge, summed = (_sdk.number_points([1, 0], [{"a": 1}, {"b": 2}], starts, 7, {0: 1.0, 1: 2.5})
                     for starts in (None, [3, 5]))
    for points, starts in ((gauge, (None, None)), (summed, (5, 3))):
        assert [vars(p) for p in points] == [vars(NumberDataPoint(
            attributes=attrs, start_time_unix_nano=start, time_unix_nano=7,  # type: ignore[arg-type]
            value=value, exemplars=[])) for attrs, start, value
            in zip(({"b": 2}, {"a": 1}), starts, (2.5, 1.0), strict=True)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.value = 3.0  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(_sdk.LOG_NAMES))
def test_the_logs_names_are_where_the_sdk_publishes_them(name):
    found = getattr(_sdk, name)
    assert inspect.isclass(found) and found.__name__ == name
    assert getattr(importlib.import_module(_sdk.LOG_NAMES[name]), name) is found


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_sdks_log_exporters_take_the_transports_arguments(protocol):
    exporter = _sdk.log_exporter_class(protocol.split("/")[0])
    assert issubclass(exporter, _sdk.LogRecordExporter)
    transport = resolve(OtlpSettings(endpoint="http://c:4318", protocol=protocol), {})
    arguments = (transport.grpc_arguments() if protocol == "grpc"
                 else transport.http_arguments())
    assert set(arguments) <= set(inspect.signature(exporter).parameters)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError):
        _sdk.NoSuchName  # noqa: B018


# --- the scan: no crossing outside _sdk.py ---------------------------------------------------

SCOPE = ("instrument", "export", "publish")
"""The stages that hold SDK objects: every module there is scanned, as is every module that
imports opentelemetry."""
_PRIVATE_MODULE = re.compile(r"\bopentelemetry(\.\w+)*\._\w")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _otel_names(tree: ast.Module) -> set[str]:
    """Names a module imports from opentelemetry (or from the crossing module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.split(".")[0] == "opentelemetry" or node.module == "otel_gpu._sdk"):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


def _sdk_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """Classes of ours deriving from an SDK class, through our own classes too."""
    derived: set[str] = set()
    while True:
        before = len(derived)
        for tree in trees.values():
            otel = _otel_names(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                        _base_name(b) in otel | derived for b in node.bases):
                    derived.add(node.name)
        if len(derived) == before:
            return derived


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: its methods and class attributes, what it sets on self."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def crossings(path: Path, tree: ast.Module, sdk_classes: set[str], root: Path = ROOT
              ) -> list[str]:
    """Each place in one module that reads or replaces what the SDK keeps private."""
    text = ast.unparse(tree)
    scoped = "opentelemetry" in text or path.relative_to(root).parts[0] in SCOPE
    found = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _PRIVATE_MODULE.search(alias.name):
                    hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "opentelemetry":
            if _PRIVATE_MODULE.search(node.module) or any(_private(a.name) for a in node.names):
                hit(node, f"from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                _PRIVATE_MODULE.search(node.value) and "\n" not in node.value:
            hit(node, repr(node.value))
        if not scoped:
            continue
        if isinstance(node, ast.Attribute):
            owner = node.value
            named = owner.id if isinstance(owner, ast.Name) else None
            private = _private(node.attr) and named not in ("self", "cls")
            filled = node.attr == "__dict__" or (
                named == "object" and node.attr in ("__new__", "__setattr__"))
            if private or filled:
                hit(node, ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr") and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str) and _private(node.args[1].value):
            hit(node, ast.unparse(node))
        elif isinstance(node, ast.ClassDef) and node.name in sdk_classes:
            own = _own_names(node)
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and \
                        inner.value.id in ("self", "cls") and _private(inner.attr) and \
                        inner.attr not in own:
                    hit(inner, f"{node.name}: {ast.unparse(inner)} (the SDK's)")
    return found


def scan(root: Path = ROOT) -> list[str]:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))
             if "_proto" not in p.parts and p.name != CROSSING.name}
    sdk_classes = _sdk_classes(trees)
    return [line for path, tree in trees.items()
            for line in crossings(path, tree, sdk_classes, root)]


def test_no_module_but_the_crossing_reaches_into_the_sdk():
    assert scan() == []


@pytest.mark.parametrize("source", [
    'from opentelemetry.sdk._logs import LoggerProvider\n',
    'import opentelemetry.sdk.metrics._internal.point\n',
    'from opentelemetry.sdk.metrics import _internal\n',
    'import importlib\nm = importlib.import_module("opentelemetry.sdk._logs")\n',
    'from opentelemetry.sdk.metrics.export import MetricExporter\n'
    'def f(e: MetricExporter):\n    return e._preferred_temporality\n',
    'from opentelemetry.sdk.metrics.export import MetricExporter\n'
    'def f(e):\n    return getattr(e, "_client", None)\n',
    'from opentelemetry.sdk.metrics.export import NumberDataPoint\n'
    'def f():\n    p = object.__new__(NumberDataPoint)\n    p.__dict__.update(value=1)\n',
    'from opentelemetry.sdk.metrics.export import MetricReader\n'
    'class R(MetricReader):\n    def f(self):\n        return self._collect\n',
    'from otel_gpu._sdk import LogRecordExporter\n'
    'class L(LogRecordExporter):\n    def f(self):\n        self._shutdown = True\n'
    'class M(L):\n    def g(self):\n        return self._exporter\n',
])
def test_the_scan_finds_each_kind_of_crossing(tmp_path, source):
    """In a stage's module, or any module importing opentelemetry."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "m.py").write_text(source)
    assert scan(tmp_path), source


@pytest.mark.parametrize("source", [
    'class A:\n    def __init__(self):\n        self._x = 1\n    def f(self, other):\n'
    '        return self._x + len(self.__class__.__name__)\n',
    'from opentelemetry.sdk.metrics.export import MetricReader\n'
    'class R(MetricReader):\n    def __init__(self):\n        self._mine = 1\n'
    '    def _receive_metrics(self, data, timeout_millis=0, **kw):\n        return self._mine\n',
])
def test_the_scan_leaves_our_own_private_names_alone(tmp_path, source):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "m.py").write_text(source)
    assert scan(tmp_path) == []
