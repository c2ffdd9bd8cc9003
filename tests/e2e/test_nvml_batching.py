"""What a sample costs in NVML calls, and an older driver's values, through the real process.

The collector runs in simulation and is scraped over HTTP: the request counter it
exports tells the calls made, and a GPU whose driver lacks the newer field ids must
export the same values as one that answers them in the batched call.
"""

from __future__ import annotations

import textwrap

from testkit.exposition import series
from tests.support.nvml import CALLS_PER_GPU_PER_SAMPLE

H100 = "NVIDIA H100 80GB HBM3"
BATCHED = "GPU-00000000-0000-0000-0000-00000000000a"
OLDER = "GPU-00000000-0000-0000-0000-00000000000b"
FIELD_IDS = ("POWER_AVERAGE", "POWER_REQUESTED_LIMIT", "POWER_CURRENT_LIMIT",
             "POWER_DEFAULT_LIMIT", "POWER_MIN_LIMIT", "POWER_MAX_LIMIT", "PERF_POLICY_POWER",
             "PERF_POLICY_THERMAL", "PERF_POLICY_SYNC_BOOST", "PERF_POLICY_BOARD_LIMIT",
             "PERF_POLICY_LOW_UTILIZATION", "PERF_POLICY_RELIABILITY")


def _counter(text: str, name: str) -> float:
    return series(text, name)[0][1]


def test_h100x8_costs_the_batched_calls_per_gpu_per_sample(collector):
    proc = collector("--simulate", "h100x8")
    first = proc.wait_sample(3)  # past discovery, the static reads and GPM's first sample
    start = _counter(first, "otel_gpu_samples_total")
    last = proc.wait_sample(start + 4)
    samples = _counter(last, "otel_gpu_samples_total") - start
    calls = (_counter(last, "otel_gpu_nvml_requests_total")
             - _counter(first, "otel_gpu_nvml_requests_total"))
    assert calls / samples / 8 == CALLS_PER_GPU_PER_SAMPLE[False]


def _scenario(tmp_path) -> str:
    gpu = """
          - name: {name}
            uuid: {uuid}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 300000, step: 2500}}
            power_limits: {{current: 650000, enforced: 640000, default: 700000, min: 200000,
                           max: 700000}}
            violations: {{power: {{start: 2000000000, step: 125000000}}, thermal: 5000,
                         sync_boost: 0, board_limit: 0, low_utilization: 900000000,
                         reliability: 0}}
            {extra}"""
    path = tmp_path / "older-driver.yaml"
    path.write_text(textwrap.dedent("""
        driver_version: "470.256.02"
        devices:""") + gpu.format(name=H100, uuid=BATCHED, extra="") + gpu.format(
        name=H100, uuid=OLDER, extra=f"unsupported: [{', '.join(FIELD_IDS)}]") + "\n")
    return str(path)


def _values(text: str, uuid: str) -> dict[tuple[str, str], float]:
    out = {}
    for name, label in (("hw_power_watts", ""),
                        ("nvidia_gpu_power_limit_watts", "nvidia_gpu_power_limit_type"),
                        ("nvidia_gpu_clock_throttle_time_seconds_total",
                         "nvidia_gpu_throttle_reason")):
        for labels, value in series(text, name, hw_id=uuid):
            out[(name, labels.get(label, ""))] = value
    return out


def test_a_gpu_whose_driver_lacks_the_field_ids_exports_the_same_values(collector, tmp_path):
    proc = collector("--simulate", _scenario(tmp_path), "--pod-attribution", "false")
    for seq in (1, 3):
        text = proc.wait_sample(seq)
        batched, older = _values(text, BATCHED), _values(text, OLDER)
        assert len(batched) == 1 + 5 + 6, sorted(batched)  # power, 5 limits, 6 policies
        assert batched == older
    assert batched[("nvidia_gpu_power_limit_watts", "enforced")] == 640.0
    assert batched[("nvidia_gpu_clock_throttle_time_seconds_total", "thermal")] == 5e-6
    assert "Traceback" not in proc.log
