"""Naming profiles: the exposition writer, counters files, and golden expositions."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from otel_gpu import sim
from otel_gpu.attribute.k8s.attribution import attribute
from otel_gpu.export.naming import ProfileOptions, build_profiles
from otel_gpu.export.naming.dcgm import (
    DEFAULT_FIELDS,
    FIELDS,
    LABEL_FIELDS,
    UNAVAILABLE,
    CollectorsError,
    LabelField,
    parse_collectors,
    select_fields,
)
from otel_gpu.export.naming.exposition import Family, format_value, render
from otel_gpu.export.naming.health import HealthProfile
from otel_gpu.sample.library import Nvml
from otel_gpu.sample.sampler import Sampler
from otel_gpu.snapshot import Pods
from testkit.exposition import render_profiles, series
from tests.support.nvml import SOURCES, profile_uuids

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
                                        if e.name in FIELDS or e.name in LABEL_FIELDS]
    license_line = next(e.line for e in entries if e.name == "DCGM_FI_DEV_VGPU_LICENSE_STATUS")
    assert (f"DCGM_FI_DEV_VGPU_LICENSE_STATUS (line {license_line}): only meaningful inside a "
            "vGPU guest VM") in problems
    energy = next(f for f in fields if f.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert energy.type == "counter"
    assert energy.help == "Total energy consumption since boot (in mJ)."
    driver = next(f for f in fields if f.name == "DCGM_FI_DRIVER_VERSION")
    assert isinstance(driver, LabelField)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DCGM_FI_DEV_GPU_TEMP\n", r"line 1: expected 'DCGM_FI_NAME, type, help'"),
        ("# c\n\nDCGM_FI_DEV_GPU_TEMP, sometimes, help\n",
         r"line 3: type 'sometimes' is not one of gauge, counter"),
        ("GPU_TEMP, gauge, help\n",
         r"line 1: 'GPU_TEMP' is not a DCGM_FI_ field name \(nor a DCGM_EXP_ or 1.x dcgm_ one\)"),
        ("DCGM_FI_DEV GPU, gauge, help\n", r"line 1: 'DCGM_FI_DEV GPU' is not a DCGM_FI_"),
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
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, l\n"
    )
    fields, problems = select_fields(parse_collectors(str(path)))
    # profiling fields come from NVML GPM
    assert [f.name for f in fields] == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                                        "DCGM_FI_DRIVER_VERSION"]
    assert problems == [
        "DCGM_FI_DEV_NOT_A_THING (line 3): not a field otel-gpu knows",
        "DCGM_FI_DEV_GPU_UTIL (line 5): type histogram is not supported for it; use gauge or "
        "counter",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS (line 6): "
        + UNAVAILABLE["DCGM_FI_DEV_VGPU_LICENSE_STATUS"],
    ]


def test_default_field_set_is_dcgm_exporters():
    assert set(DEFAULT_FIELDS) <= set(FIELDS)
    for required in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
                     "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_SM_CLOCK",
                     "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS",
                     "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        assert required in DEFAULT_FIELDS
    # NVIDIA's current file dropped the NVML PCIe byte counters DCGM deprecates; by name
    # in a counters file they still work
    for dropped in ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"):
        assert dropped not in DEFAULT_FIELDS and dropped in FIELDS


# --- golden expositions ----------------------------------------------------------


def _snapshot(profile: str, pods: list):
    """One sample of ``profile``, attributed through a fake kubelet serving ``pods``."""
    from dataclasses import replace

    from otel_gpu.attribute.k8s.podresources import PodResourcesWatcher
    from testkit.kubelet import FakeKubelet

    sim.install(sim.FakeNvml(sim.load_scenario(profile)))
    try:
        nvml = Nvml()
        nvml.init()
        snap = Sampler(nvml, SOURCES).sample()
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
    from testkit.kubelet import container, devices, pod

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
    views = [p for p in build_profiles([profile], ProfileOptions("gpu-node-1"))
             if not isinstance(p, HealthProfile)]
    text = render_profiles(views, snap).decode()
    path = GOLDEN / f"{profile}-{scenario}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; UPDATE_GOLDEN=1 rewrites it"


def test_the_collectors_health_is_there_whatever_the_naming():
    snap = _a100_mig()
    for names in (["dcgm"], ["kubelet"], ["dcgm", "kubelet"]):
        text = render_profiles(build_profiles(names, ProfileOptions("h")), snap).decode()
        assert text.count("# TYPE otel_gpu_sample_age_seconds gauge") == 1, names
        failed = [v for lab, v in series(text, "otel_gpu_devices", hw_state="failed")]
        assert failed == [0.0], names
        assert series(text, "otel_gpu_devices", hw_state="ok")[0][1] == len(snap.devices)
        assert series(text, "otel_gpu_samples_total")[0][1] == snap.seq
    # with the OpenTelemetry names they come from the SDK, not twice
    text = render_profiles(build_profiles(["otel", "dcgm"], ProfileOptions("h")), snap).decode()
    assert "otel_gpu_sample_age_seconds" not in text


def test_shared_gpu_copies_are_off_by_default():
    snap = _h100x8()
    shared = [d.device.uuid for d in snap.devices][7]

    def temps(**kw):
        profiles = build_profiles(["dcgm"], ProfileOptions("h", **kw))
        text = render_profiles(profiles, snap).decode()
        return [ln for ln in text.splitlines()
                if ln.startswith("DCGM_FI_DEV_GPU_TEMP{") and shared in ln]

    once = temps()
    assert len(once) == 1 and "pod=" not in once[0]
    copies = temps(shared_gpu_copies=True)
    assert len(copies) == 3
    assert sorted(ln.split('pod="')[1].split('"')[0] for ln in copies) == [
        "infer-0", "infer-1", "infer-2"]


def test_hostname_label_setting():
    # dcgm-exporter's newest releases name it hostname (the default); older ones Hostname
    text = render_profiles(build_profiles(["dcgm"], ProfileOptions("n1")), _a100_mig()).decode()
    assert 'hostname="n1"' in text and "Hostname=" not in text
    options = ProfileOptions("n1", hostname_label="Hostname")
    text = render_profiles(build_profiles(["dcgm"], options), _a100_mig()).decode()
    assert 'Hostname="n1"' in text and "hostname=" not in text


def test_every_field_has_a_rewrite_or_says_why_not():
    for field in FIELDS.values():
        assert bool(field.promql) != bool(field.rewrite_note), field.name


# --- dcgm-exporter's output, exactly ---------------------------------------------

COMPAT_CSV = HERE / "fixtures" / "dcgm-1x-compatibility.csv"
EXPORTER_CSV = HERE / "fixtures" / "dcgm-exporter-fields.csv"


def _dcgm(snap, **kw) -> str:
    views = [p for p in build_profiles(["dcgm"], ProfileOptions("h", **kw))
             if not isinstance(p, HealthProfile)]
    return render_profiles(views, snap).decode()


def test_the_built_in_set_is_nvidias_current_default_counters_file():
    from_file, _ = select_fields(parse_collectors(str(DEFAULT_CSV)))
    built_in, problems = select_fields(None)
    assert problems == []

    def described(columns):
        return [(c.name, c.type, getattr(c, "help", None)) for c in columns]

    listed = {c.name for c in from_file}
    assert described(c for c in built_in if c.name in listed) == described(from_file)
    # anything more is a field the file does not mention at all, not even commented out
    mentioned = set(re.findall(r"^#? ?(DCGM_\w+)", DEFAULT_CSV.read_text(), re.M))
    assert not {c.name for c in built_in if c.name not in listed} & mentioned
    # the # HELP lines are dcgm-exporter's texts, not otel-gpu's
    text = _dcgm(_h100x8())
    assert "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n" in text
    assert "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n" in text
    assert "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" not in text
    assert all(lab["DCGM_FI_DRIVER_VERSION"] == "550.90.07"
               for lab, _ in series(text, "DCGM_FI_DEV_GPU_TEMP"))


def test_xid_errors_carry_err_code_and_err_msg():
    from otel_gpu.export.naming import xid
    from otel_gpu.sample.sampler import COMMON_XIDS
    from tests.support.snapshots import gpu_device, sample, snapshot

    assert all(xid.message(code) != xid.UNKNOWN for code in COMMON_XIDS)
    assert xid.message(0) == xid.NO_ERROR and xid.message(100000) == xid.UNKNOWN
    gpus = [gpu_device(f"GPU-00000000-0000-0000-0000-00000000000{i}", i) for i in range(3)]
    snap = snapshot(sample(gpus[0], last_xid=79), sample(gpus[1]), sample(gpus[2], last_xid=999))
    got = {lab["gpu"]: (lab["err_code"], lab["err_msg"], v)
           for lab, v in series(_dcgm(snap), "DCGM_FI_DEV_XID_ERRORS")}
    assert got == {"0": ("79", xid.message(79), 79.0), "1": ("0", "no error", 0.0),
                   "2": ("999", xid.UNKNOWN, 999.0)}


def test_the_1x_compatibility_file_is_served_under_its_names():
    entries = parse_collectors(str(COMPAT_CSV))
    fields, problems = select_fields(entries)
    names = [f.name for f in fields]
    assert "dcgm_sm_clock" in names and "dcgm_memory_clock" in names
    assert all(n.startswith("dcgm_") for n in names)
    # listed twice (PCIe and DCP sections): exported once, as its last line says
    assert names.count("dcgm_fi_prof_pcie_tx_bytes") == 1
    tx_lines = [e.line for e in entries if e.name == "dcgm_fi_prof_pcie_tx_bytes"]
    assert (f"dcgm_fi_prof_pcie_tx_bytes (line {tx_lines[0]}): listed again on line "
            f"{tx_lines[1]}, which is used") in problems
    text = _dcgm(_h100x8(), collectors_file=str(COMPAT_CSV))
    default = _dcgm(_h100x8())
    assert "DCGM_FI_" not in "".join(ln for ln in text.splitlines() if not ln.startswith("#")
                                     and not ln.startswith("dcgm_")).replace(
        "DCGM_FI_DRIVER_VERSION", "")
    for old, new in (("dcgm_gpu_temp", "DCGM_FI_DEV_GPU_TEMP"),
                     ("dcgm_sm_clock", "DCGM_FI_DEV_SM_CLOCK"),
                     ("dcgm_fb_used", "DCGM_FI_DEV_FB_USED"),
                     ("dcgm_power_usage", "DCGM_FI_DEV_POWER_USAGE"),
                     ("dcgm_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL")):
        want = {lab["UUID"]: v for lab, v in series(default, new)}
        assert {lab["UUID"]: v for lab, v in series(text, old)} == want, old
        assert len(want) == 8
    assert "# HELP dcgm_gpu_temp GPU temperature (C).\n# TYPE dcgm_gpu_temp gauge\n" in text
    assert series(text, "dcgm_xid_errors")[0][0]["err_code"] == "0"


def test_exporter_fields_and_label_rows(tmp_path):
    from dataclasses import replace

    from otel_gpu.snapshot import DEGRADED, FAILED
    from tests.support.snapshots import gpu_device, sample, snapshot

    entries = parse_collectors(str(EXPORTER_CSV))
    line = {e.name: e.line for e in entries}
    fields, problems = select_fields(entries)
    assert problems == [
        f"DCGM_EXP_P2P_STATUS (line {line['DCGM_EXP_P2P_STATUS']}): needs "
        "nvmlDeviceGetP2PStatus for every GPU pair; not read",
        f"DCGM_FI_DEV_BRAND (line {line['DCGM_FI_DEV_BRAND']}): not read by otel-gpu",
    ]
    g0 = replace(gpu_device("GPU-00000000-0000-0000-0000-000000000000", 0),
                 serial="1650000000000", vbios_version="96.00.30.00.01")
    g1 = gpu_device("GPU-11111111-0000-0000-0000-000000000000", 1)
    g2 = gpu_device("GPU-22222222-0000-0000-0000-000000000000", 2)
    reasons = "clock.reasons"
    options = ProfileOptions("h", collectors_file=str(EXPORTER_CSV))
    views = [p for p in build_profiles(["dcgm"], options)
             if not isinstance(p, HealthProfile)]

    def at(seq, t, xids, bits, state1=DEGRADED):
        snap = snapshot(
            sample(g0, values={"temp.gpu": 50, reasons: bits}, xid_counts={13: 0, 79: xids}),
            sample(g1, state=state1, values={"temp.gpu": 51, reasons: 0}),
            sample(g2, state=FAILED, error="lost"),
            seq=seq, taken_monotonic=t)
        return render_profiles(views, snap).decode()

    at(1, 0.0, 0, 0x0)
    at(2, 10.0, 2, 0x4 | 0x40)  # power cap and hardware thermal slowdown begin
    text = at(3, 20.0, 3, 0x4)  # thermal ends
    labels = series(text, "DCGM_FI_DEV_GPU_TEMP", gpu="0")[0][0]
    assert labels["DCGM_FI_DEV_SERIAL"] == "1650000000000"
    assert labels["DCGM_FI_DEV_VBIOS_VERSION"] == "96.00.30.00.01"
    assert labels["DCGM_FI_DEV_UUID"] == g0.uuid and labels["DCGM_FI_DEV_NAME"] == g0.model
    assert labels["DCGM_FI_DEV_PCI_BUSID"] == g0.pci_bus_id
    assert labels["DCGM_FI_DRIVER_VERSION"] == "550.90.07"
    assert "DCGM_FI_DEV_SERIAL" not in series(text, "DCGM_FI_DEV_GPU_TEMP", gpu="1")[0][0]
    # XIDs: in the 5-minute window, and since start (the common codes from 0)
    window = {"window_size_in_ms": "300000"}
    assert [(lab.get("xid"), lab["window_size_in_ms"], v) for lab, v in
            series(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="0")] == [("79", "300000", 3.0)]
    assert series(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="1") == [
        (series(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="1")[0][0], 0.0)]
    assert "xid" not in series(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="1")[0][0]
    assert {lab["xid"]: v for lab, v in series(text, "DCGM_EXP_XID_ERRORS_TOTAL", gpu="0")} == {
        "13": 0.0, "79": 3.0}
    # clock events: samples in the window with each reason, and times each reason began
    assert {lab["clock_event"]: v for lab, v in
            series(text, "DCGM_EXP_CLOCK_EVENTS_COUNT", gpu="0", **window)} == {
        "power_cap": 2.0, "hw_thermal": 1.0}
    totals = {lab["clock_event"]: v for lab, v in
              series(text, "DCGM_EXP_CLOCK_EVENTS_TOTAL", gpu="0")}
    assert totals["power_cap"] == 1.0 and totals["hw_thermal"] == 1.0
    assert totals["gpu_idle"] == 0.0 and len(totals) == 9
    # health: DCGM's pass / warn / fail, the lost GPU included
    assert {lab["gpu"]: v for lab, v in series(text, "DCGM_EXP_GPU_HEALTH_STATUS")} == {
        "0": 0.0, "1": 10.0, "2": 20.0}
    assert series(text, "DCGM_FI_DEV_GPU_TEMP", gpu="2") == []  # a failed GPU has no values
    # five minutes later the window holds only what happened since
    later = at(4, 330.0, 4, 0x0, state1="ok")
    assert [(lab.get("xid"), v) for lab, v in
            series(later, "DCGM_EXP_XID_ERRORS_COUNT", gpu="0")] == [("79", 1.0)]
    ((labels, count),) = series(later, "DCGM_EXP_CLOCK_EVENTS_COUNT", gpu="0")
    assert count == 0.0 and "clock_event" not in labels
    assert {lab["gpu"]: v for lab, v in series(later, "DCGM_EXP_GPU_HEALTH_STATUS")}["1"] == 0.0


def _fb_used(text: str) -> list[tuple[str, str | None, float]]:
    return sorted((lab["UUID"], lab.get("GPU_I_ID", ""), v)
                  for lab, v in series(text, "DCGM_FI_DEV_FB_USED"))


def test_a_mig_gpu_is_reported_through_its_instances_by_default():
    snap = _a100_mig()
    parent = sim.load_scenario("a100-mig").devices[0]
    used = {s.device.uuid: s.values["memory.used"] for s in snap.devices}
    instances = [s for s in snap.devices if s.device.parent_uuid == parent.uuid]
    whole = [s for s in snap.devices if not s.device.is_mig and s.device.uuid != parent.uuid]
    text = _dcgm(snap)
    rows = _fb_used(text)
    # no row for the MIG GPU as a whole: its memory is its instances'
    assert [r for r in rows if r[0] == parent.uuid and not r[1]] == []
    assert sum(v for *_, v in rows) == pytest.approx(
        sum(used[s.device.uuid] for s in instances + whole) / 2**20)
    # an instance carries its GPU's temperature and clocks, but no utilization
    temps = series(text, "DCGM_FI_DEV_GPU_TEMP", UUID=parent.uuid)
    assert len(temps) == len(instances) and all("GPU_I_ID" in lab for lab, _ in temps)
    assert {v for _, v in temps} == {snap.devices[0].values["temp.gpu"]}
    assert series(text, "DCGM_FI_DEV_GPU_UTIL", UUID=parent.uuid) == []
    assert len(series(text, "DCGM_FI_DEV_GPU_UTIL")) == len(whole)

    gpus = _fb_used(_dcgm(snap, devices="gpus"))
    assert [r[1] for r in gpus] == [""] * 3
    only = _fb_used(_dcgm(snap, devices="instances"))
    assert len(only) == len(instances) and all(r[1] for r in only)
    both = _fb_used(_dcgm(snap, devices="both"))
    assert sorted(both) == sorted(gpus + only)


def test_old_pod_label_names():
    text = _dcgm(_a100_mig(), pod_label_style="old")
    ((labels, _),) = series(text, "DCGM_FI_DEV_GPU_TEMP", pod_name="whole")
    assert labels["pod_namespace"] == "ml" and labels["container_name"] == "main"
    assert "pod" not in labels and "namespace" not in labels and "container" not in labels
    assert "uuid" in labels and "UUID" not in labels


def test_kubelet_memory_is_what_cadvisor_read():
    """cAdvisor read the v1 memory call: used includes the driver's reserved memory and
    total is the physical total (on an H100, 541 MiB more than used + free)."""
    snap = _h100x8()
    views = [p for p in build_profiles(["kubelet"], ProfileOptions("h"))
             if not isinstance(p, HealthProfile)]
    text = render_profiles(views, snap).decode()
    by_uuid = {s.device.uuid: s.values for s in snap.devices}
    used = {lab["acc_id"]: v for lab, v in series(text, "container_accelerator_memory_used_bytes")}
    total = {lab["acc_id"]: v
             for lab, v in series(text, "container_accelerator_memory_total_bytes")}
    assert used and set(used) == set(total)
    for uuid, values in by_uuid.items():
        if uuid not in used:
            continue
        assert values["memory.reserved"] > 0
        assert used[uuid] == values["memory.used"] + values["memory.reserved"]
        assert total[uuid] == values["memory.total"]
        assert total[uuid] == used[uuid] + values["memory.free"]
    labels = series(text, "container_accelerator_duty_cycle")[0][0]
    assert not {"id", "image", "name"} & set(labels)  # not known without the runtime


def test_fan_speed_is_in_the_default_set_where_a_gpu_has_fans():
    assert "DCGM_FI_DEV_FAN_SPEED" in DEFAULT_FIELDS
    from dataclasses import replace as _replace

    snap = _a100_mig()
    with_fan = _replace(snap, devices=tuple(
        _replace(d, values={**d.values, "fan": 40.0}) if d is snap.devices[-1] else d
        for d in snap.devices))  # the last GPU, not in MIG mode, gets a fan
    text = render_profiles(build_profiles(["dcgm"], ProfileOptions("h")), with_fan).decode()
    fans = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_FAN_SPEED{")]
    assert len(fans) == 1 and fans[0].endswith(" 40")
    plain = render_profiles(build_profiles(["dcgm"], ProfileOptions("h")), snap).decode()
    assert "DCGM_FI_DEV_FAN_SPEED{" not in plain  # no fans, no series (never a 0)


@pytest.mark.parametrize("fixture", ["dcgm-default-counters.csv", "dcgm-dcp-metrics.csv",
                                     "dcgm-1x-compatibility.csv"])
def test_every_field_of_nvidias_counters_files_is_mapped_in_the_migration_guide(fixture):
    """Listed or commented out, each field is exported, or the guide says why not."""
    import re as _re

    guide = (HERE.parents[2] / "docs" / "migration.md").read_text()
    text = (HERE / "fixtures" / fixture).read_text()
    names = set(_re.findall(r"^#?\s*((?:DCGM_FI|DCGM_EXP|dcgm)_[A-Za-z0-9_]+)\s*,", text,
                            _re.MULTILINE))
    assert len(names) > 20
    missing = sorted(n for n in names if not _re.search(rf"`{n}`", guide))
    assert missing == []
