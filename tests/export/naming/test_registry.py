"""The registry of naming profiles: one line per profile, read by the service and settings."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.config import OPTIONS, Config
from otel_gpu.config.settings import (
    DCGM_DEVICES,
    DCGM_NAMES,
    DCGM_POD_LABEL_STYLES,
    NAMING_PROFILES,
)
from otel_gpu.export import naming
from otel_gpu.export.naming import PROFILES, ProfileOptions, profile

NAMING_DIR = Path(naming.__file__).parent


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_registered_profile_names_itself_and_builds(name):
    entry = profile(name)
    assert entry.name == name
    options = ProfileOptions(hostname="h")
    assert entry.validate(options) == []
    built = entry.build(options)
    assert (built is None) == (name == "otel")  # otel: the instruments are the series
    if built is not None:
        assert callable(built.families)


def test_an_unknown_profile_is_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown naming profile 'dcgmm': expected one of "
                                         "otel, dcgm, kubelet"):
        profile("dcgmm")


def test_settings_accept_exactly_the_registered_profiles():
    # config sits below export and cannot read the registry: this keeps the two in step
    assert tuple(PROFILES) == NAMING_PROFILES
    (row,) = [o for o in OPTIONS if o.key == "naming"]
    assert row.parse(",".join(PROFILES)) == tuple(PROFILES)
    with pytest.raises(ValueError):
        row.parse("nvidia-smi")


def test_the_dcgm_settings_defaults_and_choices_are_the_profiles():
    """Each dcgm setting's default is what ProfileOptions holds unless told otherwise, and
    each of its choices builds the profile."""
    defaults = ProfileOptions.from_config(Config())
    assert dataclasses.replace(defaults, hostname="h") == ProfileOptions("h")
    for key, field, choices in (("dcgm_devices", "devices", DCGM_DEVICES),
                                ("dcgm_pod_label_style", "pod_label_style",
                                 DCGM_POD_LABEL_STYLES),
                                ("dcgm_names", "dcgm_names", DCGM_NAMES)):
        (row,) = [o for o in OPTIONS if o.key == key]
        assert row.metavar == "|".join(choices)
        for chosen in choices:
            options = dataclasses.replace(defaults, **{field: chosen})
            assert profile("dcgm").build(options) is not None, (key, chosen)


def test_the_health_profile_does_not_import_the_docs_renderer():
    # naming/health.py -> export/_docs.py -> naming.dcgm was an import cycle
    code = ("import sys, otel_gpu.export.naming.health; "
            "print('otel_gpu.export._docs' in sys.modules, "
            "'otel_gpu.export.naming.dcgm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[3]).stdout.split()
    assert out == ["False", "False"]


def test_a_profile_module_is_imported_only_when_asked_for():
    code = ("import sys; from otel_gpu.export.naming import ProfileOptions, build_profiles; "
            "build_profiles(['otel', 'kubelet'], ProfileOptions('h')); "
            "print('otel_gpu.export.naming.dcgm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[3]).stdout.strip()
    assert out == "False"


def test_no_naming_module_is_over_500_lines():
    sizes = {str(p.relative_to(NAMING_DIR)): len(p.read_text().splitlines())
             for p in NAMING_DIR.rglob("*.py")}
    assert max(sizes.values()) <= 500, sizes


def test_the_migration_prose_is_not_in_python():
    # prose lives in naming/migration.md; the renderer only fills in the tables
    docs = (NAMING_DIR.parent / "_docs.py").read_text()
    assert "Point Prometheus at otel-gpu" not in docs
    assert "Point Prometheus at otel-gpu" in (NAMING_DIR / "migration.md").read_text()
