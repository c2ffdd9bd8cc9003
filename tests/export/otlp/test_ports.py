"""OTLP sent to the other protocol's port, said in one line (the real sockets are in
tests/e2e/test_self_metrics.py)."""

from __future__ import annotations

from otel_gpu.export.otlp.ports import mismatch


def test_grpc_to_4318_is_named_by_the_port_even_when_the_answer_says_nothing():
    found = mismatch("grpc", "http://collector:4318", "UNAVAILABLE: connection refused")
    assert found is not None and not found.proved  # retried as it was: the port alone says it
    assert found.reason.startswith("gRPC sent to an OTLP/HTTP port (4318): send gRPC to port "
                                   "4317, or set otlp_protocol")
    assert found.reason.endswith("(got UNAVAILABLE: connection refused)")


def test_http_to_4317_is_named_by_the_port():
    found = mismatch("http/protobuf", "http://collector:4317/v1/metrics", "HTTP 404 Not Found")
    assert found is not None and "OTLP/HTTP sent to an OTLP/gRPC port (4317)" in found.reason


def test_the_servers_answer_proves_it_on_any_port():
    grpc = mismatch("grpc", "collector:5000", "UNAVAILABLE: ipv4:10.0.0.1:5000: Trying to "
                    "connect an http1.x server")
    http = mismatch("http/protobuf", "http://collector:5000/v1/metrics",
                    "('Connection aborted.', BadStatusLine('\\x00\\x00\\x18\\x04'))")
    assert grpc is not None and grpc.proved and "an OTLP/HTTP endpoint" in grpc.reason
    assert http is not None and http.proved
    assert http.reason.endswith("(got an HTTP/2 frame for a status line)")


def test_other_failures_on_other_ports_are_left_as_they_are():
    assert mismatch("grpc", "collector:4317", "UNAVAILABLE: connection refused") is None
    assert mismatch("http/protobuf", "http://c:4318/v1/metrics", "HTTP 503 Unavailable") is None
    assert mismatch("grpc", "[::1", "UNAVAILABLE") is None  # no port to read
