"""A real Prometheus server scraping otel-gpu in the dcgm profile, answering dashboard queries."""

from __future__ import annotations

import pytest

from otel_gpu.export.naming.dcgm import DEFAULT_FIELDS, FIELDS
from tests.support.exposition import series
from tests.support.kubelet import FakeKubelet, container, devices, pod
from tests.support.nvml import first_sample_values, profile_uuids
from tests.support.process import CollectorProcess, serve_args, wait_until
from tests.support.prometheus_server import PrometheusServer, skip_unless_available

H100 = profile_uuids("h100x8")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """fake kubelet -> otel-gpu (otel + dcgm names, one sample) -> Prometheus."""
    binary = skip_unless_available()
    kubelet = FakeKubelet()
    kubelet.set_pods([
        pod(f"train-{i}", container("main", devices("nvidia.com/gpu", H100[i])), namespace="ml")
        for i in range(4)
    ])
    kubelet.start()
    proc = CollectorProcess(serve_args(
        "--simulate", "h100x8", "--naming", "otel,dcgm", "--kubelet-socket", kubelet.socket_path,
        "--kubelet-interval", "0.1", interval="1h",
    ))
    try:
        proc.wait_serving()
        wait_until(lambda: series(proc.metrics(), "DCGM_FI_DEV_GPU_TEMP", pod="train-3"),
                   what="pod labels on the dcgm series")
        server = PrometheusServer([f"127.0.0.1:{proc.port}"], binary=binary,
                                  workdir=tmp_path_factory.mktemp("prometheus"))
        with server:
            server.wait_for_query("up == 1")
            yield server
    finally:
        proc.stop()
        kubelet.close()


def _by_gpu(result) -> dict[str, tuple[str | None, float]]:
    return {labels["gpu"]: (labels.get("pod"), value) for labels, value in result}


@pytest.mark.parametrize(
    ("query", "key", "scale"),
    [
        ("avg by (gpu, pod) (DCGM_FI_DEV_GPU_TEMP)", "temp", 1.0),
        ("avg by (gpu, pod) (DCGM_FI_DEV_POWER_USAGE)", "power_w", 1.0),
        ("avg by (gpu, pod) (DCGM_FI_DEV_SM_CLOCK)", "sm_mhz", 1.0),
        ("avg by (gpu, pod) (DCGM_FI_DEV_GPU_UTIL)", "util", 1.0),
        ("avg by (gpu, pod) (DCGM_FI_DEV_FB_USED)", "used", 1 / 2**20),
    ],
)
def test_dashboard_queries_answer_the_scenarios_values(stack, query, key, scale):
    result = stack.wait_for_query(query, lambda r: len(r) == 8)
    got = _by_gpu(result)
    expected = first_sample_values("h100x8")
    for index, uuid in enumerate(H100):
        pod_name, value = got[str(index)]
        assert pod_name == (f"train-{index}" if index < 4 else None), (query, index)
        assert value == pytest.approx(expected[uuid][key] * scale), (query, index)


def test_migration_guide_rewrites_give_the_dcgm_values(stack):
    checked = 0
    for name in DEFAULT_FIELDS:
        field = FIELDS[name]
        if not field.promql:
            continue  # no one-to-one rewrite (XID codes, throttle reasons)
        if name.startswith("DCGM_FI_PROF_"):
            continue  # GPM values need two samples; this stack takes one
        if name == "DCGM_FI_DEV_FAN_SPEED":
            continue  # the simulated H100s are passively cooled: no series to compare
        dcgm = {lab["UUID"]: v for lab, v in stack.wait_for_query(name)}
        rewrite = {lab["hw_id"]: v for lab, v in stack.wait_for_query(field.promql)}
        assert rewrite == pytest.approx(dcgm), (name, field.promql)
        checked += 1
    assert checked >= 15
