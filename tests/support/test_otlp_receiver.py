"""The OTLP test receiver, exercised by the real OpenTelemetry SDK exporters.

Later end-to-end tests trust this receiver to tell what the collector sent;
these tests prove it decodes, records and answers correctly over every
transport and security mode the collector can be configured for.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from testkit.otlp_receiver import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
    OtlpReceiver,
    Row,
    has_metric,
    metric_names,
    resource_groups,
    rows,
)
from tests.support.certs import CertBundle, make_certs
from tests.support.exporters import SdkExporters

_CA_BUNDLE_VARS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _clean_otlp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the machine's environment out of the exporters' configuration.

    Besides OTEL_EXPORTER_OTLP_*, requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE
    override the HTTP exporter's ``certificate_file`` (see the test below).
    """
    for key in list(os.environ):
        if key.startswith("OTEL_EXPORTER_OTLP_") or key in _CA_BUNDLE_VARS:
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    return make_certs(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def foreign_certs(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    """An unrelated CA: its client certificate must be refused by mTLS receivers."""
    return make_certs(tmp_path_factory.mktemp("foreign-pki"))


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def exporters() -> Iterator[SdkExporters]:
    made = SdkExporters()
    yield made
    made.shutdown()


def _temperature(options: CallbackOptions) -> list[Observation]:
    return [Observation(41.5, {"gpu": "0"}), Observation(38.0, {"gpu": "1"})]


def metrics_data(**resource: Any) -> MetricsData:
    """A small, known set of SDK metrics: counter, up-down counter, histogram, gauge."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        resource=Resource.create({"service.name": "otlp-receiver-test", **resource}),
        metric_readers=[reader],
    )
    meter = provider.get_meter("tests.otlp", "1.0")
    meter.create_counter("test.requests", unit="{request}").add(3, {"route": "/a"})
    meter.create_up_down_counter("test.inflight").add(-2)
    latency = meter.create_histogram("test.latency", unit="ms")
    latency.record(5)
    latency.record(7.5)
    meter.create_observable_gauge("test.temperature", [_temperature], unit="Cel")
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def assert_standard_rows(request: ExportMetricsServiceRequest) -> None:
    """What ``metrics_data()`` must look like after a round trip through exporter and receiver."""
    got = {(r.metric, tuple(sorted(r.attributes.items()))): r for r in rows(request)}
    assert set(got) == {
        ("test.requests", (("route", "/a"),)),
        ("test.inflight", ()),
        ("test.latency", ()),
        ("test.temperature", (("gpu", "0"),)),
        ("test.temperature", (("gpu", "1"),)),
    }
    counter = got[("test.requests", (("route", "/a"),))]
    assert counter.resource["service.name"] == "otlp-receiver-test"
    assert counter.resource["telemetry.sdk.language"] == "python"
    assert (counter.scope, counter.unit, counter.kind) == ("tests.otlp", "{request}", "sum")
    assert (counter.monotonic, counter.temporality, counter.value) == (True, "CUMULATIVE", 3.0)
    updown = got[("test.inflight", ())]
    assert (updown.kind, updown.monotonic, updown.value) == ("sum", False, -2.0)
    latency = got[("test.latency", ())]
    assert (latency.kind, latency.unit, latency.temporality) == ("histogram", "ms", "CUMULATIVE")
    assert latency.value == 12.5
    gpu0 = got[("test.temperature", (("gpu", "0"),))]
    assert (gpu0.kind, gpu0.unit, gpu0.temporality, gpu0.value) == ("gauge", "Cel", None, 41.5)
    assert resource_groups(request) == [counter.resource]


def raw_post(url: str, body: bytes, headers: dict[str, str], **kw: Any) -> tuple[int, bytes]:
    """A bare HTTP POST, for what the SDK exporter cannot send or cannot show."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5, **kw) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


# --------------------------------------------------------------------------- plain transports


@pytest.mark.parametrize(
    ("compression", "wire"),
    [
        (grpc.Compression.NoCompression, "none"),
        (grpc.Compression.Gzip, "gzip"),
        (grpc.Compression.Deflate, "deflate"),
    ],
)
def test_grpc_plain_round_trip(
    rx: OtlpReceiver, exporters: SdkExporters, compression: grpc.Compression, wire: str
) -> None:
    exporter = exporters.grpc(rx, compression=compression)
    assert rx.grpc_endpoint == f"http://127.0.0.1:{rx.grpc_port}"

    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

    [got] = rx.wait_for(has_metric("test.requests"), timeout=5)
    assert (got.transport, got.compression, got.answer) == ("grpc", wire, "OK")
    assert got.gzipped is (wire == "gzip")
    assert got.headers["user-agent"].startswith("OTel-OTLP-Exporter-Python/")
    assert got.client_cert_cn is None
    assert_standard_rows(got.request)


def test_http_plain_gzip_round_trip(rx: OtlpReceiver, exporters: SdkExporters) -> None:
    exporter = exporters.http(rx, compression=Compression.Gzip)

    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

    [got] = rx.wait_for(has_metric("test.latency"), timeout=5)
    assert (got.transport, got.compression, got.gzipped) == ("http", "gzip", True)
    assert got.headers["content-encoding"] == "gzip"
    assert got.headers["content-type"] == "application/x-protobuf"
    assert_standard_rows(got.request)


@pytest.mark.parametrize("metrics_specific", [False, True])
def test_http_configured_by_env_vars(
    rx: OtlpReceiver,
    exporters: SdkExporters,
    monkeypatch: pytest.MonkeyPatch,
    metrics_specific: bool,
) -> None:
    """The generic base endpoint gets /v1/metrics appended; the metrics one is used verbatim."""
    env = rx.env("http/protobuf", metrics_specific=metrics_specific)
    expected_url = rx.http_metrics_url if metrics_specific else rx.http_endpoint
    assert next(v for k, v in env.items() if k.endswith("ENDPOINT")) == expected_url
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "deflate")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20env,x-tenant=gpu")

    exporter = exporters.http()  # everything from the environment
    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

    [got] = rx.wait_for(timeout=5)
    assert (got.transport, got.compression) == ("http", "deflate")
    assert got.headers["authorization"] == "Bearer env"
    assert got.headers["x-tenant"] == "gpu"
    assert_standard_rows(got.request)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_headers_are_recorded(rx: OtlpReceiver, exporters: SdkExporters, transport: str) -> None:
    # Lower-case keys: gRPC refuses others ("Illegal header key", INTERNAL, not retried).
    exporter = exporters.make(transport, rx, headers={"authorization": "Bearer t", "x-org": "o1"})

    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

    [got] = rx.wait_for(timeout=5)
    assert got.transport == transport
    assert got.headers["authorization"] == "Bearer t"
    assert got.headers["x-org"] == "o1"


def test_concurrent_exports_are_all_recorded(rx: OtlpReceiver, exporters: SdkExporters) -> None:
    workers = [exporters.make("grpc" if i % 2 else "http", rx) for i in range(6)]
    results: dict[int, MetricExportResult] = {}

    def run(i: int) -> None:
        results[i] = workers[i].export(metrics_data(worker=i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)

    assert set(results.values()) == {MetricExportResult.SUCCESS}
    got = rx.wait_for(count=6, timeout=5)
    assert sorted(resource_groups(r)[0]["worker"] for r in got) == list(range(6))
    assert {r.transport for r in got} == {"grpc", "http"}


def test_periodic_reader_delivers_and_resumes_after_restart(rx: OtlpReceiver) -> None:
    """The collector's shape: a periodic reader keeps exporting, across a receiver outage."""
    reader = PeriodicExportingMetricReader(
        HttpMetricExporter(endpoint=rx.http_metrics_url, timeout=1), export_interval_millis=100
    )
    provider = MeterProvider(
        resource=Resource.create({"service.name": "periodic"}), metric_readers=[reader]
    )
    try:
        provider.get_meter("tests.otlp").create_counter("test.ticks").add(7)
        first = rx.wait_for(has_metric("test.ticks"), count=3, timeout=5)
        arrivals = [r.arrived for r in first]
        assert arrivals == sorted(arrivals) and len(set(arrivals)) == len(arrivals)
        assert {r.value for req in first for r in req.rows()} == {7.0}  # cumulative, unchanged

        rx.stop()
        rx.clear()
        assert rx.requests == []
        rx.start()
        again = rx.wait_for(has_metric("test.ticks"), count=2, timeout=10)
        assert {r.value for req in again for r in req.rows()} == {7.0}
    finally:
        provider.shutdown()


# --------------------------------------------------------------------------- TLS and mTLS


@pytest.mark.parametrize("configured_by", ["credentials", "env"])
def test_grpc_tls(
    certs: CertBundle,
    exporters: SdkExporters,
    monkeypatch: pytest.MonkeyPatch,
    configured_by: str,
) -> None:
    with OtlpReceiver.with_tls(certs, http=False) as rx:
        assert rx.grpc_endpoint.startswith("https://127.0.0.1:")
        if configured_by == "credentials":
            creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_cert.read_bytes())
            exporter = exporters.grpc(rx, credentials=creds)
        else:
            for key, value in rx.env("grpc").items():
                monkeypatch.setenv(key, value)
            assert "OTEL_EXPORTER_OTLP_CLIENT_KEY" not in rx.env("grpc")
            exporter = exporters.grpc()

        assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

        [got] = rx.wait_for(timeout=5)
        assert got.transport == "grpc"
        assert got.client_cert_cn is None
        assert_standard_rows(got.request)


def test_grpc_tls_refused_without_the_ca(certs: CertBundle, exporters: SdkExporters) -> None:
    with OtlpReceiver.with_tls(certs, http=False) as rx:
        exporter = exporters.grpc(rx, credentials=grpc.ssl_channel_credentials(), timeout=0.5)

        assert exporter.export(metrics_data()) is MetricExportResult.FAILURE
        assert rx.attempts == []


@pytest.mark.parametrize("configured_by", ["credentials", "env"])
def test_grpc_mtls(
    certs: CertBundle,
    exporters: SdkExporters,
    monkeypatch: pytest.MonkeyPatch,
    configured_by: str,
) -> None:
    with OtlpReceiver.with_tls(certs, mtls=True, http=False) as rx:
        if configured_by == "credentials":
            creds = grpc.ssl_channel_credentials(
                root_certificates=certs.ca_cert.read_bytes(),
                private_key=certs.client_key.read_bytes(),
                certificate_chain=certs.client_cert.read_bytes(),
            )
            exporter = exporters.grpc(rx, credentials=creds)
        else:
            env = rx.env("grpc", metrics_specific=True)
            assert env["OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"] == str(certs.client_key)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            exporter = exporters.grpc()

        assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

        [got] = rx.wait_for(timeout=5)
        assert got.client_cert_cn == certs.client_common_name


@pytest.mark.parametrize("client", ["no-client-cert", "foreign-ca-client-cert"])
def test_grpc_mtls_refuses_unknown_clients(
    certs: CertBundle, foreign_certs: CertBundle, exporters: SdkExporters, client: str
) -> None:
    with OtlpReceiver.with_tls(certs, mtls=True, http=False) as rx:
        if client == "no-client-cert":
            creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_cert.read_bytes())
        else:
            creds = grpc.ssl_channel_credentials(
                root_certificates=certs.ca_cert.read_bytes(),
                private_key=foreign_certs.client_key.read_bytes(),
                certificate_chain=foreign_certs.client_cert.read_bytes(),
            )
        exporter = exporters.grpc(rx, credentials=creds, timeout=0.5)

        assert exporter.export(metrics_data()) is MetricExportResult.FAILURE
        assert rx.attempts == []


