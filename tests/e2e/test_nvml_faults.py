"""NVML faults outside the per-GPU sample, through the real process over HTTP.

A GPU whose driver hangs in discovery or XID registration must stall only
itself; values NVML answers with its "not available" sentinel must never be
exported as readings.
"""

from __future__ import annotations

import textwrap

import pytest

from testkit.exposition import series

H100 = "NVIDIA H100 80GB HBM3"
GOOD = "GPU-00000000-0000-0000-0000-000000000001"
BAD = "GPU-00000000-0000-0000-0000-000000000002"


def _scenario(tmp_path, second: str) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        devices:
          - name: {H100}
            uuid: {GOOD}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
          - name: {H100}
            uuid: {BAD}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
            {second}
    """))
    return str(path)


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceRegisterEvents"])
def test_a_gpu_hanging_at_start_up_stalls_only_itself(collector, tmp_path, function):
    proc = collector("--simulate", _scenario(
        tmp_path, f"slow: [{{function: {function}, seconds: 600}}]"))
    text = proc.wait_sample(2)  # start-up finished, and sampling goes on
    power = series(text, "hw_power_watts", hw_id=GOOD)
    later = proc.wait_sample(series(text, "otel_gpu_samples_total")[0][1] + 3)
    assert series(later, "hw_power_watts", hw_id=GOOD) != power, "GPU 0 must stay fresh"
    ages = {lab["hw_id"]: v for lab, v in series(later, "otel_gpu_device_sample_age_seconds")}
    hung = [uuid for uuid in ages if uuid != GOOD]
    assert len(hung) == 1 and ages[hung[0]] >= 1.0 > ages[GOOD]
    assert not series(later, "hw_power_watts", hw_id=hung[0])
    status, _, body = proc.get("/readyz")
    assert status == 200 and body.startswith(b"ready: 1 of 2 device(s) readable"), body
    assert b"hung: GPU 1 (" in body and function.encode() in body, body
    lines = [ln for ln in proc.lines if "has not returned" in ln]
    assert len(lines) == 1 and "GPU 1 (" in lines[0] and function in lines[0], lines
    assert "Traceback" not in proc.log


def test_nvmls_not_available_answers_are_never_exported(collector, tmp_path):
    # both temperature calls: the versioned one, or the plain one a 12.x binding makes
    sentinels = ("nvmlDeviceGetPowerUsage, nvmlDeviceGetTemperatureV, nvmlDeviceGetTemperature, "
                 "nvmlDeviceGetUtilizationRates, nvmlDeviceGetClockInfo, POWER_AVERAGE, "
                 "TOTAL_ENERGY_CONSUMPTION, ECC_SBE_VOL_TOTAL")
    proc = collector("--simulate", _scenario(tmp_path, f"""temperature: 40
            utilization: {{gpu: 30, memory: 5}}
            clocks: {{graphics: 1755, sm: 1755, memory: 2619}}
            fields: {{TOTAL_ENERGY_CONSUMPTION: 5000, ECC_SBE_VOL_TOTAL: 1}}
            not_available: [{sentinels}]"""))
    text = proc.wait_sample(2)
    assert series(text, "hw_power_watts", hw_id=GOOD)
    for name in ("hw_power_watts", "hw_temperature_celsius", "hw_gpu_utilization",
                 "hw_energy_joules_total", "hw_errors_total", "nvidia_gpu_clock_frequency_hertz"):
        assert not series(text, name, hw_id=BAD), name
    assert series(text, "hw_status", hw_id=BAD, hw_state="ok")[0][1] == 1
    omitted = {hw_id: series(text, "otel_gpu_nvml_unsupported", hw_id=hw_id,
                             otel_gpu_nvml_reason="not_available")[0][1]
               for hw_id in (GOOD, BAD)}
    assert omitted[GOOD] == 0 and omitted[BAD] >= 7, omitted
    lines = [ln for ln in proc.lines if "cannot be readings" in ln]
    assert len(lines) == 1 and "power (not available)" in lines[0], lines
