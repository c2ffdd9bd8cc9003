"""The real-GPU check runs against the simulator, so it cannot rot between GPU runs.

It is the same command a GPU node runs (``python -m benchmarks.device_check``), with
``--simulate h100x8``: the check's own pynvml reads go through the same fake driver.
One run must pass and write both reports; one whose reference reads another scenario
(a power limit and a memory total changed) must fail on exactly those values.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from otel_gpu.sim.scenario import PROFILES_DIR

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--simulate", "h100x8", "--interval", "0.5", "--latency-calls", "3",
        "--quiet-seconds", "1.5", "--scrape-seconds", "0.5"]


def check(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--out", str(out),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=150)


def test_the_check_passes_on_the_simulator_and_writes_both_reports(tmp_path):
    done = check(tmp_path, *FAST, "--systems", "otel-gpu,handwritten,handwritten-same")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "device-check.json").read_text())
    report = (tmp_path / "device-check.md").read_text()
    assert data["passed"] is True and not data["errors"]
    phases = {row["phase"] for row in data["rows"]}
    assert {"idle", "pods-1", "pods-2"} <= phases
    assert data["summary"]["compared"] > 2000 and data["summary"]["failed"] == 0
    # every family of the catalog that h100x8 exports is compared, none silently
    compared = {row["family"] for row in data["rows"]}
    assert {"hw_power_watts", "hw_energy_joules_total", "nvidia_gpu_tensor_activity",
            "nvidia_gpu_k8s_memory_usage_bytes", "nvidia_gpu_k8s_energy_joules_total",
            "nvidia_gpu_info", "hw_status"} <= compared
    assert "nvidia_gpu_xid_errors_total" in data["not_compared"]["idle"]
    # refusals are checked as absent series: h100x8 has no fan
    fan = [r for r in data["rows"] if r["family"] == "nvidia_gpu_fan_speed"]
    assert fan and all(r["rule"].startswith("absent") and r["ok"] for r in fan)
    # per-pod memory is NVML's per-process memory: 3 GiB and 1 GiB on GPU 0
    memory = {r["what"]: r["exported"] for r in data["rows"] if r["phase"] == "pods-2"
              and r["family"] == "nvidia_gpu_k8s_memory_usage_bytes" and r["what"] != "sum of rows"}
    assert memory == {"check-a": 3 << 30, "check-b": 1 << 30}
    assert set(data["cost"]) == {"otel-gpu", "handwritten", "handwritten-same"}
    assert data["cost"]["otel-gpu"]["nvml_calls_per_gpu_per_sample"] > 0
    # the baseline reading what otel-gpu reads calls nothing otel-gpu does not, the batch
    # and GPM included (benchmarks/tests/test_benchmarks.py compares the two call by call)
    same = data["cost"]["handwritten-same"]["nvml_calls_by_symbol"]
    ours = data["cost"]["otel-gpu"]["nvml_calls_by_symbol"]
    assert set(same) <= set(ours)
    assert same["nvmlDeviceGetFieldValues"] == ours["nvmlDeviceGetFieldValues"] == 1.0
    assert same["nvmlGpmSampleGet"] > 0 and same["nvmlGpmMetricsGet"] > 0
    assert data["latency"]["functions"]
    assert "PASS" in report and "NVIDIA H100 80GB HBM3" in report and "550.90.07" in report


def test_a_reference_that_disagrees_fails_the_check(tmp_path):
    scenario = yaml.safe_load((PROFILES_DIR / "h100x8.yaml").read_text())
    first = scenario["devices"][0]
    first["power_limits"]["default"] = 650000
    first["memory"]["total"] += 1 << 20
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(scenario))
    done = check(tmp_path / "out", *FAST, "--reference-scenario", str(other),
                 "--skip", "cost,latency,pods")
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads((tmp_path / "out" / "device-check.json").read_text())
    failed = {(r["family"], r["device"], r["what"]) for r in data["rows"] if not r["ok"]}
    # the first entry's four GPUs, and nothing else: the default limit, the total, and
    # what follows from the total (the free memory and the used fraction)
    for gpu in "0123":
        assert ("nvidia_gpu_power_limit_watts", gpu, "default") in failed
        assert ("hw_gpu_memory_limit_bytes", gpu, "-") in failed
    assert {f for f, *_ in failed} <= {"nvidia_gpu_power_limit_watts", "hw_gpu_memory_limit_bytes",
                                      "nvidia_gpu_memory_free_bytes", "hw_gpu_memory_utilization"}
    assert "FAIL" in (tmp_path / "out" / "device-check.md").read_text()


def test_a_new_catalog_metric_is_compared_with_its_kinds_and_units_tolerance():
    """The specs derive from the catalog: a row added there is a spec here, its tolerance
    the default for its kind and unit, an override by its name where one is given."""
    from benchmarks.device_check import specs
    from otel_gpu.instrument.catalog import CATALOG
    from otel_gpu.instrument.schema import MILLI, Kind, Metric, Point
    from otel_gpu.sample.sources import POWER, TEMP_MEM

    toy = Metric("nvidia.gpu.toy.power", Kind.GAUGE, "W", "A toy.",
                 points=(Point(POWER, {"nvidia.gpu.toy.kind": "board"}, MILLI),))
    counted = Metric("nvidia.gpu.toy.heat", Kind.UPDOWNCOUNTER, "{thing}", "A toy.",
                     points=(Point(TEMP_MEM),))
    found = {s.family: s for s in specs.specs((*CATALOG, toy, counted))}
    assert found["nvidia_gpu_toy_power_watts"] == specs.Spec(
        "nvidia_gpu_toy_power_watts", "power", specs.POWER,
        (("nvidia_gpu_toy_kind", "board"),), 0.001)
    assert found["nvidia_gpu_toy_heat"].tol is specs.EXACT
    assert found["hw_power_watts"].tol is specs.POWER
    assert found["nvidia_gpu_power_limit_watts"].tol is specs.EXACT  # an override by name
    assert {s.family for s in specs.SPECS} == {s.family for s in specs.specs(CATALOG)}


def test_the_reference_reads_a_field_source_it_has_no_call_for():
    """A new field source is read alone through nvmlDeviceGetFieldValues, with no way of
    the check's own: here the memory temperature's field under another key."""
    import pynvml

    from benchmarks.device_check.reference import read_gpu
    from otel_gpu import nvml_abi as abi
    from otel_gpu import sim
    from otel_gpu.sample.sources import TEMP_MEM, Source

    toy = Source("toy.memory_temperature", "a toy", "Cel", field_id=abi.NVML_FI_DEV_MEMORY_TEMP)
    sim.install(sim.FakeNvml(sim.load_scenario("h100x8")))
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        got = read_gpu(pynvml, handle, [toy, TEMP_MEM])
        pynvml.nvmlShutdown()
    finally:
        sim.uninstall()
    assert isinstance(got["toy.memory_temperature"], int | float)
    assert got["toy.memory_temperature"] == got["temp.memory"]
    assert got["_collectors_reader"] == []
