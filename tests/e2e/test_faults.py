"""GPU failures an operator alerts on, through the real process: lost, hung, XIDs, re-layouts.

Each scenario runs ``otel-gpu`` in simulation and reads /metrics and /readyz
over HTTP, as Prometheus and the kubelet's probes would.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from testkit.exposition import series
from testkit.process import run_cli

H100 = "NVIDIA H100 80GB HBM3"
GOOD = "GPU-00000000-0000-0000-0000-000000000001"
BAD = "GPU-00000000-0000-0000-0000-000000000002"


def _scenario(tmp_path, second: str, first: str = "") -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "550.90.07"
        devices:
          - name: {H100}
            uuid: {GOOD}
            memory: {{total: 85520809984, used: 1}}
            power: {{start: 100000, step: 1000}}
            {first}
          - name: {H100}
            uuid: {BAD}
            memory: {{total: 85520809984, used: 1}}
            power: 100000
            {second}
    """))
    return str(path)


def _power(text: str, uuid: str) -> list[float]:
    return [v for _, v in series(text, "hw_power_watts", hw_id=uuid)]


def test_a_gpu_lost_before_start_is_reported_failed(collector, tmp_path):
    proc = collector("--simulate", _scenario(tmp_path, "lost_after: 0"))
    text = proc.wait_sample(2)
    failed = series(text, "hw_status", hw_state="failed")
    assert {lab["hw_id"]: v for lab, v in failed} == {GOOD: 0.0, "GPU-unknown-index-1": 1.0}
    assert series(text, "otel_gpu_devices", hw_state="failed")[0][1] == 1
    status, _, body = proc.get("/readyz")
    assert status == 200 and body.startswith(b"ready: 1 of 2 device(s) readable")
    assert _power(text, GOOD) and not _power(text, "GPU-unknown-index-1")


def test_a_gpu_lost_while_running_stays_failed_with_its_xid_series(collector, tmp_path):
    proc = collector("--simulate", _scenario(
        tmp_path, "lost_after: 3\n            xid: [{sample: 3, code: 79}]"))
    text = proc.wait_sample(1)
    xids = {lab["nvidia_gpu_xid"]: v
            for lab, v in series(text, "nvidia_gpu_xid_errors_total", hw_id=BAD)}
    assert xids["79"] == 0 and xids["13"] == 0 and xids["48"] == 0  # there before any event
    text = proc.wait_sample(8)
    assert series(text, "hw_status", hw_id=BAD, hw_state="failed")[0][1] == 1
    assert series(text, "nvidia_gpu_xid_errors_total", hw_id=BAD, nvidia_gpu_xid="79")[0][1] == 1
    assert not _power(text, BAD) and _power(text, GOOD)
    assert series(text, "otel_gpu_devices", hw_state="failed")[0][1] == 1


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_one_hung_gpu_stalls_only_itself(collector, tmp_path):
    scenario = _scenario(
        tmp_path, "slow: [{function: nvmlDeviceGetPowerUsage, seconds: 600, after: 1}]")
    proc = collector("--simulate", scenario, interval="0.2")
    first = proc.wait_sample(1)
    assert _power(first, BAD)
    text = proc.wait_sample(6)  # samples go on while GPU 1 hangs (1 s deadline each at most)
    assert _power(text, GOOD) and not _power(text, BAD)
    assert series(text, "hw_status", hw_id=BAD, hw_state="ok")[0][1] == 1  # last known state
    ages = {lab["hw_id"]: v for lab, v in series(text, "otel_gpu_device_sample_age_seconds")}
    assert ages[BAD] >= 1.0 > ages[GOOD]
    later = proc.wait_sample(series(text, "otel_gpu_samples_total")[0][1] + 3)
    assert _power(later, GOOD) != _power(text, GOOD), "the healthy GPU must stay fresh"
    ages_later = {lab["hw_id"]: v
                  for lab, v in series(later, "otel_gpu_device_sample_age_seconds")}
    assert ages_later[BAD] > ages[BAD]
    status, _, body = proc.get("/readyz")
    assert status == 200 and body.startswith(b"ready: 1 of 2 device(s) readable"), body
    hung_lines = [ln for ln in proc.lines if "has not returned" in ln]
    assert len(hung_lines) == 1 and "GPU 1" in hung_lines[0]
    assert "field values" in hung_lines[0]  # power is read in the batched call
    code, elapsed = proc.stop()
    assert code == 0 and elapsed < 5.0, "a stuck NVML call must not block shutdown"
    assert "exiting without nvmlShutdown" in proc.log


