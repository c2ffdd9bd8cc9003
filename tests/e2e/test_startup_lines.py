"""The start-up lines: one per exporter, saying where the telemetry goes, how and how often."""

from __future__ import annotations

from testkit.process import wait_until

FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


def _line(proc, start: str) -> str:
    """The first log line whose message starts with ``start`` (after the logger's prefix)."""
    def found():
        return next((ln for ln in proc.lines if f" {start}" in ln or ln.startswith(start)),
                    None)

    return str(wait_until(found, 10.0, f"a line starting {start!r}"))


def test_otlp_only_names_where_it_pushes_and_never_claims_metrics(collector, receiver):
    proc = collector("--simulate", "t4", "--exporters", "otlp",
                     env={**receiver.env("http/protobuf"), **FAST_EXPORT})
    metrics = _line(proc, "otlp metrics:")
    assert f"pushing to {receiver.http_endpoint}/v1/metrics (http/protobuf) every 0.3 s" \
        in metrics, metrics
    logs = _line(proc, "otlp logs:")
    assert f"pushing GPU events to {receiver.http_endpoint}/v1/logs (http/protobuf)" in logs
    probes = _line(proc, "serving probes on")
    assert f"http://127.0.0.1:{proc.port}/healthz and /readyz; /metrics answers 404" in probes
    assert not any("serving metrics on" in ln for ln in proc.lines), proc.log
    assert proc.get("/metrics")[0] == 404
    receiver.wait_for(timeout=30)


def test_both_exporters_one_line_each(collector, receiver):
    proc = collector("--simulate", "t4", "--exporters", "prometheus,otlp",
                     env={**receiver.env("grpc"), **FAST_EXPORT})
    scrape = _line(proc, "prometheus:")
    assert (f"prometheus: serving metrics on http://127.0.0.1:{proc.port}/metrics "
            "(pulled by scrapers; new values every 0.2 s)") in scrape, scrape
    metrics = _line(proc, "otlp metrics:")
    assert f"pushing to {receiver.grpc_endpoint} (grpc) every 0.3 s" in metrics, metrics
    assert "(grpc)" in _line(proc, "otlp logs:")
    assert not any("serving probes on" in ln for ln in proc.lines), proc.log
    receiver.wait_for(timeout=30)


def test_logs_off_says_so(collector, receiver):
    proc = collector("--simulate", "t4", "--exporters", "otlp",
                     env={**receiver.env("http/protobuf"), **FAST_EXPORT,
                          "OTEL_LOGS_EXPORTER": "none"})
    assert "otlp logs: off (OTEL_LOGS_EXPORTER=none)" in _line(proc, "otlp logs:")
