"""otel-gpu's OTLP exporter: the variables it reads as the SDK's exporters did, and its retries."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import MetricExportResult

from otel_gpu.export.otlp.client import (
    Attempt,
    OtlpMetricExporter,
    _retry_after,
    _retry_info,
    target,
    temporality,
)
from otel_gpu.export.otlp.transport import OtlpSettings, resolve
from tests.support.metrics_data import data, gauge, point


def _target(settings: OtlpSettings, environ: dict[str, str]):
    return target(resolve(settings, environ), environ)


def test_the_variables_fill_what_the_settings_leave():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "4",
           "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "3", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=a"}
    got = _target(OtlpSettings(), env)
    assert (got.url, got.timeout_s, got.compression, dict(got.headers)) == (
        "http://c:4318/v1/metrics", 3.0, "gzip", {"x-tenant": "a"})
    mine = _target(OtlpSettings(timeout=2.0, compression="none"), env)
    assert (mine.timeout_s, mine.compression) == (2.0, "none")
    assert _target(OtlpSettings(), {}).url == "http://localhost:4318/v1/metrics"
    assert _target(OtlpSettings(), {}).timeout_s == 10.0


@pytest.mark.parametrize(("endpoint", "env", "insecure"), [
    ("http://c:4317", {}, True),
    ("https://c:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, False),
    ("c:4317", {}, False),
    ("c:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, True),
    ("http://c:4317", {"OTEL_EXPORTER_OTLP_METRICS_INSECURE": "false"}, False),
])
def test_grpc_plaintext_as_the_sdk_decides_it(endpoint, env, insecure):
    got = _target(OtlpSettings(endpoint=endpoint, protocol="grpc"), env)
    assert got.insecure is insecure and got.authority == "c:4317"


def test_temporality_from_the_setting_else_the_variable():
    from opentelemetry.sdk.metrics import Counter, ObservableCounter

    variable = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    assert temporality(None, {variable: "delta"})[ObservableCounter].name == "DELTA"
    assert temporality("cumulative", {variable: "delta"})[ObservableCounter].name == "CUMULATIVE"
    low = temporality(None, {variable: "lowmemory"})
    assert (low[Counter].name, low[ObservableCounter].name) == ("DELTA", "CUMULATIVE")


def test_server_delays():
    from google.protobuf.duration_pb2 import Duration

    duration = Duration(seconds=1, nanos=500_000_000).SerializeToString()
    assert _retry_info(b"\x0a" + bytes([len(duration)]) + duration) == 1.5
    assert _retry_info(b"") is None and _retry_info(b"\x12\x00") is None
    assert _retry_after("2") == 2.0 and _retry_after("soon") is None
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def _script(*answers: Attempt):
    """A sender answering from a list, recording what it was given."""

    class Script:
        def __init__(self, *answers: Attempt) -> None:
            self.answers, self.sent, self.reconnects, self.closed = list(answers), [], 0, False

        def prepare(self, body: bytes) -> bytes:
            return b"<" + body + b">"

        def send(self, body: bytes, timeout_s: float) -> Attempt:
            self.sent.append((body, timeout_s))
            return self.answers.pop(0)

        def reconnect(self) -> None:
            self.reconnects += 1

        def close(self) -> None:
            self.closed = True

    return Script(*answers)


def _exporter(sender, timeout_s: float = 5.0) -> OtlpMetricExporter:
    where = _target(OtlpSettings(endpoint="http://c:4317", protocol="grpc",
                                 timeout=timeout_s), {})
    return OtlpMetricExporter(where, temporality(None, {}), sender=sender)


def test_transient_failures_are_retried_after_the_servers_delay():
    sender = _script(Attempt(False, "UNAVAILABLE: down", True, 0.01, reconnect=True),
                     Attempt(False, "UNAVAILABLE: down", True, 0.01, reconnect=True),
                     Attempt(True))
    body = data(gauge("g", [point(1.0)]))
    assert _exporter(sender).export(body) is MetricExportResult.SUCCESS
    assert len(sender.sent) == 3 and sender.reconnects == 1  # after the first only
    assert sender.sent[0][0].startswith(b"<") and sender.sent[0][1] <= 5.0


def test_a_permanent_failure_or_a_delay_past_the_deadline_is_not_retried(caplog):
    sender = _script(Attempt(False, "INVALID_ARGUMENT: no", False))
    assert _exporter(sender).export(data()) is MetricExportResult.FAILURE
    assert len(sender.sent) == 1 and "Failed to export metrics to" in caplog.text
    late = _script(Attempt(False, "UNAVAILABLE: down", True, 60.0))
    assert _exporter(late, timeout_s=1.0).export(data()) is MetricExportResult.FAILURE
    assert len(late.sent) == 1


def test_the_export_timeout_bounds_the_deadline_and_shutdown_stops_it():
    sender = _script(Attempt(True))
    exporter = _exporter(sender)
    exporter.export(data(), timeout_millis=500)
    assert sender.sent[0][1] <= 0.5
    exporter.shutdown()
    exporter.shutdown()  # once only
    assert sender.closed and exporter.export(data()) is MetricExportResult.FAILURE
    assert len(sender.sent) == 1
