"""``otel-gpu check`` on GPU time: each holder's share of the GPU held and kept busy, and the
allocations idle in its one sample, said alike in text and JSON (the rest of check's report
is in ``tests/test_cli.py``)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml

from otel_gpu import cli


@pytest.fixture
def scenario(tmp_path, monkeypatch):
    """Two T4s on a Kubernetes node: GPU 1 held by a pod running its process, GPU 0 held by
    a pod running nothing (a notebook left open)."""
    monkeypatch.setattr(cli, "configure_logging", lambda level, fmt: None)
    data = yaml.safe_load(resources.files("otel_gpu.sim").joinpath("profiles/t4.yaml")
                          .read_text())
    data["devices"][0]["utilization"]["gpu"] = {"start": 0, "per_device": 45}  # 0 %, 45 %
    data["node"] = {"pods": [
        {"namespace": "serve", "name": "infer", "containers": [
            {"name": "main", "pids": [3131], "devices": [1]}]},
        {"namespace": "research", "name": "notebook", "containers": [
            {"name": "lab", "devices": [0]}]},
    ]}
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _check(capsys, scenario: str, *argv: str) -> str:
    assert cli.main(["check", "--simulate", scenario, *argv]) == cli.EXIT_OK
    return capsys.readouterr().out


def test_check_says_each_holders_share_and_the_idle_allocation(capsys, scenario):
    report = json.loads(_check(capsys, scenario, "--format", "json"))
    gpu0, gpu1 = report["devices"]
    (idle,) = gpu0["gpu_time"]
    assert (idle["workload"], idle["name"], idle["share"], idle["active_share"],
            idle["idle"]) == ("pod", "research/notebook/lab", 1, 0, True)
    assert {k: v for k, v in idle["attributes"].items() if k != "k8s.pod.uid"} == {
        "k8s.pod.name": "notebook", "k8s.namespace.name": "research", "k8s.container.name": "lab"}
    (busy,) = gpu1["gpu_time"]
    # alone on a GPU without GPM: NVML's utilization
    assert (busy["name"], busy["share"], busy["active_share"], busy["idle"]) == (
        "serve/infer/main", 1, 0.45, False)
    assert [(r["index"], r["uuid"], r["name"]) for r in report["idle_allocations"]] == [
        (0, gpu0["uuid"], "research/notebook/lab")]
    text = _check(capsys, scenario)
    assert (f"\nidle allocation: pod research/notebook/lab holds GPU 0 ({gpu0['uuid']}) with "
            "no process on it or no activity\n") in text
    assert "\n  time: pod research/notebook/lab holds 100.0% of the GPU, keeps 0.0% busy, idle\n" \
        in text
    assert "\n  time: pod serve/infer/main holds 100.0% of the GPU, keeps 45.0% busy\n" in text
    assert text.count("idle allocation:") == 1


def test_check_names_use_outside_any_allocation(capsys, scenario, tmp_path):
    """The busy pod gone: its process now runs on a GPU nobody holds."""
    data = yaml.safe_load(Path(scenario).read_text())
    data["node"]["pods"] = data["node"]["pods"][1:]
    data["node"]["host_pids"] = [3131]
    path = tmp_path / "free.yaml"
    path.write_text(yaml.safe_dump(data))
    report = json.loads(_check(capsys, str(path), "--format", "json"))
    assert [d["outside_use"] for d in report["devices"]] == [[], ["unallocated_device"]]
    assert [d["gpu_time"] for d in report["devices"]][1] == []
    text = _check(capsys, str(path))
    assert text.count("\n  used outside any allocation: unallocated_device\n") == 1


def test_containers_and_jobs_are_named_as_their_series_name_them(capsys, monkeypatch):
    """A container by its name (else its short id), a job by its id; a holder that no longer
    holds the device (share 0) is left out."""
    from types import SimpleNamespace

    import otel_gpu.instrument.schema as schema
    from otel_gpu.report import check_report, print_report
    from otel_gpu.snapshot import DeviceTime, GpuTime, HolderTime
    from otel_gpu.workload import ContainerRef, JobRef

    monkeypatch.setattr(schema, "device_observations", lambda metric, sample: ())
    rows = (HolderTime("GPU-1", ContainerRef("ab" * 32, "trainer"), 0, 0, 0.0, False, 0.5, 0.5),
            HolderTime("GPU-1", ContainerRef("cd" * 32), 0, 0, 0.0, True, 0.5, 0.0),
            HolderTime("GPU-1", JobRef("4242"), 0, 0, None, None, 0.0, None))
    device = SimpleNamespace(index=0, uuid="GPU-1", name="Tesla T4", mig_profile=None,
                             is_mig=False)
    snapshot = SimpleNamespace(
        driver_version="550", duration=0.0, notes=(), errors=(), pods=None,
        devices=(SimpleNamespace(device=device, state="ok", error=None, hung=None, values={}),),
        series_jobs=lambda uuid: (), gpu_time=GpuTime(rows, (DeviceTime("GPU-1", 0, 0, 0),)))
    report = check_report(snapshot)
    assert [(r["workload"], r["name"], r["idle"]) for r in report["devices"][0]["gpu_time"]] == [
        ("container", "trainer", False), ("container", "cd" * 6, True)]
    print_report(report)
    assert capsys.readouterr().out.splitlines()[1:] == [
        "idle allocation: container cdcdcdcdcdcd holds GPU 0 (GPU-1) with no process on it or "
        "no activity", "", "GPU 0  GPU-1  Tesla T4  state=ok",
        "  time: container trainer holds 50.0% of the GPU, keeps 50.0% busy",
        "  time: container cdcdcdcdcdcd holds 50.0% of the GPU, keeps 0.0% busy, idle"]
