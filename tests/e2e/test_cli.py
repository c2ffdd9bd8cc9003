"""The real ``otel-gpu`` process, end to end over HTTP, in simulation."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.exposition import series
from testkit.process import ROOT, http_get, run_cli, wait_until
from tests.support.nvml import first_sample_values
from tests.support.omitted import reasons

H100_MEMORY_TOTAL = 85520809984


def test_serves_h100x8_with_the_scenarios_values(collector):
    proc = collector("--simulate", "h100x8", interval="1h")
    text = proc.wait_sample(1)
    expected = first_sample_values("h100x8")
    assert len(expected) == 8
    used = {lab["hw_id"]: v for lab, v in series(text, "hw_gpu_memory_usage_bytes")}
    power = {lab["hw_id"]: v for lab, v in series(text, "hw_power_watts")}
    temp = {lab["hw_id"]: v
            for lab, v in series(text, "hw_temperature_celsius", hw_sensor_location="gpu")}
    limit = {lab["hw_id"]: v for lab, v in series(text, "hw_gpu_memory_limit_bytes")}
    assert set(used) == set(power) == set(temp) == set(expected)
    for uuid, want in expected.items():
        assert used[uuid] == want["used"], uuid
        assert power[uuid] == pytest.approx(want["power_w"]), uuid
        assert temp[uuid] == want["temp"], uuid
        assert limit[uuid] == H100_MEMORY_TOTAL
    assert len(set(temp.values())) > 1, "the profile's GPUs should differ"
    # device attributes, as documented: all of them on every series (the default), and
    # the same once per device on the info metric
    lab, _ = series(text, "hw_power_watts")[0]
    info = {i["hw_id"]: i for i, _ in series(text, "nvidia_gpu_info")}
    assert set(info) == set(expected)
    assert info[lab["hw_id"]] == lab
    for key in ("hw_id", "hw_name", "hw_model", "hw_vendor", "hw_driver_version", "hw_type",
                "nvidia_gpu_index", "nvidia_gpu_pci_bus_id", "hw_serial_number"):
        assert lab.get(key), key
    assert lab["hw_vendor"] == "NVIDIA" and lab["hw_model"] == "NVIDIA H100 80GB HBM3"
    # resource and self-metrics
    info = series(text, "target_info")
    assert info and info[0][0]["service_name"] == "otel-gpu"
    assert series(text, "otel_gpu_sample_age_seconds")
    assert series(text, "hw_status", hw_state="ok")[0][1] == 1.0


def test_counters_rise_between_samples(collector):
    proc = collector("--simulate", "h100x8")
    first = proc.wait_sample(1)
    uuid = series(first, "hw_energy_joules_total")[0][0]["hw_id"]
    before = series(first, "hw_energy_joules_total", hw_id=uuid)[0][1]
    seq = series(first, "otel_gpu_samples_total")[0][1]
    later = proc.wait_sample(seq + 2)
    assert series(later, "hw_energy_joules_total", hw_id=uuid)[0][1] > before


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus)")
@pytest.mark.parametrize("profile", ["h100x8", "a100-mig", "t4"])
def test_promtool_accepts_the_exposition(collector, profile):
    proc = collector("--simulate", profile)
    text = proc.wait_sample(1)
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_health_and_readiness(collector):
    proc = collector("--simulate", "h100x8", interval="1")
    assert proc.get("/healthz")[0] == 200
    proc.wait_sample(1)
    status, _, body = proc.get("/readyz")
    assert status == 200 and body.startswith(b"ready: 8 of 8"), body


def test_lost_gpu_keeps_the_others(collector, tmp_path):
    scenario = tmp_path / "lost.yaml"
    scenario.write_text(textwrap.dedent("""
        devices:
          - name: NVIDIA H100 80GB HBM3
            count: 3
            memory: {total: 85520809984, used: {start: 1000000, per_device: 1000}}
            temperature: {start: 40, per_device: 1}
            power: 300000
          - name: NVIDIA H100 80GB HBM3
            uuid: GPU-0bad0000-0000-0000-0000-000000000000
            memory: {total: 85520809984, used: 5}
            temperature: 50
            power: 300000
            lost_after: 2
    """))
    proc = collector("--simulate", str(scenario))
    text = proc.wait_sample(4)
    lost = "GPU-0bad0000-0000-0000-0000-000000000000"
    assert series(text, "hw_status", hw_id=lost, hw_state="failed")[0][1] == 1.0
    assert series(text, "hw_status", hw_id=lost, hw_state="ok")[0][1] == 0.0
    assert series(text, "hw_temperature_celsius", hw_id=lost) == []
    assert len(series(text, "hw_temperature_celsius")) == 3
    assert {v for _, v in series(text, "hw_status", hw_state="ok")} == {0.0, 1.0}
    status, _, body = proc.get("/readyz")
    assert status == 200 and b"3 of 4" in body
    assert "failed: GPU is lost" in proc.log


def test_unsupported_field_has_no_series_and_is_logged_once(collector):
    proc = collector("--simulate", "t4")
    seq = series(proc.wait_sample(1), "otel_gpu_samples_total")[0][1]
    text = proc.wait_sample(seq + 3)
    assert series(text, "hw_temperature_celsius", hw_sensor_location="gpu")
    assert series(text, "hw_temperature_celsius", hw_sensor_location="memory") == []
    assert series(text, "nvidia_gpu_fan_speed") == []
    lines = [ln for ln in proc.lines if "not available" in ln
             and reasons(ln).get("temp.memory", ("",))[0] == "NOT_SUPPORTED"]
    assert len(lines) == 1, proc.log  # one line for the node, not one per GPU
    assert reasons(lines[0])["temp.memory"][1] == "2 devices (GPU 0, GPU 1)", proc.log


@pytest.mark.slow  # at scale (thousands of pods, hundreds of GPUs, bursts): not in the quick loop
def test_twenty_concurrent_scrapes_make_no_nvml_calls(collector):
    proc = collector("--simulate", "h100x8", interval="1h")
    text = proc.wait_sample(1)
    calls = series(text, "otel_gpu_nvml_requests_total")[0][1]
    with ThreadPoolExecutor(20) as pool:
        bodies = list(pool.map(lambda _: proc.metrics(), range(20)))
    for body in bodies:
        assert series(body, "otel_gpu_nvml_requests_total")[0][1] == calls
        assert series(body, "otel_gpu_samples_total")[0][1] == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_within_five_seconds(collector, sig):
    proc = collector("--simulate", "h100x8")
    proc.wait_sample(1)
    code, elapsed = proc.stop(sig)
    assert code == 0 and elapsed < 5.0, proc.log
    assert f"received {sig.name}, stopping" in proc.log


def test_no_driver_exits_2_with_one_line():
    code, out, err = run_cli("serve", "--listen", "127.0.0.1:0")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "NVML could not be loaded" in lines[0] and "--simulate h100x8" in lines[0]


NO_DRIVER = "devices:\n  - name: Tesla T4\nerrors: {nvmlInitWithFlags: DRIVER_NOT_LOADED}\n"
"""A simulated node whose driver cannot be loaded."""

FAILED_STARTS = {
    "bad-listen-simulated": (("serve", "--simulate", "t4", "--listen=8.8.8.8:9400"),
                             "listen 8.8.8.8:9400: "),
    "bad-listen-simulated-process-usage": (
        ("serve", "--simulate", "t4", "--listen=8.8.8.8:9400", "--process-usage", "true",
         "--pod-attribution", "false"), "listen 8.8.8.8:9400: "),
    "health-in-use-simulated": (("serve", "--simulate", "t4", "--listen", "127.0.0.1:0",
                                 "--health-listen", "127.0.0.1:{busy}"), "health_listen "),
    "no-driver-simulated": (("serve", "--simulate", "{d}/no-driver.yaml",
                             "--listen", "127.0.0.1:0"), "NVML could not be loaded"),
    "no-driver-simulated-check": (("check", "--simulate", "{d}/no-driver.yaml"),
                                  "NVML could not be loaded"),
    # without --simulate: the driver's error where there is none, else the listener's
    "bad-listen": (("serve", "--listen=8.8.8.8:9400"), ""),
    "health-in-use": (("serve", "--listen", "127.0.0.1:0", "--health-listen",
                       "127.0.0.1:{busy}"), ""),
}
"""A start that fails: its arguments, and what its one line says."""


@pytest.mark.parametrize(("args", "needle"), FAILED_STARTS.values(), ids=FAILED_STARTS.keys())
def test_a_failed_start_prints_its_error_line_alone(tmp_path, args, needle):
    """No INFO line of the start-up (the scenario simulated, the process usage read) comes
    before a start that fails: its error is the one line."""
    (tmp_path / "no-driver.yaml").write_text(NO_DRIVER)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [a.format(d=tmp_path, busy=port) for a in args]
        code, out, err = run_cli(*argv, "--log-level", "info")
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("otel-gpu: error: ") and needle in lines[0], err
    assert out == ""


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--interval", "soon"], {}, "interval (from flag --interval)"),
        (["--simulate", "no-such-profile"], {}, "no-such-profile"),
        (["--bogus"], {}, "unknown flag --bogus (see otel-gpu --help)"),
        (["--simualte", "h100x8"], {}, "unknown flag --simualte (did you mean --simulate?)"),
        (["check", "--pod-atribution=false"], {},
         "unknown flag --pod-atribution (did you mean --pod-attribution?)"),
        ([], {"OTEL_GPU_LISTEN": "nowhere"}, "listen (from environment variable OTEL_GPU_LISTEN)"),
        (["--port", "9400"], {}, "(did you mean --listen :9400?)"),
        (["--web.listen-address", ":9100"], {}, "(did you mean --listen :9100?)"),
        (["--web.config.file", "w.yml"], {}, "(did you mean --web-config-file w.yml?)"),
        (["-c", "1000"], {}, "(did you mean --interval 1s?)"),
        (["chek"], {}, "unknown command 'chek' (did you mean check?)"),
        (["-simulate", "h100x8"], {}, "unknown flag -simulate (did you mean --simulate?)"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, env, needle):
    code, out, err = run_cli(*args, env=env)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err and "Traceback" not in err


def test_check_prints_every_device():
    code, out, err = run_cli("check", "--simulate", "a100-mig")
    assert code == 0, err
    assert "GPU 0 MIG 3g.20gb" in out and "GPU 2" in out
    assert "hw.gpu.memory.usage" in out


def test_check_json_is_one_document_on_stdout():
    """The log lines stay on stderr: a script reads stdout as it is."""
    import json

    code, out, err = run_cli("check", "--simulate", "a100-mig", "--format", "json")
    assert code == 0, err
    report = json.loads(out)
    assert [d["mig_profile"] for d in report["devices"]].count("3g.20gb") >= 1
    assert any(v["metric"] == "hw.gpu.memory.usage" for d in report["devices"]
               for v in d["values"])


def test_check_exits_1_when_no_gpu_is_readable(tmp_path):
    scenario = tmp_path / "dead.yaml"
    scenario.write_text(textwrap.dedent("""
        devices:
          - name: Tesla T4
            memory: {total: 16000000000, used: 1}
            errors: {nvmlDeviceGetFieldValues: GPU_IS_LOST, nvmlDeviceGetMemoryInfo_v2: GPU_IS_LOST}
    """))
    code, out, err = run_cli("check", "--simulate", str(scenario))
    assert code == 1, out + err
    assert "state=failed" in out


def test_metrics_listing_and_python_m():
    code, out, _ = run_cli("metrics")
    assert code == 0 and "hw.gpu.memory.usage" in out and "hw_gpu_memory_usage_bytes" in out


def test_port_in_use_is_one_line(collector):
    proc = collector("--simulate", "t4")
    code, out, err = run_cli("--simulate", "t4", "--listen", f"127.0.0.1:{proc.port}")
    errors = [ln for ln in err.splitlines() if ln.startswith("otel-gpu: error:")]
    assert code == 2 and "Traceback" not in err, err
    assert errors == [f"otel-gpu: error: listen 127.0.0.1:{proc.port}: Address already in use"]
    assert http_get(proc.url("/healthz"))[0] == 200


def test_otel_sdk_disabled_is_honoured_and_said(collector):
    proc = collector("--simulate", "t4", "--naming", "otel,dcgm",
                     env={"OTEL_SDK_DISABLED": "true"})
    text = wait_until(lambda: (lambda t: t if "DCGM_FI_DEV_GPU_TEMP" in t else None)(
        proc.metrics()), what="the dcgm series")
    assert "hw_power_watts" not in text and "target_info" not in text
    assert "OTEL_SDK_DISABLED=true" in proc.log
    assert proc.get("/readyz")[0] == 200


def test_json_logs_are_one_object_per_line():
    import json

    code, out, err = run_cli("check", "--simulate", "t4", "--log-format", "json",
                             "--pod-attribution", "false")
    assert code == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert records and {"time", "level", "logger", "message"} <= set(records[0])
    assert any("simulating NVML" in r["message"] for r in records)


@pytest.mark.parametrize("args", [("check", "--simulate", "h100x8", "--pod-attribution", "false"),
                                  ("metrics",), ("metrics", "--format", "markdown")])
def test_a_reader_that_went_away_ends_the_output_quietly(args):
    """``otel-gpu check | head -1``: the reader is gone before the output ends. Here it is gone
    before the output starts (closed before the process begins), so that every run meets the
    broken pipe however fast it writes: no traceback, and the status of a tool stopped by
    SIGPIPE (141), as ``yes | head -1`` gives."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "otel_gpu", *args], cwd=ROOT, stdout=write,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                              timeout=60)
    finally:
        os.close(write)
    err = done.stderr
    for word in ("Traceback", "BrokenPipe", "Exception ignored"):
        assert word not in err, err
    assert done.returncode == 141, err


def test_a_mistyped_otel_gpu_variable_is_named_in_one_warning():
    env = {"OTEL_GPU_INTERVL": "5s", "OTEL_GPU_POD_ATTRIBUTION": "false"}
    code, out, err = run_cli("check", "--simulate", "t4", env=env)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "OTEL_GPU_INTERVL" in line]
    assert len(warnings) == 1, err
    assert "WARNING" in warnings[0] and "is not a setting and is ignored" in warnings[0]
    assert "(did you mean OTEL_GPU_INTERVAL?)" in warnings[0]
    assert "OTEL_GPU_POD_ATTRIBUTION" not in err