def test_http_tls(certs: CertBundle, exporters: SdkExporters) -> None:
    with OtlpReceiver.with_tls(certs, grpc=False) as rx:
        assert rx.http_metrics_url.startswith("https://127.0.0.1:")
        exporter = exporters.http(rx, certificate_file=str(certs.ca_cert))

        assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

        [got] = rx.wait_for(timeout=5)
        assert (got.transport, got.client_cert_cn) == ("http", None)
        assert_standard_rows(got.request)

        untrusting = exporters.http(rx, timeout=0.5)  # system CAs only
        assert untrusting.export(metrics_data()) is MetricExportResult.FAILURE
        assert len(rx.attempts) == 1
        rx.wait_for_error("SSL", timeout=5)


def test_http_certificate_file_loses_to_requests_ca_bundle(
    certs: CertBundle, foreign_certs: CertBundle, exporters: SdkExporters,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trap for collector tests: requests prefers REQUESTS_CA_BUNDLE over the exporter's CA.

    A process started with that variable set (many images set it) cannot reach a
    receiver signed by a private CA over OTLP/HTTP, whatever
    OTEL_EXPORTER_OTLP_CERTIFICATE says; such tests must drop the variable.
    """
    # Some releases (1.45.0) send through urllib3, which reads no such variable.
    through_requests = any(
        r.startswith("opentelemetry-exporter-http-transport[requests]") and "extra ==" not in r
        for r in importlib.metadata.requires("opentelemetry-exporter-otlp-proto-http") or ())
    with OtlpReceiver.with_tls(certs, grpc=False) as rx:
        # another CA: from Python 3.13 on, a bundle holding the server's own certificate
        # is trusted as a partial chain
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(foreign_certs.ca_cert))
        exporter = exporters.http(rx, certificate_file=str(certs.ca_cert), timeout=0.5)

        if through_requests:
            assert exporter.export(metrics_data()) is MetricExportResult.FAILURE
            assert rx.attempts == []
        else:
            assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
            assert len(rx.wait_for(timeout=5)) == 1


def test_http_mtls(certs: CertBundle, foreign_certs: CertBundle, exporters: SdkExporters) -> None:
    with OtlpReceiver.with_tls(certs, mtls=True, grpc=False) as rx:
        exporter = exporters.http(
            rx,
            certificate_file=str(certs.ca_cert),
            client_certificate_file=str(certs.client_cert),
            client_key_file=str(certs.client_key),
        )
        assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
        [got] = rx.wait_for(timeout=5)
        assert got.client_cert_cn == certs.client_common_name

        for bad in (
            exporters.http(rx, certificate_file=str(certs.ca_cert), timeout=0.5),
            exporters.http(
                rx,
                certificate_file=str(certs.ca_cert),
                client_certificate_file=str(foreign_certs.client_cert),
                client_key_file=str(foreign_certs.client_key),
                timeout=0.5,
            ),
        ):
            assert bad.export(metrics_data()) is MetricExportResult.FAILURE
        assert len(rx.attempts) == 1
        rx.wait_for_error("SSL", timeout=5)


# --------------------------------------------------------------------------- programmed answers


@pytest.mark.parametrize(
    ("transport", "status", "answer"),
    [("grpc", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"), ("http", 503, "HTTP 503")],
)
def test_fail_next_then_success_with_sdk_backoff(
    rx: OtlpReceiver, exporters: SdkExporters, transport: str, status: Any, answer: str
) -> None:
    """Two transient failures: the SDK waits ~1 s then ~2 s (+-20 %) and the third try lands."""
    rx.fail_next(2, status)
    exporter = exporters.make(transport, rx, timeout=6)

    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS

    assert [a.answer for a in rx.attempts] == [answer, answer, "OK"]
    assert rx.pending_failures == 0
    [got] = rx.wait_for(timeout=1)
    assert_standard_rows(got.request)
    arrived = [a.arrived for a in rx.attempts]
    assert arrived[1] - arrived[0] >= 0.7 and arrived[2] - arrived[1] >= 1.5


@pytest.mark.parametrize(
    ("transport", "status", "answer", "retried"),
    [
        ("grpc", grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", True),
        ("grpc", 503, "UNAVAILABLE", True),
        ("grpc", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", False),
        ("http", 503, "HTTP 503", True),
        ("http", grpc.StatusCode.RESOURCE_EXHAUSTED, "HTTP 429", True),
        ("http", 400, "HTTP 400", False),
    ],
)
def test_fail_next_with_retry_hint(
    rx: OtlpReceiver,
    exporters: SdkExporters,
    transport: str,
    status: Any,
    answer: str,
    retried: bool,
) -> None:
    """RetryInfo / Retry-After replace the SDK backoff; non-retryable codes fail at once."""
    rx.fail_next(3 if retried else 1, status, retry_after=0.05)
    exporter = exporters.make(transport, rx, timeout=5)

    started = time.monotonic()
    result = exporter.export(metrics_data())
    elapsed = time.monotonic() - started

    assert elapsed < 0.9  # three SDK-chosen backoffs would take 7 s
    if retried:
        assert result is MetricExportResult.SUCCESS
        assert [a.answer for a in rx.attempts] == [answer] * 3 + ["OK"]
        assert len(rx.requests) == 1
    else:
        assert result is MetricExportResult.FAILURE
        assert [a.answer for a in rx.attempts] == [answer]
        assert rx.requests == []
        # The queue is used up: the next export goes through.
        assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
        assert len(rx.requests) == 1


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_partial_success(rx: OtlpReceiver, exporters: SdkExporters, transport: str) -> None:
    rx.partial_success(3, "3 points rejected by test")
    exporter = exporters.make(transport, rx)

    # The SDK treats a partial success as success (and does not log it).
    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
    [got] = rx.wait_for(timeout=5)
    assert got.answer == "PARTIAL_SUCCESS" and got.accepted

    # The reply itself carries the partial success: read it with a bare client.
    request = got.request
    if transport == "grpc":
        with grpc.insecure_channel(rx.grpc_target) as channel:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            response = stub.Export(request, timeout=5)
    else:
        status, body = raw_post(
            rx.http_metrics_url,
            request.SerializeToString(),
            {"Content-Type": "application/x-protobuf"},
        )
        assert status == 200
        response = ExportMetricsServiceResponse.FromString(body)
    assert response.partial_success.rejected_data_points == 3
    assert response.partial_success.error_message == "3 points rejected by test"

    rx.partial_success(0, "")
    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
    assert [a.answer for a in rx.attempts][-1] == "OK"


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_delay_slows_answers(rx: OtlpReceiver, exporters: SdkExporters, transport: str) -> None:
    rx.delay(0.4)
    patient = exporters.make(transport, rx, timeout=3)
    started = time.monotonic()
    assert patient.export(metrics_data()) is MetricExportResult.SUCCESS
    assert time.monotonic() - started >= 0.4

    impatient = exporters.make(transport, rx, timeout=0.2)
    assert impatient.export(metrics_data()) is MetricExportResult.FAILURE


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_stop_interrupts_a_delayed_answer(
    rx: OtlpReceiver, exporters: SdkExporters, transport: str
) -> None:
    rx.delay(60)
    exporter = exporters.make(transport, rx, timeout=1.5)
    results: list[MetricExportResult] = []
    worker = threading.Thread(target=lambda: results.append(exporter.export(metrics_data())))
    worker.start()
    rx.wait_until(lambda: rx.in_flight == 1, timeout=5, what="the request to be held")

    started = time.monotonic()
    rx.stop()
    assert time.monotonic() - started < 2
    worker.join(5)

    assert results == [MetricExportResult.FAILURE]
    assert [a.answer for a in rx.attempts] == ["ABORTED"]
    assert rx.requests == []
    assert rx.in_flight == 0


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_stop_then_start_on_the_same_port(
    rx: OtlpReceiver, exporters: SdkExporters, transport: str
) -> None:
    exporter = exporters.make(transport, rx, timeout=2)
    endpoint = rx.grpc_endpoint if transport == "grpc" else rx.http_metrics_url
    assert exporter.export(metrics_data(phase="before")) is MetricExportResult.SUCCESS

    rx.stop()
    assert not rx.running
    assert exporter.export(metrics_data(phase="down")) is MetricExportResult.FAILURE

    rx.start()
    assert (rx.grpc_endpoint if transport == "grpc" else rx.http_metrics_url) == endpoint
    # The same exporter (pooled connection / channel) reconnects on its own.
    assert exporter.export(metrics_data(phase="after")) is MetricExportResult.SUCCESS

    got = rx.wait_for(count=2, timeout=5)
    assert [resource_groups(r)[0]["phase"] for r in got] == ["before", "after"]
    assert all(a.accepted for a in rx.attempts)


# --------------------------------------------------------------------------- receiver edges


def test_http_rejects_what_is_not_otlp(rx: OtlpReceiver) -> None:
    payload = ExportMetricsServiceRequest().SerializeToString()
    proto = {"Content-Type": "application/x-protobuf"}
    base = rx.http_endpoint
    assert raw_post(f"{base}/v1/traces", payload, proto)[0] == 404
    assert raw_post(rx.http_metrics_url, payload, {"Content-Type": "text/plain"})[0] == 415
    assert raw_post(rx.http_metrics_url, b"\xff\xff\xff", proto)[0] == 400
    not_gzip = {**proto, "Content-Encoding": "gzip"}
    assert raw_post(rx.http_metrics_url, payload + b"x", not_gzip)[0] == 400
    assert rx.attempts == []
    assert len(rx.errors) == 4


def test_http_json_and_chunked_bodies(rx: OtlpReceiver) -> None:
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().scope_metrics.add().metrics.add(name="json.metric")
    body = json_format.MessageToJson(request).encode()
    status, answer = raw_post(rx.http_metrics_url, body, {"Content-Type": "application/json"})
    assert status == 200 and answer.strip().startswith(b"{")

    def chunks() -> Iterator[bytes]:
        data = gzip.compress(request.SerializeToString())
        yield data[:5]
        yield data[5:]

    req = urllib.request.Request(
        rx.http_metrics_url,
        data=chunks(),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200

    got = rx.wait_for(has_metric("json.metric"), count=2, timeout=5)
    assert [(r.content_type, r.compression) for r in got] == [
        ("application/json", "none"),
        ("application/x-protobuf", "gzip"),
    ]
    assert got[0].headers["content-type"] == "application/json"  # keys lower-cased
    assert got[1].headers["content-encoding"] == "gzip"


def test_wait_for_explains_what_arrived(rx: OtlpReceiver, exporters: SdkExporters) -> None:
    with pytest.raises(AssertionError, match="nothing arrived"):
        rx.wait_for(timeout=0.1)

    exporter = exporters.grpc(rx)
    assert exporter.export(metrics_data()) is MetricExportResult.SUCCESS
    started = time.monotonic()
    rx.wait_for(has_metric("test.temperature"), timeout=5)
    assert time.monotonic() - started < 1  # returns as soon as it matches

    with pytest.raises(AssertionError, match=r"grpc OK .*test\.requests"):
        rx.wait_for(has_metric("no.such.metric"), timeout=0.2)


def test_ports_are_fixed_after_first_start() -> None:
    receiver = OtlpReceiver(http=False)
    with pytest.raises(RuntimeError):
        _ = receiver.grpc_endpoint
    with pytest.raises(RuntimeError):
        _ = receiver.http_endpoint
    with receiver:
        port = receiver.grpc_port
        assert receiver.running
    assert not receiver.running
    with receiver:
        assert receiver.grpc_port == port
        with pytest.raises(RuntimeError):
            _ = receiver.http_port  # HTTP was not enabled


def _kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def test_rows_and_resource_groups_on_a_handmade_request() -> None:
    """The flattening helpers, independent of any SDK encoding choices."""
    request = ExportMetricsServiceRequest()
    first = request.resource_metrics.add(
        resource=PbResource(
            attributes=[
                _kv("host.name", AnyValue(string_value="n1")),
                _kv("k8s.pod.uid", AnyValue(string_value="p1")),
            ]
        )
    )
    scope = first.scope_metrics.add(scope=InstrumentationScope(name="otel-gpu", version="0"))
    energy = scope.metrics.add(name="gpu.energy", unit="J")
    energy.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    energy.sum.is_monotonic = True
    energy.sum.data_points.add(
        as_double=12.25,
        attributes=[
            _kv("gpu.index", AnyValue(int_value=0)),
            _kv("mig", AnyValue(bool_value=False)),
            _kv("ids", AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1)]))),
            _kv(
                "nested",
                AnyValue(kvlist_value=KeyValueList(values=[_kv("a", AnyValue(double_value=0.5))])),
            ),
        ],
    )
    util = scope.metrics.add(name="gpu.utilization", unit="1")
    util.gauge.data_points.add(as_int=87)
    second = request.resource_metrics.add(
        resource=PbResource(attributes=[_kv("host.name", AnyValue(string_value="n2"))])
    )
    hist = second.scope_metrics.add().metrics.add(name="gpu.latency", unit="s")
    hist.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    hist.histogram.data_points.add(count=2, sum=0.75)

    r1 = {"host.name": "n1", "k8s.pod.uid": "p1"}
    r2 = {"host.name": "n2"}
    assert resource_groups(request) == [r1, r2]
    assert metric_names(request) == {"gpu.energy", "gpu.utilization", "gpu.latency"}
    attrs = {"gpu.index": 0, "mig": False, "ids": [1], "nested": {"a": 0.5}}
    assert rows(request) == [
        Row(r1, "otel-gpu", "gpu.energy", "J", "sum", True, "DELTA", attrs, 12.25),
        Row(r1, "otel-gpu", "gpu.utilization", "1", "gauge", False, None, {}, 87.0),
        Row(r2, "", "gpu.latency", "s", "histogram", False, "CUMULATIVE", {}, 0.75),
    ]
