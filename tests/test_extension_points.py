"""The README's places for a new metric, setting, exporter and naming profile are the real ones.

A list of names spelled out in a file is a place the next name must be added
to: every file spelling the exporters, the naming profiles or the settings
must be one the README's paragraph for that addition names, and every path
those paragraphs name must exist.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from otel_gpu.config import OPTIONS
from otel_gpu.config.settings import EXPORTERS, NAMING_PROFILES
from otel_gpu.export import exporters
from otel_gpu.export.naming import PROFILES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SOURCES = ("otel_gpu", "deploy", "config", "scripts", "benchmarks", "examples")
"""Where a copy of a list would be a place to touch (tests, ``benchmarks/tests`` among them,
and prose are not)."""
SCHEMA = json.loads((ROOT / "deploy/helm/otel-gpu/values.schema.json").read_text())
TITLES = ("A new NVML-backed metric", "A new setting", "A new exporter", "A new naming profile")


def _paragraph(title: str) -> str:
    start = README.index(f"**{title}**")
    return README[start:README.find("\n\n", start)]


def _files() -> dict[str, str]:
    out = {}
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "tests" not in path.parts and path.suffix in (
                    ".py", ".yaml", ".yml", ".json", ".toml", ".sh", ".tpl", ".txt", ".csv"):
                out[path.relative_to(ROOT).as_posix()] = path.read_text(errors="replace")
    return out


FILES = _files()


def _spelling(names: tuple[str, ...]) -> set[str]:
    """The files that spell ``names`` one after the other, as a list or an alternation."""
    pattern = re.compile(r"\b" + r"[\s\"'|,]{1,8}".join(map(re.escape, names)) + r"\b")
    return {path for path, text in FILES.items() if pattern.search(text)}


def _named(path: str, paragraph: str) -> bool:
    short = path.removeprefix("otel_gpu/")
    return path in paragraph or short in paragraph


@pytest.mark.parametrize(("title", "names"), [
    ("A new exporter", EXPORTERS),
    ("A new naming profile", NAMING_PROFILES),
])
def test_every_file_listing_the_names_is_a_place_the_readme_names(title, names):
    places = _spelling(names)
    assert "otel_gpu/config/settings.py" in places  # the one list the settings read
    paragraph = _paragraph(title)
    assert [p for p in sorted(places) if not _named(p, paragraph)] == [], paragraph


def test_every_file_listing_the_settings_is_a_place_the_readme_names():
    keys = [o.key for o in OPTIONS]
    places = {path for path, text in FILES.items()
              if sum(bool(re.search(rf"\b{k}\b", text)) for k in keys) > len(keys) * 0.8}
    assert "config/otel-gpu.yaml" in places
    paragraph = _paragraph("A new setting")
    assert [p for p in sorted(places) if not _named(p, paragraph)] == [], paragraph


@pytest.mark.parametrize("title", TITLES)
def test_every_place_the_readme_names_exists(title):
    paragraph = _paragraph(title)
    paths = re.findall(r"`([\w./-]+/[\w./-]*|[\w-]+\.(?:py|md|yaml|json))`", paragraph)
    assert paths, paragraph
    for path in paths:
        path = path.split("::")[0]
        assert any((base / path).exists() for base in (ROOT, ROOT / "otel_gpu")), path


def test_the_registries_and_what_the_settings_offer_are_one_list_each():
    assert exporters.NAMES == EXPORTERS
    assert tuple(PROFILES) == NAMING_PROFILES
    (naming,) = [o for o in OPTIONS if o.key == "naming"]
    assert all(re.search(rf"\b{n}\b", naming.help) for n in NAMING_PROFILES), naming.help
    for node in (SCHEMA["properties"]["naming"],
                 SCHEMA["properties"]["config"]["properties"]["naming"]):
        assert node["items"]["enum"] == list(NAMING_PROFILES)
    assert SCHEMA["properties"]["config"]["properties"]["exporters"]["items"]["enum"] == list(
        EXPORTERS)


TOY_ROW = '''    Metric(
        "nvidia.gpu.toy.ecc_pending", Kind.GAUGE, "1",
        "A toy: 1 while an ECC mode change waits for a reboot.",
        points=(Point(TOY_ECC_PENDING),),
    ),
'''
TOY_SOURCE = '\nTOY_ECC_PENDING = _field("toy.ecc_pending", "ECC_PENDING", "1", maximum=1)\n'


def _copy_with_a_new_metric(root: Path) -> Path:
    """The checkout's code with one field-backed metric added where the README's paragraph
    says, and nowhere else: its source in sample/sources.py, its row (and import) in
    instrument/catalog.py. The simulator gives the field from a scenario's ``fields``."""
    import shutil

    ignore = shutil.ignore_patterns("__pycache__", "results", "*.pyc")
    for top in ("otel_gpu", "benchmarks", "testkit"):
        shutil.copytree(ROOT / top, root / top, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    sources = root / "otel_gpu/sample/sources.py"
    sources.write_text(sources.read_text() + TOY_SOURCE)
    catalog = root / "otel_gpu/instrument/catalog.py"
    text = catalog.read_text()
    text = text.replace("from otel_gpu.sample.sources import (\n",
                        "from otel_gpu.sample.sources import (\n    TOY_ECC_PENDING,\n", 1)
    end = text.rindex("\n)\n")
    catalog.write_text(text[:end + 1] + TOY_ROW + text[end + 1:])
    scenario = yaml.safe_load((ROOT / "otel_gpu/sim/profiles/h100x8.yaml").read_text())
    for entry in scenario["devices"]:
        entry.setdefault("fields", {})["ECC_PENDING"] = 1
    (root / "toy.yaml").write_text(yaml.safe_dump(scenario))
    return root


@pytest.mark.slow  # three subprocesses on a copy of the code: about half a minute
def test_a_new_metric_added_where_the_readme_says_is_exported_checked_and_benchmarked(
        tmp_path):
    """The README's two places and nothing else: ``otel-gpu metrics`` lists the metric,
    the collector exports it on the simulator, the real-GPU check compares it with its own
    read of the field (a family no file of the check names), and the same-reads baseline
    still makes the collector's calls, call for call."""
    import subprocess
    import sys

    root = _copy_with_a_new_metric(tmp_path / "copy")
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=root, env=env, text=True,
                              capture_output=True, timeout=timeout)

    listed = run("-m", "otel_gpu", "metrics")
    assert listed.returncode == 0 and "nvidia.gpu.toy.ecc_pending" in listed.stdout, listed
    out = tmp_path / "check"
    checked = run("-m", "benchmarks.device_check", "--out", str(out), "--simulate",
                  str(root / "toy.yaml"), "--interval", "0.5",
                  "--skip", "cost,latency,pods")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    data = json.loads((out / "device-check.json").read_text())
    rows = [r for r in data["rows"] if r["family"] == "nvidia_gpu_toy_ecc_pending"]
    assert len(rows) == 8 and all(r["ok"] and r["exported"] == 1 and r["source"] == "pynvml"
                                  for r in rows), rows
    assert "nvidia_gpu_toy_ecc_pending" not in data["not_compared"]["idle"]
    same = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
               "benchmarks/tests/test_benchmarks.py::"
               "test_the_same_reads_baseline_makes_the_collectors_nvml_calls")
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-2000:]


