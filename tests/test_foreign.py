"""dcgm-exporter's variables, answered as its flags are (config/foreign.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu.config import ConfigError, load
from otel_gpu.config.foreign import BY_VARIABLE, foreign_variables


def test_every_line_names_otel_gpus_variables_never_a_flag():
    for name, row in BY_VARIABLE.items():
        line = row.variable_hint(name, "true")
        assert line.startswith(f"environment variable {name} is dcgm-exporter's: "), line
        assert " --" not in line and "(--" not in line, line


def test_values_are_converted_as_the_flags_are():
    (line,) = foreign_variables({"DCGM_EXPORTER_INTERVAL": "1500"})
    assert line.endswith("(did you mean OTEL_GPU_INTERVAL=1.5s?)")
    (line,) = foreign_variables({"DCGM_EXPORTER_KUBERNETES": "false"})
    assert line.endswith("(did you mean OTEL_GPU_POD_ATTRIBUTION=false?)")
    (line,) = foreign_variables({"DCGM_EXPORTER_DEVICES_STR": "g+i"})
    assert line.endswith("(did you mean OTEL_GPU_NAMING=dcgm OTEL_GPU_DCGM_DEVICES=both?)")


def test_load_refuses_them_and_leaves_service_links_and_blanks_alone():
    with pytest.raises(ConfigError, match=r"DCGM_EXPORTER_LISTEN .*OTEL_GPU_LISTEN=:9401"):
        load(environ={"DCGM_EXPORTER_LISTEN": ":9401"})
    load(environ={"DCGM_EXPORTER_SERVICE_HOST": "10.0.0.1", "DCGM_EXPORTER_LISTEN": "  "})


def test_the_migration_guide_lists_every_variable():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "migration.md").read_text()
    for name in BY_VARIABLE:
        assert f"`{name}" in guide, name
