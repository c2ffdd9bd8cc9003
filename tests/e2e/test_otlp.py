"""The real otel-gpu process pushing OTLP to a real receiver, with a fake kubelet."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import grpc
import pytest

from testkit.exposition import series
from testkit.kubelet import container, devices, pod
from testkit.otlp_receiver import OtlpReceiver, resource_groups
from testkit.process import run_cli, wait_until
from tests.support.certs import make_certs
from tests.support.nvml import profile_uuids

H100 = profile_uuids("h100x8")
POD_KEYS = ("k8s.pod.name", "k8s.namespace.name", "k8s.container.name")
FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}


@pytest.fixture
def kubelet(kubelet):
    """The shared fake kubelet, with four pods on the first four GPUs."""
    kubelet.set_pods([
        pod(f"train-{i}", container("main", devices("nvidia.com/gpu", H100[i], numa=0)),
            namespace="ml")
        for i in range(4)
    ])
    return kubelet


def _pod_groups(req) -> list[dict]:
    return [g for g in resource_groups(req) if "k8s.pod.name" in g]


def _with_pods(count: int):
    return lambda req: len(_pod_groups(req)) == count


def _rows_by_id(req, metric: str) -> dict[str, float]:
    return {r.attributes["hw.id"]: r.value for r in req.rows() if r.metric == metric}


def test_one_resource_per_pod_plus_the_node(collector, receiver, kubelet):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "NODE_NAME": "gpu-node-7",
           **FAST_EXPORT}
    proc = collector("--simulate", "h100x8", "--kubelet-socket", kubelet.socket_path,
                     "--kubelet-interval", "0.1", env=env, interval="1h")
    (req,) = receiver.wait_for(_with_pods(4), timeout=30)
    assert req.transport == "http" and req.content_type == "application/x-protobuf"
    groups = resource_groups(req)
    assert len(groups) == 5
    node = [g for g in groups if "k8s.pod.name" not in g]
    assert len(node) == 1
    for group in groups:
        assert group["k8s.node.name"] == "gpu-node-7"
        assert group["service.name"] == "otel-gpu" and group["host.name"]
    pods = sorted((g["k8s.pod.name"], g["k8s.namespace.name"], g["k8s.container.name"])
                  for g in _pod_groups(req))
    assert pods == [(f"train-{i}", "ml", "main") for i in range(4)]
    rows = req.rows()
    # each pod's GPU series sit under its Resource, with the pod taken off the points
    for row in rows:
        assert not set(POD_KEYS) & set(row.attributes), row
        if row.metric == "hw.power":
            index = H100.index(row.attributes["hw.id"])
            expected = f"train-{index}" if index < 4 else None
            assert row.resource.get("k8s.pod.name") == expected
    assert {r.metric for r in rows if "k8s.pod.name" not in r.resource} >= {
        "otel_gpu.samples", "hw.power"}
    # the info series describe the hardware, not a pod: all under the node's Resource;
    # each series also carries every device attribute (the default)
    info = {r.attributes["hw.id"]: r for r in rows if r.metric == "nvidia.gpu.info"}
    assert set(info) == set(H100)
    for row in info.values():
        assert "k8s.pod.name" not in row.resource and row.value == 1
        assert row.attributes["hw.model"] == "NVIDIA H100 80GB HBM3"
        assert {"hw.serial_number", "nvidia.gpu.pci_bus_id", "hw.driver_version"} <= set(
            row.attributes)
    power = [r for r in rows if r.metric == "hw.power"]
    assert power and all(r.attributes == info[r.attributes["hw.id"]].attributes
                         for r in power)
    # names, units, kinds, temporality
    kinds = {r.metric: (r.kind, r.monotonic, r.temporality, r.unit) for r in rows}
    assert kinds["hw.energy"] == ("sum", True, "CUMULATIVE", "J")
    assert kinds["hw.gpu.memory.usage"] == ("sum", False, "CUMULATIVE", "By")
    assert kinds["hw.power"][0::3] == ("gauge", "W")
    assert kinds["hw.temperature"][0::3] == ("gauge", "Cel")
    # the same values as the Prometheus endpoint (one sample only: interval 1h)
    text = proc.metrics()
    for otlp_name, prom_name in (("hw.gpu.memory.usage", "hw_gpu_memory_usage_bytes"),
                                 ("hw.power", "hw_power_watts"),
                                 ("hw.energy", "hw_energy_joules_total")):
        prom = {lab["hw_id"]: v for lab, v in series(text, prom_name)}
        assert _rows_by_id(req, otlp_name) == pytest.approx(prom), otlp_name
        assert len(prom) == 8


def test_attributes_mode_keeps_one_resource(collector, receiver, kubelet):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, **FAST_EXPORT}
    collector("--simulate", "h100x8", "--kubelet-socket", kubelet.socket_path,
              "--kubelet-interval", "0.1", "--pod-identity", "attributes", env=env)

    def pods_on_points(req):
        return any(r.attributes.get("k8s.pod.name") == "train-3" for r in req.rows())

    (req,) = receiver.wait_for(pods_on_points, timeout=30)
    assert len(resource_groups(req)) == 1


def test_http_gzip_headers_from_a_file_and_delta(collector, receiver, tmp_path):
    secret = tmp_path / "headers"
    secret.write_text("authorization=Bearer s3cr3t-t0ken\n")
    env = {**receiver.env("http/protobuf"), "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a", **FAST_EXPORT}
    proc = collector("--simulate", "t4", "--otlp-headers-file", str(secret),
                     "--otlp-temporality", "delta", env=env)
    (req,) = receiver.wait_for(lambda r: "hw.energy" in r.metric_names(), timeout=30)
    assert req.gzipped
    assert req.headers["authorization"] == "Bearer s3cr3t-t0ken"
    assert req.headers["x-tenant"] == "team-a"
    temporality = {r.metric: r.temporality for r in req.rows()}
    assert temporality["hw.energy"] == "DELTA"
    assert temporality["hw.gpu.memory.usage"] == "CUMULATIVE"  # up-down counters stay
    assert "s3cr3t" not in proc.log


def test_grpc_with_tls(collector, tmp_path):
    certs = make_certs(tmp_path)
    with OtlpReceiver.with_tls(certs, mtls=True) as rx:
        env = {**rx.env("grpc"), **FAST_EXPORT}
        collector("--simulate", "a100-mig", env=env)
        (req,) = rx.wait_for(lambda r: "hw.gpu.memory.usage" in r.metric_names(), timeout=30)
        assert req.transport == "grpc"
        assert req.client_cert_cn == certs.client_common_name
        migs = {r.attributes["hw.id"] for r in req.rows()
                if r.metric == "hw.gpu.memory.usage" and "hw.parent" in r.attributes}
        assert len(migs) == 4


def test_http_with_tls_and_our_settings_beat_requests_ca_bundle(collector, tmp_path):
    certs = make_certs(tmp_path)
    with OtlpReceiver.with_tls(certs, mtls=True, grpc=False) as rx:
        env = {"REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
               "CURL_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt", **FAST_EXPORT}
        collector("--simulate", "t4", "--otlp-endpoint", rx.http_endpoint,
                  "--otlp-certificate", str(certs.ca_cert),
                  "--otlp-client-certificate", str(certs.client_cert),
                  "--otlp-client-key", str(certs.client_key), env=env)
        (req,) = rx.wait_for(timeout=30)
        assert req.transport == "http" and req.client_cert_cn == certs.client_common_name


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_partial_success_is_logged(collector, receiver, protocol):
    receiver.partial_success(3, "hw.power: unit not allowed here")
    proc = collector("--simulate", "t4", env={**receiver.env(protocol), **FAST_EXPORT})
    receiver.wait_for(timeout=30)
    lines = wait_until(lambda: [line for line in proc.log.splitlines() if "rejected" in line],
                       what="the partial-success log line")
    assert "3 data point(s) rejected: hw.power: unit not allowed here" in lines[0], lines


def test_retries_when_the_backend_answers_errors(collector, receiver):
    receiver.fail_next(2, grpc.StatusCode.UNAVAILABLE, retry_after=0.1)
    proc = collector("--simulate", "t4", env={**receiver.env("grpc"), **FAST_EXPORT})
    receiver.wait_for(timeout=30)
    failed = [a for a in receiver.attempts if not a.accepted]
    assert len(failed) == 2
    assert proc.get("/metrics")[0] == 200


def test_final_export_on_sigterm(collector, receiver):
    env = {**receiver.env("http/protobuf"), "OTEL_METRIC_EXPORT_INTERVAL": "3600000"}
    proc = collector("--simulate", "h100x8", env=env)
    proc.wait_sample(1)
    assert receiver.requests == []  # nothing due before an hour
    code, elapsed = proc.stop()
    assert code == 0 and elapsed < 5.0, proc.log
    (req,) = receiver.wait_for(timeout=1)
    assert "hw.power" in req.metric_names()


def test_otlp_only_still_answers_health(collector, receiver):
    proc = collector("--simulate", "t4", "--exporters", "otlp",
                     env={**receiver.env("grpc"), **FAST_EXPORT})
    receiver.wait_for(timeout=30)
    assert proc.get("/metrics")[0] == 404
    wait_until(lambda: proc.get("/readyz")[0] == 200, what="readiness")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


LOG_WINDOW_S = 0.5
_FAILURES = ("Transient error", "Failed to export")



@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_backend_down_for_many_exports(collector, receiver):
    """An outage of hundreds of failed exports and many log windows, in seconds.

    Exports run every 50 ms and the window in which a library message is let
    through once is cut to 0.5 s by the internal _OTEL_GPU_LIBRARY_LOG_WINDOW
    variable (a minute otherwise), so the limit is crossed many times over.
    """
    env = {**receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "50",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "1", "_OTEL_GPU_LIBRARY_LOG_WINDOW": str(LOG_WINDOW_S)}
    proc = collector("--simulate", "h100x8", env=env, interval="0.2")
    batch_bytes = receiver.wait_for(timeout=30)[0].request.ByteSize()
    scrapes = 0

    def failed_attempts() -> int:
        return sum(not attempt.accepted for attempt in receiver.attempts)

    def scrape_until(done) -> None:
        nonlocal scrapes
        deadline = time.monotonic() + 30
        while not done():
            assert proc.get("/metrics", timeout=5)[0] == 200
            scrapes += 1
            assert time.monotonic() < deadline, "exports stopped failing:\n" + proc.log
            time.sleep(0.01)  # scrape pacing, leaving the collector the CPU to export

    # down, answering UNAVAILABLE with a 5 ms retry delay: each export makes six attempts,
    # logging five "Transient error" warnings, then "Failed to export"
    down_since, first_line = time.monotonic(), len(proc.lines)
    receiver.fail_next(100_000, grpc.StatusCode.UNAVAILABLE, retry_after=0.005)
    scrape_until(lambda: failed_attempts() >= 30)  # past the first failures' allocations
    baseline, counted_from = _rss_kib(proc.proc.pid), failed_attempts()
    scrape_until(lambda: failed_attempts() >= counted_from + 200)
    attempts = failed_attempts() - counted_from
    # then gone altogether: connection refused, with the SDK's own backoff
    receiver.stop()
    receiver.reset_answers()
    refused_until = time.monotonic() + 1.5
    scrape_until(lambda: time.monotonic() > refused_until)
    grown_kib = _rss_kib(proc.proc.pid) - baseline
    lines = [ln for ln in proc.lines[first_line:] if any(f in ln for f in _FAILURES)]
    windows = (time.monotonic() - down_since) / LOG_WINDOW_S  # after the lines were taken

    # memory: keeping each failed request would have taken attempts * batch_bytes
    bound_kib = 16 * 1024
    assert attempts * batch_bytes > bound_kib * 1024, "too few failures to tell a leak"
    assert grown_kib < bound_kib, f"memory grew {grown_kib} KiB over {attempts} failed attempts"
    assert scrapes > 100
    # each message at most once per window (plus the first), and that limit did bite:
    # without it, far more lines than it allows would have been written
    for failure in _FAILURES:
        logged = sum(failure in ln for ln in lines)
        assert 0 < logged <= windows + 1, (
            f"{failure!r} logged {logged} times in {windows:.1f} windows:\n" + proc.log
        )
    # every failed attempt logs a warning without the limit: far more than it lets through
    # (counted from the receiver, not from the log's own "suppressed" notes, whose last
    # window is still open when the lines are taken)
    assert failed_attempts() > len(_FAILURES) * (windows + 1) >= len(lines), proc.log
    # back up on the same port: delivery resumes
    receiver.clear()
    receiver.start()
    req = receiver.wait_for(timeout=30)[0]
    assert "hw.power" in req.metric_names()


def test_sighup_stops_gracefully_with_a_final_export(collector, receiver):
    env = {**receiver.env("http/protobuf"), "OTEL_METRIC_EXPORT_INTERVAL": "3600000"}
    proc = collector("--simulate", "t4", env=env)
    proc.wait_sample(1)
    assert receiver.requests == []  # nothing due before an hour
    code, elapsed = proc.stop(signal.SIGHUP)
    assert code == 0 and elapsed < 5.0, proc.log
    assert "received SIGHUP, stopping" in proc.log
    (req,) = receiver.wait_for(timeout=1)
    assert "hw.power" in req.metric_names()


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_a_backend_that_is_down_still_lets_the_collector_stop_in_time_with_one_line(collector):
    """Once the stop ran out of time and the SDK's exit hook said "shutdown can only be
    called once": the final export retried a refused connection past every deadline."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: every connection is refused
    for protocol in ("grpc", "http/protobuf"):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_METRIC_EXPORT_INTERVAL": "200"}
        proc = collector("--simulate", "t4", env=env)
        proc.wait_sample(1)
        wait_until(lambda p=proc: "127.0.0.1" in p.log and "export" in p.log.lower(),
                   what="a failed export")  # an export is retrying when the stop comes
        code, elapsed = proc.stop(signal.SIGTERM)
        assert code == 0 and elapsed < 5.0, proc.log
        stopping = proc.log.split("received SIGTERM, stopping", 1)[1]
        assert "shutdown can only be called once" not in stopping, stopping
        assert "did not finish in time" not in stopping and "Traceback" not in stopping
        assert stopping.count("the final OTLP export did not finish") <= 1, stopping