MAPS = {
    "otel_gpu/export/naming/dcgm/fields.py": "the DCGM profile names the families DCGM has a "
                                             "field for: a new metric needs no DCGM name",
}
"""Files that spell most of the catalog's families as a mapping of their own, not a copy
of the list a new metric must join, each with its reason."""


def test_no_file_but_the_catalog_lists_the_nvml_metrics():
    """A copy of the catalog's list of NVML-backed metrics (their names or their Prometheus
    families, as the real-GPU check once kept) is a place a new metric must be added to
    that the README does not name: derive from the catalog instead."""
    from otel_gpu.export.naming.otel import prometheus_name
    from otel_gpu.instrument.catalog import CATALOG

    rows = [m for m in CATALOG if m.points]
    spellings = [[m.name for m in rows], [prometheus_name(m) for m in rows]]
    copies = set()
    for path, text in FILES.items():
        for names in spellings:
            found = sum(bool(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text))
                        for n in names)
            if found >= 0.8 * len(names):
                copies.add(path)
    assert "otel_gpu/instrument/catalog.py" in copies
    paragraph = _paragraph("A new NVML-backed metric")
    assert [p for p in sorted(copies) if not _named(p, paragraph) and p not in MAPS] == []
    assert all(p in copies for p in MAPS)  # each exemption still needed
