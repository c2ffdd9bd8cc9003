"""A real Prometheus server scraping otel-gpu in the dcgm profile, answering dashboard queries."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu.export.naming.dcgm import DEFAULT_FIELDS, FIELDS
from otel_gpu.export.naming.dcgm.current import CURRENT_FIELDS, RENAMES, from_old
from testkit.exposition import series
from testkit.kubelet import FakeKubelet, container, devices, pod
from testkit.process import CollectorProcess, serve_args, wait_until
from tests.support.nvml import first_sample_values, profile_uuids
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


# --- dcgm-exporter 4.9 and 4.10 names ------------------------------------------------

FIXTURES = Path(__file__).parents[1] / "export" / "naming" / "fixtures"


def _serve_and_scrape(tmp_path_factory, *args: str):
    """otel-gpu (one sample of h100x8, ``args``) -> Prometheus; yields the server."""
    binary = skip_unless_available()
    proc = CollectorProcess(serve_args("--simulate", "h100x8", *args, interval="1h"))
    try:
        proc.wait_serving()
        wait_until(lambda: "DCGM_FI_" in proc.metrics(), what="the dcgm series")
        server = PrometheusServer([f"127.0.0.1:{proc.port}"], binary=binary,
                                  workdir=tmp_path_factory.mktemp("prometheus"))
        with server:
            server.wait_for_query("up == 1")
            yield server
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def stack_4_10(tmp_path_factory):
    """A counters file in dcgm-exporter 4.10's names."""
    yield from _serve_and_scrape(tmp_path_factory, "--naming", "dcgm",
                                 "-f", str(FIXTURES / "dcgm-4.10-counters.csv"))


@pytest.fixture(scope="module")
def stack_both(tmp_path_factory):
    """The OpenTelemetry names, and a counters file with every rename's old and new name."""
    rows = []
    for new, rename in RENAMES.items():
        rows += [f"{rename.old}, {FIELDS[rename.old].type}, old",
                 f"{new}, {CURRENT_FIELDS[new].type}, new"]
    path = tmp_path_factory.mktemp("counters") / "both-generations.csv"
    path.write_text("\n".join(dict.fromkeys(rows)) + "\n")
    yield from _serve_and_scrape(tmp_path_factory, "--naming", "otel,dcgm", "-f", str(path))


@pytest.mark.parametrize(
    ("name", "key", "scale"),
    [
        ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "temp", 1.0),
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", "power_w", 1.0),
        ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "sm_mhz", 1e6),
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "util", 0.01),
        ("DCGM_FI_DEV_FB_USED_BYTES", "used", 1.0),
    ],
)
def test_a_4_10_counters_file_is_served_in_its_units(stack_4_10, name, key, scale):
    result = stack_4_10.wait_for_query(name, lambda r: len(r) == 8)
    expected = first_sample_values("h100x8")
    for labels, value in result:
        assert value == pytest.approx(expected[labels["UUID"]][key] * scale), (name, labels)
        assert labels["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "550.90.07"
        assert "DCGM_FI_DRIVER_VERSION" not in labels
    assert stack_4_10.query("DCGM_FI_DEV_GPU_TEMP") == []  # the old names are not asked for


def _checkable(name: str) -> bool:
    field = CURRENT_FIELDS[name]
    # GPM values and rates need two samples, the stack takes one; XID codes and the
    # throttle bitmask have no one-to-one rewrite; the simulated H100s have no fans
    return bool(field.promql) and not field.rate and not name.startswith("DCGM_FI_PROF_") \
        and "FAN_SPEED" not in name


def test_both_generations_in_one_file_each_in_its_unit(stack_both):
    checked = 0
    for name, rename in RENAMES.items():
        if not _checkable(name):
            continue
        if not stack_both.query(rename.old):  # not on an H100 (retired pages): neither is
            assert stack_both.query(name) == [], name
            continue
        new = {lab["UUID"]: v for lab, v in stack_both.wait_for_query(name)}
        converted = {lab["UUID"]: v for lab, v in stack_both.wait_for_query(from_old(name))}
        assert len(new) == 8, name
        assert new == pytest.approx(converted), (name, from_old(name))
        checked += 1
    assert checked >= 20


def test_migration_guide_rewrites_give_the_4_9_values(stack_both):
    checked = 0
    for name in CURRENT_FIELDS:
        if not _checkable(name) or not stack_both.query(name):
            continue
        dcgm = {lab["UUID"]: v for lab, v in stack_both.wait_for_query(name)}
        rewrite = {lab["hw_id"]: v
                   for lab, v in stack_both.wait_for_query(CURRENT_FIELDS[name].promql)}
        assert rewrite == pytest.approx(dcgm), (name, CURRENT_FIELDS[name].promql)
        checked += 1
    assert checked >= 20
