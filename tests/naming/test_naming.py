"""Naming profiles: the exposition writer, counters files, and golden expositions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_gpu import sim
from otel_gpu.k8s.attribution import attribute
from otel_gpu.naming import build_profiles, render_profiles
from otel_gpu.naming.dcgm import (
    DEFAULT_FIELDS,
    FIELDS,
    CollectorsError,
    parse_collectors,
    select_fields,
)
from otel_gpu.naming.exposition import Family, format_value, render
from otel_gpu.naming.health import HealthProfile
from otel_gpu.nvml.library import Nvml
from otel_gpu.nvml.sampler import Sampler
from otel_gpu.snapshot import Pods
from tests.support.exposition import series
from tests.support.nvml import profile_uuids

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
DEFAULT_CSV = HERE / "fixtures" / "dcgm-default-counters.csv"


def test_render_escapes_and_formats():
    fam = Family("DCGM_FI_DEV_GPU_TEMP", "gauge", 'GPU temperature\n(C) \\ "x"')
    fam.add({"modelName": 'A "quoted"\\name\n'}, 61.0)
    fam.add({}, 0.25)
    text = render([fam, Family("EMPTY", "gauge", "no samples")])
    assert text == (
        '# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature\\n(C) \\\\ "x"\n'
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{modelName="A \\"quoted\\"\\\\name\\n"} 61\n'
        "DCGM_FI_DEV_GPU_TEMP 0.25\n"
    )
    assert format_value(2**60) == str(float(2**60))
    assert format_value(float("inf")) == "+Inf"


def test_dcgm_exporters_default_counters_file_is_accepted_as_it_is():
    entries = parse_collectors(str(DEFAULT_CSV))
    assert [e.name for e in entries][:3] == [
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP"]
    assert "DCGM_FI_DEV_DEC_UTIL" in [e.name for e in entries]  # "NAME ," spacing
    assert "DCGM_FI_DEV_POWER_VIOLATION" not in [e.name for e in entries]  # commented out
    fields, problems = select_fields(entries)
    assert [f.name for f in fields] == [e.name for e in entries
                                        if e.name != "DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
    assert problems == ["DCGM_FI_DEV_VGPU_LICENSE_STATUS (line 61): only meaningful inside a "
                        "vGPU guest VM"]
    energy = next(f for f in fields if f.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert energy.type == "counter" and energy.help == "Energy used since boot (in mJ)."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DCGM_FI_DEV_GPU_TEMP\n", r"line 1: expected 'DCGM_FI_NAME, type, help'"),
        ("# c\n\nDCGM_FI_DEV_GPU_TEMP, sometimes, help\n",
         r"line 3: type 'sometimes' is not one of gauge, counter"),
        ("GPU_TEMP, gauge, help\n", r"line 1: 'GPU_TEMP' is not a DCGM_FI_ field name"),
        (", gauge, help\n", r"line 1: expected"),
    ],
)
def test_malformed_counters_files_name_the_line(tmp_path, text, message):
    path = tmp_path / "counters.csv"
    path.write_text(text)
    with pytest.raises(CollectorsError, match=message) as info:
        parse_collectors(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_unknown_and_unavailable_fields_are_reported_not_exported(tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text(
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\n"
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, tensor\n"
        "DCGM_FI_DEV_NOT_A_THING, gauge, ?\n"
        "DCGM_FI_DRIVER_VERSION, label, driver\n"
        "DCGM_FI_DEV_GPU_UTIL, histogram, u\n"
    )
    fields, problems = select_fields(parse_collectors(str(path)))
    assert [f.name for f in fields] == ["DCGM_FI_DEV_GPU_TEMP"]
    assert problems == [
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (line 2): needs DCGM's profiling module; NVML does "
        "not measure it",
        "DCGM_FI_DEV_NOT_A_THING (line 3): not a field otel-gpu knows",
        "DCGM_FI_DEV_GPU_UTIL (line 5): type histogram is not supported for it; use gauge or "
        "counter",
    ]


def test_default_field_set_is_dcgm_exporters():
    assert set(DEFAULT_FIELDS) <= set(FIELDS)
    for required in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
                     "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_SM_CLOCK",
                     "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS",
                     "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        assert required in DEFAULT_FIELDS


# --- golden expositions ----------------------------------------------------------


def _snapshot(profile: str, pods: list):
    """One sample of ``profile``, attributed through a fake kubelet serving ``pods``."""
    from dataclasses import replace

    from otel_gpu.k8s.podresources import PodResourcesWatcher
    from tests.support.kubelet import FakeKubelet

    sim.install(sim.FakeNvml(sim.load_scenario(profile)))
    try:
        nvml = Nvml()
        nvml.init()
        snap = Sampler(nvml).sample()
    finally:
        sim.uninstall()
    with FakeKubelet() as kubelet:
        kubelet.set_pods(pods)
        watcher = PodResourcesWatcher(kubelet.socket_path)
        try:
            assert watcher.poll_once()
            state = watcher.state
        finally:
            watcher.stop()
    devices = [s.device for s in snap.devices]
    return replace(snap, pods=Pods(attribute(devices, state), None, 1.0))


def _pod(name: str, resource: str, device_id: str):
    from tests.support.kubelet import container, devices, pod

    return pod(name, container("main", devices(resource, device_id)), namespace="ml")


def _h100x8():
    uuids = profile_uuids("h100x8")
    pods = [_pod(f"train-{i}", "nvidia.com/gpu", uuids[i]) for i in range(3)]
    pods += [_pod(f"infer-{i}", "nvidia.com/gpu", f"{uuids[7]}::{i}") for i in range(3)]
    return _snapshot("h100x8", pods)


def _a100_mig():
    gpus = sim.load_scenario("a100-mig").devices
    mig = {m.gpu_instance_id: m.uuid for m in gpus[0].mig}
    return _snapshot("a100-mig", [
        _pod("big", "nvidia.com/mig-3g.20gb", mig[1]),
        _pod("small", "nvidia.com/mig-1g.5gb", mig[13]),
        _pod("whole", "nvidia.com/gpu", gpus[1].uuid),
    ])


@pytest.mark.parametrize("profile", ["dcgm", "kubelet"])
@pytest.mark.parametrize("scenario", ["h100x8", "a100-mig"])
def test_golden_exposition(profile, scenario):
    snap = _h100x8() if scenario == "h100x8" else _a100_mig()
    # the collector's health families are checked on their own below
    views = [p for p in build_profiles([profile], hostname="gpu-node-1")
             if not isinstance(p, HealthProfile)]
    text = render_profiles(views, snap).decode()
    path = GOLDEN / f"{profile}-{scenario}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 rewrites it"


def test_the_collectors_health_is_there_whatever_the_naming():
    snap = _a100_mig()
    for names in (["dcgm"], ["kubelet"], ["dcgm", "kubelet"]):
        text = render_profiles(build_profiles(names, hostname="h"), snap).decode()
        assert text.count("# TYPE otel_gpu_sample_age_seconds gauge") == 1, names
        failed = [v for lab, v in series(text, "otel_gpu_devices", hw_state="failed")]
        assert failed == [0.0], names
        assert series(text, "otel_gpu_devices", hw_state="ok")[0][1] == len(snap.devices)
        assert series(text, "otel_gpu_samples_total")[0][1] == snap.seq
    # with the OpenTelemetry names they come from the SDK, not twice
    text = render_profiles(build_profiles(["otel", "dcgm"], hostname="h"), snap).decode()
    assert "otel_gpu_sample_age_seconds" not in text


def test_shared_gpu_copies_are_off_by_default():
    snap = _h100x8()
    shared = [d.device.uuid for d in snap.devices][7]

    def temps(**kw):
        text = render_profiles(build_profiles(["dcgm"], hostname="h", **kw), snap).decode()
        return [ln for ln in text.splitlines()
                if ln.startswith("DCGM_FI_DEV_GPU_TEMP{") and shared in ln]

    once = temps()
    assert len(once) == 1 and "pod=" not in once[0]
    copies = temps(shared_gpu_copies=True)
    assert len(copies) == 3
    assert sorted(ln.split('pod="')[1].split('"')[0] for ln in copies) == [
        "infer-0", "infer-1", "infer-2"]


def test_hostname_label_setting():
    text = render_profiles(build_profiles(["dcgm"], hostname="n1", hostname_label="hostname"),
                        _a100_mig()).decode()
    assert 'hostname="n1"' in text and "Hostname=" not in text


def test_every_field_has_a_rewrite_or_says_why_not():
    for field in FIELDS.values():
        assert bool(field.promql) != bool(field.rewrite_note), field.name
