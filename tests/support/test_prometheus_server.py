"""The Prometheus harness against a tiny exposition of the test's own.

The naming tests trust this harness to tell them what a real Prometheus stores
and answers, so it is checked here on a fixed exposition with DCGM-style names:
exporter labels (``pod``, ``namespace``, even ``job``) survive the scrape, a
camelCase label name and a counter without ``_total`` are stored as they are,
rejected PromQL fails loudly, and no Prometheus process outlives its test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.exposition import ExpositionTarget
from tests.support.prometheus_server import (
    PrometheusServer,
    Sample,
    parse_duration,
    skip_unless_available,
)

EXPOSITION = b"""\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pod="train-0",namespace="ml"} 61
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",pod="train-1",namespace="ml"} 55
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA H100 80GB HBM3",pod="train-0"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",modelName="NVIDIA A100-SXM4-40GB",pod="train-1"} 13
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 12345
# HELP naming_probe_info Carries job and instance labels of its own.
# TYPE naming_probe_info gauge
naming_probe_info{job="dcgm-exporter",instance="node-a"} 1
"""


@pytest.fixture(scope="module")
def target() -> Iterator[ExpositionTarget]:
    served = ExpositionTarget(EXPOSITION)
    yield served
    served.close()


@pytest.fixture(scope="module")
def prom(target: ExpositionTarget, tmp_path_factory: pytest.TempPathFactory):
    """One server for the query tests: its first scrape costs about 5 s of start-up."""
    binary = skip_unless_available()
    workdir = tmp_path_factory.mktemp("prometheus")
    with PrometheusServer([target.address], workdir=workdir, binary=binary) as server:
        yield server


def _by_labels(result: list[Sample]) -> list[tuple[list[tuple[str, str]], float]]:
    return sorted((sorted(labels.items()), value) for labels, value in result)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ----------------------------------------------------------------------- ingestion


def test_avg_by_gpu_and_pod_keeps_the_pod_label(prom: PrometheusServer) -> None:
    result = prom.wait_for_query("avg by (gpu, pod) (DCGM_FI_DEV_GPU_TEMP)", lambda r: len(r) == 2)
    assert _by_labels(result) == [
        ([("gpu", "0"), ("pod", "train-0")], 61.0),
        ([("gpu", "1"), ("pod", "train-1")], 55.0),
    ]


def test_exporter_labels_are_stored_without_exported_prefix(prom: PrometheusServer) -> None:
    raw = prom.wait_for_query('DCGM_FI_DEV_GPU_TEMP{gpu="0"}')
    assert len(raw) == 1
    labels, value = raw[0]
    assert value == 61.0
    assert labels["pod"] == "train-0" and labels["namespace"] == "ml" and labels["UUID"] == "GPU-a"
    assert not [name for name in labels if name.startswith("exported_")], labels
    # honor_labels: even the exposition's own job/instance win over the scrape's.
    probe = prom.wait_for_query("naming_probe_info")
    assert [labels for labels, _ in probe] == [
        {"__name__": "naming_probe_info", "job": "dcgm-exporter", "instance": "node-a"}
    ]


def test_camel_case_label_name_is_queryable(prom: PrometheusServer) -> None:
    result = prom.wait_for_query('DCGM_FI_DEV_GPU_UTIL{modelName="NVIDIA H100 80GB HBM3"}')
    assert [(labels["gpu"], labels["modelName"], value) for labels, value in result] == [
        ("0", "NVIDIA H100 80GB HBM3", 87.0)
    ]
    by_model = prom.query("sum by (modelName) (DCGM_FI_DEV_GPU_UTIL)")
    assert _by_labels(by_model) == [
        ([("modelName", "NVIDIA A100-SXM4-40GB")], 13.0),
        ([("modelName", "NVIDIA H100 80GB HBM3")], 87.0),
    ]


def test_counter_without_total_keeps_its_exact_name(prom: PrometheusServer) -> None:
    result = prom.wait_for_query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert [(labels["__name__"], labels["gpu"], value) for labels, value in result] == [
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", 12345.0)
    ]
    assert prom.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total") == []


def test_scalar_result_comes_back_as_one_unlabelled_sample(prom: PrometheusServer) -> None:
    assert prom.query("scalar(vector(2.5))") == [({}, 2.5)]


# ------------------------------------------------------------------------ failures


def test_bad_promql_raises_with_the_server_message(prom: PrometheusServer) -> None:
    with pytest.raises(AssertionError, match=r"bad_data: .*parse error.*unclosed left paren"):
        prom.query("avg by (gpu) (DCGM_FI_DEV_GPU_TEMP")
    # A rejected query fails at once instead of being polled until the deadline.
    with pytest.raises(AssertionError, match="parse error"):
        prom.wait_for_query("sum(", timeout=60.0)


def test_wait_for_query_timeout_shows_last_result_and_target_health(
    prom: PrometheusServer, target: ExpositionTarget
) -> None:
    prom.wait_for_query("up == 1")  # the target has been scraped by now
    with pytest.raises(AssertionError) as failure:
        prom.wait_for_query("DCGM_FI_DEV_GPU_TEMP", lambda r: len(r) == 3, timeout=0.3)
    message = str(failure.value)
    last = message.split("last result: ", 1)[1].split("\ntargets: ")[0]
    assert "'pod': 'train-0'" in last and "61.0" in last and "55.0" in last
    assert f"http://{target.address}/metrics health=up lastError=''" in message


def test_targets_health_reports_the_scrape(
    prom: PrometheusServer, target: ExpositionTarget
) -> None:
    prom.wait_for_query("up == 1")
    targets = prom.targets_health()
    assert [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets] == [
        (f"http://{target.address}/metrics", "up", "")
    ]
    assert target.accept_headers, "Prometheus never scraped the target"


def test_down_target_health_carries_the_scrape_error(tmp_path: Path) -> None:
    binary = skip_unless_available()
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    with PrometheusServer([dead], workdir=tmp_path, binary=binary) as server:
        assert [value for _, value in server.wait_for_query("up")] == [0.0]
        with pytest.raises(AssertionError) as failure:
            server.wait_for_query("up == 1", timeout=0.2)
    message = str(failure.value)
    assert "last result: []" in message
    assert f"http://{dead}/metrics health=down lastError=" in message
    assert "connection refused" in message


# ----------------------------------------------------------------------- lifecycle


def test_stop_leaves_no_process_and_is_idempotent(target: ExpositionTarget, tmp_path: Path) -> None:
    binary = skip_unless_available()
    server = PrometheusServer([target.address], workdir=tmp_path, binary=binary)
    with server:
        pid = server.pid
        assert pid is not None and _alive(pid)
        url = server.url
        with urllib.request.urlopen(url + "/-/ready", timeout=5) as resp:
            assert resp.status == 200
    assert server.proc is not None and server.proc.returncode == 0  # SIGTERM: clean exit
    assert not _alive(pid)
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/-/ready", timeout=5)
    assert server.stop() == 0  # a second stop is harmless


def test_process_is_stopped_when_the_test_body_raises(
    target: ExpositionTarget, tmp_path: Path
) -> None:
    binary = skip_unless_available()
    server = PrometheusServer([target.address], workdir=tmp_path, binary=binary)
    with pytest.raises(RuntimeError, match="test body failed"), server:
        pid = server.pid
        raise RuntimeError("test body failed")
    assert pid is not None and not _alive(pid)


def test_early_exit_fails_start_with_the_log_tail(target: ExpositionTarget, tmp_path: Path) -> None:
    binary = skip_unless_available()
    server = PrometheusServer(
        [target.address], workdir=tmp_path, binary=binary, extra_args=["--no-such-flag"]
    )
    with pytest.raises(AssertionError, match=r"(?s)exited with code \d+.*no-such-flag"):
        server.start()
    assert server.proc is not None and server.proc.returncode is not None


# --------------------------------------------------------------- configuration


def test_config_is_minimal_and_valid(tmp_path: Path) -> None:
    server = PrometheusServer(["127.0.0.1:9400"], scrape_interval="2s", workdir=tmp_path)
    config = server.config()
    assert set(config) == {"global", "scrape_configs"}  # no remote_write, alerting, rules
    assert config["global"]["scrape_interval"] == "2s"
    assert parse_duration(config["global"]["scrape_timeout"]) < 2000
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9400"]}]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    import yaml

    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_scrape_timeout_above_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exceeds"):
        PrometheusServer(
            ["127.0.0.1:1"], scrape_interval="1s", scrape_timeout="2s", workdir=tmp_path
        )


@pytest.mark.parametrize(
    ("text", "ms"), [("1s", 1000), ("500ms", 500), ("1m30s", 90_000), ("2h", 7_200_000)]
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "1", "1x", "s", "0s", "1.5s", "1s2m3"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_missing_binary_skips_locally_and_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not found on PATH"):
        skip_unless_available("otel-gpu-no-such-prometheus")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run"):
        skip_unless_available("otel-gpu-no-such-prometheus")
