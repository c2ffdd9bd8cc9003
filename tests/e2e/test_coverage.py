"""Every value NVML has, end to end: the real process in simulation, read over /metrics.

The expected numbers are the built-in profiles' first sample, worked out by hand from
the YAML (``k`` is a GPU's position in its ``count`` entry), so a unit, scope or summing
mistake shows as a wrong number, not only as a missing series.
"""

from __future__ import annotations

import pytest

from testkit.exposition import parse_samples, series
from testkit.process import CollectorProcess, serve_args

MHZ, KIB = 1e6, 1024.0


def _by_gpu(text: str, name: str, **labels: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for lab, value in series(text, name, **labels):
        index = int(lab["nvidia_gpu_index"])
        assert index not in out, (name, labels, lab)  # one series per GPU for these labels
        out[index] = value
    return out


def _per_group(first: list[float], second: list[float]) -> dict[int, float]:
    """GPUs 0-3 from the profile's first entry, 4-7 from its second."""
    return dict(enumerate(first + second))


def _first_sample(profile: str):
    """The /metrics body after the first sample of ``--simulate profile``."""
    proc = CollectorProcess(serve_args("--simulate", profile, interval="1h"))
    try:
        proc.wait_serving()
        yield proc.wait_sample(1)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def h100():
    yield from _first_sample("h100x8")


@pytest.fixture(scope="module")
def t4():
    yield from _first_sample("t4")


K = range(4)


def test_h100_nvlink_traffic_is_all_18_links(h100):
    # link i of GPU k sends 100M + i*1M + k*5M KiB (120M + ... on GPUs 4-7): the sum over
    # i = 0..17 is 18*100M + 153M + k*90M; link 0 alone would be 100M + k*5M
    tx = _by_gpu(h100, "nvidia_gpu_nvlink_io_bytes_total", network_io_direction="transmit")
    rx = _by_gpu(h100, "nvidia_gpu_nvlink_io_bytes_total", network_io_direction="receive")
    assert tx == _per_group([(1_953_000_000 + 90_000_000 * k) * KIB for k in K],
                            [(2_313_000_000 + 90_000_000 * k) * KIB for k in K])
    assert rx == _per_group([(2_043_000_000 + 90_000_000 * k) * KIB for k in K],
                            [(2_403_000_000 + 90_000_000 * k) * KIB for k in K])


def test_h100_nvlink_health(h100):
    assert _by_gpu(h100, "nvidia_gpu_nvlink_links") == dict.fromkeys(range(8), 18.0)
    errors = {kind: _by_gpu(h100, "nvidia_gpu_nvlink_errors_total", error_type=kind)
              for kind in ("crc_flit", "crc_data", "replay", "recovery")}
    assert errors["crc_flit"] == _per_group([4.0 + k for k in K], [4.0 + k for k in K])
    assert errors["crc_data"] == dict.fromkeys(range(8), 1.0)
    assert errors["replay"] == dict.fromkeys(range(8), 7.0)
    assert errors["recovery"] == _per_group([float(k) for k in K], [float(k) for k in K])


def test_h100_power_limits(h100):
    def limit(kind):
        return _by_gpu(h100, "nvidia_gpu_power_limit_watts", nvidia_gpu_power_limit_type=kind)

    assert limit("current") == _per_group([700.0] * 4, [650.0] * 4)
    assert limit("enforced") == _per_group([700.0] * 4, [640.0] * 4)
    assert limit("default") == dict.fromkeys(range(8), 700.0)
    assert limit("min") == dict.fromkeys(range(8), 200.0)
    assert limit("max") == dict.fromkeys(range(8), 700.0)


def test_h100_clocks_and_performance_state(h100):
    assert _by_gpu(h100, "nvidia_gpu_performance_state") == dict.fromkeys(range(8), 0.0)
    video = _by_gpu(h100, "nvidia_gpu_clock_frequency_hertz", nvidia_gpu_clock_domain="video")
    assert video == _per_group([(1530 + 15 * k) * MHZ for k in K],
                               [(1590 + 15 * k) * MHZ for k in K])
    for domain, mhz in (("graphics", 1980), ("sm", 1980), ("memory", 2619), ("video", 1755)):
        assert _by_gpu(h100, "nvidia_gpu_clock_max_frequency_hertz",
                       nvidia_gpu_clock_domain=domain) == dict.fromkeys(range(8), mhz * MHZ)


def test_h100_pcie_link(h100):
    for name, value in (("generation", 5.0), ("max_generation", 5.0), ("width", 16.0),
                        ("max_width", 16.0)):
        assert _by_gpu(h100, f"nvidia_gpu_pcie_link_{name}") == dict.fromkeys(range(8), value)
    # the byte counters are there: no sampled throughput, hw.gpu.io instead
    assert not series(h100, "nvidia_gpu_pcie_sampled_throughput_bytes_per_second")
    assert len(series(h100, "hw_gpu_io_bytes_total")) == 16


def test_h100_throttle_time(h100):
    def seconds(reason):
        return _by_gpu(h100, "nvidia_gpu_clock_throttle_time_seconds_total",
                       nvidia_gpu_throttle_reason=reason)

    assert seconds("power") == pytest.approx(_per_group([1.5 + 0.25 * k for k in K],
                                                        [2.5 + 0.25 * k for k in K]))
    assert seconds("thermal") == pytest.approx(_per_group([0.0] * 4,
                                                          [0.25 + 0.125 * k for k in K]))
    assert seconds("low_utilization") == pytest.approx(_per_group([40.0 + k for k in K],
                                                                  [20.0 + k for k in K]))
    for reason in ("sync_boost", "board_limit", "reliability"):
        assert seconds(reason) == dict.fromkeys(range(8), 0.0)


def test_h100_memory_health(h100):
    def banks(bucket):
        return _by_gpu(h100, "nvidia_gpu_memory_row_remap_banks",
                       nvidia_gpu_row_remap_availability=bucket)

    assert banks("max") == _per_group([2559.0] * 4, [2557.0] * 4)
    assert banks("high") == _per_group([1.0] * 4, [2.0] * 4)
    assert banks("partial") == _per_group([0.0] * 4, [1.0] * 4)
    assert banks("none") == dict.fromkeys(range(8), 0.0)
    assert not series(h100, "nvidia_gpu_memory_retired_pages_total")  # H100 remaps rows

    def ecc(kind, counter):
        return _by_gpu(h100, "nvidia_gpu_ecc_errors_total", error_type=kind,
                       nvidia_gpu_ecc_counter_type=counter)

    assert ecc("corrected", "aggregate") == _per_group([12.0 + 3 * k for k in K],
                                                       [24.0 + 3 * k for k in K])
    assert ecc("uncorrected", "aggregate") == _per_group([0.0] * 4, [float(k) for k in K])
    assert ecc("corrected", "volatile") == _per_group([float(k) for k in K],
                                                      [4.0 + k for k in K])
    volatile = {int(lab["nvidia_gpu_index"]): v
                for lab, v in series(h100, "hw_errors_total", error_type="corrected")}
    assert volatile == ecc("corrected", "volatile")  # hw.errors: the same, as before


def test_t4_has_no_nvlink_and_its_pcie_traffic_from_the_fallback(t4):
    assert not [name for name, _, _ in parse_samples(t4) if "nvlink" in name]
    assert not series(t4, "hw_gpu_io_bytes_total")
    tx = _by_gpu(t4, "nvidia_gpu_pcie_sampled_throughput_bytes_per_second",
                 network_io_direction="transmit")
    rx = _by_gpu(t4, "nvidia_gpu_pcie_sampled_throughput_bytes_per_second",
                 network_io_direction="receive")
    assert tx == {0: 1200 * KIB, 1: 4600 * KIB}
    assert rx == {0: 45000 * KIB, 1: 60500 * KIB}
    assert _by_gpu(t4, "nvidia_gpu_pcie_link_generation") == {0: 3.0, 1: 3.0}


def test_t4_retired_pages_limits_and_throttle_time(t4):
    def pages(cause):
        return _by_gpu(t4, "nvidia_gpu_memory_retired_pages_total",
                       nvidia_gpu_page_retirement_cause=cause)

    assert pages("multiple_single_bit_ecc") == {0: 1.0, 1: 2.0}
    assert pages("double_bit_ecc") == {0: 0.0, 1: 1.0}
    assert _by_gpu(t4, "nvidia_gpu_memory_page_retirement_pending") == {0: 0.0, 1: 0.0}
    assert not series(t4, "nvidia_gpu_memory_row_remap_banks")
    assert _by_gpu(t4, "nvidia_gpu_performance_state") == {0: 2.0, 1: 8.0}
    assert _by_gpu(t4, "nvidia_gpu_power_limit_watts",
                   nvidia_gpu_power_limit_type="min") == {0: 60.0, 1: 60.0}
    assert _by_gpu(t4, "nvidia_gpu_clock_throttle_time_seconds_total",
                   nvidia_gpu_throttle_reason="power") == pytest.approx({0: 0.9, 1: 1.5})
    assert _by_gpu(t4, "nvidia_gpu_clock_throttle_time_seconds_total",
                   nvidia_gpu_throttle_reason="thermal") == pytest.approx({0: 0.0, 1: 0.12})
    assert _by_gpu(t4, "nvidia_gpu_ecc_errors_total", error_type="uncorrected",
                   nvidia_gpu_ecc_counter_type="aggregate") == {0: 0.0, 1: 1.0}


COUNTERS = """\
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, NVLink bandwidth.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, NVLink flow-control CRC errors.
DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in us).
DCGM_FI_DEV_THERMAL_VIOLATION, counter, Throttling duration due to thermal constraints (in us).
DCGM_FI_DEV_POWER_MGMT_LIMIT, gauge, Power limit.
DCGM_FI_DEV_ENFORCED_POWER_LIMIT, gauge, Enforced power limit.
DCGM_FI_DEV_PSTATE, gauge, P-state.
DCGM_FI_DEV_VIDEO_CLOCK, gauge, Video clock.
DCGM_FI_DEV_MAX_SM_CLOCK, gauge, Max SM clock.
DCGM_FI_DEV_PCIE_LINK_GEN, gauge, PCIe generation.
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH, gauge, PCIe max width.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Aggregate single-bit errors.
DCGM_FI_DEV_RETIRED_SBE, counter, Retired pages (single-bit).
DCGM_FI_DEV_RETIRED_DBE, counter, Retired pages (double-bit).
DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX, gauge, Banks at max.
"""


def _dcgm(text: str, name: str) -> dict[int, float]:
    return {int(lab["gpu"]): value for lab, value in series(text, name)}


def test_dcgm_names_in_dcgm_units(collector, tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text(COUNTERS)
    text = collector("--simulate", "h100x8", "--naming", "otel,dcgm", "-f", str(path),
                     interval="1h").wait_sample(1)
    # TX + RX KiB over all links: (1953M + 2043M) + k * 180M on GPUs 0-3
    assert _dcgm(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == _per_group(
        [3_996_000_000.0 + 180_000_000 * k for k in K],
        [4_716_000_000.0 + 180_000_000 * k for k in K])
    assert _dcgm(text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == _per_group(
        [4.0 + k for k in K], [4.0 + k for k in K])
    # microseconds
    assert _dcgm(text, "DCGM_FI_DEV_POWER_VIOLATION") == _per_group(
        [1_500_000.0 + 250_000 * k for k in K], [2_500_000.0 + 250_000 * k for k in K])
    assert _dcgm(text, "DCGM_FI_DEV_THERMAL_VIOLATION") == _per_group(
        [0.0] * 4, [250_000.0 + 125_000 * k for k in K])
    # watts, MHz, plain numbers
    assert _dcgm(text, "DCGM_FI_DEV_POWER_MGMT_LIMIT") == _per_group([700.0] * 4, [650.0] * 4)
    assert _dcgm(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == _per_group([700.0] * 4,
                                                                         [640.0] * 4)
    assert _dcgm(text, "DCGM_FI_DEV_PSTATE") == dict.fromkeys(range(8), 0.0)
    assert _dcgm(text, "DCGM_FI_DEV_VIDEO_CLOCK") == _per_group(
        [1530.0 + 15 * k for k in K], [1590.0 + 15 * k for k in K])
    assert _dcgm(text, "DCGM_FI_DEV_MAX_SM_CLOCK") == dict.fromkeys(range(8), 1980.0)
    assert _dcgm(text, "DCGM_FI_DEV_PCIE_LINK_GEN") == dict.fromkeys(range(8), 5.0)
    assert _dcgm(text, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH") == dict.fromkeys(range(8), 16.0)
    assert _dcgm(text, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL") == _per_group(
        [12.0 + 3 * k for k in K], [24.0 + 3 * k for k in K])
    assert _dcgm(text, "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX") == _per_group(
        [2559.0] * 4, [2557.0] * 4)
    assert not series(text, "DCGM_FI_DEV_RETIRED_SBE")  # H100 remaps rows instead

    text = collector("--simulate", "t4", "--naming", "otel,dcgm", "-f", str(path),
                     interval="1h").wait_sample(1)
    assert _dcgm(text, "DCGM_FI_DEV_RETIRED_SBE") == {0: 1.0, 1: 2.0}
    assert _dcgm(text, "DCGM_FI_DEV_RETIRED_DBE") == {0: 0.0, 1: 1.0}
    assert _dcgm(text, "DCGM_FI_DEV_POWER_VIOLATION") == {0: 900_000.0, 1: 1_500_000.0}
    assert _dcgm(text, "DCGM_FI_DEV_PSTATE") == {0: 2.0, 1: 8.0}
    assert not series(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
    assert not series(text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
    assert not series(text, "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX")


# --- every family the endpoint can serve is documented ---------------------------------

HELD_GPU = "GPU-5706aeb2-2d1e-554f-8a1d-29b123d8308b"  # GPU 0 of h100x8


def _documented(doc: str) -> set[str]:
    """Every backticked Prometheus-looking name in a generated doc."""
    import re

    return set(re.findall(r"`([A-Za-z_:][A-Za-z0-9_:]*)", doc))


def test_every_family_the_endpoint_serves_is_in_the_generated_docs(
        collector, kubelet, receiver, tmp_path):
    """All profiles and every feature on (GPM, pods, HPC jobs, process usage, OTLP and its
    GPU events): each family of the body is in docs/metrics.md (the OpenTelemetry names)
    or docs/migration.md (the dcgm-exporter and kubelet profiles')."""
    from pathlib import Path

    from testkit.kubelet import container, devices, pod
    from testkit.process import wait_until

    docs = Path(__file__).resolve().parents[2] / "docs"
    kubelet.set_pods([pod("train-0", container("main", devices("nvidia.com/gpu", HELD_GPU)),
                          namespace="ml")])
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("4242\n")  # GPU 0: a pod and a job
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
           "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}
    proc = CollectorProcess(serve_args(
        "--simulate", "h100x8", "--naming", "otel,dcgm,kubelet",
        "--kubelet-socket", kubelet.socket_path, "--kubelet-interval", "0.1",
        "--process-usage", "true", "--hpc-job-mapping-dir", str(jobs), interval="0.25"),
        env=env)
    try:
        proc.wait_serving()

        def full():
            text = proc.metrics()
            names = {name for name, _, _ in parse_samples(text)}
            wanted = {"nvidia_gpu_k8s_allocation", "nvidia_gpu_k8s_memory_usage_bytes",
                      "nvidia_gpu_sm_activity", "otel_gpu_events_total"}
            pods = series(text, "otel_gpu_kubelet_pods") == [({}, 1.0)]
            return (names, text) if wanted <= names and pods else None

        served, text = wait_until(full, 30, "a body with pods, profiling, usage and events")
    finally:
        proc.stop()
    otel = _documented((docs / "metrics.md").read_text())
    migration = _documented((docs / "migration.md").read_text())
    missing = sorted(n for n in served - {"target_info"}
                     if n not in otel and n.removesuffix("_total") not in migration
                     and n not in migration)
    assert missing == [], f"served but not in docs/metrics.md or docs/migration.md: {missing}"
    # as the README says: the pod is on the held GPU's series, and never on its info series
    (info,) = [lab for lab, _ in series(text, "nvidia_gpu_info", hw_id=HELD_GPU)]
    (power,) = [lab for lab, _ in series(text, "hw_power_watts", hw_id=HELD_GPU)]
    assert power["k8s_pod_name"] == "train-0" and "k8s_pod_name" not in info
    assert power["nvidia_gpu_hpc_job_id"] == "4242" and "nvidia_gpu_hpc_job_id" not in info
