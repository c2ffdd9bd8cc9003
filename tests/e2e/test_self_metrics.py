"""The first day's habits from dcgm-exporter and every other exporter, on the real process
over real sockets: the process_* series, ``/health``, dcgm-exporter's variables, and OTLP
sent to the other protocol's port."""

from __future__ import annotations

import gzip
import time
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as read_om
from prometheus_client.parser import text_string_to_metric_families as read_text

from testkit.otlp_receiver import resource_groups
from testkit.process import run_cli, wait_until

FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes",
           "process_virtual_memory_bytes", "process_start_time_seconds", "process_open_fds",
           "process_max_fds")


def _values(text: str, reader=read_text) -> dict[str, float]:
    return {s.name: s.value for f in reader(text) for s in f.samples}


@pytest.mark.parametrize("naming", ["otel", "dcgm", "kubelet"])
def test_every_naming_profiles_body_has_the_process_series(collector, naming):
    started = time.time()
    proc = collector("--simulate", "t4", "--naming", naming)
    values = _values(proc.metrics())
    assert set(PROCESS) <= set(values), naming
    assert values["process_resident_memory_bytes"] > 10 << 20
    assert 0 < values["process_open_fds"] <= values["process_max_fds"]
    assert started - 30 < values["process_start_time_seconds"] <= time.time()
    assert values["process_cpu_seconds_total"] > 0


def test_they_are_read_at_each_scrape_not_per_sample(collector):
    """One sample an hour: the body stays that sample's, the process series move."""
    proc = collector("--simulate", "t4", interval="1h")
    first = _values(proc.metrics())

    def moved():
        for _ in range(20):  # each scrape costs the collector a little CPU
            proc.get("/metrics")
        now = _values(proc.metrics())
        return now if now["process_cpu_seconds_total"] > first["process_cpu_seconds_total"] \
            else None

    later = wait_until(moved, what="process_cpu_seconds_total to grow")
    assert later["otel_gpu_samples_total"] == first["otel_gpu_samples_total"] == 1


def test_openmetrics_and_gzip_answers_carry_them_too(collector):
    proc = collector("--simulate", "t4")
    proc.metrics()
    status, headers, body = proc.get("/metrics", headers={
        "Accept": "application/openmetrics-text;version=1.0.0",
        "Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    families = {f.name: f for f in read_om(text)}  # the reference parser: # EOF last, once
    assert families["process_cpu_seconds"].type == "counter"
    assert families["process_resident_memory_bytes"].unit == "bytes"
    assert "hw_power_watts" in families


def test_health_answers_as_healthz_for_probes_copied_from_dcgm_exporter(collector):
    proc = collector("--simulate", "t4")
    assert proc.get("/health")[::2] == (200, b"ok\n")
    assert proc.get("/healthz")[::2] == (200, b"ok\n")


@pytest.mark.parametrize(("env", "line"), [
    ({"DCGM_EXPORTER_LISTEN": ":9401"},
     "otel-gpu: error: environment variable DCGM_EXPORTER_LISTEN is dcgm-exporter's: otel-gpu "
     "listens with OTEL_GPU_LISTEN=HOST:PORT (did you mean OTEL_GPU_LISTEN=:9401?)"),
    ({"DCGM_EXPORTER_INTERVAL": "30000", "DCGM_EXPORTER_KUBERNETES": "true"},
     "otel-gpu: error: environment variable DCGM_EXPORTER_INTERVAL is dcgm-exporter's: otel-gpu "
     "samples every OTEL_GPU_INTERVAL=DURATION (10s, 500ms), not milliseconds (did you mean "
     "OTEL_GPU_INTERVAL=30s?) (also set: DCGM_EXPORTER_KUBERNETES)"),
])
@pytest.mark.parametrize("command", ["serve", "check"])
def test_dcgm_exporters_variables_stop_the_start_with_one_line(command, env, line):
    code, _, err = run_cli(command, "--simulate", "t4", "--listen", "127.0.0.1:0", env=env,
                           timeout=30)
    assert code == 2 and err.strip().splitlines() == [line], err


def test_a_service_named_dcgm_exporter_is_no_setting(collector):
    """Kubernetes gives each pod of the namespace its Service's address variables."""
    env = {"DCGM_EXPORTER_SERVICE_HOST": "10.0.0.9", "DCGM_EXPORTER_PORT": "tcp://10.0.0.9:9400",
           "DCGM_EXPORTER_SERVICE_PORT": "9400", "DCGM_EXPORTER_LISTEN": " "}
    proc = collector("--simulate", "t4", env=env)
    assert "process_open_fds" in proc.metrics()


def _failure(proc) -> str:
    def found():
        return next((ln for ln in proc.lines if "Failed to export metrics" in ln), None)
    return wait_until(found, timeout=30, what="the export's failure line")


def test_grpc_sent_to_an_otlp_http_receiver_is_one_line_naming_the_fix(collector, receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", **FAST_EXPORT}
    proc = collector("--simulate", "t4", env=env)
    line = _failure(proc)
    assert "gRPC sent to an OTLP/HTTP endpoint: send gRPC to port 4317, or set otlp_protocol " \
           "(OTEL_EXPORTER_OTLP_PROTOCOL) to http/protobuf" in line, proc.log
    assert not any("Transient error" in ln for ln in proc.lines)  # no retry can help


def test_http_sent_to_an_otlp_grpc_receiver_is_one_line_naming_the_fix(collector, receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{receiver.grpc_target}",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", **FAST_EXPORT}
    proc = collector("--simulate", "t4", env=env)
    line = _failure(proc)
    assert "OTLP/HTTP sent to an OTLP/gRPC endpoint: send it to port 4318 (path /v1/metrics), " \
           "or set otlp_protocol (OTEL_EXPORTER_OTLP_PROTOCOL) to grpc (got an HTTP/2 frame" \
           in line, proc.log


def test_otlp_carries_the_semantic_conventions_process_metrics(collector, receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "NODE_NAME": "gpu-node-3",
           **FAST_EXPORT}
    collector("--simulate", "t4", env=env)

    def with_process(req):
        return "process.cpu.time" in req.metric_names()

    (req,) = receiver.wait_for(with_process, timeout=30)
    rows = [r for r in req.rows() if r.metric.startswith("process.")]
    assert {r.metric for r in rows} == {
        "process.cpu.time", "process.memory.usage", "process.memory.virtual",
        "process.unix.file_descriptor.count", "process.uptime"}
    assert sorted(r.attributes["cpu.mode"] for r in rows if r.metric == "process.cpu.time") \
        == ["system", "user"]
    for row in rows:  # the collector's own, under the node's Resource
        assert row.resource.get("service.name") == "otel-gpu"
        assert "k8s.pod.name" not in row.resource
    assert any(g.get("k8s.node.name") == "gpu-node-3" for g in resource_groups(req))
    memory = next(r.value for r in rows if r.metric == "process.memory.usage")
    assert memory > 10 << 20


def test_a_proxy_reading_the_gzip_answer_as_curl_does_gets_all_of_it(collector):
    """One gzip member: readers that stop after the first (some curl builds) miss nothing."""
    import zlib

    proc = collector("--simulate", "t4")
    proc.metrics()
    req = urllib.request.Request(proc.url("/metrics"), headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = inflate.decompress(raw).decode()
    assert inflate.eof and not inflate.unused_data
    assert "hw_power_watts" in text
    assert text.index("# HELP process_cpu_seconds_total") > text.index("hw_power_watts")
