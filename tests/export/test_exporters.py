"""The exporter seam: one registry read by settings, checks, the service and shutdown."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from otel_gpu.config import OPTIONS, load
from otel_gpu.config.settings import EXPORTERS
from otel_gpu.errors import SetupError
from otel_gpu.export import exporters
from otel_gpu.export.collected import CollectingReader
from otel_gpu.export.otlp.transport import OtlpSetupError
from otel_gpu.export.seam import Exporter
from otel_gpu.instrument.telemetry import build_resource

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "deploy/helm/otel-gpu/values.schema.json"


def test_the_registry_names_what_the_exporters_setting_accepts():
    assert exporters.NAMES == ("prometheus", "otlp")
    for name in exporters.NAMES:
        assert load({"exporters": name}, environ={}).exporters == (name,)
    with pytest.raises(SetupError, match="exporters"):
        load({"exporters": "zipkin"}, environ={})
    with pytest.raises(ValueError, match="prometheus and/or otlp"):
        load({"exporters": "prometheus,statsd"}, environ={})


def test_the_settings_help_and_helm_schema_offer_exactly_the_registrys_exporters():
    """One list: the registry's names are the setting's choices, which its help text and the
    chart's schema offer (a new exporter missing from one of them fails here)."""
    assert exporters.NAMES == EXPORTERS
    (row,) = [o for o in OPTIONS if o.key == "exporters"]
    offered = re.split(r",\s*(?:or both|or several)?\s*", row.help.split(" (")[0])
    assert [n for n in offered if n] == list(EXPORTERS), row.help
    config = json.loads(SCHEMA.read_text())["properties"]["config"]["properties"]["exporters"]
    assert config["items"]["enum"] == list(EXPORTERS)
    assert config["description"] == row.help


def test_select_defaults_to_prometheus_plus_otlp_once_an_endpoint_is_set():
    config = load({}, environ={})
    assert [e.name for e in exporters.select(config, {})] == ["prometheus"]
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert [e.name for e in exporters.select(config, env)] == ["prometheus", "otlp", "otlp"]
    only = load({"exporters": "otlp"}, environ={})
    assert [type(e).__name__ for e in exporters.select(only, {})] == [
        "OtlpMetricsExporter", "OtlpLogsExporter"]


def test_validate_runs_each_selected_exporters_checks():
    config = load({"exporters": "prometheus,otlp"}, environ={})
    with pytest.raises(OtlpSetupError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        exporters.validate(config, {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"})
    prometheus_only = load({"exporters": "prometheus"}, environ={})
    assert [e.name for e in exporters.validate(
        prometheus_only, {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"})] == ["prometheus"]


def test_each_registered_exporter_has_the_protocols_shape():
    config = load({"otlp_endpoint": "http://127.0.0.1:9"}, environ={})
    members = [n for n in Exporter.__dict__ if not n.startswith("_")]
    members += list(Exporter.__annotations__)
    assert {"name", "variables", "scrape", "prepare", "readers", "attach", "stop"} <= set(members)
    for make in exporters.REGISTRY:
        exporter = make(config, {"OTEL_LOGS_EXPORTER": "none"})
        for member in members:
            assert hasattr(exporter, member), (exporter, member)
        resource = build_resource(environ={})
        assert all(m.name for m in exporter.prepare(resource))
        source = CollectingReader()
        readers = exporter.readers(resource, source)
        assert isinstance(readers, list)
        # registered and shut down here: a reader's loop left running would collect, and log,
        # in whichever test runs a minute later
        MeterProvider(metric_readers=[source, *readers]).shutdown(timeout_millis=10_000)
        exporter.stop(0.1)


def test_the_service_names_no_exporter():
    """The service builds, attaches and stops every exporter through the seam alone: no
    exporter class, name or isinstance check in wiring.py."""
    source = (ROOT / "otel_gpu/wiring.py").read_text()
    tree = ast.parse(source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    classes = {getattr(make, "__name__", "") for make in exporters.REGISTRY}
    assert not names & classes
    assert not strings & set(exporters.NAMES)
    assert "isinstance" not in names
