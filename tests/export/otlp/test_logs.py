"""The events' logs pipeline: settings, Resource grouping, and records at a real receiver."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.resources import Resource

from otel_gpu.export.events.records import ERROR, INFO, Event
from otel_gpu.export.otlp.logs import (
    EventLog,
    PodResourceLogExporter,
    build_event_log,
    build_exporter,
    logs_enabled,
    validate,
)
from otel_gpu.export.otlp.transport import ATTRIBUTES, OtlpSettings, OtlpSetupError
from testkit.otlp_receiver import OtlpReceiver
from tests.support.exporters import RecordingLogExporter

NODE = Resource({"service.name": "otel-gpu", "k8s.node.name": "node-1"})
POD = {"k8s.pod.name": "train-0", "k8s.namespace.name": "ml", "k8s.container.name": "main"}


def _event(uuid: str, pod: dict[str, str] | None = None, body: str = "x") -> Event:
    return Event("nvidia.gpu.xid", ERROR, body, 1_700_000_000.5,
                 {"hw.id": uuid, "nvidia.gpu.xid": 79, **(pod or {})})


def _emit(events: list[Event], exporter: LogRecordExporter) -> None:
    log = EventLog(exporter, NODE)
    for e in events:
        log.emit(e)
    assert log.shutdown(10.0)


def test_records_of_one_pod_share_one_resource_and_lose_the_pod_attributes():
    recorder = RecordingLogExporter()
    other = {**POD, "k8s.pod.name": "train-1"}
    _emit([_event("GPU-0", POD), _event("GPU-1", other), _event("GPU-2"),
           _event("GPU-0", POD, "again")], PodResourceLogExporter(recorder, NODE))
    batch = [r for b in recorder.batches for r in b]
    request = encode_logs(batch)  # how the SDK's exporters group records: by resource
    groups = {}
    for rl in request.resource_logs:
        attrs = {kv.key: kv.value.string_value for kv in rl.resource.attributes}
        groups[attrs.get("k8s.pod.name")] = (attrs, sum(len(s.log_records)
                                                       for s in rl.scope_logs))
    assert set(groups) == {None, "train-0", "train-1"}
    assert groups["train-0"][1] == 2 and groups["train-1"][1] == 1 and groups[None][1] == 1
    assert groups["train-0"][0] == {**{k: str(v) for k, v in NODE.attributes.items()}, **POD}
    for record in batch:
        assert not set(POD) & set(record.log_record.attributes)
        assert record.log_record.attributes["nvidia.gpu.xid"] == 79


def test_records_of_an_hpc_job_go_under_the_jobs_resource():
    recorder = RecordingLogExporter()
    _emit([_event("GPU-0", {"nvidia.gpu.hpc.job.id": "1234"}), _event("GPU-1")],
          PodResourceLogExporter(recorder, NODE))
    batch = [r for b in recorder.batches for r in b]
    by_job = {r.resource.attributes.get("nvidia.gpu.hpc.job.id"): r for r in batch}
    assert set(by_job) == {"1234", None}
    assert by_job["1234"].resource.attributes["k8s.node.name"] == "node-1"
    assert "nvidia.gpu.hpc.job.id" not in by_job["1234"].log_record.attributes


def test_logs_exporter_variable():
    assert logs_enabled({}) and logs_enabled({"OTEL_LOGS_EXPORTER": "otlp"})
    assert not logs_enabled({"OTEL_LOGS_EXPORTER": " None "})
    with pytest.raises(OtlpSetupError, match="OTEL_LOGS_EXPORTER: unsupported exporter 'zipkin'"):
        logs_enabled({"OTEL_LOGS_EXPORTER": "zipkin"})
    assert build_event_log(OtlpSettings(), NODE, {"OTEL_LOGS_EXPORTER": "none"}) is None


def test_logs_variables_are_checked_under_their_own_names():
    env = {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "good=1,bad header=2",
           "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "fine=1"}
    build_exporter(OtlpSettings(endpoint="http://c:4318"),  # the metrics' value is not read
                   {"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "bad header=2"})
    with pytest.raises(OtlpSetupError, match=r"^OTEL_EXPORTER_OTLP_LOGS_HEADERS: header 2"):
        build_exporter(OtlpSettings(endpoint="http://c:4318"), env)
    with pytest.raises(OtlpSetupError, match="OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"):
        build_exporter(OtlpSettings(), {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "c:4318"})


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_records_arrive_at_the_receiver_under_the_pods_resource(protocol):
    with OtlpReceiver() as receiver:
        endpoint = receiver.grpc_target if protocol == "grpc" else receiver.http_endpoint
        settings = OtlpSettings(endpoint=endpoint, protocol=protocol, insecure=True)
        log = build_event_log(settings, NODE, {})
        assert log is not None
        log.emit(_event("GPU-0", POD, "GPU no longer reachable on the PCIe bus"))
        log.emit(Event("nvidia.gpu.throttle.thermal", INFO, "ended", 1.0, {"hw.id": "GPU-1"}))
        assert log.shutdown(10.0)
        rows = receiver.wait_for_logs(count=2)
    by_event = {r.attributes["hw.id"]: r for r in rows}
    xid = by_event["GPU-0"]
    assert xid.resource["k8s.pod.name"] == "train-0" and xid.resource["k8s.node.name"] == "node-1"
    assert xid.event_name == "nvidia.gpu.xid" and xid.severity_text == "ERROR"
    assert xid.severity_number == 17 and xid.body == "GPU no longer reachable on the PCIe bus"
    assert xid.attributes == {"hw.id": "GPU-0", "nvidia.gpu.xid": 79}
    assert xid.time_unix_nano == 1_700_000_000_500_000_000
    assert xid.scope == "otel_gpu.events"
    assert "k8s.pod.name" not in by_event["GPU-1"].resource
    assert by_event["GPU-1"].severity_number == 9


def test_pod_identity_attributes_keeps_the_pod_on_the_record():
    with OtlpReceiver(grpc=False) as receiver:
        settings = OtlpSettings(endpoint=receiver.http_endpoint, pod_identity=ATTRIBUTES)
        log = build_event_log(settings, NODE, {})
        log.emit(_event("GPU-0", POD))
        assert log.shutdown(10.0)
        (row,) = receiver.wait_for_logs()
    assert row.attributes["k8s.pod.name"] == "train-0" and "k8s.pod.name" not in row.resource


def test_without_a_logs_endpoint_logs_follow_the_metrics_endpoint():
    with OtlpReceiver(grpc=False) as receiver:
        env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.http_metrics_url}
        log = EventLog(build_exporter(OtlpSettings(), env), NODE)
        log.emit(_event("GPU-0"))
        assert log.shutdown(10.0)
        (row,) = receiver.wait_for_logs()
    assert row.attributes["hw.id"] == "GPU-0"
    assert receiver.errors == []  # it went to /v1/logs, not /v1/metrics


def test_a_logs_endpoint_variable_wins(monkeypatch):
    with OtlpReceiver(grpc=False) as logs, OtlpReceiver(grpc=False) as metrics:
        # the SDK's exporter reads the variables of the process itself
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", metrics.http_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", f"{logs.http_endpoint}/v1/logs")
        import os

        log = EventLog(build_exporter(OtlpSettings(), dict(os.environ)), NODE)
        log.emit(_event("GPU-0"))
        assert log.shutdown(10.0)
        logs.wait_for_logs()
        assert metrics.log_requests == []


def test_following_the_metrics_endpoint_takes_its_headers_too():
    with OtlpReceiver(grpc=False) as receiver:
        env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.http_metrics_url,
               "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-tenant=gpu%20team"}
        log = EventLog(build_exporter(OtlpSettings(), env), NODE)
        log.emit(_event("GPU-0"))
        assert log.shutdown(10.0)
        receiver.wait_for_logs()
        (request,) = receiver.log_requests
    assert request.headers["x-tenant"] == "gpu team"


def test_validate_checks_what_serve_would_build(tmp_path):
    validate(OtlpSettings(endpoint="http://c:4318"), {"OTEL_LOGS_EXPORTER": "none",
                                                      "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "bad"})
    missing = tmp_path / "ca.pem"
    with pytest.raises(OtlpSetupError, match=f"OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE {missing}"):
        validate(OtlpSettings(endpoint="https://c:4318"),
                 {"OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": str(missing)})


def test_shutdown_sends_what_is_queued_at_once():
    with OtlpReceiver(grpc=False) as receiver:
        exporter = build_exporter(OtlpSettings(endpoint=receiver.http_endpoint), {})
        log = EventLog(exporter, NODE, schedule_delay_ms=3_600_000)  # no timed export
        log.emit(_event("GPU-0"))
        assert receiver.log_requests == []
        assert log.shutdown(10.0)
        (row,) = receiver.wait_for_logs(timeout=1.0)
    assert row.attributes["hw.id"] == "GPU-0"


@pytest.mark.parametrize(("settings", "environ", "says"), [
    (OtlpSettings(endpoint="http://c:4318", protocol="grpc"), {}, "gRPC sent to an OTLP/HTTP "
     "port (4318): send gRPC to port 4317"),
    (OtlpSettings(protocol="http/protobuf"), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
     "OTLP/HTTP sent to an OTLP/gRPC port (4317): send it to port 4318 (path /v1/logs)"),
    (OtlpSettings(protocol="http/protobuf"),
     {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:4317/v1/logs"}, "(path /v1/logs)"),
])
def test_logs_sent_to_the_other_protocols_port_are_named_at_start(settings, environ, says,
                                                                     caplog):
    """The logs leave through the SDK's exporter, whose failure on the wrong port is a
    raw transport error: the mismatch is one line at start-up."""
    build_exporter(settings, environ)
    assert [r.getMessage() for r in caplog.records if "OTLP logs" in r.getMessage()] \
        and says in caplog.text


def test_logs_on_their_own_protocols_port_get_no_such_line(caplog):
    build_exporter(OtlpSettings(endpoint="http://c:4318", protocol="http/protobuf"), {})
    build_exporter(OtlpSettings(endpoint="c:4317", protocol="grpc"), {})
    assert "OTLP logs" not in caplog.text
