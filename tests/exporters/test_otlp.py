"""OTLP setup and the per-pod Resource regrouping, in-process."""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu.app import choose_exporters
from otel_gpu.config import load
from otel_gpu.exporters.otlp import (
    RESOURCE,
    OtlpSettings,
    OtlpSetupError,
    PodResourceExporter,
    build_exporter,
    read_headers_file,
    resolve_protocol,
)

NODE = Resource({"service.name": "otel-gpu", "k8s.node.name": "node-1"})
POD = {"k8s.pod.name": "train-0", "k8s.namespace.name": "ml", "k8s.container.name": "main"}


def _data():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=NODE)
    meter = provider.get_meter("otel_gpu")
    from opentelemetry.metrics import Observation

    meter.create_observable_gauge("hw.power", [lambda o: [
        Observation(300.0, {"hw.id": "GPU-0", **POD}),
        Observation(310.0, {"hw.id": "GPU-1", **{**POD, "k8s.pod.name": "train-1"}}),
        Observation(100.0, {"hw.id": "GPU-2"}),
    ]], unit="W")
    meter.create_observable_counter("otel_gpu.samples", [lambda o: [Observation(3, {})]])
    data = reader.get_metrics_data()
    provider.shutdown()
    return data


def test_regroup_puts_each_pod_under_its_own_resource():
    exporter = PodResourceExporter(_Recorder(), NODE)
    out = exporter.regroup(_data())
    groups = {rm.resource.attributes.get("k8s.pod.name"): rm for rm in out.resource_metrics}
    assert set(groups) == {None, "train-0", "train-1"}
    node = groups[None]
    assert dict(node.resource.attributes) == dict(NODE.attributes)
    names = {m.name for sm in node.scope_metrics for m in sm.metrics}
    assert names == {"hw.power", "otel_gpu.samples"}
    pod = groups["train-0"]
    assert pod.resource.attributes["k8s.node.name"] == "node-1"
    assert pod.resource.attributes["k8s.namespace.name"] == "ml"
    (metric,) = [m for sm in pod.scope_metrics for m in sm.metrics]
    (point,) = metric.data.data_points
    assert dict(point.attributes) == {"hw.id": "GPU-0"} and point.value == 300.0
    assert metric.unit == "W"
    assert out.resource_metrics[0] is node  # the node's group first


class _Recorder(MetricExporter):
    def __init__(self):
        super().__init__()
        self.exported = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def test_export_passes_the_regrouped_data_on():
    inner = _Recorder()
    PodResourceExporter(inner, NODE).export(_data())
    assert len(inner.exported[0].resource_metrics) == 3


def test_headers_file(tmp_path):
    path = tmp_path / "headers"
    path.write_text(
        "# from a Secret\nAuthorization=Bearer%20abc\nx-scope-orgid=team-a, dd-api-key=k\n"
    )
    assert read_headers_file(str(path)) == {
        "authorization": "Bearer abc", "x-scope-orgid": "team-a", "dd-api-key": "k"}
    path.write_text("no equals sign\n")
    with pytest.raises(OtlpSetupError, match=r"line 1: expected key=value"):
        read_headers_file(str(path))
    with pytest.raises(OtlpSetupError, match=r"cannot read it"):
        read_headers_file(str(tmp_path / "missing"))


def test_protocol_resolution():
    s = OtlpSettings()
    assert resolve_protocol(s, {}) == "http/protobuf"
    assert resolve_protocol(s, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}
    assert resolve_protocol(s, env) == "http/protobuf"
    assert resolve_protocol(OtlpSettings(protocol="grpc"), env) == "grpc"
    with pytest.raises(OtlpSetupError, match="http/json"):
        resolve_protocol(s, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_exporters_default_to_prometheus_until_an_endpoint_is_set():
    cfg = load({}, environ={})
    assert choose_exporters(cfg, {}) == ("prometheus",)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert choose_exporters(cfg, env) == ("prometheus", "otlp")
    assert choose_exporters(load({"exporters": "otlp"}, environ={}), env) == ("otlp",)
    with pytest.raises(ValueError, match="prometheus and/or otlp"):
        load({"exporters": "prometheus,statsd"}, environ={})


def test_unreadable_tls_file_is_a_setup_error(tmp_path):
    settings = OtlpSettings(protocol="grpc", certificate=str(tmp_path / "ca.pem"))
    with pytest.raises(OtlpSetupError, match="certificate .*ca.pem: cannot read it"):
        build_exporter(settings, {})


def test_settings_are_the_otlp_rows_and_come_from_a_config():
    assert {f.name for f in dataclasses.fields(OtlpSettings)} == {
        "endpoint", "protocol", "headers_file", "insecure", "certificate", "client_certificate",
        "client_key", "compression", "timeout", "interval", "temporality", "pod_identity",
    }
    assert OtlpSettings().pod_identity == RESOURCE
    assert OtlpSettings.from_config(load({}, environ={})) == OtlpSettings()
    config = load({"otlp_endpoint": "http://collector:4318", "otlp_timeout": "2s",
                   "otlp_insecure": "true", "pod_identity": "attributes"}, environ={})
    assert OtlpSettings.from_config(config) == OtlpSettings(
        endpoint="http://collector:4318", timeout=2.0, insecure=True, pod_identity="attributes"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        OtlpSettings().endpoint = "x"  # type: ignore[misc]
