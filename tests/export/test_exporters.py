"""The exporter registry: one list read by settings, checks, the service and shutdown."""

from __future__ import annotations

import pytest

from otel_gpu.config import load
from otel_gpu.errors import SetupError
from otel_gpu.export import exporters
from otel_gpu.export.otlp.transport import OtlpSetupError


def test_the_registry_names_what_the_exporters_setting_accepts():
    assert exporters.NAMES == ("prometheus", "otlp")
    for name in exporters.NAMES:
        assert load({"exporters": name}, environ={}).exporters == (name,)
    with pytest.raises(SetupError, match="exporters"):
        load({"exporters": "zipkin"}, environ={})


def test_select_defaults_to_prometheus_plus_otlp_once_an_endpoint_is_set():
    config = load({}, environ={})
    assert [e.name for e in exporters.select(config, {})] == ["prometheus"]
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert [e.name for e in exporters.select(config, env)] == ["prometheus", "otlp"]
    only = load({"exporters": "otlp"}, environ={})
    assert [e.name for e in exporters.select(only, {})] == ["otlp"]


def test_validate_runs_each_selected_exporters_checks():
    config = load({"exporters": "prometheus,otlp"}, environ={})
    with pytest.raises(OtlpSetupError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        exporters.validate(config, {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"})
    prometheus_only = load({"exporters": "prometheus"}, environ={})
    assert [e.name for e in exporters.validate(
        prometheus_only, {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"})] == ["prometheus"]


def test_each_registered_exporter_has_the_protocols_shape():
    config = load({}, environ={})
    for make in exporters.REGISTRY:
        exporter = make(config, {})
        for member in ("name", "default_on", "validate", "readers", "stop"):
            assert hasattr(exporter, member), (exporter, member)
