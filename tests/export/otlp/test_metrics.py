"""OTLP setup and the per-pod Resource regrouping, in-process."""

from __future__ import annotations

import dataclasses
import re

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_gpu.config import load
from otel_gpu.export.otlp.metrics import PodResourceExporter, build_exporter, validate
from otel_gpu.export.otlp.transport import (
    RESOURCE,
    OtlpSettings,
    OtlpSetupError,
    read_headers_file,
    resolve,
    resolve_protocol,
)
from tests.support.certs import make_certs
from tests.support.exporters import RecordingExporter

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
    exporter = PodResourceExporter(RecordingExporter(), NODE)
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


def test_regrouping_again_reuses_each_pods_resource_and_stays_right():
    """Push after push the same pods: their Resources are made once; a new collection
    with other pods still gets the right ones."""
    exporter = PodResourceExporter(RecordingExporter(), NODE)
    data = _data()

    def by_pod(out):
        return {rm.resource.attributes.get("k8s.pod.name"): rm.resource
                for rm in out.resource_metrics}

    first, again = by_pod(exporter.regroup(data)), by_pod(exporter.regroup(data))
    assert again["train-0"] is first["train-0"] and again["train-1"] is first["train-1"]
    fresh = by_pod(exporter.regroup(_data()))  # new attribute objects, same pods
    assert fresh["train-0"] is first["train-0"]
    for rm in exporter.regroup(_data()).resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    assert "k8s.pod.name" not in point.attributes
                    assert point.attributes.get("hw.id") in {"GPU-0", "GPU-1", "GPU-2", None}


def test_export_passes_the_regrouped_data_on():
    inner = RecordingExporter()
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


# --- start-up checks: headers, endpoints, TLS files ---------------------------------------------

SECRET = "s3cr3t-t0ken"


@pytest.mark.parametrize(("text", "message"), [
    (f"x-a=1\nauthorization=%20Bearer%20{SECRET}\n",
     "line 2: header 'authorization': the value has leading or trailing spaces"),
    (f"authorization=Bearer {SECRET}%20\n", "the value has leading or trailing spaces"),
    (f"authorization=Bearer%0D%0A{SECRET}\n", "line 1: header 'authorization': the value "
                                              "contains a control character"),
    (f"authorization=Bearer%09{SECRET}\n", "the value contains a control character"),
    (f"authorization=Bearer%C3%A9{SECRET}\n", "the value is not ASCII"),
    (f"authorization: Bearer {SECRET}=1\n", "line 1: the header name is not an HTTP token"),
    (f"=Bearer {SECRET}\n", "line 1: expected key=value"),
    (f"x-a=1, Bearer {SECRET}\n", "line 1: expected key=value"),
])
def test_a_bad_header_is_named_by_line_and_key_never_by_value(tmp_path, text, message):
    path = tmp_path / "headers"
    path.write_text(text)
    with pytest.raises(OtlpSetupError) as info:
        read_headers_file(str(path))
    assert str(info.value).startswith(f"OTLP headers file {path}: ")
    assert message in str(info.value)
    assert SECRET not in str(info.value) and "Bearer" not in str(info.value)


def test_headers_file_is_bounded_regular_utf8(tmp_path):
    path = tmp_path / "headers"
    path.write_bytes(b"authorization=\xff\n")
    with pytest.raises(OtlpSetupError, match=r"headers .*: not UTF-8 text"):
        read_headers_file(str(path))
    with pytest.raises(OtlpSetupError, match=r"/dev/zero: not a regular file"):
        read_headers_file("/dev/zero")


def test_header_variables_are_checked_as_the_sdk_reads_them():
    settings = OtlpSettings(endpoint="http://c:4318")
    validate(settings, {"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=%20two%20"})  # the SDK strips
    for raw, message in ((f"a=1,authorization=Bearer;{SECRET}", "header 2: expected key=value"),
                         (f"authorization=Bearer%0A{SECRET}",
                          "header 1 ('authorization'): the value contains a control character"),
                         (f"a%0Ab=x,{SECRET}", "header 1: the header name is not an HTTP token")):
        for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"):
            with pytest.raises(OtlpSetupError) as info:
                validate(settings, {name: raw})
            assert str(info.value).startswith(f"{name}: ") and message in str(info.value)
            assert SECRET not in str(info.value)


@pytest.mark.parametrize(("protocol", "env", "message"), [
    ("http/protobuf", {}, "otlp_endpoint: http/protobuf needs a URL such as http://"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"},
     "OTEL_EXPORTER_OTLP_ENDPOINT: not a valid URL"),
    (None, {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "ftp://c"},
     "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: expected an http:// or https:// URL"),
])
def test_endpoints_are_checked_at_start_up(protocol, env, message):
    endpoint = "collector:4318" if not env else None
    settings = OtlpSettings(endpoint=endpoint, protocol=protocol)
    for check in (validate, build_exporter):
        with pytest.raises(OtlpSetupError, match=re.escape(message)):
            check(settings, env)


def test_grpc_takes_host_and_port():
    settings = OtlpSettings(endpoint="collector:4317", protocol="grpc")
    validate(settings, {})
    assert resolve(settings, {}).grpc_arguments()["endpoint"] == "collector:4317"


@pytest.fixture
def pki(tmp_path):
    return make_certs(tmp_path)


