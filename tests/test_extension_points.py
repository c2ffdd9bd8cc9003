"""The README's places for a new metric, setting, exporter and naming profile are the real ones.

A list of names spelled out in a file is a place the next name must be added
to: every file spelling the exporters, the naming profiles or the settings
must be one the README's paragraph for that addition names, and every path
those paragraphs name must exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from otel_gpu.config import OPTIONS
from otel_gpu.config.settings import EXPORTERS, NAMING_PROFILES
from otel_gpu.export import exporters
from otel_gpu.export.naming import PROFILES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SOURCES = ("otel_gpu", "deploy", "config", "scripts", "benchmarks", "examples")
"""Where a copy of a list would be a place to touch (tests and prose are not)."""
SCHEMA = json.loads((ROOT / "deploy/helm/otel-gpu/values.schema.json").read_text())
TITLES = ("A new NVML-backed metric", "A new setting", "A new exporter", "A new naming profile")


def _paragraph(title: str) -> str:
    start = README.index(f"**{title}**")
    return README[start:README.find("\n\n", start)]


def _files() -> dict[str, str]:
    out = {}
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".json", ".toml",
                                                  ".sh", ".tpl", ".txt", ".csv"):
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