# --- the OTEL_* variables the SDK reads by itself ---------------------------------------------

_STOPS = [
    *[("OTEL_METRIC_EXPORT_INTERVAL", v) for v in ("-5", "0", "nan", "inf", "garbage", "1e308")],
    *[(var, v) for var in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT")
      for v in ("-5", "0", "nan", "inf", "1e308")],
]


# `check` reads the variables as `serve` does and stops before serving. The full suite runs
# every value through both; the quick loop each variable's bounds (-5, 1e308) through `check`.
@pytest.mark.parametrize("command", [pytest.param("serve", marks=pytest.mark.slow), "check"])
@pytest.mark.parametrize(("variable", "value"), [
    pytest.param(var, v, marks=[] if v in ("-5", "1e308") else [pytest.mark.slow])
    for var, v in _STOPS
])
def test_a_bad_sdk_variable_that_stands_for_a_setting_exits_2_naming_it(
        variable, value, command):
    """Once exit 1 with the SDK's traceback (-5, 0), or a start that never pushed."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", variable: value}
    code, out, err = run_cli(command, "--simulate", "t4", "--listen", "127.0.0.1:0",
                             env=env, timeout=30)
    assert code == 2, (command, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"otel-gpu: error: {variable}: "), err
    assert "Traceback" not in err


_IGNORED = [
    *[(var, v) for var in ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT")
      for v in ("-1", "nan", "garbage")],
    ("OTEL_METRICS_EXEMPLAR_FILTER", "garbage"),
    ("OTEL_BLRP_EXPORT_TIMEOUT", "garbage"),
    ("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "garbage"),
]


@pytest.mark.parametrize(("variable", "value"), _IGNORED)
def test_a_bad_sdk_variable_the_spec_ignores_is_one_warning_and_the_default(
        collector, receiver, variable, value):
    """Once exit 1 with a traceback (the limits, the exemplar filter) or a traceback in the
    log (the logs' batch timeout, the resource detectors)."""
    env = {**receiver.env("http/protobuf"), **FAST_EXPORT, variable: value}
    proc = collector("--simulate", "t4", env=env)
    receiver.wait_for(timeout=30)  # pushing as it would without the variable
    wait_until(lambda: variable in proc.log, what="the warning")
    assert proc.get("/metrics")[0] == 200
    named = [line for line in proc.log.splitlines() if variable in line]
    assert len(named) == 1 and "ignored, using the default" in named[0], proc.log
    assert "Traceback" not in proc.log


def test_check_names_an_ignored_sdk_variable():
    code, out, err = run_cli("check", "--simulate", "t4",
                             env={"OTEL_METRICS_EXEMPLAR_FILTER": "garbage"}, timeout=30)
    assert code == 0, err
    assert "OTEL_METRICS_EXEMPLAR_FILTER" in err and "Traceback" not in err