def test_good_tls_files_pass(pki):
    settings = OtlpSettings(endpoint="https://localhost:4317", certificate=str(pki.ca_cert),
                            client_certificate=str(pki.client_cert),
                            client_key=str(pki.client_key))
    for protocol in ("grpc", "http/protobuf"):
        exporter = build_exporter(dataclasses.replace(settings, protocol=protocol), {})
        exporter.shutdown()
        assert exporter.target.protocol == protocol
        assert exporter.target.tls_paths["client_key"] == str(pki.client_key)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_garbage_ca_is_refused_at_start_up(tmp_path, protocol):
    ca = tmp_path / "ca.pem"
    for content in (b"garbage\n", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                    b"\x30\x82\x01\x0a"):
        ca.write_bytes(content)
        settings = OtlpSettings(endpoint="https://c:4317", protocol=protocol,
                                certificate=str(ca))
        with pytest.raises(OtlpSetupError, match=rf"^otlp_certificate {ca}: not a PEM CA "):
            build_exporter(settings, {})


def test_client_certificate_and_key_must_belong_together(pki):
    mismatched = OtlpSettings(endpoint="https://c:4318", client_certificate=str(pki.client_cert),
                              client_key=str(pki.server_key))
    with pytest.raises(OtlpSetupError, match=r"^otlp_client_certificate .* with otlp_client_key "
                                             r".*: not a usable PEM certificate"):
        validate(mismatched, {})
    alone = OtlpSettings(endpoint="https://c:4318", client_key=str(pki.client_key))
    with pytest.raises(OtlpSetupError, match=r"a client key needs a client certificate"):
        validate(alone, {})


def test_tls_files_from_the_variables_are_checked_like_the_settings(tmp_path, pki):
    missing = str(tmp_path / "absent.pem")
    for name in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                 "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY"):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317", name: missing}
        with pytest.raises(OtlpSetupError, match=rf"^{name} {missing}: cannot read it"):
            validate(OtlpSettings(protocol="grpc"), env)
    # the setting beats the variables, as in the SDK
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": missing}
    validate(OtlpSettings(certificate=str(pki.ca_cert)), env)


def test_a_refused_variable_is_a_setup_error():
    env = {"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}
    for check in (validate, build_exporter):
        with pytest.raises(OtlpSetupError,
                           match=r"^OTLP exporter: OTEL_EXPORTER_OTLP_COMPRESSION: .*brotli"):
            check(OtlpSettings(endpoint="http://c:4317", protocol="grpc"), env)


def test_grpc_needs_the_client_key_in_its_own_file(pki):
    settings = OtlpSettings(endpoint="https://c:4317", protocol="grpc",
                            client_certificate=str(pki.client_cert))
    with pytest.raises(OtlpSetupError, match=r"gRPC needs the client key in a file of its own"):
        validate(settings, {})


@pytest.mark.parametrize("seed", range(4))
def test_collections_with_series_ids_regroup_as_without_them(seed):
    """A collection with series ids is regrouped by a plan kept while its layout stays
    and by each series' workload kept by its id: push after push of a node whose pods
    change, it is what the regrouping of the same points without ids is, and its ids
    still name its points' series."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics.export import MetricsData

    from otel_gpu.export.otlp.encode import Encoder
    from otel_gpu.instrument.series import SeriesData, flat_metrics
    from tests.support.series_walk import series_walk

    fast, slow = PodResourceExporter(RecordingExporter(), NODE), \
        PodResourceExporter(RecordingExporter(), NODE)
    encoder = Encoder()
    planned = 0
    last = None
    for step, collected in enumerate(series_walk(seed, 60)):
        if collected is None:
            continue
        mine = fast.regroup(collected)
        expected = slow.regroup(MetricsData(collected.resource_metrics))
        assert isinstance(mine, SeriesData) and not isinstance(expected, SeriesData)
        wanted = encode_metrics(expected).SerializeToString(deterministic=True)
        assert encode_metrics(mine).SerializeToString(deterministic=True) == wanted, step
        assert encoder.encode(mine).SerializeToString(deterministic=True) == wanted, step
        for metric, ids in zip(flat_metrics(mine), mine.ids, strict=True):
            for point, series in zip(metric.data.data_points, ids, strict=True):
                kept = collected.table.attributes[series]
                assert dict(point.attributes) == {
                    k: v for k, v in kept.items() if not k.startswith("k8s.")}
        planned += last is not None and mine.layout is last.layout
        last = mine
    assert planned


@pytest.mark.parametrize("seed", range(4))
def test_a_push_whose_layout_stays_refills_the_last_request_with_its_values(seed):
    """Push after push of a node whose pods change: every request sent is the SDK's
    encoding of the regrouped points, whether it was written afresh or the last one
    refilled (no data made for it), and while the layout stays it is refilled."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.sdk.metrics.export import MetricsData

    from otel_gpu.export.otlp.client import OtlpMetricExporter, target, temporality
    from tests.support.exporters import CapturingSender
    from tests.support.series_walk import series_walk

    sender = CapturingSender()
    where = target(resolve(OtlpSettings(endpoint="http://c:4317", protocol="grpc"), {}), {})
    pushing = PodResourceExporter(OtlpMetricExporter(where, temporality(None, {}),
                                                     sender=sender), NODE)
    slow = PodResourceExporter(RecordingExporter(), NODE)
    regrouped, refilled = 0, 0
    original = pushing.regroup

    def counted(data):
        nonlocal regrouped
        regrouped += 1
        return original(data)

    pushing.regroup = counted  # type: ignore[method-assign]
    for step, collected in enumerate(series_walk(seed, 60)):
        if collected is None:
            continue
        before = regrouped
        pushing.export(collected)
        refilled += regrouped == before
        wanted = encode_metrics(slow.regroup(MetricsData(collected.resource_metrics)))
        sent = ExportMetricsServiceRequest.FromString(sender.sent[-1])
        assert sent.SerializeToString(deterministic=True) == \
            wanted.SerializeToString(deterministic=True), step
    assert refilled and regrouped, (refilled, regrouped)