@pytest.mark.slow  # seconds of real time (retries, timeouts, many samples): not in the quick loop
def test_check_gives_up_on_a_hung_gpu_and_names_it(tmp_path):
    scenario = _scenario(tmp_path, "slow: [{function: nvmlDeviceGetPowerUsage, seconds: 600}]")
    started = time.monotonic()
    code, out, err = run_cli("check", "--simulate", scenario, "--pod-attribution", "false",
                             timeout=30)
    assert time.monotonic() - started < 20
    assert code == 0, err  # GPU 0 was read
    assert f"problem: GPU 1 ({BAD}): reading field values has not returned after 5" in out
    assert "hung: GPU 1" in out and "Traceback" not in err


def test_mig_relayout_shows_within_a_few_samples(collector, tmp_path):
    path = tmp_path / "mig.yaml"
    path.write_text(textwrap.dedent("""
        devices:
          - name: NVIDIA A100-SXM4-40GB
            memory: {total: 42949672960, used: 1}
            power: 100000
            mig_capable: true
            mig:
              - {profile: 3g.20gb, gpu_instance_id: 1, until_sample: 4,
                 uuid: MIG-11111111-1111-1111-1111-111111111111,
                 memory: {total: 20000000000, used: 5}}
              - {profile: 1g.5gb, gpu_instance_id: 9, from_sample: 5,
                 uuid: MIG-99999999-9999-9999-9999-999999999999,
                 memory: {total: 5000000000, used: 7}}
    """))
    proc = collector("--simulate", str(path), interval="0.2")
    text = proc.wait_sample(2)
    ids = {lab["hw_id"] for lab, _ in series(text, "hw_gpu_memory_usage_bytes")}
    assert "MIG-11111111-1111-1111-1111-111111111111" in ids
    text = proc.wait_sample(7)  # well before the periodic rediscovery at sample 61
    usage = {lab["hw_id"]: v for lab, v in series(text, "hw_gpu_memory_usage_bytes")}
    assert usage.get("MIG-99999999-9999-9999-9999-999999999999") == 7
    assert "MIG-11111111-1111-1111-1111-111111111111" not in usage
    gone = [lab for lab, _ in series(text, "hw_status")
            if lab["hw_id"] == "MIG-11111111-1111-1111-1111-111111111111"]
    assert gone == [], "a destroyed instance is not reported as ok"


def test_dcgm_names_alone_keep_the_collectors_health(collector, tmp_path):
    proc = collector("--simulate", _scenario(tmp_path, "lost_after: 2"), "--naming", "dcgm")
    text = proc.wait_sample(4)  # otel_gpu_samples_total is there without the otel names
    assert series(text, "otel_gpu_sample_age_seconds")[0][1] < 30
    assert series(text, "otel_gpu_devices", hw_state="failed")[0][1] == 1
    assert series(text, "otel_gpu_devices", hw_state="ok")[0][1] == 1
    assert series(text, "DCGM_FI_DEV_POWER_USAGE")  # and the dcgm names themselves
    assert not series(text, "hw_power_watts")


_NULL_BUFFER = """
        processes: [{{pid: {pid}, used_memory: 1000, sm: 20}}]"""
_SUCCESS_WITHOUT_A_BUFFER = """
shapes:
  - {function: nvmlDeviceGetProcessesUtilizationInfo, shape: "returns:SUCCESS"}
  - {function: nvmlDeviceGetProcessUtilization, shape: "returns:SUCCESS"}
"""


def test_success_without_a_buffer_publishes_every_gpu_as_idle(collector, tmp_path):
    """NVIDIA's mock driver answers the per-process utilization size query with SUCCESS and
    no buffer, its way of saying "no sample": with process usage on, every GPU went
    unpublished before containment, then counted a reader failure a sample each. It is an
    empty list: every GPU published, no failure, no warning."""
    path = _scenario(tmp_path, _NULL_BUFFER.format(pid=202).strip(),
                     _NULL_BUFFER.format(pid=101).strip())
    with open(path, "a") as scenario:
        scenario.write(_SUCCESS_WITHOUT_A_BUFFER)
    proc = collector("--simulate", path, "--process-usage", "true")
    first = proc.wait_sample(2)
    text = proc.wait_sample(4)
    assert _power(text, GOOD) != _power(first, GOOD)  # fresh, not the first sample's
    assert _power(text, BAD)
    failures = {lab["otel_gpu_reader"]: v
                for lab, v in series(text, "otel_gpu_reader_failures_total")}
    assert failures and not any(failures.values()), failures  # each there, at 0
    assert not [line for line in proc.lines if "reader failed unexpectedly" in line]
    assert "Traceback" not in proc.log
    code, out, err = run_cli("check", "--simulate", path, "--process-usage", "true",
                             "--pod-attribution", "false", timeout=30)
    assert code == 0, err
    assert "problem:" not in out and "reader failed unexpectedly" not in out, out
